/*
 * kernels/ref/quant_fast.h: the shortcuts the CUDA encoders take instead of
 * a division per element, checked against the reference's division on the
 * CPU. The GPU runs the same predicates, and its E4M3 conversion equals
 * kvd_float_to_fp8_e4m3 for every float (test_cuda_kernels,
 * test_fp8_exhaustive), so what holds here holds there.
 *
 * TurboQuant's bound search is checked against the reference's count.
 *
 * Each check also counts the inputs where the shortcut's code and the
 * division's differ: the near-boundary cases must produce some (they are
 * what the predicates exist to refuse), and typical KV values must take the
 * shortcut nearly always, or it would save nothing.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "tests/unit/kvd_testdata_int.h"

#include "kernels/ref/quant_fast.h"
#include "kernels/ref/ref.h"
#include "kvdepot/kernels.h"

static uint64_t g_seed;

static float bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* ---- the quantizers as the reference computes them ---------------------- */

/* fp8.c: scale amax / 448, 1.0 at or below 2^-6. */
static float fp8_scale(float amax)
{
    return amax > 0.015625f ? amax / 448.0f : 1.0f;
}

/* int8.c: scale fp16(amax / 127), 1.0 when that is zero. */
static float i8_scale(float amax)
{
    float s = kvd_half_to_float(kvd_float_to_half(amax / 127.0f));
    return s == 0.0f ? 1.0f : s;
}

static int8_t i8_code(float q)
{
    float r = rintf(q);
    if (isnan(r)) {
        return 0;
    }
    return (int8_t)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
}

typedef struct tally {
    unsigned long fast, slow, refused_differ;
} tally_t;

typedef enum quant { QUANT_FP8, QUANT_INT8 } quant_t;

static const char *const quant_names[] = {"fp8", "int8"};

static float quant_scale(quant_t k, float amax)
{
    return k == QUANT_FP8 ? fp8_scale(amax) : i8_scale(amax);
}

/* The code of a quotient and whether the predicate admits it. */
static int quant_code(quant_t k, float q)
{
    return k == QUANT_FP8 ? kvd_float_to_fp8_e4m3(q) : i8_code(q);
}

static int quant_ok(quant_t k, float q)
{
    return k == QUANT_FP8 ? kvd_qf_fp8_ok(q) : kvd_qf_i8_ok(q);
}

/* One element: where the predicate allows the shortcut, its code must be
 * the division's. */
static void check(quant_t k, float x, float s, tally_t *t)
{
    float q = x * (1.0f / s);
    int want = quant_code(k, x / s);
    int got = quant_code(k, q);
    if (quant_ok(k, q)) {
        if (got != want) {
            fail_msg("%s: x %a s %a: x*(1/s) %a gives %d, x/s gives %d",
                     quant_names[k], (double)x, (double)s, (double)q, got,
                     want);
        }
        t->fast++;
    } else {
        t->slow++;
        t->refused_differ += got != want;
    }
}

/* Scales from amax values spread over the fp16 and bf16 ranges, the
 * thresholds and the non-finite cases. */
static size_t amax_samples(float *out, size_t cap)
{
    size_t n = 0;
    for (uint32_t u = 1; u < 0x7c00u && n < cap; u += 257u) {
        out[n++] = kvd_half_to_float((uint16_t)u);
    }
    for (uint32_t u = 1; u < 0x7f80u && n < cap; u += 263u) {
        out[n++] = kvd_bf16_to_float((uint16_t)u);
    }
    static const float special[] = {
        0.0f,    0.015625f, 0.0156251f, 448.0f,      65504.0f,
        3.0e38f, 1e-30f,    INFINITY,   0x1.2p-115f, 127.0f};
    for (size_t i = 0; i < sizeof(special) / sizeof(special[0]) && n < cap;
         i++) {
        out[n++] = special[i];
    }
    return n;
}

/* ---- every fp16 input -------------------------------------------------- */

static void every_fp16_input(quant_t k)
{
    float amax[512];
    size_t na = amax_samples(amax, 512);
    tally_t t = {0, 0, 0};
    for (size_t a = 0; a < na; a++) {
        float s = quant_scale(k, amax[a]);
        for (uint32_t u = 0; u < 65536u; u++) {
            check(k, kvd_half_to_float((uint16_t)u), s, &t);
        }
    }
    printf("%s, every fp16 x %zu scales: %lu by x*(1/s), %lu divided\n",
           quant_names[k], na, t.fast, t.slow);
    assert_true(t.fast > 0);
}

static void test_fp8_every_fp16_input(void **state)
{
    (void)state;
    every_fp16_input(QUANT_FP8);
}

static void test_i8_every_fp16_input(void **state)
{
    (void)state;
    every_fp16_input(QUANT_INT8);
}

/* ---- inputs next to the rounding boundaries ---------------------------- */

/* x = m * s rounded, and its float neighbours, for every boundary m of the
 * code grid: where x * (1/s) and x / s can round apart. */
static void near_boundaries(quant_t k, tally_t *t)
{
    uint64_t rng = g_seed;
    for (unsigned trial = 0; trial < 400; trial++) {
        float amax = (float)(exp(20.0 * kvd_test_uniform01(&rng) - 10.0));
        float s = quant_scale(k, amax);
        unsigned nb = k == QUANT_FP8 ? 16u * 8u : 256u;
        for (unsigned b = 0; b < nb; b++) {
            double m;
            if (k == QUANT_FP8) {
                /* Midpoints of the normal binades 2^-6 .. 2^8. */
                int e = (int)(b / 8u) - 6;
                m = ldexp(1.0 + (2.0 * (b % 8u) + 1.0) / 16.0, e);
            } else {
                m = (double)b - 127.5;
            }
            uint32_t bits;
            float x = (float)(m * (double)s);
            memcpy(&bits, &x, sizeof(bits));
            for (int d = -4; d <= 4; d++) {
                check(k, bits_float(bits + (uint32_t)d), s, t);
            }
        }
    }
}

static void test_near_boundaries(quant_t k)
{
    tally_t t = {0, 0, 0};
    near_boundaries(k, &t);
    printf("%s near rounding boundaries: %lu by x*(1/s), %lu divided, %lu of "
           "those would have differed\n",
           quant_names[k], t.fast, t.slow, t.refused_differ);
    assert_true(t.refused_differ > 0);
}

static void test_fp8_near_midpoints(void **state)
{
    (void)state;
    test_near_boundaries(QUANT_FP8);
}

static void test_i8_near_half_integers(void **state)
{
    (void)state;
    test_near_boundaries(QUANT_INT8);
}

/* ---- arbitrary floats -------------------------------------------------- */

static void test_random_floats(void **state)
{
    (void)state;
    uint64_t rng = g_seed ^ 0x5eedull;
    tally_t f8 = {0, 0, 0}, i8 = {0, 0, 0};
    for (unsigned i = 0; i < 2000000; i++) {
        float x = bits_float((uint32_t)kvd_test_rng(&rng));
        float amax = fabsf(bits_float((uint32_t)kvd_test_rng(&rng)));
        if (i % 2 == 0) {
            /* Mostly the vector's own range: |x| <= amax. */
            amax = fabsf(x) * (float)(1.0 + 8.0 * kvd_test_uniform01(&rng));
        }
        check(QUANT_FP8, x, fp8_scale(amax), &f8);
        check(QUANT_INT8, x, i8_scale(amax), &i8);
    }
    assert_true(f8.fast > 0);
    assert_true(i8.fast > 0);
}

/* ---- typical KV values take the shortcut --------------------------------
 */

static void test_typical_values_take_the_shortcut(void **state)
{
    (void)state;
    uint64_t rng = g_seed ^ 0xca11ull;
    enum { DIM = 128, VECTORS = 4096 };
    double std[DIM], off[DIM];
    kvd_test_channel_model(1, DIM, &rng, std, off);
    unsigned long chunks = 0, fp8_fast = 0, i8_fast = 0;
    tally_t t = {0, 0, 0};
    for (unsigned v = 0; v < VECTORS; v++) {
        float x[DIM];
        float amax = 0.0f;
        int key_like = v % 2;
        for (unsigned c = 0; c < DIM; c++) {
            double g = kvd_test_gauss(&rng);
            double val = key_like ? off[c] + std[c] * g : g;
            x[c] = kvd_half_to_float(kvd_float_to_half((float)val));
            amax = fmaxf(amax, fabsf(x[c]));
        }
        float s8 = fp8_scale(amax), si = i8_scale(amax);
        /* The kernels fall back per chunk of eight elements. */
        for (unsigned c0 = 0; c0 < DIM; c0 += 8) {
            int ok8 = 1, oki = 1;
            for (unsigned c = c0; c < c0 + 8; c++) {
                ok8 &= kvd_qf_fp8_ok(x[c] * (1.0f / s8));
                oki &= kvd_qf_i8_ok(x[c] * (1.0f / si));
                check(QUANT_FP8, x[c], s8, &t);
                check(QUANT_INT8, x[c], si, &t);
            }
            chunks++;
            fp8_fast += (unsigned long)ok8;
            i8_fast += (unsigned long)oki;
        }
    }
    printf("typical values: %lu of %lu chunks fast for fp8, %lu for int8\n",
           fp8_fast, chunks, i8_fast);
    assert_true(fp8_fast * 100 >= chunks * 99);
    assert_true(i8_fast * 100 >= chunks * 99);
}

/* ---- TurboQuant's bound search ------------------------------------------ */

static uint32_t tq_count(float y, const float *b, unsigned bits)
{
    uint32_t c = 0;
    for (unsigned k = 0; k < (1u << bits) - 1u; k++) {
        c += y > b[k];
    }
    return c;
}

static void tq_search_check(const float *b, unsigned bits, float y)
{
    uint32_t want = tq_count(y, b, bits);
    uint32_t got = kvd_qf_tq_code(y, b, bits);
    if (got != want) {
        fail_msg("tq%u: y %a: search %u, count %u", bits, (double)y, got, want);
    }
}

/* The codec's own tables at every head_dim and width, at every bound and
 * its float neighbours, the special values and random values; then
 * non-decreasing arrays with repeated bounds. */
static void test_tq_bound_search(void **state)
{
    (void)state;
    static const uint32_t dims[] = {64, 128, 256};
    uint64_t rng = g_seed ^ 0x7a11ull;
    for (size_t d = 0; d < 3; d++) {
        kvd_object_format_t fmt;
        memset(&fmt, 0, sizeof(fmt));
        fmt.dtype = KVD_DTYPE_FP16;
        fmt.num_layers = 1;
        fmt.num_planes = 2;
        fmt.num_heads = 1;
        fmt.block_size = 16;
        fmt.head_dim = dims[d];
        fmt.codec[0] = fmt.codec[1] = KVD_CODEC_TQ4;
        fmt.tq_seed = 7;
        kvd_codec_tables_t *tables = NULL;
        assert_int_equal(kvd_codec_tables_create(&fmt, &tables), KVD_OK);
        for (unsigned bits = 2; bits <= 4; bits++) {
            const float *b = tables->tq_bound[bits - 2];
            for (unsigned k = 0; k < (1u << bits) - 1u; k++) {
                uint32_t u;
                memcpy(&u, &b[k], sizeof(u));
                for (int e = -2; e <= 2; e++) {
                    tq_search_check(b, bits, bits_float(u + (uint32_t)e));
                }
            }
            static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY,
                                            NAN,  -NAN,  1e30f,    -1e30f};
            for (size_t i = 0; i < sizeof(special) / sizeof(special[0]); i++) {
                tq_search_check(b, bits, special[i]);
            }
            for (unsigned i = 0; i < 20000; i++) {
                tq_search_check(b, bits, (float)(0.3 * kvd_test_gauss(&rng)));
            }
        }
        kvd_codec_tables_destroy(tables);
    }
    for (unsigned trial = 0; trial < 2000; trial++) {
        unsigned bits = 2 + trial % 3;
        float b[15];
        float v = (float)kvd_test_gauss(&rng);
        for (unsigned k = 0; k < (1u << bits) - 1u; k++) {
            if (kvd_test_rng(&rng) % 3 != 0) {
                v += (float)kvd_test_uniform01(&rng);
            }
            b[k] = v;
        }
        for (unsigned k = 0; k < (1u << bits) - 1u; k++) {
            tq_search_check(b, bits, b[k]);
            tq_search_check(b, bits, nextafterf(b[k], INFINITY));
            tq_search_check(b, bits, nextafterf(b[k], -INFINITY));
        }
    }
}

/* ---- NaN tests --------------------------------------------------------- */

static int half_is_nan(uint32_t u)
{
    float f = kvd_half_to_float((uint16_t)u);
    return f != f;
}

static void test_fp16_pair_nan(void **state)
{
    (void)state;
    static const uint32_t partner[] = {0x0000, 0x8000, 0x3c00, 0x7bff,
                                       0x7c00, 0xfc00, 0x7c01, 0xfe00,
                                       0x7fff, 0x03ff, 0x83ff, 0xffff};
    for (uint32_t u = 0; u < 65536u; u++) {
        for (size_t k = 0; k < sizeof(partner) / sizeof(partner[0]); k++) {
            uint32_t p = partner[k];
            int want = half_is_nan(u) || half_is_nan(p);
            assert_int_equal(kvd_qf_fp16x2_nan(u | (p << 16)) != 0, want);
            assert_int_equal(kvd_qf_fp16x2_nan(p | (u << 16)) != 0, want);
        }
    }
}

static void test_e4m3_quad_nan(void **state)
{
    (void)state;
    static const uint32_t other[] = {0x00, 0x80, 0x7e, 0xfe, 0x7f, 0xff, 0x01};
    for (uint32_t c = 0; c < 256u; c++) {
        for (unsigned pos = 0; pos < 4; pos++) {
            for (size_t k = 0; k < sizeof(other) / sizeof(other[0]); k++) {
                uint32_t w = 0;
                for (unsigned i = 0; i < 4; i++) {
                    w |= (i == pos ? c : other[k]) << (8 * i);
                }
                float a = kvd_fp8_e4m3_to_float((uint8_t)c);
                float b = kvd_fp8_e4m3_to_float((uint8_t)other[k]);
                int want = a != a || b != b;
                assert_int_equal(kvd_qf_e4m3x4_nan(w) != 0, want);
            }
        }
    }
}

int main(void)
{
    const char *env = getenv("KVDEPOT_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 0)
                 : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    printf("test_quant_fast: seed %llu (KVDEPOT_TEST_SEED to replay)\n",
           (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_every_fp16_input),
        cmocka_unit_test(test_i8_every_fp16_input),
        cmocka_unit_test(test_fp8_near_midpoints),
        cmocka_unit_test(test_i8_near_half_integers),
        cmocka_unit_test(test_random_floats),
        cmocka_unit_test(test_typical_values_take_the_shortcut),
        cmocka_unit_test(test_tq_bound_search),
        cmocka_unit_test(test_fp16_pair_nan),
        cmocka_unit_test(test_e4m3_quad_nan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
