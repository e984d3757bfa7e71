/*
 * Configuration: every value parser (valid, invalid, edge), YAML loading
 * and its errors with line numbers, the precedence call > env > file >
 * default, unknown-key detection, bad defaults and --print-config output.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/config_int.h"
#include "kvdepot/common.h"

/* ------------------------------------------------------------------------ */
/* Fixtures                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct sample {
    bool flag;
    int64_t count;
    uint64_t arena_bytes;
    uint64_t timeout_ms;
    char name[KVD_CONFIG_STRING_MAX];
    int mode;
} sample_t;

static const char *const modes[] = {"fast", "safe", "paranoid", NULL};

static const kvd_config_field_t table[] = {
    {"tst.flag", "false", "a flag", kvd_config_parse_bool,
     offsetof(sample_t, flag), 0, 0, NULL},
    {"tst.count", "7", "a count", kvd_config_parse_int,
     offsetof(sample_t, count), -10, 100, NULL},
    {"tst.store.arena_size", "1g", "arena bytes", kvd_config_parse_size,
     offsetof(sample_t, arena_bytes), 0, 0, NULL},
    {"tst.timeout", "5s", "a timeout", kvd_config_parse_duration_ms,
     offsetof(sample_t, timeout_ms), 0, 0, NULL},
    {"tst.name", "kvd", "a name", kvd_config_parse_string,
     offsetof(sample_t, name), 0, 0, NULL},
    {"tst.mode", "safe", "a mode", kvd_config_parse_enum,
     offsetof(sample_t, mode), 0, 0, modes},
};
#define NUM_FIELDS (sizeof(table) / sizeof(table[0]))

static const char *const env_names[] = {
    "KVDEPOT_TST_FLAG",    "KVDEPOT_TST_COUNT", "KVDEPOT_TST_STORE_ARENA_SIZE",
    "KVDEPOT_TST_TIMEOUT", "KVDEPOT_TST_NAME",  "KVDEPOT_TST_MODE",
};

/* Log capture: keeps the last message so tests can check what was logged
 * (and keeps expected errors off stderr). */
static char last_log[2048];
static int num_logs;

static void capture_sink(void *arg, kvd_log_level_t level, const char *file,
                         int line, const char *msg)
{
    (void)arg;
    (void)level;
    (void)file;
    (void)line;
    snprintf(last_log, sizeof(last_log), "%s", msg);
    num_logs++;
}

static int setup(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(env_names) / sizeof(env_names[0]); i++) {
        unsetenv(env_names[i]);
    }
    last_log[0] = '\0';
    num_logs = 0;
    return 0;
}

static kvd_config_t *config_new(void)
{
    kvd_config_t *config = NULL;
    assert_int_equal(kvd_config_create(&config), KVD_OK);
    assert_non_null(config);
    return config;
}

static void load(kvd_config_t *config, const char *yaml)
{
    char err[256] = "";
    kvd_status_t st =
        kvd_config_load_yaml(config, yaml, strlen(yaml), err, sizeof(err));
    if (st != KVD_OK) {
        fail_msg("load failed: %s", err);
    }
}

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

static kvd_status_t apply(const kvd_config_t *config, sample_t *s, char *err,
                          size_t err_len)
{
    memset(s, 0xA5, sizeof(*s));
    return kvd_config_apply(config, table, NUM_FIELDS, s, err, err_len);
}

/* ------------------------------------------------------------------------ */
/* Parsers                                                                  */
/* ------------------------------------------------------------------------ */

static void test_parse_bool(void **state)
{
    (void)state;
    static const char *const yes[] = {"true", "TRUE", "Yes",
                                      "on",   "1",    " yes\t"};
    static const char *const no[] = {"false", "False", "NO",
                                     "off",   "0",     "\toff "};
    char err[128];
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        bool v = false;
        assert_int_equal(kvd_config_parse_bool(NULL, yes[i], &v, err, 128),
                         KVD_OK);
        assert_true(v);
        v = true;
        assert_int_equal(kvd_config_parse_bool(NULL, no[i], &v, err, 128),
                         KVD_OK);
        assert_false(v);
    }
    static const char *const bad[] = {"", "  ", "2", "truee", "y", "o", "-1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        bool v = true;
        err[0] = '\0';
        assert_int_equal(kvd_config_parse_bool(NULL, bad[i], &v, err, 128),
                         KVD_ERR_INVALID);
        assert_true(v); /* untouched on error */
        assert_non_null(strstr(err, "not a boolean"));
    }
    bool v;
    assert_int_equal(kvd_config_parse_bool(NULL, NULL, &v, err, 128),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_config_parse_bool(NULL, "true", NULL, NULL, 0),
                     KVD_ERR_INVALID);
}

static kvd_status_t parse_int(int64_t min, int64_t max, const char *text,
                              int64_t *out, char *err)
{
    kvd_config_field_t f = {.name = "i", .min = min, .max = max};
    *out = 12345;
    return kvd_config_parse_int(&f, text, out, err, 128);
}

static void test_parse_int(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int64_t value;
    } ok[] = {
        {"42", 42},
        {"-42", -42},
        {"+7", 7},
        {"0", 0},
        {" 12 ", 12},
        {"010", 10},
        {"0x1F", 31},
        {"0XfF", 255},
        {"-0x10", -16},
        {"9223372036854775807", INT64_MAX},
        {"-9223372036854775808", INT64_MIN},
        {"0x7fffffffffffffff", INT64_MAX},
        {"-0x8000000000000000", INT64_MIN},
    };
    char err[128];
    int64_t v;
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        assert_int_equal(parse_int(0, 0, ok[i].text, &v, err), KVD_OK);
        assert_true(v == ok[i].value);
    }
    static const char *const range[] = {
        "9223372036854775808", "-9223372036854775809", "0x8000000000000000",
        "0xFFFFFFFFFFFFFFFF", "99999999999999999999999999"};
    for (size_t i = 0; i < sizeof(range) / sizeof(range[0]); i++) {
        assert_int_equal(parse_int(0, 0, range[i], &v, err), KVD_ERR_RANGE);
        assert_true(v == 12345);
        assert_non_null(strstr(err, "64 bits"));
    }
    static const char *const bad[] = {"",    " ",   "0x",  "12a",  "1.5",
                                      "--1", "+-1", "1 2", "0x1g", "1e3"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(parse_int(0, 0, bad[i], &v, err), KVD_ERR_INVALID);
        assert_true(v == 12345);
    }
    /* Range: [min, max] inclusive; max 0 = no upper bound; both 0 =
     * unbounded. */
    assert_int_equal(parse_int(-10, 100, "-10", &v, err), KVD_OK);
    assert_true(v == -10);
    assert_int_equal(parse_int(-10, 100, "100", &v, err), KVD_OK);
    assert_true(v == 100);
    assert_int_equal(parse_int(-10, 100, "101", &v, err), KVD_ERR_RANGE);
    assert_string_equal(err, "101 is above the maximum 100");
    assert_int_equal(parse_int(-10, 100, "-11", &v, err), KVD_ERR_RANGE);
    assert_string_equal(err, "-11 is below the minimum -10");
    assert_int_equal(parse_int(5, 0, "1000000000", &v, err), KVD_OK);
    assert_int_equal(parse_int(5, 0, "4", &v, err), KVD_ERR_RANGE);
    assert_int_equal(parse_int(0, 0, "-5", &v, err), KVD_OK);
    assert_true(v == -5);
    /* NULL field = unbounded; NULL text/dst rejected. */
    assert_int_equal(kvd_config_parse_int(NULL, "-3", &v, NULL, 0), KVD_OK);
    assert_true(v == -3);
    assert_int_equal(kvd_config_parse_int(NULL, NULL, &v, err, 128),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_config_parse_int(NULL, "1", NULL, err, 128),
                     KVD_ERR_INVALID);
}

static void test_parse_size(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        uint64_t bytes;
    } ok[] = {
        {"0", 0},
        {"4096", 4096},
        {"4096b", 4096},
        {"4096B", 4096},
        {"1k", 1024},
        {"1K", 1024},
        {"1kb", 1024},
        {"1KB", 1024},
        {"1kib", 1024},
        {"512KiB", 524288},
        {"1m", 1048576},
        {"3MiB", 3145728},
        {"64g", 64ull << 30},
        {"64GB", 64ull << 30},
        {"2t", 2ull << 40},
        {"2Tib", 2ull << 40},
        {" 8m\t", 8ull << 20},
        {"1.5g", 3ull << 29},
        {"0.5k", 512},
        {"2.0", 2},
        {"2.000b", 2},
        {"0.0009765625k", 1},
        {"16777215t", 16777215ull << 40},
        {"18446744073709551615", UINT64_MAX},
        {"0g", 0},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        uint64_t v = 1;
        if (kvd_parse_size(ok[i].text, &v) != KVD_OK || v != ok[i].bytes) {
            fail_msg("'%s' -> %llu", ok[i].text, (unsigned long long)v);
        }
    }
    static const struct {
        const char *text;
        kvd_status_t st;
        const char *reason;
    } bad[] = {
        {"8x", KVD_ERR_INVALID, "unknown size suffix 'x'"},
        {"8kx", KVD_ERR_INVALID, "unknown size suffix 'kx'"},
        {"8ibk", KVD_ERR_INVALID, "unknown size suffix 'ibk'"},
        {"8 k", KVD_ERR_INVALID, "unknown size suffix ' k'"},
        {"1e3", KVD_ERR_INVALID, "unknown size suffix 'e3'"},
        {"k", KVD_ERR_INVALID, "expected a number"},
        {".5k", KVD_ERR_INVALID, "expected a number"},
        {"+5", KVD_ERR_INVALID, "expected a number"},
        {"", KVD_ERR_INVALID, "empty value"},
        {"   ", KVD_ERR_INVALID, "empty value"},
        {"1.", KVD_ERR_INVALID, "expected digits after '.'"},
        {"1.1k", KVD_ERR_INVALID, "not a whole number of bytes"},
        {"1.5", KVD_ERR_INVALID, "not a whole number of bytes"},
        {"1.5b", KVD_ERR_INVALID, "not a whole number of bytes"},
        {"1.0000000000001t", KVD_ERR_INVALID, "fraction digits"},
        {"-1", KVD_ERR_RANGE, "negative"},
        {"-1k", KVD_ERR_RANGE, "negative"},
        {"16777216t", KVD_ERR_RANGE, "64 bits"},
        {"18446744073709551616", KVD_ERR_RANGE, "too large"},
        {"17179869184g", KVD_ERR_RANGE, "64 bits"},
        {"16777215.9999999999t", KVD_ERR_INVALID, "whole"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t v = 77;
        char err[128] = "";
        kvd_status_t st =
            kvd_config_parse_size(NULL, bad[i].text, &v, err, sizeof(err));
        if (st != bad[i].st || strstr(err, bad[i].reason) == NULL || v != 77) {
            fail_msg("'%s' -> %d '%s'", bad[i].text, st, err);
        }
        assert_int_equal(kvd_parse_size(bad[i].text, &v), bad[i].st);
    }
    /* 16777215.5t = (2^24 - 0.5) * 2^40 fits; the sum overflow is caught
     * once the whole part is at the limit. */
    uint64_t v;
    assert_int_equal(kvd_parse_size("16777215.5t", &v), KVD_OK);
    assert_true(v == (16777215ull << 40) + (1ull << 39));
    assert_int_equal(kvd_parse_size("18446744073709551615.5", &v),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_parse_size(NULL, &v), KVD_ERR_INVALID);
    assert_int_equal(kvd_parse_size("1", NULL), KVD_ERR_INVALID);

    /* Field range on sizes. */
    kvd_config_field_t f = {.name = "s", .min = 4096, .max = 1 << 30};
    char err[128];
    assert_int_equal(kvd_config_parse_size(&f, "1k", &v, err, sizeof(err)),
                     KVD_ERR_RANGE);
    assert_string_equal(err, "1024 is below the minimum 4096");
    assert_int_equal(kvd_config_parse_size(&f, "2g", &v, err, sizeof(err)),
                     KVD_ERR_RANGE);
    assert_int_equal(kvd_config_parse_size(&f, "1g", &v, err, sizeof(err)),
                     KVD_OK);
    assert_true(v == 1u << 30);
    assert_int_equal(kvd_config_parse_size(&f, "1g", NULL, err, sizeof(err)),
                     KVD_ERR_INVALID);
}

static void test_parse_duration(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        uint64_t ms;
    } ok[] = {
        {"0", 0},
        {"500", 500},
        {"500ms", 500},
        {"2s", 2000},
        {"2S", 2000},
        {"1m", 60000},
        {"1h", 3600000},
        {"1.5s", 1500},
        {"0.5m", 30000},
        {"0.001s", 1},
        {"1000us", 1},
        {"5000000ns", 5},
        {"0ns", 0},
        {" 3s ", 3000},
        {"2.50h", 9000000},
        {"18446744073709551615", UINT64_MAX},
        {"18446744073709551615ms", UINT64_MAX},
        {"5124095576030h", 5124095576030ull * 3600000ull},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        uint64_t v = 1;
        if (kvd_parse_duration_ms(ok[i].text, &v) != KVD_OK || v != ok[i].ms) {
            fail_msg("'%s' -> %llu", ok[i].text, (unsigned long long)v);
        }
    }
    static const struct {
        const char *text;
        kvd_status_t st;
        const char *reason;
    } bad[] = {
        {"1500us", KVD_ERR_INVALID, "whole number of milliseconds"},
        {"1.5ms", KVD_ERR_INVALID, "whole number of milliseconds"},
        {"1.5", KVD_ERR_INVALID, "whole number of milliseconds"},
        {"1ns", KVD_ERR_INVALID, "whole number of milliseconds"},
        {"1000.5us", KVD_ERR_INVALID, "whole number of milliseconds"},
        {"0.0001s", KVD_ERR_INVALID, "whole number of milliseconds"},
        {"0.0000001h", KVD_ERR_INVALID, "whole number of milliseconds"},
        {"10d", KVD_ERR_INVALID, "unknown duration unit 'd'"},
        {"5 s", KVD_ERR_INVALID, "unknown duration unit ' s'"},
        {"5sec", KVD_ERR_INVALID, "unknown duration unit 'sec'"},
        {"s", KVD_ERR_INVALID, "expected a number"},
        {"", KVD_ERR_INVALID, "empty value"},
        {"-1s", KVD_ERR_RANGE, "negative"},
        {"18446744073709551615s", KVD_ERR_RANGE, "64 bits"},
        {"5124095576031h", KVD_ERR_RANGE, "64 bits"},
        {"18446744073709551616", KVD_ERR_RANGE, "too large"},
        {"18446744073709551615.5s", KVD_ERR_RANGE, "64 bits"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t v = 77;
        char err[128] = "";
        kvd_status_t st = kvd_config_parse_duration_ms(NULL, bad[i].text, &v,
                                                       err, sizeof(err));
        if (st != bad[i].st || strstr(err, bad[i].reason) == NULL || v != 77) {
            fail_msg("'%s' -> %d '%s'", bad[i].text, st, err);
        }
        assert_int_equal(kvd_parse_duration_ms(bad[i].text, &v), bad[i].st);
    }
    uint64_t v;
    kvd_config_field_t f = {.name = "d", .min = 10, .max = 60000};
    char err[128];
    assert_int_equal(
        kvd_config_parse_duration_ms(&f, "2m", &v, err, sizeof(err)),
        KVD_ERR_RANGE);
    assert_string_equal(err, "120000 is above the maximum 60000");
    assert_int_equal(
        kvd_config_parse_duration_ms(&f, "1m", &v, err, sizeof(err)), KVD_OK);
    assert_true(v == 60000);
    assert_int_equal(kvd_parse_duration_ms(NULL, &v), KVD_ERR_INVALID);
    assert_int_equal(kvd_parse_duration_ms("1s", NULL), KVD_ERR_INVALID);
    assert_int_equal(
        kvd_config_parse_duration_ms(&f, "1s", NULL, err, sizeof(err)),
        KVD_ERR_INVALID);
}

static void test_parse_string(void **state)
{
    (void)state;
    char dst[KVD_CONFIG_STRING_MAX];
    char err[128];
    assert_int_equal(kvd_config_parse_string(NULL, "hello", dst, err, 128),
                     KVD_OK);
    assert_string_equal(dst, "hello");
    assert_int_equal(kvd_config_parse_string(NULL, " a b ", dst, err, 128),
                     KVD_OK);
    assert_string_equal(dst, " a b "); /* strings are verbatim */
    assert_int_equal(kvd_config_parse_string(NULL, "", dst, err, 128), KVD_OK);
    assert_string_equal(dst, "");

    char text[KVD_CONFIG_STRING_MAX + 1];
    memset(text, 'x', KVD_CONFIG_STRING_MAX - 1);
    text[KVD_CONFIG_STRING_MAX - 1] = '\0';
    assert_int_equal(kvd_config_parse_string(NULL, text, dst, err, 128),
                     KVD_OK);
    assert_int_equal(strlen(dst), KVD_CONFIG_STRING_MAX - 1);
    text[KVD_CONFIG_STRING_MAX - 1] = 'x';
    text[KVD_CONFIG_STRING_MAX] = '\0';
    snprintf(dst, sizeof(dst), "keep");
    assert_int_equal(kvd_config_parse_string(NULL, text, dst, err, 128),
                     KVD_ERR_RANGE);
    assert_string_equal(dst, "keep");
    assert_string_equal(err, "string of 256 bytes is longer than 255");
    assert_int_equal(kvd_config_parse_string(NULL, NULL, dst, err, 128),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_config_parse_string(NULL, "a", NULL, NULL, 0),
                     KVD_ERR_INVALID);
}

static void test_parse_enum(void **state)
{
    (void)state;
    kvd_config_field_t f = {.name = "e", .choices = modes};
    int v = -1;
    char err[128];
    assert_int_equal(kvd_config_parse_enum(&f, "fast", &v, err, 128), KVD_OK);
    assert_int_equal(v, 0);
    assert_int_equal(kvd_config_parse_enum(&f, " paranoid ", &v, err, 128),
                     KVD_OK);
    assert_int_equal(v, 2);
    v = -1;
    assert_int_equal(kvd_config_parse_enum(&f, "Fast", &v, err, 128),
                     KVD_ERR_INVALID);
    assert_int_equal(v, -1);
    assert_string_equal(err, "not one of: fast safe paranoid");
    assert_int_equal(kvd_config_parse_enum(&f, "", &v, err, 128),
                     KVD_ERR_INVALID);
    /* A short buffer is cut, never overrun. */
    char small[16];
    memset(small, 'Z', sizeof(small));
    assert_int_equal(kvd_config_parse_enum(&f, "x", &v, small, 12),
                     KVD_ERR_INVALID);
    assert_string_equal(small, "not one of:");
    assert_int_equal(small[12], 'Z');
    assert_int_equal(kvd_config_parse_enum(&f, "x", &v, small, 14),
                     KVD_ERR_INVALID);
    assert_string_equal(small, "not one of: f");
    assert_int_equal(kvd_config_parse_enum(&f, "x", &v, NULL, 0),
                     KVD_ERR_INVALID);
    kvd_config_field_t nochoice = {.name = "e"};
    assert_int_equal(kvd_config_parse_enum(&nochoice, "fast", &v, err, 128),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_config_parse_enum(NULL, "fast", &v, err, 128),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_config_parse_enum(&f, NULL, &v, err, 128),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_config_parse_enum(&f, "fast", NULL, err, 128),
                     KVD_ERR_INVALID);
}

/* ------------------------------------------------------------------------ */
/* Config object, YAML                                                      */
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

static void test_yaml_nesting(void **state)
{
    (void)state;
    kvd_config_t *config = config_new();
    sample_t s;
    char err[256] = "";
    /* Sequences are refused even under other components' keys. */
    char e2[256] = "";
    const char *with_seq = "other:\n  thing: [1]\n";
    assert_int_equal(kvd_config_load_yaml(config, with_seq, strlen(with_seq),
                                          e2, sizeof(e2)),
                     KVD_ERR_INVALID);
    assert_string_equal(
        e2, "<yaml>:2: sequences are not supported (key 'other.thing')");
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
    const char *bad = "tst: {timeout: 9s}\nx: [1]\n";
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
    load_bad("tst:\n  count: [1, 2]\n", 20, 2,
             "sequences are not supported (key 'tst.count')");
    load_bad("- a\n- b\n", 8, 1, "sequences are not supported");
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
    load_bad("? [a]\n: 2\n", 10, 1, "sequences are not supported");
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
    const char *yaml = "a: 1\nb:\n  - x\n";
    assert_int_equal(kvd_config_load_yaml(config, yaml, strlen(yaml), NULL, 0),
                     KVD_ERR_INVALID);
    assert_int_equal(num_logs, 1);
    assert_string_equal(last_log, "config <yaml>:3: sequences are not "
                                  "supported (key 'b')");
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
        cmocka_unit_test_setup(test_parse_bool, setup),
        cmocka_unit_test_setup(test_parse_int, setup),
        cmocka_unit_test_setup(test_parse_size, setup),
        cmocka_unit_test_setup(test_parse_duration, setup),
        cmocka_unit_test_setup(test_parse_string, setup),
        cmocka_unit_test_setup(test_parse_enum, setup),
        cmocka_unit_test_setup(test_create_set_errors, setup),
        cmocka_unit_test_setup(test_defaults, setup),
        cmocka_unit_test_setup(test_precedence, setup),
        cmocka_unit_test_setup(test_yaml_nesting, setup),
        cmocka_unit_test_setup(test_yaml_empty, setup),
        cmocka_unit_test_setup(test_yaml_errors, setup),
        cmocka_unit_test_setup(test_yaml_bounds, setup),
        cmocka_unit_test_setup(test_yaml_error_is_logged, setup),
        cmocka_unit_test_setup(test_load_file, setup),
        cmocka_unit_test_setup(test_apply_error_text, setup),
        cmocka_unit_test_setup(test_apply_unknown_keys, setup),
        cmocka_unit_test_setup(test_apply_bad_table, setup),
        cmocka_unit_test_setup(test_print, setup),
        cmocka_unit_test_setup(test_visit, setup),
        cmocka_unit_test_setup(test_concurrent_set_apply, setup),
    };
    /* Expected errors are logged; keep them off the test output. */
    kvd_log_set_level(KVD_LOG_LEVEL_OFF);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
