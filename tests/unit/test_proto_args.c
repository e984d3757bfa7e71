/*
 * proto/ arguments and ids: bad arguments are KVD_ERR_INVALID with a
 * reason, an empty input is a message with every field unset, a short
 * reason buffer is cut and never overrun, and request ids must be valid
 * UTF-8 (stray, overlong, surrogate, out-of-range and truncated sequences
 * are refused).
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
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_utf8_id_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
