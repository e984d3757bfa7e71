/*
 * CUDA gather/scatter kernels against the C reference (label gpu).
 *
 * For every engine layout the descriptor covers (vLLM FlashAttention NHD
 * and HND, FlashInfer, MLA, the TensorRT-LLM cross-layer pool, and an odd
 * shape that forces every fallback path: unaligned rows, head_dim not a
 * multiple of 8, KIVI codes straddling heads), for fp16 and bf16 (and fp8
 * caches with raw), for every codec on K and V (same codec on both planes,
 * and mixed pairs), with random data and a random block map whose last
 * block is partial:
 *   - gather on the device into a poisoned staging buffer must produce the
 *     bytes kvd_ref_gather_layer produces, padding included: bit-exact for
 *     raw, fp8, int8 and KIVI; for TurboQuant at most 0.1% of the codes may
 *     differ, by +-1, and the relative MSE of the decoded result must be
 *     within 1% of the reference's (docs/codecs.md's parity contract);
 *   - scatter of the reference's objects into a poisoned device cache must
 *     change exactly the listed blocks' valid tokens of that layer, to the
 *     bytes kvd_ref_scatter_layer writes.
 * Runs alternate between the legacy default stream (2D copies for
 * copy-engine planes) and a created stream (batched copies). Also: E4M3
 * conversion of all 2^16 fp16 and bf16 patterns and 10^6 random floats
 * against kvd_float_to_fp8_e4m3, the 8-bit codecs on caches holding NaN,
 * zeros and subnormals (every fast path's fallback), argument errors, and
 * a bench smoke run.
 * Exits 77 (skipped) when built without CUDA or run without a device.
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

#include "kvdepot/kernels_cuda.h"
#include "kernels/ref/ref.h"
#include "kernels/ref/tq_int.h"
#include "kvdepot/kernels.h"

#define TEST_CACHE_BLOCKS 12u
#define TEST_LISTED 5u
#define TEST_POISON 0x7b

typedef enum test_layout {
    TEST_NHD,
    TEST_HND,
    TEST_FLASHINFER,
    TEST_MLA,
    TEST_TRT_POOL,
    TEST_ODD_NHD,
    TEST_HND_BIG /* HND with 1024-token blocks: raw goes to the copy engine */
} test_layout_t;

static const char *const test_layout_names[] = {
    "vllm-nhd", "vllm-hnd", "flashinfer", "mla",
    "trt-pool", "odd-nhd",  "hnd-1024"};

/* ---- deterministic randomness ---------------------------------------- */

static uint64_t test_rng = 0x9e3779b97f4a7c15ull;

static uint64_t test_rand(void)
{
    test_rng ^= test_rng >> 12;
    test_rng ^= test_rng << 25;
    test_rng ^= test_rng >> 27;
    return test_rng * 0x2545f4914f6cdd1dull;
}

static float test_uniform(void)
{
    return (float)((test_rand() >> 40) + 0.5) / (float)(1u << 24);
}

static float test_gauss(void)
{
    float u = test_uniform(), v = test_uniform();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* ---- one cache: host image, device copy, both layouts ----------------- */

typedef struct test_cache {
    kvd_object_format_t fmt;
    test_layout_t kind;
    size_t bytes;
    unsigned char *host;
    void *dev;
    void *host_bases[4];
    void *dev_bases[4];
    kvd_kv_layout_t host_layout, dev_layout;
} test_cache_t;

/* Strides of each layout in bytes, and the byte offset of layer l. */
static void test_cache_geometry(test_cache_t *c, size_t *layer_stride)
{
    const kvd_object_format_t *f = &c->fmt;
    int64_t elt = (int64_t)kvd_dtype_size(f->dtype);
    int64_t row = elt * f->head_dim;
    int64_t nb = TEST_CACHE_BLOCKS;
    kvd_kv_layout_t *l = &c->host_layout;

    switch (c->kind) {
    case TEST_NHD:
    case TEST_ODD_NHD: /* [2, NB, BS, H, D] */
        l->stride_head = row;
        l->stride_token = row * f->num_heads;
        l->stride_block = l->stride_token * f->block_size;
        l->stride_plane = l->stride_block * nb;
        *layer_stride = (size_t)(l->stride_plane * f->num_planes);
        break;
    case TEST_HND: /* [2, NB, H, BS, D] */
    case TEST_HND_BIG:
        l->stride_token = row;
        l->stride_head = row * f->block_size;
        l->stride_block = l->stride_head * f->num_heads;
        l->stride_plane = l->stride_block * nb;
        *layer_stride = (size_t)(l->stride_plane * f->num_planes);
        break;
    case TEST_FLASHINFER: /* [NB, 2, BS, H, D] */
        l->stride_head = row;
        l->stride_token = row * f->num_heads;
        l->stride_plane = l->stride_token * f->block_size;
        l->stride_block = l->stride_plane * f->num_planes;
        *layer_stride = (size_t)(l->stride_block * nb);
        break;
    case TEST_MLA: /* [NB, BS, D], one plane, one head */
        l->stride_head = 0;
        l->stride_plane = 0;
        l->stride_token = row;
        l->stride_block = row * f->block_size;
        *layer_stride = (size_t)(l->stride_block * nb);
        break;
    case TEST_TRT_POOL: /* [NB, L, 2, H, BS, D], one base per layer */
        l->stride_token = row;
        l->stride_head = row * f->block_size;
        l->stride_plane = l->stride_head * f->num_heads;
        *layer_stride = (size_t)(l->stride_plane * f->num_planes);
        l->stride_block = (int64_t)*layer_stride * f->num_layers;
        break;
    }
    l->num_blocks = TEST_CACHE_BLOCKS;
}

static void test_cache_init(test_cache_t *c, test_layout_t kind,
                            const kvd_object_format_t *fmt)
{
    memset(c, 0, sizeof(*c));
    c->fmt = *fmt;
    c->kind = kind;
    size_t layer_stride = 0;
    test_cache_geometry(c, &layer_stride);
    if (kind == TEST_TRT_POOL) {
        c->bytes = (size_t)c->host_layout.stride_block * TEST_CACHE_BLOCKS;
    } else {
        c->bytes = layer_stride * fmt->num_layers;
    }
    c->host = malloc(c->bytes);
    assert_non_null(c->host);
    assert_int_equal(kvd_cuda_mem_create(c->bytes, &c->dev), KVD_OK);
    c->dev_layout = c->host_layout;
    for (unsigned l = 0; l < fmt->num_layers; l++) {
        c->host_bases[l] = c->host + l * layer_stride;
        c->dev_bases[l] = (unsigned char *)c->dev + l * layer_stride;
    }
    c->host_layout.layer_base = c->host_bases;
    c->dev_layout.layer_base = c->dev_bases;
}

static void test_cache_cleanup(test_cache_t *c)
{
    kvd_cuda_mem_destroy(c->dev);
    free(c->host);
}

/* Random values over the whole image: every 16-bit word (or byte for fp8)
 * is an element of some layout position or unused, both fine. A few
 * channels get large outliers, as keys have. */
/* Set by test_hostile_values: the cache also holds what a broken or
 * adversarial one does, one element in 96 of each kind (see there). */
static int test_hostile;

static uint16_t test_hostile_element(kvd_dtype_t dtype, uint16_t u)
{
    uint64_t r = test_rand();
    uint16_t inf = dtype == KVD_DTYPE_BF16 ? 0x7f80u : 0x7c00u;
    switch (r % 96u) {
    case 0:
        /* Any pattern but Inf: NaNs with every payload and sign, the
         * largest values, subnormals. */
        u = (uint16_t)(r >> 32);
        if ((u & 0x7fffu) == inf) {
            u ^= 1u;
        }
        /* bf16 below 2^22, so int8's fp16 scale stays finite: 0 * Inf in
         * its decode is another NaN of disputed sign. */
        if (dtype == KVD_DTYPE_BF16 && (u & 0x7f80u) != 0x7f80u &&
            (u & 0x7f80u) > (148u << 7)) {
            u = (uint16_t)((u & 0x807fu) | (148u << 7));
        }
        return u;
    case 1: return (uint16_t)((r >> 32) & 0x8000u); /* +-0 */
    case 2: return (uint16_t)((r >> 32) & 0x803fu); /* tiny */
    default: return u;
    }
}

static void test_cache_fill(test_cache_t *c)
{
    if (c->fmt.dtype == KVD_DTYPE_FP8_E4M3) {
        for (size_t i = 0; i < c->bytes; i++) {
            c->host[i] = (unsigned char)test_rand();
        }
    } else {
        for (size_t i = 0; i + 1 < c->bytes; i += 2) {
            float v = test_gauss();
            if ((i / 2) % 29 == 3) {
                v *= 12.0f;
            }
            uint16_t u = c->fmt.dtype == KVD_DTYPE_BF16 ? kvd_float_to_bf16(v)
                                                        : kvd_float_to_half(v);
            if (test_hostile) {
                u = test_hostile_element(c->fmt.dtype, u);
            }
            memcpy(c->host + i, &u, 2);
        }
    }
    assert_int_equal(kvd_cuda_mem_copy(c->dev, c->host, c->bytes), KVD_OK);
}

/* ---- comparisons -------------------------------------------------------- */

typedef struct test_regions {
    size_t data_off[2], meta_off[2], data_bytes[2], meta_bytes[2];
} test_regions_t;

static test_regions_t test_regions(const kvd_object_format_t *fmt,
                                   unsigned layer)
{
    test_regions_t r;
    memset(&r, 0, sizeof(r));
    size_t off = kvd_object_layer_offset(fmt, layer);
    for (unsigned p = 0; p < fmt->num_planes; p++) {
        r.data_off[p] = off;
        r.data_bytes[p] = kvd_object_plane_data_bytes(fmt, p);
        off += r.data_bytes[p];
        r.meta_off[p] = off;
        r.meta_bytes[p] = kvd_object_plane_meta_bytes(fmt, p);
        off += r.meta_bytes[p];
    }
    return r;
}

static int test_is_tq(kvd_codec_t c)
{
    return c == KVD_CODEC_TQ4 || c == KVD_CODEC_TQ3 || c == KVD_CODEC_TQ2;
}

static unsigned test_tq_bits(kvd_codec_t c)
{
    return c == KVD_CODEC_TQ4 ? 4 : c == KVD_CODEC_TQ3 ? 3 : 2;
}

/* TurboQuant plane: codes may differ by +-1 on at most 0.1%; norms by one
 * fp16 ulp. Returns the number of differing codes through *diff. */
static void test_tq_plane_compare(const kvd_object_format_t *fmt, unsigned p,
                                  const unsigned char *gpu,
                                  const unsigned char *ref,
                                  const test_regions_t *r, size_t *diff,
                                  size_t *total)
{
    unsigned bits = test_tq_bits(fmt->codec[p]);
    size_t vec_bytes = (size_t)fmt->head_dim * bits / 8;
    size_t vecs = (size_t)fmt->num_heads * fmt->block_size;
    uint8_t cg[KVD_TQ_MAX_DIM], cr[KVD_TQ_MAX_DIM];

    for (size_t v = 0; v < vecs; v++) {
        kvd_ref_bp32_unpack(gpu + r->data_off[p] + v * vec_bytes, fmt->head_dim,
                            bits, cg);
        kvd_ref_bp32_unpack(ref + r->data_off[p] + v * vec_bytes, fmt->head_dim,
                            bits, cr);
        for (unsigned j = 0; j < fmt->head_dim; j++) {
            int d = (int)cg[j] - (int)cr[j];
            assert_true(d >= -1 && d <= 1);
            *diff += d != 0;
        }
        uint16_t ng, nr;
        memcpy(&ng, gpu + r->meta_off[p] + 2 * v, 2);
        memcpy(&nr, ref + r->meta_off[p] + 2 * v, 2);
        assert_true(abs((int)ng - (int)nr) <= 1);
    }
    *total += vecs * fmt->head_dim;
    /* Padding after the used bytes is exact. */
    size_t used = vecs * vec_bytes;
    assert_memory_equal(gpu + r->data_off[p] + used,
                        ref + r->data_off[p] + used, r->data_bytes[p] - used);
    assert_memory_equal(gpu + r->meta_off[p] + 2 * vecs,
                        ref + r->meta_off[p] + 2 * vecs,
                        r->meta_bytes[p] - 2 * vecs);
}

static float test_elt_float(kvd_dtype_t dtype, const unsigned char *p)
{
    uint16_t u;
    memcpy(&u, p, 2);
    return dtype == KVD_DTYPE_BF16 ? kvd_bf16_to_float(u)
                                   : kvd_half_to_float(u);
}

/* Marks the cache bytes a scatter of `ids` into `layer` may write. */
static void test_written_mask(const test_cache_t *c, unsigned layer,
                              const int32_t *ids, size_t n, uint32_t valid_last,
                              unsigned char *mask)
{
    const kvd_object_format_t *f = &c->fmt;
    const kvd_kv_layout_t *l = &c->host_layout;
    size_t elt = kvd_dtype_size(f->dtype);
    size_t base = (size_t)((unsigned char *)l->layer_base[layer] - c->host);
    memset(mask, 0, c->bytes);
    for (size_t i = 0; i < n; i++) {
        uint32_t valid = i + 1 == n ? valid_last : f->block_size;
        for (unsigned p = 0; p < f->num_planes; p++) {
            for (uint32_t t = 0; t < valid; t++) {
                for (uint32_t h = 0; h < f->num_heads; h++) {
                    size_t at = base + p * (size_t)l->stride_plane +
                                (size_t)ids[i] * (size_t)l->stride_block +
                                t * (size_t)l->stride_token +
                                h * (size_t)l->stride_head;
                    memset(mask + at, 1, f->head_dim * elt);
                }
            }
        }
    }
}

/* Sum of squared differences between the written elements of two images
 * and of the original's squares, for TurboQuant's relative-MSE gate. */
static void test_mse(const test_cache_t *c, const unsigned char *mask,
                     const unsigned char *img, double *err, double *energy)
{
    *err = 0.0;
    *energy = 0.0;
    for (size_t i = 0; i + 1 < c->bytes; i += 2) {
        if (!mask[i]) {
            continue;
        }
        double a = test_elt_float(c->fmt.dtype, c->host + i);
        double b = test_elt_float(c->fmt.dtype, img + i);
        *err += (a - b) * (a - b);
        *energy += a * a;
    }
}

/* ---- one run: a format on a layout ------------------------------------ */

typedef struct test_run {
    test_cache_t cache;
    kvd_codec_tables_t *tables;
    kvd_cuda_tables_t *dev_tables;
    void *stream;
    int32_t ids[TEST_LISTED];
    int32_t *ids_dev;
    uint32_t valid_last;
    size_t obj_bytes;
    unsigned char *ref_objs; /* TEST_LISTED objects, 16-byte aligned */
    unsigned char *gpu_objs;
    void *staging;
    void *ref_obj_ptr[TEST_LISTED];
    size_t tq_diff, tq_total;
} test_run_t;

static void test_pick_blocks(test_run_t *r)
{
    int32_t perm[TEST_CACHE_BLOCKS];
    for (unsigned i = 0; i < TEST_CACHE_BLOCKS; i++) {
        perm[i] = (int32_t)i;
    }
    for (unsigned i = TEST_CACHE_BLOCKS - 1; i > 0; i--) {
        unsigned j = (unsigned)(test_rand() % (i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    memcpy(r->ids, perm, sizeof(r->ids));
    /* Mostly partial, sometimes full, never empty. */
    uint32_t bs = r->cache.fmt.block_size;
    r->valid_last =
        (test_rand() % 4 == 0) ? bs : 1 + (uint32_t)(test_rand() % bs);
}

static void test_run_layer_gather(test_run_t *r, unsigned layer)
{
    const kvd_object_format_t *f = &r->cache.fmt;
    memset(r->ref_objs, 0, TEST_LISTED * r->obj_bytes);
    assert_int_equal(kvd_ref_gather_layer(&r->cache.host_layout, f, r->tables,
                                          layer, r->ids, TEST_LISTED,
                                          r->valid_last, r->ref_obj_ptr),
                     KVD_OK);
    assert_int_equal(
        kvd_cuda_mem_set(r->staging, 0xa5, TEST_LISTED * r->obj_bytes), KVD_OK);
    assert_int_equal(
        kvd_cuda_gather_layer(&r->cache.dev_layout, f, r->dev_tables, layer,
                              r->ids, r->ids_dev, TEST_LISTED, r->valid_last,
                              r->staging, r->obj_bytes, r->stream),
        KVD_OK);
    assert_int_equal(kvd_cuda_device_wait(), KVD_OK);
    assert_int_equal(
        kvd_cuda_mem_copy(r->gpu_objs, r->staging, TEST_LISTED * r->obj_bytes),
        KVD_OK);
    test_regions_t rg = test_regions(f, layer);
    for (unsigned i = 0; i < TEST_LISTED; i++) {
        const unsigned char *g = r->gpu_objs + i * r->obj_bytes;
        const unsigned char *c = r->ref_objs + i * r->obj_bytes;
        for (unsigned p = 0; p < f->num_planes; p++) {
            if (test_is_tq(f->codec[p])) {
                test_tq_plane_compare(f, p, g, c, &rg, &r->tq_diff,
                                      &r->tq_total);
                continue;
            }
            size_t end = rg.meta_off[p] + rg.meta_bytes[p];
            if (memcmp(g + rg.data_off[p], c + rg.data_off[p],
                       end - rg.data_off[p]) != 0) {
                for (size_t k = rg.data_off[p]; k < end; k++) {
                    if (g[k] != c[k]) {
                        fail_msg("gather %s %s/%s layer %u object %u plane "
                                 "%u: byte %zu (region offset %zu) gpu %02x "
                                 "ref %02x",
                                 test_layout_names[r->cache.kind],
                                 kvd_codec_name(f->codec[0]),
                                 kvd_codec_name(f->codec[f->num_planes - 1]),
                                 layer, i, p, k, k - rg.data_off[p], g[k],
                                 c[k]);
                    }
                }
            }
        }
    }
}

static void test_run_layer_scatter(test_run_t *r, unsigned layer)
{
    test_cache_t *c = &r->cache;
    const kvd_object_format_t *f = &c->fmt;
    unsigned char *ref_img = malloc(c->bytes);
    unsigned char *gpu_img = malloc(c->bytes);
    unsigned char *mask = malloc(c->bytes);
    unsigned char *saved = malloc(c->bytes);
    assert_non_null(ref_img);
    assert_non_null(gpu_img);
    assert_non_null(mask);
    assert_non_null(saved);

    /* Reference scatter of the reference objects into a poisoned image;
     * the device scatters the same objects into a poisoned device cache. */
    memcpy(saved, c->host, c->bytes);
    memset(c->host, TEST_POISON, c->bytes);
    assert_int_equal(kvd_ref_scatter_layer(&c->host_layout, f, r->tables, layer,
                                           r->ids, TEST_LISTED, r->valid_last,
                                           (const void *const *)r->ref_obj_ptr),
                     KVD_OK);
    memcpy(ref_img, c->host, c->bytes);
    memcpy(c->host, saved, c->bytes);

    assert_int_equal(
        kvd_cuda_mem_copy(r->staging, r->ref_objs, TEST_LISTED * r->obj_bytes),
        KVD_OK);
    assert_int_equal(kvd_cuda_mem_set(c->dev, TEST_POISON, c->bytes), KVD_OK);
    assert_int_equal(
        kvd_cuda_scatter_layer(&c->dev_layout, f, r->dev_tables, layer, r->ids,
                               r->ids_dev, TEST_LISTED, r->valid_last,
                               r->staging, r->obj_bytes, r->stream),
        KVD_OK);
    assert_int_equal(kvd_cuda_device_wait(), KVD_OK);
    assert_int_equal(kvd_cuda_mem_copy(gpu_img, c->dev, c->bytes), KVD_OK);

    test_written_mask(c, layer, r->ids, TEST_LISTED, r->valid_last, mask);
    int exact = !test_is_tq(f->codec[0]) &&
                (f->num_planes == 1 || !test_is_tq(f->codec[1]));
    for (size_t k = 0; k < c->bytes; k++) {
        if (!mask[k]) {
            if (gpu_img[k] != TEST_POISON || ref_img[k] != TEST_POISON) {
                fail_msg("scatter %s layer %u wrote byte %zu outside the "
                         "listed tokens",
                         test_layout_names[c->kind], layer, k);
            }
        } else if (exact && gpu_img[k] != ref_img[k]) {
            fail_msg("scatter %s %s/%s layer %u: byte %zu gpu %02x ref %02x",
                     test_layout_names[c->kind], kvd_codec_name(f->codec[0]),
                     kvd_codec_name(f->codec[f->num_planes - 1]), layer, k,
                     gpu_img[k], ref_img[k]);
        }
    }
    if (!exact) {
        /* Same objects decoded twice: the reconstruction errors against
         * the original cache must agree within 1%. */
        double eg, er, energy;
        test_mse(c, mask, gpu_img, &eg, &energy);
        test_mse(c, mask, ref_img, &er, &energy);
        assert_true(energy > 0.0);
        assert_true(fabs(eg - er) <= 0.01 * er + 1e-12 * energy);
    }
    /* The device cache is poisoned now: put the data back for the next
     * layer's gather. */
    assert_int_equal(kvd_cuda_mem_copy(c->dev, c->host, c->bytes), KVD_OK);
    free(saved);
    free(mask);
    free(gpu_img);
    free(ref_img);
}

/* TurboQuant gather gate on top of the per-code check: the decoded GPU
 * objects' relative MSE is within 1% of the reference objects'. */
static void test_run_layer_tq_quality(test_run_t *r, unsigned layer)
{
    test_cache_t *c = &r->cache;
    const kvd_object_format_t *f = &c->fmt;
    unsigned char *img_ref = malloc(c->bytes);
    unsigned char *img_gpu = malloc(c->bytes);
    unsigned char *mask = malloc(c->bytes);
    unsigned char *saved = malloc(c->bytes);
    void *gpu_ptr[TEST_LISTED];
    assert_non_null(img_ref);
    assert_non_null(img_gpu);
    assert_non_null(mask);
    assert_non_null(saved);
    for (unsigned i = 0; i < TEST_LISTED; i++) {
        gpu_ptr[i] = r->gpu_objs + i * r->obj_bytes;
    }
    memcpy(saved, c->host, c->bytes);
    assert_int_equal(kvd_ref_scatter_layer(&c->host_layout, f, r->tables, layer,
                                           r->ids, TEST_LISTED, r->valid_last,
                                           (const void *const *)r->ref_obj_ptr),
                     KVD_OK);
    memcpy(img_ref, c->host, c->bytes);
    memcpy(c->host, saved, c->bytes);
    assert_int_equal(kvd_ref_scatter_layer(&c->host_layout, f, r->tables, layer,
                                           r->ids, TEST_LISTED, r->valid_last,
                                           (const void *const *)gpu_ptr),
                     KVD_OK);
    memcpy(img_gpu, c->host, c->bytes);
    memcpy(c->host, saved, c->bytes);
    test_written_mask(c, layer, r->ids, TEST_LISTED, r->valid_last, mask);
    double eg, er, energy;
    test_mse(c, mask, img_gpu, &eg, &energy);
    test_mse(c, mask, img_ref, &er, &energy);
    assert_true(fabs(eg - er) <= 0.01 * er + 1e-12 * energy);
    free(saved);
    free(mask);
    free(img_gpu);
    free(img_ref);
}

static void test_run_format(test_layout_t kind, const kvd_object_format_t *fmt,
                            int use_stream)
{
    test_run_t r;
    memset(&r, 0, sizeof(r));
    test_cache_init(&r.cache, kind, fmt);
    test_cache_fill(&r.cache);
    assert_int_equal(kvd_codec_tables_create(fmt, &r.tables), KVD_OK);
    assert_int_equal(kvd_cuda_tables_create(r.tables, &r.dev_tables), KVD_OK);
    if (use_stream) {
        assert_int_equal(kvd_cuda_stream_create(&r.stream), KVD_OK);
    }
    test_pick_blocks(&r);
    assert_int_equal(kvd_cuda_mem_create(sizeof(r.ids), (void **)&r.ids_dev),
                     KVD_OK);
    assert_int_equal(kvd_cuda_mem_copy(r.ids_dev, r.ids, sizeof(r.ids)),
                     KVD_OK);
    r.obj_bytes = kvd_object_bytes(fmt);
    r.ref_objs = aligned_alloc(16, TEST_LISTED * r.obj_bytes);
    r.gpu_objs = malloc(TEST_LISTED * r.obj_bytes);
    assert_non_null(r.ref_objs);
    assert_non_null(r.gpu_objs);
    for (unsigned i = 0; i < TEST_LISTED; i++) {
        r.ref_obj_ptr[i] = r.ref_objs + i * r.obj_bytes;
    }
    assert_int_equal(kvd_cuda_mem_create(TEST_LISTED * r.obj_bytes, &r.staging),
                     KVD_OK);

    int tq = test_is_tq(fmt->codec[0]) ||
             (fmt->num_planes == 2 && test_is_tq(fmt->codec[1]));
    for (unsigned layer = 0; layer < fmt->num_layers; layer++) {
        test_run_layer_gather(&r, layer);
        if (tq) {
            test_run_layer_tq_quality(&r, layer);
        }
        test_run_layer_scatter(&r, layer);
    }
    /* docs/codecs.md's parity contract: at most 0.1% of TurboQuant codes
     * may differ. */
    assert_true(r.tq_diff * 1000 <= r.tq_total);

    kvd_cuda_mem_destroy(r.staging);
    free(r.gpu_objs);
    free(r.ref_objs);
    kvd_cuda_mem_destroy(r.ids_dev);
    kvd_cuda_stream_destroy(r.stream);
    kvd_cuda_tables_destroy(r.dev_tables);
    kvd_codec_tables_destroy(r.tables);
    test_cache_cleanup(&r.cache);
}

/* Shapes per layout: (heads, head_dim, block_size, planes). MLA's latent is
 * 576 wide, which TurboQuant cannot rotate: it runs at 256 then. */
static kvd_object_format_t test_format(test_layout_t kind, kvd_dtype_t dtype,
                                       kvd_codec_t k, kvd_codec_t v)
{
    kvd_object_format_t f;
    memset(&f, 0, sizeof(f));
    f.dtype = dtype;
    f.num_layers = 3;
    f.num_planes = 2;
    f.codec[0] = k;
    f.codec[1] = v;
    f.tq_seed = 0x5eed0000u + (uint64_t)kind;
    switch (kind) {
    case TEST_NHD: f.num_heads = 4, f.head_dim = 128, f.block_size = 16; break;
    case TEST_HND: f.num_heads = 2, f.head_dim = 64, f.block_size = 32; break;
    case TEST_HND_BIG:
        /* A block's plane is 2 x 1024 x 128 x 2 bytes = 512 KiB, one copy
         * at or over the copy engine's minimum (256 KiB). */
        f.num_heads = 2, f.head_dim = 128, f.block_size = 1024;
        break;
    case TEST_FLASHINFER:
        f.num_heads = 3, f.head_dim = 128, f.block_size = 16;
        break;
    case TEST_MLA:
        f.num_planes = 1, f.num_heads = 1, f.block_size = 16;
        f.head_dim = test_is_tq(k) ? 256 : 576;
        f.codec[1] = KVD_CODEC_RAW;
        break;
    case TEST_TRT_POOL:
        f.num_heads = 2, f.head_dim = 256, f.block_size = 8;
        break;
    case TEST_ODD_NHD:
        /* Rows of 70 bytes (no 16-byte access), head_dim % 8 != 0 and
         * 5 * 35 * 4 bits not a multiple of 8: KIVI codes straddle heads. */
        f.num_heads = 3, f.head_dim = 35, f.block_size = 5;
        break;
    }
    return f;
}

static void test_layout_all_codecs(test_layout_t kind)
{
    static const kvd_dtype_t dtypes[] = {KVD_DTYPE_FP16, KVD_DTYPE_BF16};
    unsigned runs = 0;
    for (unsigned d = 0; d < 2; d++) {
        for (unsigned k = 0; k < KVD_CODEC_COUNT; k++) {
            /* Same codec on both planes, then a mixed pair, so every codec
             * meets every other plane's kind of launch. */
            for (unsigned mix = 0; mix < 2; mix++) {
                kvd_object_format_t f = test_format(
                    kind, dtypes[d], (kvd_codec_t)k, (kvd_codec_t)k);
                if (f.num_planes == 1 && mix) {
                    break;
                }
                /* Mixed: the first other codec from k + 3 on that the
                 * shape admits (the odd shape rejects KIVI V and TQ). */
                for (unsigned step = 3; mix && step < 3 + KVD_CODEC_COUNT;
                     step++) {
                    f.codec[1] = (kvd_codec_t)((k + step) % KVD_CODEC_COUNT);
                    if (f.codec[1] != (kvd_codec_t)k &&
                        kvd_object_format_check(&f, NULL, 0) == KVD_OK) {
                        break;
                    }
                }
                if (kvd_object_format_check(&f, NULL, 0) != KVD_OK) {
                    continue;
                }
                test_run_format(kind, &f, (int)(runs++ % 2));
            }
        }
    }
    /* fp8 caches pass through raw only. */
    kvd_object_format_t f =
        test_format(kind, KVD_DTYPE_FP8_E4M3, KVD_CODEC_RAW, KVD_CODEC_RAW);
    test_run_format(kind, &f, 0);
    test_run_format(kind, &f, 1);
    printf("%s: %u formats\n", test_layout_names[kind], runs + 2);
}

static void test_nhd(void **state)
{
    (void)state;
    test_layout_all_codecs(TEST_NHD);
}

static void test_hnd(void **state)
{
    (void)state;
    test_layout_all_codecs(TEST_HND);
}

static void test_flashinfer(void **state)
{
    (void)state;
    test_layout_all_codecs(TEST_FLASHINFER);
}

static void test_mla(void **state)
{
    (void)state;
    test_layout_all_codecs(TEST_MLA);
}

static void test_trt_pool(void **state)
{
    (void)state;
    test_layout_all_codecs(TEST_TRT_POOL);
}

static void test_odd_shapes(void **state)
{
    (void)state;
    test_layout_all_codecs(TEST_ODD_NHD);
}

/* The copy-engine path: raw planes of large blocks (both dtypes and fp8
 * caches; a partial last block; raw K beside an fp8-encoded V, so a
 * kernel launch and the copies share one call). */
static void test_copy_engine(void **state)
{
    (void)state;
    static const kvd_dtype_t dtypes[] = {KVD_DTYPE_FP16, KVD_DTYPE_BF16,
                                         KVD_DTYPE_FP8_E4M3};
    for (unsigned d = 0; d < 3; d++) {
        kvd_object_format_t f =
            test_format(TEST_HND_BIG, dtypes[d], KVD_CODEC_RAW, KVD_CODEC_RAW);
        test_run_format(TEST_HND_BIG, &f, 0);
        test_run_format(TEST_HND_BIG, &f, 1);
    }
    kvd_object_format_t f = test_format(TEST_HND_BIG, KVD_DTYPE_BF16,
                                        KVD_CODEC_RAW, KVD_CODEC_FP8_E4M3);
    test_run_format(TEST_HND_BIG, &f, 1);
}

/* The 8-bit codecs on hostile values: the encoders multiply by the
 * scale's reciprocal where kernels/ref/quant_fast.h proves the codes equal
 * the division's and divide everywhere else (zeros, subnormals, NaN, codes
 * next to a rounding boundary); the chunk loads and stores convert with the
 * plain instructions only where no NaN is present. Every path must give the
 * reference's bytes: the register path (head_dim 128 and 256), the
 * two-pass path (unaligned rows), both dtypes, gather and scatter (the
 * scatter decodes the reference's objects, NaN codes included). Inf is left
 * out: Inf / Inf is a NaN whose sign x86 and the GPU disagree on, a
 * documented difference of broken caches (codec_dev.cuh). */
static void test_hostile_values(void **state)
{
    (void)state;
    static const kvd_dtype_t dtypes[] = {KVD_DTYPE_FP16, KVD_DTYPE_BF16};
    static const kvd_codec_t codecs[] = {KVD_CODEC_FP8_E4M3, KVD_CODEC_INT8};
    static const test_layout_t kinds[] = {TEST_NHD, TEST_TRT_POOL,
                                          TEST_ODD_NHD};
    unsigned runs = 0;
    test_hostile = 1;
    for (unsigned d = 0; d < 2; d++) {
        for (unsigned k = 0; k < 2; k++) {
            for (unsigned l = 0; l < 3; l++) {
                kvd_object_format_t f =
                    test_format(kinds[l], dtypes[d], codecs[k], codecs[k]);
                test_run_format(kinds[l], &f, (int)(runs++ % 2));
            }
        }
    }
    test_hostile = 0;
}

/* ---- fp8 conversion parity ---------------------------------------------- */

static void test_fp8_compare(const float *in, size_t n)
{
    uint8_t *gpu = malloc(n);
    assert_non_null(gpu);
    assert_int_equal(kvd_cuda_fp8_e4m3_encode(in, gpu, n), KVD_OK);
    for (size_t i = 0; i < n; i++) {
        uint8_t ref = kvd_float_to_fp8_e4m3(in[i]);
        if (gpu[i] != ref) {
            uint32_t bits;
            memcpy(&bits, &in[i], 4);
            fail_msg("fp8 of %a (0x%08x): gpu %02x ref %02x", (double)in[i],
                     bits, gpu[i], ref);
        }
    }
    free(gpu);
}

static void test_fp8_exhaustive(void **state)
{
    (void)state;
    size_t n = 2 * 65536 + 1000000 + 16;
    float *in = malloc(n * sizeof(float));
    assert_non_null(in);
    size_t k = 0;
    for (uint32_t u = 0; u < 65536; u++) {
        in[k++] = kvd_half_to_float((uint16_t)u);
        in[k++] = kvd_bf16_to_float((uint16_t)u);
    }
    for (unsigned i = 0; i < 1000000; i++) {
        uint32_t bits = (uint32_t)test_rand();
        /* Half of them near the E4M3 range, where the rounding happens. */
        if (i % 2 == 0) {
            bits = (bits & 0x807fffffu) | ((112u + (bits >> 23) % 24u) << 23);
        }
        memcpy(&in[k++], &bits, 4);
    }
    static const float special[] = {
        0.0f,           -0.0f,     464.0f,    -464.0f,
        464.01f,        448.0f,    449.0f,    480.0f,
        1.0f / 1024.0f, 0.00098f,  0.015625f, 1e-30f,
        INFINITY,       -INFINITY, NAN,       -NAN};
    for (unsigned i = 0; i < 16; i++) {
        in[k++] = special[i];
    }
    assert_int_equal(k, n);
    test_fp8_compare(in, n);
    free(in);
}

/* ---- argument errors ------------------------------------------------------
 */

static void test_bad_arguments(void **state)
{
    (void)state;
    kvd_object_format_t f = test_format(TEST_NHD, KVD_DTYPE_FP16, KVD_CODEC_TQ4,
                                        KVD_CODEC_FP8_E4M3);
    test_cache_t c;
    test_cache_init(&c, TEST_NHD, &f);
    size_t obj = kvd_object_bytes(&f);
    void *staging = NULL;
    int32_t *ids_dev = NULL;
    int32_t ids[2] = {1, 2};
    assert_int_equal(kvd_cuda_mem_create(2 * obj + 16, &staging), KVD_OK);
    assert_int_equal(kvd_cuda_mem_create(sizeof(ids), (void **)&ids_dev),
                     KVD_OK);
    assert_int_equal(kvd_cuda_mem_copy(ids_dev, ids, sizeof(ids)), KVD_OK);
    kvd_codec_tables_t *t = NULL;
    kvd_cuda_tables_t *dt = NULL;
    assert_int_equal(kvd_codec_tables_create(&f, &t), KVD_OK);
    assert_int_equal(kvd_cuda_tables_create(t, &dt), KVD_OK);

    /* TurboQuant without tables, or with another seed's. */
    assert_int_equal(kvd_cuda_gather_layer(&c.dev_layout, &f, NULL, 0, ids,
                                           ids_dev, 2, 16, staging, obj, NULL),
                     KVD_ERR_INVALID);
    kvd_object_format_t other = f;
    other.tq_seed ^= 1;
    assert_int_equal(kvd_cuda_gather_layer(&c.dev_layout, &other, dt, 0, ids,
                                           ids_dev, 2, 16, staging, obj, NULL),
                     KVD_ERR_INVALID);
    /* Layer, valid count, staging alignment and stride. */
    assert_int_equal(kvd_cuda_gather_layer(&c.dev_layout, &f, dt, 3, ids,
                                           ids_dev, 2, 16, staging, obj, NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_cuda_gather_layer(&c.dev_layout, &f, dt, 0, ids,
                                           ids_dev, 2, 0, staging, obj, NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_cuda_gather_layer(&c.dev_layout, &f, dt, 0, ids,
                                           ids_dev, 2, 17, staging, obj, NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(
        kvd_cuda_gather_layer(&c.dev_layout, &f, dt, 0, ids, ids_dev, 2, 16,
                              (unsigned char *)staging + 8, obj, NULL),
        KVD_ERR_INVALID);
    assert_int_equal(kvd_cuda_scatter_layer(&c.dev_layout, &f, dt, 0, ids,
                                            ids_dev, 2, 16, staging, obj - 16,
                                            NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_cuda_scatter_layer(&c.dev_layout, &f, dt, 0, ids, NULL,
                                            2, 16, staging, obj, NULL),
                     KVD_ERR_INVALID);
    /* Block id out of range. */
    int32_t bad[2] = {1, (int32_t)TEST_CACHE_BLOCKS};
    assert_int_equal(kvd_cuda_scatter_layer(&c.dev_layout, &f, dt, 0, bad,
                                            ids_dev, 2, 16, staging, obj, NULL),
                     KVD_ERR_RANGE);
    bad[1] = -1;
    assert_int_equal(kvd_cuda_gather_layer(&c.dev_layout, &f, dt, 0, bad,
                                           ids_dev, 2, 16, staging, obj, NULL),
                     KVD_ERR_RANGE);
    /* Odd strides: 2-byte elements at odd addresses. */
    kvd_kv_layout_t odd = c.dev_layout;
    odd.stride_block += 1;
    odd.stride_plane = odd.stride_block * TEST_CACHE_BLOCKS;
    assert_int_equal(kvd_cuda_gather_layer(&odd, &f, dt, 0, ids, ids_dev, 2, 16,
                                           staging, obj, NULL),
                     KVD_ERR_UNSUPPORTED);
    /* Nothing to do is fine. */
    assert_int_equal(kvd_cuda_gather_layer(&c.dev_layout, &f, dt, 0, NULL, NULL,
                                           0, 16, NULL, 0, NULL),
                     KVD_OK);
    assert_int_equal(kvd_cuda_device_wait(), KVD_OK);

    kvd_cuda_tables_destroy(dt);
    kvd_codec_tables_destroy(t);
    kvd_cuda_mem_destroy(ids_dev);
    kvd_cuda_mem_destroy(staging);
    test_cache_cleanup(&c);
}

static void test_bench_smoke(void **state)
{
    (void)state;
    kvd_object_format_t f = test_format(TEST_NHD, KVD_DTYPE_BF16,
                                        KVD_CODEC_FP8_E4M3, KVD_CODEC_TQ4);
    double g = 0.0, s = 0.0, d = 0.0;
    assert_int_equal(kvd_cuda_bench_gather(&f, 64, 2, &g, &s, &d), KVD_OK);
    assert_true(g > 0.0 && s > 0.0 && d > 0.0);
    printf("bench smoke: gather %.1f GB/s, scatter %.1f GB/s, d2d %.1f GB/s\n",
           g, s, d);
    assert_int_equal(kvd_cuda_bench_gather(&f, 0, 2, &g, &s, &d),
                     KVD_ERR_INVALID);
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
        cmocka_unit_test(test_fp8_exhaustive),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_nhd),
        cmocka_unit_test(test_hnd),
        cmocka_unit_test(test_flashinfer),
        cmocka_unit_test(test_mla),
        cmocka_unit_test(test_trt_pool),
        cmocka_unit_test(test_odd_shapes),
        cmocka_unit_test(test_hostile_values),
        cmocka_unit_test(test_copy_engine),
        cmocka_unit_test(test_bench_smoke),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
