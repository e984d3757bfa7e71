/*
 * The leader (include/kvdepot/leader.h): per-request state between the
 * engine's scheduler calls, and the step plan. This file holds the request
 * table, the multiset of blocks being loaded, leases, create / destroy and
 * the end of a request; match.c answers lookups and takes the engine's
 * scheduling calls, plan.c writes the step plan, report.c applies worker
 * reports.
 *
 * A request carries its block hash chain (from tokens, extended as decode
 * tokens arrive, keyed per block as vLLM keys it: LoRA name, the
 * multimodal inputs overlapping the block, cache salt on block 0; or from
 * the engine's hashes), the result of its one
 * lookup (how many leading blocks the store holds, and a lease on each
 * block it will load), its engine block table, and two markers: how many
 * leading blocks are stored or planned for saving (`saved_upto`) and which
 * loads and saves the next plan must carry. Requests live in a table keyed
 * by id; those touched since the last plan are on a list, so a plan costs
 * O(requests touched + blocks planned), never O(all requests).
 *
 * Reports: a request's saves (loads) count as finished once `num_workers`
 * reports for a step at or after the last plan that gave it saves (loads)
 * name it; a report for an earlier step is for work already superseded.
 *
 * "Not yet": blocks whose asynchronous load is planned and not finished are
 * in `loading`, a multiset of block hashes. A new request whose promised
 * blocks include one of them waits (the engine retries next step and then
 * finds the block in its own prefix cache), so a shared prefix is loaded
 * once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grow_int.h"
#include "leader/leader_int.h"

/* ---- small containers --------------------------------------------------- */

static size_t id_bucket(const char *id)
{
    return (size_t)(kvd_xxh3_64(id, strlen(id)) % LEADER_BUCKETS);
}

lreq_t *kvd_lreq_find(kvd_leader_t *ld, const char *id)
{
    for (lreq_t *r = ld->table[id_bucket(id)]; r != NULL; r = r->next) {
        if (strcmp(r->id, id) == 0) {
            return r;
        }
    }
    return NULL;
}

bool kvd_leader_id_ok(const char *id)
{
    return id != NULL && id[0] != '\0' && strlen(id) <= LEADER_ID_MAX;
}

void kvd_lreq_touch(kvd_leader_t *ld, lreq_t *r)
{
    if (!r->touched) {
        r->touched = true;
        r->next_touched = ld->touched;
        ld->touched = r;
    }
}

static lhash_t **loading_slot(kvd_leader_t *ld, const kvd_block_hash_t *h)
{
    uint64_t k;
    memcpy(&k, h->bytes, sizeof k);
    lhash_t **p = &ld->loading[k % LEADER_HASH_BUCKETS];
    while (*p != NULL && memcmp(&(*p)->hash, h, sizeof *h) != 0) {
        p = &(*p)->next;
    }
    return p;
}

bool kvd_leader_loading_has(kvd_leader_t *ld, const kvd_block_hash_t *h)
{
    return *loading_slot(ld, h) != NULL;
}

bool kvd_leader_loading_add(kvd_leader_t *ld, const kvd_block_hash_t *h)
{
    lhash_t **p = loading_slot(ld, h);
    if (*p == NULL) {
        lhash_t *e = calloc(1, sizeof *e);
        if (e == NULL) {
            return false;
        }
        e->hash = *h;
        *p = e;
    }
    (*p)->count++;
    return true;
}

static void loading_remove(kvd_leader_t *ld, const kvd_block_hash_t *h)
{
    lhash_t **p = loading_slot(ld, h);
    if (*p != NULL && --(*p)->count == 0) {
        lhash_t *e = *p;
        *p = e->next;
        free(e);
    }
}

/* ---- leases and loads --------------------------------------------------- */

void kvd_lreq_release_tail(kvd_leader_t *ld, lreq_t *r, size_t keep)
{
    if (keep >= r->num_leases) {
        return;
    }
    size_t n = r->num_leases - keep;
    for (size_t row = 0; row < r->lease_rows; row++) {
        (void)kvd_store_release(ld->store,
                                r->leases + row * r->lease_stride + keep, n);
    }
    ld->st.leases -= (uint64_t)n * r->lease_rows;
    r->num_leases = keep;
}

void kvd_lreq_release_leases(kvd_leader_t *ld, lreq_t *r)
{
    kvd_lreq_release_tail(ld, r, 0);
    free(r->leases);
    r->leases = NULL;
    r->lease_rows = r->lease_stride = 0;
}

/* Ends the request's loads (finished, failed or dropped). */
void kvd_lreq_end_loads(kvd_leader_t *ld, lreq_t *r)
{
    if (r->loading_marked) {
        for (size_t i = 0; i < r->load_blocks; i++) {
            loading_remove(ld, &r->hashes[r->first_block + i]);
        }
        r->loading_marked = false;
    }
    r->loads_inflight = false;
    r->plan_loads = false;
    r->load_reports = 0;
    kvd_lreq_release_leases(ld, r);
    kvd_chunk_release(ld, r);
}

/* Ends the request's loads and forgets its answer: the engine asks again
 * (after a preemption, or a load that failed) and gets a fresh lookup. */
void kvd_lreq_forget_answer(kvd_leader_t *ld, lreq_t *r)
{
    kvd_lreq_end_loads(ld, r);
    r->looked_up = false;
    r->allocated = false;
    r->not_yet_since_ns = 0;
    r->matched_tokens = 0;
    r->async = false;
    r->load_blocks = 0;
}

static void req_free(lreq_t *r)
{
    free(r->tokens);
    free(r->hashes);
    free(r->lora);
    free(r->salt);
    free(r->source);
    free(r->mm);
    free(r->mm_text);
    free(r->mm_keys);
    free(r->embeds);
    free(r->content);
    free(r->has_content);
    free(r->chunk_leases);
    free(r->leases);
    free(r->block_ids);
    free(r);
}

static void req_unlink(kvd_leader_t *ld, lreq_t *r)
{
    lreq_t **p = &ld->table[id_bucket(r->id)];
    while (*p != r) {
        p = &(*p)->next;
    }
    *p = r->next;
    if (r->touched) {
        lreq_t **t = &ld->touched;
        while (*t != r) {
            t = &(*t)->next_touched;
        }
        *t = r->next_touched;
    }
    ld->st.requests--;
}

/* Drops a finished request once nothing of it is in flight. */
void kvd_lreq_maybe_drop(kvd_leader_t *ld, lreq_t *r)
{
    if (r->finished && !r->saves_inflight && !r->loads_inflight) {
        req_unlink(ld, r);
        kvd_lreq_release_leases(ld, r);
        kvd_chunk_release(ld, r);
        req_free(r);
    }
}

/* ---- hashing ------------------------------------------------------------ */

bool kvd_leader_mm_ok(const kvd_leader_request_t *q)
{
    if (q->num_mm_inputs > 0 && q->mm_inputs == NULL) {
        return false;
    }
    for (size_t i = 0; i < q->num_mm_inputs; i++) {
        const kvd_leader_mm_input_t *in = &q->mm_inputs[i];
        if (in->identifier == NULL || in->offset > INT64_MAX ||
            in->length > INT64_MAX - in->offset ||
            (i > 0 && in->offset < q->mm_inputs[i - 1].offset)) {
            return false;
        }
    }
    return q->num_prompt_embeds == 0 || q->prompt_embeds != NULL;
}

/* SHA-256 of no bytes: the digest vLLM gives a block past the prompt's
 * embeddings (an empty slice). */
static const uint8_t kvd_sha256_of_nothing[KVD_SHA256_BYTES] = {
    0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4,
    0xc8, 0x99, 0x6f, 0xb9, 0x24, 0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b,
    0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55};

/*
 * The keys of the multimodal inputs overlapping tokens [start, end) into
 * r->mm_keys, and their count: (identifier, offset - start) for each, as
 * vLLM's _gen_mm_extra_hash_keys writes them. *idx is the first input to
 * consider, moved past the inputs that end inside the block (the next
 * block starts there); an input that runs on past the block ends the scan.
 */
static size_t mm_block_keys(lreq_t *r, uint64_t start, uint64_t end,
                            size_t *idx)
{
    if (r->num_mm == 0) {
        return 0;
    }
    const kvd_leader_mm_input_t *last = &r->mm[r->num_mm - 1];
    if (last->offset + last->length <= start) {
        return 0; /* past every input (late prefill, decode) */
    }
    size_t n = 0, i = *idx;
    while (i < r->num_mm && end > r->mm[i].offset) {
        const kvd_leader_mm_input_t *in = &r->mm[i];
        if (start >= in->offset + in->length) {
            i++; /* the block is past this input */
            continue;
        }
        r->mm_keys[n].identifier = in->identifier;
        r->mm_keys[n++].offset = (int64_t)in->offset - (int64_t)start;
        if (end < in->offset + in->length) {
            break; /* it goes on into the next block */
        }
        i++;
    }
    *idx = i;
    return n;
}

/* Hashes every full block of the token sequence not hashed yet. */
kvd_status_t kvd_lreq_extend_hashes(kvd_leader_t *ld, lreq_t *r)
{
    size_t bs = ld->cfg.block_size, full = r->num_tokens / bs;
    if (r->hashes_mode || full <= r->num_hashes) {
        return kvd_lreq_extend_content(ld, r);
    }
    if (!kvd_lreq_grow(r, (void **)&r->hashes, &r->cap_hashes, full, 16,
                       sizeof *r->hashes)) {
        return KVD_ERR_NOMEM;
    }
    /* vLLM's request_block_hasher scans the inputs from the first when it
     * hashes from token 0, and only the last input when it extends a chain
     * (blocks completed by generated tokens): the same here, so the keys
     * stay vLLM's even where that shortcut skips an input. */
    size_t idx = r->num_hashes == 0 || r->num_mm == 0 ? 0 : r->num_mm - 1;
    for (size_t b = r->num_hashes; b < full; b++) {
        const kvd_block_hash_t *parent =
            b == 0 ? &ld->cfg.root : &r->hashes[b - 1];
        uint64_t start = (uint64_t)b * bs;
        kvd_block_extras_t ex = {.lora_name = r->lora, .mm = r->mm_keys};
        ex.num_mm = mm_block_keys(r, start, start + bs, &idx);
        ex.cache_salt = b == 0 ? r->salt : NULL;
        if (r->has_embeds) {
            ex.prompt_embeds = b < r->num_embeds
                                   ? r->embeds + b * KVD_SHA256_BYTES
                                   : kvd_sha256_of_nothing;
        }
        kvd_status_t s =
            kvd_block_hash(parent, r->tokens + b * bs, bs, &ex, &r->hashes[b]);
        if (s != KVD_OK) {
            return s;
        }
        r->num_hashes = b + 1;
    }
    return kvd_lreq_extend_content(ld, r);
}

/* Copies the request's multimodal inputs (token mode): one array, one
 * buffer for the identifiers, and room for one block's keys. */
static bool mm_copy(lreq_t *r, const kvd_leader_request_t *q)
{
    size_t n = q->num_mm_inputs, text = 0;
    if (n == 0) {
        return true;
    }
    for (size_t i = 0; i < n; i++) {
        text += strlen(q->mm_inputs[i].identifier) + 1;
    }
    r->mm = malloc(n * sizeof *r->mm);
    r->mm_text = malloc(text);
    r->mm_keys = malloc(n * sizeof *r->mm_keys);
    if (r->mm == NULL || r->mm_text == NULL || r->mm_keys == NULL) {
        return false; /* req_free frees what was taken */
    }
    char *p = r->mm_text;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(q->mm_inputs[i].identifier) + 1;
        memcpy(p, q->mm_inputs[i].identifier, len);
        r->mm[i] = q->mm_inputs[i];
        r->mm[i].identifier = p;
        p += len;
    }
    r->num_mm = n;
    return true;
}

static char *dup_or_null(const char *s, bool *ok)
{
    if (s == NULL || s[0] == '\0') {
        return NULL;
    }
    char *d = strdup(s);
    *ok = *ok && d != NULL;
    return d;
}

kvd_status_t kvd_lreq_create(kvd_leader_t *ld, const kvd_leader_request_t *q,
                             lreq_t **out)
{
    lreq_t *r = calloc(1, sizeof *r);
    if (r == NULL) {
        return KVD_ERR_NOMEM;
    }
    bool ok = true;
    snprintf(r->id, sizeof r->id, "%s", q->request_id);
    r->prompt_tokens = q->num_tokens;
    r->chunk_on = ld->chunk.enabled;
    r->chunk_from = SIZE_MAX;
    r->lora = dup_or_null(q->lora_name, &ok);
    r->salt = dup_or_null(q->cache_salt, &ok);
    r->source = dup_or_null(q->source_node, &ok);
    r->hashes_mode = q->hashes != NULL;
    if (ok && r->hashes_mode) {
        ok = kvd_lreq_grow(r, (void **)&r->hashes, &r->cap_hashes,
                           q->num_hashes, 16, sizeof *r->hashes);
        if (ok && q->num_hashes > 0) {
            memcpy(r->hashes, q->hashes, q->num_hashes * sizeof *r->hashes);
            r->num_hashes = q->num_hashes;
        }
    } else if (ok && q->num_tokens > 0) {
        ok =
            kvd_lreq_grow(r, (void **)&r->tokens, &r->cap_tokens, q->num_tokens,
                          16 * ld->cfg.block_size, sizeof *r->tokens);
        if (ok) {
            memcpy(r->tokens, q->tokens, q->num_tokens * sizeof *r->tokens);
            r->num_tokens = q->num_tokens;
        }
        ok = ok && mm_copy(r, q);
        if (ok && q->prompt_embeds != NULL) {
            size_t bytes = q->num_prompt_embeds * KVD_SHA256_BYTES;
            r->has_embeds = true;
            r->embeds = malloc(bytes > 0 ? bytes : 1);
            ok = r->embeds != NULL;
            if (ok && bytes > 0) {
                memcpy(r->embeds, q->prompt_embeds, bytes);
                r->num_embeds = q->num_prompt_embeds;
            }
        }
    }
    kvd_status_t s = ok ? kvd_lreq_extend_hashes(ld, r) : KVD_ERR_NOMEM;
    if (s != KVD_OK) {
        req_free(r);
        return s;
    }
    size_t b = id_bucket(r->id);
    r->next = ld->table[b];
    ld->table[b] = r;
    ld->st.requests++;
    *out = r;
    return KVD_OK;
}

/* ---- create / destroy --------------------------------------------------- */

static bool shards_ok(const kvd_namespace_t *shard_ns, uint32_t num)
{
    return (shard_ns != NULL || num == 0) && num <= KVD_LEADER_MAX_SHARD_NS;
}

/* Copies the shard namespaces into the leader's own array. */
static void shards_set(kvd_leader_t *ld, const kvd_namespace_t *shard_ns,
                       uint32_t num)
{
    if (num > 0) {
        memmove(ld->shard_ns, shard_ns, num * sizeof *shard_ns);
    }
    ld->cfg.shard_ns = num > 0 ? ld->shard_ns : NULL;
    ld->cfg.num_shard_ns = num;
}

KVD_API kvd_status_t kvd_leader_create(const kvd_leader_config_t *cfg,
                                       kvd_store_t *store,
                                       kvd_leader_t **leader_out)
{
    if (cfg == NULL || store == NULL || leader_out == NULL ||
        cfg->block_size == 0 || cfg->block_size > LEADER_BLOCK_SIZE_MAX ||
        cfg->num_workers == 0 || !shards_ok(cfg->shard_ns, cfg->num_shard_ns)) {
        return KVD_ERR_INVALID;
    }
    kvd_leader_t *ld = calloc(1, sizeof *ld);
    if (ld == NULL) {
        return KVD_ERR_NOMEM;
    }
    ld->cfg = *cfg;
    ld->store = store;
    snprintf(ld->node_id, sizeof ld->node_id, "%s",
             cfg->node_id != NULL ? cfg->node_id : "");
    ld->cfg.node_id = ld->node_id;
    shards_set(ld, cfg->shard_ns, cfg->num_shard_ns);
    if (ld->cfg.lookup_timeout_ms == 0) {
        ld->cfg.lookup_timeout_ms = KVD_LEADER_DEFAULT_LOOKUP_TIMEOUT_MS;
    }
    *leader_out = ld;
    return KVD_OK;
}

KVD_API kvd_status_t kvd_leader_set_namespace(kvd_leader_t *leader,
                                              const kvd_namespace_t *ns)
{
    if (leader == NULL || ns == NULL) {
        return KVD_ERR_INVALID;
    }
    leader->cfg.ns = *ns;
    return KVD_OK;
}

KVD_API kvd_status_t kvd_leader_set_namespaces(kvd_leader_t *leader,
                                               const kvd_namespace_t *ns,
                                               const kvd_namespace_t *shard_ns,
                                               uint32_t num_shard_ns)
{
    if (leader == NULL || ns == NULL || !shards_ok(shard_ns, num_shard_ns)) {
        return KVD_ERR_INVALID;
    }
    leader->cfg.ns = *ns;
    shards_set(leader, shard_ns, num_shard_ns);
    return KVD_OK;
}

KVD_API void kvd_leader_destroy(kvd_leader_t *leader)
{
    if (leader == NULL) {
        return;
    }
    for (size_t b = 0; b < LEADER_BUCKETS; b++) {
        for (lreq_t *r = leader->table[b], *next; r != NULL; r = next) {
            next = r->next;
            kvd_lreq_release_leases(leader, r);
            kvd_chunk_release(leader, r);
            req_free(r);
        }
    }
    for (size_t b = 0; b < LEADER_HASH_BUCKETS; b++) {
        for (lhash_t *e = leader->loading[b], *next; e != NULL; e = next) {
            next = e->next;
            free(e);
        }
    }
    free(leader->failed);
    free(leader->taken);
    free(leader->handoff);
    free(leader->done_ids);
    kvd_leader_saved_free(leader);
    free(leader);
}

/* ---- end of a request --------------------------------------------------- */

KVD_API kvd_status_t kvd_leader_request_preempted(kvd_leader_t *leader,
                                                  const char *request_id)
{
    if (leader == NULL || !kvd_leader_id_ok(request_id)) {
        return KVD_ERR_INVALID;
    }
    lreq_t *r = kvd_lreq_find(leader, request_id);
    if (r == NULL) {
        return KVD_ERR_NOT_FOUND;
    }
    if (r->finished) {
        return KVD_ERR_STATE;
    }
    kvd_lreq_forget_answer(leader, r);
    r->num_block_ids = 0; /* the engine frees the blocks */
    r->saved_upto = r->save_from;
    r->preempted = true;
    kvd_lreq_touch(leader, r);
    return KVD_OK;
}

KVD_API kvd_status_t kvd_leader_request_finished(kvd_leader_t *leader,
                                                 const char *request_id,
                                                 bool *delay_free_out)
{
    if (leader == NULL || !kvd_leader_id_ok(request_id) ||
        delay_free_out == NULL) {
        return KVD_ERR_INVALID;
    }
    lreq_t *r = kvd_lreq_find(leader, request_id);
    if (r == NULL) {
        return KVD_ERR_NOT_FOUND;
    }
    /* Saves planned but never sent are dropped: nobody will run them. */
    r->saved_upto = r->save_from;
    r->finished = true;
    kvd_lreq_end_loads(leader, r);
    bool delay = r->saves_inflight;
    kvd_lreq_maybe_drop(leader, r);
    *delay_free_out = delay;
    return KVD_OK;
}

KVD_API kvd_status_t kvd_leader_request_finished_transfer(
    kvd_leader_t *leader, const char *request_id, bool *delay_free_out,
    kvd_leader_transfer_t *transfer_out)
{
    if (leader == NULL || !kvd_leader_id_ok(request_id) ||
        delay_free_out == NULL || transfer_out == NULL) {
        return KVD_ERR_INVALID;
    }
    lreq_t *r = kvd_lreq_find(leader, request_id);
    if (r == NULL) {
        return KVD_ERR_NOT_FOUND;
    }
    /* Full blocks stored or sent to the workers for saving; saves not yet
     * in a plan are dropped by finishing, so they are not handed off. */
    size_t n = r->save_from < r->chunk_from ? r->save_from : r->chunk_from;
    if (n > 0 && !kvd_grow((void **)&leader->handoff, &leader->cap_handoff, n,
                           sizeof *leader->handoff)) {
        return KVD_ERR_NOMEM;
    }
    if (n > 0) {
        memcpy(leader->handoff, r->hashes, n * sizeof *r->hashes);
    }
    kvd_status_t s =
        kvd_leader_request_finished(leader, request_id, delay_free_out);
    if (s != KVD_OK) {
        return s;
    }
    transfer_out->node_id = leader->node_id;
    transfer_out->ns = leader->cfg.ns;
    transfer_out->hashes = n > 0 ? leader->handoff : NULL;
    transfer_out->num_hashes = n;
    transfer_out->num_tokens = (uint64_t)n * leader->cfg.block_size;
    return KVD_OK;
}

KVD_API kvd_status_t kvd_leader_stats(kvd_leader_t *leader,
                                      kvd_leader_stats_t *out)
{
    if (leader == NULL || out == NULL) {
        return KVD_ERR_INVALID;
    }
    *out = leader->st;
    return KVD_OK;
}
