/*
 * Block identity: roots and links against digests computed independently
 * with Python's cbor2 + hashlib (vLLM's sha256_cbor recipe), the CBOR bytes
 * of a block rebuilt by hand, every argument error, and the chain's
 * contract (equal to block-by-block hashing, tail ignored, first_extras on
 * block 0 only, nothing written on KVD_ERR_RANGE).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvdepot/common.h"

/* sha256(cbor2.dumps("0", canonical=True)): vLLM's NONE_HASH with
 * PYTHONHASHSEED=0. */
static const uint8_t seed_0[KVD_SHA256_BYTES] = {
    0x4e, 0x11, 0x95, 0xdf, 0x02, 0x0d, 0xe5, 0x9e, 0x0d, 0x65, 0xa3,
    0x3a, 0x42, 0x79, 0xf1, 0x18, 0x3e, 0x7a, 0xe4, 0xe5, 0xd9, 0x80,
    0xe3, 0x09, 0xf8, 0xb5, 0x5a, 0xdf, 0xf2, 0xe6, 0x1c, 0x3e};

/* sha256(cbor2.dumps("kvdepot", canonical=True)). */
static const uint8_t seed_kvdepot[KVD_SHA256_BYTES] = {
    0x30, 0xf5, 0x33, 0x0d, 0x51, 0x6e, 0x9d, 0x37, 0xdd, 0xc5, 0xc0,
    0x1e, 0x95, 0x20, 0x2b, 0x82, 0x98, 0xdc, 0x2b, 0x85, 0xa1, 0xd6,
    0xb1, 0x5a, 0xaf, 0x7c, 0xb5, 0xae, 0x58, 0x54, 0xcb, 0x21};

/* sha256(cbor2.dumps("", canonical=True)). */
static const uint8_t seed_empty[KVD_SHA256_BYTES] = {
    0x8d, 0x33, 0xf5, 0x20, 0xa3, 0xc4, 0xce, 0xf8, 0x0d, 0x24, 0x53,
    0xae, 0xf8, 0x1b, 0x61, 0x2b, 0xfe, 0x1c, 0xb4, 0x4c, 0x8b, 0x20,
    0x25, 0x63, 0x0a, 0xd3, 0x86, 0x62, 0x76, 0x3f, 0x13, 0xd3};

/* h1 = sha256_cbor((seed_0, tuple(range(16)), None)),
 * h2 = sha256_cbor((h1, tuple(range(16, 32)), None)). */
static const uint8_t chain_h1[KVD_SHA256_BYTES] = {
    0xd8, 0x30, 0xde, 0x3d, 0x42, 0xc0, 0x0f, 0x25, 0xa2, 0x94, 0x9b,
    0x5d, 0x12, 0xd9, 0x86, 0x42, 0x66, 0x4a, 0x44, 0x87, 0x2c, 0x16,
    0x14, 0xc5, 0xb0, 0x14, 0x75, 0x56, 0x27, 0x6a, 0xfc, 0x9c};
static const uint8_t chain_h2[KVD_SHA256_BYTES] = {
    0xfe, 0xdd, 0x9e, 0x4a, 0xbe, 0xbe, 0xbb, 0xe6, 0xf6, 0xcf, 0x96,
    0xb6, 0x82, 0xf0, 0x8d, 0x31, 0x60, 0x63, 0xfe, 0x2f, 0x22, 0xa5,
    0xc5, 0x52, 0x19, 0x2d, 0xd6, 0x29, 0x04, 0xfc, 0xcc, 0xac};

/* sha256_cbor((seed_0, (0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1),
 * None)). */
static const uint8_t big_tokens_hash[KVD_SHA256_BYTES] = {
    0x39, 0x53, 0x2d, 0x75, 0x90, 0x36, 0xec, 0xa7, 0xef, 0xd7, 0xa6,
    0xe0, 0x39, 0xe2, 0x16, 0x83, 0x6a, 0x50, 0x43, 0x6e, 0xf6, 0xb0,
    0x4f, 0x2f, 0x26, 0x1c, 0x9e, 0x2f, 0x45, 0x3f, 0xb3, 0xec};

/* sha256_cbor((seed_0, (1, 2, 3), ("lora-a", ("img-hash", -5),
 * ("aud", 300), "salt", bytes(range(32))))). */
static const uint8_t extras_hash[KVD_SHA256_BYTES] = {
    0x8a, 0x52, 0x2a, 0x81, 0xb5, 0x11, 0x5e, 0x53, 0xc7, 0x74, 0xe8,
    0xa5, 0x86, 0xad, 0x51, 0x9a, 0x1e, 0x64, 0xeb, 0xc7, 0xa8, 0xca,
    0x57, 0x06, 0xf5, 0x6e, 0x92, 0x2e, 0xd4, 0xd8, 0x3b, 0x97};

static kvd_block_hash_t root_0(void)
{
    kvd_block_hash_t root;
    assert_int_equal(kvd_block_hash_seed("0", &root), KVD_OK);
    return root;
}

static void test_seed_matches_vllm_none_hash(void **state)
{
    kvd_block_hash_t root;
    (void)state;

    assert_int_equal(kvd_block_hash_seed("0", &root), KVD_OK);
    assert_memory_equal(root.bytes, seed_0, KVD_SHA256_BYTES);
    assert_int_equal(kvd_block_hash_seed(KVD_BLOCK_HASH_DEFAULT_SEED, &root),
                     KVD_OK);
    assert_memory_equal(root.bytes, seed_kvdepot, KVD_SHA256_BYTES);
    assert_int_equal(kvd_block_hash_seed("", &root), KVD_OK);
    assert_memory_equal(root.bytes, seed_empty, KVD_SHA256_BYTES);
}

static void test_seed_longer_than_stack_buffer(void **state)
{
    /* sha256 over the text head 0x79 0x07 0xd0 and 2000 'x': the seed
     * spills to the heap and must still encode in canonical form. */
    enum { LEN = 2000 };
    char *seed = malloc(LEN + 1);
    uint8_t *cbor = malloc(LEN + 3);
    kvd_block_hash_t root;
    uint8_t expect[KVD_SHA256_BYTES];
    (void)state;

    assert_non_null(seed);
    assert_non_null(cbor);
    memset(seed, 'x', LEN);
    seed[LEN] = '\0';
    cbor[0] = 0x79;
    cbor[1] = (uint8_t)(LEN >> 8);
    cbor[2] = (uint8_t)LEN;
    memcpy(cbor + 3, seed, LEN);
    assert_int_equal(kvd_sha256(cbor, LEN + 3, expect), KVD_OK);
    assert_int_equal(kvd_block_hash_seed(seed, &root), KVD_OK);
    assert_memory_equal(root.bytes, expect, KVD_SHA256_BYTES);
    free(cbor);
    free(seed);
}

static void test_seed_errors(void **state)
{
    kvd_block_hash_t root;
    (void)state;

    memset(&root, 0x5a, sizeof(root));
    assert_int_equal(kvd_block_hash_seed(NULL, &root), KVD_ERR_INVALID);
    assert_int_equal(root.bytes[0], 0x5a);
    assert_int_equal(kvd_block_hash_seed("0", NULL), KVD_ERR_INVALID);
}

static void test_block_matches_python_vectors(void **state)
{
    uint32_t tokens[32];
    kvd_block_hash_t root = root_0();
    kvd_block_hash_t h1;
    kvd_block_hash_t h2;
    (void)state;

    for (uint32_t i = 0; i < 32; i++) {
        tokens[i] = i;
    }
    assert_int_equal(kvd_block_hash(&root, tokens, 16, NULL, &h1), KVD_OK);
    assert_memory_equal(h1.bytes, chain_h1, KVD_SHA256_BYTES);
    assert_int_equal(kvd_block_hash(&h1, tokens + 16, 16, NULL, &h2), KVD_OK);
    assert_memory_equal(h2.bytes, chain_h2, KVD_SHA256_BYTES);

    /* The output may alias the parent. */
    h2 = h1;
    assert_int_equal(kvd_block_hash(&h2, tokens + 16, 16, NULL, &h2), KVD_OK);
    assert_memory_equal(h2.bytes, chain_h2, KVD_SHA256_BYTES);
}

static void test_big_token_ids(void **state)
{
    static const uint32_t tokens[] = {0,   23,    24,    255,
                                      256, 65535, 65536, UINT32_MAX};
    /* The same block's CBOR written out by hand. */
    static const uint8_t head[] = {0x83, 0x58, 0x20};
    static const uint8_t tail[] = {
        0x88, 0x00, 0x17, 0x18, 0x18, 0x18, 0xff, 0x19, 0x01, 0x00, 0x19, 0xff,
        0xff, 0x1a, 0x00, 0x01, 0x00, 0x00, 0x1a, 0xff, 0xff, 0xff, 0xff, 0xf6};
    uint8_t cbor[sizeof(head) + KVD_SHA256_BYTES + sizeof(tail)];
    uint8_t expect[KVD_SHA256_BYTES];
    kvd_block_hash_t root = root_0();
    kvd_block_hash_t h;
    (void)state;

    memcpy(cbor, head, sizeof(head));
    memcpy(cbor + sizeof(head), root.bytes, KVD_SHA256_BYTES);
    memcpy(cbor + sizeof(head) + KVD_SHA256_BYTES, tail, sizeof(tail));
    assert_int_equal(kvd_sha256(cbor, sizeof(cbor), expect), KVD_OK);
    assert_memory_equal(expect, big_tokens_hash, KVD_SHA256_BYTES);

    assert_int_equal(kvd_block_hash(&root, tokens, 8, NULL, &h), KVD_OK);
    assert_memory_equal(h.bytes, big_tokens_hash, KVD_SHA256_BYTES);
}

static void test_extras_match_python_vector(void **state)
{
    static const uint32_t tokens[] = {1, 2, 3};
    static const kvd_mm_extra_t mm[] = {{"img-hash", -5}, {"aud", 300}};
    uint8_t embeds[KVD_SHA256_BYTES];
    kvd_block_extras_t extras = {
        .lora_name = "lora-a",
        .mm = mm,
        .num_mm = 2,
        .cache_salt = "salt",
        .prompt_embeds = embeds,
    };
    kvd_block_hash_t root = root_0();
    kvd_block_hash_t h;
    (void)state;

    for (int i = 0; i < KVD_SHA256_BYTES; i++) {
        embeds[i] = (uint8_t)i;
    }
    assert_int_equal(kvd_block_hash(&root, tokens, 3, &extras, &h), KVD_OK);
    assert_memory_equal(h.bytes, extras_hash, KVD_SHA256_BYTES);
}

static void test_absent_extras_encode_as_null(void **state)
{
    static const uint32_t tokens[] = {0,   23,    24,    255,
                                      256, 65535, 65536, UINT32_MAX};
    kvd_block_extras_t none;
    kvd_block_extras_t empty_salt;
    kvd_block_extras_t empty_lora;
    kvd_block_hash_t root = root_0();
    kvd_block_hash_t h;
    (void)state;

    memset(&none, 0, sizeof(none));
    assert_int_equal(kvd_block_hash(&root, tokens, 8, &none, &h), KVD_OK);
    assert_memory_equal(h.bytes, big_tokens_hash, KVD_SHA256_BYTES);

    /* vLLM drops a falsy cache_salt ... */
    empty_salt = none;
    empty_salt.cache_salt = "";
    assert_int_equal(kvd_block_hash(&root, tokens, 8, &empty_salt, &h), KVD_OK);
    assert_memory_equal(h.bytes, big_tokens_hash, KVD_SHA256_BYTES);

    /* ... but keeps an empty LoRA name. */
    empty_lora = none;
    empty_lora.lora_name = "";
    assert_int_equal(kvd_block_hash(&root, tokens, 8, &empty_lora, &h), KVD_OK);
    assert_memory_not_equal(h.bytes, big_tokens_hash, KVD_SHA256_BYTES);
}

static void test_empty_block(void **state)
{
    /* sha256 of [parent, [], null], built by hand. */
    uint8_t cbor[3 + KVD_SHA256_BYTES + 2];
    uint8_t expect[KVD_SHA256_BYTES];
    kvd_block_hash_t root = root_0();
    kvd_block_hash_t h;
    (void)state;

    cbor[0] = 0x83;
    cbor[1] = 0x58;
    cbor[2] = 0x20;
    memcpy(cbor + 3, root.bytes, KVD_SHA256_BYTES);
    cbor[3 + KVD_SHA256_BYTES] = 0x80;
    cbor[4 + KVD_SHA256_BYTES] = 0xf6;
    assert_int_equal(kvd_sha256(cbor, sizeof(cbor), expect), KVD_OK);
    assert_int_equal(kvd_block_hash(&root, NULL, 0, NULL, &h), KVD_OK);
    assert_memory_equal(h.bytes, expect, KVD_SHA256_BYTES);
}

static void test_block_errors(void **state)
{
    static const uint32_t tokens[] = {1, 2, 3};
    kvd_block_hash_t root = root_0();
    kvd_block_hash_t h;
    kvd_block_extras_t bad_mm;
    kvd_mm_extra_t mm = {NULL, 0};
    (void)state;

    memset(&h, 0x5a, sizeof(h));
    assert_int_equal(kvd_block_hash(NULL, tokens, 3, NULL, &h),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_block_hash(&root, tokens, 3, NULL, NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_block_hash(&root, NULL, 3, NULL, &h), KVD_ERR_INVALID);

    memset(&bad_mm, 0, sizeof(bad_mm));
    bad_mm.num_mm = 1;
    assert_int_equal(kvd_block_hash(&root, tokens, 3, &bad_mm, &h),
                     KVD_ERR_INVALID);
    bad_mm.mm = &mm;
    assert_int_equal(kvd_block_hash(&root, tokens, 3, &bad_mm, &h),
                     KVD_ERR_INVALID);
    assert_int_equal(h.bytes[0], 0x5a);
}

/* 100 tokens, block 16: six full blocks and a 4-token tail. */
#define CHAIN_TOKENS ((size_t)100)
#define CHAIN_BLOCK ((size_t)16)
#define CHAIN_BLOCKS (CHAIN_TOKENS / CHAIN_BLOCK)

static void fill_tokens(uint32_t *tokens, size_t n)
{
    uint32_t x = 12345;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        tokens[i] = x >> (i % 17); /* small and large ids */
    }
}

static void test_chain_equals_block_by_block(void **state)
{
    uint32_t tokens[CHAIN_TOKENS];
    kvd_block_hash_t root = root_0();
    kvd_block_hash_t chain[CHAIN_BLOCKS + 2];
    kvd_block_hash_t parent = root;
    kvd_block_extras_t first = {.lora_name = "adapter", .cache_salt = "t1"};
    kvd_block_extras_t later = {.lora_name = "adapter"};
    size_t n = 0;
    (void)state;

    fill_tokens(tokens, CHAIN_TOKENS);
    assert_int_equal(kvd_block_hash_chain(&root, tokens, CHAIN_TOKENS,
                                          CHAIN_BLOCK, &first, &later, chain,
                                          CHAIN_BLOCKS + 2, &n),
                     KVD_OK);
    assert_int_equal(n, CHAIN_BLOCKS);
    for (size_t i = 0; i < CHAIN_BLOCKS; i++) {
        kvd_block_hash_t h;
        assert_int_equal(kvd_block_hash(&parent, tokens + i * CHAIN_BLOCK,
                                        CHAIN_BLOCK, i == 0 ? &first : &later,
                                        &h),
                         KVD_OK);
        assert_memory_equal(h.bytes, chain[i].bytes, KVD_SHA256_BYTES);
        parent = h;
    }

    /* The partial tail is ignored: any tail gives the same links. */
    tokens[CHAIN_TOKENS - 1] ^= 1;
    {
        kvd_block_hash_t again[CHAIN_BLOCKS];
        assert_int_equal(kvd_block_hash_chain(&root, tokens, CHAIN_TOKENS,
                                              CHAIN_BLOCK, &first, &later,
                                              again, CHAIN_BLOCKS, &n),
                         KVD_OK);
        assert_int_equal(n, CHAIN_BLOCKS);
        assert_memory_equal(again, chain, sizeof(again));
    }
}

static void test_chain_matches_python_vectors(void **state)
{
    uint32_t tokens[40];
    kvd_block_hash_t root = root_0();
    kvd_block_hash_t chain[2];
    size_t n = 0;
    (void)state;

    for (uint32_t i = 0; i < 40; i++) {
        tokens[i] = i;
    }
    assert_int_equal(
        kvd_block_hash_chain(&root, tokens, 40, 16, NULL, NULL, chain, 2, &n),
        KVD_OK);
    assert_int_equal(n, 2);
    assert_memory_equal(chain[0].bytes, chain_h1, KVD_SHA256_BYTES);
    assert_memory_equal(chain[1].bytes, chain_h2, KVD_SHA256_BYTES);
}

static void test_chain_first_extras_only_on_block_zero(void **state)
{
    uint32_t tokens[3 * CHAIN_BLOCK];
    kvd_block_hash_t root = root_0();
    kvd_block_hash_t plain[3];
    kvd_block_hash_t salted[3];
    kvd_block_extras_t salt = {.cache_salt = "tenant-a"};
    kvd_block_hash_t expect0;
    kvd_block_hash_t expect1;
    size_t n = 0;
    (void)state;

    fill_tokens(tokens, 3 * CHAIN_BLOCK);
    assert_int_equal(kvd_block_hash_chain(&root, tokens, 3 * CHAIN_BLOCK,
                                          CHAIN_BLOCK, NULL, NULL, plain, 3,
                                          &n),
                     KVD_OK);
    assert_int_equal(kvd_block_hash_chain(&root, tokens, 3 * CHAIN_BLOCK,
                                          CHAIN_BLOCK, &salt, NULL, salted, 3,
                                          &n),
                     KVD_OK);
    assert_int_equal(n, 3);

    /* Block 0 carries the salt; block 1 has no extras but a different
     * parent, so every link differs from the unsalted chain. */
    assert_int_equal(
        kvd_block_hash(&root, tokens, CHAIN_BLOCK, &salt, &expect0), KVD_OK);
    assert_memory_equal(salted[0].bytes, expect0.bytes, KVD_SHA256_BYTES);
    assert_int_equal(kvd_block_hash(&salted[0], tokens + CHAIN_BLOCK,
                                    CHAIN_BLOCK, NULL, &expect1),
                     KVD_OK);
    assert_memory_equal(salted[1].bytes, expect1.bytes, KVD_SHA256_BYTES);
    for (size_t i = 0; i < 3; i++) {
        assert_memory_not_equal(salted[i].bytes, plain[i].bytes,
                                KVD_SHA256_BYTES);
    }

    /* first_extras NULL means no extras on block 0 even when later blocks
     * have some. */
    {
        kvd_block_extras_t lora = {.lora_name = "x"};
        kvd_block_hash_t mixed[3];
        assert_int_equal(kvd_block_hash_chain(&root, tokens, 3 * CHAIN_BLOCK,
                                              CHAIN_BLOCK, NULL, &lora, mixed,
                                              3, &n),
                         KVD_OK);
        assert_memory_equal(mixed[0].bytes, plain[0].bytes, KVD_SHA256_BYTES);
        assert_memory_not_equal(mixed[1].bytes, plain[1].bytes,
                                KVD_SHA256_BYTES);
    }
}

static void test_chain_big_blocks_reuse_one_buffer(void **state)
{
    /* 256-token blocks of 5-byte ids overflow the stack buffer; the chain
     * must still agree with per-block hashing. */
#define BS ((size_t)256)
#define NB ((size_t)3)
    static uint32_t tokens[BS * NB];
    kvd_block_hash_t root = root_0();
    kvd_block_hash_t chain[NB];
    kvd_block_hash_t parent = root;
    size_t n = 0;
    (void)state;

    for (size_t i = 0; i < BS * NB; i++) {
        tokens[i] = UINT32_MAX - (uint32_t)i;
    }
    assert_int_equal(kvd_block_hash_chain(&root, tokens, BS * NB, BS, NULL,
                                          NULL, chain, NB, &n),
                     KVD_OK);
    assert_int_equal(n, NB);
    for (size_t i = 0; i < NB; i++) {
        kvd_block_hash_t h;
        assert_int_equal(kvd_block_hash(&parent, tokens + i * BS, BS, NULL, &h),
                         KVD_OK);
        assert_memory_equal(h.bytes, chain[i].bytes, KVD_SHA256_BYTES);
        parent = h;
    }
#undef NB
#undef BS
}

static void test_chain_errors(void **state)
{
    uint32_t tokens[CHAIN_TOKENS];
    kvd_block_hash_t root = root_0();
    kvd_block_hash_t out[CHAIN_BLOCKS];
    kvd_block_hash_t untouched[CHAIN_BLOCKS];
    kvd_block_extras_t bad_mm = {.num_mm = 1};
    size_t n = 777;
    (void)state;

    fill_tokens(tokens, CHAIN_TOKENS);
    memset(out, 0x5a, sizeof(out));
    memcpy(untouched, out, sizeof(out));

    assert_int_equal(kvd_block_hash_chain(NULL, tokens, CHAIN_TOKENS,
                                          CHAIN_BLOCK, NULL, NULL, out,
                                          CHAIN_BLOCKS, &n),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_block_hash_chain(&root, tokens, CHAIN_TOKENS,
                                          CHAIN_BLOCK, NULL, NULL, out,
                                          CHAIN_BLOCKS, NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_block_hash_chain(&root, NULL, CHAIN_TOKENS,
                                          CHAIN_BLOCK, NULL, NULL, out,
                                          CHAIN_BLOCKS, &n),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_block_hash_chain(&root, tokens, CHAIN_TOKENS, 0, NULL,
                                          NULL, out, CHAIN_BLOCKS, &n),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_block_hash_chain(&root, tokens, CHAIN_TOKENS,
                                          CHAIN_BLOCK, NULL, NULL, NULL,
                                          CHAIN_BLOCKS, &n),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_block_hash_chain(&root, tokens, CHAIN_TOKENS,
                                          CHAIN_BLOCK, NULL, &bad_mm, out,
                                          CHAIN_BLOCKS, &n),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_block_hash_chain(&root, tokens, CHAIN_TOKENS,
                                          CHAIN_BLOCK, &bad_mm, NULL, out,
                                          CHAIN_BLOCKS, &n),
                     KVD_ERR_INVALID);
    /* One slot short: KVD_ERR_RANGE and nothing written. */
    assert_int_equal(kvd_block_hash_chain(&root, tokens, CHAIN_TOKENS,
                                          CHAIN_BLOCK, NULL, NULL, out,
                                          CHAIN_BLOCKS - 1, &n),
                     KVD_ERR_RANGE);
    assert_int_equal(n, 777);
    assert_memory_equal(out, untouched, sizeof(out));

    /* Fewer tokens than one block: no links, hashes_out may be NULL. */
    assert_int_equal(kvd_block_hash_chain(&root, tokens, CHAIN_BLOCK - 1,
                                          CHAIN_BLOCK, NULL, NULL, NULL, 0, &n),
                     KVD_OK);
    assert_int_equal(n, 0);
    assert_int_equal(kvd_block_hash_chain(&root, NULL, 0, CHAIN_BLOCK, NULL,
                                          NULL, out, CHAIN_BLOCKS, &n),
                     KVD_OK);
    assert_int_equal(n, 0);
    assert_memory_equal(out, untouched, sizeof(out));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_matches_vllm_none_hash),
        cmocka_unit_test(test_seed_longer_than_stack_buffer),
        cmocka_unit_test(test_seed_errors),
        cmocka_unit_test(test_block_matches_python_vectors),
        cmocka_unit_test(test_big_token_ids),
        cmocka_unit_test(test_extras_match_python_vector),
        cmocka_unit_test(test_absent_extras_encode_as_null),
        cmocka_unit_test(test_empty_block),
        cmocka_unit_test(test_block_errors),
        cmocka_unit_test(test_chain_equals_block_by_block),
        cmocka_unit_test(test_chain_matches_python_vectors),
        cmocka_unit_test(test_chain_first_extras_only_on_block_zero),
        cmocka_unit_test(test_chain_big_blocks_reuse_one_buffer),
        cmocka_unit_test(test_chain_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
