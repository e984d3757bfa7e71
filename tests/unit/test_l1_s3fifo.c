/*
 * The L1 table's S3-FIFO policy (store/l1_int.h): a hot set survives a
 * one-time scan that flushes LRU; a key the small queue evicted is
 * remembered by the ghost queue and re-admitted into the main queue; an
 * object hit in the small queue moves to the main one, where it gets one
 * second chance, and pinned entries move on and are never victims.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvd_testl1_int.h"

/* ---- S3-FIFO ------------------------------------------------------------ */

/* Inserts `key`, evicting one object first when the table is full, as the
 * store does. */
static void test_put_evicting(kvd_l1_t *l1, const kvd_store_key_t *k,
                              uint32_t slot)
{
    size_t n;
    kvd_status_t st = kvd_l1_reserve(l1, k, 0, 1, slot, NULL, 0, &n);
    if (st == KVD_ERR_NOSPACE) {
        kvd_l1_victim_t v;
        assert_int_equal(kvd_l1_evict(l1, 1, 0, &v, 1, &n), KVD_OK);
        assert_int_equal(n, 1);
        st = kvd_l1_reserve(l1, k, 0, 1, slot, NULL, 0, &n);
    }
    assert_int_equal(st, KVD_OK);
    assert_int_equal(kvd_l1_commit(l1, k), KVD_OK);
}

/* Hot keys, each read twice, then a one-time scan five times the cache:
 * returns how many hot keys are still cached. */
static uint32_t test_hot_after_scan(kvd_l1_policy_t policy)
{
    enum { CAP = 100, HOT = 20, SCAN = 500 };
    kvd_l1_t *l1 = test_table(CAP, policy);
    for (uint32_t i = 0; i < HOT; i++) {
        kvd_store_key_t k = test_key(7, i);
        test_put_evicting(l1, &k, i);
        assert_true(test_touch(l1, &k));
        assert_true(test_touch(l1, &k));
    }
    for (uint32_t i = 0; i < SCAN; i++) {
        kvd_store_key_t k = test_key(8, i);
        test_put_evicting(l1, &k, 1000 + i);
    }
    uint32_t survivors = 0;
    for (uint32_t i = 0; i < HOT; i++) {
        kvd_store_key_t k = test_key(7, i);
        survivors += test_touch(l1, &k);
    }
    kvd_l1_stats_t s = test_stats(l1);
    assert_int_equal(s.objects, CAP);
    assert_int_equal(s.evictions, HOT + SCAN - CAP);
    if (policy == KVD_L1_S3FIFO) {
        /* The scan went through S and G; the hot set sits in M. */
        assert_int_equal(s.small_objects + s.main_objects, CAP);
        assert_true(s.main_objects >= HOT);
        assert_true(s.ghost_keys > 0 && s.ghost_keys <= CAP - CAP / 10);
    }
    kvd_l1_destroy(l1);
    return survivors;
}

static void test_s3fifo_scan_resistance(void **state)
{
    (void)state;
    assert_int_equal(test_hot_after_scan(KVD_L1_S3FIFO), 20);
    assert_int_equal(test_hot_after_scan(KVD_L1_LRU), 0);
}

static void test_s3fifo_ghost(void **state)
{
    (void)state;
    /* Capacity 10: S holds 1, the ghost 9 keys. */
    kvd_l1_t *l1 = test_table(10, KVD_L1_S3FIFO);
    kvd_store_key_t a = test_key(9, 0);
    test_put(l1, &a, 0, 1, 0);
    for (uint32_t i = 1; i < 10; i++) {
        kvd_store_key_t k = test_key(9, i);
        test_put(l1, &k, 0, 1, i);
    }
    /* Never hit: `a` is the S victim and its key goes to G. */
    kvd_l1_victim_t v;
    size_t n;
    assert_int_equal(kvd_l1_evict(l1, 1, 0, &v, 1, &n), KVD_OK);
    assert_int_equal(n, 1);
    assert_int_equal(v.slot, 0);
    kvd_l1_stats_t s = test_stats(l1);
    assert_int_equal(s.ghost_keys, 1);
    assert_int_equal(s.small_objects, 9);
    /* A ghost is not an object. */
    assert_false(test_get(l1, &a, NULL));
    assert_int_equal(kvd_l1_release(l1, &a), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_l1_delete(l1, &a, &v), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_l1_pin(l1, &a, true, 0), KVD_ERR_NOT_FOUND);

    /* Re-admission goes to M; a new key goes to S. */
    test_put(l1, &a, 0, 1, 50);
    s = test_stats(l1);
    assert_int_equal(s.ghost_hits, 1);
    assert_int_equal(s.ghost_keys, 0);
    assert_int_equal(s.main_objects, 1);
    assert_int_equal(s.small_objects, 9);
    assert_true(test_touch(l1, &a));

    /* M's second chance: S is over its share, so S is drained first; `a`
     * (in M, hit once) outlives every S object never hit. */
    assert_int_equal(kvd_l1_evict(l1, 9, 0, &v, 1, &n), KVD_OK);
    assert_int_equal(n, 1);
    assert_int_not_equal(v.slot, 50);
    kvd_l1_victim_t all[10];
    assert_int_equal(kvd_l1_evict(l1, 10, 0, all, 10, &n), KVD_OK);
    assert_int_equal(n, 9);
    assert_int_equal(all[8].slot, 50);
    s = test_stats(l1);
    assert_int_equal(s.objects, 0);
    /* Only S evictions are remembered, bounded by the ghost capacity. */
    assert_int_equal(s.ghost_keys, 9);
    assert_int_equal(s.main_objects + s.small_objects, 0);
    kvd_l1_destroy(l1);
}

/* An object hit in S survives S's eviction by moving to M, where it gets
 * one second chance; pinned S entries move on to M and are never victims. */
static void test_s3fifo_promotion(void **state)
{
    (void)state;
    kvd_l1_config_t cfg = {
        .capacity = 10, .policy = KVD_L1_S3FIFO, .small_percent = 50};
    kvd_l1_t *l1;
    assert_int_equal(kvd_l1_create(&cfg, &l1), KVD_OK);
    kvd_store_key_t keys[6];
    for (uint32_t i = 0; i < 6; i++) {
        keys[i] = test_key(10, i);
        test_put(l1, &keys[i], 0, 1, i);
    }
    assert_true(test_touch(l1, &keys[0]));
    kvd_l1_victim_t v;
    size_t n;
    assert_int_equal(kvd_l1_evict(l1, 1, 0, &v, 1, &n), KVD_OK);
    assert_int_equal(v.slot, 1); /* 0 was hit: promoted, not evicted */
    kvd_l1_stats_t s = test_stats(l1);
    assert_int_equal(s.main_objects, 1);
    assert_int_equal(s.small_objects, 4);
    /* S is under its share now, so M goes first: 0 spends its second
     * chance (freq 1 -> 0) and is the victim. */
    for (uint32_t i = 2; i < 6; i++) {
        assert_int_equal(kvd_l1_pin(l1, &keys[i], true, 0), KVD_OK);
    }
    assert_int_equal(kvd_l1_evict(l1, 1, 0, &v, 1, &n), KVD_OK);
    assert_int_equal(n, 1);
    assert_int_equal(v.slot, 0);
    s = test_stats(l1);
    assert_int_equal(s.small_objects, 4);
    assert_int_equal(s.main_objects, 0);
    /* With M empty, S is scanned: its pinned entries move on to M and
     * nothing is evictable. */
    assert_int_equal(kvd_l1_evict(l1, 1, 0, &v, 1, &n), KVD_OK);
    assert_int_equal(n, 0);
    s = test_stats(l1);
    assert_int_equal(s.small_objects, 0);
    assert_int_equal(s.main_objects, 4);
    assert_int_equal(s.pinned_objects, 4);
    assert_int_equal(kvd_l1_pin(l1, &keys[3], false, 0), KVD_OK);
    assert_int_equal(kvd_l1_evict(l1, 1, 0, &v, 1, &n), KVD_OK);
    assert_int_equal(n, 1);
    assert_int_equal(v.slot, 3);
    kvd_l1_destroy(l1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_s3fifo_scan_resistance),
        cmocka_unit_test(test_s3fifo_ghost),
        cmocka_unit_test(test_s3fifo_promotion),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
