/*
 * What the benchmark programs share: the clock, medians, and the child
 * processes they start (servers and peers), each killed with the
 * benchmark (PR_SET_PDEATHSIG) and stopped by its pid. Header-only
 * (static inline); `bench_prog` names the program in messages.
 */
#ifndef KVD_BENCH_PROC_INT_H
#define KVD_BENCH_PROC_INT_H

#include <errno.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *bench_prog = "bench";

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n), n <= 64. */
static inline double median(const double *v, size_t n)
{
    double s[64];
    if (n == 0 || n > 64) {
        return 0;
    }
    memcpy(s, v, n * sizeof *s);
    qsort(s, n, sizeof *s, cmp_double);
    return n % 2 == 1 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/* The median of v[0..n) (n >= 1) in out[0], its range in out[1..2]. */
static inline void spread(const double *v, size_t n, double out[3])
{
    out[0] = median(v, n);
    out[1] = out[2] = v[0];
    for (size_t i = 1; i < n; i++) {
        out[1] = v[i] < out[1] ? v[i] : out[1];
        out[2] = v[i] > out[2] ? v[i] : out[2];
    }
}

/* Forks and execs argv with stdout and stderr in `log`, on CPU `cpu` only
 * when it is not negative; -1 if fork failed. */
static inline pid_t child_spawn_on(int cpu, char *const argv[], const char *log)
{
    pid_t parent = getpid();
    fflush(NULL); /* or the child's freopen writes this buffer again */
    pid_t pid = fork();
    if (pid == 0) {
        /* Dies with the benchmark, even when it is killed. */
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent || freopen(log, "w", stdout) == NULL) {
            _exit(126);
        }
        if (cpu >= 0) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            if (sched_setaffinity(0, sizeof one, &one) != 0) {
                _exit(126);
            }
        }
        (void)dup2(STDOUT_FILENO, STDERR_FILENO);
        execvp(argv[0], argv);
        _exit(127);
    }
    if (pid < 0) {
        fprintf(stderr, "%s: fork: %s\n", bench_prog, strerror(errno));
    }
    return pid;
}

/* Forks and execs argv with stdout and stderr in `log`; -1 if fork failed. */
static inline pid_t child_spawn(char *const argv[], const char *log)
{
    return child_spawn_on(-1, argv, log);
}

static inline bool child_alive(pid_t pid, const char *name)
{
    int st = 0;
    if (pid > 0 && waitpid(pid, &st, WNOHANG) == 0) {
        return true;
    }
    fprintf(stderr, "%s: %s has exited (wait status 0x%x)\n", bench_prog, name,
            (unsigned)st);
    return false;
}

/* SIGTERM, then waits; returns the exit status (-1: killed or unknown). */
static inline int child_stop(pid_t pid)
{
    int st = 0;
    if (pid <= 0 || kill(pid, SIGTERM) != 0 || waitpid(pid, &st, 0) != pid) {
        return -1;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0). */
static inline int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0) {
        port = ntohs(a.sin_port);
    }
    if (fd >= 0) {
        close(fd);
    }
    return port;
}

/* Waits `timeout_s` at most for kvdepotd `pid` to write its ready file,
 * whose pid= must be the child's (the pid SIGTERM goes to). */
static inline int daemon_wait_ready(pid_t pid, const char *ready,
                                    double timeout_s)
{
    for (double end = now_s() + timeout_s; now_s() < end;) {
        FILE *f = fopen(ready, "r");
        int rpid = 0;
        if (f != NULL) {
            int n = fscanf(f, "pid=%d", &rpid);
            fclose(f);
            if (n == 1 && rpid == pid) {
                return 0;
            }
            fprintf(stderr, "%s: ready file says pid=%d, not %d\n", bench_prog,
                    rpid, (int)pid);
            return -1;
        }
        if (!child_alive(pid, "kvdepotd")) {
            return -1;
        }
        usleep(10000);
    }
    fprintf(stderr, "%s: kvdepotd not ready after %.0f s\n", bench_prog,
            timeout_s);
    return -1;
}

#endif /* KVD_BENCH_PROC_INT_H */
