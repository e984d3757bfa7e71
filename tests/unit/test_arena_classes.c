/*
 * Host arena class places (store/arena.h): at most KVD_ARENA_CLASSES_MAX
 * slot sizes hold chunks at once; a size gives its place back when its
 * last slot is freed, so new sizes find room while live objects keep
 * their offsets and bytes (slab-class exhaustion, docs/reliability.md),
 * and a thousand sizes pass through one arena without running out.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvd_testarena_int.h"

/* Writes `seed`'s pattern over the first and the last 64 bytes of a slot of
 * `len` bytes (whole slots of the large classes would be slow to fill). */
static void mark_slot(uint8_t *p, uint64_t len, uint32_t seed)
{
    fill_pattern(p, 64, seed);
    fill_pattern(p + len - 64, 64, seed + 1);
}

static bool check_mark(const uint8_t *p, uint64_t len, uint32_t seed)
{
    return check_pattern(p, 64, seed) &&
           check_pattern(p + len - 64, 64, seed + 1);
}

/*
 * Slab-class exhaustion (docs/reliability.md): with objects of
 * KVD_ARENA_CLASSES_MAX distinct sizes live, freeing every object of some
 * sizes must make room for new sizes, while the live objects keep their
 * offsets and bytes, and an id registered before its class drained still
 * allocates slots of its own size.
 */
static void test_class_reclaim(void **state)
{
    (void)state;
    /* 128 pages per chunk: sizes of 1..64 pages take one chunk each. */
    const uint64_t chunk = 512 * 1024;
    kvd_arena_t *arena = test_arena(80 * chunk, chunk);
    enum { N = KVD_ARENA_CLASSES_MAX };
    uint32_t cls[N], slots[N][2];
    uint64_t offs[N][2];
    for (uint32_t i = 0; i < N; i++) {
        uint64_t bytes = (i + 1) * 4096ull;
        assert_int_equal(kvd_arena_class_register(arena, bytes - 100, &cls[i]),
                         KVD_OK);
        for (uint32_t k = 0; k < 2; k++) {
            assert_int_equal(kvd_arena_slot_alloc(arena, cls[i], &slots[i][k]),
                             KVD_OK);
            offs[i][k] = kvd_arena_slot_offset(arena, slots[i][k]);
            fill_pattern(kvd_arena_slot_ptr(arena, slots[i][k]), bytes,
                         i * 2 + k);
        }
    }
    /* Every object of the even-indexed sizes goes: 32 classes drain. */
    for (uint32_t i = 0; i < N; i += 2) {
        for (uint32_t k = 0; k < 2; k++) {
            assert_int_equal(kvd_arena_slot_free(arena, slots[i][k]), KVD_OK);
        }
    }

    /* A 65th size, then 31 more: the table is full of live classes again. */
    uint32_t fresh[N / 2], fresh_slot[N / 2];
    for (uint32_t j = 0; j < N / 2; j++) {
        uint64_t bytes = (65 + j) * 4096ull;
        assert_int_equal(kvd_arena_class_register(arena, bytes, &fresh[j]),
                         KVD_OK);
        assert_int_equal(kvd_arena_slot_alloc(arena, fresh[j], &fresh_slot[j]),
                         KVD_OK);
        uint64_t off = kvd_arena_slot_offset(arena, fresh_slot[j]);
        assert_int_equal(off % KVD_ARENA_SLOT_ALIGN, 0);
        assert_true(off % chunk + bytes <= chunk);
        mark_slot(kvd_arena_slot_ptr(arena, fresh_slot[j]), bytes, 1000 + j);
    }

    /* The id of a drained size: no class slot while 64 sizes are live (the
     * caller evicts and retries), its own slot size once one drains. */
    uint32_t s;
    kvd_log_level_t saved = kvd_log_get_level();
    kvd_log_set_level(KVD_LOG_LEVEL_OFF);
    assert_int_equal(kvd_arena_slot_alloc(arena, cls[2], &s), KVD_ERR_NOSPACE);
    kvd_log_set_level(saved);
    assert_int_equal(kvd_arena_slot_free(arena, fresh_slot[0]), KVD_OK);
    assert_int_equal(kvd_arena_slot_alloc(arena, cls[2], &s), KVD_OK);
    uint64_t off = kvd_arena_slot_offset(arena, s);
    assert_true(off % chunk + 3 * 4096 <= chunk);
    fill_pattern(kvd_arena_slot_ptr(arena, s), 3 * 4096, 7777);

    /* Nothing live moved or was overwritten. */
    for (uint32_t i = 1; i < N; i += 2) {
        for (uint32_t k = 0; k < 2; k++) {
            assert_int_equal(kvd_arena_slot_offset(arena, slots[i][k]),
                             offs[i][k]);
            assert_true(check_pattern(kvd_arena_slot_ptr(arena, slots[i][k]),
                                      (i + 1) * 4096ull, i * 2 + k));
        }
    }
    for (uint32_t j = 1; j < N / 2; j++) {
        assert_true(check_mark(kvd_arena_slot_ptr(arena, fresh_slot[j]),
                               (65 + j) * 4096ull, 1000 + j));
    }
    assert_true(check_pattern(kvd_arena_slot_ptr(arena, s), 3 * 4096, 7777));

    /* Free everything: no class, slot or chunk is left behind. */
    assert_int_equal(kvd_arena_slot_free(arena, s), KVD_OK);
    for (uint32_t i = 1; i < N; i += 2) {
        for (uint32_t k = 0; k < 2; k++) {
            assert_int_equal(kvd_arena_slot_free(arena, slots[i][k]), KVD_OK);
        }
    }
    for (uint32_t j = 1; j < N / 2; j++) {
        assert_int_equal(kvd_arena_slot_free(arena, fresh_slot[j]), KVD_OK);
    }
    kvd_arena_stats_t st;
    assert_int_equal(kvd_arena_stats(arena, &st), KVD_OK);
    assert_int_equal(st.num_classes, 0);
    assert_int_equal(st.bytes_used, 0);
    assert_int_equal(st.chunks_free, st.chunks_total);
    kvd_arena_destroy(arena);
}

/* 1000 distinct sizes pass through the arena, 63 of them live at a time
 * next to one long-lived object: the table never runs out. */
static void test_class_cycle_sizes(void **state)
{
    (void)state;
    enum { SIZES = 1000, WINDOW = KVD_ARENA_CLASSES_MAX - 1 };
    const uint64_t chunk = 4 * MIB; /* 1024 pages: room for every size */
    kvd_arena_t *arena = test_arena(66 * chunk, chunk);
    uint32_t anchor_cls, anchor;
    assert_int_equal(kvd_arena_class_register(arena, 4096, &anchor_cls),
                     KVD_OK);
    assert_int_equal(kvd_arena_slot_alloc(arena, anchor_cls, &anchor), KVD_OK);
    uint64_t anchor_off = kvd_arena_slot_offset(arena, anchor);
    fill_pattern(kvd_arena_slot_ptr(arena, anchor), 4096, 42);

    static uint32_t slots[SIZES];
    for (uint32_t i = 0; i < SIZES; i++) {
        if (i >= WINDOW) {
            uint32_t old = i - WINDOW;
            uint64_t old_bytes = (2 + old) * 4096ull;
            assert_true(check_mark(kvd_arena_slot_ptr(arena, slots[old]),
                                   old_bytes, old));
            assert_int_equal(kvd_arena_slot_free(arena, slots[old]), KVD_OK);
        }
        uint64_t bytes = (2 + i) * 4096ull;
        uint32_t cls;
        assert_int_equal(kvd_arena_class_register(arena, bytes, &cls), KVD_OK);
        assert_int_equal(kvd_arena_slot_alloc(arena, cls, &slots[i]), KVD_OK);
        uint64_t off = kvd_arena_slot_offset(arena, slots[i]);
        assert_true(off % chunk + bytes <= chunk);
        mark_slot(kvd_arena_slot_ptr(arena, slots[i]), bytes, i);
    }
    for (uint32_t i = SIZES - WINDOW; i < SIZES; i++) {
        assert_true(check_mark(kvd_arena_slot_ptr(arena, slots[i]),
                               (2 + i) * 4096ull, i));
        assert_int_equal(kvd_arena_slot_free(arena, slots[i]), KVD_OK);
    }
    assert_int_equal(kvd_arena_slot_offset(arena, anchor), anchor_off);
    assert_true(check_pattern(kvd_arena_slot_ptr(arena, anchor), 4096, 42));

    kvd_arena_stats_t st;
    assert_int_equal(kvd_arena_stats(arena, &st), KVD_OK);
    assert_int_equal(st.num_classes, 1);
    assert_int_equal(st.chunks_free, st.chunks_total - 1);
    assert_int_equal(st.bytes_used, 4096);
    assert_int_equal(kvd_arena_slot_free(arena, anchor), KVD_OK);
    kvd_arena_destroy(arena);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_class_reclaim),
        cmocka_unit_test(test_class_cycle_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
