/* Weighted rendezvous hashing (placement.h). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cluster/placement.h"

double kvd_placement_score(const kvd_store_key_t *key, const kvd_member_t *node)
{
    /* The key's bytes, then the node id: one hash per (key, node). */
    uint8_t buf[sizeof *key + sizeof node->node_id];
    size_t id_len = strnlen(node->node_id, sizeof node->node_id);
    memcpy(buf, key, sizeof *key);
    memcpy(buf + sizeof *key, node->node_id, id_len);
    uint64_t h = kvd_xxh3_64(buf, sizeof *key + id_len);
    /* 53 bits into (0, 1): never 0, never 1. */
    double u = ((double)(h >> 11) + 0.5) * 0x1.0p-53;
    double w = node->capacity_bytes > 0 ? (double)node->capacity_bytes : 1.0;
    return w / -log(u);
}

size_t kvd_placement_homes(const kvd_store_key_t *key,
                           const kvd_member_t *nodes, size_t n, size_t r,
                           size_t *out)
{
    if (key == NULL || nodes == NULL || out == NULL) {
        return 0;
    }
    size_t k = r < n ? r : n;
    if (k > KVD_PLACEMENT_MAX_REPLICAS) {
        k = KVD_PLACEMENT_MAX_REPLICAS;
    }
    double best[KVD_PLACEMENT_MAX_REPLICAS];
    size_t have = 0;
    /* Insertion into the k best so far: r is small (the replication). */
    for (size_t i = 0; i < n && k > 0; i++) {
        double s = kvd_placement_score(key, &nodes[i]);
        if (have == k && s <= best[k - 1]) {
            continue;
        }
        size_t j = have < k ? have++ : k - 1;
        while (j > 0 && best[j - 1] < s) {
            best[j] = best[j - 1];
            out[j] = out[j - 1];
            j--;
        }
        best[j] = s;
        out[j] = i;
    }
    return have;
}
