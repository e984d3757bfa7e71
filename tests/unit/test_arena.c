/*
 * Host arena (store/arena.h): creation in each huge-page mode and with
 * bad settings, slab classes, exact capacity, free and reuse, chunks moving
 * between classes (no fragmentation failure), class places handed back
 * when a size drains and reused by other sizes, slot alignment and
 * disjointness, prefault, the export/import path across fork(), the config
 * table, every failpoint (nothing leaked: ASan for memory, /proc/self/fd
 * for descriptors) and concurrent allocation from four threads, over two
 * sizes and over more sizes than class places.
 *
 * Arenas here are a few MiB with 1 MiB chunks so that the whole file runs
 * in well under a second, sanitizers included. Worker threads and forked
 * children never call cmocka asserts; they report through return values.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/failpoint_int.h"
#include "store/arena.h"

#define MIB (1ull << 20)

#if defined(__SANITIZE_THREAD__)
#define TEST_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TEST_UNDER_TSAN 1
#endif
#endif
#ifdef TEST_UNDER_TSAN
#define THREAD_ITERATIONS 5000
#else
#define THREAD_ITERATIONS 50000
#endif
#define NUM_THREADS 4

static kvd_arena_config_t test_config(uint64_t size, uint64_t chunk, int mode,
                                      bool prefault)
{
    kvd_arena_config_t cfg = {
        .size_bytes = size,
        .chunk_bytes = chunk,
        .hugepages = mode,
        .prefault = prefault,
    };
    return cfg;
}

static kvd_arena_t *test_arena(uint64_t size, uint64_t chunk)
{
    kvd_arena_config_t cfg =
        test_config(size, chunk, KVD_ARENA_HUGEPAGES_OFF, false);
    kvd_arena_t *arena = NULL;
    assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_OK);
    assert_non_null(arena);
    return arena;
}

static int count_open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    while (readdir(d) != NULL) {
        n++;
    }
    closedir(d);
    return n;
}

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

/* Whether a hugetlb memfd can be created and sized here (a pool is not
 * needed for that; mmap is what reserves pages). Failpoints numbered @1
 * after memfd_create only hit the hugetlb attempt when this holds. */
static bool hugetlbfs_usable(void)
{
    int fd = memfd_create("probe", MFD_CLOEXEC | MFD_HUGETLB);
    if (fd < 0) {
        return false;
    }
    bool ok = ftruncate(fd, (off_t)(2 * MIB)) == 0;
    close(fd);
    return ok;
}

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

static void arm(const char *spec);

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

static void fill_pattern(uint8_t *p, uint64_t len, uint32_t seed)
{
    for (uint64_t i = 0; i < len; i += 4) {
        uint32_t v = seed * 2654435761u + (uint32_t)i;
        memcpy(p + i, &v, 4);
    }
}

static bool check_pattern(const uint8_t *p, uint64_t len, uint32_t seed)
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

/* ------------------------------------------------------------------------ */
/* Export and mapping                                                       */
/* ------------------------------------------------------------------------ */

/* Runs in the forked child: checks the parent's bytes and writes its own.
 * Returns the exit code (0 = fine). */
static int child_main(const kvd_arena_export_t *exp, uint64_t parent_off,
                      uint64_t child_off, uint64_t len)
{
    kvd_arena_mapping_t *m = NULL;
    if (kvd_arena_mapping_open(exp, &m) != KVD_OK) {
        return 1;
    }
    int rc = 0;
    uint8_t *in = kvd_arena_mapping_ptr(m, parent_off, len);
    uint8_t *out = kvd_arena_mapping_ptr(m, child_off, len);
    if (in == NULL || out == NULL) {
        rc = 2;
    } else if (!check_pattern(in, len, 1)) {
        rc = 3;
    } else {
        fill_pattern(out, len, 2);
    }
    kvd_arena_mapping_close(m);
    return rc;
}

static void test_export_fork(void **state)
{
    (void)state;
    kvd_arena_t *arena = test_arena(8 * MIB, MIB);
    uint32_t cls, ps, cs;
    const uint64_t len = 2 * MIB / 4;
    assert_int_equal(kvd_arena_class_register(arena, len, &cls), KVD_OK);
    assert_int_equal(kvd_arena_slot_alloc(arena, cls, &ps), KVD_OK);
    assert_int_equal(kvd_arena_slot_alloc(arena, cls, &cs), KVD_OK);
    fill_pattern(kvd_arena_slot_ptr(arena, ps), len, 1);
    memset(kvd_arena_slot_ptr(arena, cs), 0, len);

    kvd_arena_export_t exp;
    assert_int_equal(kvd_arena_export(arena, &exp), KVD_OK);
    assert_true(exp.fd >= 0);
    assert_int_equal(exp.size_bytes, 8 * MIB);
    assert_int_equal(exp.chunk_bytes, MIB);

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        _exit(child_main(&exp, kvd_arena_slot_offset(arena, ps),
                         kvd_arena_slot_offset(arena, cs), len));
    }
    int wstatus = 0;
    assert_int_equal(waitpid(pid, &wstatus, 0), pid);
    assert_true(WIFEXITED(wstatus));
    assert_int_equal(WEXITSTATUS(wstatus), 0);
    assert_true(check_pattern(kvd_arena_slot_ptr(arena, cs), len, 2));

    /* A mapping in this process sees the same bytes, and outlives the
     * arena: the memory lives until its last mapping goes. */
    kvd_arena_mapping_t *m = NULL;
    assert_int_equal(kvd_arena_mapping_open(&exp, &m), KVD_OK);
    assert_int_equal(close(exp.fd), 0);
    assert_int_equal(kvd_arena_mapping_size(m), 8 * MIB);
    uint64_t off = kvd_arena_slot_offset(arena, cs);
    kvd_arena_destroy(arena);
    assert_true(check_pattern(kvd_arena_mapping_ptr(m, off, len), len, 2));
    assert_ptr_equal(kvd_arena_mapping_ptr(m, 0, 0), kvd_arena_mapping_base(m));
    assert_null(kvd_arena_mapping_ptr(m, 8 * MIB, 0));
    assert_null(kvd_arena_mapping_ptr(m, 8 * MIB - 4096, 4097));
    assert_null(kvd_arena_mapping_ptr(m, UINT64_MAX, 2));
    assert_null(kvd_arena_mapping_ptr(NULL, 0, 1));
    kvd_arena_mapping_close(m);
    kvd_arena_mapping_close(NULL);
}

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

static void test_mapping_invalid(void **state)
{
    (void)state;
    kvd_log_level_t saved = kvd_log_get_level();
    kvd_log_set_level(KVD_LOG_LEVEL_OFF);
    kvd_arena_t *arena = test_arena(4 * MIB, MIB);
    kvd_arena_export_t exp, bad;
    kvd_arena_mapping_t *m = NULL;
    assert_int_equal(kvd_arena_export(arena, &exp), KVD_OK);
    assert_int_equal(kvd_arena_export(NULL, &exp), KVD_ERR_INVALID);
    assert_int_equal(kvd_arena_export(arena, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_arena_mapping_open(NULL, &m), KVD_ERR_INVALID);
    assert_int_equal(kvd_arena_mapping_open(&exp, NULL), KVD_ERR_INVALID);

    bad = exp;
    bad.fd = -1;
    assert_int_equal(kvd_arena_mapping_open(&bad, &m), KVD_ERR_INVALID);
    bad = exp;
    bad.map_bytes = exp.map_bytes * 2; /* longer than the file */
    bad.size_bytes = bad.map_bytes;
    assert_int_equal(kvd_arena_mapping_open(&bad, &m), KVD_ERR_INVALID);
    bad = exp;
    bad.size_bytes = exp.size_bytes + 4096; /* beyond map_bytes */
    assert_int_equal(kvd_arena_mapping_open(&bad, &m), KVD_ERR_INVALID);

    /* An unsealed memfd could be truncated under the mapping: refused. */
    int loose = memfd_create("loose", MFD_CLOEXEC);
    assert_true(loose >= 0);
    assert_int_equal(ftruncate(loose, (off_t)exp.map_bytes), 0);
    bad = exp;
    bad.fd = loose;
    assert_int_equal(kvd_arena_mapping_open(&bad, &m), KVD_ERR_INVALID);
    close(loose);
    assert_null(m);
    close(exp.fd);
    kvd_arena_destroy(arena);
    kvd_log_set_level(saved);
}

/* ------------------------------------------------------------------------ */
/* Failpoints                                                               */
/* ------------------------------------------------------------------------ */

static void arm(const char *spec)
{
    char err[128];
    kvd_status_t st = kvd_failpoint_set(spec, err, sizeof(err));
    if (st != KVD_OK) {
        print_error("failpoint spec %s: %s\n", spec, err);
    }
    assert_int_equal(st, KVD_OK);
}

static void test_failpoints(void **state)
{
    (void)state;
    kvd_log_level_t saved = kvd_log_get_level();
    kvd_log_set_level(KVD_LOG_LEVEL_OFF);
    int fds_before = count_open_fds();
    static const struct {
        const char *spec;
        kvd_status_t want;
    } cases[] = {
        {"arena.alloc=ENOMEM", KVD_ERR_NOMEM},
        {"arena.alloc=ENOMEM@2", KVD_ERR_NOMEM}, /* metadata */
        {"arena.memfd=EIO", KVD_ERR_IO},
        {"arena.memfd=24", KVD_ERR_IO}, /* EMFILE: no mapping of its own */
        {"arena.ftruncate=ENOSPC", KVD_ERR_NOSPACE},
        {"arena.seal=EPERM", KVD_ERR_AUTH},
        {"arena.mmap=ENOMEM", KVD_ERR_NOMEM},
        {"arena.prefault=ENOMEM", KVD_ERR_NOMEM},
        {"arena.prefault=EFAULT", KVD_ERR_INVALID},
    };
    for (int mode = KVD_ARENA_HUGEPAGES_AUTO; mode <= KVD_ARENA_HUGEPAGES_OFF;
         mode++) {
        if (mode == KVD_ARENA_HUGEPAGES_ON) {
            continue;
        }
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            kvd_arena_config_t cfg = test_config(8 * MIB, MIB, mode, true);
            kvd_arena_t *arena = NULL;
            arm(cases[i].spec);
            kvd_status_t st = kvd_arena_create(&cfg, &arena);
            kvd_failpoint_clear();
            if (st != cases[i].want) {
                print_error("mode %d spec %s: got %s\n", mode, cases[i].spec,
                            kvd_status_str(st));
            }
            assert_int_equal(st, cases[i].want);
            assert_null(arena);
        }
    }

    /* auto: a failing hugetlb attempt falls back to ordinary memory. */
    static const char *const fallbacks[] = {
        "arena.memfd=EINVAL@1", "arena.ftruncate=EINVAL@1",
        "arena.seal=EINVAL@1", "arena.mmap=ENOMEM@1"};
    bool hugetlbfs = hugetlbfs_usable();
    size_t num_fallbacks = hugetlbfs ? 4 : 1;
    for (size_t i = 0; i < num_fallbacks; i++) {
        kvd_arena_config_t cfg =
            test_config(8 * MIB, MIB, KVD_ARENA_HUGEPAGES_AUTO, false);
        kvd_arena_t *arena = NULL;
        arm(fallbacks[i]);
        assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_OK);
        kvd_failpoint_clear();
        kvd_arena_info_t info;
        assert_int_equal(kvd_arena_query(arena, &info), KVD_OK);
        assert_int_not_equal(info.backing, KVD_ARENA_BACKING_HUGETLB);
        kvd_arena_destroy(arena);
    }
    /* on: the same failure is the caller's error, never a silent fallback;
     * EINVAL from memfd_create means no hugetlbfs at all. */
    kvd_arena_config_t on_cfg =
        test_config(8 * MIB, MIB, KVD_ARENA_HUGEPAGES_ON, false);
    kvd_arena_t *none = NULL;
    arm("arena.memfd=EINVAL");
    assert_int_equal(kvd_arena_create(&on_cfg, &none), KVD_ERR_UNSUPPORTED);
    if (hugetlbfs) {
        arm("arena.mmap=ENOMEM");
        assert_int_equal(kvd_arena_create(&on_cfg, &none), KVD_ERR_NOMEM);
    }
    kvd_failpoint_clear();
    assert_null(none);

    /* Export and mapping. */
    kvd_arena_t *arena = test_arena(4 * MIB, MIB);
    kvd_arena_export_t exp;
    kvd_arena_mapping_t *m = NULL;
    arm("arena.dup=24"); /* EMFILE */
    assert_int_equal(kvd_arena_export(arena, &exp), KVD_ERR_IO);
    kvd_failpoint_clear();
    assert_int_equal(kvd_arena_export(arena, &exp), KVD_OK);
    arm("arena.map=ENOMEM");
    assert_int_equal(kvd_arena_mapping_open(&exp, &m), KVD_ERR_NOMEM);
    arm("arena.alloc=ENOMEM");
    assert_int_equal(kvd_arena_mapping_open(&exp, &m), KVD_ERR_NOMEM);
    kvd_failpoint_clear();
    assert_null(m);
    close(exp.fd);
    kvd_arena_destroy(arena);

    assert_int_equal(count_open_fds(), fds_before);
    kvd_log_set_level(saved);
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

/* ------------------------------------------------------------------------ */
/* Threads                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct thread_arg {
    kvd_arena_t *arena;
    const uint32_t *classes;
    uint32_t num_classes;
    uint32_t id;
    uint32_t failures; /* read by the test thread after join */
    uint32_t nospace;  /* NOSPACE answers: expected, not failures */
} thread_arg_t;

#define HELD_MAX 48

static void *thread_main(void *p)
{
    thread_arg_t *arg = p;
    uint32_t held[HELD_MAX];
    uint64_t tags[HELD_MAX];
    uint32_t n = 0;
    uint64_t rng = 0x9e3779b97f4a7c15ull * (arg->id + 1);
    for (uint32_t it = 0; it < THREAD_ITERATIONS; it++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        bool do_alloc = n == 0 || (n < HELD_MAX && (rng & 3) != 0 &&
                                   (rng >> 8) % HELD_MAX >= n / 2);
        if (do_alloc) {
            uint32_t slot;
            kvd_status_t st = kvd_arena_slot_alloc(
                arg->arena, arg->classes[(rng >> 4) % arg->num_classes], &slot);
            if (st == KVD_ERR_NOSPACE) {
                arg->nospace++;
                continue;
            }
            uint64_t *ptr = kvd_arena_slot_ptr(arg->arena, slot);
            if (st != KVD_OK || ptr == NULL) {
                arg->failures++;
                continue;
            }
            /* A slot handed to two owners would have its tag replaced. */
            tags[n] = (uint64_t)arg->id << 32 | it;
            *ptr = tags[n];
            held[n++] = slot;
        } else {
            uint32_t k = (uint32_t)((rng >> 16) % n);
            uint64_t *ptr = kvd_arena_slot_ptr(arg->arena, held[k]);
            if (ptr == NULL || *ptr != tags[k] ||
                kvd_arena_slot_free(arg->arena, held[k]) != KVD_OK) {
                arg->failures++;
            }
            held[k] = held[--n];
            tags[k] = tags[n];
        }
    }
    while (n > 0) {
        n--;
        uint64_t *ptr = kvd_arena_slot_ptr(arg->arena, held[n]);
        if (ptr == NULL || *ptr != tags[n] ||
            kvd_arena_slot_free(arg->arena, held[n]) != KVD_OK) {
            arg->failures++;
        }
    }
    return NULL;
}

/* Runs NUM_THREADS thread_main()s over `classes`, then checks that no
 * slot, chunk or class place leaked. */
static void run_threads(kvd_arena_t *arena, const uint32_t *classes,
                        uint32_t num_classes)
{
    pthread_t th[NUM_THREADS];
    thread_arg_t args[NUM_THREADS];
    for (uint32_t i = 0; i < NUM_THREADS; i++) {
        args[i] = (thread_arg_t){.arena = arena,
                                 .classes = classes,
                                 .num_classes = num_classes,
                                 .id = i};
        assert_int_equal(pthread_create(&th[i], NULL, thread_main, &args[i]),
                         0);
    }
    for (uint32_t i = 0; i < NUM_THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(args[i].failures, 0);
    }
    kvd_arena_stats_t st;
    assert_int_equal(kvd_arena_stats(arena, &st), KVD_OK);
    assert_int_equal(st.bytes_used, 0);
    assert_int_equal(st.chunks_free, st.chunks_total);
    assert_int_equal(st.num_classes, 0);
}

static void test_threads(void **state)
{
    (void)state;
    /* Small enough that the four threads (up to 48 slots each) contend for
     * chunks and hit NOSPACE, so carve/release races are exercised. */
    kvd_arena_t *arena = test_arena(8 * MIB, MIB);
    uint32_t cls[2];
    assert_int_equal(kvd_arena_class_register(arena, 16 * 1024, &cls[0]),
                     KVD_OK);
    assert_int_equal(kvd_arena_class_register(arena, 200 * 1024, &cls[1]),
                     KVD_OK);
    run_threads(arena, cls, 2);
    kvd_arena_destroy(arena);
}

/* 96 sizes over 160 chunks: the four threads contend for class places as
 * well as chunks, so places are taken and handed back concurrently. */
static void test_threads_many_sizes(void **state)
{
    (void)state;
    const uint64_t chunk = 512 * 1024;
    kvd_arena_t *arena = test_arena(160 * chunk, chunk);
    uint32_t cls[96];
    for (uint32_t i = 0; i < 96; i++) {
        assert_int_equal(
            kvd_arena_class_register(arena, (i + 1) * 4096ull, &cls[i]),
            KVD_OK);
    }
    kvd_log_level_t saved = kvd_log_get_level();
    kvd_log_set_level(KVD_LOG_LEVEL_ERROR); /* the places-full warning */
    run_threads(arena, cls, 96);
    /* Whether the threads ran out of places depends on how the scheduler
     * interleaved them (on a loaded machine one thread at a time holds at
     * most 48 sizes); holding 64 sizes at once always does. */
    uint32_t held[KVD_ARENA_CLASSES_MAX + 1];
    for (uint32_t i = 0; i < KVD_ARENA_CLASSES_MAX; i++) {
        assert_int_equal(kvd_arena_slot_alloc(arena, cls[i], &held[i]), KVD_OK);
    }
    assert_int_equal(kvd_arena_slot_alloc(arena, cls[KVD_ARENA_CLASSES_MAX],
                                          &held[KVD_ARENA_CLASSES_MAX]),
                     KVD_ERR_NOSPACE);
    for (uint32_t i = 0; i < KVD_ARENA_CLASSES_MAX; i++) {
        assert_int_equal(kvd_arena_slot_free(arena, held[i]), KVD_OK);
    }
    kvd_log_set_level(saved);
    kvd_arena_stats_t st;
    assert_int_equal(kvd_arena_stats(arena, &st), KVD_OK);
    assert_true(st.class_places_full > 0);
    assert_int_equal(st.num_classes, 0);
    kvd_arena_destroy(arena);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_modes),
        cmocka_unit_test(test_collapse),
        cmocka_unit_test(test_create_invalid),
        cmocka_unit_test(test_prefault),
        cmocka_unit_test(test_class_register),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_free_realloc),
        cmocka_unit_test(test_no_fragmentation),
        cmocka_unit_test(test_slots_aligned_disjoint),
        cmocka_unit_test(test_class_reclaim),
        cmocka_unit_test(test_class_cycle_sizes),
        cmocka_unit_test(test_export_fork),
        cmocka_unit_test(test_partitions),
        cmocka_unit_test(test_mapping_invalid),
        cmocka_unit_test(test_failpoints),
        cmocka_unit_test(test_config_table),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_threads_many_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
