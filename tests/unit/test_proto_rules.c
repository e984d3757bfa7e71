/*
 * proto/ validation rules: every rule is refused with its reason, both by
 * pack (before anything is sent, and writing nothing) and by unpack (when
 * a peer sends it anyway), including the limits that need many entries
 * (requests per plan, loads and saves in all).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvd_testproto_int.h"

/* The sample messages; each test fills them for the variant it needs. */
static kvd_samples_t samples;

/* ------------------------------------------------------------------------ */
/* Validation rules                                                         */
/* ------------------------------------------------------------------------ */

static char long_id[KVD_PROTO_MAX_ID_BYTES + 2];
static uint8_t short_hash[31];
static uint8_t long_hash[33];

typedef struct rule_case {
    kvd_proto_msg_t type;
    unsigned variant;
    void (*mutate)(kvd_samples_t *s);
    const char *want;      /* in the reason of validate and pack */
    const char *want_wire; /* in unpack's reason; NULL: same as want, "":
                              not representable on the wire */
} rule_case_t;

#define S (s)
static void m_hash_31(kvd_samples_t *s)
{
    S->load_key[1][0].block_hash.data = short_hash;
    S->load_key[1][0].block_hash.len = 31;
}
static void m_ns_15(kvd_samples_t *s)
{
    S->save_key[0][1].namespace_id.len = 15;
}
static void m_req_id_empty(kvd_samples_t *s)
{
    S->request[0].request_id = (char *)"";
}
static void m_req_id_long(kvd_samples_t *s)
{
    S->request[2].request_id = long_id;
}
static void m_req_id_utf8(kvd_samples_t *s)
{
    S->request[0].request_id = (char *)"bad\xc0\xafid";
}
static void m_dup_load(kvd_samples_t *s)
{
    S->load[0][3].block_id = S->load[0][1].block_id;
}
static void m_dup_save(kvd_samples_t *s)
{
    S->save[1][1].block_id = S->save[1][0].block_id;
}
static void m_dup_request(kvd_samples_t *s)
{
    S->request[2].request_id = S->request[0].request_id;
}
static void m_block_id_big(kvd_samples_t *s)
{
    S->load[0][0].block_id = UINT32_C(1) << 31;
}
static void m_block_size_0(kvd_samples_t *s)
{
    S->step_plan.block_size = 0;
}
static void m_block_size_big(kvd_samples_t *s)
{
    S->step_plan.block_size = 4097;
}
static void m_tokens_short(kvd_samples_t *s)
{
    S->request[0].num_load_tokens -= 16;
}
static void m_tokens_no_loads(kvd_samples_t *s)
{
    S->request[0].n_loads = 0;
}
static void m_tokens_content_loads(kvd_samples_t *s)
{
    /* Content loads (non-prefix reuse) carry no prefix tokens. */
    for (size_t i = 0; i < S->request[0].n_loads; i++) {
        S->load[0][i].content = true;
        S->load[0][i].position = 16 * i;
    }
}
static void m_position_big(kvd_samples_t *s)
{
    S->load[0][0].position = (UINT64_C(1) << 40) + 1;
}
static void m_content_key_is_key(kvd_samples_t *s)
{
    /* A second copy under the same key: one reservation names it twice. */
    S->save[0][0].content_key = S->save[0][0].key;
}
static void m_content_key_is_other(kvd_samples_t *s)
{
    S->save[0][0].content_key = S->save[0][1].key;
}
static void m_tier_unset(kvd_samples_t *s)
{
    S->source[0][0].tier = KVDEPOT__V1__TIER__TIER_UNSPECIFIED;
}
static void m_tier_unknown(kvd_samples_t *s)
{
    S->source[0][0].tier = (Kvdepot__V1__Tier)9;
}
static void m_remote_no_node(kvd_samples_t *s)
{
    S->source[0][2].node_id = (char *)"";
}
static void m_host_with_node(kvd_samples_t *s)
{
    S->source[0][0].node_id = (char *)"node-x";
}
static void m_key_missing(kvd_samples_t *s)
{
    S->load[0][1].key = NULL;
}
static void m_dup_preempted(kvd_samples_t *s)
{
    S->preempted[1] = S->preempted[0];
}
static void m_bool_2(kvd_samples_t *s)
{
    S->request[0].async_load = 2;
}
static void m_null_entry(kvd_samples_t *s)
{
    S->loads[0][1] = NULL;
}
static void m_wrong_type(kvd_samples_t *s)
{
    S->load[0][0].key = (kvd_pb_object_key_t *)(void *)&S->source[0][0];
}
static void m_null_array(kvd_samples_t *s)
{
    S->request[0].loads = NULL;
}
static void m_failed_status_0(kvd_samples_t *s)
{
    S->failed[0].status = 0;
}
static void m_failed_dup(kvd_samples_t *s)
{
    S->failed[1].block_id = S->failed[0].block_id;
}
static void m_finished_dup(kvd_samples_t *s)
{
    S->finished_saving[1] = S->finished_saving[0];
}
static void m_finished_empty(kvd_samples_t *s)
{
    S->finished_loading[0] = (char *)"";
}
static void m_layers_0(kvd_samples_t *s)
{
    S->namespace_descriptor.num_layers = 0;
}
static void m_layers_big(kvd_samples_t *s)
{
    S->namespace_descriptor.num_layers = 1025;
}
static void m_head_dim_0(kvd_samples_t *s)
{
    S->namespace_descriptor.head_dim = 0;
}
static void m_nd_block_size(kvd_samples_t *s)
{
    S->namespace_descriptor.block_size = 5000;
}
static void m_heads_range(kvd_samples_t *s)
{
    S->namespace_descriptor.head_start = 6;
}
static void m_tp_rank(kvd_samples_t *s)
{
    S->namespace_descriptor.tp_rank = 2;
}
static void m_combined_v(kvd_samples_t *s)
{
    S->namespace_descriptor.v_codec = KVDEPOT__V1__CODEC__CODEC_RAW;
}
static void m_v_unset(kvd_samples_t *s)
{
    S->namespace_descriptor.v_codec = KVDEPOT__V1__CODEC__CODEC_UNSPECIFIED;
}
static void m_dtype_unset(kvd_samples_t *s)
{
    S->namespace_descriptor.dtype = KVDEPOT__V1__DTYPE__DTYPE_UNSPECIFIED;
}
static void m_model_empty(kvd_samples_t *s)
{
    S->namespace_descriptor.model_id = (char *)"";
}
static void m_checksums_0(kvd_samples_t *s)
{
    S->object_descriptor.n_layer_checksums = 0;
}
static uint64_t many_checksums[KVD_PROTO_MAX_LAYERS + 1];
static void m_checksums_big(kvd_samples_t *s)
{
    S->object_descriptor.n_layer_checksums = KVD_PROTO_MAX_LAYERS + 1;
    S->object_descriptor.layer_checksums = many_checksums;
}
static void m_size_0(kvd_samples_t *s)
{
    S->object_descriptor.size_bytes = 0;
}
static void m_access_before(kvd_samples_t *s)
{
    S->object_descriptor.last_access_unix_ms = 1;
}
static void m_lookup_dup(kvd_samples_t *s)
{
    S->hashes[2] = S->hashes[0];
}
static void m_lookup_hash_33(kvd_samples_t *s)
{
    S->hashes[1].data = long_hash;
    S->hashes[1].len = 33;
}
static void m_lookup_none(kvd_samples_t *s)
{
    S->lookup_request.n_block_hashes = 0;
}
static void m_lookup_ttl(kvd_samples_t *s)
{
    S->lookup_request.lease_ttl_ms = KVD_PROTO_MAX_TTL_MS + 1;
}
static void m_lookup_ns_missing(kvd_samples_t *s)
{
    S->lookup_request.namespace_id.len = 0;
}
static void m_lookup_source_bad(kvd_samples_t *s)
{
    S->lookup_request.source_node = "node/../a";
}
static void m_lease_no_ttl(kvd_samples_t *s)
{
    S->lookup_response.lease_ttl_ms = 0;
}
static void m_reserved_no_id(kvd_samples_t *s)
{
    S->reserve_response.reservation_id = 0;
}
static void m_outcome_unset(kvd_samples_t *s)
{
    S->reservation[0].outcome = 0;
}
static void m_commit_id_0(kvd_samples_t *s)
{
    S->commit_request.reservation_id = 0;
}
static void m_commit_dup(kvd_samples_t *s)
{
    S->commit_entry[3].block_hash = S->commit_entry[1].block_hash;
}
static void m_release_0(kvd_samples_t *s)
{
    S->lease_ids[1] = 0;
}
static void m_release_dup(kvd_samples_t *s)
{
    S->lease_ids[2] = S->lease_ids[0];
}
static void m_get_failed_ok(kvd_samples_t *s)
{
    /* variant 1: entry 2 is GET_STATE_FAILED */
    S->get_entry[2].status = 0;
}
static void m_get_ready_size(kvd_samples_t *s)
{
    /* variant 1: entry 3 is GET_STATE_READY */
    S->get_entry[3].size_bytes = 0;
}
static void m_get_no_lease(kvd_samples_t *s)
{
    S->get_response.lease_id = 0;
}
static void m_promote_remote(kvd_samples_t *s)
{
    S->promote_request.target_tier = KVDEPOT__V1__TIER__TIER_REMOTE;
}
static void m_used_over(kvd_samples_t *s)
{
    S->tier[1].used_bytes = S->tier[1].capacity_bytes + 1;
}
static void m_tier_dup(kvd_samples_t *s)
{
    S->tier[1].tier = S->tier[0].tier;
}
static void m_admin_unset(kvd_samples_t *s)
{
    S->admin_request.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP__NOT_SET;
}
static void m_admin_bad_case(kvd_samples_t *s)
{
    S->admin_response.result_case = (Kvdepot__V1__AdminResponse__ResultCase)11;
}
static void m_ping_major(kvd_samples_t *s)
{
    S->ping_reply.protocol_major = 2;
}
static void m_drop_ns(kvd_samples_t *s)
{
    S->drop_namespace.namespace_id.len = 3;
}
#undef S

static const rule_case_t rule_cases[] = {
    {KVD_PROTO_MSG_STEP_PLAN, 2, m_hash_31,
     "step_plan.requests[1].loads[0].key.block_hash: 31 bytes, want 32", NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 2, m_ns_15,
     "step_plan.requests[0].saves[1].key.namespace_id: 15 bytes, want 16",
     NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 1, m_req_id_empty,
     "step_plan.requests[0].request_id: empty, required", NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 2, m_req_id_long,
     "step_plan.requests[2].request_id: longer than 256 bytes", NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 1, m_req_id_utf8,
     "step_plan.requests[0].request_id: not valid UTF-8", NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 1, m_dup_load,
     "step_plan.requests[0].loads[3].block_id: duplicates loads[1]", NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 2, m_dup_save,
     "step_plan.requests[1].saves[1].block_id: duplicates saves[0]", NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 2, m_dup_request,
     "step_plan.requests[2].request_id: duplicates requests[0]", NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 1, m_block_id_big,
     "step_plan.requests[0].loads[0].block_id: 2147483648, want "
     "0..2147483647",
     NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 0, m_block_size_0,
     "step_plan.block_size: 0, want 1..4096", NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 0, m_block_size_big,
     "step_plan.block_size: 4097, want 1..4096", NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 1, m_tokens_short,
     "step_plan.requests[0].num_load_tokens: 48, want 49..64", NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 1, m_tokens_no_loads,
     "step_plan.requests[0].num_load_tokens: 64 tokens without prefix "
     "loads",
     NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 1, m_tokens_content_loads,
     "step_plan.requests[0].num_load_tokens: 64 tokens without prefix "
     "loads",
     NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 1, m_content_key_is_key,
     "step_plan.requests[0].saves[0].block_hash (key or content_key): "
     "duplicates saves[0]",
     NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 1, m_content_key_is_other,
     "step_plan.requests[0].saves[1].block_hash (key or content_key): "
     "duplicates saves[0]",
     NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 1, m_position_big,
     "step_plan.requests[0].loads[0].position: 1099511627777, want "
     "0..1099511627776",
     NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 1, m_tier_unset,
     "step_plan.requests[0].loads[0].source.tier: unset (TIER_UNSPECIFIED)",
     NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 1, m_tier_unknown,
     "loads[0].source.tier: 9 is not a kvdepot.v1.Tier value", NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 1, m_remote_no_node,
     "loads[2].source.node_id: empty, required for TIER_REMOTE", NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 1, m_host_with_node,
     "loads[0].source.node_id: set, but only TIER_REMOTE names a node", NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 1, m_key_missing,
     "step_plan.requests[0].loads[1].key: missing, required", NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 2, m_dup_preempted,
     "step_plan.preempted_request_ids[1]: duplicates "
     "preempted_request_ids[0]",
     NULL},
    {KVD_PROTO_MSG_STEP_PLAN, 1, m_bool_2,
     "requests[0].async_load: bool holds 2", ""},
    {KVD_PROTO_MSG_STEP_PLAN, 1, m_null_entry,
     "step_plan.requests[0].loads[1]: NULL entry", ""},
    {KVD_PROTO_MSG_STEP_PLAN, 1, m_wrong_type,
     "loads[0].key: is a kvdepot.v1.BlockSource, want kvdepot.v1.ObjectKey",
     ""},
    {KVD_PROTO_MSG_STEP_PLAN, 1, m_null_array,
     "step_plan.requests[0].loads: 4 entries at NULL", ""},
    {KVD_PROTO_MSG_WORKER_REPORT, 2, m_failed_status_0,
     "worker_report.failed_loads[0].status: 0, want -2147483648..-1", NULL},
    {KVD_PROTO_MSG_WORKER_REPORT, 2, m_failed_dup,
     "worker_report.failed_loads[1]: duplicates failed_loads[0]", NULL},
    {KVD_PROTO_MSG_WORKER_REPORT, 1, m_finished_dup,
     "worker_report.finished_saving[1]: duplicates finished_saving[0]", NULL},
    {KVD_PROTO_MSG_WORKER_REPORT, 1, m_finished_empty,
     "worker_report.finished_loading[0]: empty string", NULL},
    {KVD_PROTO_MSG_NAMESPACE_DESCRIPTOR, 0, m_layers_0,
     "namespace_descriptor.num_layers: 0, want 1..1024", NULL},
    {KVD_PROTO_MSG_NAMESPACE_DESCRIPTOR, 0, m_layers_big,
     "namespace_descriptor.num_layers: 1025, want 1..1024", NULL},
    {KVD_PROTO_MSG_NAMESPACE_DESCRIPTOR, 0, m_head_dim_0,
     "namespace_descriptor.head_dim: 0, want 1..1024", NULL},
    {KVD_PROTO_MSG_NAMESPACE_DESCRIPTOR, 0, m_nd_block_size,
     "namespace_descriptor.block_size: 5000, want 1..4096", NULL},
    {KVD_PROTO_MSG_NAMESPACE_DESCRIPTOR, 1, m_heads_range,
     "namespace_descriptor.head_start: heads 6..9 exceed total_kv_heads 8",
     NULL},
    {KVD_PROTO_MSG_NAMESPACE_DESCRIPTOR, 1, m_tp_rank,
     "namespace_descriptor.tp_rank: 2, want < tp_size 2", NULL},
    {KVD_PROTO_MSG_NAMESPACE_DESCRIPTOR, 2, m_combined_v,
     "namespace_descriptor.v_codec: set, but K and V are combined", NULL},
    {KVD_PROTO_MSG_NAMESPACE_DESCRIPTOR, 0, m_v_unset,
     "namespace_descriptor.v_codec: unset (CODEC_UNSPECIFIED), required", NULL},
    {KVD_PROTO_MSG_NAMESPACE_DESCRIPTOR, 0, m_dtype_unset,
     "namespace_descriptor.dtype: unset (DTYPE_UNSPECIFIED), required", NULL},
    {KVD_PROTO_MSG_NAMESPACE_DESCRIPTOR, 0, m_model_empty,
     "namespace_descriptor.model_id: empty, required", NULL},
    {KVD_PROTO_MSG_OBJECT_DESCRIPTOR, 1, m_checksums_0,
     "object_descriptor.layer_checksums: empty, at least one entry required",
     NULL},
    {KVD_PROTO_MSG_OBJECT_DESCRIPTOR, 1, m_checksums_big,
     "object_descriptor.layer_checksums: 1025 entries, max 1024",
     "object_descriptor.layer_checksums: more than 1024 entries"},
    {KVD_PROTO_MSG_OBJECT_DESCRIPTOR, 1, m_size_0,
     "object_descriptor.size_bytes: 0, want 1..1073741824", NULL},
    {KVD_PROTO_MSG_OBJECT_DESCRIPTOR, 1, m_access_before,
     "object_descriptor.last_access_unix_ms: 1, before created_unix_ms", NULL},
    {KVD_PROTO_MSG_LOOKUP_REQUEST, 1, m_lookup_dup,
     "lookup_request.block_hashes[2]: duplicates block_hashes[0]", NULL},
    {KVD_PROTO_MSG_LOOKUP_REQUEST, 1, m_lookup_hash_33,
     "lookup_request.block_hashes[1]: 33 bytes, want 32", NULL},
    {KVD_PROTO_MSG_LOOKUP_REQUEST, 1, m_lookup_none,
     "lookup_request.block_hashes: empty, at least one entry required", NULL},
    {KVD_PROTO_MSG_LOOKUP_REQUEST, 1, m_lookup_ttl,
     "lookup_request.lease_ttl_ms: 3600001, want 0..3600000", NULL},
    {KVD_PROTO_MSG_LOOKUP_REQUEST, 1, m_lookup_ns_missing,
     "lookup_request.namespace_id: empty, required", NULL},
    {KVD_PROTO_MSG_LOOKUP_REQUEST, 1, m_lookup_source_bad,
     "lookup_request.source_node: \"node/../a\": want letters, digits, . _ "
     "-",
     NULL},
    {KVD_PROTO_MSG_LOOKUP_RESPONSE, 1, m_lease_no_ttl,
     "lookup_response.lease_ttl_ms: 0 with lease_id 555", NULL},
    {KVD_PROTO_MSG_RESERVE_RESPONSE, 1, m_reserved_no_id,
     "reserve_response.reservation_id: unset, required when a block is "
     "reserved",
     NULL},
    {KVD_PROTO_MSG_RESERVE_RESPONSE, 1, m_outcome_unset,
     "reserve_response.blocks[0].outcome: unset "
     "(RESERVE_OUTCOME_UNSPECIFIED)",
     NULL},
    {KVD_PROTO_MSG_COMMIT_REQUEST, 1, m_commit_id_0,
     "commit_request.reservation_id: unset, required", NULL},
    {KVD_PROTO_MSG_COMMIT_REQUEST, 1, m_commit_dup,
     "commit_request.entries[3].block_hash: duplicates entries[1]", NULL},
    {KVD_PROTO_MSG_RELEASE_REQUEST, 2, m_release_0,
     "release_request.lease_ids[1]: 0, want >= 1", NULL},
    {KVD_PROTO_MSG_RELEASE_REQUEST, 2, m_release_dup,
     "release_request.lease_ids[2]: duplicates lease_ids[0]", NULL},
    {KVD_PROTO_MSG_GET_RESPONSE, 1, m_get_failed_ok,
     "get_response.entries[2].status: 0, want a negative status", NULL},
    {KVD_PROTO_MSG_GET_RESPONSE, 1, m_get_ready_size,
     "get_response.entries[3].size_bytes: 0, required for GET_STATE_READY",
     NULL},
    {KVD_PROTO_MSG_GET_RESPONSE, 1, m_get_no_lease,
     "get_response.lease_id: unset, required for READY/PENDING entries", NULL},
    {KVD_PROTO_MSG_PROMOTE_REQUEST, 1, m_promote_remote,
     "promote_request.target_tier: 3, want TIER_HOST or TIER_DISK", NULL},
    {KVD_PROTO_MSG_STATS_RESPONSE, 2, m_used_over,
     "stats_response.tiers[1].used_bytes: 68719476737, above capacity_bytes "
     "68719476736",
     NULL},
    {KVD_PROTO_MSG_STATS_RESPONSE, 2, m_tier_dup,
     "stats_response.tiers[1].tier: duplicates tiers[0]", NULL},
    {KVD_PROTO_MSG_ADMIN_REQUEST, 0, m_admin_unset,
     "admin_request.op: unset, required", NULL},
    {KVD_PROTO_MSG_ADMIN_RESPONSE, 0, m_admin_bad_case,
     "admin_response.result: case 11 names no member", ""},
    {KVD_PROTO_MSG_ADMIN_RESPONSE, 0, m_ping_major,
     "admin_response.ping.protocol_major: 2, want 1..1", NULL},
    {KVD_PROTO_MSG_ADMIN_REQUEST, 1, m_drop_ns,
     "admin_request.drop_namespace.namespace_id: 3 bytes, want 16", NULL},
};

static void test_rules_refused(void **state)
{
    (void)state;
    memset(long_id, 'x', sizeof(long_id) - 1);
    for (size_t i = 0; i < sizeof(rule_cases) / sizeof(*rule_cases); i++) {
        const rule_case_t *c = &rule_cases[i];
        kvd_samples_init(&samples, c->variant);
        c->mutate(&samples);
        ProtobufCMessage *msg = kvd_samples_get(&samples, c->type);
        char reason[KVD_PROTO_REASON_MAX] = "";
        kvd_status_t status =
            kvd_proto_validate(c->type, msg, reason, sizeof(reason));
        if (status != KVD_ERR_PROTO || strstr(reason, c->want) == NULL) {
            fail_msg("case %zu: validate gave %d \"%s\", want \"%s\"", i,
                     (int)status, reason, c->want);
        }
        /* pack refuses it and writes nothing. */
        uint8_t *buf = NULL;
        size_t len = 999;
        status = kvd_proto_pack_alloc(c->type, msg, &buf, &len, reason,
                                      sizeof(reason));
        assert_int_equal(status, KVD_ERR_PROTO);
        assert_null(buf);
        assert_int_equal(len, 999);
        assert_reason(reason, c->want);
        if (c->want_wire != NULL && c->want_wire[0] == '\0') {
            continue;
        }
        /* A peer sending it anyway is refused on receipt. */
        uint8_t *raw = raw_pack(msg, &len);
        expect_unpack_fails(c->type, raw, len,
                            c->want_wire ? c->want_wire : c->want);
        free(raw);
    }
}

/* Limits that need many entries: built once, on the heap. */
static void test_count_limits(void **state)
{
    (void)state;
    kvd_samples_init(&samples, 1);
    kvd_pb_step_request_t **reqs =
        calloc(KVD_PROTO_MAX_REQUESTS + 1, sizeof(*reqs));
    assert_non_null(reqs);
    for (size_t i = 0; i <= KVD_PROTO_MAX_REQUESTS; i++) {
        reqs[i] = &samples.request[0];
    }
    samples.step_plan.n_requests = KVD_PROTO_MAX_REQUESTS + 1;
    samples.step_plan.requests = reqs;
    char reason[KVD_PROTO_REASON_MAX];
    assert_int_equal(kvd_proto_step_plan_validate(&samples.step_plan, reason,
                                                  sizeof(reason)),
                     KVD_ERR_PROTO);
    assert_reason(reason, "step_plan.requests: 8193 entries, max 8192");
    size_t len;
    uint8_t *raw = raw_pack(&samples.step_plan.base, &len);
    expect_unpack_fails(KVD_PROTO_MSG_STEP_PLAN, raw, len,
                        "step_plan.requests: more than 8192 entries");
    free(raw);
    free(reqs);

    /* Loads and saves of all requests: 2 x 65536 saves + 1 load. */
    kvd_samples_init(&samples, 1);
    size_t n = KVD_PROTO_MAX_BLOCKS_PER_REQUEST;
    kvd_pb_block_save_t **saves = calloc(n, sizeof(*saves));
    assert_non_null(saves);
    for (size_t i = 0; i < n; i++) {
        saves[i] = &samples.save[0][0];
    }
    samples.request[0].n_saves = n;
    samples.request[0].saves = saves;
    samples.request[1].n_saves = n;
    samples.request[1].saves = saves;
    assert_int_equal(kvd_proto_step_plan_validate(&samples.step_plan, reason,
                                                  sizeof(reason)),
                     KVD_ERR_PROTO);
    assert_reason(reason, "step_plan.requests: 131079 loads and saves in all, "
                          "max 131072");
    raw = raw_pack(&samples.step_plan.base, &len);
    expect_unpack_fails(KVD_PROTO_MSG_STEP_PLAN, raw, len,
                        "loads and saves in all");
    free(raw);
    free(saves);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rules_refused),
        cmocka_unit_test(test_count_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
