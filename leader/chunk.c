/*
 * Non-prefix reuse (docs/chunk-reuse.md): content keys and the chunk match.
 *
 * The prefix chain names a block by everything before it, so a block whose
 * tokens come back behind another prefix (the same documents in another
 * order, behind another question) is a miss. With chunk reuse on, every
 * full block of a request also gets a content key, the SHA-256 of its own
 * tokens (and of the overlap_k tokens before it), and the workers store a
 * second copy of each block they save under that key, recording in the
 * object's header the position it was computed at. kvd_leader_match_chunks
 * then looks up, after the prefix match, each remaining block's content
 * key; the hits are loaded with the prefix and rotated by the workers to
 * their new positions, and the seam repair says which tokens the engine
 * computes again.
 *
 * Why copies rather than an alias index in the store: a copy works in every
 * store mode (embedded, daemon, cluster, the NVMe tier after a restart)
 * through the existing calls, and content keys deduplicate: in the
 * workloads chunk reuse is for, the same documents in many orders, there
 * are far fewer distinct contents than distinct prefixes.
 *
 * What a request that loaded by content saves: its KV from the first
 * content block on is not what its prefix computes (the reused blocks were
 * computed behind another context, and every later token attended to
 * them), so from there it saves nothing under prefix keys: a prefix match
 * promises exact KV. The blocks it computes itself are stored under their
 * content keys, which promise only "these tokens".
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/endian_int.h"
#include "common/grow_int.h"
#include "common/log_int.h"
#include "leader/leader_int.h"

#define CHUNK_TAG "kvdepot-content-v1"
#define CHUNK_OVERLAP_MAX 4096u

KVD_API kvd_status_t kvd_leader_set_chunk_reuse(
    kvd_leader_t *leader, const kvd_leader_chunk_config_t *cfg)
{
    if (leader == NULL || cfg == NULL || cfg->repair > KVD_REPAIR_CACHEBLEND ||
        cfg->overlap_k > CHUNK_OVERLAP_MAX ||
        (cfg->repair == KVD_REPAIR_SELECTIVE && cfg->boundary_window == 0) ||
        (cfg->repair == KVD_REPAIR_CACHEBLEND &&
         !(cfg->recompute_ratio > 0.0 && cfg->recompute_ratio <= 1.0))) {
        return KVD_ERR_INVALID;
    }
    if (cfg->enabled && leader->cfg.num_shard_ns > 0) {
        return KVD_ERR_UNSUPPORTED;
    }
    leader->chunk = *cfg;
    return KVD_OK;
}

/* True when an input of the request's multimodal list overlaps tokens
 * [start, end). */
static bool chunk_mm_overlaps(const lreq_t *r, uint64_t start, uint64_t end)
{
    for (size_t i = 0; i < r->num_mm; i++) {
        uint64_t a = r->mm[i].offset, b = a + r->mm[i].length;
        if (a < end && start < b) {
            return true;
        }
    }
    return false;
}

/* The content key of block `blk` (its tokens are known): SHA-256 over the
 * tag, block_size, overlap_k, LoRA name and salt (each length-prefixed) and
 * the tokens [blk * bs - overlap, (blk + 1) * bs) as little-endian u32. */
static kvd_status_t chunk_key(const kvd_leader_t *ld, const lreq_t *r,
                              size_t blk, kvd_block_hash_t *out)
{
    size_t bs = ld->cfg.block_size, start = blk * bs;
    size_t over = ld->chunk.overlap_k < start ? ld->chunk.overlap_k : start;
    size_t lora = r->lora != NULL ? strlen(r->lora) : 0;
    size_t salt = r->salt != NULL ? strlen(r->salt) : 0;
    size_t n = sizeof CHUNK_TAG + 16 + lora + salt + 4 * (over + bs);
    uint8_t *buf = malloc(n);
    if (buf == NULL) {
        return KVD_ERR_NOMEM;
    }
    uint8_t *p = buf;
    memcpy(p, CHUNK_TAG, sizeof CHUNK_TAG);
    p += sizeof CHUNK_TAG;
    kvd_put_le32(p, (uint32_t)bs);
    kvd_put_le32(p + 4, ld->chunk.overlap_k);
    kvd_put_le32(p + 8, (uint32_t)lora);
    p += 12;
    if (lora > 0) {
        memcpy(p, r->lora, lora);
    }
    p += lora;
    kvd_put_le32(p, (uint32_t)salt);
    p += 4;
    if (salt > 0) {
        memcpy(p, r->salt, salt);
    }
    p += salt;
    for (size_t t = start - over; t < start + bs; t++) {
        kvd_put_le32(p, r->tokens[t]);
        p += 4;
    }
    kvd_status_t s = kvd_sha256(buf, n, out->bytes);
    free(buf);
    return s;
}

kvd_status_t kvd_lreq_extend_content(kvd_leader_t *ld, lreq_t *r)
{
    if (!r->chunk_on || r->hashes_mode || r->has_embeds) {
        return KVD_OK;
    }
    size_t bs = ld->cfg.block_size, full = r->num_tokens / bs;
    if (full <= r->num_content) {
        return KVD_OK;
    }
    if (!kvd_lreq_grow(r, (void **)&r->content, &r->cap_content, full, 16,
                       sizeof *r->content) ||
        !kvd_lreq_grow(r, (void **)&r->has_content, &r->cap_has_content, full,
                       16, sizeof *r->has_content)) {
        return KVD_ERR_NOMEM;
    }
    for (size_t b = r->num_content; b < full; b++) {
        uint64_t start = (uint64_t)b * bs;
        uint64_t over =
            ld->chunk.overlap_k < start ? ld->chunk.overlap_k : start;
        r->has_content[b] = chunk_mm_overlaps(r, start - over, start + bs)
                                ? CHUNK_NO_KEY
                                : CHUNK_KEYED;
        if (r->has_content[b]) {
            kvd_status_t s = chunk_key(ld, r, b, &r->content[b]);
            if (s != KVD_OK) {
                return s;
            }
        }
        r->num_content = b + 1;
    }
    return KVD_OK;
}

void kvd_chunk_release(kvd_leader_t *ld, lreq_t *r)
{
    for (size_t b = 0; b < r->chunk_cap; b++) {
        if (r->chunk_leases[b].tier != KVD_STORE_TIER_NONE) {
            (void)kvd_store_release(ld->store, &r->chunk_leases[b], 1);
            ld->st.leases--;
        }
    }
    free(r->chunk_leases);
    r->chunk_leases = NULL;
    r->chunk_cap = 0;
    r->chunk_hits = 0;
    r->chunk_async = false;
    r->chunk_answered = false;
}

/* The source of block `b` after the prefix answer and the content hits. */
static kvd_chunk_source_t chunk_source(const lreq_t *r, size_t b)
{
    if (b < r->first_block) {
        return KVD_CHUNK_HELD;
    }
    if (b < r->first_block + r->num_leases) {
        return KVD_CHUNK_PREFIX;
    }
    if (b < r->chunk_cap && r->chunk_leases[b].tier != KVD_STORE_TIER_NONE) {
        return KVD_CHUNK_CONTENT;
    }
    return KVD_CHUNK_COMPUTE;
}

/* Writes the answer: sources, the seam repair, the counts. KVD_ERR_RANGE
 * when the caller's arrays are too small (nothing else changes). */
static kvd_status_t chunk_answer(const kvd_leader_t *ld, const lreq_t *r,
                                 uint8_t *source_out, size_t max_blocks,
                                 uint32_t *recompute_out, size_t max_recompute,
                                 kvd_leader_chunk_match_t *out)
{
    size_t bs = ld->cfg.block_size, full = r->prompt_tokens / bs;
    if (full > max_blocks) {
        return KVD_ERR_RANGE;
    }
    kvd_leader_chunk_match_t m = {0};
    m.num_blocks = full;
    size_t run = 0; /* CONTENT blocks in the current run */
    for (size_t b = 0; b < full; b++) {
        kvd_chunk_source_t src = chunk_source(r, b);
        source_out[b] = (uint8_t)src;
        if (src == KVD_CHUNK_HELD || src == KVD_CHUNK_PREFIX) {
            m.prefix_tokens += bs;
        }
        run = src == KVD_CHUNK_CONTENT ? run + 1 : 0;
        if (src != KVD_CHUNK_CONTENT) {
            continue;
        }
        m.reused_tokens += bs;
        if (ld->chunk.repair != KVD_REPAIR_SELECTIVE) {
            continue;
        }
        /* The run's first boundary_window tokens, wherever they fall. */
        uint64_t done = (uint64_t)(run - 1) * bs;
        for (size_t t = 0; t < bs && done + t < ld->chunk.boundary_window;
             t++) {
            if (m.num_recompute >= max_recompute) {
                return KVD_ERR_RANGE;
            }
            recompute_out[m.num_recompute++] = (uint32_t)(b * bs + t);
        }
    }
    if (ld->chunk.repair == KVD_REPAIR_CACHEBLEND) {
        m.recompute_budget =
            (uint64_t)ceil(ld->chunk.recompute_ratio * (double)m.reused_tokens);
    }
    m.async = r->async || r->chunk_async;
    *out = m;
    return KVD_OK;
}

/* Keys one store lookup asks for: a lookup stops at the first key the
 * store does not hold, so a batch costs one call per miss, not per block
 * (one round trip each with a daemon). */
#define CHUNK_BATCH 64u

/* The batch from candidate `at` of `blocks` (block indexes with a content
 * key): up to CHUNK_BATCH of them, stopping before a key already in it (a
 * store batch names each key once; a document twice in one prompt). */
static size_t chunk_batch(const lreq_t *r, const size_t *blocks, size_t at,
                          size_t n, kvd_block_hash_t *keys)
{
    size_t k = 0;
    for (; at + k < n && k < CHUNK_BATCH; k++) {
        const kvd_block_hash_t *h = &r->content[blocks[at + k]];
        for (size_t j = 0; j < k; j++) {
            if (memcmp(&keys[j], h, sizeof *h) == 0) {
                return k;
            }
        }
        keys[k] = *h;
    }
    return k;
}

/* Looks the content keys of `blocks` up; each hit is leased in
 * chunk_leases[its block]. A lookup that fails ends the search (what was
 * found stays): the engine computes the rest. */
static void chunk_lookup(kvd_leader_t *ld, lreq_t *r, const size_t *blocks,
                         size_t n)
{
    kvd_block_hash_t keys[CHUNK_BATCH];
    kvd_store_lease_t leases[CHUNK_BATCH];
    for (size_t at = 0; at < n;) {
        size_t k = chunk_batch(r, blocks, at, n, keys), got = 0;
        kvd_status_t s = kvd_store_lookup_from(ld->store, &ld->cfg.ns, keys, k,
                                               NULL, leases, &got);
        if (s != KVD_OK) {
            if (s != KVD_AGAIN) {
                ld->st.lookup_errors++;
            }
            return;
        }
        for (size_t i = 0; i < got; i++) {
            r->chunk_leases[blocks[at + i]] = leases[i];
            r->chunk_async = r->chunk_async ||
                             leases[i].tier != KVD_STORE_TIER_HOST ||
                             ld->cfg.async_host_loads;
        }
        r->chunk_hits += got;
        ld->st.leases += got;
        ld->st.content_blocks += got;
        /* Past the hits, and past the miss that stopped the lookup. */
        size_t asked = got < k ? got + 1 : k;
        ld->st.content_lookups += asked;
        at += asked;
    }
}

KVD_API kvd_status_t kvd_leader_match_chunks(
    kvd_leader_t *leader, const char *request_id, uint8_t *source_out,
    size_t max_blocks, uint32_t *recompute_out, size_t max_recompute,
    kvd_leader_chunk_match_t *out)
{
    if (leader == NULL || !kvd_leader_id_ok(request_id) || out == NULL ||
        (source_out == NULL && max_blocks > 0) ||
        (recompute_out == NULL && max_recompute > 0)) {
        return KVD_ERR_INVALID;
    }
    kvd_leader_t *ld = leader;
    lreq_t *r = kvd_lreq_find(ld, request_id);
    if (r == NULL) {
        return KVD_ERR_NOT_FOUND;
    }
    if (!r->chunk_on || !r->looked_up || r->allocated || r->finished) {
        return KVD_ERR_STATE;
    }
    if (r->chunk_answered) {
        return chunk_answer(ld, r, source_out, max_blocks, recompute_out,
                            max_recompute, out);
    }
    size_t bs = ld->cfg.block_size;
    if (r->prompt_tokens / bs > max_blocks) {
        return KVD_ERR_RANGE;
    }
    size_t cap = r->prompt_tokens > 0 ? (r->prompt_tokens - 1) / bs : 0;
    if (cap > r->num_content) {
        cap = r->num_content;
    }
    size_t from = r->first_block + r->num_leases;
    size_t sink = (ld->chunk.sink_tokens + bs - 1) / bs;
    if (from < sink) {
        from = sink;
    }
    r->chunk_leases = calloc(cap + 1, sizeof *r->chunk_leases);
    if (r->chunk_leases == NULL) {
        return KVD_ERR_NOMEM;
    }
    r->chunk_cap = cap;
    size_t *blocks = malloc((cap + 1) * sizeof *blocks), n = 0;
    if (blocks == NULL) {
        kvd_chunk_release(ld, r);
        return KVD_ERR_NOMEM;
    }
    for (size_t b = from; b < cap; b++) {
        if (r->has_content[b]) {
            blocks[n++] = b;
        }
    }
    chunk_lookup(ld, r, blocks, n);
    free(blocks);
    kvd_status_t s = chunk_answer(ld, r, source_out, max_blocks, recompute_out,
                                  max_recompute, out);
    if (s != KVD_OK) {
        kvd_chunk_release(ld, r);
        return s;
    }
    r->chunk_answered = true;
    return KVD_OK;
}

size_t kvd_chunk_blocks_needed(const lreq_t *r)
{
    size_t need = 0;
    for (size_t b = 0; b < r->chunk_cap; b++) {
        if (r->chunk_leases[b].tier != KVD_STORE_TIER_NONE) {
            need = b + 1;
        }
    }
    return need;
}

void kvd_chunk_after_alloc(kvd_leader_t *ld, lreq_t *r)
{
    if (r->chunk_hits == 0) {
        kvd_chunk_release(ld, r);
        return;
    }
    for (size_t b = 0; b < r->chunk_cap; b++) {
        if (r->chunk_leases[b].tier != KVD_STORE_TIER_NONE) {
            r->has_content[b] = CHUNK_LOADED;
            if (r->chunk_from == SIZE_MAX) {
                /* From here on this request's KV is not its prefix's. */
                r->chunk_from = b;
            }
        }
    }
    r->async = r->async || r->chunk_async;
}
