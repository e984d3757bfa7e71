/*
 * Head ranges of an object (kvdepot/kernels.h, "Objects shared by
 * tensor-parallel ranks"): where the heads of one rank sit in an object
 * that holds every head, and the padding no rank owns.
 *
 * Every region is head-major and every codec encodes each head on its own
 * (docs/codecs.md), so heads [h0, h0 + n) of a region are the bytes
 * [h0 * per_head, (h0 + n) * per_head), where per_head is the region's size
 * for one head before rounding. That holds as long as a head's sub-byte
 * codes end on a byte; the formats where they do not are refused.
 */
#include <string.h>

#include "kernels/ref/plane_int.h"

/* A region's bytes for one head, exactly: its size for 16 heads (a multiple
 * of 16 when a head's bytes are whole, so the rounding adds nothing) over
 * 16. `meta` picks the metadata region. */
static size_t shard_head_bytes(const kvd_object_format_t *fmt, unsigned plane,
                               bool meta)
{
    kvd_object_format_t f = *fmt;
    f.num_heads = 16;
    size_t bytes = meta ? kvd_object_plane_meta_bytes(&f, plane)
                        : kvd_object_plane_data_bytes(&f, plane);
    return bytes / 16;
}

kvd_status_t kvd_object_shard_format(const kvd_object_format_t *object,
                                     uint32_t head_start, uint32_t num_heads,
                                     kvd_object_format_t *shard_out, char *err,
                                     size_t err_len)
{
    if (shard_out == NULL) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len, "NULL output");
    }
    kvd_status_t st = kvd_object_format_check(object, err, err_len);
    if (st != KVD_OK) {
        return st;
    }
    if (num_heads == 0 || head_start >= object->num_heads ||
        num_heads > object->num_heads - head_start) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                               "heads %u..%u are not inside the object's %u",
                               head_start, head_start + num_heads,
                               object->num_heads);
    }
    for (unsigned p = 0; p < object->num_planes; p++) {
        kvd_codec_t c = object->codec[p];
        uint64_t bits = (uint64_t)object->block_size * object->head_dim *
                        (c == KVD_CODEC_RAW ? 8 * kvd_dtype_size(object->dtype)
                                            : kvd_codec_bits(c));
        if (bits % 8 != 0 && num_heads != object->num_heads) {
            return kvd_format_fail(
                KVD_ERR_UNSUPPORTED, err, err_len,
                "plane %u: %s codes of one head (block_size %u x head_dim "
                "%u) do not end on a byte, so a head range is not a byte "
                "range",
                p, kvd_codec_name(c), object->block_size, object->head_dim);
        }
    }
    *shard_out = *object;
    shard_out->num_heads = num_heads;
    return KVD_OK;
}

size_t kvd_object_shard_ranges(const kvd_object_format_t *object,
                               uint32_t head_start, uint32_t num_heads,
                               unsigned layer, kvd_object_range_t *out)
{
    kvd_object_format_t shard;
    if (out == NULL || layer >= (object != NULL ? object->num_layers : 0) ||
        kvd_object_shard_format(object, head_start, num_heads, &shard, NULL,
                                0) != KVD_OK) {
        return 0;
    }
    shard.num_layers = 1;
    size_t n = 0, at_object = kvd_object_layer_offset(object, layer);
    size_t at_shard = 0;
    for (unsigned p = 0; p < object->num_planes; p++) {
        for (unsigned m = 0; m < 2; m++) {
            size_t whole = m ? kvd_object_plane_meta_bytes(object, p)
                             : kvd_object_plane_data_bytes(object, p);
            size_t part = m ? kvd_object_plane_meta_bytes(&shard, p)
                            : kvd_object_plane_data_bytes(&shard, p);
            size_t head = shard_head_bytes(object, p, m != 0);
            if (whole > 0) {
                bool all = num_heads == object->num_heads;
                out[n].object_offset = at_object + head_start * head;
                out[n].shard_offset = at_shard;
                out[n].bytes = all ? whole : num_heads * head;
                n++;
            }
            at_object += whole;
            at_shard += part;
        }
    }
    return n;
}

void kvd_shard_regions(const kvd_object_format_t *object, uint32_t head_start,
                       unsigned layer, size_t data_off[2], size_t meta_off[2])
{
    size_t at = kvd_object_layer_offset(object, layer);
    for (unsigned p = 0; p < 2; p++) {
        data_off[p] = meta_off[p] = 0;
    }
    for (unsigned p = 0; p < object->num_planes; p++) {
        data_off[p] = at + head_start * shard_head_bytes(object, p, false);
        at += kvd_object_plane_data_bytes(object, p);
        meta_off[p] = at + head_start * shard_head_bytes(object, p, true);
        at += kvd_object_plane_meta_bytes(object, p);
    }
}

bool kvd_object_shard_direct(const kvd_object_format_t *object,
                             uint32_t head_start, uint32_t num_heads)
{
    kvd_object_format_t shard;
    if (kvd_object_shard_format(object, head_start, num_heads, &shard, NULL,
                                0) != KVD_OK) {
        return false;
    }
    for (unsigned p = 0; p < object->num_planes; p++) {
        for (unsigned m = 0; m < 2; m++) {
            size_t head = shard_head_bytes(object, p, m != 0);
            if ((head * head_start) % 16 != 0 || (head * num_heads) % 16 != 0) {
                return false;
            }
        }
    }
    return true;
}

void kvd_object_zero_padding(const kvd_object_format_t *fmt, void *obj)
{
    if (obj == NULL || kvd_object_format_check(fmt, NULL, 0) != KVD_OK) {
        return;
    }
    unsigned char *at = obj;
    for (unsigned l = 0; l < fmt->num_layers; l++) {
        for (unsigned p = 0; p < fmt->num_planes; p++) {
            for (unsigned m = 0; m < 2; m++) {
                size_t whole = m ? kvd_object_plane_meta_bytes(fmt, p)
                                 : kvd_object_plane_data_bytes(fmt, p);
                size_t used = fmt->num_heads * shard_head_bytes(fmt, p, m);
                if (used < whole) {
                    memset(at + used, 0, whole - used);
                }
                at += whole;
            }
        }
    }
}
