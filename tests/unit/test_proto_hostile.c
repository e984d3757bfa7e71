/*
 * proto/ against hostile bytes: truncated, garbage and oversize input is
 * refused as KVD_ERR_PROTO, and pack refuses to produce more than a reader
 * accepts; wire-level tricks that protobuf-c would accept or misread are
 * refused; the allocation budget stops amplification, while the densest
 * valid messages still fit it.
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_truncated_input),
        cmocka_unit_test(test_garbage_input),
        cmocka_unit_test(test_oversize_input),
        cmocka_unit_test(test_wire_rules),
        cmocka_unit_test(test_amplification),
        cmocka_unit_test(test_dense_valid_messages_fit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
