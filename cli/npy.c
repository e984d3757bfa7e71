/*
 * Strict .npy reader (contract in npy_int.h).
 *
 * The header is a Python dict literal, but evaluating Python is neither
 * possible nor wanted here: this is a small recursive-descent parser for
 * the one shape numpy writes, {'descr': STR, 'fortran_order': BOOL,
 * 'shape': TUPLE}, and it refuses everything else. Every read goes through
 * a cursor bounded by the header's end, and every number taken from the
 * file (header length, dimensions, data size) is range-checked before it
 * is used as a length, so a hostile file can only produce an error message.
 */
#include "cli/npy_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KVD_NPY_MAGIC "\x93NUMPY"
#define KVD_NPY_MAGIC_BYTES 6
/* Longest 'descr' string we keep; longer ones are reported as too long. */
#define KVD_NPY_DESCR_MAX 32
/* At most this much of the raw shape text is quoted in error messages. */
#define KVD_NPY_SHAPE_QUOTE_MAX 64
/* Dimensions remembered from the shape tuple; more are only counted. */
#define KVD_NPY_MAX_DIMS 2

typedef struct kvd_npy_cursor {
    const char *pos;
    const char *end;
} kvd_npy_cursor_t;

/* What the header dict said; `seen_*` tell which keys were present. */
typedef struct kvd_npy_header {
    bool seen_descr, seen_fortran, seen_shape;
    char descr[KVD_NPY_DESCR_MAX + 1];
    bool fortran_order;
    size_t ndim;
    uint64_t dims[KVD_NPY_MAX_DIMS];
    const char *shape_text; /* "(...)" as written, for messages */
    size_t shape_text_len;
} kvd_npy_header_t;

static kvd_status_t npy_fail(char *err, size_t err_len, kvd_status_t status,
                             const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static kvd_status_t npy_fail(char *err, size_t err_len, kvd_status_t status,
                             const char *fmt, ...)
{
    if (err != NULL && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return status;
}

static uint32_t npy_le16(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

static uint32_t npy_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

/* Python allows any whitespace between tokens; numpy writes single spaces
 * inside the dict and pads with spaces before the final newline. */
static void npy_skip_space(kvd_npy_cursor_t *c)
{
    while (c->pos < c->end && (*c->pos == ' ' || *c->pos == '\t' ||
                               *c->pos == '\n' || *c->pos == '\r')) {
        c->pos++;
    }
}

/* Describes the byte at the cursor for "expected X, found Y" messages. */
static void npy_describe(const kvd_npy_cursor_t *c, char *out, size_t len)
{
    if (c->pos >= c->end) {
        snprintf(out, len, "end of header");
    } else if (*c->pos > ' ' && *c->pos < 0x7f) {
        snprintf(out, len, "'%c'", *c->pos);
    } else {
        snprintf(out, len, "byte 0x%02x", (unsigned)(uint8_t)*c->pos);
    }
}

static kvd_status_t npy_expect(kvd_npy_cursor_t *c, char want,
                               const char *where, char *err, size_t err_len)
{
    npy_skip_space(c);
    if (c->pos < c->end && *c->pos == want) {
        c->pos++;
        return KVD_OK;
    }
    char found[24];
    npy_describe(c, found, sizeof(found));
    return npy_fail(err, err_len, KVD_ERR_INVALID,
                    "malformed header: expected '%c' %s, found %s", want, where,
                    found);
}

/*
 * Reads a quoted string without escapes into `out` (capacity out_len
 * including the NUL). Only printable ASCII is accepted: no key or dtype
 * numpy writes needs more, and it keeps error messages printable.
 * *too_long_out is set (and the text truncated) when it does not fit.
 */
static kvd_status_t npy_parse_string(kvd_npy_cursor_t *c, char *out,
                                     size_t out_len, bool *too_long_out,
                                     char *err, size_t err_len)
{
    npy_skip_space(c);
    if (c->pos >= c->end || (*c->pos != '\'' && *c->pos != '"')) {
        char found[24];
        npy_describe(c, found, sizeof(found));
        return npy_fail(err, err_len, KVD_ERR_INVALID,
                        "malformed header: expected a quoted string, found %s",
                        found);
    }
    char quote = *c->pos++;
    size_t n = 0;
    *too_long_out = false;
    for (;;) {
        if (c->pos >= c->end) {
            return npy_fail(err, err_len, KVD_ERR_INVALID,
                            "malformed header: unterminated string");
        }
        char ch = *c->pos++;
        if (ch == quote) {
            break;
        }
        if (ch == '\\' || ch < ' ' || ch >= 0x7f) {
            return npy_fail(err, err_len, KVD_ERR_INVALID,
                            "malformed header: unsupported byte 0x%02x in a "
                            "string",
                            (unsigned)(uint8_t)ch);
        }
        if (n + 1 < out_len) {
            out[n++] = ch;
        } else {
            *too_long_out = true;
        }
    }
    out[n] = '\0';
    return KVD_OK;
}

static kvd_status_t npy_parse_bool(kvd_npy_cursor_t *c, bool *value_out,
                                   char *err, size_t err_len)
{
    npy_skip_space(c);
    size_t avail = (size_t)(c->end - c->pos);
    if (avail >= 4 && memcmp(c->pos, "True", 4) == 0) {
        c->pos += 4;
        *value_out = true;
        return KVD_OK;
    }
    if (avail >= 5 && memcmp(c->pos, "False", 5) == 0) {
        c->pos += 5;
        *value_out = false;
        return KVD_OK;
    }
    return npy_fail(err, err_len, KVD_ERR_INVALID,
                    "malformed header: 'fortran_order' must be True or False");
}

/* Decimal integer; the overflow test runs before each multiply so a
 * 30-digit dimension is an error, not a wrapped value. */
static kvd_status_t npy_parse_dim(kvd_npy_cursor_t *c, uint64_t *value_out,
                                  char *err, size_t err_len)
{
    npy_skip_space(c);
    if (c->pos >= c->end || *c->pos < '0' || *c->pos > '9') {
        char found[24];
        npy_describe(c, found, sizeof(found));
        return npy_fail(err, err_len, KVD_ERR_INVALID,
                        "malformed header: expected a non-negative shape "
                        "dimension, found %s",
                        found);
    }
    uint64_t v = 0;
    while (c->pos < c->end && *c->pos >= '0' && *c->pos <= '9') {
        uint64_t digit = (uint64_t)(*c->pos - '0');
        if (v > (UINT64_MAX - digit) / 10) {
            return npy_fail(err, err_len, KVD_ERR_RANGE,
                            "shape dimension does not fit in 64 bits");
        }
        v = v * 10 + digit;
        c->pos++;
    }
    *value_out = v;
    return KVD_OK;
}

/* "(a, b, ...)" with an optional trailing comma, as Python's tuple repr
 * writes it ("(5,)" for one dimension, "()" for a scalar). */
static kvd_status_t npy_parse_shape(kvd_npy_cursor_t *c, kvd_npy_header_t *h,
                                    char *err, size_t err_len)
{
    kvd_status_t st = npy_expect(c, '(', "to open 'shape'", err, err_len);
    if (st != KVD_OK) {
        return st;
    }
    h->shape_text = c->pos - 1;
    h->ndim = 0;
    for (;;) {
        npy_skip_space(c);
        if (c->pos < c->end && *c->pos == ')') {
            c->pos++;
            break;
        }
        uint64_t dim = 0;
        st = npy_parse_dim(c, &dim, err, err_len);
        if (st != KVD_OK) {
            return st;
        }
        if (h->ndim < KVD_NPY_MAX_DIMS) {
            h->dims[h->ndim] = dim;
        }
        h->ndim++;
        npy_skip_space(c);
        if (c->pos < c->end && *c->pos == ',') {
            c->pos++;
            continue;
        }
        st = npy_expect(c, ')', "to close 'shape'", err, err_len);
        if (st != KVD_OK) {
            return st;
        }
        break;
    }
    h->shape_text_len = (size_t)(c->pos - h->shape_text);
    return KVD_OK;
}

static kvd_status_t npy_parse_descr(kvd_npy_cursor_t *c, kvd_npy_header_t *h,
                                    char *err, size_t err_len)
{
    npy_skip_space(c);
    if (c->pos < c->end && (*c->pos == '[' || *c->pos == '{')) {
        return npy_fail(err, err_len, KVD_ERR_UNSUPPORTED,
                        "structured dtypes are not supported: need '<f2' "
                        "(float16) or '<f4' (float32)");
    }
    bool too_long;
    kvd_status_t st = npy_parse_string(c, h->descr, sizeof(h->descr), &too_long,
                                       err, err_len);
    if (st == KVD_OK && too_long) {
        st = npy_fail(err, err_len, KVD_ERR_UNSUPPORTED,
                      "unsupported dtype '%s...': need '<f2' (float16) or "
                      "'<f4' (float32)",
                      h->descr);
    }
    return st;
}

static kvd_status_t npy_parse_value(kvd_npy_cursor_t *c, const char *key,
                                    kvd_npy_header_t *h, char *err,
                                    size_t err_len)
{
    bool *seen;
    if (strcmp(key, "descr") == 0) {
        seen = &h->seen_descr;
    } else if (strcmp(key, "fortran_order") == 0) {
        seen = &h->seen_fortran;
    } else if (strcmp(key, "shape") == 0) {
        seen = &h->seen_shape;
    } else {
        return npy_fail(err, err_len, KVD_ERR_INVALID,
                        "malformed header: unexpected key '%s'", key);
    }
    if (*seen) {
        return npy_fail(err, err_len, KVD_ERR_INVALID,
                        "malformed header: key '%s' appears twice", key);
    }
    *seen = true;
    if (seen == &h->seen_shape) {
        return npy_parse_shape(c, h, err, err_len);
    }
    if (seen == &h->seen_fortran) {
        return npy_parse_bool(c, &h->fortran_order, err, err_len);
    }
    return npy_parse_descr(c, h, err, err_len);
}

/* The dict, then only padding up to the header's end. */
static kvd_status_t npy_parse_dict(kvd_npy_cursor_t *c, kvd_npy_header_t *h,
                                   char *err, size_t err_len)
{
    kvd_status_t st =
        npy_expect(c, '{', "at the start of the header", err, err_len);
    if (st != KVD_OK) {
        return st;
    }
    for (;;) {
        npy_skip_space(c);
        if (c->pos < c->end && *c->pos == '}') {
            c->pos++;
            break;
        }
        char key[24];
        bool too_long;
        st = npy_parse_string(c, key, sizeof(key), &too_long, err, err_len);
        if (st != KVD_OK) {
            return st;
        }
        if (too_long) {
            return npy_fail(err, err_len, KVD_ERR_INVALID,
                            "malformed header: unexpected key '%s...'", key);
        }
        st = npy_expect(c, ':', "after a key", err, err_len);
        if (st == KVD_OK) {
            st = npy_parse_value(c, key, h, err, err_len);
        }
        if (st != KVD_OK) {
            return st;
        }
        npy_skip_space(c);
        if (c->pos < c->end && *c->pos == ',') {
            c->pos++;
            continue;
        }
        st = npy_expect(c, '}', "to close the header dict", err, err_len);
        if (st != KVD_OK) {
            return st;
        }
        break;
    }
    npy_skip_space(c);
    if (c->pos != c->end) {
        char found[24];
        npy_describe(c, found, sizeof(found));
        return npy_fail(err, err_len, KVD_ERR_INVALID,
                        "malformed header: %s after the closing '}'", found);
    }
    const char *missing = !h->seen_descr     ? "descr"
                          : !h->seen_fortran ? "fortran_order"
                          : !h->seen_shape   ? "shape"
                                             : NULL;
    if (missing != NULL) {
        return npy_fail(err, err_len, KVD_ERR_INVALID,
                        "malformed header: key '%s' is missing", missing);
    }
    return KVD_OK;
}

/* Magic, version and header length; sets the header's byte range. */
static kvd_status_t npy_parse_preamble(const uint8_t *b, size_t len,
                                       unsigned *major_out,
                                       size_t *header_off_out,
                                       size_t *header_len_out, char *err,
                                       size_t err_len)
{
    size_t magic_cmp = len < KVD_NPY_MAGIC_BYTES ? len : KVD_NPY_MAGIC_BYTES;
    if (memcmp(b, KVD_NPY_MAGIC, magic_cmp) != 0) {
        return npy_fail(err, err_len, KVD_ERR_INVALID,
                        "not an .npy file: bad magic (need \\x93NUMPY)");
    }
    if (len < 10) {
        return npy_fail(err, err_len, KVD_ERR_INVALID,
                        "truncated .npy preamble: %zu bytes, need at least "
                        "10",
                        len);
    }
    unsigned major = b[6], minor = b[7];
    if (major < 1 || major > 3 || minor != 0) {
        return npy_fail(err, err_len, KVD_ERR_INVALID,
                        "unsupported .npy format version %u.%u (need 1.0, "
                        "2.0 or 3.0)",
                        major, minor);
    }
    size_t off = major == 1 ? 10 : 12;
    if (len < off) {
        return npy_fail(err, err_len, KVD_ERR_INVALID,
                        "truncated .npy preamble: %zu bytes, need %zu for "
                        "version %u.0",
                        len, off, major);
    }
    uint32_t hlen = major == 1 ? npy_le16(b + 8) : npy_le32(b + 8);
    if (hlen == 0 || hlen > KVD_NPY_MAX_HEADER_BYTES) {
        return npy_fail(err, err_len, KVD_ERR_INVALID,
                        "bad .npy header length %u (need 1..%u)", hlen,
                        KVD_NPY_MAX_HEADER_BYTES);
    }
    if (len - off < hlen) {
        return npy_fail(err, err_len, KVD_ERR_INVALID,
                        "truncated .npy header: %u bytes declared, %zu "
                        "present",
                        hlen, len - off);
    }
    *major_out = major;
    *header_off_out = off;
    *header_len_out = hlen;
    return KVD_OK;
}

/* The meaning of a syntactically valid header: what this reader takes. */
static kvd_status_t npy_check_header(const kvd_npy_header_t *h,
                                     size_t *elem_bytes_out, char *err,
                                     size_t err_len)
{
    if (strcmp(h->descr, "<f2") == 0) {
        *elem_bytes_out = 2;
    } else if (strcmp(h->descr, "<f4") == 0) {
        *elem_bytes_out = 4;
    } else {
        return npy_fail(err, err_len, KVD_ERR_UNSUPPORTED,
                        "unsupported dtype '%s': need '<f2' (float16) or "
                        "'<f4' (float32)",
                        h->descr);
    }
    if (h->fortran_order) {
        return npy_fail(err, err_len, KVD_ERR_UNSUPPORTED,
                        "fortran_order True is not supported: save a "
                        "C-ordered array (np.ascontiguousarray)");
    }
    int quote_len = h->shape_text_len > KVD_NPY_SHAPE_QUOTE_MAX
                        ? KVD_NPY_SHAPE_QUOTE_MAX
                        : (int)h->shape_text_len;
    if (h->ndim != 2) {
        return npy_fail(err, err_len, KVD_ERR_UNSUPPORTED,
                        "shape %.*s%s has %zu dimension%s: need 2 "
                        "([vectors, head_dim])",
                        quote_len, h->shape_text,
                        (size_t)quote_len < h->shape_text_len ? "..." : "",
                        h->ndim, h->ndim == 1 ? "" : "s");
    }
    if (h->dims[0] == 0 || h->dims[1] == 0) {
        return npy_fail(err, err_len, KVD_ERR_UNSUPPORTED,
                        "shape %.*s is empty: need at least one vector of "
                        "at least one element",
                        quote_len, h->shape_text);
    }
    return KVD_OK;
}

kvd_status_t kvd_npy_parse(const void *buf, size_t len,
                           kvd_npy_array_t *array_out, char *err,
                           size_t err_len)
{
    if ((buf == NULL && len > 0) || array_out == NULL) {
        return npy_fail(err, err_len, KVD_ERR_INVALID, "invalid arguments");
    }
    const uint8_t *b = buf;
    unsigned major = 0;
    size_t hoff = 0, hlen = 0;
    kvd_status_t st =
        npy_parse_preamble(b, len, &major, &hoff, &hlen, err, err_len);
    if (st != KVD_OK) {
        return st;
    }
    /* The format promises a newline as the header's last byte; checking it
     * first catches a header cut short by a wrong length field. */
    if (b[hoff + hlen - 1] != '\n') {
        return npy_fail(err, err_len, KVD_ERR_INVALID,
                        "malformed header: does not end with a newline");
    }
    kvd_npy_header_t h;
    memset(&h, 0, sizeof(h));
    kvd_npy_cursor_t c = {(const char *)b + hoff,
                          (const char *)b + hoff + hlen};
    st = npy_parse_dict(&c, &h, err, err_len);
    if (st != KVD_OK) {
        return st;
    }
    size_t elem = 0;
    st = npy_check_header(&h, &elem, err, err_len);
    if (st != KVD_OK) {
        return st;
    }
    uint64_t count, bytes;
    if (__builtin_mul_overflow(h.dims[0], h.dims[1], &count) ||
        __builtin_mul_overflow(count, (uint64_t)elem, &bytes) ||
        bytes > SIZE_MAX) {
        return npy_fail(err, err_len, KVD_ERR_RANGE,
                        "shape (%llu, %llu) is too large: its byte size "
                        "overflows",
                        (unsigned long long)h.dims[0],
                        (unsigned long long)h.dims[1]);
    }
    size_t data_off = hoff + hlen;
    size_t avail = len - data_off;
    if (avail < bytes) {
        return npy_fail(err, err_len, KVD_ERR_INVALID,
                        "truncated data: shape (%llu, %llu) float%zu needs "
                        "%llu bytes, file has %zu",
                        (unsigned long long)h.dims[0],
                        (unsigned long long)h.dims[1], elem * 8,
                        (unsigned long long)bytes, avail);
    }
    if (avail > bytes) {
        return npy_fail(
            err, err_len, KVD_ERR_INVALID,
            "%zu trailing byte%s after the %llu data bytes of "
            "shape (%llu, %llu)",
            avail - (size_t)bytes, avail - (size_t)bytes == 1 ? "" : "s",
            (unsigned long long)bytes, (unsigned long long)h.dims[0],
            (unsigned long long)h.dims[1]);
    }
    array_out->version_major = major;
    array_out->elem_bytes = elem;
    array_out->rows = h.dims[0];
    array_out->cols = h.dims[1];
    array_out->data_offset = data_off;
    array_out->data_bytes = (size_t)bytes;
    array_out->data = b + data_off;
    return KVD_OK;
}

kvd_status_t kvd_npy_file_load(const char *path, void **buf_out,
                               size_t *len_out, char *err, size_t err_len)
{
    kvd_status_t st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return npy_fail(err, err_len, kvd_status_from_errno(e), "%s: %s", path,
                        strerror(e));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        st = npy_fail(err, err_len, kvd_status_from_errno(e), "%s: %s", path,
                      strerror(e));
        goto err_close;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = npy_fail(err, err_len, KVD_ERR_INVALID, "%s: not a regular file",
                      path);
        goto err_close;
    }
    if ((uint64_t)sb.st_size > SIZE_MAX / 2) {
        st = npy_fail(err, err_len, KVD_ERR_RANGE, "%s: file too large", path);
        goto err_close;
    }
    size_t cap = (size_t)sb.st_size;
    uint8_t *buf = malloc(cap ? cap : 1);
    if (buf == NULL) {
        st = npy_fail(err, err_len, KVD_ERR_NOMEM,
                      "%s: cannot allocate %zu bytes", path, cap);
        goto err_close;
    }
    /* Reads at most the size fstat saw: a file that shrinks meanwhile
     * yields fewer bytes (and then a "truncated" parse error). */
    size_t len = 0;
    while (len < cap) {
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            int e = errno;
            st = npy_fail(err, err_len, kvd_status_from_errno(e), "%s: %s",
                          path, strerror(e));
            goto err_free;
        }
        if (n == 0) {
            break;
        }
        len += (size_t)n;
    }
    close(fd);
    *buf_out = buf;
    *len_out = len;
    return KVD_OK;

err_free:
    free(buf);
err_close:
    close(fd);
    return st;
}
