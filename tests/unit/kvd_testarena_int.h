/*
 * Helpers shared by the host arena tests (test_arena_*.c): small arenas
 * without huge pages, failpoints armed with a message naming a bad spec,
 * and a byte pattern that depends on its place, so a slot that overlaps
 * another or moves is seen. Header-only (static inline): each test is one
 * executable built from one source file; the including test has cmocka.h
 * included first.
 *
 * Arenas here are a few MiB with 1 MiB chunks so that each program runs
 * in well under a second, sanitizers included. Worker threads and forked
 * children never call cmocka asserts; they report through return values.
 */
#ifndef KVD_TESTS_TESTARENA_INT_H
#define KVD_TESTS_TESTARENA_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "common/failpoint_int.h"
#include "store/arena.h"

#define MIB (1ull << 20)

static inline kvd_arena_config_t test_config(uint64_t size, uint64_t chunk,
                                             int mode, bool prefault)
{
    kvd_arena_config_t cfg = {
        .size_bytes = size,
        .chunk_bytes = chunk,
        .hugepages = mode,
        .prefault = prefault,
    };
    return cfg;
}

/* An arena of `size` bytes in `chunk`-byte chunks, ordinary pages, no
 * prefault; a failed creation fails the test. */
static inline kvd_arena_t *test_arena(uint64_t size, uint64_t chunk)
{
    kvd_arena_config_t cfg =
        test_config(size, chunk, KVD_ARENA_HUGEPAGES_OFF, false);
    kvd_arena_t *arena = NULL;
    assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_OK);
    assert_non_null(arena);
    return arena;
}

/* Arms a failpoint; a spec the parser refuses fails the test with why. */
static inline void arm(const char *spec)
{
    char err[128];
    kvd_status_t st = kvd_failpoint_set(spec, err, sizeof(err));
    if (st != KVD_OK) {
        print_error("failpoint spec %s: %s\n", spec, err);
    }
    assert_int_equal(st, KVD_OK);
}

/* `seed`'s pattern over `len` bytes (a multiple of 4), and its check:
 * each word depends on its place, so overlapping slots are seen. */
static inline void fill_pattern(uint8_t *p, uint64_t len, uint32_t seed)
{
    for (uint64_t i = 0; i < len; i += 4) {
        uint32_t v = seed * 2654435761u + (uint32_t)i;
        memcpy(p + i, &v, 4);
    }
}

static inline bool check_pattern(const uint8_t *p, uint64_t len, uint32_t seed)
{
    for (uint64_t i = 0; i < len; i += 4) {
        uint32_t v = seed * 2654435761u + (uint32_t)i, got;
        memcpy(&got, p + i, 4);
        if (got != v) {
            return false;
        }
    }
    return true;
}

#endif /* KVD_TESTS_TESTARENA_INT_H */
