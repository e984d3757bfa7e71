/*
 * server.exit_when_idle with a real kvdepotd ($KVDEPOTD): the setting the
 * Python connector relies on to leave no daemon behind when it starts one
 * for a tensor-parallel engine (python/kvdepot/_spawn.py).
 *   - a daemon with clients keeps running past the idle time while any of
 *     them is connected; once the last one is gone (one closed its store,
 *     the other was killed with SIGKILL) it stops by itself, exit 0, its
 *     ready file and both sockets removed;
 *   - a daemon no client ever reaches stops after the idle time too (an
 *     engine killed before it connected leaves nothing behind);
 *   - without the setting (the default, 0) a daemon keeps running with no
 *     client;
 *   - the setting without server.unix_socket is refused (exit 2).
 * Skipped (77) without $KVDEPOTD.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "client/handoff.h"
#include "tests/integration/kvd_testdaemonclient_int.h"

/* Whether `pid` (our child) is still running; reaps it and writes its
 * wait status when it is not. */
static bool daemon_running(pid_t pid, int *status)
{
    pid_t r = waitpid(pid, status, WNOHANG);
    assert_true(r == 0 || r == pid);
    return r == 0;
}

/* Waits up to `ms` for the daemon `pid` to exit by itself: the time it
 * took (fails past `ms`), its exit code checked to be 0. */
static uint64_t daemon_wait_exit(pid_t pid, uint64_t ms)
{
    uint64_t t0 = now_ms();
    int st = 0;
    while (daemon_running(pid, &st)) {
        assert_true(now_ms() - t0 < ms);
        usleep(10000);
    }
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    return now_ms() - t0;
}

static bool exists_in(const kvd_test_dir_t *d, const char *name)
{
    char path[300];
    snprintf(path, sizeof path, "%s/%s", d->path, name);
    return access(path, F_OK) == 0;
}

/* A child that opens a store on the daemon in `d`, says so on `ready_fd`
 * and waits to be killed. */
static pid_t client_child(const kvd_test_dir_t *d)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(p[0]);
        kvd_store_t *st = NULL;
        char ok = client_open(d, "30s", "3s", &st) == KVD_OK ? 'y' : 'n';
        (void)write(p[1], &ok, 1);
        for (;;) {
            pause();
        }
    }
    close(p[1]);
    char ok = 0;
    assert_int_equal(read(p[0], &ok, 1), 1);
    close(p[0]);
    assert_int_equal(ok, 'y');
    return child;
}

static void test_stops_after_last_client(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "idle_clients");
    pid_t dpid =
        daemon_start(&d, "server.exit_when_idle=400ms", (const char *)NULL);
    /* The child first: a gRPC client does not survive a fork. */
    pid_t child = client_child(&d);
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "3s", &st), KVD_OK);
    kvd_namespace_t ns;
    kvd_block_hash_t h[1];
    keys_make(&ns, h, 1, 3);
    assert_int_equal(save_objects(st, &ns, h, 1), 1);
    int st_unused = 0;
    usleep(1200 * 1000); /* three idle times, both clients connected */
    assert_true(daemon_running(dpid, &st_unused));
    kvd_store_close(st);
    usleep(1200 * 1000); /* the child still holds its store */
    assert_true(daemon_running(dpid, &st_unused));
    assert_true(exists_in(&d, "ready"));

    assert_int_equal(kill(child, SIGKILL), 0);
    assert_int_equal(waitpid(child, NULL, 0), child);
    uint64_t took = daemon_wait_exit(dpid, 5000);
    fprintf(stderr, "stopped %llu ms after its last client was killed\n",
            (unsigned long long)took);
    assert_true(took >= 300);
    assert_false(exists_in(&d, "ready"));
    assert_false(exists_in(&d, "d.sock"));
    assert_false(exists_in(&d, "d.sock" KVD_HANDOFF_SUFFIX));
    kvd_test_dir_remove(&d);
}

static void test_stops_without_any_client(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "idle_none");
    pid_t dpid =
        daemon_start(&d, "server.exit_when_idle=300ms", (const char *)NULL);
    uint64_t took = daemon_wait_exit(dpid, 5000);
    fprintf(stderr, "stopped %llu ms after it was ready, no client\n",
            (unsigned long long)took);
    assert_false(exists_in(&d, "d.sock"));
    kvd_test_dir_remove(&d);
}

static void test_default_keeps_running(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "idle_default");
    pid_t dpid = daemon_start(&d, (const char *)NULL);
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "3s", &st), KVD_OK);
    kvd_store_close(st);
    int unused = 0;
    usleep(1000 * 1000);
    assert_true(daemon_running(dpid, &unused));
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

static void test_needs_unix_socket(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) {
            dup2(null, STDOUT_FILENO);
            dup2(null, STDERR_FILENO);
        }
        execl(daemon_bin(), daemon_bin(), "--set",
              "server.unix_socket=", "--set", "server.exit_when_idle=1s",
              "--print-config", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stops_after_last_client),
        cmocka_unit_test(test_stops_without_any_client),
        cmocka_unit_test(test_default_keeps_running),
        cmocka_unit_test(test_needs_unix_socket),
    };
    return cmocka_run_group_tests(tests, skip_without_daemon, NULL);
}
