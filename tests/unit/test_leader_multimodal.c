/*
 * Multimodal requests (include/kvdepot/leader.h, kvd_leader_mm_input_t):
 * the placeholder tokens of an image are the same for every image, so two
 * prompts that differ only in their images must still get different keys
 * from the first block an image overlaps, and the same keys before it.
 * The expected keys are written out block by block here, as vLLM's
 * generate_block_hash_extra_keys builds them ((identifier, offset - block
 * start) per input overlapping the block), and hashed with kvd_block_hash;
 * the leader's keys are read from its lookups and its save plans.
 * Prompts given as embeddings (vLLM prompt_embeds) have placeholder token
 * ids, so each block's key carries the digest of its embeddings instead.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvd_testleader_int.h"

/* Block b's hash with the given mm keys (and the salt on block 0). */
static void link_mm(const kvd_block_hash_t *parent, const uint32_t *tok,
                    size_t b, const kvd_mm_extra_t *mm, size_t num_mm,
                    const char *salt, kvd_block_hash_t *out)
{
    kvd_block_extras_t ex = {
        .mm = mm, .num_mm = num_mm, .cache_salt = b == 0 ? salt : NULL};
    assert_int_equal(kvd_block_hash(parent, tok + b * BS, BS, &ex, out),
                     KVD_OK);
}

/*
 * The 80-token prompt's five blocks with two images: `img` at tokens
 * [20, 50) and `icon` at [56, 60). Block 0 holds no image; blocks 1 and 2
 * are inside img; block 3 holds img's end and all of icon; block 4 none.
 */
static void expected(const uint32_t *tok, const char *img, const char *icon,
                     const char *salt, kvd_block_hash_t *h)
{
    kvd_leader_config_t c = config(1);
    const kvd_mm_extra_t b1[] = {{img, 20 - 16}};
    const kvd_mm_extra_t b2[] = {{img, 20 - 32}};
    const kvd_mm_extra_t b3[] = {{img, 20 - 48}, {icon, 56 - 48}};
    link_mm(&c.root, tok, 0, NULL, 0, salt, &h[0]);
    link_mm(&h[0], tok, 1, b1, 1, salt, &h[1]);
    link_mm(&h[1], tok, 2, b2, 1, salt, &h[2]);
    link_mm(&h[2], tok, 3, b3, 2, salt, &h[3]);
    link_mm(&h[3], tok, 4, NULL, 0, salt, &h[4]);
}

static kvd_status_t match_mm(kvd_leader_t *ld, const char *id,
                             const uint32_t *tok, size_t n, const char *img,
                             const char *icon, const char *salt,
                             uint64_t *matched)
{
    const kvd_leader_mm_input_t mm[] = {{img, 20, 30}, {icon, 56, 4}};
    kvd_leader_request_t q = {.request_id = id,
                              .tokens = tok,
                              .num_tokens = n,
                              .cache_salt = salt,
                              .mm_inputs = mm,
                              .num_mm_inputs = 2};
    bool async = false;
    return kvd_leader_get_num_new_matched_tokens(ld, &q, 0, matched, &async);
}

/* Takes the answer, runs the prompt, and checks the keys of the blocks
 * the plan saves: blocks [m / BS, 5) with hashes h. */
static void check_saves(kvd_leader_t *ld, const char *id, uint64_t m,
                        const kvd_block_hash_t *h)
{
    uint32_t blocks[5];
    ids(blocks, 5, 10);
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, id, blocks, 5, m),
                     KVD_OK);
    assert_int_equal(
        kvd_leader_request_scheduled(ld, id, NULL, 0, NULL, 0, NULL, 0, 80),
        KVD_OK);
    kvd_pb_step_plan_t *p = plan_of(ld);
    const kvd_pb_step_request_t *q = plan_req(p, id);
    assert_non_null(q);
    size_t first = (size_t)(m / BS);
    assert_int_equal(q->n_saves, 5 - first);
    for (size_t i = 0; i < q->n_saves; i++) {
        assert_int_equal(q->saves[i]->block_id, 10 + first + i);
        assert_memory_equal(q->saves[i]->key->block_hash.data,
                            h[first + i].bytes, 32);
    }
    kvd_proto_step_plan_free(p);
    bool delay = false;
    assert_int_equal(kvd_leader_request_finished(ld, id, &delay), KVD_OK);
}

static void test_images_key_their_blocks(void **state)
{
    (void)state;
    fake_t f = {0};
    kvd_leader_t *ld = leader_on(&f, 1);
    uint32_t tok[80];
    kvd_block_hash_t ha[5], hb[5], plain[5];
    prompt(tok, 80, 3);
    expected(tok, "image-a", "icon", "t", ha);
    expected(tok, "image-b", "icon", "t", hb);
    assert_int_equal(chain(tok, 80, "t", plain), 5);
    /* Before the first image the keys are the text-only ones. */
    assert_memory_equal(ha[0].bytes, plain[0].bytes, 32);
    assert_memory_equal(hb[0].bytes, plain[0].bytes, 32);
    for (size_t i = 1; i < 5; i++) {
        assert_memory_not_equal(ha[i].bytes, hb[i].bytes, 32);
        assert_memory_not_equal(ha[i].bytes, plain[i].bytes, 32);
    }
    fake_store(&f, ha, 5, KVD_STORE_TIER_HOST);

    /* Image A's prompt finds its 4 blocks (never the last token's). */
    uint64_t m = 0;
    assert_int_equal(match_mm(ld, "a", tok, 80, "image-a", "icon", "t", &m),
                     KVD_OK);
    assert_int_equal(m, 64);
    check_saves(ld, "a", m, ha);
    /* Image B's: only the block before the image; it saves its own. */
    assert_int_equal(match_mm(ld, "b", tok, 80, "image-b", "icon", "t", &m),
                     KVD_OK);
    assert_int_equal(m, 16);
    check_saves(ld, "b", m, hb);
    /* The same tokens without images: the text-only keys. */
    assert_int_equal(match(ld, "n", tok, 80, "t", 0, &m, &(bool){false}),
                     KVD_OK);
    assert_int_equal(m, 16);
    check_saves(ld, "n", m, plain);
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

/* A block completed by generated tokens: vLLM extends a chain looking at
 * the last input only (request_block_hasher), so of the two inputs in the
 * prompt's tail block only the last enters that block's key; the leader
 * keys it the same way, or its keys would not be the engine's. */
static void test_decode_block_after_an_image(void **state)
{
    (void)state;
    fake_t f = {0};
    kvd_leader_t *ld = leader_on(&f, 1);
    uint32_t tok[80], blocks[5];
    prompt(tok, 80, 5);
    const kvd_leader_mm_input_t mm[] = {
        {"photo", 2, 10}, {"clip", 66, 2}, {"tag", 70, 1}};
    kvd_leader_request_t q = {.request_id = "d",
                              .tokens = tok,
                              .num_tokens = 72,
                              .mm_inputs = mm,
                              .num_mm_inputs = 3};
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(
        kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    ids(blocks, 5, 20);
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, "d", blocks, 5, 0),
                     KVD_OK);
    assert_int_equal(kvd_leader_request_scheduled(ld, "d", NULL, 0, tok + 72, 8,
                                                  NULL, 0, 80),
                     KVD_OK);
    kvd_leader_config_t c = config(1);
    kvd_block_hash_t h[5];
    const kvd_mm_extra_t b0[] = {{"photo", 2}};
    const kvd_mm_extra_t b4[] = {{"tag", 70 - 64}};
    link_mm(&c.root, tok, 0, b0, 1, NULL, &h[0]);
    for (size_t b = 1; b < 4; b++) {
        link_mm(&h[b - 1], tok, b, NULL, 0, NULL, &h[b]);
    }
    link_mm(&h[3], tok, 4, b4, 1, NULL, &h[4]);
    kvd_pb_step_plan_t *p = plan_of(ld);
    const kvd_pb_step_request_t *r = plan_req(p, "d");
    assert_int_equal(r->n_saves, 5);
    for (size_t i = 0; i < 5; i++) {
        assert_memory_equal(r->saves[i]->key->block_hash.data, h[i].bytes, 32);
    }
    kvd_proto_step_plan_free(p);
    kvd_leader_destroy(ld);
}

static void test_bad_mm_inputs(void **state)
{
    (void)state;
    fake_t f = {0};
    kvd_leader_t *ld = leader_on(&f, 1);
    uint32_t tok[40];
    prompt(tok, 40, 7);
    kvd_leader_mm_input_t mm[] = {{"x", 20, 4}, {"y", 4, 4}};
    kvd_leader_request_t q = {.request_id = "bad",
                              .tokens = tok,
                              .num_tokens = 40,
                              .num_mm_inputs = 1};
    uint64_t m = 0;
    bool a = false;
    assert_int_equal(kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &a),
                     KVD_ERR_INVALID); /* no array */
    q.mm_inputs = mm;
    q.num_mm_inputs = 2;
    assert_int_equal(kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &a),
                     KVD_ERR_INVALID); /* not sorted */
    mm[1].offset = 30;
    mm[1].identifier = NULL;
    assert_int_equal(kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &a),
                     KVD_ERR_INVALID); /* no identifier */
    mm[1].identifier = "y";
    mm[1].length = UINT64_MAX;
    assert_int_equal(kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &a),
                     KVD_ERR_INVALID); /* past int64_t */
    mm[1].length = 4;
    assert_int_equal(kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &a),
                     KVD_OK);
    kvd_leader_stats_t st;
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.requests, 1);
    kvd_leader_destroy(ld);
}

/* Prompt embeddings: the token ids are all 0, so without the digests two
 * different embedded prompts would share every key. Each block's key
 * carries its digest (a block past the given ones, completed by generated
 * tokens, the digest of no bytes); the same embeddings match, others do
 * not. */
static void embeds_request(kvd_leader_request_t *q, const char *id,
                           const uint32_t *tok, const uint8_t *dig, size_t n)
{
    *q = (kvd_leader_request_t){.request_id = id,
                                .tokens = tok,
                                .num_tokens = 72,
                                .prompt_embeds = dig,
                                .num_prompt_embeds = n};
}

static void test_prompt_embeds_key_their_blocks(void **state)
{
    (void)state;
    fake_t f = {0};
    kvd_leader_t *ld = leader_on(&f, 1);
    uint32_t tok[80] = {0}, blocks[5];
    uint8_t da[5 * 32], db[5 * 32];
    for (size_t i = 0; i < sizeof da; i++) {
        da[i] = (uint8_t)(i * 7 + 1);
        db[i] = da[i];
    }
    db[2 * 32 + 5] ^= 1; /* b's embeddings differ from block 2 on */
    static const uint8_t nothing[32] = {
        0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4,
        0xc8, 0x99, 0x6f, 0xb9, 0x24, 0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b,
        0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55};
    kvd_leader_config_t c = config(1);
    kvd_block_hash_t ha[5], hb[5];
    for (size_t b = 0; b < 5; b++) {
        /* The prompt's 72 tokens give 5 digests (the last for 8 tokens);
         * block 4 is full only once 8 tokens are generated. */
        kvd_block_extras_t ea = {.prompt_embeds = da + b * 32};
        kvd_block_extras_t eb = {.prompt_embeds = db + b * 32};
        assert_int_equal(kvd_block_hash(b == 0 ? &c.root : &ha[b - 1],
                                        tok + b * BS, BS, &ea, &ha[b]),
                         KVD_OK);
        assert_int_equal(kvd_block_hash(b == 0 ? &c.root : &hb[b - 1],
                                        tok + b * BS, BS, &eb, &hb[b]),
                         KVD_OK);
    }
    fake_store(&f, ha, 4, KVD_STORE_TIER_HOST);
    kvd_leader_request_t q;
    uint64_t m = 0;
    bool async = false;
    embeds_request(&q, "a", tok, da, 5);
    assert_int_equal(
        kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 64); /* the same embeddings: every stored block */
    embeds_request(&q, "b", tok, db, 5);
    assert_int_equal(
        kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 32); /* up to the block whose embeddings differ */
    /* The same placeholder tokens as plain text match nothing. */
    assert_int_equal(match(ld, "t", tok, 72, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);

    /* Only 4 digests given: block 4 (generated tokens) gets the digest of
     * no bytes, as vLLM's empty slice past the prompt. */
    embeds_request(&q, "g", tok, da, 4);
    q.num_tokens = 64;
    assert_int_equal(
        kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &async), KVD_OK);
    ids(blocks, 5, 30);
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, "g", blocks, 5, m),
                     KVD_OK);
    assert_int_equal(kvd_leader_request_scheduled(ld, "g", NULL, 0, tok + 64,
                                                  16, NULL, 0, 80),
                     KVD_OK);
    kvd_block_extras_t e4 = {.prompt_embeds = nothing};
    kvd_block_hash_t h4;
    assert_int_equal(kvd_block_hash(&ha[3], tok + 4 * BS, BS, &e4, &h4),
                     KVD_OK);
    kvd_pb_step_plan_t *p = plan_of(ld);
    const kvd_pb_step_request_t *r = plan_req(p, "g");
    assert_non_null(r);
    assert_true(r->n_saves >= 1);
    const kvd_pb_block_save_t *last = r->saves[r->n_saves - 1];
    assert_int_equal(last->block_id, 34);
    assert_memory_equal(last->key->block_hash.data, h4.bytes, 32);
    kvd_proto_step_plan_free(p);

    /* Digests promised but not given. */
    embeds_request(&q, "bad", tok, NULL, 2);
    assert_int_equal(
        kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &async),
        KVD_ERR_INVALID);
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_images_key_their_blocks),
        cmocka_unit_test(test_decode_block_after_an_image),
        cmocka_unit_test(test_bad_mm_inputs),
        cmocka_unit_test(test_prompt_embeds_key_their_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
