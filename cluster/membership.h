/*
 * Cluster membership through etcd (docs/cluster.md).
 *
 * A node registers its NodeInfo (proto/kvdepot/v1/cluster.proto) at
 * /kvdepot/<cluster>/nodes/<node_id> under an etcd lease it keeps alive
 * every TTL/3; a node that stops (or dies) leaves when its lease ends. Each
 * node reads the prefix once and then watches it from the revision of that
 * read, so its view misses no change. While etcd is unreachable the node
 * keeps its last view, marks it stale and retries with backoff (100 ms
 * doubling to 5 s); once etcd answers it registers again and reads the view
 * afresh.
 *
 * Threading: one background thread per membership does all of the above;
 * kvd_membership_view() may be called from any thread.
 */
#ifndef KVD_CLUSTER_MEMBERSHIP_H
#define KVD_CLUSTER_MEMBERSHIP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvdepot/common.h"
#include "proto/kvd_proto.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvd_membership kvd_membership_t;

typedef struct kvd_member {
    char node_id[KVD_PROTO_MAX_NODE_ID_BYTES + 1];
    char grpc_address[KVD_PROTO_MAX_ADDRESS_BYTES + 1];
    uint8_t ucx_address[KVD_PROTO_MAX_UCX_ADDRESS_BYTES];
    size_t ucx_address_len;
    uint64_t capacity_bytes;
    char version[KVD_PROTO_MAX_ID_BYTES + 1];
    uint32_t protocol_revision;
} kvd_member_t;

/* Nodes a view holds at most; registrations beyond it are ignored (and
 * counted). */
#define KVD_MEMBERSHIP_MAX_NODES 1024

typedef struct kvd_membership_config {
    const char *etcd_endpoint; /* "host:port" */
    const char *etcd_tls_ca;   /* PEM texts (kvd_etcd_tls_t); NULL: plain */
    const char *etcd_tls_cert;
    const char *etcd_tls_key;
    const char *cluster;      /* [a-zA-Z0-9._-]+ */
    const kvd_member_t *self; /* copied; node_id required */
    int lease_ttl_s;          /* >= 1 */
    int timeout_ms;           /* every etcd call's deadline */
} kvd_membership_config_t;

typedef struct kvd_membership_stats {
    bool stale;          /* etcd unreachable: the view may be out of date */
    bool registered;     /* this node's key is in etcd (as far as known) */
    uint64_t generation; /* increases at every change of the view */
    uint64_t reconnects; /* times the node registered again */
    uint64_t ignored;    /* registrations that did not decode or fit */
    size_t num_nodes;
} kvd_membership_stats_t;

/* Starts the background thread; returns at once (registration happens
 * there; until it does the view is empty and stale). Errors:
 * KVD_ERR_INVALID (bad config), KVD_ERR_NOMEM, thread errors. */
kvd_status_t kvd_membership_start(const kvd_membership_config_t *cfg,
                                  kvd_membership_t **out);

/* Stops the thread and revokes the lease so the node leaves the others'
 * views at once (best effort, within the timeout). NULL is accepted. */
void kvd_membership_stop(kvd_membership_t *m);

/* Copies up to `max` live members, ordered by node id, into `out` and
 * returns how many there are in all; `stats_out` may be NULL. */
size_t kvd_membership_view(kvd_membership_t *m, kvd_member_t *out, size_t max,
                           kvd_membership_stats_t *stats_out);

#ifdef __cplusplus
}
#endif

#endif /* KVD_CLUSTER_MEMBERSHIP_H */
