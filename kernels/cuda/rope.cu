// RoPE re-rotation of reused keys on the GPU (kvdepot/kernels_cuda.h is
// the contract, kernels/ref/rope.c the reference whose bytes we reproduce).
//
// Host side: the reference's own argument check (kvd_rope_args_check) plus
// the CUDA-specific ones (device id array, element-aligned strides), all
// before anything is enqueued; then one launch, grid (listed block, head).
// The frequencies were uploaded once by kvd_cuda_rope_create, block ids and
// deltas come from the caller's device arrays, so nothing is allocated and
// nothing synchronizes per call.
//
// Device side: the CTA reads its block id and delta (delta 0: nothing to
// do, the block is not even rewritten), computes the block's cos/sin per
// pair into shared memory with kernels/ref/rope_int.h, the same source the
// reference runs (angle reduction in double with fma, a Taylor series
// rather than CUDA's cos/sin, whose last bit differs from glibc's), then
// its threads walk (token, pair) of its head's valid rows (rope_dev.cuh,
// shared with the scatter kernel that rotates as it decodes, gather.cu).
// -fmad=false keeps the float rotation unfused, as the reference's
// -ffp-contract=off does.
#include <cuda_runtime.h>

#include <stdlib.h>
#include <string.h>

#include "common/log_int.h"
#include "kernels/cuda/codec_dev.cuh"
#include "kernels/cuda/rope_dev.cuh"
#include "kvdepot/kernels_cuda.h"

#define KVD_ROPE_THREADS 128

// Everything one launch needs, passed by value (__grid_constant__).
struct kvd_rope_args {
    unsigned char *cache; // this layer's base (plane 0 is K)
    int64_t stride_block, stride_token, stride_head;
    const int32_t *block_ids; // device copy of the ids
    const int64_t *deltas;    // device, one per listed block
    const double *inv_freq;   // device, `half` values
    uint32_t num_cache_blocks, num_blocks, block_size, valid_last, half;
    int style; // kvd_rope_style_t
};

// ---- kernel ----

template <class E>
__global__ void __launch_bounds__(KVD_ROPE_THREADS)
    kvd_rope_kernel(const __grid_constant__ kvd_rope_args a)
{
    __shared__ float cos_s[KVD_ROPE_MAX_PAIRS];
    __shared__ float sin_s[KVD_ROPE_MAX_PAIRS];
    const uint32_t i = blockIdx.x;
    const int32_t id = a.block_ids[i];
    const int64_t delta = a.deltas[i];
    // The host checked the ids it was given; a device array that disagrees
    // must still never send us outside the cache. Both exits are uniform
    // over the CTA, so no thread misses the barrier below.
    if (id < 0 || (uint32_t)id >= a.num_cache_blocks || delta == 0) {
        return;
    }
    kvd_rope_table_dev(delta, a.inv_freq, a.half, cos_s, sin_s);
    __syncthreads();

    const uint32_t valid = i + 1 == a.num_blocks ? a.valid_last : a.block_size;
    unsigned char *head = a.cache + (int64_t)id * a.stride_block +
                          (int64_t)blockIdx.y * a.stride_head;
    kvd_rope_rows_dev<E>(head, a.stride_token, valid, a.half, a.style, cos_s,
                         sin_s);
}

// ---- device rope ----

extern "C" kvd_status_t kvd_cuda_rope_create(const kvd_rope_t *rope,
                                             kvd_cuda_rope_t **rope_out)
{
    if (rope == NULL || rope_out == NULL) {
        return KVD_ERR_INVALID;
    }
    char why[160];
    kvd_status_t st = kvd_rope_check(rope, why, sizeof(why));
    if (st != KVD_OK) {
        KVD_LOG_ERROR("cuda rope: %s", why);
        return st;
    }
    double inv_freq[KVD_ROPE_MAX_PAIRS];
    st = kvd_rope_inv_freq(rope, inv_freq);
    if (st != KVD_OK) {
        return st;
    }
    const size_t bytes = (size_t)(rope->rotary_dim / 2) * sizeof(double);

    kvd_cuda_rope_t *r = (kvd_cuda_rope_t *)calloc(1, sizeof(*r));
    if (r == NULL) {
        return KVD_ERR_NOMEM;
    }
    st = kvd_cuda_status(cudaMalloc(&r->inv_freq, bytes),
                         "cudaMalloc rope frequencies");
    if (st != KVD_OK) {
        goto err_free;
    }
    st = kvd_cuda_status(
        cudaMemcpy(r->inv_freq, inv_freq, bytes, cudaMemcpyHostToDevice),
        "cudaMemcpy rope frequencies");
    if (st == KVD_OK) {
        // The pageable upload may still be in flight when cudaMemcpy
        // returns, and launches on non-blocking streams would not wait.
        st = kvd_cuda_status(cudaDeviceSynchronize(), "rope upload");
    }
    if (st != KVD_OK) {
        goto err_dev;
    }
    r->host = *rope;
    *rope_out = r;
    return KVD_OK;

err_dev:
    cudaFree(r->inv_freq);
err_free:
    free(r);
    return st;
}

extern "C" void kvd_cuda_rope_destroy(kvd_cuda_rope_t *rope)
{
    if (rope == NULL) {
        return;
    }
    cudaFree(rope->inv_freq);
    free(rope);
}

// ---- entry point ----

// OR of the base address and of the K-plane strides of every dimension
// that has more than one position (kvd_kv_layout_check lets callers leave
// anything in the others).
static uint64_t kvd_rope_layout_bits(const kvd_kv_layout_t *layout,
                                     const kvd_object_format_t *fmt,
                                     unsigned layer)
{
    uint64_t bits = (uint64_t)(uintptr_t)layout->layer_base[layer];
    if (layout->num_blocks > 1) {
        bits |= (uint64_t)layout->stride_block;
    }
    if (fmt->block_size > 1) {
        bits |= (uint64_t)layout->stride_token;
    }
    if (fmt->num_heads > 1) {
        bits |= (uint64_t)layout->stride_head;
    }
    return bits;
}

extern "C" kvd_status_t kvd_cuda_rope_shift_layer(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
    const kvd_cuda_rope_t *rope, unsigned layer, const int32_t *block_ids,
    const int32_t *block_ids_dev, const int64_t *deltas_dev, size_t num_blocks,
    uint32_t num_valid_tokens_last, void *stream)
{
    if (rope == NULL) {
        KVD_LOG_ERROR("cuda rope shift: NULL rope");
        return KVD_ERR_INVALID;
    }
    kvd_status_t st =
        kvd_rope_args_check(layout, fmt, &rope->host, layer, block_ids,
                            deltas_dev, num_blocks, num_valid_tokens_last);
    if (st != KVD_OK || num_blocks == 0) {
        return st;
    }
    if (block_ids_dev == NULL) {
        KVD_LOG_ERROR("cuda rope shift: NULL device block ids");
        return KVD_ERR_INVALID;
    }
    if (num_blocks > (size_t)INT32_MAX) {
        KVD_LOG_ERROR("cuda rope shift: %zu blocks in one call, at most %d",
                      num_blocks, INT32_MAX);
        return KVD_ERR_INVALID;
    }
    if (kvd_rope_layout_bits(layout, fmt, layer) % 2 != 0) {
        KVD_LOG_ERROR("cuda rope shift: layer %u base or strides not "
                      "multiples of the 2-byte element",
                      layer);
        return KVD_ERR_UNSUPPORTED;
    }

    kvd_rope_args a;
    memset(&a, 0, sizeof(a));
    a.cache = (unsigned char *)layout->layer_base[layer];
    a.stride_block = layout->stride_block;
    a.stride_token = layout->stride_token;
    a.stride_head = layout->stride_head;
    a.block_ids = block_ids_dev;
    a.deltas = deltas_dev;
    a.inv_freq = rope->inv_freq;
    a.num_cache_blocks = layout->num_blocks;
    a.num_blocks = (uint32_t)num_blocks;
    a.block_size = fmt->block_size;
    a.valid_last = num_valid_tokens_last;
    a.half = rope->host.rotary_dim / 2;
    a.style = (int)rope->host.style;

    dim3 grid((unsigned)num_blocks, fmt->num_heads);
    cudaStream_t s = (cudaStream_t)stream;
    if (fmt->dtype == KVD_DTYPE_BF16) {
        kvd_rope_kernel<kvd_elt_bf16><<<grid, KVD_ROPE_THREADS, 0, s>>>(a);
    } else {
        kvd_rope_kernel<kvd_elt_fp16><<<grid, KVD_ROPE_THREADS, 0, s>>>(a);
    }
    return kvd_cuda_status(cudaGetLastError(), "rope shift launch");
}
