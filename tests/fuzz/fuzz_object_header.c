/*
 * libFuzzer target for the object header parser (kernels/ref/header.c),
 * which reads the last 128 bytes of every object loaded from any tier or
 * node. Besides "no crash, no out-of-bounds read" it checks what a reader
 * relies on after a successful parse: the format passes
 * kvd_object_format_check, the payload size is that format's, packing the
 * parsed header again gives back the same bytes (so the parse lost
 * nothing and accepted no alternative spelling), and the full check of an
 * object built around it accepts it for its own key and refuses it for
 * another. Every refusal explains itself.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvdepot/kernels.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvd_object_header_t h;
    char err[256];
    err[0] = '\0';
    kvd_status_t st = kvd_object_header_unpack(data, size, &h, err, sizeof err);
    if (st != KVD_OK) {
        if (st != KVD_ERR_CORRUPT || memchr(err, '\0', sizeof err) == NULL ||
            err[0] == '\0') {
            abort();
        }
        return 0;
    }
    if (kvd_object_format_check(&h.format, NULL, 0) != KVD_OK ||
        h.payload_bytes != kvd_object_bytes(&h.format) ||
        h.version != KVD_OBJECT_FORMAT_V) {
        abort();
    }
    uint8_t again[KVD_OBJECT_HEADER_BYTES];
    if (kvd_object_header_pack(&h.format, &h.ns, &h.hash, again) != KVD_OK ||
        memcmp(again, data, sizeof again) != 0) {
        abort();
    }
    /* A whole object around it: accepted for its key, not for another.
     * Payloads of large formats are not allocated (size check only). */
    if (h.payload_bytes > ((size_t)1 << 20)) {
        return 0;
    }
    size_t total = (size_t)h.payload_bytes + KVD_OBJECT_HEADER_BYTES;
    uint8_t *obj = calloc(1, total);
    if (obj == NULL) {
        return 0;
    }
    memcpy(obj + h.payload_bytes, data, KVD_OBJECT_HEADER_BYTES);
    kvd_block_hash_t other = h.hash;
    other.bytes[0] ^= 1;
    if (kvd_object_header_check(&h.format, &h.ns, &h.hash, obj, total, NULL,
                                0) != KVD_OK ||
        kvd_object_header_check(&h.format, &h.ns, &other, obj, total, err,
                                sizeof err) != KVD_ERR_CORRUPT ||
        kvd_object_header_check(&h.format, &h.ns, &h.hash, obj, total - 1, NULL,
                                0) != KVD_ERR_CORRUPT) {
        abort();
    }
    free(obj);
    return 0;
}
