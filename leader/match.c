/*
 * The leader's answers to the engine's scheduler before a step: how many
 * tokens of a request the store can provide (one lookup per answer, with
 * leases on what it will load, and "not yet" while another request loads
 * the same blocks), the engine's block table after allocation, and each
 * scheduled step's new blocks and tokens, which decide the saves. The
 * state it writes is drained by the plan (plan.c).
 *
 * Shards: with tensor parallelism every rank needs its own shard of each
 * block it is promised (a rank that misses one fails the user's request
 * under vLLM's default kv_load_failure_policy), so a lookup asks the
 * plan's namespace and then every shard namespace, each up to the prefix
 * found so far, and leases the common prefix in all of them.
 */
#include <stdlib.h>
#include <string.h>

#include "common/grow_int.h"
#include "common/log_int.h"
#include "common/time_int.h"
#include "leader/leader_int.h"

/* ---- matching ----------------------------------------------------------- */

/* Records a lookup that promises nothing: blocks the engine holds itself
 * were saved when it computed them. */
static kvd_status_t req_answer_miss(lreq_t *r, size_t first,
                                    uint64_t *matched_out, bool *async_out)
{
    r->looked_up = true;
    r->first_block = first;
    r->saved_upto = r->save_from = first;
    r->matched_tokens = 0; /* an earlier answer may have promised some */
    r->async = false;
    *matched_out = 0;
    *async_out = false;
    return KVD_OK;
}

/* The request of this id, created on its first call. KVD_ERR_EXISTS for
 * the id of a finished request still tracked; kvd_lreq_create's errors. */
static kvd_status_t req_find_or_create(kvd_leader_t *ld,
                                       const kvd_leader_request_t *req,
                                       lreq_t **out)
{
    lreq_t *r = kvd_lreq_find(ld, req->request_id);
    if (r == NULL) {
        kvd_status_t s = kvd_lreq_create(ld, req, &r);
        if (s != KVD_OK) {
            return s;
        }
    } else if (r->finished) {
        /* The id belongs to a finished request whose saves are still in
         * flight: a new request may not reuse it yet. */
        return KVD_ERR_EXISTS;
    }
    *out = r;
    return KVD_OK;
}

/* Gives back leases [from, to) of rows [0, rows) of a lookup's array. */
static void rows_release(kvd_leader_t *ld, kvd_store_lease_t *leases,
                         size_t rows, size_t stride, size_t from, size_t to)
{
    for (size_t row = 0; to > from && row < rows; row++) {
        (void)kvd_store_release(ld->store, leases + row * stride + from,
                                to - from);
    }
}

/*
 * Looks hashes [0, cap) up under cfg.ns (row 0 of `leases`, rows of `cap`
 * leases) and then under each shard namespace (row 1 + s), each shard's
 * cap shrunk to what every namespace before it holds: a block counts only
 * when all shards hold it. On KVD_OK every row holds leases [0, *m_out)
 * (whatever a row leased beyond the final prefix is given back). On any
 * other status nothing stays leased: KVD_AGAIN (some namespace was not
 * ready) or the first lookup's error, logged here.
 */
static kvd_status_t lookup_rows(kvd_leader_t *ld, lreq_t *r, size_t cap,
                                size_t first, kvd_store_lease_t *leases,
                                size_t *m_out)
{
    size_t rows = 1 + ld->cfg.num_shard_ns, m = cap, row = 0;
    for (; row < rows && (row == 0 || m > first); row++) {
        const kvd_namespace_t *ns =
            row == 0 ? &ld->cfg.ns : &ld->cfg.shard_ns[row - 1];
        size_t got = 0;
        ld->st.lookups++;
        kvd_status_t s = kvd_store_lookup_from(
            ld->store, ns, r->hashes, m, r->source, leases + row * cap, &got);
        if (s != KVD_OK) {
            rows_release(ld, leases, row, cap, 0, m);
            if (s != KVD_AGAIN) {
                KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 5000,
                                    "leader: lookup for request %s failed "
                                    "(%s, namespace %zu of %zu): computed "
                                    "instead",
                                    r->id, kvd_status_str(s), row + 1, rows);
            }
            return s;
        }
        if (got < m) {
            /* This shard stops earlier: the blocks past it are not
             * stored, whatever the namespaces before it hold. */
            rows_release(ld, leases, row, cap, got, m);
            m = got;
        }
    }
    if (m <= first) {
        /* Nothing beyond what the engine has (the shards after `row` were
         * not asked): what the rows asked hold goes back now. */
        rows_release(ld, leases, row, cap, 0, m);
        m = 0;
    }
    *m_out = m;
    return KVD_OK;
}

/* Records a lookup that matched m leading blocks under every namespace,
 * with a lease on each in `rows` rows of `stride` leases (taken over:
 * kept or freed here). */
static void req_answer_leases(kvd_leader_t *ld, lreq_t *r, size_t first,
                              kvd_store_lease_t *leases, size_t rows,
                              size_t stride, size_t m,
                              uint64_t num_computed_tokens)
{
    size_t bs = ld->cfg.block_size;
    /* Blocks the engine has already are not loaded: give them back. */
    size_t keep_from = first < m ? first : m;
    rows_release(ld, leases, rows, stride, 0, keep_from);
    r->looked_up = true;
    r->first_block = first;
    r->saved_upto = r->save_from = m > first ? m : first;
    r->num_leases = m - keep_from;
    r->async = false;
    if (r->num_leases > 0) {
        for (size_t row = 0; row < rows; row++) {
            kvd_store_lease_t *l = leases + row * stride;
            memmove(l, l + keep_from, r->num_leases * sizeof *l);
            for (size_t i = 0; i < r->num_leases; i++) {
                r->async = r->async || l[i].tier != KVD_STORE_TIER_HOST ||
                           ld->cfg.async_host_loads;
            }
        }
        r->leases = leases;
        r->lease_rows = rows;
        r->lease_stride = stride;
    } else {
        free(leases);
    }
    r->matched_tokens = (uint64_t)r->num_leases * bs;
    if (r->matched_tokens > 0) {
        /* Whole blocks from a block boundary: the first leased block may
         * start below num_computed_tokens only when it is not a boundary,
         * which the engine never does for blocks it caches. */
        r->matched_tokens =
            (uint64_t)(first + r->num_leases) * bs - num_computed_tokens;
    }
    ld->st.leases += (uint64_t)r->num_leases * rows;
    ld->st.matched_blocks += r->num_leases;
}

KVD_API kvd_status_t kvd_leader_get_num_new_matched_tokens(
    kvd_leader_t *leader, const kvd_leader_request_t *req,
    uint64_t num_computed_tokens, uint64_t *matched_out, bool *async_out)
{
    if (leader == NULL || req == NULL || matched_out == NULL ||
        async_out == NULL || !kvd_leader_id_ok(req->request_id) ||
        (req->tokens == NULL && req->num_tokens > 0 && req->hashes == NULL) ||
        (req->hashes == NULL && req->num_hashes > 0) ||
        !kvd_leader_mm_ok(req)) {
        return KVD_ERR_INVALID;
    }
    kvd_leader_t *ld = leader;
    lreq_t *r = NULL;
    kvd_status_t s = req_find_or_create(ld, req, &r);
    if (s != KVD_OK) {
        return s;
    }
    if (r->looked_up && num_computed_tokens != r->answered_computed) {
        if (r->allocated) {
            return KVD_ERR_STATE; /* the engine acted on the answer */
        }
        /* The engine's own prefix changed since the answer (grown from
         * another request, or evicted): the promised blocks are not the
         * same ones, so look up again. */
        kvd_lreq_release_leases(ld, r);
        kvd_chunk_release(ld, r);
        r->looked_up = false;
        r->matched_tokens = 0;
        r->async = false;
    }
    if (r->looked_up) {
        *matched_out = r->matched_tokens;
        *async_out = r->async;
        return KVD_OK;
    }
    r->answered_computed = num_computed_tokens;
    size_t bs = ld->cfg.block_size;
    /* Never the block holding the last prompt token: the engine must
     * compute at least one token to sample from. */
    size_t cap = r->prompt_tokens > 0 ? (r->prompt_tokens - 1) / bs : 0;
    if (cap > r->num_hashes) {
        cap = r->num_hashes;
    }
    size_t first = (size_t)(num_computed_tokens / bs);
    if (first >= cap) {
        return req_answer_miss(r, first, matched_out, async_out);
    }
    /* "Not yet" is bounded: past lookup_timeout_ms of waiting, the request
     * is served like an engine without retries (TensorRT-LLM). */
    uint64_t now = kvd_time_now_ns();
    bool may_wait = !ld->cfg.no_retry &&
                    (r->not_yet_since_ns == 0 ||
                     now - r->not_yet_since_ns <
                         (uint64_t)ld->cfg.lookup_timeout_ms * 1000000u);
    if (!may_wait && !ld->cfg.no_retry) {
        ld->st.timeouts++;
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                            "leader: request %s waited %u ms for its prefix; "
                            "matching what is ready",
                            r->id, ld->cfg.lookup_timeout_ms);
    }
    for (size_t i = first; i < cap; i++) {
        if (kvd_leader_loading_has(ld, &r->hashes[i])) {
            if (may_wait) {
                if (r->not_yet_since_ns == 0) {
                    r->not_yet_since_ns = now;
                }
                ld->st.not_yet++;
                return KVD_AGAIN;
            }
            cap = i; /* load only what nobody is loading */
            break;
        }
    }
    if (first >= cap) {
        return req_answer_miss(r, first, matched_out, async_out);
    }
    /* One row of `cap` leases per namespace (leader_int.h). */
    kvd_store_lease_t *leases =
        calloc((1 + (size_t)ld->cfg.num_shard_ns) * cap, sizeof *leases);
    if (leases == NULL) {
        return KVD_ERR_NOMEM;
    }
    size_t m = 0;
    s = lookup_rows(ld, r, cap, first, leases, &m);
    if (s == KVD_AGAIN && !may_wait) {
        /* Not ready and the engine cannot wait: a miss, asked again only
         * if the request comes back (preemption). */
        free(leases);
        return req_answer_miss(r, first, matched_out, async_out);
    }
    if (s != KVD_OK && s != KVD_AGAIN) {
        /* The cache failed (a dead daemon, a deadline): the engine
         * computes the prefix; it never waits on or fails for the cache. */
        free(leases); /* lookup_rows logged it */
        ld->st.lookup_errors++;
        return req_answer_miss(r, first, matched_out, async_out);
    }
    if (s != KVD_OK) {
        free(leases);
        ld->st.not_yet++;
        if (r->not_yet_since_ns == 0) {
            r->not_yet_since_ns = now;
        }
        return s;
    }
    /* The gate keeps what is predicted to load faster than it computes. */
    size_t keep = kvd_gate_cut(ld, leases, first, m);
    if (keep < m) {
        rows_release(ld, leases, 1 + ld->cfg.num_shard_ns, cap, keep, m);
        m = keep;
    }
    req_answer_leases(ld, r, first, leases, 1 + ld->cfg.num_shard_ns, cap, m,
                      num_computed_tokens);
    *matched_out = r->matched_tokens;
    *async_out = r->async;
    return KVD_OK;
}

KVD_API kvd_status_t kvd_leader_update_state_after_alloc(
    kvd_leader_t *leader, const char *request_id, const uint32_t *block_ids,
    size_t num_block_ids, uint64_t num_external_tokens)
{
    if (leader == NULL || !kvd_leader_id_ok(request_id) ||
        (block_ids == NULL && num_block_ids > 0)) {
        return KVD_ERR_INVALID;
    }
    kvd_leader_t *ld = leader;
    lreq_t *r = kvd_lreq_find(ld, request_id);
    if (r == NULL) {
        return KVD_ERR_NOT_FOUND;
    }
    if (r->finished) {
        return KVD_ERR_STATE; /* kept only until its saves finish */
    }
    if (num_external_tokens > 0 && !r->looked_up) {
        return KVD_ERR_STATE; /* no answer stands: nothing was promised */
    }
    if (num_external_tokens > r->matched_tokens) {
        return KVD_ERR_RANGE;
    }
    size_t bs = ld->cfg.block_size;
    size_t blocks = (size_t)((num_external_tokens + bs - 1) / bs);
    if (blocks > 0 && r->first_block + blocks > num_block_ids) {
        return KVD_ERR_RANGE;
    }
    if (!r->allocated && r->chunk_answered &&
        kvd_chunk_blocks_needed(r) > num_block_ids) {
        return KVD_ERR_RANGE;
    }
    if (!kvd_lreq_grow(r, (void **)&r->block_ids, &r->cap_block_ids,
                       num_block_ids, 16, sizeof *r->block_ids)) {
        return KVD_ERR_NOMEM;
    }
    if (num_block_ids > 0) {
        memcpy(r->block_ids, block_ids, num_block_ids * sizeof *block_ids);
    }
    r->num_block_ids = num_block_ids;
    if (r->allocated) {
        /* A second call (vLLM, when an asynchronous load has completed):
         * the block table only. The loads were planned by the first. */
        return KVD_OK;
    }
    r->allocated = true;
    if (blocks < r->num_leases) {
        /* The engine computes part of the prefix: the chunk answer was
         * made for blocks after the whole prefix, so it no longer holds. */
        kvd_chunk_release(ld, r);
    }
    /* Leases beyond what the engine takes go back now, in every shard. */
    kvd_lreq_release_tail(ld, r, blocks);
    if (blocks == 0) {
        kvd_lreq_release_leases(ld, r);
    }
    r->load_blocks = blocks;
    r->load_tokens = num_external_tokens;
    kvd_chunk_after_alloc(ld, r);
    r->plan_loads = blocks > 0 || r->chunk_hits > 0;
    if (r->async && blocks > 0) {
        /* From now on another request matching these blocks waits for this
         * load: in vLLM it is matched in this same schedule() pass, before
         * any plan exists, and would load them a second time. */
        bool ok = true;
        for (size_t b = 0; b < blocks; b++) {
            ok = kvd_leader_loading_add(ld, &r->hashes[r->first_block + b]) &&
                 ok;
        }
        if (!ok) {
            KVD_LOG_WARN("leader: no memory to track a load; a shared "
                         "prefix may be loaded twice");
        }
        r->loading_marked = true;
    }
    if (r->plan_loads) {
        kvd_lreq_touch(ld, r);
    }
    return KVD_OK;
}

/* ---- scheduling and saves ----------------------------------------------- */

KVD_API kvd_status_t kvd_leader_request_scheduled(
    kvd_leader_t *leader, const char *request_id, const uint32_t *new_block_ids,
    size_t num_new_blocks, const uint32_t *new_tokens, size_t num_new_tokens,
    const kvd_block_hash_t *new_hashes, size_t num_new_hashes,
    uint64_t num_computed_tokens)
{
    if (leader == NULL || !kvd_leader_id_ok(request_id) ||
        (new_block_ids == NULL && num_new_blocks > 0) ||
        (new_tokens == NULL && num_new_tokens > 0) ||
        (new_hashes == NULL && num_new_hashes > 0)) {
        return KVD_ERR_INVALID;
    }
    kvd_leader_t *ld = leader;
    lreq_t *r = kvd_lreq_find(ld, request_id);
    if (r == NULL) {
        return KVD_ERR_NOT_FOUND;
    }
    if (r->finished) {
        return KVD_ERR_STATE;
    }
    size_t bs = ld->cfg.block_size;
    if (!kvd_lreq_grow(r, (void **)&r->block_ids, &r->cap_block_ids,
                       r->num_block_ids + num_new_blocks, 16,
                       sizeof *r->block_ids) ||
        (num_new_tokens > 0 &&
         !kvd_lreq_grow(r, (void **)&r->tokens, &r->cap_tokens,
                        r->num_tokens + num_new_tokens, 16 * bs,
                        sizeof *r->tokens)) ||
        (num_new_hashes > 0 &&
         !kvd_lreq_grow(r, (void **)&r->hashes, &r->cap_hashes,
                        r->num_hashes + num_new_hashes, 16,
                        sizeof *r->hashes))) {
        return KVD_ERR_NOMEM;
    }
    if (num_new_blocks > 0) {
        memcpy(r->block_ids + r->num_block_ids, new_block_ids,
               num_new_blocks * sizeof *new_block_ids);
        r->num_block_ids += num_new_blocks;
    }
    if (num_new_tokens > 0 && !r->hashes_mode) {
        memcpy(r->tokens + r->num_tokens, new_tokens,
               num_new_tokens * sizeof *new_tokens);
        r->num_tokens += num_new_tokens;
    }
    if (num_new_hashes > 0 && r->hashes_mode) {
        memcpy(r->hashes + r->num_hashes, new_hashes,
               num_new_hashes * sizeof *new_hashes);
        r->num_hashes += num_new_hashes;
    }
    kvd_status_t s = kvd_lreq_extend_hashes(ld, r);
    if (s != KVD_OK) {
        return s;
    }
    /* Full blocks computed by the end of this step, with a hash and an
     * engine block, and not yet stored or planned. */
    size_t done = (size_t)(num_computed_tokens / bs);
    if (done > r->num_hashes) {
        done = r->num_hashes;
    }
    if (done > r->num_block_ids) {
        done = r->num_block_ids;
    }
    if (done > r->saved_upto) {
        r->saved_upto = done;
        kvd_lreq_touch(ld, r);
    }
    return KVD_OK;
}
