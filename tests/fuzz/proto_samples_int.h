/*
 * Valid sample messages of every kvdepot.v1 top-level type, built in
 * caller storage with the generated *__INIT macros. Shared by the unit test
 * (round trips, and the base each validation case mutates) and by the
 * corpus generator (seed inputs), so both start from the same shapes.
 *
 * kvd_samples_init(s, variant) fills every message; `variant` 0 is the
 * smallest valid shape, 1 a typical one, 2 the widest (remote sources,
 * non-ASCII ids, every optional field set). The messages point into `s`,
 * so `s` must outlive their use and must not be copied.
 */
#ifndef KVD_TESTS_PROTO_SAMPLES_INT_H
#define KVD_TESTS_PROTO_SAMPLES_INT_H

#include <string.h>

#include "proto/kvd_proto.h"

#define KVD_SAMPLES_REQUESTS 3
#define KVD_SAMPLES_LOADS 4
#define KVD_SAMPLES_SAVES 3
#define KVD_SAMPLES_HASHES 4
#define KVD_SAMPLES_LAYERS 4

typedef struct kvd_samples {
    uint8_t ns[KVD_PROTO_NAMESPACE_ID_BYTES];
    uint8_t hash[KVD_SAMPLES_HASHES * 4][KVD_PROTO_BLOCK_HASH_BYTES];
    ProtobufCBinaryData hashes[KVD_SAMPLES_HASHES];
    uint64_t checksums[KVD_SAMPLES_LAYERS];
    char *request_ids[KVD_SAMPLES_REQUESTS];
    char *preempted[2];

    /* step plan */
    kvd_pb_object_key_t load_key[KVD_SAMPLES_REQUESTS][KVD_SAMPLES_LOADS];
    kvd_pb_block_source_t source[KVD_SAMPLES_REQUESTS][KVD_SAMPLES_LOADS];
    kvd_pb_block_load_t load[KVD_SAMPLES_REQUESTS][KVD_SAMPLES_LOADS];
    kvd_pb_block_load_t *loads[KVD_SAMPLES_REQUESTS][KVD_SAMPLES_LOADS];
    kvd_pb_object_key_t save_key[KVD_SAMPLES_REQUESTS][KVD_SAMPLES_SAVES];
    kvd_pb_block_save_t save[KVD_SAMPLES_REQUESTS][KVD_SAMPLES_SAVES];
    kvd_pb_block_save_t *saves[KVD_SAMPLES_REQUESTS][KVD_SAMPLES_SAVES];
    kvd_pb_step_request_t request[KVD_SAMPLES_REQUESTS];
    kvd_pb_step_request_t *requests[KVD_SAMPLES_REQUESTS];
    kvd_pb_step_plan_t step_plan;

    /* worker report */
    kvd_pb_failed_load_t failed[2];
    kvd_pb_failed_load_t *faileds[2];
    kvd_pb_tier_load_t tier_load[2];
    kvd_pb_tier_load_t *tier_loads[2];
    char *finished_saving[2];
    char *finished_loading[2];
    kvd_pb_worker_report_t worker_report;

    /* descriptors */
    kvd_pb_namespace_descriptor_t namespace_descriptor;
    kvd_pb_object_key_t object_key;
    kvd_pb_object_descriptor_t object_descriptor;

    /* store */
    kvd_pb_lookup_request_t lookup_request;
    kvd_pb_block_location_t location[KVD_SAMPLES_HASHES];
    kvd_pb_block_location_t *locations[KVD_SAMPLES_HASHES];
    kvd_pb_lookup_response_t lookup_response;
    kvd_pb_reserve_request_t reserve_request;
    kvd_pb_block_reservation_t reservation[KVD_SAMPLES_HASHES];
    kvd_pb_block_reservation_t *reservations[KVD_SAMPLES_HASHES];
    kvd_pb_reserve_response_t reserve_response;
    kvd_pb_commit_entry_t commit_entry[KVD_SAMPLES_HASHES];
    kvd_pb_commit_entry_t *commit_entries[KVD_SAMPLES_HASHES];
    kvd_pb_commit_request_t commit_request;
    kvd_pb_commit_response_t commit_response;
    kvd_pb_abort_request_t abort_request;
    kvd_pb_abort_response_t abort_response;
    uint64_t lease_ids[3];
    kvd_pb_release_request_t release_request;
    kvd_pb_release_response_t release_response;
    kvd_pb_get_request_t get_request;
    kvd_pb_get_entry_t get_entry[KVD_SAMPLES_HASHES];
    kvd_pb_get_entry_t *get_entries[KVD_SAMPLES_HASHES];
    kvd_pb_get_response_t get_response;
    kvd_pb_promote_request_t promote_request;
    kvd_pb_promote_response_t promote_response;
    kvd_pb_delete_request_t delete_request;
    kvd_pb_delete_response_t delete_response;
    kvd_pb_stats_request_t stats_request;
    kvd_pb_tier_stats_t tier[KVD_PROTO_MAX_TIERS];
    kvd_pb_tier_stats_t *tiers[KVD_PROTO_MAX_TIERS];
    kvd_pb_stats_response_t stats_response;
    kvd_pb_ping_t ping;
    kvd_pb_drop_namespace_t drop_namespace;
    kvd_pb_flush_t flush;
    kvd_pb_admin_request_t admin_request;
    kvd_pb_ping_reply_t ping_reply;
    kvd_pb_drop_namespace_reply_t drop_namespace_reply;
    kvd_pb_flush_reply_t flush_reply;
    kvd_pb_admin_response_t admin_response;
    uint8_t ucx_address[64];
    kvd_pb_node_info_t node_info;
} kvd_samples_t;

static inline void kvd_samples_key(kvd_samples_t *s, kvd_pb_object_key_t *key,
                                   unsigned hash_index)
{
    kvd_pb_object_key_t init = KVDEPOT__V1__OBJECT_KEY__INIT;
    *key = init;
    key->namespace_id.data = s->ns;
    key->namespace_id.len = sizeof(s->ns);
    key->block_hash.data = s->hash[hash_index];
    key->block_hash.len = sizeof(s->hash[hash_index]);
}

static inline void kvd_samples_plan(kvd_samples_t *s, unsigned variant)
{
    static const char *const ids[3] = {"cmpl-0", "req-\xc3\xa9t\xc3\xa9-1",
                                       "42"};
    unsigned num_requests = variant + 1;
    unsigned hash_index = 0;
    kvd_pb_step_plan_t plan = KVDEPOT__V1__STEP_PLAN__INIT;
    s->step_plan = plan;
    s->step_plan.step = 7 + variant * 1000;
    s->step_plan.block_size = variant == 2 ? 4096 : 16;
    for (unsigned r = 0; r < num_requests; r++) {
        kvd_pb_step_request_t req = KVDEPOT__V1__STEP_REQUEST__INIT;
        s->request_ids[r] = (char *)ids[r];
        req.request_id = s->request_ids[r];
        unsigned num_loads = variant == 0 ? 1 : KVD_SAMPLES_LOADS - r;
        unsigned num_saves = variant == 0 ? 0 : KVD_SAMPLES_SAVES - r;
        for (unsigned i = 0; i < num_loads; i++) {
            kvd_pb_block_source_t src = KVDEPOT__V1__BLOCK_SOURCE__INIT;
            kvd_pb_block_load_t load = KVDEPOT__V1__BLOCK_LOAD__INIT;
            src.tier = (Kvdepot__V1__Tier)(1 + (i + r) % 3);
            if (src.tier == KVDEPOT__V1__TIER__TIER_REMOTE) {
                src.node_id = (char *)"node-b:5051";
            }
            src.lease_id = variant == 0 ? 0 : 1000 + r;
            src.arena_slot = 10 * i + r;
            s->source[r][i] = src;
            kvd_samples_key(s, &s->load_key[r][i], hash_index++);
            load.block_id = variant == 2 ? (uint32_t)INT32_MAX - i : i + 3 * r;
            load.key = &s->load_key[r][i];
            load.source = &s->source[r][i];
            s->load[r][i] = load;
            s->loads[r][i] = &s->load[r][i];
        }
        for (unsigned i = 0; i < num_saves; i++) {
            kvd_pb_block_save_t save = KVDEPOT__V1__BLOCK_SAVE__INIT;
            kvd_samples_key(s, &s->save_key[r][i], hash_index++);
            save.block_id = 100 + i + 10 * r;
            save.key = &s->save_key[r][i];
            save.reservation_id = variant == 2 ? 77 : 0;
            save.arena_slot = variant == 2 ? 5 + i : 0;
            s->save[r][i] = save;
            s->saves[r][i] = &s->save[r][i];
        }
        req.n_loads = num_loads;
        req.loads = s->loads[r];
        req.n_saves = num_saves;
        req.saves = num_saves ? s->saves[r] : NULL;
        /* The whole-prompt case: one token short of full blocks. */
        req.num_load_tokens =
            num_loads * s->step_plan.block_size - (r == 1 ? 1 : 0);
        req.async_load = r != 0;
        req.layerwise = variant == 2;
        s->request[r] = req;
        s->requests[r] = &s->request[r];
    }
    s->step_plan.n_requests = num_requests;
    s->step_plan.requests = s->requests;
    if (variant == 2) {
        s->preempted[0] = (char *)"cmpl-old";
        s->preempted[1] = (char *)"cmpl-older";
        s->step_plan.n_preempted_request_ids = 2;
        s->step_plan.preempted_request_ids = s->preempted;
    }
}

static inline void kvd_samples_report(kvd_samples_t *s, unsigned variant)
{
    kvd_pb_worker_report_t report = KVDEPOT__V1__WORKER_REPORT__INIT;
    report.step = 7 + variant;
    report.worker_rank = variant;
    if (variant >= 1) {
        s->finished_saving[0] = (char *)"cmpl-0";
        s->finished_saving[1] = (char *)"cmpl-1";
        s->finished_loading[0] = (char *)"42";
        report.n_finished_saving = 2;
        report.finished_saving = s->finished_saving;
        report.n_finished_loading = 1;
        report.finished_loading = s->finished_loading;
    }
    if (variant == 2) {
        for (unsigned i = 0; i < 2; i++) {
            kvd_pb_failed_load_t f = KVDEPOT__V1__FAILED_LOAD__INIT;
            f.request_id = (char *)"42";
            f.block_id = 9 + i;
            f.status = i == 0 ? KVD_ERR_CHECKSUM : KVD_ERR_TIMEOUT;
            s->failed[i] = f;
            s->faileds[i] = &s->failed[i];
        }
        report.n_failed_loads = 2;
        report.failed_loads = s->faileds;
        for (unsigned i = 0; i < 2; i++) {
            kvd_pb_tier_load_t t = KVDEPOT__V1__TIER_LOAD__INIT;
            t.tier = i == 0 ? KVDEPOT__V1__TIER__TIER_HOST
                            : KVDEPOT__V1__TIER__TIER_DISK;
            t.loads = 1 + i;
            t.blocks = 6 + i;
            t.bytes = 6 * 32768u + i;
            t.nanos = 250000u * (1 + i);
            s->tier_load[i] = t;
            s->tier_loads[i] = &s->tier_load[i];
        }
        report.n_tier_loads = 2;
        report.tier_loads = s->tier_loads;
    }
    s->worker_report = report;
}

static inline void kvd_samples_descriptors(kvd_samples_t *s, unsigned variant)
{
    kvd_pb_namespace_descriptor_t nd = KVDEPOT__V1__NAMESPACE_DESCRIPTOR__INIT;
    nd.model_id = (char *)(variant == 2 ? "deepseek-ai/DeepSeek-V3@main"
                                        : "meta-llama/Llama-3.1-8B");
    nd.dtype = KVDEPOT__V1__DTYPE__DTYPE_BF16;
    nd.k_codec = variant == 1 ? KVDEPOT__V1__CODEC__CODEC_KIVI4
                              : KVDEPOT__V1__CODEC__CODEC_RAW;
    nd.v_codec = variant == 2 ? KVDEPOT__V1__CODEC__CODEC_UNSPECIFIED
                              : KVDEPOT__V1__CODEC__CODEC_TQ3;
    nd.kv_combined = variant == 2;
    nd.num_layers = variant == 2 ? 61 : 32;
    nd.num_kv_heads = variant == 2 ? 1 : 4;
    nd.head_start = variant == 1 ? 4 : 0;
    nd.total_kv_heads = variant == 2 ? 1 : 8;
    nd.head_dim = variant == 2 ? 576 : 128;
    nd.block_size = variant == 2 ? 64 : 16;
    nd.tp_size = variant == 1 ? 2 : 1;
    nd.tp_rank = variant == 1 ? 1 : 0;
    nd.first_layer = 0;
    s->namespace_descriptor = nd;

    kvd_samples_key(s, &s->object_key, 0);
    kvd_pb_object_descriptor_t od = KVDEPOT__V1__OBJECT_DESCRIPTOR__INIT;
    od.key = &s->object_key;
    od.size_bytes = UINT64_C(2) << 20;
    od.k_codec = KVDEPOT__V1__CODEC__CODEC_FP8_E4M3;
    od.v_codec = variant == 2 ? KVDEPOT__V1__CODEC__CODEC_UNSPECIFIED
                              : KVDEPOT__V1__CODEC__CODEC_INT8;
    for (unsigned i = 0; i < KVD_SAMPLES_LAYERS; i++) {
        s->checksums[i] = UINT64_C(0x9e3779b97f4a7c15) * (i + 1 + variant);
    }
    od.n_layer_checksums = variant == 0 ? 1 : KVD_SAMPLES_LAYERS;
    od.layer_checksums = s->checksums;
    od.tier = (Kvdepot__V1__Tier)(1 + variant);
    od.created_unix_ms = variant ? UINT64_C(1700000000000) : 0;
    od.last_access_unix_ms = variant ? UINT64_C(1700000000500) : 0;
    od.tier_offset = variant * UINT64_C(4096);
    s->object_descriptor = od;
}

static inline void kvd_samples_store(kvd_samples_t *s, unsigned variant)
{
    size_t n = variant == 0 ? 1 : KVD_SAMPLES_HASHES;
    kvd_pb_lookup_request_t lreq = KVDEPOT__V1__LOOKUP_REQUEST__INIT;
    lreq.namespace_id.data = s->ns;
    lreq.namespace_id.len = sizeof(s->ns);
    lreq.n_block_hashes = n;
    lreq.block_hashes = s->hashes;
    lreq.lease_ttl_ms = variant ? 30000 : 0;
    lreq.tenant = (char *)(variant == 2 ? "tenant-\xe2\x82\xac" : "");
    lreq.include_remote = variant == 2;
    s->lookup_request = lreq;

    kvd_pb_lookup_response_t lresp = KVDEPOT__V1__LOOKUP_RESPONSE__INIT;
    for (size_t i = 0; i < n; i++) {
        kvd_pb_block_location_t loc = KVDEPOT__V1__BLOCK_LOCATION__INIT;
        loc.tier = (Kvdepot__V1__Tier)(1 + (i + variant) % 3);
        if (loc.tier == KVDEPOT__V1__TIER__TIER_REMOTE) {
            loc.node_id = (char *)"node-c";
        }
        loc.arena_slot = (uint32_t)i * 3;
        loc.size_bytes = UINT64_C(2) << 20;
        s->location[i] = loc;
        s->locations[i] = &s->location[i];
    }
    lresp.n_locations = variant == 0 ? 0 : n;
    lresp.locations = s->locations;
    lresp.lease_id = variant == 0 ? 0 : 555;
    lresp.lease_ttl_ms = variant == 0 ? 0 : 30000;
    s->lookup_response = lresp;

    kvd_pb_reserve_request_t rreq = KVDEPOT__V1__RESERVE_REQUEST__INIT;
    rreq.namespace_id = lreq.namespace_id;
    rreq.n_block_hashes = n;
    rreq.block_hashes = s->hashes;
    rreq.object_size_bytes = UINT64_C(2) << 20;
    rreq.tenant = lreq.tenant;
    rreq.ttl_ms = variant * 1000;
    s->reserve_request = rreq;

    kvd_pb_reserve_response_t rresp = KVDEPOT__V1__RESERVE_RESPONSE__INIT;
    for (size_t i = 0; i < n; i++) {
        kvd_pb_block_reservation_t res = KVDEPOT__V1__BLOCK_RESERVATION__INIT;
        res.block_hash = s->hashes[i];
        res.outcome = (Kvdepot__V1__ReserveOutcome)(1 + (i + variant) % 3);
        res.arena_slot = res.outcome == 1 ? (uint32_t)i + 1 : 0;
        s->reservation[i] = res;
        s->reservations[i] = &s->reservation[i];
    }
    rresp.n_blocks = n;
    rresp.blocks = s->reservations;
    rresp.reservation_id = 0;
    for (size_t i = 0; i < n; i++) {
        if (s->reservation[i].outcome == 1) {
            rresp.reservation_id = 99;
        }
    }
    rresp.ttl_ms = 5000;
    s->reserve_response = rresp;

    kvd_pb_commit_request_t creq = KVDEPOT__V1__COMMIT_REQUEST__INIT;
    for (size_t i = 0; i < n; i++) {
        kvd_pb_commit_entry_t e = KVDEPOT__V1__COMMIT_ENTRY__INIT;
        e.block_hash = s->hashes[i];
        e.n_layer_checksums = variant == 0 ? 1 : KVD_SAMPLES_LAYERS;
        e.layer_checksums = s->checksums;
        s->commit_entry[i] = e;
        s->commit_entries[i] = &s->commit_entry[i];
    }
    creq.reservation_id = 99;
    creq.n_entries = n;
    creq.entries = s->commit_entries;
    s->commit_request = creq;
    kvd_pb_commit_response_t cresp = KVDEPOT__V1__COMMIT_RESPONSE__INIT;
    cresp.num_committed = (uint32_t)n;
    s->commit_response = cresp;

    kvd_pb_abort_request_t areq = KVDEPOT__V1__ABORT_REQUEST__INIT;
    areq.reservation_id = 99;
    areq.n_block_hashes = variant == 0 ? 0 : n;
    areq.block_hashes = s->hashes;
    s->abort_request = areq;
    kvd_pb_abort_response_t aresp = KVDEPOT__V1__ABORT_RESPONSE__INIT;
    aresp.num_aborted = variant;
    s->abort_response = aresp;

    kvd_pb_release_request_t rlreq = KVDEPOT__V1__RELEASE_REQUEST__INIT;
    s->lease_ids[0] = 555;
    s->lease_ids[1] = UINT64_MAX;
    s->lease_ids[2] = 1;
    rlreq.n_lease_ids = variant + 1;
    rlreq.lease_ids = s->lease_ids;
    s->release_request = rlreq;
    kvd_pb_release_response_t rlresp = KVDEPOT__V1__RELEASE_RESPONSE__INIT;
    rlresp.num_released = variant;
    s->release_response = rlresp;

    kvd_pb_get_request_t greq = KVDEPOT__V1__GET_REQUEST__INIT;
    greq.namespace_id = lreq.namespace_id;
    greq.n_block_hashes = n;
    greq.block_hashes = s->hashes;
    greq.lease_id = variant == 2 ? 555 : 0;
    greq.lease_ttl_ms = variant * 100;
    s->get_request = greq;

    kvd_pb_get_response_t gresp = KVDEPOT__V1__GET_RESPONSE__INIT;
    for (size_t i = 0; i < n; i++) {
        kvd_pb_get_entry_t e = KVDEPOT__V1__GET_ENTRY__INIT;
        e.block_hash = s->hashes[i];
        e.state = (Kvdepot__V1__GetState)(1 + (i + variant) % 4);
        if (e.state == KVDEPOT__V1__GET_STATE__GET_STATE_READY) {
            e.arena_slot = (uint32_t)i;
            e.size_bytes = UINT64_C(2) << 20;
        }
        if (e.state == KVDEPOT__V1__GET_STATE__GET_STATE_FAILED) {
            e.status = KVD_ERR_CHECKSUM;
        }
        s->get_entry[i] = e;
        s->get_entries[i] = &s->get_entry[i];
    }
    gresp.n_entries = n;
    gresp.entries = s->get_entries;
    gresp.lease_id = 0;
    for (size_t i = 0; i < n; i++) {
        if (s->get_entry[i].state == KVDEPOT__V1__GET_STATE__GET_STATE_READY ||
            s->get_entry[i].state ==
                KVDEPOT__V1__GET_STATE__GET_STATE_PENDING) {
            gresp.lease_id = 556;
            gresp.lease_ttl_ms = 30000;
        }
    }
    s->get_response = gresp;

    kvd_pb_promote_request_t preq = KVDEPOT__V1__PROMOTE_REQUEST__INIT;
    preq.namespace_id = lreq.namespace_id;
    preq.n_block_hashes = n;
    preq.block_hashes = s->hashes;
    preq.target_tier = variant == 1 ? KVDEPOT__V1__TIER__TIER_DISK
                                    : KVDEPOT__V1__TIER__TIER_HOST;
    s->promote_request = preq;
    kvd_pb_promote_response_t presp = KVDEPOT__V1__PROMOTE_RESPONSE__INIT;
    presp.num_accepted = (uint32_t)n;
    s->promote_response = presp;

    kvd_pb_delete_request_t dreq = KVDEPOT__V1__DELETE_REQUEST__INIT;
    dreq.namespace_id = lreq.namespace_id;
    dreq.n_block_hashes = n;
    dreq.block_hashes = s->hashes;
    s->delete_request = dreq;
    kvd_pb_delete_response_t dresp = KVDEPOT__V1__DELETE_RESPONSE__INIT;
    dresp.num_deleted = (uint32_t)(n / 2);
    dresp.busy = variant == 1;
    s->delete_response = dresp;
}

static inline void kvd_samples_ops(kvd_samples_t *s, unsigned variant)
{
    kvd_pb_stats_request_t sreq = KVDEPOT__V1__STATS_REQUEST__INIT;
    s->stats_request = sreq;
    kvd_pb_stats_response_t sresp = KVDEPOT__V1__STATS_RESPONSE__INIT;
    unsigned num_tiers = variant == 0 ? 0 : KVD_PROTO_MAX_TIERS - 2 + variant;
    for (unsigned i = 0; i < num_tiers; i++) {
        kvd_pb_tier_stats_t t = KVDEPOT__V1__TIER_STATS__INIT;
        t.tier = (Kvdepot__V1__Tier)(i + 1);
        t.capacity_bytes = UINT64_C(64) << 30;
        t.used_bytes = UINT64_C(3) << 30;
        t.num_objects = 1536 * (i + 1);
        t.hits = 100;
        t.misses = 7;
        t.evictions = i;
        t.bytes_read = UINT64_C(1) << 33;
        t.bytes_written = UINT64_C(1) << 32;
        t.checksum_errors = i == 1;
        s->tier[i] = t;
        s->tiers[i] = &s->tier[i];
    }
    sresp.n_tiers = num_tiers;
    sresp.tiers = s->tiers;
    sresp.uptime_ms = 123456;
    sresp.num_namespaces = variant;
    sresp.active_leases = 3;
    sresp.active_reservations = 1;
    s->stats_response = sresp;

    kvd_pb_ping_t ping = KVDEPOT__V1__PING__INIT;
    kvd_pb_drop_namespace_t drop = KVDEPOT__V1__DROP_NAMESPACE__INIT;
    kvd_pb_flush_t flush = KVDEPOT__V1__FLUSH__INIT;
    kvd_pb_admin_request_t areq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    s->ping = ping;
    s->drop_namespace = drop;
    s->drop_namespace.namespace_id.data = s->ns;
    s->drop_namespace.namespace_id.len = sizeof(s->ns);
    s->flush = flush;
    s->flush.timeout_ms = 60000;
    s->admin_request = areq;

    kvd_pb_ping_reply_t pr = KVDEPOT__V1__PING_REPLY__INIT;
    pr.version = (char *)"0.1.0";
    pr.protocol_major = KVD_PROTO_MAJOR;
    pr.protocol_revision = KVD_PROTO_REVISION;
    pr.node_id = (char *)(variant == 2 ? "node-a" : "");
    s->ping_reply = pr;
    kvd_pb_drop_namespace_reply_t dr = KVDEPOT__V1__DROP_NAMESPACE_REPLY__INIT;
    dr.num_objects_dropped = 12;
    s->drop_namespace_reply = dr;
    kvd_pb_flush_reply_t fr = KVDEPOT__V1__FLUSH_REPLY__INIT;
    fr.num_objects_written = 4;
    s->flush_reply = fr;
    kvd_pb_admin_response_t aresp = KVDEPOT__V1__ADMIN_RESPONSE__INIT;
    s->admin_response = aresp;

    kvd_pb_node_info_t node = KVDEPOT__V1__NODE_INFO__INIT;
    node.node_id = (char *)(variant == 1 ? "node-b" : "node-a");
    node.grpc_address = (char *)(variant == 0 ? "" : "10.0.0.7:7070");
    for (size_t i = 0; i < sizeof(s->ucx_address); i++) {
        s->ucx_address[i] = (uint8_t)(i * 7u + variant);
    }
    node.ucx_address.data = s->ucx_address;
    node.ucx_address.len = variant == 0 ? 0 : sizeof(s->ucx_address);
    node.capacity_bytes = UINT64_C(64) << 30;
    node.version = (char *)"0.1.0";
    node.protocol_revision = KVD_PROTO_REVISION;
    s->node_info = node;

    switch (variant) {
    case 0:
        s->admin_request.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_PING;
        s->admin_request.ping = &s->ping;
        s->admin_response.result_case =
            KVDEPOT__V1__ADMIN_RESPONSE__RESULT_PING;
        s->admin_response.ping = &s->ping_reply;
        break;
    case 1:
        s->admin_request.op_case =
            KVDEPOT__V1__ADMIN_REQUEST__OP_DROP_NAMESPACE;
        s->admin_request.drop_namespace = &s->drop_namespace;
        s->admin_response.result_case =
            KVDEPOT__V1__ADMIN_RESPONSE__RESULT_DROP_NAMESPACE;
        s->admin_response.drop_namespace = &s->drop_namespace_reply;
        break;
    default:
        s->admin_request.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_FLUSH;
        s->admin_request.flush = &s->flush;
        s->admin_response.result_case =
            KVDEPOT__V1__ADMIN_RESPONSE__RESULT_FLUSH;
        s->admin_response.flush = &s->flush_reply;
        break;
    }
}

/* Number of variants kvd_samples_init accepts. */
#define KVD_SAMPLES_VARIANTS 3

static inline void kvd_samples_init(kvd_samples_t *s, unsigned variant)
{
    memset(s, 0, sizeof(*s));
    for (unsigned i = 0; i < sizeof(s->ns); i++) {
        s->ns[i] = (uint8_t)(0xa0 + i);
    }
    for (unsigned h = 0; h < sizeof(s->hash) / sizeof(s->hash[0]); h++) {
        for (unsigned i = 0; i < KVD_PROTO_BLOCK_HASH_BYTES; i++) {
            s->hash[h][i] = (uint8_t)(h * 31 + i * 7 + variant);
        }
    }
    for (unsigned h = 0; h < KVD_SAMPLES_HASHES; h++) {
        s->hashes[h].data = s->hash[h];
        s->hashes[h].len = KVD_PROTO_BLOCK_HASH_BYTES;
    }
    kvd_samples_plan(s, variant);
    kvd_samples_report(s, variant);
    kvd_samples_descriptors(s, variant);
    kvd_samples_store(s, variant);
    kvd_samples_ops(s, variant);
}

/* The sample of `type` inside `s`. */
static inline ProtobufCMessage *kvd_samples_get(kvd_samples_t *s,
                                                kvd_proto_msg_t type)
{
    switch (type) {
#define KVD_SAMPLES_CASE_(snake, UPPER, Camel)                                 \
    case KVD_PROTO_MSG_##UPPER: return &s->snake.base;
        KVD_PROTO_MESSAGES(KVD_SAMPLES_CASE_)
#undef KVD_SAMPLES_CASE_
    case KVD_PROTO_MSG_COUNT: break;
    }
    return NULL;
}

#endif /* KVD_TESTS_PROTO_SAMPLES_INT_H */
