/*
 * L1 eviction (store/l1_int.h): leased, pinned and reserved entries are
 * never chosen (their slots never appear among victims), under S3-FIFO and
 * LRU alike; reservations count against capacity; victims by count, by
 * bytes and bounded by the batch; and LRU's order of recency.
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

/* ---- eviction never touches leased, pinned or reserved entries ---------- */

static void test_evict_skips_busy_policy(kvd_l1_policy_t policy)
{
    enum { CAP = 64 };
    kvd_l1_t *l1 = test_table(CAP, policy);
    kvd_store_key_t keys[CAP];
    for (uint32_t i = 0; i < CAP; i++) {
        keys[i] = test_key(4, i);
        if (i % 7 == 6) { /* reserved, never committed */
            size_t n;
            assert_int_equal(
                kvd_l1_reserve(l1, &keys[i], 0, 10, 1000 + i, NULL, 0, &n),
                KVD_OK);
        } else {
            test_put(l1, &keys[i], 0, 10, 1000 + i);
        }
    }
    /* Lease every third object, pin every fifth. */
    bool busy[CAP] = {false};
    uint32_t expect_busy = 0;
    for (uint32_t i = 0; i < CAP; i++) {
        if (i % 7 == 6) {
            busy[i] = true;
        } else if (i % 3 == 0) {
            assert_true(test_get(l1, &keys[i], NULL));
            busy[i] = true;
        } else if (i % 5 == 0) {
            assert_int_equal(kvd_l1_pin(l1, &keys[i], true, 0), KVD_OK);
            busy[i] = true;
        }
        expect_busy += busy[i];
    }
    kvd_l1_victim_t victims[CAP];
    size_t n = 0;
    assert_int_equal(kvd_l1_evict(l1, CAP, 0, victims, CAP, &n), KVD_OK);
    assert_int_equal(n, CAP - expect_busy);
    bool seen[CAP] = {false};
    for (size_t j = 0; j < n; j++) {
        uint32_t i = victims[j].slot - 1000;
        assert_true(i < CAP);
        assert_false(busy[i]);
        assert_false(seen[i]);
        seen[i] = true;
        assert_memory_equal(&victims[j].key, &keys[i], sizeof(keys[i]));
        assert_int_equal(victims[j].size_bytes, 10);
    }
    /* Everything busy is still there and still readable. */
    kvd_l1_stats_t s = test_stats(l1);
    assert_int_equal(s.objects, expect_busy);
    assert_int_equal(kvd_l1_evict(l1, CAP, 0, victims, CAP, &n), KVD_OK);
    assert_int_equal(n, 0);
    for (uint32_t i = 0; i < CAP; i++) {
        if (busy[i] && i % 7 != 6) {
            uint32_t slot;
            assert_true(test_get(l1, &keys[i], &slot));
            assert_int_equal(slot, 1000 + i);
            assert_int_equal(kvd_l1_release(l1, &keys[i]), KVD_OK);
        }
    }
    /* Dropping the first leases frees those objects; pins and reservations
     * still hold. */
    uint32_t leased = 0;
    for (uint32_t i = 0; i < CAP; i++) {
        if (i % 7 != 6 && i % 3 == 0) {
            assert_int_equal(kvd_l1_release(l1, &keys[i]), KVD_OK);
            leased++;
        }
    }
    assert_int_equal(kvd_l1_evict(l1, CAP, 0, victims, CAP, &n), KVD_OK);
    assert_int_equal(n, leased);
    for (size_t j = 0; j < n; j++) {
        uint32_t i = victims[j].slot - 1000;
        assert_true(i % 3 == 0 && i % 7 != 6);
    }
    s = test_stats(l1);
    assert_int_equal(s.objects, expect_busy - leased);
    assert_int_equal(s.leases, 0);
    kvd_l1_destroy(l1);
}

static void test_evict_skips_busy(void **state)
{
    (void)state;
    test_evict_skips_busy_policy(KVD_L1_S3FIFO);
    test_evict_skips_busy_policy(KVD_L1_LRU);
}

/* ---- capacity ----------------------------------------------------------- */

static void test_capacity(void **state)
{
    (void)state;
    enum { CAP = 8 };
    kvd_l1_t *l1 = test_table(CAP, KVD_L1_LRU);
    for (uint32_t i = 0; i < CAP; i++) {
        kvd_store_key_t k = test_key(5, i);
        test_put(l1, &k, 0, 1, i);
    }
    kvd_store_key_t extra = test_key(5, 100);
    size_t n = 99;
    assert_int_equal(kvd_l1_reserve(l1, &extra, 0, 1, 100, NULL, 0, &n),
                     KVD_ERR_NOSPACE);
    assert_int_equal(n, 0);
    /* Evicting by bytes: sizes are 1, so want_bytes 3 takes three. */
    kvd_l1_victim_t v[CAP];
    assert_int_equal(kvd_l1_evict(l1, 0, 3, v, CAP, &n), KVD_OK);
    assert_int_equal(n, 3);
    /* LRU order: the three oldest. */
    for (size_t j = 0; j < 3; j++) {
        assert_int_equal(v[j].slot, j);
    }
    /* max_victims bounds the batch. */
    assert_int_equal(kvd_l1_evict(l1, 5, 0, v, 1, &n), KVD_OK);
    assert_int_equal(n, 1);
    assert_int_equal(v[0].slot, 3);
    assert_int_equal(kvd_l1_reserve(l1, &extra, 0, 1, 100, NULL, 0, &n),
                     KVD_OK);
    /* Reservations count against capacity too. */
    for (uint32_t i = 0; i < 3; i++) {
        kvd_store_key_t k = test_key(5, 200 + i);
        assert_int_equal(kvd_l1_reserve(l1, &k, 0, 1, 200 + i, NULL, 0, &n),
                         KVD_OK);
    }
    kvd_store_key_t k = test_key(5, 300);
    assert_int_equal(kvd_l1_reserve(l1, &k, 0, 1, 300, NULL, 0, &n),
                     KVD_ERR_NOSPACE);
    kvd_l1_stats_t s = test_stats(l1);
    assert_int_equal(s.objects, CAP);
    assert_int_equal(s.reserved, 4);
    assert_int_equal(s.lru_objects, CAP - 4);
    kvd_l1_destroy(l1);
}

/* ---- LRU order ---------------------------------------------------------- */

static void test_lru_order(void **state)
{
    (void)state;
    kvd_l1_t *l1 = test_table(8, KVD_L1_LRU);
    kvd_store_key_t keys[5];
    for (uint32_t i = 0; i < 5; i++) {
        keys[i] = test_key(6, i);
        test_put(l1, &keys[i], 0, 1, i);
    }
    assert_true(test_touch(l1, &keys[0])); /* 0 becomes the newest */
    assert_true(test_touch(l1, &keys[2]));
    kvd_l1_victim_t v[5];
    size_t n;
    assert_int_equal(kvd_l1_evict(l1, 5, 0, v, 5, &n), KVD_OK);
    assert_int_equal(n, 5);
    const uint32_t order[5] = {1, 3, 4, 0, 2};
    for (size_t j = 0; j < 5; j++) {
        assert_int_equal(v[j].slot, order[j]);
    }
    kvd_l1_destroy(l1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_evict_skips_busy),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_lru_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
