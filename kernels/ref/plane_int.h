/*
 * Internal entry points of plane.c for gather.c: the plane codecs split
 * into "check the arguments" and "run on arguments already checked, with
 * caller scratch". gather/scatter validate every block before touching any
 * object and allocate their scratch once, so a failure can never happen
 * after the first byte was written; the public kvd_ref_plane_encode/decode
 * are these two steps plus a malloc. Also the codec properties that
 * format.c and plane.c both need, and the reason writer of the format and
 * header checks.
 */
#ifndef KVD_KERNELS_REF_PLANE_INT_H
#define KVD_KERNELS_REF_PLANE_INT_H

#include <stddef.h>

#include "kernels/ref/ref.h"

/* Writes a reason into err (if any, at most err_len bytes) and returns
 * `status`, so checks read as one line each (format.c, header.c). */
__attribute__((format(printf, 4, 5))) kvd_status_t
kvd_format_fail(kvd_status_t status, char *err, size_t err_len, const char *fmt,
                ...);

/* Codec properties shared by format.c (region sizes) and plane.c. */
static inline int kvd_codec_is_kivi(kvd_codec_t c)
{
    return c == KVD_CODEC_KIVI4 || c == KVD_CODEC_KIVI2;
}

static inline int kvd_codec_is_tq(kvd_codec_t c)
{
    return c == KVD_CODEC_TQ4 || c == KVD_CODEC_TQ3 || c == KVD_CODEC_TQ2;
}

/* Bits per stored code: 8 for fp8/int8 (raw is not a code). */
static inline unsigned kvd_codec_bits(kvd_codec_t c)
{
    switch (c) {
    case KVD_CODEC_KIVI2:
    case KVD_CODEC_TQ2: return 2;
    case KVD_CODEC_TQ3: return 3;
    case KVD_CODEC_KIVI4:
    case KVD_CODEC_TQ4: return 4;
    default: return 8;
    }
}

/* Everything kvd_ref_plane_encode/decode reject, except NULL buffers:
 * format, plane index, valid token count (1..block_size), and tables (non-
 * NULL and made for this head_dim and seed when the plane uses TurboQuant).
 * KVD_OK or KVD_ERR_INVALID / KVD_ERR_UNSUPPORTED; logs the reason. */
/* The object offsets of heads [head_start, ..) of layer `layer` in each
 * plane's data and metadata region of an object of format `object`
 * (shard.c; the caller checked the split). */
void kvd_shard_regions(const kvd_object_format_t *object, uint32_t head_start,
                       unsigned layer, size_t data_off[2], size_t meta_off[2]);

kvd_status_t kvd_ref_plane_args_check(const kvd_object_format_t *fmt,
                                      const kvd_codec_tables_t *tables,
                                      unsigned plane,
                                      uint32_t num_valid_tokens);

/* Floats of scratch the _buf functions need for `plane`: 0 for raw,
 * heads*block_size*head_dim otherwise. */
size_t kvd_ref_plane_scratch_floats(const kvd_object_format_t *fmt,
                                    unsigned plane);

/* kvd_ref_plane_encode/decode on checked arguments; `scratch` holds
 * kvd_ref_plane_scratch_floats(fmt, plane) floats (may be NULL when 0).
 * data/meta must be 16-byte aligned. Cannot fail. */
void kvd_ref_plane_encode_buf(const kvd_object_format_t *fmt,
                              const kvd_codec_tables_t *tables, unsigned plane,
                              const void *src, uint32_t num_valid_tokens,
                              void *data, void *meta, float *scratch);
void kvd_ref_plane_decode_buf(const kvd_object_format_t *fmt,
                              const kvd_codec_tables_t *tables, unsigned plane,
                              const void *data, const void *meta,
                              uint32_t num_valid_tokens, void *dst,
                              float *scratch);

#endif /* KVD_KERNELS_REF_PLANE_INT_H */
