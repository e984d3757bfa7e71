/*
 * The inside of the store client (client/client.h), shared by the files of
 * client/ and by nobody else:
 *
 *   client.c     open and close: the one place that builds and tears down
 *                a kvd_client_t
 *   transport.c  one unary gRPC call with its deadline and the daemon
 *                instance; the only client file that includes grpc.h
 *   mapping.c    the daemon's arena mapped here, mapped again after a
 *                restart, and the arena pointer calls
 *   lease.c      Lookup's leases (counted per lease id) and their release
 *   data.c       Reserve, Commit, Abort and Delete
 *   get.c        gets of disk-tier blocks, driven by the get thread
 *   admin.c      Stats and the Admin calls (the CLI's operator calls)
 *
 * Locking: `mu` guards every field below it in struct kvd_client; the
 * functions marked "`mu` held" expect it taken, the others take it
 * themselves. No gRPC call is made with `mu` held.
 */
#ifndef KVD_CLIENT_CLIENT_INT_H
#define KVD_CLIENT_CLIENT_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/un.h>

#include "client/client.h"
#include "client/handoff.h"
#include "common/config_int.h"
#include "common/ring_int.h"
#include "proto/kvd_proto.h"
#include "store/arena.h"
#include "store/ops.h" /* kvd_store_t, the client's first member */

#ifdef __cplusplus
extern "C" {
#endif

#define CL_BUCKETS 4096u
#define CL_MAPPINGS_MAX 16u
#define CL_MAX_MESSAGE (32 << 20)
/* Released lease ids wait at most this long for a Lookup to carry them. */
#define CL_RELEASE_DELAY_MS 2
#define CL_RELEASE_BATCH 1024u

/* One mapping of a daemon instance's arena. `held`: leases (blocks) and
 * reservations of that instance the caller holds; a mapping that is not
 * the current one is unmapped when it reaches zero. */
typedef struct cl_map {
    kvd_arena_mapping_t *map;
    uint64_t instance;
    uint32_t gen; /* kvd_store_reservation_t.reserved */
    uint64_t held;
} cl_map_t;

/* Handed-out blocks of one daemon lease id. `deadline_ns`: when the
 * daemon may end the lease (the reply's TTL counted from before the call
 * was sent, so never later than the daemon's own deadline); past it no
 * pointer of the group is handed out and releasing a block of it answers
 * KVD_ERR_TIMEOUT. A Get on the id extends it. */
typedef struct cl_group {
    uint64_t lease_id;
    uint64_t instance;
    uint64_t deadline_ns;
    uint32_t refs;
    uint32_t next_free; /* free list, index + 1 */
} cl_group_t;

/* One handed-out block of a lease group; a lease's `reserved` word is its
 * index + 1, so each block is released once and only once. `tag`: the
 * first 8 bytes of the key's hash, which a stale lease naming a reused
 * entry does not match. */
typedef struct cl_lblock {
    uint32_t group;     /* index + 1; 0: free */
    uint32_t next_free; /* free list, index + 1 */
    uint64_t tag;
} cl_lblock_t;

/* A reserved key waiting for commit or abort, in two chains: by key
 * (commit / abort) and by (instance, offset) (the reservation pointer).
 * Past `deadline_ns` (the reply's TTL counted from before the call) the
 * pointer is refused and a commit becomes an abort (KVD_ERR_TIMEOUT). */
typedef struct cl_resv {
    struct cl_resv *next;
    struct cl_resv *next_off;
    kvd_store_key_t key;
    uint64_t reservation_id;
    uint64_t instance;
    uint64_t offset, size;
    uint64_t deadline_ns;
    uint32_t part, num_parts; /* objects written in parts (1: plain) */
} cl_resv_t;

/* A get of a disk-tier block, driven by the get thread. */
typedef struct cl_get {
    struct cl_get *next;
    kvd_store_get_t get;
    uint64_t lease_id;
} cl_get_t;

struct kvd_client {
    kvd_store_t base; /* first: the store handle is the client */
    kvd_client_config_t cfg;
    char address[KVD_CONFIG_STRING_MAX];
    char shm_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    struct grpc_channel *ch; /* transport.c's */
    /* Over TCP (remote): no arena; every call carries `auth`
     * ("Bearer <token>", or NULL), the channel trusts `tls_ca_pem` (NULL:
     * plain TCP). */
    bool remote;
    char *auth;
    char *tls_ca_pem;
    char *tls_cert_pem, *tls_key_pem; /* this client's, or NULL */

    pthread_mutex_t mu; /* everything below */
    uint64_t instance;
    char instance_hex[17];
    char session_hex[2 * KVD_HANDOFF_SESSION_BYTES + 1]; /* from the hand-off */
    kvd_arena_mapping_t *map; /* the current instance's, maps[n_maps - 1] */
    cl_map_t maps[CL_MAPPINGS_MAX];
    size_t n_maps;
    uint32_t map_gen; /* generation of the newest mapping */
    uint64_t map_bytes, size_bytes;
    uint64_t offset; /* arena offset of the mapping's first byte: the
                        caller's tenant's partition starts there */
    int arena_fd;
    int handoff_fd; /* the hand-off connection, kept open (mapping.c) */

    /* Key events (admin.c kvd_client_events_*): the namespaces watched,
     * the last event number read, recording on. Guarded by `ev_mu`. */
    pthread_mutex_t ev_mu;
    kvd_namespace_t ev_watch[KVD_STORE_EVENTS_WATCH_MAX];
    size_t ev_n_watch;
    uint64_t ev_seq;
    bool ev_on;

    cl_group_t *groups;
    uint32_t n_groups, cap_groups, free_head;
    cl_lblock_t *lblocks;
    uint32_t n_lblocks, cap_lblocks, lblock_free;
    /* Lease ids the engine released, not yet told to the daemon: the next
     * Lookup carries them, or the get thread sends them after
     * CL_RELEASE_DELAY_MS. */
    uint64_t *rel;
    size_t n_rel, cap_rel;
    uint64_t rel_since_ms;
    /* The get thread sleeps with a deadline and will look at the deferred
     * releases when it wakes: a new release need not wake it. */
    bool rel_timer_armed;
    cl_resv_t *resv[CL_BUCKETS];
    cl_resv_t *resv_off[CL_BUCKETS];

    /* Gets: `gets` is the queue the get thread works through. */
    cl_get_t *gets;
    pthread_cond_t get_cv;
    bool stopping;
    pthread_t get_thread;
    bool get_thread_started;
    kvd_ring_t *cq;
    uint64_t outstanding; /* accepted, not yet polled (atomic) */
    bool fd_wanted;       /* kvd_client_fd was called: polls arm the ring */
};

/* ---- transport.c --------------------------------------------------------- */

/* The methods of kvdepot.v1.KvStore the client calls. */
enum cl_method {
    CL_LOOKUP,
    CL_RESERVE,
    CL_COMMIT,
    CL_ABORT,
    CL_RELEASE,
    CL_GET,
    CL_PROMOTE,
    CL_STATS,
    CL_ADMIN,
    CL_DELETE
};

/* gRPC up (grpc_init) and the channel to c->address; kvd_client_open,
 * once. The channel connects lazily: this cannot fail. */
void kvd_cl_channel_open(kvd_client_t *c);
/* The channel down and gRPC's reference dropped; nothing when no channel
 * was opened. kvd_client_close, after the get thread has stopped. */
void kvd_cl_channel_close(kvd_client_t *c);

/*
 * Sends `req` (of type `rq_type`) as method `m` and unpacks the reply as
 * `rsp_type` into *rsp_out (kvd_proto_free it). `instance_used` gets the
 * instance the call named, so a caller can tell a restart. A reply saying
 * the instance changed (KVD_ERR_STATE) maps the new arena; then a call
 * with `retry` (one that names no id of the old daemon) is sent once more,
 * and one without returns KVD_ERR_NOT_FOUND (its ids are gone). Errors: the
 * daemon's status (its trailer), or gRPC's code translated
 * (kvd_status_from_grpc), KVD_ERR_PROTO for a reply that does not decode.
 * Takes `mu` briefly; never call it with `mu` held.
 */
kvd_status_t kvd_cl_call(kvd_client_t *c, enum cl_method m,
                         kvd_proto_msg_t rq_type, const ProtobufCMessage *req,
                         kvd_proto_msg_t rsp_type, ProtobufCMessage **rsp_out,
                         uint64_t *instance_used, bool retry);

/* ---- mapping.c ----------------------------------------------------------- */

/* Asks the daemon for its arena over the hand-off socket and maps it as
 * the current instance's; `mu` held. Errors (reason in `err`) as
 * kvd_client_open's. */
kvd_status_t kvd_cl_arena_map(kvd_client_t *c, char *err, size_t err_len);
/* After KVD_ERR_STATE from instance `used`: maps the new arena (once,
 * whichever thread sees it first; the others find it done). Takes `mu`. */
kvd_status_t kvd_cl_arena_remap(kvd_client_t *c, uint64_t used);
/* After KVD_ERR_AUTH on a call that sent session `used` (hex): the
 * daemon forgot that session; hands off again (once, whichever thread sees
 * it first: a session that changed meanwhile is taken as renewed) and
 * keeps the mapping if the arena is the same. KVD_ERR_AUTH without a
 * hand-off (TCP), or the hand-off's error. Takes `mu`. */
kvd_status_t kvd_cl_session_renew(kvd_client_t *c, const char *used);
/* Whether arena offsets [offset, offset + len) are in the current mapping
 * (the caller's partition of the daemon's arena); `mu` held. */
bool kvd_cl_arena_contains(const kvd_client_t *c, uint64_t offset,
                           uint64_t len);
/* The mapping of `instance`, or NULL; `mu` held. Valid while `mu` is. */
cl_map_t *kvd_cl_map_of_instance(kvd_client_t *c, uint64_t instance);
/* Adds `delta` to what the caller holds of `instance`'s arena; unmaps that
 * arena when it is not the current one and nothing of it is held. `mu`
 * held. */
void kvd_cl_map_held(kvd_client_t *c, uint64_t instance, int64_t delta);
/* Unmaps every arena and closes the current one's descriptor
 * (kvd_client_close). */
void kvd_cl_arena_unmap_all(kvd_client_t *c);

/* ---- lease.c ------------------------------------------------------------- */

/* The group of a handed-out block (`lease` as the lookup wrote it), or
 * NULL when the block is not held (released already, or never handed
 * out). `mu` held; valid while it is. */
cl_group_t *kvd_cl_lease_group(kvd_client_t *c, const kvd_store_lease_t *lease);
/* Drops a handed-out block; writes the lease id to release on the daemon
 * into *release (0: not yet, or not this daemon's). KVD_ERR_NOT_FOUND for
 * a block not held (so a second release of it), KVD_ERR_TIMEOUT when its
 * group's deadline had passed (the block is dropped all the same). `mu`
 * held. */
kvd_status_t kvd_cl_block_unref(kvd_client_t *c, const kvd_store_lease_t *lease,
                                uint64_t *release);
/* Moves group `g` (index + 1)'s deadline to `deadline_ns` if later (a Get
 * on its id extended the lease). `mu` held. */
void kvd_cl_group_extend(kvd_client_t *c, uint32_t g, uint64_t deadline_ns);
/* Releases lease ids on the daemon now (n may be 0); a failure leaves them
 * to the daemon's TTL. Without `mu`. */
void kvd_cl_release_ids(kvd_client_t *c, uint64_t *ids, size_t n);
/* Sends every deferred release now (before calls whose answer depends on
 * them: stats, admin, delete, close). Without `mu`. */
void kvd_cl_flush_releases(kvd_client_t *c);

/* ---- get.c --------------------------------------------------------------- */

/* The get thread (pthread_create's start routine, `arg` the client): works
 * through c->gets and sends deferred releases no Lookup picked up, until
 * c->stopping, then cancels what is queued. */
void *kvd_cl_get_main(void *arg);

#ifdef __cplusplus
}
#endif

#endif /* KVD_CLIENT_CLIENT_INT_H */
