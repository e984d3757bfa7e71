/*
 * Encoding and checking of the peer messages (cluster/peer_int.h). Every
 * byte here comes from the network: lengths are checked against the op
 * and count before anything is read.
 */
#include <stdbool.h>
#include <string.h>

#include "cluster/peer_int.h"
#include "common/endian_int.h"

size_t kvd_peer_hdr_encode(const kvd_peer_hdr_t *h,
                           uint8_t out[KVD_PEER_HDR_MAX_BYTES])
{
    kvd_put_le32(out, KVD_PEER_MAGIC);
    kvd_put_le16(out + 4, KVD_PEER_VERSION);
    kvd_put_le16(out + 6, h->op);
    kvd_put_le64(out + 8, h->req_id);
    kvd_put_le32(out + 16, (uint32_t)h->status);
    kvd_put_le32(out + 20, h->count);
    kvd_put_le64(out + 24, h->size);
    kvd_put_le64(out + 32, h->checksum);
    memcpy(out + 40, h->ns.bytes, KVD_NAMESPACE_BYTES);
    memcpy(out + 56, h->auth, KVD_PEER_AUTH_BYTES);
    if (h->op != KVD_PEER_OP_DATA_PART) {
        return KVD_PEER_HDR_BYTES;
    }
    kvd_put_le64(out + KVD_PEER_HDR_BYTES, h->offset);
    return KVD_PEER_PART_HDR_BYTES;
}

kvd_status_t kvd_peer_hdr_decode(const void *buf, size_t len, size_t body_len,
                                 kvd_peer_hdr_t *out)
{
    const uint8_t *p = buf;
    if (p == NULL || out == NULL || len < KVD_PEER_HDR_BYTES ||
        kvd_get_le32(p) != KVD_PEER_MAGIC ||
        kvd_get_le16(p + 4) != KVD_PEER_VERSION) {
        return KVD_ERR_PROTO;
    }
    memset(out, 0, sizeof *out);
    out->op = kvd_get_le16(p + 6);
    bool part = out->op == KVD_PEER_OP_DATA_PART;
    if (len != (part ? KVD_PEER_PART_HDR_BYTES : KVD_PEER_HDR_BYTES)) {
        return KVD_ERR_PROTO;
    }
    out->req_id = kvd_get_le64(p + 8);
    out->status = (int32_t)kvd_get_le32(p + 16);
    out->count = kvd_get_le32(p + 20);
    out->size = kvd_get_le64(p + 24);
    out->checksum = kvd_get_le64(p + 32);
    memcpy(out->ns.bytes, p + 40, KVD_NAMESPACE_BYTES);
    memcpy(out->auth, p + 56, KVD_PEER_AUTH_BYTES);
    uint64_t n = out->count;
    switch (out->op) {
    case KVD_PEER_OP_LOOKUP:
        return n >= 1 && n <= KVD_PEER_MAX_KEYS && body_len == n * 32
                   ? KVD_OK
                   : KVD_ERR_PROTO;
    case KVD_PEER_OP_FETCH:
        return n >= 1 && n <= KVD_PEER_MAX_KEYS && body_len >= 2 + 1 + n * 40 &&
                       body_len <= 2 + KVD_PEER_MAX_ADDRESS + n * 40
                   ? KVD_OK
                   : KVD_ERR_PROTO;
    case KVD_PEER_OP_LOOKUP_REPLY:
        /* A refused request is answered with no sizes. */
        return n <= KVD_PEER_MAX_KEYS && body_len == n * 8 &&
                       (n > 0 || out->status != KVD_OK)
                   ? KVD_OK
                   : KVD_ERR_PROTO;
    case KVD_PEER_OP_DATA:
        if (n >= KVD_PEER_MAX_KEYS) {
            return KVD_ERR_PROTO;
        }
        if (out->status != KVD_OK) {
            return body_len == 0 ? KVD_OK : KVD_ERR_PROTO;
        }
        return out->size >= 1 && out->size <= (UINT64_C(1) << 30) &&
                       body_len == out->size
                   ? KVD_OK
                   : KVD_ERR_PROTO;
    case KVD_PEER_OP_DATA_PART:
        out->offset = kvd_get_le64(p + KVD_PEER_HDR_BYTES);
        /* Failures go as DATA; a part is bytes of an object, in bounds. */
        return n < KVD_PEER_MAX_KEYS && out->status == KVD_OK &&
                       out->size >= 1 && out->size <= (UINT64_C(1) << 30) &&
                       body_len >= 1 && out->offset < out->size &&
                       body_len <= out->size - out->offset
                   ? KVD_OK
                   : KVD_ERR_PROTO;
    case KVD_PEER_OP_OFFER:
        return n >= 1 && n <= KVD_PEER_MAX_KEYS && out->size <= UINT32_MAX &&
                       body_len >= 2 + n * 40 &&
                       body_len <= 2 + KVD_PEER_MAX_NODE_ID + n * 40
                   ? KVD_OK
                   : KVD_ERR_PROTO;
    default: return KVD_ERR_PROTO;
    }
}

kvd_status_t kvd_peer_fetch_decode(const uint8_t *body, size_t len,
                                   uint32_t count, const uint8_t **address,
                                   size_t *address_len, const uint8_t **entries)
{
    if (body == NULL || len < 2 || count == 0 || count > KVD_PEER_MAX_KEYS) {
        return KVD_ERR_PROTO;
    }
    size_t alen = kvd_get_le16(body);
    if (alen == 0 || alen > KVD_PEER_MAX_ADDRESS ||
        len != 2 + alen + (size_t)count * 40) {
        return KVD_ERR_PROTO;
    }
    *address = body + 2;
    *address_len = alen;
    *entries = body + 2 + alen;
    return KVD_OK;
}

kvd_status_t kvd_peer_offer_decode(const uint8_t *body, size_t len,
                                   uint32_t count, char *node_id,
                                   const uint8_t **entries)
{
    if (body == NULL || len < 2 || count == 0 || count > KVD_PEER_MAX_KEYS) {
        return KVD_ERR_PROTO;
    }
    size_t id_len = kvd_get_le16(body);
    if (id_len == 0 || id_len > KVD_PEER_MAX_NODE_ID ||
        len != 2 + id_len + (size_t)count * 40) {
        return KVD_ERR_PROTO;
    }
    for (size_t i = 0; i < id_len; i++) {
        char c = (char)body[2 + i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
        if (!ok) {
            return KVD_ERR_PROTO;
        }
    }
    memcpy(node_id, body + 2, id_len);
    node_id[id_len] = '\0';
    *entries = body + 2 + id_len;
    return KVD_OK;
}
