/*
 * KIVI codec (arXiv 2402.02750; docs/codecs.md, "kivi4, kivi2"): asymmetric
 * min/max quantization to 4 or 2 bits. K is quantized per channel over the
 * block's valid tokens (keys have outlier channels, and a channel's range
 * is narrow across tokens); V per token over groups of 32 channels.
 *
 * Each group stores (fp16 scale, fp16 min). Both are rounded to fp16
 * *before* they are used, and the scale is computed from the rounded min,
 * so the stored pair is all decode needs and a GPU encoder doing the same
 * float operations produces the same bytes:
 *   mn = fp16(min), s = fp16((max - mn) / L), L = 2^bits - 1,
 *   q  = clamp(rintf((x - mn) / s), 0, L),  decode x = q * s + mn.
 * Rounding mn can move it above the true min and rounding s can shrink the
 * range, which is why q is clamped at both ends. When s rounds to 0 (a
 * constant group, or a range below the smallest fp16 subnormal times L)
 * every code is 0 and decode gives mn: the division is skipped, never
 * performed by 0.
 *
 * Limits: values from fp16 caches always fit (min is exactly an fp16 and
 * (max - min) / 3 <= 131008 / 3 < 65504). A bf16 group beyond fp16 range
 * saturates mn and s to +-65504 rather than storing Inf, so it decodes
 * clipped but finite. NaN inputs are skipped by min/max and encode as
 * code 0.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "kernels/ref/ref.h"

#define KVD_KIVI_V_GROUP 32u
#define KVD_HALF_MAX_BITS 0x7bffu /* 65504 */

/* fp16 of f, with overflow saturated to the largest finite value. */
static uint16_t kvd_kivi_half_sat(float f)
{
    uint16_t h = kvd_float_to_half(f);
    if ((h & 0x7fffu) == 0x7c00u) {
        h = (uint16_t)((h & 0x8000u) | KVD_HALF_MAX_BITS);
    }
    return h;
}

/* A group's parameters as stored and as used. */
typedef struct kvd_kivi_param {
    uint16_t scale_fp16, min_fp16;
    float scale, min;
} kvd_kivi_param_t;

/* Parameters for the `n` values x[0], x[stride], ... */
static kvd_kivi_param_t kvd_kivi_param(const float *x, size_t n, size_t stride,
                                       unsigned levels)
{
    float lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        /* fminf/fmaxf ignore a NaN operand. */
        lo = fminf(lo, x[i * stride]);
        hi = fmaxf(hi, x[i * stride]);
    }
    kvd_kivi_param_t p;
    if (!(lo <= hi)) {
        /* Every value was NaN: an all-zero group. */
        lo = hi = 0.0f;
    }
    p.min_fp16 = kvd_kivi_half_sat(lo);
    p.min = kvd_half_to_float(p.min_fp16);
    p.scale_fp16 = kvd_kivi_half_sat((hi - p.min) / (float)levels);
    p.scale = kvd_half_to_float(p.scale_fp16);
    if (!(p.scale > 0.0f)) {
        /* A negative range (hi below the rounded min, bf16 input only) or
         * -0: a constant group, stored as scale +0. */
        p.scale_fp16 = 0;
        p.scale = 0.0f;
    }
    return p;
}

static unsigned kvd_kivi_code(float x, const kvd_kivi_param_t *p,
                              unsigned levels)
{
    if (p->scale == 0.0f) {
        return 0;
    }
    float q = rintf((x - p->min) / p->scale);
    /* NaN must not reach the float -> unsigned conversion. */
    if (!(q > 0.0f)) {
        return 0;
    }
    return q >= (float)levels ? levels : (unsigned)q;
}

/* Codes are packed LSB-first over the whole plane: value i at bit
 * (i*bits) % 8 of byte (i*bits) / 8. bits divides 8, so no code straddles
 * a byte. */
static void kvd_kivi_put(uint8_t *data, size_t i, unsigned bits, unsigned q)
{
    size_t bit = i * bits;
    data[bit / 8] |= (uint8_t)(q << (bit % 8));
}

static unsigned kvd_kivi_get(const uint8_t *data, size_t i, unsigned bits)
{
    size_t bit = i * bits;
    return (data[bit / 8] >> (bit % 8)) & ((1u << bits) - 1u);
}

static float kvd_kivi_value(unsigned q, float scale, float min)
{
    return (float)q * scale + min;
}

/* K: one (scale, min) per (head, channel) over the valid tokens. */
static void kvd_kivi_encode_k(const kvd_plane_dims_t *d, unsigned bits,
                              const float *x, uint8_t *data, uint16_t *meta)
{
    unsigned levels = (1u << bits) - 1u;

    for (uint32_t h = 0; h < d->heads; h++) {
        size_t head = (size_t)h * d->block_size * d->head_dim;
        for (uint32_t c = 0; c < d->head_dim; c++) {
            uint16_t *m = meta + ((size_t)h * d->head_dim + c) * 2;
            if (d->valid == 0) {
                m[0] = m[1] = 0;
                continue;
            }
            kvd_kivi_param_t p =
                kvd_kivi_param(x + head + c, d->valid, d->head_dim, levels);
            m[0] = p.scale_fp16;
            m[1] = p.min_fp16;
            for (uint32_t t = 0; t < d->valid; t++) {
                size_t i = head + (size_t)t * d->head_dim + c;
                kvd_kivi_put(data, i, bits, kvd_kivi_code(x[i], &p, levels));
            }
        }
    }
}

/* V: one (scale, min) per (head, token, group of 32 channels). */
static void kvd_kivi_encode_v(const kvd_plane_dims_t *d, unsigned bits,
                              const float *x, uint8_t *data, uint16_t *meta)
{
    unsigned levels = (1u << bits) - 1u;
    uint32_t groups = d->head_dim / KVD_KIVI_V_GROUP;

    for (uint32_t h = 0; h < d->heads; h++) {
        for (uint32_t t = 0; t < d->block_size; t++) {
            size_t v = (size_t)h * d->block_size + t;
            for (uint32_t g = 0; g < groups; g++) {
                uint16_t *m = meta + (v * groups + g) * 2;
                size_t first = v * d->head_dim + g * KVD_KIVI_V_GROUP;
                if (t >= d->valid) {
                    m[0] = m[1] = 0;
                    continue;
                }
                kvd_kivi_param_t p =
                    kvd_kivi_param(x + first, KVD_KIVI_V_GROUP, 1, levels);
                m[0] = p.scale_fp16;
                m[1] = p.min_fp16;
                for (uint32_t c = 0; c < KVD_KIVI_V_GROUP; c++) {
                    kvd_kivi_put(data, first + c, bits,
                                 kvd_kivi_code(x[first + c], &p, levels));
                }
            }
        }
    }
}

void kvd_ref_kivi_encode(const kvd_plane_dims_t *d, unsigned bits,
                         kvd_plane_t plane, const float *x, uint8_t *data,
                         uint16_t *meta)
{
    assert(bits == 2 || bits == 4);
    size_t n = (size_t)d->heads * d->block_size * d->head_dim;

    /* Codes are OR-ed in, and tokens >= valid must read as code 0. */
    memset(data, 0, (n * bits + 7) / 8);
    if (plane == KVD_PLANE_K) {
        kvd_kivi_encode_k(d, bits, x, data, meta);
    } else {
        assert(d->head_dim % KVD_KIVI_V_GROUP == 0);
        kvd_kivi_encode_v(d, bits, x, data, meta);
    }
}

void kvd_ref_kivi_decode(const kvd_plane_dims_t *d, unsigned bits,
                         kvd_plane_t plane, const uint8_t *data,
                         const uint16_t *meta, float *x)
{
    assert(bits == 2 || bits == 4);
    uint32_t groups = d->head_dim / KVD_KIVI_V_GROUP;

    for (uint32_t h = 0; h < d->heads; h++) {
        for (uint32_t t = 0; t < d->valid; t++) {
            size_t v = (size_t)h * d->block_size + t;
            for (uint32_t c = 0; c < d->head_dim; c++) {
                const uint16_t *m =
                    plane == KVD_PLANE_K
                        ? meta + ((size_t)h * d->head_dim + c) * 2
                        : meta + (v * groups + c / KVD_KIVI_V_GROUP) * 2;
                size_t i = v * d->head_dim + c;
                x[i] = kvd_kivi_value(kvd_kivi_get(data, i, bits),
                                      kvd_half_to_float(m[0]),
                                      kvd_half_to_float(m[1]));
            }
        }
    }
}
