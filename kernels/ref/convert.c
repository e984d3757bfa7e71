/*
 * Scalar conversions between float and the cache element types (fp16, bf16,
 * OCP FP8 E4M3), and the bulk load/store helpers the reference codecs use.
 *
 * Every conversion is written on the bits or with exact power-of-two
 * scaling, never with the C library's current rounding mode, because the
 * CUDA kernels must produce the same bytes (docs/codecs.md, "CPU/GPU
 * parity contract"): fp16 and bf16 round to nearest even, and E4M3 follows
 * cvt.rn.satfinite for every number: round to nearest even, overflow
 * (including +-Inf) saturates to +-448. NaN keeps its sign (0x7F / 0xFF),
 * where the CUDA intrinsic always gives 0x7F; the CUDA kernels special-case
 * NaN to match this.
 */
#include <math.h>
#include <string.h>

#include "kernels/ref/ref.h"

static uint32_t kvd_float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float kvd_bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

float kvd_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;

    if (exp == 0) {
        /* Zero or subnormal: man * 2^-24 is exact in float. */
        float v = ldexpf((float)man, -24);
        return kvd_bits_float(kvd_float_bits(v) | sign);
    }
    if (exp == 31) {
        /* Inf or NaN; the payload moves to the top of the float mantissa. */
        return kvd_bits_float(sign | 0x7f800000u | (man << 13));
    }
    return kvd_bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t kvd_float_to_half(float f)
{
    uint32_t x = kvd_float_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);

    x &= 0x7fffffffu;
    if (x > 0x7f800000u) {
        /* NaN: keep the top payload bits and force the quiet bit so a
         * payload living only in the low bits cannot turn into Inf. */
        return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
    }
    /* 65520 is halfway between 65504 (max half, odd mantissa) and 65536:
     * it and everything above round to Inf. */
    if (x >= 0x477ff000u) {
        return (uint16_t)(sign | 0x7c00u);
    }
    if (x >= 0x38800000u) {
        /* Normal half: rebias the exponent, then add "half minus one plus
         * the lowest kept bit" so ties round to even; a mantissa carry
         * correctly bumps the exponent. */
        uint32_t r = x - (112u << 23);
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    /* Subnormal half (or zero): value = mant * 2^(exp-150) and the result
     * counts units of 2^-24, so shift right by 126-exp with RNE. Below a
     * quarter unit (shift >= 25) the result is zero whatever the mantissa. */
    uint32_t exp = x >> 23;
    uint32_t shift = 126u - exp;
    if (shift >= 25u) {
        return sign;
    }
    uint32_t man = (x & 0x7fffffu) | 0x800000u;
    uint32_t n = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (n & 1u))) {
        n++;
    }
    return (uint16_t)(sign | n);
}

float kvd_bf16_to_float(uint16_t b)
{
    return kvd_bits_float((uint32_t)b << 16);
}

uint16_t kvd_float_to_bf16(float f)
{
    uint32_t x = kvd_float_bits(f);

    if ((x & 0x7fffffffu) > 0x7f800000u) {
        /* NaN: truncation could clear every payload bit and give Inf. */
        return (uint16_t)((x >> 16) | 0x40u);
    }
    /* Overflow needs no special case: the rounding carry runs into the
     * exponent and yields Inf exactly when RNE says so. */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

uint8_t kvd_float_to_fp8_e4m3(float f)
{
    uint32_t bits = kvd_float_bits(f);
    uint8_t sign = (uint8_t)((bits >> 24) & 0x80u);
    uint32_t abits = bits & 0x7fffffffu;

    if (abits > 0x7f800000u) {
        return (uint8_t)(sign | 0x7fu); /* NaN keeps its sign */
    }
    /* Satfinite: everything from 448 up (464 would tie to the NaN slot's
     * 480, Inf included) clamps to the largest finite code. */
    if (abits >= 0x43e00000u) { /* 448.0f */
        return (uint8_t)(sign | 0x7eu);
    }
    int e = (int)(abits >> 23) - 127;
    if (e < -6) {
        /* Below the smallest normal the quantum is the subnormal step 2^-9:
         * a * 2^9 is exact (a power-of-two scale), lies in [0, 8), and
         * adding then subtracting 2^23 rounds it to the nearest integer,
         * ties to even, in the default rounding mode. A result of 8 is the
         * smallest normal, code 0x08, which the same formula gives. */
        float q = kvd_bits_float(abits) * 512.0f;
        unsigned n = (unsigned)((q + 8388608.0f) - 8388608.0f);
        return (uint8_t)(sign | n);
    }
    /* Normal: keep 3 of the 23 mantissa bits, rounding to nearest even on
     * the 20 dropped ones. A carry out of the mantissa (r >> 20 == 8) moves
     * into the exponent field, which is exactly the next binade. a < 448
     * keeps the result at or below 0x7E. */
    uint32_t m = abits & 0x7fffffu;
    uint32_t r = m + 0x7ffffu + ((m >> 20) & 1u);
    uint32_t code = ((uint32_t)(e + 7) << 3) + (r >> 20);
    return (uint8_t)(sign | code);
}

float kvd_fp8_e4m3_to_float(uint8_t q)
{
    uint32_t sign = (uint32_t)(q & 0x80u) << 24;
    uint32_t exp = (q >> 3) & 0xfu;
    uint32_t man = q & 7u;

    if ((q & 0x7fu) == 0x7fu) {
        return kvd_bits_float(sign | 0x7fc00000u);
    }
    if (exp == 0) {
        /* Subnormal: man * 2^-9, exact in float. */
        float v = (float)man * (1.0f / 512.0f);
        return (q & 0x80u) ? -v : v;
    }
    /* Normal: rebias the exponent (7 -> 127), widen the mantissa. */
    return kvd_bits_float(sign | ((exp + 120u) << 23) | (man << 20));
}

void kvd_ref_load_f32(kvd_dtype_t dtype, const void *src, float *dst, size_t n)
{
    const unsigned char *s = src;

    /* memcpy per element: engine caches need not be 2-byte aligned for the
     * reference, and this keeps the loads free of aliasing questions. */
    for (size_t i = 0; i < n; i++) {
        uint16_t v;
        switch (dtype) {
        case KVD_DTYPE_FP16:
            memcpy(&v, s + 2 * i, sizeof(v));
            dst[i] = kvd_half_to_float(v);
            break;
        case KVD_DTYPE_BF16:
            memcpy(&v, s + 2 * i, sizeof(v));
            dst[i] = kvd_bf16_to_float(v);
            break;
        case KVD_DTYPE_FP8_E4M3: dst[i] = kvd_fp8_e4m3_to_float(s[i]); break;
        default: dst[i] = 0.0f; break;
        }
    }
}

void kvd_ref_store_f32(kvd_dtype_t dtype, const float *src, void *dst, size_t n)
{
    unsigned char *d = dst;

    for (size_t i = 0; i < n; i++) {
        uint16_t v;
        switch (dtype) {
        case KVD_DTYPE_FP16:
            v = kvd_float_to_half(src[i]);
            memcpy(d + 2 * i, &v, sizeof(v));
            break;
        case KVD_DTYPE_BF16:
            v = kvd_float_to_bf16(src[i]);
            memcpy(d + 2 * i, &v, sizeof(v));
            break;
        case KVD_DTYPE_FP8_E4M3: d[i] = kvd_float_to_fp8_e4m3(src[i]); break;
        default: break;
        }
    }
}
