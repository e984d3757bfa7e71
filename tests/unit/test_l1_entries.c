/*
 * L1 object table entries (store/l1_int.h): creation and its errors;
 * reserve, commit, abort, lookup, release, pin and delete with every error
 * path; longest-prefix lookup stopping at the first absent or reserved
 * key; the store's commit-with-lease, acquire and peek calls; exact
 * counters after a mixed sequence; and keys sharing one hash bucket.
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

/* ---- create ------------------------------------------------------------- */

static void test_create_errors(void **state)
{
    (void)state;
    int sentinel;
    kvd_l1_t *l1 = (kvd_l1_t *)&sentinel;
    kvd_l1_config_t cfg = {.capacity = 8, .policy = KVD_L1_S3FIFO};
    assert_int_equal(kvd_l1_create(NULL, &l1), KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_create(&cfg, NULL), KVD_ERR_INVALID);
    kvd_l1_config_t bad = cfg;
    bad.capacity = 0;
    assert_int_equal(kvd_l1_create(&bad, &l1), KVD_ERR_INVALID);
    bad.capacity = KVD_L1_CAPACITY_MAX + 1;
    assert_int_equal(kvd_l1_create(&bad, &l1), KVD_ERR_INVALID);
    bad = cfg;
    bad.policy = (kvd_l1_policy_t)7;
    assert_int_equal(kvd_l1_create(&bad, &l1), KVD_ERR_INVALID);
    bad = cfg;
    bad.small_percent = 91;
    assert_int_equal(kvd_l1_create(&bad, &l1), KVD_ERR_INVALID);
    bad = cfg;
    bad.ghost_capacity = KVD_L1_CAPACITY_MAX + 1;
    assert_int_equal(kvd_l1_create(&bad, &l1), KVD_ERR_INVALID);
#ifdef KVD_FAILPOINTS_ENABLED
    /* Each of the four allocations fails in turn; ASan checks that the
     * earlier ones are freed. */
    static const char *const specs[] = {
        "l1.alloc=ENOMEM@1", "l1.alloc=ENOMEM@2", "l1.alloc=ENOMEM@3",
        "l1.alloc=ENOMEM@4"};
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(kvd_failpoint_set(specs[i], NULL, 0), KVD_OK);
        assert_int_equal(kvd_l1_create(&cfg, &l1), KVD_ERR_NOMEM);
        assert_int_equal(kvd_failpoint_count("l1.alloc"), i + 1);
    }
    kvd_failpoint_clear();
#endif
    /* Nothing was written on any failure. */
    assert_ptr_equal(l1, (kvd_l1_t *)&sentinel);
    kvd_l1_destroy(NULL);

    /* Capacity 1 gives a usable S3-FIFO table (small share rounds up). */
    cfg.capacity = 1;
    assert_int_equal(kvd_l1_create(&cfg, &l1), KVD_OK);
    kvd_store_key_t k = test_key(1, 1);
    test_put(l1, &k, 0, 10, 3);
    assert_true(test_touch(l1, &k));
    kvd_l1_destroy(l1);
}

/* ---- single-entry semantics and error paths ----------------------------- */

static void test_lifecycle_errors(void **state)
{
    (void)state;
    kvd_l1_t *l1 = test_table(16, KVD_L1_S3FIFO);
    kvd_store_key_t k = test_key(1, 1);
    kvd_store_key_t absent = test_key(1, 2);
    kvd_store_key_t other_ns = test_key(2, 1); /* same hash, other namespace */
    kvd_l1_victim_t v[2];
    uint32_t slot = 0;
    size_t n = 0;

    /* Argument checks. */
    assert_int_equal(kvd_l1_reserve(NULL, &k, 0, 1, 0, NULL, 0, &n),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_reserve(l1, NULL, 0, 1, 0, NULL, 0, &n),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_reserve(l1, &k, 0, 1, 0, NULL, 0, NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_reserve(l1, &k, 0, 0, 0, NULL, 0, &n),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_reserve(l1, &k, 0, 1, 0, NULL, 1, &n),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_commit(NULL, &k), KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_commit(l1, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_abort(l1, &k, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_abort(NULL, &k, &slot), KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_release(l1, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_pin(NULL, &k, true, 0), KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_delete(l1, &k, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_lookup_prefix(l1, NULL, 1, &slot, NULL, &n),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_lookup_prefix(l1, &k, 1, NULL, NULL, &n),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_lookup_prefix(l1, &k, 1, &slot, NULL, NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_evict(l1, 1, 0, NULL, 1, &n), KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_evict(l1, 1, 0, v, 1, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_stats(l1, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_tenant_set_quota(NULL, 0, 1), KVD_ERR_INVALID);

    /* Byte counters cannot wrap. */
    kvd_store_key_t big = test_key(1, 3);
    assert_int_equal(kvd_l1_reserve(l1, &big, 0, UINT64_MAX, 0, NULL, 0, &n),
                     KVD_OK);
    assert_int_equal(kvd_l1_reserve(l1, &absent, 0, 1, 0, NULL, 0, &n),
                     KVD_ERR_RANGE);
    assert_int_equal(kvd_l1_abort(l1, &big, &slot), KVD_OK);

    /* Not found everywhere. */
    assert_int_equal(kvd_l1_commit(l1, &absent), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_l1_abort(l1, &absent, &slot), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_l1_release(l1, &absent), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_l1_pin(l1, &absent, true, 0), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_l1_delete(l1, &absent, v), KVD_ERR_NOT_FOUND);

    /* Reserved: invisible, not releasable, not deletable, not evictable. */
    assert_int_equal(kvd_l1_reserve(l1, &k, 5, 100, 42, NULL, 0, &n), KVD_OK);
    assert_int_equal(kvd_l1_reserve(l1, &k, 5, 100, 43, NULL, 0, &n),
                     KVD_ERR_EXISTS);
    assert_false(test_get(l1, &k, NULL));
    assert_int_equal(kvd_l1_release(l1, &k), KVD_ERR_STATE);
    assert_int_equal(kvd_l1_delete(l1, &k, v), KVD_ERR_STATE);
    assert_int_equal(kvd_l1_evict(l1, 1, 0, v, 2, &n), KVD_OK);
    assert_int_equal(n, 0);
    /* The other namespace is a different object. */
    assert_false(test_get(l1, &other_ns, NULL));
    assert_int_equal(kvd_l1_commit(l1, &other_ns), KVD_ERR_NOT_FOUND);

    /* Ready: visible with its slot; commit and abort are wrong now. */
    assert_int_equal(kvd_l1_commit(l1, &k), KVD_OK);
    assert_int_equal(kvd_l1_commit(l1, &k), KVD_ERR_STATE);
    assert_int_equal(kvd_l1_abort(l1, &k, &slot), KVD_ERR_STATE);
    assert_int_equal(kvd_l1_reserve(l1, &k, 5, 100, 43, NULL, 0, &n),
                     KVD_ERR_EXISTS);
    assert_int_equal(kvd_l1_release(l1, &k), KVD_ERR_STATE); /* no lease */
    assert_true(test_get(l1, &k, &slot));
    assert_int_equal(slot, 42);
    assert_true(test_get(l1, &k, NULL)); /* a second lease */
    assert_int_equal(kvd_l1_delete(l1, &k, v), KVD_ERR_BUSY);
    assert_int_equal(kvd_l1_release(l1, &k), KVD_OK);
    assert_int_equal(kvd_l1_delete(l1, &k, v), KVD_ERR_BUSY);
    assert_int_equal(kvd_l1_release(l1, &k), KVD_OK);
    assert_int_equal(kvd_l1_release(l1, &k), KVD_ERR_STATE);

    /* Delete hands the object back, pinned or not. */
    assert_int_equal(kvd_l1_pin(l1, &k, true, 0), KVD_OK);
    memset(v, 0, sizeof(v));
    assert_int_equal(kvd_l1_delete(l1, &k, &v[0]), KVD_OK);
    assert_memory_equal(&v[0].key, &k, sizeof(k));
    assert_int_equal(v[0].slot, 42);
    assert_int_equal(v[0].size_bytes, 100);
    assert_int_equal(v[0].tenant, 5);
    assert_false(test_get(l1, &k, NULL));
    assert_int_equal(kvd_l1_delete(l1, &k, v), KVD_ERR_NOT_FOUND);

    /* Abort returns the slot and forgets the key and its bytes. */
    assert_int_equal(kvd_l1_reserve(l1, &k, 5, 100, 7, NULL, 0, &n), KVD_OK);
    slot = 0;
    assert_int_equal(kvd_l1_abort(l1, &k, &slot), KVD_OK);
    assert_int_equal(slot, 7);
    assert_int_equal(kvd_l1_abort(l1, &k, &slot), KVD_ERR_NOT_FOUND);
    kvd_l1_tenant_stats_t ts;
    assert_int_equal(kvd_l1_tenant_stats(l1, 5, &ts), KVD_OK);
    assert_int_equal(ts.objects, 0);
    assert_int_equal(ts.bytes, 0);
    assert_int_equal(kvd_l1_tenant_stats(l1, 6, &ts), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_l1_tenant_stats(l1, 5, NULL), KVD_ERR_INVALID);
    kvd_l1_stats_t s = test_stats(l1);
    assert_int_equal(s.objects, 0);
    assert_int_equal(s.bytes, 0);
    assert_int_equal(s.leases, 0);
    assert_int_equal(s.pinned_objects, 0);
    kvd_l1_destroy(l1);
}

/* ---- longest prefix ----------------------------------------------------- */

static void test_lookup_prefix(void **state)
{
    (void)state;
    kvd_l1_t *l1 = test_table(16, KVD_L1_S3FIFO);
    kvd_store_key_t keys[8];
    for (uint32_t i = 0; i < 8; i++) {
        keys[i] = test_key(3, i);
    }
    for (uint32_t i = 0; i < 3; i++) {
        test_put(l1, &keys[i], 0, 10 + i, 100 + i);
    }
    size_t n;
    assert_int_equal(kvd_l1_reserve(l1, &keys[3], 0, 13, 103, NULL, 0, &n),
                     KVD_OK);
    test_put(l1, &keys[4], 0, 14, 104);

    uint32_t slots[8];
    size_t m = 99;
    memset(slots, 0xff, sizeof(slots));
    /* Stops at the reserved key 3 though 4 is ready. */
    assert_int_equal(kvd_l1_lookup_prefix(l1, keys, 8, slots, NULL, &m),
                     KVD_OK);
    assert_int_equal(m, 3);
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(slots[i], 100 + i);
    }
    assert_int_equal(slots[3], UINT32_MAX); /* untouched past the match */
    kvd_l1_stats_t s = test_stats(l1);
    assert_int_equal(s.hits, 3);
    assert_int_equal(s.misses, 1);
    assert_int_equal(s.leases, 3);
    assert_int_equal(s.leased_objects, 3);

    /* Empty query: no hit, no miss. */
    assert_int_equal(kvd_l1_lookup_prefix(l1, NULL, 0, NULL, NULL, &m), KVD_OK);
    assert_int_equal(m, 0);
    /* Stops at once when the first key is absent. */
    assert_int_equal(kvd_l1_lookup_prefix(l1, &keys[5], 3, slots, NULL, &m),
                     KVD_OK);
    assert_int_equal(m, 0);

    /* Once key 3 is committed the prefix runs through 4 and stops at 5. */
    assert_int_equal(kvd_l1_commit(l1, &keys[3]), KVD_OK);
    uint64_t sizes[8];
    memset(sizes, 0xff, sizeof(sizes));
    assert_int_equal(kvd_l1_lookup_prefix(l1, keys, 8, slots, sizes, &m),
                     KVD_OK);
    assert_int_equal(m, 5);
    assert_int_equal(slots[3], 103);
    assert_int_equal(slots[4], 104);
    /* Each match's size, from the same lock hold. */
    for (uint32_t i = 0; i < 5; i++) {
        assert_int_equal(sizes[i], 10 + i);
    }
    assert_int_equal(sizes[5], UINT64_MAX); /* untouched past the match */
    /* A full match counts no miss. */
    assert_int_equal(kvd_l1_lookup_prefix(l1, keys, 2, slots, NULL, &m),
                     KVD_OK);
    assert_int_equal(m, 2);
    s = test_stats(l1);
    assert_int_equal(s.hits, 3 + 5 + 2);
    assert_int_equal(s.misses, 3);
    assert_int_equal(s.leases, 3 + 5 + 2);
    assert_int_equal(s.leased_objects, 5);
    kvd_l1_destroy(l1);
}

/* The store's own calls: commit with a lease, acquire without a hit, and
 * peek without side effects. */
static void test_acquire_and_peek(void **state)
{
    (void)state;
    kvd_l1_t *l1 = test_table(8, KVD_L1_S3FIFO);
    kvd_store_key_t a = test_key(1, 1), b = test_key(1, 2), z = test_key(1, 9);
    kvd_l1_entry_info_t info;
    uint32_t slot = 0;
    size_t n = 0;

    assert_int_equal(kvd_l1_reserve(l1, &a, 3, 100, 7, NULL, 0, &n), KVD_OK);
    assert_int_equal(kvd_l1_peek(l1, &a, &info), KVD_OK);
    assert_false(info.ready);
    assert_int_equal(info.slot, 7);
    assert_int_equal(info.tenant, 3);
    assert_int_equal(info.size_bytes, 100);
    assert_int_equal(kvd_l1_acquire(l1, &a, &slot), KVD_ERR_STATE);
    assert_int_equal(kvd_l1_commit_acquire(l1, &a), KVD_OK);
    assert_int_equal(kvd_l1_commit_acquire(l1, &a), KVD_ERR_STATE);
    assert_int_equal(kvd_l1_peek(l1, &a, &info), KVD_OK);
    assert_true(info.ready);
    assert_int_equal(info.refs, 1);

    /* Leased by commit_acquire: eviction passes it by. */
    kvd_l1_victim_t v[2];
    assert_int_equal(kvd_l1_evict(l1, 1, 0, v, 2, &n), KVD_OK);
    assert_int_equal(n, 0);
    assert_int_equal(kvd_l1_acquire(l1, &a, &slot), KVD_OK);
    assert_int_equal(slot, 7);
    kvd_l1_stats_t st = test_stats(l1);
    assert_int_equal(st.leases, 2);
    assert_int_equal(st.leased_objects, 1);
    assert_int_equal(st.hits, 0); /* neither counted as a hit */
    assert_int_equal(kvd_l1_release(l1, &a), KVD_OK);
    assert_int_equal(kvd_l1_release(l1, &a), KVD_OK);
    assert_int_equal(kvd_l1_evict(l1, 1, 0, v, 2, &n), KVD_OK);
    assert_int_equal(n, 1);
    assert_memory_equal(&v[0].key, &a, sizeof a);

    test_put(l1, &b, 0, 10, 8);
    assert_int_equal(kvd_l1_peek(l1, &b, &info), KVD_OK);
    assert_int_equal(info.refs, 0);
    assert_int_equal(kvd_l1_peek(l1, &z, &info), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_l1_acquire(l1, &z, &slot), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_l1_commit_acquire(l1, &z), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_l1_peek(NULL, &b, &info), KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_peek(l1, &b, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_acquire(l1, &b, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_commit_acquire(NULL, &b), KVD_ERR_INVALID);
    kvd_l1_destroy(l1);
}

/* ---- exact counters ----------------------------------------------------- */

static void test_stats_exact(void **state)
{
    (void)state;
    kvd_l1_t *l1 = test_table(10, KVD_L1_S3FIFO);
    kvd_store_key_t k[6];
    for (uint32_t i = 0; i < 6; i++) {
        k[i] = test_key(15, i);
    }
    size_t n;
    uint32_t slot;
    kvd_l1_victim_t v[4];
    test_put(l1, &k[0], 1, 10, 0);
    test_put(l1, &k[1], 1, 20, 1);
    test_put(l1, &k[2], 2, 30, 2);
    assert_int_equal(kvd_l1_reserve(l1, &k[3], 2, 40, 3, NULL, 0, &n), KVD_OK);
    assert_int_equal(kvd_l1_reserve(l1, &k[4], 2, 50, 4, NULL, 0, &n), KVD_OK);
    assert_int_equal(kvd_l1_abort(l1, &k[4], &slot), KVD_OK);
    assert_true(test_get(l1, &k[0], NULL));
    assert_true(test_get(l1, &k[0], NULL));
    assert_true(test_touch(l1, &k[1]));
    assert_false(test_get(l1, &k[3], NULL)); /* reserved: miss */
    assert_false(test_get(l1, &k[5], NULL)); /* absent: miss */
    /* A bound on pinned bytes refuses a pin past it (k2 is 30 bytes). */
    assert_int_equal(kvd_l1_pin(l1, &k[2], true, 29), KVD_ERR_QUOTA);
    assert_int_equal(test_stats(l1).pinned_bytes, 0);
    assert_int_equal(kvd_l1_pin(l1, &k[2], true, 30), KVD_OK);
    assert_int_equal(kvd_l1_pin(l1, &k[2], true, 1), KVD_OK); /* a flag */
    assert_int_equal(test_stats(l1).pinned_bytes, 30);
    assert_int_equal(kvd_l1_evict(l1, 4, 0, v, 4, &n), KVD_OK);
    assert_int_equal(n, 1); /* only k1: k0 leased, k2 pinned, k3 reserved */
    assert_int_equal(v[0].slot, 1);
    assert_int_equal(kvd_l1_pin(l1, &k[2], false, 0), KVD_OK);
    assert_int_equal(kvd_l1_delete(l1, &k[2], v), KVD_OK);

    kvd_l1_stats_t s = test_stats(l1);
    assert_int_equal(s.objects, 2); /* k0 ready, k3 reserved */
    assert_int_equal(s.reserved, 1);
    assert_int_equal(s.bytes, 50);
    assert_int_equal(s.leases, 2);
    assert_int_equal(s.leased_objects, 1);
    assert_int_equal(s.pinned_objects, 0);
    assert_int_equal(s.hits, 3);
    assert_int_equal(s.misses, 2);
    assert_int_equal(s.commits, 3);
    assert_int_equal(s.aborts, 1);
    assert_int_equal(s.deletes, 1);
    assert_int_equal(s.evictions, 1);
    assert_int_equal(s.quota_evictions, 0);
    assert_int_equal(s.quota_rejects, 0);
    assert_int_equal(s.ghost_hits, 0);
    /* k0 (leased), k1 (hit) and k2 (pinned) all left S for M, and M
     * evicted k1 after its second chance: M evictions leave no ghost. */
    assert_int_equal(s.ghost_keys, 0);
    assert_int_equal(s.small_objects, 0);
    assert_int_equal(s.main_objects, 1);
    assert_int_equal(s.lru_objects, 0);
    kvd_l1_tenant_stats_t t1, t2;
    assert_int_equal(kvd_l1_tenant_stats(l1, 1, &t1), KVD_OK);
    assert_int_equal(t1.objects, 1);
    assert_int_equal(t1.bytes, 10);
    assert_int_equal(t1.evictable_bytes, 0);
    assert_int_equal(t1.evictions, 1);
    assert_int_equal(kvd_l1_tenant_stats(l1, 2, &t2), KVD_OK);
    assert_int_equal(t2.objects, 1);
    assert_int_equal(t2.bytes, 40);
    assert_int_equal(t2.evictable_bytes, 0);
    assert_int_equal(kvd_l1_release(l1, &k[0]), KVD_OK);
    assert_int_equal(kvd_l1_release(l1, &k[0]), KVD_OK);
    assert_int_equal(kvd_l1_tenant_stats(l1, 1, &t1), KVD_OK);
    assert_int_equal(t1.evictable_bytes, 10);
    kvd_l1_destroy(l1);
}

/* ---- bucket collisions -------------------------------------------------- */

/* Keys that share the first 8 hash bytes and the namespace land in one
 * chain; unlinking from its middle, head and tail keeps the others. */
static void test_same_bucket(void **state)
{
    (void)state;
    enum { N = 9 };
    kvd_l1_t *l1 = test_table(16, KVD_L1_LRU);
    kvd_store_key_t keys[N];
    for (uint32_t i = 0; i < N; i++) {
        keys[i] = test_key(17, 0);
        keys[i].hash.bytes[31] = (uint8_t)i;
        test_put(l1, &keys[i], 0, 1, i);
    }
    kvd_l1_victim_t v;
    const uint32_t order[N] = {4, 0, 8, 2, 6, 1, 7, 3, 5};
    for (uint32_t j = 0; j < N; j++) {
        assert_int_equal(kvd_l1_delete(l1, &keys[order[j]], &v), KVD_OK);
        assert_int_equal(v.slot, order[j]);
        for (uint32_t i = 0; i < N; i++) {
            bool gone = false;
            for (uint32_t x = 0; x <= j; x++) {
                gone = gone || order[x] == i;
            }
            uint32_t slot = UINT32_MAX;
            assert_int_equal(test_get(l1, &keys[i], &slot), !gone);
            if (!gone) {
                assert_int_equal(slot, i);
                assert_int_equal(kvd_l1_release(l1, &keys[i]), KVD_OK);
            }
        }
    }
    kvd_l1_destroy(l1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_lifecycle_errors),
        cmocka_unit_test(test_lookup_prefix),
        cmocka_unit_test(test_acquire_and_peek),
        cmocka_unit_test(test_stats_exact),
        cmocka_unit_test(test_same_bucket),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
