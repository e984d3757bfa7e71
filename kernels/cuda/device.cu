// Device discovery and the one place cudaError_t becomes kvd_status_t.
// Without a driver the runtime answers cudaErrorInsufficientDriver (35),
// without a device cudaErrorNoDevice (100): both mean "no GPU", not an error.
#include <cuda_runtime.h>

#include <stdlib.h>
#include <string.h>

#include "common/log_int.h"
#include "kvdepot/kernels_cuda.h"

extern "C" kvd_status_t kvd_cuda_status(int cuda_err, const char *what)
{
    cudaError_t err = (cudaError_t)cuda_err;
    if (err == cudaSuccess) {
        return KVD_OK;
    }
    KVD_LOG_ERROR("%s: %s (%d)", what, cudaGetErrorString(err), (int)err);
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
        return KVD_ERR_NO_DEVICE;
    }
    if (err == cudaErrorMemoryAllocation) {
        return KVD_ERR_NOMEM;
    }
    return KVD_ERR_DEVICE;
}

extern "C" kvd_status_t kvd_cuda_device_count(int *count_out)
{
    int count = 0; // left unchanged by the runtime on error
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
        (void)cudaGetLastError(); // clear the sticky-free error state
        count = 0;
    } else if (err != cudaSuccess) {
        return kvd_cuda_status(err, "cudaGetDeviceCount");
    }
    *count_out = count;
    return KVD_OK;
}

extern "C" kvd_status_t kvd_cuda_selftest(size_t len)
{
    int count = 0;
    kvd_status_t st = kvd_cuda_device_count(&count);
    if (st != KVD_OK) {
        return st;
    }
    if (count == 0) {
        return KVD_ERR_NO_DEVICE;
    }
    unsigned char *src = (unsigned char *)malloc(len);
    unsigned char *dst = (unsigned char *)malloc(len);
    void *dev = NULL;
    if (src == NULL || dst == NULL) {
        st = KVD_ERR_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < len; i++) {
        src[i] = (unsigned char)(i * 131u + 7u);
    }
    memset(dst, 0, len);
    st = kvd_cuda_status(cudaMalloc(&dev, len), "cudaMalloc");
    if (st != KVD_OK) {
        goto out;
    }
    st = kvd_cuda_status(cudaMemcpy(dev, src, len, cudaMemcpyHostToDevice),
                         "cudaMemcpy H2D");
    if (st == KVD_OK) {
        st = kvd_cuda_status(cudaMemcpy(dst, dev, len, cudaMemcpyDeviceToHost),
                             "cudaMemcpy D2H");
    }
    if (st == KVD_OK && memcmp(src, dst, len) != 0) {
        KVD_LOG_ERROR("cuda selftest: %zu bytes came back changed", len);
        st = KVD_ERR_INTERNAL;
    }
    cudaFree(dev);
out:
    free(src);
    free(dst);
    return st;
}
