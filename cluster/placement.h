/*
 * Where objects live in a cluster (docs/cluster.md): weighted rendezvous
 * (highest random weight) hashing of object keys over the live members.
 * Every node computes the same homes from the same view, a node joining
 * takes only the keys it now wins and a node leaving hands over only its
 * own, and a node offering twice the capacity is home to twice the keys.
 * Pure functions: no state, any thread.
 */
#ifndef KVD_CLUSTER_PLACEMENT_H
#define KVD_CLUSTER_PLACEMENT_H

#include <stddef.h>

#include "cluster/membership.h"
#include "kvdepot/store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Homes asked for at most (the replication factor's ceiling). */
#define KVD_PLACEMENT_MAX_REPLICAS 16

/* The score of `node` for `key`: weight / -ln(u), u uniform in (0, 1)
 * from XXH3 of the key and the node id; the weight is the node's capacity
 * (a node announcing 0 counts as 1 byte). */
double kvd_placement_score(const kvd_store_key_t *key,
                           const kvd_member_t *node);

/* The `r` home nodes of `key` among `nodes[0..n)`, best first, as indexes
 * into `nodes` written to `out` (room for `r`); returns
 * min(r, n, KVD_PLACEMENT_MAX_REPLICAS). */
size_t kvd_placement_homes(const kvd_store_key_t *key,
                           const kvd_member_t *nodes, size_t n, size_t r,
                           size_t *out);

#ifdef __cplusplus
}
#endif

#endif /* KVD_CLUSTER_PLACEMENT_H */
