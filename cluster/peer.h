/*
 * The data plane between kvdepotd nodes (docs/cluster.md):
 * one UCX worker per daemon, driven by one progress thread, speaking active
 * messages. Three requests, each a batch over one namespace:
 *
 *   LOOKUP  which of these keys does the node hold in its arena? The
 *           answer is one size per key (0: not there).
 *   FETCH   send me these objects (to this worker address). The node
 *           answers one DATA message per key; a DATA message carries the
 *           object with UCX rendezvous, received straight into an arena
 *           slot reserved here beforehand, and its XXH3-64 checksum,
 *           verified on arrival. A verified object is committed to the
 *           local store; a corrupt one is aborted (not cached) and
 *           reported as KVD_ERR_CHECKSUM.
 *   OFFER   I saved these keys and you are their home: fetch them from
 *           me. No answer; the receiver hands the offer to `on_offer`.
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
 * The wire format and the implementation's internals are in
 * cluster/peer_int.h (this folder only).
 *
 * Threading: every call from any thread; `on_offer` runs on the progress
 * thread and must not block.
 */
#ifndef KVD_CLUSTER_PEER_H
#define KVD_CLUSTER_PEER_H

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
    /* A peer this node sends objects to that takes none of them for this
     * long (its receive stalled, a rendezvous left unanswered) has its
     * endpoint closed: what was going to it fails, its leases go back and
     * its queued FETCHes are dropped (0: 10 s). */
    uint32_t stall_ms;
    /* Whether a FETCH may have its objects sent to the worker address
     * `addr`. UCX trusts the worker addresses it is given (a damaged one
     * aborts the process in ucp_ep_create), so a FETCH naming an address
     * this node has no endpoint to yet is served only when this says yes
     * (kvdepotd: a member of the current view); else each key is answered
     * busy and stats.address_refused counts it. NULL: every address (two
     * data planes of one test). Called on the progress thread. */
    bool (*address_ok)(void *ctx, const uint8_t *addr, size_t len);
    void *address_ctx;
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
    uint64_t stalled; /* endpoints failed for moving nothing for stall_ms */
    uint64_t address_refused; /* FETCHes naming an address not trusted */
} kvd_peer_stats_t;

/* Creates the UCX context and worker and starts the progress thread.
 * Errors (reason in `err`): KVD_ERR_INVALID, KVD_ERR_NOMEM, KVD_ERR_PEER
 * (UCX refused). */
kvd_status_t kvd_peer_start(const kvd_peer_config_t *cfg, kvd_peer_t **out,
                            char *err, size_t err_len);

/* Stops the thread, fails calls in progress, closes every endpoint.
 * NULL is accepted. */
void kvd_peer_stop(kvd_peer_t *p);

/* This worker's address (network transports only) for NodeInfo; valid
 * until kvd_peer_stop. NULL (length 0) for a NULL data plane. */
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

/* A snapshot of the counters (each read atomically, not all at one
 * instant); zeros for a NULL data plane. Any thread. */
void kvd_peer_stats(kvd_peer_t *p, kvd_peer_stats_t *out);

/* A store get of this data plane completed (see disk_gets); any thread. */
void kvd_peer_store_completion(kvd_peer_t *p, const kvd_store_completion_t *c);

/* The same, once the data plane is gone: gives the lease back, frees. */
void kvd_peer_forget_completion(kvd_store_t *store,
                                const kvd_store_completion_t *c);

#ifdef __cplusplus
}
#endif

#endif /* KVD_CLUSTER_PEER_H */
