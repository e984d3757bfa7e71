/*
 * kvdepot kernels: paged gather/scatter between an engine's KV cache and the
 * stored object layout, with the KV codecs (raw, fp8, int8, KIVI,
 * TurboQuant) applied on the way. Two implementations share this contract:
 * the plain-C reference (kvd_ref_*, always built; what the host device
 * backend runs) and CUDA (kvd_cuda_*, built when nvcc is found, declared in
 * kvdepot/kernels_cuda.h).
 *
 * Object layout (docs/codecs.md, "Object layout"): one object holds one
 * engine block for every layer of the shard, layer-major. Per layer:
 * plane 0 (K, or the MLA latent), then plane 1 (V). Per plane: the data
 * region, then the codec metadata region, each starting on a 16-byte
 * boundary. Inside each region the order is head-major,
 * [head][token][...]. Every offset follows arithmetically from
 * kvd_object_format_t, so kernels never look anything up.
 *
 * A partial block (num_valid_tokens < block_size) is encoded as if tokens
 * >= num_valid_tokens were zero: those cache slots are never read by gather
 * and never written by scatter.
 *
 * Threading: every function is reentrant; a kvd_codec_tables_t is immutable
 * after kvd_codec_tables_create and may be shared by any number of threads.
 */
#ifndef KVDEPOT_KERNELS_H
#define KVDEPOT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kvdepot/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element type of the engine's KV cache. fp8 caches (vLLM's
 * --kv-cache-dtype fp8, fp8_e4m3, fp8_e5m2) pass through with the raw codec
 * only: their bytes are already quantized with the engine's own scales. */
typedef enum kvd_dtype {
    KVD_DTYPE_FP16 = 1,
    KVD_DTYPE_BF16 = 2,
    KVD_DTYPE_FP8_E4M3 = 3,
    KVD_DTYPE_FP8_E5M2 = 4
} kvd_dtype_t;

/* Bytes per element of `dtype`, 0 for an unknown value. */
KVD_API size_t kvd_dtype_size(kvd_dtype_t dtype);

/* True for the one-byte fp8 dtypes (raw codec only). */
KVD_API bool kvd_dtype_is_fp8(kvd_dtype_t dtype);

/* Codecs, chosen separately for K and V (docs/codecs.md gives their
 * bytes). */
typedef enum kvd_codec {
    KVD_CODEC_RAW = 0,      /* bytes as in the cache */
    KVD_CODEC_FP8_E4M3 = 1, /* per token·head fp32 scale = amax/448 */
    KVD_CODEC_INT8 = 2,  /* fp16 scale amax/127: K per channel, V per token */
    KVD_CODEC_KIVI4 = 3, /* K per channel over the block, V per token/32 */
    KVD_CODEC_KIVI2 = 4,
    KVD_CODEC_TQ4 = 5, /* TurboQuant-MSE: RHT + Lloyd-Max + fp16 norm */
    KVD_CODEC_TQ3 = 6,
    KVD_CODEC_TQ2 = 7
} kvd_codec_t;
#define KVD_CODEC_COUNT 8

/* Stable lower-case names: "raw", "fp8_e4m3", "int8", "kivi4", "kivi2",
 * "tq4", "tq3", "tq2". kvd_codec_name returns NULL for unknown values;
 * kvd_codec_parse returns KVD_ERR_INVALID for unknown names. */
KVD_API const char *kvd_codec_name(kvd_codec_t codec);
KVD_API kvd_status_t kvd_codec_parse(const char *name, kvd_codec_t *codec_out);

/* Which plane a codec encodes: KIVI and int8 quantize K per channel and V
 * per token, the others treat both alike. The MLA latent is KVD_PLANE_K. */
typedef enum kvd_plane { KVD_PLANE_K = 0, KVD_PLANE_V = 1 } kvd_plane_t;

/* ------------------------------------------------------------------------ */
/* Object format                                                            */
/* ------------------------------------------------------------------------ */

typedef struct kvd_object_format {
    kvd_dtype_t dtype;    /* element type of the engine cache */
    uint32_t num_layers;  /* layers held by this shard, 1..1024 */
    uint32_t num_planes;  /* 2 (K and V) or 1 (MLA latent) */
    uint32_t num_heads;   /* kv heads held by this shard, 1..1024 */
    uint32_t head_dim;    /* 1..1024 (codec limits below) */
    uint32_t block_size;  /* tokens per engine block, 1..4096 */
    kvd_codec_t codec[2]; /* per plane; codec[1] unused with one plane */
    uint64_t tq_seed;     /* TurboQuant rotation seed (sign vector) */
} kvd_object_format_t;

/*
 * Checks a format: ranges above, known dtype/codecs, fp8 caches only with
 * raw, KIVI V needs head_dim % 32 == 0, TurboQuant needs head_dim in
 * {64, 128, 256}. Errors: KVD_ERR_INVALID / KVD_ERR_UNSUPPORTED, with a
 * reason written into `err` (may be NULL).
 */
KVD_API kvd_status_t kvd_object_format_check(const kvd_object_format_t *fmt,
                                             char *err, size_t err_len);

/*
 * Applies the codec fallbacks in place, then checks the format: a plane
 * asking for TurboQuant at a head_dim it cannot serve (not 64, 128 or 256),
 * or for KIVI on V with head_dim % 32 != 0, is switched to fp8_e4m3. Each
 * fallback is logged at WARN and its reason written into `err` (the last
 * one when both planes fall back). Returns what kvd_object_format_check
 * returns for the result; on KVD_OK, *num_changed_out (may be NULL) is the
 * number of planes switched. Other problems are not "fixed": they fail as
 * in kvd_object_format_check.
 */
KVD_API kvd_status_t kvd_object_format_fallback(kvd_object_format_t *fmt,
                                                char *err, size_t err_len,
                                                unsigned *num_changed_out);

/* Sizes in bytes, for a format that passed kvd_object_format_check.
 * Data and metadata regions are each rounded up to 16 bytes. Each returns
 * 0 for a NULL format, one that fails the check, a plane the format does
 * not have, or (layer offset) a layer >= num_layers. Pure functions. */
KVD_API size_t kvd_object_plane_data_bytes(const kvd_object_format_t *fmt,
                                           unsigned plane);
KVD_API size_t kvd_object_plane_meta_bytes(const kvd_object_format_t *fmt,
                                           unsigned plane);
KVD_API size_t kvd_object_layer_bytes(const kvd_object_format_t *fmt);
/* Offset of layer `layer` inside an object; the object size is
 * kvd_object_layer_bytes(fmt) * num_layers. */
KVD_API size_t kvd_object_layer_offset(const kvd_object_format_t *fmt,
                                       unsigned layer);
KVD_API size_t kvd_object_bytes(const kvd_object_format_t *fmt);

/* ------------------------------------------------------------------------ */
/* Objects shared by tensor-parallel ranks (shard.c)                         */
/* ------------------------------------------------------------------------ */

/*
 * An object may hold more heads than one engine process has: with tensor
 * parallelism, rank r holds heads [head_start, head_start + num_heads) of
 * the object's `num_heads`, and since every region is head-major and every
 * codec encodes each head on its own, those heads are one contiguous byte
 * range of each of a layer's regions (at most KVD_OBJECT_MAX_RANGES per
 * layer: data and metadata of each plane). A rank encodes its heads in its
 * own format (the object's with num_heads heads) and copies the ranges into
 * the object; a reader at any other split copies its ranges out and
 * decodes. The object's bytes do not depend on how it was split
 * (docs/codecs.md, "Head ranges").
 */
#define KVD_OBJECT_MAX_RANGES 4u

/* One head range: `bytes` at `object_offset` in the whole object, at
 * `shard_offset` in one layer of the shard's format. */
typedef struct kvd_object_range {
    size_t object_offset;
    size_t shard_offset;
    size_t bytes;
} kvd_object_range_t;

/*
 * The format of heads [head_start, head_start + num_heads) of an object of
 * format `object`: `object` with num_heads heads. Errors, with a reason in
 * `err` (may be NULL): KVD_ERR_INVALID (NULL argument, a format
 * kvd_object_format_check refuses, a range outside 0..object->num_heads or
 * empty), KVD_ERR_UNSUPPORTED (a part of the heads, and one head's codes of
 * a plane do not end on a byte: block_size * head_dim * bits is not a
 * multiple of 8). Pure function.
 */
KVD_API kvd_status_t kvd_object_shard_format(const kvd_object_format_t *object,
                                             uint32_t head_start,
                                             uint32_t num_heads,
                                             kvd_object_format_t *shard_out,
                                             char *err, size_t err_len);

/* The ranges of those heads in layer `layer` of the object, and where each
 * sits in a one-layer object of the shard's format; the bytes of a padding
 * are in no range unless the shard is the whole object (then each range is
 * a whole region). Returns how many it wrote into `out` (room for
 * KVD_OBJECT_MAX_RANGES), 0 for what kvd_object_shard_format refuses or a
 * layer >= num_layers. Pure function. */
KVD_API size_t kvd_object_shard_ranges(const kvd_object_format_t *object,
                                       uint32_t head_start, uint32_t num_heads,
                                       unsigned layer, kvd_object_range_t *out);

/* Whether a rank's heads can be encoded straight into the object and
 * decoded straight out of it (kvd_ref_gather_layer_heads): the split is
 * valid and every range starts and ends on a 16-byte boundary, so the
 * shard's regions have no padding. True for every codec at the block and
 * head sizes engines use (16 tokens x 128 channels). Pure function. */
KVD_API bool kvd_object_shard_direct(const kvd_object_format_t *object,
                                     uint32_t head_start, uint32_t num_heads);

/* Zeroes the bytes of an object that no head range holds (the end of each
 * region, up to its 16-byte boundary), for a format whose heads
 * kvd_object_shard_format can split; nothing for NULL or a bad format. The
 * header is not touched. */
KVD_API void kvd_object_zero_padding(const kvd_object_format_t *fmt, void *obj);

/* ------------------------------------------------------------------------ */
/* Object header (header.c)                                                 */
/* ------------------------------------------------------------------------ */

/*
 * Every stored object describes itself: after the payload above (whose
 * size and layer offsets are unchanged, so kernels and staging never see
 * it) come KVD_OBJECT_HEADER_BYTES bytes that say what the payload is:
 * object format version (KVD_OBJECT_FORMAT_V, common.h), the codec of each
 * plane and its parameters (the TurboQuant seed, 0 when no plane uses
 * TurboQuant), dtype and geometry, payload size, the namespace digest and
 * the block hash the object was saved under, and an XXH3-64 of the header
 * itself. The worker writes it when it reserves the object's slot and
 * checks it before copying any byte of a loaded object, whichever tier or
 * node the bytes came from. Layout (little-endian) in docs/architecture.md
 * §5.
 */
#define KVD_OBJECT_HEADER_BYTES 128u

/* A parsed header. */
typedef struct kvd_object_header {
    uint32_t version; /* KVD_OBJECT_FORMAT_V */
    kvd_object_format_t format;
    uint64_t payload_bytes; /* kvd_object_bytes(&format) */
    kvd_namespace_t ns;
    kvd_block_hash_t hash;
    /* Where the block's first token was when its KV was computed (0 for
     * objects written before positions were recorded). */
    uint64_t position;
} kvd_object_header_t;

/* The largest position a header records: 2^40. */
#define KVD_OBJECT_MAX_POSITION (UINT64_C(1) << 40)

/* Bytes a stored object takes: kvd_object_bytes(fmt) followed by the
 * header. 0 where kvd_object_bytes is 0. Pure function. */
KVD_API size_t kvd_object_stored_bytes(const kvd_object_format_t *fmt);

/*
 * Writes the header of the object `hash` saved in namespace `ns` with
 * format `fmt` into `out` (KVD_OBJECT_HEADER_BYTES bytes: place it at
 * kvd_object_bytes(fmt) inside the object). Errors: KVD_ERR_INVALID (NULL
 * argument, a format kvd_object_format_check refuses); `out` is then not
 * written. Pure function.
 */
KVD_API kvd_status_t kvd_object_header_pack(const kvd_object_format_t *fmt,
                                            const kvd_namespace_t *ns,
                                            const kvd_block_hash_t *hash,
                                            void *out);

/* kvd_object_header_pack recording `position` (at most
 * KVD_OBJECT_MAX_POSITION, else KVD_ERR_INVALID): where the block's first
 * token was when its KV was computed. kvd_object_header_pack is this with
 * position 0. */
KVD_API kvd_status_t kvd_object_header_pack_at(const kvd_object_format_t *fmt,
                                               const kvd_namespace_t *ns,
                                               const kvd_block_hash_t *hash,
                                               uint64_t position, void *out);

/*
 * Parses `len` bytes as a header. Errors: KVD_ERR_INVALID (NULL argument),
 * KVD_ERR_CORRUPT (too short, wrong magic or header size, an unknown
 * version, the header checksum does not match, or a format
 * kvd_object_format_check refuses, or a payload size that is not that
 * format's), with a reason in `err` (may be NULL). `out` is written only on
 * KVD_OK. Never reads past `len`. Pure function.
 */
KVD_API kvd_status_t kvd_object_header_unpack(const void *buf, size_t len,
                                              kvd_object_header_t *out,
                                              char *err, size_t err_len);

/*
 * Checks that the stored object `obj` of `size_bytes` bytes is the one
 * asked for: its size is kvd_object_stored_bytes(fmt), its header parses,
 * and version, codecs and their parameters, dtype, geometry, namespace and
 * block hash all equal what the reader expects. Returns KVD_OK, or
 * KVD_ERR_CORRUPT with the first difference in `err` (may be NULL); the
 * payload must then not be used. KVD_ERR_INVALID for NULL arguments. Reads
 * only the header (and nothing when the size is wrong). Pure function.
 */
KVD_API kvd_status_t kvd_object_header_check(const kvd_object_format_t *fmt,
                                             const kvd_namespace_t *ns,
                                             const kvd_block_hash_t *hash,
                                             const void *obj, size_t size_bytes,
                                             char *err, size_t err_len);

/* ------------------------------------------------------------------------ */
/* Engine cache layout                                                      */
/* ------------------------------------------------------------------------ */

/*
 * Where one layer's KV lives: element (plane p, block b, token t, head h,
 * channel c) of layer l is at
 *   layer_base[l] + p*stride_plane + b*stride_block + t*stride_token
 *                 + h*stride_head + c*elem_size
 * (strides in bytes; channels are contiguous). This covers vLLM
 * FlashAttention NHD and HND, FlashInfer [NB,2,BS,H,D], MLA [NB,BS,D]
 * (one plane, one head) and the TensorRT-LLM pool [NB,L,2,H*BS*D] (one base
 * per layer inside the pool) without naming any of them.
 */
typedef struct kvd_kv_layout {
    void *const *layer_base; /* num_layers pointers, borrowed */
    uint32_t num_blocks;     /* valid block ids are 0..num_blocks-1 */
    int64_t stride_plane;
    int64_t stride_block;
    int64_t stride_token;
    int64_t stride_head;
} kvd_kv_layout_t;

/*
 * Checks a layout against a format: non-NULL bases, strides that keep every
 * element of a block inside that block's own bytes (no two (plane, token,
 * head, channel) addresses overlap), and blocks that do not overlap.
 * KVD_ERR_INVALID with a reason otherwise (or the format's own error).
 *
 * The rule, exactly: strides must be >= 0 (no engine needs negative ones),
 * num_blocks >= 1, and the dimensions must nest: sorted by stride, each
 * dimension with more than one position (channels count, at stride
 * elem_size) has a stride at least the byte span of all smaller ones, and
 * the layer's total span neither overflows int64 nor wraps past the end of
 * the address space from any base. Gaps are allowed (padded rows, the
 * TensorRT-LLM pool's other layers). The stride of a dimension with one
 * position is ignored (MLA's plane and head strides may be 0). Injective
 * but interleaved strides are rejected, not proven. Different layers'
 * bases are not checked against each other.
 */
KVD_API kvd_status_t kvd_kv_layout_check(const kvd_kv_layout_t *layout,
                                         const kvd_object_format_t *fmt,
                                         char *err, size_t err_len);

/* ------------------------------------------------------------------------ */
/* Codec tables                                                             */
/* ------------------------------------------------------------------------ */

/*
 * Precomputed state a format needs: TurboQuant sign vector (splitmix64 of
 * tq_seed) and Lloyd-Max codebooks for the rotated-coordinate distribution
 * at this head_dim. Create once per format, share read-only. The CUDA
 * implementation uploads the same tables, so CPU and GPU agree.
 */
typedef struct kvd_codec_tables kvd_codec_tables_t;

/*
 * Builds the tables of `fmt` (copied; the tables remember it). Only a
 * format with a TurboQuant plane needs them: for others the tables are
 * empty and cheap, and NULL tables serve as well. Solving the codebooks
 * takes a few milliseconds. On success *tables_out is owned by the caller
 * until kvd_codec_tables_destroy; it is immutable, so any number of
 * threads may use it at once. Errors (*tables_out untouched, the reason
 * logged): KVD_ERR_INVALID (NULL tables_out, or a format
 * kvd_object_format_check refuses with it), KVD_ERR_UNSUPPORTED (a codec
 * the format's head_dim cannot serve), KVD_ERR_NOMEM. Thread: any.
 */
KVD_API kvd_status_t kvd_codec_tables_create(const kvd_object_format_t *fmt,
                                             kvd_codec_tables_t **tables_out);
/* Frees tables made by kvd_codec_tables_create; NULL is accepted. No call
 * may still be using them (the CUDA copy, kvd_cuda_tables_t, is separate
 * and outlives them). */
KVD_API void kvd_codec_tables_destroy(kvd_codec_tables_t *tables);

/* ------------------------------------------------------------------------ */
/* Plain-C reference                                                        */
/* ------------------------------------------------------------------------ */

/*
 * Encodes one plane of one block. `src` holds num_heads*block_size*head_dim
 * elements of fmt->dtype in [head][token][channel] order; tokens >=
 * num_valid_tokens (1..block_size) are ignored (treated as zero, never
 * read). Writes the plane's whole data region to `data` and metadata region
 * to `meta` (sizes from kvd_object_plane_*_bytes), padding zeroed, so the
 * bytes depend on the valid tokens only. `data` and `meta` must be 16-byte
 * aligned; `meta` may be NULL when the region is empty (raw). `tables` may
 * be NULL unless this plane's codec is TurboQuant; then it must come from
 * kvd_codec_tables_create for the same head_dim and tq_seed. Allocates one
 * plane of float scratch for lossy codecs. Errors: KVD_ERR_INVALID /
 * KVD_ERR_UNSUPPORTED (bad format or arguments), KVD_ERR_NOMEM.
 */
KVD_API kvd_status_t kvd_ref_plane_encode(const kvd_object_format_t *fmt,
                                          const kvd_codec_tables_t *tables,
                                          unsigned plane, const void *src,
                                          uint32_t num_valid_tokens, void *data,
                                          void *meta);

/* Inverse of kvd_ref_plane_encode: writes num_valid_tokens tokens per head
 * of `dst` ([head][token][channel]); tokens beyond are left untouched. Same
 * arguments rules and errors as kvd_ref_plane_encode. */
KVD_API kvd_status_t kvd_ref_plane_decode(const kvd_object_format_t *fmt,
                                          const kvd_codec_tables_t *tables,
                                          unsigned plane, const void *data,
                                          const void *meta,
                                          uint32_t num_valid_tokens, void *dst);

/*
 * Gathers layer `layer` of each listed block from the engine cache, encodes
 * it, and writes it at kvd_object_layer_offset(fmt, layer) inside
 * objects[i] (one object per block). The last block may be partial:
 * num_valid_tokens_last tokens (block_size for a full block); its other
 * slots are not read. Objects must be 16-byte aligned and hold
 * kvd_object_bytes(fmt). `tables` may be NULL when neither plane uses a
 * TurboQuant codec. num_blocks == 0 is a no-op (block_ids and objects may
 * then be NULL). Errors: KVD_ERR_INVALID (bad format, layout, layer >=
 * num_layers, valid count outside 1..block_size, NULL or misaligned
 * object, missing tables), KVD_ERR_RANGE (block id < 0 or >= num_blocks),
 * KVD_ERR_NOMEM (one plane of scratch, allocated before any write); on
 * error no object byte has been written.
 */
KVD_API kvd_status_t kvd_ref_gather_layer(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
    const kvd_codec_tables_t *tables, unsigned layer, const int32_t *block_ids,
    size_t num_blocks, uint32_t num_valid_tokens_last, void *const *objects);

/* Exact inverse of kvd_ref_gather_layer: decodes layer `layer` of each
 * object into the listed blocks, writing only tokens < valid count of the
 * listed blocks and nothing else (never padding between rows or blocks).
 * Same arguments, errors and "nothing written" (here: no cache byte). A
 * block id listed twice is written twice, in list order. */
KVD_API kvd_status_t kvd_ref_scatter_layer(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
    const kvd_codec_tables_t *tables, unsigned layer, const int32_t *block_ids,
    size_t num_blocks, uint32_t num_valid_tokens_last,
    const void *const *objects);

/* ------------------------------------------------------------------------ */
/* Rotary position re-rotation (rope.c)                                     */
/* ------------------------------------------------------------------------ */

/*
 * Engines store keys after rotary position embedding (RoPE): the K vector
 * of a token at position q is R(q) k, a rotation of each channel pair by
 * q * inv_freq[i]. Rotations compose, R(q + delta) = R(delta) R(q), so a
 * block of keys computed at positions q.. can be reused at q + delta.. by
 * rotating every stored K vector by delta (non-prefix chunk reuse,
 * CacheBlend / KVBoost style). V is not rotated. docs/codecs.md,
 * "Re-rotating reused keys (RoPE)", gives the formulas and the precision.
 */
typedef enum kvd_rope_style {
    /* pairs (i, i + rotary_dim/2): Llama, Qwen, Mistral, Gemma (HF
     * rotate_half) */
    KVD_ROPE_NEOX = 0,
    KVD_ROPE_GPTJ = 1 /* pairs (2i, 2i + 1): GPT-J, interleaved */
} kvd_rope_style_t;

/* How inv_freq is derived from the base (HF transformers' rope_type).
 * Not implemented, so refused: YaRN (static frequencies, so it could be
 * added; its attention factor scales cos and sin alike, which a rotation
 * keeps), dynamic NTK and longrope (their frequencies depend on the
 * sequence length when the key was computed, so a stored key's angle is
 * not its position times a fixed frequency). */
typedef enum kvd_rope_scaling {
    KVD_ROPE_SCALING_NONE = 0,
    KVD_ROPE_SCALING_LINEAR = 1, /* inv_freq / factor (HF "linear") */
    /* HF "llama3": factor, low_freq_factor, high_freq_factor,
     * original_max_position */
    KVD_ROPE_SCALING_LLAMA3 = 2
} kvd_rope_scaling_t;

/* A model's rotary embedding, as its HF config describes it. */
typedef struct kvd_rope {
    uint32_t head_dim; /* must equal the format's head_dim, 2..1024 */
    /* even, 2..head_dim: channels [0, rotary_dim) rotate (partial rotary,
     * HF partial_rotary_factor * head_dim); the rest pass through */
    uint32_t rotary_dim;
    kvd_rope_style_t style;
    double base; /* rope_theta, finite and > 1 */
    kvd_rope_scaling_t scaling;
    double factor; /* LINEAR / LLAMA3: finite, >= 1; else ignored */
    /* LLAMA3: finite, 0 < low_freq_factor < high_freq_factor */
    double low_freq_factor, high_freq_factor;
    uint32_t original_max_position; /* LLAMA3, > 0 */
} kvd_rope_t;

/*
 * Checks the ranges above. KVD_ERR_INVALID for a NULL rope or a value out
 * of range, KVD_ERR_UNSUPPORTED for a style or scaling value not listed
 * above, with a reason written into `err` (may be NULL). Pure function.
 */
KVD_API kvd_status_t kvd_rope_check(const kvd_rope_t *rope, char *err,
                                    size_t err_len);

/*
 * Writes the rotation frequencies, rotary_dim/2 of them, to inv_freq_out:
 * inv_freq[i] = 1 / base^(2i / rotary_dim), then the scaling, exactly as
 * HF transformers computes inv_freq for that rope_type, but in double
 * (HF computes in float32). Pair i rotates by position * inv_freq[i].
 * Errors (nothing written): kvd_rope_check's, KVD_ERR_INVALID for a NULL
 * inv_freq_out. Pure function.
 */
KVD_API kvd_status_t kvd_rope_inv_freq(const kvd_rope_t *rope,
                                       double *inv_freq_out);

/*
 * Rotates the K plane (plane 0) of layer `layer` of each listed block in
 * the engine cache, in place, by deltas[i] positions: the block's tokens
 * were rotated at positions q and are now meant for q + deltas[i]. A delta
 * may be negative; 0 leaves the block untouched (not even rewritten). The
 * last block may be partial: only its first num_valid_tokens_last tokens
 * are read and written (block_size for a full block). Channels >=
 * rotary_dim, the V plane, other layers and other blocks are never
 * written. A block id listed twice is rotated twice, in list order.
 *
 * Per block and pair i the angle delta * inv_freq[i] is computed exactly
 * and reduced modulo 2*pi in double (error about 1e-15 rad for |delta| <=
 * 2^53, so deltas of 2^40 stay accurate; larger ones are rounded to
 * double first), its cosine and sine are rounded to float, and each pair
 * is rotated in float without fused multiply-add, then rounded to the
 * format's dtype (fp16 or bf16) to nearest even: each result is within
 * half an ulp of the dtype plus 2^-22 of the pair's length of the exact
 * rotation of the stored values. kvd_cuda_rope_shift_layer writes the
 * same bytes.
 *
 * num_blocks == 0 is a no-op (block_ids and deltas may then be NULL).
 * Errors, all before any cache byte is written: KVD_ERR_INVALID (NULL
 * argument, bad format or layout as kvd_kv_layout_check, bad rope as
 * kvd_rope_check, rope->head_dim != fmt->head_dim, layer >= num_layers,
 * valid count outside 1..block_size), KVD_ERR_UNSUPPORTED (an fp8 cache
 * dtype, a one-plane (MLA) format, a rope style or scaling not listed
 * above), KVD_ERR_RANGE (block id < 0 or >= layout->num_blocks).
 * Allocates nothing. Thread: any; the caller keeps other writers off the
 * listed blocks during the call.
 */
KVD_API kvd_status_t kvd_ref_rope_shift_layer(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
    const kvd_rope_t *rope, unsigned layer, const int32_t *block_ids,
    const int64_t *deltas, size_t num_blocks, uint32_t num_valid_tokens_last);

/*
 * kvd_ref_scatter_layer and kvd_ref_rope_shift_layer in one pass: each
 * block is decoded into the cache and its keys rotated by deltas[i] at
 * once, while its rows are still in the CPU's caches (the load of a block
 * reused at another position, docs/chunk-reuse.md). Writes exactly the
 * bytes of the two calls one after the other. Arguments and errors are the
 * union of both (every check before any cache byte is written; `rope` and
 * `deltas` NULL: KVD_ERR_INVALID). Thread: any.
 */
KVD_API kvd_status_t kvd_ref_scatter_layer_rope(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
    const kvd_codec_tables_t *tables, unsigned layer, const int32_t *block_ids,
    size_t num_blocks, uint32_t num_valid_tokens_last,
    const void *const *objects, const kvd_rope_t *rope, const int64_t *deltas);

/*
 * kvd_ref_gather_layer and kvd_ref_scatter_layer(_rope) for a rank holding
 * heads [head_start, head_start + num_heads) of objects of format
 * `object`: `layout` is the rank's cache (its num_heads heads), and each
 * plane's data and metadata go straight to (come straight from) the
 * heads' ranges in the objects, no other byte of them written or read.
 * Needs kvd_object_shard_direct (else KVD_ERR_UNSUPPORTED); `rope` may be
 * NULL (then deltas is ignored). Otherwise the arguments, errors and
 * "nothing written on error" of those calls, with the shard's format.
 */
KVD_API kvd_status_t kvd_ref_gather_layer_heads(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *object,
    const kvd_codec_tables_t *tables, unsigned layer, uint32_t head_start,
    uint32_t num_heads, const int32_t *block_ids, size_t num_blocks,
    uint32_t num_valid_tokens_last, void *const *objects);
KVD_API kvd_status_t kvd_ref_scatter_layer_heads(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *object,
    const kvd_codec_tables_t *tables, unsigned layer, uint32_t head_start,
    uint32_t num_heads, const int32_t *block_ids, size_t num_blocks,
    uint32_t num_valid_tokens_last, const void *const *objects,
    const kvd_rope_t *rope, const int64_t *deltas);

#ifdef __cplusplus
}
#endif

#endif /* KVDEPOT_KERNELS_H */
