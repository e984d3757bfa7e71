/*
 * Internal C entry points into kernels/cuda. Only built when CMake found a
 * CUDA compiler (KVD_HAVE_CUDA defined); callers check that macro first.
 * Every function translates cudaError_t into kvd_status_t in one place
 * (kvd_cuda_status in device.cu) and logs the CUDA error string there.
 */
#ifndef KVD_KERNELS_CUDA_INT_H
#define KVD_KERNELS_CUDA_INT_H

#include "kvdepot/common.h"

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
}
#endif

#endif /* KVD_KERNELS_CUDA_INT_H */
