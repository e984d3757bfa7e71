// TurboQuant-MSE on the device (kernels/ref/tq.c and tq_int.h are the
// contract): norm, sign flip, fast Walsh-Hadamard transform, Lloyd-Max
// bounds (searched, kernels/ref/quant_fast.h), BP32 bit planes, fp16 norm.
//
// One warp per (head, token) vector; lane l holds coordinates e*32 + l for
// e < head_dim/32, which is the layout the reference's parity rules are
// written for (docs/codecs.md, "CPU/GPU parity contract"):
//   - norm: per-lane sum over e in increasing order, then a xor butterfly
//     with offsets 16, 8, 4, 2, 1 (kvd_ref_tq_norm_sq emulates exactly this);
//   - FWHT stages h = 1, 2, ..., 16 across lanes with shuffles (the lane
//     whose bit h is clear computes mine + partner, the other partner -
//     mine, i.e. a + b and a - b as in kvd_ref_fwht), then h >= 32 inside
//     each lane's registers, so the stage order is the reference's;
//   - every multiply, add, divide and square root is an explicit _rn
//     intrinsic, so no FMA contraction can occur whatever the flags (the
//     target also builds with -fmad=false), and the multiply order is the
//     reference's: (x * s) * (1/g), u * (1/sqrt d), ((y * (1/sqrt d)) * s) *
//     norm.
//   - BP32: word W[e*bits + k] is __ballot_sync of bit k of the lanes' codes
//     of group e; lane e*bits + k stores it, so a vector's words go out in
//     one coalesced store.
// Rows are staged through shared memory so that the cache is read and
// written with 16-byte accesses when aligned.
#ifndef KVD_KERNELS_CUDA_CODEC_TQ_CUH
#define KVD_KERNELS_CUDA_CODEC_TQ_CUH

#include "kernels/cuda/codec_dev.cuh"

#define KVD_TQ_HALF_MAX_BITS 0x7bffu

// Loads vector (c.h, t) into x[e] = element e*32 + lane.
template <class E, int NE>
__device__ __forceinline__ void kvd_tq_load(const kvd_gs_args &a,
                                            const kvd_cta &c, uint32_t t,
                                            uint16_t *stage, float x[NE])
{
    const unsigned char *row = c.src + (int64_t)t * a.stride_token;
    uint32_t lane = threadIdx.x & 31u;
    if (a.vec16) {
        // NE*32 elements = NE*4 16-byte pieces, at most one per lane; each
        // lane tests its piece for NaN, and a vector without one converts
        // with the plain instruction (the test is warp-uniform).
        uint32_t nan = 0;
        if (lane < (uint32_t)NE * 4u) {
            uint4 v = reinterpret_cast<const uint4 *>(row)[lane];
            nan = E::word_nan(v.x) | E::word_nan(v.y) | E::word_nan(v.z) |
                  E::word_nan(v.w);
            reinterpret_cast<uint4 *>(stage)[lane] = v;
        }
        bool any_nan = __any_sync(KVD_FULL_MASK, nan != 0);
        __syncwarp();
        if (any_nan) {
#pragma unroll
            for (int e = 0; e < NE; e++) {
                x[e] = E::load(stage[e * 32 + lane]);
            }
        } else {
#pragma unroll
            for (int e = 0; e < NE; e++) {
                x[e] = E::load_fast(stage[e * 32 + lane]);
            }
        }
        __syncwarp(); // the stage is reused by the next vector
    } else {
        const uint16_t *p = reinterpret_cast<const uint16_t *>(row);
#pragma unroll
        for (int e = 0; e < NE; e++) {
            x[e] = E::load(p[e * 32 + lane]);
        }
    }
}

template <class E, int NE>
__device__ __forceinline__ void kvd_tq_store(const kvd_gs_args &a,
                                             const kvd_cta &c, uint32_t t,
                                             uint16_t *stage, const float x[NE])
{
    unsigned char *row = c.src + (int64_t)t * a.stride_token;
    uint32_t lane = threadIdx.x & 31u;
    if (a.vec16) {
        bool nan = false;
#pragma unroll
        for (int e = 0; e < NE; e++) {
            nan |= isnan(x[e]);
        }
        if (nan) {
#pragma unroll
            for (int e = 0; e < NE; e++) {
                stage[e * 32 + lane] = E::store(x[e]);
            }
        } else {
#pragma unroll
            for (int e = 0; e < NE; e++) {
                stage[e * 32 + lane] = E::store_fast(x[e]);
            }
        }
        __syncwarp();
        if (lane < (uint32_t)NE * 4u) {
            reinterpret_cast<uint4 *>(row)[lane] =
                reinterpret_cast<const uint4 *>(stage)[lane];
        }
        __syncwarp();
    } else {
        uint16_t *p = reinterpret_cast<uint16_t *>(row);
#pragma unroll
        for (int e = 0; e < NE; e++) {
            p[e * 32 + lane] = E::store(x[e]);
        }
    }
}

// Unnormalized FWHT over the warp's NE*32 coordinates, stages h = 1, 2, ...
// The upper lane's partner - mine is computed as (-mine) + partner, the
// same IEEE result, so every lane runs one add after flipping its own sign
// bit or not.
template <int NE> __device__ __forceinline__ void kvd_tq_fwht(float u[NE])
{
    uint32_t lane = threadIdx.x & 31u;
#pragma unroll
    for (uint32_t s = 0; s < 5; s++) {
        const uint32_t h = 1u << s;
        const uint32_t flip = (lane << (31u - s)) & 0x80000000u;
#pragma unroll
        for (int e = 0; e < NE; e++) {
            float p = __shfl_xor_sync(KVD_FULL_MASK, u[e], h);
            u[e] = __fadd_rn(__uint_as_float(__float_as_uint(u[e]) ^ flip), p);
        }
    }
#pragma unroll
    for (int hh = 1; hh < NE; hh <<= 1) { // h = 32 * hh
#pragma unroll
        for (int e = 0; e < NE; e++) {
            if ((e & hh) == 0) {
                float lo = u[e], hi = u[e + hh];
                u[e] = __fadd_rn(lo, hi);
                u[e + hh] = __fsub_rn(lo, hi);
            }
        }
    }
}

template <class E, int NE, unsigned BITS>
__device__ void kvd_tq_encode_cta(const kvd_gs_args &a, const kvd_cta &c,
                                  uint16_t *stage)
{
    const unsigned nbound = (1u << BITS) - 1u;
    const uint32_t lane = threadIdx.x & 31u;
    const uint32_t warp = threadIdx.x >> 5;
    const uint32_t words = NE * BITS; // u32 words per vector
    float sign[NE], bound[KVD_TQ_MAX_LEVELS - 1] = {};
#pragma unroll
    for (int e = 0; e < NE; e++) {
        sign[e] = __ldg(&a.tables->sign[e * 32 + lane]);
    }
#pragma unroll
    for (unsigned k = 0; k < nbound; k++) {
        bound[k] = __ldg(&a.tables->bound[BITS - 2][k]);
    }

    for (uint32_t t = warp; t < a.block_size; t += KVD_GS_WARPS) {
        size_t v = (size_t)c.h * a.block_size + t;
        uint32_t *out = reinterpret_cast<uint32_t *>(c.data) + v * words;
        uint16_t *norm_out = reinterpret_cast<uint16_t *>(c.meta) + v;
        if (t >= c.valid) {
            if (lane < words) {
                out[lane] = 0;
            }
            if (lane == 0) {
                *norm_out = 0;
            }
            continue;
        }
        float x[NE];
        kvd_tq_load<E, NE>(a, c, t, stage, x);

        float acc = 0.0f;
#pragma unroll
        for (int e = 0; e < NE; e++) {
            acc = __fadd_rn(acc, __fmul_rn(x[e], x[e]));
        }
#pragma unroll
        for (uint32_t o = 16; o >= 1; o >>= 1) {
            acc = __fadd_rn(acc, __shfl_xor_sync(KVD_FULL_MASK, acc, o));
        }
        // Every lane holds the same bits here (float addition commutes), so
        // the branches below are warp-uniform.
        float g = __fsqrt_rn(acc);
        uint16_t norm = 0;
        if (isfinite(g)) {
            norm = kvd_dev_float_to_half(g);
            if (norm > KVD_TQ_HALF_MAX_BITS) {
                norm = KVD_TQ_HALF_MAX_BITS;
            }
        }
        if (norm == 0) {
            if (lane < words) {
                out[lane] = 0;
            }
            if (lane == 0) {
                *norm_out = 0;
            }
            continue;
        }
        float inv_g = __fdiv_rn(1.0f, g);
#pragma unroll
        for (int e = 0; e < NE; e++) {
            x[e] = __fmul_rn(__fmul_rn(x[e], sign[e]), inv_g);
        }
        kvd_tq_fwht<NE>(x);

        uint32_t my_word = 0;
#pragma unroll
        for (int e = 0; e < NE; e++) {
            float y = __fmul_rn(x[e], a.tq_inv_sqrt_d);
            uint32_t code = kvd_qf_tq_code(y, bound, BITS);
#pragma unroll
            for (unsigned k = 0; k < BITS; k++) {
                uint32_t w = __ballot_sync(KVD_FULL_MASK, (code >> k) & 1u);
                if (lane == e * BITS + k) {
                    my_word = w;
                }
            }
        }
        if (lane < words) {
            out[lane] = my_word;
        }
        if (lane == 0) {
            *norm_out = norm;
        }
    }
}

template <class E, int NE, unsigned BITS>
__device__ void kvd_tq_decode_cta(const kvd_gs_args &a, const kvd_cta &c,
                                  uint16_t *stage)
{
    const uint32_t lane = threadIdx.x & 31u;
    const uint32_t warp = threadIdx.x >> 5;
    const uint32_t words = NE * BITS;
    const float *centroid = a.tables->centroid[BITS - 2];
    float sign[NE];
#pragma unroll
    for (int e = 0; e < NE; e++) {
        sign[e] = __ldg(&a.tables->sign[e * 32 + lane]);
    }

    for (uint32_t t = warp; t < c.valid; t += KVD_GS_WARPS) {
        size_t v = (size_t)c.h * a.block_size + t;
        float norm = kvd_dev_half_to_float(
            reinterpret_cast<const uint16_t *>(c.meta)[v]);
        float x[NE];
        if (norm == 0.0f) {
            // +0.0 exactly, as the reference: not a centroid times zero.
#pragma unroll
            for (int e = 0; e < NE; e++) {
                x[e] = 0.0f;
            }
            kvd_tq_store<E, NE>(a, c, t, stage, x);
            continue;
        }
        const uint32_t *in =
            reinterpret_cast<const uint32_t *>(c.data) + v * words;
        uint32_t my_word = lane < words ? in[lane] : 0u;
#pragma unroll
        for (int e = 0; e < NE; e++) {
            uint32_t code = 0;
#pragma unroll
            for (unsigned k = 0; k < BITS; k++) {
                uint32_t w = __shfl_sync(KVD_FULL_MASK, my_word, e * BITS + k);
                code |= ((w >> lane) & 1u) << k;
            }
            x[e] = __ldg(&centroid[code]);
        }
        kvd_tq_fwht<NE>(x);
#pragma unroll
        for (int e = 0; e < NE; e++) {
            x[e] = __fmul_rn(
                __fmul_rn(__fmul_rn(x[e], a.tq_inv_sqrt_d), sign[e]), norm);
        }
        kvd_tq_store<E, NE>(a, c, t, stage, x);
    }
}

// `smem` holds KVD_GS_WARPS * head_dim elements, 16-byte aligned (the
// launch sizes it); each warp stages its vector in its own slice.
template <class E, unsigned BITS, bool GATHER>
__device__ void kvd_tq_cta_bits(const kvd_gs_args &a, const kvd_cta &c,
                                unsigned char *smem)
{
    uint16_t *mine =
        reinterpret_cast<uint16_t *>(smem) + (threadIdx.x >> 5) * a.head_dim;
    switch (a.head_dim) {
    case 64:
        if (GATHER) {
            kvd_tq_encode_cta<E, 2, BITS>(a, c, mine);
        } else {
            kvd_tq_decode_cta<E, 2, BITS>(a, c, mine);
        }
        break;
    case 128:
        if (GATHER) {
            kvd_tq_encode_cta<E, 4, BITS>(a, c, mine);
        } else {
            kvd_tq_decode_cta<E, 4, BITS>(a, c, mine);
        }
        break;
    default: // 256; kvd_object_format_check admits nothing else
        if (GATHER) {
            kvd_tq_encode_cta<E, 8, BITS>(a, c, mine);
        } else {
            kvd_tq_decode_cta<E, 8, BITS>(a, c, mine);
        }
        break;
    }
}

#endif // KVD_KERNELS_CUDA_CODEC_TQ_CUH
