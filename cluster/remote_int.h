/*
 * The insides of a clustered node's share of the one cache (cluster/
 * remote.h is its interface), shared by its files and by no one outside
 * cluster/:
 *
 *   remote.c        start, stop, leave; the view of the live nodes and the
 *                   nodes that just failed (suspects)
 *   remote_fill.c   lookups that missed here (kvd_remote_fill)
 *   remote_mover.c  the mover thread: pushes to the homes of what was
 *                   saved here, pulls of what was offered here, repair
 *
 * Locks: `view_mu` guards `view` and `membership`; `mu` the job ring and
 * `stop`; `suspect_mu` the suspects. The retries and the repair state are
 * the mover's own. Counters are relaxed atomics.
 */
#ifndef KVD_CLUSTER_REMOTE_INT_H
#define KVD_CLUSTER_REMOTE_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cluster/membership.h"
#include "cluster/peer.h"
#include "cluster/remote.h"
#include "kvdepot/store.h"
#include "proto/kvd_proto.h"

#ifdef __cplusplus
extern "C" {
#endif

#define REMOTE_SUSPECTS 64u
/* Failed jobs waiting for their next try, at most (remote_mover.c). */
#define REMOTE_RETRIES 4096u

enum { JOB_PUSH = 1, JOB_PULL = 2 };

typedef struct remote_job {
    uint8_t kind;
    uint8_t attempts;       /* failed tries so far */
    uint64_t not_before_ns; /* a retry waits until then */
    kvd_namespace_t ns;
    kvd_block_hash_t hash;
    uint64_t size;
    uint32_t tenant;                     /* the store tenant it was saved for */
    char node[KVD_PEER_MAX_NODE_ID + 1]; /* JOB_PULL: who offered it */
} remote_job_t;

typedef struct remote_view {
    int refs;
    uint64_t generation;
    size_t n;
    kvd_member_t *m;
} remote_view_t;

struct kvd_remote {
    kvd_remote_config_t cfg;
    char self_id[KVD_PROTO_MAX_NODE_ID_BYTES + 1];
    kvd_peer_t *peer;
    kvd_membership_t *membership;

    pthread_mutex_t view_mu;
    remote_view_t *view;

    pthread_mutex_t mu; /* the job ring */
    pthread_cond_t cv;
    remote_job_t *jobs;
    size_t head, count;
    bool stop;
    pthread_t mover;
    bool mover_started;

    /* Failed jobs waiting for their next try: the mover's own, no lock. */
    remote_job_t *retry;
    size_t n_retry;

    /* Nodes whose last call failed (dead, cut off, too slow): skipped
     * until `until_ns`, so lookups do not each wait out the deadline on a
     * node that is still in the view. */
    pthread_mutex_t suspect_mu;
    struct {
        char node[KVD_PROTO_MAX_NODE_ID_BYTES + 1];
        uint64_t until_ns;
    } suspects[REMOTE_SUSPECTS];

    /* Repair (the mover's own): when a node joins the view, or the view
     * comes back from stale (etcd or the network was away: pushes may
     * have failed), the local store is scanned and every object whose
     * homes include such a node is offered to its homes again. */
    struct {
        bool started; /* the first view has been seen */
        bool was_stale;
        uint64_t generation;
        char (*known)[KVD_PROTO_MAX_NODE_ID_BYTES + 1]; /* last view */
        size_t n_known;
        bool active, all; /* scanning; for every node or for `targets` */
        uint64_t cursor;
        char (*targets)[KVD_PROTO_MAX_NODE_ID_BYTES + 1];
        size_t n_targets;
    } rep;

    kvd_remote_stats_t stats; /* counters only; atomics */
};

static inline void kvd_remote_count(uint64_t *c, uint64_t v)
{
    __atomic_fetch_add(c, v, __ATOMIC_RELAXED);
}

/* ---- the view and the suspects (remote.c) -------------------------------- */

/* The current view (taken again when it changed); release with
 * kvd_remote_view_put. NULL once the node has left (or without memory).
 * Any thread. */
remote_view_t *kvd_remote_view_get(kvd_remote_t *r);

/* Drops a reference to a view; NULL is accepted. */
void kvd_remote_view_put(kvd_remote_t *r, remote_view_t *v);

/* The index of `node_id` in the view, or -1. */
ptrdiff_t kvd_remote_view_find(const remote_view_t *v, const char *node_id);

/* The homes of (ns, hash) other than this node, best first: indexes into
 * the view (room for KVD_PLACEMENT_MAX_REPLICAS in `out`), nodes without
 * a UCX address left out. */
size_t kvd_remote_homes(kvd_remote_t *r, const remote_view_t *v,
                        const kvd_namespace_t *ns, const kvd_block_hash_t *h,
                        size_t *out);

/* Whether the last call to `node` failed less than a lease TTL ago. */
bool kvd_remote_suspect(kvd_remote_t *r, const char *node);

/* After a call to `node`: a failure makes it a suspect for a lease TTL
 * (by then it has left the view, or answers again); success clears it.
 * Other errors leave it as it was. */
void kvd_remote_suspect_note(kvd_remote_t *r, const char *node, kvd_status_t s);

/* ---- the mover (remote_mover.c) ------------------------------------------ */

/* The data plane's kvd_peer_offer_fn (`ctx` the remote): queues a pull
 * per key. On the progress thread; never blocks. */
void kvd_remote_on_offer(void *ctx, const char *node_id,
                         const kvd_namespace_t *ns, uint32_t tenant,
                         const kvd_block_hash_t *hashes, const uint64_t *sizes,
                         size_t n);

/* The mover thread's body (`arg` the remote); returns once `stop` is set. */
void *kvd_remote_mover_main(void *arg);

#ifdef __cplusplus
}
#endif

#endif /* KVD_CLUSTER_REMOTE_INT_H */
