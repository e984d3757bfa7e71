/*
 * The UCX data plane's insides (cluster/peer.h is its interface), shared
 * by its files and by no one outside cluster/: the wire format
 * (peer_wire.c; fuzzed by tests/fuzz/fuzz_peer_msg.c), the state of a
 * data plane and the calls its files make of each other.
 *
 *   peer.c        start, stop and the progress thread
 *   peer_ep.c     the endpoint cache (one UCX endpoint per peer address)
 *   peer_send.c   messages on their way out: requests queued by callers,
 *                 replies, and what UCX holds until it is done with them
 *   peer_serve.c  answering other nodes: LOOKUP, FETCH (one object per
 *                 progress-loop turn, from the arena or after a read from
 *                 NVMe), OFFER
 *   peer_call.c   this node's calls (lookup, fetch, offer): operations,
 *                 their table, deadlines, and how a fetched key ends
 *   peer_recv.c   messages arriving: the active-message handler and the
 *                 answers to this node's requests (DATA, DATA_PART)
 *   peer_wire.c   encoding and checking the messages
 *
 * Ownership: the progress thread alone touches the UCX worker and the
 * endpoint cache. Callers hand it operations through `queue` and wake it
 * with ucp_worker_signal(); they wait on their call's condition variable
 * with the deadline. `mu` guards the queue, the table of operations
 * waiting for answers and every operation's state.
 *
 * An operation (one request to one node) holds a reference for its
 * caller, one while it is in the table (answers find it there) and one per
 * UCX request in flight (the send of the request, each rendezvous receive).
 * It is freed when the last goes. A caller that reaches its deadline gives
 * its keys that have not started arriving back to the store at once; keys
 * whose bytes are arriving are finished by the progress thread.
 */
#ifndef KVD_CLUSTER_PEER_INT_H
#define KVD_CLUSTER_PEER_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

#include "cluster/peer.h"
#include "common/hash_int.h"
#include "kvdepot/store.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVD_PEER_AUTH_BYTES 32u

/* ---- wire format (peer_wire.c; fuzzed by fuzz_peer_msg) ------------------ */

enum {
    KVD_PEER_OP_LOOKUP = 1,
    KVD_PEER_OP_LOOKUP_REPLY = 2,
    KVD_PEER_OP_FETCH = 3,
    KVD_PEER_OP_DATA = 4,
    KVD_PEER_OP_OFFER = 5,
    KVD_PEER_OP_DATA_PART = 6,
};

#define KVD_PEER_MAGIC 0x5044564bu /* "KVDP" little-endian */
#define KVD_PEER_VERSION 1u
#define KVD_PEER_HDR_BYTES 88u
/* DATA_PART's header: the common one, then the part's offset (u64). */
#define KVD_PEER_PART_HDR_BYTES 96u
#define KVD_PEER_HDR_MAX_BYTES KVD_PEER_PART_HDR_BYTES
/* The part sizes a server sends (a FETCH asking for less or more is
 * served with parts of the nearest bound). */
#define KVD_PEER_PART_MIN (4u << 10)
#define KVD_PEER_PART_MAX (1u << 20)

/* The header of every message (little-endian on the wire):
 *   0 magic u32 | 4 version u16 | 6 op u16 | 8 req_id u64 | 16 status i32 |
 *   20 count u32 | 24 size u64 | 32 checksum u64 | 40 namespace [16] |
 *   56 auth [32] | DATA_PART only: 88 offset u64
 * count: keys in the body (DATA, DATA_PART: the key's index in its FETCH).
 * DATA and DATA_PART: size and checksum are the whole object's (the XXH3-64
 * the server's store kept from the object's verified commit, else computed
 * from its bytes). OFFER: size is the keys' store tenant (below 2^32).
 * FETCH: size is the part size the requester takes (0: whole objects).
 *
 * FETCH bodies start with the requester's worker address: the server
 * queues the request and sends the objects one at a time from its progress
 * loop on its own endpoint to that address. With a part size of 0 an
 * object goes as one DATA by UCX rendezvous, received straight into the
 * slot; otherwise as DATA_PART messages of that size (clamped to
 * KVD_PEER_PART_MIN..MAX), sent eagerly from the arena in order: no
 * rendezvous round trip per object, and the requester copies each part
 * into the slot and hashes it while it is in the cache. Failures (a key
 * gone, a busy server) are a DATA with a status either way; nodes that
 * predate parts ignore the size and send DATA. */
typedef struct kvd_peer_hdr {
    uint16_t op;
    uint64_t req_id;
    int32_t status;
    uint32_t count;
    uint64_t size;
    uint64_t checksum;
    kvd_namespace_t ns;
    uint8_t auth[KVD_PEER_AUTH_BYTES];
    uint64_t offset; /* DATA_PART */
} kvd_peer_hdr_t;

/* Writes the header (KVD_PEER_PART_HDR_BYTES for DATA_PART, else
 * KVD_PEER_HDR_BYTES) and returns its length. */
size_t kvd_peer_hdr_encode(const kvd_peer_hdr_t *h,
                           uint8_t out[KVD_PEER_HDR_MAX_BYTES]);

/* Checks magic, version, op, the header's length for the op and that the
 * body length fits the op and count: LOOKUP and FETCH bodies are count
 * 32-byte hashes (FETCH: plus a u64 size each), LOOKUP_REPLY count u64
 * sizes, DATA's body is the object (`size` bytes), DATA_PART's 1 or more
 * bytes of it from `offset` (ending at `size` at most), OFFER a
 * u16-prefixed node id then count (hash, size). KVD_ERR_PROTO otherwise.
 * The auth digest is the caller's to check. */
kvd_status_t kvd_peer_hdr_decode(const void *buf, size_t len, size_t body_len,
                                 kvd_peer_hdr_t *out);

/* FETCH body: the requester's UCX worker address (u16 length, then the
 * bytes; the objects are sent to it) and count (hash, size) entries.
 * KVD_ERR_PROTO for a bad length. */
kvd_status_t kvd_peer_fetch_decode(const uint8_t *body, size_t len,
                                   uint32_t count, const uint8_t **address,
                                   size_t *address_len,
                                   const uint8_t **entries);

/* OFFER body: writes the node id (NUL-terminated, room for
 * KVD_PEER_MAX_NODE_ID + 1) and points at the entries (count of 40 bytes).
 * KVD_ERR_PROTO for a bad id ([A-Za-z0-9._-]+) or length. */
kvd_status_t kvd_peer_offer_decode(const uint8_t *body, size_t len,
                                   uint32_t count, char *node_id,
                                   const uint8_t **entries);

/* ---- the data plane's state --------------------------------------------- */

#define PEER_AM_ID 17u
#define PEER_BUCKETS 256u

/* A FETCH entry: waiting, a rendezvous receive in flight (UCX writes the
 * slot), parts arriving (written under mu by the progress thread), done. */
enum { ENTRY_WAIT = 0, ENTRY_RECV = 1, ENTRY_DONE = 2, ENTRY_PARTS = 3 };

/* A caller waiting for its operations (peer_call.c). */
typedef struct peer_call peer_call_t;
/* A FETCH being served (peer_serve.c). */
typedef struct peer_serve peer_serve_t;
/* An object of a FETCH being read from NVMe (peer_serve.c). */
typedef struct peer_diskget peer_diskget_t;

/* An object arriving in parts: the hash of the bytes in order so far. */
typedef struct peer_rx {
    kvd_xxh3_stream_t *hash;
    uint64_t next;     /* the hash covers [0, next) */
    uint64_t received; /* bytes of parts copied in */
    bool ordered;      /* every part came at `next` (else hash it at the end) */
} peer_rx_t;

typedef struct peer_op {
    struct peer_op *next;  /* table chain */
    struct peer_op *qnext; /* queue */
    peer_call_t *call;     /* NULL: an offer, nobody waits */
    uint64_t id;
    uint16_t kind;
    int refs;
    bool in_table, finished, abandoned;
    kvd_status_t result;
    uint8_t *addr;
    size_t addr_len;
    ucp_ep_h ep; /* the endpoint the request went out on */
    uint8_t hdr[KVD_PEER_HDR_MAX_BYTES]; /* KVD_PEER_HDR_BYTES used */
    uint8_t *body;
    size_t body_len;
    kvd_namespace_t ns;
    size_t n, remaining, receiving;
    kvd_block_hash_t *hashes;
    uint64_t *sizes;      /* LOOKUP: answers; FETCH: expected sizes */
    uint64_t *offsets;    /* FETCH: reserved arena slots */
    uint64_t *checksums;  /* FETCH: from each DATA */
    kvd_status_t *status; /* FETCH */
    size_t *batch_index;  /* FETCH: entry -> key of the caller's batch */
    uint32_t tenant;      /* OFFER: the keys' store tenant */
    uint8_t *state;       /* FETCH */
    peer_rx_t **rx;       /* FETCH: entries in ENTRY_PARTS */
} peer_op_t;

/* An endpoint of the cache. `refs`: the cache's, and one per object in
 * flight on it (its completion may come while it is being closed).
 * `objects` are on their way to or from the peer (sends of objects and
 * their parts, rendezvous receives of the objects this node FETCHed from
 * it); `last_ns` is when the latest of them completed (or the first
 * started): a peer that moves none of them for stall_ms is closed
 * (kvd_peer_eps_check_stalled). */
typedef struct peer_ep {
    uint8_t *addr;
    size_t addr_len;
    ucp_ep_h ep;
    bool dead;
    int refs;
    uint32_t objects;
    uint32_t serving; /* objects served to it not yet sent (its window) */
    uint32_t parts;   /* parts of objects on their way to it */
    uint64_t last_ns;
    struct peer_ep *next;
    kvd_peer_t *p;
} peer_ep_t;

/* An object going out in parts: its lease goes back when UCX is done with
 * the last part. Progress thread only. */
typedef struct peer_xfer {
    kvd_store_lease_t lease;
    uint32_t parts;     /* not completed yet */
    struct peer_ep *pe; /* its requester's window (NULL: none) */
} peer_xfer_t;

/* One reply or request on its way out, alive until UCX is done with it. */
typedef struct peer_send {
    kvd_peer_t *p;
    peer_op_t *op; /* a request's operation, or NULL for replies */
    uint8_t hdr[KVD_PEER_HDR_MAX_BYTES];
    size_t hdr_len;
    void *owned; /* freed with it */
    kvd_store_lease_t lease;
    bool has_lease;
    peer_ep_t *window; /* a whole object's place in its requester's window */
    peer_xfer_t *xfer; /* a part of this object */
    peer_ep_t *pe;     /* an object send counted on its endpoint */
} peer_send_t;

struct kvd_peer {
    kvd_peer_config_t cfg;
    char node_id[KVD_PEER_MAX_NODE_ID + 1];
    uint8_t auth[KVD_PEER_AUTH_BYTES];
    ucp_context_h ctx;
    ucp_worker_h worker;
    int efd;
    uint8_t *address;
    size_t address_len;
    pthread_t thread;
    bool started;
    bool stop; /* atomic */

    pthread_mutex_t mu;
    peer_op_t *queue, *queue_tail;
    size_t queued;
    peer_op_t *table[PEER_BUCKETS];
    uint64_t next_id;
    peer_ep_t *eps;                        /* progress thread only */
    uint64_t stall_ns, stall_check_ns;     /* ditto */
    peer_serve_t *serve_head, *serve_tail; /* progress thread only */
    size_t serve_count;
    size_t disk_inflight;      /* progress thread only */
    size_t xfers;              /* objects going out in parts (ditto) */
    bool closing;              /* kvd_peer_stop is draining (on its thread) */
    peer_diskget_t *disk_done; /* under mu */
    uint32_t active;           /* UCX requests in flight (atomic) */
    kvd_peer_stats_t stats;
};

static inline void kvd_peer_stat_add(kvd_peer_t *p, uint64_t *field, uint64_t v)
{
    (void)p;
    __atomic_fetch_add(field, v, __ATOMIC_RELAXED);
}

/* ---- operations (peer_call.c) ------------------------------------------- */

/* Drops a reference; the last frees the operation. Under mu. */
void kvd_peer_op_unref(peer_op_t *op);

/* Takes the operation out of the table (dropping the table's reference)
 * when it is there. Under mu. */
void kvd_peer_table_remove(kvd_peer_t *p, peer_op_t *op);

/* The operation waiting for the answer `id`, or NULL. Under mu; the
 * pointer is valid while mu is held. */
peer_op_t *kvd_peer_table_find(kvd_peer_t *p, uint64_t id);

/* The operation is over for its caller (under mu). It stays in the table
 * while bytes are still arriving into its slots. */
void kvd_peer_op_finish(kvd_peer_t *p, peer_op_t *op);

/* A fetched key reached its end (under mu): committed when `s` is KVD_OK,
 * else its slot goes back. */
void kvd_peer_entry_done(kvd_peer_t *p, peer_op_t *op, size_t i,
                         kvd_status_t s);

/* The whole operation failed with `s` (under mu): keys not yet arriving
 * and keys arriving in parts fail now (no part is written after this);
 * keys arriving by rendezvous finish when UCX says so. */
void kvd_peer_op_fail(kvd_peer_t *p, peer_op_t *op, kvd_status_t s);

/* ---- endpoints (peer_ep.c; progress thread) ----------------------------- */

/* The cached endpoint to `addr`, created (with PEER error handling) when
 * there is none; NULL when UCX refuses or without memory. Valid until
 * kvd_peer_eps_close_dead closes it. */
ucp_ep_h kvd_peer_ep_get(kvd_peer_t *p, const uint8_t *addr, size_t len);

/* Closes the endpoints that failed (every endpoint when `all`). A failed
 * endpoint with parts still on their way stays open until they end (UCX
 * 1.13's TCP transport can crash when a connection closed by force while
 * it still has bytes to write is later closed by its peer). */
void kvd_peer_eps_close_dead(kvd_peer_t *p, bool all);

/* Whether the cache holds a live endpoint to `addr`. */
bool kvd_peer_ep_known(const kvd_peer_t *p, const uint8_t *addr, size_t len);

/* Whether an endpoint to `addr` failed (a stall) with parts still stuck
 * on it: that requester's new FETCHes are answered busy meanwhile. */
bool kvd_peer_ep_wedged(const kvd_peer_t *p, const uint8_t *addr, size_t len);

/* The cache's entry for `ep` (NULL when it is not one of the cache's). */
peer_ep_t *kvd_peer_ep_find(kvd_peer_t *p, ucp_ep_h ep);

/* Drops a reference to `e`; the last frees it. */
void kvd_peer_ep_unref(peer_ep_t *e);

/* An object starts its way to or from the peer of `ep` (a send or a
 * rendezvous receive): counted on its cache entry, which is returned with
 * a reference (NULL when `ep` is not the cache's). kvd_peer_ep_moved
 * counts it done and drops the reference. */
peer_ep_t *kvd_peer_ep_moving(kvd_peer_t *p, ucp_ep_h ep);
void kvd_peer_ep_moved(peer_ep_t *e);

/* An object served to the peer of `ep` takes a place in its window
 * (`serving`); the entry is returned with a reference, NULL when `ep` is
 * not the cache's. kvd_peer_ep_served gives the place back. */
peer_ep_t *kvd_peer_ep_serving(kvd_peer_t *p, ucp_ep_h ep);
void kvd_peer_ep_served(peer_ep_t *e);

/* Every 50 ms at most: an endpoint with objects on their way that moved
 * none of them for stall_ms fails as if UCX had failed it (its operations
 * fail, its queued FETCHes are dropped, stats.stalled counts it);
 * kvd_peer_eps_close_dead then closes it, which ends those transfers, or,
 * when parts are stuck on it, once they end (the peer reads again, or
 * its connection fails). */
void kvd_peer_eps_check_stalled(kvd_peer_t *p);

/* ---- sending (peer_send.c; progress thread) ----------------------------- */

/* A header with op, req_id, ns and this node's token digest; the rest 0. */
void kvd_peer_hdr_init(const kvd_peer_t *p, kvd_peer_hdr_t *h, uint16_t op,
                       uint64_t req_id, const kvd_namespace_t *ns);

/* Sends header + body; `s` is consumed (finished now or at completion):
 * its lease and part are given back and `owned` freed when UCX is done
 * with the bytes. */
void kvd_peer_send_msg(kvd_peer_t *p, ucp_ep_h ep, peer_send_t *s,
                       const void *body, size_t len, uint32_t flags);

/* Sends a reply with header `h` and `body`; `owned` (freed with the send)
 * and `lease` (NULL: none; given back with the send) are consumed, even
 * when the send cannot start. */
void kvd_peer_reply(kvd_peer_t *p, ucp_ep_h ep, const kvd_peer_hdr_t *h,
                    void *owned, const void *body, size_t len,
                    const kvd_store_lease_t *lease, uint32_t flags);

/* `done` parts of `x` are over (sent, failed or never started); the last
 * gives the object's lease back and frees `x`. */
void kvd_peer_xfer_put(kvd_peer_t *p, peer_xfer_t *x, uint32_t done);

/* Takes the requests callers queued and sends them. */
void kvd_peer_queue_drain(kvd_peer_t *p);

/* ---- serving (peer_serve.c; progress thread) ---------------------------- */

/* Answers a LOOKUP (count hashes in `body`) on `ep`. */
void kvd_peer_serve_lookup(kvd_peer_t *p, ucp_ep_h ep, const kvd_peer_hdr_t *rq,
                           const uint8_t *body);

/* Queues a FETCH; the progress loop serves it one object at a time
 * (kvd_peer_serve_step). A full queue (or the requester's share of it),
 * a requester whose stalled endpoint still has parts stuck on it, or a
 * requester's address that is neither cached nor accepted by
 * cfg.address_ok, answers every key "busy" at once. */
void kvd_peer_serve_fetch(kvd_peer_t *p, ucp_ep_h reply_ep,
                          const kvd_peer_hdr_t *rq, const uint8_t *body,
                          size_t len);

/* Hands an OFFER to cfg.on_offer (on this thread). */
void kvd_peer_serve_offer(kvd_peer_t *p, const kvd_peer_hdr_t *rq,
                          const uint8_t *body, size_t len);

/* Serves the next object of the oldest queued FETCH whose requester has
 * room in its window (PEER_XFER_WINDOW objects in parts, or
 * PEER_RNDV_WINDOW whole objects, on their way to it); false when none. */
bool kvd_peer_serve_step(kvd_peer_t *p);

/* Drops every queued FETCH (stopping). */
void kvd_peer_serve_clear(kvd_peer_t *p);

/* The endpoint to `addr` failed: the FETCHes still queued for it are
 * dropped (their requester is gone or will time out). */
void kvd_peer_serve_drop_addr(kvd_peer_t *p, const uint8_t *addr, size_t len);

/* Sends what the reads from NVMe that completed have brought in. */
void kvd_peer_disk_drain(kvd_peer_t *p);

/* Stopping (the progress thread is gone): the reads that completed but
 * were never sent give their leases back. */
void kvd_peer_disk_forget(kvd_peer_t *p);

/* ---- arriving (peer_recv.c; progress thread) ---------------------------- */

/* The active-message handler (ucp_am_recv_callback_t, `arg` the data
 * plane): checks, then serves requests and applies answers. */
ucs_status_t kvd_peer_am_recv(void *arg, const void *header,
                              size_t header_length, void *data, size_t length,
                              const ucp_am_recv_param_t *param);

#ifdef __cplusplus
}
#endif

#endif /* KVD_CLUSTER_PEER_INT_H */
