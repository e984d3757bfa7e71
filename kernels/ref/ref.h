/*
 * Internal contract between the plain-C reference kernels' files.
 *
 * plane.c drives a plane encode/decode: it converts the engine dtype to
 * float ([head][token][channel], tokens >= valid set to 0), calls one codec
 * below, and converts back. Codecs therefore work on float only, except
 * raw, which copies bytes. gather.c walks the strided engine layout and
 * calls plane.c per (block, plane). Formats of every codec's data and
 * metadata regions are in docs/codecs.md; the CUDA kernels implement the
 * same bytes.
 *
 * Rounding conventions shared with CUDA (bit-exactness, docs/codecs.md,
 * "CPU/GPU parity contract"): float->fp16/bf16 round to nearest even;
 * quantizers divide by the scale (never multiply by a reciprocal) and
 * round with rintf (RNE); scales are rounded to fp16 before use where they
 * are stored as fp16. quant_fast.h says where the CUDA encoders may take a
 * reciprocal instead and still produce these bytes.
 */
#ifndef KVD_KERNELS_REF_H
#define KVD_KERNELS_REF_H

#include <stdint.h>

#include "kvdepot/kernels.h"

/* ---- scalar conversions (convert.c) ------------------------------------ */
float kvd_half_to_float(uint16_t h);
uint16_t kvd_float_to_half(float f); /* RNE, overflow -> inf, NaN kept */
float kvd_bf16_to_float(uint16_t b);
uint16_t kvd_float_to_bf16(float f); /* RNE, NaN kept quiet */
/* OCP E4M3 ("e4m3fn"): RNE, saturating to +-448, NaN -> 0x7F/0xFF by sign */
uint8_t kvd_float_to_fp8_e4m3(float f);
float kvd_fp8_e4m3_to_float(uint8_t q);

/* Converts n elements of `dtype` to float and back (RNE). */
void kvd_ref_load_f32(kvd_dtype_t dtype, const void *src, float *dst, size_t n);
void kvd_ref_store_f32(kvd_dtype_t dtype, const float *src, void *dst,
                       size_t n);

/* ---- codec tables (tables.c) ------------------------------------------- */
#define KVD_TQ_MAX_DIM 256
#define KVD_TQ_MAX_LEVELS 16 /* 2^4 */
struct kvd_codec_tables {
    kvd_object_format_t fmt;
    /* TurboQuant: s_i in {+1,-1} from splitmix64(tq_seed) top bits. */
    float tq_sign[KVD_TQ_MAX_DIM];
    /* Lloyd-Max codebook for the rotated coordinate of a unit vector at
     * this head_dim, index [bits-2]; ascending; bounds are midpoints. */
    float tq_centroid[3][KVD_TQ_MAX_LEVELS];
    float tq_bound[3][KVD_TQ_MAX_LEVELS - 1];
};

/* ---- codecs (one file each) -------------------------------------------- */
/* Plane shape; x is heads*block_size*head_dim floats [h][t][c]. Codecs
 * compute statistics over tokens < valid only and write code 0 / scale 0
 * for the others; decode writes only tokens < valid. */
typedef struct kvd_plane_dims {
    uint32_t heads, block_size, head_dim, valid;
} kvd_plane_dims_t;

/* fp8.c: data [h][t][c] e4m3 bytes; meta [h][t] fp32 scale = amax/448
 * (1.0 when amax < 2^-6); q = e4m3(x / scale). */
void kvd_ref_fp8_encode(const kvd_plane_dims_t *d, const float *x,
                        uint8_t *data, float *scale);
void kvd_ref_fp8_decode(const kvd_plane_dims_t *d, const uint8_t *data,
                        const float *scale, float *x);

/* int8.c: data [h][t][c] int8; q = clamp(rint(x / scale), -127, 127) with
 * scale = fp16(amax/127) (1.0 when 0). K plane: amax per (h, c) over the
 * valid tokens, meta [h][c]; V plane: amax per (h, t), meta [h][t]. */
void kvd_ref_int8_encode(const kvd_plane_dims_t *d, kvd_plane_t plane,
                         const float *x, int8_t *data, uint16_t *scale_fp16);
void kvd_ref_int8_decode(const kvd_plane_dims_t *d, kvd_plane_t plane,
                         const int8_t *data, const uint16_t *scale_fp16,
                         float *x);

/* kivi.c: bits 4 or 2; codes [h][t][c] packed LSB-first (value i at bit
 * (i*bits)%8 of byte (i*bits)/8). K plane: one (fp16 scale, fp16 min) per
 * (h, c) over the block's valid tokens, meta [h][c][2]. V plane: one pair
 * per (h, t, group of 32 channels), meta [h][t][c/32][2]. */
void kvd_ref_kivi_encode(const kvd_plane_dims_t *d, unsigned bits,
                         kvd_plane_t plane, const float *x, uint8_t *data,
                         uint16_t *meta);
void kvd_ref_kivi_decode(const kvd_plane_dims_t *d, unsigned bits,
                         kvd_plane_t plane, const uint8_t *data,
                         const uint16_t *meta, float *x);

/* tq.c: bits 2..4; per (h, t) vector: head_dim*bits/8 bytes of BP32
 * bit-planes (group g = i/32, word W[g*bits+k] bit l = bit k of code[g*32+l],
 * little-endian u32), meta [h][t] fp16 norm. */
void kvd_ref_tq_encode(const kvd_plane_dims_t *d, unsigned bits,
                       const kvd_codec_tables_t *tables, const float *x,
                       uint8_t *data, uint16_t *norm_fp16);
void kvd_ref_tq_decode(const kvd_plane_dims_t *d, unsigned bits,
                       const kvd_codec_tables_t *tables, const uint8_t *data,
                       const uint16_t *norm_fp16, float *x);

#endif /* KVD_KERNELS_REF_H */
