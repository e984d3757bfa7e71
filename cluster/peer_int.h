/*
 * The data plane between kvdepotd nodes (DESIGN.md §10, docs/cluster.md):
 * one UCX worker per daemon, driven by one progress thread, speaking active
 * messages. Three requests, each a batch over one namespace:
 *
 *   LOOKUP  which of these keys does the node hold in its arena? The answer
 *           is one size per key (0: not there).
 *   FETCH   send me these objects (to this worker address). The node
 *           answers one DATA message per key; a DATA message carries the object
 * with UCX rendezvous, received straight into an arena slot reserved here
 * beforehand, and its XXH3-64 checksum, verified on arrival. A verified object
 * is committed to the local store; a corrupt one is aborted (not cached) and
 * reported as KVD_ERR_CHECKSUM. OFFER   I saved these keys and you are their
 * home: fetch them from me. No answer; the receiver hands the offer to
 * `on_offer`.
 *
 * Endpoints are cached per peer address with UCX's PEER error handling: a
 * dead peer fails its transfers (KVD_ERR_UNREACHABLE / KVD_ERR_PEER), and
 * every call has a deadline after which it returns KVD_ERR_TIMEOUT and
 * never touches the caller's memory again. An arena slot still being
 * written by UCX when a call gives up stays reserved until the transfer
 * completes or fails, then is committed or aborted by the progress thread.
 *
 * Every message carries SHA-256 of the cluster token (cluster.token_file);
 * a message whose digest differs is dropped and counted. Without a token
 * the digest is all zeros and any node that can reach the worker is a
 * peer: fine on a private network, documented in docs/cluster.md.
 *
 * Objects on the NVMe tier only are read into the arena first (a store
 * get, see disk_gets) and then sent; without disk_gets they are answered
 * as absent.
 *
 * Threading: every call from any thread; `on_offer` runs on the progress
 * thread and must not block.
 */
#ifndef KVD_CLUSTER_PEER_INT_H
#define KVD_CLUSTER_PEER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvdepot/store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Keys in one request at most (callers split larger batches). */
#define KVD_PEER_MAX_KEYS 4096u
/* Node ids on the wire at most (as NodeInfo.node_id). */
#define KVD_PEER_MAX_NODE_ID 128u
#define KVD_PEER_AUTH_BYTES 32u
/* A UCX worker address on the wire at most (as NodeInfo.ucx_address). */
#define KVD_PEER_MAX_ADDRESS 1024u

typedef struct kvd_peer kvd_peer_t;

/* `tenant`: the store tenant the offering node saved the keys for. */
typedef void (*kvd_peer_offer_fn)(void *ctx, const char *node_id,
                                  const kvd_namespace_t *ns, uint32_t tenant,
                                  const kvd_block_hash_t *hashes,
                                  const uint64_t *sizes, size_t n);

typedef struct kvd_peer_config {
    kvd_store_t *store;  /* served from and fetched into */
    const char *node_id; /* named in the offers this node sends */
    const char *token;   /* cluster token ("" or NULL: none) */
    kvd_peer_offer_fn on_offer;
    void *offer_ctx;
    /* Serve objects that are on the NVMe tier only: the data plane submits
     * store gets for them (user_data tagged with bit 0) and the owner of
     * the store's completion poller hands their completions to
     * kvd_peer_store_completion (after kvd_peer_stop: to
     * kvd_peer_forget_completion). Without it such objects are answered
     * as absent. */
    bool disk_gets;
    /* This node's FETCHes ask for objects in parts of this many bytes
     * (clamped to KVD_PEER_PART_MIN..MAX by the server; 0: whole objects
     * by rendezvous). See the wire format below. */
    uint32_t part_bytes;
} kvd_peer_config_t;

/* One node's part of a batch call. */
typedef struct kvd_peer_batch {
    const uint8_t *address; /* the node's UCX worker address */
    size_t address_len;
    const kvd_block_hash_t *hashes;
    size_t n; /* 1..KVD_PEER_MAX_KEYS */
    /* LOOKUP: out, bytes per key (0: absent). FETCH: in, each key's size
     * as the node's LOOKUP reported it. */
    uint64_t *sizes;
    /* FETCH: out, per key: KVD_OK (now committed locally), KVD_ERR_EXISTS
     * (was already here), KVD_ERR_NOT_FOUND (gone from the node),
     * KVD_ERR_CHECKSUM, KVD_ERR_NOSPACE / KVD_ERR_QUOTA (no local slot),
     * KVD_ERR_PEER / KVD_ERR_UNREACHABLE / KVD_ERR_TIMEOUT. */
    kvd_status_t *status;
    kvd_status_t result; /* out: the batch as a whole */
} kvd_peer_batch_t;

typedef struct kvd_peer_stats {
    uint64_t requests_sent, requests_served;
    uint64_t objects_fetched, bytes_fetched; /* committed here */
    uint64_t objects_served, bytes_served;
    uint64_t checksum_errors; /* objects that arrived corrupt */
    uint64_t peer_errors;     /* endpoints failed by UCX */
    uint64_t timeouts;        /* calls that reached their deadline */
    uint64_t auth_rejected;   /* messages with the wrong token digest */
    uint64_t malformed;       /* messages that did not decode */
    uint64_t offers_sent, offers_received;
} kvd_peer_stats_t;

/* Creates the UCX context and worker and starts the progress thread.
 * Errors (reason in `err`): KVD_ERR_INVALID, KVD_ERR_NOMEM, KVD_ERR_PEER
 * (UCX refused). */
kvd_status_t kvd_peer_start(const kvd_peer_config_t *cfg, kvd_peer_t **out,
                            char *err, size_t err_len);

/* Stops the thread, fails calls in progress, closes every endpoint.
 * NULL is accepted. */
void kvd_peer_stop(kvd_peer_t *p);

/* This worker's address (network transports only) for NodeInfo. */
const uint8_t *kvd_peer_address(const kvd_peer_t *p, size_t *len_out);

/* Asks every node of `batches` at once; returns when all answered or at
 * `deadline_ns` (CLOCK_MONOTONIC). Returns KVD_OK when every batch
 * succeeded, else the first batch error (each batch has its own). */
kvd_status_t kvd_peer_lookup(kvd_peer_t *p, const kvd_namespace_t *ns,
                             kvd_peer_batch_t *batches, size_t nb,
                             uint64_t deadline_ns);

/* Reserves arena slots here (for `tenant`), fetches the keys from each
 * node into them and commits what arrives intact. Same return rules. */
kvd_status_t kvd_peer_fetch(kvd_peer_t *p, const kvd_namespace_t *ns,
                            uint32_t tenant, kvd_peer_batch_t *batches,
                            size_t nb, uint64_t deadline_ns);

/* Sends an OFFER of keys this node holds (sizes given), saved for store
 * tenant `tenant` (the home pulls them into that tenant's share: its
 * quota, its arena partition), and does not wait. KVD_ERR_BUSY when the
 * send queue is full. */
kvd_status_t kvd_peer_offer(kvd_peer_t *p, const uint8_t *address,
                            size_t address_len, const kvd_namespace_t *ns,
                            uint32_t tenant, const kvd_block_hash_t *hashes,
                            const uint64_t *sizes, size_t n);

void kvd_peer_stats(kvd_peer_t *p, kvd_peer_stats_t *out);

/* A store get of this data plane completed (see disk_gets); any thread. */
void kvd_peer_store_completion(kvd_peer_t *p, const kvd_store_completion_t *c);

/* The same, once the data plane is gone: gives the lease back, frees. */
void kvd_peer_forget_completion(kvd_store_t *store,
                                const kvd_store_completion_t *c);

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

#ifdef __cplusplus
}
#endif

#endif /* KVD_CLUSTER_PEER_INT_H */
