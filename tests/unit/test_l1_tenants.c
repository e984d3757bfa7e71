/*
 * L1 tenants (store/l1_int.h): a quota evicts only the tenant's own
 * objects (never leased, pinned or reserved ones) or refuses the object,
 * and also makes room in a full table; an eviction group takes its own
 * tenants' objects only; a thousand tenants grow the tenant map, and a
 * failed growth leaves the table usable.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/failpoint_int.h"
#include "kvd_testl1_int.h"

/* ---- quotas ------------------------------------------------------------- */

static void test_quota(void **state)
{
    (void)state;
    enum { A = 1, B = 2 };
    kvd_l1_t *l1 = test_table(32, KVD_L1_S3FIFO);
    assert_int_equal(kvd_l1_tenant_set_quota(l1, A, 300), KVD_OK);
    kvd_store_key_t ka[8], kb[3];
    for (uint32_t i = 0; i < 8; i++) {
        ka[i] = test_key(11, i);
    }
    for (uint32_t i = 0; i < 3; i++) {
        kb[i] = test_key(12, i);
    }
    for (uint32_t i = 0; i < 3; i++) {
        test_put(l1, &ka[i], A, 100, i);
        test_put(l1, &kb[i], B, 100, 100 + i); /* B interleaved, unlimited */
    }
    /* A's fourth object evicts A's oldest, never B's. */
    kvd_l1_victim_t v[4];
    size_t n = 99;
    assert_int_equal(kvd_l1_reserve(l1, &ka[3], A, 100, 3, v, 4, &n), KVD_OK);
    assert_int_equal(n, 1);
    assert_int_equal(v[0].tenant, A);
    assert_int_equal(v[0].slot, 0);
    assert_int_equal(kvd_l1_commit(l1, &ka[3]), KVD_OK);
    /* A bigger object needs two victims. */
    assert_int_equal(kvd_l1_reserve(l1, &ka[4], A, 200, 4, v, 4, &n), KVD_OK);
    assert_int_equal(n, 2);
    assert_int_equal(v[0].tenant, A);
    assert_int_equal(v[1].tenant, A);
    assert_int_equal(kvd_l1_commit(l1, &ka[4]), KVD_OK);
    kvd_l1_tenant_stats_t ta, tb;
    assert_int_equal(kvd_l1_tenant_stats(l1, A, &ta), KVD_OK);
    assert_int_equal(ta.bytes, 300);
    assert_int_equal(ta.objects, 2);
    assert_int_equal(ta.evictions, 3);
    assert_int_equal(ta.evictable_bytes, 300);
    assert_int_equal(kvd_l1_tenant_stats(l1, B, &tb), KVD_OK);
    assert_int_equal(tb.objects, 3);
    assert_int_equal(tb.evictions, 0);
    assert_int_equal(tb.quota_bytes, 0);

    /* All of A's objects leased (3 and 4): A cannot admit, B is untouched
     * and nothing is evicted. */
    assert_true(test_get(l1, &ka[3], NULL));
    assert_true(test_get(l1, &ka[4], NULL));
    assert_int_equal(kvd_l1_tenant_stats(l1, A, &ta), KVD_OK);
    assert_int_equal(ta.evictable_bytes, 0);
    n = 99;
    assert_int_equal(kvd_l1_reserve(l1, &ka[5], A, 100, 5, v, 4, &n),
                     KVD_ERR_QUOTA);
    assert_int_equal(n, 0);
    /* Larger than the whole quota. */
    assert_int_equal(kvd_l1_reserve(l1, &ka[5], A, 301, 5, v, 4, &n),
                     KVD_ERR_QUOTA);
    assert_int_equal(n, 0);
    kvd_l1_stats_t s = test_stats(l1);
    assert_int_equal(s.objects, 5);
    assert_int_equal(s.quota_rejects, 2);
    assert_int_equal(s.quota_evictions, 3);
    assert_int_equal(s.evictions, 0);
    /* Pinned is as good as leased for quota eviction. */
    assert_int_equal(kvd_l1_release(l1, &ka[4]), KVD_OK);
    assert_int_equal(kvd_l1_pin(l1, &ka[4], true, 0), KVD_OK);
    assert_int_equal(kvd_l1_reserve(l1, &ka[5], A, 100, 5, v, 4, &n),
                     KVD_ERR_QUOTA);
    assert_int_equal(kvd_l1_pin(l1, &ka[4], false, 0), KVD_OK);
    /* max_victims too small: the victims evicted so far are reported. */
    assert_int_equal(kvd_l1_release(l1, &ka[3]), KVD_OK);
    n = 99;
    assert_int_equal(kvd_l1_reserve(l1, &ka[5], A, 300, 5, v, 1, &n),
                     KVD_ERR_QUOTA);
    assert_int_equal(n, 1);
    assert_int_equal(v[0].tenant, A);
    assert_int_equal(kvd_l1_tenant_stats(l1, A, &ta), KVD_OK);
    assert_int_equal(ta.objects, 1);
    assert_int_equal(ta.quota_rejects, 4);
    /* Unlimited again: no eviction. */
    assert_int_equal(kvd_l1_tenant_set_quota(l1, A, 0), KVD_OK);
    assert_int_equal(kvd_l1_reserve(l1, &ka[5], A, 1000, 5, v, 4, &n), KVD_OK);
    assert_int_equal(n, 0);
    /* Reserved bytes count towards the quota and are not evictable. */
    assert_int_equal(kvd_l1_tenant_set_quota(l1, A, 1100), KVD_OK);
    assert_int_equal(kvd_l1_reserve(l1, &ka[6], A, 200, 6, v, 4, &n),
                     KVD_ERR_QUOTA);
    assert_int_equal(n, 0);
    assert_int_equal(kvd_l1_tenant_stats(l1, B, &tb), KVD_OK);
    assert_int_equal(tb.objects, 3);
    kvd_l1_destroy(l1);
}

/* Eviction groups: a group's eviction takes its own objects only, in
 * policy order, under both policies; the ungrouped eviction takes any. */
static void test_evict_group_policy(kvd_l1_policy_t policy)
{
    enum { A = 1, B = 2, C = 3 };
    kvd_l1_t *l1 = test_table(32, policy);
    assert_int_equal(kvd_l1_tenant_set_group(l1, B, 1), KVD_OK);
    assert_int_equal(kvd_l1_tenant_set_group(NULL, B, 1), KVD_ERR_INVALID);
    for (uint32_t i = 0; i < 4; i++) {
        kvd_store_key_t ka = test_key(31, i), kb = test_key(32, i),
                        kc = test_key(33, i);
        test_put(l1, &ka, A, 10, i);
        test_put(l1, &kb, B, 10, 100 + i);
        test_put(l1, &kc, C, 10, 200 + i);
    }
    kvd_l1_victim_t v[8];
    size_t n = 99;
    assert_int_equal(kvd_l1_evict_group(l1, 1, 3, 0, v, 8, &n), KVD_OK);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(v[i].tenant, B);
        assert_int_equal(v[i].slot, 100 + i); /* oldest first */
    }
    /* Group 0 (A and C) is never B's. */
    assert_int_equal(kvd_l1_evict_group(l1, 0, 8, 0, v, 8, &n), KVD_OK);
    assert_int_equal(n, 8);
    for (size_t i = 0; i < n; i++) {
        assert_true(v[i].tenant == A || v[i].tenant == C);
    }
    assert_int_equal(kvd_l1_evict_group(l1, 0, 1, 0, v, 8, &n), KVD_OK);
    assert_int_equal(n, 0);
    assert_int_equal(kvd_l1_evict_group(l1, 2, 1, 0, v, 8, &n), KVD_OK);
    assert_int_equal(n, 0);
    assert_int_equal(kvd_l1_evict_group(NULL, 0, 1, 0, v, 8, &n),
                     KVD_ERR_INVALID);
    /* B's last object is left, and the plain eviction finds it. */
    assert_int_equal(kvd_l1_evict(l1, 8, 0, v, 8, &n), KVD_OK);
    assert_int_equal(n, 1);
    assert_int_equal(v[0].slot, 103);
    kvd_l1_destroy(l1);
}

static void test_evict_group(void **state)
{
    (void)state;
    test_evict_group_policy(KVD_L1_S3FIFO);
    test_evict_group_policy(KVD_L1_LRU);
}

/* Quota eviction also makes room in a full table. */
static void test_quota_full_table(void **state)
{
    (void)state;
    kvd_l1_t *l1 = test_table(4, KVD_L1_LRU);
    assert_int_equal(kvd_l1_tenant_set_quota(l1, 1, 20), KVD_OK);
    for (uint32_t i = 0; i < 4; i++) {
        kvd_store_key_t k = test_key(13, i);
        test_put(l1, &k, i < 2 ? 1 : 2, 10, i);
    }
    kvd_store_key_t k = test_key(13, 9);
    kvd_l1_victim_t v[2];
    size_t n;
    assert_int_equal(kvd_l1_reserve(l1, &k, 2, 10, 9, v, 2, &n),
                     KVD_ERR_NOSPACE);
    assert_int_equal(kvd_l1_reserve(l1, &k, 1, 10, 9, v, 2, &n), KVD_OK);
    assert_int_equal(n, 1);
    assert_int_equal(v[0].slot, 0);
    kvd_l1_destroy(l1);
}

/* Many tenants grow the tenant map; a failed growth is KVD_ERR_NOMEM and
 * leaves the table usable. */
static void test_tenants_many(void **state)
{
    (void)state;
    enum { T = 1000 };
    kvd_l1_t *l1 = test_table(T, KVD_L1_S3FIFO);
    for (uint32_t t = 0; t < T; t++) {
        kvd_store_key_t k = test_key(14, t);
        test_put(l1, &k, t * 7919u, 1 + t, t);
    }
    for (uint32_t t = 0; t < T; t++) {
        kvd_l1_tenant_stats_t ts;
        assert_int_equal(kvd_l1_tenant_stats(l1, t * 7919u, &ts), KVD_OK);
        assert_int_equal(ts.bytes, 1 + t);
        assert_int_equal(ts.objects, 1);
    }
#ifdef KVD_FAILPOINTS_ENABLED
    /* 1000 tenants live in 2048 records; the 1025th needs 4096. */
    assert_int_equal(kvd_failpoint_set("l1.tenant_alloc=ENOMEM", NULL, 0),
                     KVD_OK);
    uint32_t t = T;
    kvd_status_t st = KVD_OK;
    for (; t < 2 * T && st == KVD_OK; t++) {
        st = kvd_l1_tenant_set_quota(l1, 5000000 + t, 1);
    }
    assert_int_equal(st, KVD_ERR_NOMEM);
    kvd_store_key_t k = test_key(14, 5000);
    size_t n;
    kvd_l1_victim_t v;
    assert_int_equal(kvd_l1_evict(l1, 1, 0, &v, 1, &n), KVD_OK);
    assert_int_equal(kvd_l1_reserve(l1, &k, 9999999, 1, 1, NULL, 0, &n),
                     KVD_ERR_NOMEM);
    kvd_failpoint_clear();
#else
    kvd_store_key_t k = test_key(14, 5000);
    size_t n;
    kvd_l1_victim_t v;
    assert_int_equal(kvd_l1_evict(l1, 1, 0, &v, 1, &n), KVD_OK);
#endif
    assert_int_equal(kvd_l1_reserve(l1, &k, 9999999, 1, 1, NULL, 0, &n),
                     KVD_OK);
    kvd_l1_tenant_stats_t ts;
    assert_int_equal(kvd_l1_tenant_stats(l1, 7919u, &ts), KVD_OK);
    assert_int_equal(ts.bytes, 2);
    kvd_l1_destroy(l1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quota),
        cmocka_unit_test(test_evict_group),
        cmocka_unit_test(test_quota_full_table),
        cmocka_unit_test(test_tenants_many),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
