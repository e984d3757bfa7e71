/*
 * The host arena's region (store/arena.h): one sealed memfd per partition,
 * mapped side by side in one reserved range, on hugetlb pages, transparent
 * huge pages or 4 KiB pages as store.arena_hugepages and the host allow;
 * the prefault that backs every page at start; and the export of a
 * partition's memfd to another process, which maps it read-write with
 * kvd_arena_mapping_open. Slots and classes on top of the region are
 * arena.c's.
 *
 * Sealing (no shrink, no grow) is what lets another process map the memfd
 * without risking SIGBUS: the importer checks the seals before it maps.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/failpoint_int.h"
#include "common/log_int.h"
#include "common/time_int.h"
#include "store/arena_int.h"

/* Prefault progress is logged for arenas at least this large. */
#define ARENA_PREFAULT_LOG_BYTES (1ull << 30)

struct kvd_arena_mapping {
    uint8_t *base;
    uint64_t map_bytes;
    uint64_t size_bytes;
    uint64_t offset; /* arena offset of base */
};

/* ------------------------------------------------------------------------ */
/* The region                                                               */
/* ------------------------------------------------------------------------ */

const char *kvd_arena_backing_name(kvd_arena_backing_t backing)
{
    switch (backing) {
    case KVD_ARENA_BACKING_PLAIN: return "4k pages";
    case KVD_ARENA_BACKING_THP: return "transparent huge pages";
    case KVD_ARENA_BACKING_HUGETLB: return "hugetlb";
    }
    return "?";
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
void kvd_arena_region_unmap(kvd_arena_t *arena)
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
            kvd_arena_region_unmap(arena);
            return status;
        }
    }
    return KVD_OK;
}

kvd_status_t kvd_arena_region_map(kvd_arena_t *arena, int mode)
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
bool kvd_arena_region_collapse(kvd_arena_t *arena)
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

/* ------------------------------------------------------------------------ */
/* Memory the prefault may take                                             */
/* ------------------------------------------------------------------------ */

/* The first line of `path` as a number ("max": UINT64_MAX); false when the
 * file cannot be read or holds no number. */
static bool read_u64_file(const char *path, uint64_t *out)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return false;
    }
    char line[64];
    bool ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (ok && strncmp(line, "max", 3) == 0) {
        *out = UINT64_MAX;
        return true;
    }
    char *end = NULL;
    errno = 0;
    unsigned long long v = ok ? strtoull(line, &end, 10) : 0;
    if (!ok || end == line || errno != 0) {
        return false;
    }
    *out = v;
    return true;
}

/* The number after "`key` " (or "`key`:") on a line of `path` starting
 * with the key: memory.stat, /proc/meminfo. */
static bool read_key(const char *path, const char *key, uint64_t *out)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return false;
    }
    size_t n = strlen(key);
    char line[256];
    bool found = false;
    while (!found && fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, key, n) != 0 || (line[n] != ' ' && line[n] != ':')) {
            continue;
        }
        char *end = NULL;
        unsigned long long v = strtoull(line + n + 1, &end, 10);
        found = end != line + n + 1;
        *out = v;
    }
    fclose(f);
    return found;
}

/* What a cgroup directory leaves: limit - (usage - inactive file pages). */
static uint64_t cgroup_room(uint64_t limit, uint64_t usage, uint64_t inactive)
{
    uint64_t held = usage > inactive ? usage - inactive : 0;
    return held < limit ? limit - held : 0;
}

/* cgroup v2: the tightest of `dir` and its ancestors up to `mount`. */
static void room_v2(const char *mount, const char *path, uint64_t *room,
                    uint64_t *limit)
{
    char rel[512];
    snprintf(rel, sizeof rel, "%s", path);
    for (;;) {
        char dir[1024], f[1100];
        snprintf(dir, sizeof dir, "%s%s", mount, rel);
        uint64_t max = 0, cur = 0, inactive = 0;
        snprintf(f, sizeof f, "%s/memory.max", dir);
        if (read_u64_file(f, &max) && max != UINT64_MAX) {
            snprintf(f, sizeof f, "%s/memory.current", dir);
            if (!read_u64_file(f, &cur)) {
                cur = 0;
            }
            snprintf(f, sizeof f, "%s/memory.stat", dir);
            if (!read_key(f, "inactive_file", &inactive)) {
                inactive = 0;
            }
            uint64_t r = cgroup_room(max, cur, inactive);
            if (r < *room) {
                *room = r;
                *limit = max;
            }
        }
        char *slash = strrchr(rel, '/');
        if (slash == NULL || rel[0] == '\0') {
            return;
        }
        *slash = '\0'; /* "/a/b" -> "/a" -> "" (the mount itself) */
    }
}

/* cgroup v1: the memory controller's directory of `path` (or, in a
 * container that sees its own cgroup at the mount, the mount). */
static void room_v1(const char *mount, const char *path, uint64_t *room,
                    uint64_t *limit)
{
    const char *dirs[2] = {path, ""};
    for (int i = 0; i < 2; i++) {
        char dir[1024], f[1100];
        snprintf(dir, sizeof dir, "%s%s", mount, dirs[i]);
        uint64_t lim = 0, usage = 0, inactive = 0;
        snprintf(f, sizeof f, "%s/memory.stat", dir);
        bool hier = read_key(f, "hierarchical_memory_limit", &lim);
        if (!read_key(f, "total_inactive_file", &inactive)) {
            inactive = 0;
        }
        snprintf(f, sizeof f, "%s/memory.limit_in_bytes", dir);
        uint64_t own = 0;
        if (read_u64_file(f, &own) && (!hier || own < lim)) {
            lim = own;
            hier = true;
        }
        snprintf(f, sizeof f, "%s/memory.usage_in_bytes", dir);
        if (!hier || !read_u64_file(f, &usage)) {
            continue;
        }
        /* "No limit" reads as a page-rounded LONG_MAX. */
        if (lim < (1ull << 62)) {
            uint64_t r = cgroup_room(lim, usage, inactive);
            if (r < *room) {
                *room = r;
                *limit = lim;
            }
        }
        return;
    }
}

void kvd_arena_memory_room(const char *root, uint64_t *room_out,
                           uint64_t *limit_out)
{
    uint64_t room = UINT64_MAX, limit = UINT64_MAX, kb = 0;
    char path[1024];
    snprintf(path, sizeof path, "%s/proc/meminfo", root);
    if (read_key(path, "MemAvailable", &kb) && kb < UINT64_MAX / 1024) {
        room = kb * 1024;
    }
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    FILE *f = fopen(path, "r");
    char line[600];
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        /* hierarchy-id:controllers:path */
        char *c1 = strchr(line, ':');
        char *c2 = c1 != NULL ? strchr(c1 + 1, ':') : NULL;
        if (c2 == NULL) {
            continue;
        }
        *c2 = '\0';
        const char *ctrl = c1 + 1, *cg = c2 + 1;
        if (strcmp(cg, "/") == 0) {
            cg = "";
        }
        char mount[1024];
        if (ctrl[0] == '\0') {
            snprintf(mount, sizeof mount, "%s/sys/fs/cgroup", root);
            room_v2(mount, cg, &room, &limit);
            snprintf(mount, sizeof mount, "%s/sys/fs/cgroup/unified", root);
            room_v2(mount, cg, &room, &limit);
            continue;
        }
        /* A v1 hierarchy whose controllers include "memory". */
        for (const char *p = ctrl; p != NULL && *p != '\0';) {
            const char *e = strchr(p, ',');
            size_t n = e != NULL ? (size_t)(e - p) : strlen(p);
            if (n == 6 && strncmp(p, "memory", 6) == 0) {
                snprintf(mount, sizeof mount, "%s/sys/fs/cgroup/memory", root);
                room_v1(mount, cg, &room, &limit);
                break;
            }
            p = e != NULL ? e + 1 : NULL;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    *room_out = room;
    *limit_out = limit;
}

/*
 * Populates every page, in steps of about a tenth so that large arenas log
 * progress. MADV_POPULATE_WRITE (Linux 5.14) allocates and maps in one
 * call and reports a shortage as an error; older kernels answer EINVAL and
 * get one write per page instead (the region is fresh, so writing zero
 * changes nothing).
 */
kvd_status_t kvd_arena_region_prefault(kvd_arena_t *arena)
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
