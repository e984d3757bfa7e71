/*
 * Non-prefix reuse end to end (docs/chunk-reuse.md): leader, worker and
 * embedded store in an engine's call order, with an engine that computes
 * any set of positions.
 *
 * The "model" is a rule: the K of token x at position p in layer l, head h
 * is R(p) k(x, l, h), the rotary embedding (NeoX pairing, base 10000) of a
 * vector drawn from x, l and h, and its V is v(x, l, h); the test computes
 * both itself in double. Request A computes documents X and Y and saves
 * them. Request B, Y then X behind nothing, misses the prefix, matches the
 * four blocks by content, and the worker loads and rotates them: every K
 * must equal R(new position) k within fp16 rounding, every V the stored
 * bytes. B saves nothing under prefix keys (a prefix match promises exact
 * KV), so the same prompt again still misses its prefix; X then Y again
 * matches its prefix as before. Also: the selective repair's positions, a
 * worker without a rotary embedding (the moved blocks fail as load errors),
 * a document twice in one prompt (one content object, no failed save).
 */
#include <math.h>
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

#include "kernels/ref/ref.h"
#include "kvdepot/leader.h"
#include "kvdepot/worker.h"

#define LAYERS 2
#define BLOCKS 48
#define BS 16
#define HEADS 2
#define DIM 64
#define DOC 32 /* two blocks per document */
#define TAIL 5
#define MAXTOK (8 * BS)

typedef struct engine {
    kvd_store_t *store;
    kvd_leader_t *leader;
    kvd_worker_t *worker;
    test_cache_t cache;
    uint32_t next_block;
} engine_t;

static const kvd_rope_t g_rope = {.head_dim = DIM,
                                  .rotary_dim = DIM,
                                  .style = KVD_ROPE_NEOX,
                                  .base = 10000.0,
                                  .scaling = KVD_ROPE_SCALING_NONE};

/* ---- the model's rule ---------------------------------------------------- */

static double draw(uint32_t x, uint32_t l, uint32_t h, uint32_t c, uint32_t p)
{
    uint64_t s = ((uint64_t)x << 32) ^ ((uint64_t)l << 24) ^
                 ((uint64_t)h << 16) ^ ((uint64_t)c << 4) ^ p;
    return kvd_test_gauss(&s);
}

/* K of token x at position pos (NeoX pairs (i, i + DIM/2)), or V. */
static void kv_of(uint32_t x, uint32_t pos, uint32_t l, uint32_t h, bool v,
                  double *out)
{
    double raw[DIM];
    for (uint32_t c = 0; c < DIM; c++) {
        raw[c] = draw(x, l, h, c, v ? 1 : 0);
    }
    if (v) {
        memcpy(out, raw, sizeof raw);
        return;
    }
    for (uint32_t i = 0; i < DIM / 2; i++) {
        double inv = 1.0 / pow(10000.0, (2.0 * i) / DIM);
        double a = (double)pos * inv;
        double x0 = raw[i], x1 = raw[i + DIM / 2];
        out[i] = x0 * cos(a) - x1 * sin(a);
        out[i + DIM / 2] = x1 * cos(a) + x0 * sin(a);
    }
}

static uint16_t *elem(engine_t *e, uint32_t l, uint32_t p, uint32_t blk,
                      uint32_t t, uint32_t h)
{
    return (uint16_t *)(void *)(e->cache.mem +
                                flat_index(&e->cache, l, p, blk, t, h, 0) * 2);
}

/* The engine computes tokens [from, to) of the prompt into its blocks. */
static void compute(engine_t *e, const uint32_t *tok, const uint32_t *blocks,
                    uint32_t from, uint32_t to)
{
    double kv[DIM];
    for (uint32_t pos = from; pos < to; pos++) {
        for (uint32_t l = 0; l < LAYERS; l++) {
            for (uint32_t h = 0; h < HEADS; h++) {
                for (uint32_t p = 0; p < 2; p++) {
                    kv_of(tok[pos], pos, l, h, p == 1, kv);
                    uint16_t *d = elem(e, l, p, blocks[pos / BS], pos % BS, h);
                    for (uint32_t c = 0; c < DIM; c++) {
                        d[c] = kvd_float_to_half((float)kv[c]);
                    }
                }
            }
        }
    }
}

/* Largest |cache - rule| over block `b` (position b * BS..) of K, and
 * whether V equals the rule's fp16 bytes. */
static double block_error(engine_t *e, const uint32_t *tok,
                          const uint32_t *blocks, uint32_t b, bool *v_exact)
{
    double kv[DIM], worst = 0;
    *v_exact = true;
    for (uint32_t t = 0; t < BS; t++) {
        uint32_t pos = b * BS + t;
        for (uint32_t l = 0; l < LAYERS; l++) {
            for (uint32_t h = 0; h < HEADS; h++) {
                kv_of(tok[pos], pos, l, h, false, kv);
                const uint16_t *k = elem(e, l, 0, blocks[b], t, h);
                for (uint32_t c = 0; c < DIM; c++) {
                    double d = fabs(kvd_half_to_float(k[c]) - kv[c]);
                    worst = d > worst ? d : worst;
                }
                kv_of(tok[pos], pos, l, h, true, kv);
                const uint16_t *v = elem(e, l, 1, blocks[b], t, h);
                for (uint32_t c = 0; c < DIM; c++) {
                    *v_exact =
                        *v_exact && v[c] == kvd_float_to_half((float)kv[c]);
                }
            }
        }
    }
    return worst;
}

/* ---- the engine ---------------------------------------------------------- */

static void engine_start(engine_t *e, kvd_repair_t repair, bool rope)
{
    memset(e, 0, sizeof *e);
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    static const char *const kv[] = {
        "store.arena_size",      "16m", "store.arena_chunk",    "1m",
        "store.arena_hugepages", "off", "store.arena_prefault", "false"};
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i += 2) {
        assert_int_equal(kvd_config_set(cfg, kv[i], kv[i + 1]), KVD_OK);
    }
    char err[256] = "";
    assert_int_equal(kvd_store_open(cfg, &e->store, err, sizeof err), KVD_OK);
    kvd_config_destroy(cfg);
    kvd_namespace_t ns;
    memset(ns.bytes, 0x5c, sizeof ns.bytes);
    kvd_leader_config_t lc = {0};
    lc.block_size = BS;
    lc.ns = ns;
    assert_int_equal(kvd_block_hash_seed(KVD_BLOCK_HASH_DEFAULT_SEED, &lc.root),
                     KVD_OK);
    lc.num_workers = 1;
    lc.layerwise = true;
    assert_int_equal(kvd_leader_create(&lc, e->store, &e->leader), KVD_OK);
    kvd_leader_chunk_config_t cc = {.enabled = true,
                                    .repair = repair,
                                    .boundary_window = 8,
                                    .recompute_ratio = 0.15};
    assert_int_equal(kvd_leader_set_chunk_reuse(e->leader, &cc), KVD_OK);

    cache_init(&e->cache, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    memset(e->cache.mem, 0, e->cache.bytes);
    kvd_worker_config_t wc = {0};
    wc.store = e->store;
    wc.ns = ns;
    wc.format = cache_format(&e->cache, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    assert_int_equal(kvd_worker_create(&wc, &e->worker, err, sizeof err),
                     KVD_OK);
    assert_int_equal(kvd_worker_register_kv_caches(e->worker, &e->cache.layout,
                                                   err, sizeof err),
                     KVD_OK);
    if (rope) {
        assert_int_equal(kvd_worker_set_rope(e->worker, &g_rope), KVD_OK);
    }
}

static void engine_stop(engine_t *e)
{
    kvd_leader_stats_t ls;
    assert_int_equal(kvd_leader_stats(e->leader, &ls), KVD_OK);
    assert_int_equal(ls.leases, 0);
    kvd_worker_destroy(e->worker);
    kvd_leader_destroy(e->leader);
    kvd_store_stats_t ss;
    assert_int_equal(kvd_store_stats(e->store, &ss), KVD_OK);
    assert_int_equal(ss.leases, 0);
    kvd_store_close(e->store);
    cache_cleanup(&e->cache);
}

/* One engine step (tests/integration/kvd_testconnector_int.h); returns
 * the failed loads. */
static size_t engine_step(engine_t *e)
{
    return kvd_test_connector_step(e->leader, e->worker, LAYERS, false);
}

typedef struct outcome {
    uint64_t prefix;
    kvd_leader_chunk_match_t m;
    uint8_t src[MAXTOK / BS];
    uint32_t recompute[MAXTOK];
    uint32_t blocks[MAXTOK / BS + 1];
    size_t failed;
} outcome_t;

/* Serves one request: match (prefix, then chunks), allocate, load, compute
 * what was not loaded, save, finish. */
static void serve(engine_t *e, const char *id, const uint32_t *tok, uint32_t n,
                  outcome_t *o)
{
    memset(o, 0, sizeof *o);
    kvd_leader_request_t q = {.request_id = id, .tokens = tok, .num_tokens = n};
    bool async = false;
    assert_int_equal(kvd_leader_get_num_new_matched_tokens(e->leader, &q, 0,
                                                           &o->prefix, &async),
                     KVD_OK);
    assert_int_equal(kvd_leader_match_chunks(e->leader, id, o->src, MAXTOK / BS,
                                             o->recompute, MAXTOK, &o->m),
                     KVD_OK);
    uint32_t nb = (n + BS - 1) / BS;
    for (uint32_t b = 0; b < nb; b++) {
        o->blocks[b] = e->next_block++ % BLOCKS;
    }
    assert_int_equal(kvd_leader_update_state_after_alloc(
                         e->leader, id, o->blocks, nb, o->prefix),
                     KVD_OK);
    assert_int_equal(kvd_leader_request_scheduled(e->leader, id, NULL, 0, NULL,
                                                  0, NULL, 0, o->prefix),
                     KVD_OK);
    o->failed = engine_step(e);
    /* Compute every block not loaded (and any load that failed). */
    for (uint32_t b = 0; b < nb; b++) {
        bool loaded =
            b < o->m.num_blocks &&
            (o->src[b] == KVD_CHUNK_PREFIX || o->src[b] == KVD_CHUNK_CONTENT) &&
            o->failed == 0;
        if (!loaded) {
            uint32_t to = (b + 1) * BS < n ? (b + 1) * BS : n;
            compute(e, tok, o->blocks, b * BS, to);
        }
    }
    assert_int_equal(kvd_leader_request_scheduled(e->leader, id, NULL, 0, NULL,
                                                  0, NULL, 0, n),
                     KVD_OK);
    (void)engine_step(e);
    bool delay = false;
    assert_int_equal(kvd_leader_request_finished(e->leader, id, &delay),
                     KVD_OK);
}

/* Prompt: documents in the given order (0: X, 1: Y, 2: Z), then a tail. */
static uint32_t prompt(const int *docs, size_t ndocs, uint32_t tail_seed,
                       uint32_t *tok)
{
    uint32_t n = 0;
    for (size_t d = 0; d < ndocs; d++) {
        for (uint32_t t = 0; t < DOC; t++) {
            tok[n++] = 1000u * (uint32_t)(docs[d] + 1) + t;
        }
    }
    for (uint32_t t = 0; t < TAIL; t++) {
        tok[n++] = 50000u + tail_seed * 16u + t;
    }
    return n;
}

/* ---- tests --------------------------------------------------------------- */

static void test_shuffled_documents_rotated(void **state)
{
    (void)state;
    engine_t e;
    engine_start(&e, KVD_REPAIR_NONE, true);
    uint32_t a[MAXTOK], b[MAXTOK];
    uint32_t na = prompt((const int[]){0, 1}, 2, 1, a);
    uint32_t nb = prompt((const int[]){1, 0}, 2, 2, b);
    outcome_t o;
    serve(&e, "A", a, na, &o);
    assert_int_equal(o.m.reused_tokens, 0);

    serve(&e, "B", b, nb, &o);
    assert_int_equal(o.prefix, 0);
    assert_int_equal(o.failed, 0);
    assert_int_equal(o.m.num_blocks, 4);
    assert_int_equal(o.m.reused_tokens, 4 * BS);
    for (uint32_t blk = 0; blk < 4; blk++) {
        assert_int_equal(o.src[blk], KVD_CHUNK_CONTENT);
        bool v_exact = false;
        double err = block_error(&e, b, o.blocks, blk, &v_exact);
        /* fp16 storage at |k| <~ 4: half an ulp (2^-9) of the stored value,
         * the rotation's float arithmetic and the new rounding. */
        if (err > 8e-3) {
            fail_msg("block %u: K off by %g after rotation", blk, err);
        }
        assert_true(v_exact);
    }
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(e.worker, &ws), KVD_OK);
    assert_int_equal(ws.load_errors, 0);

    /* B saved nothing under its prefix keys: its prefix still misses. */
    serve(&e, "B2", b, nb, &o);
    assert_int_equal(o.prefix, 0);
    assert_int_equal(o.m.reused_tokens, 4 * BS);
    /* A's order still matches its prefix, exactly. */
    serve(&e, "A2", a, na, &o);
    assert_int_equal(o.prefix, 4 * BS);
    assert_int_equal(o.m.reused_tokens, 0);
    for (uint32_t blk = 0; blk < 4; blk++) {
        assert_int_equal(o.src[blk], KVD_CHUNK_PREFIX);
    }
    engine_stop(&e);
}

static void test_selective_positions(void **state)
{
    (void)state;
    engine_t e;
    engine_start(&e, KVD_REPAIR_SELECTIVE, true);
    uint32_t a[MAXTOK], b[MAXTOK];
    uint32_t na = prompt((const int[]){0, 1}, 2, 1, a);
    /* Y, Z (new), X: two reused runs, blocks 0-1 and 4-5. */
    uint32_t nb = prompt((const int[]){1, 2, 0}, 3, 2, b);
    outcome_t o;
    serve(&e, "A", a, na, &o);
    serve(&e, "B", b, nb, &o);
    assert_int_equal(o.m.num_blocks, 6);
    static const uint8_t want[6] = {KVD_CHUNK_CONTENT, KVD_CHUNK_CONTENT,
                                    KVD_CHUNK_COMPUTE, KVD_CHUNK_COMPUTE,
                                    KVD_CHUNK_CONTENT, KVD_CHUNK_CONTENT};
    assert_memory_equal(o.src, want, 6);
    assert_int_equal(o.m.num_recompute, 16);
    for (uint32_t i = 0; i < 8; i++) {
        assert_int_equal(o.recompute[i], i);
        assert_int_equal(o.recompute[8 + i], 4 * BS + i);
    }
    engine_stop(&e);
}

static void test_no_rope_fails_moved_blocks(void **state)
{
    (void)state;
    engine_t e;
    engine_start(&e, KVD_REPAIR_NONE, false);
    uint32_t a[MAXTOK], b[MAXTOK];
    uint32_t na = prompt((const int[]){0, 1}, 2, 1, a);
    uint32_t nb = prompt((const int[]){1, 0}, 2, 2, b);
    outcome_t o;
    serve(&e, "A", a, na, &o);
    serve(&e, "B", b, nb, &o);
    assert_int_equal(o.m.reused_tokens, 4 * BS);
    assert_int_equal(o.failed, 4); /* every block moved: none rotated */
    size_t got = 0;
    uint32_t ids[8];
    got = kvd_leader_take_failed_blocks(e.leader, ids, 8);
    assert_int_equal(got, 4);
    engine_stop(&e);
}

static void test_document_twice(void **state)
{
    (void)state;
    engine_t e;
    engine_start(&e, KVD_REPAIR_NONE, true);
    uint32_t a[MAXTOK], b[MAXTOK];
    uint32_t na = prompt((const int[]){0, 0}, 2, 1, a);
    outcome_t o;
    serve(&e, "A", a, na, &o);
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(e.worker, &ws), KVD_OK);
    assert_int_equal(ws.saves_dropped, 0);
    /* X behind a new document: both of its blocks by content. */
    uint32_t nb = prompt((const int[]){2, 0}, 2, 2, b);
    serve(&e, "B", b, nb, &o);
    assert_int_equal(o.src[2], KVD_CHUNK_CONTENT);
    assert_int_equal(o.src[3], KVD_CHUNK_CONTENT);
    assert_int_equal(o.failed, 0);
    bool v_exact = false;
    assert_true(block_error(&e, b, o.blocks, 3, &v_exact) < 8e-3);
    assert_true(v_exact);
    engine_stop(&e);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    engine_t e;
    engine_start(&e, KVD_REPAIR_NONE, true);
    kvd_leader_chunk_config_t cc = {.enabled = true,
                                    .repair = KVD_REPAIR_SELECTIVE};
    assert_int_equal(kvd_leader_set_chunk_reuse(e.leader, &cc),
                     KVD_ERR_INVALID); /* no window */
    cc.repair = KVD_REPAIR_CACHEBLEND;
    cc.recompute_ratio = 1.5;
    assert_int_equal(kvd_leader_set_chunk_reuse(e.leader, &cc),
                     KVD_ERR_INVALID);
    uint8_t src[4];
    kvd_leader_chunk_match_t m;
    assert_int_equal(
        kvd_leader_match_chunks(e.leader, "nobody", src, 4, NULL, 0, &m),
        KVD_ERR_NOT_FOUND);
    kvd_rope_t r = g_rope;
    r.head_dim = 128;
    assert_int_equal(kvd_worker_set_rope(e.worker, &r), KVD_ERR_INVALID);
    engine_stop(&e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shuffled_documents_rotated),
        cmocka_unit_test(test_selective_positions),
        cmocka_unit_test(test_no_rope_fails_moved_blocks),
        cmocka_unit_test(test_document_twice),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
