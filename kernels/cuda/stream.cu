// Thin, asynchronous CUDA runtime wrappers for the worker's device backend
// (worker/device_cuda.c), which must not include cuda_runtime.h: the
// current device, pointer queries, pinned and registered host memory,
// events, stream ordering and copies between host and device.
//
// Nothing here allocates per call or waits unless its name says it does
// (the *_wait functions, and the allocation/registration ones meant for
// set-up time). Every CUDA error goes through kvd_cuda_status, the one
// translation (device.cu), except the few codes that are answers rather
// than errors (memory registered already, batched copies unsupported by
// the driver), which are handled before it and never logged as errors.
#include <cuda_runtime.h>

#include <string.h>

#include "common/log_int.h"
#include "kvdepot/kernels_cuda.h"

// ---- devices and pointers ----

extern "C" kvd_status_t kvd_cuda_device_get(int *device_out)
{
    if (device_out == NULL) {
        return KVD_ERR_INVALID;
    }
    int dev = -1;
    kvd_status_t st = kvd_cuda_status(cudaGetDevice(&dev), "cudaGetDevice");
    if (st == KVD_OK) {
        *device_out = dev;
    }
    return st;
}

extern "C" kvd_status_t kvd_cuda_device_set(int device)
{
    if (device < 0) {
        return KVD_ERR_INVALID;
    }
    return kvd_cuda_status(cudaSetDevice(device), "cudaSetDevice");
}

extern "C" kvd_status_t kvd_cuda_pointer_query(const void *ptr, int *device_out)
{
    if (ptr == NULL || device_out == NULL) {
        return KVD_ERR_INVALID;
    }
    cudaPointerAttributes attr;
    memset(&attr, 0, sizeof(attr));
    cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
    if (err == cudaErrorInvalidValue) {
        // Older runtimes answer this for memory CUDA never saw: host memory.
        (void)cudaGetLastError();
        *device_out = -1;
        return KVD_OK;
    }
    kvd_status_t st = kvd_cuda_status(err, "cudaPointerGetAttributes");
    if (st != KVD_OK) {
        return st;
    }
    // Managed memory migrates on demand: not a place kernels and the copy
    // engine can treat as device memory. Registered or pinned host memory
    // is host memory.
    *device_out = attr.type == cudaMemoryTypeDevice ? attr.device : -1;
    return KVD_OK;
}

// ---- host memory ----

extern "C" kvd_status_t kvd_cuda_host_register(void *ptr, size_t len)
{
    if (ptr == NULL || len == 0) {
        return KVD_ERR_INVALID;
    }
    // Portable: pinned for every device of the process, not only the
    // current one (the arena serves all the process's workers).
    cudaError_t err = cudaHostRegister(ptr, len, cudaHostRegisterPortable);
    if (err == cudaErrorHostMemoryAlreadyRegistered) {
        (void)cudaGetLastError();
        return KVD_ERR_STATE;
    }
    return kvd_cuda_status(err, "cudaHostRegister");
}

extern "C" void kvd_cuda_host_unregister(void *ptr)
{
    if (ptr == NULL) {
        return;
    }
    (void)kvd_cuda_status(cudaHostUnregister(ptr), "cudaHostUnregister");
}

extern "C" kvd_status_t kvd_cuda_host_alloc(size_t len, void **host_out)
{
    if (len == 0 || host_out == NULL) {
        return KVD_ERR_INVALID;
    }
    void *p = NULL;
    kvd_status_t st = kvd_cuda_status(
        cudaHostAlloc(&p, len, cudaHostAllocPortable), "cudaHostAlloc");
    if (st == KVD_OK) {
        *host_out = p;
    }
    return st;
}

extern "C" void kvd_cuda_host_free(void *host)
{
    if (host == NULL) {
        return;
    }
    (void)kvd_cuda_status(cudaFreeHost(host), "cudaFreeHost");
}

// ---- events ----

extern "C" kvd_status_t kvd_cuda_event_create(void **event_out)
{
    if (event_out == NULL) {
        return KVD_ERR_INVALID;
    }
    cudaEvent_t ev = NULL;
    // No timing: recording and waiting on such events is the cheap kind.
    kvd_status_t st =
        kvd_cuda_status(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming),
                        "cudaEventCreateWithFlags");
    if (st == KVD_OK) {
        *event_out = (void *)ev;
    }
    return st;
}

extern "C" void kvd_cuda_event_destroy(void *event)
{
    if (event == NULL) {
        return;
    }
    (void)kvd_cuda_status(cudaEventDestroy((cudaEvent_t)event),
                          "cudaEventDestroy");
}

extern "C" kvd_status_t kvd_cuda_event_record(void *event, void *stream)
{
    if (event == NULL) {
        return KVD_ERR_INVALID;
    }
    return kvd_cuda_status(
        cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream),
        "cudaEventRecord");
}

extern "C" kvd_status_t kvd_cuda_event_wait(void *event)
{
    if (event == NULL) {
        return KVD_ERR_INVALID;
    }
    return kvd_cuda_status(cudaEventSynchronize((cudaEvent_t)event),
                           "cudaEventSynchronize");
}

extern "C" kvd_status_t kvd_cuda_stream_wait_event(void *stream, void *event)
{
    if (event == NULL) {
        return KVD_ERR_INVALID;
    }
    return kvd_cuda_status(
        cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0),
        "cudaStreamWaitEvent");
}

extern "C" kvd_status_t kvd_cuda_stream_wait(void *stream)
{
    return kvd_cuda_status(cudaStreamSynchronize((cudaStream_t)stream),
                           "cudaStreamSynchronize");
}

// ---- copies ----

extern "C" kvd_status_t kvd_cuda_copy_async(void *dst, const void *src,
                                            size_t len, void *stream)
{
    if (len == 0) {
        return KVD_OK;
    }
    if (dst == NULL || src == NULL) {
        return KVD_ERR_INVALID;
    }
    return kvd_cuda_status(
        cudaMemcpyAsync(dst, src, len, cudaMemcpyDefault, (cudaStream_t)stream),
        "cudaMemcpyAsync");
}

extern "C" kvd_status_t kvd_cuda_copy_batch_async(void *const *dsts,
                                                  const void *const *srcs,
                                                  const size_t *sizes, size_t n,
                                                  bool to_device, int device,
                                                  void *stream)
{
    if (n == 0) {
        return KVD_OK;
    }
    if (dsts == NULL || srcs == NULL || sizes == NULL || device < 0) {
        return KVD_ERR_INVALID;
    }
    cudaMemLocation host_loc, dev_loc;
    memset(&host_loc, 0, sizeof(host_loc));
    memset(&dev_loc, 0, sizeof(dev_loc));
    host_loc.type = cudaMemLocationTypeHost;
    dev_loc.type = cudaMemLocationTypeDevice;
    dev_loc.id = device;
    cudaMemcpyAttributes attr;
    memset(&attr, 0, sizeof(attr));
    // Stream order: the sources are written by earlier work of the stream
    // (a gather into staging) and must not be read before it.
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.srcLocHint = to_device ? host_loc : dev_loc;
    attr.dstLocHint = to_device ? dev_loc : host_loc;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_idx = 0;
    cudaError_t err = cudaMemcpyBatchAsync(dsts, srcs, sizes, n, &attr,
                                           &attr_idx, 1, (cudaStream_t)stream);
    if (err == cudaErrorNotSupported || err == cudaErrorInvalidValue ||
        err == cudaErrorCallRequiresNewerDriver) {
        // Batching needs a 12.8 driver and a non-legacy stream: one copy
        // each instead, same order, same stream. Nothing of the batch was
        // enqueued when it is refused.
        (void)cudaGetLastError();
        KVD_LOG_DEBUG("cudaMemcpyBatchAsync refused (%s): %zu plain copies",
                      cudaGetErrorString(err), n);
        err = cudaSuccess;
        for (size_t k = 0; k < n && err == cudaSuccess; k++) {
            err = cudaMemcpyAsync(dsts[k], srcs[k], sizes[k], cudaMemcpyDefault,
                                  (cudaStream_t)stream);
        }
    }
    return kvd_cuda_status(err, "batched copy");
}

extern "C" kvd_status_t kvd_cuda_copy_2d_async(void *dst, size_t dpitch,
                                               const void *src, size_t spitch,
                                               size_t width, size_t height,
                                               void *stream)
{
    if (width == 0 || height == 0) {
        return KVD_OK;
    }
    if (dst == NULL || src == NULL || dpitch < width || spitch < width) {
        return KVD_ERR_INVALID;
    }
    cudaError_t err =
        cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height,
                          cudaMemcpyDefault, (cudaStream_t)stream);
    if (err == cudaErrorInvalidPitchValue) {
        // A pitch over the device's limit: nothing was enqueued; the rows
        // one by one instead, same stream.
        (void)cudaGetLastError();
        KVD_LOG_DEBUG("cudaMemcpy2DAsync refused pitch %zu / %zu: %zu copies",
                      dpitch, spitch, height);
        err = cudaSuccess;
        for (size_t r = 0; r < height && err == cudaSuccess; r++) {
            err = cudaMemcpyAsync((char *)dst + r * dpitch,
                                  (const char *)src + r * spitch, width,
                                  cudaMemcpyDefault, (cudaStream_t)stream);
        }
    }
    return kvd_cuda_status(err, "cudaMemcpy2DAsync");
}
