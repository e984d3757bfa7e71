/*
 * The embedded engine's calls beyond include/kvdepot/store.h: a documented
 * internal interface for the daemon (server/) and the cluster (cluster/),
 * which link the static library. Nothing here reaches the client: each call
 * works on an embedded store and says what it does on any other.
 *
 * Tenant arenas: kvdepotd opens its store with an arena partition per
 * tenant named in server.tenant_arenas (store/arena.h, "Partitions")
 * and hands each local client the partition of its tenant only.
 *
 * Remembered checksums: an object whose bytes a writer has checked against
 * their XXH3-64 at commit keeps that value in its L1 entry, so a reader that
 * needs it (the cluster data plane sending the object to another node) does
 * not read 2 MiB again to compute it. Writers that check: the daemon's Commit
 * with server.verify_commits (the client's checksum, verified), and the
 * cluster data plane committing a fetched object (verified on arrival).
 *
 * A remembered checksum describes the bytes as they were checked: a
 * process that writes into a committed slot afterwards (a broken client
 * mapping the arena, or a co-tenant sharing it) makes the object fail a
 * peer's verification instead of travelling with a checksum of the damaged
 * bytes, and the NVMe write checks the slot against it first: such an
 * object is dropped, never written to disk (counted in checksum_errors).
 *
 * Embedded stores only (a daemon-mode store has no L1 here). Threading:
 * any thread, as the other store calls.
 */
#ifndef KVD_STORE_ENGINE_H
#define KVD_STORE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvdepot/store.h"
#include "store/arena.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One tenant's arena partition (kvdepotd's server.tenant_arenas). */
typedef struct kvd_store_tenant_arena {
    uint32_t tenant; /* non-zero */
    uint64_t bytes;  /* whole arena chunks; 0: an equal share carved out of
                        store.arena_size (see kvd_store_open_partitioned) */
} kvd_store_tenant_arena_t;

/*
 * kvd_store_open() with arena partitions: tenant arenas[i].tenant's objects
 * live in partition i + 1 of arenas[i].bytes (its own memfd), every other
 * tenant's in the main one (store.arena_size). Evicting for one partition
 * takes only objects of it, so tenants never evict each other's data, and
 * kvd_store_arena_export_tenant() hands out one partition only. A
 * partition of 0 bytes takes an equal share of store.arena_size: with n
 * such partitions and c whole chunks, c / (n + 1) chunks each, the main
 * arena keeping the rest (KVD_ERR_RANGE when a share is under one chunk).
 * Embedded mode only (KVD_ERR_INVALID in daemon mode, for a tenant 0, a
 * tenant given twice, or more than KVD_ARENA_PARTS_MAX).
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

/* kvd_store_commit of one key whose bytes the caller has checked against
 * `xxh3` (XXH3-64 of the whole object); the entry remembers it. In daemon
 * mode the same as kvd_store_commit. Errors: as kvd_store_commit. */
kvd_status_t kvd_store_commit_checksum(kvd_store_t *store,
                                       const kvd_store_key_t *key,
                                       uint64_t xxh3);

/* Writes the checksum remembered for the arena object `lease` holds (a
 * HOST lease of this store) to `*xxh3_out`; false when none is remembered
 * (committed without one, or not an embedded store's HOST lease). */
bool kvd_store_lease_checksum(kvd_store_t *store,
                              const kvd_store_lease_t *lease,
                              uint64_t *xxh3_out);

/*
 * One tenant's share of kvd_store_stats(), for a caller that may see that
 * tenant's figures only (kvdepotd's Stats for a caller bound to a tenant).
 * Per tier: objects and bytes the tenant's saves hold (reserved included)
 * and the evictions of its objects; host capacity_bytes is what the
 * tenant may fill (its own arena partition, else the main one, capped by
 * its quota); disk capacity_bytes is the disk tier's configured size,
 * which every tenant shares. Every other field reads 0: hits, misses and
 * bytes moved are not counted per tenant here, and errors, leases and the
 * write queue are the store's, not the tenant's. A tenant the store never
 * saw holds nothing (zeros, KVD_OK). KVD_ERR_INVALID for a NULL argument
 * or a store in daemon mode. Thread: any.
 */
kvd_status_t kvd_store_tenant_stats(kvd_store_t *store, uint32_t tenant,
                                    kvd_store_stats_t *out);

#ifdef __cplusplus
}
#endif

#endif /* KVD_STORE_ENGINE_H */
