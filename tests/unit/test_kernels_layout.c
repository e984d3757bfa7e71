/*
 * Layout-agnostic gather/scatter and the object format (kvdepot/kernels.h).
 *
 * Each engine layout (vLLM FlashAttention NHD and HND, FlashInfer
 * [NB,2,BS,H,D], MLA [NB,BS,D], the TensorRT-LLM pool [NB,L,2,H,BS,D], and
 * an HND variant with padding between rows and blocks) is built in host
 * memory and described only by base pointers and byte strides. The
 * expected object bytes and the set of cache bytes scatter may write are
 * computed independently, from each layout's flat index formula
 * (kernels/README.md, "Describing an engine's cache") and the object rules
 * (docs/codecs.md, "Object layout"), never from the strides under test.
 * Scatter goes into a poisoned copy of the cache: the listed blocks' valid
 * tokens must come back and every other byte must still be poison.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "tests/unit/kvd_testcache_int.h"
#include "tests/unit/kvd_testdata_int.h"

#include "kernels/ref/ref.h"
#include "kvdepot/kernels.h"

#define POISON 0xa5

static uint64_t g_seed;

static unsigned rnd(uint64_t *s, unsigned n)
{
    return (unsigned)(kvd_test_rng(s) % n);
}

static size_t round16(size_t n)
{
    return (n + 15) / 16 * 16;
}

/* Expected raw object for one block, from the rules: per layer, per plane,
 * [h][t][c] elements of the valid tokens, zeros elsewhere, every region
 * rounded up to 16 bytes (raw has no metadata). */
static unsigned char *expected_raw_object(const test_cache_t *c, uint32_t b,
                                          uint32_t valid, size_t *bytes_out)
{
    size_t plane = round16((size_t)c->heads * c->bs * c->dim * c->elt);
    size_t layer = plane * c->planes;
    unsigned char *obj = calloc(1, layer * c->layers);
    assert_non_null(obj);
    for (uint32_t l = 0; l < c->layers; l++) {
        for (uint32_t p = 0; p < c->planes; p++) {
            for (uint32_t h = 0; h < c->heads; h++) {
                for (uint32_t t = 0; t < valid; t++) {
                    for (uint32_t ch = 0; ch < c->dim; ch++) {
                        size_t dst =
                            l * layer + p * plane +
                            (((size_t)h * c->bs + t) * c->dim + ch) * c->elt;
                        size_t src = flat_index(c, l, p, b, t, h, ch) * c->elt;
                        memcpy(obj + dst, c->mem + src, c->elt);
                    }
                }
            }
        }
    }
    *bytes_out = layer * c->layers;
    return obj;
}

/* Picks n distinct block ids out of c->blocks. */
static void random_block_map(uint64_t *s, uint32_t blocks, int32_t *ids,
                             size_t n)
{
    int32_t *all = malloc(sizeof(int32_t) * blocks);
    assert_non_null(all);
    for (uint32_t i = 0; i < blocks; i++) {
        all[i] = (int32_t)i;
    }
    for (uint32_t i = blocks - 1; i > 0; i--) {
        uint32_t j = rnd(s, i + 1);
        int32_t t = all[i];
        all[i] = all[j];
        all[j] = t;
    }
    memcpy(ids, all, n * sizeof(int32_t));
    free(all);
}

static void **alloc_objects(size_t n, size_t bytes)
{
    void **objs = calloc(n, sizeof(void *));
    assert_non_null(objs);
    for (size_t i = 0; i < n; i++) {
        objs[i] = aligned_alloc(16, round16(bytes));
        assert_non_null(objs[i]);
        memset(objs[i], 0x5a, bytes);
    }
    return objs;
}

static void free_objects(void **objs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(objs[i]);
    }
    free(objs);
}

/* Marks the cache bytes scatter is allowed to write. */
static unsigned char *written_mask(const test_cache_t *c, const int32_t *ids,
                                   size_t n, uint32_t valid_last)
{
    unsigned char *mask = calloc(1, c->bytes);
    assert_non_null(mask);
    for (size_t i = 0; i < n; i++) {
        uint32_t valid = i + 1 == n ? valid_last : c->bs;
        for (uint32_t l = 0; l < c->layers; l++) {
            for (uint32_t p = 0; p < c->planes; p++) {
                for (uint32_t h = 0; h < c->heads; h++) {
                    for (uint32_t t = 0; t < valid; t++) {
                        size_t at =
                            flat_index(c, l, p, (uint32_t)ids[i], t, h, 0) *
                            c->elt;
                        memset(mask + at, 1, c->dim * c->elt);
                    }
                }
            }
        }
    }
    return mask;
}

/* One raw round trip: gather every layer of a random block map, check the
 * objects byte for byte, scatter into a poisoned cache and check it. */
static void raw_round_trip(engine_layout_t kind, kvd_dtype_t dtype,
                           uint32_t layers, uint32_t blocks, uint32_t bs,
                           uint32_t heads, uint32_t dim, uint64_t *s)
{
    test_cache_t src, dst;
    size_t elt = kvd_dtype_size(dtype);
    cache_init(&src, kind, elt, layers, blocks, bs, heads, dim);
    cache_init(&dst, kind, elt, layers, blocks, bs, heads, dim);
    for (size_t i = 0; i < src.bytes; i++) {
        src.mem[i] = (unsigned char)kvd_test_rng(s);
    }
    memset(dst.mem, POISON, dst.bytes);

    kvd_object_format_t fmt = cache_format(&src, dtype, KVD_CODEC_RAW);
    char why[160] = "";
    if (kvd_kv_layout_check(&src.layout, &fmt, why, sizeof(why)) != KVD_OK) {
        fail_msg("%s: layout rejected: %s", layout_name(kind), why);
    }
    size_t n = 1 + rnd(s, blocks);
    uint32_t valid_last = 1 + rnd(s, bs);
    int32_t *ids = malloc(sizeof(int32_t) * n);
    assert_non_null(ids);
    random_block_map(s, blocks, ids, n);
    size_t obj_bytes = kvd_object_bytes(&fmt);
    void **objs = alloc_objects(n, obj_bytes);

    for (uint32_t l = 0; l < layers; l++) {
        assert_int_equal(kvd_ref_gather_layer(&src.layout, &fmt, NULL, l, ids,
                                              n, valid_last, objs),
                         KVD_OK);
    }
    for (size_t i = 0; i < n; i++) {
        size_t want_bytes;
        unsigned char *want = expected_raw_object(
            &src, (uint32_t)ids[i], i + 1 == n ? valid_last : bs, &want_bytes);
        assert_int_equal(want_bytes, obj_bytes);
        if (memcmp(want, objs[i], obj_bytes) != 0) {
            fail_msg("%s: object %zu (block %d) differs from the expected "
                     "layout",
                     layout_name(kind), i, ids[i]);
        }
        free(want);
    }

    for (uint32_t l = 0; l < layers; l++) {
        assert_int_equal(kvd_ref_scatter_layer(&dst.layout, &fmt, NULL, l, ids,
                                               n, valid_last,
                                               (const void *const *)objs),
                         KVD_OK);
    }
    unsigned char *mask = written_mask(&src, ids, n, valid_last);
    for (size_t i = 0; i < dst.bytes; i++) {
        unsigned char want = mask[i] ? src.mem[i] : POISON;
        if (dst.mem[i] != want) {
            fail_msg("%s: cache byte %zu is 0x%02x, want 0x%02x (%s)",
                     layout_name(kind), i, dst.mem[i], want,
                     mask[i] ? "scattered" : "must stay poison");
        }
    }
    free(mask);
    free_objects(objs, n);
    free(ids);
    cache_cleanup(&src);
    cache_cleanup(&dst);
}

static void test_raw_round_trip_every_layout(void **state)
{
    (void)state;
    uint64_t s = g_seed;
    static const uint32_t shapes[][5] = {
        /* layers, blocks, block_size, heads, head_dim */
        {2, 9, 16, 2, 64},  {3, 5, 4, 3, 40}, {1, 3, 1, 1, 8},
        {2, 6, 32, 4, 128}, {1, 4, 5, 8, 6},
    };
    static const kvd_dtype_t dtypes[] = {
        KVD_DTYPE_FP16, KVD_DTYPE_BF16, KVD_DTYPE_FP8_E4M3, KVD_DTYPE_FP8_E5M2};
    for (unsigned k = 0; k < LAYOUT_COUNT; k++) {
        for (unsigned d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
            for (unsigned i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
                for (unsigned rep = 0; rep < 2; rep++) {
                    raw_round_trip((engine_layout_t)k, dtypes[d], shapes[i][0],
                                   shapes[i][1], shapes[i][2], shapes[i][3],
                                   shapes[i][4], &s);
                }
            }
        }
    }
}

/* A lossy codec through gather/scatter: objects equal plane-encoding the
 * block staged by hand, scatter writes exactly the decoded valid tokens
 * and nothing else. */
static void test_codec_gather_scatter(void **state)
{
    (void)state;
    uint64_t s = g_seed ^ 0xc0dec;
    static const kvd_codec_t codecs[] = {KVD_CODEC_FP8_E4M3, KVD_CODEC_INT8};
    for (unsigned k = 0; k < 2; k++) {
        for (unsigned lk = 0; lk < LAYOUT_COUNT; lk++) {
            test_cache_t src, dst;
            cache_init(&src, (engine_layout_t)lk, 2, 2, 7, 16, 2, 64);
            cache_init(&dst, (engine_layout_t)lk, 2, 2, 7, 16, 2, 64);
            for (size_t i = 0; i < src.bytes / 2; i++) {
                uint16_t v =
                    kvd_float_to_bf16((float)((int)rnd(&s, 2001) - 1000) / 37);
                memcpy(src.mem + 2 * i, &v, 2);
            }
            memset(dst.mem, POISON, dst.bytes);
            kvd_object_format_t fmt =
                cache_format(&src, KVD_DTYPE_BF16, codecs[k]);
            int32_t ids[3] = {5, 0, 3};
            uint32_t valid_last = 11;
            size_t obj_bytes = kvd_object_bytes(&fmt);
            void **objs = alloc_objects(3, obj_bytes);
            for (uint32_t l = 0; l < 2; l++) {
                assert_int_equal(kvd_ref_gather_layer(&src.layout, &fmt, NULL,
                                                      l, ids, 3, valid_last,
                                                      objs),
                                 KVD_OK);
                assert_int_equal(kvd_ref_scatter_layer(
                                     &dst.layout, &fmt, NULL, l, ids, 3,
                                     valid_last, (const void *const *)objs),
                                 KVD_OK);
            }
            size_t plane_elems = (size_t)src.heads * src.bs * src.dim;
            uint16_t *stage = malloc(plane_elems * 2);
            uint16_t *dec = malloc(plane_elems * 2);
            unsigned char *want = aligned_alloc(16, obj_bytes);
            assert_non_null(stage);
            assert_non_null(dec);
            assert_non_null(want);
            unsigned char *mask = written_mask(&src, ids, 3, valid_last);
            for (size_t i = 0; i < 3; i++) {
                uint32_t valid = i == 2 ? valid_last : src.bs;
                size_t off = 0;
                for (uint32_t l = 0; l < 2; l++) {
                    for (uint32_t p = 0; p < src.planes; p++) {
                        for (size_t j = 0; j < plane_elems; j++) {
                            uint32_t ch = (uint32_t)(j % src.dim);
                            uint32_t t = (uint32_t)(j / src.dim % src.bs);
                            uint32_t h = (uint32_t)(j / src.dim / src.bs);
                            memcpy(stage + j,
                                   src.mem + 2 * flat_index(&src, l, p,
                                                            (uint32_t)ids[i], t,
                                                            h, ch),
                                   2);
                        }
                        size_t db = kvd_object_plane_data_bytes(&fmt, p);
                        size_t mb = kvd_object_plane_meta_bytes(&fmt, p);
                        assert_int_equal(
                            kvd_ref_plane_encode(&fmt, NULL, p, stage, valid,
                                                 want + off, want + off + db),
                            KVD_OK);
                        assert_int_equal(
                            kvd_ref_plane_decode(&fmt, NULL, p, want + off,
                                                 want + off + db, valid, dec),
                            KVD_OK);
                        for (uint32_t h = 0; h < src.heads; h++) {
                            for (uint32_t t = 0; t < valid; t++) {
                                size_t at = flat_index(
                                    &dst, l, p, (uint32_t)ids[i], t, h, 0);
                                size_t j = ((size_t)h * src.bs + t) * src.dim;
                                assert_memory_equal(dst.mem + 2 * at, dec + j,
                                                    2 * src.dim);
                            }
                        }
                        off += db + mb;
                    }
                }
                assert_int_equal(off, obj_bytes);
                assert_memory_equal(want, objs[i], obj_bytes);
            }
            for (size_t i = 0; i < dst.bytes; i++) {
                if (!mask[i] && dst.mem[i] != POISON) {
                    fail_msg("%s/%s: byte %zu outside the listed slots "
                             "changed",
                             layout_name((engine_layout_t)lk),
                             kvd_codec_name(codecs[k]), i);
                }
            }
            free(mask);
            free(want);
            free(dec);
            free(stage);
            free_objects(objs, 3);
            cache_cleanup(&src);
            cache_cleanup(&dst);
        }
    }
}

/* ---- object format ------------------------------------------------------ */

static void test_codec_names(void **state)
{
    (void)state;
    static const char *const names[] = {"raw",   "fp8_e4m3", "int8", "kivi4",
                                        "kivi2", "tq4",      "tq3",  "tq2"};
    for (unsigned i = 0; i < KVD_CODEC_COUNT; i++) {
        kvd_codec_t c;
        assert_string_equal(kvd_codec_name((kvd_codec_t)i), names[i]);
        assert_int_equal(kvd_codec_parse(names[i], &c), KVD_OK);
        assert_int_equal(c, i);
    }
    kvd_codec_t c = KVD_CODEC_INT8;
    assert_null(kvd_codec_name((kvd_codec_t)KVD_CODEC_COUNT));
    assert_null(kvd_codec_name((kvd_codec_t)-1));
    assert_int_equal(kvd_codec_parse("fp8", &c), KVD_ERR_INVALID);
    assert_int_equal(kvd_codec_parse("RAW", &c), KVD_ERR_INVALID);
    assert_int_equal(kvd_codec_parse("", &c), KVD_ERR_INVALID);
    assert_int_equal(kvd_codec_parse(NULL, &c), KVD_ERR_INVALID);
    assert_int_equal(kvd_codec_parse("raw", NULL), KVD_ERR_INVALID);
    assert_int_equal(c, KVD_CODEC_INT8);
    assert_int_equal(kvd_dtype_size(KVD_DTYPE_FP16), 2);
    assert_int_equal(kvd_dtype_size(KVD_DTYPE_BF16), 2);
    assert_int_equal(kvd_dtype_size(KVD_DTYPE_FP8_E4M3), 1);
    assert_int_equal(kvd_dtype_size(KVD_DTYPE_FP8_E5M2), 1);
    assert_true(kvd_dtype_is_fp8(KVD_DTYPE_FP8_E5M2));
    assert_false(kvd_dtype_is_fp8(KVD_DTYPE_BF16));
    assert_int_equal(kvd_dtype_size((kvd_dtype_t)0), 0);
    assert_int_equal(kvd_dtype_size((kvd_dtype_t)9), 0);
}

static const kvd_object_format_t good_fmt = {
    KVD_DTYPE_BF16, 4, 2, 8, 128, 16, {KVD_CODEC_FP8_E4M3, KVD_CODEC_INT8}, 1};

static void expect_format(const kvd_object_format_t *f, kvd_status_t want)
{
    char why[160] = "";
    assert_int_equal(kvd_object_format_check(f, why, sizeof(why)), want);
    if (want != KVD_OK) {
        assert_true(strlen(why) > 0);
        /* The size functions refuse to compute anything for it. */
        assert_int_equal(kvd_object_bytes(f), 0);
    }
}

static void test_format_check(void **state)
{
    (void)state;
    kvd_object_format_t f;

    expect_format(&good_fmt, KVD_OK);
    assert_int_equal(kvd_object_format_check(NULL, NULL, 0), KVD_ERR_INVALID);
#define BAD(field, value, want)                                                \
    do {                                                                       \
        f = good_fmt;                                                          \
        f.field = value;                                                       \
        expect_format(&f, want);                                               \
    } while (0)
    BAD(dtype, (kvd_dtype_t)0, KVD_ERR_INVALID);
    BAD(dtype, (kvd_dtype_t)5, KVD_ERR_INVALID);
    BAD(num_layers, 0, KVD_ERR_INVALID);
    BAD(num_layers, 1025, KVD_ERR_INVALID);
    BAD(num_planes, 0, KVD_ERR_INVALID);
    BAD(num_planes, 3, KVD_ERR_INVALID);
    BAD(num_heads, 0, KVD_ERR_INVALID);
    BAD(num_heads, 1025, KVD_ERR_INVALID);
    BAD(head_dim, 0, KVD_ERR_INVALID);
    BAD(head_dim, 1025, KVD_ERR_INVALID);
    BAD(block_size, 0, KVD_ERR_INVALID);
    BAD(block_size, 4097, KVD_ERR_INVALID);
    BAD(codec[0], (kvd_codec_t)8, KVD_ERR_INVALID);
    BAD(codec[1], (kvd_codec_t)-1, KVD_ERR_INVALID);
    BAD(dtype, KVD_DTYPE_FP8_E4M3, KVD_ERR_UNSUPPORTED);
    BAD(dtype, KVD_DTYPE_FP8_E5M2, KVD_ERR_UNSUPPORTED);
    f = good_fmt;
    f.head_dim = 48;
    f.codec[1] = KVD_CODEC_KIVI4;
    expect_format(&f, KVD_ERR_UNSUPPORTED); /* V groups of 32 channels */
    f.codec[1] = KVD_CODEC_RAW;
    f.codec[0] = KVD_CODEC_KIVI2;
    expect_format(&f, KVD_OK); /* K is per channel: any head_dim */
    f.codec[0] = KVD_CODEC_TQ3;
    expect_format(&f, KVD_ERR_UNSUPPORTED);
    f.head_dim = 256;
    expect_format(&f, KVD_OK);
    /* One plane: codec[1] is not looked at. */
    f = good_fmt;
    f.num_planes = 1;
    f.codec[1] = (kvd_codec_t)77;
    expect_format(&f, KVD_OK);
    f = good_fmt;
    f.dtype = KVD_DTYPE_FP8_E4M3;
    f.codec[0] = f.codec[1] = KVD_CODEC_RAW;
    expect_format(&f, KVD_OK);
    f.dtype = KVD_DTYPE_FP8_E5M2;
    expect_format(&f, KVD_OK);
    /* err may be NULL or tiny. */
    f = good_fmt;
    f.num_heads = 0;
    char tiny[1];
    assert_int_equal(kvd_object_format_check(&f, NULL, 0), KVD_ERR_INVALID);
    assert_int_equal(kvd_object_format_check(&f, tiny, 1), KVD_ERR_INVALID);
    assert_int_equal(tiny[0], '\0');
#undef BAD
}

static void test_format_sizes(void **state)
{
    (void)state;
    kvd_object_format_t f = good_fmt; /* H=8 BS=16 D=128 bf16 */
    const size_t n = 8 * 16 * 128, v = 8 * 16;
    static const struct {
        kvd_codec_t codec;
        size_t data, meta_k, meta_v;
    } want[] = {
        {KVD_CODEC_RAW, n * 2, 0, 0},
        {KVD_CODEC_FP8_E4M3, n, v * 4, v * 4},
        {KVD_CODEC_INT8, n, 8 * 128 * 2, v * 2},
        {KVD_CODEC_KIVI4, n / 2, 8 * 128 * 4, v * 4 * 4},
        {KVD_CODEC_KIVI2, n / 4, 8 * 128 * 4, v * 4 * 4},
        {KVD_CODEC_TQ4, n / 2, v * 2, v * 2},
        {KVD_CODEC_TQ3, n * 3 / 8, v * 2, v * 2},
        {KVD_CODEC_TQ2, n / 4, v * 2, v * 2},
    };
    for (unsigned i = 0; i < KVD_CODEC_COUNT; i++) {
        f.codec[0] = f.codec[1] = want[i].codec;
        assert_int_equal(kvd_object_plane_data_bytes(&f, 0), want[i].data);
        assert_int_equal(kvd_object_plane_data_bytes(&f, 1), want[i].data);
        assert_int_equal(kvd_object_plane_meta_bytes(&f, 0), want[i].meta_k);
        assert_int_equal(kvd_object_plane_meta_bytes(&f, 1), want[i].meta_v);
        size_t layer = 2 * want[i].data + want[i].meta_k + want[i].meta_v;
        assert_int_equal(kvd_object_layer_bytes(&f), layer);
        assert_int_equal(kvd_object_layer_offset(&f, 3), 3 * layer);
        assert_int_equal(kvd_object_bytes(&f), 4 * layer);
        assert_int_equal(kvd_object_plane_data_bytes(&f, 2), 0);
        assert_int_equal(kvd_object_plane_meta_bytes(&f, 2), 0);
    }
    assert_int_equal(kvd_object_layer_offset(&f, 4), 0);
    /* Rounding to 16 bytes: 1 head x 1 token x 3 channels. */
    kvd_object_format_t g = {
        KVD_DTYPE_FP16, 2, 2, 1, 3, 1, {KVD_CODEC_RAW, KVD_CODEC_FP8_E4M3}, 0};
    assert_int_equal(kvd_object_plane_data_bytes(&g, 0), 16);
    assert_int_equal(kvd_object_plane_meta_bytes(&g, 0), 0);
    assert_int_equal(kvd_object_plane_data_bytes(&g, 1), 16);
    assert_int_equal(kvd_object_plane_meta_bytes(&g, 1), 16);
    assert_int_equal(kvd_object_layer_bytes(&g), 48);
    assert_int_equal(kvd_object_layer_offset(&g, 1), 48);
    assert_int_equal(kvd_object_bytes(&g), 96);
    g.codec[0] = KVD_CODEC_KIVI2; /* 3 codes x 2 bits: one partial byte */
    assert_int_equal(kvd_object_plane_data_bytes(&g, 0), 16);
    assert_int_equal(kvd_object_plane_meta_bytes(&g, 0), 16);
    assert_int_equal(kvd_object_plane_data_bytes(NULL, 0), 0);
    assert_int_equal(kvd_object_layer_bytes(NULL), 0);
}

/* ---- layout check ------------------------------------------------------- */

static void expect_layout(const kvd_kv_layout_t *lo,
                          const kvd_object_format_t *f, kvd_status_t want)
{
    char why[160] = "";
    assert_int_equal(kvd_kv_layout_check(lo, f, why, sizeof(why)), want);
    if (want != KVD_OK) {
        assert_true(strlen(why) > 0);
    }
}

static void test_layout_check(void **state)
{
    (void)state;
    test_cache_t c;
    cache_init(&c, LAYOUT_VLLM_NHD, 2, 2, 4, 16, 2, 64);
    kvd_object_format_t f = cache_format(&c, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_kv_layout_t lo = c.layout;
    void *bases[2] = {c.bases[0], c.bases[1]};

    expect_layout(&lo, &f, KVD_OK);
    expect_layout(NULL, &f, KVD_ERR_INVALID);
    expect_layout(&lo, NULL, KVD_ERR_INVALID);
    kvd_object_format_t badf = f;
    badf.num_heads = 0;
    expect_layout(&lo, &badf, KVD_ERR_INVALID);
#define BADLO(field, value)                                                    \
    do {                                                                       \
        lo = c.layout;                                                         \
        lo.field = value;                                                      \
        expect_layout(&lo, &f, KVD_ERR_INVALID);                               \
    } while (0)
    BADLO(layer_base, NULL);
    BADLO(num_blocks, 0);
    BADLO(stride_head, -128);
    BADLO(stride_token, -1);
    BADLO(stride_block, INT64_MIN);
    BADLO(stride_plane, -4096);
    /* Heads overlapping channels, tokens overlapping heads. */
    BADLO(stride_head, 64);
    BADLO(stride_token, 128);
    BADLO(stride_token, c.layout.stride_head);
    /* Blocks overlapping each other, planes overlapping blocks. */
    BADLO(stride_block, c.layout.stride_block - 2);
    BADLO(stride_plane, c.layout.stride_block * 3);
    BADLO(stride_block, 0);
    /* Span overflow. */
    BADLO(stride_plane, INT64_MAX);
    BADLO(stride_block, INT64_MAX / 2);
    /* A NULL base for one layer. */
    lo = c.layout;
    bases[1] = NULL;
    lo.layer_base = bases;
    expect_layout(&lo, &f, KVD_ERR_INVALID);
    /* A base so high that the layer would wrap the address space. */
    bases[1] = (void *)(UINTPTR_MAX - 4096);
    expect_layout(&lo, &f, KVD_ERR_INVALID);
    /* Gaps between rows and blocks are fine, and so is any stride of a
     * dimension with one position (MLA: one plane, one head). */
    lo = c.layout;
    lo.stride_block *= 3;
    lo.stride_plane *= 4;
    expect_layout(&lo, &f, KVD_OK);
    kvd_object_format_t one = f;
    one.num_planes = 1;
    one.num_heads = 1;
    lo = c.layout;
    lo.stride_plane = 0;
    lo.stride_head = 0;
    lo.stride_token = 64 * 2;
    lo.stride_block = 16 * 64 * 2;
    expect_layout(&lo, &one, KVD_OK);
    lo.num_blocks = 1;
    lo.stride_block = 0;
    expect_layout(&lo, &one, KVD_OK);
#undef BADLO
    cache_cleanup(&c);
}

/* ---- error paths of plane/gather/scatter --------------------------------- */

static void test_plane_errors(void **state)
{
    (void)state;
    kvd_object_format_t f = {
        KVD_DTYPE_FP16, 1, 2, 1, 64, 4, {KVD_CODEC_INT8, KVD_CODEC_TQ4}, 1};
    uint16_t src[4 * 64] = {0};
    _Alignas(16) unsigned char data[4 * 64 * 2 + 16], meta[64];
    kvd_object_format_t bad = f;
    bad.block_size = 0;

    assert_int_equal(kvd_ref_plane_encode(&bad, NULL, 0, src, 1, data, meta),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_ref_plane_encode(NULL, NULL, 0, src, 1, data, meta),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_ref_plane_encode(&f, NULL, 2, src, 1, data, meta),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_ref_plane_encode(&f, NULL, 0, src, 0, data, meta),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_ref_plane_encode(&f, NULL, 0, src, 5, data, meta),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_ref_plane_encode(&f, NULL, 0, NULL, 1, data, meta),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_ref_plane_encode(&f, NULL, 0, src, 1, NULL, meta),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_ref_plane_encode(&f, NULL, 0, src, 1, data, NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_ref_plane_encode(&f, NULL, 0, src, 1, data + 2, meta),
                     KVD_ERR_INVALID);
    /* TurboQuant needs its tables. */
    assert_int_equal(kvd_ref_plane_encode(&f, NULL, 1, src, 1, data, meta),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_ref_plane_decode(&f, NULL, 1, data, meta, 1, src),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_ref_plane_decode(&bad, NULL, 0, data, meta, 1, src),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_ref_plane_decode(&f, NULL, 0, data, meta, 9, src),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_ref_plane_decode(&f, NULL, 0, data, meta, 1, NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_ref_plane_decode(&f, NULL, 0, NULL, meta, 1, src),
                     KVD_ERR_INVALID);
    /* Raw needs no metadata pointer. */
    f.codec[0] = KVD_CODEC_RAW;
    assert_int_equal(kvd_ref_plane_encode(&f, NULL, 0, src, 4, data, NULL),
                     KVD_OK);
    assert_int_equal(kvd_ref_plane_decode(&f, NULL, 0, data, NULL, 4, src),
                     KVD_OK);
}

typedef kvd_status_t (*layer_fn_t)(const test_cache_t *c,
                                   const kvd_kv_layout_t *lo,
                                   const kvd_object_format_t *f, unsigned layer,
                                   const int32_t *ids, size_t n, uint32_t valid,
                                   void **objs);

static kvd_status_t do_gather(const test_cache_t *c, const kvd_kv_layout_t *lo,
                              const kvd_object_format_t *f, unsigned layer,
                              const int32_t *ids, size_t n, uint32_t valid,
                              void **objs)
{
    (void)c;
    return kvd_ref_gather_layer(lo, f, NULL, layer, ids, n, valid, objs);
}

static kvd_status_t do_scatter(const test_cache_t *c, const kvd_kv_layout_t *lo,
                               const kvd_object_format_t *f, unsigned layer,
                               const int32_t *ids, size_t n, uint32_t valid,
                               void **objs)
{
    (void)c;
    return kvd_ref_scatter_layer(lo, f, NULL, layer, ids, n, valid,
                                 (const void *const *)objs);
}

/* Every rejected call leaves objects and cache exactly as they were. */
static void expect_layer_error(layer_fn_t fn, test_cache_t *c,
                               const kvd_kv_layout_t *lo,
                               const kvd_object_format_t *f, unsigned layer,
                               const int32_t *ids, size_t n, uint32_t valid,
                               void **objs, size_t obj_bytes, kvd_status_t want)
{
    unsigned char *cache_before = malloc(c->bytes);
    assert_non_null(cache_before);
    memcpy(cache_before, c->mem, c->bytes);
    for (size_t i = 0; i < 3; i++) {
        if (objs[i] != NULL) {
            memset(objs[i], 0x5a, obj_bytes);
        }
    }
    assert_int_equal(fn(c, lo, f, layer, ids, n, valid, objs), want);
    for (size_t i = 0; i < 3; i++) {
        for (size_t j = 0; objs[i] != NULL && j < obj_bytes; j++) {
            if (((unsigned char *)objs[i])[j] != 0x5a) {
                fail_msg("object %zu byte %zu written by a failed call", i, j);
            }
        }
    }
    assert_memory_equal(cache_before, c->mem, c->bytes);
    free(cache_before);
}

static void test_gather_scatter_errors(void **state)
{
    (void)state;
    test_cache_t c;
    cache_init(&c, LAYOUT_VLLM_HND, 2, 2, 6, 8, 2, 64);
    for (size_t i = 0; i < c.bytes; i++) {
        c.mem[i] = (unsigned char)i;
    }
    kvd_object_format_t f = cache_format(&c, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    size_t ob = kvd_object_bytes(&f);
    void **objs = alloc_objects(3, ob + 16);
    const layer_fn_t fns[2] = {do_gather, do_scatter};

    for (unsigned k = 0; k < 2; k++) {
        layer_fn_t fn = fns[k];
        int32_t ids[3] = {1, 4, 2};
        kvd_kv_layout_t lo = c.layout;
        kvd_object_format_t bf = f;

        bf.num_layers = 0; /* bad format */
        expect_layer_error(fn, &c, &lo, &bf, 0, ids, 3, 8, objs, ob,
                           KVD_ERR_INVALID);
        bf = f;
        bf.codec[1] = KVD_CODEC_TQ4; /* TQ without tables */
        expect_layer_error(fn, &c, &lo, &bf, 0, ids, 3, 8, objs, ob,
                           KVD_ERR_INVALID);
        lo.stride_token = 2; /* overlapping strides */
        expect_layer_error(fn, &c, &lo, &f, 0, ids, 3, 8, objs, ob,
                           KVD_ERR_INVALID);
        lo = c.layout;
        lo.stride_head = -lo.stride_head; /* negative stride */
        expect_layer_error(fn, &c, &lo, &f, 0, ids, 3, 8, objs, ob,
                           KVD_ERR_INVALID);
        expect_layer_error(fn, &c, NULL, &f, 0, ids, 3, 8, objs, ob,
                           KVD_ERR_INVALID);
        lo = c.layout;
        expect_layer_error(fn, &c, &lo, &f, 2, ids, 3, 8, objs, ob,
                           KVD_ERR_INVALID); /* layer >= num_layers */
        expect_layer_error(fn, &c, &lo, &f, 0, ids, 3, 0, objs, ob,
                           KVD_ERR_INVALID);
        expect_layer_error(fn, &c, &lo, &f, 0, ids, 3, 9, objs, ob,
                           KVD_ERR_INVALID);
        expect_layer_error(fn, &c, &lo, &f, 0, NULL, 3, 8, objs, ob,
                           KVD_ERR_INVALID);
        void *saved = objs[1];
        objs[1] = NULL;
        expect_layer_error(fn, &c, &lo, &f, 0, ids, 3, 8, objs, ob,
                           KVD_ERR_INVALID);
        objs[1] = (unsigned char *)saved + 8; /* misaligned */
        expect_layer_error(fn, &c, &lo, &f, 0, ids, 3, 8, objs, ob - 8,
                           KVD_ERR_INVALID);
        objs[1] = saved;
        /* Out-of-range ids, last in the list so earlier blocks would have
         * been written by an implementation that checks as it goes. */
        ids[2] = 6;
        expect_layer_error(fn, &c, &lo, &f, 1, ids, 3, 8, objs, ob,
                           KVD_ERR_RANGE);
        ids[2] = -1;
        expect_layer_error(fn, &c, &lo, &f, 1, ids, 3, 8, objs, ob,
                           KVD_ERR_RANGE);
        ids[2] = INT32_MIN;
        expect_layer_error(fn, &c, &lo, &f, 1, ids, 3, 8, objs, ob,
                           KVD_ERR_RANGE);
        /* No blocks: nothing to do, nothing needed. */
        assert_int_equal(fn(&c, &lo, &f, 0, NULL, 0, 0, NULL), KVD_OK);
    }
    free_objects(objs, 3);
    cache_cleanup(&c);
}

int main(void)
{
    const char *env = getenv("KVDEPOT_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 0)
                 : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    printf("test_kernels_layout: seed %llu (KVDEPOT_TEST_SEED to replay)\n",
           (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codec_names),
        cmocka_unit_test(test_format_check),
        cmocka_unit_test(test_format_sizes),
        cmocka_unit_test(test_layout_check),
        cmocka_unit_test(test_raw_round_trip_every_layout),
        cmocka_unit_test(test_codec_gather_scatter),
        cmocka_unit_test(test_plane_errors),
        cmocka_unit_test(test_gather_scatter_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
