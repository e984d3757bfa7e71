/*
 * Internal C entry points into kernels/cuda. Only built when CMake found a
 * CUDA compiler (KVD_HAVE_CUDA defined); callers check that macro first.
 * Every function translates cudaError_t into kvd_status_t in one place
 * (kvd_cuda_status in device.cu) and logs the CUDA error string there.
 *
 * Five groups live here: device discovery (device.cu), the paged
 * gather/scatter kernels with their codecs (gather.cu, codec_*.cuh; the
 * contract and the object format are those of kvdepot/kernels.h, and the
 * bytes equal kvd_ref_gather_layer's), the RoPE re-rotation of reused keys
 * (rope.cu, the twin of kvd_ref_rope_shift_layer), the runtime wrappers the
 * worker's device backend drives its stream with (stream.cu), and small
 * synchronous helpers for tests and the bench program (util.cu, bench.cu).
 *
 * Errors, unless a function says more: KVD_ERR_INVALID for a NULL pointer
 * or a zero size where one is needed (checked before any CUDA call), else
 * the translation of the CUDA error by kvd_cuda_status (KVD_ERR_NO_DEVICE,
 * KVD_ERR_NOMEM, KVD_ERR_DEVICE). Streams, events, tables and memory made
 * here belong to the caller until the matching destroy / free call.
 *
 * Threading: every function is reentrant. Functions taking a `stream`
 * enqueue work on it and return without waiting; the others block the
 * calling host thread until their device work is done. Device memory passed
 * in is borrowed for the call (and, for the asynchronous functions, until
 * the enqueued work has executed on the stream).
 */
#ifndef KVDEPOT_KERNELS_CUDA_H
#define KVDEPOT_KERNELS_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvdepot/common.h"
#include "kvdepot/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Device discovery (device.cu)                                             */
/* ------------------------------------------------------------------------ */

/*
 * Number of usable CUDA devices. A machine without a driver or without a
 * device reports 0 and KVD_OK: callers treat that as "take the CPU path".
 */
kvd_status_t kvd_cuda_device_count(int *count_out);

/*
 * Copies `len` bytes host -> device -> host through a fresh device buffer
 * and checks they come back unchanged: proves the runtime, the driver and
 * DMA work. KVD_ERR_NO_DEVICE without a device, KVD_ERR_DEVICE on any CUDA
 * error, KVD_ERR_INTERNAL if the bytes differ.
 */
kvd_status_t kvd_cuda_selftest(size_t len);

/*
 * The one translation of a cudaError_t (passed as int so that C callers
 * need no CUDA header) into kvd_status_t: cudaSuccess -> KVD_OK, no driver
 * or no device -> KVD_ERR_NO_DEVICE, out of memory -> KVD_ERR_NOMEM,
 * anything else -> KVD_ERR_DEVICE. Logs `what` and the CUDA error string
 * for every error.
 */
kvd_status_t kvd_cuda_status(int cuda_err, const char *what);

/* ------------------------------------------------------------------------ */
/* Codec tables on the device (gather.cu)                                   */
/* ------------------------------------------------------------------------ */

/*
 * Device copy of a kvd_codec_tables_t: the TurboQuant sign vector,
 * codebooks and decision bounds, uploaded once so the kernels read exactly
 * the floats the reference uses. Immutable after create; one object may be
 * used by any number of concurrent launches on any stream of the device
 * that was current at create time.
 */
typedef struct kvd_cuda_tables kvd_cuda_tables_t;

/*
 * Allocates device memory on the current device and uploads `tables`
 * (synchronously: `tables` may be destroyed as soon as this returns).
 * Errors: KVD_ERR_INVALID (NULL argument), KVD_ERR_NOMEM (host or device),
 * KVD_ERR_NO_DEVICE, KVD_ERR_DEVICE. *tables_out is written on success only.
 */
kvd_status_t kvd_cuda_tables_create(const kvd_codec_tables_t *tables,
                                    kvd_cuda_tables_t **tables_out);

/* Frees the device copy; accepts NULL. The caller guarantees that no
 * launch using it is still pending (synchronize the streams first). */
void kvd_cuda_tables_destroy(kvd_cuda_tables_t *tables);

/* ------------------------------------------------------------------------ */
/* Paged gather / scatter (gather.cu)                                       */
/* ------------------------------------------------------------------------ */

/*
 * Gathers layer `layer` of each listed block from the engine cache on the
 * device, encodes it, and writes it into a device staging buffer: object i
 * (for block_ids[i]) starts at objects_dev_base + i * object_stride_bytes,
 * and this layer's bytes land at kvd_object_layer_offset(fmt, layer) inside
 * it. The bytes are those kvd_ref_gather_layer would write (bit-exact for
 * raw, fp8, int8 and KIVI; TurboQuant follows the same operation order and
 * is held to the tolerance of docs/codecs.md's parity contract), padding
 * and the tokens >= num_valid_tokens_last of the last block included
 * (zero).
 * Caches holding Inf or NaN may differ in NaN payloads only: GPU
 * arithmetic that creates a NaN (Inf / Inf) returns the canonical NaN.
 *
 * layout->layer_base is a host array of device pointers; the strides are
 * bytes. block_ids is a host array (validated here, before anything is
 * enqueued, and used for the copy-engine path); the host arguments
 * (layout, its layer_base array, fmt, block_ids) are read during the call
 * only and may be reused or freed once it returns; block_ids_dev holds the
 * same num_blocks ids in device memory, written by the caller in stream
 * order before this call (the kernels read it when they run).
 * `tables` may be NULL unless a plane uses TurboQuant; it must have been
 * made from kvd_codec_tables_create(fmt) (same head_dim and seed).
 * objects_dev_base must be 16-byte aligned and object_stride_bytes a
 * multiple of 16 and at least kvd_object_bytes(fmt).
 *
 * Work: one kernel launch for the planes that need SMs, grid (block,
 * plane, head); a raw plane on a layout whose heads are contiguous runs of
 * tokens (vLLM HND, MLA, the TensorRT-LLM pool) is moved by the copy
 * engine instead (cudaMemcpyBatchAsync, or 2D copies on the legacy default
 * stream or where batching is unsupported) when each copy (a block's
 * plane, or one head of it where heads are not adjacent) is at least
 * 256 KiB: smaller copies go through the kernel, which moves them tens of
 * times faster. Nothing is allocated and
 * nothing synchronizes: the call returns once the work is enqueued on
 * `stream` (a cudaStream_t; NULL is the default stream).
 *
 * Returns KVD_OK when enqueued (num_blocks == 0 enqueues nothing).
 * Errors, all before anything was enqueued: KVD_ERR_INVALID (bad format,
 * layout, layer, valid count, pointers, alignment, stride, or tables),
 * KVD_ERR_RANGE (a block id outside 0..layout->num_blocks-1),
 * KVD_ERR_UNSUPPORTED (base or strides not multiples of the element size).
 * A failed launch or copy returns KVD_ERR_DEVICE / KVD_ERR_NO_DEVICE; work
 * enqueued earlier in the same call may then still run.
 */
kvd_status_t kvd_cuda_gather_layer(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
    const kvd_cuda_tables_t *tables, unsigned layer, const int32_t *block_ids,
    const int32_t *block_ids_dev, size_t num_blocks,
    uint32_t num_valid_tokens_last, void *objects_dev_base,
    size_t object_stride_bytes, void *stream);

/*
 * Inverse of kvd_cuda_gather_layer, the device twin of
 * kvd_ref_scatter_layer: decodes layer `layer` of each staged object into
 * the listed blocks, writing tokens < valid count of the listed blocks and
 * nothing else. Block ids must be distinct: two objects scattered into one
 * block race. Same arguments, errors, engines and asynchrony as gather.
 */
kvd_status_t kvd_cuda_scatter_layer(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
    const kvd_cuda_tables_t *tables, unsigned layer, const int32_t *block_ids,
    const int32_t *block_ids_dev, size_t num_blocks,
    uint32_t num_valid_tokens_last, const void *objects_dev_base,
    size_t object_stride_bytes, void *stream);

/* ------------------------------------------------------------------------ */
/* RoPE re-rotation of reused keys (rope.cu)                                */
/* ------------------------------------------------------------------------ */

/*
 * Device copy of a kvd_rope_t: the rope and its kvd_rope_inv_freq
 * frequencies (doubles) in device memory, uploaded once so the kernel
 * reads exactly the values the reference uses. Immutable after create; one
 * object may be used by any number of concurrent launches on any stream of
 * the device that was current at create time.
 */
typedef struct kvd_cuda_rope kvd_cuda_rope_t;

/*
 * Allocates device memory on the current device and uploads `rope`'s
 * frequencies (synchronously: `rope` may be freed as soon as this
 * returns). Errors: KVD_ERR_INVALID (NULL argument, a rope kvd_rope_check
 * refuses as invalid), KVD_ERR_UNSUPPORTED (a style or scaling it does not
 * know), KVD_ERR_NOMEM (host or device), KVD_ERR_NO_DEVICE,
 * KVD_ERR_DEVICE. *rope_out is written on success only.
 */
kvd_status_t kvd_cuda_rope_create(const kvd_rope_t *rope,
                                  kvd_cuda_rope_t **rope_out);

/* Frees the device copy; accepts NULL. The caller guarantees that no
 * launch using it is still pending (synchronize the streams first). */
void kvd_cuda_rope_destroy(kvd_cuda_rope_t *rope);

/*
 * The device twin of kvd_ref_rope_shift_layer: rotates the K plane of
 * layer `layer` of each listed block in place by deltas[i] positions
 * (tokens < valid count only, rotary channels only, delta 0 untouched),
 * writing the bytes kvd_ref_rope_shift_layer writes (same angle reduction,
 * cosine and sine, float rotation without FMA and RNE rounding: the
 * arithmetic is shared source, kernels/ref/rope_int.h).
 *
 * Arguments as kvd_cuda_scatter_layer: layout->layer_base is a host array
 * of device pointers; block_ids is a host array, validated here before
 * anything is enqueued; block_ids_dev and deltas_dev hold the same
 * num_blocks ids and the deltas in device memory, written by the caller in
 * stream order before this call (the kernel reads them when it runs). The
 * host arguments are read during the call only. Block ids must be
 * distinct: two CTAs rotating one block race. `rope` comes from
 * kvd_cuda_rope_create and must describe fmt->head_dim.
 *
 * Work: one kernel launch, grid (listed block, head); each CTA computes
 * its block's cos/sin table in shared memory, then rotates its head's
 * valid rows. Nothing is allocated and nothing synchronizes: the call
 * returns once the launch is enqueued on `stream` (a cudaStream_t; NULL is
 * the default stream).
 *
 * Returns KVD_OK when enqueued (num_blocks == 0 enqueues nothing). Errors,
 * all before anything was enqueued: those of kvd_ref_rope_shift_layer
 * (with a NULL rope, block_ids_dev or deltas_dev as KVD_ERR_INVALID, and
 * more than INT32_MAX blocks too), and KVD_ERR_UNSUPPORTED for a base or
 * strides that are not multiples of the element size. A failed launch
 * returns KVD_ERR_DEVICE / KVD_ERR_NO_DEVICE.
 */
kvd_status_t kvd_cuda_rope_shift_layer(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
    const kvd_cuda_rope_t *rope, unsigned layer, const int32_t *block_ids,
    const int32_t *block_ids_dev, const int64_t *deltas_dev, size_t num_blocks,
    uint32_t num_valid_tokens_last, void *stream);

/*
 * The device twin of kvd_ref_scatter_layer_rope: kvd_cuda_scatter_layer,
 * then the K plane of each listed block rotated by deltas[i] positions as
 * kvd_cuda_rope_shift_layer rotates it, with the same bytes as those two
 * calls. Where the kernel decodes a block's K plane head by head (every
 * codec but raw planes that go to the copy engine and KIVI K packed across
 * heads), the CTA that decoded a head rotates it at once, while its rows
 * are still in the caches: one launch and one pass over the cache instead
 * of two. Elsewhere the rotation is a launch of its own after the
 * scatter's, on the same stream.
 *
 * Arguments as the two calls together (deltas_dev as
 * kvd_cuda_rope_shift_layer's, `rope` from kvd_cuda_rope_create). Errors:
 * those of both, all before anything was enqueued; a failed launch returns
 * KVD_ERR_DEVICE / KVD_ERR_NO_DEVICE, and what was enqueued before it in
 * the same call may still run.
 */
kvd_status_t kvd_cuda_scatter_layer_rope(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
    const kvd_cuda_tables_t *tables, const kvd_cuda_rope_t *rope,
    unsigned layer, const int32_t *block_ids, const int32_t *block_ids_dev,
    const int64_t *deltas_dev, size_t num_blocks,
    uint32_t num_valid_tokens_last, const void *objects_dev_base,
    size_t object_stride_bytes, void *stream);

/* ------------------------------------------------------------------------ */
/* Runtime wrappers for the worker's device backend (stream.cu)             */
/* ------------------------------------------------------------------------ */

/*
 * Streams and events are cudaStream_t / cudaEvent_t passed as void *; a
 * NULL stream is the legacy default stream. Enqueueing functions return
 * once the work is enqueued; only the *_wait functions block the calling
 * thread, and the allocation and registration functions are meant for
 * set-up time (they may synchronize the device). The CUDA runtime is
 * thread-safe: any thread may call these, work on one stream executes in
 * the order it was enqueued, whichever thread enqueued it.
 */

/* The calling thread's current device (cudaGetDevice). */
kvd_status_t kvd_cuda_device_get(int *device_out);
/* Makes `device` current for the calling thread (cudaSetDevice). */
kvd_status_t kvd_cuda_device_set(int device);

/*
 * Where `ptr` lives: *device_out is the device ordinal for device memory
 * (cudaMalloc, cudaMallocAsync, PyTorch's allocator) and -1 for anything
 * else (pageable, pinned or registered host memory, managed memory).
 * Errors: KVD_ERR_INVALID (NULL), KVD_ERR_NO_DEVICE, KVD_ERR_DEVICE.
 */
kvd_status_t kvd_cuda_pointer_query(const void *ptr, int *device_out);

/*
 * Page-locks [ptr, ptr + len) for DMA (cudaHostRegister, portable to every
 * device), so copies from and to it are single asynchronous DMAs. Slow:
 * once per mapping, at set-up. KVD_ERR_STATE when the range (or part of
 * it) is registered already; KVD_ERR_INVALID (NULL, 0), KVD_ERR_NOMEM,
 * KVD_ERR_NO_DEVICE, KVD_ERR_DEVICE (e.g. the OS refused to pin).
 */
kvd_status_t kvd_cuda_host_register(void *ptr, size_t len);
/* Undoes kvd_cuda_host_register(ptr); accepts NULL. No copy from or to the
 * range may be pending. */
void kvd_cuda_host_unregister(void *ptr);
/* Pinned, portable host memory of `len` bytes (cudaHostAlloc). */
kvd_status_t kvd_cuda_host_alloc(size_t len, void **host_out);
/* cudaFreeHost; accepts NULL. No copy from or to it may be pending. */
void kvd_cuda_host_free(void *host);

/* An event without timing (cudaEventDisableTiming), on the current
 * device. */
kvd_status_t kvd_cuda_event_create(void **event_out);
/* cudaEventDestroy; accepts NULL. */
void kvd_cuda_event_destroy(void *event);
/* Records `event` at the current end of `stream` (re-recording replaces
 * the previous capture; waits enqueued before see the old one). */
kvd_status_t kvd_cuda_event_record(void *event, void *stream);
/* Blocks until the work captured by the last record of `event` is done
 * (an event never recorded is done). Returns the first error of that
 * work. */
kvd_status_t kvd_cuda_event_wait(void *event);
/* Makes the work enqueued on `stream` from now on wait for the work
 * captured by `event`'s last record (no host blocking; an event never
 * recorded waits for nothing). */
kvd_status_t kvd_cuda_stream_wait_event(void *stream, void *event);
/* Blocks until every operation enqueued on `stream` so far is done
 * (cudaStreamSynchronize); returns the first error of that work. */
kvd_status_t kvd_cuda_stream_wait(void *stream);

/*
 * One asynchronous copy of `len` bytes between any host and device
 * pointers (cudaMemcpyDefault, unified addressing). With pinned or
 * registered host memory it is one DMA; with pageable memory the runtime
 * stages it (a device-to-pageable copy returns only once done). len 0:
 * nothing. Errors: KVD_ERR_INVALID, KVD_ERR_DEVICE, KVD_ERR_NO_DEVICE.
 */
kvd_status_t kvd_cuda_copy_async(void *dst, const void *src, size_t len,
                                 void *stream);

/*
 * n copies (dsts[k] <- srcs[k], sizes[k] bytes) in one
 * cudaMemcpyBatchAsync, all host-to-device (`to_device`) or all
 * device-to-host, with `device` the device side; the sources are read in
 * stream order. A driver or stream that cannot batch (older than 12.8, the
 * legacy default stream) gets n plain cudaMemcpyAsync instead. The batch
 * as a whole is ordered on the stream; copies within it are not ordered
 * among themselves (their ranges must not overlap). Errors as
 * kvd_cuda_copy_async.
 */
kvd_status_t kvd_cuda_copy_batch_async(void *const *dsts,
                                       const void *const *srcs,
                                       const size_t *sizes, size_t n,
                                       bool to_device, int device,
                                       void *stream);

/*
 * `height` copies of `width` bytes in one cudaMemcpy2DAsync: row r goes
 * from src + r * spitch to dst + r * dpitch, host to device or device to
 * host (cudaMemcpyDefault), ordered on the stream as one copy. Where the
 * host side is pinned or registered the copy engine moves the rows as one
 * operation instead of `height`. Both pitches must be at least `width`;
 * a pitch the device cannot take (over cudaDevAttrMaxPitch) gets
 * `height` plain copies instead. width or height 0: nothing. Errors as
 * kvd_cuda_copy_async.
 */
kvd_status_t kvd_cuda_copy_2d_async(void *dst, size_t dpitch, const void *src,
                                    size_t spitch, size_t width, size_t height,
                                    void *stream);

/* ------------------------------------------------------------------------ */
/* Synchronous helpers for tests and benchmarks (util.cu)                   */
/* ------------------------------------------------------------------------ */

/* cudaMalloc of `len` bytes (> 0) on the current device. */
kvd_status_t kvd_cuda_mem_create(size_t len, void **dev_out);
/* cudaFree; accepts NULL. Waits for the device to be idle first. */
void kvd_cuda_mem_destroy(void *dev);
/* Copies `len` bytes between any two host or device pointers (UVA), after
 * the work already on the default stream, and waits until the device is
 * idle (so work on any stream sees the bytes). */
kvd_status_t kvd_cuda_mem_copy(void *dst, const void *src, size_t len);
/* Sets `len` device bytes to `byte` and waits. */
kvd_status_t kvd_cuda_mem_set(void *dev, int byte, size_t len);
/* Waits until all work on the current device has finished and returns the
 * first error it reported (asynchronous kernel faults surface here). */
kvd_status_t kvd_cuda_device_wait(void);
/* A non-blocking stream (cudaStream_t as void *), e.g. to exercise the
 * batched copy-engine path, which the legacy default stream cannot use. */
kvd_status_t kvd_cuda_stream_create(void **stream_out);
/* Waits for the stream's work, then destroys it; accepts NULL. */
void kvd_cuda_stream_destroy(void *stream);

/*
 * Converts n floats to OCP E4M3 on the device with the same routine the
 * fp8 codec uses (cvt.rn.satfinite, NaN kept with its sign), so a test can
 * compare it with kvd_float_to_fp8_e4m3. `in` and `out` are host arrays;
 * synchronous. Errors: KVD_ERR_INVALID, KVD_ERR_NOMEM, KVD_ERR_NO_DEVICE,
 * KVD_ERR_DEVICE.
 */
kvd_status_t kvd_cuda_fp8_e4m3_encode(const float *in, uint8_t *out, size_t n);

/* ------------------------------------------------------------------------ */
/* Bandwidth benchmark (bench.cu)                                           */
/* ------------------------------------------------------------------------ */

/*
 * Measures the gather/scatter kernels on the current device for `fmt`
 * (layer count, heads, head_dim, block size, dtype and codecs as given):
 * allocates a vLLM FlashAttention NHD cache of num_blocks blocks per layer
 * (random values), a staging buffer of num_blocks objects and a block map
 * that visits the cache out of order, then times with CUDA events `iters`
 * rounds of
 *   gather + encode of all layers (one kvd_cuda_gather_layer per layer),
 *   decode + scatter of all layers, and
 *   one cudaMemcpyAsync device-to-device of the cache's bytes (the peer).
 * Rates are GB/s (1e9 bytes) counting bytes read plus bytes written: cache
 * bytes plus object layer bytes for gather and scatter, twice the cache
 * bytes for the copy. Frees everything before returning; blocks the
 * calling thread. Errors: KVD_ERR_INVALID (bad format, num_blocks or iters
 * 0, NULL outputs), KVD_ERR_NO_DEVICE without a GPU, KVD_ERR_NOMEM,
 * KVD_ERR_DEVICE. Outputs are written on success only.
 */
kvd_status_t kvd_cuda_bench_gather(const kvd_object_format_t *fmt,
                                   unsigned num_blocks, unsigned iters,
                                   double *gather_gbps, double *scatter_gbps,
                                   double *d2d_copy_gbps);

/*
 * Measures the fused decode + scatter + RoPE rotation
 * (kvd_cuda_scatter_layer_rope) against the same work in two launches
 * per layer (kvd_cuda_scatter_layer, then kvd_cuda_rope_shift_layer), on
 * the cache of kvd_cuda_bench_gather (fp16 or bf16 only), every block
 * rotated (NEOX over the whole head). Seven rounds of `iters` passes over
 * all layers, the two ways interleaved; *fused_ms is the median time of
 * one fused pass, ratio[0..2] the median, smallest and largest per-round
 * ratio fused / two launches. Errors as kvd_cuda_bench_gather's.
 */
kvd_status_t kvd_cuda_bench_scatter_rope(const kvd_object_format_t *fmt,
                                         unsigned num_blocks, unsigned iters,
                                         double *fused_ms, double ratio[3]);

#ifdef __cplusplus
}
#endif

#endif /* KVDEPOT_KERNELS_CUDA_H */
