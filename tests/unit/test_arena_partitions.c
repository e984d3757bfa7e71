/*
 * Host arena partitions (store/arena.h): each allocation stays in its
 * partition, a full partition refuses while others have room, one
 * partition's export maps its bytes only, at its own offsets, the main
 * export is partition 0 alone, and bad partition layouts are refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "kvd_testarena_int.h"

/* Partitions: each allocation stays in its partition, a full partition
 * refuses while others have room, and one partition's export maps its
 * bytes only, at its own offsets. */
static void test_partitions(void **state)
{
    (void)state;
    kvd_log_level_t saved = kvd_log_get_level();
    kvd_log_set_level(KVD_LOG_LEVEL_OFF);
    kvd_arena_config_t cfg =
        test_config(4 * MIB, MIB, KVD_ARENA_HUGEPAGES_OFF, true);
    cfg.num_parts = 2;
    cfg.part_bytes[0] = 2 * MIB;
    cfg.part_bytes[1] = 3 * MIB + 4096; /* rounded down to whole chunks */
    kvd_arena_t *arena = NULL;
    assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_OK);
    kvd_arena_info_t info;
    assert_int_equal(kvd_arena_query(arena, &info), KVD_OK);
    assert_int_equal(info.num_parts, 3);
    assert_int_equal(info.num_chunks, 9);
    assert_int_equal(info.size_bytes, 9 * MIB);
    kvd_arena_stats_t st;
    assert_int_equal(kvd_arena_stats(arena, &st), KVD_OK);
    assert_int_equal(st.num_parts, 3);
    assert_int_equal(st.parts[1].offset, 4 * MIB);
    assert_int_equal(st.parts[1].chunks_total, 2);
    assert_int_equal(st.parts[2].offset, 6 * MIB);
    assert_int_equal(st.parts[2].chunks_total, 3);

    /* Partition 1 holds 2 chunks of 2 slots: the fifth allocation there
     * fails while partitions 0 and 2 are empty. */
    uint32_t cls, slots[4], s0, s2;
    assert_int_equal(kvd_arena_class_register(arena, MIB / 2, &cls), KVD_OK);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(kvd_arena_slot_alloc_in(arena, 1, cls, &slots[i]),
                         KVD_OK);
        uint64_t off = kvd_arena_slot_offset(arena, slots[i]);
        assert_true(off >= 4 * MIB && off < 6 * MIB);
        assert_int_equal(kvd_arena_slot_part(arena, slots[i]), 1);
        memset(kvd_arena_slot_ptr(arena, slots[i]), 0xA5, MIB / 2);
    }
    uint32_t extra;
    assert_int_equal(kvd_arena_slot_alloc_in(arena, 1, cls, &extra),
                     KVD_ERR_NOSPACE);
    assert_int_equal(kvd_arena_slot_alloc_in(arena, 3, cls, &extra),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_arena_slot_alloc(arena, cls, &s0), KVD_OK);
    assert_true(kvd_arena_slot_offset(arena, s0) < 4 * MIB);
    assert_int_equal(kvd_arena_slot_part(arena, s0), 0);
    memset(kvd_arena_slot_ptr(arena, s0), 0x5A, MIB / 2);
    assert_int_equal(kvd_arena_slot_alloc_in(arena, 2, cls, &s2), KVD_OK);
    assert_true(kvd_arena_slot_offset(arena, s2) >= 6 * MIB);
    assert_int_equal(kvd_arena_stats(arena, &st), KVD_OK);
    assert_int_equal(st.parts[1].chunks_free, 0);
    assert_int_equal(st.parts[0].chunks_free, 3);
    assert_int_equal(st.parts[2].chunks_free, 2);

    /* Freeing in partition 1 makes room there, and only there. */
    assert_int_equal(kvd_arena_slot_free(arena, slots[3]), KVD_OK);
    assert_int_equal(kvd_arena_slot_alloc_in(arena, 1, cls, &slots[3]), KVD_OK);
    assert_int_equal(kvd_arena_slot_part(arena, slots[3]), 1);
    memset(kvd_arena_slot_ptr(arena, slots[3]), 0xA5, MIB / 2);

    /* Partition 1's export: its own memfd, its size, its offsets. */
    kvd_arena_export_t exp;
    assert_int_equal(kvd_arena_export_part(arena, 3, &exp), KVD_ERR_INVALID);
    assert_int_equal(kvd_arena_export_part(arena, 1, &exp), KVD_OK);
    assert_int_equal(exp.offset, 4 * MIB);
    assert_int_equal(exp.size_bytes, 2 * MIB);
    struct stat sb;
    assert_int_equal(fstat(exp.fd, &sb), 0);
    assert_int_equal((uint64_t)sb.st_size, 2 * MIB);
    kvd_arena_mapping_t *m = NULL;
    assert_int_equal(kvd_arena_mapping_open(&exp, &m), KVD_OK);
    assert_int_equal(close(exp.fd), 0);
    assert_int_equal(kvd_arena_mapping_offset(m), 4 * MIB);
    uint64_t off1 = kvd_arena_slot_offset(arena, slots[2]);
    uint8_t *p = kvd_arena_mapping_ptr(m, off1, MIB / 2);
    assert_non_null(p);
    assert_int_equal(p[0], 0xA5);
    p[1] = 0x11; /* shared with the arena's own view */
    assert_int_equal(((uint8_t *)kvd_arena_slot_ptr(arena, slots[2]))[1], 0x11);
    /* Offsets of the other partitions are outside this mapping. */
    assert_null(kvd_arena_mapping_ptr(m, kvd_arena_slot_offset(arena, s0), 1));
    assert_null(kvd_arena_mapping_ptr(m, kvd_arena_slot_offset(arena, s2), 1));
    assert_null(kvd_arena_mapping_ptr(m, 4 * MIB - 1, 2));
    assert_null(kvd_arena_mapping_ptr(m, 6 * MIB, 1));
    /* Nothing partition 0 holds is in the mapped bytes. */
    const uint8_t *b = kvd_arena_mapping_base(m);
    for (uint64_t i = 0; i < kvd_arena_mapping_size(m); i++) {
        assert_true(b[i] != 0x5A);
    }
    kvd_arena_mapping_close(m);

    /* The main partition's export is partition 0 alone. */
    assert_int_equal(kvd_arena_export(arena, &exp), KVD_OK);
    assert_int_equal(exp.offset, 0);
    assert_int_equal(exp.size_bytes, 4 * MIB);
    assert_int_equal(fstat(exp.fd, &sb), 0);
    assert_int_equal((uint64_t)sb.st_size, 4 * MIB);
    assert_int_equal(close(exp.fd), 0);

    for (int i = 0; i < 4; i++) {
        assert_int_equal(kvd_arena_slot_free(arena, slots[i]), KVD_OK);
    }
    assert_int_equal(kvd_arena_slot_free(arena, s0), KVD_OK);
    assert_int_equal(kvd_arena_slot_free(arena, s2), KVD_OK);
    assert_int_equal(kvd_arena_stats(arena, &st), KVD_OK);
    assert_int_equal(st.chunks_free, 9);
    assert_int_equal(st.num_classes, 0);
    kvd_arena_destroy(arena);

    /* A partition smaller than a chunk, or too many: refused. */
    cfg.part_bytes[1] = MIB - 4096;
    assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_ERR_RANGE);
    cfg.part_bytes[1] = MIB;
    cfg.num_parts = KVD_ARENA_PARTS_MAX + 1;
    assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_ERR_RANGE);
    /* Huge pages requested where the kernel may have none: either the
     * partitions are mapped or the refusal is clean. */
    cfg.num_parts = 1;
    cfg.hugepages = KVD_ARENA_HUGEPAGES_AUTO;
    assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_OK);
    kvd_arena_destroy(arena);
    kvd_log_set_level(saved);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_partitions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
