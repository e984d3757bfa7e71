/*
 * One cache over several nodes (docs/cluster.md): what a
 * clustered kvdepotd does besides serving its own store.
 *
 *   - It joins the cluster (membership through etcd, cluster/membership)
 *     with its UCX worker address (cluster/peer) in its NodeInfo.
 *   - Saves: after a key is committed here, its R home nodes (weighted
 *     rendezvous over the live view, cluster/placement) other than this
 *     one are offered it; they fetch it from here over UCX. The queue is
 *     bounded: offers that do not fit are dropped and counted.
 *   - Offers received are queued the same way and fetched by the mover
 *     thread from the node that offered them.
 *   - Lookups that miss here ask each key's first home other than this
 *     node, one LOOKUP per node, all at once; keys of the chain's prefix
 *     found there are fetched into the local arena. A node that fails (dead
 *     but still in the view, unreachable, too slow) is skipped for the
 *     key's next home, up to R homes. Everything within cluster.timeout.
 *     A node whose call failed is then skipped for one lease TTL (by then
 *     it has left the views, or answers again), so lookups do not each
 *     wait out the deadline on a node cut off but still in the view.
 *   - Repair: when a node joins the view (or this node starts), or the
 *     view is fresh again after being stale (etcd or the network was away,
 *     so pushes may have failed), the mover scans the local store and
 *     offers again every object whose homes include such a node (all
 *     nodes after a stale view); homes that hold one answer "exists"
 *     without a transfer.
 *
 * Threading: any thread calls; one mover thread does the pushes and pulls.
 */
#ifndef KVD_CLUSTER_REMOTE_H
#define KVD_CLUSTER_REMOTE_H

#include <stddef.h>
#include <stdint.h>

#include "cluster/membership.h"
#include "cluster/peer.h"
#include "kvdepot/store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvd_remote kvd_remote_t;

typedef struct kvd_remote_config {
    kvd_store_t *store;
    const char *etcd_endpoint; /* host:port */
    const char *etcd_tls_ca;   /* PEM texts, membership.h; NULL: plain */
    const char *etcd_tls_cert;
    const char *etcd_tls_key;
    const char *cluster;
    kvd_member_t *self; /* node id, gRPC address, capacity, version; the
                           UCX address is filled in here */
    int lease_ttl_s;
    const char *token;   /* cluster token ("": none) */
    size_t replicas;     /* R, 1..KVD_PLACEMENT_MAX_REPLICAS */
    uint64_t timeout_ms; /* a remote lookup's deadline */
    size_t queue;        /* keys waiting to be pushed or pulled, at most */
    uint32_t part_bytes; /* fetches in parts of this (kvd_peer_config_t) */
} kvd_remote_config_t;

typedef struct kvd_remote_stats {
    uint64_t lookups;       /* lookups that asked other nodes */
    uint64_t remote_hits;   /* keys found elsewhere and fetched here */
    uint64_t lookup_errors; /* node batches that failed (then rerouted) */
    uint64_t pushes;        /* keys offered to their homes */
    uint64_t push_errors;   /* keys whose offer failed, retries included */
    uint64_t pulls;         /* offered keys fetched here */
    uint64_t pull_errors;   /* offered keys that could not be fetched,
                               retries included */
    uint64_t retries;       /* failed pushes and pulls queued again */
    uint64_t dropped;       /* pushes or pulls that found the queue full */
    uint64_t suspect_skips; /* keys not asked of a node that just failed */
    uint64_t repairs; /* repair scans started (joins, views fresh again) */
    uint64_t repair_offers; /* objects offered again by repair scans */
    kvd_peer_stats_t peer;
} kvd_remote_stats_t;

/* Starts the UCX data plane, joins the cluster, starts the mover.
 * Errors (reason in `err`): KVD_ERR_INVALID, KVD_ERR_NOMEM, KVD_ERR_PEER. */
kvd_status_t kvd_remote_start(const kvd_remote_config_t *cfg,
                              kvd_remote_t **out, char *err, size_t err_len);

/* Leaves the cluster, stops the mover and the data plane. No call may be
 * in progress. NULL is accepted. */
void kvd_remote_stop(kvd_remote_t *r);

/* Leaves the cluster at once (revokes the registration) so the others
 * stop routing here; the data plane keeps serving until kvd_remote_stop.
 * NULL is accepted. */
void kvd_remote_leave(kvd_remote_t *r);

/* The membership's state (kvd_membership_view's stats); false once
 * left. */
bool kvd_remote_view_stats(kvd_remote_t *r, kvd_membership_stats_t *out);

/* kvd_membership_view of the cluster this daemon is in: copies up to `max`
 * members into `out` and returns how many there are (0 once left). */
size_t kvd_remote_members(kvd_remote_t *r, kvd_member_t *out, size_t max,
                          kvd_membership_stats_t *stats_out);

/* A lookup found hashes[0..n) missing here (the rest of its chain): fetches
 * the longest prefix of them the cluster holds into the local store and
 * returns its length (0 when nothing was found or the cluster is just this
 * node). `source_node` (NULL or "": none), when in the view, is every
 * key's first candidate, before its homes: the node that computed the
 * blocks has them before its pushes land. `tenant`: whose quota the
 * copies count against. */
size_t kvd_remote_fill(kvd_remote_t *r, const kvd_namespace_t *ns,
                       const kvd_block_hash_t *hashes, size_t n,
                       const char *source_node, uint32_t tenant);

/* Keys just committed here (`object_bytes` each) for store tenant
 * `tenant`: queue them for their homes, which keep them for the same
 * tenant (its quota, its arena partition). Never blocks. */
void kvd_remote_saved(kvd_remote_t *r, const kvd_namespace_t *ns,
                      const kvd_block_hash_t *hashes, size_t n,
                      uint64_t object_bytes, uint32_t tenant);

void kvd_remote_stats(kvd_remote_t *r, kvd_remote_stats_t *out);

/* A store get the data plane submitted (user_data with its tag bit)
 * completed: kvd_peer_store_completion. */
void kvd_remote_store_completion(kvd_remote_t *r,
                                 const kvd_store_completion_t *c);

#ifdef __cplusplus
}
#endif

#endif /* KVD_CLUSTER_REMOTE_H */
