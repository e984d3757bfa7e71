/*
 * Helpers shared by the L1 object table tests (test_l1_*.c): keys whose
 * hash bytes look like SHA-256 output, a table of one policy, and the
 * store's put, get and touch sequences. Header-only (static inline): each
 * test is one executable built from one source file; the including test
 * has cmocka.h included first.
 */
#ifndef KVD_TESTS_TESTL1_INT_H
#define KVD_TESTS_TESTL1_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "store/l1_int.h"

static inline uint64_t test_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Key number `i` in namespace `ns`; the hash bytes look like SHA-256
 * output (the table hashes their first 8 bytes). */
static inline kvd_store_key_t test_key(uint8_t ns, uint32_t i)
{
    kvd_store_key_t k;
    memset(k.ns.bytes, ns, sizeof(k.ns.bytes));
    for (size_t w = 0; w < sizeof(k.hash.bytes) / 8; w++) {
        uint64_t v = test_mix(((uint64_t)i << 8 | w) ^ 0x1234);
        memcpy(&k.hash.bytes[w * 8], &v, 8);
    }
    return k;
}

/* A table of `capacity` objects under `policy`, defaults otherwise. */
static inline kvd_l1_t *test_table(uint32_t capacity, kvd_l1_policy_t policy)
{
    kvd_l1_config_t cfg = {.capacity = capacity, .policy = policy};
    kvd_l1_t *l1 = NULL;
    assert_int_equal(kvd_l1_create(&cfg, &l1), KVD_OK);
    assert_non_null(l1);
    return l1;
}

/* Reserves and commits one object; the table must take it without
 * naming a victim. */
static inline void test_put(kvd_l1_t *l1, const kvd_store_key_t *k,
                            uint32_t tenant, uint64_t size, uint32_t slot)
{
    size_t n = 99;
    assert_int_equal(kvd_l1_reserve(l1, k, tenant, size, slot, NULL, 0, &n),
                     KVD_OK);
    assert_int_equal(n, 0);
    assert_int_equal(kvd_l1_commit(l1, k), KVD_OK);
}

/* Looks one key up; returns true and leaves a lease on a hit. */
static inline bool test_get(kvd_l1_t *l1, const kvd_store_key_t *k,
                            uint32_t *slot)
{
    size_t m = 99;
    uint32_t s = UINT32_MAX;
    assert_int_equal(kvd_l1_lookup_prefix(l1, k, 1, &s, NULL, &m), KVD_OK);
    if (m == 1 && slot != NULL) {
        *slot = s;
    }
    return m == 1;
}

/* A hit followed by the release: counts an access, holds nothing. */
static inline bool test_touch(kvd_l1_t *l1, const kvd_store_key_t *k)
{
    if (!test_get(l1, k, NULL)) {
        return false;
    }
    assert_int_equal(kvd_l1_release(l1, k), KVD_OK);
    return true;
}

static inline kvd_l1_stats_t test_stats(kvd_l1_t *l1)
{
    kvd_l1_stats_t s;
    assert_int_equal(kvd_l1_stats(l1, &s), KVD_OK);
    return s;
}

#endif /* KVD_TESTS_TESTL1_INT_H */
