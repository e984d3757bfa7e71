/*
 * Host arena slab classes and slots (store/arena.h): class registration
 * (the id is the slot size in pages; nothing is reserved until a slot is
 * taken), exact capacity per class, free and reuse with every invalid
 * slot and class id refused, chunks moving between classes when one
 * drains (no fragmentation failure), and slots that are aligned, inside
 * one chunk each and disjoint.
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

/* Allocates until NOSPACE; returns how many succeeded. */
static uint32_t fill_class(kvd_arena_t *arena, uint32_t class_id,
                           uint32_t *slots, uint32_t max)
{
    uint32_t n = 0;
    kvd_status_t st;
    while ((st = kvd_arena_slot_alloc(arena, class_id, &slots[n])) == KVD_OK) {
        n++;
        assert_true(n < max);
    }
    assert_int_equal(st, KVD_ERR_NOSPACE);
    return n;
}

/* The stats of class `id`; all zero when the class holds no chunk (it is
 * not listed then). */
static kvd_arena_class_stats_t class_stats(const kvd_arena_stats_t *st,
                                           uint32_t id)
{
    for (uint32_t i = 0; i < st->num_classes; i++) {
        if (st->classes[i].class_id == id) {
            return st->classes[i];
        }
    }
    return (kvd_arena_class_stats_t){.class_id = id};
}

/* ------------------------------------------------------------------------ */
/* Classes and slots                                                        */
/* ------------------------------------------------------------------------ */

static void test_class_register(void **state)
{
    (void)state;
    kvd_log_level_t saved = kvd_log_get_level();
    kvd_arena_t *arena = test_arena(4 * MIB, MIB);
    uint32_t a, b, c;
    assert_int_equal(kvd_arena_class_register(arena, 1, &a), KVD_OK);
    assert_int_equal(kvd_arena_class_register(arena, 4096, &b), KVD_OK);
    assert_int_equal(a, b); /* same slot size, same class */
    assert_int_equal(kvd_arena_class_register(arena, 4097, &c), KVD_OK);
    assert_int_not_equal(a, c);
    assert_int_equal(kvd_arena_class_register(arena, MIB, &c), KVD_OK);
    /* The id is the slot size in pages. */
    assert_int_equal(a, 1);
    assert_int_equal(c, 256);

    kvd_log_set_level(KVD_LOG_LEVEL_OFF);
    assert_int_equal(kvd_arena_class_register(arena, 0, &c), KVD_ERR_INVALID);
    assert_int_equal(kvd_arena_class_register(NULL, 1, &c), KVD_ERR_INVALID);
    assert_int_equal(kvd_arena_class_register(arena, 1, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_arena_class_register(arena, MIB + 1, &c),
                     KVD_ERR_RANGE);
    kvd_log_set_level(saved);

    /* Registering reserves nothing: any number of sizes can be registered,
     * and no class is listed before it holds a chunk. */
    for (uint64_t pages = 1; pages <= 256; pages++) {
        assert_int_equal(kvd_arena_class_register(arena, pages * 4096 - 7, &c),
                         KVD_OK);
        assert_int_equal(c, pages);
    }
    kvd_arena_stats_t st;
    assert_int_equal(kvd_arena_stats(arena, &st), KVD_OK);
    assert_int_equal(st.num_classes, 0);

    uint32_t s;
    assert_int_equal(kvd_arena_slot_alloc(arena, a, &s), KVD_OK);
    assert_int_equal(kvd_arena_stats(arena, &st), KVD_OK);
    assert_int_equal(st.num_classes, 1);
    assert_int_equal(st.classes[0].class_id, a);
    assert_int_equal(st.classes[0].slot_bytes, 4096);
    assert_int_equal(st.classes[0].slots_per_chunk, 256);
    assert_int_equal(st.classes[0].chunks, 1);
    assert_int_equal(kvd_arena_slot_free(arena, s), KVD_OK);
    kvd_arena_destroy(arena);
}

static void test_capacity(void **state)
{
    (void)state;
    kvd_arena_t *arena = test_arena(16 * MIB, MIB);
    static uint32_t slots[1024];
    uint32_t small, odd;
    assert_int_equal(kvd_arena_class_register(arena, 64 * 1024, &small),
                     KVD_OK);
    /* 300 KiB: three per 1 MiB chunk, 124 KiB of each chunk unusable. */
    assert_int_equal(kvd_arena_class_register(arena, 300 * 1024, &odd), KVD_OK);

    assert_int_equal(fill_class(arena, small, slots, 1024), 256);
    kvd_arena_stats_t st;
    assert_int_equal(kvd_arena_stats(arena, &st), KVD_OK);
    assert_int_equal(st.bytes_total, 16 * MIB);
    assert_int_equal(st.bytes_used, 16 * MIB);
    assert_int_equal(st.chunks_free, 0);
    assert_int_equal(class_stats(&st, small).slots_used, 256);
    assert_int_equal(class_stats(&st, small).slots_free, 0);
    assert_int_equal(class_stats(&st, small).chunks, 16);
    /* Full: the other class gets nothing either. */
    uint32_t s;
    assert_int_equal(kvd_arena_slot_alloc(arena, odd, &s), KVD_ERR_NOSPACE);

    for (uint32_t i = 0; i < 256; i++) {
        assert_int_equal(kvd_arena_slot_free(arena, slots[i]), KVD_OK);
    }
    assert_int_equal(kvd_arena_stats(arena, &st), KVD_OK);
    assert_int_equal(st.chunks_free, 16);
    assert_int_equal(st.bytes_used, 0);
    assert_int_equal(st.bytes_carved, 0);
    assert_int_equal(class_stats(&st, small).chunks, 0);

    assert_int_equal(fill_class(arena, odd, slots, 1024), 48);
    assert_int_equal(kvd_arena_stats(arena, &st), KVD_OK);
    assert_int_equal(st.bytes_used, 48ull * 300 * 1024);
    assert_int_equal(st.bytes_carved, 16 * MIB);
    for (uint32_t i = 0; i < 48; i++) {
        assert_int_equal(kvd_arena_slot_free(arena, slots[i]), KVD_OK);
    }
    kvd_arena_destroy(arena);
}

static void test_free_realloc(void **state)
{
    (void)state;
    kvd_log_level_t saved = kvd_log_get_level();
    kvd_arena_t *arena = test_arena(4 * MIB, MIB);
    uint32_t cls, other, s[3], again;
    assert_int_equal(kvd_arena_class_register(arena, 100000, &cls), KVD_OK);
    assert_int_equal(kvd_arena_class_register(arena, 8192, &other), KVD_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kvd_arena_slot_alloc(arena, cls, &s[i]), KVD_OK);
    }
    assert_int_not_equal(s[0], s[1]);
    assert_int_not_equal(s[1], s[2]);
    uint64_t off1 = kvd_arena_slot_offset(arena, s[1]);
    assert_int_equal(kvd_arena_slot_free(arena, s[1]), KVD_OK);
    assert_int_equal(kvd_arena_slot_alloc(arena, cls, &again), KVD_OK);
    assert_int_equal(again, s[1]); /* the freed slot is reused first */
    assert_int_equal(kvd_arena_slot_offset(arena, again), off1);

    kvd_log_set_level(KVD_LOG_LEVEL_OFF);
    assert_int_equal(kvd_arena_slot_free(arena, s[1]), KVD_OK);
    assert_int_equal(kvd_arena_slot_free(arena, s[1]), KVD_ERR_INVALID);
    /* Never handed out, but inside a carved chunk. */
    assert_int_equal(kvd_arena_slot_free(arena, s[2] + 1), KVD_ERR_INVALID);
    /* Beyond the arena and in a free chunk. */
    assert_int_equal(kvd_arena_slot_free(arena, KVD_ARENA_SLOT_INVALID),
                     KVD_ERR_INVALID);
    uint32_t free_chunk_slot = 3u << 8; /* chunk 3 of 4, 256 pages/chunk */
    assert_int_equal(kvd_arena_slot_free(arena, free_chunk_slot),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_arena_slot_free(NULL, s[0]), KVD_ERR_INVALID);
    /* Class ids run from 1 to chunk pages (256 here). */
    assert_int_equal(kvd_arena_slot_alloc(arena, 0, &again), KVD_ERR_INVALID);
    assert_int_equal(kvd_arena_slot_alloc(arena, 257, &again), KVD_ERR_INVALID);
    assert_int_equal(
        kvd_arena_slot_alloc(arena, KVD_ARENA_CLASS_INVALID, &again),
        KVD_ERR_INVALID);
    assert_int_equal(kvd_arena_slot_alloc(arena, cls, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_arena_slot_alloc(NULL, cls, &again), KVD_ERR_INVALID);
    kvd_log_set_level(saved);

    assert_null(kvd_arena_slot_ptr(arena, KVD_ARENA_SLOT_INVALID));
    assert_int_equal(kvd_arena_slot_offset(arena, free_chunk_slot), UINT64_MAX);
    assert_null(kvd_arena_slot_ptr(arena, free_chunk_slot));
    assert_int_equal(kvd_arena_slot_chunk(arena, KVD_ARENA_SLOT_INVALID),
                     UINT32_MAX);
    assert_int_equal(kvd_arena_slot_offset(NULL, s[0]), UINT64_MAX);

    kvd_arena_stats_t st;
    assert_int_equal(kvd_arena_stats(arena, &st), KVD_OK);
    assert_int_equal(class_stats(&st, cls).slots_used, 2);
    assert_int_equal(class_stats(&st, cls).slots_free, 10 - 2);
    assert_int_equal(class_stats(&st, other).chunks, 0);
    assert_int_equal(kvd_arena_stats(arena, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_arena_slot_free(arena, s[0]), KVD_OK);
    assert_int_equal(kvd_arena_slot_free(arena, s[2]), KVD_OK);
    assert_int_equal(kvd_arena_stats(arena, &st), KVD_OK);
    assert_int_equal(st.chunks_free, 4);
    kvd_arena_destroy(arena);
}

/* Two classes fill the arena interleaved; freeing one of them entirely
 * gives all its chunks to the other. */
static void test_no_fragmentation(void **state)
{
    (void)state;
    kvd_arena_t *arena = test_arena(16 * MIB, MIB);
    static uint32_t a_slots[512], b_slots[512];
    uint32_t a, b, na = 0, nb = 0;
    assert_int_equal(kvd_arena_class_register(arena, 64 * 1024, &a), KVD_OK);
    assert_int_equal(kvd_arena_class_register(arena, 256 * 1024, &b), KVD_OK);
    bool a_full = false, b_full = false;
    while (!a_full || !b_full) {
        if (!a_full) {
            a_full = kvd_arena_slot_alloc(arena, a, &a_slots[na]) != KVD_OK;
            na += !a_full;
        }
        if (!b_full) {
            b_full = kvd_arena_slot_alloc(arena, b, &b_slots[nb]) != KVD_OK;
            nb += !b_full;
        }
    }
    kvd_arena_stats_t st;
    assert_int_equal(kvd_arena_stats(arena, &st), KVD_OK);
    assert_int_equal(st.chunks_free, 0);
    uint32_t a_chunks = class_stats(&st, a).chunks;
    assert_int_equal(a_chunks + class_stats(&st, b).chunks, 16);
    assert_int_equal(na, a_chunks * 16);
    assert_true(a_chunks >= 2);

    for (uint32_t i = 0; i < na; i++) {
        assert_int_equal(kvd_arena_slot_free(arena, a_slots[i]), KVD_OK);
    }
    assert_int_equal(kvd_arena_stats(arena, &st), KVD_OK);
    assert_int_equal(st.chunks_free, a_chunks);
    uint32_t more = fill_class(arena, b, b_slots + nb, 512 - nb);
    assert_int_equal(more, a_chunks * 4);
    assert_int_equal(kvd_arena_stats(arena, &st), KVD_OK);
    assert_int_equal(class_stats(&st, b).chunks, 16);
    assert_int_equal(class_stats(&st, a).chunks, 0);
    kvd_arena_destroy(arena);
}

static void test_slots_aligned_disjoint(void **state)
{
    (void)state;
    kvd_arena_t *arena = test_arena(8 * MIB, MIB);
    kvd_arena_info_t info;
    assert_int_equal(kvd_arena_query(arena, &info), KVD_OK);
    uint32_t cls[2];
    uint64_t slot_bytes[2] = {12288, 208896};
    /* 12 KiB exactly, and 200 KiB + 1 (rounded up to 51 pages). */
    assert_int_equal(kvd_arena_class_register(arena, 12288, &cls[0]), KVD_OK);
    assert_int_equal(kvd_arena_class_register(arena, 204801, &cls[1]), KVD_OK);

    static uint32_t slots[2048];
    static uint8_t which[2048];
    uint32_t n = 0;
    bool full[2] = {false, false};
    while (!full[0] || !full[1]) {
        for (int k = 0; k < 2; k++) {
            if (!full[k]) {
                full[k] =
                    kvd_arena_slot_alloc(arena, cls[k], &slots[n]) != KVD_OK;
                if (!full[k]) {
                    which[n++] = (uint8_t)k;
                }
            }
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        uint64_t off = kvd_arena_slot_offset(arena, slots[i]);
        uint8_t *p = kvd_arena_slot_ptr(arena, slots[i]);
        assert_int_equal(off % KVD_ARENA_SLOT_ALIGN, 0);
        assert_ptr_equal(p, (uint8_t *)info.base + off);
        assert_true(off + slot_bytes[which[i]] <= info.size_bytes);
        assert_int_equal(kvd_arena_slot_chunk(arena, slots[i]),
                         off / info.chunk_bytes);
        /* A slot never straddles a chunk boundary (io_uring buffers). */
        assert_int_equal(off / info.chunk_bytes,
                         (off + slot_bytes[which[i]] - 1) / info.chunk_bytes);
        fill_pattern(p, slot_bytes[which[i]], slots[i]);
    }
    /* Any overlap would have overwritten an earlier slot's pattern. */
    for (uint32_t i = 0; i < n; i++) {
        assert_true(check_pattern(kvd_arena_slot_ptr(arena, slots[i]),
                                  slot_bytes[which[i]], slots[i]));
    }
    kvd_arena_destroy(arena);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_class_register),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_free_realloc),
        cmocka_unit_test(test_no_fragmentation),
        cmocka_unit_test(test_slots_aligned_disjoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
