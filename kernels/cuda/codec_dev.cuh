// Device-side building blocks shared by the gather/scatter kernels: the
// launch arguments, the per-CTA view of one (block, plane, head), element
// conversions, and the byte-oriented codecs (raw, fp8, int8).
//
// Every conversion here reproduces kernels/ref/convert.c bit for bit, NaN
// payloads included: the hardware instructions are used for finite values
// (they round to nearest even, as the reference does) and the reference's
// own bit formula is applied to NaN inputs, where the instructions would
// return a canonical NaN instead. The 16-byte chunk paths test a whole
// chunk for NaN first (kernels/ref/quant_fast.h) and convert a clean one
// with the plain paired instructions. NaNs *produced* by arithmetic (Inf *
// 0, Inf / Inf) still differ in payload between x86 and the GPU; only
// broken caches hold such values.
//
// fp8 and int8 quantize x / s without dividing per element: x * (1/s)
// where quant_fast.h proves the codes equal, the division otherwise
// (docs/codecs.md, "CPU/GPU parity contract").
//
// Work split: one CTA of KVD_GS_THREADS threads per (listed block, plane,
// head). Token-vector codecs put a group of G lanes (a power of two, up to
// a warp) on one token and loop over tokens; each lane owns chunks of
// KVD_CHUNK channels, loaded with one 16-byte access when the cache rows
// are 16-byte aligned (args.vec16) and element by element otherwise.
#ifndef KVD_KERNELS_CUDA_CODEC_DEV_CUH
#define KVD_KERNELS_CUDA_CODEC_DEV_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "kernels/ref/ref.h"
}
#include "kernels/ref/quant_fast.h"

#define KVD_GS_THREADS 128
#define KVD_GS_WARPS (KVD_GS_THREADS / 32)
#define KVD_GS_MIN_CTAS 8
#define KVD_CHUNK 8 // channels per 16-byte access of a 2-byte dtype
#define KVD_FULL_MASK 0xffffffffu

// The uploaded kvd_codec_tables_t floats, same order and values.
struct kvd_dev_tables {
    float sign[KVD_TQ_MAX_DIM];
    float centroid[3][KVD_TQ_MAX_LEVELS];
    float bound[3][KVD_TQ_MAX_LEVELS - 1];
};

// Everything one launch needs, passed by value (__grid_constant__) so the
// launch reads no host state after it is enqueued.
struct kvd_gs_args {
    unsigned char *cache; // this layer's base
    int64_t stride_plane, stride_block, stride_token, stride_head;
    const int32_t *block_ids; // device copy of the ids, one per object
    uint32_t num_cache_blocks;
    unsigned char *objects; // staging base; object i at i * object_stride
    size_t object_stride;
    // Offsets from the object start (layer offset included) and sizes of
    // each plane's regions; *_used is what the codec writes, the rest of
    // the region up to *_bytes is zero padding.
    size_t data_off[2], meta_off[2];
    size_t data_used[2], data_bytes[2], meta_used[2], meta_bytes[2];
    uint32_t num_blocks, heads, block_size, head_dim, valid_last;
    int dtype;         // kvd_dtype_t
    int codec[2];      // kvd_codec_t per plane
    int plane_of[2];   // blockIdx.y -> plane (planes left to the copy engine
                       // are not in the grid)
    int vec16;         // rows 16-byte aligned and head_dim % 8 == 0
    int kivi_k_whole;  // KIVI K packs across heads: one CTA per plane
    unsigned raw_unit; // bytes per access of the raw kernel copy
    const kvd_dev_tables *tables;
    float tq_inv_sqrt_d;
    // Scatter only: rotate plane K of listed block i by rope_deltas[i]
    // positions once it is decoded (NULL: no rotation; rope_dev.cuh).
    const int64_t *rope_deltas;
    const double *rope_inv_freq;
    uint32_t rope_half;
    int rope_style;
};

// One CTA's slice: listed block i (cache block `id`), plane p, head h.
struct kvd_cta {
    unsigned char *src;  // cache at (p, id, token 0, head h)
    unsigned char *obj;  // object i
    unsigned char *data; // object i's data region of plane p
    unsigned char *meta; // object i's metadata region of plane p
    uint32_t h, valid, p;
};

// ---- element conversions (kernels/ref/convert.c) ----

__device__ __forceinline__ float kvd_dev_half_to_float(uint16_t u)
{
    if ((u & 0x7c00u) == 0x7c00u && (u & 0x3ffu) != 0) {
        return __uint_as_float(((uint32_t)(u & 0x8000u) << 16) | 0x7f800000u |
                               ((uint32_t)(u & 0x3ffu) << 13));
    }
    return __half2float(__ushort_as_half(u));
}

__device__ __forceinline__ uint16_t kvd_dev_float_to_half(float f)
{
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)(((x >> 16) & 0x8000u) | 0x7e00u |
                          ((x >> 13) & 0x3ffu));
    }
    return __half_as_ushort(__float2half_rn(f));
}

__device__ __forceinline__ float kvd_dev_bf16_to_float(uint16_t u)
{
    return __uint_as_float((uint32_t)u << 16);
}

__device__ __forceinline__ uint16_t kvd_dev_float_to_bf16(float f)
{
    // The reference's integer RNE, verbatim: three integer operations, and
    // its NaN rule differs from cvt.rn.bf16.f32's canonical NaN.
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((x >> 16) | 0x40u);
    }
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

// fp16 and bf16 element traits: the codecs are templates over these.
// load/store follow the reference's NaN rules; the *_fast forms are the
// plain hardware conversions, equal to them for every value that is not a
// NaN (kvd_load_chunk and kvd_store_chunk check a whole chunk first).
struct kvd_elt_fp16 {
    static __device__ __forceinline__ float load(uint16_t u)
    {
        return kvd_dev_half_to_float(u);
    }
    static __device__ __forceinline__ uint16_t store(float f)
    {
        return kvd_dev_float_to_half(f);
    }
    static __device__ __forceinline__ uint32_t word_nan(uint32_t w)
    {
        return kvd_qf_fp16x2_nan(w);
    }
    static __device__ __forceinline__ float2 load2_fast(uint32_t w)
    {
        return __half22float2(*reinterpret_cast<const __half2 *>(&w));
    }
    static __device__ __forceinline__ float load_fast(uint16_t u)
    {
        return __half2float(__ushort_as_half(u));
    }
    static __device__ __forceinline__ uint16_t store_fast(float f)
    {
        return __half_as_ushort(__float2half_rn(f));
    }
    static __device__ __forceinline__ uint32_t store2_fast(float a, float b)
    {
        __half2 h = __floats2half2_rn(a, b);
        return *reinterpret_cast<const uint32_t *>(&h);
    }
};

struct kvd_elt_bf16 {
    static __device__ __forceinline__ float load(uint16_t u)
    {
        return kvd_dev_bf16_to_float(u);
    }
    static __device__ __forceinline__ uint16_t store(float f)
    {
        return kvd_dev_float_to_bf16(f);
    }
    // Widening bf16 is exact for every pattern, NaN included.
    static __device__ __forceinline__ uint32_t word_nan(uint32_t)
    {
        return 0;
    }
    static __device__ __forceinline__ float2 load2_fast(uint32_t w)
    {
        return make_float2(__uint_as_float(w << 16),
                           __uint_as_float(w & 0xffff0000u));
    }
    static __device__ __forceinline__ float load_fast(uint16_t u)
    {
        return kvd_dev_bf16_to_float(u);
    }
    static __device__ __forceinline__ uint16_t store_fast(float f)
    {
        uint32_t x = __float_as_uint(f);
        x += 0x7fffu + ((x >> 16) & 1u);
        return (uint16_t)(x >> 16);
    }
    // The reference's integer RNE without its NaN branch.
    static __device__ __forceinline__ uint32_t store2_fast(float a, float b)
    {
        uint32_t x = __float_as_uint(a), y = __float_as_uint(b);
        x += 0x7fffu + ((x >> 16) & 1u);
        y += 0x7fffu + ((y >> 16) & 1u);
        return (x >> 16) | (y & 0xffff0000u);
    }
};

// E4M3 with cvt.rn.satfinite (the software path on sm_80 computes the same
// RNE), except that NaN keeps its sign as in kvd_float_to_fp8_e4m3; the
// intrinsic maps every NaN to 0x7F.
__device__ __forceinline__ uint8_t kvd_dev_float_to_fp8(float f)
{
    if (isnan(f)) {
        return (uint8_t)(((__float_as_uint(f) >> 24) & 0x80u) | 0x7fu);
    }
    return (uint8_t)__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
}

// Decode times scale. Every finite E4M3 value is exact in fp16; the NaN
// codes give what x86 gives for the reference's NaN * scale (the NaN
// operand, quiet, sign kept), not the GPU's canonical NaN.
__device__ __forceinline__ float kvd_dev_fp8_decode(uint8_t q, float scale)
{
    if ((q & 0x7fu) == 0x7fu) {
        return __uint_as_float(((uint32_t)(q & 0x80u) << 24) | 0x7fc00000u);
    }
    __half_raw hr = __nv_cvt_fp8_to_halfraw(q, __NV_E4M3);
    return __half2float(__half(hr)) * scale;
}

// ---- chunk loads and stores ----

// Loads KVD_CHUNK elements at p: one 16-byte load when `vec` (p aligned),
// else eight 2-byte loads. A vector chunk without a NaN (nearly every one)
// converts with the plain instructions; the per-element NaN rules run only
// where a NaN is present, behind a branch rather than predicated.
template <class E>
__device__ __forceinline__ void kvd_load_chunk(const unsigned char *p, bool vec,
                                               float x[KVD_CHUNK])
{
    if (vec) {
        uint4 v = *reinterpret_cast<const uint4 *>(p);
        uint32_t w[4] = {v.x, v.y, v.z, v.w};
        if ((E::word_nan(w[0]) | E::word_nan(w[1]) | E::word_nan(w[2]) |
             E::word_nan(w[3])) != 0) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                x[2 * j] = E::load((uint16_t)(w[j] & 0xffffu));
                x[2 * j + 1] = E::load((uint16_t)(w[j] >> 16));
            }
        } else {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float2 f = E::load2_fast(w[j]);
                x[2 * j] = f.x;
                x[2 * j + 1] = f.y;
            }
        }
    } else {
        const uint16_t *q = reinterpret_cast<const uint16_t *>(p);
#pragma unroll
        for (int j = 0; j < KVD_CHUNK; j++) {
            x[j] = E::load(q[j]);
        }
    }
}

template <class E>
__device__ __forceinline__ void kvd_store_chunk(unsigned char *p, bool vec,
                                                const float x[KVD_CHUNK])
{
    if (vec) {
        bool nan = false;
#pragma unroll
        for (int j = 0; j < KVD_CHUNK; j++) {
            nan |= isnan(x[j]);
        }
        uint32_t w[4];
        if (nan) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                w[j] = (uint32_t)E::store(x[2 * j]) |
                       ((uint32_t)E::store(x[2 * j + 1]) << 16);
            }
        } else {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                w[j] = E::store2_fast(x[2 * j], x[2 * j + 1]);
            }
        }
        *reinterpret_cast<uint4 *>(p) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
        uint16_t *q = reinterpret_cast<uint16_t *>(p);
#pragma unroll
        for (int j = 0; j < KVD_CHUNK; j++) {
            q[j] = E::store(x[j]);
        }
    }
}

// Element `c` of token `t` in this CTA's head, as a float.
template <class E>
__device__ __forceinline__ float
kvd_load_elt(const kvd_gs_args &a, const kvd_cta &c, uint32_t t, uint32_t ch)
{
    const uint16_t *p =
        reinterpret_cast<const uint16_t *>(c.src + (int64_t)t * a.stride_token);
    return E::load(p[ch]);
}

template <class E>
__device__ __forceinline__ void kvd_store_elt(const kvd_gs_args &a,
                                              const kvd_cta &c, uint32_t t,
                                              uint32_t ch, float v)
{
    uint16_t *p =
        reinterpret_cast<uint16_t *>(c.src + (int64_t)t * a.stride_token);
    p[ch] = E::store(v);
}

// Zeroes the bytes [used, bytes) of a region: the reference encodes into a
// zeroed region, so its padding is zero. Called by one CTA per plane; the
// padding is less than 16 bytes for every codec but KIVI's packed tail.
__device__ __forceinline__ void kvd_zero_pad(unsigned char *region, size_t used,
                                             size_t bytes)
{
    for (size_t k = used + threadIdx.x; k < bytes; k += blockDim.x) {
        region[k] = 0;
    }
}

// ---- raw ----

template <unsigned U> struct kvd_unit_type;
template <> struct kvd_unit_type<16> {
    typedef uint4 type;
};
template <> struct kvd_unit_type<8> {
    typedef uint2 type;
};
template <> struct kvd_unit_type<4> {
    typedef uint32_t type;
};
template <> struct kvd_unit_type<2> {
    typedef uint16_t type;
};
template <> struct kvd_unit_type<1> {
    typedef uint8_t type;
};

// Raw copy of one head's tokens in units of U bytes (the largest power of
// two dividing the row, the strides and the base, chosen on the host).
// Gather writes zero units for tokens >= valid; scatter skips them.
template <unsigned U, bool GATHER>
__device__ void kvd_raw_cta(const kvd_gs_args &a, const kvd_cta &c,
                            size_t row_bytes)
{
    typedef typename kvd_unit_type<U>::type unit_t;
    uint32_t per_row = (uint32_t)(row_bytes / U);
    uint32_t n = a.block_size * per_row;
    for (uint32_t k = threadIdx.x; k < n; k += blockDim.x) {
        uint32_t t = k / per_row;
        uint32_t u = k - t * per_row;
        unit_t *o = reinterpret_cast<unit_t *>(
            c.data + ((size_t)c.h * a.block_size + t) * row_bytes +
            (size_t)u * U);
        unit_t *s = reinterpret_cast<unit_t *>(
            c.src + (int64_t)t * a.stride_token + (size_t)u * U);
        if (GATHER) {
            if (t < c.valid) {
                *o = *s;
            } else {
                *o = unit_t();
            }
        } else if (t < c.valid) {
            *s = *o;
        }
    }
}

template <bool GATHER>
__device__ void kvd_raw_dispatch(const kvd_gs_args &a, const kvd_cta &c,
                                 size_t elt)
{
    size_t row = (size_t)a.head_dim * elt;
    switch (a.raw_unit) {
    case 16: kvd_raw_cta<16, GATHER>(a, c, row); break;
    case 8: kvd_raw_cta<8, GATHER>(a, c, row); break;
    case 4: kvd_raw_cta<4, GATHER>(a, c, row); break;
    case 2: kvd_raw_cta<2, GATHER>(a, c, row); break;
    default: kvd_raw_cta<1, GATHER>(a, c, row); break;
    }
}

// ---- token-vector lane groups ----

// G lanes per token: the smallest power of two covering the token's chunks,
// capped at a warp. All 32 lanes of a warp iterate the same number of times
// (tokens beyond the block are inactive, not absent), so full-mask
// shuffles inside the loop are legal.
struct kvd_group {
    uint32_t g, lane, sub, per_warp;
};

__device__ __forceinline__ kvd_group kvd_group_make(uint32_t chunks)
{
    kvd_group gr;
    uint32_t g = 1;
    while (g < chunks && g < 32) {
        g <<= 1;
    }
    gr.g = g;
    gr.lane = (threadIdx.x & 31u) % g;
    gr.sub = (threadIdx.x & 31u) / g;
    gr.per_warp = 32u / g;
    return gr;
}

// amax over the group. fmaxf is exact, commutative and associative on
// non-NaN values and ignores NaN, so any tree equals the reference's
// left-to-right fmaxf chain.
__device__ __forceinline__ float kvd_group_amax(float v, uint32_t g)
{
    for (uint32_t off = g >> 1; off > 0; off >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(KVD_FULL_MASK, v, off));
    }
    return v;
}

// The same for a group size known at compile time: log2(G) shuffles, no
// loop.
template <uint32_t G> __device__ __forceinline__ float kvd_group_amax_c(float v)
{
#pragma unroll
    for (uint32_t off = G >> 1; off > 0; off >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(KVD_FULL_MASK, v, off));
    }
    return v;
}

// ---- fp8 and int8 ----

#define KVD_FP8_E4M3_MAX_F 448.0f
#define KVD_FP8_MIN_NORMAL_F 0.015625f // 2^-6
#define KVD_INT8_QMAX_F 127.0f
#define KVD_HALF_ONE_BITS 0x3c00u

// int8 code of x at step s: divide, round to nearest even, clamp to +-127;
// NaN encodes as 0 (int8.c).
__device__ __forceinline__ uint8_t kvd_i8_code(float x, float s)
{
    float q = rintf(x / s);
    if (isnan(q)) {
        q = 0.0f;
    } else if (q > KVD_INT8_QMAX_F) {
        q = KVD_INT8_QMAX_F;
    } else if (q < -KVD_INT8_QMAX_F) {
        q = -KVD_INT8_QMAX_F;
    }
    return (uint8_t)(int8_t)q;
}

// Codes of eight quotients q[j] = x[j] * (1/s) for which the quant_fast.h
// predicate held, little-endian in two words: E4M3 two per conversion
// (q is finite there), int8 rounded to nearest even and clamped.
__device__ __forceinline__ uint2 kvd_fp8_pack8(const float q[KVD_CHUNK])
{
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < KVD_CHUNK; j += 2) {
        uint32_t pair = __nv_cvt_float2_to_fp8x2(make_float2(q[j], q[j + 1]),
                                                 __NV_SATFINITE, __NV_E4M3);
        w[j / 4] |= pair << (8 * (j & 3));
    }
    return make_uint2(w[0], w[1]);
}

__device__ __forceinline__ uint2 kvd_i8_pack8(const float q[KVD_CHUNK])
{
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < KVD_CHUNK; j++) {
        int v = min(max(__float2int_rn(q[j]), -127), 127);
        w[j / 4] |= ((uint32_t)v & 0xffu) << (8 * (j & 3));
    }
    return make_uint2(w[0], w[1]);
}

// The reference's code of x at scale s: a division. A NaN element keeps
// its sign as x86's division keeps the NaN operand's, whatever the GPU's
// division makes of it.
template <bool FP8>
__device__ __forceinline__ uint8_t kvd_q8_code(float x, float s)
{
    if (FP8) {
        if (isnan(x)) {
            return kvd_dev_float_to_fp8(x);
        }
        return kvd_dev_float_to_fp8(x / s);
    }
    return kvd_i8_code(x, s);
}

// The codes of x[0..7] at scales s[j] (reciprocals r[j]), little-endian in
// two words: x * r where that provably gives the division's codes
// (kernels/ref/quant_fast.h), the division for the whole chunk otherwise.
// Per-token callers pass one scale eight times; the copies fold away.
template <bool FP8>
__device__ __forceinline__ uint2 kvd_q8_codes8(const float x[KVD_CHUNK],
                                               const float s[KVD_CHUNK],
                                               const float r[KVD_CHUNK])
{
    float q[KVD_CHUNK];
    int ok = 1;
#pragma unroll
    for (int j = 0; j < KVD_CHUNK; j++) {
        q[j] = __fmul_rn(x[j], r[j]);
        ok &= FP8 ? kvd_qf_fp8_ok(q[j]) : kvd_qf_i8_ok(q[j]);
    }
    if (ok) {
        return FP8 ? kvd_fp8_pack8(q) : kvd_i8_pack8(q);
    }
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < KVD_CHUNK; j++) {
        w[j / 4] |= (uint32_t)kvd_q8_code<FP8>(x[j], s[j]) << (8 * (j & 3));
    }
    return make_uint2(w[0], w[1]);
}

// Per-token scale of the two 8-bit codecs, computed exactly as fp8.c and
// int8.c do: fp8 divides amax by 448 (1.0 at or below 2^-6); int8 rounds
// amax/127 to fp16 first and replaces a zero scale by 1.0.
template <bool FP8> struct kvd_q8 {
    float s, r; // the scale and its reciprocal (one division per vector)
    uint16_t s16;
    __device__ __forceinline__ explicit kvd_q8(float amax)
    {
        if (FP8) {
            s = amax > KVD_FP8_MIN_NORMAL_F ? amax / KVD_FP8_E4M3_MAX_F : 1.0f;
            s16 = 0;
        } else {
            s16 = kvd_dev_float_to_half(amax / KVD_INT8_QMAX_F);
            s = kvd_dev_half_to_float(s16);
            if (s == 0.0f) {
                s16 = KVD_HALF_ONE_BITS;
                s = 1.0f;
            }
        }
        r = 1.0f / s;
    }
    __device__ __forceinline__ uint8_t encode(float x) const
    {
        return kvd_q8_code<FP8>(x, s);
    }
    __device__ __forceinline__ uint2 encode8(const float x[KVD_CHUNK]) const
    {
        const float s8[KVD_CHUNK] = {s, s, s, s, s, s, s, s};
        const float r8[KVD_CHUNK] = {r, r, r, r, r, r, r, r};
        return kvd_q8_codes8<FP8>(x, s8, r8);
    }
};

template <bool FP8>
__device__ __forceinline__ void kvd_q8_store_scale(const kvd_cta &c, size_t v,
                                                   float s, uint16_t s16)
{
    if (FP8) {
        reinterpret_cast<float *>(c.meta)[v] = s;
    } else {
        reinterpret_cast<uint16_t *>(c.meta)[v] = s16;
    }
}

// Encode, vector rows of at most 32 chunks (head_dim <= 256): a lane group
// per token, each lane holding at most one chunk, loaded once and kept in
// registers for the amax and the codes. Codes land at [h][t][c], eight per
// 8-byte store. G is the group size when the caller knows it (head_dim 64,
// 128, 256), 0 otherwise.
template <class E, bool FP8, uint32_t G>
__device__ void kvd_q8_encode_reg_cta(const kvd_gs_args &a, const kvd_cta &c)
{
    const uint32_t chunks = a.head_dim / KVD_CHUNK;
    const kvd_group gr = kvd_group_make(G != 0 ? G : chunks);
    const bool mine = gr.lane < chunks;
    const uint32_t t_step = KVD_GS_WARPS * gr.per_warp;
    uint32_t t = (threadIdx.x >> 5) * gr.per_warp + gr.sub;
    // This lane's chunk of token t in the cache and in the object, and
    // token t's scale; each advances t_step tokens per round.
    const unsigned char *src =
        c.src + (int64_t)t * a.stride_token + (size_t)gr.lane * 16;
    const int64_t src_step = (int64_t)t_step * a.stride_token;
    const size_t v0 = (size_t)c.h * a.block_size;
    unsigned char *codes = c.data + (v0 + t) * a.head_dim + (size_t)gr.lane * 8;
    const size_t codes_step = (size_t)t_step * a.head_dim;
    // Rounds run while any lane of the warp has a token: the shuffles need
    // the whole warp.
    for (uint32_t t0 = t - gr.sub; t0 < a.block_size; t0 += t_step) {
        const bool live = t < c.valid && mine;
        float x[KVD_CHUNK];
        float amax = 0.0f;
        if (live) {
            kvd_load_chunk<E>(src, true, x);
#pragma unroll
            for (int j = 0; j < KVD_CHUNK; j++) {
                amax = fmaxf(amax, fabsf(x[j]));
            }
        }
        amax = G != 0 ? kvd_group_amax_c<G>(amax) : kvd_group_amax(amax, gr.g);
        if (t < a.block_size && mine) {
            uint2 out = make_uint2(0, 0);
            float s = 0.0f;
            uint16_t s16 = 0;
            if (live) {
                kvd_q8<FP8> q(amax);
                out = q.encode8(x);
                s = q.s;
                s16 = q.s16;
            }
            *reinterpret_cast<uint2 *>(codes) = out;
            if (gr.lane == 0) {
                kvd_q8_store_scale<FP8>(c, v0 + t, s, s16);
            }
        }
        t += t_step;
        src += src_step;
        codes += codes_step;
    }
}

// Encode, any other row: a lane group per token, two passes over the
// token's chunks (amax, then quantize; the second pass reads L1-resident
// lines). Codes land at [h][t][c], eight per 8-byte store on the vector
// path.
template <class E, bool FP8, bool VEC>
__device__ void kvd_q8_encode_cta(const kvd_gs_args &a, const kvd_cta &c)
{
    const uint32_t step = VEC ? KVD_CHUNK : 1u;
    const uint32_t chunks = a.head_dim / step;
    kvd_group gr = kvd_group_make(chunks);
    uint32_t warp = threadIdx.x >> 5;
    for (uint32_t t0 = warp * gr.per_warp; t0 < a.block_size;
         t0 += KVD_GS_WARPS * gr.per_warp) {
        uint32_t t = t0 + gr.sub;
        bool live = t < c.valid;
        float amax = 0.0f;
        if (live) {
            const unsigned char *row = c.src + (int64_t)t * a.stride_token;
            for (uint32_t k = gr.lane; k < chunks; k += gr.g) {
                if (VEC) {
                    float x[KVD_CHUNK];
                    kvd_load_chunk<E>(row + (size_t)k * 16, true, x);
#pragma unroll
                    for (int j = 0; j < KVD_CHUNK; j++) {
                        amax = fmaxf(amax, fabsf(x[j]));
                    }
                } else {
                    amax = fmaxf(amax, fabsf(kvd_load_elt<E>(a, c, t, k)));
                }
            }
        }
        amax = kvd_group_amax(amax, gr.g);
        if (t >= a.block_size) {
            continue;
        }
        size_t v = (size_t)c.h * a.block_size + t;
        uint8_t *codes = c.data + v * a.head_dim;
        if (!live) {
            for (uint32_t k = gr.lane; k < chunks; k += gr.g) {
                if (VEC) {
                    *reinterpret_cast<uint2 *>(codes + (size_t)k * 8) =
                        make_uint2(0, 0);
                } else {
                    codes[k] = 0;
                }
            }
            if (gr.lane == 0) {
                kvd_q8_store_scale<FP8>(c, v, 0.0f, 0);
            }
            continue;
        }
        kvd_q8<FP8> q(amax);
        const unsigned char *row = c.src + (int64_t)t * a.stride_token;
        for (uint32_t k = gr.lane; k < chunks; k += gr.g) {
            if (VEC) {
                float x[KVD_CHUNK];
                kvd_load_chunk<E>(row + (size_t)k * 16, true, x);
                *reinterpret_cast<uint2 *>(codes + (size_t)k * 8) =
                    q.encode8(x);
            } else {
                codes[k] = q.encode(kvd_load_elt<E>(a, c, t, k));
            }
        }
        if (gr.lane == 0) {
            kvd_q8_store_scale<FP8>(c, v, q.s, q.s16);
        }
    }
}

template <bool FP8>
__device__ __forceinline__ float kvd_q8_decode(uint8_t q, float s)
{
    if (FP8) {
        return kvd_dev_fp8_decode(q, s);
    }
    return (float)(int8_t)q * s;
}

// Decode: one thread per (valid token, chunk); no cross-thread state. CH
// is the number of chunks per row when the caller knows it (head_dim 64,
// 128, 256 on the vector path), 0 otherwise. A vector chunk whose scale is
// finite and (fp8) holds no NaN code decodes to values that are not NaN
// (finite times finite), so it converts two codes at a time and stores
// with the plain conversions; any other chunk takes the reference's rules
// element by element.
template <class E, bool FP8, bool VEC, uint32_t CH = 0>
__device__ void kvd_q8_decode_cta(const kvd_gs_args &a, const kvd_cta &c)
{
    const uint32_t step = VEC ? KVD_CHUNK : 1u;
    const uint32_t chunks = CH != 0 ? CH : a.head_dim / step;
    uint32_t n = c.valid * chunks;
    for (uint32_t k = threadIdx.x; k < n; k += blockDim.x) {
        uint32_t t = k / chunks;
        uint32_t ch = k - t * chunks;
        size_t v = (size_t)c.h * a.block_size + t;
        float s = FP8 ? reinterpret_cast<const float *>(c.meta)[v]
                      : kvd_dev_half_to_float(
                            reinterpret_cast<const uint16_t *>(c.meta)[v]);
        const uint8_t *codes = c.data + v * a.head_dim + (size_t)ch * step;
        if (!VEC) {
            kvd_store_elt<E>(a, c, t, ch, kvd_q8_decode<FP8>(codes[0], s));
            continue;
        }
        unsigned char *dst =
            c.src + (int64_t)t * a.stride_token + (size_t)ch * 16;
        uint2 w = *reinterpret_cast<const uint2 *>(codes);
        float x[KVD_CHUNK];
        if (isfinite(s) &&
            (!FP8 || (kvd_qf_e4m3x4_nan(w.x) | kvd_qf_e4m3x4_nan(w.y)) == 0)) {
#pragma unroll
            for (int j = 0; j < KVD_CHUNK; j += 2) {
                uint32_t word = (j < 4 ? w.x : w.y) >> (8 * (j & 3));
                if (FP8) {
                    __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2(
                        (__nv_fp8x2_storage_t)word, __NV_E4M3);
                    float2 f = __half22float2(__half2(h2));
                    x[j] = __fmul_rn(f.x, s);
                    x[j + 1] = __fmul_rn(f.y, s);
                } else {
                    x[j] = kvd_q8_decode<false>((uint8_t)word, s);
                    x[j + 1] = kvd_q8_decode<false>((uint8_t)(word >> 8), s);
                }
            }
            uint32_t o[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                o[j] = E::store2_fast(x[2 * j], x[2 * j + 1]);
            }
            *reinterpret_cast<uint4 *>(dst) =
                make_uint4(o[0], o[1], o[2], o[3]);
            continue;
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            x[j] = kvd_q8_decode<FP8>((uint8_t)(w.x >> (8 * j)), s);
            x[j + 4] = kvd_q8_decode<FP8>((uint8_t)(w.y >> (8 * j)), s);
        }
        kvd_store_chunk<E>(dst, true, x);
    }
}

// ---- int8 K: one scale per (head, channel) over the block's valid tokens ----

// Encode: phase 1 folds |x| per channel over the valid tokens (fmaxf:
// order-independent, as in kvd_group_amax) and stores the fp16 scales,
// meta [h][c], keeping the float scales and their reciprocals in `smem`
// (2 * head_dim floats, and on the vector path up to 1024 more for the
// partial folds of every thread; sized by the launch); phase 2, one thread
// per (token, chunk) writes the codes, zero for tokens >= valid, by the
// reciprocal where quant_fast.h allows it.
__device__ __forceinline__ void kvd_i8k_set_scale(uint32_t ch, float amax,
                                                  float *s_scale,
                                                  float *s_recip,
                                                  uint16_t *meta)
{
    kvd_q8<false> q(amax);
    s_scale[ch] = q.s;
    s_recip[ch] = q.r;
    meta[ch] = q.s16;
}

template <class E, bool VEC>
__device__ void kvd_i8k_encode_cta(const kvd_gs_args &a, const kvd_cta &c,
                                   unsigned char *smem)
{
    float *s_scale = reinterpret_cast<float *>(smem);
    float *s_recip = s_scale + a.head_dim; // 1 / scale, for the shortcut
    const uint32_t step = VEC ? KVD_CHUNK : 1u;
    const uint32_t chunks = a.head_dim / step;
    uint16_t *meta =
        reinterpret_cast<uint16_t *>(c.meta) + (size_t)c.h * a.head_dim;
    if (VEC) {
        // Every thread folds: thread (g, k) takes chunk k of tokens g,
        // g + groups, ... into partial amaxes, one row of head_dim floats
        // per group in smem after the scales; then one thread per channel
        // folds the groups (fmaxf: the order does not matter).
        float *s_part = s_recip + a.head_dim;
        const uint32_t groups = KVD_GS_THREADS / chunks;
        const uint32_t k = threadIdx.x % chunks, g = threadIdx.x / chunks;
        if (g < groups) {
            float amax[KVD_CHUNK];
#pragma unroll
            for (int j = 0; j < KVD_CHUNK; j++) {
                amax[j] = 0.0f;
            }
            for (uint32_t t = g; t < c.valid; t += groups) {
                float x[KVD_CHUNK];
                kvd_load_chunk<E>(c.src + (int64_t)t * a.stride_token +
                                      (size_t)k * 16,
                                  true, x);
#pragma unroll
                for (int j = 0; j < KVD_CHUNK; j++) {
                    amax[j] = fmaxf(amax[j], fabsf(x[j]));
                }
            }
            float4 *part = reinterpret_cast<float4 *>(
                s_part + (size_t)g * a.head_dim + (size_t)k * KVD_CHUNK);
            part[0] = make_float4(amax[0], amax[1], amax[2], amax[3]);
            part[1] = make_float4(amax[4], amax[5], amax[6], amax[7]);
        }
        __syncthreads();
        for (uint32_t ch = threadIdx.x; ch < a.head_dim; ch += blockDim.x) {
            float m = 0.0f;
            for (uint32_t gg = 0; gg < groups; gg++) {
                m = fmaxf(m, s_part[(size_t)gg * a.head_dim + ch]);
            }
            kvd_i8k_set_scale(ch, m, s_scale, s_recip, meta);
        }
    } else {
        // Unaligned rows: one thread per channel over the tokens.
        for (uint32_t ch = threadIdx.x; ch < a.head_dim; ch += blockDim.x) {
            float m = 0.0f;
            for (uint32_t t = 0; t < c.valid; t++) {
                m = fmaxf(m, fabsf(kvd_load_elt<E>(a, c, t, ch)));
            }
            kvd_i8k_set_scale(ch, m, s_scale, s_recip, meta);
        }
    }
    __syncthreads();

    const uint32_t n = a.block_size * chunks;
    for (uint32_t k = threadIdx.x; k < n; k += blockDim.x) {
        uint32_t t = k / chunks;
        uint32_t ch = k - t * chunks;
        uint8_t *codes = c.data +
                         ((size_t)c.h * a.block_size + t) * a.head_dim +
                         (size_t)ch * step;
        if (VEC) {
            uint2 out = make_uint2(0, 0);
            if (t < c.valid) {
                float x[KVD_CHUNK];
                kvd_load_chunk<E>(c.src + (int64_t)t * a.stride_token +
                                      (size_t)ch * 16,
                                  true, x);
                out = kvd_q8_codes8<false>(x, s_scale + (size_t)ch * KVD_CHUNK,
                                           s_recip + (size_t)ch * KVD_CHUNK);
            }
            *reinterpret_cast<uint2 *>(codes) = out;
        } else {
            codes[0] = t < c.valid ? kvd_i8_code(kvd_load_elt<E>(a, c, t, ch),
                                                 s_scale[ch])
                                   : 0;
        }
    }
}

// Decode: one thread per (valid token, chunk); the chunk's eight scales are
// one 16-byte load on the vector path (meta [h][c] with head_dim % 8 == 0).
template <class E, bool VEC>
__device__ void kvd_i8k_decode_cta(const kvd_gs_args &a, const kvd_cta &c)
{
    const uint32_t step = VEC ? KVD_CHUNK : 1u;
    const uint32_t chunks = a.head_dim / step;
    const uint16_t *meta =
        reinterpret_cast<const uint16_t *>(c.meta) + (size_t)c.h * a.head_dim;
    const uint32_t n = c.valid * chunks;
    for (uint32_t k = threadIdx.x; k < n; k += blockDim.x) {
        uint32_t t = k / chunks;
        uint32_t ch = k - t * chunks;
        const uint8_t *codes = c.data +
                               ((size_t)c.h * a.block_size + t) * a.head_dim +
                               (size_t)ch * step;
        if (VEC) {
            uint2 w = *reinterpret_cast<const uint2 *>(codes);
            uint4 m = *reinterpret_cast<const uint4 *>(meta + (size_t)ch * 8);
            uint32_t mw[4] = {m.x, m.y, m.z, m.w};
            float x[KVD_CHUNK];
#pragma unroll
            for (int j = 0; j < KVD_CHUNK; j++) {
                uint32_t code = (j < 4 ? w.x : w.y) >> (8 * (j & 3));
                uint16_t s16 = (uint16_t)(mw[j / 2] >> (16 * (j & 1)));
                x[j] = kvd_q8_decode<false>((uint8_t)code,
                                            kvd_dev_half_to_float(s16));
            }
            kvd_store_chunk<E>(
                c.src + (int64_t)t * a.stride_token + (size_t)ch * 16, true, x);
        } else {
            kvd_store_elt<E>(a, c, t, ch,
                             kvd_q8_decode<false>(
                                 codes[0], kvd_dev_half_to_float(meta[ch])));
        }
    }
}

#endif // KVD_KERNELS_CUDA_CODEC_DEV_CUH
