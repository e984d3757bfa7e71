/*
 * Object format arithmetic and argument checks shared by the reference and
 * CUDA kernels: dtype sizes, codec names, kvd_object_format_check, the
 * per-plane region sizes and layer offsets, and kvd_kv_layout_check.
 *
 * Sizes are a pure function of the format (docs/codecs.md), so a stored
 * object's layout never depends on anything but its header. Every region
 * (a plane's data, a plane's metadata) is rounded up to 16 bytes so that
 * GPU kernels can use 16-byte vector accesses on every region start.
 *
 * The layout check is deliberately conservative. It proves that the five
 * strided dimensions (plane, block, token, head, channel) address disjoint
 * elements by requiring them to nest: sorted by stride, every dimension's
 * stride is at least the byte span of all smaller ones. Every engine layout
 * in kernels/README.md nests; exotic interleavings that happen to be
 * injective are rejected rather than proven. Negative strides are rejected
 * too: no engine needs them, and with non-negative strides the base pointer
 * is the lowest address, so "base + span does not wrap" bounds the whole
 * layer.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/log_int.h"
#include "kernels/ref/plane_int.h"

#define KVD_REGION_ALIGN 16u

static const char *const kvd_codec_names[KVD_CODEC_COUNT] = {
    "raw", "fp8_e4m3", "int8", "kivi4", "kivi2", "tq4", "tq3", "tq2",
};

size_t kvd_dtype_size(kvd_dtype_t dtype)
{
    switch (dtype) {
    case KVD_DTYPE_FP16: return 2;
    case KVD_DTYPE_BF16: return 2;
    case KVD_DTYPE_FP8_E4M3: return 1;
    case KVD_DTYPE_FP8_E5M2: return 1;
    }
    return 0;
}

bool kvd_dtype_is_fp8(kvd_dtype_t dtype)
{
    return dtype == KVD_DTYPE_FP8_E4M3 || dtype == KVD_DTYPE_FP8_E5M2;
}

const char *kvd_codec_name(kvd_codec_t codec)
{
    if ((unsigned)codec >= KVD_CODEC_COUNT) {
        return NULL;
    }
    return kvd_codec_names[codec];
}

kvd_status_t kvd_codec_parse(const char *name, kvd_codec_t *codec_out)
{
    if (name == NULL || codec_out == NULL) {
        return KVD_ERR_INVALID;
    }
    for (unsigned i = 0; i < KVD_CODEC_COUNT; i++) {
        if (strcmp(name, kvd_codec_names[i]) == 0) {
            *codec_out = (kvd_codec_t)i;
            return KVD_OK;
        }
    }
    return KVD_ERR_INVALID;
}

kvd_status_t kvd_format_fail(kvd_status_t status, char *err, size_t err_len,
                             const char *fmt, ...)
{
    if (err != NULL && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return status;
}

static kvd_status_t kvd_codec_check(const kvd_object_format_t *fmt,
                                    unsigned plane, char *err, size_t err_len)
{
    kvd_codec_t c = fmt->codec[plane];

    if ((unsigned)c >= KVD_CODEC_COUNT) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                               "plane %u: unknown codec %d", plane, (int)c);
    }
    if (kvd_dtype_is_fp8(fmt->dtype) && c != KVD_CODEC_RAW) {
        return kvd_format_fail(KVD_ERR_UNSUPPORTED, err, err_len,
                               "plane %u: fp8 caches pass through raw only, "
                               "not %s",
                               plane, kvd_codec_names[c]);
    }
    if (kvd_codec_is_kivi(c) && plane == KVD_PLANE_V &&
        fmt->head_dim % 32u != 0) {
        return kvd_format_fail(KVD_ERR_UNSUPPORTED, err, err_len,
                               "%s on V needs head_dim %% 32 == 0, got %u",
                               kvd_codec_names[c], fmt->head_dim);
    }
    if (kvd_codec_is_tq(c) && fmt->head_dim != 64 && fmt->head_dim != 128 &&
        fmt->head_dim != 256) {
        return kvd_format_fail(KVD_ERR_UNSUPPORTED, err, err_len,
                               "%s needs head_dim 64, 128 or 256, got %u",
                               kvd_codec_names[c], fmt->head_dim);
    }
    return KVD_OK;
}

kvd_status_t kvd_object_format_check(const kvd_object_format_t *fmt, char *err,
                                     size_t err_len)
{
    if (fmt == NULL) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len, "NULL format");
    }
    if (kvd_dtype_size(fmt->dtype) == 0) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                               "unknown dtype %d", (int)fmt->dtype);
    }
    if (fmt->num_layers < 1 || fmt->num_layers > 1024) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                               "num_layers %u not in 1..1024", fmt->num_layers);
    }
    if (fmt->num_planes != 1 && fmt->num_planes != 2) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                               "num_planes %u is neither 1 nor 2",
                               fmt->num_planes);
    }
    if (fmt->num_heads < 1 || fmt->num_heads > 1024) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                               "num_heads %u not in 1..1024", fmt->num_heads);
    }
    if (fmt->head_dim < 1 || fmt->head_dim > 1024) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                               "head_dim %u not in 1..1024", fmt->head_dim);
    }
    if (fmt->block_size < 1 || fmt->block_size > 4096) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                               "block_size %u not in 1..4096", fmt->block_size);
    }
    for (unsigned p = 0; p < fmt->num_planes; p++) {
        kvd_status_t st = kvd_codec_check(fmt, p, err, err_len);
        if (st != KVD_OK) {
            return st;
        }
    }
    return KVD_OK;
}

/* With the ranges above, the largest region is 1024 heads * 4096 tokens *
 * 1024 channels * 2 bytes = 2^33 bytes and a whole object stays below
 * 2^44, so plain size_t arithmetic cannot overflow on the 64-bit targets
 * kvdepot supports. */
_Static_assert(sizeof(size_t) >= 8, "kvdepot needs a 64-bit size_t");

static size_t kvd_region_round(size_t bytes)
{
    return (bytes + KVD_REGION_ALIGN - 1) & ~(size_t)(KVD_REGION_ALIGN - 1);
}

/* A plane index the format does not have, or a format that fails the check,
 * has no regions: 0 keeps callers that skip the check from computing
 * offsets out of garbage. */
static int kvd_plane_ok(const kvd_object_format_t *fmt, unsigned plane)
{
    return kvd_object_format_check(fmt, NULL, 0) == KVD_OK &&
           plane < fmt->num_planes;
}

size_t kvd_object_plane_data_bytes(const kvd_object_format_t *fmt,
                                   unsigned plane)
{
    if (!kvd_plane_ok(fmt, plane)) {
        return 0;
    }
    size_t n = (size_t)fmt->num_heads * fmt->block_size * fmt->head_dim;
    kvd_codec_t c = fmt->codec[plane];
    size_t bytes;

    if (c == KVD_CODEC_RAW) {
        bytes = n * kvd_dtype_size(fmt->dtype);
    } else {
        /* Sub-byte codes are packed across the whole region, so only the
         * region end can hold a partial byte. */
        bytes = (n * kvd_codec_bits(c) + 7) / 8;
    }
    return kvd_region_round(bytes);
}

size_t kvd_object_plane_meta_bytes(const kvd_object_format_t *fmt,
                                   unsigned plane)
{
    if (!kvd_plane_ok(fmt, plane)) {
        return 0;
    }
    size_t vecs = (size_t)fmt->num_heads * fmt->block_size;
    size_t bytes = 0;

    switch (fmt->codec[plane]) {
    case KVD_CODEC_RAW: bytes = 0; break;
    case KVD_CODEC_FP8_E4M3: bytes = vecs * 4; break;
    case KVD_CODEC_INT8:
        /* fp16 scale per channel over the block for K, per token for V. */
        bytes = plane == KVD_PLANE_K
                    ? (size_t)fmt->num_heads * fmt->head_dim * 2
                    : vecs * 2;
        break;
    case KVD_CODEC_KIVI4:
    case KVD_CODEC_KIVI2:
        /* (fp16 scale, fp16 min) per channel over the block for K, per
         * 32-channel group of each token for V. */
        if (plane == KVD_PLANE_K) {
            bytes = (size_t)fmt->num_heads * fmt->head_dim * 4;
        } else {
            bytes = vecs * (fmt->head_dim / 32) * 4;
        }
        break;
    case KVD_CODEC_TQ4:
    case KVD_CODEC_TQ3:
    case KVD_CODEC_TQ2: bytes = vecs * 2; break;
    }
    return kvd_region_round(bytes);
}

size_t kvd_object_layer_bytes(const kvd_object_format_t *fmt)
{
    if (kvd_object_format_check(fmt, NULL, 0) != KVD_OK) {
        return 0;
    }
    size_t bytes = 0;
    for (unsigned p = 0; p < fmt->num_planes; p++) {
        bytes += kvd_object_plane_data_bytes(fmt, p) +
                 kvd_object_plane_meta_bytes(fmt, p);
    }
    return bytes;
}

size_t kvd_object_layer_offset(const kvd_object_format_t *fmt, unsigned layer)
{
    size_t layer_bytes = kvd_object_layer_bytes(fmt);
    if (layer_bytes == 0 || layer >= fmt->num_layers) {
        return 0;
    }
    return layer_bytes * layer;
}

size_t kvd_object_bytes(const kvd_object_format_t *fmt)
{
    size_t layer_bytes = kvd_object_layer_bytes(fmt);
    if (layer_bytes == 0) {
        return 0;
    }
    return layer_bytes * fmt->num_layers;
}

/* One strided dimension of a layer: how many positions it has and how far
 * apart they are. */
typedef struct kvd_layout_dim {
    const char *name;
    uint64_t extent;
    uint64_t stride;
} kvd_layout_dim_t;

kvd_status_t kvd_kv_layout_check(const kvd_kv_layout_t *layout,
                                 const kvd_object_format_t *fmt, char *err,
                                 size_t err_len)
{
    kvd_status_t st = kvd_object_format_check(fmt, err, err_len);
    if (st != KVD_OK) {
        return st;
    }
    if (layout == NULL) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len, "NULL layout");
    }
    if (layout->layer_base == NULL) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                               "NULL layer_base array");
    }
    if (layout->num_blocks == 0) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                               "layout has no blocks");
    }
    const int64_t strides[4] = {layout->stride_plane, layout->stride_block,
                                layout->stride_token, layout->stride_head};
    const char *const names[4] = {"plane", "block", "token", "head"};
    for (unsigned i = 0; i < 4; i++) {
        if (strides[i] < 0) {
            return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                                   "negative stride_%s %lld", names[i],
                                   (long long)strides[i]);
        }
    }

    uint64_t elt = kvd_dtype_size(fmt->dtype);
    kvd_layout_dim_t dims[5] = {
        {"channel", fmt->head_dim, elt},
        {"head", fmt->num_heads, (uint64_t)layout->stride_head},
        {"token", fmt->block_size, (uint64_t)layout->stride_token},
        {"plane", fmt->num_planes, (uint64_t)layout->stride_plane},
        {"block", layout->num_blocks, (uint64_t)layout->stride_block},
    };
    /* Insertion sort by stride (five entries). A dimension with extent 1
     * never moves off its first position, so its stride is irrelevant and
     * it is skipped below, whatever value the caller left there. Ties keep
     * the order above, so the message names the inner dimension first. */
    for (unsigned i = 1; i < 5; i++) {
        kvd_layout_dim_t d = dims[i];
        unsigned j = i;
        while (j > 0 && dims[j - 1].stride > d.stride) {
            dims[j] = dims[j - 1];
            j--;
        }
        dims[j] = d;
    }
    /* span = bytes covered by the sub-box of the dimensions seen so far,
     * starting with one element. A dimension nests when its stride is at
     * least that span; its copies are then disjoint translates. */
    uint64_t span = elt;
    const char *inner = "element";
    for (unsigned i = 0; i < 5; i++) {
        if (dims[i].extent <= 1) {
            continue;
        }
        if (dims[i].stride < span) {
            return kvd_format_fail(
                KVD_ERR_INVALID, err, err_len,
                "stride_%s %llu overlaps %s span %llu: elements would alias",
                dims[i].name, (unsigned long long)dims[i].stride, inner,
                (unsigned long long)span);
        }
        uint64_t add;
        if (__builtin_mul_overflow(dims[i].extent - 1, dims[i].stride, &add) ||
            __builtin_add_overflow(span, add, &span) || span > INT64_MAX) {
            return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                                   "layer span overflows at stride_%s",
                                   dims[i].name);
        }
        inner = dims[i].name;
    }

    for (uint32_t l = 0; l < fmt->num_layers; l++) {
        uintptr_t base = (uintptr_t)layout->layer_base[l];
        uintptr_t end;
        if (base == 0) {
            return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                                   "layer %u: NULL base", l);
        }
        if (__builtin_add_overflow(base, (uintptr_t)span, &end)) {
            return kvd_format_fail(KVD_ERR_INVALID, err, err_len,
                                   "layer %u: base + span %llu wraps", l,
                                   (unsigned long long)span);
        }
    }
    return KVD_OK;
}

kvd_status_t kvd_object_format_fallback(kvd_object_format_t *fmt, char *err,
                                        size_t err_len,
                                        unsigned *num_changed_out)
{
    unsigned changed = 0;

    if (fmt == NULL) {
        return kvd_format_fail(KVD_ERR_INVALID, err, err_len, "NULL format");
    }
    if (err != NULL && err_len > 0) {
        err[0] = '\0';
    }
    for (unsigned plane = 0; plane < fmt->num_planes && plane < 2; plane++) {
        kvd_codec_t c = fmt->codec[plane];
        char why[128];
        /* Only a shape a codec cannot serve falls back; anything else
         * (unknown codec, an fp8 cache) stays an error for the check. */
        if ((!kvd_codec_is_tq(c) && !kvd_codec_is_kivi(c)) ||
            kvd_dtype_is_fp8(fmt->dtype) ||
            kvd_codec_check(fmt, plane, why, sizeof(why)) !=
                KVD_ERR_UNSUPPORTED) {
            continue;
        }
        fmt->codec[plane] = KVD_CODEC_FP8_E4M3;
        changed++;
        KVD_LOG_WARN("%s: plane %s falls back to fp8_e4m3", why,
                     plane == KVD_PLANE_K ? "K" : "V");
        kvd_format_fail(KVD_OK, err, err_len,
                        "%s: plane %s falls back to "
                        "fp8_e4m3",
                        why, plane == KVD_PLANE_K ? "K" : "V");
    }
    kvd_status_t st = kvd_object_format_check(fmt, err, err_len);
    if (st == KVD_OK && num_changed_out != NULL) {
        *num_changed_out = changed;
    }
    return st;
}
