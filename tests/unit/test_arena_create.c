/*
 * Host arena creation (store/arena.h): each huge-page mode (off, auto,
 * on), auto's 2 MiB pages built on request (MADV_COLLAPSE) and the 4 KiB
 * pages left when the kernel refuses, bad settings refused before anything
 * is mapped, a size rounded down to whole chunks, prefault making every
 * page resident, and the arena's config table (defaults, call parameters,
 * environment).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "kvd_testarena_int.h"

static uint64_t nr_hugepages(void)
{
    unsigned long long n = 0;
    FILE *f = fopen("/proc/sys/vm/nr_hugepages", "r");
    if (f != NULL) {
        if (fscanf(f, "%llu", &n) != 1) {
            n = 0;
        }
        fclose(f);
    }
    return n;
}

/* Whether the host's shmem THP setting gives huge pages on faults to a
 * mapping that asks (MADV_HUGEPAGE), so auto needs no collapse. */
static bool shmem_thp_on_faults(void)
{
    char buf[256] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
    if (f != NULL) {
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
    return buf[0] != '\0' && strstr(buf, "[never]") == NULL &&
           strstr(buf, "[deny]") == NULL;
}

/* ------------------------------------------------------------------------ */
/* Creation                                                                 */
/* ------------------------------------------------------------------------ */

static void check_info(kvd_arena_t *arena, uint64_t size)
{
    kvd_arena_info_t info;
    assert_int_equal(kvd_arena_query(arena, &info), KVD_OK);
    assert_non_null(info.base);
    assert_int_equal((uintptr_t)info.base % KVD_ARENA_SLOT_ALIGN, 0);
    assert_int_equal(info.size_bytes, size);
    assert_true(info.map_bytes >= info.size_bytes);
    assert_int_equal(info.num_chunks, size / info.chunk_bytes);
    /* The whole region is writable, first and last byte included. */
    uint8_t *p = info.base;
    p[0] = 0xa5;
    p[info.size_bytes - 1] = 0x5a;
    assert_int_equal(p[0], 0xa5);
    assert_int_equal(p[info.size_bytes - 1], 0x5a);
}

/* Bytes of [base, base + len) that this process maps with 2 MiB entries
 * (/proc/self/smaps: ShmemPmdMapped and FilePmdMapped of those VMAs). */
static uint64_t pmd_mapped(const void *base, uint64_t len)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (f == NULL) {
        return 0;
    }
    uintptr_t lo = (uintptr_t)base, hi = lo + len;
    bool inside = false;
    uint64_t total = 0;
    char line[512];
    while (fgets(line, sizeof line, f) != NULL) {
        unsigned long start, end, kb;
        /* A VMA's first line starts "start-end"; no field name does. */
        if (sscanf(line, "%lx-%lx ", &start, &end) == 2) {
            inside = start < hi && end > lo;
        } else if (inside &&
                   (sscanf(line, "ShmemPmdMapped: %lu kB", &kb) == 1 ||
                    sscanf(line, "FilePmdMapped: %lu kB", &kb) == 1)) {
            total += (uint64_t)kb << 10;
        }
    }
    fclose(f);
    return total;
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1 */
#endif

/* Whether this kernel builds a 2 MiB shared-memory page on request
 * (MADV_COLLAPSE: Linux 6.1, refused under shmem_enabled "deny"). */
static bool collapse_works(void)
{
    const size_t huge = 2 * MIB;
    int fd = memfd_create("probe", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)huge) != 0) {
        if (fd >= 0) {
            close(fd);
        }
        return false;
    }
    uint8_t *r = mmap(NULL, 2 * huge, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    bool ok = false;
    if (r != MAP_FAILED) {
        uint8_t *at = (uint8_t *)(((uintptr_t)r + huge - 1) & ~(huge - 1));
        uint8_t *p = mmap(at, huge, PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_FIXED, fd, 0);
        if (p != MAP_FAILED) {
            p[0] = 1;
            ok = madvise(p, huge, MADV_COLLAPSE) == 0;
        }
        munmap(r, 2 * huge);
    }
    close(fd);
    return ok;
}

/* auto with prefault and no hugetlb pool: 2 MiB pages anyway where the
 * kernel builds them on request, whatever the host's shmem THP setting
 * ("never" by default); the arena reports transparent huge pages only
 * when the kernel maps it with them. A refused collapse leaves 4 KiB
 * pages that work. */
static void test_collapse(void **state)
{
    (void)state;
    if (nr_hugepages() != 0) {
        skip(); /* auto would take the pool */
    }
    bool can = collapse_works();
    for (int refuse = 0; refuse < 2; refuse++) {
        kvd_arena_config_t cfg =
            test_config(8 * MIB, 2 * MIB, KVD_ARENA_HUGEPAGES_AUTO, true);
        kvd_arena_t *arena = NULL;
        if (refuse) {
            arm("arena.collapse=ENOMEM@2"); /* after one extent */
        }
        assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_OK);
        kvd_failpoint_clear();
        check_info(arena, 8 * MIB);
        kvd_arena_info_t info;
        assert_int_equal(kvd_arena_query(arena, &info), KVD_OK);
        uint64_t pmd = pmd_mapped(info.base, info.map_bytes);
        if (info.backing == KVD_ARENA_BACKING_THP) {
            assert_true(pmd > 0);
        }
        if (can && !refuse) {
            assert_int_equal(info.backing, KVD_ARENA_BACKING_THP);
            assert_int_equal(pmd, info.map_bytes);
        }
        if (refuse && can && !shmem_thp_on_faults()) {
            assert_int_equal(info.backing, KVD_ARENA_BACKING_PLAIN);
        }
        kvd_arena_destroy(arena);
    }
}

static void test_create_modes(void **state)
{
    (void)state;
    kvd_arena_t *arena = NULL;
    kvd_arena_config_t cfg =
        test_config(16 * MIB, MIB, KVD_ARENA_HUGEPAGES_OFF, false);
    assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_OK);
    check_info(arena, 16 * MIB);
    kvd_arena_info_t info;
    assert_int_equal(kvd_arena_query(arena, &info), KVD_OK);
    assert_int_equal(info.backing, KVD_ARENA_BACKING_PLAIN);
    kvd_arena_destroy(arena);

    /* auto always succeeds, whatever backing it found. */
    arena = NULL;
    cfg.hugepages = KVD_ARENA_HUGEPAGES_AUTO;
    assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_OK);
    check_info(arena, 16 * MIB);
    kvd_arena_destroy(arena);

    /* on: hugetlb or a clear error; without a pool it must fail. */
    arena = NULL;
    cfg.hugepages = KVD_ARENA_HUGEPAGES_ON;
    kvd_status_t st = kvd_arena_create(&cfg, &arena);
    if (st == KVD_OK) {
        check_info(arena, 16 * MIB);
        assert_int_equal(kvd_arena_query(arena, &info), KVD_OK);
        assert_int_equal(info.backing, KVD_ARENA_BACKING_HUGETLB);
        assert_int_equal(info.map_bytes % (2 * MIB), 0);
        kvd_arena_destroy(arena);
    } else {
        assert_true(st == KVD_ERR_NOMEM || st == KVD_ERR_UNSUPPORTED);
        assert_null(arena);
    }
    if (nr_hugepages() == 0) {
        assert_int_not_equal(st, KVD_OK);
    }

    kvd_arena_destroy(NULL);
}

static void test_create_invalid(void **state)
{
    (void)state;
    kvd_log_level_t saved = kvd_log_get_level();
    kvd_log_set_level(KVD_LOG_LEVEL_OFF);
    kvd_arena_t *arena = (kvd_arena_t *)&arena; /* must stay untouched */
    kvd_arena_t *const sentinel = arena;
    kvd_arena_config_t cfg =
        test_config(16 * MIB, MIB, KVD_ARENA_HUGEPAGES_OFF, false);

    assert_int_equal(kvd_arena_create(NULL, &arena), KVD_ERR_INVALID);
    assert_int_equal(kvd_arena_create(&cfg, NULL), KVD_ERR_INVALID);
    cfg.chunk_bytes = 0;
    assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_ERR_INVALID);
    cfg.chunk_bytes = 5000;
    assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_ERR_INVALID);
    cfg.chunk_bytes = 2ull << 30;
    cfg.size_bytes = 4ull << 30;
    assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_ERR_RANGE);
    cfg = test_config(MIB / 2, MIB, KVD_ARENA_HUGEPAGES_OFF, false);
    assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_ERR_RANGE);
    cfg = test_config(16 * MIB, MIB, 7, false);
    assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_ERR_INVALID);
    cfg.hugepages = -1;
    assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_ERR_INVALID);
    /* 2^32 chunks of one page: slot ids would not fit in 32 bits. Checked
     * before anything is allocated or mapped. */
    cfg = test_config(16ull << 40, 4096, KVD_ARENA_HUGEPAGES_OFF, false);
    assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_ERR_RANGE);
    assert_ptr_equal(arena, sentinel);
    kvd_log_set_level(saved);

    /* A size that is not whole chunks is rounded down, never up. */
    arena = NULL;
    cfg = test_config(16 * MIB + 5000, MIB, KVD_ARENA_HUGEPAGES_OFF, false);
    assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_OK);
    check_info(arena, 16 * MIB);
    assert_int_equal(kvd_arena_query(NULL, NULL), KVD_ERR_INVALID);
    kvd_arena_destroy(arena);
}

static void test_prefault(void **state)
{
    (void)state;
    const uint64_t size = 32 * MIB;
    size_t pages = size / 4096;
    unsigned char *vec = malloc(pages);
    assert_non_null(vec);

    for (int prefault = 0; prefault <= 1; prefault++) {
        kvd_arena_config_t cfg =
            test_config(size, MIB, KVD_ARENA_HUGEPAGES_OFF, prefault);
        kvd_arena_t *arena = NULL;
        assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_OK);
        kvd_arena_info_t info;
        assert_int_equal(kvd_arena_query(arena, &info), KVD_OK);
        assert_int_equal(mincore(info.base, size, vec), 0);
        size_t resident = 0;
        for (size_t i = 0; i < pages; i++) {
            resident += vec[i] & 1;
        }
        /* Prefault makes every page resident; without it none is. */
        assert_int_equal(resident, prefault ? pages : 0);
        kvd_arena_destroy(arena);
    }
    free(vec);
}

/* ------------------------------------------------------------------------ */
/* Configuration                                                            */
/* ------------------------------------------------------------------------ */

static void test_config_table(void **state)
{
    (void)state;
    static const char *const envs[] = {
        "KVDEPOT_STORE_ARENA_SIZE", "KVDEPOT_STORE_ARENA_CHUNK",
        "KVDEPOT_STORE_ARENA_HUGEPAGES", "KVDEPOT_STORE_ARENA_PREFAULT"};
    for (size_t i = 0; i < 4; i++) {
        unsetenv(envs[i]);
    }
    size_t n = 0;
    const kvd_config_field_t *table = kvd_arena_config_table(&n);
    assert_int_equal(n, 4);
    char err[256];

    /* The table's defaults and kvd_arena_config_default() agree. */
    kvd_arena_config_t got, want = kvd_arena_config_default();
    memset(&got, 0xff, sizeof(got));
    assert_int_equal(kvd_config_apply(NULL, table, n, &got, err, sizeof(err)),
                     KVD_OK);
    assert_int_equal(got.size_bytes, want.size_bytes);
    assert_int_equal(got.chunk_bytes, want.chunk_bytes);
    assert_int_equal(got.hugepages, want.hugepages);
    assert_int_equal(got.prefault, want.prefault);
    /* Partitions are not settings: a caller leaves them zero. */
    got.num_parts = 0;

    kvd_config_t *config = NULL;
    assert_int_equal(kvd_config_create(&config), KVD_OK);
    assert_int_equal(kvd_config_set(config, "store.arena_size", "64m"), KVD_OK);
    assert_int_equal(kvd_config_set(config, "store.arena_chunk", "2MiB"),
                     KVD_OK);
    assert_int_equal(kvd_config_set(config, "store.arena_hugepages", "off"),
                     KVD_OK);
    assert_int_equal(kvd_config_set(config, "store.arena_prefault", "no"),
                     KVD_OK);
    assert_int_equal(kvd_config_apply(config, table, n, &got, err, sizeof(err)),
                     KVD_OK);
    assert_int_equal(got.size_bytes, 64 * MIB);
    assert_int_equal(got.chunk_bytes, 2 * MIB);
    assert_int_equal(got.hugepages, KVD_ARENA_HUGEPAGES_OFF);
    assert_false(got.prefault);

    kvd_arena_t *arena = NULL;
    assert_int_equal(kvd_arena_create(&got, &arena), KVD_OK);
    kvd_arena_info_t info;
    assert_int_equal(kvd_arena_query(arena, &info), KVD_OK);
    assert_int_equal(info.num_chunks, 32);
    assert_int_equal(info.backing, KVD_ARENA_BACKING_PLAIN);
    kvd_arena_destroy(arena);

    /* The environment overrides defaults; a bad value names the field. */
    assert_int_equal(setenv("KVDEPOT_STORE_ARENA_HUGEPAGES", "maybe", 1), 0);
    assert_int_equal(kvd_config_apply(NULL, table, n, &got, err, sizeof(err)),
                     KVD_ERR_INVALID);
    assert_non_null(strstr(err, "store.arena_hugepages"));
    unsetenv("KVDEPOT_STORE_ARENA_HUGEPAGES");
    assert_int_equal(kvd_config_set(config, "store.arena_chunk", "2g"), KVD_OK);
    assert_int_equal(kvd_config_apply(config, table, n, &got, err, sizeof(err)),
                     KVD_ERR_RANGE);
    kvd_config_destroy(config);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_modes),   cmocka_unit_test(test_collapse),
        cmocka_unit_test(test_create_invalid), cmocka_unit_test(test_prefault),
        cmocka_unit_test(test_config_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
