/*
 * Canonical-CBOR encoder (contracts in cbor_int.h).
 *
 * Every item starts with a head: the major type in the top three bits and
 * an argument that RFC 8949 §4.2.1 requires in its shortest form (inline
 * below 24, then 1, 2, 4 or 8 big-endian bytes). All writers funnel through
 * kvd_cbor_enc_reserve(), which is the only place that grows the buffer or
 * latches a capacity error, and heads are written straight into the
 * reserved bytes. The block hasher's token list, the one per-item loop on a
 * hot path, has its own packer that sizes the whole array first and
 * reserves once.
 */
#include <stdlib.h>
#include <string.h>

#include "common/cbor_int.h"
#include "common/failpoint_int.h"

#define KVD_CBOR_MAJOR_UINT 0u
#define KVD_CBOR_MAJOR_NEGATIVE 1u
#define KVD_CBOR_MAJOR_BYTES 2u
#define KVD_CBOR_MAJOR_TEXT 3u
#define KVD_CBOR_MAJOR_ARRAY 4u

#define KVD_CBOR_SIMPLE_FALSE 0xf4u
#define KVD_CBOR_SIMPLE_TRUE 0xf5u
#define KVD_CBOR_SIMPLE_NULL 0xf6u

/* First heap buffer: big enough that a growing encoder reallocates rarely. */
#define KVD_CBOR_MIN_HEAP_BYTES 256u

void kvd_cbor_enc_init(kvd_cbor_enc_t *enc, void *storage, size_t storage_bytes,
                       unsigned flags)
{
    enc->buf = storage;
    enc->len = 0;
    enc->cap = storage != NULL ? storage_bytes : 0;
    enc->heap = NULL;
    enc->flags = flags;
    enc->status =
        (storage == NULL && storage_bytes != 0) ? KVD_ERR_INVALID : KVD_OK;
}

void kvd_cbor_enc_cleanup(kvd_cbor_enc_t *enc)
{
    if (enc == NULL) {
        return;
    }
    free(enc->heap);
    enc->heap = NULL;
    enc->buf = NULL;
    enc->cap = 0;
    enc->len = 0;
}

void kvd_cbor_enc_reset(kvd_cbor_enc_t *enc)
{
    /* Safe even after init latched INVALID for NULL storage: cap is 0 then,
     * so the next write grows to the heap or fails with RANGE. */
    enc->len = 0;
    enc->status = KVD_OK;
}

kvd_status_t kvd_cbor_enc_status(const kvd_cbor_enc_t *enc)
{
    return enc->status;
}

kvd_status_t kvd_cbor_enc_get(const kvd_cbor_enc_t *enc,
                              const uint8_t **data_out, size_t *len_out)
{
    if (enc->status != KVD_OK) {
        return enc->status;
    }
    *data_out = enc->buf;
    *len_out = enc->len;
    return KVD_OK;
}

/* Grows the buffer so that `extra` more bytes fit. The new capacity at
 * least doubles, so n appends cost O(n) copying in total. */
__attribute__((noinline)) static kvd_status_t
kvd_cbor_enc_grow(kvd_cbor_enc_t *enc, size_t extra)
{
    size_t need;
    size_t cap;
    uint8_t *heap;

    if ((enc->flags & KVD_CBOR_ENC_GROW) == 0) {
        return KVD_ERR_RANGE;
    }
    if (extra > KVD_CBOR_MAX_BYTES || enc->len > KVD_CBOR_MAX_BYTES - extra) {
        return KVD_ERR_RANGE;
    }
    if (KVD_FAILPOINT("cbor.grow") != 0) {
        return KVD_ERR_NOMEM;
    }
    need = enc->len + extra;
    cap =
        enc->cap < KVD_CBOR_MIN_HEAP_BYTES ? KVD_CBOR_MIN_HEAP_BYTES : enc->cap;
    while (cap < need) {
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    }

    if (enc->heap != NULL) {
        heap = realloc(enc->heap, cap);
        if (heap == NULL) {
            return KVD_ERR_NOMEM;
        }
    } else {
        /* Leaving the caller's storage: copy what is already encoded. */
        heap = malloc(cap);
        if (heap == NULL) {
            return KVD_ERR_NOMEM;
        }
        if (enc->len != 0) {
            memcpy(heap, enc->buf, enc->len);
        }
    }
    enc->heap = heap;
    enc->buf = heap;
    enc->cap = cap;
    return KVD_OK;
}

/* Returns where `extra` bytes may be written and accounts for them, or NULL
 * with the error latched. Inline so the common case (room left, no error)
 * costs two compares; growth stays out of line. */
static inline uint8_t *kvd_cbor_enc_reserve(kvd_cbor_enc_t *enc, size_t extra)
{
    uint8_t *dst;

    if (enc->status != KVD_OK) {
        return NULL;
    }
    if (extra > enc->cap - enc->len) {
        kvd_status_t status = kvd_cbor_enc_grow(enc, extra);
        if (status != KVD_OK) {
            enc->status = status;
            return NULL;
        }
    }
    dst = enc->buf + enc->len;
    enc->len += extra;
    return dst;
}

/* Length of the shortest head whose argument is `arg`. */
static inline size_t kvd_cbor_head_len(uint64_t arg)
{
    if (arg < 24) {
        return 1;
    }
    if (arg <= UINT8_MAX) {
        return 2;
    }
    if (arg <= UINT16_MAX) {
        return 3;
    }
    return arg <= UINT32_MAX ? 5 : 9;
}

/* Writes the head of length `n` (from kvd_cbor_head_len) for (major, arg)
 * to `dst`, big-endian as RFC 8949 §3 requires. */
static inline void kvd_cbor_head_write(uint8_t *dst, size_t n, unsigned major,
                                       uint64_t arg)
{
    uint8_t mt = (uint8_t)(major << 5);

    switch (n) {
    case 1: dst[0] = (uint8_t)(mt | arg); return;
    case 2: dst[0] = (uint8_t)(mt | 24u); break;
    case 3: dst[0] = (uint8_t)(mt | 25u); break;
    case 5: dst[0] = (uint8_t)(mt | 26u); break;
    default: dst[0] = (uint8_t)(mt | 27u); break;
    }
    for (size_t i = 1; i < n; i++) {
        dst[i] = (uint8_t)(arg >> (8 * (n - 1 - i)));
    }
}

static void kvd_cbor_pack_head(kvd_cbor_enc_t *enc, unsigned major,
                               uint64_t arg)
{
    size_t n = kvd_cbor_head_len(arg);
    uint8_t *dst = kvd_cbor_enc_reserve(enc, n);

    if (dst != NULL) {
        kvd_cbor_head_write(dst, n, major, arg);
    }
}

/* A head followed by `len` payload bytes, reserved together so a string is
 * either written whole or not at all. */
static void kvd_cbor_pack_string(kvd_cbor_enc_t *enc, unsigned major,
                                 const void *data, size_t len)
{
    size_t n;
    uint8_t *dst;

    if (enc->status != KVD_OK) {
        return;
    }
    if (data == NULL && len != 0) {
        enc->status = KVD_ERR_INVALID;
        return;
    }
    n = kvd_cbor_head_len((uint64_t)len);
    if (len > SIZE_MAX - n) {
        enc->status = KVD_ERR_RANGE;
        return;
    }
    dst = kvd_cbor_enc_reserve(enc, n + len);
    if (dst == NULL) {
        return;
    }
    kvd_cbor_head_write(dst, n, major, (uint64_t)len);
    if (len != 0) {
        memcpy(dst + n, data, len);
    }
}

void kvd_cbor_pack_uint(kvd_cbor_enc_t *enc, uint64_t value)
{
    kvd_cbor_pack_head(enc, KVD_CBOR_MAJOR_UINT, value);
}

void kvd_cbor_pack_negative(kvd_cbor_enc_t *enc, uint64_t n)
{
    kvd_cbor_pack_head(enc, KVD_CBOR_MAJOR_NEGATIVE, n);
}

void kvd_cbor_pack_int(kvd_cbor_enc_t *enc, int64_t value)
{
    if (value >= 0) {
        kvd_cbor_pack_head(enc, KVD_CBOR_MAJOR_UINT, (uint64_t)value);
    } else {
        /* -1 - value without signed overflow: ~v == -1 - v in two's
         * complement, and INT64_MIN maps to 2^63 - 1. */
        kvd_cbor_pack_head(enc, KVD_CBOR_MAJOR_NEGATIVE, ~(uint64_t)value);
    }
}

void kvd_cbor_pack_bytes(kvd_cbor_enc_t *enc, const void *data, size_t len)
{
    kvd_cbor_pack_string(enc, KVD_CBOR_MAJOR_BYTES, data, len);
}

void kvd_cbor_pack_text(kvd_cbor_enc_t *enc, const char *text, size_t len)
{
    kvd_cbor_pack_string(enc, KVD_CBOR_MAJOR_TEXT, text, len);
}

void kvd_cbor_pack_array(kvd_cbor_enc_t *enc, uint64_t count)
{
    kvd_cbor_pack_head(enc, KVD_CBOR_MAJOR_ARRAY, count);
}

void kvd_cbor_pack_uint32_array(kvd_cbor_enc_t *enc, const uint32_t *values,
                                size_t count)
{
    size_t head;
    size_t len;
    uint8_t *dst;

    if (enc->status != KVD_OK) {
        return;
    }
    if (values == NULL && count != 0) {
        enc->status = KVD_ERR_INVALID;
        return;
    }
    /* Exact size first (at most 5 bytes per item), so a fixed buffer that
     * holds the array exactly is not refused, then one reservation and
     * straight stores: this is the block hasher's per-token loop. */
    head = kvd_cbor_head_len((uint64_t)count);
    if (count > (SIZE_MAX - head) / 5) {
        enc->status = KVD_ERR_RANGE;
        return;
    }
    len = head;
    for (size_t i = 0; i < count; i++) {
        len += kvd_cbor_head_len(values[i]);
    }
    dst = kvd_cbor_enc_reserve(enc, len);
    if (dst == NULL) {
        return;
    }
    kvd_cbor_head_write(dst, head, KVD_CBOR_MAJOR_ARRAY, (uint64_t)count);
    dst += head;
    for (size_t i = 0; i < count; i++) {
        size_t n = kvd_cbor_head_len(values[i]);
        kvd_cbor_head_write(dst, n, KVD_CBOR_MAJOR_UINT, values[i]);
        dst += n;
    }
}

static void kvd_cbor_pack_simple(kvd_cbor_enc_t *enc, uint8_t byte)
{
    uint8_t *dst = kvd_cbor_enc_reserve(enc, 1);

    if (dst != NULL) {
        *dst = byte;
    }
}

void kvd_cbor_pack_null(kvd_cbor_enc_t *enc)
{
    kvd_cbor_pack_simple(enc, KVD_CBOR_SIMPLE_NULL);
}

void kvd_cbor_pack_bool(kvd_cbor_enc_t *enc, bool value)
{
    kvd_cbor_pack_simple(enc,
                         value ? KVD_CBOR_SIMPLE_TRUE : KVD_CBOR_SIMPLE_FALSE);
}
