/*
 * RoPE re-rotation of reused keys (kvdepot/kernels.h, "Rotary position
 * re-rotation"): kvd_rope_check, kvd_rope_inv_freq and
 * kvd_ref_rope_shift_layer.
 *
 * The oracle is written here, independently, from HF transformers'
 * formulas: inv_freq per rope_type (default, "linear", "llama3"), then
 * rotate_half (NEOX) or the interleaved rotation (GPT-J) with partial
 * rotary, computed in long double (64-bit mantissa on x86-64) so that the
 * reference angle of a 2^40 position is still good to ~1e-7 rad. Raw
 * key-like vectors are rotated to position q, rounded into an fp16 or bf16
 * paged cache, shifted by delta with the library, and compared with the
 * same raw vectors rotated to q + delta and rounded: every rotated element
 * within the tolerance of test_tolerance, every other cache byte (pass-
 * through channels, tokens past a partial block's valid count, the V
 * plane, other layers and blocks, delta-0 blocks) unchanged bit for bit.
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

#include "tests/unit/kvd_testcache_int.h"
#include "tests/unit/kvd_testdata_int.h"

#include "kernels/ref/ref.h"
#include "kvdepot/kernels.h"

#define TEST_LAYERS 2u
#define TEST_LAYER 1u /* the layer shifted; layer 0 must not move */
#define TEST_BLOCKS 6u
#define TEST_BS 16u
#define TEST_HEADS 2u
#define TEST_LISTED 3u
#define TEST_VALID_LAST 5u
#define TEST_SENTINEL 0x5a5au
#define TEST_MAX_DIM 256u

static uint64_t g_seed;
static const int32_t test_ids[TEST_LISTED] = {4, 0, 2};

/* ---- HF's formulas, written out -------------------------------------- */

/* transformers' rope_init_fns: _compute_default_rope_parameters (dim =
 * head_dim * partial_rotary_factor = rotary_dim), then "linear" divides by
 * factor and "llama3" is _compute_llama3_parameters, vectorized in HF and
 * transcribed here mask by mask. */
static void hf_inv_freq(const kvd_rope_t *r, double *out)
{
    unsigned half = r->rotary_dim / 2;
    for (unsigned i = 0; i < half; i++) {
        double exponent = (double)(2 * i) / (double)r->rotary_dim;
        out[i] = 1.0 / pow(r->base, exponent);
    }
    if (r->scaling == KVD_ROPE_SCALING_LINEAR) {
        for (unsigned i = 0; i < half; i++) {
            out[i] /= r->factor;
        }
    } else if (r->scaling == KVD_ROPE_SCALING_LLAMA3) {
        double old_context_len = (double)r->original_max_position;
        double low_freq_wavelen = old_context_len / r->low_freq_factor;
        double high_freq_wavelen = old_context_len / r->high_freq_factor;
        for (unsigned i = 0; i < half; i++) {
            double wavelen = 2 * M_PI / out[i];
            double inv_freq_llama =
                wavelen > low_freq_wavelen ? out[i] / r->factor : out[i];
            double smooth_factor =
                (old_context_len / wavelen - r->low_freq_factor) /
                (r->high_freq_factor - r->low_freq_factor);
            double smoothed = (1 - smooth_factor) * inv_freq_llama / r->factor +
                              smooth_factor * inv_freq_llama;
            int is_medium =
                !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
            out[i] = is_medium ? smoothed : inv_freq_llama;
        }
    }
}

/* x rotated to position pos: HF's q * cos + rotate_half(q) * sin on the
 * first rotary_dim channels (NEOX: halves; GPT-J: rotate_every_two), the
 * rest passed through. */
static void hf_rotate(const kvd_rope_t *r, const double *inv_freq, int64_t pos,
                      const double *x, double *out)
{
    unsigned half = r->rotary_dim / 2;
    memcpy(out, x, sizeof(double) * r->head_dim);
    for (unsigned i = 0; i < half; i++) {
        long double ang =
            fmodl((long double)pos * (long double)inv_freq[i], 2.0L * M_PIl);
        long double c = cosl(ang), s = sinl(ang);
        unsigned a = r->style == KVD_ROPE_NEOX ? i : 2 * i;
        unsigned b = r->style == KVD_ROPE_NEOX ? i + half : 2 * i + 1;
        out[a] = (double)((long double)x[a] * c - (long double)x[b] * s);
        out[b] = (double)((long double)x[b] * c + (long double)x[a] * s);
    }
}

/* ---- elements ---------------------------------------------------------- */

static uint16_t to_elt(kvd_dtype_t dtype, double v)
{
    return dtype == KVD_DTYPE_BF16 ? kvd_float_to_bf16((float)v)
                                   : kvd_float_to_half((float)v);
}

static double from_elt(kvd_dtype_t dtype, const unsigned char *p)
{
    uint16_t u;
    memcpy(&u, p, 2);
    return dtype == KVD_DTYPE_BF16 ? kvd_bf16_to_float(u)
                                   : kvd_half_to_float(u);
}

/*
 * Allowed |result - expected| for a pair of length `len` (of the raw
 * vector; rotations keep it). With m = 10 mantissa bits for fp16, 7 for
 * bf16, a rounded element is within 2^-(m+1) of its value relative to the
 * pair's length. The stored pair carries that error (at most 2^-(m+1) len
 * as a pair, and the exact rotation keeps it), the library's float
 * arithmetic adds 2^-22 len (kernels.h), its final rounding and the
 * rounding of the expected value 2^-(m+1) len each: 1.5 * 2^-m len plus
 * noise, under the 2 * 2^-m len allowed (2 ulp of the dtype at the pair's
 * length). 2^-24 covers fp16's subnormal steps near 0.
 */
static double test_tolerance(kvd_dtype_t dtype, double len)
{
    int m = dtype == KVD_DTYPE_BF16 ? 7 : 10;
    return ldexp(len, 1 - m) + 0x1p-24;
}

/* ---- one case ---------------------------------------------------------- */

typedef struct rope_case {
    const char *name;
    engine_layout_t kind;
    kvd_dtype_t dtype;
    kvd_rope_t rope;
    int64_t pos; /* position of the first listed block's token 0 */
    int64_t delta[TEST_LISTED];
} rope_case_t;

/* Position of token t of listed block i before the shift: blocks lie
 * 1000 positions apart, not adjacent, as reused chunks may. */
static int64_t test_pos(const rope_case_t *rc, unsigned i, unsigned t)
{
    return rc->pos + (int64_t)i * 1000 + t;
}

static unsigned test_valid(unsigned i)
{
    return i + 1 == TEST_LISTED ? TEST_VALID_LAST : TEST_BS;
}

static unsigned char *elt_at(const test_cache_t *c, uint32_t l, uint32_t p,
                             uint32_t b, uint32_t t, uint32_t h, uint32_t ch)
{
    return c->mem + flat_index(c, l, p, b, t, h, ch) * c->elt;
}

/* Random values everywhere, then the listed blocks' K rows of TEST_LAYER:
 * raw key-like vectors rotated to their positions (raw[i][h][t][ch] kept),
 * and the sentinel in the partial block's tokens past the valid count. */
static void test_fill(test_cache_t *c, const rope_case_t *rc, double *raw,
                      uint64_t *s)
{
    const kvd_rope_t *r = &rc->rope;
    double inv_freq[TEST_MAX_DIM / 2], rot[TEST_MAX_DIM];
    double std[TEST_MAX_DIM], off[TEST_MAX_DIM];

    for (size_t e = 0; e < c->bytes / 2; e++) {
        uint16_t u = to_elt(rc->dtype, kvd_test_gauss(s));
        memcpy(c->mem + 2 * e, &u, 2);
    }
    hf_inv_freq(r, inv_freq);
    kvd_test_channel_model(1, r->head_dim, s, std, off);
    for (unsigned i = 0; i < TEST_LISTED; i++) {
        for (unsigned h = 0; h < TEST_HEADS; h++) {
            for (unsigned t = 0; t < TEST_BS; t++) {
                double *x = raw + ((i * TEST_HEADS + h) * TEST_BS + t) *
                                      (size_t)r->head_dim;
                for (unsigned ch = 0; ch < r->head_dim; ch++) {
                    x[ch] = off[ch] + std[ch] * kvd_test_gauss(s);
                }
                hf_rotate(r, inv_freq, test_pos(rc, i, t), x, rot);
                for (unsigned ch = 0; ch < r->head_dim; ch++) {
                    uint16_t u = t < test_valid(i) ? to_elt(rc->dtype, rot[ch])
                                                   : TEST_SENTINEL;
                    memcpy(elt_at(c, TEST_LAYER, 0, (uint32_t)test_ids[i], t, h,
                                  ch),
                           &u, 2);
                }
            }
        }
    }
}

/* Checks the rotated elements of listed block i against the oracle and
 * marks them in `moved`; returns the largest error / tolerance. */
static double test_check_block(const test_cache_t *c, const rope_case_t *rc,
                               const double *raw, unsigned i,
                               unsigned char *moved)
{
    const kvd_rope_t *r = &rc->rope;
    unsigned half = r->rotary_dim / 2;
    double inv_freq[TEST_MAX_DIM / 2], want[TEST_MAX_DIM];
    double worst = 0.0;

    hf_inv_freq(r, inv_freq);
    for (unsigned h = 0; h < TEST_HEADS; h++) {
        for (unsigned t = 0; t < test_valid(i); t++) {
            const double *x = raw + ((i * TEST_HEADS + h) * TEST_BS + t) *
                                        (size_t)r->head_dim;
            hf_rotate(r, inv_freq, test_pos(rc, i, t) + rc->delta[i], x, want);
            for (unsigned j = 0; j < half; j++) {
                unsigned ch[2] = {r->style == KVD_ROPE_NEOX ? j : 2 * j,
                                  r->style == KVD_ROPE_NEOX ? j + half
                                                            : 2 * j + 1};
                double tol =
                    test_tolerance(rc->dtype, hypot(x[ch[0]], x[ch[1]]));
                for (unsigned k = 0; k < 2; k++) {
                    const unsigned char *p = elt_at(
                        c, TEST_LAYER, 0, (uint32_t)test_ids[i], t, h, ch[k]);
                    uint16_t u = to_elt(rc->dtype, want[ch[k]]);
                    double want_elt =
                        from_elt(rc->dtype, (const unsigned char *)&u);
                    double err = fabs(from_elt(rc->dtype, p) - want_elt);
                    worst = fmax(worst, err / tol);
                    memset(moved + (p - c->mem), 1, 2);
                }
            }
        }
    }
    return worst;
}

static void run_case(const rope_case_t *rc)
{
    uint64_t s = g_seed;
    test_cache_t c;
    cache_init(&c, rc->kind, 2, TEST_LAYERS, TEST_BLOCKS, TEST_BS, TEST_HEADS,
               rc->rope.head_dim);
    kvd_object_format_t fmt = cache_format(&c, rc->dtype, KVD_CODEC_RAW);
    double *raw = malloc(sizeof(double) * TEST_LISTED * TEST_HEADS * TEST_BS *
                         rc->rope.head_dim);
    unsigned char *before = malloc(c.bytes);
    unsigned char *moved = calloc(1, c.bytes);
    assert_true(raw != NULL && before != NULL && moved != NULL);
    test_fill(&c, rc, raw, &s);
    memcpy(before, c.mem, c.bytes);

    assert_int_equal(kvd_ref_rope_shift_layer(&c.layout, &fmt, &rc->rope,
                                              TEST_LAYER, test_ids, rc->delta,
                                              TEST_LISTED, TEST_VALID_LAST),
                     KVD_OK);

    double worst = 0.0;
    for (unsigned i = 0; i < TEST_LISTED; i++) {
        if (rc->delta[i] != 0) {
            worst = fmax(worst, test_check_block(&c, rc, raw, i, moved));
        }
    }
    size_t changed = 0, stray = 0;
    for (size_t b = 0; b < c.bytes; b++) {
        changed += c.mem[b] != before[b];
        stray += !moved[b] && c.mem[b] != before[b];
    }
    printf("%-28s worst error %.3f of tolerance, %zu bytes changed\n", rc->name,
           worst, changed);
    assert_true(worst <= 1.0);
    assert_int_equal(stray, 0);
    int any_delta = rc->delta[0] != 0 || rc->delta[1] != 0 || rc->delta[2] != 0;
    assert_true(any_delta ? changed > 0 : changed == 0);
    free(moved);
    free(before);
    free(raw);
    cache_cleanup(&c);
}

/* ---- configurations ---------------------------------------------------- */

static kvd_rope_t rope_plain(kvd_rope_style_t style, uint32_t dim,
                             uint32_t rotary_dim)
{
    kvd_rope_t r = {.head_dim = dim,
                    .rotary_dim = rotary_dim,
                    .style = style,
                    .base = 10000.0,
                    .scaling = KVD_ROPE_SCALING_NONE};
    return r;
}

/* Llama 3.1: rope_theta 500000, llama3 scaling factor 8, low 1, high 4,
 * original_max_position_embeddings 8192. */
static kvd_rope_t rope_llama31(uint32_t dim)
{
    kvd_rope_t r = {.head_dim = dim,
                    .rotary_dim = dim,
                    .style = KVD_ROPE_NEOX,
                    .base = 500000.0,
                    .scaling = KVD_ROPE_SCALING_LLAMA3,
                    .factor = 8.0,
                    .low_freq_factor = 1.0,
                    .high_freq_factor = 4.0,
                    .original_max_position = 8192};
    return r;
}

static kvd_rope_t rope_linear(kvd_rope_style_t style, uint32_t dim,
                              uint32_t rotary_dim, double factor)
{
    kvd_rope_t r = rope_plain(style, dim, rotary_dim);
    r.scaling = KVD_ROPE_SCALING_LINEAR;
    r.factor = factor;
    return r;
}

static void test_neox_full(void **state)
{
    (void)state;
    rope_case_t a = {"neox fp16 nhd +",
                     LAYOUT_VLLM_NHD,
                     KVD_DTYPE_FP16,
                     rope_plain(KVD_ROPE_NEOX, 128, 128),
                     100,
                     {37, 512, 3}};
    rope_case_t b = {"neox bf16 nhd -",
                     LAYOUT_VLLM_NHD,
                     KVD_DTYPE_BF16,
                     rope_plain(KVD_ROPE_NEOX, 128, 128),
                     5000,
                     {-53, -4000, -1}};
    rope_case_t d = {"neox fp16 hnd mixed",
                     LAYOUT_VLLM_HND,
                     KVD_DTYPE_FP16,
                     rope_plain(KVD_ROPE_NEOX, 64, 64),
                     2000,
                     {250, 0, -1999}};
    run_case(&a);
    run_case(&b);
    run_case(&d);
}

static void test_gptj(void **state)
{
    (void)state;
    rope_case_t a = {"gptj fp16 hnd +",
                     LAYOUT_VLLM_HND,
                     KVD_DTYPE_FP16,
                     rope_plain(KVD_ROPE_GPTJ, 64, 64),
                     10,
                     {1000, 7, 64}};
    rope_case_t b = {"gptj bf16 nhd -",
                     LAYOUT_VLLM_NHD,
                     KVD_DTYPE_BF16,
                     rope_plain(KVD_ROPE_GPTJ, 128, 128),
                     3000,
                     {-2500, -17, -3000}};
    run_case(&a);
    run_case(&b);
}

/* rotary_dim = head_dim / 4 (GPT-J's 64 of 256, GPT-NeoX's 25%): the other
 * channels must keep their bytes, which run_case checks. */
static void test_partial_rotary(void **state)
{
    (void)state;
    rope_case_t a = {"neox fp16 nhd rot 1/4",
                     LAYOUT_VLLM_NHD,
                     KVD_DTYPE_FP16,
                     rope_plain(KVD_ROPE_NEOX, 128, 32),
                     40,
                     {17, 300, -20}};
    rope_case_t b = {"gptj bf16 hnd rot 1/4",
                     LAYOUT_VLLM_HND,
                     KVD_DTYPE_BF16,
                     rope_plain(KVD_ROPE_GPTJ, 256, 64),
                     700,
                     {-300, 90, 1}};
    rope_case_t d = {"gptj fp16 padded rot 1/4",
                     LAYOUT_HND_PADDED,
                     KVD_DTYPE_FP16,
                     rope_plain(KVD_ROPE_GPTJ, 64, 16),
                     0,
                     {33, 1, 4096}};
    run_case(&a);
    run_case(&b);
    run_case(&d);
}

static void test_scaling(void **state)
{
    (void)state;
    rope_case_t a = {"linear x4 neox fp16",
                     LAYOUT_VLLM_NHD,
                     KVD_DTYPE_FP16,
                     rope_linear(KVD_ROPE_NEOX, 128, 128, 4.0),
                     100,
                     {-90, 777, 31}};
    rope_case_t b = {"linear x2.5 gptj bf16 1/4",
                     LAYOUT_VLLM_HND,
                     KVD_DTYPE_BF16,
                     rope_linear(KVD_ROPE_GPTJ, 128, 32, 2.5),
                     900,
                     {-300, 12, 20000}};
    rope_case_t d = {"llama3.1 fp16",
                     LAYOUT_VLLM_NHD,
                     KVD_DTYPE_FP16,
                     rope_llama31(128),
                     5000,
                     {5000, -4999, 70000}};
    rope_case_t e = {"llama3.1 bf16 hnd", LAYOUT_VLLM_HND, KVD_DTYPE_BF16,
                     rope_llama31(128),   20000,           {-19000, 8192, 1}};
    run_case(&a);
    run_case(&b);
    run_case(&d);
    run_case(&e);
}

/* Positions of a million tokens moved by three million, and moves of 2^40
 * and 2^52: the angle reduction must keep full accuracy (the oracle runs
 * in long double). */
static void test_large_delta(void **state)
{
    (void)state;
    rope_case_t a = {"large neox fp16", LAYOUT_VLLM_NHD,
                     KVD_DTYPE_FP16,    rope_plain(KVD_ROPE_NEOX, 128, 128),
                     1000000,           {3000000, -1000000, 3000001}};
    rope_case_t b = {
        "large llama3.1 bf16", LAYOUT_VLLM_HND, KVD_DTYPE_BF16,
        rope_llama31(128),     1000000,         {3000000, 2999999, -999999}};
    rope_case_t d = {
        "2^40 gptj fp16",
        LAYOUT_VLLM_NHD,
        KVD_DTYPE_FP16,
        rope_plain(KVD_ROPE_GPTJ, 64, 64),
        1000,
        {(int64_t)1 << 40, -((int64_t)1 << 40), ((int64_t)1 << 40) + 12345}};
    /* At 2^52 a plain fmod(delta * inv_freq, 2 pi) is off by up to half a
     * radian; the oracle's own error (64-bit product and 2 pi) stays near
     * 4e-4 rad, a fifth of the fp16 tolerance. */
    rope_case_t e = {
        "2^52 neox fp16",
        LAYOUT_VLLM_HND,
        KVD_DTYPE_FP16,
        rope_plain(KVD_ROPE_NEOX, 64, 64),
        -5,
        {(int64_t)1 << 52, 3 - ((int64_t)1 << 52), ((int64_t)1 << 52) - 999}};
    run_case(&a);
    run_case(&b);
    run_case(&d);
    run_case(&e);
}

/* Delta 0 everywhere: not a byte changes (not even rewritten). */
static void test_zero_delta(void **state)
{
    (void)state;
    rope_case_t a = {"zero fp16",
                     LAYOUT_VLLM_NHD,
                     KVD_DTYPE_FP16,
                     rope_plain(KVD_ROPE_NEOX, 128, 128),
                     100,
                     {0, 0, 0}};
    rope_case_t b = {"zero llama bf16",
                     LAYOUT_VLLM_HND,
                     KVD_DTYPE_BF16,
                     rope_llama31(128),
                     100,
                     {0, 0, 0}};
    run_case(&a);
    run_case(&b);
}

/* ---- frequencies ------------------------------------------------------- */

static void expect_inv_freq(const kvd_rope_t *r)
{
    double want[TEST_MAX_DIM / 2], got[TEST_MAX_DIM / 2 + 1];
    hf_inv_freq(r, want);
    got[r->rotary_dim / 2] = -1.0; /* must stay: rotary_dim/2 written */
    assert_int_equal(kvd_rope_inv_freq(r, got), KVD_OK);
    for (unsigned i = 0; i < r->rotary_dim / 2; i++) {
        assert_true(fabs(got[i] - want[i]) <= 1e-12 * want[i]);
    }
    assert_true(got[r->rotary_dim / 2] == -1.0);
}

static void test_inv_freq(void **state)
{
    (void)state;
    kvd_rope_t r = rope_plain(KVD_ROPE_NEOX, 128, 128);
    expect_inv_freq(&r);
    r = rope_plain(KVD_ROPE_GPTJ, 256, 64);
    expect_inv_freq(&r);
    r = rope_linear(KVD_ROPE_NEOX, 80, 20, 2.5);
    expect_inv_freq(&r);
    r = rope_llama31(128);
    expect_inv_freq(&r);
    r.factor = 32.0;
    r.original_max_position = 2048;
    r.low_freq_factor = 0.5;
    r.high_freq_factor = 6.0;
    expect_inv_freq(&r);

    /* Spot values that need no formula: pair 0 turns one radian per
     * position; Llama 3.1 keeps it (wavelength 2*pi < 8192/4) and divides
     * the slowest pair (wavelength ~2.3e6 > 8192) by 8. */
    double f[64];
    r = rope_llama31(128);
    assert_int_equal(kvd_rope_inv_freq(&r, f), KVD_OK);
    assert_true(f[0] == 1.0);
    assert_true(fabs(f[63] - pow(500000.0, -126.0 / 128.0) / 8.0) <=
                1e-15 * f[63]);
    r = rope_linear(KVD_ROPE_NEOX, 64, 64, 4.0);
    assert_int_equal(kvd_rope_inv_freq(&r, f), KVD_OK);
    assert_true(f[0] == 0.25);
}

/* ---- errors ------------------------------------------------------------ */

static void expect_rope_check(const kvd_rope_t *r, kvd_status_t want)
{
    char err[160] = "";
    assert_int_equal(kvd_rope_check(r, err, sizeof(err)), want);
    if (want != KVD_OK) {
        assert_true(err[0] != '\0');
        double f[TEST_MAX_DIM];
        assert_int_equal(kvd_rope_inv_freq(r, f), want);
    }
}

static void test_rope_check(void **state)
{
    (void)state;
    kvd_rope_t ok = rope_plain(KVD_ROPE_NEOX, 128, 128);
    expect_rope_check(&ok, KVD_OK);
    assert_int_equal(kvd_rope_check(&ok, NULL, 0), KVD_OK);
    expect_rope_check(NULL, KVD_ERR_INVALID);

    kvd_rope_t r = ok;
    r.rotary_dim = 127; /* odd */
    expect_rope_check(&r, KVD_ERR_INVALID);
    r.rotary_dim = 130; /* > head_dim */
    expect_rope_check(&r, KVD_ERR_INVALID);
    r.rotary_dim = 0;
    expect_rope_check(&r, KVD_ERR_INVALID);
    r = ok;
    r.head_dim = 2048;
    expect_rope_check(&r, KVD_ERR_INVALID);
    r = ok;
    r.base = 1.0;
    expect_rope_check(&r, KVD_ERR_INVALID);
    r.base = NAN;
    expect_rope_check(&r, KVD_ERR_INVALID);
    r.base = INFINITY;
    expect_rope_check(&r, KVD_ERR_INVALID);
    r = ok;
    r.style = (kvd_rope_style_t)2;
    expect_rope_check(&r, KVD_ERR_UNSUPPORTED);
    r = ok;
    r.scaling = (kvd_rope_scaling_t)3; /* e.g. what YaRN would be */
    expect_rope_check(&r, KVD_ERR_UNSUPPORTED);
    r = rope_linear(KVD_ROPE_NEOX, 128, 128, 0.5);
    expect_rope_check(&r, KVD_ERR_INVALID);
    r.factor = NAN;
    expect_rope_check(&r, KVD_ERR_INVALID);
    r = rope_llama31(128);
    r.low_freq_factor = 4.0; /* not below high */
    expect_rope_check(&r, KVD_ERR_INVALID);
    r = rope_llama31(128);
    r.low_freq_factor = 0.0;
    expect_rope_check(&r, KVD_ERR_INVALID);
    r = rope_llama31(128);
    r.original_max_position = 0;
    expect_rope_check(&r, KVD_ERR_INVALID);
    r = rope_llama31(128);
    assert_int_equal(kvd_rope_inv_freq(&r, NULL), KVD_ERR_INVALID);
    /* Scaling fields are ignored without scaling. */
    r = ok;
    r.factor = -3.0;
    r.original_max_position = 0;
    expect_rope_check(&r, KVD_OK);
}

/* A shift call that must fail with `want` and leave every byte alone. */
static void expect_shift_fails(test_cache_t *c, const kvd_object_format_t *fmt,
                               const kvd_rope_t *r, unsigned layer,
                               const int32_t *ids, const int64_t *deltas,
                               size_t n, uint32_t valid, kvd_status_t want)
{
    unsigned char *before = malloc(c->bytes);
    assert_non_null(before);
    memcpy(before, c->mem, c->bytes);
    assert_int_equal(kvd_ref_rope_shift_layer(&c->layout, fmt, r, layer, ids,
                                              deltas, n, valid),
                     want);
    assert_memory_equal(c->mem, before, c->bytes);
    free(before);
}

static void test_shift_errors(void **state)
{
    (void)state;
    uint64_t s = g_seed ^ 0xe7707;
    test_cache_t c;
    cache_init(&c, LAYOUT_VLLM_NHD, 2, TEST_LAYERS, TEST_BLOCKS, TEST_BS,
               TEST_HEADS, 64);
    for (size_t i = 0; i < c.bytes; i++) {
        c.mem[i] = (unsigned char)kvd_test_rng(&s);
    }
    kvd_object_format_t f = cache_format(&c, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_rope_t r = rope_plain(KVD_ROPE_NEOX, 64, 64);
    int32_t ids[2] = {1, 3};
    int64_t d[2] = {5, -5};

    /* The first id is valid: it would have been rotated had the check
     * not come first. */
    int32_t bad_ids[2] = {1, (int32_t)TEST_BLOCKS};
    expect_shift_fails(&c, &f, &r, 1, bad_ids, d, 2, 4, KVD_ERR_RANGE);
    bad_ids[1] = -1;
    expect_shift_fails(&c, &f, &r, 1, bad_ids, d, 2, 4, KVD_ERR_RANGE);

    kvd_rope_t bad = r;
    bad.head_dim = 128; /* the format's is 64 */
    bad.rotary_dim = 128;
    expect_shift_fails(&c, &f, &bad, 1, ids, d, 2, 4, KVD_ERR_INVALID);
    bad = r;
    bad.rotary_dim = 63;
    expect_shift_fails(&c, &f, &bad, 1, ids, d, 2, 4, KVD_ERR_INVALID);
    bad = r;
    bad.rotary_dim = 66;
    expect_shift_fails(&c, &f, &bad, 1, ids, d, 2, 4, KVD_ERR_INVALID);
    bad = r;
    bad.base = 0.5;
    expect_shift_fails(&c, &f, &bad, 1, ids, d, 2, 4, KVD_ERR_INVALID);
    bad = r;
    bad.scaling = (kvd_rope_scaling_t)5;
    expect_shift_fails(&c, &f, &bad, 1, ids, d, 2, 4, KVD_ERR_UNSUPPORTED);
    expect_shift_fails(&c, &f, NULL, 1, ids, d, 2, 4, KVD_ERR_INVALID);
    expect_shift_fails(&c, NULL, &r, 1, ids, d, 2, 4, KVD_ERR_INVALID);
    expect_shift_fails(&c, &f, &r, TEST_LAYERS, ids, d, 2, 4, KVD_ERR_INVALID);
    expect_shift_fails(&c, &f, &r, 1, ids, d, 2, 0, KVD_ERR_INVALID);
    expect_shift_fails(&c, &f, &r, 1, ids, d, 2, TEST_BS + 1, KVD_ERR_INVALID);
    expect_shift_fails(&c, &f, &r, 1, NULL, d, 2, 4, KVD_ERR_INVALID);
    expect_shift_fails(&c, &f, &r, 1, ids, NULL, 2, 4, KVD_ERR_INVALID);
    kvd_object_format_t bad_fmt = f;
    bad_fmt.block_size = 0;
    expect_shift_fails(&c, &bad_fmt, &r, 1, ids, d, 2, 4, KVD_ERR_INVALID);
    kvd_kv_layout_t saved = c.layout;
    c.layout.stride_token = -c.layout.stride_token;
    expect_shift_fails(&c, &f, &r, 1, ids, d, 2, 4, KVD_ERR_INVALID);
    c.layout = saved;
    /* No blocks: nothing to do, NULL arrays allowed. */
    expect_shift_fails(&c, &f, &r, 1, NULL, NULL, 0, 0, KVD_OK);
    assert_int_equal(kvd_ref_rope_shift_layer(NULL, &f, &r, 1, ids, d, 2, 4),
                     KVD_ERR_INVALID);
    cache_cleanup(&c);

    /* An fp8 cache and an MLA latent are refused. */
    cache_init(&c, LAYOUT_VLLM_NHD, 1, TEST_LAYERS, TEST_BLOCKS, TEST_BS,
               TEST_HEADS, 64);
    memset(c.mem, 0x3c, c.bytes);
    f = cache_format(&c, KVD_DTYPE_FP8_E4M3, KVD_CODEC_RAW);
    expect_shift_fails(&c, &f, &r, 1, ids, d, 2, 4, KVD_ERR_UNSUPPORTED);
    f.dtype = KVD_DTYPE_FP8_E5M2;
    expect_shift_fails(&c, &f, &r, 1, ids, d, 2, 4, KVD_ERR_UNSUPPORTED);
    cache_cleanup(&c);
    cache_init(&c, LAYOUT_MLA, 2, TEST_LAYERS, TEST_BLOCKS, TEST_BS, 1, 64);
    memset(c.mem, 0x3c, c.bytes);
    f = cache_format(&c, KVD_DTYPE_BF16, KVD_CODEC_RAW);
    expect_shift_fails(&c, &f, &r, 1, ids, d, 2, 4, KVD_ERR_UNSUPPORTED);
    cache_cleanup(&c);
}

/* A block listed twice turns twice, in order: by the sum of its deltas. */
/* kvd_ref_scatter_layer_rope writes exactly what scatter then shift
 * write, for every codec family and both vLLM layouts, with a delta of 0,
 * negative and large ones and a partial last block; and checks its rope
 * before writing anything. */
static void test_scatter_fused(void **state)
{
    (void)state;
    static const kvd_codec_t codecs[] = {KVD_CODEC_RAW, KVD_CODEC_FP8_E4M3,
                                         KVD_CODEC_INT8, KVD_CODEC_KIVI4,
                                         KVD_CODEC_TQ4};
    static const engine_layout_t kinds[] = {LAYOUT_VLLM_NHD, LAYOUT_VLLM_HND};
    const int64_t deltas[TEST_LISTED] = {-37, 0, 123456789};
    kvd_rope_t r = {.head_dim = 64,
                    .rotary_dim = 64,
                    .style = KVD_ROPE_NEOX,
                    .base = 500000.0,
                    .scaling = KVD_ROPE_SCALING_NONE};
    for (size_t k = 0; k < 2; k++) {
        for (size_t c = 0; c < sizeof codecs / sizeof *codecs; c++) {
            test_cache_t src, a, b;
            cache_init(&src, kinds[k], 2, TEST_LAYERS, TEST_BLOCKS, TEST_BS,
                       TEST_HEADS, 64);
            cache_init(&a, kinds[k], 2, TEST_LAYERS, TEST_BLOCKS, TEST_BS,
                       TEST_HEADS, 64);
            cache_init(&b, kinds[k], 2, TEST_LAYERS, TEST_BLOCKS, TEST_BS,
                       TEST_HEADS, 64);
            uint16_t *e = (uint16_t *)(void *)src.mem;
            uint64_t seed = 17 + c;
            for (size_t i = 0; i < src.bytes / 2; i++) {
                e[i] = kvd_float_to_half((float)kvd_test_gauss(&seed));
            }
            memset(a.mem, 0x33, a.bytes);
            memset(b.mem, 0x33, b.bytes);
            kvd_object_format_t f =
                cache_format(&src, KVD_DTYPE_FP16, codecs[c]);
            kvd_codec_tables_t *tab = NULL;
            assert_int_equal(kvd_codec_tables_create(&f, &tab), KVD_OK);
            size_t bytes = (kvd_object_bytes(&f) + 63) / 64 * 64;
            void *objs[TEST_LISTED];
            for (unsigned i = 0; i < TEST_LISTED; i++) {
                objs[i] = aligned_alloc(64, bytes);
                assert_non_null(objs[i]);
            }
            const int32_t from[TEST_LISTED] = {1, 3, 5};
            for (unsigned i = 0; i < TEST_LISTED; i++) {
                assert_int_equal(kvd_ref_gather_layer(&src.layout, &f, tab,
                                                      TEST_LAYER, &from[i], 1,
                                                      TEST_BS, &objs[i]),
                                 KVD_OK);
            }
            const void *const *o = (const void *const *)objs;
            assert_int_equal(
                kvd_ref_scatter_layer(&a.layout, &f, tab, TEST_LAYER, test_ids,
                                      TEST_LISTED, TEST_VALID_LAST, o),
                KVD_OK);
            assert_int_equal(kvd_ref_rope_shift_layer(
                                 &a.layout, &f, &r, TEST_LAYER, test_ids,
                                 deltas, TEST_LISTED, TEST_VALID_LAST),
                             KVD_OK);
            kvd_rope_t bad = r;
            bad.rotary_dim = 3;
            assert_int_equal(kvd_ref_scatter_layer_rope(
                                 &b.layout, &f, tab, TEST_LAYER, test_ids,
                                 TEST_LISTED, TEST_VALID_LAST, o, &bad, deltas),
                             KVD_ERR_INVALID);
            for (size_t i = 0; i < b.bytes; i++) {
                assert_int_equal(b.mem[i], 0x33); /* nothing written */
            }
            assert_int_equal(kvd_ref_scatter_layer_rope(
                                 &b.layout, &f, tab, TEST_LAYER, test_ids,
                                 TEST_LISTED, TEST_VALID_LAST, o, &r, deltas),
                             KVD_OK);
            if (memcmp(a.mem, b.mem, a.bytes) != 0) {
                fail_msg("%s %s: fused scatter differs from scatter + shift",
                         layout_name(kinds[k]), kvd_codec_name(codecs[c]));
            }
            for (unsigned i = 0; i < TEST_LISTED; i++) {
                free(objs[i]);
            }
            kvd_codec_tables_destroy(tab);
            cache_cleanup(&src);
            cache_cleanup(&a);
            cache_cleanup(&b);
        }
    }
}

static void test_listed_twice(void **state)
{
    (void)state;
    uint64_t s = g_seed ^ 0x2;
    test_cache_t c;
    cache_init(&c, LAYOUT_VLLM_NHD, 2, 1, 2, 4, 1, 32);
    kvd_object_format_t f = cache_format(&c, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_rope_t r = rope_plain(KVD_ROPE_NEOX, 32, 32);
    double inv_freq[16], x[32], want[32];
    hf_inv_freq(&r, inv_freq);
    for (unsigned ch = 0; ch < 32; ch++) {
        x[ch] = kvd_test_gauss(&s);
    }
    for (unsigned t = 0; t < 4; t++) {
        hf_rotate(&r, inv_freq, 10 + t, x, want);
        for (unsigned ch = 0; ch < 32; ch++) {
            uint16_t u = to_elt(KVD_DTYPE_FP16, want[ch]);
            memcpy(elt_at(&c, 0, 0, 1, t, 0, ch), &u, 2);
        }
    }
    int32_t ids[2] = {1, 1};
    int64_t d[2] = {300, -77};
    assert_int_equal(
        kvd_ref_rope_shift_layer(&c.layout, &f, &r, 0, ids, d, 2, 4), KVD_OK);
    for (unsigned t = 0; t < 4; t++) {
        hf_rotate(&r, inv_freq, 10 + t + 300 - 77, x, want);
        for (unsigned j = 0; j < 16; j++) {
            /* Two roundings of the stored pair: one more 2^-11 allowed. */
            double tol =
                1.5 * test_tolerance(KVD_DTYPE_FP16, hypot(x[j], x[j + 16]));
            for (unsigned k = 0; k < 2; k++) {
                unsigned ch = j + 16 * k;
                double got =
                    from_elt(KVD_DTYPE_FP16, elt_at(&c, 0, 0, 1, t, 0, ch));
                assert_true(fabs(got - want[ch]) <= tol);
            }
        }
    }
    cache_cleanup(&c);
}

int main(void)
{
    const char *env = getenv("KVDEPOT_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 0)
                 : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    printf("test_kernels_rope: seed %llu (KVDEPOT_TEST_SEED to replay)\n",
           (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inv_freq),
        cmocka_unit_test(test_rope_check),
        cmocka_unit_test(test_neox_full),
        cmocka_unit_test(test_gptj),
        cmocka_unit_test(test_partial_rotary),
        cmocka_unit_test(test_scaling),
        cmocka_unit_test(test_large_delta),
        cmocka_unit_test(test_zero_delta),
        cmocka_unit_test(test_listed_twice),
        cmocka_unit_test(test_scatter_fused),
        cmocka_unit_test(test_shift_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
