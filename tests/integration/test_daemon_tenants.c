/*
 * kvdepotd end to end, its tenants: server.tenant_max_leased caps what one
 * tenant holds leased, and server.tenants binds a client to the tenant of
 * its unix user whatever its requests say (as root: a child as uid 65534),
 * and such a client's Stats are its tenant's figures only.
 * The tenants' own arenas are test_daemon_arenas.c; tenants over TCP
 * tokens and certificates are tested from Python
 * (tests/python/test_daemon_grpc.py).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
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

/* What a child of another tenant is given. */
typedef struct team_b_args {
    const kvd_test_dir_t *d;
    const kvd_namespace_t *ns;
    const kvd_block_hash_t *h;
    bool save;
} team_b_args_t;

/* As uid 65534: saves keys h[0..2). Exit code 0 when both were saved. */
static int nobody_saves_two(void *arg)
{
    const team_b_args_t *a = arg;
    kvd_store_t *cs = NULL;
    int rc = setgid(65534) == 0 && setuid(65534) == 0 &&
                     client_open(a->d, "30s", "2s", &cs) == KVD_OK &&
                     save_objects(cs, a->ns, a->h, 2) == 2
                 ? 0
                 : 1;
    kvd_store_close(cs);
    return rc;
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
    team_b_args_t a = {.d = &d, .ns = &ns, .h = h, .save = true};
    assert_int_equal(run_in_child(nobody_saves_two, &a), 0);
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

/* Team B's process (uid 65534): saves and looks up its 4 objects when
 * `save`, then checks its Stats show those 4 objects and 4 hits, nothing
 * of team A's. Returns 0 when all holds. */
static int stats_team_b(const kvd_test_dir_t *d, const kvd_namespace_t *ns,
                        const kvd_block_hash_t *h, bool save)
{
    kvd_store_t *cs = NULL;
    if (setgid(65534) != 0 || setuid(65534) != 0 ||
        client_open(d, "30s", "2s", &cs) != KVD_OK) {
        return 1;
    }
    int rc = 0;
    kvd_store_lease_t l[4];
    size_t m = 0;
    if (save && (save_objects(cs, ns, h, 4) != 4 ||
                 kvd_store_lookup(cs, ns, h, 4, l, &m) != KVD_OK || m != 4 ||
                 kvd_store_release(cs, l, m) != KVD_OK)) {
        rc = 2;
    }
    kvd_store_stats_t s;
    if (rc == 0 && kvd_store_stats(cs, &s) != KVD_OK) {
        rc = 3;
    }
    if (rc == 0) {
        fprintf(
            stderr, "  team-b Stats: %llu objects, %llu hits, %llu misses\n",
            (unsigned long long)s.host.objects, (unsigned long long)s.host.hits,
            (unsigned long long)s.host.misses);
        rc = s.host.objects == 4 && s.host.bytes == 4 * OBJ_BYTES &&
                     s.host.hits == 4 && s.host.misses == 0 && s.leases == 0
                 ? 0
                 : 4;
    }
    kvd_store_close(cs);
    return rc;
}

static int stats_team_b_main(void *arg)
{
    const team_b_args_t *a = arg;
    return stats_team_b(a->d, a->ns, a->h, a->save);
}

static void stats_team_b_run(const kvd_test_dir_t *d, const kvd_namespace_t *ns,
                             const kvd_block_hash_t *h, bool save)
{
    team_b_args_t a = {.d = d, .ns = ns, .h = h, .save = save};
    assert_int_equal(run_in_child(stats_team_b_main, &a), 0);
}

/* Stats of a client bound to a tenant are its tenant's: team A (this
 * process's uid, its own 4 MiB arena) saves 3 objects and finds 3 of 4;
 * its Stats show exactly that and its arena's size as capacity, not the
 * daemon's totals. As root, team B (uid 65534) saves and reads 4 objects
 * of its own before, and its Stats show none of team A's, before and
 * after. */
/* /metrics has the same figures per tenant as each tenant's Stats: team A's
 * 3 objects, 3 hits and 1 miss and its arena's size; team B's 4 objects
 * (as root); nothing saved without a tenant. */
static void tenant_metrics_check(const kvd_test_dir_t *d, bool root)
{
    static const struct {
        const char *name;
        double want;
    } a[] = {
        {"kvdepot_tenant_objects{tenant=\"team-a\",tier=\"host\"}", 3},
        {"kvdepot_tenant_bytes{tenant=\"team-a\",tier=\"host\"}",
         3 * OBJ_BYTES},
        {"kvdepot_tenant_hits_total{tenant=\"team-a\",tier=\"host\"}", 3},
        {"kvdepot_tenant_misses_total{tenant=\"team-a\",tier=\"host\"}", 1},
        {"kvdepot_tenant_capacity_bytes{tenant=\"team-a\"}", 4u << 20},
        {"kvdepot_tenant_objects{tenant=\"(none)\",tier=\"host\"}", 0},
    };
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) {
        double v = kvd_test_daemon_metric(d, a[i].name);
        if (v != a[i].want) {
            fprintf(stderr, "%s: %g, want %g\n", a[i].name, v, a[i].want);
        }
        assert_true(v == a[i].want);
    }
    if (root) {
        assert_true(kvd_test_daemon_metric(
                        d, "kvdepot_tenant_objects{tenant=\"team-b\","
                           "tier=\"host\"}") == 4);
    }
}

static void test_tenant_stats(void **state)
{
    (void)state;
    bool root = geteuid() == 0;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_tenant_stats");
    assert_int_equal(chmod(d.path, 0755), 0);
    char tenants[96];
    snprintf(tenants, sizeof tenants, "server.tenants=%u=team-a%s",
             (unsigned)getuid(), root ? ",65534=team-b" : "");
    pid_t dpid = daemon_start(
        &d, tenants, "server.tenant_arenas=team-a=4m", "server.unix_mode=0666",
        "server.metrics_address=127.0.0.1:0", (const char *)NULL);
    kvd_namespace_t ns;
    kvd_block_hash_t hb[4], ha[4];
    keys_make(&ns, hb, 4, 0xB1);
    keys_make(&ns, ha, 4, 0xA1);
    /* Children fork while this process has no client open (a gRPC client
     * does not survive a fork). */
    if (root) {
        stats_team_b_run(&d, &ns, hb, true);
    } else {
        fprintf(stderr, "not root: team B's side not tested\n");
    }
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    assert_int_equal(save_objects(st, &ns, ha, 3), 3);
    kvd_store_lease_t l[4];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, ha, 4, l, &m), KVD_OK);
    assert_int_equal(m, 3);
    assert_int_equal(kvd_store_release(st, l, m), KVD_OK);
    kvd_store_stats_t s;
    assert_int_equal(kvd_store_stats(st, &s), KVD_OK);
    fprintf(stderr,
            "  team-a Stats: %llu objects, %llu hits, %llu misses, "
            "capacity %llu\n",
            (unsigned long long)s.host.objects, (unsigned long long)s.host.hits,
            (unsigned long long)s.host.misses,
            (unsigned long long)s.host.capacity_bytes);
    assert_int_equal(s.host.objects, 3);
    assert_int_equal(s.host.bytes, 3 * OBJ_BYTES);
    assert_int_equal(s.host.hits, 3);
    assert_int_equal(s.host.misses, 1);
    assert_int_equal(s.host.capacity_bytes, 4u << 20);
    assert_int_equal(s.leases, 0);
    kvd_store_close(st);
    if (root) {
        stats_team_b_run(&d, &ns, hb, false);
    }
    tenant_metrics_check(&d, root);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tenant_lease_cap),
        cmocka_unit_test(test_tenant_of_user),
        cmocka_unit_test(test_tenant_stats),
    };
    return cmocka_run_group_tests(tests, skip_without_daemon, NULL);
}
