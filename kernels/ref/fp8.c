/*
 * FP8 E4M3 codec with one fp32 scale per (head, token) vector
 * (docs/codecs.md, "fp8_e4m3"; the "fp8_e4m3_tokhead" scheme).
 *
 * scale = amax / 448, so the vector's largest magnitude lands on the
 * largest finite code and the whole 3-bit mantissa is used. Vectors whose
 * amax is at or below 2^-6 (the smallest E4M3 normal) keep scale 1.0, the
 * LMCache rule: dividing by a tiny scale would blow denormal-level noise up
 * to full range for no accuracy gain. The quantizer divides by the scale
 * rather than multiplying by its reciprocal, as vLLM does, so the CUDA
 * kernel can match bit for bit. amax uses fmaxf, which ignores NaN; an Inf
 * makes the scale Inf and the vector decodes to NaN, as a raw copy of a
 * broken cache would be broken too.
 */
#include <math.h>

#include "kernels/ref/ref.h"

#define KVD_FP8_E4M3_MAX 448.0f
#define KVD_FP8_MIN_NORMAL 0.015625f /* 2^-6 */

void kvd_ref_fp8_encode(const kvd_plane_dims_t *d, const float *x,
                        uint8_t *data, float *scale)
{
    for (uint32_t h = 0; h < d->heads; h++) {
        for (uint32_t t = 0; t < d->block_size; t++) {
            size_t v = (size_t)h * d->block_size + t;
            const float *xv = x + v * d->head_dim;
            uint8_t *qv = data + v * d->head_dim;

            if (t >= d->valid) {
                /* Invalid tokens: code 0 and scale 0, so the object bytes
                 * do not depend on what the cache held there. */
                for (uint32_t c = 0; c < d->head_dim; c++) {
                    qv[c] = 0;
                }
                scale[v] = 0.0f;
                continue;
            }
            float amax = 0.0f;
            for (uint32_t c = 0; c < d->head_dim; c++) {
                amax = fmaxf(amax, fabsf(xv[c]));
            }
            float s =
                amax > KVD_FP8_MIN_NORMAL ? amax / KVD_FP8_E4M3_MAX : 1.0f;
            for (uint32_t c = 0; c < d->head_dim; c++) {
                qv[c] = kvd_float_to_fp8_e4m3(xv[c] / s);
            }
            scale[v] = s;
        }
    }
}

void kvd_ref_fp8_decode(const kvd_plane_dims_t *d, const uint8_t *data,
                        const float *scale, float *x)
{
    for (uint32_t h = 0; h < d->heads; h++) {
        for (uint32_t t = 0; t < d->valid; t++) {
            size_t v = (size_t)h * d->block_size + t;
            for (uint32_t c = 0; c < d->head_dim; c++) {
                size_t i = v * d->head_dim + c;
                x[i] = kvd_fp8_e4m3_to_float(data[i]) * scale[v];
            }
        }
    }
}
