/*
 * Three kvdepotd and one etcd on 127.0.0.1 (docs/cluster.md): a chain saved
 * through node A is loaded, byte for byte, through node C; with R=2 the
 * chain stays loadable after A is SIGKILLed (its keys' other homes have
 * them); lookups while A is dead but still in the view route around it
 * within cluster.timeout, never hang; a decode node naming the prefill
 * node (transfer params) gets the blocks at once, byte for byte; with etcd
 * stopped the nodes keep their last view and keep working. UCX on
 * loopback TCP (ctest sets UCX_NET_DEVICES=lo, UCX_TLS=tcp; the daemons inherit
 * them). Skipped (77) without etcd or kvdepotd.
 *
 * The engines' side is the daemon-mode store client (store.mode: daemon),
 * opened only after every child process has been started: gRPC does not
 * survive fork().
 */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/placement.h"
#include "kvdepot/store.h"
#include "client/client.h"
#include "tests/integration/kvd_testetcd_int.h" /* first: kvd_test_dir_t */

#include "tests/integration/kvd_testchain_int.h"
#include "tests/integration/kvd_testdaemon_int.h"

#define NODES 4 /* A, B, C, and D: NVMe tier, pushes off (failpoint) */
#define CHAIN 6
#define OBJ (256u << 10)

typedef struct cluster {
    etcd_proc_t etcd;
    kvd_test_dir_t dir[NODES];
    pid_t pid[NODES];
    kvd_store_t *client[NODES];
} cluster_t;

static kvd_namespace_t g_ns = {{0xc1, 0x05, 0x7e, 0x12}};

static pid_t spawn(const kvd_test_dir_t *d, const char *failpoints, ...)
{
    va_list ap;
    va_start(ap, failpoints);
    pid_t pid = kvd_test_daemon_spawn(d, failpoints, ap);
    va_end(ap);
    return pid;
}

static void client_open(cluster_t *c, int i)
{
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    char addr[300];
    snprintf(addr, sizeof addr, "unix:%s/d.sock", c->dir[i].path);
    assert_int_equal(kvd_config_set(cfg, "store.mode", "daemon"), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.address", addr), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.timeout", "5s"), KVD_OK);
    char err[256] = "";
    kvd_status_t s = kvd_store_open(cfg, &c->client[i], err, sizeof err);
    if (s != KVD_OK) {
        fprintf(stderr, "client %d: %s\n", i, err);
    }
    assert_int_equal(s, KVD_OK);
    kvd_config_destroy(cfg);
}

static int setup(void **state)
{
    if (etcd_bin() == NULL || kvd_test_daemon_bin() == NULL) {
        return -1;
    }
    cluster_t *c = calloc(1, sizeof *c);
    assert_non_null(c);
    kvd_test_dir_make(&c->etcd.dir, "cluster_etcd");
    c->etcd.client_port = free_port();
    c->etcd.peer_port = free_port();
    snprintf(c->etcd.endpoint, sizeof c->etcd.endpoint, "127.0.0.1:%d",
             c->etcd.client_port);
    etcd_start(&c->etcd);
    /* Node C is given a dead endpoint first: it joins through the
     * second (docs/cluster.md, several endpoints). */
    char etcd[96], etcd_c[128];
    snprintf(etcd, sizeof etcd, "cluster.etcd=%s", c->etcd.endpoint);
    snprintf(etcd_c, sizeof etcd_c, "cluster.etcd=127.0.0.1:%d,%s", free_port(),
             c->etcd.endpoint);
    static const char *const ids[NODES] = {
        "server.node_id=node-a", "server.node_id=node-b",
        "server.node_id=node-c", "server.node_id=node-d"};
    for (int i = 0; i < NODES; i++) {
        kvd_test_dir_make(&c->dir[i], "cluster");
        char disk[300];
        snprintf(disk, sizeof disk, "store.disk_path=%s", c->dir[i].path);
        bool d = i == NODES - 1;
        /* B's first offer to a home fails: test_failed_push_is_retried. */
        const char *fp = d        ? "cluster.push=EIO"
                         : i == 1 ? "cluster.offer=EIO@1"
                                  : NULL;
        c->pid[i] = spawn(&c->dir[i], fp, ids[i], i == 2 ? etcd_c : etcd,
                          "cluster.name=t", "cluster.lease_ttl=2s",
                          "cluster.replicas=2", "cluster.timeout=1500ms",
                          "server.metrics_address=127.0.0.1:0",
                          d ? disk : "store.disk_path=", "store.disk_size=32m",
                          "store.disk_write=through",
                          "store.disk_admission=all", (char *)NULL);
    }
    for (int i = 0; i < NODES; i++) {
        kvd_test_daemon_wait_ready(&c->dir[i], c->pid[i]);
    }
    /* Every node sees the three (registration is asynchronous). */
    uint64_t t0 = kvd_test_now_ms();
    for (int i = 0; i < NODES; i++) {
        while (kvd_test_daemon_metric(&c->dir[i], "kvdepot_cluster_nodes") !=
               NODES) {
            assert_true(kvd_test_now_ms() - t0 < 20000);
            usleep(20000);
        }
    }
    for (int i = 0; i < NODES; i++) {
        client_open(c, i);
    }
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    cluster_t *c = *state;
    for (int i = 0; i < NODES; i++) {
        kvd_store_close(c->client[i]);
    }
    for (int i = 0; i < NODES; i++) {
        if (c->pid[i] > 0) {
            kvd_test_daemon_stop(c->pid[i]);
        }
        kvd_test_dir_remove(&c->dir[i]);
    }
    etcd_kill(&c->etcd, SIGKILL);
    kvd_test_dir_remove(&c->etcd.dir);
    free(c);
    return 0;
}

static void chain(unsigned tag, kvd_block_hash_t *h)
{
    kvd_test_chain_keys(tag, h, CHAIN);
}

static void save(kvd_store_t *s, const kvd_block_hash_t *h)
{
    kvd_test_chain_save(s, &g_ns, h, CHAIN, OBJ);
}

/* Looks the chain up through `s` (asking `source` first when not NULL);
 * checks the bytes of what matched. */
static size_t load_from(kvd_store_t *s, const kvd_block_hash_t *h,
                        const char *source)
{
    return kvd_test_chain_load(s, &g_ns, h, CHAIN, OBJ, source);
}

static size_t load(kvd_store_t *s, const kvd_block_hash_t *h)
{
    return load_from(s, h, NULL);
}

/* load_from again until the whole chain matches or `ms` pass: a first
 * remote fetch on a loaded machine (the sanitizer suites run tests side by
 * side) may reach cluster.timeout while connections are set up; what
 * arrived late is committed and matched by the next try. */
static size_t load_until(kvd_store_t *s, const kvd_block_hash_t *h,
                         const char *source, uint64_t ms)
{
    uint64_t t0 = kvd_test_now_ms();
    size_t m;
    while ((m = load_from(s, h, source)) < CHAIN &&
           kvd_test_now_ms() - t0 < ms) {
        usleep(20000);
    }
    return m;
}

/* The sum of a counter over the nodes still running. */
static double metric_sum(cluster_t *c, const char *name)
{
    double sum = 0;
    for (int i = 0; i < NODES; i++) {
        if (c->pid[i] > 0) {
            sum += kvd_test_daemon_metric(&c->dir[i], name);
        }
    }
    return sum;
}

/* Pairs (key, home) of chain `h` for which counts(home, arg) holds,
 * with the nodes' announced capacities as the daemons' placement uses
 * them (host + disk) and cluster.replicas=2. */
static size_t home_pairs_where(cluster_t *c, const kvd_block_hash_t *h,
                               bool (*counts)(size_t home, int arg), int arg)
{
    static const char *const names[NODES] = {"node-a", "node-b", "node-c",
                                             "node-d"};
    kvd_member_t m[NODES];
    memset(m, 0, sizeof m);
    for (int i = 0; i < NODES; i++) {
        kvd_store_stats_t st;
        assert_int_equal(kvd_store_stats(c->client[i], &st), KVD_OK);
        snprintf(m[i].node_id, sizeof m[i].node_id, "%s", names[i]);
        m[i].capacity_bytes = st.host.capacity_bytes + st.disk.capacity_bytes;
    }
    size_t pairs = 0;
    for (size_t k = 0; k < CHAIN; k++) {
        kvd_store_key_t key = {g_ns, h[k]};
        size_t homes[2];
        size_t n = kvd_placement_homes(&key, m, NODES, 2, homes);
        for (size_t j = 0; j < n; j++) {
            pairs += counts(homes[j], arg);
        }
    }
    return pairs;
}

static bool home_is_not(size_t home, int node)
{
    return home != (size_t)node;
}

/* Pairs whose home is not node `from` (index): what the pushes of `from`
 * must deliver. */
static size_t home_pairs(cluster_t *c, const kvd_block_hash_t *h, int from)
{
    return home_pairs_where(c, h, home_is_not, from);
}

/* B's first offer fails (failpoint cluster.offer=EIO@1, as if that home
 * were down for a moment): its keys are queued again and offered 0.5 s
 * later, so every (key, home) pair of the chain B saved is pulled by its
 * home in the end (without the retry the first home's keys are missing),
 * and nothing is given up. Runs first: B has offered nothing before. */
static void test_failed_push_is_retried(void **state)
{
    cluster_t *c = *state;
    kvd_block_hash_t h[CHAIN];
    chain(3, h);
    size_t want = home_pairs(c, h, 1);
    double pulls0 = metric_sum(c, "kvdepot_cluster_pulls_total");
    double dropped0 = kvd_test_daemon_metric(
        &c->dir[1], "kvdepot_cluster_queue_dropped_total");
    save(c->client[1], h);
    uint64_t t0 = kvd_test_now_ms();
    while (metric_sum(c, "kvdepot_cluster_pulls_total") - pulls0 <
           (double)want) {
        if (kvd_test_now_ms() - t0 > 10000) {
            fail_msg("%g of %zu (key, home) pairs pulled",
                     metric_sum(c, "kvdepot_cluster_pulls_total") - pulls0,
                     want);
        }
        usleep(50000);
    }
    fprintf(stderr,
            "# B's first offer failed; after its retry the homes pulled all "
            "%zu (key, home) pairs in %llu ms\n",
            want, (unsigned long long)(kvd_test_now_ms() - t0));
    assert_true(kvd_test_daemon_metric(&c->dir[1],
                                       "kvdepot_cluster_retries_total") >= 1);
    assert_true(kvd_test_daemon_metric(
                    &c->dir[1], "kvdepot_cluster_push_errors_total") >= 1);
    assert_true(kvd_test_daemon_metric(&c->dir[1],
                                       "kvdepot_cluster_queue_dropped_total") ==
                dropped0);
    assert_int_equal(load(c->client[2], h), CHAIN);
}

static void test_saved_on_a_loaded_on_c(void **state)
{
    cluster_t *c = *state;
    kvd_block_hash_t h[CHAIN];
    chain(1, h);
    save(c->client[0], h);
    /* C asks each key's homes; a home that is not A has it once A's
     * background push has landed (milliseconds). */
    uint64_t t0 = kvd_test_now_ms();
    size_t m = 0;
    while ((m = load(c->client[2], h)) < CHAIN &&
           kvd_test_now_ms() - t0 < 5000) {
        usleep(20000);
    }
    fprintf(stderr, "# chain saved on A loaded through C after %llu ms\n",
            (unsigned long long)(kvd_test_now_ms() - t0));
    assert_int_equal(m, CHAIN);
    assert_true(kvd_test_daemon_metric(
                    &c->dir[2], "kvdepot_cluster_remote_lookups_total") >= 1);
    /* B too, and a chain nobody saved is a quick miss everywhere. */
    assert_int_equal(load(c->client[1], h), CHAIN);
    kvd_block_hash_t none[CHAIN];
    chain(99, none);
    uint64_t t1 = kvd_test_now_ms();
    assert_int_equal(load(c->client[1], none), 0);
    assert_true(kvd_test_now_ms() - t1 < 1000);
}

/* Objects `node` holds for store tenant `tenant` (kvd_client_list). */
static uint64_t tenant_objects(cluster_t *c, int node, uint32_t tenant)
{
    kvd_client_ns_usage_t *nu = NULL;
    kvd_client_tenant_usage_t *tu = NULL;
    size_t nn = 0, nt = 0;
    bool trunc = false;
    assert_int_equal(kvd_client_list(kvd_client_of(c->client[node]), &nu, &nn,
                                     &tu, &nt, &trunc),
                     KVD_OK);
    uint64_t n = 0;
    for (size_t i = 0; i < nt; i++) {
        if (tu[i].tenant == tenant) {
            n += tu[i].objects;
        }
    }
    free(nu);
    free(tu);
    return n;
}

static bool home_is_a_or_c(size_t home, int unused)
{
    (void)unused;
    return home == 0 || home == 2;
}

/* A save for a tenant is pushed to its homes for the same tenant: the
 * homes keep the copies in that tenant's share (quota, arena partition),
 * not the default tenant's. Saved through B (tenant "7"); A and C, which
 * keep no disk tier, hold every copy homed on them under that tenant
 * (before, the pulls were reserved for tenant 0). */
static void test_pushes_keep_the_tenant(void **state)
{
    cluster_t *c = *state;
    kvd_block_hash_t h[CHAIN];
    chain(7, h);
    kvd_store_reservation_t r[CHAIN];
    kvd_store_key_t keys[CHAIN];
    assert_int_equal(
        kvd_store_reserve(c->client[1], &g_ns, h, CHAIN, OBJ, 7, r), KVD_OK);
    for (size_t i = 0; i < CHAIN; i++) {
        assert_int_equal(r[i].status, KVD_OK);
        uint8_t *dst =
            kvd_store_arena_ptr(c->client[1], r[i].arena_offset, OBJ);
        assert_non_null(dst);
        kvd_test_chain_fill(dst, OBJ, &h[i]);
        keys[i].ns = g_ns;
        keys[i].hash = h[i];
    }
    assert_int_equal(kvd_store_commit(c->client[1], keys, CHAIN, NULL), KVD_OK);
    /* The daemon names an unbound caller's tenant "7": its store id. */
    uint32_t t7 = (uint32_t)kvd_xxh3_64("7", 1);
    t7 = t7 == 0 ? 1 : t7;
    assert_int_equal(tenant_objects(c, 1, t7), CHAIN);
    /* Copies homed on A and C, as the daemons' placement puts them. */
    uint64_t want = home_pairs_where(c, h, home_is_a_or_c, 0);
    uint64_t t0 = kvd_test_now_ms(), got = 0;
    while ((got = tenant_objects(c, 0, t7) + tenant_objects(c, 2, t7)) < want &&
           kvd_test_now_ms() - t0 < 5000) {
        usleep(20000);
    }
    assert_int_equal(got, want);
}

/* Prefill on A, decode on B: B's lookup names A (the transfer params of
 * the prefill side), so it matches at once, before A's pushes land, and
 * the bytes are A's. */
static void test_prefill_decode_handoff(void **state)
{
    cluster_t *c = *state;
    for (unsigned tag = 10; tag < 16; tag++) {
        kvd_block_hash_t h[CHAIN];
        chain(tag, h);
        save(c->client[0], h);
        assert_int_equal(load_until(c->client[1], h, "node-a", 10000), CHAIN);
    }
    /* A source that is not in the cluster is only a hint: no error. */
    kvd_block_hash_t none[CHAIN];
    chain(97, none);
    assert_int_equal(load_from(c->client[2], none, "no-such-node"), 0);
}

/* etcd stopped: every node keeps its last view (stale) and the cluster
 * keeps working: a chain saved through A loads through C; etcd back: the
 * views are fresh again and it still does. */
static void test_etcd_down_and_back(void **state)
{
    cluster_t *c = *state;
    etcd_kill(&c->etcd, SIGKILL);
    uint64_t t0 = kvd_test_now_ms();
    while (kvd_test_daemon_metric(&c->dir[2], "kvdepot_cluster_stale") != 1) {
        assert_true(kvd_test_now_ms() - t0 < 15000);
        usleep(50000);
    }
    for (unsigned tag = 20; tag < 22; tag++) {
        kvd_block_hash_t h[CHAIN];
        chain(tag, h);
        save(c->client[0], h);
        size_t m = 0;
        for (uint64_t t = kvd_test_now_ms();
             (m = load(c->client[2], h)) < CHAIN &&
             kvd_test_now_ms() - t < 5000;) {
            usleep(20000);
        }
        assert_int_equal(m, CHAIN);
        if (tag == 20) {
            etcd_start(&c->etcd); /* same ports and data */
        }
    }
    t0 = kvd_test_now_ms();
    for (int i = 0; i < NODES; i++) {
        while (kvd_test_daemon_metric(&c->dir[i], "kvdepot_cluster_stale") !=
                   0 ||
               kvd_test_daemon_metric(&c->dir[i], "kvdepot_cluster_nodes") !=
                   NODES) {
            assert_true(kvd_test_now_ms() - t0 < 20000);
            usleep(50000);
        }
    }
    fprintf(stderr, "# etcd back: every view fresh after %llu ms\n",
            (unsigned long long)(kvd_test_now_ms() - t0));
}

/* D keeps its objects on NVMe (write-through) and pushes nothing
 * (failpoint cluster.push): a chain D saved and then evicted from its
 * arena is served to C from D's NVMe tier, read into the arena first. */
static void test_disk_tier_served(void **state)
{
    cluster_t *c = *state;
    kvd_store_t *d = c->client[NODES - 1];
    kvd_block_hash_t h[CHAIN];
    chain(30, h);
    save(d, h);
    /* 16 MiB arena: 80 more objects of 256 KiB push the chain out. */
    for (unsigned tag = 31; tag < 31 + 80 / CHAIN + 1; tag++) {
        kvd_block_hash_t f[CHAIN];
        chain(tag, f);
        save(d, f);
    }
    kvd_store_lease_t l[CHAIN];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup_from(d, &g_ns, h, CHAIN, NULL, l, &m),
                     KVD_OK);
    assert_int_equal(m, CHAIN);
    size_t on_disk = 0;
    for (size_t i = 0; i < m; i++) {
        on_disk += l[i].tier == KVD_STORE_TIER_DISK;
    }
    assert_int_equal(kvd_store_release(d, l, m), KVD_OK);
    assert_true(on_disk > 0);
    double served0 = kvd_test_daemon_metric(
        &c->dir[NODES - 1], "kvdepot_cluster_served_bytes_total");
    assert_int_equal(load_until(c->client[2], h, "node-d", 10000), CHAIN);
    double served = kvd_test_daemon_metric(
        &c->dir[NODES - 1], "kvdepot_cluster_served_bytes_total");
    fprintf(stderr,
            "# %zu of %d blocks were on D's NVMe only; D served "
            "%.0f bytes\n",
            on_disk, CHAIN, served - served0);
    assert_true(served - served0 >= (double)on_disk * OBJ);
}

static void test_replicas_survive_a_killed_node(void **state)
{
    cluster_t *c = *state;
    kvd_block_hash_t h[CHAIN];
    chain(2, h);
    save(c->client[0], h);
    /* The pushes to the homes are in the background: wait until the
     * nodes' pulls have stopped growing (300 ms without one). */
    double pulls = metric_sum(c, "kvdepot_cluster_pulls_total");
    for (uint64_t t = kvd_test_now_ms(), quiet = t + 300;
         kvd_test_now_ms() < quiet && kvd_test_now_ms() - t < 10000;) {
        usleep(50000);
        double now = metric_sum(c, "kvdepot_cluster_pulls_total");
        if (now != pulls) {
            pulls = now;
            quiet = kvd_test_now_ms() + 300;
        }
    }
    assert_int_equal(kill(c->pid[0], SIGKILL), 0);
    assert_int_equal(waitpid(c->pid[0], NULL, 0), c->pid[0]);
    c->pid[0] = -1;
    kvd_store_close(c->client[0]);
    c->client[0] = NULL;
    /* A is still in the view (lease TTL 2 s): C's lookup must go round it
     * within cluster.timeout, and find every key at its other home. */
    uint64_t t0 = kvd_test_now_ms();
    size_t m = load_until(c->client[2], h, NULL, 5000);
    uint64_t took = kvd_test_now_ms() - t0;
    fprintf(stderr,
            "# after SIGKILL of A: a lookup through C matched %zu/%d "
            "%llu ms after the kill\n",
            m, CHAIN, (unsigned long long)took);
    assert_int_equal(m, CHAIN);
    /* After A's lease ends the views drop it; lookups stay quick. */
    uint64_t k0 = kvd_test_now_ms();
    while (kvd_test_daemon_metric(&c->dir[2], "kvdepot_cluster_nodes") !=
           NODES - 1) {
        assert_true(kvd_test_now_ms() - k0 < 10000);
        usleep(50000);
    }
    fprintf(stderr, "# A left C's view %llu ms after its kill\n",
            (unsigned long long)(kvd_test_now_ms() - t0));
    kvd_block_hash_t none[CHAIN];
    chain(98, none);
    t0 = kvd_test_now_ms();
    assert_int_equal(load(c->client[1], none), 0);
    assert_true(kvd_test_now_ms() - t0 < 1000);
}

int main(void)
{
    if (getenv("UCX_NET_DEVICES") == NULL) {
        setenv("UCX_NET_DEVICES", "lo", 1); /* loopback only */
        setenv("UCX_TLS", "tcp", 1);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failed_push_is_retried),
        cmocka_unit_test(test_saved_on_a_loaded_on_c),
        cmocka_unit_test(test_pushes_keep_the_tenant),
        cmocka_unit_test(test_prefill_decode_handoff),
        cmocka_unit_test(test_etcd_down_and_back),
        cmocka_unit_test(test_disk_tier_served),
        cmocka_unit_test(test_replicas_survive_a_killed_node),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    if (etcd_bin() == NULL || kvd_test_daemon_bin() == NULL) {
        return 77;
    }
    return rc;
}
