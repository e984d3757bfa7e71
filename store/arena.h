/*
 * Host arena: the L1 tier's memory (store/README.md).
 *
 * One shared-memory region (a memfd, mapped MAP_SHARED once) holds every
 * object cached in host memory. It is one contiguous mapping because three
 * consumers register it whole: io_uring (NVMe reads and writes land directly
 * in slots), CUDA workers (cudaHostRegister, so GPU<->arena copies are single
 * DMAs) and worker processes that map the same memfd (kvd_arena_export() and
 * kvd_arena_mapping_open()). Across processes the currency is the byte
 * offset of a slot from the base, never a pointer.
 *
 * Layout: the region is cut into equal chunks (cfg.chunk_bytes, the slab
 * page). A chunk is either free or carved into slots of exactly one slab
 * class; a class is one slot size, the object size rounded up to 4096 bytes
 * so that every slot is aligned and sized for O_DIRECT and DMA. Chunks are
 * carved on demand when a class has no free slot left, and a chunk whose
 * last slot is freed goes straight back to the free-chunk pool, so classes
 * trade memory at chunk granularity: an allocation never fails because of
 * fragmentation while some chunk is entirely free. What a class cannot use
 * is the tail of each chunk (chunk_bytes % slot_bytes), reported by
 * kvd_arena_stats().
 *
 * A class exists while it holds a chunk: at most KVD_ARENA_CLASSES_MAX slot
 * sizes hold chunks at the same time, and a class whose last chunk returns
 * to the pool gives its place to any other size. Class ids are therefore
 * not places in a table but the slot size in KVD_ARENA_SLOT_ALIGN units: an
 * id never goes stale and never comes to mean another size.
 *
 * Slot ids are stable uint32 values, (chunk << index_bits) | index within
 * the chunk; KVD_ARENA_SLOT_INVALID is never a valid id.
 *
 * Partitions: besides the main part (partition 0, size_bytes), the arena may
 * hold up to KVD_ARENA_PARTS_MAX more partitions, each its own memfd,
 * mapped right after the previous one so that the region stays one
 * contiguous range of offsets in this process. Every chunk belongs to one
 * partition; an allocation names its partition and only ever takes chunks
 * and slots of it (per-partition free pools and per-partition partial
 * lists; class places are shared). kvd_arena_export_part() hands another
 * process one partition's memfd only, so a process given partition p can
 * read and write partition p's bytes and nothing else: that is how the
 * daemon keeps tenants that must not see each other's data apart
 * (server.tenant_arenas).
 *
 * Threading: kvd_arena_create() and kvd_arena_destroy() must not run
 * concurrently with any other call on the same arena. Every other call is
 * thread-safe. Allocation, free and stats take one
 * mutex and are O(1) (stats is O(classes)); class registration is
 * arithmetic and takes no lock. kvd_arena_slot_ptr(),
 * kvd_arena_slot_offset() and kvd_arena_slot_chunk() take no lock: they are
 * arithmetic on a slot the caller holds. Mappings (kvd_arena_mapping_t) are
 * immutable after open and may be used from any thread.
 *
 * Failpoints (common/failpoint_int.h): "arena.alloc" (metadata allocation),
 * "arena.memfd", "arena.ftruncate", "arena.seal", "arena.mmap",
 * "arena.prefault", "arena.dup" (kvd_arena_export) and "arena.map"
 * (kvd_arena_mapping_open's mmap).
 *
 * Internal: not exported from libkvdepot.so; the store and tests link the
 * static library.
 */
#ifndef KVD_STORE_ARENA_H
#define KVD_STORE_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvdepot/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Slot granularity and alignment: the O_DIRECT / DMA page. */
#define KVD_ARENA_SLOT_ALIGN 4096u
/* At most this many slot sizes hold chunks at the same time (a bit mask). */
#define KVD_ARENA_CLASSES_MAX 64u
/* Largest chunk: io_uring registers at most 1 GiB per buffer. */
#define KVD_ARENA_CHUNK_BYTES_MAX (1ull << 30)
/* Partitions besides the main one (kvd_arena_config_t.parts). */
#define KVD_ARENA_PARTS_MAX 16u
/* Never a valid slot id or class id. */
#define KVD_ARENA_SLOT_INVALID UINT32_MAX
#define KVD_ARENA_CLASS_INVALID UINT32_MAX

typedef struct kvd_arena kvd_arena_t;
typedef struct kvd_arena_mapping kvd_arena_mapping_t;

/* Huge-page policy, also the index of the "store.arena_hugepages" enum. */
typedef enum kvd_arena_hugepages {
    /* MFD_HUGETLB, else transparent huge pages (MADV_HUGEPAGE), else plain
     * pages; the choice is logged at INFO. */
    KVD_ARENA_HUGEPAGES_AUTO = 0,
    /* MFD_HUGETLB or fail (pages reserved from vm.nr_hugepages). */
    KVD_ARENA_HUGEPAGES_ON = 1,
    /* Plain 4 KiB shared memory, no madvise. */
    KVD_ARENA_HUGEPAGES_OFF = 2
} kvd_arena_hugepages_t;

/* What the region actually got. */
typedef enum kvd_arena_backing {
    KVD_ARENA_BACKING_PLAIN = 0,   /* 4 KiB pages */
    KVD_ARENA_BACKING_THP = 1,     /* shmem on 2 MiB pages: MADV_HUGEPAGE
                                      accepted, or built by MADV_COLLAPSE */
    KVD_ARENA_BACKING_HUGETLB = 2, /* hugetlbfs memfd */
} kvd_arena_backing_t;

/*
 * Settings, filled by kvd_config_apply() from kvd_arena_config_table() or
 * by hand.
 *   size_bytes  memory budget; rounded DOWN to a multiple of chunk_bytes
 *               (the budget is never exceeded), at least one chunk.
 *   chunk_bytes slab page: a multiple of 4096, at most 1 GiB; an object
 *               larger than a chunk cannot be stored.
 *   hugepages   a kvd_arena_hugepages_t value (int: the enum parser's type).
 *   prefault    populate every page at create (MADV_POPULATE_WRITE, else a
 *               write per page), so the first transfer into a slot does not
 *               take page faults and a short machine fails at start, not
 *               later with SIGBUS or the OOM killer. Progress is logged at
 *               INFO every 10% when the arena is 1 GiB or more.
 *   num_parts   partitions besides the main one, 0..KVD_ARENA_PARTS_MAX
 *   part_bytes  their sizes: each a whole number of chunks, at least one
 *               (partition i + 1 is part_bytes[i]). Not in the settings
 *               table: the daemon sets them from server.tenant_arenas.
 *               With partitions, the backing page must divide chunk_bytes
 *               (hugetlb pages larger than a chunk fall back, in auto
 *               mode, to shared memory).
 */
typedef struct kvd_arena_config {
    uint64_t size_bytes;
    uint64_t chunk_bytes;
    int hugepages;
    bool prefault;
    uint32_t num_parts;
    uint64_t part_bytes[KVD_ARENA_PARTS_MAX];
} kvd_arena_config_t;

/*
 * The settings table: "store.arena_size" (size, default 8g),
 * "store.arena_chunk" (size, default 64m), "store.arena_hugepages"
 * (auto|on|off, default auto), "store.arena_prefault" (bool, default true),
 * with offsets into kvd_arena_config_t. Static storage; writes the number of
 * fields into `*num_fields_out` (which must not be NULL).
 */
const kvd_config_field_t *kvd_arena_config_table(size_t *num_fields_out);

/* The table's defaults, without consulting the environment or a file. */
kvd_arena_config_t kvd_arena_config_default(void);

/*
 * Creates the arena: memfd, size, seals (F_SEAL_SHRINK | F_SEAL_GROW, so no
 * process sharing it can truncate it under another's mapping), mapping,
 * optional prefault, and the slab metadata. `cfg` is borrowed for the call.
 *
 * Errors (nothing is left allocated or open; `*arena_out` is untouched):
 *   KVD_ERR_INVALID      NULL argument; chunk_bytes 0 or not a multiple of
 *                        4096; hugepages not a kvd_arena_hugepages_t.
 *   KVD_ERR_RANGE        chunk_bytes above KVD_ARENA_CHUNK_BYTES_MAX;
 *                        size_bytes below chunk_bytes; too many chunks for
 *                        32-bit slot ids.
 *   KVD_ERR_NOMEM        metadata allocation failed, or hugepages "on" and
 *                        the huge page pool is too small.
 *   KVD_ERR_UNSUPPORTED  hugepages "on" and the kernel has no hugetlbfs.
 *   other                a syscall failed (translated errno; logged with
 *                        the call and the cause).
 * In "auto" mode a huge page failure is not an error: the next backing is
 * tried and the outcome logged at INFO.
 *
 * Ownership: the caller owns the arena; kvd_arena_destroy() frees it.
 */
kvd_status_t kvd_arena_create(const kvd_arena_config_t *cfg,
                              kvd_arena_t **arena_out);

/*
 * Unmaps the region, closes the memfd and frees the metadata. Slots still
 * allocated are released with it; pointers into the arena become invalid.
 * Mappings opened from an export in this or another process stay valid
 * (the memory lives until its last mapping and fd are gone). NULL is
 * accepted.
 */
void kvd_arena_destroy(kvd_arena_t *arena);

/* The region as the process sees it, for registration (io_uring, CUDA). */
typedef struct kvd_arena_info {
    void *base;                  /* page-aligned; valid until destroy */
    uint64_t size_bytes;         /* usable: num_chunks * chunk_bytes, every
                                    partition included */
    uint64_t map_bytes;          /* mapped length (size rounded up to the
                                    backing's page), >= size_bytes */
    uint64_t chunk_bytes;        /* chunk i is [i*chunk_bytes, +chunk_bytes) */
    uint32_t num_chunks;         /* io_uring buffer i can be chunk i */
    kvd_arena_backing_t backing; /* huge pages actually used */
    uint32_t num_parts;          /* partitions, the main one included */
} kvd_arena_info_t;

/* Fills `*info_out`. KVD_ERR_INVALID for a NULL argument. */
kvd_status_t kvd_arena_query(const kvd_arena_t *arena,
                             kvd_arena_info_t *info_out);

/*
 * The slab class id for objects of `object_bytes`. The slot size is
 * object_bytes rounded up to KVD_ARENA_SLOT_ALIGN; objects whose slot sizes
 * are equal share one class, so registering the same size twice returns
 * the same id. The id is the slot size in KVD_ARENA_SLOT_ALIGN units (1 to
 * chunk_bytes / 4096) and stays valid until destroy, whether or not the
 * class holds chunks now: registering reserves nothing, and the number of
 * sizes registered is not limited (kvd_arena_slot_alloc() says when
 * KVD_ARENA_CLASSES_MAX other sizes hold all the class places).
 *
 * Errors: KVD_ERR_INVALID (NULL argument, object_bytes 0), KVD_ERR_RANGE
 * (slot larger than a chunk).
 */
kvd_status_t kvd_arena_class_register(kvd_arena_t *arena, uint64_t object_bytes,
                                      uint32_t *class_out);

/*
 * Allocates one slot of `class_id`: a free slot in a chunk of that class if
 * there is one (chunks that became non-full by a free are used first, to
 * keep others draining), else carves a chunk from the free pool. O(1).
 * The slot's bytes are whatever its previous holder left.
 *
 * A class that holds no chunk takes one of the KVD_ARENA_CLASSES_MAX class
 * places with its first chunk and gives it back when its last chunk
 * returns to the pool.
 *
 * Errors: KVD_ERR_INVALID (NULL argument, id not from
 * kvd_arena_class_register()), KVD_ERR_NOSPACE (no free slot in the class
 * and no free chunk, or the class holds no chunk and KVD_ARENA_CLASSES_MAX
 * other sizes do: evict, then retry; either way freeing slots is the cure).
 */
kvd_status_t kvd_arena_slot_alloc(kvd_arena_t *arena, uint32_t class_id,
                                  uint32_t *slot_out);

/*
 * kvd_arena_slot_alloc() in partition `part` (0: the main one): the slot's
 * chunk belongs to that partition. KVD_ERR_NOSPACE when that partition has
 * no free slot of the class and no free chunk, whatever the others have.
 * KVD_ERR_INVALID also for a partition the arena does not have.
 */
kvd_status_t kvd_arena_slot_alloc_in(kvd_arena_t *arena, uint32_t part,
                                     uint32_t class_id, uint32_t *slot_out);

/* The partition of an allocated slot's chunk, or UINT32_MAX for an id
 * outside the arena. Lock-free. */
uint32_t kvd_arena_slot_part(const kvd_arena_t *arena, uint32_t slot);

/*
 * Returns an allocated slot to its class; when it was the last allocated
 * slot of its chunk, the chunk returns to the free pool, and when that was
 * the class's last chunk, its class place is free for any size. O(1).
 * Errors: KVD_ERR_INVALID (NULL arena, id that is not an allocated slot,
 * including a double free; logged, nothing changes).
 */
kvd_status_t kvd_arena_slot_free(kvd_arena_t *arena, uint32_t slot);

/*
 * Byte offset of `slot` from the base: what crosses process boundaries and
 * what io_uring/DMA use. A multiple of KVD_ARENA_SLOT_ALIGN. UINT64_MAX for
 * an id outside the arena or in a free chunk. Lock-free; meaningful only
 * while the caller holds the slot.
 */
uint64_t kvd_arena_slot_offset(const kvd_arena_t *arena, uint32_t slot);

/* base + kvd_arena_slot_offset(), or NULL where the offset is UINT64_MAX. */
void *kvd_arena_slot_ptr(const kvd_arena_t *arena, uint32_t slot);

/* The chunk holding `slot` (its io_uring buffer index when chunks are
 * registered one by one), or UINT32_MAX for an id outside the arena. */
uint32_t kvd_arena_slot_chunk(const kvd_arena_t *arena, uint32_t slot);

/* Per-class counters. Slots "available" = free slots in the class's chunks
 * plus what the free chunks would give it. */
typedef struct kvd_arena_class_stats {
    uint32_t class_id; /* as kvd_arena_class_register() returns it */
    uint64_t slot_bytes;
    uint32_t slots_per_chunk;
    uint32_t chunks;     /* chunks carved for this class now */
    uint64_t slots_used; /* allocated */
    uint64_t slots_free; /* free inside this class's chunks */
} kvd_arena_class_stats_t;

/* One partition's chunks. */
typedef struct kvd_arena_part_stats {
    uint64_t offset;      /* arena offset of its first byte */
    uint64_t bytes_total; /* its chunks * chunk_bytes */
    uint32_t chunks_total;
    uint32_t chunks_free;
} kvd_arena_part_stats_t;

typedef struct kvd_arena_stats {
    uint64_t bytes_total;  /* size_bytes */
    uint64_t bytes_used;   /* sum of slot_bytes over allocated slots */
    uint64_t bytes_carved; /* chunks carved * chunk_bytes */
    uint32_t chunks_total;
    uint32_t chunks_free;
    /* Allocations refused with KVD_ERR_NOSPACE because KVD_ARENA_CLASSES_MAX
     * other sizes held every class place (since create). */
    uint64_t class_places_full;
    /* The classes that hold chunks now, classes[0 .. num_classes), in no
     * particular order; a class without chunks is not listed. */
    uint32_t num_classes;
    kvd_arena_class_stats_t classes[KVD_ARENA_CLASSES_MAX];
    /* parts[0 .. num_parts): the main partition first. */
    uint32_t num_parts;
    kvd_arena_part_stats_t parts[KVD_ARENA_PARTS_MAX + 1];
} kvd_arena_stats_t;

/* A consistent snapshot (taken under the lock). KVD_ERR_INVALID for a NULL
 * argument. */
kvd_status_t kvd_arena_stats(kvd_arena_t *arena, kvd_arena_stats_t *out);

/*
 * What another process needs to map one partition of the arena. Send `fd`
 * with SCM_RIGHTS (or inherit it) together with the numbers; slot offsets
 * in [offset, offset + size_bytes) then mean the same bytes on both sides.
 */
typedef struct kvd_arena_export {
    int fd;              /* the partition's memfd, O_CLOEXEC */
    uint64_t map_bytes;  /* length to map */
    uint64_t size_bytes; /* usable bytes of the partition */
    uint64_t chunk_bytes;
    kvd_arena_backing_t backing;
    uint64_t offset; /* arena offset of the partition's first byte (0 for
                        the main partition); a multiple of chunk_bytes */
} kvd_arena_export_t;

/*
 * Fills `*out` with a new descriptor of the main partition's memfd (dup'd,
 * O_CLOEXEC) and its layout: the whole arena when it has no other
 * partition. The caller owns out->fd and closes it; it keeps the memory
 * alive even after kvd_arena_destroy().
 * Errors: KVD_ERR_INVALID (NULL argument), translated errno from fcntl
 * (failpoint "arena.dup").
 */
kvd_status_t kvd_arena_export(const kvd_arena_t *arena,
                              kvd_arena_export_t *out);

/* kvd_arena_export() of partition `part`; KVD_ERR_INVALID also for a
 * partition the arena does not have. */
kvd_status_t kvd_arena_export_part(const kvd_arena_t *arena, uint32_t part,
                                   kvd_arena_export_t *out);

/*
 * Maps an exported arena (MAP_SHARED, read-write) in this process, typically
 * a worker that then registers it with CUDA. `exp` is borrowed: exp->fd is
 * not retained and may be closed right after this call. The fd is checked
 * to be a sealed memfd at least map_bytes long, so the exporter cannot
 * shrink it under this mapping.
 *
 * Errors (nothing mapped; `*mapping_out` untouched): KVD_ERR_INVALID (NULL
 * argument, negative fd, inconsistent sizes, fd too short or not sealed),
 * KVD_ERR_NOMEM, translated errno from fstat/mmap (failpoint "arena.map").
 */
kvd_status_t kvd_arena_mapping_open(const kvd_arena_export_t *exp,
                                    kvd_arena_mapping_t **mapping_out);

/* Unmaps and frees; NULL is accepted. */
void kvd_arena_mapping_close(kvd_arena_mapping_t *mapping);

/* Base and usable size of the mapping (valid until close); the base holds
 * arena offset kvd_arena_mapping_offset(). */
void *kvd_arena_mapping_base(const kvd_arena_mapping_t *mapping);
uint64_t kvd_arena_mapping_size(const kvd_arena_mapping_t *mapping);
uint64_t kvd_arena_mapping_offset(const kvd_arena_mapping_t *mapping);

/* Pointer to arena offsets [offset, offset + len) in the mapping, or NULL
 * when that range is not inside the mapped partition (len 0 is checked as
 * 1 byte). */
void *kvd_arena_mapping_ptr(const kvd_arena_mapping_t *mapping, uint64_t offset,
                            uint64_t len);

#ifdef __cplusplus
}
#endif

#endif /* KVD_STORE_ARENA_H */
