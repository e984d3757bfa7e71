/*
 * kvdepot store, embedded mode (DESIGN.md §5).
 *
 * A store keeps KV objects (one engine block x this worker's layers,
 * DESIGN.md §4) in two tiers: the host arena (L1, shared memory that workers
 * read and write directly) and, when `store.disk_path` is set, NVMe files
 * (L2) whose LMDB index survives restarts and crashes. The store treats an
 * object as opaque bytes of a fixed size per call; callers name objects by
 * (namespace digest, block hash).
 *
 * Save:   kvd_store_reserve() gives each new key an arena slot (evicting
 *         colder objects if needed); the caller writes the object's bytes at
 *         kvd_store_reservation_ptr() (or through its own mapping of
 *         kvd_store_arena_export()), then kvd_store_commit() publishes them
 *         or kvd_store_abort() gives the slots back.
 * Load:   kvd_store_lookup() finds the longest stored prefix of a hash chain
 *         and leases every object of it, so none can be evicted or deleted
 *         before the caller is done. A lease on the HOST tier can be read at
 *         once; one on the DISK tier is brought into the arena with
 *         kvd_store_get_submit() (asynchronous, completion polled), which
 *         turns it into a HOST lease. Every lease is given back with
 *         kvd_store_release().
 * Tiers:  with write-back (default) an object evicted from the arena is
 *         written to NVMe (if the admission filter lets it) before its slot
 *         is reused; with write-through every commit is also written to
 *         NVMe at once. An NVMe object is indexed only after its bytes are
 *         written, so after a restart or a kill -9 the store serves every
 *         indexed object and nothing torn. Each NVMe object's XXH3-64 is in
 *         the index and checked on every read: a mismatch fails the read
 *         with KVD_ERR_CHECKSUM and drops the object.
 *
 * Settings (kvd_store_print_config lists them with their docs): every
 * `store.*` key, from the call's kvd_config_t, KVDEPOT_STORE_* environment
 * variables, a YAML file loaded into the config, then defaults.
 *
 * Threading: every call is thread-safe except that kvd_store_open and
 * kvd_store_close must not overlap any other call on the store, and
 * kvd_store_poll / kvd_store_wait are for one polling thread at a time.
 * Internal threads (NVMe completions, write-back) never call user code;
 * results come back through kvd_store_poll.
 */
#ifndef KVDEPOT_STORE_H
#define KVDEPOT_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvdepot/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvd_store kvd_store_t;

/* An object's name: 48 bytes, no padding. */
typedef struct kvd_store_key {
    kvd_namespace_t ns;
    kvd_block_hash_t hash;
} kvd_store_key_t;

typedef enum kvd_store_tier {
    KVD_STORE_TIER_NONE = 0,
    KVD_STORE_TIER_HOST = 1, /* in the arena: read at arena_offset */
    KVD_STORE_TIER_DISK = 2  /* on NVMe: kvd_store_get_submit() first */
} kvd_store_tier_t;

/* A lease on one stored object, written by kvd_store_lookup() and
 * kvd_store_poll(). Pass it back unchanged to get_submit / release. */
typedef struct kvd_store_lease {
    kvd_store_key_t key;
    uint32_t tier;         /* kvd_store_tier_t */
    uint32_t reserved;     /* the store's own (daemon mode: its lease group) */
    uint64_t arena_offset; /* HOST: slot's byte offset in the arena */
    uint64_t size_bytes;   /* the object's size */
} kvd_store_lease_t;

/*
 * Opens a store with the `store.*` settings resolved from `config` (may be
 * NULL: environment and defaults only). Creates the arena; when
 * store.disk_path is set, opens (or creates) the NVMe files and the index
 * beside them and rebuilds the disk tier's table from the index (objects
 * whose extent is unusable are dropped from the index and logged).
 *
 * Errors (nothing is left open; `*store_out` untouched; the reason is
 * written to `err`, at most `err_len` bytes, may be NULL when err_len is 0):
 *   KVD_ERR_INVALID / KVD_ERR_NOT_FOUND / KVD_ERR_RANGE  a setting is
 *                        malformed, unknown ("store.arena_sise") or out of
 *                        range;
 *   KVD_ERR_NOMEM, KVD_ERR_NOSPACE, KVD_ERR_IO, KVD_ERR_CORRUPT,
 *   KVD_ERR_UNSUPPORTED  from the arena, the NVMe files or the index.
 */
KVD_API kvd_status_t kvd_store_open(const kvd_config_t *config,
                                    kvd_store_t **store_out, char *err,
                                    size_t err_len);

/*
 * Clean stop: cancels gets not yet completed (they are not polled any
 * more), finishes the NVMe writes already queued and indexes them, syncs
 * the NVMe files and the index, and frees everything. Objects only in the
 * arena are lost (the arena is memory). Leases still held are dropped.
 * NULL is accepted.
 */
KVD_API void kvd_store_close(kvd_store_t *store);

/* Writes every `store.*` setting with its value, source and doc, resolved
 * from `config` (may be NULL) as kvd_store_open would. */
KVD_API kvd_status_t kvd_store_print_config(const kvd_config_t *config,
                                            FILE *out);

/* kvd_config_visit over every `store.*` setting (config may be NULL). */
KVD_API kvd_status_t kvd_store_visit_config(const kvd_config_t *config,
                                            kvd_config_visit_fn fn, void *ctx);

/* Resolves and checks every `store.*` setting as kvd_store_open would,
 * without opening anything: KVD_OK, or the error with the key and the
 * reason in `err` (for `--print-config` and config checkers). Writes the
 * mode into *daemon_mode_out (may be NULL): true for store.mode daemon. */
KVD_API kvd_status_t kvd_store_check_config(const kvd_config_t *config,
                                            bool *daemon_mode_out, char *err,
                                            size_t err_len);

/* ---- the arena, for the bytes --------------------------------------- */

/* Pointer to [arena_offset, +len) in this process's mapping of the arena,
 * or NULL when the range is outside it. Valid until kvd_store_close. In
 * daemon mode this is the arena of the daemon as it is now: after a daemon
 * restart, an offset from an earlier lease or reservation names a slot of
 * the new arena that holds something else. Use kvd_store_lease_ptr and
 * kvd_store_reservation_ptr for the bytes of a lease or a reservation. */
KVD_API void *kvd_store_arena_ptr(kvd_store_t *store, uint64_t arena_offset,
                                  uint64_t len);

/*
 * Keeps the arena this process maps now mapped until the matching
 * kvd_store_arena_unhold, and says where it is: for memory registered with
 * a device (cudaHostRegister), which must stay mapped while it is
 * registered. In daemon mode a restarted daemon's arena is otherwise
 * unmapped once nothing of it is held (kvd_store_lease_ptr). Writes the
 * base, the usable size and the mapping's generation (changes when the
 * client maps a restarted daemon's arena; 0 for an embedded store, whose
 * arena never changes). Errors: KVD_ERR_INVALID (NULL), KVD_ERR_STATE (no
 * arena mapped). Thread: any.
 */
KVD_API kvd_status_t kvd_store_arena_hold(kvd_store_t *store, void **base_out,
                                          uint64_t *size_bytes_out,
                                          uint32_t *generation_out);
/* Undoes one kvd_store_arena_hold of `generation`. Thread: any. */
KVD_API void kvd_store_arena_unhold(kvd_store_t *store, uint32_t generation);
/* The generation of the arena mapped now (see kvd_store_arena_hold). */
KVD_API uint32_t kvd_store_arena_generation(kvd_store_t *store);

/*
 * The object of a HOST-tier lease (lease->size_bytes bytes), in the arena
 * the lease was given in, or NULL (not a HOST lease, not held, or that
 * arena is no longer mapped). In daemon mode a daemon restart does not
 * move it: it stays in the old arena, which the client keeps mapped while
 * any lease or reservation of it is held, and the restarted daemon's
 * objects are never reached through it. Valid until the lease is released.
 * Thread: any.
 */
KVD_API void *kvd_store_lease_ptr(kvd_store_t *store,
                                  const kvd_store_lease_t *lease);

/* What another process needs to map the arena (daemon mode, workers in
 * other processes): a new O_CLOEXEC descriptor of the sealed memfd, owned
 * by the caller, and the lengths. The memfd may be one partition of the
 * daemon's arena (a tenant with an arena of its own): the mapped bytes
 * are then arena offsets [offset, offset + size_bytes). */
typedef struct kvd_store_arena_export {
    int fd;
    uint64_t map_bytes;  /* length to mmap (MAP_SHARED) */
    uint64_t size_bytes; /* usable bytes from the start of the mapping */
    uint64_t offset;     /* arena offset of the mapping's first byte */
} kvd_store_arena_export_t;

KVD_API kvd_status_t kvd_store_arena_export(kvd_store_t *store,
                                            kvd_store_arena_export_t *out);

/* ---- save ------------------------------------------------------------ */

/* One key's outcome of kvd_store_reserve. */
typedef struct kvd_store_reservation {
    /* KVD_OK: write size_bytes at arena_offset, then commit or abort.
     * KVD_ERR_EXISTS: stored already (either tier) or being written: skip.
     * KVD_ERR_NOSPACE: no slot could be freed (everything leased/pinned).
     * KVD_ERR_QUOTA: the tenant's quota cannot fit it.
     * Daemon mode also: KVD_ERR_NOMEM / KVD_ERR_BUSY (the daemon's cause,
     * e.g. draining), or the failed call's status (KVD_ERR_UNREACHABLE,
     * KVD_ERR_TIMEOUT, KVD_ERR_INTERNAL, ...): skip the save. */
    kvd_status_t status;
    uint32_t reserved; /* the store's own (daemon mode: which arena mapping) */
    uint64_t arena_offset;
} kvd_store_reservation_t;

/*
 * Reserves arena slots of `object_bytes` for the keys (ns, hashes[i]),
 * i < num_hashes, on behalf of `tenant` (the cache_salt quota domain; 0 is
 * the default tenant). Writes one outcome per key into out[i]. Keys reserved
 * here are invisible to lookups until committed. The call itself fails only
 * for bad arguments (KVD_ERR_INVALID: NULL pointers with num_hashes > 0,
 * object_bytes 0 or larger than an arena chunk); per-key outcomes are in
 * `out`. Thread: any.
 */
KVD_API kvd_status_t kvd_store_reserve(kvd_store_t *store,
                                       const kvd_namespace_t *ns,
                                       const kvd_block_hash_t *hashes,
                                       size_t num_hashes, uint64_t object_bytes,
                                       uint32_t tenant,
                                       kvd_store_reservation_t *out);

/*
 * Where to write the `len` bytes of a reservation whose status is KVD_OK,
 * in the arena it was made in (as kvd_store_lease_ptr), or NULL (status not
 * OK, range outside the arena, or that arena is no longer mapped). A
 * reservation made before a daemon restart can no longer be committed, and
 * writing through this pointer cannot touch the restarted daemon's
 * objects. Valid until the key is committed or aborted. Thread: any.
 */
KVD_API void *kvd_store_reservation_ptr(kvd_store_t *store,
                                        const kvd_store_reservation_t *r,
                                        uint64_t len);

/*
 * Publishes reserved keys: each becomes visible to lookups (and, with
 * write-through, is queued for NVMe). statuses_out[i] (may be NULL) gets
 * KVD_OK or KVD_ERR_NOT_FOUND (not reserved) / KVD_ERR_STATE (already
 * committed). Returns KVD_OK when every key committed, else the first
 * error. Thread: any.
 */
KVD_API kvd_status_t kvd_store_commit(kvd_store_t *store,
                                      const kvd_store_key_t *keys, size_t num,
                                      kvd_status_t *statuses_out);

/* Gives reserved keys' slots back (the write failed). Same reporting as
 * kvd_store_commit. */
KVD_API kvd_status_t kvd_store_abort(kvd_store_t *store,
                                     const kvd_store_key_t *keys, size_t num,
                                     kvd_status_t *statuses_out);

/* ---- load ------------------------------------------------------------ */

/*
 * Finds the longest prefix hashes[0..m) stored under `ns` in either tier,
 * leases each of its objects (so none is evicted, deleted or reused until
 * released) and writes them into leases_out[0..m) and m into *matched_out.
 * Matching stops at the first key stored nowhere (or only half written).
 * `leases_out` holds num_hashes entries. Never blocks on I/O: it consults
 * in-memory tables only. Counts a hit per matched key and a miss when the
 * prefix stops early, per tier. Errors: KVD_ERR_INVALID (NULL arguments).
 * Thread: any.
 */
KVD_API kvd_status_t kvd_store_lookup(kvd_store_t *store,
                                      const kvd_namespace_t *ns,
                                      const kvd_block_hash_t *hashes,
                                      size_t num_hashes,
                                      kvd_store_lease_t *leases_out,
                                      size_t *matched_out);

/*
 * kvd_store_lookup, naming the node that computed the blocks (a prefill
 * node handing a request over; `source_node` as its kvd_leader_transfer's
 * node_id, NULL or "" for none). In daemon mode the daemon, when it is in
 * a cluster, asks that node first for what it does not hold, before the
 * blocks' home nodes, and pulls what it finds into its arena before it
 * answers; an embedded store has no other node and ignores it.
 */
KVD_API kvd_status_t kvd_store_lookup_from(
    kvd_store_t *store, const kvd_namespace_t *ns,
    const kvd_block_hash_t *hashes, size_t num_hashes, const char *source_node,
    kvd_store_lease_t *leases_out, size_t *matched_out);

/* Gives leases back (either tier). Returns KVD_OK, or the first error
 * (KVD_ERR_NOT_FOUND / KVD_ERR_STATE: not a lease held; nothing else is
 * affected by one bad element). Thread: any. */
KVD_API kvd_status_t kvd_store_release(kvd_store_t *store,
                                       const kvd_store_lease_t *leases,
                                       size_t num);

/* One object to bring into the arena. */
typedef struct kvd_store_get {
    kvd_store_lease_t lease; /* from kvd_store_lookup */
    uint64_t user_data;      /* returned in the completion */
} kvd_store_get_t;

/* One finished get, drained by kvd_store_poll. */
typedef struct kvd_store_completion {
    uint64_t user_data;
    /* KVD_OK: `lease` is now a HOST lease (release it when done).
     * Otherwise the object could not be read and the DISK lease is already
     * given back: KVD_ERR_CHECKSUM (bad bytes; the object was dropped),
     * KVD_ERR_IO, KVD_ERR_NOSPACE (no arena slot could be freed),
     * KVD_ERR_CANCELED (store closing). */
    kvd_status_t status;
    uint32_t reserved;
    kvd_store_lease_t lease;
} kvd_store_completion_t;

/*
 * Starts bringing leased objects into the arena; writes how many were
 * accepted (a prefix) into *accepted_out. Each accepted get completes
 * exactly once through kvd_store_poll (a HOST lease completes at once with
 * KVD_OK). Fewer accepted than asked means the queue is full (back-pressure;
 * poll, then submit the rest). Errors (nothing accepted): KVD_ERR_INVALID
 * (NULL arguments, a lease that is not one), KVD_ERR_BUSY. Thread: any.
 */
KVD_API kvd_status_t kvd_store_get_submit(kvd_store_t *store,
                                          const kvd_store_get_t *gets,
                                          size_t num, size_t *accepted_out);

/* Drains up to `max` completions without blocking; returns how many. One
 * polling thread at a time. */
KVD_API size_t kvd_store_poll(kvd_store_t *store, kvd_store_completion_t *out,
                              size_t max);

/* Blocks until a completion is ready or `timeout_ms` passes (-1: forever).
 * KVD_OK (something to poll) or KVD_ERR_TIMEOUT. */
KVD_API kvd_status_t kvd_store_wait(kvd_store_t *store, int timeout_ms);

/* An eventfd that is readable when completions may be ready (for epoll);
 * owned by the store. */
KVD_API int kvd_store_fd(kvd_store_t *store);

/* ---- management ------------------------------------------------------ */

/*
 * Deletes the keys from both tiers (index entries are removed and synced
 * before their extents are reused). Writes the number deleted into
 * *num_deleted_out (may be NULL). A leased or half-written key is skipped
 * and makes the call return KVD_ERR_BUSY after the others are deleted;
 * absent keys are not an error. KVD_ERR_IO (before BUSY): an NVMe object's
 * index record could not be removed: it is gone from the tables now but a
 * restart finds it again (its extent is kept, its bytes intact), so the
 * deletion is not durable. Thread: any.
 */
KVD_API kvd_status_t kvd_store_delete(kvd_store_t *store,
                                      const kvd_store_key_t *keys, size_t num,
                                      size_t *num_deleted_out);

/* One stored object, written by kvd_store_scan. */
typedef struct kvd_store_object {
    kvd_store_key_t key;
    uint32_t tier;   /* kvd_store_tier_t */
    uint32_t tenant; /* the quota domain it was saved under */
    uint64_t size_bytes;
} kvd_store_object_t;

/*
 * Lists stored objects (committed; both tiers; an object in both is listed
 * once per tier), up to `max` per call, for operators (`kvdepot ls`, drop
 * a namespace). *cursor starts at 0 and is advanced; the listing is done
 * when a call writes fewer than `max`. Objects saved or removed meanwhile
 * may or may not appear; none appears twice in one tier. Does not block on
 * I/O. KVD_ERR_UNSUPPORTED in daemon mode (operators ask the daemon).
 * Thread: any.
 */
KVD_API kvd_status_t kvd_store_scan(kvd_store_t *store, uint64_t *cursor,
                                    kvd_store_object_t *out, size_t max,
                                    size_t *n_out);

/* Sets the arena byte quota of `tenant` (0 = unlimited), enforced at
 * reserve. Thread: any. */
KVD_API kvd_status_t kvd_store_tenant_set_quota(kvd_store_t *store,
                                                uint32_t tenant,
                                                uint64_t max_bytes);

/*
 * Waits until every NVMe write queued before the call has finished and is
 * indexed, then syncs the files and the index (durable against power loss).
 * `timeout_ms` -1 waits forever. KVD_OK, KVD_ERR_TIMEOUT, an I/O error
 * from the sync, or the cause of the latest NVMe write dropped since the
 * previous flush (KVD_ERR_IO, KVD_ERR_NOSPACE, ...: those objects stay in
 * the arena only; each drop is reported by one flush, whichever caller's
 * it is). Thread: any.
 */
KVD_API kvd_status_t kvd_store_flush(kvd_store_t *store, int timeout_ms);

typedef struct kvd_store_tier_stats {
    uint64_t capacity_bytes;
    uint64_t bytes; /* held by objects (reserved included) */
    uint64_t objects;
    uint64_t hits;   /* keys matched by lookups in this tier */
    uint64_t misses; /* lookups whose prefix ended in this tier's turn */
    uint64_t evictions;
    uint64_t bytes_written;
    uint64_t bytes_read;
    uint64_t errors; /* I/O and checksum errors */
} kvd_store_tier_stats_t;

typedef struct kvd_store_stats {
    kvd_store_tier_stats_t host;
    kvd_store_tier_stats_t disk; /* all zero without a disk tier */
    uint64_t leases;             /* held now, both tiers */
    uint64_t writes_pending;     /* NVMe writes queued or in flight */
    uint64_t admission_rejects;  /* evictions not written (filter) */
    uint64_t checksum_errors;
    uint64_t dropped_writes; /* write-backs lost to errors or space */
} kvd_store_stats_t;

KVD_API kvd_status_t kvd_store_stats(kvd_store_t *store,
                                     kvd_store_stats_t *out);

#ifdef __cplusplus
}
#endif

#endif /* KVDEPOT_STORE_H */
