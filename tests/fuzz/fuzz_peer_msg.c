/*
 * libFuzzer target for the peer messages of the cluster data plane
 * (cluster/peer_wire.c): the first KVD_PEER_HDR_BYTES bytes are a header
 * (KVD_PEER_PART_HDR_BYTES when its op is DATA_PART), the rest its body,
 * as UCX hands them to the active-message handler.
 * Checks that a header that decodes encodes back to the same bytes, that
 * the body length it accepted matches its op and count, and that an OFFER
 * body decodes to a valid node id and entries inside the body. Seeds in
 * corpus/peer_msg/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/peer_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < KVD_PEER_HDR_BYTES) {
        kvd_peer_hdr_t h;
        if (kvd_peer_hdr_decode(data, size, 0, &h) == KVD_OK) {
            abort(); /* a short header never decodes */
        }
        return 0;
    }
    size_t hlen = KVD_PEER_HDR_BYTES;
    if ((data[6] | data[7] << 8) == KVD_PEER_OP_DATA_PART &&
        size >= KVD_PEER_PART_HDR_BYTES) {
        hlen = KVD_PEER_PART_HDR_BYTES;
    }
    const uint8_t *body = data + hlen;
    size_t len = size - hlen;
    kvd_peer_hdr_t h;
    if (kvd_peer_hdr_decode(data, hlen, len, &h) != KVD_OK) {
        return 0;
    }
    uint8_t again[KVD_PEER_HDR_MAX_BYTES];
    if (kvd_peer_hdr_encode(&h, again) != hlen ||
        memcmp(again, data, hlen) != 0) {
        abort();
    }
    switch (h.op) {
    case KVD_PEER_OP_DATA_PART:
        if (len == 0 || h.offset >= h.size || len > h.size - h.offset ||
            h.status != KVD_OK) {
            abort(); /* a part outside its object was accepted */
        }
        break;
    case KVD_PEER_OP_LOOKUP:
        if (len != (size_t)h.count * 32 || h.count == 0) {
            abort();
        }
        break;
    case KVD_PEER_OP_FETCH: {
        const uint8_t *addr = NULL, *entries = NULL;
        size_t alen = 0;
        if (len < 2 + (size_t)h.count * 40 || h.count == 0) {
            abort();
        }
        if (kvd_peer_fetch_decode(body, len, h.count, &addr, &alen, &entries) ==
                KVD_OK &&
            (addr != body + 2 || alen == 0 || alen > KVD_PEER_MAX_ADDRESS ||
             entries != body + 2 + alen ||
             entries + (size_t)h.count * 40 != body + len)) {
            abort();
        }
        break;
    }
    case KVD_PEER_OP_OFFER: {
        char id[KVD_PEER_MAX_NODE_ID + 1];
        const uint8_t *entries = NULL;
        if (kvd_peer_offer_decode(body, len, h.count, id, &entries) == KVD_OK) {
            size_t id_len = strlen(id);
            if (id_len == 0 || id_len > KVD_PEER_MAX_NODE_ID ||
                entries != body + 2 + id_len ||
                entries + (size_t)h.count * 40 != body + len) {
                abort();
            }
        }
        break;
    }
    default: break;
    }
    return 0;
}
