/*
 * The strict .npy reader (cli/npy.c): valid version 1/2/3 files of float16
 * and float32 parse to the right shape and data, and every malformed or
 * unsupported file is refused with the status and message text documented
 * in cli/npy_int.h, which `kvdepot codec-eval` shows users as is.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli/npy_int.h"

/* A test file: preamble + header + data, built in memory. */
typedef struct npy_buf {
    uint8_t *bytes;
    size_t len;
    size_t data_offset;
} npy_buf_t;

/*
 * Builds an .npy image: `dict` is padded with spaces and a newline so the
 * data starts on a 64-byte boundary, as numpy writes it (align 0 writes the
 * dict followed by a newline only). `data_len` bytes follow, filled with a
 * counting pattern.
 */
static npy_buf_t npy_build(unsigned major, unsigned minor, const char *dict,
                           size_t align, size_t data_len)
{
    size_t pre = major == 1 ? 10 : 12;
    size_t hlen = strlen(dict) + 1;
    if (align > 0) {
        hlen = (pre + hlen + align - 1) / align * align - pre;
    }
    npy_buf_t b = {0};
    b.len = pre + hlen + data_len;
    b.bytes = malloc(b.len);
    assert_non_null(b.bytes);
    memcpy(b.bytes, "\x93NUMPY", 6);
    b.bytes[6] = (uint8_t)major;
    b.bytes[7] = (uint8_t)minor;
    for (size_t i = 0; i < pre - 8; i++) {
        b.bytes[8 + i] = (uint8_t)(hlen >> (8 * i));
    }
    memset(b.bytes + pre, ' ', hlen);
    memcpy(b.bytes + pre, dict, strlen(dict));
    b.bytes[pre + hlen - 1] = '\n';
    b.data_offset = pre + hlen;
    for (size_t i = 0; i < data_len; i++) {
        b.bytes[b.data_offset + i] = (uint8_t)(i * 7 + 1);
    }
    return b;
}

#define F4_3X4 "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }"
#define F2_3X4 "{'descr': '<f2', 'fortran_order': False, 'shape': (3, 4), }"

static void test_valid_v1_f2(void **state)
{
    (void)state;
    npy_buf_t b = npy_build(1, 0, F2_3X4, 64, 24);
    kvd_npy_array_t a;
    char err[256] = "";
    assert_int_equal(kvd_npy_parse(b.bytes, b.len, &a, err, sizeof(err)),
                     KVD_OK);
    assert_int_equal(a.version_major, 1);
    assert_int_equal(a.elem_bytes, 2);
    assert_int_equal(a.rows, 3);
    assert_int_equal(a.cols, 4);
    /* numpy's layout: data on a 64-byte boundary. */
    assert_int_equal(a.data_offset, 128);
    assert_int_equal(a.data_bytes, 24);
    assert_ptr_equal(a.data, b.bytes + 128);
    assert_string_equal(err, "");
    free(b.bytes);
}

static void test_valid_v2_and_v3_f4(void **state)
{
    (void)state;
    for (unsigned major = 2; major <= 3; major++) {
        npy_buf_t b = npy_build(major, 0, F4_3X4, 64, 48);
        kvd_npy_array_t a;
        assert_int_equal(kvd_npy_parse(b.bytes, b.len, &a, NULL, 0), KVD_OK);
        assert_int_equal(a.version_major, major);
        assert_int_equal(a.elem_bytes, 4);
        assert_int_equal(a.rows, 3);
        assert_int_equal(a.cols, 4);
        assert_int_equal(a.data_offset, 128);
        assert_memory_equal(a.data, b.bytes + 128, 48);
        free(b.bytes);
    }
}

/* Python literal syntax numpy does not write but a hand-made file might:
 * double quotes, other key order, no trailing comma, no alignment padding,
 * a one-row array. */
static void test_valid_variants(void **state)
{
    (void)state;
    static const char *dicts[] = {
        "{\"shape\": (1,2), \"descr\": \"<f4\", \"fortran_order\": False}",
        "{ 'fortran_order' : False ,'shape':( 1 , 2 , ),'descr':'<f4' }",
    };
    for (size_t i = 0; i < sizeof(dicts) / sizeof(dicts[0]); i++) {
        npy_buf_t b = npy_build(1, 0, dicts[i], 0, 8);
        kvd_npy_array_t a;
        char err[256] = "";
        assert_int_equal(kvd_npy_parse(b.bytes, b.len, &a, err, sizeof(err)),
                         KVD_OK);
        assert_int_equal(a.rows, 1);
        assert_int_equal(a.cols, 2);
        assert_int_equal(a.data_offset, b.data_offset);
        free(b.bytes);
    }
}

/* Parses `b` expecting `status` and an error text containing `text`. */
static void expect_error(const npy_buf_t *b, kvd_status_t status,
                         const char *text)
{
    kvd_npy_array_t a;
    memset(&a, 0xab, sizeof(a));
    kvd_npy_array_t untouched = a;
    char err[256] = "";
    kvd_status_t st = kvd_npy_parse(b->bytes, b->len, &a, err, sizeof(err));
    if (st != status || strstr(err, text) == NULL) {
        print_error("status %d, message \"%s\"; wanted %d with \"%s\"\n",
                    (int)st, err, (int)status, text);
        fail();
    }
    /* The out-parameter is written only on success. */
    assert_memory_equal(&a, &untouched, sizeof(a));
    /* Same answer without an error buffer. */
    assert_int_equal(kvd_npy_parse(b->bytes, b->len, &a, NULL, 0), status);
}

static void expect_dict_error(const char *dict, size_t data_len,
                              kvd_status_t status, const char *text)
{
    npy_buf_t b = npy_build(1, 0, dict, 64, data_len);
    expect_error(&b, status, text);
    free(b.bytes);
}

static void test_bad_magic_and_preamble(void **state)
{
    (void)state;
    npy_buf_t b = npy_build(1, 0, F4_3X4, 64, 48);
    b.bytes[1] = 'X';
    expect_error(&b, KVD_ERR_INVALID,
                 "not an .npy file: bad magic (need \\x93NUMPY)");
    b.bytes[1] = 'N';

    /* Cut inside the magic, then inside the length field. */
    npy_buf_t cut = {b.bytes, 4, 0};
    expect_error(&cut, KVD_ERR_INVALID, "truncated .npy preamble: 4 bytes");
    cut.len = 9;
    expect_error(&cut, KVD_ERR_INVALID,
                 "truncated .npy preamble: 9 bytes, need at least 10");
    cut.len = 0;
    expect_error(&cut, KVD_ERR_INVALID, "truncated .npy preamble: 0 bytes");
    free(b.bytes);

    npy_buf_t v2 = npy_build(2, 0, F4_3X4, 64, 48);
    npy_buf_t v2cut = {v2.bytes, 11, 0};
    expect_error(&v2cut, KVD_ERR_INVALID,
                 "truncated .npy preamble: 11 bytes, need 12 for version 2.0");
    free(v2.bytes);
}

static void test_bad_version(void **state)
{
    (void)state;
    static const unsigned versions[][2] = {{0, 0}, {4, 0}, {1, 1}, {2, 5}};
    for (size_t i = 0; i < 4; i++) {
        npy_buf_t b = npy_build(versions[i][0], versions[i][1], F4_3X4, 64, 48);
        char want[64];
        snprintf(want, sizeof(want),
                 "unsupported .npy format version %u.%u (need 1.0, 2.0 or "
                 "3.0)",
                 versions[i][0], versions[i][1]);
        expect_error(&b, KVD_ERR_INVALID, want);
        free(b.bytes);
    }
}

static void test_header_length_and_truncation(void **state)
{
    (void)state;
    npy_buf_t b = npy_build(1, 0, F4_3X4, 64, 48);
    /* Header cut short: the file ends inside the declared header. */
    npy_buf_t cut = {b.bytes, 40, 0};
    expect_error(&cut, KVD_ERR_INVALID,
                 "truncated .npy header: 118 bytes declared, 30 present");

    b.bytes[8] = 0;
    b.bytes[9] = 0;
    expect_error(&b, KVD_ERR_INVALID, "bad .npy header length 0 (need 1..");

    /* A length field one short drops the newline into the data. */
    b.bytes[8] = 117;
    expect_error(&b, KVD_ERR_INVALID,
                 "malformed header: does not end with a newline");
    free(b.bytes);

    npy_buf_t v2 = npy_build(2, 0, F4_3X4, 64, 48);
    v2.bytes[8] = 1;
    v2.bytes[9] = 0;
    v2.bytes[10] = 1; /* 65537 */
    v2.bytes[11] = 0;
    expect_error(&v2, KVD_ERR_INVALID,
                 "bad .npy header length 65537 (need 1..65536)");
    v2.bytes[11] = 0xff; /* ~4 GiB: rejected before any arithmetic */
    expect_error(&v2, KVD_ERR_INVALID, "bad .npy header length");
    free(v2.bytes);
}

static void test_malformed_dicts(void **state)
{
    (void)state;
    /* Unterminated dict: the header ends before '}'. */
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': "
                      "(3, 4), ",
                      48, KVD_ERR_INVALID,
                      "malformed header: expected a quoted string, found end "
                      "of header");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': "
                      "(3, 4)",
                      48, KVD_ERR_INVALID,
                      "malformed header: expected '}' to close the header "
                      "dict, found end of header");
    expect_dict_error("{'descr': '<f4, 'fortran_order': False}", 0,
                      KVD_ERR_INVALID,
                      "malformed header: expected '}' to close the header "
                      "dict, found 'f'");
    expect_dict_error("{'descr' '<f4'}", 0, KVD_ERR_INVALID,
                      "malformed header: expected ':' after a key, found "
                      "'''");
    expect_dict_error("{'descr': '<f4", 0, KVD_ERR_INVALID,
                      "malformed header: unsupported byte 0x0a in a string");
    expect_dict_error("'descr': '<f4'", 0, KVD_ERR_INVALID,
                      "malformed header: expected '{' at the start of the "
                      "header, found '''");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': "
                      "(3, 4), 'extra': 1}",
                      48, KVD_ERR_INVALID,
                      "malformed header: unexpected key 'extra'");
    expect_dict_error("{'descr': '<f4', 'descr': '<f4'}", 0, KVD_ERR_INVALID,
                      "malformed header: key 'descr' appears twice");
    expect_dict_error("{'descr': '<f4', 'shape': (3, 4)}", 48, KVD_ERR_INVALID,
                      "malformed header: key 'fortran_order' is missing");
    expect_dict_error("{'descr': '<f4', 'fortran_order': 0, 'shape': (3, 4)}",
                      48, KVD_ERR_INVALID,
                      "malformed header: 'fortran_order' must be True or "
                      "False");
    expect_dict_error(F4_3X4 "x", 48, KVD_ERR_INVALID,
                      "malformed header: 'x' after the closing '}'");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': "
                      "(-1, 4)}",
                      0, KVD_ERR_INVALID,
                      "malformed header: expected a non-negative shape "
                      "dimension, found '-'");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': "
                      "[3, 4]}",
                      48, KVD_ERR_INVALID,
                      "malformed header: expected '(' to open 'shape', found "
                      "'['");
    expect_dict_error("{'descr': '<f\\x34'}", 0, KVD_ERR_INVALID,
                      "malformed header: unsupported byte 0x5c in a string");
}

static void test_unsupported_dtypes(void **state)
{
    (void)state;
    static const char *dtypes[] = {"<f8", ">f4", ">f2", "<i4", "|u1",
                                   "|f2", "=f4", "<c8", ""};
    for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++) {
        char dict[160], want[96];
        snprintf(dict, sizeof(dict),
                 "{'descr': '%s', 'fortran_order': False, 'shape': (3, 4), }",
                 dtypes[i]);
        snprintf(want, sizeof(want),
                 "unsupported dtype '%s': need '<f2' (float16) or '<f4' "
                 "(float32)",
                 dtypes[i]);
        expect_dict_error(dict, 48, KVD_ERR_UNSUPPORTED, want);
    }
    expect_dict_error("{'descr': [('x', '<f4')], 'fortran_order': False, "
                      "'shape': (3, 4), }",
                      48, KVD_ERR_UNSUPPORTED,
                      "structured dtypes are not supported");
    expect_dict_error(
        "{'descr': '<f4aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',"
        " 'fortran_order': False, 'shape': (3, 4), }",
        48, KVD_ERR_UNSUPPORTED,
        "unsupported dtype '<f4aaaaaaaaaaaaaaaaaaaaaaaaaaaaa...'");
}

static void test_fortran_order_and_shapes(void **state)
{
    (void)state;
    expect_dict_error("{'descr': '<f4', 'fortran_order': True, 'shape': "
                      "(3, 4), }",
                      48, KVD_ERR_UNSUPPORTED,
                      "fortran_order True is not supported");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': "
                      "(12,), }",
                      48, KVD_ERR_UNSUPPORTED,
                      "shape (12,) has 1 dimension: need 2 ([vectors, "
                      "head_dim])");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': "
                      "(2, 3, 2), }",
                      48, KVD_ERR_UNSUPPORTED,
                      "shape (2, 3, 2) has 3 dimensions: need 2");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': (), "
                      "}",
                      4, KVD_ERR_UNSUPPORTED, "shape () has 0 dimensions");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': "
                      "(0, 4), }",
                      0, KVD_ERR_UNSUPPORTED,
                      "shape (0, 4) is empty: need at least one vector of at "
                      "least one element");
    expect_dict_error("{'descr': '<f2', 'fortran_order': False, 'shape': "
                      "(5, 0), }",
                      0, KVD_ERR_UNSUPPORTED, "shape (5, 0) is empty");
}

static void test_huge_dims_overflow(void **state)
{
    (void)state;
    /* 2^32 * 2^32 elements: the element count itself wraps. */
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': "
                      "(4294967296, 4294967296), }",
                      48, KVD_ERR_RANGE,
                      "shape (4294967296, 4294967296) is too large: its byte "
                      "size overflows");
    /* 2^62 elements fit, their bytes do not. */
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': "
                      "(4611686018427387904, 1), }",
                      48, KVD_ERR_RANGE, "is too large");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': "
                      "(18446744073709551616, 1), }",
                      48, KVD_ERR_RANGE,
                      "shape dimension does not fit in 64 bits");
    /* Large but representable: reported as truncated data, not allocated. */
    expect_dict_error("{'descr': '<f2', 'fortran_order': False, 'shape': "
                      "(1000000000, 1000), }",
                      48, KVD_ERR_INVALID,
                      "truncated data: shape (1000000000, 1000) float16 needs "
                      "2000000000000 bytes, file has 48");
}

static void test_data_size(void **state)
{
    (void)state;
    expect_dict_error(F4_3X4, 47, KVD_ERR_INVALID,
                      "truncated data: shape (3, 4) float32 needs 48 bytes, "
                      "file has 47");
    expect_dict_error(F4_3X4, 0, KVD_ERR_INVALID,
                      "truncated data: shape (3, 4) float32 needs 48 bytes, "
                      "file has 0");
    expect_dict_error(F2_3X4, 25, KVD_ERR_INVALID,
                      "1 trailing byte after the 24 data bytes of shape (3, "
                      "4)");
    expect_dict_error(F2_3X4, 48, KVD_ERR_INVALID,
                      "24 trailing bytes after the 24 data bytes");
}

static void test_null_arguments(void **state)
{
    (void)state;
    kvd_npy_array_t a;
    char err[64];
    assert_int_equal(kvd_npy_parse(NULL, 10, &a, err, sizeof(err)),
                     KVD_ERR_INVALID);
    assert_string_equal(err, "invalid arguments");
    npy_buf_t b = npy_build(1, 0, F4_3X4, 64, 48);
    assert_int_equal(kvd_npy_parse(b.bytes, b.len, NULL, err, sizeof(err)),
                     KVD_ERR_INVALID);
    /* A tiny error buffer is truncated, never overrun. */
    char tiny[8];
    b.bytes[0] = 0;
    assert_int_equal(kvd_npy_parse(b.bytes, b.len, &a, tiny, sizeof(tiny)),
                     KVD_ERR_INVALID);
    assert_string_equal(tiny, "not an ");
    free(b.bytes);
}

static void test_file_load(void **state)
{
    (void)state;
    char path[] = "/tmp/kvd_test_npy_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    npy_buf_t b = npy_build(1, 0, F2_3X4, 64, 24);
    assert_int_equal(write(fd, b.bytes, b.len), (ssize_t)b.len);
    close(fd);

    void *buf = NULL;
    size_t len = 0;
    char err[256];
    assert_int_equal(kvd_npy_file_load(path, &buf, &len, err, sizeof(err)),
                     KVD_OK);
    assert_int_equal(len, b.len);
    assert_memory_equal(buf, b.bytes, b.len);
    kvd_npy_array_t a;
    assert_int_equal(kvd_npy_parse(buf, len, &a, err, sizeof(err)), KVD_OK);
    assert_int_equal(a.rows, 3);
    free(buf);
    unlink(path);
    free(b.bytes);

    buf = NULL;
    assert_int_equal(kvd_npy_file_load(path, &buf, &len, err, sizeof(err)),
                     KVD_ERR_NOT_FOUND);
    assert_null(buf);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "No such file or directory"));
    assert_int_equal(kvd_npy_file_load("/tmp", &buf, &len, err, sizeof(err)),
                     KVD_ERR_INVALID);
    assert_string_equal(err, "/tmp: not a regular file");
    assert_null(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_v1_f2),
        cmocka_unit_test(test_valid_v2_and_v3_f4),
        cmocka_unit_test(test_valid_variants),
        cmocka_unit_test(test_bad_magic_and_preamble),
        cmocka_unit_test(test_bad_version),
        cmocka_unit_test(test_header_length_and_truncation),
        cmocka_unit_test(test_malformed_dicts),
        cmocka_unit_test(test_unsupported_dtypes),
        cmocka_unit_test(test_fortran_order_and_shapes),
        cmocka_unit_test(test_huge_dims_overflow),
        cmocka_unit_test(test_data_size),
        cmocka_unit_test(test_null_arguments),
        cmocka_unit_test(test_file_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
