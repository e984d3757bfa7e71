/*
 * The arithmetic of RoPE re-rotation that kernels/ref/rope.c and
 * kernels/cuda/rope.cu share, so that both write the same bytes: the angle
 * delta * inv_freq reduced modulo 2*pi, its cosine and sine, and the
 * rotation of one channel pair; and the argument check both run.
 *
 * Compiled as C (kernels/ref, -ffp-contract=off) and as CUDA __host__
 * __device__ code (-fmad=false), so it uses only operations that IEEE 754
 * rounds one way on both: + - * /, fma, rint and conversions. No libm
 * transcendental: glibc's and CUDA's cos and sin differ in the last bit
 * now and then, and that bit would then flip a float now and then.
 */
#ifndef KVD_KERNELS_REF_ROPE_INT_H
#define KVD_KERNELS_REF_ROPE_INT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kvdepot/kernels.h"

#ifdef __CUDACC__
#define KVD_ROPE_FN static inline __host__ __device__
#else
#define KVD_ROPE_FN static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Every check kvd_ref_rope_shift_layer and kvd_cuda_rope_shift_layer
 * share, in its order: layout and format (kvd_kv_layout_check), rope
 * (kvd_rope_check, head_dim equal to the format's), fp16/bf16 K and V
 * planes, layer, then for num_blocks > 0 non-NULL block_ids and deltas
 * (only compared with NULL: a host or a device array), the valid count and
 * the block ids. KVD_OK or the error the headers list; logs the reason.
 * rope.c.
 */
kvd_status_t kvd_rope_args_check(const kvd_kv_layout_t *layout,
                                 const kvd_object_format_t *fmt,
                                 const kvd_rope_t *rope, unsigned layer,
                                 const int32_t *block_ids, const void *deltas,
                                 size_t num_blocks, uint32_t valid_last);

/*
 * Rotates the K rows of block `block_id` (its first `valid` tokens) of
 * layer `layer` by `delta`, with `inv_freq` from kvd_rope_inv_freq: the
 * body of kvd_ref_rope_shift_layer for one block, without its checks, for
 * callers that checked the arguments once for many blocks
 * (kvd_rope_args_check) and computed the frequencies once. rope.c.
 */
void kvd_rope_shift_block(const kvd_kv_layout_t *layout,
                          const kvd_object_format_t *fmt,
                          const kvd_rope_t *rope, const double *inv_freq,
                          unsigned layer, int32_t block_id, int64_t delta,
                          uint32_t valid);

#ifdef __cplusplus
}
#endif

/* Pairs of the largest head_dim a format allows (1024). */
#define KVD_ROPE_MAX_PAIRS 512u

/* 2*pi as HI + LO (HI the double nearest 2*pi, LO the double nearest the
 * rest; together within 2^-106 of 2*pi). 1/(2*pi) only picks the multiple
 * to subtract, so its last bit does not matter. */
#define KVD_ROPE_2PI_HI 6.283185307179586
#define KVD_ROPE_2PI_LO 2.4492935982947064e-16
#define KVD_ROPE_INV_2PI 0.15915494309189535

/* Nesting depth of the Taylor series below: the first omitted terms,
 * pi^31/31! and pi^30/30!, are below 1e-17. */
#define KVD_ROPE_TAYLOR_TERMS 14

/*
 * delta * inv_freq modulo 2*pi, in [-pi, pi] up to rounding. p + e is the
 * exact product (fma yields the rounding error of p). Subtracting k*2*pi
 * in two parts with fma (Cody-Waite) keeps each product exact and rounds
 * only results near [-pi, pi], so the angle is good to about 1e-15 rad
 * whatever delta is, up to 2^53 (where int64 -> double is still exact). A
 * second round catches the k that p's rounding leaves off by more than one
 * for larger deltas, so the result stays a small angle even then.
 */
KVD_ROPE_FN double kvd_rope_reduce(int64_t delta, double inv_freq)
{
    double d = (double)delta;
    double p = d * inv_freq;
    double e = fma(d, inv_freq, -p);
    double k = rint(p * KVD_ROPE_INV_2PI);
    double r = fma(-k, KVD_ROPE_2PI_HI, p);
    r = fma(-k, KVD_ROPE_2PI_LO, r) + e;
    k = rint(r * KVD_ROPE_INV_2PI);
    r = fma(-k, KVD_ROPE_2PI_HI, r);
    return fma(-k, KVD_ROPE_2PI_LO, r);
}

/*
 * cos and sin of r (|r| <= pi and a little beyond) from their Taylor
 * series in nested form, sin r = r (1 - r^2/(2*3) (1 - r^2/(4*5) (...)))
 * and cos r = 1 - r^2/(1*2) (1 - r^2/(3*4) (...)), with exact integer
 * divisors: about 1e-15 absolute in double, then rounded to float.
 */
KVD_ROPE_FN void kvd_rope_sincos(double r, float *cos_out, float *sin_out)
{
    double r2 = r * r;
    double s = 1.0;
    double c = 1.0;
    for (int n = KVD_ROPE_TAYLOR_TERMS; n >= 1; n--) {
        s = 1.0 - s * r2 / (double)((2 * n) * (2 * n + 1));
        c = 1.0 - c * r2 / (double)((2 * n - 1) * (2 * n));
    }
    *cos_out = (float)c;
    *sin_out = (float)(r * s);
}

/* Rotates the pair (x1, x2) by the angle whose cosine and sine are c, s:
 * four products and two sums in float, never fused. */
KVD_ROPE_FN void kvd_rope_rotate(float *x1, float *x2, float c, float s)
{
    float a = *x1;
    float b = *x2;
    *x1 = a * c - b * s;
    *x2 = b * c + a * s;
}

/* Channels of pair i: NEOX (style 0) pairs i with i + half, GPT-J (style
 * 1) pairs 2i with 2i + 1. */
KVD_ROPE_FN uint32_t kvd_rope_chan0(int style, uint32_t half, uint32_t i)
{
    (void)half;
    return style == 0 ? i : 2u * i;
}

KVD_ROPE_FN uint32_t kvd_rope_chan1(int style, uint32_t half, uint32_t i)
{
    return style == 0 ? i + half : 2u * i + 1u;
}

#endif /* KVD_KERNELS_REF_ROPE_INT_H */
