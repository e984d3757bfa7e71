/*
 * Symmetric int8 codec (docs/codecs.md, "int8"): the V plane keeps one fp16
 * scale per (head, token) vector ("int8_tokhead"); the K plane (and the MLA
 * latent) keeps one fp16 scale per (head, channel) over the block's valid
 * tokens ("int8_chan"). Keys have outlier channels: a per-vector step
 * amax/127 is set by the largest channel and costs the others (relative MSE
 * 1.3e-4..6e-4 on key-like data), while a per-channel step follows each
 * channel's own range (2e-5..3e-5), for 16 bytes more per token at
 * head_dim 128 and block_size 16. The same split as KIVI's.
 *
 * The scale is rounded to fp16 *before* it is used to quantize, so encode
 * and decode see the same scale and the stored fp16 is the whole truth.
 * Codes are clamped to [-127, 127]: -128 has no positive twin, and a
 * symmetric range keeps decode(-q) == -decode(q). A zero scale (all-zero
 * group, or amax so small that amax/127 rounds to fp16 zero) becomes 1.0, so
 * decode never multiplies a code by 0 that encode did not intend. Rounding is
 * rintf, i.e. the current mode, which is round-to-nearest-even in every
 * kvdepot process (nothing calls fesetround); a GPU kernel must round the
 * same way (__float2int_rn) and divide rather than multiply by a reciprocal
 * to stay bit-exact.
 *
 * Limits: a bf16 group with amax above 65504 * 127 overflows the fp16
 * scale to Inf and decodes to NaN; fp16 caches cannot reach that.
 */
#include <math.h>

#include "kernels/ref/ref.h"

#define KVD_INT8_QMAX 127.0f
#define KVD_HALF_ONE 0x3c00u

/* The stored scale of a group whose largest magnitude is `amax`. */
static uint16_t kvd_int8_scale(float amax)
{
    uint16_t s16 = kvd_float_to_half(amax / KVD_INT8_QMAX);
    return kvd_half_to_float(s16) == 0.0f ? KVD_HALF_ONE : s16;
}

static int8_t kvd_int8_code(float x, float s)
{
    float q = rintf(x / s);
    /* NaN must not reach the float->int conversion, where it is undefined
     * behaviour; it encodes as 0. */
    if (isnan(q)) {
        q = 0.0f;
    } else if (q > KVD_INT8_QMAX) {
        q = KVD_INT8_QMAX;
    } else if (q < -KVD_INT8_QMAX) {
        q = -KVD_INT8_QMAX;
    }
    return (int8_t)q;
}

/* V: one scale per (head, token); invalid tokens get scale 0, codes 0. */
static void kvd_int8_encode_tok(const kvd_plane_dims_t *d, const float *x,
                                int8_t *data, uint16_t *scale_fp16)
{
    for (uint32_t h = 0; h < d->heads; h++) {
        for (uint32_t t = 0; t < d->valid; t++) {
            size_t v = (size_t)h * d->block_size + t;
            const float *xv = x + v * d->head_dim;
            float amax = 0.0f;
            for (uint32_t c = 0; c < d->head_dim; c++) {
                amax = fmaxf(amax, fabsf(xv[c]));
            }
            uint16_t s16 = kvd_int8_scale(amax);
            float s = kvd_half_to_float(s16);
            for (uint32_t c = 0; c < d->head_dim; c++) {
                data[v * d->head_dim + c] = kvd_int8_code(xv[c], s);
            }
            scale_fp16[v] = s16;
        }
    }
}

/* K: one scale per (head, channel) over the valid tokens; codes of invalid
 * tokens stay 0. */
static void kvd_int8_encode_chan(const kvd_plane_dims_t *d, const float *x,
                                 int8_t *data, uint16_t *scale_fp16)
{
    for (uint32_t h = 0; h < d->heads; h++) {
        const float *xh = x + (size_t)h * d->block_size * d->head_dim;
        int8_t *qh = data + (size_t)h * d->block_size * d->head_dim;
        for (uint32_t c = 0; c < d->head_dim; c++) {
            float amax = 0.0f;
            for (uint32_t t = 0; t < d->valid; t++) {
                amax = fmaxf(amax, fabsf(xh[(size_t)t * d->head_dim + c]));
            }
            uint16_t s16 = kvd_int8_scale(amax);
            float s = kvd_half_to_float(s16);
            for (uint32_t t = 0; t < d->valid; t++) {
                size_t i = (size_t)t * d->head_dim + c;
                qh[i] = kvd_int8_code(xh[i], s);
            }
            scale_fp16[(size_t)h * d->head_dim + c] = s16;
        }
    }
}

void kvd_ref_int8_encode(const kvd_plane_dims_t *d, kvd_plane_t plane,
                         const float *x, int8_t *data, uint16_t *scale_fp16)
{
    /* plane.c zeroed both regions: what is not written here stays 0. */
    if (plane == KVD_PLANE_K) {
        kvd_int8_encode_chan(d, x, data, scale_fp16);
    } else {
        kvd_int8_encode_tok(d, x, data, scale_fp16);
    }
}

void kvd_ref_int8_decode(const kvd_plane_dims_t *d, kvd_plane_t plane,
                         const int8_t *data, const uint16_t *scale_fp16,
                         float *x)
{
    for (uint32_t h = 0; h < d->heads; h++) {
        for (uint32_t t = 0; t < d->valid; t++) {
            size_t v = (size_t)h * d->block_size + t;
            for (uint32_t c = 0; c < d->head_dim; c++) {
                size_t m =
                    plane == KVD_PLANE_K ? (size_t)h * d->head_dim + c : v;
                size_t i = v * d->head_dim + c;
                x[i] = (float)data[i] * kvd_half_to_float(scale_fp16[m]);
            }
        }
    }
}
