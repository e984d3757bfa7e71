/*
 * The nodes of the data-plane tests (test_peer, test_peer_attack): each is
 * an embedded store with small settings (chunks of 4 MiB, no huge pages or
 * prefaulting, reservations that do not wait) and keys numbered by i.
 * Header-only (static inline); the including test has cmocka.h included
 * first.
 */
#ifndef KVD_TESTS_TESTPEER_INT_H
#define KVD_TESTS_TESTPEER_INT_H

#include <string.h>

#include "kvdepot/store.h"

/* An embedded store with an arena of `arena_size` ("32m"). */
static inline kvd_store_t *kvd_test_peer_store(const char *arena_size)
{
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    const char *const kv[] = {
        "store.arena_size",      arena_size, "store.arena_chunk",    "4m",
        "store.arena_hugepages", "off",      "store.arena_prefault", "false",
        "store.reserve_timeout", "0"};
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i += 2) {
        assert_int_equal(kvd_config_set(cfg, kv[i], kv[i + 1]), KVD_OK);
    }
    kvd_store_t *st = NULL;
    char err[256] = "";
    assert_int_equal(kvd_store_open(cfg, &st, err, sizeof err), KVD_OK);
    kvd_config_destroy(cfg);
    return st;
}

/* Key i of a test: i in its first two bytes, `tag` in its last. */
static inline kvd_block_hash_t kvd_test_peer_key(unsigned i, uint8_t tag)
{
    kvd_block_hash_t h;
    memset(&h, 0, sizeof h);
    h.bytes[0] = (uint8_t)i;
    h.bytes[1] = (uint8_t)(i >> 8);
    h.bytes[31] = tag;
    return h;
}

#endif /* KVD_TESTS_TESTPEER_INT_H */
