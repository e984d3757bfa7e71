/*
 * When the leader answers "not yet" (KVD_AGAIN, ask again) and when it does
 * not (include/kvdepot/leader.h): a prefix another request is loading is
 * loaded once, the other request waits; a store that is not ready also
 * means not yet; the wait lasts lookup_timeout_ms at most; a failing store
 * (a dead daemon, a deadline) is a miss, never an error for the engine.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "kvd_testleader_int.h"

static void test_shared_prefix_loaded_once(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[80], blocks[5];
    kvd_block_hash_t h[8];
    kvd_leader_t *ld = scene(&f, 1, tok, 80, 7, h);
    fake_store(&f, h, 5, KVD_STORE_TIER_DISK);
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "g1", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_true(async);
    ids(blocks, 5, 0);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "g1", blocks, 5, 64), KVD_OK);
    /* g2 shares the prefix in the same scheduling pass, before any plan
     * exists (vLLM matches every waiting request, then plans): not yet. */
    assert_int_equal(match(ld, "g2", tok, 80, NULL, 0, &m, &async), KVD_AGAIN);
    kvd_pb_step_plan_t *p = plan_of(ld);
    kvd_proto_step_plan_free(p);
    /* And while g1 is loading it: not yet. */
    assert_int_equal(match(ld, "g2", tok, 80, NULL, 0, &m, &async), KVD_AGAIN);
    report(ld, 1, NULL, "g1", NULL, 0);
    const char *done[2];
    assert_int_equal(kvd_leader_take_finished_loads(ld, done, 2), 1);
    assert_string_equal(done[0], "g1");
    /* Now the engine has the blocks locally: nothing to load. */
    assert_int_equal(match(ld, "g2", tok, 80, NULL, 64, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    kvd_leader_stats_t st;
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.not_yet, 2);
    assert_int_equal(st.planned_loads, 4);
    /* A store that is not ready yet also means not yet. */
    f.busy = 1;
    assert_int_equal(match(ld, "g3", tok, 80, NULL, 0, &m, &async), KVD_AGAIN);
    f.busy = 0;
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

/* "Not yet" lasts lookup_timeout_ms at most; then the request is matched
 * against what is ready, as for an engine without retries. */
static void test_not_yet_is_bounded(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[80], blocks[5];
    kvd_block_hash_t h[8];
    memset(&f, 0, sizeof f);
    prompt(tok, 80, 8);
    chain(tok, 80, NULL, h);
    fake_store(&f, h, 5, KVD_STORE_TIER_DISK);
    kvd_leader_config_t c = config(1);
    c.lookup_timeout_ms = 20;
    kvd_leader_t *ld = NULL;
    assert_int_equal(kvd_leader_create(&c, fake_as_store(&f), &ld), KVD_OK);
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "t1", tok, 80, NULL, 0, &m, &async), KVD_OK);
    ids(blocks, 5, 0);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "t1", blocks, 5, 64), KVD_OK);
    kvd_proto_step_plan_free(plan_of(ld));
    /* t2 waits for t1's loads, but not forever. */
    assert_int_equal(match(ld, "t2", tok, 80, NULL, 0, &m, &async), KVD_AGAIN);
    assert_int_equal(match(ld, "t2", tok, 80, NULL, 0, &m, &async), KVD_AGAIN);
    struct timespec nap = {0, 30 * 1000000L};
    nanosleep(&nap, NULL);
    assert_int_equal(match(ld, "t2", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0); /* every block it could load is t1's */
    /* A store that never gets ready: a miss after the timeout. */
    uint32_t other[80];
    prompt(other, 80, 9);
    f.busy = 1;
    assert_int_equal(match(ld, "t3", other, 80, NULL, 0, &m, &async),
                     KVD_AGAIN);
    nanosleep(&nap, NULL);
    assert_int_equal(match(ld, "t3", other, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    f.busy = 0;
    kvd_leader_stats_t st;
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.timeouts, 2);
    assert_int_equal(st.not_yet, 3);
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

/* A failing store (a dead daemon, a deadline) is a miss: the engine
 * computes; the request goes on normally and later lookups work again. */
static void test_store_failure_is_a_miss(void **state)
{
    (void)state;
    fake_t f = {0};
    kvd_leader_t *ld = leader_on(&f, 1);
    uint32_t tok[80];
    prompt(tok, 80, 41);
    kvd_block_hash_t h[5];
    assert_int_equal(chain(tok, 80, NULL, h), 5);
    fake_store(&f, h, 5, KVD_STORE_TIER_HOST);
    uint64_t m = 99;
    bool async = true;
    f.fail = KVD_ERR_UNREACHABLE;
    assert_int_equal(match(ld, "down", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    assert_false(async);
    f.fail = KVD_ERR_TIMEOUT;
    assert_int_equal(match(ld, "slow", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    kvd_leader_stats_t st;
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.lookup_errors, 2);
    f.fail = KVD_OK;
    assert_int_equal(match(ld, "up", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 64);
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_prefix_loaded_once),
        cmocka_unit_test(test_not_yet_is_bounded),
        cmocka_unit_test(test_store_failure_is_a_miss),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
