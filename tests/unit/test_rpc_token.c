/*
 * kvdepotd's bearer-token comparison (server/rpc_int.h): tokens are
 * compared by SHA-256 digest in constant time, so a wrong token is refused
 * whatever its length, and the prefix "Bearer " and the token hash as one
 * value. Timing itself is not measured here (too noisy for a unit test);
 * what is checked is that every length goes through the same digest
 * comparison and only the exact value matches.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "server/rpc_int.h"

static void test_match_exact_only(void **state)
{
    (void)state;
    static const char tok[] = "s3cret-token-0123456789";
    uint8_t want[KVD_RPC_TOKEN_DIGEST_BYTES];
    assert_true(kvd_rpc_token_digest("Bearer ", tok, strlen(tok), want));
    static const char good[] = "Bearer s3cret-token-0123456789";
    assert_true(kvd_rpc_token_match(want, good, strlen(good)));
    /* Shorter, longer, same length with one byte changed, prefix only,
     * empty: all refused. */
    const char *bad[] = {
        "Bearer s3cret-token-012345678",
        "Bearer s3cret-token-01234567890",
        "Bearer s3cret-token-0123456788",
        "Bearer S3cret-token-0123456789",
        "bearer s3cret-token-0123456789",
        "Bearer ",
        "",
        "s3cret-token-0123456789",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_false(kvd_rpc_token_match(want, bad[i], strlen(bad[i])));
    }
    assert_false(kvd_rpc_token_match(want, NULL, 0));
}

static void test_digest_of_parts(void **state)
{
    (void)state;
    uint8_t a[KVD_RPC_TOKEN_DIGEST_BYTES], b[KVD_RPC_TOKEN_DIGEST_BYTES];
    /* The prefix and the secret hash as their concatenation. */
    assert_true(kvd_rpc_token_digest("Bearer ", "abc", 3, a));
    assert_true(kvd_rpc_token_digest(NULL, "Bearer abc", 10, b));
    assert_memory_equal(a, b, sizeof a);
    /* SHA-256 of "abc" (FIPS 180-2 example). */
    static const uint8_t abc[KVD_RPC_TOKEN_DIGEST_BYTES] = {
        0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40,
        0xde, 0x5d, 0xae, 0x22, 0x23, 0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17,
        0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
    assert_true(kvd_rpc_token_digest(NULL, "abc", 3, a));
    assert_memory_equal(a, abc, sizeof a);
    assert_true(kvd_rpc_token_match(abc, "abc", 3));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_match_exact_only),
        cmocka_unit_test(test_digest_of_parts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
