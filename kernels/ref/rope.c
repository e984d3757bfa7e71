/*
 * RoPE re-rotation of reused keys (kvdepot/kernels.h, "Rotary position
 * re-rotation"): the frequencies of a model's rotary embedding as HF
 * transformers derives them, and the in-place rotation of the K plane of
 * listed cache blocks by a per-block position delta.
 *
 * Engines store K after RoPE, and rotations compose (R(q + d) = R(d) R(q)),
 * so moving a block of keys by d positions is one more rotation by d. The
 * angle of each (block, pair) is reduced and its cosine and sine computed
 * once per block by rope_int.h, the code the CUDA kernel runs too; each
 * row is then converted to float, rotated pair by pair and converted back
 * with the reference's own conversions (convert.c), rotary channels only,
 * so pass-through channels keep their bytes. As in gather.c, every
 * argument is checked before the first byte is written, and only the
 * valid tokens of the listed blocks are touched.
 */
#include <math.h>

#include "common/log_int.h"
#include "kernels/ref/plane_int.h"
#include "kernels/ref/rope_int.h"

static kvd_status_t kvd_rope_scaling_check(const kvd_rope_t *rope, char *err,
                                           size_t err_len)
{
    switch (rope->scaling) {
    case KVD_ROPE_SCALING_NONE: return KVD_OK;
    case KVD_ROPE_SCALING_LINEAR:
    case KVD_ROPE_SCALING_LLAMA3: break;
    default:
        return kvd_format_fail(KVD_ERR_UNSUPPORTED, err, err_len,
                               "rope scaling %d not supported (none, linear, "
                               "llama3)",
                               (int)rope->scaling);
    }
    if (!isfinite(rope->factor) || !(rope->factor >= 1.0)) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                               "rope factor %g: need a finite value >= 1",
                               rope->factor);
    }
    if (rope->scaling == KVD_ROPE_SCALING_LINEAR) {
        return KVD_OK;
    }
    if (!isfinite(rope->high_freq_factor) || !(rope->low_freq_factor > 0.0) ||
        !(rope->low_freq_factor < rope->high_freq_factor)) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                               "llama3 rope: low_freq_factor %g and "
                               "high_freq_factor %g need 0 < low < high",
                               rope->low_freq_factor, rope->high_freq_factor);
    }
    if (rope->original_max_position == 0) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                               "llama3 rope: original_max_position is 0");
    }
    return KVD_OK;
}

kvd_status_t kvd_rope_check(const kvd_rope_t *rope, char *err, size_t err_len)
{
    if (rope == NULL) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len, "NULL rope");
    }
    if (rope->head_dim < 2 || rope->head_dim > 1024) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                               "rope head_dim %u not in 2..1024",
                               rope->head_dim);
    }
    if (rope->rotary_dim < 2 || rope->rotary_dim > rope->head_dim ||
        rope->rotary_dim % 2 != 0) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                               "rotary_dim %u: need an even value in 2..%u",
                               rope->rotary_dim, rope->head_dim);
    }
    if (rope->style != KVD_ROPE_NEOX && rope->style != KVD_ROPE_GPTJ) {
        return kvd_format_fail(KVD_ERR_UNSUPPORTED, err, err_len,
                               "rope style %d not supported (neox, gptj)",
                               (int)rope->style);
    }
    if (!isfinite(rope->base) || !(rope->base > 1.0)) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                               "rope base %g: need a finite value > 1",
                               rope->base);
    }
    return kvd_rope_scaling_check(rope, err, err_len);
}

/* HF transformers' _compute_llama3_parameters for one frequency, operation
 * for operation (in double where HF uses float32): low frequencies (long
 * wavelengths) are divided by factor, high ones kept, the band between
 * interpolated. */
static double kvd_rope_llama3(const kvd_rope_t *rope, double f)
{
    double old_len = (double)rope->original_max_position;
    double low_wavelen = old_len / rope->low_freq_factor;
    double high_wavelen = old_len / rope->high_freq_factor;
    double wavelen = 2.0 * M_PI / f;

    if (wavelen < high_wavelen) {
        return f;
    }
    if (wavelen > low_wavelen) {
        return f / rope->factor;
    }
    double smooth = (old_len / wavelen - rope->low_freq_factor) /
                    (rope->high_freq_factor - rope->low_freq_factor);
    return (1.0 - smooth) * f / rope->factor + smooth * f;
}

kvd_status_t kvd_rope_inv_freq(const kvd_rope_t *rope, double *inv_freq_out)
{
    kvd_status_t st = kvd_rope_check(rope, NULL, 0);
    if (st != KVD_OK) {
        return st;
    }
    if (inv_freq_out == NULL) {
        return KVD_ERR_INVALID;
    }
    const double dim = (double)rope->rotary_dim;
    for (uint32_t i = 0; i < rope->rotary_dim / 2; i++) {
        /* HF: 1.0 / (base ** (arange(0, dim, 2) / dim)) */
        double f = 1.0 / pow(rope->base, (double)(2 * i) / dim);
        if (rope->scaling == KVD_ROPE_SCALING_LINEAR) {
            f /= rope->factor;
        } else if (rope->scaling == KVD_ROPE_SCALING_LLAMA3) {
            f = kvd_rope_llama3(rope, f);
        }
        inv_freq_out[i] = f;
    }
    return KVD_OK;
}

kvd_status_t kvd_rope_args_check(const kvd_kv_layout_t *layout,
                                 const kvd_object_format_t *fmt,
                                 const kvd_rope_t *rope, unsigned layer,
                                 const int32_t *block_ids, const void *deltas,
                                 size_t num_blocks, uint32_t valid_last)
{
    char why[160];
    kvd_status_t st = kvd_kv_layout_check(layout, fmt, why, sizeof(why));
    if (st != KVD_OK) {
        KVD_LOG_ERROR("rope shift: bad cache layout or format: %s", why);
        return st;
    }
    st = kvd_rope_check(rope, why, sizeof(why));
    if (st != KVD_OK) {
        KVD_LOG_ERROR("rope shift: %s", why);
        return st;
    }
    if (rope->head_dim != fmt->head_dim) {
        KVD_LOG_ERROR("rope shift: rope head_dim %u, format head_dim %u",
                      rope->head_dim, fmt->head_dim);
        return KVD_ERR_INVALID;
    }
    if (kvd_dtype_is_fp8(fmt->dtype) || fmt->num_planes != 2) {
        /* An fp8 cache holds keys quantized with the engine's scales, and
         * an MLA latent rotates only a decoupled part the format does not
         * describe. */
        KVD_LOG_ERROR("rope shift: needs an fp16 or bf16 cache with K and V "
                      "planes (dtype %d, %u planes)",
                      (int)fmt->dtype, fmt->num_planes);
        return KVD_ERR_UNSUPPORTED;
    }
    if (layer >= fmt->num_layers) {
        KVD_LOG_ERROR("rope shift: layer %u but the format has %u", layer,
                      fmt->num_layers);
        return KVD_ERR_INVALID;
    }
    if (num_blocks == 0) {
        return KVD_OK;
    }
    if (block_ids == NULL || deltas == NULL) {
        KVD_LOG_ERROR("rope shift: NULL block_ids or deltas for %zu blocks",
                      num_blocks);
        return KVD_ERR_INVALID;
    }
    if (valid_last < 1 || valid_last > fmt->block_size) {
        KVD_LOG_ERROR("rope shift: last block has %u valid tokens, "
                      "block_size %u",
                      valid_last, fmt->block_size);
        return KVD_ERR_INVALID;
    }
    for (size_t i = 0; i < num_blocks; i++) {
        if (block_ids[i] < 0 || (uint32_t)block_ids[i] >= layout->num_blocks) {
            KVD_LOG_ERROR("rope shift: block id %d (entry %zu) outside 0..%u",
                          (int)block_ids[i], i, layout->num_blocks - 1);
            return KVD_ERR_RANGE;
        }
    }
    return KVD_OK;
}

/* One block's rotation: cos and sin per pair, the same for every row. */
typedef struct kvd_rope_block {
    float cos[KVD_ROPE_MAX_PAIRS];
    float sin[KVD_ROPE_MAX_PAIRS];
} kvd_rope_block_t;

/* Rotates the first rotary_dim channels of the row at p in place. */
static void kvd_rope_row(unsigned char *p, kvd_dtype_t dtype,
                         const kvd_rope_t *rope, const kvd_rope_block_t *b)
{
    float x[2 * KVD_ROPE_MAX_PAIRS];
    uint32_t half = rope->rotary_dim / 2;

    kvd_ref_load_f32(dtype, p, x, rope->rotary_dim);
    for (uint32_t i = 0; i < half; i++) {
        kvd_rope_rotate(&x[kvd_rope_chan0((int)rope->style, half, i)],
                        &x[kvd_rope_chan1((int)rope->style, half, i)],
                        b->cos[i], b->sin[i]);
    }
    kvd_ref_store_f32(dtype, x, p, rope->rotary_dim);
}

kvd_status_t kvd_ref_rope_shift_layer(const kvd_kv_layout_t *layout,
                                      const kvd_object_format_t *fmt,
                                      const kvd_rope_t *rope, unsigned layer,
                                      const int32_t *block_ids,
                                      const int64_t *deltas, size_t num_blocks,
                                      uint32_t num_valid_tokens_last)
{
    kvd_status_t st =
        kvd_rope_args_check(layout, fmt, rope, layer, block_ids, deltas,
                            num_blocks, num_valid_tokens_last);
    if (st != KVD_OK || num_blocks == 0) {
        return st;
    }
    double inv_freq[KVD_ROPE_MAX_PAIRS];
    (void)kvd_rope_inv_freq(rope, inv_freq); /* checked just above */
    for (size_t i = 0; i < num_blocks; i++) {
        uint32_t valid =
            i + 1 == num_blocks ? num_valid_tokens_last : fmt->block_size;
        kvd_rope_shift_block(layout, fmt, rope, inv_freq, layer, block_ids[i],
                             deltas[i], valid);
    }
    return KVD_OK;
}

void kvd_rope_shift_block(const kvd_kv_layout_t *layout,
                          const kvd_object_format_t *fmt,
                          const kvd_rope_t *rope, const double *inv_freq,
                          unsigned layer, int32_t block_id, int64_t delta,
                          uint32_t valid)
{
    if (delta == 0) {
        return;
    }
    kvd_rope_block_t b;
    for (uint32_t j = 0; j < rope->rotary_dim / 2; j++) {
        kvd_rope_sincos(kvd_rope_reduce(delta, inv_freq[j]), &b.cos[j],
                        &b.sin[j]);
    }
    /* Plane 0 is K; the layout check proved every (block, token, head)
     * row below lies inside the layer. */
    unsigned char *blk = (unsigned char *)layout->layer_base[layer] +
                         (size_t)block_id * (uint64_t)layout->stride_block;
    for (uint32_t h = 0; h < fmt->num_heads; h++) {
        for (uint32_t t = 0; t < valid; t++) {
            kvd_rope_row(blk + (size_t)h * (uint64_t)layout->stride_head +
                             (size_t)t * (uint64_t)layout->stride_token,
                         fmt->dtype, rope, &b);
        }
    }
}
