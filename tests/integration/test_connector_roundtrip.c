/*
 * The connector end to end in C: leader, worker and embedded store driven
 * in vLLM's call order, across a restart.
 *
 * Engine A computes a 100-token prompt (its KV is the random content of
 * the blocks it was given), the leader plans the saves, the worker copies
 * the blocks into the store (written through to NVMe) and reports, and the
 * leader lets the request go. Everything is closed. Engine B starts on the
 * same store directory with an empty arena: the same prompt matches 96
 * tokens, asynchronously (the objects are on disk); the worker promotes
 * and loads them into B's blocks, the reports reach the leader, which
 * releases the request; B's blocks hold A's bytes. A prompt sharing the
 * first four blocks matches exactly those. No lease is left anywhere.
 */
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/unit/kvd_testcache_int.h"
#include "tests/integration/kvd_testconnector_int.h"
#include "tests/unit/kvd_testdata_int.h"
#include "tests/unit/kvd_testdir_int.h"

#include "kvdepot/leader.h"
#include "kvdepot/worker.h"

#define LAYERS 4
#define BLOCKS 32
#define BS 16
#define HEADS 2
#define DIM 64
#define PROMPT 100

typedef struct engine {
    kvd_store_t *store;
    kvd_leader_t *leader;
    kvd_worker_t *worker;
    test_cache_t cache;
} engine_t;

static kvd_namespace_t g_ns;

static void engine_start(engine_t *e, const kvd_test_dir_t *d, uint64_t seed)
{
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    static const char *const kv[] = {
        "store.arena_size",      "8m",  "store.arena_chunk",    "1m",
        "store.arena_hugepages", "off", "store.arena_prefault", "false",
        "store.disk_size",       "16m", "store.disk_write",     "through",
        "store.disk_admission",  "all", "store.sync_interval",  "0"};
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i += 2) {
        assert_int_equal(kvd_config_set(cfg, kv[i], kv[i + 1]), KVD_OK);
    }
    assert_int_equal(kvd_config_set(cfg, "store.disk_path", d->path), KVD_OK);
    char err[256] = "";
    assert_int_equal(kvd_store_open(cfg, &e->store, err, sizeof err), KVD_OK);
    kvd_config_destroy(cfg);

    kvd_leader_config_t lc = {0};
    lc.block_size = BS;
    lc.ns = g_ns;
    assert_int_equal(kvd_block_hash_seed(KVD_BLOCK_HASH_DEFAULT_SEED, &lc.root),
                     KVD_OK);
    lc.num_workers = 1;
    lc.layerwise = true;
    assert_int_equal(kvd_leader_create(&lc, e->store, &e->leader), KVD_OK);

    cache_init(&e->cache, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    uint16_t *v = (uint16_t *)(void *)e->cache.mem;
    for (size_t i = 0; i < e->cache.bytes / 2; i++) {
        v[i] = (uint16_t)kvd_test_rng(&seed);
    }
    kvd_worker_config_t wc = {0};
    wc.store = e->store;
    wc.ns = g_ns;
    wc.format = cache_format(&e->cache, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    assert_int_equal(kvd_worker_create(&wc, &e->worker, err, sizeof err),
                     KVD_OK);
    assert_int_equal(kvd_worker_register_kv_caches(e->worker, &e->cache.layout,
                                                   err, sizeof err),
                     KVD_OK);
}

static void engine_stop(engine_t *e)
{
    kvd_leader_stats_t ls;
    assert_int_equal(kvd_leader_stats(e->leader, &ls), KVD_OK);
    assert_int_equal(ls.leases, 0);
    kvd_worker_destroy(e->worker);
    kvd_leader_destroy(e->leader);
    /* Write-through copies hold their slots until written: flush first. */
    assert_int_equal(kvd_store_flush(e->store, 5000), KVD_OK);
    kvd_store_stats_t ss;
    assert_int_equal(kvd_store_stats(e->store, &ss), KVD_OK);
    assert_int_equal(ss.leases, 0);
    kvd_store_close(e->store);
    cache_cleanup(&e->cache);
}

/* One engine step (tests/integration/kvd_testconnector_int.h): no load
 * may fail. */
static void engine_step(engine_t *e)
{
    assert_int_equal(
        kvd_test_connector_step(e->leader, e->worker, LAYERS, true), 0);
}

static uint64_t match(engine_t *e, const char *id, const uint32_t *tok,
                      bool *async)
{
    kvd_leader_request_t q = {
        .request_id = id, .tokens = tok, .num_tokens = PROMPT};
    uint64_t m = 0;
    assert_int_equal(
        kvd_leader_get_num_new_matched_tokens(e->leader, &q, 0, &m, async),
        KVD_OK);
    return m;
}

static void test_restart_round_trip(void **state)
{
    (void)state;
    memset(g_ns.bytes, 0x6e, sizeof g_ns.bytes);
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "connector");
    uint32_t tok[PROMPT];
    for (uint32_t i = 0; i < PROMPT; i++) {
        tok[i] = (i * 7919u) % 32000u;
    }

    /* Engine A computes the prompt; its full blocks are saved. */
    engine_t a;
    engine_start(&a, &d, 1);
    bool async = true;
    assert_int_equal(match(&a, "a", tok, &async), 0);
    uint32_t a_blocks[7] = {3, 9, 1, 12, 5, 30, 7};
    assert_int_equal(
        kvd_leader_update_state_after_alloc(a.leader, "a", a_blocks, 7, 0),
        KVD_OK);
    assert_int_equal(kvd_leader_request_scheduled(a.leader, "a", NULL, 0, NULL,
                                                  0, NULL, 0, PROMPT),
                     KVD_OK);
    engine_step(&a);
    bool delay = true;
    assert_int_equal(kvd_leader_request_finished(a.leader, "a", &delay),
                     KVD_OK);
    assert_false(delay); /* the saves were reported finished already */
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(a.worker, &ws), KVD_OK);
    assert_int_equal(ws.blocks_saved, 6);
    test_cache_t a_cache = a.cache;
    a.cache.mem = NULL; /* kept for the comparison below */
    unsigned char *a_mem = a_cache.mem;
    engine_stop(&a);
    a_cache.mem = a_mem;

    /* Engine B, a new process on the same store directory. */
    engine_t b;
    engine_start(&b, &d, 2);
    memset(b.cache.mem, 0xee, b.cache.bytes);
    assert_int_equal(match(&b, "b", tok, &async), 96);
    assert_true(async); /* on NVMe: the engine waits for the load */
    uint32_t b_blocks[7] = {20, 21, 22, 23, 24, 25, 26};
    assert_int_equal(
        kvd_leader_update_state_after_alloc(b.leader, "b", b_blocks, 7, 96),
        KVD_OK);
    const char *done[4];
    size_t n_done = 0;
    for (int step = 0; step < 500 && n_done == 0; step++) {
        engine_step(&b); /* the request waits; its loads run */
        n_done = kvd_leader_take_finished_loads(b.leader, done, 4);
        if (n_done == 0) {
            struct pollfd p = {kvd_worker_fd(b.worker), POLLIN, 0};
            (void)poll(&p, 1, 10);
        }
    }
    assert_int_equal(n_done, 1);
    assert_string_equal(done[0], "b");
    for (uint32_t l = 0; l < LAYERS; l++) {
        for (uint32_t i = 0; i < 6; i++) {
            for (uint32_t p = 0; p < 2; p++) {
                for (uint32_t t = 0; t < BS; t++) {
                    size_t x = flat_index(&a_cache, l, p, a_blocks[i], t, 0, 0);
                    size_t y = flat_index(&b.cache, l, p, b_blocks[i], t, 0, 0);
                    assert_memory_equal(a_cache.mem + x * 2,
                                        b.cache.mem + y * 2, HEADS * DIM * 2);
                }
            }
        }
    }
    /* The block of the last token was not loaded: B computes it. */
    size_t z = flat_index(&b.cache, 0, 0, b_blocks[6], 0, 0, 0);
    assert_int_equal(b.cache.mem[z * 2], 0xee);
    assert_int_equal(kvd_leader_request_scheduled(b.leader, "b", NULL, 0, NULL,
                                                  0, NULL, 0, PROMPT),
                     KVD_OK);
    engine_step(&b);
    assert_int_equal(kvd_leader_request_finished(b.leader, "b", &delay),
                     KVD_OK);

    /* A prompt sharing the first four blocks. */
    uint32_t tok2[PROMPT];
    memcpy(tok2, tok, sizeof tok2);
    tok2[4 * BS + 3] ^= 1;
    assert_int_equal(match(&b, "c", tok2, &async), 4 * BS);
    assert_int_equal(kvd_leader_request_finished(b.leader, "c", &delay),
                     KVD_OK);
    engine_stop(&b);
    free(a_mem);
    kvd_test_dir_remove(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restart_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
