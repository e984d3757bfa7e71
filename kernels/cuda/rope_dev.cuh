// Device-side RoPE re-rotation shared by the rotation kernel (rope.cu) and
// the scatter kernel that rotates what it just decoded (gather.cu): the
// device copy of a rope, the per-block cos/sin table and the rotation of
// one head's rows. The arithmetic is kernels/ref/rope_int.h, the source
// the C reference runs, so every path writes the reference's bytes.
#ifndef KVD_KERNELS_CUDA_ROPE_DEV_CUH
#define KVD_KERNELS_CUDA_ROPE_DEV_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/ref/rope_int.h"
#include "kvdepot/kernels.h"

struct kvd_cuda_rope {
    kvd_rope_t host;  // what the argument checks read
    double *inv_freq; // device, rotary_dim / 2 values
};

// cos and sin of delta * inv_freq[j] for the `half` pairs, computed by the
// CTA's threads into shared memory; the caller synchronizes before use.
__device__ __forceinline__ void kvd_rope_table_dev(int64_t delta,
                                                   const double *inv_freq,
                                                   uint32_t half, float *cos_s,
                                                   float *sin_s)
{
    for (uint32_t j = threadIdx.x; j < half; j += blockDim.x) {
        kvd_rope_sincos(kvd_rope_reduce(delta, inv_freq[j]), &cos_s[j],
                        &sin_s[j]);
    }
}

// Rotates the first `valid` rows of one head (rows `stride_token` bytes
// apart from `head`) with the table above. Consecutive threads take
// consecutive pairs, so NEOX rows are read and written in coalesced runs.
template <class E>
__device__ __forceinline__ void
kvd_rope_rows_dev(unsigned char *head, int64_t stride_token, uint32_t valid,
                  uint32_t half, int style, const float *cos_s,
                  const float *sin_s)
{
    // At most 4096 tokens * 512 pairs: fits 32 bits.
    const uint32_t n = valid * half;
    for (uint32_t k = threadIdx.x; k < n; k += blockDim.x) {
        const uint32_t t = k / half;
        const uint32_t j = k - t * half;
        uint16_t *row =
            reinterpret_cast<uint16_t *>(head + (int64_t)t * stride_token);
        const uint32_t c0 = kvd_rope_chan0(style, half, j);
        const uint32_t c1 = kvd_rope_chan1(style, half, j);
        float x1 = E::load(row[c0]);
        float x2 = E::load(row[c1]);
        kvd_rope_rotate(&x1, &x2, cos_s[j], sin_s[j]);
        row[c0] = E::store(x1);
        row[c1] = E::store(x2);
    }
}

#endif // KVD_KERNELS_CUDA_ROPE_DEV_CUH
