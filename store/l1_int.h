/*
 * L1 object table: the in-memory truth of which objects live in the host
 * arena (store/README.md), with leases, pinning, eviction and tenant quotas.
 *
 * An object is named by (namespace digest, block hash) and maps to an opaque
 * arena slot id, a size, a tenant (the `cache_salt` quota domain) and a
 * state. The table never allocates, frees or touches slots: the caller (the
 * store) takes a slot from the arena, reserves a key with it, fills it and
 * commits; slots leave the table only through the calls that hand them back
 * to the caller (kvd_l1_abort, kvd_l1_delete, kvd_l1_evict and the quota
 * eviction inside kvd_l1_reserve), and the caller then frees them.
 *
 * Life of an entry:
 *
 *   reserve --> RESERVED --commit--> READY --evict/delete--> gone
 *                  |                   ^ |
 *                  +--abort--> gone    | +-- lookup_prefix (lease++) /
 *                                      +---- release (lease--)
 *
 * A RESERVED entry is being written: it is invisible to lookups, holds the
 * writer's one reference and can never be evicted. A READY entry is visible;
 * each successful lookup takes one lease (reference) on it and the reader
 * gives it back with kvd_l1_release. An entry with a lease, a pinned entry
 * or a reserved entry is never chosen by eviction, never deleted and so its
 * slot is never handed back to the caller for reuse.
 *
 * Write-back hand-off (L1 -> NVMe demotion): eviction removes a victim from
 * the table at once and passes its slot to the caller, who owns it from
 * then on: it may write the bytes to NVMe, publish the extent in the index
 * and only then free the slot. No "evicting" state exists because none is
 * needed for safety: a victim had no lease when it was chosen, and once
 * removed no lookup can lease it again, so nobody reads the slot but the
 * write-back; the slot cannot be reused because only the caller can free it
 * to the arena. The price is that a lookup racing a write-back misses L1
 * and may miss L2 too (before the index says the extent exists): a miss is
 * always a correct answer for a cache, and the engine recomputes.
 *
 * Eviction policies (chosen at create time):
 *   KVD_L1_S3FIFO  S3-FIFO (Yang et al., SOSP'23): a small FIFO S (10% of
 *                  the capacity by default), a main FIFO M and a ghost FIFO
 *                  G remembering keys (no data) recently evicted from S. New
 *                  objects enter S, or M when their key is in G. Every hit
 *                  increments a 2-bit frequency (capped at 3). Evicting from
 *                  S: an object hit at least once since insertion moves to M,
 *                  one never hit is evicted and its key goes to G. Evicting
 *                  from M: an object with frequency > 0 is decremented and
 *                  reinserted at M's head (second chance), otherwise evicted.
 *                  S is the source while it holds at least its share. One-
 *                  time scans therefore pass through S without disturbing
 *                  the hot set in M.
 *   KVD_L1_LRU     one list, most recently inserted or hit at the head,
 *                  victims from the tail.
 * Leased, pinned and reserved entries are skipped: in S they are moved on to
 * M (they are in use, hence hot); in M and in LRU they keep their place and
 * the scan passes them, so one eviction costs O(1) plus the number of such
 * entries it meets at the cold end (leases are short and pins few).
 *
 * Quotas: each tenant may have a byte quota counting its reserved and ready
 * objects. kvd_l1_reserve for a tenant that would exceed it first evicts
 * that tenant's own evictable objects in policy order (never another
 * tenant's) and fails with KVD_ERR_QUOTA when they cannot free enough.
 *
 * Capacity: the table holds at most `capacity` entries (reserved + ready);
 * all its memory, ghost included, is allocated by kvd_l1_create, so the hot
 * calls never allocate, except kvd_l1_reserve and kvd_l1_tenant_set_quota
 * the first time they see a tenant id.
 *
 * Threading: every call may be made from any thread, concurrently; one
 * mutex serialises them (each holds it for O(1) work plus the scans above,
 * and never calls out of the table). kvd_l1_create and kvd_l1_destroy must
 * not run concurrently with any other call on the same table.
 *
 * Internal: not exported from libkvdepot.so; the store and tests use it.
 */
#ifndef KVD_STORE_L1_INT_H
#define KVD_STORE_L1_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvdepot/common.h"
#include "kvdepot/store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest capacity, in objects (the table costs about 120 bytes per object
 * and per ghost key, allocated up front). */
#define KVD_L1_CAPACITY_MAX (1u << 24)
/* Default share of S3-FIFO's small queue, in percent of the capacity. */
#define KVD_L1_SMALL_PERCENT_DEFAULT 10
/* Frequency cap of S3-FIFO's per-object counter (2 bits). */
#define KVD_L1_FREQ_MAX 3

/* Objects are named by kvd_store_key_t (include/kvdepot/store.h). */

typedef enum kvd_l1_policy {
    KVD_L1_S3FIFO = 0,
    KVD_L1_LRU = 1
} kvd_l1_policy_t;

typedef struct kvd_l1_config {
    /* Most entries (reserved + ready) held at once: 1..KVD_L1_CAPACITY_MAX. */
    uint32_t capacity;
    kvd_l1_policy_t policy;
    /* S3-FIFO: small queue's share of `capacity` in percent, 1..90; 0 gives
     * KVD_L1_SMALL_PERCENT_DEFAULT. The share is at least one object.
     * Ignored by LRU. */
    uint32_t small_percent;
    /* S3-FIFO: keys remembered in the ghost queue, 0..KVD_L1_CAPACITY_MAX;
     * 0 gives the main queue's share (capacity minus the small share), as
     * in the paper. Ignored by LRU. */
    uint32_t ghost_capacity;
} kvd_l1_config_t;

/* An object removed by eviction, quota eviction, delete or abort; its slot
 * now belongs to the caller. */
typedef struct kvd_l1_victim {
    kvd_store_key_t key;
    uint64_t size_bytes;
    uint32_t slot;
    uint32_t tenant;
    bool has_checksum; /* the entry's remembered checksum, as in */
    uint64_t checksum; /* kvd_l1_entry_info_t */
} kvd_l1_victim_t;

/* Table-wide counters, a consistent snapshot taken under the lock. */
typedef struct kvd_l1_stats {
    uint64_t objects;         /* entries, reserved + ready */
    uint64_t reserved;        /* entries being written */
    uint64_t bytes;           /* size_bytes of all entries */
    uint64_t leases;          /* leases held (sum of readers' references) */
    uint64_t leased_objects;  /* ready entries with at least one lease */
    uint64_t pinned_objects;  /* entries pinned */
    uint64_t pinned_bytes;    /* their size_bytes */
    uint64_t hits;            /* keys matched by kvd_l1_lookup_prefix */
    uint64_t misses;          /* lookups that stopped before their last key */
    uint64_t commits;         /* kvd_l1_commit successes */
    uint64_t aborts;          /* kvd_l1_abort successes */
    uint64_t deletes;         /* kvd_l1_delete successes */
    uint64_t evictions;       /* victims of kvd_l1_evict */
    uint64_t quota_evictions; /* victims of quota eviction in reserve */
    uint64_t quota_rejects;   /* reserves failed with KVD_ERR_QUOTA */
    uint64_t ghost_hits;      /* reserves admitted to M from the ghost */
    /* Queue lengths: S3-FIFO uses small/main/ghost, LRU uses lru. Reserved
     * entries sit in no queue until committed. */
    uint64_t small_objects;
    uint64_t main_objects;
    uint64_t ghost_keys;
    uint64_t lru_objects;
} kvd_l1_stats_t;

typedef struct kvd_l1_tenant_stats {
    uint64_t objects;         /* entries, reserved + ready */
    uint64_t bytes;           /* their size_bytes, what the quota counts */
    uint64_t evictable_bytes; /* ready, unleased, unpinned */
    uint64_t quota_bytes;     /* 0 = unlimited */
    uint64_t evictions;       /* victims of kvd_l1_evict and quota */
    uint64_t quota_rejects;
} kvd_l1_tenant_stats_t;

typedef struct kvd_l1 kvd_l1_t;

/*
 * Creates an empty table and writes it to `*l1_out`. `cfg` is borrowed.
 * Errors (nothing allocated, `*l1_out` untouched):
 *   KVD_ERR_INVALID  NULL argument, capacity 0 or above the maximum, unknown
 *                    policy, small_percent above 90, ghost_capacity above
 *                    the maximum.
 *   KVD_ERR_NOMEM    allocation failed (failpoint "l1.alloc", evaluated
 *                    once per allocation: four of them).
 *   other            pthread_mutex_init failed (errno translated).
 */
kvd_status_t kvd_l1_create(const kvd_l1_config_t *cfg, kvd_l1_t **l1_out);

/* Frees the table. Entries still present are dropped without handing their
 * slots back: the caller frees the whole arena with it. NULL is a no-op. */
void kvd_l1_destroy(kvd_l1_t *l1);

/*
 * Sets `tenant`'s quota to `max_bytes` (0 = unlimited). Lowering a quota
 * below the tenant's current bytes evicts nothing: the next reserve for the
 * tenant does. Errors: KVD_ERR_INVALID (NULL l1), KVD_ERR_NOMEM (first time
 * this tenant is seen and its record cannot be allocated).
 */
kvd_status_t kvd_l1_tenant_set_quota(kvd_l1_t *l1, uint32_t tenant,
                                     uint64_t max_bytes);

/*
 * Puts `tenant` in eviction group `group` (0 by default for every tenant):
 * the objects it reserves from then on belong to that group, and
 * kvd_l1_evict_group() takes victims of one group only. The store gives
 * each tenant with its own arena partition that partition's number, so
 * evicting for one partition never takes objects whose slots are in
 * another. Set it before the tenant's first reserve. Errors as
 * kvd_l1_tenant_set_quota().
 */
kvd_status_t kvd_l1_tenant_set_group(kvd_l1_t *l1, uint32_t tenant,
                                     uint8_t group);

/*
 * Adds `key` in state RESERVED for a writer filling `slot` with
 * `size_bytes` bytes for `tenant`. The entry is invisible to lookups and
 * holds the writer's reference until kvd_l1_commit or kvd_l1_abort. The
 * slot is not checked: the caller guarantees it owns it.
 *
 * Admission: if the tenant's reserved + ready bytes plus `size_bytes`
 * exceed its quota, the tenant's own evictable objects are evicted in
 * policy order until the new object fits. They are written to
 * `victims_out` (up to `max_victims`; the count to `*n_victims_out`), and
 * the caller must free or write back their slots exactly like kvd_l1_evict
 * victims. A key recently evicted from S3-FIFO's small queue (in the ghost)
 * will enter the main queue on commit.
 *
 * `*n_victims_out` is written on every return except KVD_ERR_INVALID, even
 * on failure, because victims evicted before a failure are gone for good.
 *
 * Errors:
 *   KVD_ERR_INVALID  NULL l1/key/n_victims_out, size_bytes 0, or
 *                    victims_out NULL with max_victims > 0.
 *   KVD_ERR_EXISTS   `key` is present (reserved or ready); nothing evicted.
 *   KVD_ERR_RANGE    the table's byte count would overflow 64 bits.
 *   KVD_ERR_NOSPACE  the table holds `capacity` entries and no quota
 *                    eviction is due: evict first (nothing evicted).
 *   KVD_ERR_QUOTA    `size_bytes` exceeds the quota, or the tenant's
 *                    evictable objects cannot free enough (nothing
 *                    evicted), or `max_victims` was reached first (the
 *                    victims so far are returned).
 *   KVD_ERR_NOMEM    first sight of `tenant` and its record cannot be
 *                    allocated (failpoint "l1.tenant_alloc").
 */
kvd_status_t kvd_l1_reserve(kvd_l1_t *l1, const kvd_store_key_t *key,
                            uint32_t tenant, uint64_t size_bytes, uint32_t slot,
                            kvd_l1_victim_t *victims_out, size_t max_victims,
                            size_t *n_victims_out);

/*
 * Publishes a RESERVED entry: it becomes READY (visible to lookups and
 * eligible for eviction) and the writer's reference is dropped.
 * Errors: KVD_ERR_INVALID (NULL), KVD_ERR_NOT_FOUND (no such entry),
 * KVD_ERR_STATE (already ready).
 */
kvd_status_t kvd_l1_commit(kvd_l1_t *l1, const kvd_store_key_t *key);

/*
 * As kvd_l1_commit, and the writer's reference becomes one lease in the
 * same step, so the entry cannot be evicted before the caller is done with
 * it (write-through, promotion from NVMe). Release it with kvd_l1_release.
 * Counts no hit. Errors: as kvd_l1_commit.
 */
kvd_status_t kvd_l1_commit_acquire(kvd_l1_t *l1, const kvd_store_key_t *key);

/*
 * As kvd_l1_commit (kvd_l1_commit_acquire when `acquire`), and the entry
 * keeps `checksum`, the XXH3-64 of its bytes, which the caller has checked
 * against them; kvd_l1_peek reports it, so a reader that needs it (the
 * cluster data plane sending the object) need not read the bytes again.
 * Errors: as kvd_l1_commit.
 */
kvd_status_t kvd_l1_commit_checksum(kvd_l1_t *l1, const kvd_store_key_t *key,
                                    uint64_t checksum, bool acquire);

/*
 * Removes a RESERVED entry (the write failed) and writes its slot to
 * `*slot_out`; the caller frees it. Errors: KVD_ERR_INVALID (NULL),
 * KVD_ERR_NOT_FOUND, KVD_ERR_STATE (the entry is ready: use delete).
 */
kvd_status_t kvd_l1_abort(kvd_l1_t *l1, const kvd_store_key_t *key,
                          uint32_t *slot_out);

/*
 * Finds the longest prefix keys[0..m) of READY entries, takes one lease on
 * each of them and writes their slots to slots_out[0..m) and m to
 * `*matched_out`. The scan stops at the first key that is absent, reserved
 * or whose lease count is saturated (UINT32_MAX). Matching and leasing
 * happen under one lock hold, so no match can be evicted in between. Each
 * match counts as a hit for the policy (S3-FIFO frequency, LRU recency) and
 * in stats.hits; a lookup stopping before keys[n-1] adds one to
 * stats.misses. Every leased key must be released with kvd_l1_release.
 * `keys` and `slots_out` have `n` elements (both may be NULL when n is 0);
 * `sizes_out` (n elements, or NULL) gets each match's size_bytes, read in
 * the same lock hold (a lease pins the entry, so it cannot change).
 * Errors: KVD_ERR_INVALID (NULL l1/matched_out, or NULL arrays with n > 0).
 */
kvd_status_t kvd_l1_lookup_prefix(kvd_l1_t *l1, const kvd_store_key_t *keys,
                                  size_t n, uint32_t *slots_out,
                                  uint64_t *sizes_out, size_t *matched_out);

/*
 * Drops one lease taken by kvd_l1_lookup_prefix. Errors: KVD_ERR_INVALID
 * (NULL), KVD_ERR_NOT_FOUND, KVD_ERR_STATE (entry reserved, or no lease
 * held on it).
 */
kvd_status_t kvd_l1_release(kvd_l1_t *l1, const kvd_store_key_t *key);

/* kvd_l1_release of n keys under one lock hold: every key is tried; the
 * first error is returned. */
kvd_status_t kvd_l1_release_many(kvd_l1_t *l1, const kvd_store_key_t *keys,
                                 size_t n);

/*
 * Takes one lease on the READY entry `key`, as kvd_l1_lookup_prefix would,
 * and writes its slot to `*slot_out`, but counts no hit or miss and does
 * not touch the eviction order: for the store's own readers. Errors:
 * KVD_ERR_INVALID (NULL), KVD_ERR_NOT_FOUND, KVD_ERR_STATE (reserved, or
 * the lease count is saturated).
 */
kvd_status_t kvd_l1_acquire(kvd_l1_t *l1, const kvd_store_key_t *key,
                            uint32_t *slot_out);

/* An entry as it is now, for kvd_l1_peek. */
typedef struct kvd_l1_entry_info {
    bool ready;  /* false: reserved */
    bool doomed; /* kvd_l1_doom: no longer matched */
    bool pinned;
    uint32_t refs; /* leases held (ready entries) */
    uint32_t slot;
    uint32_t tenant;
    uint64_t size_bytes;
    bool has_checksum; /* committed by kvd_l1_commit_checksum */
    uint64_t checksum; /* XXH3-64 of the bytes, when has_checksum */
} kvd_l1_entry_info_t;

/*
 * Marks the READY entry `key` as holding bad bytes: lookups and acquires no
 * longer match it (as if it were gone), leases already held stay valid
 * until released, and delete or eviction removes it once it is free. For
 * an object whose checksum failed while other readers held it. Errors:
 * KVD_ERR_INVALID (NULL), KVD_ERR_NOT_FOUND, KVD_ERR_STATE (reserved).
 */
kvd_status_t kvd_l1_doom(kvd_l1_t *l1, const kvd_store_key_t *key);

/* Writes `key`'s entry into *info_out without side effects (no lease, no
 * hit). Errors: KVD_ERR_INVALID (NULL), KVD_ERR_NOT_FOUND. */
kvd_status_t kvd_l1_peek(kvd_l1_t *l1, const kvd_store_key_t *key,
                         kvd_l1_entry_info_t *info_out);

/*
 * Pins (`pinned` true) or unpins an entry, reserved or ready. A pinned entry
 * is never evicted, by policy or quota; delete still removes it. Pinning is
 * a flag, not a count. `max_pinned_bytes` (0: no bound): a pin that would
 * take the pinned entries' bytes past it is refused (KVD_ERR_QUOTA).
 * Errors: KVD_ERR_INVALID (NULL), KVD_ERR_NOT_FOUND, KVD_ERR_QUOTA.
 */
kvd_status_t kvd_l1_pin(kvd_l1_t *l1, const kvd_store_key_t *key, bool pinned,
                        uint64_t max_pinned_bytes);

/*
 * Evicts READY, unleased, unpinned entries in policy order until at least
 * `want_objects` objects and `want_bytes` bytes are freed, `max_victims`
 * victims are taken or nothing evictable is left. Victims are removed from
 * the table and written to victims_out[0..*n_out); their slots now belong
 * to the caller (see the write-back hand-off above). Fewer victims than
 * asked is not an error: `*n_out` tells. Errors: KVD_ERR_INVALID (NULL
 * l1/n_out, or NULL victims_out with max_victims > 0).
 */
kvd_status_t kvd_l1_evict(kvd_l1_t *l1, size_t want_objects,
                          uint64_t want_bytes, kvd_l1_victim_t *victims_out,
                          size_t max_victims, size_t *n_out);

/* kvd_l1_evict() among the objects of eviction group `group` only (see
 * kvd_l1_tenant_set_group()); the others keep their places. */
kvd_status_t kvd_l1_evict_group(kvd_l1_t *l1, uint8_t group,
                                size_t want_objects, uint64_t want_bytes,
                                kvd_l1_victim_t *victims_out,
                                size_t max_victims, size_t *n_out);

/*
 * Removes a READY entry (pinned or not) and writes it to `*removed_out`;
 * its slot belongs to the caller. Errors: KVD_ERR_INVALID (NULL),
 * KVD_ERR_NOT_FOUND, KVD_ERR_STATE (reserved: use abort), KVD_ERR_BUSY
 * (leased: retry after the readers release).
 */
kvd_status_t kvd_l1_delete(kvd_l1_t *l1, const kvd_store_key_t *key,
                           kvd_l1_victim_t *removed_out);

/* Writes a snapshot of the table's counters. KVD_ERR_INVALID on NULL. */
/* One READY entry, written by kvd_l1_scan. */
typedef struct kvd_l1_scan_entry {
    kvd_store_key_t key;
    uint64_t size_bytes;
    uint32_t tenant;
} kvd_l1_scan_entry_t;

/*
 * Walks the READY, not doomed entries in table order, up to `max` per call:
 * *cursor starts at 0 and is advanced; the walk is over when a call writes
 * fewer than `max` entries. Entries added or removed while walking may or
 * may not be seen; none is seen twice. One lock hold per call.
 */
kvd_status_t kvd_l1_scan(kvd_l1_t *l1, uint64_t *cursor,
                         kvd_l1_scan_entry_t *out, size_t max, size_t *n_out);

kvd_status_t kvd_l1_stats(kvd_l1_t *l1, kvd_l1_stats_t *stats_out);

/* Writes `tenant`'s counters. KVD_ERR_INVALID on NULL, KVD_ERR_NOT_FOUND
 * when the tenant was never seen by reserve or set_quota. */
kvd_status_t kvd_l1_tenant_stats(kvd_l1_t *l1, uint32_t tenant,
                                 kvd_l1_tenant_stats_t *stats_out);

#ifdef __cplusplus
}
#endif

#endif /* KVD_STORE_L1_INT_H */
