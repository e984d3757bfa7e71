/*
 * Helpers shared by the worker tests on the host backend (test_worker_*.c,
 * include/kvdepot/worker.h): an embedded store (optionally over NVMe files),
 * keys and StepPlans packed from plain arrays, engine caches filled at
 * random or with POISON, the cache a load must produce computed with the
 * reference kernels directly (gather, then scatter), and the engine's
 * per-step calls (a save step, waiting for a request's loads). Four blocks
 * saved from save_blocks as keys4 are loaded into load_blocks.
 * Header-only (static inline): each test is one executable built from one
 * source file; the including test has cmocka.h included first.
 */
#ifndef KVD_TESTS_TESTWORKER_INT_H
#define KVD_TESTS_TESTWORKER_INT_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/kvd_testcache_int.h"
#include "tests/unit/kvd_testdata_int.h"
#include "tests/unit/kvd_testdir_int.h"
#include "tests/support/kvd_testplan.h"

#include "kernels/ref/ref.h"
#include "kvdepot/worker.h"

#define POISON 0x5a
#define LAYERS 3
#define BLOCKS 8
#define BS 16
#define HEADS 2
#define DIM 64

/* ---- store, keys, plans -------------------------------------------------- */

static inline kvd_store_t *store_open(const char *disk_path)
{
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    static const char *const base[] = {
        "store.arena_size",      "16m", "store.arena_chunk",    "1m",
        "store.arena_hugepages", "off", "store.arena_prefault", "false",
        "store.reserve_timeout", "0",   "store.disk_size",      "16m",
        "store.disk_admission",  "all", "store.disk_write",     "through",
        "store.sync_interval",   "0"};
    for (size_t i = 0; i < sizeof base / sizeof *base; i += 2) {
        assert_int_equal(kvd_config_set(cfg, base[i], base[i + 1]), KVD_OK);
    }
    if (disk_path != NULL) {
        assert_int_equal(kvd_config_set(cfg, "store.disk_path", disk_path),
                         KVD_OK);
    }
    kvd_store_t *st = NULL;
    char err[256] = "";
    kvd_status_t s = kvd_store_open(cfg, &st, err, sizeof err);
    if (s != KVD_OK) {
        fprintf(stderr, "kvd_store_open: %s (%s)\n", kvd_status_str(s), err);
    }
    assert_int_equal(s, KVD_OK);
    kvd_config_destroy(cfg);
    return st;
}

static inline kvd_namespace_t test_ns(void)
{
    kvd_namespace_t ns;
    memset(ns.bytes, 0x42, sizeof ns.bytes);
    return ns;
}

static inline kvd_block_hash_t key_hash(uint32_t k)
{
    kvd_block_hash_t h;
    memset(h.bytes, 0x11, sizeof h.bytes);
    memcpy(h.bytes, &k, sizeof k);
    return h;
}

typedef struct treq {
    const char *id;
    bool async, layerwise;
    size_t n_loads, n_saves;
    int32_t load_ids[BLOCKS];
    uint32_t load_keys[BLOCKS];
    int32_t save_ids[BLOCKS];
    uint32_t save_keys[BLOCKS];
} treq_t;

/* Packs a StepPlan; keys from key_hash, namespace `ns`. */
static inline uint8_t *plan_pack(uint64_t step, uint32_t block_size,
                                 const kvd_namespace_t *ns, const treq_t *reqs,
                                 size_t n, size_t *len_out)
{
    kvd_testplan_req_t tr[4];
    kvd_block_hash_t lh[4][BLOCKS], sh[4][BLOCKS];
    assert_true(n <= 4);
    for (size_t i = 0; i < n; i++) {
        for (size_t b = 0; b < reqs[i].n_loads; b++) {
            lh[i][b] = key_hash(reqs[i].load_keys[b]);
        }
        for (size_t b = 0; b < reqs[i].n_saves; b++) {
            sh[i][b] = key_hash(reqs[i].save_keys[b]);
        }
        tr[i] = (kvd_testplan_req_t){
            .id = reqs[i].id,
            .async = reqs[i].async,
            .layerwise = reqs[i].layerwise,
            .n_loads = reqs[i].n_loads,
            .n_saves = reqs[i].n_saves,
            .load_ids = reqs[i].load_ids,
            .load_hashes = lh[i],
            .save_ids = reqs[i].save_ids,
            .save_hashes = sh[i],
        };
    }
    uint8_t *buf = kvd_testplan_pack(step, block_size, ns, tr, n, len_out);
    assert_non_null(buf);
    return buf;
}

/* ---- caches ------------------------------------------------------------- */

static inline void cache_fill_random(test_cache_t *c, uint64_t seed)
{
    size_t n = c->bytes / c->elt;
    uint16_t *e = (uint16_t *)(void *)c->mem;
    for (size_t i = 0; i < n; i++) {
        float f = (float)kvd_test_gauss(&seed);
        e[i] = c->elt == 2 ? kvd_float_to_half(f) : 0;
    }
}

/* The cache `dst` must become: `exp` starts as dst's poison; each (src
 * block, dst block) pair is gathered and scattered with the reference
 * kernels. */
static inline void expected_cache(const test_cache_t *src, test_cache_t *exp,
                                  const kvd_object_format_t *fmt,
                                  const kvd_codec_tables_t *tables,
                                  const int32_t *src_ids,
                                  const int32_t *dst_ids, size_t n)
{
    size_t bytes = kvd_object_bytes(fmt);
    for (size_t i = 0; i < n; i++) {
        void *obj = aligned_alloc(64, (bytes + 63) / 64 * 64);
        assert_non_null(obj);
        for (uint32_t l = 0; l < fmt->num_layers; l++) {
            assert_int_equal(kvd_ref_gather_layer(&src->layout, fmt, tables, l,
                                                  &src_ids[i], 1, BS, &obj),
                             KVD_OK);
            assert_int_equal(kvd_ref_scatter_layer(&exp->layout, fmt, tables, l,
                                                   &dst_ids[i], 1, BS,
                                                   (const void *const *)&obj),
                             KVD_OK);
        }
        free(obj);
    }
}

/* Layer `l` of block `b` equal in both caches. */
static inline bool layer_block_equal(const test_cache_t *a,
                                     const test_cache_t *b, uint32_t l,
                                     uint32_t blk)
{
    for (uint32_t p = 0; p < a->planes; p++) {
        for (uint32_t t = 0; t < a->bs; t++) {
            for (uint32_t h = 0; h < a->heads; h++) {
                size_t i = flat_index(a, l, p, blk, t, h, 0) * a->elt;
                if (memcmp(a->mem + i, b->mem + i, a->dim * a->elt) != 0) {
                    return false;
                }
            }
        }
    }
    return true;
}

/* ---- worker helpers ----------------------------------------------------- */

static inline kvd_worker_t *
worker_new(kvd_store_t *st, const kvd_object_format_t *fmt, uint32_t threads)
{
    kvd_worker_config_t cfg = {0};
    cfg.store = st;
    cfg.ns = test_ns();
    cfg.format = *fmt;
    cfg.worker_rank = 3;
    cfg.num_threads = threads;
    kvd_worker_t *w = NULL;
    char err[256] = "";
    kvd_status_t s = kvd_worker_create(&cfg, &w, err, sizeof err);
    if (s != KVD_OK) {
        fail_msg("worker: %s (%s)", kvd_status_str(s), err);
    }
    return w;
}

static inline void worker_register(kvd_worker_t *w, const test_cache_t *c)
{
    char err[256] = "";
    kvd_status_t s =
        kvd_worker_register_kv_caches(w, &c->layout, err, sizeof err);
    if (s != KVD_OK) {
        fail_msg("register: %s (%s)", kvd_status_str(s), err);
    }
}

static inline void worker_bind(kvd_worker_t *w, uint64_t step,
                               const treq_t *reqs, size_t n)
{
    kvd_namespace_t ns = test_ns();
    size_t len = 0;
    uint8_t *plan = plan_pack(step, BS, &ns, reqs, n, &len);
    char err[256] = "";
    kvd_status_t s = kvd_worker_bind_metadata(w, plan, len, err, sizeof err);
    free(plan);
    if (s != KVD_OK) {
        fail_msg("bind: %s (%s)", kvd_status_str(s), err);
    }
}

/* One engine step that saves `n` blocks of request `id`, layer by layer. */
static inline void save_step(kvd_worker_t *w, uint64_t step, const char *id,
                             const int32_t *ids, const uint32_t *keys, size_t n)
{
    treq_t r = {.id = id, .layerwise = true, .n_saves = n};
    memcpy(r.save_ids, ids, n * sizeof *ids);
    memcpy(r.save_keys, keys, n * sizeof *keys);
    worker_bind(w, step, &r, 1);
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    for (uint32_t l = 0; l < LAYERS; l++) {
        assert_int_equal(kvd_worker_wait_for_layer_load(w, l, NULL), KVD_OK);
        assert_int_equal(kvd_worker_save_kv_layer(w, l, NULL), KVD_OK);
    }
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_finished_saving, 1);
    assert_string_equal(f.finished_saving[0], id);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
}

/* Drains reports until request `id` finished loading (5 s at most); the
 * failed blocks seen on the way are counted into *failed_out (may be NULL:
 * then there must be none). */
static inline kvd_worker_finished_t wait_loaded(kvd_worker_t *w, const char *id,
                                                size_t *failed_out)
{
    size_t failed = 0;
    for (int i = 0; i < 500; i++) {
        kvd_worker_finished_t f;
        assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
        failed += f.num_failed_loads;
        if (failed_out == NULL) {
            assert_int_equal(failed, 0);
        } else {
            *failed_out = failed;
        }
        for (size_t k = 0; k < f.num_finished_loading; k++) {
            if (strcmp(f.finished_loading[k], id) == 0) {
                return f;
            }
        }
        struct pollfd p = {kvd_worker_fd(w), POLLIN, 0};
        (void)poll(&p, 1, 10);
    }
    fail_msg("request %s never finished loading", id);
    kvd_worker_finished_t none = {0};
    return none;
}

/* Destroys the worker, checks that it left no lease, closes the store. */
static inline void worker_store_close(kvd_worker_t *w, kvd_store_t *st)
{
    kvd_worker_destroy(w);
    kvd_store_stats_t ss;
    assert_int_equal(kvd_store_stats(st, &ss), KVD_OK);
    assert_int_equal(ss.leases, 0);
    kvd_store_close(st);
}

/* How many of `keys` (a prefix) a lookup in namespace `ns` finds. */
static inline size_t stored_in(kvd_store_t *st, const kvd_namespace_t *ns,
                               const uint32_t *keys, size_t n)
{
    kvd_block_hash_t h[BLOCKS];
    kvd_store_lease_t l[BLOCKS];
    for (size_t i = 0; i < n; i++) {
        h[i] = key_hash(keys[i]);
    }
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, ns, h, n, l, &m), KVD_OK);
    if (m > 0) {
        assert_int_equal(kvd_store_release(st, l, m), KVD_OK);
    }
    return m;
}

/* The same in the tests' namespace. */
static inline size_t stored(kvd_store_t *st, const uint32_t *keys, size_t n)
{
    kvd_namespace_t ns = test_ns();
    return stored_in(st, &ns, keys, n);
}

/* A cache of random bytes (NHD, fp16, raw) and an embedded store. */
typedef struct wfixture {
    test_cache_t c;
    kvd_object_format_t fmt;
    kvd_store_t *st;
} wfixture_t;

static inline void wfixture_open(wfixture_t *fx, uint64_t seed)
{
    cache_init(&fx->c, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&fx->c, seed);
    fx->fmt = cache_format(&fx->c, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    fx->st = store_open(NULL);
}

/* ---- saved and loaded blocks ------------------------------------------- */

static const int32_t save_blocks[] = {1, 3, 4, 6};
static const int32_t load_blocks[] = {7, 0, 5, 2};
static const uint32_t keys4[] = {10, 11, 12, 13};

static inline void save_four_then_restart(const kvd_test_dir_t *d,
                                          test_cache_t *src,
                                          const kvd_object_format_t *fmt,
                                          kvd_store_t **st_out)
{
    kvd_store_t *st = store_open(d->path);
    kvd_worker_t *w = worker_new(st, fmt, 2);
    worker_register(w, src);
    save_step(w, 1, "writer", save_blocks, keys4, 4);
    kvd_worker_destroy(w);
    assert_int_equal(kvd_store_flush(st, 5000), KVD_OK);
    kvd_store_close(st);
    *st_out = store_open(d->path); /* arena empty: every object on DISK */
}

/* The four objects of save_four_then_restart are in `dst` at load_blocks
 * (vLLM NHD caches: one block's tokens are contiguous per layer and plane). */
static inline void assert_four_loaded(const test_cache_t *src,
                                      const test_cache_t *dst)
{
    for (uint32_t l = 0; l < LAYERS; l++) {
        for (size_t i = 0; i < 4; i++) {
            for (uint32_t p = 0; p < 2; p++) {
                size_t a =
                    flat_index(src, l, p, (uint32_t)save_blocks[i], 0, 0, 0) *
                    2;
                size_t b =
                    flat_index(dst, l, p, (uint32_t)load_blocks[i], 0, 0, 0) *
                    2;
                assert_memory_equal(src->mem + a, dst->mem + b,
                                    (size_t)BS * HEADS * DIM * 2);
            }
        }
    }
}

/* One synchronous load of keys4 into load_blocks; returns the failed
 * blocks' count and writes their statuses (4 at most) into st_out. */
static inline size_t load_four(kvd_worker_t *w, uint64_t step,
                               kvd_status_t st_out[4])
{
    treq_t r = {.id = "reader", .n_loads = 4};
    memcpy(r.load_ids, load_blocks, sizeof load_blocks);
    memcpy(r.load_keys, keys4, sizeof keys4);
    worker_bind(w, step, &r, 1);
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    size_t failed = 0;
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_finished_loading, 1);
    for (size_t i = 0; i < f.num_failed_loads && failed < 4; i++) {
        st_out[failed++] = f.failed_loads[i].status;
    }
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    return failed;
}

#endif /* KVD_TESTS_TESTWORKER_INT_H */
