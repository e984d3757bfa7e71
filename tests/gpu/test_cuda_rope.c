/*
 * CUDA RoPE re-rotation (kvd_cuda_rope_shift_layer) against the C
 * reference (kvd_ref_rope_shift_layer), label gpu.
 *
 * A two-layer cache of 400 blocks in vLLM FlashAttention NHD or HND, fp16
 * or bf16, random values; 300 distinct blocks in random order are shifted
 * with mixed deltas (0, small, negative, up to 2^32, around +-2^40), the
 * last block partial. The device cache must come back equal, byte for
 * byte, to the host cache the reference shifted (kernels_cuda.h: the
 * arithmetic is shared source, kernels/ref/rope_int.h), for NEOX and GPT-J,
 * full and partial rotary, each scaling type; runs alternate between the
 * legacy default stream and a created one. Also the argument errors, with
 * nothing written. Exits 77 (skipped) when built without CUDA or run
 * without a device.
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

#include "kernels/ref/ref.h"
#include "kvdepot/kernels.h"
#include "kvdepot/kernels_cuda.h"

#define RT_LAYERS 2u
#define RT_LAYER 1u
#define RT_BLOCKS 400u
#define RT_LISTED 300u
#define RT_BS 16u
#define RT_HEADS 4u
#define RT_VALID_LAST 7u

static uint64_t rt_rng = 0x243f6a8885a308d3ull;

static uint64_t rt_rand(void)
{
    rt_rng ^= rt_rng >> 12;
    rt_rng ^= rt_rng << 25;
    rt_rng ^= rt_rng >> 27;
    return rt_rng * 0x2545f4914f6cdd1dull;
}

static float rt_gauss(void)
{
    float u = ((float)(rt_rand() >> 40) + 0.5f) / (float)(1u << 24);
    float v = ((float)(rt_rand() >> 40) + 0.5f) / (float)(1u << 24);
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* One cache image on the host and its copy on the device. */
typedef struct rt_cache {
    kvd_object_format_t fmt;
    size_t bytes, layer_bytes;
    unsigned char *host;
    void *dev;
    void *host_bases[RT_LAYERS], *dev_bases[RT_LAYERS];
    kvd_kv_layout_t host_layout, dev_layout;
} rt_cache_t;

static void rt_cache_init(rt_cache_t *c, int hnd, kvd_dtype_t dtype,
                          uint32_t dim)
{
    memset(c, 0, sizeof(*c));
    kvd_object_format_t f = {dtype,
                             RT_LAYERS,
                             2,
                             RT_HEADS,
                             dim,
                             RT_BS,
                             {KVD_CODEC_RAW, KVD_CODEC_RAW},
                             0};
    c->fmt = f;
    int64_t row = 2 * (int64_t)dim;
    kvd_kv_layout_t *l = &c->host_layout;
    if (hnd) { /* [2, NB, H, BS, D] */
        l->stride_token = row;
        l->stride_head = row * RT_BS;
    } else { /* [2, NB, BS, H, D] */
        l->stride_head = row;
        l->stride_token = row * RT_HEADS;
    }
    l->stride_block = row * RT_BS * RT_HEADS;
    l->stride_plane = l->stride_block * RT_BLOCKS;
    l->num_blocks = RT_BLOCKS;
    c->layer_bytes = (size_t)l->stride_plane * 2;
    c->bytes = c->layer_bytes * RT_LAYERS;
    c->host = malloc(c->bytes);
    assert_non_null(c->host);
    for (size_t i = 0; i < c->bytes; i += 2) {
        float v = rt_gauss() * (i % 58 == 6 ? 10.0f : 1.0f);
        uint16_t u = dtype == KVD_DTYPE_BF16 ? kvd_float_to_bf16(v)
                                             : kvd_float_to_half(v);
        memcpy(c->host + i, &u, 2);
    }
    assert_int_equal(kvd_cuda_mem_create(c->bytes, &c->dev), KVD_OK);
    assert_int_equal(kvd_cuda_mem_copy(c->dev, c->host, c->bytes), KVD_OK);
    c->dev_layout = c->host_layout;
    for (unsigned k = 0; k < RT_LAYERS; k++) {
        c->host_bases[k] = c->host + k * c->layer_bytes;
        c->dev_bases[k] = (unsigned char *)c->dev + k * c->layer_bytes;
    }
    c->host_layout.layer_base = c->host_bases;
    c->dev_layout.layer_base = c->dev_bases;
}

static void rt_cache_cleanup(rt_cache_t *c)
{
    kvd_cuda_mem_destroy(c->dev);
    free(c->host);
}

/* The device cache must equal the host image; on a difference, says how
 * many elements and by how many units in the last place at most. */
static void rt_expect_equal(const rt_cache_t *c, const char *name)
{
    unsigned char *back = malloc(c->bytes);
    assert_non_null(back);
    assert_int_equal(kvd_cuda_mem_copy(back, c->dev, c->bytes), KVD_OK);
    size_t diff = 0;
    int worst = 0;
    for (size_t i = 0; i < c->bytes; i += 2) {
        uint16_t a, b;
        memcpy(&a, c->host + i, 2);
        memcpy(&b, back + i, 2);
        if (a != b) {
            int ulp = abs((int)(a & 0x7fffu) - (int)(b & 0x7fffu));
            worst = ulp > worst ? ulp : worst;
            diff++;
        }
    }
    if (diff != 0) {
        printf("%s: %zu elements differ, by up to %d ulp\n", name, diff, worst);
    }
    assert_int_equal(diff, 0);
    free(back);
}

/* 300 distinct blocks in random order and mixed deltas. */
static void rt_pick(int32_t *ids, int64_t *deltas)
{
    int32_t all[RT_BLOCKS];
    for (unsigned i = 0; i < RT_BLOCKS; i++) {
        all[i] = (int32_t)i;
    }
    for (unsigned i = RT_BLOCKS - 1; i > 0; i--) {
        unsigned j = (unsigned)(rt_rand() % (i + 1));
        int32_t t = all[i];
        all[i] = all[j];
        all[j] = t;
    }
    for (unsigned i = 0; i < RT_LISTED; i++) {
        int64_t r = (int64_t)(rt_rand() >> 40);
        ids[i] = all[i];
        switch (i % 6) {
        case 0: deltas[i] = 0; break;
        case 1: deltas[i] = r % 4096 + 1; break;
        case 2: deltas[i] = -(r % 100000) - 1; break;
        case 3: deltas[i] = ((int64_t)1 << 40) + r % 1000; break;
        case 4: deltas[i] = -((int64_t)1 << 40) - r % 1000; break;
        default: deltas[i] = (int64_t)(rt_rand() >> 32); break;
        }
    }
}

static void rt_run(const char *name, int hnd, kvd_dtype_t dtype,
                   const kvd_rope_t *rope, void *stream)
{
    rt_cache_t c;
    rt_cache_init(&c, hnd, dtype, rope->head_dim);
    int32_t ids[RT_LISTED];
    int64_t deltas[RT_LISTED];
    rt_pick(ids, deltas);
    void *ids_dev = NULL, *deltas_dev = NULL;
    assert_int_equal(kvd_cuda_mem_create(sizeof(ids), &ids_dev), KVD_OK);
    assert_int_equal(kvd_cuda_mem_create(sizeof(deltas), &deltas_dev), KVD_OK);
    assert_int_equal(kvd_cuda_mem_copy(ids_dev, ids, sizeof(ids)), KVD_OK);
    assert_int_equal(kvd_cuda_mem_copy(deltas_dev, deltas, sizeof(deltas)),
                     KVD_OK);
    kvd_cuda_rope_t *dr = NULL;
    assert_int_equal(kvd_cuda_rope_create(rope, &dr), KVD_OK);

    unsigned char *before = malloc(c.bytes);
    assert_non_null(before);
    memcpy(before, c.host, c.bytes);
    assert_int_equal(kvd_ref_rope_shift_layer(&c.host_layout, &c.fmt, rope,
                                              RT_LAYER, ids, deltas, RT_LISTED,
                                              RT_VALID_LAST),
                     KVD_OK);
    assert_true(memcmp(before, c.host, c.bytes) != 0);
    assert_int_equal(kvd_cuda_rope_shift_layer(
                         &c.dev_layout, &c.fmt, dr, RT_LAYER, ids,
                         (const int32_t *)ids_dev, (const int64_t *)deltas_dev,
                         RT_LISTED, RT_VALID_LAST, stream),
                     KVD_OK);
    assert_int_equal(kvd_cuda_stream_wait(stream), KVD_OK);
    rt_expect_equal(&c, name);
    printf("%s: device bytes equal the reference\n", name);

    free(before);
    kvd_cuda_rope_destroy(dr);
    kvd_cuda_mem_destroy(deltas_dev);
    kvd_cuda_mem_destroy(ids_dev);
    rt_cache_cleanup(&c);
}

static kvd_rope_t rt_rope(kvd_rope_style_t style, uint32_t dim,
                          uint32_t rotary_dim, kvd_rope_scaling_t scaling)
{
    kvd_rope_t r = {dim, rotary_dim, style, 10000.0, scaling, 1.0, 0.0, 0.0, 0};
    if (scaling == KVD_ROPE_SCALING_LINEAR) {
        r.factor = 4.0;
    } else if (scaling == KVD_ROPE_SCALING_LLAMA3) {
        r.base = 500000.0;
        r.factor = 8.0;
        r.low_freq_factor = 1.0;
        r.high_freq_factor = 4.0;
        r.original_max_position = 8192;
    }
    return r;
}

static void test_parity(void **state)
{
    (void)state;
    void *stream = NULL;
    assert_int_equal(kvd_cuda_stream_create(&stream), KVD_OK);
    kvd_rope_t r = rt_rope(KVD_ROPE_NEOX, 128, 128, KVD_ROPE_SCALING_NONE);
    rt_run("neox fp16 nhd", 0, KVD_DTYPE_FP16, &r, NULL);
    rt_run("neox bf16 hnd", 1, KVD_DTYPE_BF16, &r, stream);
    r = rt_rope(KVD_ROPE_GPTJ, 64, 64, KVD_ROPE_SCALING_NONE);
    rt_run("gptj fp16 hnd", 1, KVD_DTYPE_FP16, &r, stream);
    rt_run("gptj bf16 nhd", 0, KVD_DTYPE_BF16, &r, NULL);
    r = rt_rope(KVD_ROPE_NEOX, 128, 32, KVD_ROPE_SCALING_LLAMA3);
    rt_run("neox llama3 rot 1/4 fp16", 0, KVD_DTYPE_FP16, &r, stream);
    r = rt_rope(KVD_ROPE_GPTJ, 256, 64, KVD_ROPE_SCALING_LINEAR);
    rt_run("gptj linear rot 1/4 bf16", 1, KVD_DTYPE_BF16, &r, NULL);
    r = rt_rope(KVD_ROPE_NEOX, 128, 128, KVD_ROPE_SCALING_LLAMA3);
    rt_run("neox llama3 bf16 nhd", 0, KVD_DTYPE_BF16, &r, stream);
    r = rt_rope(KVD_ROPE_GPTJ, 80, 20, KVD_ROPE_SCALING_NONE);
    rt_run("gptj d80 rot 20 fp16", 0, KVD_DTYPE_FP16, &r, stream);
    kvd_cuda_stream_destroy(stream);
}

/* ---- scatter with rotation (kvd_cuda_scatter_layer_rope) ---- */

/* One case of the fused scatter: a cache shape, its codecs and a rope. */
typedef struct fz_case {
    const char *name;
    int hnd;
    kvd_dtype_t dtype;
    uint32_t heads, bs, dim, blocks, listed, valid_last;
    kvd_codec_t codec[2];
    kvd_rope_t rope;
} fz_case_t;

/* A two-layer cache of the case's shape: layout strides and random
 * contents, host image only. */
static unsigned char *fz_cache(const fz_case_t *k, kvd_kv_layout_t *l,
                               size_t *layer_bytes)
{
    memset(l, 0, sizeof(*l));
    int64_t row = 2 * (int64_t)k->dim;
    if (k->hnd) {
        l->stride_token = row;
        l->stride_head = row * k->bs;
    } else {
        l->stride_head = row;
        l->stride_token = row * k->heads;
    }
    l->stride_block = row * k->bs * k->heads;
    l->stride_plane = l->stride_block * k->blocks;
    l->num_blocks = k->blocks;
    *layer_bytes = (size_t)l->stride_plane * 2;
    unsigned char *c = malloc(*layer_bytes * RT_LAYERS);
    assert_non_null(c);
    for (size_t i = 0; i < *layer_bytes * RT_LAYERS; i += 2) {
        float v = rt_gauss() * (i % 58 == 6 ? 10.0f : 1.0f);
        uint16_t u = k->dtype == KVD_DTYPE_BF16 ? kvd_float_to_bf16(v)
                                                : kvd_float_to_half(v);
        memcpy(c + i, &u, 2);
    }
    return c;
}

/* Distinct ids in random order, the first `n` of a shuffle. */
static void fz_ids(int32_t *ids, uint32_t blocks, uint32_t n)
{
    int32_t *all = malloc(blocks * sizeof(*all));
    assert_non_null(all);
    for (uint32_t i = 0; i < blocks; i++) {
        all[i] = (int32_t)i;
    }
    for (uint32_t i = blocks - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(rt_rand() % (i + 1));
        int32_t t = all[i];
        all[i] = all[j];
        all[j] = t;
    }
    memcpy(ids, all, n * sizeof(*ids));
    free(all);
}

/* Bytes of two images that differ, counted by 2-byte element. */
static size_t fz_diff(const unsigned char *a, const unsigned char *b,
                      size_t bytes)
{
    size_t diff = 0;
    for (size_t i = 0; i < bytes; i += 2) {
        diff += memcmp(a + i, b + i, 2) != 0;
    }
    return diff;
}

/* Objects gathered from one random cache are scattered with rotation into
 * another, by the reference on the host and by the device, fused, and by
 * the device in two launches (scatter, then shift): the fused result must
 * equal the two launches byte for byte, and the reference too where the
 * codec's decode is bit-exact (every codec but TurboQuant, whose GPU
 * decode is held to a tolerance: docs/codecs.md); the rotation must have
 * changed what a plain scatter writes. */
static void fz_run(const fz_case_t *k, void *stream)
{
    kvd_object_format_t f = {k->dtype,
                             RT_LAYERS,
                             2,
                             k->heads,
                             k->dim,
                             k->bs,
                             {k->codec[0], k->codec[1]},
                             7};
    kvd_codec_tables_t *tables = NULL;
    kvd_cuda_tables_t *dtables = NULL;
    assert_int_equal(kvd_codec_tables_create(&f, &tables), KVD_OK);
    assert_int_equal(kvd_cuda_tables_create(tables, &dtables), KVD_OK);
    kvd_cuda_rope_t *dr = NULL;
    assert_int_equal(kvd_cuda_rope_create(&k->rope, &dr), KVD_OK);

    /* The objects: a random source cache gathered by the reference. */
    kvd_kv_layout_t src_l, dst_l, dev_l;
    size_t layer_bytes = 0;
    unsigned char *src = fz_cache(k, &src_l, &layer_bytes);
    void *src_bases[RT_LAYERS] = {src, src + layer_bytes};
    src_l.layer_base = src_bases;
    const size_t obj = kvd_object_bytes(&f);
    const size_t stride = (obj + 15) / 16 * 16;
    unsigned char *objs = calloc(k->listed, stride);
    assert_non_null(objs);
    void **optr = malloc(k->listed * sizeof(*optr));
    int32_t *from = malloc(k->listed * sizeof(*from));
    int32_t *ids = malloc(k->listed * sizeof(*ids));
    int64_t *deltas = malloc(k->listed * sizeof(*deltas));
    assert_true(optr != NULL && from != NULL && ids != NULL && deltas != NULL);
    for (uint32_t i = 0; i < k->listed; i++) {
        optr[i] = objs + i * stride;
    }
    fz_ids(from, k->blocks, k->listed);
    assert_int_equal(kvd_ref_gather_layer(&src_l, &f, tables, RT_LAYER, from,
                                          k->listed, k->valid_last, optr),
                     KVD_OK);

    /* The destination: another random cache, on the host and the device. */
    unsigned char *dst = fz_cache(k, &dst_l, &layer_bytes);
    unsigned char *plain = malloc(layer_bytes * RT_LAYERS);
    assert_non_null(plain);
    memcpy(plain, dst, layer_bytes * RT_LAYERS);
    void *dev = NULL, *two = NULL, *stage = NULL, *ids_dev = NULL;
    void *deltas_dev = NULL;
    assert_int_equal(kvd_cuda_mem_create(layer_bytes * RT_LAYERS, &dev),
                     KVD_OK);
    assert_int_equal(kvd_cuda_mem_copy(dev, dst, layer_bytes * RT_LAYERS),
                     KVD_OK);
    assert_int_equal(kvd_cuda_mem_create(layer_bytes * RT_LAYERS, &two),
                     KVD_OK);
    assert_int_equal(kvd_cuda_mem_copy(two, dst, layer_bytes * RT_LAYERS),
                     KVD_OK);
    assert_int_equal(kvd_cuda_mem_create(k->listed * stride, &stage), KVD_OK);
    assert_int_equal(kvd_cuda_mem_copy(stage, objs, k->listed * stride),
                     KVD_OK);
    fz_ids(ids, k->blocks, k->listed);
    for (uint32_t i = 0; i < k->listed; i++) {
        int64_t r = (int64_t)(rt_rand() >> 40);
        deltas[i] = i % 5 == 0   ? 0
                    : i % 5 == 1 ? r % 4096 + 1
                    : i % 5 == 2 ? -(r % 100000) - 1
                    : i % 5 == 3 ? ((int64_t)1 << 40) + r % 1000
                                 : (int64_t)(rt_rand() >> 32);
    }
    assert_int_equal(kvd_cuda_mem_create(k->listed * sizeof(*ids), &ids_dev),
                     KVD_OK);
    assert_int_equal(
        kvd_cuda_mem_create(k->listed * sizeof(*deltas), &deltas_dev), KVD_OK);
    assert_int_equal(kvd_cuda_mem_copy(ids_dev, ids, k->listed * sizeof(*ids)),
                     KVD_OK);
    assert_int_equal(
        kvd_cuda_mem_copy(deltas_dev, deltas, k->listed * sizeof(*deltas)),
        KVD_OK);

    void *dst_bases[RT_LAYERS] = {dst, dst + layer_bytes};
    void *plain_bases[RT_LAYERS] = {plain, plain + layer_bytes};
    void *dev_bases[RT_LAYERS] = {dev, (unsigned char *)dev + layer_bytes};
    void *two_bases[RT_LAYERS] = {two, (unsigned char *)two + layer_bytes};
    kvd_kv_layout_t plain_l = dst_l, two_l = dst_l;
    two_l.layer_base = two_bases;
    dev_l = dst_l;
    dst_l.layer_base = dst_bases;
    plain_l.layer_base = plain_bases;
    dev_l.layer_base = dev_bases;
    assert_int_equal(kvd_ref_scatter_layer_rope(&dst_l, &f, tables, RT_LAYER,
                                                ids, k->listed, k->valid_last,
                                                (const void *const *)optr,
                                                &k->rope, deltas),
                     KVD_OK);
    assert_int_equal(kvd_ref_scatter_layer(&plain_l, &f, tables, RT_LAYER, ids,
                                           k->listed, k->valid_last,
                                           (const void *const *)optr),
                     KVD_OK);
    assert_true(memcmp(dst, plain, layer_bytes * RT_LAYERS) != 0);
    assert_int_equal(kvd_cuda_scatter_layer_rope(
                         &dev_l, &f, dtables, dr, RT_LAYER, ids,
                         (const int32_t *)ids_dev, (const int64_t *)deltas_dev,
                         k->listed, k->valid_last, stage, stride, stream),
                     KVD_OK);
    assert_int_equal(kvd_cuda_scatter_layer(&two_l, &f, dtables, RT_LAYER, ids,
                                            (const int32_t *)ids_dev, k->listed,
                                            k->valid_last, stage, stride,
                                            stream),
                     KVD_OK);
    assert_int_equal(kvd_cuda_rope_shift_layer(
                         &two_l, &f, dr, RT_LAYER, ids,
                         (const int32_t *)ids_dev, (const int64_t *)deltas_dev,
                         k->listed, k->valid_last, stream),
                     KVD_OK);
    assert_int_equal(kvd_cuda_stream_wait(stream), KVD_OK);

    const size_t bytes = layer_bytes * RT_LAYERS;
    unsigned char *back = malloc(bytes), *back2 = malloc(bytes);
    assert_true(back != NULL && back2 != NULL);
    assert_int_equal(kvd_cuda_mem_copy(back, dev, bytes), KVD_OK);
    assert_int_equal(kvd_cuda_mem_copy(back2, two, bytes), KVD_OK);
    size_t d_two = fz_diff(back, back2, bytes);
    int tq = k->codec[0] >= KVD_CODEC_TQ4 || k->codec[1] >= KVD_CODEC_TQ4;
    size_t d_ref = tq ? 0 : fz_diff(back, dst, bytes);
    if (d_two != 0 || d_ref != 0) {
        printf("%s: %zu elements differ from two launches, %zu from the "
               "reference\n",
               k->name, d_two, d_ref);
    }
    assert_int_equal(d_two, 0);
    assert_int_equal(d_ref, 0);
    printf("%s: fused bytes equal two launches%s\n", k->name,
           tq ? "" : " and the reference");

    free(back2);
    free(back);
    kvd_cuda_mem_destroy(two);
    kvd_cuda_mem_destroy(deltas_dev);
    kvd_cuda_mem_destroy(ids_dev);
    kvd_cuda_mem_destroy(stage);
    kvd_cuda_mem_destroy(dev);
    free(plain);
    free(dst);
    free(deltas);
    free(ids);
    free(from);
    free(optr);
    free(objs);
    free(src);
    kvd_cuda_rope_destroy(dr);
    kvd_cuda_tables_destroy(dtables);
    kvd_codec_tables_destroy(tables);
}

static kvd_rope_t rt_rope(kvd_rope_style_t style, uint32_t dim,
                          uint32_t rotary_dim, kvd_rope_scaling_t scaling);

/* Every codec on both planes (the CTA that decodes a head rotates it), a
 * raw K plane the copy engine moves and KIVI K packed across heads (both
 * rotated by a launch of their own after the scatter). */
static void test_scatter_fused(void **state)
{
    (void)state;
    void *stream = NULL;
    assert_int_equal(kvd_cuda_stream_create(&stream), KVD_OK);
    static const kvd_codec_t codecs[] = {
        KVD_CODEC_RAW,   KVD_CODEC_FP8_E4M3, KVD_CODEC_INT8, KVD_CODEC_KIVI4,
        KVD_CODEC_KIVI2, KVD_CODEC_TQ4,      KVD_CODEC_TQ3,  KVD_CODEC_TQ2};
    char name[96];
    for (size_t i = 0; i < sizeof(codecs) / sizeof(codecs[0]); i++) {
        fz_case_t k = {name,
                       0,
                       KVD_DTYPE_FP16,
                       4,
                       16,
                       128,
                       120,
                       90,
                       7,
                       {codecs[i], codecs[i]},
                       rt_rope(KVD_ROPE_NEOX, 128, 128, KVD_ROPE_SCALING_NONE)};
        snprintf(name, sizeof(name), "fused %s neox fp16 nhd",
                 kvd_codec_name(codecs[i]));
        fz_run(&k, i % 2 ? stream : NULL);
        k.hnd = 1;
        k.dtype = KVD_DTYPE_BF16;
        k.rope = rt_rope(KVD_ROPE_GPTJ, 128, 64, KVD_ROPE_SCALING_LLAMA3);
        snprintf(name, sizeof(name), "fused %s gptj llama3 rot 1/2 bf16 hnd",
                 kvd_codec_name(codecs[i]));
        fz_run(&k, i % 2 ? NULL : stream);
    }
    fz_case_t ce = {"raw K on the copy engine, bf16 hnd",
                    1,
                    KVD_DTYPE_BF16,
                    8,
                    128,
                    128,
                    12,
                    8,
                    128,
                    {KVD_CODEC_RAW, KVD_CODEC_FP8_E4M3},
                    rt_rope(KVD_ROPE_NEOX, 128, 128, KVD_ROPE_SCALING_NONE)};
    fz_run(&ce, stream);
    fz_case_t whole = {"kivi2 K packed across heads, d10",
                       0,
                       KVD_DTYPE_FP16,
                       3,
                       5,
                       10,
                       40,
                       30,
                       3,
                       {KVD_CODEC_KIVI2, KVD_CODEC_FP8_E4M3},
                       rt_rope(KVD_ROPE_GPTJ, 10, 10, KVD_ROPE_SCALING_NONE)};
    fz_run(&whole, stream);
    kvd_cuda_stream_destroy(stream);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    kvd_rope_t r = rt_rope(KVD_ROPE_NEOX, 64, 64, KVD_ROPE_SCALING_NONE);
    kvd_cuda_rope_t *dr = NULL;
    assert_int_equal(kvd_cuda_rope_create(NULL, &dr), KVD_ERR_INVALID);
    assert_int_equal(kvd_cuda_rope_create(&r, NULL), KVD_ERR_INVALID);
    kvd_rope_t bad = r;
    bad.rotary_dim = 63;
    assert_int_equal(kvd_cuda_rope_create(&bad, &dr), KVD_ERR_INVALID);
    bad = r;
    bad.scaling = (kvd_rope_scaling_t)7;
    assert_int_equal(kvd_cuda_rope_create(&bad, &dr), KVD_ERR_UNSUPPORTED);
    assert_null(dr);
    kvd_cuda_rope_destroy(NULL);
    assert_int_equal(kvd_cuda_rope_create(&r, &dr), KVD_OK);

    rt_cache_t c;
    rt_cache_init(&c, 0, KVD_DTYPE_FP16, 64);
    int32_t ids[2] = {3, 5};
    int64_t deltas[2] = {100, -100};
    void *ids_dev = NULL, *deltas_dev = NULL;
    assert_int_equal(kvd_cuda_mem_create(sizeof(ids), &ids_dev), KVD_OK);
    assert_int_equal(kvd_cuda_mem_create(sizeof(deltas), &deltas_dev), KVD_OK);
    assert_int_equal(kvd_cuda_mem_copy(ids_dev, ids, sizeof(ids)), KVD_OK);
    assert_int_equal(kvd_cuda_mem_copy(deltas_dev, deltas, sizeof(deltas)),
                     KVD_OK);
    const int32_t *idd = ids_dev;
    const int64_t *dd = deltas_dev;
    const kvd_kv_layout_t *l = &c.dev_layout;

    assert_int_equal(
        kvd_cuda_rope_shift_layer(l, &c.fmt, NULL, 1, ids, idd, dd, 2, 4, NULL),
        KVD_ERR_INVALID);
    assert_int_equal(
        kvd_cuda_rope_shift_layer(l, &c.fmt, dr, 1, ids, NULL, dd, 2, 4, NULL),
        KVD_ERR_INVALID);
    assert_int_equal(
        kvd_cuda_rope_shift_layer(l, &c.fmt, dr, 1, ids, idd, NULL, 2, 4, NULL),
        KVD_ERR_INVALID);
    assert_int_equal(
        kvd_cuda_rope_shift_layer(l, &c.fmt, dr, 2, ids, idd, dd, 2, 4, NULL),
        KVD_ERR_INVALID);
    assert_int_equal(
        kvd_cuda_rope_shift_layer(l, &c.fmt, dr, 1, ids, idd, dd, 2, 0, NULL),
        KVD_ERR_INVALID);
    int32_t far[2] = {3, (int32_t)RT_BLOCKS};
    assert_int_equal(
        kvd_cuda_rope_shift_layer(l, &c.fmt, dr, 1, far, idd, dd, 2, 4, NULL),
        KVD_ERR_RANGE);
    kvd_object_format_t f = c.fmt;
    f.head_dim = 128; /* the layout's and the rope's are 64 */
    assert_int_equal(
        kvd_cuda_rope_shift_layer(l, &f, dr, 1, ids, idd, dd, 2, 4, NULL),
        KVD_ERR_INVALID);
    f = c.fmt;
    f.num_planes = 1;
    assert_int_equal(
        kvd_cuda_rope_shift_layer(l, &f, dr, 1, ids, idd, dd, 2, 4, NULL),
        KVD_ERR_UNSUPPORTED);
    /* An odd base: a 2-byte element cannot be read there. */
    kvd_kv_layout_t odd = c.dev_layout;
    void *odd_bases[RT_LAYERS] = {c.dev_bases[0],
                                  (unsigned char *)c.dev_bases[1] + 1};
    odd.layer_base = odd_bases;
    odd.num_blocks = RT_BLOCKS - 1;
    assert_int_equal(kvd_cuda_rope_shift_layer(&odd, &c.fmt, dr, 1, ids, idd,
                                               dd, 2, 4, NULL),
                     KVD_ERR_UNSUPPORTED);
    assert_int_equal(kvd_cuda_rope_shift_layer(l, &c.fmt, dr, 1, NULL, NULL,
                                               NULL, 0, 0, NULL),
                     KVD_OK);
    /* The fused scatter refuses the same before anything is enqueued. */
    size_t obj = kvd_object_bytes(&c.fmt);
    void *stage = NULL;
    assert_int_equal(kvd_cuda_mem_create(2 * obj, &stage), KVD_OK);
    assert_int_equal(kvd_cuda_scatter_layer_rope(l, &c.fmt, NULL, NULL, 1, ids,
                                                 idd, dd, 2, 4, stage, obj,
                                                 NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_cuda_scatter_layer_rope(l, &c.fmt, NULL, dr, 1, ids,
                                                 idd, NULL, 2, 4, stage, obj,
                                                 NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_cuda_scatter_layer_rope(l, &c.fmt, NULL, dr, 1, far,
                                                 idd, dd, 2, 4, stage, obj,
                                                 NULL),
                     KVD_ERR_RANGE);
    assert_int_equal(kvd_cuda_scatter_layer_rope(l, &c.fmt, NULL, dr, 1, ids,
                                                 idd, dd, 2, 4, stage, obj + 1,
                                                 NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_cuda_device_wait(), KVD_OK);
    rt_expect_equal(&c, "after errors");
    kvd_cuda_mem_destroy(stage);

    kvd_cuda_mem_destroy(deltas_dev);
    kvd_cuda_mem_destroy(ids_dev);
    kvd_cuda_rope_destroy(dr);
    rt_cache_cleanup(&c);
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
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_parity),
        cmocka_unit_test(test_scatter_fused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
