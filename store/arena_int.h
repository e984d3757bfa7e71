/*
 * The host arena's bookkeeping, shared by arena.c (configuration, create /
 * destroy, slab classes and slots) and arena_region.c (the shared-memory
 * region: memfds, huge pages, prefault, export). Nothing outside store/
 * includes it; other folders use store/arena.h.
 *
 * Threading: the kvd_arena_region_* calls run only while the arena is
 * created or destroyed, by the one thread doing it (no lock); everything
 * under kvd_arena_t.lock is as arena.c describes.
 */
#ifndef KVD_STORE_ARENA_INT_H
#define KVD_STORE_ARENA_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "store/arena.h"

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

static inline uint64_t arena_round_up(uint64_t value, uint64_t align)
{
    return (value + align - 1) / align * align;
}

/* "4k pages", "transparent huge pages", "hugetlb": for logs. Static
 * storage. */
const char *kvd_arena_backing_name(kvd_arena_backing_t backing);

/*
 * Maps the region for the arena's partitions (geometry already set) with
 * huge pages as `mode` (kvd_arena_hugepages_t) asks, and sets base,
 * map_bytes, page_bytes, backing and every partition's fd. auto tries the
 * hugetlb pool, then shared memory with MADV_HUGEPAGE where that works;
 * on falls back to nothing. On error nothing stays mapped or open; the
 * errno of the failing call is translated (KVD_ERR_UNSUPPORTED: no
 * hugetlbfs, or pages that do not divide a partition).
 */
kvd_status_t kvd_arena_region_map(kvd_arena_t *arena, int mode);

/* Closes every partition's memfd and unmaps the region; idempotent. */
void kvd_arena_region_unmap(kvd_arena_t *arena);

/* Puts a plain shared-memory region on 2 MiB pages with MADV_COLLAPSE;
 * true when every extent is on a huge page (arena_region.c says when it
 * stops). */
bool kvd_arena_region_collapse(kvd_arena_t *arena);

/* Touches every page of the region; the errno of a shortage translated. */
kvd_status_t kvd_arena_region_prefault(kvd_arena_t *arena);

/*
 * The memory this process can still fault in without the kernel's OOM
 * killer: MemAvailable (/proc/meminfo), and below it, where the process is
 * in a memory cgroup with a limit, the limit less what the cgroup holds
 * beyond its reclaimable file pages (v2: memory.max, memory.current and
 * memory.stat inactive_file, the tightest of the cgroup and its
 * ancestors; v1: memory.stat hierarchical_memory_limit or
 * memory.limit_in_bytes, memory.usage_in_bytes, total_inactive_file).
 * `root` prefixes every path ("" for this machine; a test's tree of
 * proc/ and sys/fs/cgroup/ files otherwise). *room_out: UINT64_MAX when
 * none of it can be read; *limit_out: the cgroup limit that bounds it,
 * UINT64_MAX for none.
 */
void kvd_arena_memory_room(const char *root, uint64_t *room_out,
                           uint64_t *limit_out);

#endif /* KVD_STORE_ARENA_INT_H */
