// Synchronous device-memory helpers for C callers that cannot include the
// CUDA runtime headers (the GPU tests, the bench program), and the device
// fp8 conversion hook the parity test compares with the reference.
// None of this is on a hot path: every call waits for its work.
#include <cuda_runtime.h>

#include "common/log_int.h"
#include "kernels/cuda/codec_dev.cuh"
#include "kvdepot/kernels_cuda.h"

extern "C" kvd_status_t kvd_cuda_mem_create(size_t len, void **dev_out)
{
    if (len == 0 || dev_out == NULL) {
        return KVD_ERR_INVALID;
    }
    void *dev = NULL;
    kvd_status_t st = kvd_cuda_status(cudaMalloc(&dev, len), "cudaMalloc");
    if (st == KVD_OK) {
        *dev_out = dev;
    }
    return st;
}

extern "C" void kvd_cuda_mem_destroy(void *dev)
{
    if (dev == NULL) {
        return;
    }
    // cudaFree synchronizes the device itself; an error here would only be
    // a fault of earlier work, which kvd_cuda_device_wait reports.
    (void)cudaFree(dev);
}

extern "C" kvd_status_t kvd_cuda_mem_copy(void *dst, const void *src,
                                          size_t len)
{
    if (len == 0) {
        return KVD_OK;
    }
    if (dst == NULL || src == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t st = kvd_cuda_status(
        cudaMemcpy(dst, src, len, cudaMemcpyDefault), "cudaMemcpy");
    // A pageable host->device cudaMemcpy may return before its DMA lands;
    // work on non-blocking streams would not wait for it.
    if (st == KVD_OK) {
        st = kvd_cuda_device_wait();
    }
    return st;
}

extern "C" kvd_status_t kvd_cuda_mem_set(void *dev, int byte, size_t len)
{
    if (len == 0) {
        return KVD_OK;
    }
    if (dev == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t st = kvd_cuda_status(cudaMemset(dev, byte, len), "cudaMemset");
    if (st == KVD_OK) {
        st = kvd_cuda_device_wait();
    }
    return st;
}

extern "C" kvd_status_t kvd_cuda_device_wait(void)
{
    return kvd_cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

extern "C" kvd_status_t kvd_cuda_stream_create(void **stream_out)
{
    if (stream_out == NULL) {
        return KVD_ERR_INVALID;
    }
    cudaStream_t s = NULL;
    kvd_status_t st =
        kvd_cuda_status(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                        "cudaStreamCreateWithFlags");
    if (st == KVD_OK) {
        *stream_out = (void *)s;
    }
    return st;
}

extern "C" void kvd_cuda_stream_destroy(void *stream)
{
    if (stream == NULL) {
        return;
    }
    (void)cudaStreamSynchronize((cudaStream_t)stream);
    (void)cudaStreamDestroy((cudaStream_t)stream);
}

__global__ void kvd_fp8_encode_kernel(const float *in, uint8_t *out, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        out[i] = kvd_dev_float_to_fp8(in[i]);
    }
}

extern "C" kvd_status_t kvd_cuda_fp8_e4m3_encode(const float *in, uint8_t *out,
                                                 size_t n)
{
    if (in == NULL || out == NULL || n == 0) {
        return KVD_ERR_INVALID;
    }
    float *d_in = NULL;
    uint8_t *d_out = NULL;
    kvd_status_t st = kvd_cuda_status(cudaMalloc(&d_in, n * sizeof(float)),
                                      "cudaMalloc fp8 input");
    if (st != KVD_OK) {
        return st;
    }
    st = kvd_cuda_status(cudaMalloc(&d_out, n), "cudaMalloc fp8 output");
    if (st != KVD_OK) {
        goto err_in;
    }
    st = kvd_cuda_status(
        cudaMemcpy(d_in, in, n * sizeof(float), cudaMemcpyHostToDevice),
        "cudaMemcpy fp8 input");
    if (st != KVD_OK) {
        goto err_out;
    }
    kvd_fp8_encode_kernel<<<256, 256>>>(d_in, d_out, n);
    st = kvd_cuda_status(cudaGetLastError(), "fp8 encode launch");
    if (st != KVD_OK) {
        goto err_out;
    }
    st = kvd_cuda_status(cudaMemcpy(out, d_out, n, cudaMemcpyDeviceToHost),
                         "cudaMemcpy fp8 output");
err_out:
    cudaFree(d_out);
err_in:
    cudaFree(d_in);
    return st;
}
