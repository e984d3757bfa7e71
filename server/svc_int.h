/*
 * The KvStore service's internals, shared by its files (server/ only; the
 * interface other files use is service_int.h):
 *   service.c              dispatch, counters, create/destroy;
 *   service_tenant.c       the caller's tenant, tenant namespaces, the
 *                          bytes each tenant holds leased;
 *   service_lease.c        lease records and their blocks;
 *   service_lookup.c       Lookup and Release;
 *   service_get.c          Get and Promote;
 *   service_resv.c         reservation records, Reserve, Commit, Abort;
 *   service_admin.c        Stats, Admin, Delete;
 *   service_housekeeping.c the thread: get completions, expiry;
 *   service_events.c       the store's key events for clients (Admin
 *                          events);
 *   service_quarantine.c   sessions, and the expired leases and
 *                          reservations kept for them.
 *
 * Ordering rules:
 *   - `mu` guards the two tables and the records in them. Store calls that
 *     may wait (reserve, which can wait for write-back) or that touch many
 *     keys before we know the outcome (lookup) run without `mu`; the record
 *     is inserted afterwards, so a concurrent call cannot see it half-made.
 *   - A record leaves its table before its store leases are given back, and
 *     a lease record with gets still in flight is freed by the housekeeping
 *     thread when the last one completes (`dead`), so a completion never
 *     finds freed memory.
 *
 * Threading: every call here runs on a caller's thread inside
 * kvd_service_call or on the housekeeping thread; "`mu` held" says the
 * caller holds svc->mu.
 */
#ifndef KVD_SERVER_SVC_INT_H
#define KVD_SERVER_SVC_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/kvd_proto.h"
#include "store/engine.h"
#include "server/service_int.h"

#define SVC_BUCKETS 4096u
#define SVC_POLL_BATCH 64u
/* Key events the service keeps for its clients (service_events.c). */
#define SVC_EVENTS 65536u

typedef struct svc_event svc_event_t;

/* ---- records ------------------------------------------------------------ */

enum svc_block_state {
    SVC_HELD = 0,    /* `lease` is a store lease we hold */
    SVC_PENDING = 1, /* a store get is in flight for it */
    SVC_FAILED = 2,  /* the get failed; nothing held; `status` says why */
};

typedef struct svc_lease svc_lease_t;

typedef struct svc_block {
    kvd_store_lease_t lease;
    svc_lease_t *owner;
    uint8_t state;
    bool in_slab; /* part of the record's slab, not allocated alone */
    kvd_status_t status;
} svc_block_t;

struct svc_lease {
    svc_lease_t *next;
    uint64_t id;
    uint64_t deadline_ns;
    uint32_t ttl_ms;
    kvd_namespace_t ns;
    size_t n, cap;
    svc_block_t **blocks; /* stable addresses: gets point at them */
    svc_block_t *slab;    /* the blocks a Lookup leased, in one allocation */
    uint32_t pending;     /* store gets in flight */
    bool dead;            /* out of the table; free when pending is 0 */
    bool promote;         /* Promote's: give each block back when loaded */
    bool in_table;
    uint32_t tenant;  /* the creator's bound tenant (0: none) */
    uint64_t bytes;   /* object bytes of its blocks (the tenant's count) */
    uint64_t session; /* the creator's hand-off session (0: none) */
};

enum svc_key_state { SVC_RESERVED = 0, SVC_DONE = 1 };

typedef struct svc_resv_key {
    kvd_block_hash_t hash;
    uint64_t offset;
    uint8_t state;
} svc_resv_key_t;

typedef struct svc_resv {
    struct svc_resv *next;
    uint64_t id;
    uint64_t deadline_ns;
    kvd_namespace_t ns;
    uint64_t object_bytes;
    size_t n, open; /* keys, and those still reserved */
    size_t cursor;  /* where the next commit entry is probably */
    svc_resv_key_t *keys;
    uint32_t tenant;       /* the creator's bound tenant (0: none) */
    uint32_t store_tenant; /* the store tenant its slots were taken for */
    uint64_t session;      /* the creator's hand-off session (0: none) */
    /* The creator's part of objects written in parts (1 part: plain). */
    uint32_t part, num_parts;
} svc_resv_t;

/* Object bytes one tenant holds leased (records in the table), and what
 * its lookups found, per tier ([0] host, [1] disk), for its Stats. */
typedef struct svc_held {
    uint32_t tenant;
    uint64_t bytes;
    uint64_t hits[2];
    uint64_t misses[2];
} svc_held_t;

struct kvd_service {
    kvd_service_config_t cfg;
    char node_id[KVD_PROTO_MAX_NODE_ID_BYTES + 1];
    kvd_store_t *store;
    uint64_t started_ns;

    pthread_mutex_t mu;
    svc_lease_t *leases[SVC_BUCKETS];
    svc_resv_t *resvs[SVC_BUCKETS];
    svc_lease_t *graveyard; /* dead records waiting for their gets */
    uint64_t next_id;       /* lease and reservation ids, never 0 */
    uint64_t n_leases, n_leased_blocks, n_resvs;
    svc_held_t *held;
    size_t n_held, cap_held;
    /* Expired records kept for their open session (service_quarantine.c),
     * and the sessions open now. */
    svc_lease_t *q_leases;
    svc_resv_t *q_resvs;
    uint64_t n_q_leases, n_q_resvs, q_bytes;
    uint64_t *sessions;
    size_t n_sessions, cap_sessions;

    pthread_t thread;
    bool thread_started;
    bool stopping;         /* atomic */
    bool draining;         /* atomic: Reserve refuses while set */
    uint64_t heartbeat_ns; /* atomic: end of the thread's last expiry pass */

    /* The key event log (service_events.c): `ev_mu` guards it; ev_on
     * (atomic) once the first Admin events call started it. */
    pthread_mutex_t ev_mu;
    svc_event_t *ev;
    size_t ev_head, ev_len;
    uint64_t ev_next; /* the number the next event gets */
    bool ev_on;

    /* Counters (atomic, relaxed). */
    kvd_service_method_stats_t m[KVD_RPC_COUNT];
    uint64_t errors_by_status[KVD_SERVICE_ERROR_KINDS];
    uint64_t leases_expired, resvs_expired, checksum_errors;
    uint64_t leases_refused;
};

static inline void svc_count(uint64_t *c, uint64_t v)
{
    __atomic_fetch_add(c, v, __ATOMIC_RELAXED);
}

static inline size_t svc_bucket(uint64_t id)
{
    return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 52) % SVC_BUCKETS;
}

static inline uint32_t svc_ttl(uint32_t asked, uint32_t dflt)
{
    return asked != 0 ? asked : dflt;
}

/* ---- service.c: shared helpers ------------------------------------------ */

/* A new lease or reservation id, never 0. `mu` held. */
uint64_t svc_id_new(kvd_service_t *svc);

/* The request's hashes as one array (proto/ checked each is 32 bytes);
 * malloc'd, NULL on OOM. */
kvd_block_hash_t *svc_hashes(const ProtobufCBinaryData *src, size_t n);

/* The wire tier of a store tier. */
Kvdepot__V1__Tier svc_tier(uint32_t tier);

/* Packs a response into *out (malloc'd); a response that fails validation
 * is logged and answered KVD_ERR_INTERNAL. */
kvd_status_t svc_pack(kvd_proto_msg_t type, const ProtobufCMessage *msg,
                      uint8_t **out, size_t *len, char *reason,
                      size_t reason_len);

/* ---- service_tenant.c --------------------------------------------------- */

/* The caller's tenant as its credentials say, for the handler running on
 * this thread (NULL: the request's own), and its id (0 with none);
 * kvd_service_call sets both around the handler. */
extern _Thread_local const char *svc_caller_tenant;
extern _Thread_local uint32_t svc_caller_id;
/* The caller's hand-off session (0: none), set likewise. */
extern _Thread_local uint64_t svc_caller_session;

/* kvd_service_tenant_id. */
uint32_t svc_tenant_id(const char *tenant);

/* Whether this thread's caller may use a lease or reservation its creator
 * (bound to `owner`, 0: none) made. */
bool svc_owns(uint32_t owner);

/* The request's namespace as the store knows it (a bound caller's is its
 * tenant's own copy). Errors: those of kvd_sha256, with `reason`. */
kvd_status_t svc_ns(const ProtobufCBinaryData *src, kvd_namespace_t *ns,
                    char *reason, size_t reason_len);

/* Adds (add) or takes away `bytes` from what `tenant` holds leased. `mu`
 * held. */
void svc_held_add(kvd_service_t *svc, uint32_t tenant, uint64_t bytes,
                  bool add);

/* Bytes `tenant` may still lease under server.tenant_max_leased
 * (UINT64_MAX: no limit). `mu` held. */
uint64_t svc_held_room(kvd_service_t *svc, uint32_t tenant);

/* Counts a lookup of this thread's caller, when it is bound to a tenant,
 * in its tenant's hits and misses, as the store counts its own: `leases`
 * the m found of n looked for, in chain order. Takes `mu`. */
void svc_tenant_count_lookup(kvd_service_t *svc,
                             const kvd_store_lease_t *leases, size_t m,
                             size_t n);

/* `tenant`'s lookup hits and misses per tier ([0] host, [1] disk), and
 * the leases and reservations its callers hold open now. Takes `mu`. */
void svc_tenant_figures(kvd_service_t *svc, uint32_t tenant,
                        uint64_t hits_out[2], uint64_t misses_out[2],
                        uint64_t *leases_out, uint64_t *resvs_out);

/* Object bytes this thread's caller may still reserve under
 * server.max_reserved_bytes (UINT64_MAX: no limit): the cap less what its
 * open and quarantined reservations hold. `mu` held. */
uint64_t svc_reserved_room(kvd_service_t *svc);

/* ---- service_lease.c ---------------------------------------------------- */

/* A lease by id, if this thread's caller may use it. `mu` held. */
svc_lease_t *svc_lease_find(kvd_service_t *svc, uint64_t id);
/* Into / out of the table, with the counts and the tenant's bytes. `mu`
 * held. */
void svc_lease_insert(kvd_service_t *svc, svc_lease_t *l);
void svc_lease_unlink(kvd_service_t *svc, svc_lease_t *l);
/* Frees an out-of-table record and its blocks (holding nothing). */
void svc_lease_free(svc_lease_t *l);
/* A new empty record (calloc'd; NULL on OOM), deadline now + ttl. */
svc_lease_t *svc_lease_new(const kvd_namespace_t *ns, uint32_t ttl_ms);
/* Fills a new record with `m` held store leases; KVD_ERR_NOMEM. */
kvd_status_t svc_lease_fill(svc_lease_t *l, const kvd_store_lease_t *sl,
                            size_t m);
/* Gives back what an out-of-table record holds; frees it unless gets are
 * in flight (then the housekeeping thread frees it). `mu` held. */
void svc_lease_drop(kvd_service_t *svc, svc_lease_t *l);
/* The record's block for `hash`, or NULL. `mu` held. */
svc_block_t *svc_lease_block(svc_lease_t *l, const uint8_t *hash);
/* Takes a store lease on one key into `l`; false if stored nowhere or
 * refused (*err: KVD_ERR_QUOTA, KVD_ERR_NOMEM). `mu` held. */
bool svc_lease_take_one(kvd_service_t *svc, svc_lease_t *l,
                        const kvd_block_hash_t *hash, kvd_status_t *err);
/* Starts the store get of a DISK block. `mu` held. */
void svc_block_fetch(kvd_service_t *svc, svc_block_t *b);
/* Ends the leases named (unknown ids are skipped); returns how many were
 * held. Takes `mu`. */
uint32_t svc_release_ids(kvd_service_t *svc, const uint64_t *ids, size_t n);

/* ---- service_resv.c ----------------------------------------------------- */

/* Out of the table / freed (NULL accepted). `mu` held for unlink. */
void svc_resv_unlink(kvd_service_t *svc, svc_resv_t *r);
void svc_resv_free(svc_resv_t *r);
/* Aborts every key still reserved. `mu` held. */
void svc_resv_abort_open(kvd_service_t *svc, svc_resv_t *r);

/* ---- service_quarantine.c ----------------------------------------------- */

/* An expired lease out of its table: quarantined when its session is open
 * (kept, still counted against its tenant), otherwise given back. `mu`
 * held. */
void svc_lease_expire(kvd_service_t *svc, svc_lease_t *l);
/* An expired reservation out of its table: quarantined when its session
 * is open (its slots stay reserved in the store), otherwise aborted. `mu`
 * held. */
void svc_resv_expire(kvd_service_t *svc, svc_resv_t *r);
/* The caller's acknowledgement of quarantined lease `id`: gives it back;
 * false when there is none of this caller's. `mu` held. */
bool svc_quarantine_release_lease(kvd_service_t *svc, uint64_t id);
/* Likewise for reservation `id`: aborts what it kept; writes the number
 * of slots given back. `mu` held. */
bool svc_quarantine_release_resv(kvd_service_t *svc, uint64_t id,
                                 uint32_t *aborted_out);
/* Gives back everything quarantined (destroy). `mu` held. */
void svc_quarantine_drop_all(kvd_service_t *svc);

/* ---- service_housekeeping.c --------------------------------------------- */

/* The housekeeping thread's body (arg: the service). */
void *svc_main(void *arg);
/* Applies one store get completion. `mu` held. */
void svc_complete(kvd_service_t *svc, const kvd_store_completion_t *c);
/* Ends every lease and reservation, then waits (bounded) for gets still in
 * flight and frees what is left. `mu` held; released while waiting. */
void svc_reclaim_all(kvd_service_t *svc);

/* ---- the handlers (one per method) --------------------------------------- */

/* Each: `req` (len bytes, hostile) in, the packed response in *out
 * (malloc'd, the caller frees) on KVD_OK; otherwise an error, nothing
 * allocated, the reason in `reason`. Run inside kvd_service_call. */

/* service_lookup.c */
kvd_status_t svc_lookup(kvd_service_t *svc, const uint8_t *req, size_t len,
                        uint8_t **out, size_t *out_len, char *reason,
                        size_t reason_len);
kvd_status_t svc_release(kvd_service_t *svc, const uint8_t *req, size_t len,
                         uint8_t **out, size_t *out_len, char *reason,
                         size_t reason_len);

/* service_resv.c */
kvd_status_t svc_reserve(kvd_service_t *svc, const uint8_t *req, size_t len,
                         uint8_t **out, size_t *out_len, char *reason,
                         size_t reason_len);
kvd_status_t svc_commit(kvd_service_t *svc, const uint8_t *req, size_t len,
                        uint8_t **out, size_t *out_len, char *reason,
                        size_t reason_len);
kvd_status_t svc_abort(kvd_service_t *svc, const uint8_t *req, size_t len,
                       uint8_t **out, size_t *out_len, char *reason,
                       size_t reason_len);

/* service_get.c */
kvd_status_t svc_get(kvd_service_t *svc, const uint8_t *req, size_t len,
                     uint8_t **out, size_t *out_len, char *reason,
                     size_t reason_len);
kvd_status_t svc_promote(kvd_service_t *svc, const uint8_t *req, size_t len,
                         uint8_t **out, size_t *out_len, char *reason,
                         size_t reason_len);

/* service_admin.c */
kvd_status_t svc_stats(kvd_service_t *svc, const uint8_t *req, size_t len,
                       uint8_t **out, size_t *out_len, char *reason,
                       size_t reason_len);
kvd_status_t svc_admin(kvd_service_t *svc, const uint8_t *req, size_t len,
                       uint8_t **out, size_t *out_len, char *reason,
                       size_t reason_len);
kvd_status_t svc_delete(kvd_service_t *svc, const uint8_t *req, size_t len,
                        uint8_t **out, size_t *out_len, char *reason,
                        size_t reason_len);

/* ---- service_events.c ---------------------------------------------------- */

/* What an Admin events reply points at until it is packed. */
typedef struct svc_events_reply {
    kvd_pb_events_reply_t reply;
    kvd_pb_store_event_t *events, **eventp;
    kvd_block_hash_t *hashes;
} svc_events_reply_t;

/* Admin events: the events of the request's namespaces after its
 * after_seq into r (r->reply initialised by the caller; free with
 * svc_events_reply_free). Starts the log on the first call. */
kvd_status_t svc_events(kvd_service_t *svc, const kvd_pb_events_t *rq,
                        svc_events_reply_t *r, char *reason, size_t reason_len);
void svc_events_reply_free(svc_events_reply_t *r);
/* Moves the store's queued events into the log (housekeeping). */
void svc_events_pull(kvd_service_t *svc);
void svc_events_free(kvd_service_t *svc);

#endif /* KVD_SERVER_SVC_INT_H */
