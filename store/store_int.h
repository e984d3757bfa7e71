/*
 * The embedded store's internals, shared by store.c (the public calls:
 * open/close, reserve/commit, lookup/release, delete, stats) and store_io.c
 * (the I/O thread: write-back to NVMe, promotion from NVMe, index batches,
 * periodic sync).
 *
 * Tables. `l1` (kvd_l1_t) holds the objects in the arena, slot = arena slot
 * id. `l2` is a second kvd_l1_t holding the objects on NVMe, slot = extent
 * id: the same leases keep an extent from being evicted or deleted while a
 * promotion reads it, and the same S3-FIFO picks what leaves a full disk.
 * The LMDB index is the persistent copy of `l2`: `l2` is rebuilt from it at
 * open, and an object enters `l2` as READY only after its bytes are written
 * and its record committed.
 *
 * Jobs. Every NVMe transfer is a store_job_t. Writers (reserve's eviction,
 * commit with write-through) append write jobs to `wq`; kvd_store_get_submit
 * appends read jobs to `gq`; the NVMe completion callback moves a finished
 * job to `doneq`. The I/O thread alone takes jobs off the three queues, so
 * the tables, the index and the extent allocator see each object's steps in
 * order. All three queues and the counters beside them are guarded by `mu`.
 *
 * Lock order: `mu` is never held while calling into l1/l2/arena/index/nvme
 * (each has its own lock), except kvd_nvme_submit's callback, which only
 * takes `mu` to append to `doneq`.
 */
#ifndef KVD_STORE_STORE_INT_H
#define KVD_STORE_STORE_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/ring_int.h"
#include "kvdepot/store.h"
#include "store/arena.h"
#include "store/index.h"
#include "store/l1_int.h"
#include "store/nvme_int.h"
#include "store/ops.h"
#include "store/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvd_embedded kvd_embedded_t;

enum store_disk_write {
    STORE_WRITE_BACK = 0,   /* NVMe on L1 eviction */
    STORE_WRITE_THROUGH = 1 /* NVMe on every commit */
};

enum store_admission {
    STORE_ADMIT_ALL = 0,   /* every evicted object goes to NVMe */
    STORE_ADMIT_SECOND = 1 /* only objects seen at least twice */
};

enum store_mode {
    STORE_MODE_EMBEDDED = 0, /* this process owns the store */
    STORE_MODE_DAEMON = 1    /* calls go to kvdepotd (client/) */
};

/* The `store.*` settings, one struct so one table can be applied. */
typedef struct store_settings {
    int mode; /* enum store_mode */
    char address[KVD_CONFIG_STRING_MAX];
    char token_file[KVD_CONFIG_STRING_MAX]; /* tcp: the bearer token's file */
    char tls_ca[KVD_CONFIG_STRING_MAX];     /* tcp: CA of the daemon's cert */
    char tls_cert[KVD_CONFIG_STRING_MAX];   /* tcp: this client's cert */
    char tls_key[KVD_CONFIG_STRING_MAX];    /* tcp: and its key */
    uint64_t timeout_ms;
    uint64_t lease_ttl_ms;
    kvd_arena_config_t arena;
    kvd_nvme_config_t nvme;
    int l1_policy;            /* kvd_l1_policy_t */
    int64_t l1_max_objects;   /* 0: from the arena size */
    uint64_t pin_max_bytes;   /* pinned bytes at most (0: half the arena) */
    int64_t disk_max_objects; /* 0: from the disk size */
    int disk_write;           /* enum store_disk_write */
    int disk_admission;       /* enum store_admission */
    uint64_t index_map_bytes;
    uint64_t sync_interval_ms;   /* 0: sync after every index batch */
    uint64_t stop_flush_ms;      /* close: flush for this long (0: not) */
    uint64_t reserve_timeout_ms; /* wait for write-back to free slots */
    int64_t get_queue;           /* gets accepted and not yet polled */
    uint64_t part_timeout_ms;    /* objects in parts: all parts by then */
} store_settings_t;

/* Bytes the admission filter spends: one saturating counter per bucket. */
#define STORE_SIGHT_BUCKETS (1u << 20)

typedef enum store_job_kind {
    STORE_JOB_WRITE = 0,
    STORE_JOB_READ = 1
} store_job_kind_t;

typedef struct store_job store_job_t;
struct store_job {
    store_job_t *next;
    kvd_embedded_t *store;
    store_job_kind_t kind;
    kvd_store_key_t key;
    uint32_t tenant;
    uint64_t size_bytes;
    uint32_t slot;   /* arena slot: the source of a write, a read's target */
    uint32_t extent; /* NVMe extent, KVD_NVME_EXTENT_INVALID until known */
    bool leased;     /* write: the slot is an L1 lease (write-through) to
                        release, not an evicted slot to free */
    /* XXH3-64 of the bytes. A write whose entry remembers the checksum a
     * writer checked at commit (store/engine.h) takes it from there
     * (has_checksum) and checks the slot against it before the NVMe write:
     * bytes changed since the commit are dropped, never written or indexed
     * (store_io.c); a change racing the write itself fails the NVMe read's
     * check instead of being indexed with a checksum of the damaged
     * bytes. */
    bool has_checksum;
    uint64_t checksum;
    kvd_status_t io_status;
    uint64_t deadline_ns; /* read: give up waiting for a slot (0: not
                             waiting yet) */
    kvd_store_get_t get;  /* read: what the caller asked */
};

typedef struct store_queue {
    store_job_t *head, *tail;
    size_t len;
} store_queue_t;

/* The embedded engine: a kvd_store_t whose ops are kvd_store_embedded_ops.
 * `base` comes first, so the store handle and the engine are one pointer. */
struct kvd_embedded {
    kvd_store_t base;
    store_settings_t cfg;

    kvd_arena_t *arena;
    kvd_arena_info_t arena_info;
    kvd_l1_t *l1;

    /* Disk tier; all NULL without store.disk_path. */
    kvd_nvme_t *nvme;
    kvd_index_t *index;
    kvd_l1_t *l2;
    bool fixed_buffers; /* arena chunks registered with io_uring */

    /* Completions of gets, pushed by the I/O thread, popped by the poller. */
    kvd_ring_t *cq;
    uint64_t gets_outstanding; /* accepted, not yet polled (atomic) */
    bool fd_wanted;            /* kvd_store_fd was called: polls arm the ring */

    uint8_t *sight; /* admission filter counters (atomic bytes) */

    /* Tenants with an arena partition of their own: partition i + 1 is
     * part_tenants[i]'s; every other tenant uses partition 0. Fixed at
     * open. */
    uint32_t num_part_tenants;
    uint32_t part_tenants[KVD_ARENA_PARTS_MAX];

    pthread_mutex_t mu;
    pthread_cond_t work_cv;  /* I/O thread: something queued or done */
    pthread_cond_t space_cv; /* reservers: slots freed */
    pthread_cond_t idle_cv;  /* flush: writes_pending reached 0 */
    store_queue_t wq, gq, doneq;
    uint64_t writes_pending; /* write jobs queued or in flight */
    uint64_t ios_inflight;   /* jobs handed to the NVMe tier */
    bool stopping;
    pthread_t io_thread;
    bool io_thread_started;

    /* Counters (atomic, relaxed). */
    struct {
        uint64_t host_hits, host_misses, disk_hits, disk_misses;
        uint64_t host_evictions, disk_evictions;
        uint64_t disk_bytes_written, disk_bytes_read, disk_errors;
        uint64_t admission_rejects, checksum_errors, dropped_writes;
        uint64_t host_errors;
    } n;
    /* Flush reports the writes dropped since the previous flush: the count
     * it saw last, and why the latest drop happened (atomic). */
    uint64_t flush_dropped_seen;
    int last_drop_status;

    /* Key events (store_events.c): a ring of ev_cap events from ev_head,
     * ev_len of them queued, guarded by ev_mu (taken alone, never with
     * another lock held inside it). ev_on (atomic) spares the lock while
     * recording is off. */
    pthread_mutex_t ev_mu;
    bool ev_on;
    kvd_store_event_t *ev;
    size_t ev_cap, ev_head, ev_len;
    uint64_t ev_dropped;
    kvd_namespace_t ev_watch[KVD_STORE_EVENTS_WATCH_MAX];
    size_t ev_n_watch; /* 0: every namespace */

    /* Objects being written in parts (store_parts.c): a chained hash table
     * of the open ones, guarded by parts_mu (taken before mu and the L1's
     * locks, never inside them). parts_n (atomic) spares the lock of the
     * plain commit's check while there are none. */
    pthread_mutex_t parts_mu;
    struct store_parts_entry **parts;
    size_t parts_n;
    uint64_t parts_sweep_ns; /* next look for abandoned objects */
};

/* The engine behind `store`, or NULL when it is not an embedded store. */
static inline kvd_embedded_t *store_embedded(kvd_store_t *store)
{
    return store != NULL && store->ops == &kvd_store_embedded_ops
               ? (kvd_embedded_t *)store
               : NULL;
}

/* Relaxed counter helpers. */
static inline void store_count(uint64_t *counter, uint64_t v)
{
    __atomic_fetch_add(counter, v, __ATOMIC_RELAXED);
}

static inline uint64_t store_read(const uint64_t *counter)
{
    return __atomic_load_n(counter, __ATOMIC_RELAXED);
}

/* Lookups and reserves convert keys in chunks of this many on the stack. */
#define STORE_KEY_CHUNK 64u
/* Victims taken by one eviction step. */
#define STORE_EVICT_BATCH 16u

/* The arena partition of `tenant`'s objects (0: the main one). */
uint32_t store_part_of(const kvd_embedded_t *st, uint32_t tenant);

/* The engine's store.h calls (store/ops.h: arguments already checked),
 * filled into kvd_store_embedded_ops: save (store_save.c), load
 * (store_load.c), management (store_manage.c). */
kvd_status_t store_op_lookup(kvd_store_t *base, const kvd_namespace_t *ns,
                             const kvd_block_hash_t *hashes, size_t num_hashes,
                             const char *source_node,
                             kvd_store_lease_t *leases_out,
                             size_t *matched_out);
kvd_status_t store_op_release(kvd_store_t *base,
                              const kvd_store_lease_t *leases, size_t num);
kvd_status_t store_op_get_submit(kvd_store_t *base, const kvd_store_get_t *gets,
                                 size_t num, size_t *accepted_out);
size_t store_op_poll(kvd_store_t *base, kvd_store_completion_t *out,
                     size_t max);
kvd_status_t store_op_wait(kvd_store_t *base, int timeout_ms);
int store_op_fd(kvd_store_t *base);
kvd_status_t store_op_delete(kvd_store_t *base, const kvd_store_key_t *keys,
                             size_t num, size_t *num_deleted_out);
kvd_status_t store_op_scan(kvd_store_t *base, uint64_t *cursor,
                           kvd_store_object_t *out, size_t max, size_t *n_out);
kvd_status_t store_op_tenant_set_quota(kvd_store_t *base, uint32_t tenant,
                                       uint64_t max_bytes);
kvd_status_t store_op_flush(kvd_store_t *base, int timeout_ms);
kvd_status_t store_op_pin(kvd_store_t *base, const kvd_store_key_t *keys,
                          size_t num, bool pinned, size_t *num_done_out,
                          size_t *num_missing_out);
kvd_status_t store_op_stats(kvd_store_t *base, kvd_store_stats_t *out);
kvd_status_t store_op_events_enable(kvd_store_t *base, size_t capacity);
kvd_status_t store_op_events_watch(kvd_store_t *base, const kvd_namespace_t *ns,
                                   size_t num);
kvd_status_t store_op_take_events(kvd_store_t *base, kvd_store_event_t *out,
                                  size_t max, size_t *n_out,
                                  uint64_t *dropped_out);

/* Queues one key event when recording is on (store_events.c). Thread:
 * any; takes ev_mu only. */
void store_event(kvd_embedded_t *st, const kvd_store_key_t *key,
                 kvd_store_event_kind_t kind);
/* Queues KVD_STORE_EVENT_REMOVED for `key` unless `other` (the tier the
 * caller did not remove it from; NULL: none) still holds it. */
void store_event_removed(kvd_embedded_t *st, const kvd_store_key_t *key,
                         kvd_l1_t *other);
kvd_status_t store_op_reserve(kvd_store_t *base, const kvd_namespace_t *ns,
                              const kvd_block_hash_t *hashes, size_t num_hashes,
                              uint64_t object_bytes, uint32_t tenant,
                              kvd_store_reservation_t *out);
kvd_status_t store_op_commit(kvd_store_t *base, const kvd_store_key_t *keys,
                             size_t num, kvd_status_t *statuses_out);
kvd_status_t store_op_abort(kvd_store_t *base, const kvd_store_key_t *keys,
                            size_t num, kvd_status_t *statuses_out);

/* The arena class of objects of `object_bytes` (registered on first use);
 * KVD_ERR_INVALID past a chunk (store_save.c). */
kvd_status_t store_reserve_class(kvd_embedded_t *st, uint64_t object_bytes,
                                 uint32_t *class_out);

/* One key of a reserve (store_save.c): KVD_OK with its slot's offset, or
 * KVD_ERR_EXISTS / NOSPACE / QUOTA. `class_id` registered for
 * object_bytes; *deadline_ns starts at 0 and is shared by a batch. */
kvd_status_t store_reserve_one(kvd_embedded_t *st, const kvd_store_key_t *key,
                               uint32_t class_id, uint64_t object_bytes,
                               uint32_t tenant, uint64_t *deadline_ns,
                               uint64_t *offset_out);

/* Publishes one reserved key; `xxh3`, when not NULL, is the checksum of
 * its bytes the caller checked (store_save.c). */
kvd_status_t store_commit_one(kvd_embedded_t *store, const kvd_store_key_t *key,
                              const uint64_t *xxh3);

/* Objects written in parts (store_parts.c): the ops, the table's life, and
 * whether `key` is one (the plain commit and abort refuse it). */
kvd_status_t store_op_reserve_part(kvd_store_t *base, const kvd_namespace_t *ns,
                                   const kvd_block_hash_t *hashes,
                                   size_t num_hashes, uint64_t object_bytes,
                                   uint32_t tenant, uint32_t part,
                                   uint32_t num_parts,
                                   kvd_store_reservation_t *out);
kvd_status_t store_op_end_part(kvd_store_t *base, const kvd_store_key_t *keys,
                               size_t num, uint32_t part, bool commit,
                               kvd_status_t *statuses_out, bool *published_out);
kvd_status_t store_parts_init(kvd_embedded_t *st);
void store_parts_free(kvd_embedded_t *st);
bool store_parts_has(kvd_embedded_t *st, const kvd_store_key_t *key);
/* Abandons the objects in parts past their deadline and gives back the
 * slots no part writes any more; plain reserves call it too, so such a
 * slot goes back even when no writer in parts calls again. */
void store_parts_tick(kvd_embedded_t *st);

/* Admission filter: one more sighting of `key`, and whether it has been
 * seen at least twice. */
void store_sight(kvd_embedded_t *st, const kvd_store_key_t *key);
bool store_sighted_twice(kvd_embedded_t *st, const kvd_store_key_t *key);

/* Takes the slots of objects evicted from L1: frees them, or queues the
 * write-back of those the disk tier should keep. Any thread, `mu` not held. */
void store_victims_dispose(kvd_embedded_t *st, const kvd_l1_victim_t *victims,
                           size_t n);

/* Evicts from L1 until an arena slot of `class_id` is free in `tenant`'s
 * partition and takes it; KVD_ERR_NOSPACE when nothing evictable is left
 * there. Only objects of that partition are evicted. `mu` not held. */
kvd_status_t store_slot_alloc_evicting(kvd_embedded_t *st, uint32_t tenant,
                                       uint32_t class_id, uint64_t object_bytes,
                                       uint32_t *slot_out);

/* Appends a job to a queue (`mu` held). */
void store_queue_push(store_queue_t *q, store_job_t *job);
/* Moves every job of `q` into a list returned to the caller (`mu` held). */
store_job_t *store_queue_take(store_queue_t *q);

/* Removes (or, while leased, dooms) an NVMe object whose bytes failed
 * their checksum. Any thread, `mu` not held. */
void store_forget_corrupt(kvd_embedded_t *st, const kvd_store_key_t *key);

/* I/O thread body (store_io.c), started by kvd_store_open. */
void *store_io_main(void *arg);

/* Flush (store_manage.c): queues the write-back of every arena object with
 * no NVMe copy (each pinned by a lease until written; objects evicted or
 * deleted meanwhile are skipped), waits for every queued write, then syncs
 * the NVMe files and the index. `timeout_ms` -1: no deadline. Returns as
 * kvd_store_flush; *queued_out (may be NULL) counts the write-backs it
 * queued itself. Any thread, `mu` not held. */
kvd_status_t store_flush(kvd_embedded_t *store, int timeout_ms,
                         uint64_t *queued_out);

/* Arena objects with no NVMe copy now (0 without a disk tier). */
uint64_t store_host_only_count(kvd_embedded_t *st);

/* Index records of L2 victims are deleted (and synced) before their
 * extents are freed. KVD_ERR_IO when some records could not be removed
 * (their extents stay allocated; a restart finds those objects again).
 * Any thread, `mu` not held. */
kvd_status_t store_l2_victims_dispose(kvd_embedded_t *st,
                                      const kvd_l1_victim_t *victims, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* KVD_STORE_STORE_INT_H */
