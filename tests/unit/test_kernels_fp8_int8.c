/*
 * Scalar conversions and the fp8 / int8 codecs of the reference kernels.
 *
 * The E4M3 encoder is checked bit for bit against a brute-force oracle that
 * knows nothing about its algorithm: it decodes all 254 finite codes with
 * ldexp and picks the nearest (ties to the even mantissa, the input's sign
 * for zero, saturation to +-448, NaN to 0x7F/0xFF), over every fp16 and
 * bf16 pattern and 10^6 random floats (docs/codecs.md, "fp8_e4m3").
 * fp16/bf16 rounding is checked against a binary search over the
 * monotonic positive bit patterns. The quality gates run on fresh random
 * data every time; the seed is printed so a failure can be replayed with
 * KVDEPOT_TEST_SEED.
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

#include "kernels/ref/ref.h"
#include "kvdepot/kernels.h"

/* ---- randomness -------------------------------------------------------- */

static uint64_t g_seed;

static float bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

/* ---- independent oracles ----------------------------------------------- */

/* E4M3 value of a code, straight from the format definition (OCP E4M3). */
static double e4m3_value(unsigned code)
{
    unsigned e = (code >> 3) & 15u, m = code & 7u;
    double v = e == 0 ? ldexp((double)m, -9) : ldexp(8.0 + m, (int)e - 10);
    return (code & 0x80u) ? -v : v;
}

static uint8_t e4m3_oracle(float x)
{
    int neg = signbit(x) != 0;
    if (isnan(x)) {
        return neg ? 0xff : 0x7f;
    }
    double xd = x;
    if (xd > 448.0) {
        return 0x7e;
    }
    if (xd < -448.0) {
        return 0xfe;
    }
    int best = -1;
    double best_d = 0;
    for (unsigned code = 0; code < 256; code++) {
        if ((code & 0x7fu) == 0x7fu) {
            continue;
        }
        double d = fabs(xd - e4m3_value(code));
        if (best < 0 || d < best_d) {
            best = (int)code;
            best_d = d;
        } else if (d == best_d) {
            /* Tie: +0/-0 go by the input's sign, otherwise even mantissa. */
            if (e4m3_value(code) == 0.0) {
                if (((code & 0x80u) != 0) == neg) {
                    best = (int)code;
                }
            } else if ((code & 1u) == 0) {
                best = (int)code;
            }
        }
    }
    return (uint8_t)best;
}

static double half_value(unsigned h)
{
    unsigned e = (h >> 10) & 31u, m = h & 0x3ffu;
    double v = e == 0 ? ldexp((double)m, -24) : ldexp(1024.0 + m, (int)e - 25);
    return (h & 0x8000u) ? -v : v;
}

static double bf16_value(unsigned b)
{
    unsigned e = (b >> 7) & 255u, m = b & 0x7fu;
    double v = e == 0 ? ldexp((double)m, -133) : ldexp(128.0 + m, (int)e - 134);
    return (b & 0x8000u) ? -v : v;
}

/* Nearest-even rounding of a finite float to a 16-bit format whose positive
 * patterns 0..max_pat are monotonic; `beyond` is the value the next pattern
 * would have with an unbounded exponent (rounding to it means Inf, which is
 * pattern max_pat + 1). */
static uint16_t round16_oracle(float x, double (*value)(unsigned),
                               unsigned max_pat, double beyond)
{
    double a = fabs((double)x);
    unsigned sign = signbit(x) ? 0x8000u : 0;
    unsigned lo = 0, hi = max_pat;
    if (a >= value(max_pat)) {
        lo = max_pat;
    } else {
        /* Largest pattern with value <= a. */
        while (hi - lo > 1) {
            unsigned mid = (lo + hi) / 2;
            if (value(mid) <= a) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
    }
    double vlo = value(lo);
    double vhi = lo == max_pat ? beyond : value(lo + 1);
    if (a == vlo) {
        return (uint16_t)(sign | lo);
    }
    double dl = a - vlo, dh = vhi - a;
    unsigned pick = (dl < dh || (dl == dh && (lo & 1u) == 0)) ? lo : lo + 1;
    return (uint16_t)(sign | pick);
}

static uint16_t half_oracle(float x)
{
    return round16_oracle(x, half_value, 0x7bffu, 65536.0);
}

static uint16_t bf16_oracle(float x)
{
    return round16_oracle(x, bf16_value, 0x7f7fu, ldexp(1.0, 128));
}

/* ---- E4M3 --------------------------------------------------------------- */

static void expect_fp8(float x, uint8_t want)
{
    uint8_t got = kvd_float_to_fp8_e4m3(x);
    if (got != want) {
        fail_msg("e4m3(%a) = 0x%02x, want 0x%02x", (double)x, got, want);
    }
}

static void test_fp8_edge_cases(void **state)
{
    (void)state;
    expect_fp8(464.0f, 0x7e);
    expect_fp8(464.01f, 0x7e);
    expect_fp8(-0.0f, 0x80);
    expect_fp8(0.0f, 0x00);
    expect_fp8(0x1p-10f, 0x00);
    expect_fp8(0.00098f, 0x01);
    expect_fp8(448.0f, 0x7e);
    expect_fp8(480.0f, 0x7e);
    expect_fp8(-1e30f, 0xfe);
    expect_fp8(INFINITY, 0x7e);
    expect_fp8(-INFINITY, 0xfe);
    expect_fp8(NAN, 0x7f);
    expect_fp8(-NAN, 0xff);
    expect_fp8(0x1p-9f, 0x01);
    expect_fp8(0x1p-6f, 0x08);
    expect_fp8(0x1.ep-7f, 0x08); /* 7.5 * 2^-9 ties up to the min normal */
    expect_fp8(1.0f, 0x38);
    expect_fp8(-1.0f, 0xb8);
    expect_fp8(1.0625f, 0x38); /* tie between 1 and 1.125: even */
    expect_fp8(1.1875f, 0x3a); /* tie between 1.125 and 1.25: even */
    expect_fp8(0x1p-149f, 0x00);
    expect_fp8(-0x1p-149f, 0x80);
}

static void test_fp8_all_fp16_inputs(void **state)
{
    (void)state;
    for (unsigned h = 0; h < 65536; h++) {
        float x = kvd_half_to_float((uint16_t)h);
        uint8_t got = kvd_float_to_fp8_e4m3(x), want = e4m3_oracle(x);
        if (got != want) {
            fail_msg("fp16 0x%04x (%a): 0x%02x, want 0x%02x", h, (double)x, got,
                     want);
        }
    }
}

static void test_fp8_all_bf16_inputs(void **state)
{
    (void)state;
    for (unsigned b = 0; b < 65536; b++) {
        float x = bits_float((uint32_t)b << 16);
        uint8_t got = kvd_float_to_fp8_e4m3(x), want = e4m3_oracle(x);
        if (got != want) {
            fail_msg("bf16 0x%04x (%a): 0x%02x, want 0x%02x", b, (double)x, got,
                     want);
        }
    }
}

static void test_fp8_random_floats(void **state)
{
    (void)state;
    uint64_t s = g_seed ^ 0xf8f8f8f8ull;
    for (unsigned i = 0; i < 1000000; i++) {
        uint64_t r = kvd_test_rng(&s);
        float x;
        if (i & 1) {
            x = bits_float((uint32_t)r);
        } else {
            /* Most random bit patterns are far outside E4M3's range; half
             * the samples are drawn where its codes actually live. */
            int e = (int)((r >> 32) % 24) - 14;
            x = (float)ldexp((double)(uint32_t)r * 0x1p-32 + 0.5, e);
            if (r >> 63) {
                x = -x;
            }
        }
        uint8_t got = kvd_float_to_fp8_e4m3(x), want = e4m3_oracle(x);
        if (got != want) {
            fail_msg("float 0x%08x (%a): 0x%02x, want 0x%02x", float_bits(x),
                     (double)x, got, want);
        }
    }
}

static void test_fp8_decode_round_trips(void **state)
{
    (void)state;
    for (unsigned code = 0; code < 256; code++) {
        float v = kvd_fp8_e4m3_to_float((uint8_t)code);
        if ((code & 0x7fu) == 0x7fu) {
            assert_true(isnan(v));
            assert_int_equal(kvd_float_to_fp8_e4m3(v), code);
            continue;
        }
        assert_true((double)v == e4m3_value(code));
        assert_int_equal(kvd_float_to_fp8_e4m3(v), code);
    }
}

/* ---- fp16 / bf16 ------------------------------------------------------- */

static void test_half_bf16_all_patterns(void **state)
{
    (void)state;
    for (unsigned p = 0; p < 65536; p++) {
        float h = kvd_half_to_float((uint16_t)p);
        float b = kvd_bf16_to_float((uint16_t)p);
        int h_nan = (p & 0x7c00u) == 0x7c00u && (p & 0x3ffu) != 0;
        int b_nan = (p & 0x7f80u) == 0x7f80u && (p & 0x7fu) != 0;
        if (h_nan) {
            assert_true(isnan(h));
            uint16_t back = kvd_float_to_half(h);
            assert_true((back & 0x7c00u) == 0x7c00u && (back & 0x3ffu) != 0);
            assert_int_equal(back & 0x8000u, p & 0x8000u);
        } else {
            assert_true((double)h == half_value(p) ||
                        (isinf(h) && p % 0x8000 == 0x7c00));
            assert_int_equal(kvd_float_to_half(h), p);
        }
        if (b_nan) {
            assert_true(isnan(b));
            uint16_t back = kvd_float_to_bf16(b);
            assert_true((back & 0x7f80u) == 0x7f80u && (back & 0x7fu) != 0);
        } else {
            assert_int_equal(kvd_float_to_bf16(b), p);
        }
    }
}

static void test_half_bf16_rounding(void **state)
{
    (void)state;
    uint64_t s = g_seed ^ 0x16161616ull;
    /* Fixed ties and overflow boundaries first. */
    assert_int_equal(kvd_float_to_half(65504.0f), 0x7bff);
    assert_int_equal(kvd_float_to_half(65519.99f), 0x7bff);
    assert_int_equal(kvd_float_to_half(65520.0f), 0x7c00);
    assert_int_equal(kvd_float_to_half(-INFINITY), 0xfc00);
    assert_int_equal(kvd_float_to_half(0x1p-25f), 0x0000);
    assert_int_equal(kvd_float_to_half(0x1.8p-25f), 0x0001);
    assert_int_equal(kvd_float_to_half(0x1.8p-24f), 0x0002);
    assert_int_equal(kvd_float_to_half(-0.0f), 0x8000);
    assert_int_equal(kvd_float_to_bf16(bits_float(0x7f7f8000u)), 0x7f80);
    assert_int_equal(kvd_float_to_bf16(bits_float(0x3f808000u)), 0x3f80);
    assert_int_equal(kvd_float_to_bf16(bits_float(0x3f818000u)), 0x3f82);
    assert_int_equal(kvd_float_to_bf16(bits_float(0x7f800001u)) & 0x7fc0u,
                     0x7fc0);
    for (unsigned i = 0; i < 1000000; i++) {
        uint32_t r = (uint32_t)kvd_test_rng(&s);
        if (i & 1) {
            /* Exponents around the fp16 range, where subnormals and
             * overflow live. */
            r = (r & 0x807fffffu) | ((100u + (r >> 23) % 50u) << 23);
        }
        float x = bits_float(r);
        if (isnan(x)) {
            continue;
        }
        if (kvd_float_to_half(x) != half_oracle(x)) {
            fail_msg("half(%a) = 0x%04x, want 0x%04x", (double)x,
                     kvd_float_to_half(x), half_oracle(x));
        }
        if (kvd_float_to_bf16(x) != bf16_oracle(x)) {
            fail_msg("bf16(%a) = 0x%04x, want 0x%04x", (double)x,
                     kvd_float_to_bf16(x), bf16_oracle(x));
        }
    }
}

/* ---- codec quality ------------------------------------------------------ */

#define QDIM 128
#define QVECS 4096

/* Generates QVECS vectors: i.i.d. N(0,1), or key-like (docs/codecs.md,
 * "Expected quality": key-like): channel std e^{0.5 N}, 4 outlier
 * channels x8..15, per-channel offsets N(0, 2^2). Rounded to fp16, the
 * cache dtype, so the reference is exactly what the codec sees. */
static float *make_vectors(int key_like, uint64_t seed)
{
    float *x = malloc(sizeof(float) * QDIM * QVECS);
    double std[QDIM], off[QDIM];
    uint64_t s = seed;
    assert_non_null(x);
    kvd_test_channel_model(key_like, QDIM, &s, std, off);
    for (size_t i = 0; i < (size_t)QDIM * QVECS; i++) {
        unsigned c = (unsigned)(i % QDIM);
        x[i] = kvd_half_to_float(
            kvd_float_to_half((float)(off[c] + std[c] * kvd_test_gauss(&s))));
    }
    return x;
}

/* Relative MSE sum ||x - y||^2 / sum ||x||^2 of one codec on one plane
 * over the vectors, run through the public plane API (fp16 cache, 16
 * tokens x 1 head per block) so loads, stores and region offsets are
 * covered too. */
static double codec_rel_mse(kvd_codec_t codec, kvd_plane_t plane,
                            const float *x)
{
    const uint32_t bs = 16;
    kvd_object_format_t fmt = {KVD_DTYPE_FP16, 1, 2, 1, QDIM, bs,
                               {codec, codec}, 0};
    size_t data_bytes = kvd_object_plane_data_bytes(&fmt, plane);
    size_t meta_bytes = kvd_object_plane_meta_bytes(&fmt, plane);
    uint16_t *src = malloc(sizeof(uint16_t) * QDIM * bs);
    uint16_t *dst = malloc(sizeof(uint16_t) * QDIM * bs);
    void *data = aligned_alloc(16, data_bytes);
    void *meta = aligned_alloc(16, meta_bytes);
    double err = 0, sig = 0;

    assert_non_null(src);
    assert_non_null(dst);
    assert_non_null(data);
    assert_non_null(meta);
    for (size_t v0 = 0; v0 < QVECS; v0 += bs) {
        for (size_t i = 0; i < (size_t)QDIM * bs; i++) {
            src[i] = kvd_float_to_half(x[v0 * QDIM + i]);
        }
        assert_int_equal(
            kvd_ref_plane_encode(&fmt, NULL, plane, src, bs, data, meta),
            KVD_OK);
        assert_int_equal(
            kvd_ref_plane_decode(&fmt, NULL, plane, data, meta, bs, dst),
            KVD_OK);
        for (size_t i = 0; i < (size_t)QDIM * bs; i++) {
            double a = x[v0 * QDIM + i];
            double d = a - kvd_half_to_float(dst[i]);
            err += d * d;
            sig += a * a;
        }
    }
    free(src);
    free(dst);
    free(data);
    free(meta);
    return err / sig;
}

static void check_gate(const char *what, double got, double gate)
{
    printf("[ relmse   ] %-22s %.3e (gate %.1e, seed %llu)\n", what, got, gate,
           (unsigned long long)g_seed);
    if (!(got <= gate)) {
        fail_msg("%s: relative MSE %.3e above %.1e (seed %llu)", what, got,
                 gate, (unsigned long long)g_seed);
    }
}

static void test_quality_gaussian(void **state)
{
    (void)state;
    float *x = make_vectors(0, g_seed);
    check_gate("fp8 N(0,1)", codec_rel_mse(KVD_CODEC_FP8_E4M3, 0, x), 8e-4);
    check_gate("int8 K N(0,1)", codec_rel_mse(KVD_CODEC_INT8, 0, x), 6e-5);
    check_gate("int8 V N(0,1)", codec_rel_mse(KVD_CODEC_INT8, 1, x), 6e-5);
    free(x);
}

/* What symmetric int8 with per-vector step s must cost if it is correct:
 * uniform rounding noise s^2/12 per element, s = fp16(amax/127). */
static double int8_predicted_rel_mse(const float *x)
{
    double err = 0, sig = 0;
    for (size_t v = 0; v < QVECS; v++) {
        double amax = 0;
        for (unsigned c = 0; c < QDIM; c++) {
            double a = x[v * QDIM + c];
            amax = fabs(a) > amax ? fabs(a) : amax;
            sig += a * a;
        }
        double st = kvd_half_to_float(kvd_float_to_half((float)(amax / 127)));
        err += QDIM * st * st / 12.0;
    }
    return err / sig;
}

/*
 * Key-like data. fp8 keeps its N(0,1) gate: its error is relative to each
 * element, so outlier channels barely move it. int8 on K keeps it too: its
 * step is per channel over the block, so an outlier channel widens only
 * its own step. Keys are what has outlier channels; int8 on V is per
 * token, where a per-vector step amax/127 costs (amax/rms)^2, which the
 * outlier channels raise by 5x to 15x depending on the draw (1.3e-4 ..
 * 6e-4 over 40 seeds; the design study quoted 2e-4). Should V ever look
 * like this, the test holds int8 V to within 10% of its own noise model on
 * the same data, which still catches a wrong scale, rounding or clamp.
 */
static void test_quality_key_like(void **state)
{
    (void)state;
    float *x = make_vectors(1, g_seed + 1);
    check_gate("fp8 key-like", codec_rel_mse(KVD_CODEC_FP8_E4M3, 0, x), 8e-4);
    check_gate("int8 K key-like", codec_rel_mse(KVD_CODEC_INT8, 0, x), 6e-5);
    double model = int8_predicted_rel_mse(x);
    printf("[ relmse   ] int8 V key-like model  %.3e\n", model);
    check_gate("int8 V key-like", codec_rel_mse(KVD_CODEC_INT8, 1, x),
               1.10 * model);
    free(x);
}

/* ---- plane encode edge cases -------------------------------------------- */

static void test_zero_vector_and_partial_block(void **state)
{
    (void)state;
    const uint32_t heads = 2, bs = 8, dim = 32, valid = 3;
    const kvd_codec_t codecs[2] = {KVD_CODEC_FP8_E4M3, KVD_CODEC_INT8};
    uint16_t src[2 * 8 * 32], dst[2 * 8 * 32];
    _Alignas(16) unsigned char data[2 * 8 * 32], meta[2 * 8 * 4];
    uint64_t s = g_seed ^ 0x55ull;

    for (unsigned k = 0; k < 2; k++) {
        kvd_object_format_t fmt = {KVD_DTYPE_BF16,         1, 2, heads, dim, bs,
                                   {codecs[k], codecs[k]}, 0};
        assert_true(kvd_object_plane_data_bytes(&fmt, 1) <= sizeof(data));
        assert_true(kvd_object_plane_meta_bytes(&fmt, 1) <= sizeof(meta));
        /* Head 0 token 0 all zero; tokens >= valid hold garbage that must
         * not leak into the object. */
        for (unsigned i = 0; i < heads * bs * dim; i++) {
            src[i] = kvd_float_to_bf16((float)kvd_test_gauss(&s));
        }
        memset(src, 0, dim * sizeof(uint16_t));
        memset(data, 0xee, sizeof(data));
        memset(meta, 0xee, sizeof(meta));
        assert_int_equal(
            kvd_ref_plane_encode(&fmt, NULL, 1, src, valid, data, meta),
            KVD_OK);
        for (uint32_t h = 0; h < heads; h++) {
            for (uint32_t t = 0; t < bs; t++) {
                size_t v = (size_t)h * bs + t;
                int zero_vec = (h == 0 && t == 0) || t >= valid;
                for (uint32_t c = 0; c < dim; c++) {
                    if (zero_vec) {
                        assert_int_equal(data[v * dim + c], 0);
                    }
                }
                if (k == 0) {
                    float sc;
                    memcpy(&sc, meta + 4 * v, 4);
                    assert_true(sc == (t >= valid ? 0.0f
                                       : zero_vec ? 1.0f
                                                  : sc));
                    assert_true(t >= valid || sc > 0.0f);
                } else {
                    uint16_t sc;
                    memcpy(&sc, meta + 2 * v, 2);
                    if (t >= valid) {
                        assert_int_equal(sc, 0);
                    } else if (zero_vec) {
                        assert_int_equal(sc, 0x3c00);
                    }
                }
            }
        }
        for (unsigned i = 0; i < heads * bs * dim; i++) {
            dst[i] = 0xbeef;
        }
        assert_int_equal(
            kvd_ref_plane_decode(&fmt, NULL, 1, data, meta, valid, dst),
            KVD_OK);
        for (uint32_t h = 0; h < heads; h++) {
            for (uint32_t t = 0; t < bs; t++) {
                for (uint32_t c = 0; c < dim; c++) {
                    size_t i = ((size_t)h * bs + t) * dim + c;
                    if (t >= valid) {
                        assert_int_equal(dst[i], 0xbeef);
                    } else if (h == 0 && t == 0) {
                        assert_int_equal(dst[i] & 0x7fffu, 0);
                    } else {
                        float a = kvd_bf16_to_float(src[i]);
                        float b = kvd_bf16_to_float(dst[i]);
                        assert_true(fabsf(a - b) <= 0.1f * fabsf(a) + 0.05f);
                    }
                }
            }
        }
    }
}

/* Codes are bit-exact functions of the spec in docs/codecs.md: checks one
 * vector by hand-written arithmetic (divide by the scale, round, clamp). */
static void test_codec_arithmetic(void **state)
{
    (void)state;
    kvd_plane_dims_t d = {1, 1, 4, 1};
    float x[4] = {-3.0f, 0.5f, 1.0f, 1e-3f};
    uint8_t q8[4];
    int8_t qi[4];
    float fs;
    uint16_t hs;
    float y[4];

    kvd_ref_fp8_encode(&d, x, q8, &fs);
    assert_true(fs == 3.0f / 448.0f);
    for (unsigned c = 0; c < 4; c++) {
        assert_int_equal(q8[c], kvd_float_to_fp8_e4m3(x[c] / fs));
    }
    assert_int_equal(q8[0], 0xfe);
    kvd_ref_fp8_decode(&d, q8, &fs, y);
    assert_true(y[0] == -3.0f);

    kvd_ref_int8_encode(&d, KVD_PLANE_V, x, qi, &hs);
    assert_int_equal(hs, kvd_float_to_half(3.0f / 127.0f));
    float s = kvd_half_to_float(hs);
    for (unsigned c = 0; c < 4; c++) {
        assert_int_equal(qi[c], (int)rintf(x[c] / s));
    }
    /* The fp16 rounding of 3/127 is below 3/127, so -3/s exceeds 127 and
     * must clamp to -127, never -128. */
    assert_int_equal(qi[0], -127);
    kvd_ref_int8_decode(&d, KVD_PLANE_V, qi, &hs, y);
    assert_true(y[2] == (float)qi[2] * s);

    /* K: the same four values as 2 tokens x 2 channels: one scale per
     * channel over the tokens, {3, 0.5} / 127, meta [channel]. */
    kvd_plane_dims_t dk = {1, 2, 2, 2};
    uint16_t hk[2];
    kvd_ref_int8_encode(&dk, KVD_PLANE_K, x, qi, hk);
    assert_int_equal(hk[0], kvd_float_to_half(3.0f / 127.0f));
    assert_int_equal(hk[1], kvd_float_to_half(0.5f / 127.0f));
    for (unsigned i = 0; i < 4; i++) {
        float sc = kvd_half_to_float(hk[i % 2]);
        float q = rintf(x[i] / sc);
        q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
        assert_int_equal(qi[i], (int)q);
    }
    assert_int_equal(qi[0], -127);
    kvd_ref_int8_decode(&dk, KVD_PLANE_K, qi, hk, y);
    for (unsigned i = 0; i < 4; i++) {
        assert_true(y[i] == (float)qi[i] * kvd_half_to_float(hk[i % 2]));
    }
}

/*
 * int8 K on a partial block: a channel's scale comes from the valid tokens
 * only (garbage beyond them must not widen it), a channel that is zero on
 * every valid token gets scale 1.0, codes of the invalid tokens are 0, and
 * decode writes the valid tokens only.
 */
static void test_int8_k_partial_block(void **state)
{
    (void)state;
    const uint32_t heads = 2, bs = 8, dim = 32, valid = 3;
    kvd_object_format_t fmt = {KVD_DTYPE_FP16,
                               1,
                               2,
                               heads,
                               dim,
                               bs,
                               {KVD_CODEC_INT8, KVD_CODEC_RAW},
                               0};
    uint16_t src[2 * 8 * 32], dst[2 * 8 * 32];
    _Alignas(16) int8_t data[2 * 8 * 32];
    _Alignas(16) uint16_t meta[2 * 32];
    uint64_t s = g_seed ^ 0x99ull;

    assert_int_equal(kvd_object_plane_meta_bytes(&fmt, 0), sizeof(meta));
    for (unsigned i = 0; i < heads * bs * dim; i++) {
        unsigned t = (i / dim) % bs, c = i % dim;
        /* Channel 5 of head 1 is zero on the valid tokens; every invalid
         * token is large. */
        double v = t >= valid                        ? 1000.0
                   : (i / (bs * dim) == 1 && c == 5) ? 0.0
                                                     : kvd_test_gauss(&s);
        src[i] = kvd_float_to_half((float)v);
    }
    memset(data, 0x55, sizeof(data));
    memset(meta, 0x55, sizeof(meta));
    assert_int_equal(
        kvd_ref_plane_encode(&fmt, NULL, 0, src, valid, data, meta), KVD_OK);
    for (uint32_t h = 0; h < heads; h++) {
        for (uint32_t c = 0; c < dim; c++) {
            float amax = 0.0f;
            for (uint32_t t = 0; t < valid; t++) {
                size_t i = ((size_t)h * bs + t) * dim + c;
                amax = fmaxf(amax, fabsf(kvd_half_to_float(src[i])));
            }
            uint16_t want =
                amax == 0.0f ? 0x3c00 : kvd_float_to_half(amax / 127.0f);
            assert_int_equal(meta[h * dim + c], want);
            for (uint32_t t = valid; t < bs; t++) {
                assert_int_equal(data[((size_t)h * bs + t) * dim + c], 0);
            }
        }
    }
    assert_int_equal(meta[dim + 5], 0x3c00);
    for (unsigned i = 0; i < heads * bs * dim; i++) {
        dst[i] = 0xbeef;
    }
    assert_int_equal(
        kvd_ref_plane_decode(&fmt, NULL, 0, data, meta, valid, dst), KVD_OK);
    for (unsigned i = 0; i < heads * bs * dim; i++) {
        unsigned t = (i / dim) % bs;
        if (t >= valid) {
            assert_int_equal(dst[i], 0xbeef);
        } else {
            float a = kvd_half_to_float(src[i]);
            float b = kvd_half_to_float(dst[i]);
            float sc =
                kvd_half_to_float(meta[(i / (bs * dim)) * dim + i % dim]);
            assert_true(fabsf(a - b) <= 0.5f * sc * 1.001f + 1e-3f * fabsf(a));
        }
    }
}

int main(void)
{
    const char *env = getenv("KVDEPOT_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 0)
                 : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    printf("test_kernels_fp8_int8: seed %llu (KVDEPOT_TEST_SEED to replay)\n",
           (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_edge_cases),
        cmocka_unit_test(test_fp8_all_fp16_inputs),
        cmocka_unit_test(test_fp8_all_bf16_inputs),
        cmocka_unit_test(test_fp8_random_floats),
        cmocka_unit_test(test_fp8_decode_round_trips),
        cmocka_unit_test(test_half_bf16_all_patterns),
        cmocka_unit_test(test_half_bf16_rounding),
        cmocka_unit_test(test_quality_gaussian),
        cmocka_unit_test(test_quality_key_like),
        cmocka_unit_test(test_zero_vector_and_partial_block),
        cmocka_unit_test(test_codec_arithmetic),
        cmocka_unit_test(test_int8_k_partial_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
