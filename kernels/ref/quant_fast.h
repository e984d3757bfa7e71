/*
 * Exact shortcuts to the reference quantizers' bytes, shared by the CUDA
 * kernels (kernels/cuda/codec_dev.cuh) and tested against the reference on
 * the CPU (tests/unit/test_quant_fast.c).
 *
 * fp8_e4m3 and int8 encode each element as round(x / s), one division per
 * element (ref.h: "quantizers divide by the scale"). On the GPU an IEEE
 * division is a reciprocal, five fused steps and a range check per
 * element, the bulk of the encode's instructions. The kernels compute
 * q = x * r instead, with r = 1/s divided once per vector, and keep q's
 * code only where it provably equals the division's:
 *
 *   q = x * (1/s)(1+d1)(1+d2) with |d1|, |d2| <= 2^-24, so q is within
 *   2 ulps of the exact x / s and within 2.5 ulps of the division's
 *   rounded result; 5 float steps when a power of two lies between them.
 *   Rounding to the code grid is monotone, so if no rounding boundary of
 *   the grid lies within 8 float steps of q, the division's result rounds
 *   to the same code as q.
 *
 * Anything else (zeros and tiny values, Inf, NaN, q near a boundary)
 * takes the division, so the bytes are the reference's in every case;
 * with typical KV values the division runs for well under 1% of vectors.
 * The NaN tests below let the kernels convert a chunk with the plain
 * hardware conversions when no element needs the reference's NaN rules,
 * and TurboQuant's bound search replaces 2^bits - 1 comparisons by bits.
 */
#ifndef KVD_KERNELS_REF_QUANT_FAST_H
#define KVD_KERNELS_REF_QUANT_FAST_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define KVD_QF_FN static __host__ __device__ __forceinline__
#else
#define KVD_QF_FN static inline
#endif

KVD_QF_FN uint32_t kvd_qf_bits(float f)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
#endif
}

/* E4M3 ("e4m3fn", saturating): 1 when the code of q is the code of the
 * division q approximates. q must lie in [2^-6, 512), where E4M3 values are
 * normal with 3 mantissa bits, so the grid's rounding midpoints are the
 * floats whose low 20 mantissa bits are 0x80000 (at 448 and above every
 * value saturates to 448, so the tie at 464 is the only boundary there);
 * and q's low 20 bits must be at least 8 steps from 0x80000. A power of two
 * is a grid value, never a midpoint, so the steps never straddle one near a
 * boundary. */
KVD_QF_FN int kvd_qf_fp8_ok(float q)
{
    float a = fabsf(q); /* NaN fails both comparisons */
    int normal = (a >= 0x1p-6f) & (a < 512.0f);
    /* (low 20 bits - 0x80000 + 8) mod 2^20 >= 16; the sign bit and the
     * carries out of bit 19 are masked away. */
    int far = ((kvd_qf_bits(q) + 0x80008u) & 0xffff0u) != 0;
    return normal & far;
}

/* int8 (rint, then clamp to +-127): 1 when the code of q is the
 * division's. For |q| < 128, 2.5 ulps are below 2^-15, so q at least
 * 2^-14 from a half-integer rounds like the division (q - rint(q) is exact
 * there); beyond 127.5 both clamp to +-127. NaN and Inf compare false. */
KVD_QF_FN int kvd_qf_i8_ok(float q)
{
    return fabsf(fabsf(q - rintf(q)) - 0.5f) > 0x1p-14f;
}

/* Non-zero when one of the two fp16 values in w is a NaN: |u| > 0x7c00
 * exactly when |u| + 0x3ff reaches bit 15 (no carry leaves the half). */
KVD_QF_FN uint32_t kvd_qf_fp16x2_nan(uint32_t w)
{
    return ((w & 0x7fff7fffu) + 0x03ff03ffu) & 0x80008000u;
}

/* Non-zero when one of the four E4M3 codes in w is a NaN (low 7 bits all
 * ones: adding 1 to the low 7 bits reaches bit 7). */
KVD_QF_FN uint32_t kvd_qf_e4m3x4_nan(uint32_t w)
{
    return ((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
}

/* TurboQuant's code of a rotated coordinate, #{k : y > bound[k]} over the
 * 2^bits - 1 ascending bounds (tq.c counts them one by one), by binary
 * search: bits comparisons, each choosing the next bound from the earlier
 * outcomes. For a non-decreasing array the bounds below y form a prefix,
 * so the search finds the same count; NaN compares false everywhere and
 * gives 0 both ways. Every index is a constant once bits is, so on the GPU
 * the bounds stay in registers. */
KVD_QF_FN uint32_t kvd_qf_tq_code(float y, const float *b, unsigned bits)
{
    if (bits == 2) {
        uint32_t c1 = y > b[1];
        uint32_t c0 = y > (c1 ? b[2] : b[0]);
        return 2u * c1 + c0;
    }
    if (bits == 3) {
        uint32_t c2 = y > b[3];
        uint32_t c1 = y > (c2 ? b[5] : b[1]);
        float m0 = c2 ? (c1 ? b[6] : b[4]) : (c1 ? b[2] : b[0]);
        return 4u * c2 + 2u * c1 + (uint32_t)(y > m0);
    }
    uint32_t c3 = y > b[7];
    uint32_t c2 = y > (c3 ? b[11] : b[3]);
    float m1 = c3 ? (c2 ? b[13] : b[9]) : (c2 ? b[5] : b[1]);
    uint32_t c1 = y > m1;
    float m0 = c3 ? (c2 ? (c1 ? b[14] : b[12]) : (c1 ? b[10] : b[8]))
                  : (c2 ? (c1 ? b[6] : b[4]) : (c1 ? b[2] : b[0]));
    return 8u * c3 + 4u * c2 + 2u * c1 + (uint32_t)(y > m0);
}

#endif /* KVD_KERNELS_REF_QUANT_FAST_H */
