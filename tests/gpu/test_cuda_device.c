/*
 * CUDA smoke test (label gpu): the runtime reports the device count without
 * a driver, and on a machine with a GPU a host->device->host copy returns
 * the same bytes. Exits 77 (skipped) when built without CUDA or run without
 * a device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "tests/gpu/kvd_gpu_skip_int.h"

#include "kvdepot/common.h"
#ifdef KVD_HAVE_CUDA
#include "kvdepot/kernels_cuda.h"

static void test_roundtrip(void **state)
{
    (void)state;
    assert_int_equal(kvd_cuda_selftest(64u << 20), KVD_OK);
    assert_int_equal(kvd_cuda_selftest(1), KVD_OK);
}
#endif

int main(void)
{
    int skip = kvd_test_gpu_skip();
    if (skip >= 0) {
        return skip;
    }
#ifdef KVD_HAVE_CUDA
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
