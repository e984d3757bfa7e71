/*
 * Strict reader for NumPy .npy files holding a 2-D little-endian float16 or
 * float32 array, the shape `kvdepot codec-eval` accepts as a dump of a
 * model's K or V ([vectors, head_dim]).
 *
 * The parser works on a memory buffer so it can be fuzzed
 * (tests/fuzz/fuzz_npy.c); kvd_npy_file_load only reads a file into memory.
 * It never trusts a length from the file: the header length, every shape
 * dimension and the data size are checked for overflow and against the
 * buffer before anything is indexed.
 *
 * Accepted (anything else is an error whose text names what was found):
 *   - magic "\x93NUMPY", format version 1.0, 2.0 or 3.0 (header length as
 *     little-endian u16 for 1.0, u32 for 2.0 and 3.0), header length at
 *     most KVD_NPY_MAX_HEADER_BYTES;
 *   - a header that is a Python dict literal with exactly the keys 'descr',
 *     'fortran_order' and 'shape' in any order, optionally followed by a
 *     trailing comma, then only spaces and the closing newline;
 *   - 'descr' '<f2' or '<f4' (big-endian, other widths, integers and
 *     structured dtypes are rejected), 'fortran_order' False, 'shape' a
 *     tuple of exactly two integers, both >= 1;
 *   - data of exactly rows*cols*element bytes right after the header.
 *     Trailing bytes after the data are rejected: a file holding more than
 *     its header describes (several arrays saved into one file, a broken
 *     copy) should not be silently cut short.
 *
 * Threading: every function is reentrant.
 */
#ifndef KVD_CLI_NPY_INT_H
#define KVD_CLI_NPY_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kvdepot/common.h"

/* numpy itself refuses headers above 10000 bytes by default; ours are a
 * few dozen bytes, so this only bounds what a hostile file can make us
 * scan. */
#define KVD_NPY_MAX_HEADER_BYTES 65536u

/* A parsed array. `data` points into the caller's buffer and is valid as
 * long as that buffer is; it has no alignment guarantee (read elements with
 * memcpy). */
typedef struct kvd_npy_array {
    unsigned version_major; /* 1, 2 or 3 */
    size_t elem_bytes;      /* 2 (float16) or 4 (float32) */
    uint64_t rows;          /* shape[0] >= 1 */
    uint64_t cols;          /* shape[1] >= 1 */
    size_t data_offset;     /* bytes from the start of the buffer */
    size_t data_bytes;      /* rows * cols * elem_bytes */
    const void *data;
} kvd_npy_array_t;

/*
 * Parses `len` bytes at `buf` as an .npy file. On success fills *array_out.
 * Errors, each with a one-line reason in `err` (NUL-terminated, at most
 * `err_len` bytes; `err` may be NULL):
 *   KVD_ERR_INVALID      not an .npy file or a malformed/truncated one
 *                        (bad magic, version, header, data size);
 *   KVD_ERR_UNSUPPORTED  a well-formed .npy this reader does not take
 *                        (dtype other than '<f2'/'<f4', Fortran order,
 *                        not 2-D, a zero dimension);
 *   KVD_ERR_RANGE        a shape whose byte size overflows.
 * `buf` is borrowed for the call (and by array_out->data afterwards).
 */
kvd_status_t kvd_npy_parse(const void *buf, size_t len,
                           kvd_npy_array_t *array_out, char *err,
                           size_t err_len);

/*
 * Reads the whole file at `path` into a malloc'd buffer, returned with its
 * length; the caller frees it with free(). Errors: kvd_status_from_errno of
 * the failing call (KVD_ERR_NOT_FOUND for a missing file, KVD_ERR_AUTH,
 * KVD_ERR_IO, ...), KVD_ERR_INVALID for a directory, KVD_ERR_RANGE for a
 * file larger than memory can address, KVD_ERR_NOMEM; the path and the
 * system's reason are written into `err`.
 */
kvd_status_t kvd_npy_file_load(const char *path, void **buf_out,
                               size_t *len_out, char *err, size_t err_len);

#endif /* KVD_CLI_NPY_INT_H */
