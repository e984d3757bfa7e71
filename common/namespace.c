/*
 * Namespace digest (docs/protocol.md): 16 bytes that name everything making
 * stored KV bytes incompatible, so a cache written for one model, dtype,
 * codec or shard can never be read by another. Canonical CBOR (the same
 * encoder as the block hashes) under a version tag, then SHA-256, keeps the
 * digest reproducible outside C: docs/protocol.md gives the recipe and
 * tests/unit/test_namespace.c a vector computed with python3-cbor2.
 */
#include <string.h>

#include "common/cbor_int.h"
#include "common/log_int.h"
#include "kvdepot/common.h"

#define NAMESPACE_TAG "kvdepot-namespace-v2"
#define NAMESPACE_MODEL_ID_MAX 256u
#define NAMESPACE_TEXT_MAX 65536u

static bool text_ok(const char *text)
{
    return text == NULL || strlen(text) <= NAMESPACE_TEXT_MAX;
}

static void pack_opt_text(kvd_cbor_enc_t *enc, const char *text)
{
    kvd_cbor_pack_text(enc, text != NULL ? text : "",
                       text != NULL ? strlen(text) : 0);
}

static bool namespace_desc_ok(const kvd_namespace_desc_t *d)
{
    size_t id_len = d->model_id != NULL ? strlen(d->model_id) : 0;
    return id_len > 0 && id_len <= NAMESPACE_MODEL_ID_MAX &&
           d->num_layers > 0 && d->num_kv_heads > 0 && d->total_kv_heads > 0 &&
           d->head_dim > 0 && d->block_size > 0 && d->tp_size > 0 &&
           d->tp_rank < d->tp_size &&
           (uint64_t)d->head_start + d->num_kv_heads <= d->total_kv_heads &&
           (d->format_version == 0 ||
            d->format_version == KVD_OBJECT_FORMAT_V) &&
           text_ok(d->model_revision) && text_ok(d->weight_quant) &&
           text_ok(d->model_overrides);
}

KVD_API kvd_status_t kvd_namespace_digest(const kvd_namespace_desc_t *desc,
                                          kvd_namespace_t *ns_out)
{
    if (desc == NULL || ns_out == NULL || !namespace_desc_ok(desc)) {
        return KVD_ERR_INVALID;
    }
    uint8_t storage[1024];
    kvd_cbor_enc_t enc;
    kvd_cbor_enc_init(&enc, storage, sizeof storage, KVD_CBOR_ENC_GROW);
    kvd_cbor_pack_array(&enc, 22);
    kvd_cbor_pack_text(&enc, NAMESPACE_TAG, strlen(NAMESPACE_TAG));
    kvd_cbor_pack_text(&enc, desc->model_id, strlen(desc->model_id));
    const uint32_t fields[12] = {
        desc->dtype,      desc->k_codec,        desc->v_codec,
        desc->num_layers, desc->first_layer,    desc->num_kv_heads,
        desc->head_start, desc->total_kv_heads, desc->head_dim,
        desc->block_size, desc->tp_size,        desc->tp_rank};
    for (size_t i = 0; i < 12; i++) {
        kvd_cbor_pack_uint(&enc, fields[i]);
    }
    kvd_cbor_pack_bool(&enc, desc->kv_combined);
    kvd_cbor_pack_uint(&enc, desc->format_version != 0 ? desc->format_version
                                                       : KVD_OBJECT_FORMAT_V);
    kvd_cbor_pack_uint(&enc, desc->tq_seed);
    pack_opt_text(&enc, desc->model_revision);
    pack_opt_text(&enc, desc->weight_quant);
    pack_opt_text(&enc, desc->model_overrides);
    kvd_cbor_pack_uint(&enc, desc->sliding_window);
    kvd_cbor_pack_uint(&enc, desc->generation);
    const uint8_t *data;
    size_t len;
    uint8_t digest[KVD_SHA256_BYTES];
    kvd_status_t status = kvd_cbor_enc_get(&enc, &data, &len);
    if (status == KVD_OK) {
        status = kvd_sha256(data, len, digest);
    }
    kvd_cbor_enc_cleanup(&enc);
    if (status != KVD_OK) {
        return status;
    }
    memcpy(ns_out->bytes, digest, KVD_NAMESPACE_BYTES);
    return KVD_OK;
}
