/*
 * Helpers shared by the proto/ tests (test_proto_*.c): the sample messages
 * of tests/fuzz/proto_samples_int.h, an encoder without validation (what a
 * buggy or hostile peer would send), and the checks that an unpack is
 * refused with a given reason. Header-only (static inline): each test is
 * one executable built from one source file; the including test has
 * cmocka.h included first.
 */
#ifndef KVD_TESTS_TESTPROTO_INT_H
#define KVD_TESTS_TESTPROTO_INT_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../fuzz/proto_samples_int.h"

/* Encodes without validation: what a buggy or hostile peer would send. */
static inline uint8_t *raw_pack(const ProtobufCMessage *msg, size_t *len_out)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(len + 1);
    assert_non_null(buf);
    assert_int_equal(protobuf_c_message_pack(msg, buf), len);
    *len_out = len;
    return buf;
}

static inline void assert_reason(const char *reason, const char *want)
{
    if (strstr(reason, want) == NULL) {
        fail_msg("reason \"%s\" lacks \"%s\"", reason, want);
    }
}

/* Expects unpacking `len` bytes as `type` to fail with KVD_ERR_PROTO,
 * no message, and a reason containing `want`. */
static inline void expect_unpack_fails(kvd_proto_msg_t type, const void *data,
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

#endif /* KVD_TESTS_TESTPROTO_INT_H */
