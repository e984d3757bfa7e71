/*
 * proto/ round trips: every message type, in every sample variant, packs
 * and unpacks back field for field (compared through the descriptors, so
 * a field added later is compared too) and packs into a caller's buffer of
 * exactly its size but not one byte less; the typed wrappers carry the
 * leader's plan and the worker's report; unknown fields from a newer
 * writer are accepted, kept and re-sent.
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

/* The sample messages; each test fills them for the variant it needs. */
static kvd_samples_t samples;

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_every_message),
        cmocka_unit_test(test_typed_step_plan_and_report),
        cmocka_unit_test(test_unknown_fields_accepted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
