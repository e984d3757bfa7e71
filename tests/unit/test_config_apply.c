/*
 * Configuration objects applied to a settings table (common/config_int.h):
 * set and its errors, defaults, the precedence call > env > file >
 * default, apply's error text naming the setting and its source, unknown
 * keys under the table's own prefix, bad and required defaults, env names,
 * known sections, and set racing apply from two threads.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvd_testconfig_int.h"

/* ------------------------------------------------------------------------ */
/* Config object                                                            */
/* ------------------------------------------------------------------------ */

static void test_create_set_errors(void **state)
{
    (void)state;
    assert_int_equal(kvd_config_create(NULL), KVD_ERR_INVALID);
    kvd_config_destroy(NULL);
    kvd_config_t *config = config_new();
    assert_int_equal(kvd_config_set(NULL, "a", "b"), KVD_ERR_INVALID);
    assert_int_equal(kvd_config_set(config, NULL, "b"), KVD_ERR_INVALID);
    assert_int_equal(kvd_config_set(config, "a", NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_config_set(config, "", "b"), KVD_ERR_INVALID);
    char longname[300];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    assert_int_equal(kvd_config_set(config, longname, "b"), KVD_ERR_INVALID);

    /* A later set replaces the earlier value; strings are copied. */
    char value[8] = "3";
    assert_int_equal(kvd_config_set(config, "tst.count", value), KVD_OK);
    snprintf(value, sizeof(value), "99");
    sample_t s;
    char err[256];
    assert_int_equal(apply(config, &s, err, sizeof(err)), KVD_OK);
    assert_true(s.count == 3);
    assert_int_equal(kvd_config_set(config, "tst.count", "4"), KVD_OK);
    assert_int_equal(apply(config, &s, err, sizeof(err)), KVD_OK);
    assert_true(s.count == 4);
    kvd_config_destroy(config);
}

static void test_defaults(void **state)
{
    (void)state;
    sample_t s;
    char err[256] = "";
    assert_int_equal(apply(NULL, &s, err, sizeof(err)), KVD_OK);
    assert_false(s.flag);
    assert_true(s.count == 7);
    assert_true(s.arena_bytes == 1ull << 30);
    assert_true(s.timeout_ms == 5000);
    assert_string_equal(s.name, "kvd");
    assert_int_equal(s.mode, 1);
    kvd_config_t *config = config_new();
    assert_int_equal(apply(config, &s, err, sizeof(err)), KVD_OK);
    assert_true(s.count == 7);
    kvd_config_destroy(config);
}

static void test_precedence(void **state)
{
    (void)state;
    kvd_config_t *config = config_new();
    sample_t s;
    char err[256] = "";
    load(config, "tst:\n  count: 1\n  store:\n    arena_size: 2g\n"
                 "  name: from-file\n");
    assert_int_equal(apply(config, &s, err, sizeof(err)), KVD_OK);
    assert_true(s.count == 1);
    assert_true(s.arena_bytes == 2ull << 30);
    assert_string_equal(s.name, "from-file");
    assert_true(s.timeout_ms == 5000); /* default */

    setenv("KVDEPOT_TST_COUNT", "2", 1);
    setenv("KVDEPOT_TST_STORE_ARENA_SIZE", "3g", 1);
    setenv("KVDEPOT_TST_NAME", "", 1); /* empty env = unset */
    assert_int_equal(apply(config, &s, err, sizeof(err)), KVD_OK);
    assert_true(s.count == 2);
    assert_true(s.arena_bytes == 3ull << 30);
    assert_string_equal(s.name, "from-file");

    assert_int_equal(kvd_config_set(config, "tst.count", "3"), KVD_OK);
    assert_int_equal(apply(config, &s, err, sizeof(err)), KVD_OK);
    assert_true(s.count == 3);
    assert_true(s.arena_bytes == 3ull << 30);

    /* Env without a config object still wins over defaults. */
    assert_int_equal(apply(NULL, &s, err, sizeof(err)), KVD_OK);
    assert_true(s.count == 2);
    assert_true(s.arena_bytes == 3ull << 30);
    assert_string_equal(s.name, "kvd");
    kvd_config_destroy(config);
}

/* ------------------------------------------------------------------------ */
/* Apply                                                                    */
/* ------------------------------------------------------------------------ */

static void test_apply_error_text(void **state)
{
    (void)state;
    sample_t s;
    char err[256] = "";
    setenv("KVDEPOT_TST_STORE_ARENA_SIZE", "8x", 1);
    assert_int_equal(apply(NULL, &s, err, sizeof(err)), KVD_ERR_INVALID);
    assert_string_equal(err, "tst.store.arena_size='8x' (from env "
                             "KVDEPOT_TST_STORE_ARENA_SIZE): unknown size "
                             "suffix 'x'");
    unsetenv("KVDEPOT_TST_STORE_ARENA_SIZE");

    kvd_config_t *config = config_new();
    load(config, "tst:\n  mode: turbo\n");
    assert_int_equal(apply(config, &s, err, sizeof(err)), KVD_ERR_INVALID);
    assert_string_equal(err, "tst.mode='turbo' (from file <yaml>:2): not one "
                             "of: fast safe paranoid");
    assert_int_equal(kvd_config_set(config, "tst.mode", "fast"), KVD_OK);
    assert_int_equal(kvd_config_set(config, "tst.flag", "maybe"), KVD_OK);
    assert_int_equal(apply(config, &s, err, sizeof(err)), KVD_ERR_INVALID);
    assert_string_equal(err, "tst.flag='maybe' (from call parameter): not a "
                             "boolean (use true/false, yes/no, on/off or "
                             "1/0)");
    /* Errors fit any buffer, including none. */
    char small[10];
    assert_int_equal(apply(config, &s, small, sizeof(small)), KVD_ERR_INVALID);
    assert_string_equal(small, "tst.flag=");
    assert_int_equal(apply(config, &s, NULL, 0), KVD_ERR_INVALID);
    /* Long values are quoted in part. */
    char longval[400];
    memset(longval, '9', sizeof(longval) - 1);
    longval[sizeof(longval) - 1] = '\0';
    assert_int_equal(kvd_config_set(config, "tst.flag", longval), KVD_OK);
    char big[512];
    assert_int_equal(apply(config, &s, big, sizeof(big)), KVD_ERR_INVALID);
    assert_non_null(strstr(big, "99...' (from call parameter)"));
    kvd_config_destroy(config);
}

static void test_apply_unknown_keys(void **state)
{
    (void)state;
    sample_t s;
    char err[256] = "";
    kvd_config_t *config = config_new();
    load(config, "tst:\n  cuont: 3\n");
    assert_int_equal(apply(config, &s, err, sizeof(err)), KVD_ERR_NOT_FOUND);
    assert_string_equal(err,
                        "unknown setting 'tst.cuont' (from file <yaml>:2)");
    kvd_config_destroy(config);

    config = config_new();
    assert_int_equal(kvd_config_set(config, "tst.store.arena_sise", "1g"),
                     KVD_OK);
    assert_int_equal(apply(config, &s, err, sizeof(err)), KVD_ERR_NOT_FOUND);
    assert_string_equal(
        err, "unknown setting 'tst.store.arena_sise' (from call parameter)");
    kvd_config_destroy(config);

    /* The bare prefix itself is not a field either. */
    config = config_new();
    load(config, "tst: 5\n");
    assert_int_equal(apply(config, &s, err, sizeof(err)), KVD_ERR_NOT_FOUND);
    kvd_config_destroy(config);

    /* Other components' keys (other first part) pass through. */
    config = config_new();
    load(config, "store: {arena_size: 1t}\ntstx.a: 1\nnet.port: 80\n");
    assert_int_equal(kvd_config_set(config, "daemon.socket", "/x"), KVD_OK);
    assert_int_equal(apply(config, &s, err, sizeof(err)), KVD_OK);
    assert_true(s.arena_bytes == 1ull << 30);
    kvd_config_destroy(config);
}

static void test_apply_bad_table(void **state)
{
    (void)state;
    typedef struct {
        uint64_t size;
        int64_t n;
    } small_t;
    small_t s;
    char err[256] = "";
    kvd_config_field_t bad_default[] = {
        {"bt.size", "12q", "size", kvd_config_parse_size,
         offsetof(small_t, size), 0, 0, NULL},
    };
    assert_int_equal(kvd_config_apply(NULL, bad_default, 1, &s, err, 256),
                     KVD_ERR_INTERNAL);
    assert_string_equal(
        err, "bt.size: default '12q' is invalid: unknown size suffix 'q'");

    /* NULL default = required: an error until some source sets it. */
    kvd_config_field_t required[] = {
        {"bt.n", NULL, "n", kvd_config_parse_int, offsetof(small_t, n), 0, 0,
         NULL},
    };
    assert_int_equal(kvd_config_apply(NULL, required, 1, &s, err, 256),
                     KVD_ERR_NOT_FOUND);
    assert_non_null(strstr(err, "bt.n: required setting has no value"));
    assert_non_null(strstr(err, "KVDEPOT_BT_N"));
    setenv("KVDEPOT_BT_N", "0x20", 1);
    assert_int_equal(kvd_config_apply(NULL, required, 1, &s, err, 256), KVD_OK);
    assert_true(s.n == 32);
    unsetenv("KVDEPOT_BT_N");

    kvd_config_field_t no_parser[] = {{"bt.n", "1", "n", NULL, 0, 0, 0, NULL}};
    assert_int_equal(kvd_config_apply(NULL, no_parser, 1, &s, err, 256),
                     KVD_ERR_INVALID);
    kvd_config_field_t no_name[] = {
        {NULL, "1", "n", kvd_config_parse_int, 0, 0, 0, NULL}};
    assert_int_equal(kvd_config_apply(NULL, no_name, 1, &s, err, 256),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_config_apply(NULL, NULL, 1, &s, err, 256),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_config_apply(NULL, required, 1, NULL, err, 256),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_config_apply(NULL, NULL, 0, &s, err, 256), KVD_OK);

    /* Dashes become underscores in env names. */
    kvd_config_field_t dashed[] = {
        {"bt.max-n", "1", "n", kvd_config_parse_int, offsetof(small_t, n), 0, 0,
         NULL},
    };
    setenv("KVDEPOT_BT_MAX_N", "-9", 1);
    assert_int_equal(kvd_config_apply(NULL, dashed, 1, &s, err, 256), KVD_OK);
    assert_true(s.n == -9);
    unsetenv("KVDEPOT_BT_MAX_N");
}

/* ------------------------------------------------------------------------ */
/* Threads                                                                  */
/* ------------------------------------------------------------------------ */

static void *set_thread(void *arg)
{
    kvd_config_t *config = arg;
    char value[16];
    for (int i = 0; i < 500; i++) {
        snprintf(value, sizeof(value), "%d", i % 50);
        if (kvd_config_set(config, "tst.count", value) != KVD_OK) {
            return (void *)1;
        }
    }
    return NULL;
}

static void test_concurrent_set_apply(void **state)
{
    (void)state;
    kvd_config_t *config = config_new();
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, set_thread, config), 0);
    for (int i = 0; i < 500; i++) {
        sample_t s;
        assert_int_equal(apply(config, &s, NULL, 0), KVD_OK);
        assert_true(s.count == 7 || (s.count >= 0 && s.count < 50));
    }
    void *ret;
    assert_int_equal(pthread_join(t, &ret), 0);
    assert_null(ret);
    kvd_config_destroy(config);
}

/* A program that knows all its sections refuses a key of any other (a
 * misspelt section would otherwise pass as another component's). */
static void test_check_sections(void **state)
{
    (void)state;
    static const char *const sections[] = {"store", "server", NULL};
    kvd_config_t *config = NULL;
    char err[256] = "";
    assert_int_equal(kvd_config_create(&config), KVD_OK);
    assert_int_equal(
        kvd_config_check_sections(config, sections, err, sizeof err), KVD_OK);
    static const char yaml[] = "store:\n  arena_size: 1g\n"
                               "servr:\n  threads: 2\n";
    assert_int_equal(
        kvd_config_load_yaml(config, yaml, strlen(yaml), err, sizeof err),
        KVD_OK);
    assert_int_equal(
        kvd_config_check_sections(config, sections, err, sizeof err),
        KVD_ERR_NOT_FOUND);
    assert_non_null(strstr(err, "servr.threads"));
    assert_non_null(strstr(err, "no section 'servr'"));
    kvd_config_destroy(config);
    assert_int_equal(kvd_config_create(&config), KVD_OK);
    assert_int_equal(kvd_config_set(config, "serverx", "1"), KVD_OK);
    assert_int_equal(
        kvd_config_check_sections(config, sections, err, sizeof err),
        KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_config_check_sections(config, NULL, err, sizeof err),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_config_check_sections(NULL, sections, err, sizeof err),
                     KVD_OK);
    kvd_config_destroy(config);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_sections),
        cmocka_unit_test_setup(test_create_set_errors, setup),
        cmocka_unit_test_setup(test_defaults, setup),
        cmocka_unit_test_setup(test_precedence, setup),
        cmocka_unit_test_setup(test_apply_error_text, setup),
        cmocka_unit_test_setup(test_apply_unknown_keys, setup),
        cmocka_unit_test_setup(test_apply_bad_table, setup),
        cmocka_unit_test_setup(test_concurrent_set_apply, setup),
    };
    /* Expected errors are logged; keep them off the test output. */
    kvd_log_set_level(KVD_LOG_LEVEL_OFF);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
