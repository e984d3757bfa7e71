/*
 * Hash primitives: kvd_sha256 against the FIPS 180-2 example vectors and its
 * argument errors; kvd_xxh3_64 against the reference values xxHash's own
 * sanity check (cli/xsum_sanity_check.c) publishes for every length class
 * of XXH3, plus alignment independence and avalanche.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/failpoint_int.h"
#include "common/hash_int.h"
#include "kvdepot/common.h"

static void hex_to_bytes(const char *hex, uint8_t *out, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned v = 0;
        for (int j = 0; j < 2; j++) {
            char c = hex[2 * i + (size_t)j];
            v = v * 16 + (unsigned)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
        }
        out[i] = (uint8_t)v;
    }
}

static void assert_sha256(const void *data, size_t len, const char *hex)
{
    uint8_t expect[KVD_SHA256_BYTES];
    uint8_t got[KVD_SHA256_BYTES];

    hex_to_bytes(hex, expect, sizeof(expect));
    memset(got, 0, sizeof(got));
    assert_int_equal(kvd_sha256(data, len, got), KVD_OK);
    assert_memory_equal(got, expect, sizeof(expect));
}

static void test_sha256_fips_vectors(void **state)
{
    static const char msg448[] =
        "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    (void)state;

    assert_sha256("", 0,
                  "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b"
                  "7852b855");
    assert_sha256(NULL, 0,
                  "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b"
                  "7852b855");
    assert_sha256("abc", 3,
                  "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61"
                  "f20015ad");
    assert_int_equal(strlen(msg448) * 8, 448);
    assert_sha256(msg448, strlen(msg448),
                  "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd4"
                  "19db06c1");
}

static void test_sha256_million_a(void **state)
{
    const size_t len = 1000000;
    char *buf = malloc(len);
    (void)state;

    assert_non_null(buf);
    memset(buf, 'a', len);
    assert_sha256(buf, len,
                  "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39cc"
                  "c7112cd0");
    free(buf);
}

static void test_sha256_rejects_bad_arguments(void **state)
{
    uint8_t out[KVD_SHA256_BYTES];
    uint8_t untouched[KVD_SHA256_BYTES];
    (void)state;

    memset(out, 0xa5, sizeof(out));
    memcpy(untouched, out, sizeof(out));
    assert_int_equal(kvd_sha256(NULL, 1, out), KVD_ERR_INVALID);
    assert_memory_equal(out, untouched, sizeof(out));
    assert_int_equal(kvd_sha256("abc", 3, NULL), KVD_ERR_INVALID);
}

/* The sanity buffer of xxHash's self-test: byte i is the top byte of
 * 2654435761 * 11400714785074694797^i (mod 2^64). */
static void fill_xxh_sanity_buffer(uint8_t *buf, size_t len)
{
    uint64_t gen = 2654435761u;
    for (size_t i = 0; i < len; i++) {
        buf[i] = (uint8_t)(gen >> 56);
        gen *= 11400714785074694797ull;
    }
}

static void test_xxh3_reference_values(void **state)
{
    /* XXH3_64bits (seed 0) values from xxHash's published sanity table,
     * one or more per internal code path. */
    static const struct {
        size_t len;
        uint64_t hash;
    } vectors[] = {
        {0, 0x2D06800538D394C2ull},    {1, 0xC44BDFF4074EECDBull},
        {6, 0x27B56A84CD2D7325ull},    {12, 0xA713DAF0DFBB77E7ull},
        {24, 0xA3FE70BF9D3510EBull},   {48, 0x397DA259ECBA1F11ull},
        {80, 0xBCDEFBBB2C47C90Aull},   {195, 0xCD94217EE362EC3Aull},
        {403, 0xCDEB804D65C6DEA4ull},  {512, 0x617E49599013CB6Bull},
        {2048, 0xDD59E2C3A5F038E0ull}, {2240, 0x6E73A90539CF2948ull},
        {2367, 0xCB37AEB9E5D361EDull},
    };
    uint8_t buf[2367];
    (void)state;

    fill_xxh_sanity_buffer(buf, sizeof(buf));
    for (size_t i = 0; i < sizeof(vectors) / sizeof(vectors[0]); i++) {
        assert_true(vectors[i].hash == kvd_xxh3_64(buf, vectors[i].len));
    }
    assert_true(kvd_xxh3_64(NULL, 0) == 0x2D06800538D394C2ull);
    /* NULL is the empty input whatever the length (no status to return). */
    assert_true(kvd_xxh3_64(NULL, 16) == 0x2D06800538D394C2ull);
}

static void test_xxh3_alignment_and_avalanche(void **state)
{
    uint8_t buf[4096 + 8];
    uint8_t *unaligned = buf + 3;
    (void)state;

    fill_xxh_sanity_buffer(buf, sizeof(buf));
    for (size_t len = 0; len <= 4096; len = len * 2 + 1) {
        uint8_t copy[4096];
        uint64_t h;

        memcpy(copy, unaligned, len);
        h = kvd_xxh3_64(unaligned, len);
        assert_true(h == kvd_xxh3_64(copy, len));
        if (len == 0) {
            continue;
        }
        /* One flipped bit anywhere changes, on average, half the output
         * bits; require at least 10 of 64 for every position tried. */
        for (size_t pos = 0; pos < len; pos += 1 + len / 7) {
            uint64_t flipped;
            copy[pos] ^= 0x10;
            flipped = kvd_xxh3_64(copy, len);
            copy[pos] ^= 0x10;
            assert_true(__builtin_popcountll(h ^ flipped) >= 10);
        }
    }
}

/* A libcrypto failure (injected) is KVD_ERR_INTERNAL, for block hashing
 * too, and neither output is touched. */
/* The streaming digest of pieces fed in order equals the one-shot digest
 * of the whole, whatever the piece sizes (the cluster hashes each part of
 * an object as it lands); a stream with nothing fed hashes as empty. */
static void test_xxh3_stream_matches_one_shot(void **state)
{
    (void)state;
    enum { N = 3 * 65536 + 123 };
    uint8_t *buf = malloc(N);
    assert_non_null(buf);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < N; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = (uint8_t)x;
    }
    kvd_xxh3_stream_t *s = kvd_xxh3_stream_new();
    assert_non_null(s);
    assert_true(kvd_xxh3_stream_digest(s) == kvd_xxh3_64(NULL, 0));
    kvd_xxh3_stream_free(s);
    static const size_t pieces[] = {1, 7, 240, 4096, 16384, 61440, N};
    for (size_t k = 0; k < sizeof pieces / sizeof *pieces; k++) {
        s = kvd_xxh3_stream_new();
        assert_non_null(s);
        for (size_t off = 0; off < N; off += pieces[k]) {
            size_t len = N - off < pieces[k] ? N - off : pieces[k];
            kvd_xxh3_stream_update(s, buf + off, len);
        }
        assert_true(kvd_xxh3_stream_digest(s) == kvd_xxh3_64(buf, N));
        kvd_xxh3_stream_update(s, buf, 0);
        assert_true(kvd_xxh3_stream_digest(s) == kvd_xxh3_64(buf, N));
        kvd_xxh3_stream_free(s);
    }
    kvd_xxh3_stream_free(NULL);
    free(buf);
}

static void test_sha256_failure_is_internal(void **state)
{
    (void)state;
#ifndef KVD_FAILPOINTS_ENABLED
    skip(); /* release build: failpoints are compiled out */
#endif
    uint8_t out[KVD_SHA256_BYTES];
    kvd_block_hash_t root, h;
    memset(out, 0xa5, sizeof(out));
    assert_int_equal(kvd_block_hash_seed("0", &root), KVD_OK);
    memset(&h, 0x5a, sizeof(h));

    assert_int_equal(kvd_failpoint_set("hash.sha256=EIO", NULL, 0), KVD_OK);
    assert_int_equal(kvd_sha256("abc", 3, out), KVD_ERR_INTERNAL);
    const uint32_t tokens[4] = {1, 2, 3, 4};
    assert_int_equal(kvd_block_hash(&root, tokens, 4, NULL, &h),
                     KVD_ERR_INTERNAL);
    kvd_failpoint_clear();

    for (size_t i = 0; i < sizeof(out); i++) {
        assert_int_equal(out[i], 0xa5);
        assert_int_equal(h.bytes[i], 0x5a);
    }
    assert_int_equal(kvd_sha256("abc", 3, out), KVD_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_fips_vectors),
        cmocka_unit_test(test_sha256_failure_is_internal),
        cmocka_unit_test(test_sha256_million_a),
        cmocka_unit_test(test_sha256_rejects_bad_arguments),
        cmocka_unit_test(test_xxh3_reference_values),
        cmocka_unit_test(test_xxh3_alignment_and_avalanche),
        cmocka_unit_test(test_xxh3_stream_matches_one_shot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
