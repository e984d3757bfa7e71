/*
 * Host arena (store/arena.h): one sealed memfd mapped once (or, with
 * partitions, one per partition mapped side by side in one reserved range),
 * cut into chunks that are carved into fixed-size slots per slab class.
 * Each partition keeps its own free-chunk pool and each class one partial
 * list per partition, so an allocation never leaves its partition.
 *
 * Bookkeeping lives outside the shared region, in ordinary heap memory: the
 * region is handed to DMA engines and other processes, and its bytes belong
 * to whoever holds a slot, so an intrusive free list there could be
 * overwritten by a transfer or a buggy worker. Per chunk we keep its class,
 * a use count, a bump index (slots never handed out since the chunk was
 * carved, which makes carving O(1) whatever the slot count) and the head of
 * a free list threaded through one uint32 link per possible slot. A bitmap
 * with one bit per possible slot catches double and wild frees, which in a
 * cache would otherwise silently hand one slot to two objects.
 *
 * Each class keeps a doubly linked list of its chunks that have a free
 * slot. Allocation takes the list head; a chunk that goes from full to
 * non-full is pushed at the head, so the chunks that are nearly full are
 * refilled first and the others get a chance to drain completely and return
 * to the free-chunk pool, where any class can carve them. A chunk returns
 * to the pool the moment its last slot is freed: carving is O(1), so there
 * is nothing to gain from keeping empty chunks per class, and keeping them
 * would starve other classes.
 *
 * Classes live in a fixed table of KVD_ARENA_CLASSES_MAX places. A place is
 * bound to a slot size exactly while the class holds a chunk: it is taken
 * with the first chunk carved and handed back when the last chunk returns
 * to the pool, both under the lock, so a place is never seen half-bound and
 * a size never lingers on a place nobody uses (otherwise 64 sizes seen once
 * would lock every later size out). Callers never see places: a class id is
 * the slot size in pages, and class_of[] maps it to its place, if any, in
 * O(1). An id kept across frees and evictions therefore keeps meaning the
 * same size, whichever place its class has by then. The lock-free offset
 * lookup reads the slot size from the chunk itself (one atomic word set
 * when the chunk is carved), never the class table, which changes under
 * the lock.
 */
#include "store/arena.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/failpoint_int.h"
#include "common/log_int.h"
#include "common/time_int.h"

/* End of every chunk list; "no place" for arena_class_bind(). */
#define ARENA_NONE UINT32_MAX
/* class_of[] entry of a slot size whose class holds no chunk. */
#define ARENA_NO_PLACE UINT8_MAX
/* Every class place free: one bit per place. */
#define ARENA_PLACES_ALL (UINT64_MAX >> (64 - KVD_ARENA_CLASSES_MAX))

/* Prefault progress is logged for arenas at least this large. */
#define ARENA_PREFAULT_LOG_BYTES (1ull << 30)

_Static_assert(KVD_ARENA_CLASSES_MAX >= 1 && KVD_ARENA_CLASSES_MAX <= 64 &&
                   KVD_ARENA_CLASSES_MAX < ARENA_NO_PLACE,
               "class places are bits of a uint64_t and fit a uint8_t");

typedef struct arena_chunk {
    uint32_t slot_pages; /* 0 when free; atomic (read lock-free) */
    uint32_t part;       /* its partition; fixed at create */
    uint32_t place;      /* its class's place in classes[] while carved */
    uint32_t used;       /* allocated slots */
    uint32_t bump;       /* slots [bump, slots_per_chunk) never handed out */
    uint32_t free_head;  /* first freed slot index, links[] chained */
    uint32_t prev;       /* class partial list (prev/next) or pool (next) */
    uint32_t next;
} arena_chunk_t;

/* A class place; slot_bytes 0 while the place is free. */
typedef struct arena_class {
    uint64_t slot_bytes;
    uint32_t slots_per_chunk;
    /* Per partition: chunks of this class with a free slot. */
    uint32_t partial_head[KVD_ARENA_PARTS_MAX + 1];
    uint32_t chunks;
    uint64_t slots_used;
    uint64_t slots_free;
} arena_class_t;

/* A partition: one memfd mapped at chunk first_chunk of the region. */
typedef struct arena_part {
    int fd;
    uint32_t first_chunk;
    uint32_t num_chunks;
    uint64_t map_bytes;
    uint32_t free_head; /* its free-chunk pool (guarded by the lock) */
    uint32_t chunks_free;
} arena_part_t;

struct kvd_arena {
    uint8_t *base;
    uint64_t size_bytes;
    uint64_t map_bytes;
    uint64_t page_bytes; /* backing page: 4096 or the huge page size */
    uint64_t chunk_bytes;
    uint32_t num_chunks;
    uint32_t index_bits;      /* slot id = chunk << index_bits | index */
    uint32_t slots_max_chunk; /* chunk_bytes / 4096: link/bitmap stride */
    kvd_arena_backing_t backing;
    uint32_t num_parts; /* the main partition included */
    arena_part_t parts[KVD_ARENA_PARTS_MAX + 1]; /* fd and layout fixed at
                                                    create; pools locked */

    pthread_mutex_t lock; /* guards everything below and the pools */
    uint32_t chunks_free;
    uint32_t num_classes;    /* places bound to a size */
    uint64_t places_free;    /* bit i: classes[i] is free */
    uint64_t places_refused; /* allocations refused for want of a place */
    uint64_t bytes_used;
    arena_class_t classes[KVD_ARENA_CLASSES_MAX];
    uint8_t *class_of; /* per class id (slot pages): its place or NO_PLACE */
    arena_chunk_t *chunks;
    uint32_t *links;     /* next free index, per possible slot */
    uint64_t *allocated; /* one bit per possible slot */
};

struct kvd_arena_mapping {
    uint8_t *base;
    uint64_t map_bytes;
    uint64_t size_bytes;
    uint64_t offset; /* arena offset of base */
};

/* ------------------------------------------------------------------------ */
/* Configuration                                                            */
/* ------------------------------------------------------------------------ */

static const char *const arena_hugepage_choices[] = {"auto", "on", "off", NULL};

static const kvd_config_field_t arena_config_fields[] = {
    {"store.arena_size", "8g", "host arena (L1) size, rounded down to chunks",
     kvd_config_parse_size, offsetof(kvd_arena_config_t, size_bytes),
     KVD_ARENA_SLOT_ALIGN, 0, NULL},
    {"store.arena_chunk", "64m", "arena slab page; the largest storable object",
     kvd_config_parse_size, offsetof(kvd_arena_config_t, chunk_bytes),
     KVD_ARENA_SLOT_ALIGN, (int64_t)KVD_ARENA_CHUNK_BYTES_MAX, NULL},
    {"store.arena_hugepages", "auto",
     "huge pages for the arena: auto (the hugetlb pool if it holds the "
     "arena, else transparent huge pages) | on (the pool) | off",
     kvd_config_parse_enum, offsetof(kvd_arena_config_t, hugepages), 0, 0,
     arena_hugepage_choices},
    {"store.arena_prefault", "true", "touch every arena page at start",
     kvd_config_parse_bool, offsetof(kvd_arena_config_t, prefault), 0, 0, NULL},
};

const kvd_config_field_t *kvd_arena_config_table(size_t *num_fields_out)
{
    *num_fields_out =
        sizeof(arena_config_fields) / sizeof(arena_config_fields[0]);
    return arena_config_fields;
}

kvd_arena_config_t kvd_arena_config_default(void)
{
    /* Must match the default strings of arena_config_fields; the unit test
     * checks it by applying the table to an empty configuration. */
    kvd_arena_config_t cfg = {
        .size_bytes = 8ull << 30,
        .chunk_bytes = 64ull << 20,
        .hugepages = KVD_ARENA_HUGEPAGES_AUTO,
        .prefault = true,
    };
    return cfg;
}

/* ------------------------------------------------------------------------ */
/* The region                                                               */
/* ------------------------------------------------------------------------ */

static const char *arena_backing_name(kvd_arena_backing_t backing)
{
    switch (backing) {
    case KVD_ARENA_BACKING_PLAIN: return "4k pages";
    case KVD_ARENA_BACKING_THP: return "transparent huge pages";
    case KVD_ARENA_BACKING_HUGETLB: return "hugetlb";
    }
    return "?";
}

static uint64_t arena_round_up(uint64_t value, uint64_t align)
{
    return (value + align - 1) / align * align;
}

/*
 * Creates, sizes, seals and maps one memfd. `hugetlb` selects MFD_HUGETLB,
 * whose page size (st_blksize) the length is rounded to. `quiet` logs
 * failures at INFO (auto mode will try the next backing) instead of ERROR.
 */
static kvd_status_t arena_map_memfd(bool hugetlb, bool quiet, uint64_t size,
                                    uint8_t *fixed, int *fd_out,
                                    uint64_t *map_bytes_out,
                                    uint64_t *page_bytes_out,
                                    uint8_t **base_out)
{
    kvd_log_level_t level = quiet ? KVD_LOG_LEVEL_INFO : KVD_LOG_LEVEL_ERROR;
    const char *what = hugetlb ? "hugetlb" : "shared";
    unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
    if (hugetlb) {
        flags |= MFD_HUGETLB;
    }
    int err = KVD_FAILPOINT("arena.memfd");
    int fd = err != 0 ? -1 : memfd_create("kvdepot-arena", flags);
    if (fd < 0) {
        err = err != 0 ? err : errno;
        KVD_LOG(level, "arena: memfd_create (%s) failed: %s", what,
                strerror(err));
        /* EINVAL for MFD_HUGETLB: this kernel has no hugetlbfs. */
        if (hugetlb && err == EINVAL) {
            return KVD_ERR_UNSUPPORTED;
        }
        return kvd_status_from_errno(err);
    }

    uint64_t map_bytes = size;
    uint64_t page_bytes = KVD_ARENA_SLOT_ALIGN;
    if (hugetlb) {
        struct stat st;
        if (fstat(fd, &st) != 0) {
            err = errno;
            KVD_LOG(level, "arena: fstat of hugetlb memfd failed: %s",
                    strerror(err));
            goto err_close;
        }
        if (st.st_blksize > 0) {
            page_bytes = (uint64_t)st.st_blksize;
            map_bytes = arena_round_up(size, page_bytes);
        }
    }
    if (fixed != NULL && map_bytes != size) {
        /* A partition mapped in place must end where the next begins. */
        KVD_LOG(level,
                "arena: %" PRIu64 "-byte pages do not divide a %" PRIu64
                "-byte partition",
                page_bytes, size);
        close(fd);
        return KVD_ERR_UNSUPPORTED;
    }

    err = KVD_FAILPOINT("arena.ftruncate");
    if (err != 0 || ftruncate(fd, (off_t)map_bytes) != 0) {
        err = err != 0 ? err : errno;
        KVD_LOG(level, "arena: ftruncate (%s) to %" PRIu64 " bytes failed: %s",
                what, map_bytes, strerror(err));
        goto err_close;
    }

    /* Sharing processes must not be able to shrink the file under each
     * other's mappings (SIGBUS) or grow it (the layout is fixed). */
    err = KVD_FAILPOINT("arena.seal");
    if (err != 0 || fcntl(fd, F_ADD_SEALS,
                          F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        err = err != 0 ? err : errno;
        KVD_LOG(level, "arena: sealing the %s memfd failed: %s", what,
                strerror(err));
        goto err_close;
    }

    /* For hugetlb this mmap reserves the pages, so a short pool fails here
     * rather than with SIGBUS on first touch. */
    err = KVD_FAILPOINT("arena.mmap");
    void *base =
        err != 0 ? MAP_FAILED
                 : mmap(fixed, map_bytes, PROT_READ | PROT_WRITE,
                        MAP_SHARED | (fixed != NULL ? MAP_FIXED : 0), fd, 0);
    if (base == MAP_FAILED) {
        err = err != 0 ? err : errno;
        KVD_LOG(level, "arena: mmap (%s) of %" PRIu64 " bytes failed: %s", what,
                map_bytes, strerror(err));
        goto err_close;
    }

    *fd_out = fd;
    *map_bytes_out = map_bytes;
    *page_bytes_out = page_bytes;
    *base_out = base;
    return KVD_OK;

err_close:
    close(fd);
    return kvd_status_from_errno(err);
}

/* Whether MADV_HUGEPAGE on shared memory has an effect: the sysfs knob
 * shows the active choice in brackets. */
static bool arena_shmem_thp_possible(void)
{
    char buf[256];
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
    if (f == NULL) {
        return false;
    }
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, "[never]") == NULL && strstr(buf, "[deny]") == NULL;
}

/* Closes every partition's memfd and unmaps the region. */
static void arena_unmap_all(kvd_arena_t *arena)
{
    if (arena->base != NULL) {
        munmap(arena->base, arena->map_bytes);
        arena->base = NULL;
    }
    for (uint32_t p = 0; p < arena->num_parts; p++) {
        if (arena->parts[p].fd >= 0) {
            close(arena->parts[p].fd);
            arena->parts[p].fd = -1;
        }
    }
}

/*
 * Maps every partition at its place in one reserved range aligned to 2 MiB
 * (PROT_NONE first, then each memfd MAP_FIXED over its share), so offsets
 * stay one contiguous range in this process and every 2 MiB of it can be
 * one huge page: the kernel aligns a shared-memory mapping by itself only
 * where the host's shmem THP setting allows huge pages on faults. One
 * hugetlb partition is one mapping, which the kernel aligns to its page
 * size (1 GiB pages included).
 */
static kvd_status_t arena_map_all(kvd_arena_t *arena, bool hugetlb, bool quiet)
{
    if (arena->num_parts == 1 && hugetlb) {
        arena_part_t *p = &arena->parts[0];
        kvd_status_t status = arena_map_memfd(hugetlb, quiet, arena->size_bytes,
                                              NULL, &p->fd, &arena->map_bytes,
                                              &arena->page_bytes, &arena->base);
        p->map_bytes = arena->map_bytes;
        return status;
    }
    /* Aligned for 2 MiB huge pages; larger ones fail the fixed mapping
     * (EINVAL) and auto mode falls back. */
    const uint64_t align = 2ull << 20;
    int err = KVD_FAILPOINT("arena.mmap");
    void *r = err != 0
                  ? MAP_FAILED
                  : mmap(NULL, arena->size_bytes + align, PROT_NONE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) {
        err = err != 0 ? err : errno;
        KVD_LOG_ERROR("arena: reserving %" PRIu64 " bytes for %u partitions "
                      "failed: %s",
                      arena->size_bytes, arena->num_parts, strerror(err));
        return kvd_status_from_errno(err);
    }
    uintptr_t start = (uintptr_t)r;
    uintptr_t aligned = (start + align - 1) & ~(uintptr_t)(align - 1);
    if (aligned > start) {
        munmap(r, aligned - start);
    }
    uintptr_t end = aligned + arena->size_bytes;
    if (start + arena->size_bytes + align > end) {
        munmap((void *)end, start + arena->size_bytes + align - end);
    }
    arena->base = (uint8_t *)aligned;
    arena->map_bytes = arena->size_bytes;
    for (uint32_t i = 0; i < arena->num_parts; i++) {
        arena_part_t *p = &arena->parts[i];
        uint64_t bytes = (uint64_t)p->num_chunks * arena->chunk_bytes;
        uint8_t *at =
            arena->base + (uint64_t)p->first_chunk * arena->chunk_bytes;
        uint8_t *got = NULL;
        kvd_status_t status =
            arena_map_memfd(hugetlb, quiet, bytes, at, &p->fd, &p->map_bytes,
                            &arena->page_bytes, &got);
        if (status != KVD_OK) {
            arena_unmap_all(arena);
            return status;
        }
    }
    return KVD_OK;
}

static kvd_status_t arena_map_region(kvd_arena_t *arena, int mode)
{
    kvd_status_t status;
    if (mode != KVD_ARENA_HUGEPAGES_OFF) {
        status = arena_map_all(arena, true, mode == KVD_ARENA_HUGEPAGES_AUTO);
        if (status == KVD_OK) {
            arena->backing = KVD_ARENA_BACKING_HUGETLB;
            return KVD_OK;
        }
        if (mode == KVD_ARENA_HUGEPAGES_ON) {
            KVD_LOG_ERROR("arena: store.arena_hugepages=on but no hugetlb "
                          "region of %" PRIu64 " bytes (vm.nr_hugepages?)",
                          arena->size_bytes);
            return status;
        }
    }

    status = arena_map_all(arena, false, false);
    if (status != KVD_OK) {
        return status;
    }
    arena->backing = KVD_ARENA_BACKING_PLAIN;
    if (mode == KVD_ARENA_HUGEPAGES_AUTO && arena_shmem_thp_possible() &&
        madvise(arena->base, arena->map_bytes, MADV_HUGEPAGE) == 0) {
        arena->backing = KVD_ARENA_BACKING_THP;
    }
    return KVD_OK;
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1 */
#endif

/*
 * Puts a shared-memory arena on 2 MiB pages where the host's shmem THP
 * setting does not allow them on faults ("never", the kernel's default):
 * MADV_COLLAPSE builds a huge page for a range on request whatever that
 * setting says ("deny" still refuses), and copying arena objects in and
 * out of memory mapped with 2 MiB pages is cheaper (docs/cluster.md). The
 * first byte of each 2 MiB extent is written first (a collapse wants a page
 * present; the region is fresh, so writing zero changes nothing); one
 * extent per call, which is several times quicker than one call for the
 * region (0.14 s per GiB on a 2-vCPU VM whose host has backed the memory;
 * the first time it backs it, about 2.4 s per GiB).
 * Stops at the first refusal (a kernel before 6.1, no free huge page,
 * extents not 2 MiB aligned): true when every extent is on a huge page.
 */
static bool arena_collapse(kvd_arena_t *arena)
{
    const uint64_t huge = 2ull << 20;
    uint64_t len = arena->map_bytes;
    uint64_t start_ns = kvd_time_now_ns();
    if (((uintptr_t)arena->base & (huge - 1)) != 0 || len % huge != 0) {
        return false;
    }
    /* Large arenas log progress every tenth, as the prefault does. */
    uint64_t tenth = len >= ARENA_PREFAULT_LOG_BYTES
                         ? arena_round_up(len / 10, huge)
                         : UINT64_MAX;
    uint64_t off = 0;
    int err = 0;
    for (; off < len; off += huge) {
        ((volatile uint8_t *)arena->base)[off] = 0;
        err = KVD_FAILPOINT("arena.collapse");
        if (err == 0 && madvise(arena->base + off, huge, MADV_COLLAPSE) != 0) {
            err = errno;
        }
        if (err != 0) {
            break;
        }
        if ((off + huge) % tenth == 0) {
            KVD_LOG_INFO("arena: huge pages %" PRIu64 "%% (%" PRIu64
                         " of %" PRIu64 " MiB)",
                         (off + huge) * 100 / len, (off + huge) >> 20,
                         len >> 20);
        }
    }
    if (off < len) {
        KVD_LOG_INFO("arena: 4 KiB pages after %" PRIu64 " of %" PRIu64
                     " MiB on huge pages (MADV_COLLAPSE: %s)",
                     off >> 20, len >> 20, strerror(err));
        return false;
    }
    KVD_LOG_INFO(
        "arena: %" PRIu64 " MiB on huge pages by MADV_COLLAPSE in %" PRIu64
        " ms",
        len >> 20,
        (uint64_t)((kvd_time_now_ns() - start_ns) / KVD_NSEC_PER_MSEC));
    return true;
}

/*
 * Populates every page, in steps of about a tenth so that large arenas log
 * progress. MADV_POPULATE_WRITE (Linux 5.14) allocates and maps in one
 * call and reports a shortage as an error; older kernels answer EINVAL and
 * get one write per page instead (the region is fresh, so writing zero
 * changes nothing).
 */
static kvd_status_t arena_prefault(kvd_arena_t *arena)
{
    uint64_t len = arena->map_bytes;
    bool verbose = len >= ARENA_PREFAULT_LOG_BYTES;
    /* Steps are whole backing pages: madvise on hugetlb wants them. */
    uint64_t step = verbose ? arena_round_up(len / 10, arena->page_bytes) : len;
    uint64_t start_ns = kvd_time_now_ns();
    bool populate = true;

    for (uint64_t off = 0; off < len; off += step) {
        uint64_t n = len - off < step ? len - off : step;
        int err = KVD_FAILPOINT("arena.prefault");
        if (err == 0 && populate &&
            madvise(arena->base + off, n, MADV_POPULATE_WRITE) != 0) {
            err = errno;
            if (err == EINVAL) {
                populate = false;
                err = 0;
            }
        }
        if (err != 0) {
            KVD_LOG_ERROR("arena: prefault at offset %" PRIu64 " of %" PRIu64
                          " failed: %s",
                          off, len, strerror(err));
            return kvd_status_from_errno(err);
        }
        if (!populate) {
            for (uint64_t p = 0; p < n; p += KVD_ARENA_SLOT_ALIGN) {
                ((volatile uint8_t *)arena->base)[off + p] = 0;
            }
        }
        if (verbose) {
            KVD_LOG_INFO("arena: prefault %" PRIu64 "%% (%" PRIu64
                         " of %" PRIu64 " MiB)",
                         (off + n) * 100 / len, (off + n) >> 20, len >> 20);
        }
    }
    KVD_LOG_INFO(
        "arena: prefaulted %" PRIu64 " MiB in %" PRIu64 " ms", len >> 20,
        (uint64_t)((kvd_time_now_ns() - start_ns) / KVD_NSEC_PER_MSEC));
    return KVD_OK;
}

/* ------------------------------------------------------------------------ */
/* Create / destroy                                                         */
/* ------------------------------------------------------------------------ */

static kvd_status_t arena_check_config(const kvd_arena_config_t *cfg)
{
    if (cfg->chunk_bytes == 0 || cfg->chunk_bytes % KVD_ARENA_SLOT_ALIGN != 0) {
        KVD_LOG_ERROR("arena: chunk size %" PRIu64
                      " is not a positive multiple of %u",
                      cfg->chunk_bytes, KVD_ARENA_SLOT_ALIGN);
        return KVD_ERR_INVALID;
    }
    if (cfg->hugepages < KVD_ARENA_HUGEPAGES_AUTO ||
        cfg->hugepages > KVD_ARENA_HUGEPAGES_OFF) {
        KVD_LOG_ERROR("arena: hugepages mode %d unknown", cfg->hugepages);
        return KVD_ERR_INVALID;
    }
    if (cfg->chunk_bytes > KVD_ARENA_CHUNK_BYTES_MAX ||
        cfg->size_bytes < cfg->chunk_bytes) {
        KVD_LOG_ERROR("arena: size %" PRIu64 " / chunk %" PRIu64
                      " out of range (chunk <= 1 GiB, size >= chunk)",
                      cfg->size_bytes, cfg->chunk_bytes);
        return KVD_ERR_RANGE;
    }
    if (cfg->num_parts > KVD_ARENA_PARTS_MAX) {
        KVD_LOG_ERROR("arena: %u partitions; at most %u besides the main one",
                      cfg->num_parts, KVD_ARENA_PARTS_MAX);
        return KVD_ERR_RANGE;
    }
    for (uint32_t i = 0; i < cfg->num_parts; i++) {
        if (cfg->part_bytes[i] < cfg->chunk_bytes) {
            KVD_LOG_ERROR("arena: partition %u of %" PRIu64
                          " bytes is smaller than a chunk (%" PRIu64 ")",
                          i + 1, cfg->part_bytes[i], cfg->chunk_bytes);
            return KVD_ERR_RANGE;
        }
    }
    return KVD_OK;
}

/* Sets the slot-id geometry; KVD_ERR_RANGE when the ids would not fit. */
static kvd_status_t arena_set_geometry(kvd_arena_t *arena,
                                       const kvd_arena_config_t *cfg)
{
    uint64_t num_chunks = cfg->size_bytes / cfg->chunk_bytes;
    arena->num_parts = 1 + cfg->num_parts;
    arena->parts[0] =
        (arena_part_t){.fd = -1, .num_chunks = (uint32_t)num_chunks};
    for (uint32_t i = 0; i < cfg->num_parts; i++) {
        uint64_t n = cfg->part_bytes[i] / cfg->chunk_bytes;
        if (n * cfg->chunk_bytes != cfg->part_bytes[i]) {
            KVD_LOG_INFO("arena: partition %u of %" PRIu64
                         " bytes rounded down to %" PRIu64
                         " (whole chunks of %" PRIu64 ")",
                         i + 1, cfg->part_bytes[i], n * cfg->chunk_bytes,
                         cfg->chunk_bytes);
        }
        if (num_chunks + n >= UINT32_MAX) {
            KVD_LOG_ERROR("arena: too many chunks of %" PRIu64 " bytes",
                          cfg->chunk_bytes);
            return KVD_ERR_RANGE;
        }
        arena->parts[i + 1] =
            (arena_part_t){.fd = -1,
                           .first_chunk = (uint32_t)num_chunks,
                           .num_chunks = (uint32_t)n};
        num_chunks += n;
    }
    arena->chunk_bytes = cfg->chunk_bytes;
    arena->slots_max_chunk =
        (uint32_t)(cfg->chunk_bytes / KVD_ARENA_SLOT_ALIGN);
    arena->index_bits = 0;
    while ((1ull << arena->index_bits) < arena->slots_max_chunk) {
        arena->index_bits++;
    }
    /* Strictly below, so that UINT32_MAX is never a valid slot id. */
    if (num_chunks >= (1ull << (32 - arena->index_bits))) {
        KVD_LOG_ERROR("arena: %" PRIu64 " chunks of %" PRIu64
                      " bytes exceed 32-bit slot ids; use larger chunks",
                      num_chunks, cfg->chunk_bytes);
        return KVD_ERR_RANGE;
    }
    arena->num_chunks = (uint32_t)num_chunks;
    arena->size_bytes = num_chunks * cfg->chunk_bytes;
    if (arena->parts[0].num_chunks * cfg->chunk_bytes != cfg->size_bytes) {
        KVD_LOG_INFO("arena: size %" PRIu64 " rounded down to %" PRIu64
                     " (whole chunks of %" PRIu64 ")",
                     cfg->size_bytes, arena->size_bytes, cfg->chunk_bytes);
    }
    return KVD_OK;
}

static kvd_status_t arena_alloc_metadata(kvd_arena_t *arena)
{
    uint64_t slots = (uint64_t)arena->num_chunks * arena->slots_max_chunk;
    if (KVD_FAILPOINT("arena.alloc") != 0) {
        return KVD_ERR_NOMEM;
    }
    /* links[] is only read where written (free lists), so no zeroing. */
    arena->chunks = malloc(arena->num_chunks * sizeof(*arena->chunks));
    arena->links = malloc(slots * sizeof(*arena->links));
    arena->allocated = calloc((slots + 63) / 64, sizeof(uint64_t));
    /* Class ids run from 1 to slots_max_chunk. */
    arena->class_of = malloc((size_t)arena->slots_max_chunk + 1);
    if (arena->chunks == NULL || arena->links == NULL ||
        arena->allocated == NULL || arena->class_of == NULL) {
        free(arena->chunks);
        free(arena->links);
        free(arena->allocated);
        free(arena->class_of);
        return KVD_ERR_NOMEM;
    }
    memset(arena->class_of, ARENA_NO_PLACE, (size_t)arena->slots_max_chunk + 1);
    arena->places_free = ARENA_PLACES_ALL;
    /* Pools in address order, so a fresh partition fills from its base. */
    for (uint32_t p = 0; p < arena->num_parts; p++) {
        arena_part_t *part = &arena->parts[p];
        uint32_t end = part->first_chunk + part->num_chunks;
        for (uint32_t c = part->first_chunk; c < end; c++) {
            arena->chunks[c] = (arena_chunk_t){
                .part = p,
                .place = ARENA_NONE,
                .free_head = ARENA_NONE,
                .prev = ARENA_NONE,
                .next = c + 1 < end ? c + 1 : ARENA_NONE,
            };
        }
        part->free_head = part->first_chunk;
        part->chunks_free = part->num_chunks;
    }
    for (uint32_t place = 0; place < KVD_ARENA_CLASSES_MAX; place++) {
        for (uint32_t p = 0; p <= KVD_ARENA_PARTS_MAX; p++) {
            arena->classes[place].partial_head[p] = ARENA_NONE;
        }
    }
    arena->chunks_free = arena->num_chunks;
    return KVD_OK;
}

kvd_status_t kvd_arena_create(const kvd_arena_config_t *cfg,
                              kvd_arena_t **arena_out)
{
    if (cfg == NULL || arena_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t status = arena_check_config(cfg);
    if (status != KVD_OK) {
        return status;
    }
    int inject = KVD_FAILPOINT("arena.alloc");
    kvd_arena_t *arena = inject != 0 ? NULL : calloc(1, sizeof(*arena));
    if (arena == NULL) {
        return KVD_ERR_NOMEM;
    }
    status = arena_set_geometry(arena, cfg);
    if (status != KVD_OK) {
        goto err_free;
    }
    status = arena_alloc_metadata(arena);
    if (status != KVD_OK) {
        KVD_LOG_ERROR("arena: no memory for metadata of %u chunks",
                      arena->num_chunks);
        goto err_free;
    }
    int rc = pthread_mutex_init(&arena->lock, NULL);
    if (rc != 0) {
        status = kvd_status_from_errno(rc);
        goto err_metadata;
    }
    status = arena_map_region(arena, cfg->hugepages);
    if (status != KVD_OK) {
        goto err_mutex;
    }
    /* auto without huge pages from the pool or on faults: built now, as
     * prefault allocates every page anyway. */
    if (cfg->prefault && cfg->hugepages == KVD_ARENA_HUGEPAGES_AUTO &&
        arena->backing == KVD_ARENA_BACKING_PLAIN && arena_collapse(arena)) {
        arena->backing = KVD_ARENA_BACKING_THP;
    }
    if (cfg->prefault) {
        status = arena_prefault(arena);
        if (status != KVD_OK) {
            goto err_unmap;
        }
    }
    KVD_LOG_INFO(
        "arena: %" PRIu64 " MiB, %u chunks of %" PRIu64
        " KiB, %u partition%s, %s, prefault %s",
        arena->size_bytes >> 20, arena->num_chunks, arena->chunk_bytes >> 10,
        arena->num_parts, arena->num_parts == 1 ? "" : "s",
        arena_backing_name(arena->backing), cfg->prefault ? "on" : "off");
    *arena_out = arena;
    return KVD_OK;

err_unmap:
    arena_unmap_all(arena);
err_mutex:
    pthread_mutex_destroy(&arena->lock);
err_metadata:
    free(arena->chunks);
    free(arena->links);
    free(arena->allocated);
    free(arena->class_of);
err_free:
    free(arena);
    return status;
}

void kvd_arena_destroy(kvd_arena_t *arena)
{
    if (arena == NULL) {
        return;
    }
    arena_unmap_all(arena);
    pthread_mutex_destroy(&arena->lock);
    free(arena->chunks);
    free(arena->links);
    free(arena->allocated);
    free(arena->class_of);
    free(arena);
}

kvd_status_t kvd_arena_query(const kvd_arena_t *arena,
                             kvd_arena_info_t *info_out)
{
    if (arena == NULL || info_out == NULL) {
        return KVD_ERR_INVALID;
    }
    *info_out = (kvd_arena_info_t){
        .base = arena->base,
        .size_bytes = arena->size_bytes,
        .map_bytes = arena->map_bytes,
        .chunk_bytes = arena->chunk_bytes,
        .num_chunks = arena->num_chunks,
        .backing = arena->backing,
        .num_parts = arena->num_parts,
    };
    return KVD_OK;
}

/* ------------------------------------------------------------------------ */
/* Slab classes and slots                                                   */
/* ------------------------------------------------------------------------ */

kvd_status_t kvd_arena_class_register(kvd_arena_t *arena, uint64_t object_bytes,
                                      uint32_t *class_out)
{
    if (arena == NULL || class_out == NULL || object_bytes == 0) {
        return KVD_ERR_INVALID;
    }
    if (object_bytes > arena->chunk_bytes) {
        KVD_LOG_ERROR("arena: object of %" PRIu64
                      " bytes is larger than a chunk (%" PRIu64 ")",
                      object_bytes, arena->chunk_bytes);
        return KVD_ERR_RANGE;
    }
    /* At most chunk_bytes / 4096 <= 2^18: fits, and never CLASS_INVALID. */
    *class_out = (uint32_t)(arena_round_up(object_bytes, KVD_ARENA_SLOT_ALIGN) /
                            KVD_ARENA_SLOT_ALIGN);
    return KVD_OK;
}

/*
 * Binds a free place to the class of `class_id` (slot pages); ARENA_NONE
 * when every place is bound. The caller holds the lock and carves the
 * class's first chunk right after, so a bound place always holds a chunk.
 */
static uint32_t arena_class_bind(kvd_arena_t *arena, uint32_t class_id)
{
    if (arena->places_free == 0) {
        return ARENA_NONE;
    }
    uint32_t place = (uint32_t)__builtin_ctzll(arena->places_free);
    uint64_t slot_bytes = (uint64_t)class_id * KVD_ARENA_SLOT_ALIGN;
    arena->places_free &= ~(1ull << place);
    arena->classes[place] = (arena_class_t){
        .slot_bytes = slot_bytes,
        .slots_per_chunk = (uint32_t)(arena->chunk_bytes / slot_bytes),
    };
    for (uint32_t p = 0; p <= KVD_ARENA_PARTS_MAX; p++) {
        arena->classes[place].partial_head[p] = ARENA_NONE;
    }
    arena->class_of[class_id] = (uint8_t)place;
    arena->num_classes++;
    KVD_LOG_DEBUG("arena: class %u (%" PRIu64 "-byte slots, %u per chunk) "
                  "takes place %u",
                  class_id, slot_bytes, arena->classes[place].slots_per_chunk,
                  place);
    return place;
}

/* Frees the place of a class whose last chunk went back to the pool; the
 * caller holds the lock. */
static void arena_class_unbind(kvd_arena_t *arena, uint32_t place)
{
    arena_class_t *cls = &arena->classes[place];
    assert(cls->chunks == 0 && cls->slots_used == 0 && cls->slots_free == 0);
    uint32_t class_id = (uint32_t)(cls->slot_bytes / KVD_ARENA_SLOT_ALIGN);
    arena->class_of[class_id] = ARENA_NO_PLACE;
    *cls = (arena_class_t){0};
    for (uint32_t p = 0; p <= KVD_ARENA_PARTS_MAX; p++) {
        cls->partial_head[p] = ARENA_NONE;
    }
    arena->places_free |= 1ull << place;
    arena->num_classes--;
    KVD_LOG_DEBUG("arena: class %u holds no chunk; place %u is free", class_id,
                  place);
}

static uint64_t arena_slot_bit(const kvd_arena_t *arena, uint32_t chunk,
                               uint32_t index)
{
    return (uint64_t)chunk * arena->slots_max_chunk + index;
}

/* Partial-list operations; the caller holds the lock. */
static void arena_partial_push(kvd_arena_t *arena, arena_class_t *cls,
                               uint32_t c)
{
    arena_chunk_t *ch = &arena->chunks[c];
    uint32_t *head = &cls->partial_head[ch->part];
    ch->prev = ARENA_NONE;
    ch->next = *head;
    if (*head != ARENA_NONE) {
        arena->chunks[*head].prev = c;
    }
    *head = c;
}

static void arena_partial_remove(kvd_arena_t *arena, arena_class_t *cls,
                                 uint32_t c)
{
    arena_chunk_t *ch = &arena->chunks[c];
    if (ch->prev != ARENA_NONE) {
        arena->chunks[ch->prev].next = ch->next;
    } else {
        cls->partial_head[ch->part] = ch->next;
    }
    if (ch->next != ARENA_NONE) {
        arena->chunks[ch->next].prev = ch->prev;
    }
    ch->prev = ch->next = ARENA_NONE;
}

/* Takes a chunk from partition `part`'s pool for the class at `place`;
 * ARENA_NONE if none. */
static uint32_t arena_chunk_carve(kvd_arena_t *arena, uint32_t part,
                                  uint32_t place)
{
    arena_part_t *pt = &arena->parts[part];
    uint32_t c = pt->free_head;
    if (c == ARENA_NONE) {
        return ARENA_NONE;
    }
    arena_chunk_t *ch = &arena->chunks[c];
    arena_class_t *cls = &arena->classes[place];
    pt->free_head = ch->next;
    pt->chunks_free--;
    arena->chunks_free--;
    ch->place = place;
    ch->used = 0;
    ch->bump = 0;
    ch->free_head = ARENA_NONE;
    __atomic_store_n(&ch->slot_pages,
                     (uint32_t)(cls->slot_bytes / KVD_ARENA_SLOT_ALIGN),
                     __ATOMIC_RELEASE);
    cls->chunks++;
    cls->slots_free += cls->slots_per_chunk;
    arena_partial_push(arena, cls, c);
    return c;
}

/* Returns an empty chunk (off its class's partial list) to the pool, and
 * the class's place with it when that was the class's last chunk. */
static void arena_chunk_release(kvd_arena_t *arena, uint32_t c)
{
    arena_chunk_t *ch = &arena->chunks[c];
    uint32_t place = ch->place;
    arena_class_t *cls = &arena->classes[place];
    __atomic_store_n(&ch->slot_pages, 0, __ATOMIC_RELEASE);
    ch->place = ARENA_NONE;
    cls->chunks--;
    cls->slots_free -= cls->slots_per_chunk;
    arena_part_t *pt = &arena->parts[ch->part];
    ch->prev = ARENA_NONE;
    ch->next = pt->free_head;
    pt->free_head = c;
    pt->chunks_free++;
    arena->chunks_free++;
    if (cls->chunks == 0) {
        arena_class_unbind(arena, place);
    }
}

kvd_status_t kvd_arena_slot_alloc(kvd_arena_t *arena, uint32_t class_id,
                                  uint32_t *slot_out)
{
    return kvd_arena_slot_alloc_in(arena, 0, class_id, slot_out);
}

kvd_status_t kvd_arena_slot_alloc_in(kvd_arena_t *arena, uint32_t part,
                                     uint32_t class_id, uint32_t *slot_out)
{
    if (arena == NULL || slot_out == NULL || part >= arena->num_parts) {
        return KVD_ERR_INVALID;
    }
    if (class_id == 0 || class_id > arena->slots_max_chunk) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t status = KVD_OK;
    pthread_mutex_lock(&arena->lock);
    uint32_t place = arena->class_of[class_id];
    if (place == ARENA_NO_PLACE) {
        /* Bind only with a chunk to carve, so that a bound place always
         * holds one and is handed back by the free of its last slot. */
        if (arena->parts[part].free_head == ARENA_NONE) {
            status = KVD_ERR_NOSPACE;
            goto out;
        }
        place = arena_class_bind(arena, class_id);
        if (place == ARENA_NONE) {
            /* A client may choose many sizes: rate-limited, and counted. */
            arena->places_refused++;
            KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                                "arena: %u sizes hold chunks; %" PRIu64
                                "-byte slots wait for one to drain",
                                arena->num_classes,
                                (uint64_t)class_id * KVD_ARENA_SLOT_ALIGN);
            status = KVD_ERR_NOSPACE;
            goto out;
        }
    }
    arena_class_t *cls = &arena->classes[place];
    uint32_t c = cls->partial_head[part];
    if (c == ARENA_NONE) {
        c = arena_chunk_carve(arena, part, place);
        if (c == ARENA_NONE) {
            status = KVD_ERR_NOSPACE;
            goto out;
        }
    }
    arena_chunk_t *ch = &arena->chunks[c];
    uint32_t index;
    if (ch->free_head != ARENA_NONE) {
        index = ch->free_head;
        ch->free_head = arena->links[arena_slot_bit(arena, c, index)];
    } else {
        index = ch->bump++;
    }
    if (++ch->used == cls->slots_per_chunk) {
        arena_partial_remove(arena, cls, c);
    }
    cls->slots_used++;
    cls->slots_free--;
    arena->bytes_used += cls->slot_bytes;
    uint64_t bit = arena_slot_bit(arena, c, index);
    arena->allocated[bit / 64] |= 1ull << (bit % 64);
    *slot_out = c << arena->index_bits | index;
out:
    pthread_mutex_unlock(&arena->lock);
    return status;
}

kvd_status_t kvd_arena_slot_free(kvd_arena_t *arena, uint32_t slot)
{
    if (arena == NULL) {
        return KVD_ERR_INVALID;
    }
    uint32_t c = slot >> arena->index_bits;
    uint32_t index = slot & ((1u << arena->index_bits) - 1);
    if (c >= arena->num_chunks || index >= arena->slots_max_chunk) {
        KVD_LOG_ERROR("arena: free of slot %" PRIu32 " outside the arena",
                      slot);
        return KVD_ERR_INVALID;
    }
    uint64_t bit = arena_slot_bit(arena, c, index);
    pthread_mutex_lock(&arena->lock);
    arena_chunk_t *ch = &arena->chunks[c];
    if (ch->place == ARENA_NONE ||
        (arena->allocated[bit / 64] & (1ull << (bit % 64))) == 0) {
        pthread_mutex_unlock(&arena->lock);
        KVD_LOG_ERROR("arena: free of slot %" PRIu32
                      " (chunk %u index %u) that is not allocated",
                      slot, c, index);
        return KVD_ERR_INVALID;
    }
    arena_class_t *cls = &arena->classes[ch->place];
    arena->allocated[bit / 64] &= ~(1ull << (bit % 64));
    arena->links[bit] = ch->free_head;
    ch->free_head = index;
    bool was_full = ch->used == cls->slots_per_chunk;
    ch->used--;
    cls->slots_used--;
    cls->slots_free++;
    arena->bytes_used -= cls->slot_bytes;
    if (ch->used == 0) {
        /* A full chunk with one slot per chunk was never on the list. */
        if (!was_full) {
            arena_partial_remove(arena, cls, c);
        }
        arena_chunk_release(arena, c);
    } else if (was_full) {
        arena_partial_push(arena, cls, c);
    }
    pthread_mutex_unlock(&arena->lock);
    return KVD_OK;
}

uint64_t kvd_arena_slot_offset(const kvd_arena_t *arena, uint32_t slot)
{
    if (arena == NULL) {
        return UINT64_MAX;
    }
    uint32_t c = kvd_arena_slot_chunk(arena, slot);
    if (c == UINT32_MAX) {
        return UINT64_MAX;
    }
    uint32_t index = slot & ((1u << arena->index_bits) - 1);
    /* The slot size comes from the chunk, not from the class table, whose
     * places are rebound under the lock: one atomic word cannot be seen
     * half-written. A caller holding the slot is ordered after the carve
     * by the lock it allocated under; acquire pairs with carve's release
     * for one that was handed the id by another thread. */
    uint32_t pages =
        __atomic_load_n(&arena->chunks[c].slot_pages, __ATOMIC_ACQUIRE);
    uint64_t slot_bytes = (uint64_t)pages * KVD_ARENA_SLOT_ALIGN;
    if (pages == 0 || (uint64_t)(index + 1) * slot_bytes > arena->chunk_bytes) {
        return UINT64_MAX;
    }
    return (uint64_t)c * arena->chunk_bytes + (uint64_t)index * slot_bytes;
}

void *kvd_arena_slot_ptr(const kvd_arena_t *arena, uint32_t slot)
{
    uint64_t off = kvd_arena_slot_offset(arena, slot);
    return off == UINT64_MAX ? NULL : arena->base + off;
}

uint32_t kvd_arena_slot_part(const kvd_arena_t *arena, uint32_t slot)
{
    uint32_t c = kvd_arena_slot_chunk(arena, slot);
    return c == UINT32_MAX ? UINT32_MAX : arena->chunks[c].part;
}

uint32_t kvd_arena_slot_chunk(const kvd_arena_t *arena, uint32_t slot)
{
    if (arena == NULL) {
        return UINT32_MAX;
    }
    uint32_t c = slot >> arena->index_bits;
    return c < arena->num_chunks ? c : UINT32_MAX;
}

kvd_status_t kvd_arena_stats(kvd_arena_t *arena, kvd_arena_stats_t *out)
{
    if (arena == NULL || out == NULL) {
        return KVD_ERR_INVALID;
    }
    pthread_mutex_lock(&arena->lock);
    out->bytes_total = arena->size_bytes;
    out->bytes_used = arena->bytes_used;
    out->chunks_total = arena->num_chunks;
    out->chunks_free = arena->chunks_free;
    out->bytes_carved =
        (uint64_t)(arena->num_chunks - arena->chunks_free) * arena->chunk_bytes;
    out->class_places_full = arena->places_refused;
    uint32_t n = 0;
    for (uint32_t place = 0; place < KVD_ARENA_CLASSES_MAX; place++) {
        const arena_class_t *cls = &arena->classes[place];
        if (cls->slot_bytes == 0) {
            continue;
        }
        out->classes[n++] = (kvd_arena_class_stats_t){
            .class_id = (uint32_t)(cls->slot_bytes / KVD_ARENA_SLOT_ALIGN),
            .slot_bytes = cls->slot_bytes,
            .slots_per_chunk = cls->slots_per_chunk,
            .chunks = cls->chunks,
            .slots_used = cls->slots_used,
            .slots_free = cls->slots_free,
        };
    }
    out->num_classes = n;
    out->num_parts = arena->num_parts;
    for (uint32_t p = 0; p < arena->num_parts; p++) {
        const arena_part_t *pt = &arena->parts[p];
        out->parts[p] = (kvd_arena_part_stats_t){
            .offset = (uint64_t)pt->first_chunk * arena->chunk_bytes,
            .bytes_total = (uint64_t)pt->num_chunks * arena->chunk_bytes,
            .chunks_total = pt->num_chunks,
            .chunks_free = pt->chunks_free,
        };
    }
    pthread_mutex_unlock(&arena->lock);
    return KVD_OK;
}

/* ------------------------------------------------------------------------ */
/* Export and mapping in another process                                    */
/* ------------------------------------------------------------------------ */

kvd_status_t kvd_arena_export(const kvd_arena_t *arena, kvd_arena_export_t *out)
{
    return kvd_arena_export_part(arena, 0, out);
}

kvd_status_t kvd_arena_export_part(const kvd_arena_t *arena, uint32_t part,
                                   kvd_arena_export_t *out)
{
    if (arena == NULL || out == NULL || part >= arena->num_parts) {
        return KVD_ERR_INVALID;
    }
    const arena_part_t *pt = &arena->parts[part];
    int err = KVD_FAILPOINT("arena.dup");
    int fd = err != 0 ? -1 : fcntl(pt->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
        err = err != 0 ? err : errno;
        KVD_LOG_ERROR("arena: dup of the memfd for export failed: %s",
                      strerror(err));
        return kvd_status_from_errno(err);
    }
    *out = (kvd_arena_export_t){
        .fd = fd,
        .map_bytes = pt->map_bytes,
        .size_bytes = (uint64_t)pt->num_chunks * arena->chunk_bytes,
        .chunk_bytes = arena->chunk_bytes,
        .backing = arena->backing,
        .offset = (uint64_t)pt->first_chunk * arena->chunk_bytes,
    };
    return KVD_OK;
}

/* The fd must be a memfd sealed against shrinking and long enough, or the
 * mapping could fault (SIGBUS) when its owner truncates it. */
static kvd_status_t arena_check_export(const kvd_arena_export_t *exp)
{
    if (exp->fd < 0 || exp->size_bytes == 0 || exp->chunk_bytes == 0 ||
        exp->size_bytes > exp->map_bytes ||
        exp->size_bytes % exp->chunk_bytes != 0 ||
        exp->map_bytes % KVD_ARENA_SLOT_ALIGN != 0 ||
        exp->offset % KVD_ARENA_SLOT_ALIGN != 0 ||
        exp->offset > UINT64_MAX - exp->size_bytes) {
        KVD_LOG_ERROR("arena: export descriptor is inconsistent (fd %d, "
                      "size %" PRIu64 ", map %" PRIu64 ", chunk %" PRIu64 ")",
                      exp->fd, exp->size_bytes, exp->map_bytes,
                      exp->chunk_bytes);
        return KVD_ERR_INVALID;
    }
    struct stat st;
    if (fstat(exp->fd, &st) != 0) {
        int err = errno;
        KVD_LOG_ERROR("arena: fstat of exported fd %d failed: %s", exp->fd,
                      strerror(err));
        return kvd_status_from_errno(err);
    }
    int seals = fcntl(exp->fd, F_GET_SEALS);
    if ((uint64_t)st.st_size < exp->map_bytes || seals < 0 ||
        (seals & F_SEAL_SHRINK) == 0) {
        KVD_LOG_ERROR("arena: fd %d is not a sealed arena of %" PRIu64
                      " bytes (size %lld, seals %d)",
                      exp->fd, exp->map_bytes, (long long)st.st_size, seals);
        return KVD_ERR_INVALID;
    }
    return KVD_OK;
}

kvd_status_t kvd_arena_mapping_open(const kvd_arena_export_t *exp,
                                    kvd_arena_mapping_t **mapping_out)
{
    if (exp == NULL || mapping_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t status = arena_check_export(exp);
    if (status != KVD_OK) {
        return status;
    }
    int err = KVD_FAILPOINT("arena.alloc");
    kvd_arena_mapping_t *m = err != 0 ? NULL : calloc(1, sizeof(*m));
    if (m == NULL) {
        return KVD_ERR_NOMEM;
    }
    err = KVD_FAILPOINT("arena.map");
    void *base = err != 0 ? MAP_FAILED
                          : mmap(NULL, exp->map_bytes, PROT_READ | PROT_WRITE,
                                 MAP_SHARED, exp->fd, 0);
    if (base == MAP_FAILED) {
        err = err != 0 ? err : errno;
        KVD_LOG_ERROR("arena: mapping exported fd %d (%" PRIu64
                      " bytes) failed: %s",
                      exp->fd, exp->map_bytes, strerror(err));
        status = kvd_status_from_errno(err);
        goto err_free;
    }
    if (exp->backing == KVD_ARENA_BACKING_THP &&
        madvise(base, exp->map_bytes, MADV_HUGEPAGE) != 0) {
        KVD_LOG_DEBUG("arena: MADV_HUGEPAGE on the imported mapping: %s",
                      strerror(errno));
    }
    m->base = base;
    m->map_bytes = exp->map_bytes;
    m->size_bytes = exp->size_bytes;
    m->offset = exp->offset;
    *mapping_out = m;
    return KVD_OK;

err_free:
    free(m);
    return status;
}

void kvd_arena_mapping_close(kvd_arena_mapping_t *mapping)
{
    if (mapping == NULL) {
        return;
    }
    munmap(mapping->base, mapping->map_bytes);
    free(mapping);
}

void *kvd_arena_mapping_base(const kvd_arena_mapping_t *mapping)
{
    return mapping == NULL ? NULL : mapping->base;
}

uint64_t kvd_arena_mapping_size(const kvd_arena_mapping_t *mapping)
{
    return mapping == NULL ? 0 : mapping->size_bytes;
}

uint64_t kvd_arena_mapping_offset(const kvd_arena_mapping_t *mapping)
{
    return mapping == NULL ? 0 : mapping->offset;
}

void *kvd_arena_mapping_ptr(const kvd_arena_mapping_t *mapping, uint64_t offset,
                            uint64_t len)
{
    if (mapping == NULL) {
        return NULL;
    }
    uint64_t need = len == 0 ? 1 : len;
    if (offset < mapping->offset) {
        return NULL;
    }
    offset -= mapping->offset;
    if (offset >= mapping->size_bytes || need > mapping->size_bytes - offset) {
        return NULL;
    }
    return mapping->base + offset;
}
