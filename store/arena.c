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
 *
 * This file holds the configuration table, create / destroy, slab classes
 * and slots; arena_region.c maps the region (memfds, huge pages, prefault)
 * and exports it to other processes.
 */
#include "store/arena.h"

#include <assert.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/failpoint_int.h"
#include "common/log_int.h"
#include "store/arena_int.h"

/* End of every chunk list; "no place" for arena_class_bind(). */
#define ARENA_NONE UINT32_MAX
/* class_of[] entry of a slot size whose class holds no chunk. */
#define ARENA_NO_PLACE UINT8_MAX
/* Every class place free: one bit per place. */
#define ARENA_PLACES_ALL (UINT64_MAX >> (64 - KVD_ARENA_CLASSES_MAX))

_Static_assert(KVD_ARENA_CLASSES_MAX >= 1 && KVD_ARENA_CLASSES_MAX <= 64 &&
                   KVD_ARENA_CLASSES_MAX < ARENA_NO_PLACE,
               "class places are bits of a uint64_t and fit a uint8_t");
/* ------------------------------------------------------------------------ */
/* Configuration                                                            */
/* ------------------------------------------------------------------------ */

static const char *const arena_hugepage_choices[] = {"auto", "on", "off", NULL};

static const kvd_config_field_t arena_config_fields[] = {
    {"store.arena_size", "8g", "host arena (L1) size, rounded down to chunks",
     kvd_config_parse_size, offsetof(kvd_arena_config_t, size_bytes),
     KVD_ARENA_SLOT_ALIGN, 0, NULL},
    {"store.arena_chunk", "64m",
     "arena slab page; the largest storable object (a worker's object is its "
     "payload plus a 128-byte header)",
     kvd_config_parse_size, offsetof(kvd_arena_config_t, chunk_bytes),
     KVD_ARENA_SLOT_ALIGN, (int64_t)KVD_ARENA_CHUNK_BYTES_MAX, NULL},
    {"store.arena_hugepages", "auto",
     "huge pages for the arena: auto (the hugetlb pool if it holds the "
     "arena, else transparent huge pages) | on (the pool) | off",
     kvd_config_parse_enum, offsetof(kvd_arena_config_t, hugepages), 0, 0,
     arena_hugepage_choices},
    {"store.arena_prefault", "true",
     "touch every arena page at start (an arena larger than the memory "
     "available to the process, MemAvailable or its memory cgroup's limit, "
     "is then refused at start)",
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
    status = kvd_arena_region_map(arena, cfg->hugepages);
    if (status != KVD_OK) {
        goto err_mutex;
    }
    /* Pages faulted in beyond what the machine (or the memory cgroup) has
     * bring the OOM killer, to this process or a neighbour, not an error:
     * refuse first. hugetlb pages were reserved by the mapping. */
    if (arena->backing != KVD_ARENA_BACKING_HUGETLB) {
        uint64_t room = 0, limit = 0;
        kvd_arena_memory_room("", &room, &limit);
        if (arena->map_bytes > room && !cfg->prefault) {
            KVD_LOG_WARN("arena: %" PRIu64
                         " MiB, without prefault, and %" PRIu64
                         " MiB of memory available to this process: filling "
                         "it will run out of memory",
                         arena->map_bytes >> 20, room >> 20);
        } else if (arena->map_bytes > room) {
            char lim[64] = "";
            if (limit != UINT64_MAX) {
                snprintf(lim, sizeof lim,
                         " (memory cgroup limit %" PRIu64 " MiB)", limit >> 20);
            }
            KVD_LOG_ERROR("arena: %" PRIu64 " MiB to prefault and %" PRIu64
                          " MiB of memory available to this process%s; set "
                          "a smaller store.arena_size",
                          arena->map_bytes >> 20, room >> 20, lim);
            status = KVD_ERR_NOMEM;
            goto err_unmap;
        }
    }
    /* auto without huge pages from the pool or on faults: built now, as
     * prefault allocates every page anyway. */
    if (cfg->prefault && cfg->hugepages == KVD_ARENA_HUGEPAGES_AUTO &&
        arena->backing == KVD_ARENA_BACKING_PLAIN &&
        kvd_arena_region_collapse(arena)) {
        arena->backing = KVD_ARENA_BACKING_THP;
    }
    if (cfg->prefault) {
        status = kvd_arena_region_prefault(arena);
        if (status != KVD_OK) {
            goto err_unmap;
        }
    }
    KVD_LOG_INFO(
        "arena: %" PRIu64 " MiB, %u chunks of %" PRIu64
        " KiB, %u partition%s, %s, prefault %s",
        arena->size_bytes >> 20, arena->num_chunks, arena->chunk_bytes >> 10,
        arena->num_parts, arena->num_parts == 1 ? "" : "s",
        kvd_arena_backing_name(arena->backing), cfg->prefault ? "on" : "off");
    *arena_out = arena;
    return KVD_OK;

err_unmap:
    kvd_arena_region_unmap(arena);
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
    kvd_arena_region_unmap(arena);
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
