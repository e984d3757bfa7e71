/*
 * The leader's loads (include/kvdepot/leader.h), scripted engine steps
 * against a scripted store (every lease counted): a full hit never claims
 * the last block; the engine may take fewer blocks than matched; asked
 * again, the answer follows the engine's own prefix; preemption and abort
 * give every lease back; an asynchronous load with a failed block is
 * reported and the request looked up afresh; positions the engine dropped
 * (KVD_LEADER_NO_BLOCK, a sliding window) are neither loaded nor saved.
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

static void test_full_hit_never_claims_last_block(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[112], blocks[7];
    kvd_block_hash_t h[8];
    kvd_leader_t *ld = scene(&f, 1, tok, 112, 2, h);
    fake_store(&f, h, 7, KVD_STORE_TIER_HOST);
    uint64_t m = 0;
    bool async = true;
    assert_int_equal(match(ld, "b", tok, 112, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 96); /* 6 of 7 blocks: the last token is computed */
    assert_false(async);
    assert_int_equal(f.leases, 6);
    /* Side-effect free when asked again. */
    assert_int_equal(match(ld, "b", tok, 112, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 96);
    assert_int_equal(f.leases, 6);

    ids(blocks, 7, 10);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "b", blocks, 7, 96), KVD_OK);
    assert_int_equal(
        kvd_leader_request_scheduled(ld, "b", NULL, 0, NULL, 0, NULL, 0, 112),
        KVD_OK);
    kvd_pb_step_plan_t *p = plan_of(ld);
    const kvd_pb_step_request_t *q = plan_req(p, "b");
    assert_non_null(q);
    assert_int_equal(q->n_loads, 6);
    assert_int_equal(q->num_load_tokens, 96);
    assert_false(q->async_load);
    for (size_t i = 0; i < 6; i++) {
        assert_int_equal(q->loads[i]->block_id, 10 + i);
        assert_int_equal(q->loads[i]->source->tier,
                         KVDEPOT__V1__TIER__TIER_HOST);
        assert_memory_equal(q->loads[i]->key->block_hash.data, h[i].bytes, 32);
    }
    /* The stored 7th block is not saved again... it is: the leader only
     * knows the prefix it leased, and the store answers EXISTS. */
    assert_int_equal(q->n_saves, 1);
    assert_int_equal(q->saves[0]->block_id, 16);
    kvd_proto_step_plan_free(p);
    report(ld, 1, "b", "b", NULL, 0);
    assert_int_equal(f.leases, 0);
    const char *done[4];
    assert_int_equal(kvd_leader_take_finished_loads(ld, done, 4), 0);
    bool delay = true;
    assert_int_equal(kvd_leader_request_finished(ld, "b", &delay), KVD_OK);
    assert_false(delay);
    kvd_leader_destroy(ld);
}

static void test_partial_hit_and_fewer_blocks_taken(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[112], blocks[7];
    kvd_block_hash_t h[8];
    kvd_leader_t *ld = scene(&f, 1, tok, 112, 3, h);
    fake_store(&f, h, 3, KVD_STORE_TIER_HOST);
    uint64_t m = 0;
    bool async = true;
    /* The engine has block 0 locally already. */
    assert_int_equal(match(ld, "c", tok, 112, NULL, 16, &m, &async), KVD_OK);
    assert_int_equal(m, 32);
    assert_int_equal(f.leases, 2);
    ids(blocks, 7, 0);
    /* The engine takes one block of the two. */
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "c", blocks, 7, 48),
        KVD_ERR_RANGE);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "c", blocks, 7, 16), KVD_OK);
    assert_int_equal(f.leases, 1);
    kvd_pb_step_plan_t *p = plan_of(ld);
    const kvd_pb_step_request_t *q = plan_req(p, "c");
    assert_int_equal(q->n_loads, 1);
    assert_int_equal(q->loads[0]->block_id, 1);
    kvd_proto_step_plan_free(p);
    bool delay = true;
    assert_int_equal(kvd_leader_request_finished(ld, "c", &delay), KVD_OK);
    assert_false(delay);
    assert_int_equal(f.leases, 0);
    kvd_leader_destroy(ld);
}

static void test_preempt_and_abort_release_everything(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[80], blocks[5];
    kvd_block_hash_t h[8];
    kvd_leader_t *ld = scene(&f, 1, tok, 80, 5, h);
    fake_store(&f, h, 5, KVD_STORE_TIER_HOST);
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "e", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 64);
    ids(blocks, 5, 0);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "e", blocks, 5, 64), KVD_OK);
    assert_int_equal(kvd_leader_request_preempted(ld, "e"), KVD_OK);
    assert_int_equal(f.leases, 0);
    kvd_pb_step_plan_t *p = plan_of(ld);
    assert_int_equal(p->n_preempted_request_ids, 1);
    assert_string_equal(p->preempted_request_ids[0], "e");
    assert_null(plan_req(p, "e")); /* its loads were dropped */
    kvd_proto_step_plan_free(p);
    /* Resumed: asked again, looked up again. */
    assert_int_equal(match(ld, "e", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 64);
    assert_int_equal(f.leases, 4);
    /* Aborted before anything ran. */
    bool delay = true;
    assert_int_equal(kvd_leader_request_finished(ld, "e", &delay), KVD_OK);
    assert_false(delay);
    assert_int_equal(f.leases, 0);
    kvd_leader_stats_t st;
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.requests, 0);
    assert_int_equal(st.leases, 0);
    kvd_leader_destroy(ld);
}

static void test_async_load_failure(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[80], blocks[5];
    kvd_block_hash_t h[8];
    kvd_leader_t *ld = scene(&f, 1, tok, 80, 6, h);
    fake_store(&f, h, 2, KVD_STORE_TIER_HOST);
    fake_store(&f, h + 2, 3, KVD_STORE_TIER_DISK);
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "f", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 64);
    assert_true(async);
    ids(blocks, 5, 20);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "f", blocks, 5, 64), KVD_OK);
    kvd_pb_step_plan_t *p = plan_of(ld);
    const kvd_pb_step_request_t *q = plan_req(p, "f");
    assert_true(q->async_load);
    assert_int_equal(q->loads[3]->source->tier, KVDEPOT__V1__TIER__TIER_DISK);
    kvd_proto_step_plan_free(p);
    /* Block 22 fails its checksum. */
    report(ld, 1, NULL, NULL, "f", 22);
    uint32_t bad[4];
    assert_int_equal(kvd_leader_take_failed_blocks(ld, bad, 4), 1);
    assert_int_equal(bad[0], 22);
    assert_int_equal(kvd_leader_take_failed_blocks(ld, bad, 4), 0);
    const char *done[4];
    assert_int_equal(kvd_leader_take_finished_loads(ld, done, 4), 1);
    assert_string_equal(done[0], "f");
    assert_int_equal(f.leases, 0);
    /* vLLM's "recompute" policy puts the request back in its queue and
     * asks again: a fresh lookup, not the answer that failed (the store
     * dropped the bad object). */
    kvd_leader_stats_t st;
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    uint64_t lookups = st.lookups;
    f.num_stored = 2; /* blocks 2..4 are gone */
    assert_int_equal(match(ld, "f", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 32);
    assert_false(async);
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.lookups, lookups + 1);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "f", blocks, 5, 32), KVD_OK);
    p = plan_of(ld);
    q = plan_req(p, "f");
    assert_non_null(q);
    assert_int_equal(q->n_loads, 2);
    kvd_proto_step_plan_free(p);
    report(ld, 2, NULL, "f", NULL, 0);
    assert_int_equal(f.leases, 0);
    bool delay = true;
    assert_int_equal(kvd_leader_request_finished(ld, "f", &delay), KVD_OK);
    kvd_leader_destroy(ld);
}

/* A sliding-window KV-cache group (vLLM's hybrid allocator): positions the
 * engine dropped are KVD_LEADER_NO_BLOCK. Nothing is loaded into or saved
 * from them, and an asynchronous load of only such positions still ends
 * when the worker reports it. */
static void test_no_block_positions(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[80];
    kvd_block_hash_t h[8];
    kvd_leader_t *ld = scene(&f, 1, tok, 80, 12, h);
    fake_store(&f, h, 4, KVD_STORE_TIER_DISK);
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "w", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 64);
    assert_true(async);
    const uint32_t nb = KVD_LEADER_NO_BLOCK;
    uint32_t blocks[5] = {nb, nb, 32, 33, 34};
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "w", blocks, 5, 64), KVD_OK);
    kvd_pb_step_plan_t *p = plan_of(ld);
    const kvd_pb_step_request_t *q = plan_req(p, "w");
    assert_non_null(q);
    assert_true(q->async_load);
    assert_int_equal(q->n_loads, 2);
    assert_int_equal(q->loads[0]->block_id, 32);
    assert_int_equal(q->loads[1]->block_id, 33);
    assert_memory_equal(q->loads[0]->key->block_hash.data, h[2].bytes,
                        KVD_SHA256_BYTES);
    assert_int_equal(q->num_load_tokens, 32);
    kvd_proto_step_plan_free(p);
    report(ld, 1, NULL, "w", NULL, 0);
    assert_int_equal(f.leases, 0);
    /* Prefill of the rest: block 4 is saved; the engine then drops block
     * 2 and 3 from the window before a later save would reach them. */
    uint32_t more[1] = {35};
    assert_int_equal(
        kvd_leader_request_scheduled(ld, "w", more, 0, NULL, 0, NULL, 0, 80),
        KVD_OK);
    p = plan_of(ld);
    q = plan_req(p, "w");
    assert_non_null(q);
    assert_int_equal(q->n_loads, 0);
    assert_int_equal(q->n_saves, 1);
    assert_int_equal(q->saves[0]->block_id, 34);
    kvd_proto_step_plan_free(p);
    report(ld, 2, "w", NULL, NULL, 0);
    bool delay = true;
    assert_int_equal(kvd_leader_request_finished(ld, "w", &delay), KVD_OK);
    assert_false(delay);

    /* Every position to load dropped: the load is asynchronous with nothing
     * to copy and still ends with the worker's report. */
    assert_int_equal(match(ld, "x", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 64);
    uint32_t none[5] = {nb, nb, nb, nb, 40};
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, "x", none, 5, 64),
                     KVD_OK);
    p = plan_of(ld);
    q = plan_req(p, "x");
    assert_non_null(q);
    assert_true(q->async_load);
    assert_int_equal(q->n_loads, 0);
    kvd_proto_step_plan_free(p);
    report(ld, 3, NULL, "x", NULL, 0);
    const char *done[2];
    assert_int_equal(kvd_leader_take_finished_loads(ld, done, 2), 2);
    assert_int_equal(f.leases, 0);

    /* Host-tier (synchronous) blocks, all dropped: planned as an
     * asynchronous load of nothing, so the worker's report ends it. */
    kvd_block_hash_t h2[3];
    uint32_t tok3[48];
    prompt(tok3, 48, 14);
    assert_int_equal(chain(tok3, 48, NULL, h2), 3);
    fake_store(&f, h2, 2, KVD_STORE_TIER_HOST);
    assert_int_equal(match(ld, "z", tok3, 48, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 32);
    assert_false(async);
    uint32_t z[3] = {nb, nb, 60};
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, "z", z, 3, 32),
                     KVD_OK);
    p = plan_of(ld);
    q = plan_req(p, "z");
    assert_non_null(q);
    assert_true(q->async_load);
    assert_int_equal(q->n_loads, 0);
    kvd_proto_step_plan_free(p);
    assert_true(f.leases > 0);
    report(ld, 4, NULL, "z", NULL, 0);
    assert_int_equal(f.leases, 0);
    assert_int_equal(kvd_leader_request_finished(ld, "z", &delay), KVD_OK);

    /* Saves of dropped positions only: no plan entry, nothing in flight. */
    uint32_t tok2[48];
    prompt(tok2, 48, 13);
    assert_int_equal(match(ld, "y", tok2, 48, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    uint32_t y[3] = {nb, nb, 50};
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, "y", y, 3, 0),
                     KVD_OK);
    assert_int_equal(
        kvd_leader_request_scheduled(ld, "y", NULL, 0, NULL, 0, NULL, 0, 32),
        KVD_OK);
    p = plan_of(ld);
    assert_null(plan_req(p, "y"));
    kvd_proto_step_plan_free(p);
    assert_int_equal(kvd_leader_request_finished(ld, "y", &delay), KVD_OK);
    assert_false(delay);
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

/* Asked again with a different num_computed_tokens (the engine's own
 * prefix grew or shrank before it allocated), the answer is for the new
 * prefix: never past the last token, never a block the engine has. */
static void test_answer_follows_engine_prefix(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[112], blocks[7];
    kvd_block_hash_t h[8];
    kvd_leader_t *ld = scene(&f, 1, tok, 112, 12, h);
    fake_store(&f, h, 7, KVD_STORE_TIER_HOST);
    uint64_t m = 0;
    bool async = true;
    assert_int_equal(match(ld, "p", tok, 112, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 96);
    assert_int_equal(f.leases, 6);
    assert_int_equal(match(ld, "p", tok, 112, NULL, 32, &m, &async), KVD_OK);
    assert_int_equal(m, 64); /* blocks 2..5: 32 + 64 < 112 */
    assert_int_equal(f.leases, 4);
    assert_int_equal(match(ld, "p", tok, 112, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 96);
    assert_int_equal(f.leases, 6);
    ids(blocks, 7, 0);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "p", blocks, 7, 96), KVD_OK);
    /* Once the engine acted on the answer, it cannot change. */
    assert_int_equal(match(ld, "p", tok, 112, NULL, 16, &m, &async),
                     KVD_ERR_STATE);
    assert_int_equal(match(ld, "p", tok, 112, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 96);
    bool delay = false;
    assert_int_equal(kvd_leader_request_finished(ld, "p", &delay), KVD_OK);
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_hit_never_claims_last_block),
        cmocka_unit_test(test_partial_hit_and_fewer_blocks_taken),
        cmocka_unit_test(test_preempt_and_abort_release_everything),
        cmocka_unit_test(test_async_load_failure),
        cmocka_unit_test(test_no_block_positions),
        cmocka_unit_test(test_answer_follows_engine_prefix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
