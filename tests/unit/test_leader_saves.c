/*
 * The leader's saves (include/kvdepot/leader.h), scripted engine steps
 * against a scripted store: a prompt with no hit is planned for saving
 * block by block, and its blocks are freed only after the save is
 * reported; a chunked prefill and the decode after it save each block once
 * it is full; a save is done only when every worker reported its step.
 * Plans are unpacked and checked block by block against hash chains
 * computed independently with kvd_block_hash_chain.
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

static void test_no_hit_saves_and_delays_free(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[100], blocks[7];
    kvd_block_hash_t h[8];
    kvd_leader_t *ld = scene(&f, 1, tok, 100, 1, h); /* 6 full blocks */
    uint64_t m = 99;
    bool async = true;
    assert_int_equal(match(ld, "a", tok, 100, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    assert_false(async);
    ids(blocks, 7, 40);
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, "a", blocks, 7, 0),
                     KVD_OK);
    assert_int_equal(
        kvd_leader_request_scheduled(ld, "a", NULL, 0, NULL, 0, NULL, 0, 100),
        KVD_OK);
    kvd_pb_step_plan_t *p = plan_of(ld);
    assert_int_equal(p->step, 1);
    assert_int_equal(p->block_size, BS);
    const kvd_pb_step_request_t *q = plan_req(p, "a");
    assert_non_null(q);
    assert_int_equal(q->n_loads, 0);
    assert_int_equal(q->n_saves, 6);
    for (size_t i = 0; i < 6; i++) {
        assert_int_equal(q->saves[i]->block_id, 40 + i);
        assert_memory_equal(q->saves[i]->key->block_hash.data, h[i].bytes, 32);
    }
    kvd_proto_step_plan_free(p);
    /* Nothing new: an empty plan. */
    p = plan_of(ld);
    assert_int_equal(p->n_requests, 0);
    kvd_proto_step_plan_free(p);

    bool delay = false;
    assert_int_equal(kvd_leader_request_finished(ld, "a", &delay), KVD_OK);
    assert_true(delay);
    report(ld, 1, "a", NULL, NULL, 0);
    kvd_leader_stats_t st;
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.requests, 0);
    assert_int_equal(st.planned_saves, 6);
    assert_int_equal(kvd_leader_request_finished(ld, "a", &delay),
                     KVD_ERR_NOT_FOUND);
    kvd_leader_destroy(ld);
}

static void test_chunked_prefill_and_decode(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[176], blocks[12];
    kvd_block_hash_t h[16];
    kvd_leader_t *ld = scene(&f, 1, tok, 176, 4, h);
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "d", tok, 165, NULL, 0, &m, &async), KVD_OK);
    ids(blocks, 12, 100);
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, "d", blocks, 4, 0),
                     KVD_OK);
    /* Three chunks: 64, 64, 37 tokens of a 165-token prompt. */
    static const uint64_t computed[3] = {64, 128, 165};
    static const size_t want_from[3] = {0, 4, 8}, want_n[3] = {4, 4, 2};
    for (int step = 0; step < 3; step++) {
        size_t add = step == 0 ? 0 : 4;
        assert_int_equal(kvd_leader_request_scheduled(
                             ld, "d", blocks + 4 * step, add ? 4 : 0, NULL, 0,
                             NULL, 0, computed[step]),
                         KVD_OK);
        kvd_pb_step_plan_t *p = plan_of(ld);
        const kvd_pb_step_request_t *q = plan_req(p, "d");
        assert_non_null(q);
        assert_int_equal(q->n_saves, want_n[step]);
        for (size_t i = 0; i < q->n_saves; i++) {
            size_t b = want_from[step] + i;
            assert_int_equal(q->saves[i]->block_id, 100 + b);
            assert_memory_equal(q->saves[i]->key->block_hash.data, h[b].bytes,
                                32);
        }
        kvd_proto_step_plan_free(p);
    }
    /* Decode: tokens 165..175 arrive one per step; block 10 completes at
     * 176 tokens. */
    for (uint32_t t = 165; t < 176; t++) {
        assert_int_equal(kvd_leader_request_scheduled(ld, "d", NULL, 0, &tok[t],
                                                      1, NULL, 0, t + 1),
                         KVD_OK);
        kvd_pb_step_plan_t *p = plan_of(ld);
        const kvd_pb_step_request_t *q = plan_req(p, "d");
        if (t + 1 < 176) {
            assert_null(q);
        } else {
            assert_non_null(q);
            assert_int_equal(q->n_saves, 1);
            assert_int_equal(q->saves[0]->block_id, 110);
            assert_memory_equal(q->saves[0]->key->block_hash.data, h[10].bytes,
                                32);
        }
        kvd_proto_step_plan_free(p);
    }
    kvd_leader_destroy(ld);
}

static void test_every_worker_must_report(void **state)
{
    (void)state;
    fake_t f = {0};
    kvd_leader_t *ld = leader_on(&f, 2);
    uint32_t tok[64], blocks[4];
    prompt(tok, 64, 9);
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "w", tok, 64, NULL, 0, &m, &async), KVD_OK);
    ids(blocks, 4, 0);
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, "w", blocks, 4, 0),
                     KVD_OK);
    assert_int_equal(
        kvd_leader_request_scheduled(ld, "w", NULL, 0, NULL, 0, NULL, 0, 32),
        KVD_OK);
    kvd_proto_step_plan_free(plan_of(ld)); /* step 1: blocks 0-1 */
    assert_int_equal(
        kvd_leader_request_scheduled(ld, "w", NULL, 0, NULL, 0, NULL, 0, 64),
        KVD_OK);
    kvd_proto_step_plan_free(plan_of(ld)); /* step 2: blocks 2-3 */
    bool delay = false;
    assert_int_equal(kvd_leader_request_finished(ld, "w", &delay), KVD_OK);
    assert_true(delay);
    /* Reports about step 1 do not finish step 2's saves. */
    report(ld, 1, "w", NULL, NULL, 0);
    report(ld, 1, "w", NULL, NULL, 0);
    kvd_leader_stats_t st;
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.requests, 1);
    report(ld, 2, "w", NULL, NULL, 0);
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.requests, 1);
    report(ld, 2, "w", NULL, NULL, 0);
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.requests, 0);
    kvd_leader_destroy(ld);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_hit_saves_and_delays_free),
        cmocka_unit_test(test_chunked_prefill_and_decode),
        cmocka_unit_test(test_every_worker_must_report),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
