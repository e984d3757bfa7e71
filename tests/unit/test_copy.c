/*
 * kvd_copy_nt (common/copy_int.h): the non-temporal copy the cluster data
 * plane fills arena slots with. Every destination alignment and length
 * around its 16-byte head and 64-byte loop, checked byte for byte, and
 * the bytes just outside the destination untouched.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/copy_int.h"
#include "tests/unit/kvd_testdata_int.h"

enum { SPAN = 4096 + 256 };

static void pattern(uint8_t *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        p[i] = (uint8_t)kvd_test_rng(&seed);
    }
}

static void test_copy_nt_every_alignment(void **state)
{
    (void)state;
    uint8_t *src = malloc(SPAN), *dst = malloc(SPAN + 64);
    assert_non_null(src);
    assert_non_null(dst);
    pattern(src, SPAN, 1);
    static const size_t lens[] = {0,  1,  15,  16,  17,  63,   64,  65,
                                  79, 80, 127, 128, 129, 1000, 4096};
    for (size_t da = 0; da < 32; da++) {
        for (size_t sa = 0; sa < 3; sa++) {
            for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
                size_t n = lens[k];
                memset(dst, 0xA5, SPAN + 64);
                kvd_copy_nt(dst + 16 + da, src + sa, n);
                if (n > 0) {
                    assert_memory_equal(dst + 16 + da, src + sa, n);
                }
                for (size_t i = 0; i < 16 + da; i++) {
                    assert_int_equal(dst[i], 0xA5);
                }
                for (size_t i = 16 + da + n; i < SPAN + 64; i++) {
                    assert_int_equal(dst[i], 0xA5);
                }
            }
        }
    }
    free(src);
    free(dst);
}

/* An object's worth (2 MiB) in 60 KiB parts, as the data plane does. */
static void test_copy_nt_object_in_parts(void **state)
{
    (void)state;
    size_t n = 2u << 20, part = 61440;
    uint8_t *src = malloc(n), *dst = malloc(n);
    assert_non_null(src);
    assert_non_null(dst);
    pattern(src, n, 7);
    memset(dst, 0, n);
    for (size_t off = 0; off < n; off += part) {
        kvd_copy_nt(dst + off, src + off, n - off < part ? n - off : part);
    }
    assert_memory_equal(dst, src, n);
    free(src);
    free(dst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_nt_every_alignment),
        cmocka_unit_test(test_copy_nt_object_in_parts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
