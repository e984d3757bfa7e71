/*
 * Symmetric int8 codec with one fp16 scale per (head, token) vector
 * (quant-kernels.md §8.3, "int8_tokhead").
 *
 * The scale is rounded to fp16 *before* it is used to quantize, so encode
 * and decode see the same scale and the stored fp16 is the whole truth.
 * Codes are clamped to [-127, 127]: -128 has no positive twin, and a
 * symmetric range keeps decode(-q) == -decode(q). A zero scale (all-zero
 * vector, or amax so small that amax/127 rounds to fp16 zero) becomes 1.0, so
 * decode never multiplies a code by 0 that encode did not intend. Rounding is
 * rintf, i.e. the current mode, which is round-to-nearest-even in every
 * kvdepot process (nothing calls fesetround); a GPU kernel must round the
 * same way (__float2int_rn) and divide rather than multiply by a reciprocal
 * to stay bit-exact.
 *
 * Limits: a bf16 vector with amax above 65504 * 127 overflows the fp16
 * scale to Inf and decodes to NaN; fp16 caches cannot reach that.
 */
#include <math.h>

#include "kernels/ref/ref_int.h"

#define KVD_INT8_QMAX 127.0f
#define KVD_HALF_ONE 0x3c00u

void kvd_ref_int8_encode(const kvd_plane_dims_t *d, const float *x,
                         int8_t *data, uint16_t *scale_fp16)
{
    for (uint32_t h = 0; h < d->heads; h++) {
        for (uint32_t t = 0; t < d->block_size; t++) {
            size_t v = (size_t)h * d->block_size + t;
            const float *xv = x + v * d->head_dim;
            int8_t *qv = data + v * d->head_dim;

            if (t >= d->valid) {
                for (uint32_t c = 0; c < d->head_dim; c++) {
                    qv[c] = 0;
                }
                scale_fp16[v] = 0;
                continue;
            }
            float amax = 0.0f;
            for (uint32_t c = 0; c < d->head_dim; c++) {
                amax = fmaxf(amax, fabsf(xv[c]));
            }
            uint16_t s16 = kvd_float_to_half(amax / KVD_INT8_QMAX);
            float s = kvd_half_to_float(s16);
            if (s == 0.0f) {
                s16 = KVD_HALF_ONE;
                s = 1.0f;
            }
            for (uint32_t c = 0; c < d->head_dim; c++) {
                float q = rintf(xv[c] / s);
                /* NaN must not reach the float->int conversion, where it
                 * is undefined behaviour; it encodes as 0. */
                if (isnan(q)) {
                    q = 0.0f;
                } else if (q > KVD_INT8_QMAX) {
                    q = KVD_INT8_QMAX;
                } else if (q < -KVD_INT8_QMAX) {
                    q = -KVD_INT8_QMAX;
                }
                qv[c] = (int8_t)q;
            }
            scale_fp16[v] = s16;
        }
    }
}

void kvd_ref_int8_decode(const kvd_plane_dims_t *d, const int8_t *data,
                         const uint16_t *scale_fp16, float *x)
{
    for (uint32_t h = 0; h < d->heads; h++) {
        for (uint32_t t = 0; t < d->valid; t++) {
            size_t v = (size_t)h * d->block_size + t;
            float s = kvd_half_to_float(scale_fp16[v]);
            for (uint32_t c = 0; c < d->head_dim; c++) {
                size_t i = v * d->head_dim + c;
                x[i] = (float)data[i] * s;
            }
        }
    }
}
