/*
 * Starting and stopping a real kvdepotd ($KVDEPOTD) from the integration
 * tests: a small arena in the test's directory, the socket at d/d.sock,
 * logs in d/daemon.log, failpoints through KVDEPOT_FAILPOINTS. The daemon
 * dies with the test (PR_SET_PDEATHSIG), so a failed assertion never
 * leaves one holding ctest's output pipe. Header-only (static inline); the
 * including test has cmocka.h and kvd_testdir_int.h included first.
 */
#ifndef KVD_TESTS_TESTDAEMON_INT_H
#define KVD_TESTS_TESTDAEMON_INT_H

#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/kvd_metric.h"

/* The daemon binary, or NULL when $KVDEPOTD is not set. */
static inline const char *kvd_test_daemon_bin(void)
{
    const char *p = getenv("KVDEPOTD");
    return p != NULL && p[0] != '\0' ? p : NULL;
}

static inline uint64_t kvd_test_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* When set, daemons start inside this network namespace (`ip netns exec`;
 * the partition test). */
static const char *kvd_test_daemon_netns;

/* Forks and execs kvdepotd in `d` with KVDEPOT_FAILPOINTS=`failpoints`
 * (NULL: none) and extra --set values (a NULL-terminated va_list). */
static inline pid_t kvd_test_daemon_spawn(const kvd_test_dir_t *d,
                                          const char *failpoints, va_list ap)
{
    char sock[300], ready[300];
    snprintf(sock, sizeof sock, "server.unix_socket=%s/d.sock", d->path);
    snprintf(ready, sizeof ready, "%s/ready", d->path);
    (void)unlink(ready);
    const char *argv[72];
    int n = 0;
    if (kvd_test_daemon_netns != NULL) {
        argv[n++] = "/usr/sbin/ip";
        argv[n++] = "netns";
        argv[n++] = "exec";
        argv[n++] = kvd_test_daemon_netns;
    }
    argv[n++] = kvd_test_daemon_bin();
    const char *const base[] = {
        sock,
        "store.arena_size=16m",
        "store.arena_chunk=2m",
        "store.arena_hugepages=off",
        "store.arena_prefault=false",
        "server.tick=20ms",
        "log.level=warn",
    };
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) {
        argv[n++] = "--set";
        argv[n++] = base[i];
    }
    for (const char *s; (s = va_arg(ap, const char *)) != NULL && n < 66;) {
        argv[n++] = "--set";
        argv[n++] = s;
    }
    argv[n++] = "--ready-file";
    argv[n++] = ready;
    argv[n] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        char log[300];
        snprintf(log, sizeof log, "%s/daemon.log", d->path);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
            close(fd);
        }
        if (failpoints != NULL) {
            (void)setenv("KVDEPOT_FAILPOINTS", failpoints, 1);
        } else {
            (void)unsetenv("KVDEPOT_FAILPOINTS");
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* Waits (20 s at most) for the ready file of the daemon `pid` in `d`. */
static inline void kvd_test_daemon_wait_ready(const kvd_test_dir_t *d,
                                              pid_t pid)
{
    char ready[300];
    snprintf(ready, sizeof ready, "%s/ready", d->path);
    uint64_t deadline = kvd_test_now_ms() + 20000;
    while (access(ready, F_OK) != 0) {
        int st;
        assert_int_equal(waitpid(pid, &st, WNOHANG), 0); /* still alive */
        assert_true(kvd_test_now_ms() < deadline);
        usleep(5000);
    }
}

/* SIGTERM and wait: a graceful stop exits 0. */
static inline void kvd_test_daemon_stop(pid_t pid)
{
    assert_int_equal(kill(pid, SIGTERM), 0);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* The value of metric `name` in the /metrics of the daemon in `d`
 * (started with server.metrics_address=127.0.0.1:0), or -1. */
static inline double kvd_test_daemon_metric(const kvd_test_dir_t *d,
                                            const char *name)
{
    char ready[300];
    snprintf(ready, sizeof ready, "%s/ready", d->path);
    return kvd_metric_read(ready, name);
}

/* The number after `prefix` on the line of /proc/<pid>/<file> that starts
 * with it, or -1: (pid, "limits", "Max open files") is the soft descriptor
 * limit. */
static inline long kvd_test_proc_long(pid_t pid, const char *file,
                                      const char *prefix)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, file);
    FILE *f = fopen(path, "re");
    assert_non_null(f);
    long v = -1;
    size_t n = strlen(prefix);
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, prefix, n) == 0) {
            v = strtol(line + n, NULL, 10);
        }
    }
    fclose(f);
    return v;
}

/* The resident set of `pid` in KiB (VmRSS). */
static inline long kvd_test_rss_kib(pid_t pid)
{
    return kvd_test_proc_long(pid, "status", "VmRSS:");
}

/* The TCP port the daemon in `d` wrote to its ready file (tcp_port=). */
static inline int kvd_test_daemon_tcp_port(const kvd_test_dir_t *d)
{
    char path[300], line[128];
    snprintf(path, sizeof path, "%s/ready", d->path);
    FILE *f = fopen(path, "re");
    assert_non_null(f);
    int port = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        (void)sscanf(line, "tcp_port=%d", &port);
    }
    fclose(f);
    assert_true(port > 0);
    return port;
}

#endif /* KVD_TESTS_TESTDAEMON_INT_H */
