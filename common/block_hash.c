/*
 * Block identity (docs/architecture.md §5): the prefix-cache hash chain
 *   h_i = SHA-256(canonical_cbor([h_{i-1}, [tokens...], extras | null]))
 * built to be byte-identical to vLLM's hash_block_tokens with the
 * "sha256_cbor" algorithm, so a key computed here equals the BlockHash the
 * engine computes for the same block when both start from the same root
 * (vLLM's NONE_HASH = sha256_cbor(PYTHONHASHSEED)).
 *
 * Python's cbor2 turns the tuple (parent, tuple(tokens), extra_keys) into a
 * 3-array of a 32-byte bstr, an array of unsigned ints, and null or an array
 * of the extras; canonical=True only changes floats and maps, which never
 * occur here, while integers and lengths always take their shortest form.
 *
 * Hot path: the scheduler hashes every new full block of every request. A
 * 16-token block is at most ~120 bytes of CBOR, so it is encoded into a
 * stack buffer and hashed with one EVP one-shot; the encoder falls back to
 * the heap only for long blocks or large extras. The chain reuses one
 * encoder, so even long blocks allocate once per chain, not once per block.
 */
#include <string.h>

#include "common/cbor_int.h"
#include "common/log_int.h"

/* Holds a 64-token block with worst-case 5-byte tokens (359 bytes) plus
 * ~150 bytes of extras; 16-token blocks leave room for ~390 bytes. */
#define KVD_BLOCK_HASH_STACK_BYTES 512

/* Rejects extras whose pointers cannot be followed. Checked before any
 * hashing so the chain fails before it writes anything. */
static kvd_status_t kvd_block_extras_check(const kvd_block_extras_t *extras)
{
    if (extras == NULL || extras->num_mm == 0) {
        return KVD_OK;
    }
    if (extras->mm == NULL) {
        KVD_LOG_DEBUG("block extras: num_mm=%zu with mm NULL", extras->num_mm);
        return KVD_ERR_INVALID;
    }
    for (size_t i = 0; i < extras->num_mm; i++) {
        if (extras->mm[i].identifier == NULL) {
            KVD_LOG_DEBUG("block extras: mm[%zu].identifier is NULL", i);
            return KVD_ERR_INVALID;
        }
    }
    return KVD_OK;
}

static void kvd_block_extras_pack(kvd_cbor_enc_t *enc,
                                  const kvd_block_extras_t *extras)
{
    uint64_t count;
    int has_salt;

    if (extras == NULL) {
        kvd_cbor_pack_null(enc);
        return;
    }
    /* vLLM skips a falsy salt ("" or None) but keeps any LoRA name. */
    has_salt = extras->cache_salt != NULL && extras->cache_salt[0] != '\0';
    count = (uint64_t)(extras->lora_name != NULL) + (uint64_t)extras->num_mm +
            (uint64_t)has_salt + (uint64_t)(extras->prompt_embeds != NULL);
    if (count == 0) {
        kvd_cbor_pack_null(enc);
        return;
    }

    kvd_cbor_pack_array(enc, count);
    if (extras->lora_name != NULL) {
        kvd_cbor_pack_text(enc, extras->lora_name, strlen(extras->lora_name));
    }
    for (size_t i = 0; i < extras->num_mm; i++) {
        const kvd_mm_extra_t *mm = &extras->mm[i];
        kvd_cbor_pack_array(enc, 2);
        kvd_cbor_pack_text(enc, mm->identifier, strlen(mm->identifier));
        kvd_cbor_pack_int(enc, mm->offset);
    }
    if (has_salt) {
        kvd_cbor_pack_text(enc, extras->cache_salt, strlen(extras->cache_salt));
    }
    if (extras->prompt_embeds != NULL) {
        kvd_cbor_pack_bytes(enc, extras->prompt_embeds, KVD_SHA256_BYTES);
    }
}

/* Encodes one block into `enc` (reset first) and hashes it into `*out`.
 * Arguments are already checked. `out` may alias `parent`: the parent is
 * copied into the encoding before `out` is written. */
static kvd_status_t
kvd_block_hash_encode(kvd_cbor_enc_t *enc, const kvd_block_hash_t *parent,
                      const uint32_t *tokens, size_t num_tokens,
                      const kvd_block_extras_t *extras, kvd_block_hash_t *out)
{
    const uint8_t *data;
    size_t len;
    kvd_status_t status;

    kvd_cbor_enc_reset(enc);
    kvd_cbor_pack_array(enc, 3);
    kvd_cbor_pack_bytes(enc, parent->bytes, KVD_SHA256_BYTES);
    kvd_cbor_pack_uint32_array(enc, tokens, num_tokens);
    kvd_block_extras_pack(enc, extras);

    status = kvd_cbor_enc_get(enc, &data, &len);
    if (status != KVD_OK) {
        KVD_LOG_ERROR("block hash: encoding %zu tokens failed: %s", num_tokens,
                      kvd_status_str(status));
        return status;
    }
    return kvd_sha256(data, len, out->bytes);
}

KVD_API kvd_status_t kvd_block_hash_seed(const char *seed,
                                         kvd_block_hash_t *root_out)
{
    uint8_t storage[KVD_BLOCK_HASH_STACK_BYTES];
    kvd_cbor_enc_t enc;
    const uint8_t *data;
    size_t len;
    kvd_block_hash_t root;
    kvd_status_t status;

    if (seed == NULL || root_out == NULL) {
        KVD_LOG_DEBUG("kvd_block_hash_seed: NULL %s",
                      seed == NULL ? "seed" : "root_out");
        return KVD_ERR_INVALID;
    }

    kvd_cbor_enc_init(&enc, storage, sizeof(storage), KVD_CBOR_ENC_GROW);
    kvd_cbor_pack_text(&enc, seed, strlen(seed));
    status = kvd_cbor_enc_get(&enc, &data, &len);
    if (status != KVD_OK) {
        KVD_LOG_ERROR("block hash seed: encoding failed: %s",
                      kvd_status_str(status));
        goto err_cleanup;
    }
    status = kvd_sha256(data, len, root.bytes);
    if (status != KVD_OK) {
        goto err_cleanup;
    }
    *root_out = root;

err_cleanup:
    kvd_cbor_enc_cleanup(&enc);
    return status;
}

KVD_API kvd_status_t kvd_block_hash(const kvd_block_hash_t *parent,
                                    const uint32_t *tokens, size_t num_tokens,
                                    const kvd_block_extras_t *extras,
                                    kvd_block_hash_t *hash_out)
{
    uint8_t storage[KVD_BLOCK_HASH_STACK_BYTES];
    kvd_cbor_enc_t enc;
    kvd_block_hash_t hash;
    kvd_status_t status;

    if (parent == NULL || hash_out == NULL ||
        (tokens == NULL && num_tokens != 0)) {
        KVD_LOG_DEBUG("kvd_block_hash: NULL argument (parent=%p tokens=%p "
                      "num_tokens=%zu out=%p)",
                      (const void *)parent, (const void *)tokens, num_tokens,
                      (void *)hash_out);
        return KVD_ERR_INVALID;
    }
    status = kvd_block_extras_check(extras);
    if (status != KVD_OK) {
        return status;
    }

    kvd_cbor_enc_init(&enc, storage, sizeof(storage), KVD_CBOR_ENC_GROW);
    status =
        kvd_block_hash_encode(&enc, parent, tokens, num_tokens, extras, &hash);
    if (status != KVD_OK) {
        goto err_cleanup;
    }
    *hash_out = hash;

err_cleanup:
    kvd_cbor_enc_cleanup(&enc);
    return status;
}

KVD_API kvd_status_t kvd_block_hash_chain(
    const kvd_block_hash_t *root, const uint32_t *tokens, size_t num_tokens,
    size_t block_size, const kvd_block_extras_t *first_extras,
    const kvd_block_extras_t *extras, kvd_block_hash_t *hashes_out,
    size_t max_hashes, size_t *num_hashes_out)
{
    uint8_t storage[KVD_BLOCK_HASH_STACK_BYTES];
    kvd_cbor_enc_t enc;
    const kvd_block_hash_t *parent;
    size_t num_blocks;
    kvd_status_t status;

    if (root == NULL || num_hashes_out == NULL || block_size == 0 ||
        (tokens == NULL && num_tokens != 0) ||
        (hashes_out == NULL && max_hashes != 0)) {
        KVD_LOG_DEBUG("kvd_block_hash_chain: invalid argument (root=%p "
                      "tokens=%p num_tokens=%zu block_size=%zu hashes_out=%p "
                      "max_hashes=%zu num_hashes_out=%p)",
                      (const void *)root, (const void *)tokens, num_tokens,
                      block_size, (void *)hashes_out, max_hashes,
                      (void *)num_hashes_out);
        return KVD_ERR_INVALID;
    }
    status = kvd_block_extras_check(first_extras);
    if (status == KVD_OK) {
        status = kvd_block_extras_check(extras);
    }
    if (status != KVD_OK) {
        return status;
    }
    num_blocks = num_tokens / block_size;
    if (num_blocks > max_hashes) {
        KVD_LOG_DEBUG("kvd_block_hash_chain: %zu blocks, room for %zu",
                      num_blocks, max_hashes);
        return KVD_ERR_RANGE;
    }

    kvd_cbor_enc_init(&enc, storage, sizeof(storage), KVD_CBOR_ENC_GROW);
    parent = root;
    for (size_t i = 0; i < num_blocks; i++) {
        status = kvd_block_hash_encode(
            &enc, parent, tokens + i * block_size, block_size,
            i == 0 ? first_extras : extras, &hashes_out[i]);
        if (status != KVD_OK) {
            goto err_cleanup;
        }
        parent = &hashes_out[i];
    }
    *num_hashes_out = num_blocks;

err_cleanup:
    kvd_cbor_enc_cleanup(&enc);
    return status;
}
