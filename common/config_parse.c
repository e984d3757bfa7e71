/*
 * Configuration value parsers: bool, int, size, duration, string and enum,
 * each turning one text into one settings-struct member with a reason on
 * failure (contract in include/kvdepot/common.h, "Configuration").
 *
 * Text rules: bool, int, size, duration and enum values ignore leading and
 * trailing whitespace (env values often carry a stray space); strings are
 * copied verbatim. Sizes and durations accept a decimal fraction ("1.5g",
 * "0.5s") when the result is a whole number of bytes / milliseconds, with
 * at most 12 significant fraction digits; ints do not (no octal either:
 * "010" is ten). Every value may be hostile (the fuzzer feeds these), so
 * all arithmetic is overflow-checked.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/config_int.h"
#include "kvdepot/common.h"

/* Fraction digits kept for sizes/durations: 10^12 * 3.6e6 fits uint64. */
#define KVD_CONFIG_FRAC_DIGITS_MAX 12

void kvd_config_err(char *err, size_t err_len, const char *fmt, ...)
{
    if (err == NULL || err_len == 0) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------ */
/* Value parsers                                                            */
/* ------------------------------------------------------------------------ */

static void text_trim(const char *text, const char **begin, const char **end)
{
    const char *b = text;
    const char *e = text + strlen(text);
    while (b < e && isspace((unsigned char)*b)) {
        b++;
    }
    while (e > b && isspace((unsigned char)e[-1])) {
        e--;
    }
    *begin = b;
    *end = e;
}

static bool range_equals(const char *b, const char *e, const char *word)
{
    size_t n = strlen(word);
    return (size_t)(e - b) == n && strncasecmp(b, word, n) == 0;
}

/* A non-negative decimal with an optional fraction: "12", "1.5", "2.50". */
typedef struct kvd_decimal {
    uint64_t whole;
    uint64_t frac;        /* fraction digits, trailing zeros removed */
    unsigned frac_digits; /* so the fraction is frac / 10^frac_digits */
} kvd_decimal_t;

static kvd_status_t decimal_scan(const char *b, const char *e,
                                 const char **stop, kvd_decimal_t *out,
                                 char *err, size_t err_len)
{
    const char *p = b;
    if (p < e && *p == '-') {
        kvd_config_err(err, err_len, "negative values are not allowed");
        return KVD_ERR_RANGE;
    }
    if (p == e || !isdigit((unsigned char)*p)) {
        kvd_config_err(err, err_len, "expected a number");
        return KVD_ERR_INVALID;
    }
    uint64_t whole = 0;
    for (; p < e && isdigit((unsigned char)*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (whole > (UINT64_MAX - d) / 10) {
            kvd_config_err(err, err_len, "number too large");
            return KVD_ERR_RANGE;
        }
        whole = whole * 10 + d;
    }
    uint64_t frac = 0;
    unsigned digits = 0;
    if (p < e && *p == '.') {
        p++;
        const char *fb = p;
        while (p < e && isdigit((unsigned char)*p)) {
            p++;
        }
        if (p == fb) {
            kvd_config_err(err, err_len, "expected digits after '.'");
            return KVD_ERR_INVALID;
        }
        const char *fe = p;
        while (fe > fb && fe[-1] == '0') {
            fe--;
        }
        if (fe - fb > KVD_CONFIG_FRAC_DIGITS_MAX) {
            kvd_config_err(err, err_len,
                           "more than %d significant fraction digits",
                           KVD_CONFIG_FRAC_DIGITS_MAX);
            return KVD_ERR_INVALID;
        }
        for (const char *q = fb; q < fe; q++) {
            frac = frac * 10 + (uint64_t)(*q - '0');
        }
        digits = (unsigned)(fe - fb);
    }
    out->whole = whole;
    out->frac = frac;
    out->frac_digits = digits;
    *stop = p;
    return KVD_OK;
}

static uint64_t pow_u64(uint64_t base, unsigned exp)
{
    uint64_t r = 1;
    while (exp-- > 0) {
        r *= base;
    }
    return r;
}

/* Unsigned fields share the field's range; min/max both 0 = unbounded,
 * max 0 alone = no upper bound, a negative min is no lower bound. */
static kvd_status_t range_check_u64(const kvd_config_field_t *field, uint64_t v,
                                    char *err, size_t err_len)
{
    if (field == NULL || (field->min == 0 && field->max == 0)) {
        return KVD_OK;
    }
    if (field->min > 0 && v < (uint64_t)field->min) {
        kvd_config_err(err, err_len,
                       "%" PRIu64 " is below the minimum %" PRId64, v,
                       field->min);
        return KVD_ERR_RANGE;
    }
    if (field->max > 0 && v > (uint64_t)field->max) {
        kvd_config_err(err, err_len,
                       "%" PRIu64 " is above the maximum %" PRId64, v,
                       field->max);
        return KVD_ERR_RANGE;
    }
    return KVD_OK;
}

/* What size and duration parsing share: the argument check, trimming, a
 * non-empty value and its leading decimal. On KVD_OK, [*suffix, *end) is
 * the text after the number. */
static kvd_status_t number_scan(const char *text, const void *out,
                                kvd_decimal_t *num, const char **suffix,
                                const char **end, char *err, size_t err_len)
{
    if (text == NULL || out == NULL) {
        kvd_config_err(err, err_len, "NULL argument");
        return KVD_ERR_INVALID;
    }
    const char *b;
    text_trim(text, &b, end);
    if (b == *end) {
        kvd_config_err(err, err_len, "empty value");
        return KVD_ERR_INVALID;
    }
    return decimal_scan(b, *end, suffix, num, err, err_len);
}

static kvd_status_t size_scan(const char *text, uint64_t *bytes_out, char *err,
                              size_t err_len)
{
    const char *e, *p;
    kvd_decimal_t num;
    kvd_status_t st = number_scan(text, bytes_out, &num, &p, &e, err, err_len);
    if (st != KVD_OK) {
        return st;
    }
    /* Suffix: "", "b", or one of k/m/g/t then "", "b" or "ib". */
    unsigned shift = 0;
    if (p < e && !range_equals(p, e, "b")) {
        const char *units = "kmgt";
        const char *u = strchr(units, tolower((unsigned char)*p));
        if (u == NULL || *p == '\0' ||
            !(p + 1 == e || range_equals(p + 1, e, "b") ||
              range_equals(p + 1, e, "ib"))) {
            kvd_config_err(err, err_len, "unknown size suffix '%.*s'",
                           (int)(e - p), p);
            return KVD_ERR_INVALID;
        }
        shift = 10u * (unsigned)(u - units + 1);
    }
    if (num.whole > (UINT64_MAX >> shift)) {
        kvd_config_err(err, err_len, "size does not fit in 64 bits");
        return KVD_ERR_RANGE;
    }
    uint64_t bytes = num.whole << shift;
    if (num.frac_digits > 0) {
        /* frac * 2^shift / 10^d is whole iff 5^d divides frac and the
         * remaining power of two covers 2^d; g < 2^d keeps g << 40 small.
         */
        uint64_t pow5 = pow_u64(5, num.frac_digits);
        uint64_t g = num.frac / pow5;
        uint64_t v = g << shift;
        if (num.frac % pow5 != 0 ||
            (v & ((UINT64_C(1) << num.frac_digits) - 1)) != 0) {
            kvd_config_err(err, err_len, "not a whole number of bytes");
            return KVD_ERR_INVALID;
        }
        v >>= num.frac_digits;
        if (bytes > UINT64_MAX - v) {
            kvd_config_err(err, err_len, "size does not fit in 64 bits");
            return KVD_ERR_RANGE;
        }
        bytes += v;
    }
    *bytes_out = bytes;
    return KVD_OK;
}

typedef struct kvd_duration_unit {
    const char *name;
    uint64_t mul_ms; /* unit = mul_ms milliseconds, or */
    uint64_t div_ms; /* unit = 1/div_ms milliseconds */
} kvd_duration_unit_t;

static const kvd_duration_unit_t duration_units[] = {
    {"ns", 0, 1000000}, {"us", 0, 1000}, {"ms", 1, 0},
    {"s", 1000, 0},     {"m", 60000, 0}, {"h", 3600000, 0},
};

static kvd_status_t duration_scan(const char *text, uint64_t *ms_out, char *err,
                                  size_t err_len)
{
    const char *e, *p;
    kvd_decimal_t num;
    kvd_status_t st = number_scan(text, ms_out, &num, &p, &e, err, err_len);
    if (st != KVD_OK) {
        return st;
    }
    const kvd_duration_unit_t *unit = &duration_units[2]; /* bare = ms */
    if (p < e) {
        unit = NULL;
        for (size_t i = 0;
             i < sizeof(duration_units) / sizeof(duration_units[0]); i++) {
            if (range_equals(p, e, duration_units[i].name)) {
                unit = &duration_units[i];
                break;
            }
        }
        if (unit == NULL) {
            kvd_config_err(err, err_len,
                           "unknown duration unit '%.*s' (use ns, us, ms, s, m "
                           "or h)",
                           (int)(e - p), p);
            return KVD_ERR_INVALID;
        }
    }
    uint64_t ms;
    if (unit->div_ms != 0) {
        /* Any fraction of a ns/us cannot add up to a whole millisecond. */
        if (num.frac_digits > 0 || num.whole % unit->div_ms != 0) {
            kvd_config_err(err, err_len, "not a whole number of milliseconds");
            return KVD_ERR_INVALID;
        }
        ms = num.whole / unit->div_ms;
    } else {
        if (num.whole > UINT64_MAX / unit->mul_ms) {
            kvd_config_err(err, err_len, "duration does not fit in 64 bits");
            return KVD_ERR_RANGE;
        }
        ms = num.whole * unit->mul_ms;
        /* frac < 10^12 and mul_ms <= 3.6e6, so the product fits. */
        uint64_t scaled = num.frac * unit->mul_ms;
        uint64_t pow10 = pow_u64(10, num.frac_digits);
        if (scaled % pow10 != 0) {
            kvd_config_err(err, err_len, "not a whole number of milliseconds");
            return KVD_ERR_INVALID;
        }
        if (ms > UINT64_MAX - scaled / pow10) {
            kvd_config_err(err, err_len, "duration does not fit in 64 bits");
            return KVD_ERR_RANGE;
        }
        ms += scaled / pow10;
    }
    *ms_out = ms;
    return KVD_OK;
}

KVD_API kvd_status_t kvd_parse_size(const char *text, uint64_t *bytes_out)
{
    return size_scan(text, bytes_out, NULL, 0);
}

KVD_API kvd_status_t kvd_parse_duration_ms(const char *text, uint64_t *ms_out)
{
    return duration_scan(text, ms_out, NULL, 0);
}

KVD_API kvd_status_t kvd_config_parse_bool(const kvd_config_field_t *field,
                                           const char *text, void *dst,
                                           char *err, size_t err_len)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    (void)field;
    if (text == NULL || dst == NULL) {
        kvd_config_err(err, err_len, "NULL argument");
        return KVD_ERR_INVALID;
    }
    const char *b, *e;
    text_trim(text, &b, &e);
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        if (range_equals(b, e, yes[i]) || range_equals(b, e, no[i])) {
            *(bool *)dst = range_equals(b, e, yes[i]);
            return KVD_OK;
        }
    }
    kvd_config_err(err, err_len,
                   "not a boolean (use true/false, yes/no, on/off or 1/0)");
    return KVD_ERR_INVALID;
}

KVD_API kvd_status_t kvd_config_parse_int(const kvd_config_field_t *field,
                                          const char *text, void *dst,
                                          char *err, size_t err_len)
{
    if (text == NULL || dst == NULL) {
        kvd_config_err(err, err_len, "NULL argument");
        return KVD_ERR_INVALID;
    }
    const char *p, *e;
    text_trim(text, &p, &e);
    bool neg = false;
    if (p < e && (*p == '-' || *p == '+')) {
        neg = *p == '-';
        p++;
    }
    unsigned base = 10;
    if (e - p > 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
        base = 16;
        p += 2;
    }
    if (p == e) {
        kvd_config_err(err, err_len, "expected an integer");
        return KVD_ERR_INVALID;
    }
    /* Accumulate the magnitude; -2^63 is the one value whose magnitude
     * exceeds INT64_MAX. */
    uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    uint64_t mag = 0;
    for (; p < e; p++) {
        int c = tolower((unsigned char)*p);
        unsigned d;
        if (c >= '0' && c <= '9') {
            d = (unsigned)(c - '0');
        } else if (base == 16 && c >= 'a' && c <= 'f') {
            d = (unsigned)(c - 'a' + 10);
        } else {
            kvd_config_err(err, err_len, "unexpected character '%c' in integer",
                           *p);
            return KVD_ERR_INVALID;
        }
        if (mag > (limit - d) / base) {
            kvd_config_err(err, err_len, "integer does not fit in 64 bits");
            return KVD_ERR_RANGE;
        }
        mag = mag * base + d;
    }
    int64_t v = neg ? (int64_t)(0 - mag) : (int64_t)mag;
    if (field != NULL && !(field->min == 0 && field->max == 0)) {
        if (v < field->min) {
            kvd_config_err(err, err_len,
                           "%" PRId64 " is below the minimum %" PRId64, v,
                           field->min);
            return KVD_ERR_RANGE;
        }
        if (field->max != 0 && v > field->max) {
            kvd_config_err(err, err_len,
                           "%" PRId64 " is above the maximum %" PRId64, v,
                           field->max);
            return KVD_ERR_RANGE;
        }
    }
    *(int64_t *)dst = v;
    return KVD_OK;
}

KVD_API kvd_status_t kvd_config_parse_size(const kvd_config_field_t *field,
                                           const char *text, void *dst,
                                           char *err, size_t err_len)
{
    uint64_t v;
    kvd_status_t st = size_scan(text, &v, err, err_len);
    if (st == KVD_OK && dst == NULL) {
        kvd_config_err(err, err_len, "NULL argument");
        st = KVD_ERR_INVALID;
    }
    if (st == KVD_OK) {
        st = range_check_u64(field, v, err, err_len);
    }
    if (st == KVD_OK) {
        *(uint64_t *)dst = v;
    }
    return st;
}

KVD_API kvd_status_t
kvd_config_parse_duration_ms(const kvd_config_field_t *field, const char *text,
                             void *dst, char *err, size_t err_len)
{
    uint64_t v;
    kvd_status_t st = duration_scan(text, &v, err, err_len);
    if (st == KVD_OK && dst == NULL) {
        kvd_config_err(err, err_len, "NULL argument");
        st = KVD_ERR_INVALID;
    }
    if (st == KVD_OK) {
        st = range_check_u64(field, v, err, err_len);
    }
    if (st == KVD_OK) {
        *(uint64_t *)dst = v;
    }
    return st;
}

KVD_API kvd_status_t kvd_config_parse_string(const kvd_config_field_t *field,
                                             const char *text, void *dst,
                                             char *err, size_t err_len)
{
    (void)field;
    if (text == NULL || dst == NULL) {
        kvd_config_err(err, err_len, "NULL argument");
        return KVD_ERR_INVALID;
    }
    size_t len = strlen(text);
    if (len >= KVD_CONFIG_STRING_MAX) {
        kvd_config_err(err, err_len, "string of %zu bytes is longer than %d",
                       len, KVD_CONFIG_STRING_MAX - 1);
        return KVD_ERR_RANGE;
    }
    memcpy(dst, text, len + 1);
    return KVD_OK;
}

KVD_API kvd_status_t kvd_config_parse_enum(const kvd_config_field_t *field,
                                           const char *text, void *dst,
                                           char *err, size_t err_len)
{
    if (field == NULL || field->choices == NULL || text == NULL ||
        dst == NULL) {
        kvd_config_err(err, err_len, "NULL argument or enum without choices");
        return KVD_ERR_INVALID;
    }
    const char *b, *e;
    text_trim(text, &b, &e);
    for (int i = 0; field->choices[i] != NULL; i++) {
        size_t n = strlen(field->choices[i]);
        if ((size_t)(e - b) == n && memcmp(b, field->choices[i], n) == 0) {
            *(int *)dst = i;
            return KVD_OK;
        }
    }
    /* List the allowed values, cutting the list off cleanly if err is
     * short. */
    kvd_config_err(err, err_len, "not one of:");
    size_t used = err != NULL && err_len > 0 ? strlen(err) : 0;
    for (int i = 0; field->choices[i] != NULL && used + 1 < err_len; i++) {
        int n = snprintf(err + used, err_len - used, " %s", field->choices[i]);
        if (n < 0) {
            break;
        }
        used += (size_t)n;
    }
    return KVD_ERR_INVALID;
}

/* Appends [b, e), trimmed, to the canonical text in out[0, *used); false
 * when it would not fit with its terminator in KVD_CONFIG_STRING_MAX. */
static bool canon_put(char *out, size_t *used, const char *b, const char *e)
{
    while (b < e && isspace((unsigned char)*b)) {
        b++;
    }
    while (e > b && isspace((unsigned char)e[-1])) {
        e--;
    }
    size_t n = (size_t)(e - b);
    if (*used + n >= KVD_CONFIG_STRING_MAX) {
        return false;
    }
    memcpy(out + *used, b, n);
    *used += n;
    out[*used] = '\0';
    return true;
}

/* One item [p, ie) of a list onto `out`: trimmed, non-empty; for pairs
 * "key=value" split at the item's last '=', both sides trimmed and
 * non-empty. */
static kvd_status_t canon_item(const char *p, const char *ie, bool pairs,
                               size_t index, char *out, size_t *used, char *err,
                               size_t err_len)
{
    const char *eq = NULL;
    for (const char *q = p; pairs && q < ie; q++) {
        eq = *q == '=' ? q : eq;
    }
    size_t start = *used;
    bool fits = pairs && eq != NULL ? canon_put(out, used, p, eq) : true;
    size_t key_end = *used;
    if (fits && pairs && eq != NULL) {
        static const char eq_sign[] = "=";
        fits = canon_put(out, used, eq_sign, eq_sign + 1);
        key_end = *used - 1;
    }
    size_t value_start = *used;
    fits = fits && canon_put(out, used, eq != NULL ? eq + 1 : p, ie);
    if (!fits) {
        kvd_config_err(err, err_len, "longer than %d bytes",
                       KVD_CONFIG_STRING_MAX - 1);
        return KVD_ERR_RANGE;
    }
    if (pairs && (eq == NULL || key_end == start || *used == value_start)) {
        kvd_config_err(err, err_len,
                       "item %zu '%.*s' is not key=value (or write a YAML "
                       "mapping: {key: value, ...})",
                       index + 1, KVD_CONFIG_QUOTE_MAX, p);
        return KVD_ERR_INVALID;
    }
    if (!pairs && *used == value_start) {
        kvd_config_err(err, err_len, "item %zu is empty", index + 1);
        return KVD_ERR_INVALID;
    }
    return KVD_OK;
}

/* The canonical text of a comma list ("a, b" -> "a,b") or, when `pairs`,
 * of key=value pairs ("k = v, k2=v2" -> "k=v,k2=v2"). "" stays "". */
static kvd_status_t list_canon(const char *text, bool pairs, char *out,
                               char *err, size_t err_len)
{
    size_t used = 0;
    out[0] = '\0';
    const char *p, *end;
    text_trim(text, &p, &end);
    for (size_t index = 0; p < end; index++) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *ie = comma != NULL ? comma : end;
        if (index > 0) {
            if (used + 1 >= KVD_CONFIG_STRING_MAX) {
                kvd_config_err(err, err_len, "longer than %d bytes",
                               KVD_CONFIG_STRING_MAX - 1);
                return KVD_ERR_RANGE;
            }
            out[used++] = ',';
            out[used] = '\0';
        }
        kvd_status_t st =
            canon_item(p, ie, pairs, index, out, &used, err, err_len);
        if (st != KVD_OK) {
            return st;
        }
        if (comma != NULL && comma + 1 == end) {
            kvd_config_err(err, err_len, "item %zu is empty", index + 2);
            return KVD_ERR_INVALID;
        }
        p = comma != NULL ? comma + 1 : end;
    }
    return KVD_OK;
}

static kvd_status_t parse_list_or_pairs(const char *text, void *dst, bool pairs,
                                        char *err, size_t err_len)
{
    if (text == NULL || dst == NULL) {
        kvd_config_err(err, err_len, "NULL argument");
        return KVD_ERR_INVALID;
    }
    char canon[KVD_CONFIG_STRING_MAX];
    kvd_status_t st = list_canon(text, pairs, canon, err, err_len);
    if (st == KVD_OK) {
        memcpy(dst, canon, strlen(canon) + 1);
    }
    return st;
}

KVD_API kvd_status_t kvd_config_parse_list(const kvd_config_field_t *field,
                                           const char *text, void *dst,
                                           char *err, size_t err_len)
{
    (void)field;
    return parse_list_or_pairs(text, dst, false, err, err_len);
}

KVD_API kvd_status_t kvd_config_parse_pairs(const kvd_config_field_t *field,
                                            const char *text, void *dst,
                                            char *err, size_t err_len)
{
    (void)field;
    return parse_list_or_pairs(text, dst, true, err, err_len);
}
