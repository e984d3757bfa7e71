/*
 * A small canonical-CBOR encoder (RFC 8949 §4.2.1, core deterministic
 * encoding) for the few types kvdepot hashes and exchanges: unsigned and
 * negative integers, byte strings, text strings, definite-length arrays,
 * null and booleans. Every head uses the shortest form, so two encoders fed
 * the same values produce the same bytes; that is what makes block hashes
 * agree with Python's cbor2.dumps(..., canonical=True) (architecture.md §5).
 *
 * The encoder writes into storage the caller provides (usually a stack
 * buffer) and, when created with KVD_CBOR_ENC_GROW, moves to a heap buffer
 * it owns once that storage is full. Errors are latched: the first failure
 * is remembered, every later kvd_cbor_pack_* call is a no-op, and the caller
 * checks once at the end with kvd_cbor_enc_get() or kvd_cbor_enc_status().
 *
 * Ownership: `storage` is borrowed until kvd_cbor_enc_cleanup(); the heap
 * buffer (if any) belongs to the encoder and is freed by cleanup. Pointers
 * returned by kvd_cbor_enc_get() stay valid until the next pack, reset or
 * cleanup on the same encoder.
 *
 * Threading: an encoder is used by one thread at a time; distinct encoders
 * are independent. No function here logs or takes locks.
 *
 * Errors (latched): KVD_ERR_RANGE when the output would not fit and growth
 * is not allowed, or would exceed KVD_CBOR_MAX_BYTES; KVD_ERR_NOMEM when the
 * heap buffer cannot be grown (failpoint "cbor.grow" injects it);
 * KVD_ERR_INVALID for a NULL pointer with a non-zero length.
 */
#ifndef KVD_COMMON_CBOR_INT_H
#define KVD_COMMON_CBOR_INT_H

/* Largest encoding an encoder will produce. Block-hash preimages are a few
 * hundred bytes; the bound keeps an absurd length from ever reaching
 * malloc. */
#define KVD_CBOR_MAX_BYTES ((size_t)1 << 30)

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvdepot/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Flags for kvd_cbor_enc_init. */
enum {
    /* Move to a heap buffer when the caller's storage is full. */
    KVD_CBOR_ENC_GROW = 1u << 0
};

/* Encoder state; lives in the caller's storage. Read its fields only
 * through the functions below. */
typedef struct kvd_cbor_enc {
    uint8_t *buf;        /* where bytes go: `storage` or `heap` */
    size_t len;          /* bytes written */
    size_t cap;          /* size of `buf` */
    uint8_t *heap;       /* owned buffer once grown, else NULL */
    unsigned flags;      /* KVD_CBOR_ENC_* */
    kvd_status_t status; /* first error, or KVD_OK */
} kvd_cbor_enc_t;

/*
 * Prepares `enc` to write into `storage` (`storage_bytes` long; NULL with 0
 * is allowed and, with KVD_CBOR_ENC_GROW, starts on the heap at the first
 * write). Never fails: a NULL `storage` with a non-zero size latches
 * KVD_ERR_INVALID.
 */
void kvd_cbor_enc_init(kvd_cbor_enc_t *enc, void *storage, size_t storage_bytes,
                       unsigned flags);

/* Frees the heap buffer, if any. `enc` may be NULL. The encoder must be
 * initialised again before reuse. */
void kvd_cbor_enc_cleanup(kvd_cbor_enc_t *enc);

/*
 * Empties the encoder for a new item and clears any latched error, keeping
 * whichever buffer it currently writes into (a grown heap buffer is reused,
 * so a loop that encodes many items allocates at most a few times).
 */
void kvd_cbor_enc_reset(kvd_cbor_enc_t *enc);

/* The latched status: KVD_OK or the first error. */
kvd_status_t kvd_cbor_enc_status(const kvd_cbor_enc_t *enc);

/*
 * Returns the latched status; on KVD_OK writes the encoded bytes and their
 * length to `*data_out` and `*len_out` (valid until the next pack, reset or
 * cleanup). On error the out-parameters are not written.
 */
kvd_status_t kvd_cbor_enc_get(const kvd_cbor_enc_t *enc,
                              const uint8_t **data_out, size_t *len_out);

/* Major type 0: an unsigned integer, shortest head. */
void kvd_cbor_pack_uint(kvd_cbor_enc_t *enc, uint64_t value);

/* Major type 0 for value >= 0, else major type 1 (-1 - n). */
void kvd_cbor_pack_int(kvd_cbor_enc_t *enc, int64_t value);

/* Major type 1 with argument n, i.e. the integer -1 - n; reaches
 * -2^64, which int64_t cannot hold. */
void kvd_cbor_pack_negative(kvd_cbor_enc_t *enc, uint64_t n);

/* Major type 2: `len` bytes from `data` (NULL allowed when len is 0). */
void kvd_cbor_pack_bytes(kvd_cbor_enc_t *enc, const void *data, size_t len);

/* Major type 3: `len` bytes of UTF-8 from `text` (NULL allowed when len is
 * 0). The bytes are copied as given; UTF-8 validity is the caller's. */
void kvd_cbor_pack_text(kvd_cbor_enc_t *enc, const char *text, size_t len);

/* Major type 4 head of a definite-length array; the caller then packs
 * exactly `count` items. */
void kvd_cbor_pack_array(kvd_cbor_enc_t *enc, uint64_t count);

/* A definite-length array of `count` unsigned integers, the same bytes as
 * kvd_cbor_pack_array(count) followed by kvd_cbor_pack_uint() per value,
 * written with one reservation (NULL `values` allowed when count is 0).
 * Either the whole array is written or nothing. */
void kvd_cbor_pack_uint32_array(kvd_cbor_enc_t *enc, const uint32_t *values,
                                size_t count);

/* Simple values: null (0xf6), false (0xf4), true (0xf5). */
void kvd_cbor_pack_null(kvd_cbor_enc_t *enc);
void kvd_cbor_pack_bool(kvd_cbor_enc_t *enc, bool value);

#ifdef __cplusplus
}
#endif

#endif /* KVD_COMMON_CBOR_INT_H */
