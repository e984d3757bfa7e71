/*
 * Tenant arenas: kvdepotd opens its store with an arena partition per
 * tenant named in server.tenant_arenas (store/arena_int.h, "Partitions")
 * and hands each local client the partition of its tenant only.
 *
 * Internal: the daemon and the tests link the static library.
 */
#ifndef KVD_STORE_TENANT_ARENA_INT_H
#define KVD_STORE_TENANT_ARENA_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kvdepot/store.h"
#include "store/arena_int.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One tenant's arena partition (kvdepotd's server.tenant_arenas). */
typedef struct kvd_store_tenant_arena {
    uint32_t tenant; /* non-zero */
    uint64_t bytes;  /* whole arena chunks */
} kvd_store_tenant_arena_t;

/*
 * kvd_store_open() with arena partitions: tenant arenas[i].tenant's objects
 * live in partition i + 1 of arenas[i].bytes (its own memfd), every other
 * tenant's in the main one (store.arena_size). Evicting for one partition
 * takes only objects of it, so tenants never evict each other's data, and
 * kvd_store_arena_export_tenant() hands out one partition only. Embedded
 * mode only (KVD_ERR_INVALID in daemon mode, for a tenant 0, a tenant
 * given twice, or more than KVD_ARENA_PARTS_MAX).
 */
kvd_status_t kvd_store_open_partitioned(const kvd_config_t *config,
                                        const kvd_store_tenant_arena_t *arenas,
                                        size_t n, kvd_store_t **store_out,
                                        char *err, size_t err_len);

/* kvd_store_arena_export() of the partition `tenant`'s objects live in:
 * its own, or the main one. out->offset is the partition's first arena
 * offset. */
kvd_status_t kvd_store_arena_export_tenant(kvd_store_t *store, uint32_t tenant,
                                           kvd_store_arena_export_t *out);

/* The chunks of every arena partition: out[0] the main one, out[i + 1]
 * the arena of kvd_store_open_partitioned()'s arenas[i]; at most `max`,
 * the number written to `*n_out`. KVD_ERR_INVALID for a NULL argument or
 * a store in daemon mode. */
kvd_status_t kvd_store_arena_partitions(kvd_store_t *store,
                                        kvd_arena_part_stats_t *out, size_t max,
                                        size_t *n_out);

/* What backs the arena's memory (one mapping for every partition): 4 KiB
 * pages, shared memory on 2 MiB transparent huge pages, or a hugetlb pool.
 * KVD_ERR_INVALID for a NULL argument or a store in daemon mode. */
kvd_status_t kvd_store_arena_backing(kvd_store_t *store,
                                     kvd_arena_backing_t *out);

#ifdef __cplusplus
}
#endif

#endif /* KVD_STORE_TENANT_ARENA_INT_H */
