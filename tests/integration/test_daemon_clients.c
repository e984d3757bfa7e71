/*
 * kvdepotd end to end, its clients: a client opened where no daemon
 * listens fails fast, and a TCP address is refused (the data path needs
 * the unix socket); two client processes share objects (one saves, the
 * other loads the same bytes through its own mapping of the arena), with
 * reserve, release, abort and delete as the daemon answers them; a client
 * killed with SIGKILL holding leases: the daemon reclaims them after the
 * lease TTL; the admin calls (list, drop a namespace, drain).
 * Malformed/oversized requests, the token on TCP and the metrics endpoint
 * are tested from Python (tests/python/test_daemon_grpc.py).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvdepot/store.h"
#include "client/client.h"
#include "tests/unit/kvd_testdir_int.h"
#include "tests/integration/kvd_testdaemon_int.h"
#include "tests/integration/kvd_testdaemonclient_int.h"

static void test_two_processes_share(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_share");
    pid_t dpid = daemon_start(&d, (const char *)NULL);
    kvd_namespace_t ns;
    kvd_block_hash_t h[NKEYS];
    keys_make(&ns, h, NKEYS, 1);

    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        kvd_store_t *st = NULL;
        int rc = client_open(&d, "30s", "2s", &st) == KVD_OK &&
                         save_objects(st, &ns, h, NKEYS) == NKEYS
                     ? 0
                     : 1;
        kvd_store_close(st);
        _exit(rc);
    }
    int cst = 0;
    assert_int_equal(waitpid(child, &cst, 0), child);
    assert_true(WIFEXITED(cst) && WEXITSTATUS(cst) == 0);

    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    kvd_store_lease_t l[NKEYS];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, h, NKEYS, l, &m), KVD_OK);
    assert_int_equal(m, NKEYS);
    for (size_t i = 0; i < m; i++) {
        check_bytes(st, &l[i]);
    }
    assert_int_equal(daemon_leases(st), 1);
    /* Saving what is stored is refused as EXISTS, not duplicated. */
    kvd_store_reservation_t r[NKEYS];
    assert_int_equal(kvd_store_reserve(st, &ns, h, NKEYS, OBJ_BYTES, 0, r),
                     KVD_OK);
    for (size_t i = 0; i < NKEYS; i++) {
        assert_int_equal(r[i].status, KVD_ERR_EXISTS);
    }
    /* Half released: the daemon keeps the lease; all: it is gone. */
    assert_int_equal(kvd_store_release(st, l, NKEYS / 2), KVD_OK);
    assert_int_equal(daemon_leases(st), 1);
    assert_int_equal(kvd_store_release(st, l + NKEYS / 2, NKEYS / 2), KVD_OK);
    assert_int_equal(daemon_leases(st), 0);
    /* A lease released twice is an error, not a double release. */
    assert_int_equal(kvd_store_release(st, l, 1), KVD_ERR_NOT_FOUND);
    /* A prefix stops at the first missing block. */
    kvd_block_hash_t mixed[3] = {h[0], h[1], h[2]};
    mixed[1].bytes[5] = 0xEE;
    assert_int_equal(kvd_store_lookup(st, &ns, mixed, 3, l, &m), KVD_OK);
    assert_int_equal(m, 1);
    assert_int_equal(kvd_store_release(st, l, 1), KVD_OK);
    /* Abort gives a reservation back: the key stays absent. */
    kvd_block_hash_t fresh[1];
    keys_make(&ns, fresh, 1, 9);
    assert_int_equal(kvd_store_reserve(st, &ns, fresh, 1, OBJ_BYTES, 0, r),
                     KVD_OK);
    assert_int_equal(r[0].status, KVD_OK);
    kvd_store_key_t fk = {.ns = ns, .hash = fresh[0]};
    kvd_status_t as;
    assert_int_equal(kvd_store_abort(st, &fk, 1, &as), KVD_OK);
    assert_int_equal(as, KVD_OK);
    assert_int_equal(kvd_store_lookup(st, &ns, fresh, 1, l, &m), KVD_OK);
    assert_int_equal(m, 0);
    assert_int_equal(kvd_store_commit(st, &fk, 1, &as), KVD_ERR_NOT_FOUND);
    /* Delete: a leased object is kept (BUSY), the others go. */
    assert_int_equal(kvd_store_lookup(st, &ns, h, 1, l, &m), KVD_OK);
    assert_int_equal(m, 1);
    kvd_store_key_t dk[NKEYS];
    for (size_t i = 0; i < NKEYS; i++) {
        dk[i] = (kvd_store_key_t){.ns = ns, .hash = h[i]};
    }
    size_t deleted = 0;
    assert_int_equal(kvd_store_delete(st, dk, NKEYS, &deleted), KVD_ERR_BUSY);
    assert_int_equal(deleted, NKEYS - 1);
    assert_int_equal(kvd_store_release(st, l, 1), KVD_OK);
    assert_int_equal(kvd_store_delete(st, dk, NKEYS, &deleted), KVD_OK);
    assert_int_equal(deleted, 1);
    assert_int_equal(kvd_store_lookup(st, &ns, h, NKEYS, l, &m), KVD_OK);
    assert_int_equal(m, 0);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

static void test_killed_client_leases_reclaimed(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_kill");
    pid_t dpid = daemon_start(&d, (const char *)NULL);
    kvd_namespace_t ns;
    kvd_block_hash_t h[4];
    keys_make(&ns, h, 4, 3);
    /* gRPC does not survive fork(): every process here forks before it
     * opens its own client. */
    pid_t saver = fork();
    assert_true(saver >= 0);
    if (saver == 0) {
        kvd_store_t *ss = NULL;
        int rc = client_open(&d, "30s", "2s", &ss) == KVD_OK &&
                         save_objects(ss, &ns, h, 4) == 4
                     ? 0
                     : 1;
        kvd_store_close(ss);
        _exit(rc);
    }
    int sst = 0;
    assert_int_equal(waitpid(saver, &sst, 0), saver);
    assert_true(WIFEXITED(sst) && WEXITSTATUS(sst) == 0);

    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        kvd_store_t *cs = NULL;
        kvd_store_lease_t l[4];
        size_t m = 0;
        char ok = client_open(&d, "400ms", "2s", &cs) == KVD_OK &&
                          kvd_store_lookup(cs, &ns, h, 4, l, &m) == KVD_OK &&
                          m == 4
                      ? 'y'
                      : 'n';
        (void)!write(pipefd[1], &ok, 1);
        for (;;) {
            pause(); /* holds the lease until killed */
        }
    }
    /* The parent keeps no write end: a child that dies before it writes
     * fails the test at once instead of leaving the read blocked. */
    close(pipefd[1]);
    char ok = 0;
    assert_int_equal(read(pipefd[0], &ok, 1), 1);
    assert_int_equal(ok, 'y');
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    assert_int_equal(daemon_leases(st), 1);
    daemon_kill9(child);
    /* Leased objects cannot be evicted or deleted meanwhile; the daemon
     * reclaims the lease after its TTL (400 ms) plus a tick. */
    wait_leases(st, 0, 5000);
    close(pipefd[0]);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

static void test_open_without_daemon(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_none");
    kvd_store_t *st = NULL;
    uint64_t t0 = now_ms();
    assert_int_equal(client_open(&d, "30s", "500ms", &st), KVD_ERR_UNREACHABLE);
    assert_null(st);
    assert_true(now_ms() - t0 < 5000);
    /* A TCP address is refused: the data path needs the unix socket. */
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    (void)kvd_config_set(cfg, "store.mode", "daemon");
    (void)kvd_config_set(cfg, "store.address", "127.0.0.1:1");
    char err[256] = "";
    assert_int_equal(kvd_store_open(cfg, &st, err, sizeof err),
                     KVD_ERR_INVALID);
    assert_non_null(strstr(err, "store.address"));
    kvd_config_destroy(cfg);
    kvd_test_dir_remove(&d);
}

static void test_admin_list_drop_drain(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_admin");
    pid_t dpid = daemon_start(&d, (const char *)NULL);
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    kvd_client_t *c = kvd_client_of(st);
    assert_non_null(c);
    kvd_namespace_t ns1, ns2;
    kvd_block_hash_t h[NKEYS];
    keys_make(&ns1, h, NKEYS, 5);
    ns2 = ns1;
    ns2.bytes[0] ^= 0xFF;
    assert_int_equal(save_objects(st, &ns1, h, 5), 5);
    assert_int_equal(save_objects(st, &ns2, h, 3), 3);

    kvd_client_ns_usage_t *nu = NULL;
    kvd_client_tenant_usage_t *tu = NULL;
    size_t nn = 0, nt = 0;
    bool trunc = true;
    assert_int_equal(kvd_client_list(c, &nu, &nn, &tu, &nt, &trunc), KVD_OK);
    assert_int_equal(nn, 2);
    assert_false(trunc);
    uint64_t total = 0;
    for (size_t i = 0; i < nn; i++) {
        bool first = memcmp(&nu[i].ns, &ns1, sizeof ns1) == 0;
        assert_int_equal(nu[i].host_objects, first ? 5 : 3);
        assert_int_equal(nu[i].bytes, (first ? 5u : 3u) * OBJ_BYTES);
        total += nu[i].host_objects;
    }
    assert_int_equal(total, 8);
    assert_int_equal(nt, 1);
    assert_int_equal(tu[0].objects, 8);
    free(nu);
    free(tu);

    /* Drop ns1, with one of its objects leased: that one stays. */
    kvd_store_lease_t l[NKEYS];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns1, h, 1, l, &m), KVD_OK);
    assert_int_equal(m, 1);
    uint64_t dropped = 0;
    assert_int_equal(kvd_client_drop_namespace(c, &ns1, &dropped), KVD_OK);
    assert_int_equal(dropped, 4);
    assert_int_equal(kvd_store_release(st, l, 1), KVD_OK);
    assert_int_equal(kvd_client_drop_namespace(c, &ns1, &dropped), KVD_OK);
    assert_int_equal(dropped, 1);
    assert_int_equal(kvd_store_lookup(st, &ns1, h, NKEYS, l, &m), KVD_OK);
    assert_int_equal(m, 0);
    assert_int_equal(kvd_store_lookup(st, &ns2, h, 3, l, &m), KVD_OK);
    assert_int_equal(m, 3);
    assert_int_equal(kvd_store_release(st, l, 3), KVD_OK);

    /* Draining: saves are refused, loads still served; then back. */
    uint64_t leases = 9, resv = 9;
    assert_int_equal(kvd_client_drain(c, true, &leases, &resv), KVD_OK);
    assert_int_equal(leases, 0);
    assert_int_equal(resv, 0);
    assert_int_equal(save_objects(st, &ns1, h, 2), 0);
    assert_int_equal(kvd_store_lookup(st, &ns2, h, 3, l, &m), KVD_OK);
    assert_int_equal(m, 3);
    assert_int_equal(kvd_store_release(st, l, 3), KVD_OK);
    assert_int_equal(kvd_client_drain(c, false, &leases, &resv), KVD_OK);
    assert_int_equal(save_objects(st, &ns1, h, 2), 2);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_without_daemon),
        cmocka_unit_test(test_two_processes_share),
        cmocka_unit_test(test_killed_client_leases_reclaimed),
        cmocka_unit_test(test_admin_list_drop_drain),
    };
    return cmocka_run_group_tests(tests, skip_without_daemon, NULL);
}
