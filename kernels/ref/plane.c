/*
 * One plane of one block through a codec: the [head][token][channel] block
 * in the cache dtype on one side, the object's data and metadata regions on
 * the other (kvdepot/kernels.h, ref.h).
 *
 * raw copies bytes, which keeps it exact for every dtype (fp8 caches
 * included) and makes it the memcpy the CUDA path hands to the copy
 * engine. Every other codec sees floats: valid tokens are converted
 * exactly from fp16/bf16, invalid ones are zero, the codec runs, and
 * decode converts back with round-to-nearest-even.
 *
 * Encode first zeroes both regions, padding included, so an object's bytes
 * are a function of the valid tokens alone: whatever the cache held in
 * unused slots never reaches a checksum or a deduplicated store.
 */
#include <stdlib.h>
#include <string.h>

#include "common/log_int.h"
#include "kernels/ref/plane_int.h"

kvd_status_t kvd_ref_plane_args_check(const kvd_object_format_t *fmt,
                                      const kvd_codec_tables_t *tables,
                                      unsigned plane, uint32_t num_valid_tokens)
{
    char why[160];
    kvd_status_t st = kvd_object_format_check(fmt, why, sizeof(why));

    if (st != KVD_OK) {
        KVD_LOG_ERROR("bad object format: %s", why);
        return st;
    }
    if (plane >= fmt->num_planes) {
        KVD_LOG_ERROR("plane %u but the format has %u", plane, fmt->num_planes);
        return KVD_ERR_INVALID;
    }
    if (num_valid_tokens < 1 || num_valid_tokens > fmt->block_size) {
        KVD_LOG_ERROR("%u valid tokens, block_size %u", num_valid_tokens,
                      fmt->block_size);
        return KVD_ERR_INVALID;
    }
    if (kvd_codec_is_tq(fmt->codec[plane])) {
        /* Tables built for another head_dim or seed would decode to
         * garbage without any other symptom. */
        if (tables == NULL || tables->fmt.head_dim != fmt->head_dim ||
            tables->fmt.tq_seed != fmt->tq_seed) {
            KVD_LOG_ERROR("plane %u uses %s: codec tables missing or built "
                          "for another head_dim/seed",
                          plane, kvd_codec_name(fmt->codec[plane]));
            return KVD_ERR_INVALID;
        }
    }
    return KVD_OK;
}

size_t kvd_ref_plane_scratch_floats(const kvd_object_format_t *fmt,
                                    unsigned plane)
{
    if (fmt->codec[plane] == KVD_CODEC_RAW) {
        return 0;
    }
    return (size_t)fmt->num_heads * fmt->block_size * fmt->head_dim;
}

static kvd_plane_dims_t kvd_plane_dims(const kvd_object_format_t *fmt,
                                       uint32_t num_valid_tokens)
{
    kvd_plane_dims_t d = {fmt->num_heads, fmt->block_size, fmt->head_dim,
                          num_valid_tokens};
    return d;
}

void kvd_ref_plane_encode_buf(const kvd_object_format_t *fmt,
                              const kvd_codec_tables_t *tables, unsigned plane,
                              const void *src, uint32_t num_valid_tokens,
                              void *data, void *meta, float *scratch)
{
    kvd_codec_t codec = fmt->codec[plane];
    size_t elt = kvd_dtype_size(fmt->dtype);
    size_t head_elems = (size_t)fmt->block_size * fmt->head_dim;
    size_t valid_elems = (size_t)num_valid_tokens * fmt->head_dim;
    const unsigned char *s = src;

    size_t meta_bytes = kvd_object_plane_meta_bytes(fmt, plane);
    memset(data, 0, kvd_object_plane_data_bytes(fmt, plane));
    if (meta_bytes != 0) {
        memset(meta, 0, meta_bytes);
    }

    if (codec == KVD_CODEC_RAW) {
        unsigned char *out = data;
        for (uint32_t h = 0; h < fmt->num_heads; h++) {
            memcpy(out + h * head_elems * elt, s + h * head_elems * elt,
                   valid_elems * elt);
        }
        return;
    }

    for (uint32_t h = 0; h < fmt->num_heads; h++) {
        float *x = scratch + h * head_elems;
        kvd_ref_load_f32(fmt->dtype, s + h * head_elems * elt, x, valid_elems);
        memset(x + valid_elems, 0, (head_elems - valid_elems) * sizeof(float));
    }
    kvd_plane_dims_t d = kvd_plane_dims(fmt, num_valid_tokens);
    unsigned bits = kvd_codec_bits(codec);
    switch (codec) {
    case KVD_CODEC_FP8_E4M3: kvd_ref_fp8_encode(&d, scratch, data, meta); break;
    case KVD_CODEC_INT8:
        kvd_ref_int8_encode(&d, (kvd_plane_t)plane, scratch, data, meta);
        break;
    case KVD_CODEC_KIVI4:
    case KVD_CODEC_KIVI2:
        kvd_ref_kivi_encode(&d, bits, (kvd_plane_t)plane, scratch, data, meta);
        break;
    case KVD_CODEC_TQ4:
    case KVD_CODEC_TQ3:
    case KVD_CODEC_TQ2:
        kvd_ref_tq_encode(&d, bits, tables, scratch, data, meta);
        break;
    case KVD_CODEC_RAW: break;
    }
}

void kvd_ref_plane_decode_buf(const kvd_object_format_t *fmt,
                              const kvd_codec_tables_t *tables, unsigned plane,
                              const void *data, const void *meta,
                              uint32_t num_valid_tokens, void *dst,
                              float *scratch)
{
    kvd_codec_t codec = fmt->codec[plane];
    size_t elt = kvd_dtype_size(fmt->dtype);
    size_t head_elems = (size_t)fmt->block_size * fmt->head_dim;
    size_t valid_elems = (size_t)num_valid_tokens * fmt->head_dim;
    unsigned char *out = dst;

    if (codec == KVD_CODEC_RAW) {
        const unsigned char *in = data;
        for (uint32_t h = 0; h < fmt->num_heads; h++) {
            memcpy(out + h * head_elems * elt, in + h * head_elems * elt,
                   valid_elems * elt);
        }
        return;
    }

    kvd_plane_dims_t d = kvd_plane_dims(fmt, num_valid_tokens);
    unsigned bits = kvd_codec_bits(codec);
    switch (codec) {
    case KVD_CODEC_FP8_E4M3: kvd_ref_fp8_decode(&d, data, meta, scratch); break;
    case KVD_CODEC_INT8:
        kvd_ref_int8_decode(&d, (kvd_plane_t)plane, data, meta, scratch);
        break;
    case KVD_CODEC_KIVI4:
    case KVD_CODEC_KIVI2:
        kvd_ref_kivi_decode(&d, bits, (kvd_plane_t)plane, data, meta, scratch);
        break;
    case KVD_CODEC_TQ4:
    case KVD_CODEC_TQ3:
    case KVD_CODEC_TQ2:
        kvd_ref_tq_decode(&d, bits, tables, data, meta, scratch);
        break;
    case KVD_CODEC_RAW: break;
    }
    for (uint32_t h = 0; h < fmt->num_heads; h++) {
        kvd_ref_store_f32(fmt->dtype, scratch + h * head_elems,
                          out + h * head_elems * elt, valid_elems);
    }
}

/* The regions are read and written through float and uint16_t pointers by
 * the codecs; 16 bytes is what the object layout guarantees anyway. */
static int kvd_aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

static kvd_status_t kvd_plane_buffers_check(const kvd_object_format_t *fmt,
                                            unsigned plane, const void *cache,
                                            const void *data, const void *meta)
{
    int need_meta = kvd_object_plane_meta_bytes(fmt, plane) != 0;

    if (cache == NULL || data == NULL || (need_meta && meta == NULL)) {
        KVD_LOG_ERROR("plane %u: NULL buffer", plane);
        return KVD_ERR_INVALID;
    }
    if (!kvd_aligned16(data) || (need_meta && !kvd_aligned16(meta))) {
        KVD_LOG_ERROR("plane %u: data/meta regions not 16-byte aligned", plane);
        return KVD_ERR_INVALID;
    }
    return KVD_OK;
}

/* The checks and the float scratch both public plane calls need: validates
 * the arguments, then allocates the codec's scratch (*scratch_out is NULL
 * when the codec needs none). The caller frees *scratch_out. */
static kvd_status_t
kvd_plane_call_prepare(const kvd_object_format_t *fmt,
                       const kvd_codec_tables_t *tables, unsigned plane,
                       uint32_t num_valid_tokens, const void *cache_side,
                       const void *data, const void *meta, float **scratch_out)
{
    kvd_status_t st =
        kvd_ref_plane_args_check(fmt, tables, plane, num_valid_tokens);
    if (st != KVD_OK) {
        return st;
    }
    st = kvd_plane_buffers_check(fmt, plane, cache_side, data, meta);
    if (st != KVD_OK) {
        return st;
    }
    float *scratch = NULL;
    size_t n = kvd_ref_plane_scratch_floats(fmt, plane);
    if (n != 0) {
        scratch = malloc(n * sizeof(float));
        if (scratch == NULL) {
            KVD_LOG_ERROR("plane %u: no memory for %zu scratch floats", plane,
                          n);
            return KVD_ERR_NOMEM;
        }
    }
    *scratch_out = scratch;
    return KVD_OK;
}

kvd_status_t kvd_ref_plane_encode(const kvd_object_format_t *fmt,
                                  const kvd_codec_tables_t *tables,
                                  unsigned plane, const void *src,
                                  uint32_t num_valid_tokens, void *data,
                                  void *meta)
{
    float *scratch;
    kvd_status_t st = kvd_plane_call_prepare(
        fmt, tables, plane, num_valid_tokens, src, data, meta, &scratch);
    if (st != KVD_OK) {
        return st;
    }
    kvd_ref_plane_encode_buf(fmt, tables, plane, src, num_valid_tokens, data,
                             meta, scratch);
    free(scratch);
    return KVD_OK;
}

kvd_status_t kvd_ref_plane_decode(const kvd_object_format_t *fmt,
                                  const kvd_codec_tables_t *tables,
                                  unsigned plane, const void *data,
                                  const void *meta, uint32_t num_valid_tokens,
                                  void *dst)
{
    float *scratch;
    kvd_status_t st = kvd_plane_call_prepare(
        fmt, tables, plane, num_valid_tokens, dst, data, meta, &scratch);
    if (st != KVD_OK) {
        return st;
    }
    kvd_ref_plane_decode_buf(fmt, tables, plane, data, meta, num_valid_tokens,
                             dst, scratch);
    free(scratch);
    return KVD_OK;
}
