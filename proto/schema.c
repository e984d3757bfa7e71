/*
 * The kvdepot.v1 validation rules: one table of per-field constraints and
 * one cross-field check per message that needs one, bound to protoc-c's
 * descriptors once at first use.
 *
 * The table names fields by their .proto names and is resolved against the
 * generated descriptors, so a renamed or retyped field fails loudly (every
 * call returns KVD_ERR_INTERNAL and test_proto_roundtrip fails) instead of
 * silently losing its rule. The resolver also insists that every bytes field
 * and every repeated field has a rule: those are the fields that cost memory,
 * and a new one must not arrive without a limit.
 *
 * The limits themselves are the KVD_PROTO_MAX_* constants of kvd_proto.h;
 * docs/protocol.md gives the reasoning behind each.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/log_int.h"
#include "proto/codec_int.h"

#define D(snake) (&kvdepot__v1__##snake##__descriptor)

/* Rule shorthands: required, range, count. */
#define REQ KVD_PROTO_RULE_REQUIRED
#define UNIQ KVD_PROTO_RULE_UNIQUE
#define RNG KVD_PROTO_RULE_RANGE
#define NS_BYTES KVD_PROTO_NAMESPACE_ID_BYTES
#define HASH_BYTES KVD_PROTO_BLOCK_HASH_BYTES
#define ID_MAX KVD_PROTO_MAX_ID_BYTES
#define NODE_MAX KVD_PROTO_MAX_NODE_ID_BYTES
#define TTL_MAX KVD_PROTO_MAX_TTL_MS
#define OBJ_MAX ((int64_t)KVD_PROTO_MAX_OBJECT_BYTES)

static const kvd_proto_rule_t rules[] = {
    /* metadata.proto: identity and descriptors */
    {D(object_key), "namespace_id", REQ | RNG, NS_BYTES, NS_BYTES, 0},
    {D(object_key), "block_hash", REQ | RNG, HASH_BYTES, HASH_BYTES, 0},
    {D(namespace_descriptor), "model_id", REQ | RNG, 1, ID_MAX, 0},
    {D(namespace_descriptor), "dtype", REQ, 0, 0, 0},
    {D(namespace_descriptor), "k_codec", REQ, 0, 0, 0},
    {D(namespace_descriptor), "num_layers", RNG, 1, KVD_PROTO_MAX_LAYERS, 0},
    {D(namespace_descriptor), "num_kv_heads", RNG, 1, KVD_PROTO_MAX_HEADS, 0},
    {D(namespace_descriptor), "head_start", RNG, 0, KVD_PROTO_MAX_HEADS - 1, 0},
    {D(namespace_descriptor), "total_kv_heads", RNG, 1, KVD_PROTO_MAX_HEADS, 0},
    {D(namespace_descriptor), "head_dim", RNG, 1, KVD_PROTO_MAX_HEAD_DIM, 0},
    {D(namespace_descriptor), "block_size", RNG, 1, KVD_PROTO_MAX_BLOCK_SIZE,
     0},
    {D(namespace_descriptor), "tp_size", RNG, 1, KVD_PROTO_MAX_TP_SIZE, 0},
    {D(namespace_descriptor), "tp_rank", RNG, 0, KVD_PROTO_MAX_TP_SIZE - 1, 0},
    {D(namespace_descriptor), "first_layer", RNG, 0, KVD_PROTO_MAX_LAYERS - 1,
     0},
    {D(object_descriptor), "key", REQ, 0, 0, 0},
    {D(object_descriptor), "size_bytes", RNG, 1, OBJ_MAX, 0},
    {D(object_descriptor), "k_codec", REQ, 0, 0, 0},
    {D(object_descriptor), "layer_checksums", REQ, 0, 0, KVD_PROTO_MAX_LAYERS},
    {D(object_descriptor), "tier", REQ, 0, 0, 0},

    /* metadata.proto: step plan */
    {D(block_source), "tier", REQ, 0, 0, 0},
    {D(block_source), "node_id", RNG, 0, NODE_MAX, 0},
    {D(block_load), "block_id", RNG, 0, KVD_PROTO_MAX_BLOCK_ID, 0},
    {D(block_load), "key", REQ, 0, 0, 0},
    {D(block_load), "source", REQ, 0, 0, 0},
    {D(block_save), "block_id", RNG, 0, KVD_PROTO_MAX_BLOCK_ID, 0},
    {D(block_save), "key", REQ, 0, 0, 0},
    {D(block_save), "position", RNG, 0, KVD_PROTO_MAX_POSITION, 0},
    {D(block_load), "position", RNG, 0, KVD_PROTO_MAX_POSITION, 0},
    {D(step_request), "request_id", REQ | RNG, 1, ID_MAX, 0},
    {D(step_request), "loads", 0, 0, 0, KVD_PROTO_MAX_BLOCKS_PER_REQUEST},
    {D(step_request), "saves", 0, 0, 0, KVD_PROTO_MAX_BLOCKS_PER_REQUEST},
    {D(step_plan), "block_size", RNG, 1, KVD_PROTO_MAX_BLOCK_SIZE, 0},
    {D(step_plan), "requests", 0, 0, 0, KVD_PROTO_MAX_REQUESTS},
    {D(step_plan), "preempted_request_ids", UNIQ | RNG, 1, ID_MAX,
     KVD_PROTO_MAX_REQUESTS},

    /* metadata.proto: worker report */
    {D(failed_load), "request_id", REQ | RNG, 1, ID_MAX, 0},
    {D(failed_load), "block_id", RNG, 0, KVD_PROTO_MAX_BLOCK_ID, 0},
    {D(failed_load), "status", RNG, INT32_MIN, -1, 0},
    {D(worker_report), "worker_rank", RNG, 0, INT32_MAX, 0},
    {D(worker_report), "finished_saving", UNIQ | RNG, 1, ID_MAX,
     KVD_PROTO_MAX_REQUESTS},
    {D(worker_report), "finished_loading", UNIQ | RNG, 1, ID_MAX,
     KVD_PROTO_MAX_REQUESTS},
    {D(worker_report), "failed_loads", 0, 0, 0, KVD_PROTO_MAX_BLOCKS_PER_PLAN},
    {D(worker_report), "tier_loads", 0, 0, 0, KVD_PROTO_MAX_TIERS},
    {D(tier_load), "tier", REQ, 0, 0, 0},
    {D(tier_load), "blocks", RNG, 1, KVD_PROTO_MAX_BLOCKS_PER_PLAN, 0},
    {D(tier_load), "loads", RNG, 1, KVD_PROTO_MAX_BLOCKS_PER_PLAN, 0},

    /* store.proto */
    {D(lookup_request), "namespace_id", REQ | RNG, NS_BYTES, NS_BYTES, 0},
    {D(lookup_request), "block_hashes", UNIQ | RNG, HASH_BYTES, HASH_BYTES,
     KVD_PROTO_MAX_HASHES},
    {D(lookup_request), "packed_hashes", RNG, 0,
     (int64_t)HASH_BYTES *KVD_PROTO_MAX_HASHES, 0},
    {D(lookup_request), "lease_ttl_ms", RNG, 0, TTL_MAX, 0},
    {D(lookup_request), "tenant", RNG, 0, ID_MAX, 0},
    {D(lookup_request), "source_node", RNG, 0, NODE_MAX, 0},
    {D(lookup_request), "release_lease_ids", UNIQ | RNG, 1, KVD_PROTO_NO_MAX,
     KVD_PROTO_MAX_LEASES},
    {D(block_location), "tier", REQ, 0, 0, 0},
    {D(block_location), "node_id", RNG, 0, NODE_MAX, 0},
    {D(block_location), "size_bytes", RNG, 0, OBJ_MAX, 0},
    {D(lookup_response), "locations", 0, 0, 0, KVD_PROTO_MAX_HASHES},
    {D(lookup_response), "tiers", 0, 0, 0, KVD_PROTO_MAX_HASHES},
    {D(lookup_response), "arena_offsets", 0, 0, 0, KVD_PROTO_MAX_HASHES},
    {D(lookup_response), "sizes", RNG, 0, OBJ_MAX, KVD_PROTO_MAX_HASHES},
    {D(lookup_response), "lease_ttl_ms", RNG, 0, TTL_MAX, 0},
    {D(reserve_request), "namespace_id", REQ | RNG, NS_BYTES, NS_BYTES, 0},
    {D(reserve_request), "block_hashes", REQ | UNIQ | RNG, HASH_BYTES,
     HASH_BYTES, KVD_PROTO_MAX_HASHES},
    {D(reserve_request), "object_size_bytes", RNG, 1, OBJ_MAX, 0},
    {D(reserve_request), "tenant", RNG, 0, ID_MAX, 0},
    {D(reserve_request), "ttl_ms", RNG, 0, TTL_MAX, 0},
    {D(reserve_request), "part", RNG, 0, KVD_PROTO_MAX_PARTS - 1, 0},
    {D(reserve_request), "num_parts", RNG, 0, KVD_PROTO_MAX_PARTS, 0},
    {D(block_reservation), "block_hash", REQ | RNG, HASH_BYTES, HASH_BYTES, 0},
    {D(block_reservation), "outcome", REQ, 0, 0, 0},
    {D(reserve_response), "blocks", 0, 0, 0, KVD_PROTO_MAX_HASHES},
    {D(reserve_response), "ttl_ms", RNG, 0, TTL_MAX, 0},
    {D(reserve_response), "num_parts", RNG, 0, KVD_PROTO_MAX_PARTS, 0},
    {D(commit_entry), "block_hash", REQ | RNG, HASH_BYTES, HASH_BYTES, 0},
    {D(commit_entry), "layer_checksums", 0, 0, 0, KVD_PROTO_MAX_LAYERS},
    {D(commit_request), "reservation_id", REQ, 0, 0, 0},
    {D(commit_request), "entries", REQ, 0, 0, KVD_PROTO_MAX_HASHES},
    {D(commit_response), "num_committed", RNG, 0, KVD_PROTO_MAX_HASHES, 0},
    {D(commit_response), "statuses", RNG, INT32_MIN, 0, KVD_PROTO_MAX_HASHES},
    {D(block_reservation), "status", RNG, INT32_MIN, 0, 0},
    {D(abort_request), "reservation_id", REQ, 0, 0, 0},
    {D(abort_request), "block_hashes", UNIQ | RNG, HASH_BYTES, HASH_BYTES,
     KVD_PROTO_MAX_HASHES},
    {D(abort_response), "num_aborted", RNG, 0, KVD_PROTO_MAX_HASHES, 0},
    {D(release_request), "lease_ids", REQ | UNIQ | RNG, 1, KVD_PROTO_NO_MAX,
     KVD_PROTO_MAX_LEASES},
    {D(release_response), "num_released", RNG, 0, KVD_PROTO_MAX_LEASES, 0},
    {D(get_request), "namespace_id", REQ | RNG, NS_BYTES, NS_BYTES, 0},
    {D(get_request), "block_hashes", REQ | UNIQ | RNG, HASH_BYTES, HASH_BYTES,
     KVD_PROTO_MAX_HASHES},
    {D(get_request), "lease_ttl_ms", RNG, 0, TTL_MAX, 0},
    {D(get_entry), "block_hash", REQ | RNG, HASH_BYTES, HASH_BYTES, 0},
    {D(get_entry), "state", REQ, 0, 0, 0},
    {D(get_entry), "size_bytes", RNG, 0, OBJ_MAX, 0},
    {D(get_entry), "status", RNG, INT32_MIN, 0, 0},
    {D(get_response), "lease_ttl_ms", RNG, 0, TTL_MAX, 0},
    {D(get_response), "entries", 0, 0, 0, KVD_PROTO_MAX_HASHES},
    {D(promote_request), "namespace_id", REQ | RNG, NS_BYTES, NS_BYTES, 0},
    {D(promote_request), "block_hashes", REQ | UNIQ | RNG, HASH_BYTES,
     HASH_BYTES, KVD_PROTO_MAX_HASHES},
    {D(promote_request), "target_tier", REQ, 0, 0, 0},
    {D(promote_response), "num_accepted", RNG, 0, KVD_PROTO_MAX_HASHES, 0},
    {D(delete_request), "namespace_id", REQ | RNG, NS_BYTES, NS_BYTES, 0},
    {D(delete_request), "block_hashes", REQ | UNIQ | RNG, HASH_BYTES,
     HASH_BYTES, KVD_PROTO_MAX_HASHES},
    {D(delete_response), "num_deleted", RNG, 0, KVD_PROTO_MAX_HASHES, 0},
    {D(tier_stats), "tier", REQ, 0, 0, 0},
    {D(stats_response), "tiers", 0, 0, 0, KVD_PROTO_MAX_TIERS},
    {D(stats_response), "tenant", RNG, 0, ID_MAX, 0},
    {D(ping_reply), "version", REQ | RNG, 1, ID_MAX, 0},
    {D(ping_reply), "protocol_major", RNG, KVD_PROTO_MAJOR, KVD_PROTO_MAJOR, 0},
    {D(ping_reply), "node_id", RNG, 0, NODE_MAX, 0},
    {D(drop_tenant), "tenant", RNG, 0, ID_MAX, 0},
    {D(node_info), "node_id", REQ | RNG, 1, NODE_MAX, 0},
    {D(node_info), "grpc_address", RNG, 0, KVD_PROTO_MAX_ADDRESS_BYTES, 0},
    {D(node_info), "ucx_address", RNG, 0, KVD_PROTO_MAX_UCX_ADDRESS_BYTES, 0},
    {D(node_info), "version", RNG, 0, ID_MAX, 0},
    {D(config_entry), "key", REQ | RNG, 1, KVD_PROTO_MAX_CONFIG_TEXT, 0},
    {D(config_entry), "value", RNG, 0, KVD_PROTO_MAX_CONFIG_TEXT, 0},
    {D(config_entry), "source", REQ | RNG, 1, 16, 0},
    {D(config_dump_reply), "entries", 0, 0, 0, KVD_PROTO_MAX_CONFIG_ENTRIES},
    {D(drop_namespace), "namespace_id", REQ | RNG, NS_BYTES, NS_BYTES, 0},
    {D(flush), "timeout_ms", RNG, 0, TTL_MAX, 0},
    {D(namespace_usage), "namespace_id", REQ | RNG, NS_BYTES, NS_BYTES, 0},
    {D(list_namespaces_reply), "namespaces", 0, 0, 0, KVD_PROTO_MAX_NAMESPACES},
    {D(list_namespaces_reply), "tenants", 0, 0, 0, KVD_PROTO_MAX_NAMESPACES},
    {D(tenant_usage), "tenant_name", RNG, 0, ID_MAX, 0},
    {D(cluster_node), "node_id", REQ | RNG, 1, NODE_MAX, 0},
    {D(cluster_node), "grpc_address", RNG, 0, KVD_PROTO_MAX_ADDRESS_BYTES, 0},
    {D(cluster_node), "version", RNG, 0, ID_MAX, 0},
    {D(cluster_nodes_reply), "self_node_id", RNG, 0, NODE_MAX, 0},
    {D(cluster_nodes_reply), "nodes", 0, 0, 0, KVD_PROTO_MAX_CLUSTER_NODES},
    {D(pin), "namespace_id", REQ | RNG, NS_BYTES, NS_BYTES, 0},
    {D(pin), "block_hashes", REQ | UNIQ | RNG, HASH_BYTES, HASH_BYTES,
     KVD_PROTO_MAX_PIN_KEYS},
    {D(events), "namespace_ids", UNIQ | RNG, NS_BYTES, NS_BYTES,
     KVD_PROTO_MAX_EVENT_NAMESPACES},
    {D(events), "max_events", RNG, 0, KVD_PROTO_MAX_EVENTS, 0},
    {D(store_event), "namespace_index", RNG, 0,
     KVD_PROTO_MAX_EVENT_NAMESPACES - 1, 0},
    {D(store_event), "block_hash", REQ | RNG, HASH_BYTES, HASH_BYTES, 0},
    {D(events_reply), "events", 0, 0, 0, KVD_PROTO_MAX_EVENTS},
};

/* ------------------------------------------------------------------------ */
/* Cross-field checks                                                       */
/* ------------------------------------------------------------------------ */

/* Fails at "<path>.<field>: <message>". */
#define FAIL_AT(walk, field, ...)                                              \
    (kvd_proto_walk_push((walk), (field), KVD_PROTO_NO_INDEX),                 \
     kvd_proto_walk_fail((walk), KVD_ERR_PROTO, __VA_ARGS__))

static kvd_proto_item_t *items_alloc(kvd_proto_walk_t *walk, size_t n,
                                     kvd_status_t *status_out)
{
    kvd_proto_item_t *items = malloc((n > 0 ? n : 1) * sizeof(*items));
    if (items == NULL) {
        *status_out = kvd_proto_walk_fail(walk, KVD_ERR_NOMEM,
                                          "out of memory for %zu entries", n);
    }
    return items;
}

static void item_set(kvd_proto_item_t *item, size_t index, const void *bytes,
                     size_t len, uint64_t num)
{
    item->bytes = bytes;
    item->len = len;
    item->num = num;
    item->index = index;
}

/* num_load_tokens must be what the prefix loads carry: every block full
 * except possibly one token short of the last (the engine computes at least
 * one token itself when the whole prompt hit). Content loads (non-prefix
 * reuse) are whole blocks outside the prefix and not counted. */
static kvd_status_t check_load_tokens(kvd_proto_walk_t *walk,
                                      const kvd_pb_step_request_t *r,
                                      uint32_t block_size)
{
    uint64_t tokens = r->num_load_tokens;
    size_t n = 0;
    for (size_t i = 0; i < r->n_loads; i++) {
        n += !r->loads[i]->content;
    }
    if (n == 0) {
        if (tokens != 0) {
            return FAIL_AT(walk, "num_load_tokens",
                           "%llu tokens without prefix loads",
                           (unsigned long long)tokens);
        }
        return KVD_OK;
    }
    uint64_t hi = (uint64_t)n * block_size;
    uint64_t lo = hi - block_size + 1;
    if (tokens < lo || tokens > hi) {
        return FAIL_AT(walk, "num_load_tokens",
                       "%llu, want %llu..%llu for %zu loads of %u tokens",
                       (unsigned long long)tokens, (unsigned long long)lo,
                       (unsigned long long)hi, n, block_size);
    }
    return KVD_OK;
}

static kvd_status_t check_request_blocks(kvd_proto_walk_t *walk,
                                         const kvd_pb_step_request_t *r,
                                         kvd_proto_item_t *items)
{
    for (size_t i = 0; i < r->n_loads; i++) {
        item_set(&items[i], i, NULL, 0, r->loads[i]->block_id);
    }
    kvd_status_t status =
        kvd_proto_walk_unique(walk, items, r->n_loads, "loads", "block_id");
    if (status != KVD_OK) {
        return status;
    }
    for (size_t i = 0; i < r->n_saves; i++) {
        item_set(&items[i], i, NULL, 0, r->saves[i]->block_id);
    }
    status =
        kvd_proto_walk_unique(walk, items, r->n_saves, "saves", "block_id");
    if (status != KVD_OK) {
        return status;
    }
    /* Every object the saves name once: a save's content key is a second
     * object, and the worker reserves them all in one batch, which names
     * each key once. */
    size_t k = 0;
    for (size_t i = 0; i < r->n_saves; i++) {
        const kvd_pb_block_save_t *sv = r->saves[i];
        if (sv->key != NULL) {
            item_set(&items[k++], i, sv->key->block_hash.data,
                     sv->key->block_hash.len, 0);
        }
        if (sv->content_key != NULL) {
            item_set(&items[k++], i, sv->content_key->block_hash.data,
                     sv->content_key->block_hash.len, 0);
        }
    }
    return kvd_proto_walk_unique(walk, items, k, "saves",
                                 "block_hash (key or content_key)");
}

static kvd_status_t check_step_plan(kvd_proto_walk_t *walk,
                                    const ProtobufCMessage *msg)
{
    const kvd_pb_step_plan_t *plan = (const void *)msg;
    size_t scratch = plan->n_requests, total = 0;
    for (size_t i = 0; i < plan->n_requests; i++) {
        const kvd_pb_step_request_t *r = plan->requests[i];
        scratch = r->n_loads > scratch ? r->n_loads : scratch;
        /* Saves: a key and a content key each. */
        scratch = 2 * r->n_saves > scratch ? 2 * r->n_saves : scratch;
        total += r->n_loads + r->n_saves;
    }
    if (total > KVD_PROTO_MAX_BLOCKS_PER_PLAN) {
        return FAIL_AT(walk, "requests", "%zu loads and saves in all, max %u",
                       total, (unsigned)KVD_PROTO_MAX_BLOCKS_PER_PLAN);
    }
    kvd_status_t status = KVD_OK;
    kvd_proto_item_t *items = items_alloc(walk, scratch, &status);
    if (items == NULL) {
        return status;
    }
    for (size_t i = 0; status == KVD_OK && i < plan->n_requests; i++) {
        const kvd_pb_step_request_t *r = plan->requests[i];
        kvd_proto_walk_push(walk, "requests", i);
        status = check_load_tokens(walk, r, plan->block_size);
        if (status == KVD_OK) {
            status = check_request_blocks(walk, r, items);
        }
        kvd_proto_walk_pop(walk);
    }
    if (status == KVD_OK) {
        for (size_t i = 0; i < plan->n_requests; i++) {
            const char *id = plan->requests[i]->request_id;
            item_set(&items[i], i, id, strlen(id), 0);
        }
        status = kvd_proto_walk_unique(walk, items, plan->n_requests,
                                       "requests", "request_id");
    }
    free(items);
    return status;
}

/* A source or location names a node exactly when it is remote. */
static kvd_status_t check_tier_node(kvd_proto_walk_t *walk, int tier,
                                    const char *node_id)
{
    bool has_node = node_id != NULL && node_id[0] != '\0';
    if (tier == KVDEPOT__V1__TIER__TIER_REMOTE && !has_node) {
        return FAIL_AT(walk, "node_id", "empty, required for TIER_REMOTE");
    }
    if (tier != KVDEPOT__V1__TIER__TIER_REMOTE && has_node) {
        return FAIL_AT(walk, "node_id",
                       "set, but only TIER_REMOTE names a node");
    }
    return KVD_OK;
}

static kvd_status_t check_block_source(kvd_proto_walk_t *walk,
                                       const ProtobufCMessage *msg)
{
    const kvd_pb_block_source_t *s = (const void *)msg;
    return check_tier_node(walk, s->tier, s->node_id);
}

static kvd_status_t check_block_location(kvd_proto_walk_t *walk,
                                         const ProtobufCMessage *msg)
{
    const kvd_pb_block_location_t *l = (const void *)msg;
    return check_tier_node(walk, l->tier, l->node_id);
}

static kvd_status_t check_namespace_descriptor(kvd_proto_walk_t *walk,
                                               const ProtobufCMessage *msg)
{
    const kvd_pb_namespace_descriptor_t *d = (const void *)msg;
    if ((uint64_t)d->head_start + d->num_kv_heads > d->total_kv_heads) {
        return FAIL_AT(walk, "head_start",
                       "heads %u..%u exceed total_kv_heads %u", d->head_start,
                       d->head_start + d->num_kv_heads - 1, d->total_kv_heads);
    }
    if (d->tp_rank >= d->tp_size) {
        return FAIL_AT(walk, "tp_rank", "%u, want < tp_size %u", d->tp_rank,
                       d->tp_size);
    }
    if (d->kv_combined && d->v_codec != KVDEPOT__V1__CODEC__CODEC_UNSPECIFIED) {
        return FAIL_AT(walk, "v_codec", "set, but K and V are combined");
    }
    if (!d->kv_combined &&
        d->v_codec == KVDEPOT__V1__CODEC__CODEC_UNSPECIFIED) {
        return FAIL_AT(walk, "v_codec", "unset (CODEC_UNSPECIFIED), required");
    }
    return KVD_OK;
}

static kvd_status_t check_object_descriptor(kvd_proto_walk_t *walk,
                                            const ProtobufCMessage *msg)
{
    const kvd_pb_object_descriptor_t *d = (const void *)msg;
    if (d->created_unix_ms != 0 && d->last_access_unix_ms != 0 &&
        d->last_access_unix_ms < d->created_unix_ms) {
        return FAIL_AT(walk, "last_access_unix_ms",
                       "%llu, before created_unix_ms %llu",
                       (unsigned long long)d->last_access_unix_ms,
                       (unsigned long long)d->created_unix_ms);
    }
    return KVD_OK;
}

static kvd_status_t check_worker_report(kvd_proto_walk_t *walk,
                                        const ProtobufCMessage *msg)
{
    const kvd_pb_worker_report_t *r = (const void *)msg;
    kvd_status_t status = KVD_OK;
    kvd_proto_item_t *items = items_alloc(walk, r->n_failed_loads, &status);
    if (items == NULL) {
        return status;
    }
    for (size_t i = 0; i < r->n_failed_loads; i++) {
        const kvd_pb_failed_load_t *f = r->failed_loads[i];
        item_set(&items[i], i, f->request_id, strlen(f->request_id),
                 f->block_id);
    }
    status = kvd_proto_walk_unique(walk, items, r->n_failed_loads,
                                   "failed_loads", NULL);
    free(items);
    return status;
}

/* One form of the chain: block_hashes (repeated, unique) or packed_hashes
 * (one field of 32-byte hashes). */
static kvd_status_t check_lookup_request(kvd_proto_walk_t *walk,
                                         const ProtobufCMessage *msg)
{
    const kvd_pb_lookup_request_t *r = (const void *)msg;
    size_t packed = r->packed_hashes.len;
    if (r->n_block_hashes == 0 && packed == 0) {
        return FAIL_AT(walk, "block_hashes",
                       "empty, at least one entry required");
    }
    if (r->n_block_hashes > 0 && packed > 0) {
        return FAIL_AT(walk, "packed_hashes",
                       "%zu bytes beside %zu block_hashes; one form only",
                       packed, r->n_block_hashes);
    }
    if (packed % HASH_BYTES != 0) {
        return FAIL_AT(walk, "packed_hashes",
                       "%zu bytes, want a multiple of %d", packed, HASH_BYTES);
    }
    const char *src = r->source_node;
    if (src != NULL &&
        strspn(src, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                    "0123456789._-") != strlen(src)) {
        return FAIL_AT(walk, "source_node",
                       "\"%.40s\": want letters, digits, . _ -", src);
    }
    return KVD_OK;
}

static kvd_status_t check_lookup_response(kvd_proto_walk_t *walk,
                                          const ProtobufCMessage *msg)
{
    const kvd_pb_lookup_response_t *r = (const void *)msg;
    if ((r->lease_id != 0) != (r->lease_ttl_ms != 0)) {
        return FAIL_AT(walk, "lease_ttl_ms",
                       "%u with lease_id %llu; both set or both 0",
                       r->lease_ttl_ms, (unsigned long long)r->lease_id);
    }
    if (r->n_tiers != r->n_arena_offsets || r->n_tiers != r->n_sizes) {
        return FAIL_AT(walk, "tiers",
                       "%zu entries, arena_offsets %zu, sizes %zu: want one "
                       "length",
                       r->n_tiers, r->n_arena_offsets, r->n_sizes);
    }
    if (r->n_tiers > 0 && r->n_locations > 0) {
        return FAIL_AT(walk, "locations",
                       "%zu entries beside %zu packed ones; one form only",
                       r->n_locations, r->n_tiers);
    }
    for (size_t i = 0; i < r->n_tiers; i++) {
        if (r->tiers[i] != KVDEPOT__V1__TIER__TIER_HOST &&
            r->tiers[i] != KVDEPOT__V1__TIER__TIER_DISK) {
            return FAIL_AT(walk, "tiers",
                           "entry %zu: %d, want TIER_HOST or "
                           "TIER_DISK",
                           i, (int)r->tiers[i]);
        }
    }
    if (r->lease_id != 0 && r->n_locations == 0 && r->n_tiers == 0) {
        return FAIL_AT(walk, "lease_id", "set without any location");
    }
    return KVD_OK;
}

/* Entries of a response each answer one hash of the request. */
#define CHECK_HASHES_UNIQUE(walk, list, n, entry_hash)                         \
    do {                                                                       \
        kvd_status_t st_ = KVD_OK;                                             \
        kvd_proto_item_t *items_ = items_alloc((walk), (n), &st_);             \
        if (items_ == NULL) {                                                  \
            return st_;                                                        \
        }                                                                      \
        for (size_t i_ = 0; i_ < (n); i_++) {                                  \
            item_set(&items_[i_], i_, entry_hash(i_).data, entry_hash(i_).len, \
                     0);                                                       \
        }                                                                      \
        st_ =                                                                  \
            kvd_proto_walk_unique((walk), items_, (n), (list), "block_hash");  \
        free(items_);                                                          \
        if (st_ != KVD_OK) {                                                   \
            return st_;                                                        \
        }                                                                      \
    } while (0)

static kvd_status_t check_reserve_request(kvd_proto_walk_t *walk,
                                          const ProtobufCMessage *msg)
{
    const kvd_pb_reserve_request_t *r = (const void *)msg;
    if (r->part >= (r->num_parts > 1 ? r->num_parts : 1)) {
        return FAIL_AT(walk, "part", "%u, not below num_parts %u", r->part,
                       r->num_parts);
    }
    return KVD_OK;
}

static kvd_status_t check_reserve_response(kvd_proto_walk_t *walk,
                                           const ProtobufCMessage *msg)
{
    const kvd_pb_reserve_response_t *r = (const void *)msg;
    bool reserved = false;
    for (size_t i = 0; i < r->n_blocks; i++) {
        reserved |= r->blocks[i]->outcome ==
                    KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_RESERVED;
    }
    if (reserved && r->reservation_id == 0) {
        return FAIL_AT(walk, "reservation_id",
                       "unset, required when a block is reserved");
    }
    if (!reserved && r->reservation_id != 0) {
        return FAIL_AT(walk, "reservation_id", "set, but nothing is reserved");
    }
#define ENTRY_HASH(i) (r->blocks[i]->block_hash)
    CHECK_HASHES_UNIQUE(walk, "blocks", r->n_blocks, ENTRY_HASH);
#undef ENTRY_HASH
    return KVD_OK;
}

static kvd_status_t check_commit_request(kvd_proto_walk_t *walk,
                                         const ProtobufCMessage *msg)
{
    const kvd_pb_commit_request_t *r = (const void *)msg;
#define ENTRY_HASH(i) (r->entries[i]->block_hash)
    CHECK_HASHES_UNIQUE(walk, "entries", r->n_entries, ENTRY_HASH);
#undef ENTRY_HASH
    return KVD_OK;
}

static kvd_status_t check_get_entry(kvd_proto_walk_t *walk,
                                    const ProtobufCMessage *msg)
{
    const kvd_pb_get_entry_t *e = (const void *)msg;
    bool failed = e->state == KVDEPOT__V1__GET_STATE__GET_STATE_FAILED;
    if (e->state == KVDEPOT__V1__GET_STATE__GET_STATE_READY &&
        e->size_bytes == 0) {
        return FAIL_AT(walk, "size_bytes", "0, required for GET_STATE_READY");
    }
    if (failed && e->status == 0) {
        return FAIL_AT(walk, "status",
                       "0, want a negative status when "
                       "GET_STATE_FAILED");
    }
    if (!failed && e->status != 0) {
        return FAIL_AT(walk, "status", "%d, want 0 unless GET_STATE_FAILED",
                       (int)e->status);
    }
    return KVD_OK;
}

static kvd_status_t check_get_response(kvd_proto_walk_t *walk,
                                       const ProtobufCMessage *msg)
{
    const kvd_pb_get_response_t *r = (const void *)msg;
    bool leased = false;
    for (size_t i = 0; i < r->n_entries; i++) {
        leased |=
            r->entries[i]->state == KVDEPOT__V1__GET_STATE__GET_STATE_READY ||
            r->entries[i]->state == KVDEPOT__V1__GET_STATE__GET_STATE_PENDING;
    }
    if (leased != (r->lease_id != 0)) {
        return FAIL_AT(walk, "lease_id",
                       leased ? "unset, required for READY/PENDING entries"
                              : "set without READY/PENDING entries");
    }
#define ENTRY_HASH(i) (r->entries[i]->block_hash)
    CHECK_HASHES_UNIQUE(walk, "entries", r->n_entries, ENTRY_HASH);
#undef ENTRY_HASH
    return KVD_OK;
}

static kvd_status_t check_promote_request(kvd_proto_walk_t *walk,
                                          const ProtobufCMessage *msg)
{
    const kvd_pb_promote_request_t *r = (const void *)msg;
    if (r->target_tier != KVDEPOT__V1__TIER__TIER_HOST &&
        r->target_tier != KVDEPOT__V1__TIER__TIER_DISK) {
        return FAIL_AT(walk, "target_tier", "%d, want TIER_HOST or TIER_DISK",
                       (int)r->target_tier);
    }
    return KVD_OK;
}

static kvd_status_t check_tier_stats(kvd_proto_walk_t *walk,
                                     const ProtobufCMessage *msg)
{
    const kvd_pb_tier_stats_t *t = (const void *)msg;
    if (t->used_bytes > t->capacity_bytes) {
        return FAIL_AT(walk, "used_bytes", "%llu, above capacity_bytes %llu",
                       (unsigned long long)t->used_bytes,
                       (unsigned long long)t->capacity_bytes);
    }
    return KVD_OK;
}

static kvd_status_t check_stats_response(kvd_proto_walk_t *walk,
                                         const ProtobufCMessage *msg)
{
    const kvd_pb_stats_response_t *r = (const void *)msg;
    kvd_proto_item_t items[KVD_PROTO_MAX_TIERS];
    for (size_t i = 0; i < r->n_tiers; i++) {
        item_set(&items[i], i, NULL, 0, (uint32_t)r->tiers[i]->tier);
    }
    return kvd_proto_walk_unique(walk, items, r->n_tiers, "tiers", "tier");
}

/* A oneof case must name one of its members (protobuf-c would pack nothing
 * for an unknown case, and the peer would see "unset"). */
static kvd_status_t check_oneof(kvd_proto_walk_t *walk,
                                const ProtobufCMessage *msg, const char *name)
{
    const ProtobufCMessageDescriptor *desc = msg->descriptor;
    uint32_t which = 0;
    for (unsigned i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &desc->fields[i];
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            which =
                *(const uint32_t *)((const char *)msg + f->quantifier_offset);
            if (which == f->id) {
                return KVD_OK;
            }
        }
    }
    if (which == 0) {
        return FAIL_AT(walk, name, "unset, required");
    }
    return FAIL_AT(walk, name, "case %u names no member", (unsigned)which);
}

static kvd_status_t check_admin_request(kvd_proto_walk_t *walk,
                                        const ProtobufCMessage *msg)
{
    return check_oneof(walk, msg, "op");
}

static kvd_status_t check_admin_response(kvd_proto_walk_t *walk,
                                         const ProtobufCMessage *msg)
{
    return check_oneof(walk, msg, "result");
}

static const struct {
    const ProtobufCMessageDescriptor *desc;
    kvd_proto_check_fn check;
} checks[] = {
    {D(step_plan), check_step_plan},
    {D(block_source), check_block_source},
    {D(block_location), check_block_location},
    {D(namespace_descriptor), check_namespace_descriptor},
    {D(object_descriptor), check_object_descriptor},
    {D(worker_report), check_worker_report},
    {D(lookup_request), check_lookup_request},
    {D(lookup_response), check_lookup_response},
    {D(reserve_request), check_reserve_request},
    {D(reserve_response), check_reserve_response},
    {D(commit_request), check_commit_request},
    {D(get_entry), check_get_entry},
    {D(get_response), check_get_response},
    {D(promote_request), check_promote_request},
    {D(tier_stats), check_tier_stats},
    {D(stats_response), check_stats_response},
    {D(admin_request), check_admin_request},
    {D(admin_response), check_admin_response},
};

/* ------------------------------------------------------------------------ */
/* Binding the tables to the descriptors                                    */
/* ------------------------------------------------------------------------ */

/* Every descriptor reachable from the top-level messages (33 today). */
#define MAX_SCHEMAS 64

static kvd_proto_schema_t schemas[MAX_SCHEMAS];
static size_t num_schemas;
static const kvd_proto_schema_t *roots[KVD_PROTO_MSG_COUNT];
static kvd_status_t init_status = KVD_ERR_INTERNAL;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static kvd_proto_schema_t *schema_find(const ProtobufCMessageDescriptor *desc)
{
    for (size_t i = 0; i < num_schemas; i++) {
        if (schemas[i].desc == desc) {
            return &schemas[i];
        }
    }
    return NULL;
}

/* Adds `desc` and everything below it; `depth` bounds the nesting so the
 * walks' path stacks cannot overflow. */
static kvd_status_t schema_add(const ProtobufCMessageDescriptor *desc,
                               unsigned depth, kvd_proto_schema_t **out)
{
    kvd_proto_schema_t *s = schema_find(desc);
    if (s != NULL) {
        *out = s;
        return KVD_OK;
    }
    if (depth >= KVD_PROTO_MAX_DEPTH || num_schemas == MAX_SCHEMAS ||
        desc->n_fields > KVD_PROTO_MAX_FIELDS) {
        KVD_LOG_ERROR("proto schema: %s: too deep, too many messages or "
                      "fields",
                      desc->name);
        return KVD_ERR_INTERNAL;
    }
    s = &schemas[num_schemas++];
    s->desc = desc;
    for (unsigned i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &desc->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE) {
            continue;
        }
        kvd_proto_schema_t *child;
        kvd_status_t status = schema_add(f->descriptor, depth + 1, &child);
        if (status != KVD_OK) {
            return status;
        }
        s->children[i] = child;
    }
    *out = s;
    return KVD_OK;
}

static kvd_status_t bind_rule(const kvd_proto_rule_t *rule)
{
    kvd_proto_schema_t *s = schema_find(rule->message);
    const ProtobufCFieldDescriptor *f =
        s != NULL ? protobuf_c_message_descriptor_get_field_by_name(
                        rule->message, rule->field)
                  : NULL;
    if (f == NULL) {
        KVD_LOG_ERROR("proto schema: rule for unknown field %s.%s",
                      rule->message->name, rule->field);
        return KVD_ERR_INTERNAL;
    }
    bool is_unsigned = f->type == PROTOBUF_C_TYPE_UINT32 ||
                       f->type == PROTOBUF_C_TYPE_UINT64 ||
                       f->type == PROTOBUF_C_TYPE_FIXED32 ||
                       f->type == PROTOBUF_C_TYPE_FIXED64 ||
                       f->type == PROTOBUF_C_TYPE_STRING ||
                       f->type == PROTOBUF_C_TYPE_BYTES;
    if ((is_unsigned && rule->min < 0) || rule->min > rule->max ||
        (f->label == PROTOBUF_C_LABEL_REPEATED) != (rule->max_count > 0)) {
        KVD_LOG_ERROR("proto schema: inconsistent rule for %s.%s",
                      rule->message->name, rule->field);
        return KVD_ERR_INTERNAL;
    }
    s->rules[f - rule->message->fields] = rule;
    return KVD_OK;
}

static void schema_init(void)
{
    kvd_status_t status = KVD_OK;
    for (int t = 0; status == KVD_OK && t < KVD_PROTO_MSG_COUNT; t++) {
        kvd_proto_schema_t *root = NULL;
        status =
            schema_add(kvd_proto_msg_info((kvd_proto_msg_t)t)->desc, 0, &root);
        roots[t] = root;
    }
    for (size_t i = 0; status == KVD_OK && i < sizeof(rules) / sizeof(*rules);
         i++) {
        status = bind_rule(&rules[i]);
    }
    for (size_t i = 0; status == KVD_OK && i < sizeof(checks) / sizeof(*checks);
         i++) {
        kvd_proto_schema_t *s = schema_find(checks[i].desc);
        if (s == NULL) {
            status = KVD_ERR_INTERNAL;
            break;
        }
        s->check = checks[i].check;
    }
    /* The fields that cost memory or carry bytes must have limits. */
    for (size_t i = 0; status == KVD_OK && i < num_schemas; i++) {
        const ProtobufCMessageDescriptor *desc = schemas[i].desc;
        for (unsigned k = 0; k < desc->n_fields; k++) {
            const ProtobufCFieldDescriptor *f = &desc->fields[k];
            const kvd_proto_rule_t *r = schemas[i].rules[k];
            if ((f->label == PROTOBUF_C_LABEL_REPEATED && r == NULL) ||
                (f->type == PROTOBUF_C_TYPE_BYTES &&
                 (r == NULL || !(r->flags & KVD_PROTO_RULE_RANGE)))) {
                KVD_LOG_ERROR("proto schema: %s.%s has no limit", desc->name,
                              f->name);
                status = KVD_ERR_INTERNAL;
                break;
            }
        }
    }
    init_status = status;
}

kvd_status_t kvd_proto_schema_get(kvd_proto_msg_t type,
                                  const kvd_proto_schema_t **schema_out)
{
    pthread_once(&init_once, schema_init);
    if (init_status != KVD_OK) {
        return init_status;
    }
    *schema_out = roots[type];
    return KVD_OK;
}
