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
    assert_int_equal(kvd_cuda_device_wait(), KVD_OK);
    rt_expect_equal(&c, "after errors");

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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
