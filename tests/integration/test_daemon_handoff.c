/*
 * kvdepotd's arena hand-off (<server.unix_socket>.shm) against hostile
 * neighbours of the same node, with a real daemon (the binary in
 * $KVDEPOTD) and raw unix-socket peers beside a real client:
 *   - a peer that connects and sends one byte, and one that sends nothing,
 *     delay no one: a store opened meanwhile opens at once, a HELLO sent
 *     in two pieces is answered, the stalled peers are dropped after the
 *     hand-off deadline, and SIGTERM stops the daemon promptly while fresh
 *     stalled peers are connected;
 *   - hand-offs from one user past server.max_sessions_per_uid are refused
 *     with KVD_ERR_BUSY while the first client keeps working, and 5,000
 *     hand-offs opened and closed after it never take its session;
 *   - a client whose session the daemon did forget (its connection ended,
 *     then 5,000 others took the slot) hands off again by itself and its
 *     next call succeeds.
 * The figures (open time, stop time, hand-offs per second) go to stderr
 * for docs/reliability.md. Skipped (77) without $KVDEPOTD.
 */
#include <dirent.h>
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

#include <sys/socket.h>
#include <sys/un.h>

#include "client/handoff.h"
#include "tests/integration/kvd_testdaemonclient_int.h"

#define FLOOD 5000
#define CAP 32

/* A raw connection to the daemon's hand-off socket. */
static int raw_connect(const kvd_test_dir_t *d)
{
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(s >= 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    char path[300];
    snprintf(path, sizeof path, "%s/d.sock%s", d->path, KVD_HANDOFF_SUFFIX);
    assert_true(strlen(path) < sizeof a.sun_path);
    memcpy(a.sun_path, path, strlen(path) + 1);
    assert_int_equal(connect(s, (struct sockaddr *)&a, sizeof a), 0);
    return s;
}

/* One whole hand-off on `s`: the reply's status (its memfd closed). */
static kvd_status_t raw_handoff(int s)
{
    uint8_t hello[KVD_HANDOFF_HELLO_BYTES], rbuf[KVD_HANDOFF_REPLY_BYTES];
    kvd_handoff_hello_encode(hello);
    assert_int_equal(kvd_handoff_send(s, hello, sizeof hello, -1), KVD_OK);
    int fd = -1;
    assert_int_equal(kvd_handoff_recv(s, rbuf, sizeof rbuf, 5000, &fd), KVD_OK);
    kvd_handoff_reply_t r;
    char err[128];
    assert_int_equal(
        kvd_handoff_reply_decode(rbuf, sizeof rbuf, &r, err, sizeof err),
        KVD_OK);
    if (fd >= 0) {
        close(fd);
    }
    assert_true((r.status == KVD_OK) == (fd >= 0));
    return r.status;
}

/* SIGTERM with peers connected: the stop's time in ms (fails past 5 s). */
static uint64_t daemon_stop_timed(pid_t pid)
{
    uint64_t t0 = now_ms();
    assert_int_equal(kill(pid, SIGTERM), 0);
    int st = 0;
    pid_t w;
    while ((w = waitpid(pid, &st, WNOHANG)) == 0) {
        if (now_ms() - t0 > 5000) {
            (void)kill(pid, SIGKILL);
            (void)waitpid(pid, &st, 0);
            fail_msg("kvdepotd did not stop within 5 s of SIGTERM");
        }
        usleep(2000);
    }
    assert_int_equal(w, pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    return now_ms() - t0;
}

static void test_stalled_peers_block_nobody(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "handoff_stall");
    pid_t dpid = daemon_start(&d, (const char *)NULL);
    int one = raw_connect(&d), none = raw_connect(&d);
    assert_int_equal(send(one, "K", 1, MSG_NOSIGNAL), 1);
    usleep(50000); /* the daemon has seen both */

    kvd_store_t *st = NULL;
    uint64_t t0 = now_ms();
    assert_int_equal(client_open(&d, "30s", "3s", &st), KVD_OK);
    kvd_store_stats_t stats;
    assert_int_equal(kvd_store_stats(st, &stats), KVD_OK);
    uint64_t open_ms = now_ms() - t0;
    fprintf(stderr, "open + stats beside 2 stalled peers: %llu ms\n",
            (unsigned long long)open_ms);
    assert_true(open_ms < 1000);

    /* A slow but honest peer: its HELLO in two pieces. */
    int slow = raw_connect(&d);
    uint8_t hello[KVD_HANDOFF_HELLO_BYTES];
    kvd_handoff_hello_encode(hello);
    assert_int_equal(send(slow, hello, 8, MSG_NOSIGNAL), 8);
    usleep(200000);
    assert_int_equal(kvd_handoff_send(slow, hello + 8, 8, -1), KVD_OK);
    uint8_t rbuf[KVD_HANDOFF_REPLY_BYTES];
    int fd = -1;
    assert_int_equal(kvd_handoff_recv(slow, rbuf, sizeof rbuf, 2000, &fd),
                     KVD_OK);
    assert_true(fd >= 0);
    close(fd);
    close(slow);

    /* The stalled ones are dropped at the deadline. */
    uint64_t t1 = now_ms();
    char b;
    assert_int_equal(recv(one, &b, 1, 0), 0);
    assert_int_equal(recv(none, &b, 1, 0), 0);
    fprintf(stderr, "stalled peers dropped %llu ms after the open\n",
            (unsigned long long)(now_ms() - t1 + open_ms));
    close(one);
    close(none);

    /* A stop while fresh stalled peers are connected. */
    one = raw_connect(&d);
    none = raw_connect(&d);
    assert_int_equal(send(one, "K", 1, MSG_NOSIGNAL), 1);
    kvd_store_close(st);
    usleep(50000);
    uint64_t stop_ms = daemon_stop_timed(dpid);
    fprintf(stderr, "SIGTERM to exit with 2 stalled peers: %llu ms\n",
            (unsigned long long)stop_ms);
    assert_true(stop_ms < 3000);
    close(one);
    close(none);
    kvd_test_dir_remove(&d);
}

/* This process's connection to the daemon's hand-off socket (the store's
 * kept connection), or -1. */
static int find_handoff_fd(const kvd_test_dir_t *d)
{
    char want[300];
    snprintf(want, sizeof want, "%s/d.sock%s", d->path, KVD_HANDOFF_SUFFIX);
    DIR *dir = opendir("/proc/self/fd");
    assert_non_null(dir);
    int found = -1;
    for (struct dirent *e; (e = readdir(dir)) != NULL;) {
        int fd = atoi(e->d_name);
        struct sockaddr_un a;
        socklen_t al = sizeof a;
        if (e->d_name[0] != '.' && fd != dirfd(dir) &&
            getpeername(fd, (struct sockaddr *)&a, &al) == 0 &&
            a.sun_family == AF_UNIX && strcmp(a.sun_path, want) == 0) {
            found = fd;
        }
    }
    closedir(dir);
    return found;
}

/* FLOOD hand-offs opened and closed; returns how many were answered OK
 * (the others BUSY: the daemon had not yet seen earlier ones end). */
static size_t flood(const kvd_test_dir_t *d)
{
    size_t ok = 0;
    uint64_t t0 = now_ms();
    for (int i = 0; i < FLOOD; i++) {
        int s = raw_connect(d);
        kvd_status_t r = raw_handoff(s);
        assert_true(r == KVD_OK || r == KVD_ERR_BUSY);
        ok += r == KVD_OK;
        close(s);
    }
    fprintf(stderr, "%d hand-offs opened and closed in %llu ms, %zu OK\n",
            FLOOD, (unsigned long long)(now_ms() - t0), ok);
    return ok;
}

/* The saved object is found and its bytes are right. */
static void check_saved(kvd_store_t *st, const kvd_namespace_t *ns,
                        const kvd_block_hash_t *h)
{
    kvd_store_lease_t l;
    size_t matched = 0;
    assert_int_equal(kvd_store_lookup(st, ns, h, 1, &l, &matched), KVD_OK);
    assert_int_equal(matched, 1);
    check_bytes(st, &l);
    assert_int_equal(kvd_store_release(st, &l, 1), KVD_OK);
}

static void test_session_flood(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "handoff_flood");
    pid_t dpid =
        daemon_start(&d, "server.max_sessions_per_uid=32", (const char *)NULL);
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "3s", &st), KVD_OK);
    kvd_namespace_t ns;
    kvd_block_hash_t h[1];
    keys_make(&ns, h, 1, 7);
    assert_int_equal(save_objects(st, &ns, h, 1), 1);

    /* Held open up to the cap: the store holds one, CAP - 1 more pass. */
    int held[CAP + 8];
    size_t ok = 0, busy = 0;
    for (size_t i = 0; i < CAP + 8; i++) {
        held[i] = raw_connect(&d);
        kvd_status_t r = raw_handoff(held[i]);
        ok += r == KVD_OK;
        busy += r == KVD_ERR_BUSY;
    }
    fprintf(stderr, "%d hand-offs held: %zu OK, %zu refused BUSY\n", CAP + 8,
            ok, busy);
    assert_int_equal(ok, CAP - 1);
    assert_int_equal(busy, 9);
    check_saved(st, &ns, h);
    for (size_t i = 0; i < CAP + 8; i++) {
        close(held[i]);
    }

    /* Opened and closed: recycled, never the store's live session. */
    assert_true(flood(&d) > FLOOD / 2);
    check_saved(st, &ns, h);

    /* The store's connection ends (as if the daemon had lost it) and the
     * flood takes its session's slot: the next call hands off again. */
    int fd = find_handoff_fd(&d);
    assert_true(fd >= 0);
    assert_int_equal(shutdown(fd, SHUT_RDWR), 0);
    usleep(200000);
    assert_true(flood(&d) > FLOOD / 2);
    check_saved(st, &ns, h);
    assert_true(find_handoff_fd(&d) >= 0);

    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stalled_peers_block_nobody),
        cmocka_unit_test(test_session_flood),
    };
    return cmocka_run_group_tests(tests, skip_without_daemon, NULL);
}
