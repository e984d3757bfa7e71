/*
 * Configuration from YAML (common/config_int.h): block and flow mappings,
 * dotted keys and quoting joined into the same flat names, later loads
 * replacing earlier keys and a failed load changing nothing, empty
 * documents, every refused construct with its line number (nested lists,
 * anchors, aliases, tags, duplicate keys, bad bytes), the nesting and
 * key-length bounds, the error logged, and files, whose names appear in
 * load and apply errors.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvd_testconfig_int.h"

/* ------------------------------------------------------------------------ */
/* YAML                                                                     */
/* ------------------------------------------------------------------------ */

/* Expects `yaml` to be rejected as KVD_ERR_INVALID with an error naming
 * `line` and containing `needle`. */
static void load_bad(const char *yaml, size_t len, unsigned line,
                     const char *needle)
{
    kvd_config_t *config = config_new();
    char err[256] = "";
    assert_int_equal(kvd_config_load_yaml(config, yaml, len, err, sizeof(err)),
                     KVD_ERR_INVALID);
    char where[32];
    snprintf(where, sizeof(where), "<yaml>:%u: ", line);
    if (strstr(err, where) == NULL || strstr(err, needle) == NULL) {
        fail_msg("error '%s' lacks '%s' or '%s'", err, where, needle);
    }
    kvd_config_destroy(config);
}

static void test_yaml_nesting(void **state)
{
    (void)state;
    kvd_config_t *config = config_new();
    sample_t s;
    char err[256] = "";
    /* A list of lists is refused even under other components' keys. */
    char e2[256] = "";
    const char *with_seq = "other:\n  thing: [[1]]\n";
    assert_int_equal(kvd_config_load_yaml(config, with_seq, strlen(with_seq),
                                          e2, sizeof(e2)),
                     KVD_ERR_INVALID);
    assert_string_equal(e2, "<yaml>:2: a list of 'other.thing' holds a list "
                            "(lists hold scalars only)");
    kvd_config_destroy(config);

    /* Block nesting, dotted keys, flow mappings and quoting all join to the
     * same flat names. */
    config = config_new();
    load(config, "# settings\n"
                 "tst:\n"
                 "  store: {arena_size: '16m'}\n"
                 "  flag: yes\n"
                 "tst.timeout: 250ms\n"
                 "other: {x: {y: 1}}\n");
    load(config, "{tst.mode: paranoid, tst.name: \"a b\"}");
    assert_int_equal(apply(config, &s, err, sizeof(err)), KVD_OK);
    assert_true(s.flag);
    assert_true(s.arena_bytes == 16ull << 20);
    assert_true(s.timeout_ms == 250);
    assert_int_equal(s.mode, 2);
    assert_string_equal(s.name, "a b");

    /* Later loads replace keys loaded earlier. */
    load(config, "tst: {timeout: 1s}\n");
    assert_int_equal(apply(config, &s, err, sizeof(err)), KVD_OK);
    assert_true(s.timeout_ms == 1000);
    assert_true(s.arena_bytes == 16ull << 20);

    /* A failed load changes nothing. */
    const char *bad = "tst: {timeout: 9s}\nx: [[1]]\n";
    assert_int_equal(
        kvd_config_load_yaml(config, bad, strlen(bad), err, sizeof(err)),
        KVD_ERR_INVALID);
    assert_int_equal(apply(config, &s, err, sizeof(err)), KVD_OK);
    assert_true(s.timeout_ms == 1000);
    kvd_config_destroy(config);
}

static void test_yaml_empty(void **state)
{
    (void)state;
    static const char *const empties[] = {
        "", "\n", "# only a comment\n", "---\n", "---\n...\n", "{}"};
    for (size_t i = 0; i < sizeof(empties) / sizeof(empties[0]); i++) {
        kvd_config_t *config = config_new();
        load(config, empties[i]);
        sample_t s;
        assert_int_equal(apply(config, &s, NULL, 0), KVD_OK);
        assert_true(s.count == 7);
        kvd_config_destroy(config);
    }
    kvd_config_t *config = config_new();
    char err[64];
    assert_int_equal(kvd_config_load_yaml(config, NULL, 0, err, sizeof(err)),
                     KVD_OK);
    assert_int_equal(kvd_config_load_yaml(config, NULL, 3, err, sizeof(err)),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_config_load_yaml(NULL, "a: 1", 4, NULL, 0),
                     KVD_ERR_INVALID);
    kvd_config_destroy(config);
}

static void test_yaml_errors(void **state)
{
    (void)state;
    load_bad("tst:\n  count: [1, [2]]\n", 22, 2,
             "a list of 'tst.count' holds a list");
    load_bad("- a\n- b\n", 8, 1, "the top level must be a mapping");
    load_bad("a: 1\nb: &anchor 2\n", 18, 2, "anchors are not supported");
    load_bad("a: &m {x: 1}\n", 13, 1, "anchors are not supported");
    load_bad("a: 1\nb: *x\n", 11, 2, "aliases are not supported ('*x')");
    load_bad("x: &a 1\ny: *a\n", 14, 1, "anchors are not supported");
    load_bad("a:\n  b: 1\n  c: !!str 2\n", 23, 3, "tags are not supported");
    load_bad("a: !custom {x: 1}\n", 18, 1, "tags are not supported");
    load_bad("tst:\n  count: 1\ntst.count: 2\n", 29, 3,
             "duplicate key 'tst.count' (first set on line 2)");
    load_bad("a: 1\na: 2\n", 10, 2, "duplicate key 'a'");
    load_bad("hello\n", 6, 1, "the top level must be a mapping");
    load_bad("a: b: c\n", 8, 1, "mapping values are not allowed");
    load_bad("a: 1\n---\nb: 2\n", 14, 2, "more than one YAML document");
    load_bad("? {a: 1}\n: 2\n", 13, 1, "mapping keys must be scalars");
    load_bad("? [a]\n: 2\n", 10, 1, "mapping keys must be scalars");
    load_bad("\"\": 1\n", 6, 1, "empty key");
    load_bad("a: \"x\\0y\"\n", 10, 1, "NUL byte in a value");
    load_bad("\"k\\0\": 1\n", 9, 1, "NUL byte in a key");
    load_bad("a: \"unterminated\n", 17, 2, "found unexpected end of stream");
    load_bad("a: 1\n\tb: 2\n", 11, 2, "");
    const char utf8[] = "a: \xff\xfe\n";
    load_bad(utf8, sizeof(utf8) - 1, 1, "invalid");
    const char nul[] = "a: 1\0b: 2\n";
    load_bad(nul, sizeof(nul) - 1, 1, "");
}

static void test_yaml_bounds(void **state)
{
    (void)state;
    /* 16 nested mappings are fine, 17 are not. */
    char yaml[1024];
    size_t n = 0;
    for (int depth = 1; depth <= 17; depth++) {
        n += (size_t)snprintf(yaml + n, sizeof(yaml) - n, "{k%d: ", depth);
    }
    char *inner = yaml + n;
    kvd_config_t *config = config_new();
    char err[256];
    snprintf(inner, sizeof(yaml) - n, "v}}}}}}}}}}}}}}}}}");
    assert_int_equal(
        kvd_config_load_yaml(config, yaml, strlen(yaml), err, sizeof(err)),
        KVD_ERR_INVALID);
    assert_non_null(strstr(err, "nested deeper than 16 levels"));
    /* Drop the outermost level. */
    const char *sixteen = yaml + strlen("{k1: ");
    size_t len = strlen(sixteen) - 1;
    assert_int_equal(
        kvd_config_load_yaml(config, sixteen, len, err, sizeof(err)), KVD_OK);
    kvd_config_destroy(config);

    /* Joined keys up to 256 bytes. */
    char key[400];
    memset(key, 'k', sizeof(key));
    config = config_new();
    snprintf(yaml, sizeof(yaml), "a:\n  %.254s: 1\n", key); /* 256 */
    load(config, yaml);
    snprintf(yaml, sizeof(yaml), "a:\n  %.255s: 1\n", key); /* 257 */
    assert_int_equal(
        kvd_config_load_yaml(config, yaml, strlen(yaml), err, sizeof(err)),
        KVD_ERR_INVALID);
    assert_string_equal(err, "<yaml>:2: key longer than 256 bytes");
    kvd_config_destroy(config);
}

static void test_yaml_error_is_logged(void **state)
{
    (void)state;
    kvd_log_set_sink(capture_sink, NULL);
    kvd_log_level_t old = kvd_log_get_level();
    kvd_log_set_level(KVD_LOG_LEVEL_ERROR);
    kvd_config_t *config = config_new();
    const char *yaml = "a: 1\nb:\n  - [x]\n";
    assert_int_equal(kvd_config_load_yaml(config, yaml, strlen(yaml), NULL, 0),
                     KVD_ERR_INVALID);
    assert_int_equal(num_logs, 1);
    assert_string_equal(last_log, "config <yaml>:3: a list of 'b' holds a "
                                  "list (lists hold scalars only)");
    kvd_config_destroy(config);
    kvd_log_set_level(old);
    kvd_log_set_sink(NULL, NULL);
}

static void test_load_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvd_test_config_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof(path), "%s/kvdepot.yaml", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("tst:\n  count: 42\n  mode: fast\n", f);
    fclose(f);

    kvd_config_t *config = config_new();
    char err[256] = "";
    assert_int_equal(kvd_config_load_file(config, path, err, sizeof(err)),
                     KVD_OK);
    sample_t s;
    assert_int_equal(apply(config, &s, err, sizeof(err)), KVD_OK);
    assert_true(s.count == 42);
    assert_int_equal(s.mode, 0);

    /* The file name and line appear in apply errors. */
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("tst:\n  count: 420\n", f);
    fclose(f);
    assert_int_equal(kvd_config_load_file(config, path, err, sizeof(err)),
                     KVD_OK);
    assert_int_equal(apply(config, &s, err, sizeof(err)), KVD_ERR_RANGE);
    char want[256];
    snprintf(want, sizeof(want),
             "tst.count='420' (from file %s:2): 420 is above the maximum "
             "100",
             path);
    assert_string_equal(err, want);

    /* And in load errors. */
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("tst:\n  count: 1\n  count: 2\n", f);
    fclose(f);
    assert_int_equal(kvd_config_load_file(config, path, err, sizeof(err)),
                     KVD_ERR_INVALID);
    snprintf(want, sizeof(want),
             "%s:3: duplicate key 'tst.count' (first set on line 2)", path);
    assert_string_equal(err, want);

    char missing[160];
    snprintf(missing, sizeof(missing), "%s/nope.yaml", dir);
    assert_int_equal(kvd_config_load_file(config, missing, err, sizeof(err)),
                     KVD_ERR_NOT_FOUND);
    assert_non_null(strstr(err, "nope.yaml"));
    assert_non_null(strstr(err, strerror(ENOENT)));
    assert_int_equal(kvd_config_load_file(config, dir, err, sizeof(err)),
                     KVD_ERR_IO);
    assert_int_equal(kvd_config_load_file(config, NULL, err, sizeof(err)),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_config_load_file(NULL, path, NULL, 0),
                     KVD_ERR_INVALID);
    kvd_config_destroy(config);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_yaml_nesting, setup),
        cmocka_unit_test_setup(test_yaml_empty, setup),
        cmocka_unit_test_setup(test_yaml_errors, setup),
        cmocka_unit_test_setup(test_yaml_bounds, setup),
        cmocka_unit_test_setup(test_yaml_error_is_logged, setup),
        cmocka_unit_test_setup(test_load_file, setup),
    };
    /* Expected errors are logged; keep them off the test output. */
    kvd_log_set_level(KVD_LOG_LEVEL_OFF);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
