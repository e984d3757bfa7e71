// Paged gather/scatter of one layer on the GPU, with the KV codecs applied
// on the way (kvdepot/kernels_cuda.h is the contract, kernels/ref/gather.c
// the reference whose bytes we reproduce).
//
// Host side: every argument is validated with the reference's own pure
// checks (kvd_kv_layout_check, the object format) plus the CUDA-specific
// ones (staging alignment, block ids in range, element-aligned strides)
// before anything is enqueued, so an error never leaves half a layer
// behind. Then one kernel launch covers the planes that need SMs, grid
// (listed block, plane, head) of KVD_GS_THREADS threads; raw planes whose
// heads are contiguous token runs (vLLM HND, MLA, the TensorRT-LLM pool) go
// to the copy engine instead when each copy is large enough
// (KVD_CE_MIN_COPY_BYTES), so a pass-through save or load does not
// compete with the engine's kernels for SMs (LMCache PR #5067's finding);
// small copies cost the copy engine far more than the SMs they spare.
// Nothing is allocated and nothing synchronizes: block ids reach the kernel
// through the caller's device array, and the copy engine path builds its
// batches in fixed-size arrays on the host stack.
//
// Device side: the CTA reads its block id, computes the cache address of
// (plane, block, head) from the byte strides and its object's region
// offsets, and runs the codec for that plane (codec_dev.cuh for raw, fp8
// and int8, codec_kivi.cuh, codec_tq.cuh). The dtype and codec switches are
// uniform per CTA.
#include <cuda_runtime.h>

#include <stdlib.h>
#include <string.h>

#include "common/log_int.h"
#include "kernels/cuda/codec_kivi.cuh"
#include "kernels/cuda/codec_tq.cuh"
#include "kernels/cuda/rope_dev.cuh"
#include "kvdepot/kernels_cuda.h"

extern "C" {
#include "kernels/ref/tq_int.h"
}

struct kvd_cuda_tables {
    kvd_dev_tables *dev;
    uint32_t head_dim;
    uint64_t tq_seed;
};

// ---- kernel ----

// 16-byte rows with CH chunks (0: not known at compile time): the
// register encode up to 32 chunks (head_dim 256), the two-pass one beyond,
// the vector decode.
template <class E, bool FP8, bool GATHER, uint32_t CH>
__device__ void kvd_q8_vec_cta(const kvd_gs_args &a, const kvd_cta &c)
{
    if (!GATHER) {
        kvd_q8_decode_cta<E, FP8, true, CH>(a, c);
    } else if (a.head_dim <= 32 * KVD_CHUNK) {
        kvd_q8_encode_reg_cta<E, FP8, CH>(a, c);
    } else {
        kvd_q8_encode_cta<E, FP8, true>(a, c);
    }
}

// The common head sizes get their chunks per row (the encode's lane group
// size) fixed at compile time.
template <class E, bool FP8, bool GATHER>
__device__ void kvd_q8_cta(const kvd_gs_args &a, const kvd_cta &c)
{
    if (a.vec16) {
        switch (a.head_dim) {
        case 64: kvd_q8_vec_cta<E, FP8, GATHER, 8>(a, c); break;
        case 128: kvd_q8_vec_cta<E, FP8, GATHER, 16>(a, c); break;
        case 256: kvd_q8_vec_cta<E, FP8, GATHER, 32>(a, c); break;
        default: kvd_q8_vec_cta<E, FP8, GATHER, 0>(a, c); break;
        }
    } else if (GATHER) {
        kvd_q8_encode_cta<E, FP8, false>(a, c);
    } else {
        kvd_q8_decode_cta<E, FP8, false>(a, c);
    }
}

// int8: per-token scales on V (kvd_q8_cta), per-channel scales on K.
template <class E, bool GATHER>
__device__ void kvd_int8_cta(const kvd_gs_args &a, const kvd_cta &c,
                             unsigned char *smem)
{
    if (c.p != KVD_PLANE_K) {
        kvd_q8_cta<E, false, GATHER>(a, c);
    } else if (a.vec16) {
        if (GATHER) {
            kvd_i8k_encode_cta<E, true>(a, c, smem);
        } else {
            kvd_i8k_decode_cta<E, true>(a, c);
        }
    } else if (GATHER) {
        kvd_i8k_encode_cta<E, false>(a, c, smem);
    } else {
        kvd_i8k_decode_cta<E, false>(a, c);
    }
}

template <class E, bool GATHER>
__device__ void kvd_codec_cta(const kvd_gs_args &a, const kvd_cta &c, int codec,
                              unsigned char *smem)
{
    switch (codec) {
    case KVD_CODEC_FP8_E4M3: kvd_q8_cta<E, true, GATHER>(a, c); break;
    case KVD_CODEC_INT8: kvd_int8_cta<E, GATHER>(a, c, smem); break;
    case KVD_CODEC_KIVI4: kvd_kivi_cta<E, 4, GATHER>(a, c, smem); break;
    case KVD_CODEC_KIVI2: kvd_kivi_cta<E, 2, GATHER>(a, c, smem); break;
    case KVD_CODEC_TQ4: kvd_tq_cta_bits<E, 4, GATHER>(a, c, smem); break;
    case KVD_CODEC_TQ3: kvd_tq_cta_bits<E, 3, GATHER>(a, c, smem); break;
    case KVD_CODEC_TQ2: kvd_tq_cta_bits<E, 2, GATHER>(a, c, smem); break;
    default: break;
    }
}

// Rotates the K rows this CTA has just decoded by `delta` positions, while
// they are still in the caches: the bytes of a scatter followed by
// kvd_cuda_rope_shift_layer, without the second launch and its pass over
// memory. The host fuses only where this CTA wrote every row of its head
// (not the copy engine's planes, not KIVI K packed across heads). The
// barrier makes the decode's global writes visible to the whole CTA and
// frees the codec's shared memory for the table; `delta` is uniform over
// the CTA, so every thread reaches both barriers or none.
__device__ __noinline__ void kvd_rope_after_scatter(const kvd_gs_args &a,
                                                    const kvd_cta &c,
                                                    int64_t delta,
                                                    unsigned char *smem)
{
    if (delta == 0) {
        return;
    }
    __syncthreads();
    float *cos_s = reinterpret_cast<float *>(smem);
    float *sin_s = cos_s + a.rope_half;
    kvd_rope_table_dev(delta, a.rope_inv_freq, a.rope_half, cos_s, sin_s);
    __syncthreads();
    if (a.dtype == KVD_DTYPE_BF16) {
        kvd_rope_rows_dev<kvd_elt_bf16>(c.src, a.stride_token, c.valid,
                                        a.rope_half, a.rope_style, cos_s,
                                        sin_s);
    } else {
        kvd_rope_rows_dev<kvd_elt_fp16>(c.src, a.stride_token, c.valid,
                                        a.rope_half, a.rope_style, cos_s,
                                        sin_s);
    }
}

// At least KVD_GS_MIN_CTAS CTAs per SM: caps registers at 64 so the
// memory-bound codecs keep enough loads in flight (the widest paths,
// TurboQuant at head_dim 256 and KIVI V's 32-value groups, fit without
// spilling).
template <bool GATHER>
__global__ void __launch_bounds__(KVD_GS_THREADS, KVD_GS_MIN_CTAS)
    kvd_gs_kernel(const __grid_constant__ kvd_gs_args a)
{
    const uint32_t i = blockIdx.x;
    const int p = a.plane_of[blockIdx.y];
    const int32_t id = a.block_ids[i];
    // The host checked the ids it was given; a device array that disagrees
    // must still never send us outside the cache.
    if (id < 0 || (uint32_t)id >= a.num_cache_blocks) {
        return;
    }
    kvd_cta c;
    c.p = (uint32_t)p;
    c.h = blockIdx.z;
    c.valid = i + 1 == a.num_blocks ? a.valid_last : a.block_size;
    c.src = a.cache + (int64_t)p * a.stride_plane +
            (int64_t)id * a.stride_block + (int64_t)c.h * a.stride_head;
    c.obj = a.objects + (size_t)i * a.object_stride;
    c.data = c.obj + a.data_off[p];
    c.meta = c.obj + a.meta_off[p];
    if (GATHER && c.h == 0) {
        kvd_zero_pad(c.data, a.data_used[p], a.data_bytes[p]);
        kvd_zero_pad(c.meta, a.meta_used[p], a.meta_bytes[p]);
    }
    // Dynamic shared memory, sized by the launch for the codecs present:
    // KIVI K's and int8 K's per-channel parameters or TurboQuant's per-warp
    // row stage.
    extern __shared__ uint4 kvd_gs_smem[];
    unsigned char *smem = reinterpret_cast<unsigned char *>(kvd_gs_smem);
    const int codec = a.codec[p];
    if (codec == KVD_CODEC_RAW) {
        kvd_raw_dispatch<GATHER>(
            a, c,
            a.dtype == KVD_DTYPE_FP8_E4M3 || a.dtype == KVD_DTYPE_FP8_E5M2 ? 1
                                                                           : 2);
    } else if (a.dtype == KVD_DTYPE_BF16) {
        kvd_codec_cta<kvd_elt_bf16, GATHER>(a, c, codec, smem);
    } else {
        kvd_codec_cta<kvd_elt_fp16, GATHER>(a, c, codec, smem);
    }
    if (!GATHER && a.rope_deltas != nullptr && p == KVD_PLANE_K) {
        kvd_rope_after_scatter(a, c, a.rope_deltas[i], smem);
    }
}

// ---- codec tables ----

extern "C" kvd_status_t kvd_cuda_tables_create(const kvd_codec_tables_t *tables,
                                               kvd_cuda_tables_t **tables_out)
{
    static_assert(sizeof(((kvd_dev_tables *)0)->sign) ==
                      sizeof(((kvd_codec_tables_t *)0)->tq_sign),
                  "sign table layout");
    static_assert(sizeof(((kvd_dev_tables *)0)->centroid) ==
                      sizeof(((kvd_codec_tables_t *)0)->tq_centroid),
                  "centroid table layout");
    static_assert(sizeof(((kvd_dev_tables *)0)->bound) ==
                      sizeof(((kvd_codec_tables_t *)0)->tq_bound),
                  "bound table layout");
    if (tables == NULL || tables_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_dev_tables host;
    memcpy(host.sign, tables->tq_sign, sizeof(host.sign));
    memcpy(host.centroid, tables->tq_centroid, sizeof(host.centroid));
    memcpy(host.bound, tables->tq_bound, sizeof(host.bound));

    kvd_cuda_tables_t *t = (kvd_cuda_tables_t *)calloc(1, sizeof(*t));
    if (t == NULL) {
        return KVD_ERR_NOMEM;
    }
    kvd_status_t st = kvd_cuda_status(cudaMalloc(&t->dev, sizeof(host)),
                                      "cudaMalloc codec tables");
    if (st != KVD_OK) {
        goto err_free;
    }
    st = kvd_cuda_status(
        cudaMemcpy(t->dev, &host, sizeof(host), cudaMemcpyHostToDevice),
        "cudaMemcpy codec tables");
    if (st == KVD_OK) {
        // The pageable upload may still be in flight when cudaMemcpy
        // returns, and launches on non-blocking streams would not wait.
        st = kvd_cuda_status(cudaDeviceSynchronize(), "codec tables upload");
    }
    if (st != KVD_OK) {
        goto err_dev;
    }
    t->head_dim = tables->fmt.head_dim;
    t->tq_seed = tables->fmt.tq_seed;
    *tables_out = t;
    return KVD_OK;

err_dev:
    cudaFree(t->dev);
err_free:
    free(t);
    return st;
}

extern "C" void kvd_cuda_tables_destroy(kvd_cuda_tables_t *tables)
{
    if (tables == NULL) {
        return;
    }
    cudaFree(tables->dev);
    free(tables);
}

// ---- argument checks and launch parameters ----

static bool kvd_codec_is_tq_dev(int c)
{
    return c == KVD_CODEC_TQ4 || c == KVD_CODEC_TQ3 || c == KVD_CODEC_TQ2;
}

static unsigned kvd_codec_bits_dev(int c)
{
    switch (c) {
    case KVD_CODEC_KIVI2:
    case KVD_CODEC_TQ2: return 2;
    case KVD_CODEC_TQ3: return 3;
    case KVD_CODEC_KIVI4:
    case KVD_CODEC_TQ4: return 4;
    default: return 8;
    }
}

// Bytes of a plane's regions the codec writes (the rest is padding).
static void kvd_plane_used(const kvd_object_format_t *fmt, unsigned p,
                           size_t *data_used, size_t *meta_used)
{
    size_t vecs = (size_t)fmt->num_heads * fmt->block_size;
    size_t n = vecs * fmt->head_dim;
    int c = fmt->codec[p];
    switch (c) {
    case KVD_CODEC_RAW:
        *data_used = n * kvd_dtype_size(fmt->dtype);
        *meta_used = 0;
        break;
    case KVD_CODEC_FP8_E4M3:
        *data_used = n;
        *meta_used = vecs * 4;
        break;
    case KVD_CODEC_INT8:
        *data_used = n;
        *meta_used = p == KVD_PLANE_K
                         ? (size_t)fmt->num_heads * fmt->head_dim * 2
                         : vecs * 2;
        break;
    case KVD_CODEC_KIVI4:
    case KVD_CODEC_KIVI2:
        *data_used = (n * kvd_codec_bits_dev(c) + 7) / 8;
        *meta_used = p == KVD_PLANE_K
                         ? (size_t)fmt->num_heads * fmt->head_dim * 4
                         : vecs * (fmt->head_dim / 32) * 4;
        break;
    default: // TurboQuant
        *data_used = n * kvd_codec_bits_dev(c) / 8;
        *meta_used = vecs * 2;
        break;
    }
}

// OR of the base address and of the strides of every dimension that has
// more than one position (the others are never multiplied by a non-zero
// index, and kvd_kv_layout_check lets callers leave anything there).
static uint64_t kvd_layout_bits(const kvd_kv_layout_t *layout,
                                const kvd_object_format_t *fmt, unsigned layer)
{
    uint64_t bits = (uint64_t)(uintptr_t)layout->layer_base[layer];
    if (fmt->num_planes > 1) {
        bits |= (uint64_t)layout->stride_plane;
    }
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

// Smallest copy the copy engine is given. On an H100 (CUDA 13.0) a raw
// restore whose copies were one head of one 16-token block (4 KiB each,
// batched 128 per cudaMemcpyBatchAsync) moved 1 GB/s against 47-54 GB/s
// for the same bytes through the kernels; the SMs a kernel takes from
// the engine cost far less than that.
#define KVD_CE_MIN_COPY_BYTES ((size_t)256 << 10)

// A raw plane goes to the copy engine when every head's tokens are one
// contiguous run in the cache (as they are in the object), the region
// has no padding to zero, and each copy (a block's plane when its heads
// are adjacent too, else one head) is at least KVD_CE_MIN_COPY_BYTES.
static bool kvd_plane_copy_engine(const kvd_kv_layout_t *layout,
                                  const kvd_object_format_t *fmt,
                                  const kvd_gs_args *a, unsigned p)
{
    size_t row = (size_t)fmt->head_dim * kvd_dtype_size(fmt->dtype);
    size_t head_bytes = (size_t)fmt->block_size * row;
    bool adjacent = (uint64_t)layout->stride_head == head_bytes;
    size_t copy = head_bytes;
    if (fmt->num_heads == 1 || adjacent) {
        copy *= fmt->num_heads;
    }
    if (copy < KVD_CE_MIN_COPY_BYTES) {
        return false;
    }
    return fmt->codec[p] == KVD_CODEC_RAW &&
           (fmt->block_size == 1 || (uint64_t)layout->stride_token == row) &&
           a->data_used[p] == a->data_bytes[p];
}

static kvd_status_t
kvd_gs_prepare(const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
               const kvd_cuda_tables_t *tables, unsigned layer,
               const int32_t *block_ids, const int32_t *block_ids_dev,
               size_t num_blocks, uint32_t valid_last, const void *objects,
               size_t object_stride, kvd_gs_args *a, bool ce[2])
{
    char why[160];
    kvd_status_t st = kvd_kv_layout_check(layout, fmt, why, sizeof(why));
    if (st != KVD_OK) {
        KVD_LOG_ERROR("bad cache layout or format: %s", why);
        return st;
    }
    if (layer >= fmt->num_layers) {
        KVD_LOG_ERROR("layer %u but the format has %u", layer, fmt->num_layers);
        return KVD_ERR_INVALID;
    }
    for (unsigned p = 0; p < fmt->num_planes; p++) {
        if (kvd_codec_is_tq_dev(fmt->codec[p]) &&
            (tables == NULL || tables->head_dim != fmt->head_dim ||
             tables->tq_seed != fmt->tq_seed)) {
            KVD_LOG_ERROR("plane %u uses %s: device tables missing or built "
                          "for another head_dim/seed",
                          p, kvd_codec_name(fmt->codec[p]));
            return KVD_ERR_INVALID;
        }
    }
    if (num_blocks == 0) {
        return KVD_OK;
    }
    if (block_ids == NULL || block_ids_dev == NULL || objects == NULL) {
        KVD_LOG_ERROR("NULL block ids or staging for %zu blocks", num_blocks);
        return KVD_ERR_INVALID;
    }
    if (num_blocks > (size_t)INT32_MAX) {
        KVD_LOG_ERROR("%zu blocks in one call, at most %d", num_blocks,
                      INT32_MAX);
        return KVD_ERR_INVALID;
    }
    if (valid_last < 1 || valid_last > fmt->block_size) {
        KVD_LOG_ERROR("last block has %u valid tokens, block_size %u",
                      valid_last, fmt->block_size);
        return KVD_ERR_INVALID;
    }
    if (((uintptr_t)objects & 15u) != 0 || object_stride % 16 != 0 ||
        object_stride < kvd_object_bytes(fmt)) {
        KVD_LOG_ERROR("staging %p stride %zu: need 16-byte alignment and a "
                      "stride >= %zu, multiple of 16",
                      objects, object_stride, kvd_object_bytes(fmt));
        return KVD_ERR_INVALID;
    }
    for (size_t i = 0; i < num_blocks; i++) {
        if (block_ids[i] < 0 || (uint32_t)block_ids[i] >= layout->num_blocks) {
            KVD_LOG_ERROR("block id %d (entry %zu) outside 0..%u",
                          (int)block_ids[i], i, layout->num_blocks - 1);
            return KVD_ERR_RANGE;
        }
    }
    const size_t elt = kvd_dtype_size(fmt->dtype);
    const uint64_t bits = kvd_layout_bits(layout, fmt, layer);
    if (bits % elt != 0) {
        KVD_LOG_ERROR("layer %u: base or strides not multiples of the %zu-byte "
                      "element",
                      layer, elt);
        return KVD_ERR_UNSUPPORTED;
    }

    memset(a, 0, sizeof(*a));
    a->cache = (unsigned char *)layout->layer_base[layer];
    a->stride_plane = layout->stride_plane;
    a->stride_block = layout->stride_block;
    a->stride_token = layout->stride_token;
    a->stride_head = layout->stride_head;
    a->block_ids = block_ids_dev;
    a->num_cache_blocks = layout->num_blocks;
    a->objects = (unsigned char *)objects;
    a->object_stride = object_stride;
    a->num_blocks = (uint32_t)num_blocks;
    a->heads = fmt->num_heads;
    a->block_size = fmt->block_size;
    a->head_dim = fmt->head_dim;
    a->valid_last = valid_last;
    a->dtype = fmt->dtype;
    size_t off = kvd_object_layer_offset(fmt, layer);
    for (unsigned p = 0; p < fmt->num_planes; p++) {
        a->codec[p] = fmt->codec[p];
        a->data_off[p] = off;
        a->data_bytes[p] = kvd_object_plane_data_bytes(fmt, p);
        off += a->data_bytes[p];
        a->meta_off[p] = off;
        a->meta_bytes[p] = kvd_object_plane_meta_bytes(fmt, p);
        off += a->meta_bytes[p];
        kvd_plane_used(fmt, p, &a->data_used[p], &a->meta_used[p]);
    }
    const size_t row = (size_t)fmt->head_dim * elt;
    a->vec16 = elt == 2 && fmt->head_dim % KVD_CHUNK == 0 && bits % 16 == 0;
    unsigned unit = 16;
    while (unit > 1 && ((bits | row) & (unit - 1)) != 0) {
        unit >>= 1;
    }
    a->raw_unit = unit;
    a->kivi_k_whole = ((size_t)fmt->block_size * fmt->head_dim *
                       kvd_codec_bits_dev(fmt->codec[0])) %
                          8 !=
                      0;
    a->tables = tables != NULL ? tables->dev : NULL;
    if ((fmt->head_dim & (fmt->head_dim - 1)) == 0) {
        a->tq_inv_sqrt_d = kvd_ref_tq_inv_sqrt_dim(fmt->head_dim);
    }
    for (unsigned p = 0; p < 2; p++) {
        ce[p] = p < fmt->num_planes && kvd_plane_copy_engine(layout, fmt, a, p);
    }
    return KVD_OK;
}

// ---- copy engine ----

#define KVD_CE_BATCH 128

// Pending 1D copies for one cudaMemcpyBatchAsync call, on the host stack.
struct kvd_ce_batch {
    void *dst[KVD_CE_BATCH];
    const void *src[KVD_CE_BATCH];
    size_t size[KVD_CE_BATCH];
    size_t n;
    bool batched; // false: 2D copies (legacy stream, or no driver support)
    bool tried;   // a batch call has succeeded or fallen back already
    int device;
    cudaStream_t stream;
};

static kvd_status_t kvd_ce_flush(kvd_ce_batch *b)
{
    if (b->n == 0) {
        return KVD_OK;
    }
    cudaMemcpyAttributes attr;
    memset(&attr, 0, sizeof(attr));
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    // Location hints only matter for managed memory; ours is device memory.
    attr.srcLocHint.type = cudaMemLocationTypeDevice;
    attr.srcLocHint.id = b->device;
    attr.dstLocHint = attr.srcLocHint;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_idx = 0;
    cudaError_t err = cudaMemcpyBatchAsync(b->dst, b->src, b->size, b->n, &attr,
                                           &attr_idx, 1, b->stream);
    if (err != cudaSuccess && !b->tried &&
        (err == cudaErrorNotSupported || err == cudaErrorInvalidValue ||
         err == cudaErrorCallRequiresNewerDriver)) {
        // A driver older than the runtime (batching needs 12.8): fall back
        // to plain copies for this batch and 2D copies from now on.
        (void)cudaGetLastError();
        KVD_LOG_DEBUG("cudaMemcpyBatchAsync unavailable (%s): using 2D copies",
                      cudaGetErrorString(err));
        b->batched = false;
        for (size_t k = 0; k < b->n; k++) {
            err = cudaMemcpyAsync(b->dst[k], b->src[k], b->size[k],
                                  cudaMemcpyDeviceToDevice, b->stream);
            if (err != cudaSuccess) {
                break;
            }
        }
    }
    b->tried = true;
    b->n = 0;
    return kvd_cuda_status(err, "copy-engine batch");
}

static kvd_status_t kvd_ce_add(kvd_ce_batch *b, void *dst, const void *src,
                               size_t size)
{
    b->dst[b->n] = dst;
    b->src[b->n] = src;
    b->size[b->n] = size;
    b->n++;
    return b->n == KVD_CE_BATCH ? kvd_ce_flush(b) : KVD_OK;
}

// Moves plane p of listed block i between cache and object: one copy when
// the plane's heads are adjacent too, else one per head (or one 2D copy).
static kvd_status_t kvd_ce_plane(kvd_ce_batch *b, const kvd_gs_args *a,
                                 bool gather, const int32_t *block_ids,
                                 size_t i, unsigned p)
{
    size_t elt = kvd_dtype_size((kvd_dtype_t)a->dtype);
    size_t row = (size_t)a->head_dim * elt;
    size_t head_bytes = (size_t)a->block_size * row;
    uint32_t valid = i + 1 == a->num_blocks ? a->valid_last : a->block_size;
    unsigned char *cache = a->cache + (int64_t)p * a->stride_plane +
                           (int64_t)block_ids[i] * a->stride_block;
    unsigned char *obj = a->objects + i * a->object_stride + a->data_off[p];
    size_t cache_pitch =
        a->heads == 1 ? head_bytes : (size_t)(uint64_t)a->stride_head;
    kvd_status_t st = KVD_OK;

    if (!b->batched) {
        cudaError_t err =
            gather ? cudaMemcpy2DAsync(obj, head_bytes, cache, cache_pitch,
                                       valid * row, a->heads,
                                       cudaMemcpyDeviceToDevice, b->stream)
                   : cudaMemcpy2DAsync(cache, cache_pitch, obj, head_bytes,
                                       valid * row, a->heads,
                                       cudaMemcpyDeviceToDevice, b->stream);
        st = kvd_cuda_status(err, "cudaMemcpy2DAsync");
    } else if (valid == a->block_size && cache_pitch == head_bytes) {
        st = gather ? kvd_ce_add(b, obj, cache, a->heads * head_bytes)
                    : kvd_ce_add(b, cache, obj, a->heads * head_bytes);
    } else {
        for (uint32_t h = 0; h < a->heads && st == KVD_OK; h++) {
            unsigned char *c = cache + (int64_t)h * a->stride_head;
            unsigned char *o = obj + h * head_bytes;
            st = gather ? kvd_ce_add(b, o, c, valid * row)
                        : kvd_ce_add(b, c, o, valid * row);
        }
    }
    if (st == KVD_OK && gather && valid < a->block_size) {
        // The reference's object holds zeros past the valid tokens.
        st = kvd_cuda_status(cudaMemset2DAsync(obj + valid * row, head_bytes, 0,
                                               (a->block_size - valid) * row,
                                               a->heads, b->stream),
                             "cudaMemset2DAsync");
    }
    return st;
}

static kvd_status_t kvd_ce_run(const kvd_gs_args *a, const bool ce[2],
                               bool gather, const int32_t *block_ids,
                               size_t num_blocks, cudaStream_t stream)
{
    kvd_ce_batch b;
    b.n = 0;
    b.tried = false;
    b.stream = stream;
    // The batch API rejects the legacy default stream.
    b.batched = stream != NULL && stream != cudaStreamLegacy;
    b.device = 0;
    kvd_status_t st =
        kvd_cuda_status(cudaGetDevice(&b.device), "cudaGetDevice");
    for (size_t i = 0; i < num_blocks && st == KVD_OK; i++) {
        for (unsigned p = 0; p < 2 && st == KVD_OK; p++) {
            if (ce[p]) {
                st = kvd_ce_plane(&b, a, gather, block_ids, i, p);
            }
        }
    }
    if (st == KVD_OK) {
        st = kvd_ce_flush(&b);
    }
    return st;
}

// ---- entry points ----

// Dynamic shared memory of one launch: the largest need among the planes
// the kernel runs (12 KiB at most: int8 K at head_dim 1024).
static size_t kvd_gs_smem_bytes(const kvd_object_format_t *fmt, bool gather,
                                const bool ce[2])
{
    size_t bytes = 0;
    for (unsigned p = 0; p < fmt->num_planes; p++) {
        int c = fmt->codec[p];
        size_t need = 0;
        if (ce[p]) {
            continue;
        }
        if (gather && p == KVD_PLANE_K &&
            (c == KVD_CODEC_KIVI4 || c == KVD_CODEC_KIVI2) &&
            fmt->head_dim % KVD_CHUNK == 0) {
            need = 2 * sizeof(float) * fmt->head_dim;
        } else if (gather && p == KVD_PLANE_K && c == KVD_CODEC_INT8) {
            // Scales and reciprocals; with 16-byte chunks also the partial
            // folds, KVD_GS_THREADS / chunks rows of head_dim floats.
            need = 2 * sizeof(float) * fmt->head_dim;
            if (fmt->head_dim % KVD_CHUNK == 0) {
                need += sizeof(float) *
                        (KVD_GS_THREADS / (fmt->head_dim / KVD_CHUNK)) *
                        fmt->head_dim;
            }
        } else if (kvd_codec_is_tq_dev(c)) {
            need = KVD_GS_WARPS * sizeof(uint16_t) * fmt->head_dim;
        }
        bytes = need > bytes ? need : bytes;
    }
    return bytes;
}

// The rotation of a scatter with RoPE: fused into the kernel when the CTA
// of (block, K, head) writes every row of its head, else a launch of its
// own after the scatter's kernel and copies (same stream, same bytes).
struct kvd_gs_rope {
    const kvd_cuda_rope_t *rope; // NULL: no rotation
    const int64_t *deltas_dev;
    bool fused;
};

static kvd_status_t kvd_gs_submit(
    bool gather, const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
    const kvd_cuda_tables_t *tables, unsigned layer, const int32_t *block_ids,
    const int32_t *block_ids_dev, size_t num_blocks, uint32_t valid_last,
    const void *objects, size_t object_stride, kvd_gs_rope *rope, void *stream)
{
    kvd_gs_args a;
    bool ce[2] = {false, false};
    kvd_status_t st =
        kvd_gs_prepare(layout, fmt, tables, layer, block_ids, block_ids_dev,
                       num_blocks, valid_last, objects, object_stride, &a, ce);
    if (st != KVD_OK || num_blocks == 0) {
        return st;
    }
    cudaStream_t s = (cudaStream_t)stream;
    unsigned ny = 0;
    for (unsigned p = 0; p < fmt->num_planes; p++) {
        if (!ce[p]) {
            a.plane_of[ny++] = (int)p;
        }
    }
    const int kc = fmt->codec[KVD_PLANE_K];
    if (rope != NULL) {
        rope->fused = !ce[KVD_PLANE_K] &&
                      !(a.kivi_k_whole &&
                        (kc == KVD_CODEC_KIVI4 || kc == KVD_CODEC_KIVI2));
    }
    if (rope != NULL && rope->fused) {
        a.rope_deltas = rope->deltas_dev;
        a.rope_inv_freq = rope->rope->inv_freq;
        a.rope_half = rope->rope->host.rotary_dim / 2;
        a.rope_style = (int)rope->rope->host.style;
    }
    if (ny > 0) {
        dim3 grid((unsigned)num_blocks, ny, fmt->num_heads);
        size_t smem = kvd_gs_smem_bytes(fmt, gather, ce);
        const size_t table = 2 * sizeof(float) * a.rope_half;
        smem = table > smem ? table : smem;
        if (gather) {
            kvd_gs_kernel<true><<<grid, KVD_GS_THREADS, smem, s>>>(a);
        } else {
            kvd_gs_kernel<false><<<grid, KVD_GS_THREADS, smem, s>>>(a);
        }
        st = kvd_cuda_status(cudaGetLastError(),
                             gather ? "gather launch" : "scatter launch");
        if (st != KVD_OK) {
            return st;
        }
    }
    if (ce[0] || ce[1]) {
        st = kvd_ce_run(&a, ce, gather, block_ids, num_blocks, s);
    }
    return st;
}

extern "C" kvd_status_t kvd_cuda_gather_layer(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
    const kvd_cuda_tables_t *tables, unsigned layer, const int32_t *block_ids,
    const int32_t *block_ids_dev, size_t num_blocks,
    uint32_t num_valid_tokens_last, void *objects_dev_base,
    size_t object_stride_bytes, void *stream)
{
    return kvd_gs_submit(true, layout, fmt, tables, layer, block_ids,
                         block_ids_dev, num_blocks, num_valid_tokens_last,
                         objects_dev_base, object_stride_bytes, NULL, stream);
}

extern "C" kvd_status_t kvd_cuda_scatter_layer(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
    const kvd_cuda_tables_t *tables, unsigned layer, const int32_t *block_ids,
    const int32_t *block_ids_dev, size_t num_blocks,
    uint32_t num_valid_tokens_last, const void *objects_dev_base,
    size_t object_stride_bytes, void *stream)
{
    return kvd_gs_submit(false, layout, fmt, tables, layer, block_ids,
                         block_ids_dev, num_blocks, num_valid_tokens_last,
                         objects_dev_base, object_stride_bytes, NULL, stream);
}

extern "C" kvd_status_t kvd_cuda_scatter_layer_rope(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
    const kvd_cuda_tables_t *tables, const kvd_cuda_rope_t *rope,
    unsigned layer, const int32_t *block_ids, const int32_t *block_ids_dev,
    const int64_t *deltas_dev, size_t num_blocks,
    uint32_t num_valid_tokens_last, const void *objects_dev_base,
    size_t object_stride_bytes, void *stream)
{
    if (rope == NULL) {
        KVD_LOG_ERROR("cuda scatter with rope: NULL rope");
        return KVD_ERR_INVALID;
    }
    // Every check of both halves before anything is enqueued.
    kvd_status_t st =
        kvd_rope_args_check(layout, fmt, &rope->host, layer, block_ids,
                            deltas_dev, num_blocks, num_valid_tokens_last);
    if (st != KVD_OK) {
        return st;
    }
    kvd_gs_rope r = {rope, deltas_dev, false};
    st = kvd_gs_submit(false, layout, fmt, tables, layer, block_ids,
                       block_ids_dev, num_blocks, num_valid_tokens_last,
                       objects_dev_base, object_stride_bytes, &r, stream);
    if (st != KVD_OK || num_blocks == 0 || r.fused) {
        return st;
    }
    return kvd_cuda_rope_shift_layer(layout, fmt, rope, layer, block_ids,
                                     block_ids_dev, deltas_dev, num_blocks,
                                     num_valid_tokens_last, stream);
}
