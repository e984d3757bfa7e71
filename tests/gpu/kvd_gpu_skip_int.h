/*
 * The GPU suites' start: 77 (skipped) without CUDA in the build or without
 * a device, 1 when the runtime cannot count devices, -1 to run the tests.
 */
#ifndef KVD_TESTS_GPU_SKIP_INT_H
#define KVD_TESTS_GPU_SKIP_INT_H

#include <stdio.h>

#include "kvdepot/common.h"
#ifdef KVD_HAVE_CUDA
#include "kvdepot/kernels_cuda.h"
#endif

static inline int kvd_test_gpu_skip(void)
{
#ifndef KVD_HAVE_CUDA
    printf("built without CUDA: skipped\n");
    return 77;
#else
    int count = -1;
    if (kvd_cuda_device_count(&count) != KVD_OK) {
        printf("CUDA runtime failed to count devices\n");
        return 1;
    }
    if (count == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    return -1;
#endif
}

#endif /* KVD_TESTS_GPU_SKIP_INT_H */
