/*
 * Printing a configuration (common/config_int.h): the --print-config
 * output with each value, its default and its source, a required setting
 * without a value, a stream that cannot be written, and kvd_config_visit
 * walking the same values in table order until a callback's error.
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

#include "kvd_testconfig_int.h"

/* ------------------------------------------------------------------------ */
/* Print                                                                    */
/* ------------------------------------------------------------------------ */

static void test_print(void **state)
{
    (void)state;
    kvd_config_t *config = config_new();
    load(config, "tst:\n  count: 9\n  timeout: 2s\n");
    setenv("KVDEPOT_TST_TIMEOUT", "3s", 1);
    assert_int_equal(kvd_config_set(config, "tst.mode", "fast"), KVD_OK);

    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    assert_non_null(out);
    assert_int_equal(kvd_config_print(config, table, NUM_FIELDS, out), KVD_OK);
    fclose(out);
    assert_string_equal(
        text, "tst.flag = false  # a flag (default: false, from: default)\n"
              "tst.count = 9  # a count (default: 7, from: file)\n"
              "tst.store.arena_size = 1g  # arena bytes (default: 1g, from: "
              "default)\n"
              "tst.timeout = 3s  # a timeout (default: 5s, from: env)\n"
              "tst.name = kvd  # a name (default: kvd, from: default)\n"
              "tst.mode = fast  # a mode (default: safe, from: call)\n");
    free(text);
    unsetenv("KVDEPOT_TST_TIMEOUT");

    kvd_config_field_t required[] = {
        {"bt.n", NULL, NULL, kvd_config_parse_int, 0, 0, 0, NULL},
    };
    out = open_memstream(&text, &len);
    assert_non_null(out);
    assert_int_equal(kvd_config_print(NULL, required, 1, out), KVD_OK);
    fclose(out);
    assert_string_equal(text, "bt.n =   #  (default: none, from: none)\n");
    free(text);

    assert_int_equal(kvd_config_print(config, table, NUM_FIELDS, NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_config_print(config, NULL, 2, stdout),
                     KVD_ERR_INVALID);
    /* A stream that cannot be written is an I/O error. */
    FILE *ro = fopen("/dev/null", "r");
    assert_non_null(ro);
    assert_int_equal(kvd_config_print(config, table, NUM_FIELDS, ro),
                     KVD_ERR_IO);
    fclose(ro);
    kvd_config_destroy(config);
}

/* kvd_config_visit: the same values and sources as print, in table order;
 * a callback's error stops the walk and comes back. */
typedef struct visit_log {
    char text[512];
    size_t calls, stop_after;
} visit_log_t;

static kvd_status_t visit_one(void *ctx, const kvd_config_field_t *field,
                              const char *value, const char *source)
{
    visit_log_t *v = ctx;
    size_t n = strlen(v->text);
    snprintf(v->text + n, sizeof v->text - n, "%s=%s/%s;", field->name, value,
             source);
    return ++v->calls == v->stop_after ? KVD_ERR_NOMEM : KVD_OK;
}

static void test_visit(void **state)
{
    (void)state;
    kvd_config_t *config = config_new();
    load(config, "tst:\n  count: 9\n");
    assert_int_equal(kvd_config_set(config, "tst.mode", "fast"), KVD_OK);
    visit_log_t v = {.stop_after = 0};
    assert_int_equal(kvd_config_visit(config, table, NUM_FIELDS, visit_one, &v),
                     KVD_OK);
    assert_string_equal(v.text, "tst.flag=false/default;tst.count=9/file;"
                                "tst.store.arena_size=1g/default;"
                                "tst.timeout=5s/default;tst.name=kvd/default;"
                                "tst.mode=fast/call;");
    visit_log_t stop = {.stop_after = 2};
    assert_int_equal(
        kvd_config_visit(config, table, NUM_FIELDS, visit_one, &stop),
        KVD_ERR_NOMEM);
    assert_int_equal(stop.calls, 2);
    assert_int_equal(kvd_config_visit(config, table, NUM_FIELDS, NULL, &v),
                     KVD_ERR_INVALID);
    kvd_config_destroy(config);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_print, setup),
        cmocka_unit_test_setup(test_visit, setup),
    };
    /* Expected errors are logged; keep them off the test output. */
    kvd_log_set_level(KVD_LOG_LEVEL_OFF);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
