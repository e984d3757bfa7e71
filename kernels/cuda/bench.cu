// GPU bandwidth benchmark of the gather/scatter kernels, called by the
// bench program (kvdepot/kernels_cuda.h: kvd_cuda_bench_gather). It builds
// a vLLM FlashAttention NHD cache ([plane][block][token][head][channel] per
// layer, the layout that needs SMs even for raw), visits it through a
// strided permutation of block ids so the access pattern is paged rather
// than sequential, and compares with the device's own device-to-device
// memcpy of the same cache bytes, measured in the same run: the ratio is
// what the bench program reports (bench/README.md: benchmarks print a ratio
// against a peer).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdlib.h>
#include <string.h>

#include "common/log_int.h"
#include "kvdepot/kernels_cuda.h"

// Fills n 16-bit elements with values in [-2, 2) from a hash of the index
// (fp16 or bf16 bit patterns); fp8 caches get bytes in [-2, 2) as e4m3.
__global__ void kvd_bench_fill_kernel(uint16_t *p, size_t n, int bf16)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        float v = (float)(h & 0xffffu) * (4.0f / 65536.0f) - 2.0f;
        p[i] = bf16 ? (uint16_t)(__float_as_uint(v) >> 16)
                    : (uint16_t)__half_as_ushort(__float2half_rn(v));
    }
}

static unsigned kvd_gcd(unsigned a, unsigned b)
{
    while (b != 0) {
        unsigned t = a % b;
        a = b;
        b = t;
    }
    return a;
}

// Everything the benchmark allocates, released in one place.
struct kvd_bench_res {
    unsigned char *cache, *copy, *staging;
    int32_t *ids_dev;
    int32_t *ids;
    void **bases;
    kvd_codec_tables_t *tables;
    kvd_cuda_tables_t *dev_tables;
    cudaStream_t stream;
    cudaEvent_t start, stop;
    kvd_kv_layout_t layout; // the NHD cache over `cache`, every layer
    size_t cache_bytes, object_bytes;
};

// Checks the benchmark has a device to run on.
static kvd_status_t kvd_bench_device(void)
{
    int count = 0;
    kvd_status_t st = kvd_cuda_device_count(&count);
    if (st == KVD_OK && count == 0) {
        st = KVD_ERR_NO_DEVICE;
    }
    return st;
}

// Ends a region timed from r->start (when `st` is still KVD_OK): records
// r->stop, waits for it and writes the milliseconds between the two.
static kvd_status_t kvd_bench_stop(kvd_bench_res *r, kvd_status_t st,
                                   float *ms_out)
{
    if (st == KVD_OK) {
        st = kvd_cuda_status(cudaEventRecord(r->stop, r->stream),
                             "cudaEventRecord");
    }
    if (st == KVD_OK) {
        st = kvd_cuda_status(cudaEventSynchronize(r->stop),
                             "cudaEventSynchronize");
    }
    if (st == KVD_OK) {
        st = kvd_cuda_status(cudaEventElapsedTime(ms_out, r->start, r->stop),
                             "cudaEventElapsedTime");
    }
    return st;
}

static void kvd_bench_release(kvd_bench_res *r)
{
    if (r->stop != NULL) {
        cudaEventDestroy(r->stop);
    }
    if (r->start != NULL) {
        cudaEventDestroy(r->start);
    }
    if (r->stream != NULL) {
        cudaStreamDestroy(r->stream);
    }
    kvd_cuda_tables_destroy(r->dev_tables);
    kvd_codec_tables_destroy(r->tables);
    free(r->bases);
    free(r->ids);
    cudaFree(r->ids_dev);
    cudaFree(r->staging);
    cudaFree(r->copy);
    cudaFree(r->cache);
}

// Runs `iters` rounds of gather (or scatter) over all layers and returns
// the elapsed milliseconds.
static kvd_status_t kvd_bench_time_layers(kvd_bench_res *r, bool gather,
                                          const kvd_kv_layout_t *layout,
                                          const kvd_object_format_t *fmt,
                                          unsigned num_blocks, unsigned iters,
                                          size_t object_bytes, float *ms_out)
{
    kvd_status_t st = kvd_cuda_status(cudaEventRecord(r->start, r->stream),
                                      "cudaEventRecord");
    for (unsigned it = 0; it < iters && st == KVD_OK; it++) {
        for (unsigned l = 0; l < fmt->num_layers && st == KVD_OK; l++) {
            st = gather ? kvd_cuda_gather_layer(layout, fmt, r->dev_tables, l,
                                                r->ids, r->ids_dev, num_blocks,
                                                fmt->block_size, r->staging,
                                                object_bytes, r->stream)
                        : kvd_cuda_scatter_layer(layout, fmt, r->dev_tables, l,
                                                 r->ids, r->ids_dev, num_blocks,
                                                 fmt->block_size, r->staging,
                                                 object_bytes, r->stream);
        }
    }
    return kvd_bench_stop(r, st, ms_out);
}

// Allocates and fills a vLLM FlashAttention NHD cache of `num_blocks`
// blocks per layer, its copy, staging for num_blocks objects, the block
// map, tables, stream and events; r->layout describes the cache.
static kvd_status_t kvd_bench_setup(kvd_bench_res *r,
                                    const kvd_object_format_t *fmt,
                                    unsigned num_blocks)
{
    const size_t row = (size_t)fmt->head_dim * kvd_dtype_size(fmt->dtype);
    const size_t block_bytes = row * fmt->num_heads * fmt->block_size;
    const size_t plane_bytes = block_bytes * num_blocks;
    const size_t layer_cache = plane_bytes * fmt->num_planes;
    const size_t cache_bytes = layer_cache * fmt->num_layers;
    const size_t object_bytes = kvd_object_bytes(fmt);
    r->cache_bytes = cache_bytes;
    r->object_bytes = object_bytes;
    kvd_status_t st = kvd_cuda_status(cudaMalloc(&r->cache, cache_bytes),
                                      "cudaMalloc bench cache");
    if (st == KVD_OK) {
        st = kvd_cuda_status(cudaMalloc(&r->copy, cache_bytes),
                             "cudaMalloc bench copy");
    }
    if (st == KVD_OK) {
        st = kvd_cuda_status(
            cudaMalloc(&r->staging, (size_t)num_blocks * object_bytes),
            "cudaMalloc bench staging");
    }
    if (st == KVD_OK) {
        st = kvd_cuda_status(
            cudaMalloc(&r->ids_dev, (size_t)num_blocks * sizeof(int32_t)),
            "cudaMalloc bench ids");
    }
    if (st != KVD_OK) {
        return st;
    }
    r->ids = (int32_t *)malloc((size_t)num_blocks * sizeof(int32_t));
    r->bases = (void **)calloc(fmt->num_layers, sizeof(void *));
    if (r->ids == NULL || r->bases == NULL) {
        return KVD_ERR_NOMEM;
    }
    for (unsigned l = 0; l < fmt->num_layers; l++) {
        r->bases[l] = r->cache + (size_t)l * layer_cache;
    }
    r->layout.layer_base = r->bases;
    r->layout.num_blocks = num_blocks;
    r->layout.stride_plane = (int64_t)plane_bytes;
    r->layout.stride_block = (int64_t)block_bytes;
    r->layout.stride_token = (int64_t)(row * fmt->num_heads);
    r->layout.stride_head = (int64_t)row;
    // Visit block (i * step) mod n: a permutation when gcd(step, n) = 1.
    unsigned step = 7919u % num_blocks;
    while (step == 0 || kvd_gcd(step, num_blocks) != 1) {
        step = (step + 1) % num_blocks;
        if (num_blocks == 1) {
            step = 1;
            break;
        }
    }
    for (unsigned i = 0; i < num_blocks; i++) {
        r->ids[i] = (int32_t)(((uint64_t)i * step) % num_blocks);
    }
    st = kvd_cuda_status(cudaMemcpy(r->ids_dev, r->ids,
                                    (size_t)num_blocks * sizeof(int32_t),
                                    cudaMemcpyHostToDevice),
                         "cudaMemcpy bench ids");
    if (st != KVD_OK) {
        return st;
    }
    if (kvd_dtype_is_fp8(fmt->dtype)) {
        st = kvd_cuda_status(cudaMemset(r->cache, 0x3c, cache_bytes),
                             "cudaMemset bench cache");
    } else {
        kvd_bench_fill_kernel<<<1024, 256>>>((uint16_t *)r->cache,
                                             cache_bytes / 2,
                                             fmt->dtype == KVD_DTYPE_BF16);
        st = kvd_cuda_status(cudaGetLastError(), "bench fill launch");
    }
    if (st == KVD_OK) {
        st = kvd_codec_tables_create(fmt, &r->tables);
    }
    if (st == KVD_OK) {
        st = kvd_cuda_tables_create(r->tables, &r->dev_tables);
    }
    if (st == KVD_OK) {
        st = kvd_cuda_status(
            cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking),
            "cudaStreamCreate");
    }
    if (st == KVD_OK) {
        st = kvd_cuda_status(cudaEventCreate(&r->start), "cudaEventCreate");
    }
    if (st == KVD_OK) {
        st = kvd_cuda_status(cudaEventCreate(&r->stop), "cudaEventCreate");
    }
    if (st == KVD_OK) {
        st = kvd_cuda_status(cudaDeviceSynchronize(), "bench setup");
    }
    return st;
}

extern "C" kvd_status_t
kvd_cuda_bench_gather(const kvd_object_format_t *fmt, unsigned num_blocks,
                      unsigned iters, double *gather_gbps, double *scatter_gbps,
                      double *d2d_copy_gbps)
{
    if (kvd_object_format_check(fmt, NULL, 0) != KVD_OK || num_blocks == 0 ||
        iters == 0 || gather_gbps == NULL || scatter_gbps == NULL ||
        d2d_copy_gbps == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t st = kvd_bench_device();
    if (st != KVD_OK) {
        return st;
    }
    kvd_bench_res r;
    memset(&r, 0, sizeof(r));
    float ms_gather = 0.0f, ms_scatter = 0.0f, ms_copy = 0.0f;
    st = kvd_bench_setup(&r, fmt, num_blocks);
    const kvd_kv_layout_t &layout = r.layout;
    const size_t cache_bytes = r.cache_bytes, object_bytes = r.object_bytes;
    if (st != KVD_OK) {
        goto out;
    }

    // One untimed round of each warms up code, TLBs and clocks.
    st = kvd_bench_time_layers(&r, true, &layout, fmt, num_blocks, 1,
                               object_bytes, &ms_gather);
    if (st == KVD_OK) {
        st = kvd_bench_time_layers(&r, false, &layout, fmt, num_blocks, 1,
                                   object_bytes, &ms_scatter);
    }
    if (st == KVD_OK) {
        st = kvd_bench_time_layers(&r, true, &layout, fmt, num_blocks, iters,
                                   object_bytes, &ms_gather);
    }
    if (st == KVD_OK) {
        st = kvd_bench_time_layers(&r, false, &layout, fmt, num_blocks, iters,
                                   object_bytes, &ms_scatter);
    }
    if (st == KVD_OK) {
        st = kvd_cuda_status(cudaEventRecord(r.start, r.stream),
                             "cudaEventRecord");
    }
    for (unsigned it = 0; it < iters && st == KVD_OK; it++) {
        st =
            kvd_cuda_status(cudaMemcpyAsync(r.copy, r.cache, cache_bytes,
                                            cudaMemcpyDeviceToDevice, r.stream),
                            "cudaMemcpyAsync bench copy");
    }
    st = kvd_bench_stop(&r, st, &ms_copy);
    if (st == KVD_OK) {
        // Read + written: every cache byte once, every object byte once.
        double staged = (double)object_bytes * num_blocks;
        double codec_bytes = ((double)cache_bytes + staged) * iters;
        double copy_bytes = 2.0 * (double)cache_bytes * iters;
        *gather_gbps = codec_bytes / (ms_gather * 1e6);
        *scatter_gbps = codec_bytes / (ms_scatter * 1e6);
        *d2d_copy_gbps = copy_bytes / (ms_copy * 1e6);
    }
out:
    kvd_bench_release(&r);
    return st;
}

// One timed round of decode + scatter with RoPE over all layers: fused
// (kvd_cuda_scatter_layer_rope) or in two launches per layer (scatter,
// then kvd_cuda_rope_shift_layer); milliseconds in *ms_out.
static kvd_status_t
kvd_bench_time_rope(kvd_bench_res *r, bool fused, const kvd_kv_layout_t *layout,
                    const kvd_object_format_t *fmt, const kvd_cuda_rope_t *rope,
                    const int64_t *deltas_dev, unsigned num_blocks,
                    unsigned iters, size_t object_bytes, float *ms_out)
{
    kvd_status_t st = kvd_cuda_status(cudaEventRecord(r->start, r->stream),
                                      "cudaEventRecord");
    for (unsigned it = 0; it < iters && st == KVD_OK; it++) {
        for (unsigned l = 0; l < fmt->num_layers && st == KVD_OK; l++) {
            if (fused) {
                st = kvd_cuda_scatter_layer_rope(
                    layout, fmt, r->dev_tables, rope, l, r->ids, r->ids_dev,
                    deltas_dev, num_blocks, fmt->block_size, r->staging,
                    object_bytes, r->stream);
                continue;
            }
            st = kvd_cuda_scatter_layer(layout, fmt, r->dev_tables, l, r->ids,
                                        r->ids_dev, num_blocks, fmt->block_size,
                                        r->staging, object_bytes, r->stream);
            if (st == KVD_OK) {
                st = kvd_cuda_rope_shift_layer(
                    layout, fmt, rope, l, r->ids, r->ids_dev, deltas_dev,
                    num_blocks, fmt->block_size, r->stream);
            }
        }
    }
    return kvd_bench_stop(r, st, ms_out);
}

static int kvd_bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

extern "C" kvd_status_t
kvd_cuda_bench_scatter_rope(const kvd_object_format_t *fmt, unsigned num_blocks,
                            unsigned iters, double *fused_ms, double ratio[3])
{
    if (kvd_object_format_check(fmt, NULL, 0) != KVD_OK || num_blocks == 0 ||
        iters == 0 || fused_ms == NULL || ratio == NULL ||
        kvd_dtype_is_fp8(fmt->dtype)) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t st = kvd_bench_device();
    if (st != KVD_OK) {
        return st;
    }
    enum { ROUNDS = 7 };
    double fused[ROUNDS], ratios[ROUNDS];
    float ms_f = 0.0f, ms_t = 0.0f;

    kvd_bench_res r;
    memset(&r, 0, sizeof(r));
    const kvd_kv_layout_t &layout = r.layout;
    const size_t &object_bytes = r.object_bytes;
    kvd_cuda_rope_t *rope = NULL;
    int64_t *deltas_dev = NULL;
    int64_t *deltas = (int64_t *)malloc(num_blocks * sizeof(int64_t));
    kvd_rope_t rh = {fmt->head_dim,
                     fmt->head_dim,
                     KVD_ROPE_NEOX,
                     10000.0,
                     KVD_ROPE_SCALING_NONE,
                     1.0,
                     0.0,
                     0.0,
                     0};
    if (deltas == NULL) {
        return KVD_ERR_NOMEM;
    }
    st = kvd_bench_setup(&r, fmt, num_blocks);
    if (st == KVD_OK) {
        st = kvd_cuda_rope_create(&rh, &rope);
    }
    if (st == KVD_OK) {
        st = kvd_cuda_status(cudaMalloc(&deltas_dev, num_blocks * 8),
                             "cudaMalloc bench deltas");
    }
    for (unsigned i = 0; i < num_blocks; i++) {
        deltas[i] = 1000 + (int64_t)i; // every block moves
    }
    if (st == KVD_OK) {
        st = kvd_cuda_status(cudaMemcpy(deltas_dev, deltas, num_blocks * 8,
                                        cudaMemcpyHostToDevice),
                             "cudaMemcpy bench deltas");
    }
    if (st != KVD_OK) {
        goto out;
    }
    // Objects to scatter (one gather round), then one untimed round of
    // each way; then rounds of the two ways interleaved.
    st = kvd_bench_time_layers(&r, true, &layout, fmt, num_blocks, 1,
                               object_bytes, &ms_f);
    for (int k = -1; k < ROUNDS && st == KVD_OK; k++) {
        st = kvd_bench_time_rope(&r, true, &layout, fmt, rope, deltas_dev,
                                 num_blocks, k < 0 ? 1 : iters, object_bytes,
                                 &ms_f);
        if (st == KVD_OK) {
            st = kvd_bench_time_rope(&r, false, &layout, fmt, rope, deltas_dev,
                                     num_blocks, k < 0 ? 1 : iters,
                                     object_bytes, &ms_t);
        }
        if (st == KVD_OK && k >= 0) {
            fused[k] = ms_f / iters;
            ratios[k] = (double)ms_f / ms_t;
        }
    }
    if (st == KVD_OK) {
        qsort(fused, ROUNDS, sizeof(double), kvd_bench_cmp_double);
        qsort(ratios, ROUNDS, sizeof(double), kvd_bench_cmp_double);
        *fused_ms = fused[ROUNDS / 2];
        ratio[0] = ratios[ROUNDS / 2];
        ratio[1] = ratios[0];
        ratio[2] = ratios[ROUNDS - 1];
    }
out:
    cudaFree(deltas_dev);
    kvd_cuda_rope_destroy(rope);
    free(deltas);
    kvd_bench_release(&r);
    return st;
}
