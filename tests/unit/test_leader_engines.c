/*
 * The leader beyond vLLM's scheduler on a scripted store
 * (include/kvdepot/leader.h): over the embedded store (leases held and
 * given back in the real store), the prefill/decode hand-off of
 * disaggregated serving (the transfer record, and lookups that name the
 * prefill node), and TensorRT-LLM's order and rules (no "retry later",
 * every rank reports).
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

static void test_embedded_store(void **state)
{
    (void)state;
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_size", "16m"), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_chunk", "4m"), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_prefault", "false"),
                     KVD_OK);
    kvd_store_t *st = NULL;
    assert_int_equal(kvd_store_open(cfg, &st, NULL, 0), KVD_OK);
    kvd_config_destroy(cfg);
    kvd_leader_config_t c = config(1);
    kvd_leader_t *ld = NULL;
    assert_int_equal(kvd_leader_create(&c, st, &ld), KVD_OK);

    uint32_t tok[80];
    kvd_block_hash_t h[8];
    prompt(tok, 80, 10);
    chain(tok, 80, NULL, h);
    kvd_store_reservation_t r[3];
    kvd_store_key_t keys[3];
    assert_int_equal(kvd_store_reserve(st, &c.ns, h, 3, 4096, 0, r), KVD_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(r[i].status, KVD_OK);
        keys[i].ns = c.ns;
        keys[i].hash = h[i];
    }
    assert_int_equal(kvd_store_commit(st, keys, 3, NULL), KVD_OK);
    uint64_t m = 0;
    bool async = true;
    assert_int_equal(match(ld, "s", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 48);
    assert_false(async);
    kvd_store_stats_t ss;
    assert_int_equal(kvd_store_stats(st, &ss), KVD_OK);
    assert_int_equal(ss.leases, 3);
    bool delay = true;
    assert_int_equal(kvd_leader_request_finished(ld, "s", &delay), KVD_OK);
    assert_int_equal(kvd_store_stats(st, &ss), KVD_OK);
    assert_int_equal(ss.leases, 0);
    kvd_leader_destroy(ld);
    kvd_store_close(st);
}

static void test_prefill_handoff(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[100], blocks[7];
    kvd_block_hash_t h[8];
    memset(&f, 0, sizeof f);
    prompt(tok, 100, 11);
    chain(tok, 100, NULL, h);
    kvd_leader_config_t c = config(1);
    c.node_id = "prefill-node-a";
    kvd_leader_t *ld = NULL;
    assert_int_equal(kvd_leader_create(&c, fake_as_store(&f), &ld), KVD_OK);
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "p", tok, 100, NULL, 0, &m, &async), KVD_OK);
    ids(blocks, 7, 0);
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, "p", blocks, 7, 0),
                     KVD_OK);
    assert_int_equal(
        kvd_leader_request_scheduled(ld, "p", NULL, 0, NULL, 0, NULL, 0, 100),
        KVD_OK);
    kvd_proto_step_plan_free(plan_of(ld));
    bool delay = false;
    kvd_leader_transfer_t t;
    assert_int_equal(kvd_leader_request_finished_transfer(ld, "p", &delay, &t),
                     KVD_OK);
    assert_true(delay); /* the decode node needs the saves to land */
    assert_string_equal(t.node_id, "prefill-node-a");
    assert_memory_equal(t.ns.bytes, c.ns.bytes, 16);
    assert_int_equal(t.num_hashes, 6);
    assert_int_equal(t.num_tokens, 96);
    assert_memory_equal(t.hashes, h, 6 * sizeof h[0]);
    report(ld, 1, "p", NULL, NULL, 0);
    kvd_leader_stats_t st;
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.requests, 0);
    assert_int_equal(kvd_leader_request_finished_transfer(ld, "p", &delay, &t),
                     KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_leader_request_finished_transfer(ld, "p", NULL, &t),
                     KVD_ERR_INVALID);
    kvd_leader_destroy(ld);

    /* The decode node's leader names the prefill node: its store is asked
     * through lookup_from with that node (the daemon asks it first). */
    fake_store(&f, h, 6, KVD_STORE_TIER_HOST);
    c.node_id = "decode-node-b";
    assert_int_equal(kvd_leader_create(&c, fake_as_store(&f), &ld), KVD_OK);
    kvd_leader_request_t q;
    memset(&q, 0, sizeof q);
    q.request_id = "d";
    q.tokens = tok;
    q.num_tokens = 100;
    q.source_node = "prefill-node-a";
    assert_int_equal(
        kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 96);
    assert_string_equal(f.last_source, "prefill-node-a");
    /* Without a source the plain lookup runs. */
    f.last_source[0] = '\0';
    q.request_id = "e";
    q.source_node = NULL;
    assert_int_equal(
        kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 96);
    assert_string_equal(f.last_source, "");
    kvd_leader_destroy(ld);
}

/* TensorRT-LLM's order and rules: integer request ids, no "retry later"
 * (a block another request is loading is simply not promised), the whole
 * match taken at allocation, request_finished answering only a bool. */
static void test_trtllm_sequence(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[80], blocks[5];
    kvd_block_hash_t h[8];
    memset(&f, 0, sizeof f);
    prompt(tok, 80, 12);
    chain(tok, 80, NULL, h);
    fake_store(&f, h, 2, KVD_STORE_TIER_DISK);
    fake_store(&f, h + 2, 3, KVD_STORE_TIER_HOST);
    kvd_leader_config_t c = config(2); /* every rank must report */
    c.no_retry = true;
    kvd_leader_t *ld = NULL;
    assert_int_equal(kvd_leader_create(&c, fake_as_store(&f), &ld), KVD_OK);

    /* Request 17: async load of 4 blocks (2 on NVMe). */
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "17", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 64);
    assert_true(async);
    ids(blocks, 5, 0);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "17", blocks, 5, m), KVD_OK);
    kvd_pb_step_plan_t *p = plan_of(ld);
    const kvd_pb_step_request_t *q = plan_req(p, "17");
    assert_int_equal(q->n_loads, 4);
    assert_true(q->async_load);
    kvd_proto_step_plan_free(p);

    /* Request 18, same prompt, arrives while 17 loads: never "not yet";
     * the blocks 17 is loading are not promised. */
    assert_int_equal(match(ld, "18", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    assert_false(async);

    /* Both ranks report 17's load; only then is it finished. */
    report(ld, 1, NULL, "17", NULL, 0);
    const char *done[2];
    assert_int_equal(kvd_leader_take_finished_loads(ld, done, 2), 0);
    report(ld, 1, NULL, "17", NULL, 0);
    assert_int_equal(kvd_leader_take_finished_loads(ld, done, 2), 1);
    assert_string_equal(done[0], "17");
    assert_int_equal(f.leases, 0);

    /* The last block is computed, saved, reported by both ranks. */
    assert_int_equal(
        kvd_leader_request_scheduled(ld, "17", NULL, 0, NULL, 0, NULL, 0, 80),
        KVD_OK);
    p = plan_of(ld);
    assert_int_equal(plan_req(p, "17")->n_saves, 1);
    kvd_proto_step_plan_free(p);
    bool delay = false;
    assert_int_equal(kvd_leader_request_finished(ld, "17", &delay), KVD_OK);
    assert_true(delay);
    report(ld, 2, "17", NULL, NULL, 0);
    report(ld, 2, "17", NULL, NULL, 0);
    assert_int_equal(kvd_leader_request_finished(ld, "18", &delay), KVD_OK);
    assert_false(delay);
    kvd_leader_stats_t st;
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.requests, 0);
    assert_int_equal(st.not_yet, 0);
    /* A store that is not ready is a miss, not a wait. */
    f.busy = 1;
    assert_int_equal(match(ld, "19", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    f.busy = 0;
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedded_store),
        cmocka_unit_test(test_prefill_handoff),
        cmocka_unit_test(test_trtllm_sequence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
