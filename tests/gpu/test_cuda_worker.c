/*
 * The worker's CUDA backend (KVD_WORKER_DEVICE_CUDA, label gpu) against
 * its host backend.
 *
 * Round trips through one embedded store, for vLLM FlashAttention NHD and
 * HND caches and the codecs raw, fp8, int8, kivi4 and tq4: a host worker
 * saves blocks of a random cache and loads them into a poisoned one (the
 * reference result); a CUDA worker does the same with device copies of
 * both caches, in its own namespace. Then:
 *   - the objects the CUDA worker stored equal the host worker's byte for
 *     byte (raw, fp8, int8, kivi4: the kernels are bit-exact);
 *   - the loaded device cache equals the host backend's cache byte for
 *     byte, poison outside the listed blocks included (raw: the source
 *     blocks themselves); tq4, whose GPU encoder may round a few codes the
 *     other way (docs/codecs.md's parity contract), must be as close to
 *     the source as the host's result (relative MSE within 2%) and leave
 *     every other byte as it was;
 *   - ordering on the engine's stream: the device source cache starts
 *     poisoned and each layer's real bytes are copied into it on the
 *     engine's stream just before save_kv_layer(l, stream), so a save not
 *     ordered after the stream would store poison; after
 *     wait_for_layer_load(l, stream) a copy enqueued on the stream
 *     snapshots layer l, which must already be the loaded one;
 *   - a staging buffer of 3 objects for 4 blocks (a partial last chunk)
 *     and the default one; a created stream and the legacy default stream;
 *     layerwise and whole-step loads; an asynchronous load;
 *   - a step that does not finish (cleared after one layer's save, or
 *     aborted by the engine) commits nothing.
 * Two CUDA workers holding one head each write the objects of one host
 * worker holding both (object_heads: the same bytes) and load its objects
 * into the same cache.
 * Also: a cache in host memory, or split between host and device, is
 * refused at register with a reason; no lease is left at the end.
 * Exits 77 (skipped) when built without CUDA or run without a device.
 * Built a second time as test_cuda_worker_fake against gpu/fake_cuda.c, a
 * CPU model of kernels/cuda with queued streams, so the backend's logic
 * runs in CI (tests/CMakeLists.txt).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/gpu/kvd_gpu_skip_int.h"

#include "kvdepot/common.h"
#ifdef KVD_HAVE_CUDA
#include <math.h>
#include <poll.h>

#include "tests/unit/kvd_testcache_int.h"
#include "tests/unit/kvd_testdata_int.h"
#include "tests/support/kvd_testplan.h"

#include "common/failpoint_int.h"
#include "kvdepot/kernels_cuda.h"
#include "kernels/ref/ref.h"
#ifdef KVD_FAKE_CUDA
#include "tests/gpu/fake_cuda_int.h"
#endif
#include "kvdepot/worker.h"

#define POISON 0x5a
#define LAYERS 3
#define BLOCKS 8
#define BS 16
#define HEADS 2
#define DIM 64
#define N 4

static const int32_t save_blocks[N] = {1, 3, 4, 6};
static const int32_t load_blocks[N] = {7, 0, 5, 2};

/* ---- device caches: a host test cache's twin in device memory ----------- */

typedef struct dev_cache {
    const test_cache_t *h; /* shape and strides */
    unsigned char *mem;    /* h->bytes of device memory */
    void *bases[TEST_CACHE_MAX_LAYERS];
    kvd_kv_layout_t layout;
} dev_cache_t;

static void dev_cache_init(dev_cache_t *d, const test_cache_t *h)
{
    memset(d, 0, sizeof *d);
    d->h = h;
    assert_int_equal(kvd_cuda_mem_create(h->bytes, (void **)&d->mem), KVD_OK);
    for (uint32_t l = 0; l < h->layers; l++) {
        d->bases[l] = d->mem + ((unsigned char *)h->bases[l] - h->mem);
    }
    d->layout = h->layout;
    d->layout.layer_base = d->bases;
}

static void dev_cache_cleanup(dev_cache_t *d)
{
    kvd_cuda_mem_destroy(d->mem);
}

/* Layer l's byte range in the allocation (NHD and HND: one range per
 * layer, all of one size). */
static size_t layer_span(const test_cache_t *h)
{
    return h->bytes / h->layers;
}

static size_t layer_at(const test_cache_t *h, uint32_t l)
{
    return (size_t)((unsigned char *)h->bases[l] - h->mem);
}

/* ---- store, keys, workers ----------------------------------------------- */

static kvd_store_t *store_open(void)
{
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    /* 4 MiB chunks: test_copy_runs's 16 objects of 196 KiB share one, so
     * a step's slots are one run. */
    static const char *const kv[] = {
        "store.arena_size",      "32m", "store.arena_chunk",    "4m",
        "store.arena_hugepages", "off", "store.arena_prefault", "false",
        "store.reserve_timeout", "0"};
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i += 2) {
        assert_int_equal(kvd_config_set(cfg, kv[i], kv[i + 1]), KVD_OK);
    }
    kvd_store_t *st = NULL;
    char err[256] = "";
    kvd_status_t s = kvd_store_open(cfg, &st, err, sizeof err);
    if (s != KVD_OK) {
        fail_msg("kvd_store_open: %s (%s)", kvd_status_str(s), err);
    }
    kvd_config_destroy(cfg);
    return st;
}

static kvd_namespace_t ns_of(unsigned char b)
{
    kvd_namespace_t ns;
    memset(ns.bytes, b, sizeof ns.bytes);
    return ns;
}

static kvd_block_hash_t key_hash(uint32_t k)
{
    kvd_block_hash_t h;
    memset(h.bytes, 0x11, sizeof h.bytes);
    memcpy(h.bytes, &k, sizeof k);
    return h;
}

static bool g_async_saves;         /* side_open: the worker's async_saves */
static uint32_t g_staging_buffers; /* side_open: cuda_staging_buffers */
static uint8_t g_copy_mode;        /* side_open: cuda_copy_mode */

typedef struct side {
    kvd_worker_t *w;
    kvd_namespace_t ns;
    uint64_t step;
} side_t;

/* The side's worker from `cfg`, with cfg->ns (else the test fails). */
static void side_create(side_t *sd, const kvd_worker_config_t *cfg)
{
    char err[256] = "";
    kvd_status_t s = kvd_worker_create(cfg, &sd->w, err, sizeof err);
    if (s != KVD_OK) {
        fail_msg("worker: %s (%s)", kvd_status_str(s), err);
    }
    sd->ns = cfg->ns;
    sd->step = 0;
}

static void side_open(side_t *sd, kvd_store_t *st,
                      const kvd_object_format_t *fmt, kvd_worker_device_t dev,
                      unsigned char ns_byte, uint32_t staging)
{
    kvd_worker_config_t cfg = {0};
    cfg.store = st;
    cfg.ns = ns_of(ns_byte);
    cfg.format = *fmt;
    cfg.device = dev;
    cfg.cuda_staging_blocks = staging;
    cfg.cuda_staging_buffers = g_staging_buffers;
    cfg.cuda_copy_mode = g_copy_mode;
    cfg.async_saves = g_async_saves;
    side_create(sd, &cfg);
}

static void side_register(side_t *sd, const kvd_kv_layout_t *layout)
{
    char err[256] = "";
    kvd_status_t s =
        kvd_worker_register_kv_caches(sd->w, layout, err, sizeof err);
    if (s != KVD_OK) {
        fail_msg("register: %s (%s)", kvd_status_str(s), err);
    }
}

static void side_bind(side_t *sd, const kvd_testplan_req_t *r)
{
    size_t len = 0;
    uint8_t *plan = kvd_testplan_pack(++sd->step, BS, &sd->ns, r, 1, &len);
    assert_non_null(plan);
    char err[256] = "";
    kvd_status_t s =
        kvd_worker_bind_metadata(sd->w, plan, len, err, sizeof err);
    free(plan);
    if (s != KVD_OK) {
        fail_msg("bind: %s (%s)", kvd_status_str(s), err);
    }
}

static void hashes_of(kvd_block_hash_t *h)
{
    for (uint32_t i = 0; i < N; i++) {
        h[i] = key_hash(100 + i);
    }
}

/* Called after each layer's wait or before each layer's save. */
typedef void (*layer_hook_t)(void *arg, uint32_t layer, void *stream);

static void save_step(side_t *sd, void *stream, layer_hook_t before_save,
                      void *arg)
{
    kvd_block_hash_t h[N];
    hashes_of(h);
    kvd_testplan_req_t r = {.id = "writer",
                            .layerwise = true,
                            .n_saves = N,
                            .save_ids = save_blocks,
                            .save_hashes = h};
    side_bind(sd, &r);
    assert_int_equal(kvd_worker_start_load_kv(sd->w, stream), KVD_OK);
    for (uint32_t l = 0; l < LAYERS; l++) {
        assert_int_equal(kvd_worker_wait_for_layer_load(sd->w, l, stream),
                         KVD_OK);
        if (before_save != NULL) {
            before_save(arg, l, stream);
        }
        assert_int_equal(kvd_worker_save_kv_layer(sd->w, l, stream), KVD_OK);
    }
    assert_int_equal(kvd_worker_wait_for_save(sd->w, stream), KVD_OK);
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(sd->w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_finished_saving, 1);
    assert_int_equal(kvd_worker_clear_metadata(sd->w), KVD_OK);
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(sd->w, &ws), KVD_OK);
    assert_int_equal(ws.saves_dropped, 0);
}

static void load_step(side_t *sd, bool layerwise, void *stream,
                      layer_hook_t after_wait, void *arg)
{
    kvd_block_hash_t h[N];
    hashes_of(h);
    kvd_testplan_req_t r = {.id = "reader",
                            .layerwise = layerwise,
                            .n_loads = N,
                            .load_ids = load_blocks,
                            .load_hashes = h};
    side_bind(sd, &r);
    assert_int_equal(kvd_worker_start_load_kv(sd->w, stream), KVD_OK);
    if (!layerwise && after_wait != NULL) {
        /* Whole-step loads: the stream waits for every layer already. */
        for (uint32_t l = 0; l < LAYERS; l++) {
            after_wait(arg, l, stream);
        }
    }
    for (uint32_t l = 0; layerwise && l < LAYERS; l++) {
        assert_int_equal(kvd_worker_wait_for_layer_load(sd->w, l, stream),
                         KVD_OK);
        if (after_wait != NULL) {
            after_wait(arg, l, stream);
        }
    }
    assert_int_equal(kvd_worker_wait_for_save(sd->w, stream), KVD_OK);
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(sd->w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_finished_loading, 1);
    assert_int_equal(f.num_failed_loads, 0);
    assert_int_equal(kvd_worker_clear_metadata(sd->w), KVD_OK);
}

/* ---- hooks on the engine's stream --------------------------------------- */

typedef struct copy_arg {
    const test_cache_t *h;
    unsigned char *dst;       /* device bytes written */
    const unsigned char *src; /* device bytes read */
} copy_arg_t;

/* Copies layer l's range from `src` to `dst` on the engine's stream. Before
 * save_kv_layer(l): the forward pass writing the layer it then saves.
 * After wait_for_layer_load(l): a snapshot of the loaded layer, which runs
 * after whatever the stream was made to wait for. */
static void copy_layer(void *arg, uint32_t l, void *stream)
{
    copy_arg_t *a = arg;
    size_t at = layer_at(a->h, l);
    assert_int_equal(
        kvd_cuda_copy_async(a->dst + at, a->src + at, layer_span(a->h), stream),
        KVD_OK);
}

/* ---- comparisons -------------------------------------------------------- */

static bool block_listed(int32_t b)
{
    for (int i = 0; i < N; i++) {
        if (load_blocks[i] == b) {
            return true;
        }
    }
    return false;
}

/* Every element of (layer, plane, block, token, head) outside the listed
 * blocks is poison in `mem` (NHD/HND: they cover the allocation). */
static void assert_poison_outside(const test_cache_t *c,
                                  const unsigned char *mem)
{
    for (uint32_t l = 0; l < c->layers; l++) {
        for (uint32_t p = 0; p < c->planes; p++) {
            for (uint32_t b = 0; b < c->blocks; b++) {
                if (block_listed((int32_t)b)) {
                    continue;
                }
                for (uint32_t t = 0; t < c->bs; t++) {
                    for (uint32_t hd = 0; hd < c->heads; hd++) {
                        size_t i = flat_index(c, l, p, b, t, hd, 0) * c->elt;
                        for (size_t k = 0; k < c->dim * c->elt; k++) {
                            if (mem[i + k] != POISON) {
                                fail_msg("byte of block %u layer %u changed", b,
                                         l);
                            }
                        }
                    }
                }
            }
        }
    }
}

/* Relative squared error of the loaded blocks against the saved ones. */
static double rel_mse(const test_cache_t *c, const unsigned char *src,
                      const unsigned char *dst)
{
    double err = 0.0, ref = 0.0;
    for (uint32_t l = 0; l < c->layers; l++) {
        for (uint32_t p = 0; p < c->planes; p++) {
            for (int i = 0; i < N; i++) {
                for (uint32_t t = 0; t < c->bs; t++) {
                    for (uint32_t hd = 0; hd < c->heads; hd++) {
                        for (uint32_t ch = 0; ch < c->dim; ch++) {
                            uint16_t a, b;
                            memcpy(&a,
                                   src + flat_index(c, l, p,
                                                    (uint32_t)save_blocks[i], t,
                                                    hd, ch) *
                                             2,
                                   2);
                            memcpy(&b,
                                   dst + flat_index(c, l, p,
                                                    (uint32_t)load_blocks[i], t,
                                                    hd, ch) *
                                             2,
                                   2);
                            double x = kvd_half_to_float(a);
                            double y = kvd_half_to_float(b);
                            err += (x - y) * (x - y);
                            ref += x * x;
                        }
                    }
                }
            }
        }
    }
    return err / ref;
}

static void assert_objects_equal(kvd_store_t *st, const kvd_namespace_t *a,
                                 const kvd_namespace_t *b, size_t bytes)
{
    kvd_block_hash_t h[N];
    hashes_of(h);
    kvd_store_lease_t la[N], lb[N];
    size_t ma = 0, mb = 0;
    assert_int_equal(kvd_store_lookup(st, a, h, N, la, &ma), KVD_OK);
    assert_int_equal(kvd_store_lookup(st, b, h, N, lb, &mb), KVD_OK);
    assert_int_equal(ma, N);
    assert_int_equal(mb, N);
    for (int i = 0; i < N; i++) {
        const void *x = kvd_store_arena_ptr(st, la[i].arena_offset, bytes);
        const void *y = kvd_store_arena_ptr(st, lb[i].arena_offset, bytes);
        assert_non_null(x);
        assert_non_null(y);
        if (memcmp(x, y, bytes) != 0) {
            fail_msg("object %d stored by the CUDA worker differs", i);
        }
    }
    assert_int_equal(kvd_store_release(st, la, N), KVD_OK);
    assert_int_equal(kvd_store_release(st, lb, N), KVD_OK);
}

static void fill_random(test_cache_t *c, uint64_t seed)
{
    size_t n = c->bytes / c->elt;
    uint16_t *e = (uint16_t *)(void *)c->mem;
    for (size_t i = 0; i < n; i++) {
        e[i] = kvd_float_to_half((float)kvd_test_gauss(&seed));
    }
}

/* ---- the round trip ----------------------------------------------------- */

typedef struct rt_case {
    engine_layout_t kind;
    kvd_codec_t codec;
    uint32_t staging; /* 0: default */
    bool legacy_stream;
    bool layerwise;
    /* On the CPU model: the side streams race ahead of the engine's for
     * the save step, the engine's ahead of theirs for the load step
     * (tests/gpu/fake_cuda_int.h); else both lag as far as they may. */
    bool ahead;
    uint32_t buffers; /* cuda_staging_buffers (0: the default) */
} rt_case_t;

/* The CPU model's scheduling of the streams (no-op on a GPU). */
static void streams_ahead(const rt_case_t *k, void *stream, bool engine)
{
#ifdef KVD_FAKE_CUDA
    if (k->ahead && engine) {
        kvd_fake_cuda_engine_ahead(stream);
    } else if (k->ahead) {
        kvd_fake_cuda_others_ahead(stream);
    }
#else
    (void)k;
    (void)stream;
    (void)engine;
#endif
}

static void streams_lazy(void)
{
#ifdef KVD_FAKE_CUDA
    kvd_fake_cuda_lazy();
#endif
}

static void round_trip(const rt_case_t *k)
{
    test_cache_t src, hdst, got, snap;
    cache_init(&src, k->kind, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&hdst, k->kind, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&got, k->kind, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&snap, k->kind, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    fill_random(&src, 0x5eed + (uint64_t)k->kind * 31u + k->codec);
    memset(hdst.mem, POISON, hdst.bytes);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, k->codec);
    const char *name = layout_name(k->kind);
    const char *codec = kvd_codec_name(k->codec);

    kvd_store_t *st = store_open();
    /* The reference: the host backend. */
    side_t host;
    side_open(&host, st, &fmt, KVD_WORKER_DEVICE_HOST, 0x42, 0);
    side_register(&host, &src.layout);
    save_step(&host, NULL, NULL, NULL);
    side_register(&host, &hdst.layout);
    load_step(&host, true, NULL, NULL, NULL);

    /* The CUDA backend on device twins: the source starts poisoned and
     * gets its real bytes layer by layer on the engine's stream. */
    dev_cache_t dsrc, dtruth, ddst, dsnap;
    dev_cache_init(&dsrc, &src);
    dev_cache_init(&dtruth, &src);
    dev_cache_init(&ddst, &hdst);
    dev_cache_init(&dsnap, &snap);
    assert_int_equal(kvd_cuda_mem_set(dsrc.mem, POISON, src.bytes), KVD_OK);
    assert_int_equal(kvd_cuda_mem_copy(dtruth.mem, src.mem, src.bytes), KVD_OK);
    assert_int_equal(kvd_cuda_mem_set(ddst.mem, POISON, hdst.bytes), KVD_OK);
    assert_int_equal(kvd_cuda_mem_set(dsnap.mem, 0, snap.bytes), KVD_OK);
    void *stream = NULL;
    if (!k->legacy_stream) {
        assert_int_equal(kvd_cuda_stream_create(&stream), KVD_OK);
    }
    side_t dev;
    g_staging_buffers = k->buffers;
    side_open(&dev, st, &fmt, KVD_WORKER_DEVICE_CUDA, 0x43, k->staging);
    g_staging_buffers = 0;
    side_register(&dev, &dsrc.layout);
    copy_arg_t stage = {&src, dsrc.mem, dtruth.mem};
    streams_ahead(k, stream, false);
    save_step(&dev, stream, copy_layer, &stage);
    streams_lazy();
    side_register(&dev, &ddst.layout);
    copy_arg_t shot = {&src, dsnap.mem, ddst.mem};
    streams_ahead(k, stream, true);
    load_step(&dev, k->layerwise, stream, copy_layer, &shot);
    streams_lazy();
    assert_int_equal(kvd_cuda_stream_wait(stream), KVD_OK);
    assert_int_equal(kvd_cuda_mem_copy(got.mem, ddst.mem, got.bytes), KVD_OK);
    assert_int_equal(kvd_cuda_mem_copy(snap.mem, dsnap.mem, snap.bytes),
                     KVD_OK);

    /* The snapshots, taken on the stream right after each wait, already
     * hold the loaded layers. */
    if (memcmp(snap.mem, got.mem, got.bytes) != 0) {
        fail_msg("%s %s: a layer was not in place for the engine's stream "
                 "after its wait",
                 name, codec);
    }
    if (k->codec == KVD_CODEC_TQ4) {
        assert_poison_outside(&got, got.mem);
        double h = rel_mse(&src, src.mem, hdst.mem);
        double g = rel_mse(&src, src.mem, got.mem);
        if (fabs(g - h) > 0.02 * h) {
            fail_msg("%s tq4: relative MSE %.6g on the device, %.6g on the "
                     "host",
                     name, g, h);
        }
    } else {
        assert_objects_equal(st, &host.ns, &dev.ns, kvd_object_bytes(&fmt));
        if (memcmp(got.mem, hdst.mem, got.bytes) != 0) {
            fail_msg("%s %s: the device cache differs from the host "
                     "backend's",
                     name, codec);
        }
    }
    if (k->codec == KVD_CODEC_RAW) {
        assert_true(rel_mse(&src, src.mem, got.mem) == 0.0);
    }
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(dev.w, &ws), KVD_OK);
    assert_int_equal(ws.blocks_saved, N);
    assert_int_equal(ws.blocks_loaded, N);
    assert_int_equal(ws.load_errors, 0);

    kvd_worker_destroy(dev.w);
    kvd_worker_destroy(host.w);
    kvd_store_stats_t ss;
    assert_int_equal(kvd_store_stats(st, &ss), KVD_OK);
    assert_int_equal(ss.leases, 0);
    kvd_store_close(st);
    kvd_cuda_stream_destroy(stream);
    dev_cache_cleanup(&dsrc);
    dev_cache_cleanup(&dtruth);
    dev_cache_cleanup(&ddst);
    dev_cache_cleanup(&dsnap);
    cache_cleanup(&src);
    cache_cleanup(&hdst);
    cache_cleanup(&got);
    cache_cleanup(&snap);
}

static void test_round_trips(void **state)
{
    (void)state;
    static const kvd_codec_t codecs[] = {KVD_CODEC_RAW, KVD_CODEC_FP8_E4M3,
                                         KVD_CODEC_INT8, KVD_CODEC_KIVI4,
                                         KVD_CODEC_TQ4};
    static const engine_layout_t kinds[] = {LAYOUT_VLLM_NHD, LAYOUT_VLLM_HND};
    unsigned n = 0;
    for (size_t i = 0; i < 2; i++) {
        for (size_t c = 0; c < sizeof codecs / sizeof *codecs; c++, n++) {
            rt_case_t k = {.kind = kinds[i],
                           .codec = codecs[c],
                           .staging = n % 2 == 0 ? 3 : 0,
                           .legacy_stream = n % 3 == 2,
                           .layerwise = n % 4 != 3,
                           .ahead = n / 2 % 2 == 1,
                           .buffers = n % 5 == 1   ? 1
                                      : n % 5 == 4 ? 3
                                                   : 0};
            round_trip(&k);
        }
    }
}

/* ---- asynchronous loads ------------------------------------------------- */

/* Drains reports until `id` finished loading (5 s at most). */
static void wait_loaded(kvd_worker_t *w, const char *id)
{
    for (int i = 0; i < 500; i++) {
        kvd_worker_finished_t f;
        assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
        assert_int_equal(f.num_failed_loads, 0);
        for (size_t k = 0; k < f.num_finished_loading; k++) {
            if (strcmp(f.finished_loading[k], id) == 0) {
                assert_true(f.loading_async[k]);
                return;
            }
        }
        struct pollfd p = {kvd_worker_fd(w), POLLIN, 0};
        (void)poll(&p, 1, 10);
    }
    fail_msg("request %s never finished loading", id);
}

static void test_async_load(void **state)
{
    (void)state;
    test_cache_t src, got;
    cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&got, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    fill_random(&src, 77);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    dev_cache_t dsrc, ddst;
    dev_cache_init(&dsrc, &src);
    dev_cache_init(&ddst, &got);
    assert_int_equal(kvd_cuda_mem_copy(dsrc.mem, src.mem, src.bytes), KVD_OK);
    assert_int_equal(kvd_cuda_mem_set(ddst.mem, POISON, got.bytes), KVD_OK);
    kvd_store_t *st = store_open();
    side_t dev;
    side_open(&dev, st, &fmt, KVD_WORKER_DEVICE_CUDA, 0x44, 3);
    side_register(&dev, &dsrc.layout);
    save_step(&dev, NULL, NULL, NULL);
    side_register(&dev, &ddst.layout);
    kvd_block_hash_t h[N];
    hashes_of(h);
    kvd_testplan_req_t r = {.id = "late",
                            .async = true,
                            .n_loads = N,
                            .load_ids = load_blocks,
                            .load_hashes = h};
    side_bind(&dev, &r);
    assert_int_equal(kvd_worker_start_load_kv(dev.w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(dev.w), KVD_OK);
    wait_loaded(dev.w, "late");
    /* Reported: the engine may read the blocks at once (on the CPU model,
     * a stream that runs what it is given right away). */
    dev_cache_t dsnap;
    dev_cache_init(&dsnap, &got);
#ifdef KVD_FAKE_CUDA
    kvd_fake_cuda_engine_ahead(NULL);
#endif
    assert_int_equal(kvd_cuda_copy_async(dsnap.mem, ddst.mem, got.bytes, NULL),
                     KVD_OK);
    assert_int_equal(kvd_cuda_stream_wait(NULL), KVD_OK);
#ifdef KVD_FAKE_CUDA
    kvd_fake_cuda_lazy();
#endif
    assert_int_equal(kvd_cuda_mem_copy(got.mem, dsnap.mem, got.bytes), KVD_OK);
    dev_cache_cleanup(&dsnap);
    assert_true(rel_mse(&src, src.mem, got.mem) == 0.0);
    assert_poison_outside(&got, got.mem);
    kvd_worker_destroy(dev.w);
    kvd_store_stats_t ss;
    assert_int_equal(kvd_store_stats(st, &ss), KVD_OK);
    assert_int_equal(ss.leases, 0);
    kvd_store_close(st);
    dev_cache_cleanup(&dsrc);
    dev_cache_cleanup(&ddst);
    cache_cleanup(&src);
    cache_cleanup(&got);
}

/* How many of the N keys of save_step a lookup in `ns` finds. */
static size_t stored(kvd_store_t *st, const kvd_namespace_t *ns)
{
    kvd_block_hash_t h[N];
    kvd_store_lease_t l[N];
    hashes_of(h);
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, ns, h, N, l, &m), KVD_OK);
    if (m > 0) {
        assert_int_equal(kvd_store_release(st, l, m), KVD_OK);
    }
    return m;
}

/* A step that does not finish commits nothing: clear_metadata after layer
 * 0's save only, and abort_step after every layer's; the copies enqueued
 * on the side stream are drained before the slots go back, and the same
 * keys then save whole. */
static void test_aborted_steps(void **state)
{
    (void)state;
    test_cache_t src;
    cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    fill_random(&src, 91);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    dev_cache_t dsrc;
    dev_cache_init(&dsrc, &src);
    assert_int_equal(kvd_cuda_mem_copy(dsrc.mem, src.mem, src.bytes), KVD_OK);
    kvd_store_t *st = store_open();
    side_t dev;
    side_open(&dev, st, &fmt, KVD_WORKER_DEVICE_CUDA, 0x44, 3);
    side_register(&dev, &dsrc.layout);
    kvd_block_hash_t h[N];
    hashes_of(h);
    kvd_testplan_req_t r = {.id = "cut",
                            .layerwise = true,
                            .n_saves = N,
                            .save_ids = save_blocks,
                            .save_hashes = h};
    side_bind(&dev, &r);
    assert_int_equal(kvd_worker_save_kv_layer(dev.w, 0, NULL), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(dev.w), KVD_OK);
    assert_int_equal(stored(st, &dev.ns), 0);
    side_bind(&dev, &r);
    for (uint32_t l = 0; l < LAYERS; l++) {
        assert_int_equal(kvd_worker_save_kv_layer(dev.w, l, NULL), KVD_OK);
    }
    assert_int_equal(kvd_worker_abort_step(dev.w), KVD_OK);
    assert_int_equal(kvd_worker_wait_for_save(dev.w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(dev.w), KVD_OK);
    assert_int_equal(stored(st, &dev.ns), 0);
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(dev.w, &ws), KVD_OK);
    assert_int_equal(ws.saves_aborted, 2 * N);
    assert_int_equal(ws.blocks_saved, 0);
    kvd_worker_finished_t f; /* both steps reported, once */
    assert_int_equal(kvd_worker_get_finished(dev.w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_finished_saving, 1);
    assert_string_equal(f.finished_saving[0], "cut");
    save_step(&dev, NULL, NULL, NULL);
    assert_int_equal(stored(st, &dev.ns), N);
    kvd_worker_destroy(dev.w);
    kvd_store_stats_t ss;
    assert_int_equal(kvd_store_stats(st, &ss), KVD_OK);
    assert_int_equal(ss.leases, 0);
    kvd_store_close(st);
    dev_cache_cleanup(&dsrc);
    cache_cleanup(&src);
}

/* ---- saves that outlive their step --------------------------------------- */

/* One step of `w` saving `blocks` under keys base..base+N-1, every layer,
 * then wait_for_save and clear. */
static void saving_step(side_t *sd, const int32_t *blocks, uint32_t base)
{
    kvd_block_hash_t h[N];
    for (uint32_t i = 0; i < N; i++) {
        h[i] = key_hash(base + i);
    }
    kvd_testplan_req_t r = {.id = "writer",
                            .layerwise = true,
                            .n_saves = N,
                            .save_ids = blocks,
                            .save_hashes = h};
    side_bind(sd, &r);
    assert_int_equal(kvd_worker_start_load_kv(sd->w, NULL), KVD_OK);
    for (uint32_t l = 0; l < LAYERS; l++) {
        assert_int_equal(kvd_worker_save_kv_layer(sd->w, l, NULL), KVD_OK);
    }
    assert_int_equal(kvd_worker_wait_for_save(sd->w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(sd->w), KVD_OK);
}

/* Object key base+i of namespace `ns` equals object key base+i of `ref`. */
static void assert_same_objects(kvd_store_t *st, const kvd_namespace_t *ns,
                                const kvd_namespace_t *ref, uint32_t base,
                                size_t bytes)
{
    for (uint32_t i = 0; i < N; i++) {
        kvd_block_hash_t h = key_hash(base + i);
        kvd_store_lease_t a, b;
        size_t ma = 0, mb = 0;
        assert_int_equal(kvd_store_lookup(st, ns, &h, 1, &a, &ma), KVD_OK);
        assert_int_equal(kvd_store_lookup(st, ref, &h, 1, &b, &mb), KVD_OK);
        assert_int_equal(ma, 1);
        assert_int_equal(mb, 1);
        const void *x = kvd_store_arena_ptr(st, a.arena_offset, bytes);
        const void *y = kvd_store_arena_ptr(st, b.arena_offset, bytes);
        if (memcmp(x, y, bytes) != 0) {
            fail_msg("object %u saved across steps differs", base + i);
        }
        assert_int_equal(kvd_store_release(st, &a, 1), KVD_OK);
        assert_int_equal(kvd_store_release(st, &b, 1), KVD_OK);
    }
}

/* A random cache on the host and its device twin, one store, a host
 * worker that saved save_blocks under keys base.. (the reference) and a
 * CUDA worker with async_saves registered on the twin. */
typedef struct async_pair {
    test_cache_t src;
    dev_cache_t dsrc;
    kvd_object_format_t fmt;
    kvd_store_t *st;
    side_t host, dev;
} async_pair_t;

static void async_pair_open(async_pair_t *p, uint64_t seed, unsigned char ns,
                            uint32_t base)
{
    cache_init(&p->src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    fill_random(&p->src, seed);
    p->fmt = cache_format(&p->src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    dev_cache_init(&p->dsrc, &p->src);
    assert_int_equal(kvd_cuda_mem_copy(p->dsrc.mem, p->src.mem, p->src.bytes),
                     KVD_OK);
    p->st = store_open();
    side_open(&p->host, p->st, &p->fmt, KVD_WORKER_DEVICE_HOST, ns, 0);
    side_register(&p->host, &p->src.layout);
    saving_step(&p->host, save_blocks, base);
    g_async_saves = true;
    side_open(&p->dev, p->st, &p->fmt, KVD_WORKER_DEVICE_CUDA,
              (unsigned char)(ns + 1), 0);
    g_async_saves = false;
    side_register(&p->dev, &p->dsrc.layout);
}

static void async_pair_close(async_pair_t *p)
{
    kvd_worker_destroy(p->dev.w);
    kvd_worker_destroy(p->host.w);
    kvd_store_close(p->st);
    dev_cache_cleanup(&p->dsrc);
    cache_cleanup(&p->src);
}

/* async_saves on the CUDA backend: the committer is held before it
 * drains step 1 (worker.drain=block), so step 1's copies wait on the side
 * stream (the CPU model runs them only when waited for) while step 2
 * uploads its block ids and enqueues its own. Each step's ids stay its
 * own: both steps' objects equal the host backend's. */
static void test_async_saves_keep_their_ids(void **state)
{
    (void)state;
#ifndef KVD_FAILPOINTS_ENABLED
    skip();
#endif
    static const int32_t other_blocks[N] = {0, 2, 5, 7};
    async_pair_t p;
    async_pair_open(&p, 123, 0x45, 500);
    saving_step(&p.host, other_blocks, 600);
    assert_int_equal(kvd_failpoint_set("worker.drain=block", NULL, 0), KVD_OK);
    saving_step(&p.dev, save_blocks, 500);
    saving_step(&p.dev, other_blocks, 600);
    bool saving = false; /* nothing committed yet: step 1 is held */
    assert_int_equal(kvd_worker_request_saving(p.dev.w, "writer", &saving),
                     KVD_OK);
    assert_true(saving);
    kvd_failpoint_clear();
    assert_int_equal(kvd_worker_flush_saves(p.dev.w), KVD_OK);
    size_t bytes = kvd_object_bytes(&p.fmt); /* the headers name each ns */
    assert_same_objects(p.st, &p.dev.ns, &p.host.ns, 500, bytes);
    assert_same_objects(p.st, &p.dev.ns, &p.host.ns, 600, bytes);
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(p.dev.w, &ws), KVD_OK);
    assert_int_equal(ws.blocks_saved, 2 * N);
    assert_int_equal(ws.saves_inflight, 0);
    async_pair_close(&p);
}

/* kvd_worker_blocks_fence when the engine's stream cannot be ordered after
 * the side stream (a CUDA error, worker.reads_order): the earlier step's
 * copies are waited for on the CPU instead, so the fence holds and the
 * call succeeds (the engine's step goes on). The committer is held, so
 * only the fence runs the copies (the CPU model runs a stream's work when
 * it is waited for); the cache is overwritten right after it. */
static void test_fence_falls_back_to_waiting(void **state)
{
    (void)state;
#ifndef KVD_FAILPOINTS_ENABLED
    skip();
#endif
    async_pair_t p;
    async_pair_open(&p, 321, 0x47, 700);
    assert_int_equal(
        kvd_failpoint_set("worker.drain=block,worker.reads_order=EIO", NULL, 0),
        KVD_OK);
    saving_step(&p.dev, save_blocks, 700);
    assert_int_equal(kvd_worker_blocks_fence(p.dev.w, NULL), KVD_OK);
    assert_int_equal(kvd_cuda_mem_set(p.dsrc.mem, 0, p.src.bytes), KVD_OK);
    kvd_failpoint_clear();
    assert_int_equal(kvd_worker_flush_saves(p.dev.w), KVD_OK);
    assert_same_objects(p.st, &p.dev.ns, &p.host.ns, 700,
                        kvd_object_bytes(&p.fmt));
    async_pair_close(&p);
}

/* Frees a test's device source and destination and their host sides. */
static void caches_cleanup(dev_cache_t *dsrc, dev_cache_t *ddst,
                           test_cache_t *src, test_cache_t *hdst,
                           test_cache_t *got)
{
    dev_cache_cleanup(dsrc);
    dev_cache_cleanup(ddst);
    cache_cleanup(src);
    cache_cleanup(hdst);
    cache_cleanup(got);
}

/* ---- copies in runs ------------------------------------------------------ */

/* A whole-step load of keys[i] into load_blocks[i]. */
static void loading_step(side_t *sd, const uint32_t *keys)
{
    kvd_block_hash_t h[N];
    for (uint32_t i = 0; i < N; i++) {
        h[i] = key_hash(keys[i]);
    }
    kvd_testplan_req_t r = {.id = "reader",
                            .n_loads = N,
                            .load_ids = load_blocks,
                            .load_hashes = h};
    side_bind(sd, &r);
    assert_int_equal(kvd_worker_start_load_kv(sd->w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_wait_for_save(sd->w, NULL), KVD_OK);
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(sd->w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_failed_loads, 0);
    assert_int_equal(kvd_worker_clear_metadata(sd->w), KVD_OK);
}

static uint64_t copy_ops(const side_t *sd)
{
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(sd->w, &ws), KVD_OK);
    return ws.copy_ops;
}

/* A CUDA worker with cuda_copy_mode `mode` (namespace byte `ns`) saves
 * save_blocks of `dsrc` under keys 900.. and loads keys 901, 902, 900, 903
 * into `ddst`: the objects equal the host reference's (namespace `ref`),
 * the loaded cache equals `hdst`, and the copies per layer of a step are
 * `save_ops` and `load_ops`. */
static void copy_mode_step(kvd_store_t *st, const kvd_object_format_t *fmt,
                           uint8_t mode, unsigned char ns,
                           const kvd_namespace_t *ref, dev_cache_t *dsrc,
                           dev_cache_t *ddst, const test_cache_t *hdst,
                           test_cache_t *got, uint64_t save_ops,
                           uint64_t load_ops)
{
    static const uint32_t mixed[N] = {901, 902, 900, 903};
    side_t dev;
    g_copy_mode = mode;
    side_open(&dev, st, fmt, KVD_WORKER_DEVICE_CUDA, ns, 0);
    g_copy_mode = KVD_WORKER_COPY_AUTO;
    side_register(&dev, &dsrc->layout);
    saving_step(&dev, save_blocks, 900);
    assert_int_equal(copy_ops(&dev), save_ops * LAYERS);
    assert_same_objects(st, &dev.ns, ref, 900, kvd_object_bytes(fmt));
    assert_int_equal(kvd_cuda_mem_set(ddst->mem, POISON, hdst->bytes), KVD_OK);
    side_register(&dev, &ddst->layout);
    loading_step(&dev, mixed);
    assert_int_equal(copy_ops(&dev), (save_ops + load_ops) * LAYERS);
    assert_int_equal(kvd_cuda_mem_copy(got->mem, ddst->mem, got->bytes),
                     KVD_OK);
    if (memcmp(got->mem, hdst->mem, got->bytes) != 0) {
        fail_msg("copy mode %u: the device cache differs from the host's",
                 (unsigned)mode);
    }
    kvd_worker_destroy(dev.w);
}

/* A step's saves get arena slots one after another, so in runs each layer
 * of them moves as one 2D copy, and loading keys 1, 2, 0, 3 of them makes
 * two runs a layer (slots 1-2 at one slot's stride, slots 0 and 3 at
 * three); per object every object's layer is a copy of its own. The
 * default picks runs for layer regions under KVD_WORKER_COPY_RUN_BELOW
 * bytes (8 KiB here; 64 KiB with 8 heads of 128), one copy per object at
 * or above. Every way the objects and the loaded cache equal the host
 * backend's. */
static void test_copy_runs(void **state)
{
    (void)state;
    static const uint32_t mixed[N] = {901, 902, 900, 903};
    static const uint32_t heads[2] = {HEADS, 8}, dims[2] = {DIM, 128};
    for (int big = 0; big < 2; big++) {
        test_cache_t src, hdst, got;
        cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, heads[big],
                   dims[big]);
        cache_init(&hdst, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, heads[big],
                   dims[big]);
        cache_init(&got, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, heads[big],
                   dims[big]);
        fill_random(&src, 77 + (uint64_t)big);
        memset(hdst.mem, POISON, hdst.bytes);
        kvd_object_format_t fmt =
            cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
        assert_true((kvd_object_layer_bytes(&fmt) >=
                     KVD_WORKER_COPY_RUN_BELOW) == (big == 1));
        dev_cache_t dsrc, ddst;
        dev_cache_init(&dsrc, &src);
        dev_cache_init(&ddst, &hdst);
        assert_int_equal(kvd_cuda_mem_copy(dsrc.mem, src.mem, src.bytes),
                         KVD_OK);
        kvd_store_t *st = store_open();
        side_t host;
        side_open(&host, st, &fmt, KVD_WORKER_DEVICE_HOST, 0x49, 0);
        side_register(&host, &src.layout);
        saving_step(&host, save_blocks, 900);
        side_register(&host, &hdst.layout);
        loading_step(&host, mixed);
        assert_int_equal(copy_ops(&host), 0);

        copy_mode_step(st, &fmt, KVD_WORKER_COPY_RUNS, 0x4a, &host.ns, &dsrc,
                       &ddst, &hdst, &got, 1, 2);
        copy_mode_step(st, &fmt, KVD_WORKER_COPY_PER_OBJECT, 0x4b, &host.ns,
                       &dsrc, &ddst, &hdst, &got, N, N);
        copy_mode_step(st, &fmt, KVD_WORKER_COPY_AUTO, 0x4c, &host.ns, &dsrc,
                       &ddst, &hdst, &got, big ? N : 1, big ? N : 2);

        kvd_worker_destroy(host.w);
        kvd_store_close(st);
        caches_cleanup(&dsrc, &ddst, &src, &hdst, &got);
    }
}

/* ---- registration errors ------------------------------------------------ */

/* kvd_worker_create refuses `cfg` with KVD_ERR_INVALID, naming `setting`. */
static void assert_refused(const kvd_worker_config_t *cfg, const char *setting)
{
    kvd_worker_t *w = NULL;
    char err[256] = "";
    assert_int_equal(kvd_worker_create(cfg, &w, err, sizeof err),
                     KVD_ERR_INVALID);
    assert_null(w);
    assert_non_null(strstr(err, setting));
}

/* More staging buffers than the backend has events for, or a copy mode it
 * does not know: refused at create, with the setting named. */
static void test_cuda_settings_bounded(void **state)
{
    (void)state;
    test_cache_t c;
    cache_init(&c, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    kvd_store_t *st = store_open();
    kvd_worker_config_t cfg = {0};
    cfg.store = st;
    cfg.ns = ns_of(0x46);
    cfg.format = cache_format(&c, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    cfg.device = KVD_WORKER_DEVICE_CUDA;
    cfg.cuda_staging_buffers = KVD_WORKER_MAX_STAGING_BUFFERS + 1;
    assert_refused(&cfg, "cuda_staging_buffers");
    cfg.cuda_staging_buffers = KVD_WORKER_MAX_STAGING_BUFFERS;
    cfg.cuda_copy_mode = KVD_WORKER_COPY_PER_OBJECT + 1;
    assert_refused(&cfg, "cuda_copy_mode");
    cfg.cuda_copy_mode = KVD_WORKER_COPY_PER_OBJECT;
    kvd_worker_t *w = NULL;
    char err[256] = "";
    assert_int_equal(kvd_worker_create(&cfg, &w, err, sizeof err), KVD_OK);
    kvd_worker_destroy(w);
    kvd_store_close(st);
    cache_cleanup(&c);
}

static void test_register_host_memory_refused(void **state)
{
    (void)state;
    test_cache_t c;
    cache_init(&c, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    kvd_object_format_t fmt = cache_format(&c, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = store_open();
    side_t dev;
    side_open(&dev, st, &fmt, KVD_WORKER_DEVICE_CUDA, 0x45, 0);
    char err[256] = "";
    assert_int_equal(
        kvd_worker_register_kv_caches(dev.w, &c.layout, err, sizeof err),
        KVD_ERR_INVALID);
    assert_non_null(strstr(err, "layer 0"));
    assert_non_null(strstr(err, "not device memory"));
    /* Device memory for layer 0 only. */
    dev_cache_t d;
    dev_cache_init(&d, &c);
    kvd_kv_layout_t mixed = d.layout;
    void *bases[LAYERS] = {d.bases[0], c.bases[1], d.bases[2]};
    mixed.layer_base = bases;
    assert_int_equal(
        kvd_worker_register_kv_caches(dev.w, &mixed, err, sizeof err),
        KVD_ERR_INVALID);
    assert_non_null(strstr(err, "layer 1"));
    /* Nothing registered: plans are refused. */
    uint8_t junk[1] = {0};
    assert_int_equal(kvd_worker_bind_metadata(dev.w, junk, 0, err, sizeof err),
                     KVD_ERR_STATE);
    side_register(&dev, &d.layout);
    kvd_worker_destroy(dev.w);
    kvd_store_close(st);
    dev_cache_cleanup(&d);
    cache_cleanup(&c);
}

/* ---- content loads: keys rotated to new positions ----------------------- */

static const kvd_rope_t g_rope = {.head_dim = DIM,
                                  .rotary_dim = DIM,
                                  .style = KVD_ROPE_NEOX,
                                  .base = 10000.0,
                                  .scaling = KVD_ROPE_SCALING_NONE};

/* Saves save_blocks at positions 0, 16, 32, 48 and loads them as content
 * loads at 160, 16 (its own: not rotated), 400, 0 into a poisoned cache
 * on `dev`'s backend; returns the loaded cache's bytes (host copy). */
static void content_round_trip(kvd_worker_device_t dev, bool async,
                               const test_cache_t *src, test_cache_t *got)
{
    static const uint64_t saved_at[N] = {0, 16, 32, 48};
    static const uint64_t load_at[N] = {160, 16, 400, 0};
    kvd_object_format_t fmt = cache_format(src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = store_open();
    side_t sd;
    side_open(&sd, st, &fmt, dev, 0x55, 0);
    assert_int_equal(kvd_worker_set_rope(sd.w, &g_rope), KVD_OK);
    dev_cache_t dsrc, ddst;
    bool cuda = dev == KVD_WORKER_DEVICE_CUDA;
    memset(got->mem, POISON, got->bytes);
    if (cuda) {
        dev_cache_init(&dsrc, src);
        dev_cache_init(&ddst, got);
        assert_int_equal(kvd_cuda_mem_copy(dsrc.mem, src->mem, src->bytes),
                         KVD_OK);
        assert_int_equal(kvd_cuda_mem_set(ddst.mem, POISON, got->bytes),
                         KVD_OK);
    }
    side_register(&sd, cuda ? &dsrc.layout : &src->layout);
    kvd_block_hash_t h[N];
    hashes_of(h);
    kvd_testplan_req_t w = {.id = "writer",
                            .layerwise = true,
                            .n_saves = N,
                            .save_ids = save_blocks,
                            .save_hashes = h,
                            .save_positions = saved_at};
    side_bind(&sd, &w);
    assert_int_equal(kvd_worker_start_load_kv(sd.w, NULL), KVD_OK);
    for (uint32_t l = 0; l < LAYERS; l++) {
        assert_int_equal(kvd_worker_save_kv_layer(sd.w, l, NULL), KVD_OK);
    }
    assert_int_equal(kvd_worker_wait_for_save(sd.w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(sd.w), KVD_OK);
    side_register(&sd, cuda ? &ddst.layout : &got->layout);
    kvd_testplan_req_t r = {.id = "reader",
                            .async = async,
                            .layerwise = !async,
                            .n_loads = N,
                            .load_ids = load_blocks,
                            .load_hashes = h,
                            .load_positions = load_at,
                            .content = true};
    side_bind(&sd, &r);
    assert_int_equal(kvd_worker_start_load_kv(sd.w, NULL), KVD_OK);
    if (async) {
        assert_int_equal(kvd_worker_clear_metadata(sd.w), KVD_OK);
        wait_loaded(sd.w, "reader");
    } else {
        for (uint32_t l = 0; l < LAYERS; l++) {
            assert_int_equal(kvd_worker_wait_for_layer_load(sd.w, l, NULL),
                             KVD_OK);
        }
        assert_int_equal(kvd_worker_wait_for_save(sd.w, NULL), KVD_OK);
        kvd_worker_finished_t f;
        assert_int_equal(kvd_worker_get_finished(sd.w, NULL, 0, &f), KVD_OK);
        assert_int_equal(f.num_failed_loads, 0);
        assert_int_equal(kvd_worker_clear_metadata(sd.w), KVD_OK);
    }
    if (cuda) {
        assert_int_equal(kvd_cuda_mem_copy(got->mem, ddst.mem, got->bytes),
                         KVD_OK);
        dev_cache_cleanup(&dsrc);
        dev_cache_cleanup(&ddst);
    }
    kvd_worker_destroy(sd.w);
    kvd_store_close(st);
}

/* The CUDA backend rotates a content load's keys as the host backend
 * does, byte for byte (the kernels share their arithmetic), synchronous
 * layer by layer and asynchronous; V, the block loaded at its own
 * position and everything outside the listed blocks are as loaded. */
static void test_content_loads_rotated(void **state)
{
    (void)state;
    for (int async = 0; async < 2; async++) {
        test_cache_t src, ref, got;
        cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
        cache_init(&ref, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
        cache_init(&got, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
        fill_random(&src, 91);
        content_round_trip(KVD_WORKER_DEVICE_HOST, async, &src, &ref);
        content_round_trip(KVD_WORKER_DEVICE_CUDA, async, &src, &got);
        assert_memory_equal(ref.mem, got.mem, ref.bytes);
        /* The rotation happened: block 160's keys differ from the saved
         * ones; the block loaded at its own position (16) does not. */
        size_t k0 = flat_index(&ref, 0, 0, (uint32_t)load_blocks[0], 0, 0, 0);
        size_t s0 = flat_index(&src, 0, 0, (uint32_t)save_blocks[0], 0, 0, 0);
        assert_true(memcmp(ref.mem + 2 * k0 + 2 * DIM * HEADS,
                           src.mem + 2 * s0 + 2 * DIM * HEADS,
                           2 * DIM * HEADS) != 0);
        size_t k1 = flat_index(&ref, 0, 0, (uint32_t)load_blocks[1], 0, 0, 0);
        size_t s1 = flat_index(&src, 0, 0, (uint32_t)save_blocks[1], 0, 0, 0);
        assert_memory_equal(ref.mem + 2 * k1, src.mem + 2 * s1,
                            2 * DIM * HEADS * BS);
        cache_cleanup(&src);
        cache_cleanup(&ref);
        cache_cleanup(&got);
    }
}

/* ---- objects shared by tensor-parallel ranks ---------------------------- */

/* Rank `r` of 2 (one head each) as a CUDA worker in namespace `ns_byte`:
 * its head's view of `d`, the object holding both heads. */
static void rank_open(side_t *sd, kvd_store_t *st, const dev_cache_t *d,
                      kvd_codec_t codec, uint32_t r, unsigned char ns_byte,
                      void **bases)
{
    test_cache_t one = *d->h;
    one.heads = 1;
    kvd_worker_config_t cfg = {0};
    cfg.store = st;
    cfg.ns = ns_of(ns_byte);
    cfg.format = cache_format(&one, KVD_DTYPE_FP16, codec);
    cfg.device = KVD_WORKER_DEVICE_CUDA;
    cfg.cuda_staging_blocks = 3; /* a partial last chunk */
    cfg.object_heads = HEADS;
    cfg.head_start = r;
    side_create(sd, &cfg);
    kvd_kv_layout_t lo = d->layout;
    for (uint32_t l = 0; l < LAYERS; l++) {
        bases[l] = (unsigned char *)d->bases[l] +
                   (size_t)r * (size_t)d->layout.stride_head;
    }
    lo.layer_base = bases;
    side_register(sd, &lo);
}

/* Two CUDA ranks, one head each, write the objects a host worker holding
 * both heads writes, byte for byte, and load what it wrote into what it
 * loads (HND: a head's rows are apart from the other's). */
static void test_shared_objects(void **state)
{
    (void)state;
    static const kvd_codec_t codecs[] = {KVD_CODEC_RAW, KVD_CODEC_FP8_E4M3,
                                         KVD_CODEC_INT8, KVD_CODEC_KIVI4};
    for (size_t c = 0; c < sizeof codecs / sizeof *codecs; c++) {
        test_cache_t src, hdst, got;
        cache_init(&src, LAYOUT_VLLM_HND, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
        cache_init(&hdst, LAYOUT_VLLM_HND, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
        cache_init(&got, LAYOUT_VLLM_HND, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
        fill_random(&src, 0x7a + c);
        memset(hdst.mem, POISON, hdst.bytes);
        kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, codecs[c]);
        kvd_store_t *st = store_open();
        side_t host;
        side_open(&host, st, &fmt, KVD_WORKER_DEVICE_HOST, 0x42, 0);
        side_register(&host, &src.layout);
        save_step(&host, NULL, NULL, NULL);
        side_register(&host, &hdst.layout);
        load_step(&host, true, NULL, NULL, NULL);

        dev_cache_t dsrc, ddst;
        dev_cache_init(&dsrc, &src);
        dev_cache_init(&ddst, &hdst);
        assert_int_equal(kvd_cuda_mem_copy(dsrc.mem, src.mem, src.bytes),
                         KVD_OK);
        assert_int_equal(kvd_cuda_mem_set(ddst.mem, POISON, hdst.bytes),
                         KVD_OK);
        side_t rk[2];
        void *bases[2][LAYERS];
        for (uint32_t r = 0; r < 2; r++) {
            rank_open(&rk[r], st, &dsrc, codecs[c], r, 0x44, bases[r]);
            save_step(&rk[r], NULL, NULL, NULL);
        }
        assert_objects_equal(st, &host.ns, &rk[0].ns, kvd_object_bytes(&fmt));
        for (uint32_t r = 0; r < 2; r++) {
            kvd_worker_destroy(rk[r].w);
            rank_open(&rk[r], st, &ddst, codecs[c], r, 0x42, bases[r]);
            load_step(&rk[r], r == 0, NULL, NULL, NULL);
            kvd_worker_destroy(rk[r].w);
        }
        assert_int_equal(kvd_cuda_mem_copy(got.mem, ddst.mem, got.bytes),
                         KVD_OK);
        if (memcmp(got.mem, hdst.mem, got.bytes) != 0) {
            fail_msg("%s: the two ranks' load differs from the host "
                     "backend's",
                     kvd_codec_name(codecs[c]));
        }
        kvd_worker_destroy(host.w);
        kvd_store_close(st);
        caches_cleanup(&dsrc, &ddst, &src, &hdst, &got);
    }
}
#endif

int main(void)
{
    int skip = kvd_test_gpu_skip();
    if (skip >= 0) {
        return skip;
    }
#ifdef KVD_HAVE_CUDA
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register_host_memory_refused),
        cmocka_unit_test(test_cuda_settings_bounded),
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_async_load),
        cmocka_unit_test(test_aborted_steps),
        cmocka_unit_test(test_content_loads_rotated),
        cmocka_unit_test(test_async_saves_keep_their_ids),
        cmocka_unit_test(test_fence_falls_back_to_waiting),
        cmocka_unit_test(test_copy_runs),
        cmocka_unit_test(test_shared_objects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
