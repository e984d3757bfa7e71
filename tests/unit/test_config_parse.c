/*
 * Configuration value parsers (common/config_int.h): booleans, integers
 * (decimal and hex, 64-bit limits, field ranges), sizes with suffixes and
 * fractions, durations with units, strings and enums; every valid, invalid
 * and edge input, the reason given, and the destination left untouched on
 * an error.
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_parse_bool, setup),
        cmocka_unit_test_setup(test_parse_int, setup),
        cmocka_unit_test_setup(test_parse_size, setup),
        cmocka_unit_test_setup(test_parse_duration, setup),
        cmocka_unit_test_setup(test_parse_string, setup),
        cmocka_unit_test_setup(test_parse_enum, setup),
    };
    /* Expected errors are logged; keep them off the test output. */
    kvd_log_set_level(KVD_LOG_LEVEL_OFF);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
