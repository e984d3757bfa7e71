/*
 * TurboQuant-MSE codec (arXiv 2504.19874 Algorithm 1 with a randomized
 * Hadamard rotation; docs/codecs.md). Per (head, token) vector x of
 * d = head_dim coordinates:
 *   g = sqrt(fixed-tree sum of x_j^2)
 *   u_j = x_j * s_j * (1/g);  FWHT(u);  y_j = u_j * (1/sqrt d)
 *   code_j = #{k : y_j > bound_k}          (Lloyd-Max bounds, tables.c)
 *   store BP32(code), fp16(g)
 * and decode y_j = centroid[code_j]; FWHT(y); x_j = y_j * (1/sqrt d) * s_j
 * * norm. The randomized rotation makes every coordinate follow the same
 * known distribution whatever the data (outlier channels included), which
 * is what lets one fixed codebook serve all vectors. No QJL stage: the
 * engine consumes dequantized vectors, where QJL only adds error
 * (docs/codecs.md, "tq4, tq3, tq2").
 *
 * Everything a GPU must reproduce bit for bit is pinned down here and in
 * docs/codecs.md: the norm's reduction tree (tq_int.h), the FWHT stage
 * order, the exact float constant 1/sqrt(d), the order of the multiplies,
 * and no fused multiply-add (kernels/ref is built with -ffp-contract=off).
 *
 * Edge cases: a zero vector (or one whose norm rounds to fp16 zero) stores
 * all-zero codes and norm 0 and decodes to +0.0 exactly. A norm above
 * 65504 saturates to 65504, so such a vector decodes with its direction
 * kept and its length clipped; fp16 caches reach that only with elements
 * around 5800 and above. A norm that is not finite (Inf/NaN input, or a
 * bf16 vector whose squares overflow float) is stored like a zero vector.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "kernels/ref/tq_int.h"

#define KVD_HALF_MAX_BITS 0x7bffu /* 65504 */

float kvd_ref_tq_norm_sq(const float *x, unsigned dim)
{
    float lane[KVD_TQ_LANES];

    for (unsigned l = 0; l < KVD_TQ_LANES; l++) {
        float acc = 0.0f;
        for (unsigned i = l; i < dim; i += KVD_TQ_LANES) {
            acc += x[i] * x[i];
        }
        lane[l] = acc;
    }
    /* __shfl_xor_sync butterfly: after offset o every lane holds
     * lane[l] + lane[l ^ o]. Float addition is commutative, so all lanes
     * end with the same bits and lane 0 is the result. */
    for (unsigned o = KVD_TQ_LANES / 2; o >= 1; o /= 2) {
        float next[KVD_TQ_LANES];
        for (unsigned l = 0; l < KVD_TQ_LANES; l++) {
            next[l] = lane[l] + lane[l ^ o];
        }
        memcpy(lane, next, sizeof(lane));
    }
    return lane[0];
}

float kvd_ref_tq_inv_sqrt_dim(unsigned dim)
{
    int log2d = __builtin_ctz(dim);
    if (log2d % 2 == 0) {
        return ldexpf(1.0f, -log2d / 2);
    }
    return ldexpf((float)M_SQRT1_2, -(log2d - 1) / 2);
}

void kvd_ref_fwht(float *v, unsigned dim)
{
    for (unsigned h = 1; h < dim; h *= 2) {
        for (unsigned i = 0; i < dim; i += 2 * h) {
            for (unsigned j = i; j < i + h; j++) {
                float a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
        }
    }
}

void kvd_ref_bp32_pack(const uint8_t *code, unsigned dim, unsigned bits,
                       uint8_t *out)
{
    for (unsigned g = 0; g < dim / KVD_TQ_LANES; g++) {
        for (unsigned k = 0; k < bits; k++) {
            uint32_t w = 0;
            for (unsigned l = 0; l < KVD_TQ_LANES; l++) {
                w |= (uint32_t)((code[g * KVD_TQ_LANES + l] >> k) & 1u) << l;
            }
            uint8_t *o = out + 4 * (g * bits + k);
            /* Little-endian whatever the host: the GPU writes the ballot
             * word as a little-endian u32. */
            o[0] = (uint8_t)w;
            o[1] = (uint8_t)(w >> 8);
            o[2] = (uint8_t)(w >> 16);
            o[3] = (uint8_t)(w >> 24);
        }
    }
}

void kvd_ref_bp32_unpack(const uint8_t *in, unsigned dim, unsigned bits,
                         uint8_t *code)
{
    memset(code, 0, dim);
    for (unsigned g = 0; g < dim / KVD_TQ_LANES; g++) {
        for (unsigned k = 0; k < bits; k++) {
            const uint8_t *p = in + 4 * (g * bits + k);
            uint32_t w = (uint32_t)p[0] | (uint32_t)p[1] << 8 |
                         (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            for (unsigned l = 0; l < KVD_TQ_LANES; l++) {
                code[g * KVD_TQ_LANES + l] |= (uint8_t)(((w >> l) & 1u) << k);
            }
        }
    }
}

/* fp16 of a finite, non-negative norm, saturated at 65504. */
static uint16_t kvd_tq_norm_half(float g)
{
    uint16_t h = kvd_float_to_half(g);
    return h > KVD_HALF_MAX_BITS ? (uint16_t)KVD_HALF_MAX_BITS : h;
}

/* Encodes one vector into `out` (dim*bits/8 bytes); returns the fp16 norm. */
static uint16_t kvd_tq_encode_vec(const float *x, unsigned dim, unsigned bits,
                                  const kvd_codec_tables_t *t, uint8_t *out)
{
    const float *bound = t->tq_bound[bits - 2];
    unsigned nbound = (1u << bits) - 1u;
    float u[KVD_TQ_MAX_DIM];
    uint8_t code[KVD_TQ_MAX_DIM];
    float g = sqrtf(kvd_ref_tq_norm_sq(x, dim));
    uint16_t norm = isfinite(g) ? kvd_tq_norm_half(g) : 0;

    if (norm == 0) {
        memset(out, 0, (size_t)dim * bits / 8);
        return 0;
    }
    float inv_g = 1.0f / g;
    for (unsigned j = 0; j < dim; j++) {
        u[j] = x[j] * t->tq_sign[j] * inv_g;
    }
    kvd_ref_fwht(u, dim);
    float inv_sqrt_d = kvd_ref_tq_inv_sqrt_dim(dim);
    for (unsigned j = 0; j < dim; j++) {
        float y = u[j] * inv_sqrt_d;
        unsigned c = 0;
        for (unsigned k = 0; k < nbound; k++) {
            c += y > bound[k];
        }
        code[j] = (uint8_t)c;
    }
    kvd_ref_bp32_pack(code, dim, bits, out);
    return norm;
}

static void kvd_tq_decode_vec(const uint8_t *in, uint16_t norm_fp16,
                              unsigned dim, unsigned bits,
                              const kvd_codec_tables_t *t, float *x)
{
    const float *centroid = t->tq_centroid[bits - 2];
    uint8_t code[KVD_TQ_MAX_DIM];
    float norm = kvd_half_to_float(norm_fp16);

    if (norm == 0.0f) {
        /* +0.0 exactly: a zero vector must come back as the same bytes,
         * not as -0.0 from a negative centroid times 0. */
        memset(x, 0, (size_t)dim * sizeof(float));
        return;
    }
    kvd_ref_bp32_unpack(in, dim, bits, code);
    for (unsigned j = 0; j < dim; j++) {
        x[j] = centroid[code[j]];
    }
    kvd_ref_fwht(x, dim);
    float inv_sqrt_d = kvd_ref_tq_inv_sqrt_dim(dim);
    for (unsigned j = 0; j < dim; j++) {
        x[j] = x[j] * inv_sqrt_d * t->tq_sign[j] * norm;
    }
}

void kvd_ref_tq_encode(const kvd_plane_dims_t *d, unsigned bits,
                       const kvd_codec_tables_t *tables, const float *x,
                       uint8_t *data, uint16_t *norm_fp16)
{
    assert(bits >= 2 && bits <= 4);
    assert(d->head_dim == tables->fmt.head_dim);
    assert(d->head_dim <= KVD_TQ_MAX_DIM && d->head_dim % KVD_TQ_LANES == 0);
    size_t vec_bytes = (size_t)d->head_dim * bits / 8;

    for (uint32_t h = 0; h < d->heads; h++) {
        for (uint32_t t = 0; t < d->block_size; t++) {
            size_t v = (size_t)h * d->block_size + t;
            if (t >= d->valid) {
                memset(data + v * vec_bytes, 0, vec_bytes);
                norm_fp16[v] = 0;
                continue;
            }
            norm_fp16[v] =
                kvd_tq_encode_vec(x + v * d->head_dim, d->head_dim, bits,
                                  tables, data + v * vec_bytes);
        }
    }
}

void kvd_ref_tq_decode(const kvd_plane_dims_t *d, unsigned bits,
                       const kvd_codec_tables_t *tables, const uint8_t *data,
                       const uint16_t *norm_fp16, float *x)
{
    assert(bits >= 2 && bits <= 4);
    assert(d->head_dim == tables->fmt.head_dim);
    assert(d->head_dim <= KVD_TQ_MAX_DIM && d->head_dim % KVD_TQ_LANES == 0);
    size_t vec_bytes = (size_t)d->head_dim * bits / 8;

    for (uint32_t h = 0; h < d->heads; h++) {
        for (uint32_t t = 0; t < d->valid; t++) {
            size_t v = (size_t)h * d->block_size + t;
            kvd_tq_decode_vec(data + v * vec_bytes, norm_fp16[v], d->head_dim,
                              bits, tables, x + v * d->head_dim);
        }
    }
}
