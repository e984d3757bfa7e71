/*
 * The worker on the host backend (include/kvdepot/worker.h).
 *
 * Round trips: a plan saves blocks of a random cache, a second plan loads
 * them into other blocks of a poisoned cache of the same layout; every
 * engine layout and codec. The expected cache is computed with the
 * reference kernels directly (gather, then scatter), so the test checks the
 * worker's plumbing bit for bit, raw and lossy alike, and that no byte
 * outside the listed blocks changes. Layer pipelining: right after
 * wait_for_layer_load(l) returns, layer l of every loaded block must be in
 * place. Then: loads from NVMe after a store restart (asynchronous, through
 * promotions), blocks that fail (missing, I/O error) while the request's
 * other blocks load, saves of keys stored already, reports packed for the
 * leader, cancellation and destroy with loads in flight (no lease left),
 * and every argument and plan error. The CUDA backend where it cannot run
 * (a build without CUDA, a machine without a GPU) is refused with a
 * reason; its round trips are tests/gpu/test_cuda_worker.c.
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
#include "tests/unit/kvd_testdata_int.h"
#include "tests/unit/kvd_testdir_int.h"
#include "tests/support/kvd_testplan.h"

#include "common/failpoint_int.h"
#include "kernels/ref/ref.h"
#include "kvdepot/worker.h"
#include "proto/kvd_proto.h"
#ifdef KVD_HAVE_CUDA
#include "kvdepot/kernels_cuda.h"
#endif

#define POISON 0x5a
#define LAYERS 3
#define BLOCKS 8
#define BS 16
#define HEADS 2
#define DIM 64

/* ---- store, keys, plans -------------------------------------------------- */

static kvd_store_t *store_open(const char *disk_path)
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

static kvd_namespace_t test_ns(void)
{
    kvd_namespace_t ns;
    memset(ns.bytes, 0x42, sizeof ns.bytes);
    return ns;
}

static kvd_block_hash_t key_hash(uint32_t k)
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
static uint8_t *plan_pack(uint64_t step, uint32_t block_size,
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

static void cache_fill_random(test_cache_t *c, uint64_t seed)
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
static void expected_cache(const test_cache_t *src, test_cache_t *exp,
                           const kvd_object_format_t *fmt,
                           const kvd_codec_tables_t *tables,
                           const int32_t *src_ids, const int32_t *dst_ids,
                           size_t n)
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
static bool layer_block_equal(const test_cache_t *a, const test_cache_t *b,
                              uint32_t l, uint32_t blk)
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

static kvd_worker_t *worker_new(kvd_store_t *st, const kvd_object_format_t *fmt,
                                uint32_t threads)
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

static void worker_register(kvd_worker_t *w, const test_cache_t *c)
{
    char err[256] = "";
    kvd_status_t s =
        kvd_worker_register_kv_caches(w, &c->layout, err, sizeof err);
    if (s != KVD_OK) {
        fail_msg("register: %s (%s)", kvd_status_str(s), err);
    }
}

static void worker_bind(kvd_worker_t *w, uint64_t step, const treq_t *reqs,
                        size_t n)
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
static void save_step(kvd_worker_t *w, uint64_t step, const char *id,
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
static kvd_worker_finished_t wait_loaded(kvd_worker_t *w, const char *id,
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

/* Every byte of block `blk` (all layers) is still poison. */
static bool block_is_poison(const test_cache_t *c, uint32_t blk)
{
    for (uint32_t l = 0; l < c->layers; l++) {
        for (uint32_t p = 0; p < c->planes; p++) {
            for (uint32_t t = 0; t < c->bs; t++) {
                for (uint32_t h = 0; h < c->heads; h++) {
                    size_t i = flat_index(c, l, p, blk, t, h, 0) * c->elt;
                    for (size_t k = 0; k < c->dim * c->elt; k++) {
                        if (c->mem[i + k] != POISON) {
                            return false;
                        }
                    }
                }
            }
        }
    }
    return true;
}

/* Destroys the worker, checks that it left no lease, closes the store. */
static void worker_store_close(kvd_worker_t *w, kvd_store_t *st)
{
    kvd_worker_destroy(w);
    kvd_store_stats_t ss;
    assert_int_equal(kvd_store_stats(st, &ss), KVD_OK);
    assert_int_equal(ss.leases, 0);
    kvd_store_close(st);
}

/* ---- round trips -------------------------------------------------------- */

static const int32_t save_blocks[] = {1, 3, 4, 6};
static const int32_t load_blocks[] = {7, 0, 5, 2};
static const uint32_t keys4[] = {10, 11, 12, 13};

static void round_trip(engine_layout_t kind, kvd_codec_t ck, kvd_codec_t cv,
                       uint32_t threads)
{
    test_cache_t src, dst, exp;
    cache_init(&src, kind, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&dst, kind, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&exp, kind, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 0x1234u + (uint64_t)kind * 77u + ck * 7u + cv);
    memset(dst.mem, POISON, dst.bytes);
    memset(exp.mem, POISON, exp.bytes);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, ck);
    fmt.codec[1] = cv;
    kvd_codec_tables_t *tables = NULL;
    assert_int_equal(kvd_codec_tables_create(&fmt, &tables), KVD_OK);
    expected_cache(&src, &exp, &fmt, tables, save_blocks, load_blocks, 4);

    kvd_store_t *st = store_open(NULL);
    kvd_worker_t *w = worker_new(st, &fmt, threads);
    worker_register(w, &src);
    save_step(w, 1, "writer", save_blocks, keys4, 4);

    worker_register(w, &dst);
    treq_t r = {.id = "reader", .layerwise = true, .n_loads = 4};
    memcpy(r.load_ids, load_blocks, sizeof load_blocks);
    memcpy(r.load_keys, keys4, sizeof keys4);
    worker_bind(w, 2, &r, 1);
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    for (uint32_t l = 0; l < LAYERS; l++) {
        assert_int_equal(kvd_worker_wait_for_layer_load(w, l, NULL), KVD_OK);
        /* Pipelining: layer l is complete as soon as its wait returns. */
        for (size_t i = 0; i < 4; i++) {
            if (!layer_block_equal(&dst, &exp, l, (uint32_t)load_blocks[i])) {
                fail_msg("%s %s/%s: layer %u of block %d not in place after "
                         "its wait",
                         layout_name(kind), kvd_codec_name(ck),
                         kvd_codec_name(cv), l, load_blocks[i]);
            }
        }
    }
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_finished_loading, 1);
    assert_string_equal(f.finished_loading[0], "reader");
    assert_false(f.loading_async[0]);
    assert_int_equal(f.num_failed_loads, 0);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    /* Every byte: the loaded blocks, and poison everywhere else. */
    if (memcmp(dst.mem, exp.mem, dst.bytes) != 0) {
        fail_msg("%s %s/%s: cache differs from the expected one",
                 layout_name(kind), kvd_codec_name(ck), kvd_codec_name(cv));
    }
    if (ck == KVD_CODEC_RAW && (cv == KVD_CODEC_RAW || src.planes == 1)) {
        for (uint32_t l = 0; l < LAYERS; l++) {
            for (size_t i = 0; i < 4; i++) {
                /* Raw is lossless: the source block itself came back. */
                for (uint32_t p = 0; p < src.planes; p++) {
                    for (uint32_t t = 0; t < BS; t++) {
                        for (uint32_t h = 0; h < src.heads; h++) {
                            size_t a =
                                flat_index(&src, l, p, (uint32_t)save_blocks[i],
                                           t, h, 0) *
                                2;
                            size_t b =
                                flat_index(&dst, l, p, (uint32_t)load_blocks[i],
                                           t, h, 0) *
                                2;
                            assert_memory_equal(src.mem + a, dst.mem + b,
                                                DIM * 2);
                        }
                    }
                }
            }
        }
    }
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(w, &ws), KVD_OK);
    assert_int_equal(ws.blocks_saved, 4);
    assert_int_equal(ws.blocks_loaded, 4);
    assert_int_equal(ws.load_errors, 0);
    worker_store_close(w, st);
    kvd_codec_tables_destroy(tables);
    cache_cleanup(&src);
    cache_cleanup(&dst);
    cache_cleanup(&exp);
}

static void test_round_trip_every_layout_and_codec(void **state)
{
    (void)state;
    static const kvd_codec_t pairs[][2] = {
        {KVD_CODEC_RAW, KVD_CODEC_RAW},
        {KVD_CODEC_FP8_E4M3, KVD_CODEC_FP8_E4M3},
        {KVD_CODEC_INT8, KVD_CODEC_INT8},
        {KVD_CODEC_KIVI4, KVD_CODEC_KIVI2},
        {KVD_CODEC_TQ4, KVD_CODEC_TQ3},
        {KVD_CODEC_RAW, KVD_CODEC_TQ2},
    };
    for (int k = 0; k < LAYOUT_COUNT; k++) {
        for (size_t c = 0; c < sizeof pairs / sizeof *pairs; c++) {
            round_trip((engine_layout_t)k, pairs[c][0], pairs[c][1],
                       1 + (uint32_t)(c % 3));
        }
    }
}

/* ---- NVMe, asynchronous loads, failures --------------------------------- */

static void save_four_then_restart(const kvd_test_dir_t *d, test_cache_t *src,
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

static void test_async_load_from_disk_after_restart(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "worker_disk");
    test_cache_t src, dst;
    cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&dst, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 99);
    memset(dst.mem, POISON, dst.bytes);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = NULL;
    save_four_then_restart(&d, &src, &fmt, &st);

    kvd_worker_t *w = worker_new(st, &fmt, 2);
    worker_register(w, &dst);
    treq_t r = {.id = "late", .async = true, .n_loads = 4};
    memcpy(r.load_ids, load_blocks, sizeof load_blocks);
    memcpy(r.load_keys, keys4, sizeof keys4);
    worker_bind(w, 5, &r, 1);
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    kvd_worker_finished_t f = wait_loaded(w, "late", NULL);
    assert_true(f.loading_async[0]);
    assert_int_equal(f.num_failed_loads, 0);
    assert_int_equal(f.step, 5);
    for (uint32_t l = 0; l < LAYERS; l++) {
        for (size_t i = 0; i < 4; i++) {
            for (uint32_t t = 0; t < BS; t++) {
                for (uint32_t p = 0; p < 2; p++) {
                    size_t a = flat_index(&src, l, p, (uint32_t)save_blocks[i],
                                          t, 0, 0) *
                               2;
                    size_t b = flat_index(&dst, l, p, (uint32_t)load_blocks[i],
                                          t, 0, 0) *
                               2;
                    assert_memory_equal(src.mem + a, dst.mem + b,
                                        HEADS * DIM * 2);
                }
            }
        }
    }
    /* The packed report says the same. */
    kvd_pb_worker_report_t *rep = NULL;
    assert_int_equal(
        kvd_proto_worker_report_unpack(f.report, f.report_len, &rep, NULL, 0),
        KVD_OK);
    assert_int_equal(rep->step, 5);
    assert_int_equal(rep->worker_rank, 3);
    assert_int_equal(rep->n_finished_loading, 1);
    assert_string_equal(rep->finished_loading[0], "late");
    kvd_proto_worker_report_free(rep);
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(w, &ws), KVD_OK);
    assert_int_equal(ws.promotions, 4);
    assert_int_equal(ws.blocks_loaded, 4);
    assert_int_equal(ws.async_loads_active, 0);
    worker_store_close(w, st);
    cache_cleanup(&src);
    cache_cleanup(&dst);
    kvd_test_dir_remove(&d);
}

/* The four objects of save_four_then_restart are in `dst` at load_blocks
 * (vLLM NHD caches: one block's tokens are contiguous per layer and plane). */
static void assert_four_loaded(const test_cache_t *src, const test_cache_t *dst)
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

/* An asynchronous load with no block to copy (every position it covers was
 * dropped by the engine: vLLM's sliding-window group) still finishes and
 * is reported, so the engine stops waiting for it. */
static void test_async_load_of_nothing_finishes(void **state)
{
    (void)state;
    test_cache_t dst;
    cache_init(&dst, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    memset(dst.mem, POISON, dst.bytes);
    kvd_object_format_t fmt = cache_format(&dst, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = store_open(NULL);
    kvd_worker_t *w = worker_new(st, &fmt, 2);
    worker_register(w, &dst);
    treq_t r = {.id = "empty", .async = true, .n_loads = 0};
    worker_bind(w, 9, &r, 1);
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    kvd_worker_finished_t f = wait_loaded(w, "empty", NULL);
    assert_true(f.loading_async[0]);
    assert_int_equal(f.num_failed_loads, 0);
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(w, &ws), KVD_OK);
    assert_int_equal(ws.blocks_loaded, 0);
    assert_int_equal(ws.async_loads_active, 0);
    for (size_t i = 0; i < dst.bytes; i++) {
        assert_int_equal(dst.mem[i], POISON);
    }
    worker_store_close(w, st);
    cache_cleanup(&dst);
}

/* Two workers on one store (vLLM's hybrid allocator: one per KV-cache
 * group) promote from disk at the same time; each gets its own blocks,
 * whichever of them drains the store's completions. Before, the second
 * worker was refused. */
static void test_two_workers_share_a_store(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "worker_two");
    test_cache_t src, dst[2];
    cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 41);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = NULL;
    save_four_then_restart(&d, &src, &fmt, &st);
    kvd_worker_t *w[2];
    for (int k = 0; k < 2; k++) {
        cache_init(&dst[k], LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
        memset(dst[k].mem, POISON, dst[k].bytes);
        w[k] = worker_new(st, &fmt, 1);
        worker_register(w[k], &dst[k]);
    }
    for (int round = 0; round < 8; round++) {
        char id[2][16];
        for (int k = 0; k < 2; k++) {
            snprintf(id[k], sizeof id[k], "g%d-%d", k, round);
            treq_t r = {.id = id[k], .async = true, .n_loads = 4};
            memcpy(r.load_ids, load_blocks, sizeof load_blocks);
            memcpy(r.load_keys, keys4, sizeof keys4);
            worker_bind(w[k], (uint64_t)round + 1, &r, 1);
        }
        for (int k = 0; k < 2; k++) {
            assert_int_equal(kvd_worker_start_load_kv(w[k], NULL), KVD_OK);
        }
        for (int k = 0; k < 2; k++) {
            assert_int_equal(kvd_worker_wait_for_save(w[k], NULL), KVD_OK);
            assert_int_equal(kvd_worker_clear_metadata(w[k]), KVD_OK);
        }
        for (int k = 0; k < 2; k++) {
            kvd_worker_finished_t f = wait_loaded(w[k], id[k], NULL);
            assert_int_equal(f.num_failed_loads, 0);
        }
    }
    for (int k = 0; k < 2; k++) {
        assert_four_loaded(&src, &dst[k]);
        kvd_worker_stats_t ws;
        assert_int_equal(kvd_worker_stats(w[k], &ws), KVD_OK);
        assert_int_equal(ws.blocks_loaded, 4 * 8);
        assert_int_equal(ws.async_loads_active, 0);
    }
    kvd_worker_destroy(w[0]);
    worker_store_close(w[1], st);
    cache_cleanup(&src);
    cache_cleanup(&dst[0]);
    cache_cleanup(&dst[1]);
    kvd_test_dir_remove(&d);
}

/* Tensor parallelism: the leader plans in rank 0's namespace, a rank's
 * worker stores and loads the same hashes in its own (plan_ns). Plans keyed
 * in the worker's storage namespace are then refused, and loads read the
 * worker's own objects. */
static void test_plan_namespace_differs(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "worker_planns");
    test_cache_t src, dst;
    cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&dst, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 43);
    memset(dst.mem, POISON, dst.bytes);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = NULL;
    save_four_then_restart(&d, &src, &fmt, &st); /* stored in test_ns() */

    kvd_worker_config_t cfg = {0};
    cfg.store = st;
    cfg.ns = test_ns();
    memset(cfg.plan_ns.bytes, 0x77, sizeof cfg.plan_ns.bytes);
    cfg.format = fmt;
    cfg.num_threads = 2;
    kvd_worker_t *w = NULL;
    char err[256] = "";
    assert_int_equal(kvd_worker_create(&cfg, &w, err, sizeof err), KVD_OK);
    worker_register(w, &dst);
    treq_t r = {.id = "rank1", .async = true, .n_loads = 4};
    memcpy(r.load_ids, load_blocks, sizeof load_blocks);
    memcpy(r.load_keys, keys4, sizeof keys4);
    size_t len = 0;
    kvd_namespace_t own = test_ns();
    uint8_t *plan = plan_pack(1, BS, &own, &r, 1, &len);
    assert_int_equal(kvd_worker_bind_metadata(w, plan, len, err, sizeof err),
                     KVD_ERR_PROTO);
    assert_non_null(strstr(err, "namespace"));
    free(plan);
    plan = plan_pack(2, BS, &cfg.plan_ns, &r, 1, &len);
    assert_int_equal(kvd_worker_bind_metadata(w, plan, len, err, sizeof err),
                     KVD_OK);
    free(plan);
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    kvd_worker_finished_t f = wait_loaded(w, "rank1", NULL);
    assert_int_equal(f.num_failed_loads, 0);
    assert_four_loaded(&src, &dst);
    worker_store_close(w, st);
    cache_cleanup(&src);
    cache_cleanup(&dst);
    kvd_test_dir_remove(&d);
}

/* A missing object and an I/O error fail exactly their blocks. */
static void test_failed_blocks_only(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "worker_fail");
    test_cache_t src, dst, exp;
    cache_init(&src, LAYOUT_VLLM_HND, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&dst, LAYOUT_VLLM_HND, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&exp, LAYOUT_VLLM_HND, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 7);
    memset(dst.mem, POISON, dst.bytes);
    memset(exp.mem, POISON, exp.bytes);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = NULL;
    save_four_then_restart(&d, &src, &fmt, &st);

    /* Keys 10, 99 (never stored), 12 (its read fails), 13. */
    char err[128];
    assert_int_equal(kvd_failpoint_set("nvme.read=EIO@2", err, sizeof err),
                     KVD_OK);
    kvd_worker_t *w = worker_new(st, &fmt, 2);
    worker_register(w, &dst);
    treq_t r = {.id = "holes",
                .layerwise = false,
                .n_loads = 4,
                .load_ids = {7, 0, 5, 2},
                .load_keys = {10, 99, 12, 13}};
    worker_bind(w, 9, &r, 1);
    /* Not layerwise: the loads are in place when start_load_kv returns. */
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    kvd_failpoint_clear();
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_finished_loading, 1);
    assert_int_equal(f.num_failed_loads, 2);
    bool saw_missing = false, saw_io = false;
    for (size_t i = 0; i < 2; i++) {
        assert_string_equal(f.failed_loads[i].request_id, "holes");
        if (f.failed_loads[i].block_id == 0) {
            assert_int_equal(f.failed_loads[i].status, KVD_ERR_NOT_FOUND);
            saw_missing = true;
        } else {
            /* The second promotion read is the one that failed: which
             * block that is depends on the order of completion. */
            assert_int_equal(f.failed_loads[i].status, KVD_ERR_IO);
            saw_io = true;
        }
    }
    assert_true(saw_missing && saw_io);
    /* Failed blocks are untouched, the others loaded. */
    for (int i = 0; i < 4; i++) {
        int32_t b = r.load_ids[i];
        if (b == f.failed_loads[0].block_id ||
            b == f.failed_loads[1].block_id) {
            assert_true(block_is_poison(&dst, (uint32_t)b));
            continue;
        }
        expected_cache(&src, &exp, &fmt, NULL, &save_blocks[i], &b, 1);
        for (uint32_t l = 0; l < LAYERS; l++) {
            assert_true(layer_block_equal(&dst, &exp, l, (uint32_t)b));
        }
    }
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(w, &ws), KVD_OK);
    assert_int_equal(ws.blocks_loaded, 2);
    assert_int_equal(ws.load_errors, 2);
    worker_store_close(w, st);
    cache_cleanup(&src);
    cache_cleanup(&dst);
    cache_cleanup(&exp);
    kvd_test_dir_remove(&d);
}

/* Two requests of one step load the same stored blocks (a shared prefix):
 * the worker looks blocks up in batches, and a store batch names each key
 * once, so the shared keys go in separate batches; every block loads. */
static void test_shared_blocks_in_one_step(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "worker_shared");
    test_cache_t src, dst, exp;
    cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&dst, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&exp, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 31);
    memset(dst.mem, POISON, dst.bytes);
    memset(exp.mem, POISON, exp.bytes);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = NULL;
    save_four_then_restart(&d, &src, &fmt, &st);
    kvd_worker_t *w = worker_new(st, &fmt, 2);
    worker_register(w, &dst);
    treq_t r[2] = {{.id = "first",
                    .n_loads = 2,
                    .load_ids = {0, 2},
                    .load_keys = {keys4[0], keys4[1]}},
                   {.id = "second",
                    .n_loads = 3,
                    .load_ids = {5, 7, 1},
                    .load_keys = {keys4[0], keys4[1], keys4[2]}}};
    worker_bind(w, 3, r, 2);
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_failed_loads, 0);
    for (size_t q = 0; q < 2; q++) {
        for (size_t i = 0; i < r[q].n_loads; i++) {
            int32_t b = r[q].load_ids[i];
            expected_cache(&src, &exp, &fmt, NULL, &save_blocks[i], &b, 1);
            for (uint32_t l = 0; l < LAYERS; l++) {
                assert_true(layer_block_equal(&dst, &exp, l, (uint32_t)b));
            }
        }
    }
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(w, &ws), KVD_OK);
    assert_int_equal(ws.blocks_loaded, 5);
    worker_store_close(w, st);
    cache_cleanup(&src);
    cache_cleanup(&dst);
    cache_cleanup(&exp);
    kvd_test_dir_remove(&d);
}

/* Destroy with asynchronous loads in flight: every lease comes back. */
static void test_destroy_with_loads_in_flight(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "worker_cancel");
    test_cache_t src, dst;
    cache_init(&src, LAYOUT_FLASHINFER, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&dst, LAYOUT_FLASHINFER, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 3);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = NULL;
    save_four_then_restart(&d, &src, &fmt, &st);
    for (int round = 0; round < 20; round++) {
        kvd_worker_t *w = worker_new(st, &fmt, 2);
        worker_register(w, &dst);
        treq_t r = {.id = "gone", .async = true, .n_loads = 4};
        memcpy(r.load_ids, load_blocks, sizeof load_blocks);
        memcpy(r.load_keys, keys4, sizeof keys4);
        worker_bind(w, 1, &r, 1);
        assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
        if (round % 2 == 1) {
            /* The engine finished the request: a copy not started yet is
             * canceled; either way the request is reported once, whole. */
            const char *ids[] = {"gone"};
            kvd_worker_finished_t f;
            assert_int_equal(kvd_worker_get_finished(w, ids, 1, &f), KVD_OK);
            size_t failed = 0;
            bool done = false;
            for (size_t k = 0; k < f.num_finished_loading; k++) {
                done |= strcmp(f.finished_loading[k], "gone") == 0;
            }
            failed = f.num_failed_loads;
            for (size_t k = 0; k < f.num_failed_loads; k++) {
                assert_int_equal(f.failed_loads[k].status, KVD_ERR_CANCELED);
            }
            if (!done) {
                size_t more = 0;
                (void)wait_loaded(w, "gone", &more);
                failed += more;
            }
            assert_true(failed == 0 || failed == 4);
        }
        kvd_worker_destroy(w);
        kvd_store_stats_t ss;
        assert_int_equal(kvd_store_stats(st, &ss), KVD_OK);
        assert_int_equal(ss.leases, 0);
    }
    kvd_store_close(st);
    cache_cleanup(&src);
    cache_cleanup(&dst);
    kvd_test_dir_remove(&d);
}

/* Two requests save the same key in one plan, and a key stored already:
 * one object each, the others skipped, every request reported. */
static void test_saves_skip_stored_keys(void **state)
{
    (void)state;
    test_cache_t src;
    cache_init(&src, LAYOUT_TRTLLM_POOL, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 5);
    kvd_object_format_t fmt =
        cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_FP8_E4M3);
    kvd_store_t *st = store_open(NULL);
    kvd_worker_t *w = worker_new(st, &fmt, 2);
    worker_register(w, &src);
    save_step(w, 1, "first", save_blocks, keys4, 2); /* keys 10, 11 */
    treq_t r[2] = {
        {.id = "a", .n_saves = 2, .save_ids = {1, 2}, .save_keys = {11, 20}},
        {.id = "b", .n_saves = 2, .save_ids = {3, 4}, .save_keys = {20, 21}},
    };
    worker_bind(w, 2, r, 2);
    /* No save_kv_layer: wait_for_save copies every layer itself. */
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_finished_saving, 2);
    assert_string_equal(f.finished_saving[0], "a");
    assert_string_equal(f.finished_saving[1], "b");
    assert_int_equal(f.num_finished_loading, 0);
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(w, &ws), KVD_OK);
    assert_int_equal(ws.blocks_saved, 4); /* 10, 11, 20, 21 */
    assert_int_equal(ws.saves_skipped, 2);
    assert_int_equal(ws.saves_dropped, 0);
    /* Each stored object is the gathered block. */
    kvd_namespace_t ns = test_ns();
    kvd_block_hash_t h[4] = {key_hash(10), key_hash(11), key_hash(20),
                             key_hash(21)};
    const int32_t from[4] = {1, 3, 3, 4}; /* key 20: b's block 3 or a's 2 */
    kvd_store_lease_t leases[4];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, h, 4, leases, &m), KVD_OK);
    assert_int_equal(m, 4);
    size_t bytes = kvd_object_bytes(&fmt);
    void *obj = aligned_alloc(64, (bytes + 63) / 64 * 64);
    assert_non_null(obj);
    for (int i = 0; i < 4; i++) {
        const void *got =
            kvd_store_arena_ptr(st, leases[i].arena_offset, bytes);
        assert_non_null(got);
        bool any = false;
        int32_t cands[2] = {from[i], i == 2 ? 2 : from[i]};
        for (int c = 0; c < 2 && !any; c++) {
            for (uint32_t l = 0; l < LAYERS; l++) {
                assert_int_equal(kvd_ref_gather_layer(&src.layout, &fmt, NULL,
                                                      l, &cands[c], 1, BS,
                                                      &obj),
                                 KVD_OK);
            }
            any = memcmp(got, obj, bytes) == 0;
        }
        assert_true(any);
    }
    free(obj);
    assert_int_equal(kvd_store_release(st, leases, 4), KVD_OK);
    kvd_worker_destroy(w);
    kvd_store_close(st);
    cache_cleanup(&src);
}

/* ---- errors ------------------------------------------------------------- */

static void test_create_and_register_errors(void **state)
{
    (void)state;
    test_cache_t c;
    cache_init(&c, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    kvd_object_format_t fmt = cache_format(&c, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = store_open(NULL);
    kvd_worker_config_t cfg = {0};
    cfg.store = st;
    cfg.ns = test_ns();
    cfg.format = fmt;
    kvd_worker_t *w = NULL;
    char err[256] = "";
    assert_int_equal(kvd_worker_create(NULL, &w, err, sizeof err),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_worker_create(&cfg, NULL, err, sizeof err),
                     KVD_ERR_INVALID);
    kvd_worker_config_t bad = cfg;
    bad.store = NULL;
    assert_int_equal(kvd_worker_create(&bad, &w, err, sizeof err),
                     KVD_ERR_INVALID);
    bad = cfg;
    bad.format.head_dim = 0;
    assert_int_equal(kvd_worker_create(&bad, &w, err, sizeof err),
                     KVD_ERR_INVALID);
    assert_non_null(strstr(err, "format"));
    bad = cfg;
    bad.num_threads = KVD_WORKER_MAX_THREADS + 1;
    assert_int_equal(kvd_worker_create(&bad, &w, err, sizeof err),
                     KVD_ERR_INVALID);
    bad = cfg;
    bad.device = (kvd_worker_device_t)7;
    assert_int_equal(kvd_worker_create(&bad, &w, err, sizeof err),
                     KVD_ERR_UNSUPPORTED);
    assert_null(w);

    assert_int_equal(kvd_worker_create(&cfg, &w, err, sizeof err), KVD_OK);

    /* No cache yet. */
    uint8_t junk[4] = {0};
    assert_int_equal(kvd_worker_bind_metadata(w, junk, 0, err, sizeof err),
                     KVD_ERR_STATE);
    /* Overlapping strides: heads on top of each other. */
    kvd_kv_layout_t lo = c.layout;
    lo.stride_head = 2;
    assert_int_equal(kvd_worker_register_kv_caches(w, &lo, err, sizeof err),
                     KVD_ERR_INVALID);
    assert_non_null(strstr(err, "layout"));
    assert_int_equal(kvd_worker_register_kv_caches(w, NULL, err, sizeof err),
                     KVD_ERR_INVALID);
    worker_register(w, &c);
    assert_int_equal(kvd_worker_wait_for_layer_load(w, LAYERS, NULL),
                     KVD_ERR_RANGE);
    assert_int_equal(kvd_worker_save_kv_layer(w, LAYERS, NULL), KVD_ERR_RANGE);
    /* Nothing bound: every per-step call is a no-op. */
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_wait_for_layer_load(w, 0, NULL), KVD_OK);
    assert_int_equal(kvd_worker_save_kv_layer(w, 0, NULL), KVD_OK);
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(w, NULL, 1, &f), KVD_ERR_INVALID);
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    assert_int_equal(
        f.num_finished_loading + f.num_finished_saving + f.num_failed_loads, 0);
    assert_true(kvd_worker_fd(w) >= 0);
    assert_int_equal(kvd_worker_fd(NULL), -1);
    assert_int_equal(kvd_worker_stats(w, NULL), KVD_ERR_INVALID);
    kvd_worker_destroy(w);
    kvd_worker_destroy(NULL);
    /* The store is free for a new worker. */
    assert_int_equal(kvd_worker_create(&cfg, &w, err, sizeof err), KVD_OK);
    kvd_worker_destroy(w);
    kvd_store_close(st);
    cache_cleanup(&c);
}

/* KVD_WORKER_DEVICE_CUDA: a build without CUDA says so (UNSUPPORTED), a
 * machine without a GPU says so (NO_DEVICE); no worker is made and the
 * store stays free. On a GPU machine the worker is made, and refuses a
 * cache in host memory. */
static void test_cuda_device_unavailable(void **state)
{
    (void)state;
    test_cache_t c;
    cache_init(&c, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    kvd_store_t *st = store_open(NULL);
    kvd_worker_config_t cfg = {0};
    cfg.store = st;
    cfg.ns = test_ns();
    cfg.format = cache_format(&c, KVD_DTYPE_FP16, KVD_CODEC_TQ4);
    cfg.device = KVD_WORKER_DEVICE_CUDA;
    kvd_worker_t *w = NULL;
    char err[256] = "";
    kvd_status_t s = kvd_worker_create(&cfg, &w, err, sizeof err);
#ifndef KVD_HAVE_CUDA
    assert_int_equal(s, KVD_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "no CUDA support"));
    assert_null(w);
#else
    int count = 0;
    assert_int_equal(kvd_cuda_device_count(&count), KVD_OK);
    if (count == 0) {
        assert_int_equal(s, KVD_ERR_NO_DEVICE);
        assert_non_null(strstr(err, "no CUDA device"));
        assert_null(w);
    } else {
        assert_int_equal(s, KVD_OK);
        err[0] = '\0';
        assert_int_equal(
            kvd_worker_register_kv_caches(w, &c.layout, err, sizeof err),
            KVD_ERR_INVALID);
        assert_non_null(strstr(err, "not device memory"));
        kvd_worker_destroy(w);
        w = NULL;
    }
#endif
    /* Nothing of it is left: a host worker takes the store. */
    cfg.device = KVD_WORKER_DEVICE_HOST;
    assert_int_equal(kvd_worker_create(&cfg, &w, err, sizeof err), KVD_OK);
    worker_register(w, &c);
    worker_store_close(w, st);
    cache_cleanup(&c);
}

static kvd_status_t bind_bytes(kvd_worker_t *w, const uint8_t *plan, size_t len,
                               char *err, size_t err_len)
{
    return kvd_worker_bind_metadata(w, plan, len, err, err_len);
}

static void test_bad_plans_do_nothing(void **state)
{
    (void)state;
    test_cache_t c;
    cache_init(&c, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    kvd_object_format_t fmt = cache_format(&c, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = store_open(NULL);
    kvd_worker_t *w = worker_new(st, &fmt, 2);
    worker_register(w, &c);
    char err[256] = "";
    const uint8_t garbage[] = {0x0a, 0xff, 0xff, 0xff};
    assert_int_equal(bind_bytes(w, garbage, sizeof garbage, err, sizeof err),
                     KVD_ERR_PROTO);
    assert_non_null(strstr(err, "plan"));
    assert_int_equal(bind_bytes(w, NULL, 4, err, sizeof err), KVD_ERR_INVALID);

    treq_t r = {.id = "x", .n_saves = 1, .save_ids = {1}, .save_keys = {1}};
    kvd_namespace_t ns = test_ns();
    size_t len = 0;
    uint8_t *p = plan_pack(1, BS * 2, &ns, &r, 1, &len);
    assert_int_equal(bind_bytes(w, p, len, err, sizeof err), KVD_ERR_PROTO);
    assert_non_null(strstr(err, "block_size"));
    free(p);
    kvd_namespace_t other = ns;
    other.bytes[0] ^= 1;
    p = plan_pack(1, BS, &other, &r, 1, &len);
    assert_int_equal(bind_bytes(w, p, len, err, sizeof err), KVD_ERR_PROTO);
    assert_non_null(strstr(err, "namespace"));
    free(p);
    /* Block id outside the cache, after a valid first request. */
    treq_t two[2] = {
        {.id = "ok", .n_saves = 1, .save_ids = {1}, .save_keys = {1}},
        {.id = "far", .n_saves = 1, .save_ids = {BLOCKS}, .save_keys = {2}},
    };
    p = plan_pack(1, BS, &ns, two, 2, &len);
    assert_int_equal(bind_bytes(w, p, len, err, sizeof err), KVD_ERR_RANGE);
    assert_non_null(strstr(err, "outside"));
    free(p);
    /* Nothing was reserved, bound or reported. */
    kvd_store_stats_t ss;
    assert_int_equal(kvd_store_stats(st, &ss), KVD_OK);
    assert_int_equal(ss.host.bytes, 0);
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_finished_saving, 0);
    kvd_worker_destroy(w);
    kvd_store_close(st);
    cache_cleanup(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_every_layout_and_codec),
        cmocka_unit_test(test_async_load_from_disk_after_restart),
        cmocka_unit_test(test_async_load_of_nothing_finishes),
        cmocka_unit_test(test_two_workers_share_a_store),
        cmocka_unit_test(test_plan_namespace_differs),
        cmocka_unit_test(test_failed_blocks_only),
        cmocka_unit_test(test_shared_blocks_in_one_step),
        cmocka_unit_test(test_destroy_with_loads_in_flight),
        cmocka_unit_test(test_saves_skip_stored_keys),
        cmocka_unit_test(test_create_and_register_errors),
        cmocka_unit_test(test_cuda_device_unavailable),
        cmocka_unit_test(test_bad_plans_do_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
