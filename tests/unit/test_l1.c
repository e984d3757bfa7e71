/*
 * L1 object table (store/l1_int.h): reserve/commit/abort/lookup/release
 * semantics and every error path; longest-prefix lookup stopping at the
 * first absent or reserved key; leased, pinned and reserved entries never
 * chosen by eviction (their slots never appear among victims); S3-FIFO
 * keeping a hot set through a one-time scan that flushes LRU; ghost
 * re-admission into the main queue; tenant quotas evicting only the
 * tenant's own objects; exact counters; capacity limits; and four threads
 * hammering one table while checking that no leased slot is ever handed
 * back.
 *
 * Worker threads never call cmocka asserts (they are not thread-safe); they
 * count failures that the test thread checks after joining.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/failpoint_int.h"
#include "store/l1_int.h"

#if defined(__SANITIZE_THREAD__)
#define TEST_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TEST_UNDER_TSAN 1
#endif
#endif
#ifdef TEST_UNDER_TSAN
#define STRESS_OPS 100000
#else
#define STRESS_OPS 200000
#endif

/* ---- helpers ------------------------------------------------------------ */

static uint64_t test_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Key number `i` in namespace `ns`; the hash bytes look like SHA-256
 * output (the table hashes their first 8 bytes). */
static kvd_store_key_t test_key(uint8_t ns, uint32_t i)
{
    kvd_store_key_t k;
    memset(k.ns.bytes, ns, sizeof(k.ns.bytes));
    for (size_t w = 0; w < sizeof(k.hash.bytes) / 8; w++) {
        uint64_t v = test_mix(((uint64_t)i << 8 | w) ^ 0x1234);
        memcpy(&k.hash.bytes[w * 8], &v, 8);
    }
    return k;
}

static kvd_l1_t *test_table(uint32_t capacity, kvd_l1_policy_t policy)
{
    kvd_l1_config_t cfg = {.capacity = capacity, .policy = policy};
    kvd_l1_t *l1 = NULL;
    assert_int_equal(kvd_l1_create(&cfg, &l1), KVD_OK);
    assert_non_null(l1);
    return l1;
}

static void test_put(kvd_l1_t *l1, const kvd_store_key_t *k, uint32_t tenant,
                     uint64_t size, uint32_t slot)
{
    size_t n = 99;
    assert_int_equal(kvd_l1_reserve(l1, k, tenant, size, slot, NULL, 0, &n),
                     KVD_OK);
    assert_int_equal(n, 0);
    assert_int_equal(kvd_l1_commit(l1, k), KVD_OK);
}

/* Looks one key up; returns true and leaves a lease on a hit. */
static bool test_get(kvd_l1_t *l1, const kvd_store_key_t *k, uint32_t *slot)
{
    size_t m = 99;
    uint32_t s = UINT32_MAX;
    assert_int_equal(kvd_l1_lookup_prefix(l1, k, 1, &s, &m), KVD_OK);
    if (m == 1 && slot != NULL) {
        *slot = s;
    }
    return m == 1;
}

/* A hit followed by the release: counts an access, holds nothing. */
static bool test_touch(kvd_l1_t *l1, const kvd_store_key_t *k)
{
    if (!test_get(l1, k, NULL)) {
        return false;
    }
    assert_int_equal(kvd_l1_release(l1, k), KVD_OK);
    return true;
}

static kvd_l1_stats_t test_stats(kvd_l1_t *l1)
{
    kvd_l1_stats_t s;
    assert_int_equal(kvd_l1_stats(l1, &s), KVD_OK);
    return s;
}

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
    assert_int_equal(kvd_l1_pin(NULL, &k, true), KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_delete(l1, &k, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_lookup_prefix(l1, NULL, 1, &slot, &n),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_lookup_prefix(l1, &k, 1, NULL, &n),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_l1_lookup_prefix(l1, &k, 1, &slot, NULL),
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
    assert_int_equal(kvd_l1_pin(l1, &absent, true), KVD_ERR_NOT_FOUND);
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
    assert_int_equal(kvd_l1_pin(l1, &k, true), KVD_OK);
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
        test_put(l1, &keys[i], 0, 10, 100 + i);
    }
    size_t n;
    assert_int_equal(kvd_l1_reserve(l1, &keys[3], 0, 10, 103, NULL, 0, &n),
                     KVD_OK);
    test_put(l1, &keys[4], 0, 10, 104);

    uint32_t slots[8];
    size_t m = 99;
    memset(slots, 0xff, sizeof(slots));
    /* Stops at the reserved key 3 though 4 is ready. */
    assert_int_equal(kvd_l1_lookup_prefix(l1, keys, 8, slots, &m), KVD_OK);
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
    assert_int_equal(kvd_l1_lookup_prefix(l1, NULL, 0, NULL, &m), KVD_OK);
    assert_int_equal(m, 0);
    /* Stops at once when the first key is absent. */
    assert_int_equal(kvd_l1_lookup_prefix(l1, &keys[5], 3, slots, &m), KVD_OK);
    assert_int_equal(m, 0);

    /* Once key 3 is committed the prefix runs through 4 and stops at 5. */
    assert_int_equal(kvd_l1_commit(l1, &keys[3]), KVD_OK);
    assert_int_equal(kvd_l1_lookup_prefix(l1, keys, 8, slots, &m), KVD_OK);
    assert_int_equal(m, 5);
    assert_int_equal(slots[3], 103);
    assert_int_equal(slots[4], 104);
    /* A full match counts no miss. */
    assert_int_equal(kvd_l1_lookup_prefix(l1, keys, 2, slots, &m), KVD_OK);
    assert_int_equal(m, 2);
    s = test_stats(l1);
    assert_int_equal(s.hits, 3 + 5 + 2);
    assert_int_equal(s.misses, 3);
    assert_int_equal(s.leases, 3 + 5 + 2);
    assert_int_equal(s.leased_objects, 5);
    kvd_l1_destroy(l1);
}

/* ---- eviction never touches leased, pinned or reserved entries ---------- */

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
            assert_int_equal(kvd_l1_pin(l1, &keys[i], true), KVD_OK);
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
    assert_int_equal(kvd_l1_pin(l1, &a, true), KVD_ERR_NOT_FOUND);

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
        assert_int_equal(kvd_l1_pin(l1, &keys[i], true), KVD_OK);
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
    assert_int_equal(kvd_l1_pin(l1, &keys[3], false), KVD_OK);
    assert_int_equal(kvd_l1_evict(l1, 1, 0, &v, 1, &n), KVD_OK);
    assert_int_equal(n, 1);
    assert_int_equal(v.slot, 3);
    kvd_l1_destroy(l1);
}

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
    assert_int_equal(kvd_l1_pin(l1, &ka[4], true), KVD_OK);
    assert_int_equal(kvd_l1_reserve(l1, &ka[5], A, 100, 5, v, 4, &n),
                     KVD_ERR_QUOTA);
    assert_int_equal(kvd_l1_pin(l1, &ka[4], false), KVD_OK);
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

/* Quota eviction also makes room in a full table. */
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
    assert_int_equal(kvd_l1_pin(l1, &k[2], true), KVD_OK);
    assert_int_equal(kvd_l1_pin(l1, &k[2], true), KVD_OK); /* a flag */
    assert_int_equal(kvd_l1_evict(l1, 4, 0, v, 4, &n), KVD_OK);
    assert_int_equal(n, 1); /* only k1: k0 leased, k2 pinned, k3 reserved */
    assert_int_equal(v[0].slot, 1);
    assert_int_equal(kvd_l1_pin(l1, &k[2], false), KVD_OK);
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

/* ---- randomized comparison with a model --------------------------------- */

enum { MD_CAP = 48, MD_KEYS = 160, MD_TENANTS = 3, MD_OPS = 30000 };

typedef struct md_obj {
    bool present;
    bool ready;
    bool pinned;
    uint32_t refs;
    uint32_t slot;
    uint32_t tenant;
    uint64_t size;
} md_obj_t;

typedef struct md {
    kvd_l1_t *l1;
    md_obj_t obj[MD_KEYS];
    uint64_t quota[MD_TENANTS];
    uint32_t next_slot;
} md_t;

static bool md_evictable(const md_obj_t *o)
{
    return o->present && o->ready && o->refs == 0 && !o->pinned;
}

static uint32_t md_index(const kvd_store_key_t *k)
{
    for (uint32_t i = 0; i < MD_KEYS; i++) {
        kvd_store_key_t c = test_key(18, i);
        if (memcmp(&c, k, sizeof(c)) == 0) {
            return i;
        }
    }
    fail_msg("victim key unknown to the model");
    return 0;
}

/* A victim must be an evictable object of the model (of `tenant` when not
 * UINT32_MAX) with the same slot; it leaves the model. */
static void md_take_victim(md_t *m, const kvd_l1_victim_t *v, uint32_t tenant)
{
    uint32_t i = md_index(&v->key);
    md_obj_t *o = &m->obj[i];
    assert_true(md_evictable(o));
    assert_int_equal(v->slot, o->slot);
    assert_int_equal(v->size_bytes, o->size);
    assert_int_equal(v->tenant, o->tenant);
    if (tenant != UINT32_MAX) {
        assert_int_equal(v->tenant, tenant);
    }
    o->present = false;
}

static void md_check(md_t *m)
{
    uint64_t objects = 0, reserved = 0, bytes = 0, leases = 0, leased = 0;
    uint64_t pinned = 0;
    uint64_t t_obj[MD_TENANTS] = {0}, t_bytes[MD_TENANTS] = {0};
    uint64_t t_evictable[MD_TENANTS] = {0};
    for (uint32_t i = 0; i < MD_KEYS; i++) {
        const md_obj_t *o = &m->obj[i];
        if (!o->present) {
            continue;
        }
        objects++;
        reserved += !o->ready;
        bytes += o->size;
        leases += o->refs;
        leased += o->refs > 0;
        pinned += o->pinned;
        t_obj[o->tenant]++;
        t_bytes[o->tenant] += o->size;
        t_evictable[o->tenant] += md_evictable(o) ? o->size : 0;
    }
    kvd_l1_stats_t s = test_stats(m->l1);
    assert_int_equal(s.objects, objects);
    assert_int_equal(s.reserved, reserved);
    assert_int_equal(s.bytes, bytes);
    assert_int_equal(s.leases, leases);
    assert_int_equal(s.leased_objects, leased);
    assert_int_equal(s.pinned_objects, pinned);
    assert_int_equal(s.small_objects + s.main_objects + s.lru_objects,
                     objects - reserved);
    for (uint32_t t = 0; t < MD_TENANTS; t++) {
        kvd_l1_tenant_stats_t ts;
        if (kvd_l1_tenant_stats(m->l1, t, &ts) != KVD_OK) {
            assert_int_equal(t_obj[t], 0);
            continue;
        }
        assert_int_equal(ts.objects, t_obj[t]);
        assert_int_equal(ts.bytes, t_bytes[t]);
        assert_int_equal(ts.evictable_bytes, t_evictable[t]);
    }
}

static void md_reserve(md_t *m, uint32_t i, unsigned r)
{
    md_obj_t *o = &m->obj[i];
    kvd_store_key_t k = test_key(18, i);
    uint32_t tenant = i % MD_TENANTS;
    uint64_t size = 1 + r % 40;
    uint64_t quota = m->quota[tenant];
    uint64_t objects = 0, t_bytes = 0, t_evictable = 0;
    for (uint32_t j = 0; j < MD_KEYS; j++) {
        const md_obj_t *p = &m->obj[j];
        objects += p->present;
        if (p->present && p->tenant == tenant) {
            t_bytes += p->size;
            t_evictable += md_evictable(p) ? p->size : 0;
        }
    }
    kvd_status_t want;
    bool over = quota != 0 && t_bytes + size > quota;
    if (o->present) {
        want = KVD_ERR_EXISTS;
    } else if (over && (size > quota || t_evictable < t_bytes + size - quota)) {
        want = KVD_ERR_QUOTA;
    } else if (!over && objects == MD_CAP) {
        want = KVD_ERR_NOSPACE;
    } else {
        want = KVD_OK;
    }
    kvd_l1_victim_t v[MD_CAP];
    size_t n = 99;
    uint32_t slot = m->next_slot++;
    assert_int_equal(
        kvd_l1_reserve(m->l1, &k, tenant, size, slot, v, MD_CAP, &n), want);
    if (want != KVD_OK) {
        assert_int_equal(n, 0);
        return;
    }
    uint64_t freed = 0;
    for (size_t j = 0; j < n; j++) {
        freed += v[j].size_bytes;
        md_take_victim(m, &v[j], tenant);
    }
    if (over) {
        /* Just enough: without the last victim it would not fit. */
        assert_true(n > 0);
        assert_true(t_bytes - freed + size <= quota);
        assert_true(t_bytes - (freed - v[n - 1].size_bytes) + size > quota);
    } else {
        assert_int_equal(n, 0);
    }
    *o = (md_obj_t){
        .present = true, .slot = slot, .tenant = tenant, .size = size};
}

static void md_step(md_t *m, unsigned r)
{
    uint32_t i = (r >> 4) % MD_KEYS;
    md_obj_t *o = &m->obj[i];
    kvd_store_key_t k = test_key(18, i);
    switch (r % 9) {
    case 0:
    case 1: md_reserve(m, i, r >> 12); break;
    case 2: {
        kvd_status_t want = !o->present ? KVD_ERR_NOT_FOUND
                            : o->ready  ? KVD_ERR_STATE
                                        : KVD_OK;
        uint32_t slot = UINT32_MAX;
        if ((r >> 12) % 5 == 0) {
            assert_int_equal(kvd_l1_abort(m->l1, &k, &slot), want);
            if (want == KVD_OK) {
                assert_int_equal(slot, o->slot);
                o->present = false;
            }
        } else {
            assert_int_equal(kvd_l1_commit(m->l1, &k), want);
            o->ready = o->ready || want == KVD_OK;
        }
        break;
    }
    case 3:
    case 4: {
        kvd_store_key_t keys[4];
        uint32_t slots[4];
        size_t len = 1 + (r >> 12) % 4, matched = 99, want = 0;
        for (size_t j = 0; j < len; j++) {
            keys[j] = test_key(18, (i + (uint32_t)j) % MD_KEYS);
        }
        while (want < len && m->obj[(i + want) % MD_KEYS].present &&
               m->obj[(i + want) % MD_KEYS].ready) {
            want++;
        }
        assert_int_equal(
            kvd_l1_lookup_prefix(m->l1, keys, len, slots, &matched), KVD_OK);
        assert_int_equal(matched, want);
        for (size_t j = 0; j < matched; j++) {
            md_obj_t *p = &m->obj[(i + j) % MD_KEYS];
            assert_int_equal(slots[j], p->slot);
            p->refs++;
            /* Most readers finish at once; the rest keep their lease for
             * a later release step. */
            if ((r >> (20 + j)) % 8 != 0) {
                assert_int_equal(kvd_l1_release(m->l1, &keys[j]), KVD_OK);
                p->refs--;
            }
        }
        break;
    }
    case 5: {
        kvd_status_t want = !o->present                 ? KVD_ERR_NOT_FOUND
                            : !o->ready || o->refs == 0 ? KVD_ERR_STATE
                                                        : KVD_OK;
        assert_int_equal(kvd_l1_release(m->l1, &k), want);
        o->refs -= want == KVD_OK;
        break;
    }
    case 6: {
        bool pin = (r >> 12) % 3 == 0;
        assert_int_equal(kvd_l1_pin(m->l1, &k, pin),
                         o->present ? KVD_OK : KVD_ERR_NOT_FOUND);
        o->pinned = o->present && pin;
        break;
    }
    case 7: {
        kvd_status_t want = !o->present   ? KVD_ERR_NOT_FOUND
                            : !o->ready   ? KVD_ERR_STATE
                            : o->refs > 0 ? KVD_ERR_BUSY
                                          : KVD_OK;
        kvd_l1_victim_t v;
        assert_int_equal(kvd_l1_delete(m->l1, &k, &v), want);
        if (want == KVD_OK) {
            assert_int_equal(v.slot, o->slot);
            o->present = false;
        }
        break;
    }
    default: {
        size_t want = 1 + (r >> 12) % 4, eligible = 0, n = 99;
        for (uint32_t j = 0; j < MD_KEYS; j++) {
            eligible += md_evictable(&m->obj[j]);
        }
        kvd_l1_victim_t v[4];
        assert_int_equal(kvd_l1_evict(m->l1, want, 0, v, 4, &n), KVD_OK);
        assert_int_equal(n, want < eligible ? want : eligible);
        for (size_t j = 0; j < n; j++) {
            md_take_victim(m, &v[j], UINT32_MAX);
        }
        break;
    }
    }
}

static void test_model_policy(kvd_l1_policy_t policy, unsigned seed)
{
    static md_t m;
    memset(&m, 0, sizeof(m));
    m.l1 = test_table(MD_CAP, policy);
    m.quota[1] = 200; /* tenant 1 runs into its quota, the others do not */
    assert_int_equal(kvd_l1_tenant_set_quota(m.l1, 1, m.quota[1]), KVD_OK);
    for (int op = 0; op < MD_OPS; op++) {
        md_step(&m, (unsigned)rand_r(&seed));
        if (op % 16 == 0) {
            md_check(&m);
        }
    }
    md_check(&m);
    kvd_l1_stats_t s = test_stats(m.l1);
    print_message(
        "model %s: %llu hits, %llu evictions, %llu quota "
        "evictions, %llu quota rejects, %llu ghost hits\n",
        policy == KVD_L1_LRU ? "lru" : "s3fifo", (unsigned long long)s.hits,
        (unsigned long long)s.evictions, (unsigned long long)s.quota_evictions,
        (unsigned long long)s.quota_rejects, (unsigned long long)s.ghost_hits);
    /* The run reached every path it is meant to compare. */
    assert_true(s.hits > 0 && s.evictions > 0 && s.quota_evictions > 0 &&
                s.quota_rejects > 0);
    assert_true(policy == KVD_L1_LRU || s.ghost_hits > 0);
    kvd_l1_destroy(m.l1);
}

static void test_model(void **state)
{
    (void)state;
    test_model_policy(KVD_L1_S3FIFO, 1);
    test_model_policy(KVD_L1_LRU, 2);
}

/* ---- concurrency -------------------------------------------------------- */

enum { CC_THREADS = 4, CC_CAP = 128, CC_KEYS = 512, CC_SLOTS = CC_CAP };

/* The test's stand-in for the arena: a slot pool, and per slot whether it
 * is owned by the table and how many readers the test believes hold it. */
typedef struct cc_shared {
    kvd_l1_t *l1;
    pthread_mutex_t pool_lock;
    uint32_t free_slots[CC_SLOTS];
    size_t free_count;
    atomic_int in_use[CC_SLOTS];
    atomic_int readers[CC_SLOTS];
    atomic_int failures;
} cc_shared_t;

typedef struct cc_thread {
    cc_shared_t *sh;
    unsigned seed;
} cc_thread_t;

static bool cc_slot_alloc(cc_shared_t *sh, uint32_t *slot)
{
    pthread_mutex_lock(&sh->pool_lock);
    bool ok = sh->free_count > 0;
    if (ok) {
        *slot = sh->free_slots[--sh->free_count];
    }
    pthread_mutex_unlock(&sh->pool_lock);
    if (ok && atomic_exchange(&sh->in_use[*slot], 1) != 0) {
        atomic_fetch_add(&sh->failures, 1);
    }
    return ok;
}

/* A slot handed back by the table: nobody may be reading it. */
static void cc_slot_free(cc_shared_t *sh, uint32_t slot)
{
    if (slot >= CC_SLOTS || atomic_load(&sh->readers[slot]) != 0 ||
        atomic_exchange(&sh->in_use[slot], 0) != 1) {
        atomic_fetch_add(&sh->failures, 1);
        return;
    }
    pthread_mutex_lock(&sh->pool_lock);
    sh->free_slots[sh->free_count++] = slot;
    pthread_mutex_unlock(&sh->pool_lock);
}

static void cc_evict(cc_shared_t *sh, size_t want)
{
    kvd_l1_victim_t v[4];
    size_t n = 0;
    if (kvd_l1_evict(sh->l1, want, 0, v, 4, &n) != KVD_OK) {
        atomic_fetch_add(&sh->failures, 1);
    }
    for (size_t i = 0; i < n; i++) {
        cc_slot_free(sh, v[i].slot);
    }
}

static void cc_lookup(cc_shared_t *sh, uint32_t first)
{
    kvd_store_key_t keys[4];
    uint32_t slots[4];
    size_t m = 0;
    for (uint32_t i = 0; i < 4; i++) {
        keys[i] = test_key(16, (first + i) % CC_KEYS);
    }
    if (kvd_l1_lookup_prefix(sh->l1, keys, 4, slots, &m) != KVD_OK) {
        atomic_fetch_add(&sh->failures, 1);
        return;
    }
    for (size_t i = 0; i < m; i++) {
        atomic_fetch_add(&sh->readers[slots[i]], 1);
        if (atomic_load(&sh->in_use[slots[i]]) != 1) {
            atomic_fetch_add(&sh->failures, 1);
        }
    }
    for (size_t i = 0; i < m; i++) {
        atomic_fetch_sub(&sh->readers[slots[i]], 1);
        if (kvd_l1_release(sh->l1, &keys[i]) != KVD_OK) {
            atomic_fetch_add(&sh->failures, 1);
        }
    }
}

static void cc_insert(cc_shared_t *sh, uint32_t key, bool abort_it)
{
    uint32_t slot;
    if (!cc_slot_alloc(sh, &slot)) {
        cc_evict(sh, 1);
        return;
    }
    kvd_store_key_t k = test_key(16, key);
    size_t n;
    kvd_status_t st =
        kvd_l1_reserve(sh->l1, &k, key % 3, 64, slot, NULL, 0, &n);
    if (st != KVD_OK) {
        if (st != KVD_ERR_EXISTS && st != KVD_ERR_NOSPACE) {
            atomic_fetch_add(&sh->failures, 1);
        }
        cc_slot_free(sh, slot);
        return;
    }
    if (abort_it) {
        uint32_t back = UINT32_MAX;
        if (kvd_l1_abort(sh->l1, &k, &back) != KVD_OK || back != slot) {
            atomic_fetch_add(&sh->failures, 1);
        }
        cc_slot_free(sh, slot);
    } else if (kvd_l1_commit(sh->l1, &k) != KVD_OK) {
        atomic_fetch_add(&sh->failures, 1);
    }
}

static void *cc_worker(void *arg)
{
    cc_thread_t *t = arg;
    cc_shared_t *sh = t->sh;
    for (int i = 0; i < STRESS_OPS; i++) {
        unsigned r = (unsigned)rand_r(&t->seed);
        uint32_t key = (r >> 4) % CC_KEYS;
        switch (r % 8) {
        case 0:
        case 1:
        case 2: cc_lookup(sh, key); break;
        case 3:
        case 4: cc_insert(sh, key, false); break;
        case 5: cc_insert(sh, key, (r >> 20) % 4 == 0); break;
        case 6: cc_evict(sh, 1 + (r >> 20) % 3); break;
        default: {
            kvd_store_key_t k = test_key(16, key);
            kvd_l1_victim_t v;
            kvd_status_t st = kvd_l1_delete(sh->l1, &k, &v);
            if (st == KVD_OK) {
                cc_slot_free(sh, v.slot);
            } else if (st != KVD_ERR_NOT_FOUND && st != KVD_ERR_BUSY &&
                       st != KVD_ERR_STATE) {
                atomic_fetch_add(&sh->failures, 1);
            }
            break;
        }
        }
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    (void)state;
    static cc_shared_t sh;
    memset(&sh, 0, sizeof(sh));
    sh.l1 = test_table(CC_CAP, KVD_L1_S3FIFO);
    assert_int_equal(pthread_mutex_init(&sh.pool_lock, NULL), 0);
    for (uint32_t i = 0; i < CC_SLOTS; i++) {
        sh.free_slots[sh.free_count++] = CC_SLOTS - 1 - i;
    }
    pthread_t th[CC_THREADS];
    cc_thread_t args[CC_THREADS];
    for (int i = 0; i < CC_THREADS; i++) {
        args[i] = (cc_thread_t){.sh = &sh, .seed = 0x5eed + (unsigned)i};
        assert_int_equal(pthread_create(&th[i], NULL, cc_worker, &args[i]), 0);
    }
    for (int i = 0; i < CC_THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
    }
    assert_int_equal(atomic_load(&sh.failures), 0);

    /* Every slot is either free or owned by exactly one entry. */
    kvd_l1_stats_t s = test_stats(sh.l1);
    assert_int_equal(s.leases, 0);
    assert_int_equal(s.leased_objects, 0);
    assert_int_equal(s.reserved, 0);
    assert_int_equal(s.objects, CC_SLOTS - sh.free_count);
    assert_int_equal(s.bytes, 64 * s.objects);
    print_message("concurrent: %llu hits, %llu misses, %llu commits, "
                  "%llu aborts, %llu evictions, %llu deletes\n",
                  (unsigned long long)s.hits, (unsigned long long)s.misses,
                  (unsigned long long)s.commits, (unsigned long long)s.aborts,
                  (unsigned long long)s.evictions,
                  (unsigned long long)s.deletes);
    assert_true(s.hits > 0 && s.evictions > 0 && s.commits > 0);
    assert_int_equal(s.small_objects + s.main_objects, s.objects);
    uint64_t tenant_bytes = 0;
    for (uint32_t t = 0; t < 3; t++) {
        kvd_l1_tenant_stats_t ts;
        assert_int_equal(kvd_l1_tenant_stats(sh.l1, t, &ts), KVD_OK);
        assert_int_equal(ts.evictable_bytes, ts.bytes);
        tenant_bytes += ts.bytes;
    }
    assert_int_equal(tenant_bytes, s.bytes);
    /* Nothing is busy now: everything can be evicted, each slot once. */
    kvd_l1_victim_t v[CC_CAP];
    size_t n;
    assert_int_equal(kvd_l1_evict(sh.l1, CC_CAP, 0, v, CC_CAP, &n), KVD_OK);
    assert_int_equal(n, s.objects);
    for (size_t i = 0; i < n; i++) {
        cc_slot_free(&sh, v[i].slot);
    }
    assert_int_equal(atomic_load(&sh.failures), 0);
    assert_int_equal(sh.free_count, CC_SLOTS);
    assert_int_equal(test_stats(sh.l1).objects, 0);
    pthread_mutex_destroy(&sh.pool_lock);
    kvd_l1_destroy(sh.l1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_lifecycle_errors),
        cmocka_unit_test(test_lookup_prefix),
        cmocka_unit_test(test_acquire_and_peek),
        cmocka_unit_test(test_evict_skips_busy),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_lru_order),
        cmocka_unit_test(test_s3fifo_scan_resistance),
        cmocka_unit_test(test_s3fifo_ghost),
        cmocka_unit_test(test_s3fifo_promotion),
        cmocka_unit_test(test_quota),
        cmocka_unit_test(test_evict_group),
        cmocka_unit_test(test_quota_full_table),
        cmocka_unit_test(test_tenants_many),
        cmocka_unit_test(test_stats_exact),
        cmocka_unit_test(test_same_bucket),
        cmocka_unit_test(test_model),
        cmocka_unit_test(test_concurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
