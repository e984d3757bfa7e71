/*
 * kvdepotd end to end, its tenants: server.tenant_max_leased caps what one
 * tenant holds leased, and server.tenants binds a client to the tenant of
 * its unix user whatever its requests say (as root: a child as uid 65534).
 * The tenants' own arenas are test_daemon_arenas.c; tenants over TCP
 * tokens and certificates are tested from Python
 * (tests/python/test_daemon_grpc.py).
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

/*
 * server.tenant_max_leased caps what one tenant holds leased (issue
 * "Reliability and security": request limits so one client cannot pin the
 * whole cache). With room for two objects, a lookup of four matches a
 * prefix of two, a second one matches nothing while those are held, and
 * once they are given back four are matched in two again; refusals are
 * counted.
 */
static void test_tenant_lease_cap(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_lease_cap");
    char cap[64];
    snprintf(cap, sizeof cap, "server.tenant_max_leased=%u", 2 * OBJ_BYTES);
    pid_t dpid = daemon_start(&d, cap, "server.metrics_address=127.0.0.1:0",
                              (const char *)NULL);
    kvd_namespace_t ns;
    kvd_block_hash_t h[4];
    keys_make(&ns, h, 4, 11);
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    assert_int_equal(save_objects(st, &ns, h, 4), 4);

    kvd_store_lease_t l[4], l2[4];
    size_t m = 99;
    assert_int_equal(kvd_store_lookup(st, &ns, h, 4, l, &m), KVD_OK);
    assert_int_equal(m, 2);
    for (size_t i = 0; i < m; i++) {
        check_bytes(st, &l[i]);
    }
    size_t m2 = 99;
    assert_int_equal(kvd_store_lookup(st, &ns, h, 4, l2, &m2), KVD_OK);
    assert_int_equal(m2, 0);
    assert_true(kvd_test_daemon_metric(&d, "kvdepot_leases_refused_total") >=
                6);
    assert_int_equal(kvd_store_release(st, l, m), KVD_OK);
    /* The release reaches the daemon with the next call (or 2 ms later). */
    uint64_t deadline = now_ms() + 5000;
    for (;;) {
        assert_int_equal(kvd_store_lookup(st, &ns, h, 4, l2, &m2), KVD_OK);
        if (m2 > 0) {
            break;
        }
        assert_true(now_ms() < deadline);
        usleep(20000);
    }
    assert_int_equal(m2, 2);
    assert_int_equal(kvd_store_release(st, l2, m2), KVD_OK);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

/* server.tenants: a client's saves count against the tenant of its user,
 * whatever its requests say. Needs root (a child switches to uid 65534). */
static void test_tenant_of_user(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        fprintf(stderr, "not root: tenant mapping by uid not tested\n");
        return;
    }
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_tenant");
    assert_int_equal(chmod(d.path, 0755), 0);
    pid_t dpid = daemon_start(&d, "server.tenants=65534=team-nobody",
                              "server.unix_mode=0666", (const char *)NULL);
    kvd_namespace_t ns;
    kvd_block_hash_t h[NKEYS];
    keys_make(&ns, h, NKEYS, 6);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        kvd_store_t *cs = NULL;
        int rc = setgid(65534) == 0 && setuid(65534) == 0 &&
                         client_open(&d, "30s", "2s", &cs) == KVD_OK &&
                         save_objects(cs, &ns, h, 2) == 2
                     ? 0
                     : 1;
        kvd_store_close(cs);
        _exit(rc);
    }
    int cst = 0;
    assert_int_equal(waitpid(child, &cst, 0), child);
    assert_true(WIFEXITED(cst) && WEXITSTATUS(cst) == 0);
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    assert_int_equal(save_objects(st, &ns, h + 2, 3), 3);
    kvd_client_ns_usage_t *nu = NULL;
    kvd_client_tenant_usage_t *tu = NULL;
    size_t nn = 0, nt = 0;
    bool trunc = false;
    assert_int_equal(
        kvd_client_list(kvd_client_of(st), &nu, &nn, &tu, &nt, &trunc), KVD_OK);
    uint32_t team = (uint32_t)kvd_xxh3_64("team-nobody", 11);
    team = team == 0 ? 1 : team;
    assert_int_equal(nt, 2);
    for (size_t i = 0; i < nt; i++) {
        if (tu[i].tenant == team) {
            assert_int_equal(tu[i].objects, 2);
        } else {
            assert_int_equal(tu[i].tenant, 0);
            assert_int_equal(tu[i].objects, 3);
        }
    }
    free(nu);
    free(tu);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tenant_lease_cap),
        cmocka_unit_test(test_tenant_of_user),
    };
    return cmocka_run_group_tests(tests, skip_without_daemon, NULL);
}
