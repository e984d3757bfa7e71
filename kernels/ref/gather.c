/*
 * Paged gather/scatter for one layer (kvdepot/kernels.h): walks the
 * engine's strided cache for each listed block, stages one plane at a time
 * in [head][token][channel] order, and runs it through plane.c into or out
 * of the object at kvd_object_layer_offset (the _heads calls: at a rank's
 * heads' ranges of an object holding every head). Raw planes are copied
 * row by row without the stage.
 *
 * All arguments are validated before the first byte moves, and the one
 * allocation (staging plus codec scratch, sized for one plane) happens
 * before the first block too, so "on error nothing was written" holds for
 * every error these functions return. Only tokens below each block's valid
 * count are read from or written to the cache: a partial block's unused
 * slots may belong to nobody yet (or to a concurrent writer), and scatter
 * must never touch a slot outside the listed blocks.
 */
#include <stdlib.h>
#include <string.h>

#include "common/log_int.h"
#include "kernels/ref/plane_int.h"
#include "kernels/ref/rope_int.h"

/* Object offsets of one layer's regions, computed once per call. */
typedef struct kvd_layer_regions {
    size_t layer_off;
    size_t data_off[2];
    size_t meta_off[2];
} kvd_layer_regions_t;

static kvd_layer_regions_t kvd_layer_regions(const kvd_object_format_t *fmt,
                                             unsigned layer)
{
    kvd_layer_regions_t r = {
        kvd_object_layer_offset(fmt, layer), {0, 0}, {0, 0}};
    size_t off = 0;
    for (unsigned p = 0; p < fmt->num_planes; p++) {
        r.data_off[p] = off;
        off += kvd_object_plane_data_bytes(fmt, p);
        r.meta_off[p] = off;
        off += kvd_object_plane_meta_bytes(fmt, p);
    }
    return r;
}

static kvd_status_t
kvd_layer_args_check(const kvd_kv_layout_t *layout,
                     const kvd_object_format_t *fmt,
                     const kvd_codec_tables_t *tables, unsigned layer,
                     const int32_t *block_ids, size_t num_blocks,
                     uint32_t num_valid_tokens_last, const void *const *objects)
{
    char why[160];
    kvd_status_t st = kvd_kv_layout_check(layout, fmt, why, sizeof(why));

    if (st != KVD_OK) {
        KVD_LOG_ERROR("bad cache layout or format: %s", why);
        return st;
    }
    if (layer >= fmt->num_layers) {
        KVD_LOG_ERROR("layer %u but the format has %u", layer, fmt->num_layers);
        return KVD_ERR_INVALID;
    }
    for (unsigned p = 0; p < fmt->num_planes; p++) {
        /* Full blocks are checked here, the partial one just below. */
        st = kvd_ref_plane_args_check(fmt, tables, p, fmt->block_size);
        if (st != KVD_OK) {
            return st;
        }
    }
    if (num_blocks == 0) {
        return KVD_OK;
    }
    if (block_ids == NULL || objects == NULL) {
        KVD_LOG_ERROR("NULL block_ids or objects for %zu blocks", num_blocks);
        return KVD_ERR_INVALID;
    }
    if (num_valid_tokens_last < 1 || num_valid_tokens_last > fmt->block_size) {
        KVD_LOG_ERROR("last block has %u valid tokens, block_size %u",
                      num_valid_tokens_last, fmt->block_size);
        return KVD_ERR_INVALID;
    }
    for (size_t i = 0; i < num_blocks; i++) {
        /* Regions sit at multiples of 16 from the object start, so an
         * aligned object gives aligned regions. */
        if (objects[i] == NULL || ((uintptr_t)objects[i] & 15u) != 0) {
            KVD_LOG_ERROR("object %zu is NULL or not 16-byte aligned", i);
            return KVD_ERR_INVALID;
        }
    }
    for (size_t i = 0; i < num_blocks; i++) {
        if (block_ids[i] < 0 || (uint32_t)block_ids[i] >= layout->num_blocks) {
            KVD_LOG_ERROR("block id %d (entry %zu) outside 0..%u",
                          (int)block_ids[i], i, layout->num_blocks - 1);
            return KVD_ERR_RANGE;
        }
    }
    return KVD_OK;
}

/* Staging for one plane in the cache dtype, then the codec's float scratch
 * (floats first, so they are suitably aligned). */
typedef struct kvd_layer_scratch {
    void *mem;
    unsigned char *stage;
    float *floats;
} kvd_layer_scratch_t;

static kvd_status_t kvd_layer_scratch_init(kvd_layer_scratch_t *s,
                                           const kvd_object_format_t *fmt)
{
    size_t floats = 0;
    for (unsigned p = 0; p < fmt->num_planes; p++) {
        size_t n = kvd_ref_plane_scratch_floats(fmt, p);
        floats = n > floats ? n : floats;
    }
    size_t stage = (size_t)fmt->num_heads * fmt->block_size * fmt->head_dim *
                   kvd_dtype_size(fmt->dtype);
    s->mem = malloc(floats * sizeof(float) + stage);
    if (s->mem == NULL) {
        KVD_LOG_ERROR("no memory for %zu bytes of plane scratch",
                      floats * sizeof(float) + stage);
        return KVD_ERR_NOMEM;
    }
    s->floats = floats != 0 ? s->mem : NULL;
    s->stage = (unsigned char *)s->mem + floats * sizeof(float);
    return KVD_OK;
}

/* Address of (plane, block, token 0, head) in the layer; the layout check
 * proved that every such address plus the row stays inside the layer. */
static unsigned char *kvd_cache_row(const kvd_kv_layout_t *layout,
                                    unsigned layer, unsigned plane,
                                    int32_t block, uint32_t token,
                                    uint32_t head)
{
    return (unsigned char *)layout->layer_base[layer] +
           (size_t)plane * (uint64_t)layout->stride_plane +
           (size_t)block * (uint64_t)layout->stride_block +
           (size_t)token * (uint64_t)layout->stride_token +
           (size_t)head * (uint64_t)layout->stride_head;
}

/*
 * Raw planes skip the staging copy: rows go straight between the cache and
 * the object's data region ([head][token][channel], no metadata), so each
 * byte is copied once. The bytes are those kvd_ref_plane_encode writes:
 * rows of tokens >= valid and the region's padding are zero.
 */
static void raw_gather(const kvd_kv_layout_t *layout,
                       const kvd_object_format_t *fmt, unsigned layer,
                       unsigned plane, int32_t block, uint32_t valid,
                       unsigned char *data)
{
    size_t row = (size_t)fmt->head_dim * kvd_dtype_size(fmt->dtype);
    size_t head_bytes = (size_t)fmt->block_size * row;
    for (uint32_t h = 0; h < fmt->num_heads; h++) {
        unsigned char *out = data + h * head_bytes;
        for (uint32_t t = 0; t < valid; t++) {
            memcpy(out + t * row,
                   kvd_cache_row(layout, layer, plane, block, t, h), row);
        }
        memset(out + valid * row, 0, (fmt->block_size - valid) * row);
    }
    size_t used = fmt->num_heads * head_bytes;
    memset(data + used, 0, kvd_object_plane_data_bytes(fmt, plane) - used);
}

static void raw_scatter(const kvd_kv_layout_t *layout,
                        const kvd_object_format_t *fmt, unsigned layer,
                        unsigned plane, int32_t block, uint32_t valid,
                        const unsigned char *data)
{
    size_t row = (size_t)fmt->head_dim * kvd_dtype_size(fmt->dtype);
    size_t head_bytes = (size_t)fmt->block_size * row;
    for (uint32_t h = 0; h < fmt->num_heads; h++) {
        for (uint32_t t = 0; t < valid; t++) {
            memcpy(kvd_cache_row(layout, layer, plane, block, t, h),
                   data + h * head_bytes + t * row, row);
        }
    }
}

/* The regions of a shard's heads inside objects of format `object`, for
 * the _heads calls: `shard_out` is the shard's format. */
static kvd_status_t kvd_heads_regions(const kvd_object_format_t *object,
                                      uint32_t head_start, uint32_t num_heads,
                                      unsigned layer,
                                      kvd_object_format_t *shard_out,
                                      kvd_layer_regions_t *r)
{
    if (!kvd_object_shard_direct(object, head_start, num_heads) ||
        layer >= object->num_layers) {
        KVD_LOG_ERROR("heads %u..%u of %u: not a split whose ranges are "
                      "16-byte aligned (or layer %u outside)",
                      head_start, head_start + num_heads,
                      object != NULL ? object->num_heads : 0, layer);
        return object == NULL || layer >= object->num_layers
                   ? KVD_ERR_INVALID
                   : KVD_ERR_UNSUPPORTED;
    }
    (void)kvd_object_shard_format(object, head_start, num_heads, shard_out,
                                  NULL, 0);
    r->layer_off = 0;
    kvd_shard_regions(object, head_start, layer, r->data_off, r->meta_off);
    return KVD_OK;
}

static kvd_status_t
gather_core(const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
            const kvd_codec_tables_t *tables, unsigned layer,
            const int32_t *block_ids, size_t num_blocks,
            uint32_t num_valid_tokens_last, void *const *objects,
            const kvd_layer_regions_t *regions)
{
    kvd_status_t st = kvd_layer_args_check(
        layout, fmt, tables, layer, block_ids, num_blocks,
        num_valid_tokens_last, (const void *const *)objects);
    if (st != KVD_OK || num_blocks == 0) {
        return st;
    }
    kvd_layer_scratch_t scratch;
    st = kvd_layer_scratch_init(&scratch, fmt);
    if (st != KVD_OK) {
        return st;
    }

    kvd_layer_regions_t r =
        regions != NULL ? *regions : kvd_layer_regions(fmt, layer);
    size_t row_bytes = (size_t)fmt->head_dim * kvd_dtype_size(fmt->dtype);
    for (size_t i = 0; i < num_blocks; i++) {
        uint32_t valid =
            i + 1 == num_blocks ? num_valid_tokens_last : fmt->block_size;
        unsigned char *obj = (unsigned char *)objects[i] + r.layer_off;
        for (unsigned p = 0; p < fmt->num_planes; p++) {
            if (fmt->codec[p] == KVD_CODEC_RAW) {
                raw_gather(layout, fmt, layer, p, block_ids[i], valid,
                           obj + r.data_off[p]);
                continue;
            }
            for (uint32_t h = 0; h < fmt->num_heads; h++) {
                for (uint32_t t = 0; t < valid; t++) {
                    size_t at = ((size_t)h * fmt->block_size + t) * row_bytes;
                    memcpy(scratch.stage + at,
                           kvd_cache_row(layout, layer, p, block_ids[i], t, h),
                           row_bytes);
                }
            }
            kvd_ref_plane_encode_buf(fmt, tables, p, scratch.stage, valid,
                                     obj + r.data_off[p], obj + r.meta_off[p],
                                     scratch.floats);
        }
    }
    free(scratch.mem);
    return KVD_OK;
}

kvd_status_t kvd_ref_gather_layer(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
    const kvd_codec_tables_t *tables, unsigned layer, const int32_t *block_ids,
    size_t num_blocks, uint32_t num_valid_tokens_last, void *const *objects)
{
    return gather_core(layout, fmt, tables, layer, block_ids, num_blocks,
                       num_valid_tokens_last, objects, NULL);
}

kvd_status_t kvd_ref_gather_layer_heads(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *object,
    const kvd_codec_tables_t *tables, unsigned layer, uint32_t head_start,
    uint32_t num_heads, const int32_t *block_ids, size_t num_blocks,
    uint32_t num_valid_tokens_last, void *const *objects)
{
    kvd_object_format_t shard;
    kvd_layer_regions_t r;
    kvd_status_t st =
        kvd_heads_regions(object, head_start, num_heads, layer, &shard, &r);
    return st != KVD_OK
               ? st
               : gather_core(layout, &shard, tables, layer, block_ids,
                             num_blocks, num_valid_tokens_last, objects, &r);
}

/* Scatter, and with `rope` each block's keys rotated by deltas[i] right
 * after the block is written, while its rows are still in the CPU's
 * cache (one pass over the engine cache instead of two). */
static kvd_status_t
scatter_core(const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
             const kvd_codec_tables_t *tables, unsigned layer,
             const int32_t *block_ids, size_t num_blocks,
             uint32_t num_valid_tokens_last, const void *const *objects,
             const kvd_rope_t *rope, const int64_t *deltas,
             const kvd_layer_regions_t *regions)
{
    kvd_status_t st =
        kvd_layer_args_check(layout, fmt, tables, layer, block_ids, num_blocks,
                             num_valid_tokens_last, objects);
    if (st == KVD_OK && rope != NULL) {
        st = kvd_rope_args_check(layout, fmt, rope, layer, block_ids, deltas,
                                 num_blocks, num_valid_tokens_last);
    }
    if (st != KVD_OK || num_blocks == 0) {
        return st;
    }
    kvd_layer_scratch_t scratch;
    st = kvd_layer_scratch_init(&scratch, fmt);
    if (st != KVD_OK) {
        return st;
    }
    double inv_freq[KVD_ROPE_MAX_PAIRS];
    if (rope != NULL) {
        (void)kvd_rope_inv_freq(rope, inv_freq); /* checked above */
    }

    kvd_layer_regions_t r =
        regions != NULL ? *regions : kvd_layer_regions(fmt, layer);
    size_t row_bytes = (size_t)fmt->head_dim * kvd_dtype_size(fmt->dtype);
    for (size_t i = 0; i < num_blocks; i++) {
        uint32_t valid =
            i + 1 == num_blocks ? num_valid_tokens_last : fmt->block_size;
        const unsigned char *obj =
            (const unsigned char *)objects[i] + r.layer_off;
        for (unsigned p = 0; p < fmt->num_planes; p++) {
            if (fmt->codec[p] == KVD_CODEC_RAW) {
                raw_scatter(layout, fmt, layer, p, block_ids[i], valid,
                            obj + r.data_off[p]);
                continue;
            }
            kvd_ref_plane_decode_buf(fmt, tables, p, obj + r.data_off[p],
                                     obj + r.meta_off[p], valid, scratch.stage,
                                     scratch.floats);
            for (uint32_t h = 0; h < fmt->num_heads; h++) {
                for (uint32_t t = 0; t < valid; t++) {
                    size_t at = ((size_t)h * fmt->block_size + t) * row_bytes;
                    memcpy(kvd_cache_row(layout, layer, p, block_ids[i], t, h),
                           scratch.stage + at, row_bytes);
                }
            }
        }
        if (rope != NULL) {
            /* Checked above for every block, the frequencies computed
             * once: only the block's own rotation here. */
            kvd_rope_shift_block(layout, fmt, rope, inv_freq, layer,
                                 block_ids[i], deltas[i], valid);
        }
    }
    free(scratch.mem);
    return KVD_OK;
}

kvd_status_t kvd_ref_scatter_layer(const kvd_kv_layout_t *layout,
                                   const kvd_object_format_t *fmt,
                                   const kvd_codec_tables_t *tables,
                                   unsigned layer, const int32_t *block_ids,
                                   size_t num_blocks,
                                   uint32_t num_valid_tokens_last,
                                   const void *const *objects)
{
    return scatter_core(layout, fmt, tables, layer, block_ids, num_blocks,
                        num_valid_tokens_last, objects, NULL, NULL, NULL);
}

kvd_status_t kvd_ref_scatter_layer_rope(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
    const kvd_codec_tables_t *tables, unsigned layer, const int32_t *block_ids,
    size_t num_blocks, uint32_t num_valid_tokens_last,
    const void *const *objects, const kvd_rope_t *rope, const int64_t *deltas)
{
    if (rope == NULL || (deltas == NULL && num_blocks > 0)) {
        return KVD_ERR_INVALID;
    }
    return scatter_core(layout, fmt, tables, layer, block_ids, num_blocks,
                        num_valid_tokens_last, objects, rope, deltas, NULL);
}

kvd_status_t kvd_ref_scatter_layer_heads(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *object,
    const kvd_codec_tables_t *tables, unsigned layer, uint32_t head_start,
    uint32_t num_heads, const int32_t *block_ids, size_t num_blocks,
    uint32_t num_valid_tokens_last, const void *const *objects,
    const kvd_rope_t *rope, const int64_t *deltas)
{
    if (rope != NULL && deltas == NULL && num_blocks > 0) {
        return KVD_ERR_INVALID;
    }
    kvd_object_format_t shard;
    kvd_layer_regions_t r;
    kvd_status_t st =
        kvd_heads_regions(object, head_start, num_heads, layer, &shard, &r);
    return st != KVD_OK
               ? st
               : scatter_core(layout, &shard, tables, layer, block_ids,
                              num_blocks, num_valid_tokens_last, objects, rope,
                              rope != NULL ? deltas : NULL, &r);
}
