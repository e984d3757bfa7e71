/*
 * Canonical-CBOR encoder: every encoded type against RFC 8949 Appendix A,
 * shortest-form boundaries of each head size, growth from caller storage
 * to the heap (and reuse after reset), and the latched errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/cbor_int.h"
#include "common/failpoint_int.h"

/* The NOMEM test asks for an impossible allocation; under ASan that must
 * return NULL instead of aborting the test. The sanitizer runtime looks
 * this hook up dynamically, so it must escape -fvisibility=hidden. */
__attribute__((visibility("default"))) const char *
__asan_default_options(void); /* NOLINT(readability-identifier-naming) */
__attribute__((visibility("default"))) const char *
__asan_default_options(void) /* NOLINT(readability-identifier-naming) */
{
    return "allocator_may_return_null=1";
}

static size_t hex_to_bytes(const char *hex, uint8_t *out, size_t cap)
{
    size_t n = strlen(hex) / 2;
    assert_true(n <= cap);
    for (size_t i = 0; i < n; i++) {
        unsigned v = 0;
        for (int j = 0; j < 2; j++) {
            char c = hex[2 * i + (size_t)j];
            v = v * 16 + (unsigned)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
        }
        out[i] = (uint8_t)v;
    }
    return n;
}

/* Asserts that `enc` holds exactly the bytes spelled by `hex`, then
 * empties it for the next vector. */
static void assert_encoded(kvd_cbor_enc_t *enc, const char *hex)
{
    uint8_t expect[256];
    size_t expect_len = hex_to_bytes(hex, expect, sizeof(expect));
    const uint8_t *data = NULL;
    size_t len = 0;

    assert_int_equal(kvd_cbor_enc_get(enc, &data, &len), KVD_OK);
    assert_int_equal(len, expect_len);
    assert_memory_equal(data, expect, len);
    kvd_cbor_enc_reset(enc);
}

static void test_rfc8949_integers(void **state)
{
    static const struct {
        uint64_t value;
        const char *hex;
    } uints[] = {
        {0, "00"},
        {1, "01"},
        {10, "0a"},
        {23, "17"},
        {24, "1818"},
        {25, "1819"},
        {100, "1864"},
        {1000, "1903e8"},
        {1000000, "1a000f4240"},
        {1000000000000ull, "1b000000e8d4a51000"},
        {18446744073709551615ull, "1bffffffffffffffff"},
        /* Boundaries of each head size. */
        {255, "18ff"},
        {256, "190100"},
        {65535, "19ffff"},
        {65536, "1a00010000"},
        {4294967295ull, "1affffffff"},
        {4294967296ull, "1b0000000100000000"},
    };
    static const struct {
        int64_t value;
        const char *hex;
    } ints[] = {
        {0, "00"},
        {1000000, "1a000f4240"},
        {-1, "20"},
        {-10, "29"},
        {-24, "37"},
        {-25, "3818"},
        {-100, "3863"},
        {-1000, "3903e7"},
        {-256, "38ff"},
        {-257, "390100"},
        {INT64_MAX, "1b7fffffffffffffff"},
        {INT64_MIN, "3b7fffffffffffffff"},
    };
    uint8_t storage[64];
    kvd_cbor_enc_t enc;
    (void)state;

    kvd_cbor_enc_init(&enc, storage, sizeof(storage), 0);
    for (size_t i = 0; i < sizeof(uints) / sizeof(uints[0]); i++) {
        kvd_cbor_pack_uint(&enc, uints[i].value);
        assert_encoded(&enc, uints[i].hex);
    }
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        kvd_cbor_pack_int(&enc, ints[i].value);
        assert_encoded(&enc, ints[i].hex);
    }
    /* -18446744073709551616, the most negative CBOR integer. */
    kvd_cbor_pack_negative(&enc, UINT64_MAX);
    assert_encoded(&enc, "3bffffffffffffffff");
    kvd_cbor_enc_cleanup(&enc);
}

static void test_rfc8949_strings(void **state)
{
    static const uint8_t bytes4[] = {1, 2, 3, 4};
    uint8_t storage[64];
    uint8_t big[300];
    kvd_cbor_enc_t enc;
    const uint8_t *data;
    size_t len;
    (void)state;

    kvd_cbor_enc_init(&enc, storage, sizeof(storage), 0);
    kvd_cbor_pack_bytes(&enc, NULL, 0);
    assert_encoded(&enc, "40");
    kvd_cbor_pack_bytes(&enc, bytes4, sizeof(bytes4));
    assert_encoded(&enc, "4401020304");
    kvd_cbor_pack_text(&enc, "", 0);
    assert_encoded(&enc, "60");
    kvd_cbor_pack_text(&enc, NULL, 0);
    assert_encoded(&enc, "60");
    kvd_cbor_pack_text(&enc, "a", 1);
    assert_encoded(&enc, "6161");
    kvd_cbor_pack_text(&enc, "IETF", 4);
    assert_encoded(&enc, "6449455446");
    kvd_cbor_pack_text(&enc, "\"\\", 2);
    assert_encoded(&enc, "62225c");
    kvd_cbor_pack_text(&enc, "\xc3\xbc", 2); /* "ü" */
    assert_encoded(&enc, "62c3bc");
    kvd_cbor_pack_text(&enc, "\xe6\xb0\xb4", 3); /* "水" */
    assert_encoded(&enc, "63e6b0b4");
    /* 32-byte bstr: the block-hash parent, a 1-byte length head. */
    memset(big, 0xab, sizeof(big));
    kvd_cbor_pack_bytes(&enc, big, 32);
    assert_int_equal(kvd_cbor_enc_get(&enc, &data, &len), KVD_OK);
    assert_int_equal(len, 34);
    assert_int_equal(data[0], 0x58);
    assert_int_equal(data[1], 32);
    assert_memory_equal(data + 2, big, 32);
    kvd_cbor_enc_cleanup(&enc);

    /* A 300-byte text string takes a 2-byte length. */
    kvd_cbor_enc_init(&enc, NULL, 0, KVD_CBOR_ENC_GROW);
    kvd_cbor_pack_text(&enc, (const char *)big, sizeof(big));
    assert_int_equal(kvd_cbor_enc_get(&enc, &data, &len), KVD_OK);
    assert_int_equal(len, 3 + sizeof(big));
    assert_int_equal(data[0], 0x79);
    assert_int_equal(data[1], 0x01);
    assert_int_equal(data[2], 0x2c);
    assert_memory_equal(data + 3, big, sizeof(big));
    kvd_cbor_enc_cleanup(&enc);
}

static void test_rfc8949_arrays_and_simple(void **state)
{
    uint8_t storage[64];
    kvd_cbor_enc_t enc;
    (void)state;

    kvd_cbor_enc_init(&enc, storage, sizeof(storage), 0);
    kvd_cbor_pack_array(&enc, 0);
    assert_encoded(&enc, "80");

    kvd_cbor_pack_array(&enc, 3);
    for (uint64_t i = 1; i <= 3; i++) {
        kvd_cbor_pack_uint(&enc, i);
    }
    assert_encoded(&enc, "83010203");

    kvd_cbor_pack_array(&enc, 3);
    kvd_cbor_pack_uint(&enc, 1);
    kvd_cbor_pack_array(&enc, 2);
    kvd_cbor_pack_uint(&enc, 2);
    kvd_cbor_pack_uint(&enc, 3);
    kvd_cbor_pack_array(&enc, 2);
    kvd_cbor_pack_uint(&enc, 4);
    kvd_cbor_pack_uint(&enc, 5);
    assert_encoded(&enc, "8301820203820405");

    kvd_cbor_pack_array(&enc, 25);
    for (uint64_t i = 1; i <= 25; i++) {
        kvd_cbor_pack_uint(&enc, i);
    }
    assert_encoded(&enc, "98190102030405060708090a0b0c0d0e0f101112131415"
                         "161718181819");

    kvd_cbor_pack_null(&enc);
    assert_encoded(&enc, "f6");
    kvd_cbor_pack_bool(&enc, true);
    assert_encoded(&enc, "f5");
    kvd_cbor_pack_bool(&enc, false);
    assert_encoded(&enc, "f4");
    kvd_cbor_enc_cleanup(&enc);
}

static void test_uint32_array_matches_item_by_item(void **state)
{
    static const uint32_t values[] = {0,
                                      1,
                                      23,
                                      24,
                                      255,
                                      256,
                                      65535,
                                      65536,
                                      16777216,
                                      1000000,
                                      UINT32_MAX - 1,
                                      UINT32_MAX};
    enum { N = sizeof(values) / sizeof(values[0]) };
    uint8_t one_by_one[128];
    uint8_t bulk[128];
    kvd_cbor_enc_t a;
    kvd_cbor_enc_t b;
    const uint8_t *da;
    const uint8_t *db;
    size_t la;
    size_t lb;
    (void)state;

    kvd_cbor_enc_init(&a, one_by_one, sizeof(one_by_one), 0);
    kvd_cbor_pack_array(&a, N);
    for (size_t i = 0; i < N; i++) {
        kvd_cbor_pack_uint(&a, values[i]);
    }
    assert_int_equal(kvd_cbor_enc_get(&a, &da, &la), KVD_OK);

    kvd_cbor_enc_init(&b, bulk, sizeof(bulk), 0);
    kvd_cbor_pack_uint32_array(&b, values, N);
    assert_int_equal(kvd_cbor_enc_get(&b, &db, &lb), KVD_OK);
    assert_int_equal(la, lb);
    assert_memory_equal(da, db, la);
    assert_encoded(&b, "8c000117181818ff19010019ffff1a000100001a01000000"
                       "1a000f42401afffffffe1affffffff");

    kvd_cbor_pack_uint32_array(&b, NULL, 0);
    assert_encoded(&b, "80");
    kvd_cbor_pack_uint32_array(&b, values, 3);
    assert_encoded(&b, "83000117");
    kvd_cbor_pack_uint32_array(&b, NULL, 2);
    assert_int_equal(kvd_cbor_enc_status(&b), KVD_ERR_INVALID);
    kvd_cbor_enc_cleanup(&b);
    kvd_cbor_enc_cleanup(&a);

    /* [23, 24, 255] is exactly 1 + 1 + 2 + 2 = 6 bytes: it fits a 6-byte
     * buffer, and a 5-byte one gets nothing at all. */
    kvd_cbor_enc_init(&b, bulk, 6, 0);
    kvd_cbor_pack_uint32_array(&b, values + 2, 3);
    assert_encoded(&b, "8317181818ff");
    kvd_cbor_enc_cleanup(&b);
    memset(bulk, 0, sizeof(bulk));
    kvd_cbor_enc_init(&b, bulk, 5, 0);
    kvd_cbor_pack_uint32_array(&b, values + 2, 3);
    assert_int_equal(kvd_cbor_enc_status(&b), KVD_ERR_RANGE);
    assert_int_equal(bulk[0], 0); /* not even the array head was written */
    kvd_cbor_enc_cleanup(&b);
}

/* The bytes of [0, 1, ..., n-1] as CBOR, built independently of the
 * encoder under test. */
static size_t expected_uint_array(uint8_t *out, size_t n)
{
    size_t len = 0;
    out[len++] = 0x99; /* array, 2-byte count */
    out[len++] = (uint8_t)(n >> 8);
    out[len++] = (uint8_t)n;
    for (size_t i = 0; i < n; i++) {
        if (i < 24) {
            out[len++] = (uint8_t)i;
        } else if (i < 256) {
            out[len++] = 0x18;
            out[len++] = (uint8_t)i;
        } else {
            out[len++] = 0x19;
            out[len++] = (uint8_t)(i >> 8);
            out[len++] = (uint8_t)i;
        }
    }
    return len;
}

static void test_growth_past_stack_storage(void **state)
{
    enum { N = 1000 };
    static uint8_t expect[3 + 3 * N];
    uint8_t storage[16];
    kvd_cbor_enc_t enc;
    const uint8_t *data;
    const uint8_t *first;
    size_t len;
    size_t expect_len = expected_uint_array(expect, N);
    (void)state;

    kvd_cbor_enc_init(&enc, storage, sizeof(storage), KVD_CBOR_ENC_GROW);
    kvd_cbor_pack_array(&enc, N);
    for (size_t i = 0; i < N; i++) {
        kvd_cbor_pack_uint(&enc, i);
    }
    assert_int_equal(kvd_cbor_enc_get(&enc, &data, &len), KVD_OK);
    assert_int_equal(len, expect_len);
    assert_memory_equal(data, expect, len);
    assert_true(data != storage);
    /* What was written before the move reached the heap intact, and the
     * caller's storage holds the first bytes it received. */
    assert_memory_equal(storage, expect, sizeof(storage));

    /* Reset keeps the heap buffer: a second item of the same size lands in
     * the same place. */
    first = data;
    kvd_cbor_enc_reset(&enc);
    kvd_cbor_pack_array(&enc, N);
    for (size_t i = 0; i < N; i++) {
        kvd_cbor_pack_uint(&enc, i);
    }
    assert_int_equal(kvd_cbor_enc_get(&enc, &data, &len), KVD_OK);
    assert_ptr_equal(data, first);
    assert_int_equal(len, expect_len);
    assert_memory_equal(data, expect, len);
    kvd_cbor_enc_cleanup(&enc);
    kvd_cbor_enc_cleanup(NULL);
}

static void test_latched_error_without_growth(void **state)
{
    uint8_t storage[8];
    kvd_cbor_enc_t enc;
    const uint8_t *data = NULL;
    size_t len = 12345;
    (void)state;

    kvd_cbor_enc_init(&enc, storage, sizeof(storage), 0);
    kvd_cbor_pack_uint(&enc, 1000000); /* 5 bytes: fits */
    assert_int_equal(kvd_cbor_enc_status(&enc), KVD_OK);
    kvd_cbor_pack_uint(&enc, 1000000); /* 5 more: does not */
    assert_int_equal(kvd_cbor_enc_status(&enc), KVD_ERR_RANGE);
    /* Later writes that would fit are ignored; the first error stays. */
    kvd_cbor_pack_null(&enc);
    kvd_cbor_pack_bytes(&enc, NULL, 1);
    assert_int_equal(kvd_cbor_enc_get(&enc, &data, &len), KVD_ERR_RANGE);
    assert_null(data);
    assert_int_equal(len, 12345);

    /* Reset clears the error; a string that does not fit whole writes
     * nothing, not a dangling head. */
    kvd_cbor_enc_reset(&enc);
    kvd_cbor_pack_uint(&enc, 7);
    kvd_cbor_pack_text(&enc, "too long", 8);
    assert_int_equal(kvd_cbor_enc_status(&enc), KVD_ERR_RANGE);
    kvd_cbor_enc_reset(&enc);
    kvd_cbor_pack_text(&enc, "fits", 4);
    assert_encoded(&enc, "6466697473");
    kvd_cbor_enc_cleanup(&enc);
}

static void test_invalid_arguments_latch(void **state)
{
    uint8_t storage[16];
    kvd_cbor_enc_t enc;
    const uint8_t *data;
    size_t len;
    (void)state;

    kvd_cbor_enc_init(&enc, storage, sizeof(storage), KVD_CBOR_ENC_GROW);
    kvd_cbor_pack_bytes(&enc, NULL, 3);
    assert_int_equal(kvd_cbor_enc_get(&enc, &data, &len), KVD_ERR_INVALID);
    kvd_cbor_enc_reset(&enc);
    kvd_cbor_pack_text(&enc, NULL, 1);
    assert_int_equal(kvd_cbor_enc_status(&enc), KVD_ERR_INVALID);
    kvd_cbor_enc_cleanup(&enc);

    /* NULL storage with a size is refused at init. */
    kvd_cbor_enc_init(&enc, NULL, 16, 0);
    assert_int_equal(kvd_cbor_enc_status(&enc), KVD_ERR_INVALID);
    kvd_cbor_enc_cleanup(&enc);

    /* No storage at all and no growth: the first byte is out of range. */
    kvd_cbor_enc_init(&enc, NULL, 0, 0);
    kvd_cbor_pack_null(&enc);
    assert_int_equal(kvd_cbor_enc_status(&enc), KVD_ERR_RANGE);
    kvd_cbor_enc_cleanup(&enc);
}

static void test_impossible_sizes(void **state)
{
    static const uint8_t byte = 0;
    uint8_t storage[16];
    kvd_cbor_enc_t enc;
    (void)state;

    /* Head plus payload would overflow size_t. */
    kvd_cbor_enc_init(&enc, storage, sizeof(storage), KVD_CBOR_ENC_GROW);
    kvd_cbor_pack_bytes(&enc, &byte, SIZE_MAX - 2);
    assert_int_equal(kvd_cbor_enc_status(&enc), KVD_ERR_RANGE);
    kvd_cbor_enc_cleanup(&enc);

    /* Representable but beyond KVD_CBOR_MAX_BYTES: refused before any
     * allocation (the payload is never read: the reservation fails). */
    kvd_cbor_enc_init(&enc, storage, sizeof(storage), KVD_CBOR_ENC_GROW);
    kvd_cbor_pack_uint(&enc, 1);
    kvd_cbor_pack_bytes(&enc, &byte, SIZE_MAX / 2);
    assert_int_equal(kvd_cbor_enc_status(&enc), KVD_ERR_RANGE);
    kvd_cbor_enc_cleanup(&enc);

    kvd_cbor_enc_init(&enc, storage, sizeof(storage), KVD_CBOR_ENC_GROW);
    kvd_cbor_pack_bytes(&enc, &byte, KVD_CBOR_MAX_BYTES);
    assert_int_equal(kvd_cbor_enc_status(&enc), KVD_ERR_RANGE);
    kvd_cbor_enc_cleanup(&enc);
}

static void test_grow_failure_latches_nomem(void **state)
{
    uint8_t storage[4];
    uint8_t payload[64] = {0};
    kvd_cbor_enc_t enc;
    (void)state;

#ifndef KVD_FAILPOINTS_ENABLED
    skip(); /* release build: failpoints are compiled out */
#endif
    assert_int_equal(kvd_failpoint_set("cbor.grow=ENOMEM", NULL, 0), KVD_OK);
    kvd_cbor_enc_init(&enc, storage, sizeof(storage), KVD_CBOR_ENC_GROW);
    kvd_cbor_pack_uint(&enc, 7); /* fits the caller's storage */
    assert_int_equal(kvd_cbor_enc_status(&enc), KVD_OK);
    kvd_cbor_pack_bytes(&enc, payload, sizeof(payload)); /* needs the heap */
    assert_int_equal(kvd_cbor_enc_status(&enc), KVD_ERR_NOMEM);
    /* Latched: later items fail too and nothing is appended. */
    kvd_cbor_pack_uint(&enc, 1);
    assert_int_equal(kvd_cbor_enc_status(&enc), KVD_ERR_NOMEM);
    kvd_cbor_enc_cleanup(&enc);
    kvd_failpoint_clear();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rfc8949_integers),
        cmocka_unit_test(test_rfc8949_strings),
        cmocka_unit_test(test_rfc8949_arrays_and_simple),
        cmocka_unit_test(test_uint32_array_matches_item_by_item),
        cmocka_unit_test(test_growth_past_stack_storage),
        cmocka_unit_test(test_latched_error_without_growth),
        cmocka_unit_test(test_invalid_arguments_latch),
        cmocka_unit_test(test_impossible_sizes),
        cmocka_unit_test(test_grow_failure_latches_nomem),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
