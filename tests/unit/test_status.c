/* Status codes: every code has its own name, errno maps as documented. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/status_int.h"
#include "kvdepot/common.h"

static const kvd_status_t all_codes[] = {
    KVD_OK,
    KVD_INPROGRESS,
    KVD_AGAIN,
    KVD_ERR_INVALID,
    KVD_ERR_NOT_FOUND,
    KVD_ERR_EXISTS,
    KVD_ERR_RANGE,
    KVD_ERR_PROTO,
    KVD_ERR_UNSUPPORTED,
    KVD_ERR_STATE,
    KVD_ERR_CANCELED,
    KVD_ERR_NOMEM,
    KVD_ERR_BUSY,
    KVD_ERR_NOSPACE,
    KVD_ERR_QUOTA,
    KVD_ERR_IO,
    KVD_ERR_CHECKSUM,
    KVD_ERR_CORRUPT,
    KVD_ERR_TIMEOUT,
    KVD_ERR_UNREACHABLE,
    KVD_ERR_PEER,
    KVD_ERR_RPC,
    KVD_ERR_AUTH,
    KVD_ERR_DEVICE,
    KVD_ERR_NO_DEVICE,
    KVD_ERR_INTERNAL,
};
#define NUM_CODES (sizeof(all_codes) / sizeof(all_codes[0]))

static void test_every_code_has_a_distinct_name(void **state)
{
    (void)state;
    for (size_t i = 0; i < NUM_CODES; i++) {
        const char *s = kvd_status_str(all_codes[i]);
        assert_non_null(s);
        assert_int_equal(strncmp(s, "KVD_", 4), 0);
        assert_null(strstr(s, "UNKNOWN"));
        for (size_t j = 0; j < i; j++) {
            assert_string_not_equal(s, kvd_status_str(all_codes[j]));
        }
    }
}

static void test_unknown_code_is_named_unknown(void **state)
{
    (void)state;
    assert_string_equal(kvd_status_str((kvd_status_t)-9999),
                        "KVD_ERR_UNKNOWN: unknown status");
    assert_string_equal(kvd_status_str((kvd_status_t)42),
                        "KVD_ERR_UNKNOWN: unknown status");
}

static void test_errors_are_negative_and_grouped(void **state)
{
    (void)state;
    assert_true(KVD_INPROGRESS > 0 && KVD_AGAIN > 0);
    for (size_t i = 3; i < NUM_CODES; i++) {
        assert_true(all_codes[i] < 0);
    }
    assert_true(KVD_ERR_NOMEM <= -20 && KVD_ERR_NOMEM > -40);
    assert_true(KVD_ERR_IO <= -40 && KVD_ERR_IO > -60);
}

static void test_errno_translation(void **state)
{
    (void)state;
    assert_int_equal(kvd_status_from_errno(0), KVD_OK);
    assert_int_equal(kvd_status_from_errno(ENOMEM), KVD_ERR_NOMEM);
    assert_int_equal(kvd_status_from_errno(ENOSPC), KVD_ERR_NOSPACE);
    assert_int_equal(kvd_status_from_errno(EDQUOT), KVD_ERR_NOSPACE);
    assert_int_equal(kvd_status_from_errno(EAGAIN), KVD_ERR_BUSY);
    assert_int_equal(kvd_status_from_errno(ETIMEDOUT), KVD_ERR_TIMEOUT);
    assert_int_equal(kvd_status_from_errno(ENOENT), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_status_from_errno(EINVAL), KVD_ERR_INVALID);
    assert_int_equal(kvd_status_from_errno(ECONNREFUSED), KVD_ERR_UNREACHABLE);
    assert_int_equal(kvd_status_from_errno(ECONNRESET), KVD_ERR_PEER);
    assert_int_equal(kvd_status_from_errno(ECANCELED), KVD_ERR_CANCELED);
    assert_int_equal(kvd_status_from_errno(EACCES), KVD_ERR_AUTH);
    assert_int_equal(kvd_status_from_errno(EIO), KVD_ERR_IO);
    assert_int_equal(kvd_status_from_errno(12345), KVD_ERR_IO);
}

/* gRPC's codes by their wire values (common/ does not see grpc.h); the
 * store client and the etcd client both translate through this one table. */
static void test_grpc_translation(void **state)
{
    (void)state;
    assert_int_equal(kvd_status_from_grpc(0, "t"), KVD_OK); /* OK */
    assert_int_equal(kvd_status_from_grpc(1, "t"), KVD_ERR_CANCELED);
    assert_int_equal(kvd_status_from_grpc(3, "t"), KVD_ERR_INVALID);
    assert_int_equal(kvd_status_from_grpc(4, "t"), KVD_ERR_TIMEOUT);
    assert_int_equal(kvd_status_from_grpc(5, "t"), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_status_from_grpc(7, "t"), KVD_ERR_AUTH);
    assert_int_equal(kvd_status_from_grpc(8, "t"), KVD_ERR_BUSY);
    assert_int_equal(kvd_status_from_grpc(12, "t"), KVD_ERR_UNSUPPORTED);
    assert_int_equal(kvd_status_from_grpc(14, "t"), KVD_ERR_UNREACHABLE);
    assert_int_equal(kvd_status_from_grpc(16, "t"), KVD_ERR_AUTH);
    /* UNKNOWN, ALREADY_EXISTS, FAILED_PRECONDITION, ABORTED, OUT_OF_RANGE,
     * INTERNAL, DATA_LOSS: a failure of the RPC itself. */
    static const int rpc[] = {2, 6, 9, 10, 11, 13, 15};
    for (size_t i = 0; i < sizeof rpc / sizeof rpc[0]; i++) {
        assert_int_equal(kvd_status_from_grpc(rpc[i], "t"), KVD_ERR_RPC);
    }
    /* Not a gRPC code at all, and no caller name: still an error. */
    assert_int_equal(kvd_status_from_grpc(-1, NULL), KVD_ERR_RPC);
    assert_int_equal(kvd_status_from_grpc(17, NULL), KVD_ERR_RPC);
    assert_int_equal(kvd_status_from_grpc(0, NULL), KVD_OK);
}

static char logged[256];
static int n_logged;

static void capture(void *arg, kvd_log_level_t level, const char *file,
                    int line, const char *msg)
{
    (void)arg;
    (void)level;
    (void)file;
    (void)line;
    snprintf(logged, sizeof logged, "%s", msg);
    n_logged++;
}

/* The translation is where the original code is logged: number, name and
 * who answered it; nothing for OK. */
static void test_grpc_code_is_logged(void **state)
{
    (void)state;
    kvd_log_level_t level = kvd_log_get_level();
    kvd_log_set_sink(capture, NULL);
    kvd_log_set_level(KVD_LOG_LEVEL_DEBUG);
    n_logged = 0;
    assert_int_equal(kvd_status_from_grpc(0, "/x.Y/Z"), KVD_OK);
    assert_int_equal(n_logged, 0);
    assert_int_equal(kvd_status_from_grpc(14, "/x.Y/Z"), KVD_ERR_UNREACHABLE);
    assert_int_equal(n_logged, 1);
    assert_non_null(strstr(logged, "/x.Y/Z"));
    assert_non_null(strstr(logged, "14 (UNAVAILABLE)"));
    assert_int_equal(kvd_status_from_grpc(99, NULL), KVD_ERR_RPC);
    assert_int_equal(n_logged, 2);
    assert_non_null(strstr(logged, "99"));
    kvd_log_set_level(level);
    kvd_log_set_sink(NULL, NULL);
}

static void test_version(void **state)
{
    (void)state;
    assert_string_equal(kvd_version(), "0.1.0");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_code_has_a_distinct_name),
        cmocka_unit_test(test_unknown_code_is_named_unknown),
        cmocka_unit_test(test_errors_are_negative_and_grouped),
        cmocka_unit_test(test_errno_translation),
        cmocka_unit_test(test_grpc_translation),
        cmocka_unit_test(test_grpc_code_is_logged),
        cmocka_unit_test(test_version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
