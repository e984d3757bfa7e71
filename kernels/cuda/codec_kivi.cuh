// KIVI on the device (kernels/ref/kivi.c is the contract): asymmetric
// min/max quantization to 4 or 2 bits, K per (head, channel) over the
// block's valid tokens, V per (head, token, 32-channel group).
//
// Bit-exactness rests on three things. (1) min and max are folded in the
// reference's order with the exact semantics of glibc's fminf/fmaxf, which
// on equal operands return the first one; that only matters for the sign of
// a zero min, but that sign is stored. (2) mn and the scale are rounded to
// fp16 (saturating) before use, the scale from the rounded mn, and the
// quantizer divides and rounds with rintf. (3) Codes are packed LSB-first
// over the whole plane, so a byte may hold codes of two tokens or, when
// block_size * head_dim * bits is not a multiple of 8, of two heads: the
// encoders assign every output byte to exactly one thread.
//
// K encode: fast path (head_dim % 8 == 0, every token row starts on a byte
// boundary): per-head CTA, one thread per 8-channel chunk folds the tokens
// in order, parameters go to shared memory, then one thread per (token,
// chunk) writes 4 (4-bit) or 2 (2-bit) bytes. Slow path: per-head CTA (or
// one CTA for all heads when heads share bytes), one thread per channel for
// the parameters, which are read back from the stored metadata, then one
// thread per output byte.
#ifndef KVD_KERNELS_CUDA_CODEC_KIVI_CUH
#define KVD_KERNELS_CUDA_CODEC_KIVI_CUH

#include "kernels/cuda/codec_dev.cuh"

#define KVD_KIVI_GROUP 32u
#define KVD_HALF_MAX_BITS 0x7bffu

// glibc's fminf/fmaxf: a NaN operand is ignored, equal operands give the
// first. `acc` is never NaN here (it starts at +-Inf).
__device__ __forceinline__ float kvd_fmin_first(float acc, float v)
{
    return (acc <= v || isnan(v)) ? acc : v;
}

__device__ __forceinline__ float kvd_fmax_first(float acc, float v)
{
    return (acc >= v || isnan(v)) ? acc : v;
}

__device__ __forceinline__ uint16_t kvd_kivi_half_sat(float f)
{
    uint16_t h = kvd_dev_float_to_half(f);
    if ((h & 0x7fffu) == 0x7c00u) {
        h = (uint16_t)((h & 0x8000u) | KVD_HALF_MAX_BITS);
    }
    return h;
}

struct kvd_kivi_param {
    uint16_t scale16, min16;
    float scale, min;
};

__device__ __forceinline__ kvd_kivi_param kvd_kivi_param_make(float lo,
                                                              float hi,
                                                              unsigned levels)
{
    kvd_kivi_param p;
    if (!(lo <= hi)) {
        lo = hi = 0.0f;
    }
    p.min16 = kvd_kivi_half_sat(lo);
    p.min = kvd_dev_half_to_float(p.min16);
    p.scale16 = kvd_kivi_half_sat((hi - p.min) / (float)levels);
    p.scale = kvd_dev_half_to_float(p.scale16);
    if (!(p.scale > 0.0f)) {
        p.scale16 = 0;
        p.scale = 0.0f;
    }
    return p;
}

// The parameters as decode (and the slow encoder) sees them: the stored
// fp16 pair, which is exactly what kvd_kivi_param_make used.
__device__ __forceinline__ kvd_kivi_param kvd_kivi_param_load(uint32_t pair)
{
    kvd_kivi_param p;
    p.scale16 = (uint16_t)(pair & 0xffffu);
    p.min16 = (uint16_t)(pair >> 16);
    p.scale = kvd_dev_half_to_float(p.scale16);
    p.min = kvd_dev_half_to_float(p.min16);
    return p;
}

__device__ __forceinline__ uint32_t kvd_kivi_code(float x, float scale,
                                                  float min, unsigned levels)
{
    if (scale == 0.0f) {
        return 0;
    }
    float q = rintf((x - min) / scale);
    if (!(q > 0.0f)) {
        return 0;
    }
    return q >= (float)levels ? levels : (uint32_t)q;
}

__device__ __forceinline__ float kvd_kivi_value(uint32_t q, float scale,
                                                float min)
{
    // Explicitly unfused: the reference rounds the product, then the sum.
    return __fadd_rn(__fmul_rn((float)q, scale), min);
}

// ---- V: per (head, token, group of 32 channels) ----

template <class E, unsigned BITS>
__device__ void kvd_kivi_v_encode_cta(const kvd_gs_args &a, const kvd_cta &c)
{
    const unsigned levels = (1u << BITS) - 1u;
    const uint32_t groups = a.head_dim / KVD_KIVI_GROUP;
    const uint32_t n = a.block_size * groups;
    const bool vec = a.vec16 != 0;
    for (uint32_t k = threadIdx.x; k < n; k += blockDim.x) {
        uint32_t t = k / groups;
        uint32_t g = k - t * groups;
        size_t v = (size_t)c.h * a.block_size + t;
        size_t first = v * a.head_dim + (size_t)g * KVD_KIVI_GROUP;
        unsigned char *codes = c.data + first * BITS / 8;
        uint32_t *meta = reinterpret_cast<uint32_t *>(c.meta) + v * groups + g;
        uint32_t w[BITS] = {}; // 32 codes of BITS bits = BITS words
        if (t < c.valid) {
            const unsigned char *row = c.src + (int64_t)t * a.stride_token +
                                       (size_t)g * KVD_KIVI_GROUP * 2;
            float x[KVD_KIVI_GROUP];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                kvd_load_chunk<E>(row + j * 16, vec, x + j * KVD_CHUNK);
            }
            float lo = INFINITY, hi = -INFINITY;
#pragma unroll
            for (int j = 0; j < (int)KVD_KIVI_GROUP; j++) {
                lo = kvd_fmin_first(lo, x[j]);
                hi = kvd_fmax_first(hi, x[j]);
            }
            kvd_kivi_param p = kvd_kivi_param_make(lo, hi, levels);
#pragma unroll
            for (int j = 0; j < (int)KVD_KIVI_GROUP; j++) {
                uint32_t q = kvd_kivi_code(x[j], p.scale, p.min, levels);
                w[j * BITS / 32] |= q << ((j * BITS) % 32);
            }
            *meta = (uint32_t)p.scale16 | ((uint32_t)p.min16 << 16);
        } else {
            *meta = 0;
        }
        if constexpr (BITS == 4) {
            *reinterpret_cast<uint4 *>(codes) =
                make_uint4(w[0], w[1], w[2], w[3]);
        } else {
            *reinterpret_cast<uint2 *>(codes) = make_uint2(w[0], w[1]);
        }
    }
}

template <class E, unsigned BITS>
__device__ void kvd_kivi_v_decode_cta(const kvd_gs_args &a, const kvd_cta &c)
{
    const uint32_t groups = a.head_dim / KVD_KIVI_GROUP;
    const uint32_t n = c.valid * groups;
    const bool vec = a.vec16 != 0;
    for (uint32_t k = threadIdx.x; k < n; k += blockDim.x) {
        uint32_t t = k / groups;
        uint32_t g = k - t * groups;
        size_t v = (size_t)c.h * a.block_size + t;
        size_t first = v * a.head_dim + (size_t)g * KVD_KIVI_GROUP;
        const unsigned char *codes = c.data + first * BITS / 8;
        kvd_kivi_param p = kvd_kivi_param_load(
            reinterpret_cast<const uint32_t *>(c.meta)[v * groups + g]);
        uint32_t w[BITS];
        if constexpr (BITS == 4) {
            uint4 u = *reinterpret_cast<const uint4 *>(codes);
            w[0] = u.x;
            w[1] = u.y;
            w[2] = u.z;
            w[3] = u.w;
        } else {
            uint2 u = *reinterpret_cast<const uint2 *>(codes);
            w[0] = u.x;
            w[1] = u.y;
        }
        unsigned char *row = c.src + (int64_t)t * a.stride_token +
                             (size_t)g * KVD_KIVI_GROUP * 2;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float x[KVD_CHUNK];
#pragma unroll
            for (int e = 0; e < KVD_CHUNK; e++) {
                int idx = j * KVD_CHUNK + e;
                uint32_t q = (w[idx * BITS / 32] >> ((idx * BITS) % 32)) &
                             ((1u << BITS) - 1u);
                x[e] = kvd_kivi_value(q, p.scale, p.min);
            }
            kvd_store_chunk<E>(row + j * 16, vec, x);
        }
    }
}

// ---- K fast path: head_dim % 8 == 0 ----

// Packs eight codes of BITS bits, channel-ascending from bit 0.
template <unsigned BITS>
__device__ __forceinline__ uint32_t kvd_kivi_pack8(const uint32_t q[8])
{
    uint32_t w = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        w |= q[j] << (j * BITS);
    }
    return w;
}

template <unsigned BITS>
__device__ __forceinline__ void kvd_kivi_store8(unsigned char *p, uint32_t w)
{
    if constexpr (BITS == 4) {
        *reinterpret_cast<uint32_t *>(p) = w;
    } else {
        *reinterpret_cast<uint16_t *>(p) = (uint16_t)w;
    }
}

template <unsigned BITS>
__device__ __forceinline__ uint32_t kvd_kivi_load8(const unsigned char *p)
{
    if constexpr (BITS == 4) {
        return *reinterpret_cast<const uint32_t *>(p);
    } else {
        return *reinterpret_cast<const uint16_t *>(p);
    }
}

// `smem` holds 2 * head_dim floats (the launch sizes it).
template <class E, unsigned BITS>
__device__ void kvd_kivi_k_encode_fast(const kvd_gs_args &a, const kvd_cta &c,
                                       unsigned char *smem)
{
    // Scale and min per channel of this head, as floats, for phase 2.
    float *s_scale = reinterpret_cast<float *>(smem);
    float *s_min = s_scale + a.head_dim;
    const unsigned levels = (1u << BITS) - 1u;
    const uint32_t chunks = a.head_dim / KVD_CHUNK;
    const bool vec = a.vec16 != 0;

    // Phase 1: the reference folds tokens 0..valid-1 in order per channel;
    // one thread per chunk does the same for its eight channels.
    for (uint32_t k = threadIdx.x; k < chunks; k += blockDim.x) {
        float lo[KVD_CHUNK], hi[KVD_CHUNK];
#pragma unroll
        for (int j = 0; j < KVD_CHUNK; j++) {
            lo[j] = INFINITY;
            hi[j] = -INFINITY;
        }
#pragma unroll 4
        for (uint32_t t = 0; t < c.valid; t++) {
            float x[KVD_CHUNK];
            kvd_load_chunk<E>(
                c.src + (int64_t)t * a.stride_token + (size_t)k * 16, vec, x);
#pragma unroll
            for (int j = 0; j < KVD_CHUNK; j++) {
                lo[j] = kvd_fmin_first(lo[j], x[j]);
                hi[j] = kvd_fmax_first(hi[j], x[j]);
            }
        }
        uint32_t pair[KVD_CHUNK];
#pragma unroll
        for (int j = 0; j < KVD_CHUNK; j++) {
            kvd_kivi_param p = kvd_kivi_param_make(lo[j], hi[j], levels);
            s_scale[k * KVD_CHUNK + j] = p.scale;
            s_min[k * KVD_CHUNK + j] = p.min;
            pair[j] = (uint32_t)p.scale16 | ((uint32_t)p.min16 << 16);
        }
        // meta [h][c][2]: 32 bytes per chunk, 32-byte aligned.
        uint4 *m = reinterpret_cast<uint4 *>(
            c.meta + ((size_t)c.h * a.head_dim + (size_t)k * KVD_CHUNK) * 4);
        m[0] = make_uint4(pair[0], pair[1], pair[2], pair[3]);
        m[1] = make_uint4(pair[4], pair[5], pair[6], pair[7]);
    }
    __syncthreads();

    // Phase 2: one thread per (token, chunk); tokens >= valid get code 0.
    const uint32_t n = a.block_size * chunks;
    for (uint32_t k = threadIdx.x; k < n; k += blockDim.x) {
        uint32_t t = k / chunks;
        uint32_t ch = k - t * chunks;
        size_t first = ((size_t)c.h * a.block_size + t) * a.head_dim +
                       (size_t)ch * KVD_CHUNK;
        uint32_t w = 0;
        if (t < c.valid) {
            float x[KVD_CHUNK];
            kvd_load_chunk<E>(
                c.src + (int64_t)t * a.stride_token + (size_t)ch * 16, vec, x);
            uint32_t q[KVD_CHUNK];
#pragma unroll
            for (int j = 0; j < KVD_CHUNK; j++) {
                uint32_t cc = ch * KVD_CHUNK + j;
                q[j] = kvd_kivi_code(x[j], s_scale[cc], s_min[cc], levels);
            }
            w = kvd_kivi_pack8<BITS>(q);
        }
        kvd_kivi_store8<BITS>(c.data + first * BITS / 8, w);
    }
}

template <class E, unsigned BITS>
__device__ void kvd_kivi_k_decode_fast(const kvd_gs_args &a, const kvd_cta &c)
{
    const uint32_t chunks = a.head_dim / KVD_CHUNK;
    const uint32_t n = c.valid * chunks;
    const bool vec = a.vec16 != 0;
    for (uint32_t k = threadIdx.x; k < n; k += blockDim.x) {
        uint32_t t = k / chunks;
        uint32_t ch = k - t * chunks;
        size_t first = ((size_t)c.h * a.block_size + t) * a.head_dim +
                       (size_t)ch * KVD_CHUNK;
        uint32_t w = kvd_kivi_load8<BITS>(c.data + first * BITS / 8);
        const uint4 *m = reinterpret_cast<const uint4 *>(
            c.meta + ((size_t)c.h * a.head_dim + (size_t)ch * KVD_CHUNK) * 4);
        uint4 m0 = m[0], m1 = m[1];
        uint32_t pair[KVD_CHUNK] = {m0.x, m0.y, m0.z, m0.w,
                                    m1.x, m1.y, m1.z, m1.w};
        float x[KVD_CHUNK];
#pragma unroll
        for (int j = 0; j < KVD_CHUNK; j++) {
            kvd_kivi_param p = kvd_kivi_param_load(pair[j]);
            uint32_t q = (w >> (j * BITS)) & ((1u << BITS) - 1u);
            x[j] = kvd_kivi_value(q, p.scale, p.min);
        }
        kvd_store_chunk<E>(
            c.src + (int64_t)t * a.stride_token + (size_t)ch * 16, vec, x);
    }
}

// ---- K slow path: any head_dim ----

template <class E, unsigned BITS>
__device__ void kvd_kivi_k_encode_slow(const kvd_gs_args &a, const kvd_cta &c)
{
    const unsigned levels = (1u << BITS) - 1u;
    // Heads this CTA owns: its own, or all of them when heads share bytes
    // (then only the blockIdx.z == 0 CTA of the plane runs).
    uint32_t h_lo = c.h, h_hi = c.h + 1;
    if (a.kivi_k_whole) {
        if (c.h != 0) {
            return;
        }
        h_hi = a.heads;
    }
    const unsigned char *head0 = c.src - (int64_t)c.h * a.stride_head;
    uint32_t *meta = reinterpret_cast<uint32_t *>(c.meta);

    uint32_t pairs = (h_hi - h_lo) * a.head_dim;
    for (uint32_t k = threadIdx.x; k < pairs; k += blockDim.x) {
        uint32_t h = h_lo + k / a.head_dim;
        uint32_t ch = k % a.head_dim;
        const unsigned char *src = head0 + (int64_t)h * a.stride_head;
        float lo = INFINITY, hi = -INFINITY;
        for (uint32_t t = 0; t < c.valid; t++) {
            float x = E::load(reinterpret_cast<const uint16_t *>(
                src + (int64_t)t * a.stride_token)[ch]);
            lo = kvd_fmin_first(lo, x);
            hi = kvd_fmax_first(hi, x);
        }
        kvd_kivi_param p = kvd_kivi_param_make(lo, hi, levels);
        meta[(size_t)h * a.head_dim + ch] =
            (uint32_t)p.scale16 | ((uint32_t)p.min16 << 16);
    }
    // Global writes before __syncthreads are visible to the whole CTA after.
    __syncthreads();

    const size_t per_head = (size_t)a.block_size * a.head_dim;
    const size_t e_lo = h_lo * per_head, e_hi = h_hi * per_head;
    const size_t b_lo = e_lo * BITS / 8, b_hi = (e_hi * BITS + 7) / 8;
    for (size_t b = b_lo + threadIdx.x; b < b_hi; b += blockDim.x) {
        uint32_t byte = 0;
        for (uint32_t j = 0; j < 8 / BITS; j++) {
            size_t e = b * (8 / BITS) + j;
            if (e >= e_hi) {
                break;
            }
            uint32_t h = (uint32_t)(e / per_head);
            size_t r = e - h * per_head;
            uint32_t t = (uint32_t)(r / a.head_dim);
            uint32_t ch = (uint32_t)(r - (size_t)t * a.head_dim);
            if (t >= c.valid) {
                continue;
            }
            kvd_kivi_param p =
                kvd_kivi_param_load(meta[(size_t)h * a.head_dim + ch]);
            const unsigned char *src = head0 + (int64_t)h * a.stride_head;
            float x = E::load(reinterpret_cast<const uint16_t *>(
                src + (int64_t)t * a.stride_token)[ch]);
            byte |= kvd_kivi_code(x, p.scale, p.min, levels) << (j * BITS);
        }
        c.data[b] = (unsigned char)byte;
    }
}

template <class E, unsigned BITS>
__device__ void kvd_kivi_k_decode_slow(const kvd_gs_args &a, const kvd_cta &c)
{
    const uint32_t n = c.valid * a.head_dim;
    const uint32_t *meta = reinterpret_cast<const uint32_t *>(c.meta);
    for (uint32_t k = threadIdx.x; k < n; k += blockDim.x) {
        uint32_t t = k / a.head_dim;
        uint32_t ch = k - t * a.head_dim;
        size_t e = ((size_t)c.h * a.block_size + t) * a.head_dim + ch;
        size_t bit = e * BITS;
        uint32_t q = (c.data[bit / 8] >> (bit % 8)) & ((1u << BITS) - 1u);
        kvd_kivi_param p =
            kvd_kivi_param_load(meta[(size_t)c.h * a.head_dim + ch]);
        kvd_store_elt<E>(a, c, t, ch, kvd_kivi_value(q, p.scale, p.min));
    }
}

template <class E, unsigned BITS, bool GATHER>
__device__ void kvd_kivi_cta(const kvd_gs_args &a, const kvd_cta &c,
                             unsigned char *smem)
{
    bool fast = a.head_dim % KVD_CHUNK == 0;
    if (c.p == KVD_PLANE_V) {
        if (GATHER) {
            kvd_kivi_v_encode_cta<E, BITS>(a, c);
        } else {
            kvd_kivi_v_decode_cta<E, BITS>(a, c);
        }
    } else if (GATHER) {
        if (fast) {
            kvd_kivi_k_encode_fast<E, BITS>(a, c, smem);
        } else {
            kvd_kivi_k_encode_slow<E, BITS>(a, c);
        }
    } else if (fast) {
        kvd_kivi_k_decode_fast<E, BITS>(a, c);
    } else {
        kvd_kivi_k_decode_slow<E, BITS>(a, c);
    }
}

#endif // KVD_KERNELS_CUDA_CODEC_KIVI_CUH
