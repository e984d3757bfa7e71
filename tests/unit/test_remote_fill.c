/*
 * A clustered node's remote fill and offers (cluster/remote.h), one
 * feature per test: nodes of this process, each an embedded store with
 * its kvd_remote_t, over UCX on loopback TCP (UCX_NET_DEVICES=lo,
 * UCX_TLS=tcp) and a real etcd (Debian's etcd-server, $KVDEPOT_ETCD)
 * started once for the program on 127.0.0.1 ports picked at run time;
 * each test is a cluster of its own name. Skipped (77) without the etcd
 * binary.
 *
 * Features: a node alone asks nobody; a miss is filled from the keys'
 * home, byte for byte; the prefix ends at the first key nobody holds; the
 * source node is asked before the homes (and this node never names
 * itself); a node whose call failed is skipped while it is a suspect; a
 * save is pushed to its homes; a node that joins gets what it is home to
 * by repair.
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
#include "cluster/peer.h"
#include "cluster/placement.h"
#include "cluster/remote.h"
#include "kvdepot/store.h"
#include "tests/integration/kvd_testetcd_int.h"
#include "tests/unit/kvd_testdir_int.h"

#define TIMEOUT_MS 2000
#define TTL_S 5
#define SIZE 4096u
#define CAPACITY (1ull << 30)

static etcd_proc_t g_etcd;

static const kvd_namespace_t g_ns = {
    {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5, 6}};

typedef struct node {
    char id[32];
    kvd_store_t *store;
    kvd_remote_t *remote;
    kvd_member_t self;
} node_t;

static int group_setup(void **state)
{
    (void)state;
    assert_true(etcd_start_ready(&g_etcd, "remote_fill", TIMEOUT_MS));
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    etcd_kill(&g_etcd, SIGKILL);
    kvd_test_dir_remove(&g_etcd.dir);
    return 0;
}

static kvd_store_t *store_open(void)
{
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    static const char *const kv[] = {
        "store.arena_size",      "16m", "store.arena_chunk",    "4m",
        "store.arena_hugepages", "off", "store.arena_prefault", "false",
        "store.reserve_timeout", "0"};
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i += 2) {
        assert_int_equal(kvd_config_set(cfg, kv[i], kv[i + 1]), KVD_OK);
    }
    char err[256] = "";
    kvd_store_t *s = NULL;
    assert_int_equal(kvd_store_open(cfg, &s, err, sizeof err), KVD_OK);
    kvd_config_destroy(cfg);
    return s;
}

static void node_start(node_t *nd, const char *cluster, const char *id,
                       size_t replicas)
{
    memset(nd, 0, sizeof *nd);
    snprintf(nd->id, sizeof nd->id, "%s", id);
    nd->store = store_open();
    snprintf(nd->self.node_id, sizeof nd->self.node_id, "%s", id);
    snprintf(nd->self.grpc_address, sizeof nd->self.grpc_address,
             "127.0.0.1:1");
    nd->self.capacity_bytes = CAPACITY;
    kvd_remote_config_t rc = {
        .store = nd->store,
        .etcd_endpoint = g_etcd.endpoint,
        .cluster = cluster,
        .self = &nd->self,
        .lease_ttl_s = TTL_S,
        .token = "",
        .replicas = replicas,
        .timeout_ms = TIMEOUT_MS,
        .queue = 1024,
        .part_bytes = 0,
    };
    char err[256] = "";
    kvd_status_t s = kvd_remote_start(&rc, &nd->remote, err, sizeof err);
    if (s != KVD_OK) {
        fprintf(stderr, "%s\n", err);
    }
    assert_int_equal(s, KVD_OK);
    assert_true(nd->self.ucx_address_len > 0); /* filled in by the start */
}

static void node_stop(node_t *nd)
{
    kvd_remote_stop(nd->remote);
    kvd_store_close(nd->store);
}

/* Waits until `nd` sees `n` nodes in a fresh view. */
static void wait_view(node_t *nd, size_t n)
{
    for (double end = now_s() + 10; now_s() < end; usleep(20000)) {
        kvd_membership_stats_t st;
        if (kvd_remote_view_stats(nd->remote, &st) && !st.stale &&
            st.num_nodes == n) {
            return;
        }
    }
    fail_msg("%s does not see %zu nodes", nd->id, n);
}

/* Waits until both nodes see each other and their movers have run the
 * repair scans the join started (so objects put afterwards move only
 * when a test makes them). */
static void settle(node_t *a, node_t *b)
{
    wait_view(a, 2);
    wait_view(b, 2);
    usleep(600000); /* three mover ticks */
}

static kvd_remote_stats_t stats_of(node_t *nd)
{
    kvd_remote_stats_t st;
    kvd_remote_stats(nd->remote, &st);
    return st;
}

static kvd_block_hash_t key_hash(unsigned i)
{
    kvd_block_hash_t h;
    memset(&h, 0, sizeof h);
    h.bytes[0] = (uint8_t)i;
    h.bytes[1] = (uint8_t)(i >> 8);
    h.bytes[31] = 0xc3;
    return h;
}

static void pattern(uint8_t *p, size_t n, unsigned seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 7;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

/* Saves key `i` (SIZE pattern bytes) in nd's store. */
static void put(node_t *nd, unsigned i)
{
    kvd_block_hash_t h = key_hash(i);
    kvd_store_reservation_t r;
    assert_int_equal(kvd_store_reserve(nd->store, &g_ns, &h, 1, SIZE, 0, &r),
                     KVD_OK);
    assert_int_equal(r.status, KVD_OK);
    uint8_t *dst = kvd_store_arena_ptr(nd->store, r.arena_offset, SIZE);
    assert_non_null(dst);
    pattern(dst, SIZE, i);
    kvd_store_key_t k = {.ns = g_ns, .hash = h};
    assert_int_equal(kvd_store_commit(nd->store, &k, 1, NULL), KVD_OK);
}

/* True when nd holds key `i` with its pattern bytes. */
static bool holds(node_t *nd, unsigned i)
{
    kvd_block_hash_t h = key_hash(i);
    kvd_store_lease_t l;
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(nd->store, &g_ns, &h, 1, &l, &m), KVD_OK);
    if (m == 0) {
        return false;
    }
    uint8_t want[SIZE];
    pattern(want, SIZE, i);
    bool same = l.size_bytes == SIZE &&
                memcmp(kvd_store_arena_ptr(nd->store, l.arena_offset, SIZE),
                       want, SIZE) == 0;
    assert_int_equal(kvd_store_release(nd->store, &l, 1), KVD_OK);
    return same;
}

static bool holds_soon(node_t *nd, unsigned i, double secs)
{
    for (double end = now_s() + secs; now_s() < end; usleep(20000)) {
        if (holds(nd, i)) {
            return true;
        }
    }
    return false;
}

/* Keys (from 0 up) whose first home among `nodes` (R = 1) is `home`. */
static void keys_homed_at(const node_t *const *nodes, size_t n, size_t home,
                          unsigned *keys, size_t want)
{
    kvd_member_t m[4];
    for (size_t i = 0; i < n; i++) {
        m[i] = nodes[i]->self;
    }
    size_t got = 0;
    for (unsigned i = 0; got < want && i < 10000; i++) {
        kvd_store_key_t k = {.ns = g_ns, .hash = key_hash(i)};
        size_t idx = 0;
        assert_int_equal(kvd_placement_homes(&k, m, n, 1, &idx), 1);
        if (idx == home) {
            keys[got++] = i;
        }
    }
    assert_int_equal(got, want);
}

static void test_alone_asks_nobody(void **state)
{
    (void)state;
    node_t a;
    node_start(&a, "alone", "a", 2);
    wait_view(&a, 1);
    kvd_block_hash_t h[2] = {key_hash(0), key_hash(1)};
    assert_int_equal(kvd_remote_fill(a.remote, &g_ns, h, 2, NULL, 0), 0);
    assert_int_equal(kvd_remote_fill(a.remote, &g_ns, h, 0, NULL, 0), 0);
    assert_int_equal(kvd_remote_fill(a.remote, NULL, h, 2, NULL, 0), 0);
    assert_int_equal(kvd_remote_fill(NULL, &g_ns, h, 2, NULL, 0), 0);
    kvd_remote_stats_t st = stats_of(&a);
    assert_true(st.lookups == 0);
    assert_true(st.peer.requests_sent == 0);
    node_stop(&a);
}

static void test_miss_filled_from_home(void **state)
{
    (void)state;
    node_t a, b;
    node_start(&a, "home", "a", 2); /* R = 2 of 2: b is every key's home */
    node_start(&b, "home", "b", 2);
    settle(&a, &b);
    kvd_block_hash_t h[4];
    for (unsigned i = 0; i < 4; i++) {
        put(&b, i);
        h[i] = key_hash(i);
        assert_false(holds(&a, i));
    }
    assert_int_equal(kvd_remote_fill(a.remote, &g_ns, h, 4, NULL, 0), 4);
    for (unsigned i = 0; i < 4; i++) {
        assert_true(holds(&a, i));
    }
    kvd_remote_stats_t st = stats_of(&a);
    assert_true(st.lookups == 1);
    assert_true(st.remote_hits == 4);
    assert_true(st.lookup_errors == 0);
    assert_true(st.peer.objects_fetched == 4);
    assert_true(st.peer.bytes_fetched == 4 * SIZE);
    /* Already here: found there again, but nothing new is fetched. */
    assert_int_equal(kvd_remote_fill(a.remote, &g_ns, h, 4, NULL, 0), 4);
    assert_true(stats_of(&a).remote_hits == 4);
    node_stop(&b);
    node_stop(&a);
}

static void test_prefix_ends_at_first_gap(void **state)
{
    (void)state;
    node_t a, b;
    node_start(&a, "prefix", "a", 2);
    node_start(&b, "prefix", "b", 2);
    settle(&a, &b);
    kvd_block_hash_t h[4];
    for (unsigned i = 0; i < 4; i++) {
        h[i] = key_hash(i);
        if (i != 2) {
            put(&b, i);
        }
    }
    assert_int_equal(kvd_remote_fill(a.remote, &g_ns, h, 4, NULL, 0), 2);
    assert_true(holds(&a, 0));
    assert_true(holds(&a, 1));
    assert_false(holds(&a, 2));
    assert_false(holds(&a, 3)); /* after the gap: not fetched */
    assert_true(stats_of(&a).remote_hits == 2);
    node_stop(&b);
    node_stop(&a);
}

static void test_source_asked_before_homes(void **state)
{
    (void)state;
    node_t a, b;
    node_start(&a, "source", "a", 1);
    node_start(&b, "source", "b", 1);
    settle(&a, &b);
    /* Keys whose only home (R = 1) is a itself: without a source, a has
     * nobody to ask. b computed them (it holds them). */
    const node_t *view[2] = {&a, &b};
    unsigned k[3];
    keys_homed_at(view, 2, 0, k, 3);
    kvd_block_hash_t h[3];
    for (size_t i = 0; i < 3; i++) {
        put(&b, k[i]);
        h[i] = key_hash(k[i]);
    }
    assert_int_equal(kvd_remote_fill(a.remote, &g_ns, h, 3, NULL, 0), 0);
    assert_int_equal(kvd_remote_fill(a.remote, &g_ns, h, 3, "", 0), 0);
    assert_int_equal(kvd_remote_fill(a.remote, &g_ns, h, 3, "a", 0), 0);
    assert_int_equal(kvd_remote_fill(a.remote, &g_ns, h, 3, "nobody", 0), 0);
    assert_true(stats_of(&a).peer.requests_sent == 0);
    assert_int_equal(kvd_remote_fill(a.remote, &g_ns, h, 3, "b", 0), 3);
    for (size_t i = 0; i < 3; i++) {
        assert_true(holds(&a, k[i]));
    }
    node_stop(&b);
    node_stop(&a);
}

static void test_failed_node_skipped_as_suspect(void **state)
{
    (void)state;
    node_t a;
    node_start(&a, "suspect", "a", 1);
    /* A ghost: in the view with the address of a data plane that is gone. */
    kvd_peer_config_t pc = {.store = a.store, .node_id = "ghost"};
    kvd_peer_t *gone = NULL;
    char err[256] = "";
    assert_int_equal(kvd_peer_start(&pc, &gone, err, sizeof err), KVD_OK);
    node_t ghost;
    memset(&ghost, 0, sizeof ghost);
    snprintf(ghost.self.node_id, sizeof ghost.self.node_id, "ghost");
    ghost.self.capacity_bytes = CAPACITY;
    const uint8_t *addr = kvd_peer_address(gone, &ghost.self.ucx_address_len);
    memcpy(ghost.self.ucx_address, addr, ghost.self.ucx_address_len);
    kvd_peer_stop(gone);
    kvd_membership_config_t mc = {.etcd_endpoint = g_etcd.endpoint,
                                  .cluster = "suspect",
                                  .self = &ghost.self,
                                  .lease_ttl_s = TTL_S,
                                  .timeout_ms = TIMEOUT_MS};
    kvd_membership_t *mg = NULL;
    assert_int_equal(kvd_membership_start(&mc, &mg), KVD_OK);
    wait_view(&a, 2);
    const node_t *view[2] = {&a, &ghost};
    unsigned k[2];
    keys_homed_at(view, 2, 1, k, 2);
    kvd_block_hash_t h[2] = {key_hash(k[0]), key_hash(k[1])};

    /* The first fill asks the ghost and fails (refused, or the deadline). */
    double t0 = now_s();
    assert_int_equal(kvd_remote_fill(a.remote, &g_ns, h, 2, NULL, 0), 0);
    double first = now_s() - t0;
    kvd_remote_stats_t st1 = stats_of(&a);
    assert_true(st1.lookup_errors == 1);
    assert_true(st1.suspect_skips == 0);
    /* The next ones within a lease TTL do not ask it again. */
    t0 = now_s();
    assert_int_equal(kvd_remote_fill(a.remote, &g_ns, h, 2, NULL, 0), 0);
    double second = now_s() - t0;
    kvd_remote_stats_t st2 = stats_of(&a);
    assert_true(st2.suspect_skips == 2);
    assert_true(st2.lookup_errors == 1);
    assert_true(st2.peer.requests_sent == st1.peer.requests_sent);
    assert_true(second < 0.5 * TIMEOUT_MS / 1000.0);
    fprintf(stderr, "suspect: first fill %.3f s, second %.3f s\n", first,
            second);
    kvd_membership_stop(mg);
    node_stop(&a);
}

static void test_save_pushed_to_home(void **state)
{
    (void)state;
    node_t a, b;
    node_start(&a, "push", "a", 2);
    node_start(&b, "push", "b", 2);
    settle(&a, &b);
    uint64_t repair_offers = stats_of(&a).repair_offers;
    kvd_block_hash_t h[3];
    for (unsigned i = 0; i < 3; i++) {
        put(&a, 10 + i);
        h[i] = key_hash(10 + i);
    }
    kvd_remote_saved(a.remote, &g_ns, h, 3, SIZE, 0);
    for (unsigned i = 0; i < 3; i++) {
        assert_true(holds_soon(&b, 10 + i, 10));
    }
    kvd_remote_stats_t sa = stats_of(&a);
    assert_true(sa.pushes == 3);
    assert_true(sa.push_errors == 0);
    assert_true(sa.repair_offers == repair_offers);
    kvd_remote_stats_t sb = stats_of(&b);
    assert_true(sb.pulls == 3);
    assert_true(sb.peer.offers_received >= 1);
    node_stop(&b);
    node_stop(&a);
}

static void test_joining_home_repaired(void **state)
{
    (void)state;
    node_t a, b;
    node_start(&a, "repair", "a", 2);
    wait_view(&a, 1);
    for (unsigned i = 0; i < 3; i++) {
        put(&a, 20 + i); /* saved while a was alone: pushed nowhere */
    }
    node_start(&b, "repair", "b", 2);
    wait_view(&a, 2);
    for (unsigned i = 0; i < 3; i++) {
        assert_true(holds_soon(&b, 20 + i, 10));
    }
    kvd_remote_stats_t sa = stats_of(&a);
    assert_true(sa.repairs >= 1);
    assert_true(sa.repair_offers >= 3);
    assert_true(stats_of(&b).pulls >= 3);
    /* Offers that reached b while it joined waited for its view. */
    assert_int_equal(stats_of(&b).dropped, 0);
    node_stop(&b);
    node_stop(&a);
}

int main(void)
{
    if (etcd_bin() == NULL) {
        fprintf(stderr,
                "test_remote_fill: no etcd binary (KVDEPOT_ETCD); skipped\n");
        return 77;
    }
    /* Loopback TCP only, whatever the environment says. */
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TLS", "tcp", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alone_asks_nobody),
        cmocka_unit_test(test_miss_filled_from_home),
        cmocka_unit_test(test_prefix_ends_at_first_gap),
        cmocka_unit_test(test_source_asked_before_homes),
        cmocka_unit_test(test_failed_node_skipped_as_suspect),
        cmocka_unit_test(test_save_pushed_to_home),
        cmocka_unit_test(test_joining_home_repaired),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
