/*
 * The object header: 128 bytes after every stored object's payload that
 * say what the payload is (format version, dtype, geometry, the codec of
 * each plane and its parameters, payload size), which key it was saved
 * under (namespace digest, block hash), and an XXH3-64 of the header.
 *
 * Why: the store's key says which object is asked for, but until this
 * header only the object's size was checked at load, so bytes written with
 * another TurboQuant seed, another format or under another key (an index
 * or file mix-up, a peer's bug, a namespace computed from the wrong
 * settings) were decoded as if they were right. The header travels inside
 * the object bytes, so the arena, the NVMe files, the daemon's shared
 * mapping and the cluster's FETCH carry it without knowing about it, and
 * the checksums they keep cover it. It sits after the payload so that
 * kvd_object_layer_offset, the CUDA kernels and the worker's staging
 * strides (all payload-relative) are unchanged.
 *
 * Layout, little-endian (docs/architecture.md §5):
 *   0 magic "KVDO"        4 version u16       6 header bytes u16 (128)
 *   8 dtype u8            9 planes u8        10 codec[0] u8  11 codec[1] u8
 *  12 num_layers u32     16 num_heads u32    20 head_dim u32
 *  24 block_size u32     28 zero u32         32 tq_seed u64
 *  40 payload bytes u64  48 namespace (16)   64 block hash (32)
 *  96 position u64     104 zero (16)        120 XXH3-64 of bytes 0..119
 * The position is where the block's first token was when its KV was
 * computed (keys are stored after the rotary embedding, so a block reused
 * at another position is rotated by the difference); objects written
 * before it was recorded read as position 0.
 * Fields the format does not use are written as zero (codec[1] with one
 * plane, tq_seed without a TurboQuant plane) so two equal formats always
 * give equal headers.
 */
#include <stdio.h>
#include <string.h>

#include "common/endian_int.h"
#include "kernels/ref/plane_int.h"

#define HDR_MAGIC "KVDO"
#define HDR_SUM_AT 120u

size_t kvd_object_stored_bytes(const kvd_object_format_t *fmt)
{
    size_t payload = kvd_object_bytes(fmt);
    return payload == 0 ? 0 : payload + KVD_OBJECT_HEADER_BYTES;
}

/* The format as the header records it: unused fields zero. */
static kvd_object_format_t hdr_canonical(const kvd_object_format_t *fmt)
{
    kvd_object_format_t f = *fmt;
    bool tq = false;
    for (uint32_t p = 0; p < f.num_planes && p < 2; p++) {
        tq = tq || kvd_codec_is_tq(f.codec[p]);
    }
    if (f.num_planes == 1) {
        f.codec[1] = KVD_CODEC_RAW;
    }
    if (!tq) {
        f.tq_seed = 0;
    }
    return f;
}

kvd_status_t kvd_object_header_pack(const kvd_object_format_t *fmt,
                                    const kvd_namespace_t *ns,
                                    const kvd_block_hash_t *hash, void *out)
{
    return kvd_object_header_pack_at(fmt, ns, hash, 0, out);
}

kvd_status_t kvd_object_header_pack_at(const kvd_object_format_t *fmt,
                                       const kvd_namespace_t *ns,
                                       const kvd_block_hash_t *hash,
                                       uint64_t position, void *out)
{
    if (fmt == NULL || ns == NULL || hash == NULL || out == NULL ||
        position > KVD_OBJECT_MAX_POSITION ||
        kvd_object_format_check(fmt, NULL, 0) != KVD_OK) {
        return KVD_ERR_INVALID;
    }
    kvd_object_format_t f = hdr_canonical(fmt);
    uint8_t h[KVD_OBJECT_HEADER_BYTES];
    memset(h, 0, sizeof h);
    memcpy(h, HDR_MAGIC, 4);
    kvd_put_le16(h + 4, KVD_OBJECT_FORMAT_V);
    kvd_put_le16(h + 6, KVD_OBJECT_HEADER_BYTES);
    h[8] = (uint8_t)f.dtype;
    h[9] = (uint8_t)f.num_planes;
    h[10] = (uint8_t)f.codec[0];
    h[11] = (uint8_t)f.codec[1];
    kvd_put_le32(h + 12, f.num_layers);
    kvd_put_le32(h + 16, f.num_heads);
    kvd_put_le32(h + 20, f.head_dim);
    kvd_put_le32(h + 24, f.block_size);
    kvd_put_le64(h + 32, f.tq_seed);
    kvd_put_le64(h + 40, kvd_object_bytes(fmt));
    memcpy(h + 48, ns->bytes, KVD_NAMESPACE_BYTES);
    memcpy(h + 64, hash->bytes, KVD_SHA256_BYTES);
    kvd_put_le64(h + 96, position);
    kvd_put_le64(h + HDR_SUM_AT, kvd_xxh3_64(h, HDR_SUM_AT));
    memcpy(out, h, sizeof h);
    return KVD_OK;
}

static bool zero_bytes(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != 0) {
            return false;
        }
    }
    return true;
}

kvd_status_t kvd_object_header_unpack(const void *buf, size_t len,
                                      kvd_object_header_t *out, char *err,
                                      size_t err_len)
{
    if (buf == NULL || out == NULL) {
        return KVD_ERR_INVALID;
    }
    const uint8_t *h = buf;
    if (len < KVD_OBJECT_HEADER_BYTES || memcmp(h, HDR_MAGIC, 4) != 0 ||
        kvd_get_le16(h + 6) != KVD_OBJECT_HEADER_BYTES) {
        return kvd_format_fail(
            KVD_ERR_CORRUPT, err, err_len,
            "no object header (%zu bytes, magic or size wrong)", len);
    }
    if (kvd_get_le64(h + HDR_SUM_AT) != kvd_xxh3_64(h, HDR_SUM_AT)) {
        return kvd_format_fail(KVD_ERR_CORRUPT, err, err_len,
                               "object header checksum mismatch");
    }
    kvd_object_header_t o;
    memset(&o, 0, sizeof o);
    o.version = kvd_get_le16(h + 4);
    if (o.version != KVD_OBJECT_FORMAT_V) {
        return kvd_format_fail(KVD_ERR_CORRUPT, err, err_len,
                               "object format version %u, this build reads %u",
                               o.version, KVD_OBJECT_FORMAT_V);
    }
    o.format.dtype = (kvd_dtype_t)h[8];
    o.format.num_planes = h[9];
    o.format.codec[0] = (kvd_codec_t)h[10];
    o.format.codec[1] = (kvd_codec_t)h[11];
    o.format.num_layers = kvd_get_le32(h + 12);
    o.format.num_heads = kvd_get_le32(h + 16);
    o.format.head_dim = kvd_get_le32(h + 20);
    o.format.block_size = kvd_get_le32(h + 24);
    o.format.tq_seed = kvd_get_le64(h + 32);
    o.payload_bytes = kvd_get_le64(h + 40);
    memcpy(o.ns.bytes, h + 48, KVD_NAMESPACE_BYTES);
    memcpy(o.hash.bytes, h + 64, KVD_SHA256_BYTES);
    o.position = kvd_get_le64(h + 96);
    char why[160] = "";
    if (!zero_bytes(h + 28, 4) || !zero_bytes(h + 104, 16)) {
        return kvd_format_fail(KVD_ERR_CORRUPT, err, err_len,
                               "object header: reserved bytes set");
    }
    if (o.position > KVD_OBJECT_MAX_POSITION) {
        return kvd_format_fail(KVD_ERR_CORRUPT, err, err_len,
                               "object header: position %llu out of range",
                               (unsigned long long)o.position);
    }
    if (kvd_object_format_check(&o.format, why, sizeof why) != KVD_OK) {
        return kvd_format_fail(KVD_ERR_CORRUPT, err, err_len,
                               "object header: bad format: %s", why);
    }
    if (o.payload_bytes != kvd_object_bytes(&o.format)) {
        return kvd_format_fail(
            KVD_ERR_CORRUPT, err, err_len,
            "object header: payload %llu bytes, its format %zu",
            (unsigned long long)o.payload_bytes, kvd_object_bytes(&o.format));
    }
    *out = o;
    return KVD_OK;
}

/* First difference between what the header says and what the reader
 * expects, or NULL. */
static const char *hdr_diff(const kvd_object_header_t *h,
                            const kvd_object_format_t *want)
{
    const kvd_object_format_t *f = &h->format;
    if (f->dtype != want->dtype) {
        return "dtype";
    }
    if (f->num_planes != want->num_planes) {
        return "number of planes";
    }
    if (f->codec[0] != want->codec[0] || f->codec[1] != want->codec[1]) {
        return "codec";
    }
    if (f->tq_seed != want->tq_seed) {
        return "TurboQuant seed";
    }
    if (f->num_layers != want->num_layers || f->num_heads != want->num_heads ||
        f->head_dim != want->head_dim || f->block_size != want->block_size) {
        return "geometry (layers, heads, head_dim, block_size)";
    }
    return NULL;
}

kvd_status_t kvd_object_header_check(const kvd_object_format_t *fmt,
                                     const kvd_namespace_t *ns,
                                     const kvd_block_hash_t *hash,
                                     const void *obj, size_t size_bytes,
                                     char *err, size_t err_len)
{
    if (fmt == NULL || ns == NULL || hash == NULL || obj == NULL) {
        return KVD_ERR_INVALID;
    }
    size_t payload = kvd_object_bytes(fmt);
    if (payload == 0) {
        return KVD_ERR_INVALID;
    }
    if (size_bytes != payload + KVD_OBJECT_HEADER_BYTES) {
        return kvd_format_fail(KVD_ERR_CORRUPT, err, err_len,
                               "object has %zu bytes, the format %zu",
                               size_bytes, payload + KVD_OBJECT_HEADER_BYTES);
    }
    kvd_object_header_t h;
    kvd_status_t st =
        kvd_object_header_unpack((const uint8_t *)obj + payload,
                                 KVD_OBJECT_HEADER_BYTES, &h, err, err_len);
    if (st != KVD_OK) {
        return st;
    }
    kvd_object_format_t want = hdr_canonical(fmt);
    const char *diff = hdr_diff(&h, &want);
    if (diff != NULL) {
        return kvd_format_fail(KVD_ERR_CORRUPT, err, err_len,
                               "object header: %s differs from the reader's",
                               diff);
    }
    if (memcmp(h.ns.bytes, ns->bytes, KVD_NAMESPACE_BYTES) != 0) {
        return kvd_format_fail(KVD_ERR_CORRUPT, err, err_len,
                               "object header: saved in another namespace");
    }
    if (memcmp(h.hash.bytes, hash->bytes, KVD_SHA256_BYTES) != 0) {
        return kvd_format_fail(KVD_ERR_CORRUPT, err, err_len,
                               "object header: saved under another block hash");
    }
    return KVD_OK;
}
