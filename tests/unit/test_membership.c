/*
 * Cluster membership (cluster/membership.h), one feature per test, against
 * a real etcd (Debian's etcd-server, $KVDEPOT_ETCD) started once for the
 * program on 127.0.0.1 ports picked at run time; each test uses a cluster
 * name of its own. Skipped (77) without the etcd binary.
 *
 * Features: bad settings are refused; a node's NodeInfo reaches the other
 * nodes field for field; the view is ordered by node id and bounded by the
 * caller's room; the generation moves at each change and a stopped node
 * leaves at once (before its lease's TTL); clusters of other names are
 * invisible; registrations that do not decode are ignored and counted.
 * (Lease expiry of a killed node and a stale view while etcd is down are
 * in tests/integration/test_etcd.c.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <signal.h>
#include <unistd.h>

#include "cluster/etcd_int.h"
#include "cluster/membership.h"
#include "tests/integration/kvd_testetcd_int.h"
#include "tests/unit/kvd_testdir_int.h"

#define TIMEOUT_MS 2000
#define TTL_S 5

static etcd_proc_t g_etcd;

static int group_setup(void **state)
{
    (void)state;
    assert_true(etcd_start_ready(&g_etcd, "membership", TIMEOUT_MS));
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    etcd_kill(&g_etcd, SIGKILL);
    kvd_test_dir_remove(&g_etcd.dir);
    return 0;
}

static kvd_member_t member(const char *id)
{
    kvd_member_t m;
    memset(&m, 0, sizeof m);
    snprintf(m.node_id, sizeof m.node_id, "%s", id);
    snprintf(m.grpc_address, sizeof m.grpc_address, "127.0.0.1:1");
    m.capacity_bytes = 1u << 20;
    return m;
}

static kvd_membership_t *join(const char *cluster, const kvd_member_t *self)
{
    kvd_membership_config_t cfg = {.etcd_endpoint = g_etcd.endpoint,
                                   .cluster = cluster,
                                   .self = self,
                                   .lease_ttl_s = TTL_S,
                                   .timeout_ms = TIMEOUT_MS};
    kvd_membership_t *m = NULL;
    assert_int_equal(kvd_membership_start(&cfg, &m), KVD_OK);
    assert_non_null(m);
    return m;
}

/* Waits up to `secs` for `m`'s view to list exactly `ids` (comma-separated,
 * in order) and not be stale. */
static bool view_is(kvd_membership_t *m, const char *ids, double secs)
{
    kvd_member_t nodes[8];
    for (double end = now_s() + secs;; usleep(20000)) {
        kvd_membership_stats_t st;
        size_t n = kvd_membership_view(m, nodes, 8, &st);
        char got[256] = "";
        for (size_t i = 0; i < n && i < 8; i++) {
            size_t len = strlen(got);
            snprintf(got + len, sizeof got - len, "%s%.32s", i ? "," : "",
                     nodes[i].node_id);
        }
        if (!st.stale && strcmp(got, ids) == 0) {
            return true;
        }
        if (now_s() > end) {
            fprintf(stderr, "view: [%s]%s, want [%s]\n", got,
                    st.stale ? " (stale)" : "", ids);
            return false;
        }
    }
}

static kvd_membership_stats_t stats_of(kvd_membership_t *m)
{
    kvd_membership_stats_t st;
    (void)kvd_membership_view(m, NULL, 0, &st);
    return st;
}

static void test_bad_settings_refused(void **state)
{
    (void)state;
    kvd_member_t self = member("ok-node_1.x");
    kvd_membership_config_t good = {.etcd_endpoint = g_etcd.endpoint,
                                    .cluster = "bad-settings",
                                    .self = &self,
                                    .lease_ttl_s = TTL_S,
                                    .timeout_ms = TIMEOUT_MS};
    kvd_membership_t *m = NULL;
    kvd_membership_config_t c = good;
    c.cluster = "a/b"; /* would escape the key prefix */
    assert_int_equal(kvd_membership_start(&c, &m), KVD_ERR_INVALID);
    c.cluster = "";
    assert_int_equal(kvd_membership_start(&c, &m), KVD_ERR_INVALID);
    c = good;
    c.lease_ttl_s = 0;
    assert_int_equal(kvd_membership_start(&c, &m), KVD_ERR_INVALID);
    c = good;
    c.timeout_ms = 0;
    assert_int_equal(kvd_membership_start(&c, &m), KVD_ERR_INVALID);
    c = good;
    c.etcd_endpoint = NULL;
    assert_int_equal(kvd_membership_start(&c, &m), KVD_ERR_INVALID);
    c = good;
    c.self = NULL;
    assert_int_equal(kvd_membership_start(&c, &m), KVD_ERR_INVALID);
    kvd_member_t bad = member("has space");
    c = good;
    c.self = &bad;
    assert_int_equal(kvd_membership_start(&c, &m), KVD_ERR_INVALID);
    bad = member("");
    assert_int_equal(kvd_membership_start(&c, &m), KVD_ERR_INVALID);
    bad = member("big-address");
    bad.ucx_address_len = sizeof bad.ucx_address + 1;
    assert_int_equal(kvd_membership_start(&c, &m), KVD_ERR_INVALID);
    assert_null(m);
    assert_int_equal(kvd_membership_start(NULL, &m), KVD_ERR_INVALID);
    assert_int_equal(kvd_membership_start(&good, NULL), KVD_ERR_INVALID);
    kvd_membership_stop(NULL);
    /* The good settings do start. */
    assert_int_equal(kvd_membership_start(&good, &m), KVD_OK);
    assert_true(view_is(m, "ok-node_1.x", 10));
    kvd_membership_stop(m);
}

static void test_node_info_travels(void **state)
{
    (void)state;
    kvd_member_t a = member("a");
    snprintf(a.grpc_address, sizeof a.grpc_address, "10.1.2.3:50051");
    a.ucx_address_len = 300;
    for (size_t i = 0; i < a.ucx_address_len; i++) {
        a.ucx_address[i] = (uint8_t)(i * 7 + 1);
    }
    a.capacity_bytes = 3ull << 40;
    snprintf(a.version, sizeof a.version, "9.8.7-test");
    a.protocol_revision = 42;
    kvd_member_t b = member("b");
    kvd_membership_t *ma = join("info", &a);
    kvd_membership_t *mb = join("info", &b);
    assert_true(view_is(mb, "a,b", 10));
    kvd_member_t nodes[2];
    assert_int_equal(kvd_membership_view(mb, nodes, 2, NULL), 2);
    const kvd_member_t *got = &nodes[0];
    assert_string_equal(got->node_id, "a");
    assert_string_equal(got->grpc_address, a.grpc_address);
    assert_int_equal(got->ucx_address_len, a.ucx_address_len);
    assert_memory_equal(got->ucx_address, a.ucx_address, a.ucx_address_len);
    assert_true(got->capacity_bytes == a.capacity_bytes);
    assert_string_equal(got->version, a.version);
    assert_int_equal(got->protocol_revision, a.protocol_revision);
    /* And b's own, as a sees it. */
    assert_true(view_is(ma, "a,b", 10));
    assert_int_equal(kvd_membership_view(ma, nodes, 2, NULL), 2);
    assert_int_equal(nodes[1].ucx_address_len, 0);
    assert_true(nodes[1].capacity_bytes == b.capacity_bytes);
    kvd_membership_stop(mb);
    kvd_membership_stop(ma);
}

static void test_view_sorted_and_bounded(void **state)
{
    (void)state;
    kvd_member_t c = member("n-c"), a = member("n-a"), b = member("n-b");
    kvd_membership_t *mc = join("sorted", &c);
    kvd_membership_t *ma = join("sorted", &a);
    kvd_membership_t *mb = join("sorted", &b);
    assert_true(view_is(mc, "n-a,n-b,n-c", 10));
    /* Room for two of three: the first two, the count of all. */
    kvd_member_t nodes[3];
    memset(nodes, 0xee, sizeof nodes);
    kvd_membership_stats_t st;
    assert_int_equal(kvd_membership_view(mc, nodes, 2, &st), 3);
    assert_string_equal(nodes[0].node_id, "n-a");
    assert_string_equal(nodes[1].node_id, "n-b");
    assert_int_equal(nodes[2].node_id[0], (char)0xee); /* untouched */
    assert_int_equal(st.num_nodes, 3);
    assert_false(st.stale);
    assert_true(st.registered);
    assert_int_equal(kvd_membership_view(mc, NULL, 0, NULL), 3);
    kvd_membership_stop(ma);
    kvd_membership_stop(mb);
    kvd_membership_stop(mc);
}

static void test_generation_moves_and_stop_leaves(void **state)
{
    (void)state;
    kvd_member_t a = member("a"), b = member("b");
    kvd_membership_t *ma = join("generation", &a);
    assert_true(view_is(ma, "a", 10));
    uint64_t g1 = stats_of(ma).generation;
    kvd_membership_t *mb = join("generation", &b);
    assert_true(view_is(ma, "a,b", 10));
    uint64_t g2 = stats_of(ma).generation;
    assert_true(g2 > g1);
    /* A stopped node revokes its lease: it leaves at once, well before
     * its TTL would end it. */
    double t0 = now_s();
    kvd_membership_stop(mb);
    assert_true(view_is(ma, "a", TTL_S - 2));
    assert_true(now_s() - t0 < TTL_S - 2);
    assert_true(stats_of(ma).generation > g2);
    kvd_membership_stop(ma);
}

static void test_other_clusters_invisible(void **state)
{
    (void)state;
    kvd_member_t a = member("a"), b = member("b"), c = member("c");
    kvd_membership_t *ma = join("left", &a);
    kvd_membership_t *mb = join("right", &b);
    kvd_membership_t *mc = join("right", &c);
    assert_true(view_is(mb, "b,c", 10));
    assert_true(view_is(ma, "a", 10));
    /* Still only itself once the others are settled. */
    usleep(300000);
    assert_true(view_is(ma, "a", 0));
    kvd_membership_stop(mc);
    kvd_membership_stop(mb);
    kvd_membership_stop(ma);
}

static void test_undecodable_registrations_ignored(void **state)
{
    (void)state;
    kvd_etcd_t *e = NULL;
    assert_int_equal(kvd_etcd_open(g_etcd.endpoint, TIMEOUT_MS, &e), KVD_OK);
    static const uint8_t junk[] = {0xff, 0xff, 0xff, 0x01, 0x02};
    /* One before the node reads the prefix, one seen by its watch. */
    assert_int_equal(
        kvd_etcd_put(e, "/kvdepot/junk/nodes/x1", junk, sizeof junk, 0),
        KVD_OK);
    kvd_member_t a = member("a");
    kvd_membership_t *ma = join("junk", &a);
    assert_true(view_is(ma, "a", 10));
    assert_true(stats_of(ma).ignored >= 1);
    assert_int_equal(
        kvd_etcd_put(e, "/kvdepot/junk/nodes/x2", junk, sizeof junk, 0),
        KVD_OK);
    bool counted = false;
    for (double end = now_s() + 5; !counted && now_s() < end; usleep(20000)) {
        counted = stats_of(ma).ignored >= 2;
    }
    assert_true(counted);
    assert_true(view_is(ma, "a", 0));
    kvd_membership_stop(ma);
    kvd_etcd_close(e);
}

int main(void)
{
    if (etcd_bin() == NULL) {
        fprintf(stderr,
                "test_membership: no etcd binary (KVDEPOT_ETCD); skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_settings_refused),
        cmocka_unit_test(test_node_info_travels),
        cmocka_unit_test(test_view_sorted_and_bounded),
        cmocka_unit_test(test_generation_moves_and_stop_leaves),
        cmocka_unit_test(test_other_clusters_invisible),
        cmocka_unit_test(test_undecodable_registrations_ignored),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
