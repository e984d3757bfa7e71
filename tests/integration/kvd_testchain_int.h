/*
 * Chains of objects saved and loaded through a store (daemon-mode client
 * or embedded), for the cluster tests: each object's bytes are a pattern of
 * its key, so a load checks that what it got is what was saved for that
 * key. Header-only (static inline); the including test has cmocka.h
 * included first.
 */
#ifndef KVD_TESTS_TESTCHAIN_INT_H
#define KVD_TESTS_TESTCHAIN_INT_H

#include <stdint.h>
#include <stdlib.h>

#include "kvdepot/store.h"

/* A chain of n keys named by `tag` (and position): distinct for distinct
 * (tag, i) with tag and i below 256. */
static inline void kvd_test_chain_keys(unsigned tag, kvd_block_hash_t *h,
                                       size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h[i].bytes[0] = (uint8_t)tag;
        h[i].bytes[1] = (uint8_t)i;
        for (unsigned b = 2; b < 32; b++) {
            h[i].bytes[b] = (uint8_t)(tag * 31u + i * 7u + b);
        }
    }
}

/* The bytes of the object of key `h`. */
static inline void kvd_test_chain_fill(uint8_t *p, size_t n,
                                       const kvd_block_hash_t *h)
{
    uint64_t x = 0x9e3779b97f4a7c15ull ^ h->bytes[0] ^
                 ((uint64_t)h->bytes[1] << 8) ^ ((uint64_t)h->bytes[2] << 16);
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (uint8_t)(x >> 56);
    }
}

/* Saves h[0..n) under `ns`, `size` bytes each. */
static inline void kvd_test_chain_save(kvd_store_t *s,
                                       const kvd_namespace_t *ns,
                                       const kvd_block_hash_t *h, size_t n,
                                       size_t size)
{
    kvd_store_reservation_t *r = calloc(n, sizeof *r);
    kvd_store_key_t *keys = calloc(n, sizeof *keys);
    assert_non_null(r);
    assert_non_null(keys);
    assert_int_equal(kvd_store_reserve(s, ns, h, n, size, 0, r), KVD_OK);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(r[i].status, KVD_OK);
        uint8_t *dst = kvd_store_arena_ptr(s, r[i].arena_offset, size);
        assert_non_null(dst);
        kvd_test_chain_fill(dst, size, &h[i]);
        keys[i].ns = *ns;
        keys[i].hash = h[i];
    }
    assert_int_equal(kvd_store_commit(s, keys, n, NULL), KVD_OK);
    free(keys);
    free(r);
}

/* Looks h[0..n) up (naming `source` when not NULL) and returns how many
 * matched, every matched object checked in the arena byte for byte. */
static inline size_t kvd_test_chain_load(kvd_store_t *s,
                                         const kvd_namespace_t *ns,
                                         const kvd_block_hash_t *h, size_t n,
                                         size_t size, const char *source)
{
    kvd_store_lease_t *l = calloc(n, sizeof *l);
    uint8_t *want = malloc(size);
    assert_non_null(l);
    assert_non_null(want);
    size_t m = 0;
    assert_int_equal(kvd_store_lookup_from(s, ns, h, n, source, l, &m), KVD_OK);
    for (size_t i = 0; i < m; i++) {
        assert_int_equal(l[i].tier, KVD_STORE_TIER_HOST);
        assert_int_equal(l[i].size_bytes, size);
        kvd_test_chain_fill(want, size, &h[i]);
        const uint8_t *got = kvd_store_arena_ptr(s, l[i].arena_offset, size);
        assert_non_null(got);
        assert_memory_equal(got, want, size);
    }
    if (m > 0) {
        assert_int_equal(kvd_store_release(s, l, m), KVD_OK);
    }
    free(want);
    free(l);
    return m;
}

#endif /* KVD_TESTS_TESTCHAIN_INT_H */
