/*
 * proto/: every message type round-trips field for field; every validation
 * rule is refused with its reason, both by pack (before anything is sent)
 * and by unpack (when a peer sends it anyway); malformed, truncated,
 * garbage and oversize input is refused as KVD_ERR_PROTO; the allocation
 * budget stops amplification; bad arguments are KVD_ERR_INVALID.
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

#include "../fuzz/proto_samples_int.h"

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static bool msg_equal(const ProtobufCMessage *a, const ProtobufCMessage *b);

static size_t elem_size(ProtobufCType type)
{
    switch (type) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE: return 8;
    case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE: return sizeof(ProtobufCMessage *);
    default: return 4;
    }
}

static bool value_equal(ProtobufCType type, const void *x, const void *y)
{
    switch (type) {
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)x, *t = *(char *const *)y;
        return strcmp(s ? s : "", t ? t : "") == 0;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *p = x, *q = y;
        return p->len == q->len &&
               (p->len == 0 || memcmp(p->data, q->data, p->len) == 0);
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *m = *(ProtobufCMessage *const *)x;
        const ProtobufCMessage *n = *(ProtobufCMessage *const *)y;
        if (m == NULL || n == NULL) {
            return m == n;
        }
        return msg_equal(m, n);
    }
    default: return memcmp(x, y, elem_size(type)) == 0;
    }
}

/* Field-by-field deep comparison driven by the descriptors, so every
 * message type (and any field added later) is compared completely. */
static bool msg_equal(const ProtobufCMessage *a, const ProtobufCMessage *b)
{
    if (a->descriptor != b->descriptor) {
        return false;
    }
    const ProtobufCMessageDescriptor *d = a->descriptor;
    const char *pa = (const char *)a, *pb = (const char *)b;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t na = *(const size_t *)(pa + f->quantifier_offset);
            size_t nb = *(const size_t *)(pb + f->quantifier_offset);
            if (na != nb) {
                return false;
            }
            const char *xa = *(char *const *)(pa + f->offset);
            const char *xb = *(char *const *)(pb + f->offset);
            for (size_t k = 0; k < na; k++) {
                if (!value_equal(f->type, xa + k * elem_size(f->type),
                                 xb + k * elem_size(f->type))) {
                    return false;
                }
            }
            continue;
        }
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            uint32_t ca = *(const uint32_t *)(pa + f->quantifier_offset);
            uint32_t cb = *(const uint32_t *)(pb + f->quantifier_offset);
            if (ca != cb) {
                return false;
            }
            if (ca != f->id) {
                continue;
            }
        }
        if (!value_equal(f->type, pa + f->offset, pb + f->offset)) {
            return false;
        }
    }
    return true;
}

static kvd_samples_t samples;

/* Encodes without validation: what a buggy or hostile peer would send. */
static uint8_t *raw_pack(const ProtobufCMessage *msg, size_t *len_out)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(len + 1);
    assert_non_null(buf);
    assert_int_equal(protobuf_c_message_pack(msg, buf), len);
    *len_out = len;
    return buf;
}

static void assert_reason(const char *reason, const char *want)
{
    if (strstr(reason, want) == NULL) {
        fail_msg("reason \"%s\" lacks \"%s\"", reason, want);
    }
}

static void expect_unpack_fails(kvd_proto_msg_t type, const void *data,
                                size_t len, const char *want)
{
    char reason[KVD_PROTO_REASON_MAX] = "";
    ProtobufCMessage *msg = NULL;
    kvd_status_t status =
        kvd_proto_unpack(type, data, len, &msg, reason, sizeof(reason));
    assert_int_equal(status, KVD_ERR_PROTO);
    assert_null(msg);
    assert_reason(reason, want);
}

/* ------------------------------------------------------------------------ */
/* Round trips                                                              */
/* ------------------------------------------------------------------------ */

static void test_round_trip_every_message(void **state)
{
    (void)state;
    for (unsigned v = 0; v < KVD_SAMPLES_VARIANTS; v++) {
        kvd_samples_init(&samples, v);
        for (int t = 0; t < KVD_PROTO_MSG_COUNT; t++) {
            kvd_proto_msg_t type = (kvd_proto_msg_t)t;
            const ProtobufCMessage *in = kvd_samples_get(&samples, type);
            char reason[KVD_PROTO_REASON_MAX] = "";
            uint8_t *buf = NULL;
            size_t len = 0;
            kvd_status_t status = kvd_proto_pack_alloc(type, in, &buf, &len,
                                                       reason, sizeof(reason));
            if (status != KVD_OK) {
                fail_msg("%s v%u: %s", kvd_proto_msg_name(type), v, reason);
            }
            ProtobufCMessage *out = NULL;
            status =
                kvd_proto_unpack(type, buf, len, &out, reason, sizeof(reason));
            if (status != KVD_OK) {
                fail_msg("%s v%u: %s", kvd_proto_msg_name(type), v, reason);
            }
            assert_true(msg_equal(in, out));

            /* pack into a caller buffer: exact fit works, one short does
             * not and writes nothing. */
            size_t need = 0, got = 0;
            assert_int_equal(
                kvd_proto_packed_size(type, out, &need, reason, sizeof(reason)),
                KVD_OK);
            assert_int_equal(need, len);
            uint8_t *exact = malloc(need + 1);
            assert_non_null(exact);
            assert_int_equal(kvd_proto_pack(type, out, exact, need, &got,
                                            reason, sizeof(reason)),
                             KVD_OK);
            assert_int_equal(got, len);
            assert_memory_equal(exact, buf, len);
            if (need > 0) {
                got = 12345;
                assert_int_equal(kvd_proto_pack(type, out, exact, need - 1,
                                                &got, reason, sizeof(reason)),
                                 KVD_ERR_RANGE);
                assert_int_equal(got, 12345);
                assert_reason(reason, "buffer has");
            }
            free(exact);
            kvd_proto_free(out);
            free(buf);
        }
    }
}

/* The typed wrappers and the generated field names, on the plan the leader
 * sends and the report the worker returns. */
static void test_typed_step_plan_and_report(void **state)
{
    (void)state;
    kvd_samples_init(&samples, 2);
    char reason[KVD_PROTO_REASON_MAX];
    uint8_t *buf;
    size_t len;
    assert_int_equal(kvd_proto_step_plan_pack_alloc(&samples.step_plan, &buf,
                                                    &len, reason,
                                                    sizeof(reason)),
                     KVD_OK);
    kvd_pb_step_plan_t *plan = NULL;
    assert_int_equal(
        kvd_proto_step_plan_unpack(buf, len, &plan, reason, sizeof(reason)),
        KVD_OK);
    free(buf);
    assert_int_equal(plan->step, 2007);
    assert_int_equal(plan->block_size, 4096);
    assert_int_equal(plan->n_requests, 3);
    assert_string_equal(plan->requests[1]->request_id,
                        "req-\xc3\xa9t\xc3\xa9-1");
    assert_int_equal(plan->requests[1]->num_load_tokens, 3 * 4096 - 1);
    assert_true(plan->requests[1]->async_load);
    assert_true(plan->requests[0]->layerwise);
    const kvd_pb_block_load_t *load = plan->requests[0]->loads[2];
    assert_int_equal(load->block_id, INT32_MAX - 2);
    assert_int_equal(load->source->tier, KVDEPOT__V1__TIER__TIER_REMOTE);
    assert_string_equal(load->source->node_id, "node-b:5051");
    assert_int_equal(load->key->block_hash.len, 32);
    assert_memory_equal(load->key->namespace_id.data, samples.ns, 16);
    assert_int_equal(plan->requests[2]->saves[0]->reservation_id, 77);
    assert_string_equal(plan->preempted_request_ids[1], "cmpl-older");
    kvd_proto_step_plan_free(plan);

    assert_int_equal(kvd_proto_worker_report_pack_alloc(&samples.worker_report,
                                                        &buf, &len, reason,
                                                        sizeof(reason)),
                     KVD_OK);
    kvd_pb_worker_report_t *report = NULL;
    assert_int_equal(kvd_proto_worker_report_unpack(buf, len, &report, reason,
                                                    sizeof(reason)),
                     KVD_OK);
    free(buf);
    assert_int_equal(report->n_failed_loads, 2);
    assert_int_equal(report->failed_loads[0]->status, KVD_ERR_CHECKSUM);
    assert_int_equal(report->failed_loads[1]->block_id, 10);
    assert_string_equal(report->finished_saving[1], "cmpl-1");
    kvd_proto_worker_report_free(report);
}

/* Unknown fields from a newer writer are accepted, kept and re-sent. */
static void test_unknown_fields_accepted(void **state)
{
    (void)state;
    kvd_samples_init(&samples, 1);
    size_t len;
    uint8_t *raw = raw_pack(&samples.namespace_descriptor.base, &len);
    uint8_t *buf = malloc(len + 3);
    assert_non_null(buf);
    memcpy(buf, raw, len);
    buf[len] = 0xc0; /* field 1000, varint */
    buf[len + 1] = 0x3e;
    buf[len + 2] = 0x05;
    kvd_pb_namespace_descriptor_t *nd = NULL;
    char reason[KVD_PROTO_REASON_MAX];
    assert_int_equal(kvd_proto_namespace_descriptor_unpack(
                         buf, len + 3, &nd, reason, sizeof(reason)),
                     KVD_OK);
    assert_int_equal(nd->base.n_unknown_fields, 1);
    uint8_t *again;
    size_t again_len;
    assert_int_equal(kvd_proto_namespace_descriptor_pack_alloc(
                         nd, &again, &again_len, reason, sizeof(reason)),
                     KVD_OK);
    assert_int_equal(again_len, len + 3);
    assert_memory_equal(again, buf, len + 3);
    free(again);
    kvd_proto_namespace_descriptor_free(nd);
    free(buf);
    free(raw);
}

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
    S->admin_response.result_case = (Kvdepot__V1__AdminResponse__ResultCase)9;
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
     "step_plan.requests[0].num_load_tokens: 64 tokens without loads", NULL},
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
     "admin_response.result: case 9 names no member", ""},
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

/* ------------------------------------------------------------------------ */
/* Hostile bytes                                                            */
/* ------------------------------------------------------------------------ */

static void test_truncated_input(void **state)
{
    (void)state;
    kvd_samples_init(&samples, 2);
    size_t len;
    uint8_t *raw = raw_pack(&samples.step_plan.base, &len);
    size_t refused = 0;
    for (size_t cut = 0; cut < len; cut++) {
        /* An exact-size copy so ASan sees any read past the cut. */
        uint8_t *part = malloc(cut + 1);
        assert_non_null(part);
        memcpy(part, raw, cut);
        ProtobufCMessage *msg = NULL;
        char reason[KVD_PROTO_REASON_MAX];
        kvd_status_t status = kvd_proto_unpack(
            KVD_PROTO_MSG_STEP_PLAN, part, cut, &msg, reason, sizeof(reason));
        /* A cut between two requests leaves a valid shorter plan. */
        assert_true(status == KVD_OK || status == KVD_ERR_PROTO);
        refused += status != KVD_OK;
        kvd_proto_free(msg);
        free(part);
    }
    assert_true(refused > len - 8);
    /* A cut inside the first key's hash names what ran out. */
    expect_unpack_fails(KVD_PROTO_MSG_STEP_PLAN, raw, 60, "runs past the end");
    free(raw);
}

static uint64_t rng_state = 0x243f6a8885a308d3u;
static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void test_garbage_input(void **state)
{
    (void)state;
    uint8_t buf[512];
    for (int round = 0; round < 4000; round++) {
        size_t len = rng_next() % sizeof(buf);
        for (size_t i = 0; i < len; i++) {
            buf[i] = (uint8_t)rng_next();
        }
        kvd_proto_msg_t type = (kvd_proto_msg_t)(round % KVD_PROTO_MSG_COUNT);
        ProtobufCMessage *msg = NULL;
        char reason[KVD_PROTO_REASON_MAX];
        kvd_status_t status =
            kvd_proto_unpack(type, buf, len, &msg, reason, sizeof(reason));
        assert_true(status == KVD_OK || status == KVD_ERR_PROTO);
        kvd_proto_free(msg);
    }
}

static void test_oversize_input(void **state)
{
    (void)state;
    size_t big = KVD_PROTO_MAX_MESSAGE_BYTES + 1;
    uint8_t *buf = calloc(big, 1);
    assert_non_null(buf);
    expect_unpack_fails(KVD_PROTO_MSG_STEP_PLAN, buf, big,
                        "step_plan: 16777217 bytes, max 16777216");
    expect_unpack_fails(KVD_PROTO_MSG_ADMIN_REQUEST, buf,
                        KVD_PROTO_MAX_SMALL_MESSAGE_BYTES + 1,
                        "admin_request: 65537 bytes, max 65536");
    free(buf);
    assert_int_equal(kvd_proto_max_bytes(KVD_PROTO_MSG_LOOKUP_REQUEST),
                     KVD_PROTO_MAX_MESSAGE_BYTES);
    assert_int_equal(kvd_proto_max_bytes(KVD_PROTO_MSG_COUNT), 0);

    /* pack refuses to produce more than a reader accepts. */
    kvd_samples_init(&samples, 0);
    static uint8_t blob[KVD_PROTO_MAX_SMALL_MESSAGE_BYTES];
    ProtobufCMessageUnknownField unknown = {
        .tag = 1000,
        .wire_type = PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED,
        .len = sizeof(blob),
        .data = blob};
    samples.ping_reply.base.n_unknown_fields = 1;
    samples.ping_reply.base.unknown_fields = &unknown;
    char reason[KVD_PROTO_REASON_MAX];
    size_t len;
    assert_int_equal(kvd_proto_admin_response_packed_size(
                         &samples.admin_response, &len, reason, sizeof(reason)),
                     KVD_ERR_PROTO);
    assert_reason(reason, "admin_response: encodes to");
}

/* Wire-level rules: things protobuf-c would accept or misread. */
static void test_wire_rules(void **state)
{
    (void)state;
    /* block_size=16, requests{request_id="a\0b"} */
    static const uint8_t nul_id[] = {0x10, 0x10, 0x1a, 0x05, 0x0a,
                                     0x03, 'a',  0x00, 'b'};
    expect_unpack_fails(KVD_PROTO_MSG_STEP_PLAN, nul_id, sizeof(nul_id),
                        "step_plan.requests[0].request_id: NUL byte inside "
                        "the string");
    /* block_size twice */
    static const uint8_t twice[] = {0x10, 0x10, 0x10, 0x20};
    expect_unpack_fails(KVD_PROTO_MSG_STEP_PLAN, twice, sizeof(twice),
                        "step_plan.block_size: given twice");
    /* admin op: ping then flush */
    static const uint8_t two_ops[] = {0x0a, 0x00, 0x1a, 0x00};
    expect_unpack_fails(KVD_PROTO_MSG_ADMIN_REQUEST, two_ops, sizeof(two_ops),
                        "admin_request.flush: second member of a oneof");
    /* block_size sent length-delimited */
    static const uint8_t wire_type[] = {0x12, 0x01, 0x10};
    expect_unpack_fails(KVD_PROTO_MSG_STEP_PLAN, wire_type, sizeof(wire_type),
                        "step_plan.block_size: wire type 2 at byte 0, want 0");
    static const uint8_t field_zero[] = {0x00, 0x01};
    expect_unpack_fails(KVD_PROTO_MSG_STEP_PLAN, field_zero, sizeof(field_zero),
                        "field number 0 at byte 0");
    static const uint8_t long_varint[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff,
                                          0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    expect_unpack_fails(KVD_PROTO_MSG_STEP_PLAN, long_varint,
                        sizeof(long_varint), "malformed varint at byte 1");
    static const uint8_t group[] = {0x0b, 0x0c};
    expect_unpack_fails(KVD_PROTO_MSG_STEP_PLAN, group, sizeof(group),
                        "unsupported wire type 3");
    /* layer_checksums packed with a length that is not a multiple of 8 */
    static const uint8_t packed[] = {0x2a, 0x03, 1, 2, 3};
    expect_unpack_fails(KVD_PROTO_MSG_OBJECT_DESCRIPTOR, packed, sizeof(packed),
                        "object_descriptor.layer_checksums: malformed packed "
                        "run");
    /* 1025 unknown varint fields (number 100) */
    uint8_t unknown[3 * (KVD_PROTO_MAX_UNKNOWN_FIELDS + 1)];
    for (size_t i = 0; i < KVD_PROTO_MAX_UNKNOWN_FIELDS + 1; i++) {
        unknown[3 * i] = 0xa0;
        unknown[3 * i + 1] = 0x06;
        unknown[3 * i + 2] = 0x00;
    }
    expect_unpack_fails(KVD_PROTO_MSG_STATS_REQUEST, unknown, sizeof(unknown),
                        "stats_request: more than 1024 unknown fields");
    /* ... while 1024 of them are fine. */
    ProtobufCMessage *msg = NULL;
    char reason[KVD_PROTO_REASON_MAX];
    assert_int_equal(kvd_proto_unpack(KVD_PROTO_MSG_STATS_REQUEST, unknown,
                                      sizeof(unknown) - 3, &msg, reason,
                                      sizeof(reason)),
                     KVD_OK);
    kvd_proto_free(msg);
}

/* Appends a length-delimited field header; returns the new offset. */
static size_t put_len_field(uint8_t *buf, size_t off, unsigned field,
                            size_t len)
{
    buf[off++] = (uint8_t)(field << 3 | 2);
    while (len >= 0x80) {
        buf[off++] = (uint8_t)(len | 0x80);
        len >>= 7;
    }
    buf[off++] = (uint8_t)len;
    return off;
}

static void test_amplification(void **state)
{
    (void)state;
    /* 100k empty requests in 200 KB: refused by the count before
     * protobuf-c allocates anything. */
    size_t n = 100000;
    uint8_t *buf = malloc(2 * n + 16);
    assert_non_null(buf);
    size_t off = 0;
    buf[off++] = 0x10; /* block_size = 16 */
    buf[off++] = 0x10;
    for (size_t i = 0; i < n; i++) {
        off = put_len_field(buf, off, 3, 0);
    }
    expect_unpack_fails(KVD_PROTO_MSG_STEP_PLAN, buf, off,
                        "step_plan.requests: more than 8192 entries");
    free(buf);

    /* One request with 65536 empty loads is within every count, but needs
     * ~70 bytes of memory per input byte: the budget refuses it. */
    n = KVD_PROTO_MAX_BLOCKS_PER_REQUEST;
    size_t inner = 2 * n;
    buf = malloc(inner + 32);
    assert_non_null(buf);
    off = 0;
    buf[off++] = 0x10;
    buf[off++] = 0x10;
    off = put_len_field(buf, off, 3, inner);
    for (size_t i = 0; i < n; i++) {
        off = put_len_field(buf, off, 2, 0);
    }
    expect_unpack_fails(KVD_PROTO_MSG_STEP_PLAN, buf, off,
                        "exceeds the memory budget");
    /* The same bytes with a generous explicit budget decode, and are then
     * refused for what they are (a request without an id, loads without
     * keys). */
    ProtobufCMessage *msg = NULL;
    char reason[KVD_PROTO_REASON_MAX];
    assert_int_equal(kvd_proto_unpack_with_budget(KVD_PROTO_MSG_STEP_PLAN, buf,
                                                  off, SIZE_MAX, &msg, reason,
                                                  sizeof(reason)),
                     KVD_ERR_PROTO);
    assert_reason(reason, "step_plan.requests[0].request_id: empty, required");
    free(buf);
    assert_int_equal(kvd_proto_unpack_budget(1000),
                     KVD_PROTO_BUDGET_BASE_BYTES +
                         1000 * KVD_PROTO_BUDGET_PER_INPUT_BYTE);
    assert_int_equal(kvd_proto_unpack_budget(SIZE_MAX), SIZE_MAX);

    /* A tiny budget refuses even a valid message. */
    kvd_samples_init(&samples, 1);
    size_t len;
    uint8_t *raw = raw_pack(&samples.step_plan.base, &len);
    assert_int_equal(kvd_proto_unpack_with_budget(KVD_PROTO_MSG_STEP_PLAN, raw,
                                                  len, 256, &msg, reason,
                                                  sizeof(reason)),
                     KVD_ERR_PROTO);
    assert_reason(reason, "memory budget of 256 bytes");
    free(raw);
}

/* The densest valid messages still fit the default budget: the largest
 * lookup answer with location records of two bytes each, and a report full
 * of one-character failures. */
static void test_dense_valid_messages_fit(void **state)
{
    (void)state;
    size_t n = KVD_PROTO_MAX_HASHES;
    kvd_pb_block_location_t loc = KVDEPOT__V1__BLOCK_LOCATION__INIT;
    loc.tier = KVDEPOT__V1__TIER__TIER_DISK;
    kvd_pb_block_location_t **locs = calloc(n, sizeof(*locs));
    assert_non_null(locs);
    for (size_t i = 0; i < n; i++) {
        locs[i] = &loc;
    }
    kvd_pb_lookup_response_t resp = KVDEPOT__V1__LOOKUP_RESPONSE__INIT;
    resp.n_locations = n;
    resp.locations = locs;
    char reason[KVD_PROTO_REASON_MAX];
    uint8_t *buf;
    size_t len;
    assert_int_equal(kvd_proto_lookup_response_pack_alloc(
                         &resp, &buf, &len, reason, sizeof(reason)),
                     KVD_OK);
    kvd_pb_lookup_response_t *out = NULL;
    kvd_status_t status = kvd_proto_lookup_response_unpack(
        buf, len, &out, reason, sizeof(reason));
    if (status != KVD_OK) {
        fail_msg("%s", reason);
    }
    assert_int_equal(out->n_locations, n);
    kvd_proto_lookup_response_free(out);
    free(buf);
    free(locs);

    n = KVD_PROTO_MAX_BLOCKS_PER_PLAN;
    kvd_pb_failed_load_t *fails = calloc(n, sizeof(*fails));
    kvd_pb_failed_load_t **failp = calloc(n, sizeof(*failp));
    assert_non_null(fails);
    assert_non_null(failp);
    for (size_t i = 0; i < n; i++) {
        kvd_pb_failed_load_t f = KVDEPOT__V1__FAILED_LOAD__INIT;
        f.request_id = (char *)"a";
        f.block_id = (uint32_t)i;
        f.status = -1;
        fails[i] = f;
        failp[i] = &fails[i];
    }
    kvd_pb_worker_report_t report = KVDEPOT__V1__WORKER_REPORT__INIT;
    report.n_failed_loads = n;
    report.failed_loads = failp;
    assert_int_equal(kvd_proto_worker_report_pack_alloc(&report, &buf, &len,
                                                        reason, sizeof(reason)),
                     KVD_OK);
    kvd_pb_worker_report_t *rout = NULL;
    status =
        kvd_proto_worker_report_unpack(buf, len, &rout, reason, sizeof(reason));
    if (status != KVD_OK) {
        fail_msg("%s", reason);
    }
    assert_int_equal(rout->n_failed_loads, n);
    kvd_proto_worker_report_free(rout);
    free(buf);
    free(failp);
    free(fails);
}

/* ------------------------------------------------------------------------ */
/* Arguments                                                                */
/* ------------------------------------------------------------------------ */

static void test_bad_arguments(void **state)
{
    (void)state;
    char reason[KVD_PROTO_REASON_MAX];
    ProtobufCMessage *msg = NULL;
    assert_int_equal(kvd_proto_unpack(KVD_PROTO_MSG_STEP_PLAN, NULL, 4, &msg,
                                      reason, sizeof(reason)),
                     KVD_ERR_INVALID);
    assert_reason(reason, "step_plan: NULL data");
    assert_int_equal(kvd_proto_unpack(KVD_PROTO_MSG_STEP_PLAN, "x", 1, NULL,
                                      reason, sizeof(reason)),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_proto_unpack(KVD_PROTO_MSG_COUNT, "x", 1, &msg, reason,
                                      sizeof(reason)),
                     KVD_ERR_INVALID);
    assert_reason(reason, "unknown message type");
    assert_int_equal(
        kvd_proto_unpack((kvd_proto_msg_t)-1, "x", 1, &msg, NULL, 0),
        KVD_ERR_INVALID);
    assert_null(msg);
    assert_null(kvd_proto_msg_name(KVD_PROTO_MSG_COUNT));
    assert_string_equal(kvd_proto_msg_name(KVD_PROTO_MSG_GET_RESPONSE),
                        "get_response");

    /* An empty input is a message with every field unset: valid for a
     * stats request, not for a plan (block_size is required). */
    assert_int_equal(kvd_proto_unpack(KVD_PROTO_MSG_STATS_REQUEST, NULL, 0,
                                      &msg, reason, sizeof(reason)),
                     KVD_OK);
    kvd_proto_free(msg);
    expect_unpack_fails(KVD_PROTO_MSG_STEP_PLAN, NULL, 0,
                        "step_plan.block_size: 0, want 1..4096");

    kvd_samples_init(&samples, 0);
    assert_int_equal(kvd_proto_validate(KVD_PROTO_MSG_STEP_PLAN, NULL, reason,
                                        sizeof(reason)),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_proto_validate(KVD_PROTO_MSG_STEP_PLAN,
                                        &samples.worker_report.base, reason,
                                        sizeof(reason)),
                     KVD_ERR_INVALID);
    assert_reason(reason, "step_plan: message is a kvdepot.v1.WorkerReport");
    uint8_t out[8];
    assert_int_equal(kvd_proto_pack(KVD_PROTO_MSG_STEP_PLAN,
                                    &samples.step_plan.base, out, sizeof(out),
                                    NULL, reason, sizeof(reason)),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_proto_pack_alloc(KVD_PROTO_MSG_STEP_PLAN,
                                          &samples.step_plan.base, NULL, NULL,
                                          reason, sizeof(reason)),
                     KVD_ERR_INVALID);
    size_t len;
    assert_int_equal(kvd_proto_packed_size(KVD_PROTO_MSG_STEP_PLAN,
                                           &samples.step_plan.base, NULL,
                                           reason, sizeof(reason)),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_proto_packed_size(KVD_PROTO_MSG_STEP_PLAN,
                                           &samples.step_plan.base, &len, NULL,
                                           0),
                     KVD_OK);

    /* A short reason buffer is truncated, never overrun. */
    char tiny[12];
    memset(tiny, '#', sizeof(tiny));
    samples.step_plan.block_size = 0;
    assert_int_equal(kvd_proto_validate(KVD_PROTO_MSG_STEP_PLAN,
                                        &samples.step_plan.base, tiny, 8),
                     KVD_ERR_PROTO);
    assert_string_equal(tiny, "step_pl");
    assert_int_equal(tiny[8], '#');

    kvd_proto_free(NULL);
    kvd_proto_step_plan_free(NULL);
}

static void test_utf8_id_rules(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "\x80",             /* stray continuation byte */
        "\xc1\xbf",         /* overlong 2-byte */
        "\xe0\x80\xaf",     /* overlong 3-byte */
        "\xed\xa0\x80",     /* UTF-16 surrogate */
        "\xf4\x90\x80\x80", /* above U+10FFFF */
        "\xe2\x82",         /* truncated */
        "\xff",
    };
    static const char *const good[] = {"plain", "\xc3\xa9", "\xe2\x82\xac",
                                       "\xf0\x9f\x98\x80", "\xef\xbf\xbf"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        kvd_samples_init(&samples, 0);
        samples.request[0].request_id = (char *)bad[i];
        char reason[KVD_PROTO_REASON_MAX];
        assert_int_equal(kvd_proto_step_plan_validate(&samples.step_plan,
                                                      reason, sizeof(reason)),
                         KVD_ERR_PROTO);
        assert_reason(reason, "not valid UTF-8");
    }
    for (size_t i = 0; i < sizeof(good) / sizeof(*good); i++) {
        kvd_samples_init(&samples, 0);
        samples.request[0].request_id = (char *)good[i];
        assert_int_equal(
            kvd_proto_step_plan_validate(&samples.step_plan, NULL, 0), KVD_OK);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_every_message),
        cmocka_unit_test(test_typed_step_plan_and_report),
        cmocka_unit_test(test_unknown_fields_accepted),
        cmocka_unit_test(test_rules_refused),
        cmocka_unit_test(test_count_limits),
        cmocka_unit_test(test_truncated_input),
        cmocka_unit_test(test_garbage_input),
        cmocka_unit_test(test_oversize_input),
        cmocka_unit_test(test_wire_rules),
        cmocka_unit_test(test_amplification),
        cmocka_unit_test(test_dense_valid_messages_fit),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_utf8_id_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
