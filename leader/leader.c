/*
 * The leader (include/kvdepot/leader.h): per-request state between the
 * engine's scheduler calls, and the step plan.
 *
 * A request carries its block hash chain (from tokens, extended as decode
 * tokens arrive, or from the engine's hashes), the result of its one
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
#include <stdlib.h>
#include <string.h>

#include "common/grow_int.h"
#include "common/log_int.h"
#include "common/time_int.h"
#include "kvdepot/leader.h"
#include "proto/kvd_proto.h"

#define LEADER_BUCKETS 1024u
#define LEADER_HASH_BUCKETS 4096u
#define LEADER_ID_MAX 255u
#define LEADER_BLOCK_SIZE_MAX 4096u

typedef struct lreq lreq_t;
struct lreq {
    lreq_t *next;         /* table chain */
    lreq_t *next_touched; /* plan list */
    bool touched;
    char id[LEADER_ID_MAX + 1];
    uint64_t not_yet_since_ns; /* first "not yet" answer, 0: none */

    /* Identity. */
    bool hashes_mode;
    uint32_t *tokens;
    size_t num_tokens, cap_tokens;
    kvd_block_hash_t *hashes;
    size_t num_hashes, cap_hashes;
    char *lora, *salt;
    char *source; /* the node that computed the blocks, or NULL */
    size_t prompt_tokens;

    /* Lookup: blocks [first_block, first_block + num_leases) are leased.
     * The answer holds for answered_computed tokens held by the engine. */
    bool looked_up;
    bool allocated; /* update_state_after_alloc took the answer */
    uint64_t answered_computed;
    size_t first_block;
    kvd_store_lease_t *leases;
    size_t num_leases;
    bool async;
    uint64_t matched_tokens;

    /* Engine block table. */
    uint32_t *block_ids;
    size_t num_block_ids, cap_block_ids;

    /* Loads: `load_blocks` blocks from first_block, planned when
     * plan_loads is set; in flight until the reports finish them. */
    size_t load_blocks;
    size_t load_copies;   /* of those, blocks the engine holds (planned) */
    uint64_t load_tokens; /* num_external_tokens the engine took */
    bool plan_loads;
    bool loads_inflight;
    bool loading_marked; /* its async blocks are in `loading` */
    uint64_t load_step;
    uint32_t load_reports;

    /* Saves: blocks [0, saved_upto) are stored or planned; the next plan
     * carries [save_from, saved_upto). */
    size_t saved_upto, save_from;
    size_t save_copies; /* saves in the last plan (engine-held blocks) */
    bool saves_inflight;
    uint64_t save_step;
    uint32_t save_reports;

    bool preempted; /* list in the next plan */
    bool finished;  /* engine is done; kept until its saves finish */
};

typedef struct lhash lhash_t;
struct lhash {
    lhash_t *next;
    kvd_block_hash_t hash;
    uint32_t count;
};

struct kvd_leader {
    kvd_leader_config_t cfg;
    kvd_leader_backend_t be;
    lreq_t *table[LEADER_BUCKETS];
    lreq_t *touched;
    lhash_t *loading[LEADER_HASH_BUCKETS];
    uint64_t step;
    uint32_t *failed;
    size_t num_failed, cap_failed;
    /* Ids of requests whose async loads ended, and those handed out by the
     * last kvd_leader_take_finished_loads (valid until the next take). */
    char (*done_ids)[LEADER_ID_MAX + 1];
    size_t num_done, cap_done;
    char (*taken)[LEADER_ID_MAX + 1];
    size_t cap_taken;
    char node_id[LEADER_ID_MAX + 1];
    kvd_block_hash_t *handoff; /* last hand-off's hashes */
    size_t cap_handoff;
    kvd_leader_stats_t st;
};

/* ---- small containers --------------------------------------------------- */

static size_t id_bucket(const char *id)
{
    return (size_t)(kvd_xxh3_64(id, strlen(id)) % LEADER_BUCKETS);
}

static lreq_t *req_find(kvd_leader_t *ld, const char *id)
{
    for (lreq_t *r = ld->table[id_bucket(id)]; r != NULL; r = r->next) {
        if (strcmp(r->id, id) == 0) {
            return r;
        }
    }
    return NULL;
}

static bool id_ok(const char *id)
{
    return id != NULL && id[0] != '\0' && strlen(id) <= LEADER_ID_MAX;
}

static void req_touch(kvd_leader_t *ld, lreq_t *r)
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

static bool loading_has(kvd_leader_t *ld, const kvd_block_hash_t *h)
{
    return *loading_slot(ld, h) != NULL;
}

static bool loading_add(kvd_leader_t *ld, const kvd_block_hash_t *h)
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

static void req_release_leases(kvd_leader_t *ld, lreq_t *r)
{
    if (r->num_leases > 0) {
        (void)ld->be.release(ld->be.ctx, r->leases, r->num_leases);
        ld->st.leases -= r->num_leases;
    }
    free(r->leases);
    r->leases = NULL;
    r->num_leases = 0;
}

/* Ends the request's loads (finished, failed or dropped). */
static void req_end_loads(kvd_leader_t *ld, lreq_t *r)
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
    req_release_leases(ld, r);
}

/* Ends the request's loads and forgets its answer: the engine asks again
 * (after a preemption, or a load that failed) and gets a fresh lookup. */
static void req_forget_answer(kvd_leader_t *ld, lreq_t *r)
{
    req_end_loads(ld, r);
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

/* ---- hashing ------------------------------------------------------------ */

/* Hashes every full block of the token sequence not hashed yet. */
static kvd_status_t req_extend_hashes(kvd_leader_t *ld, lreq_t *r)
{
    size_t bs = ld->cfg.block_size, full = r->num_tokens / bs;
    if (r->hashes_mode || full <= r->num_hashes) {
        return KVD_OK;
    }
    if (!kvd_grow((void **)&r->hashes, &r->cap_hashes, full,
                  sizeof *r->hashes)) {
        return KVD_ERR_NOMEM;
    }
    kvd_block_extras_t first = {.lora_name = r->lora, .cache_salt = r->salt};
    kvd_block_extras_t rest = {.lora_name = r->lora};
    for (size_t b = r->num_hashes; b < full; b++) {
        const kvd_block_hash_t *parent =
            b == 0 ? &ld->cfg.root : &r->hashes[b - 1];
        kvd_status_t s = kvd_block_hash(parent, r->tokens + b * bs, bs,
                                        b == 0 ? &first : &rest, &r->hashes[b]);
        if (s != KVD_OK) {
            return s;
        }
        r->num_hashes = b + 1;
    }
    return KVD_OK;
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

static kvd_status_t req_create(kvd_leader_t *ld, const kvd_leader_request_t *q,
                               lreq_t **out)
{
    lreq_t *r = calloc(1, sizeof *r);
    if (r == NULL) {
        return KVD_ERR_NOMEM;
    }
    bool ok = true;
    snprintf(r->id, sizeof r->id, "%s", q->request_id);
    r->prompt_tokens = q->num_tokens;
    r->lora = dup_or_null(q->lora_name, &ok);
    r->salt = dup_or_null(q->cache_salt, &ok);
    r->source = dup_or_null(q->source_node, &ok);
    r->hashes_mode = q->hashes != NULL;
    if (ok && r->hashes_mode) {
        ok = kvd_grow((void **)&r->hashes, &r->cap_hashes, q->num_hashes,
                      sizeof *r->hashes);
        if (ok && q->num_hashes > 0) {
            memcpy(r->hashes, q->hashes, q->num_hashes * sizeof *r->hashes);
            r->num_hashes = q->num_hashes;
        }
    } else if (ok && q->num_tokens > 0) {
        ok = kvd_grow((void **)&r->tokens, &r->cap_tokens, q->num_tokens,
                      sizeof *r->tokens);
        if (ok) {
            memcpy(r->tokens, q->tokens, q->num_tokens * sizeof *r->tokens);
            r->num_tokens = q->num_tokens;
        }
    }
    kvd_status_t s = ok ? req_extend_hashes(ld, r) : KVD_ERR_NOMEM;
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

/* ---- the embedded backend ----------------------------------------------- */

static kvd_status_t embedded_lookup(void *ctx, const kvd_namespace_t *ns,
                                    const kvd_block_hash_t *hashes,
                                    size_t num_hashes,
                                    kvd_store_lease_t *leases_out,
                                    size_t *matched_out)
{
    return kvd_store_lookup(ctx, ns, hashes, num_hashes, leases_out,
                            matched_out);
}

static kvd_status_t embedded_lookup_from(void *ctx, const char *source_node,
                                         const kvd_namespace_t *ns,
                                         const kvd_block_hash_t *hashes,
                                         size_t num_hashes,
                                         kvd_store_lease_t *leases_out,
                                         size_t *matched_out)
{
    return kvd_store_lookup_from(ctx, ns, hashes, num_hashes, source_node,
                                 leases_out, matched_out);
}

static kvd_status_t embedded_release(void *ctx, const kvd_store_lease_t *l,
                                     size_t num)
{
    return kvd_store_release(ctx, l, num);
}

KVD_API void kvd_leader_backend_embedded(kvd_store_t *store,
                                         kvd_leader_backend_t *out)
{
    if (out != NULL) {
        out->ctx = store;
        out->lookup = embedded_lookup;
        out->release = embedded_release;
        out->lookup_from = embedded_lookup_from;
    }
}

/* ---- create / destroy --------------------------------------------------- */

KVD_API kvd_status_t kvd_leader_create(const kvd_leader_config_t *cfg,
                                       const kvd_leader_backend_t *backend,
                                       kvd_leader_t **leader_out)
{
    if (cfg == NULL || backend == NULL || leader_out == NULL ||
        cfg->block_size == 0 || cfg->block_size > LEADER_BLOCK_SIZE_MAX ||
        cfg->num_workers == 0 || backend->lookup == NULL ||
        backend->release == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_leader_t *ld = calloc(1, sizeof *ld);
    if (ld == NULL) {
        return KVD_ERR_NOMEM;
    }
    ld->cfg = *cfg;
    ld->be = *backend;
    snprintf(ld->node_id, sizeof ld->node_id, "%s",
             cfg->node_id != NULL ? cfg->node_id : "");
    ld->cfg.node_id = ld->node_id;
    if (ld->cfg.lookup_timeout_ms == 0) {
        ld->cfg.lookup_timeout_ms = KVD_LEADER_DEFAULT_LOOKUP_TIMEOUT_MS;
    }
    *leader_out = ld;
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
            req_release_leases(leader, r);
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
    free(leader);
}

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

KVD_API kvd_status_t kvd_leader_get_num_new_matched_tokens(
    kvd_leader_t *leader, const kvd_leader_request_t *req,
    uint64_t num_computed_tokens, uint64_t *matched_out, bool *async_out)
{
    if (leader == NULL || req == NULL || matched_out == NULL ||
        async_out == NULL || !id_ok(req->request_id) ||
        (req->tokens == NULL && req->num_tokens > 0 && req->hashes == NULL) ||
        (req->hashes == NULL && req->num_hashes > 0)) {
        return KVD_ERR_INVALID;
    }
    kvd_leader_t *ld = leader;
    lreq_t *r = req_find(ld, req->request_id);
    if (r == NULL) {
        kvd_status_t s = req_create(ld, req, &r);
        if (s != KVD_OK) {
            return s;
        }
    } else if (r->finished) {
        /* The id belongs to a finished request whose saves are still in
         * flight: a new request may not reuse it yet. */
        return KVD_ERR_EXISTS;
    }
    if (r->looked_up && num_computed_tokens != r->answered_computed) {
        if (r->allocated) {
            return KVD_ERR_STATE; /* the engine acted on the answer */
        }
        /* The engine's own prefix changed since the answer (grown from
         * another request, or evicted): the promised blocks are not the
         * same ones, so look up again. */
        req_release_leases(ld, r);
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
        if (loading_has(ld, &r->hashes[i])) {
            if (may_wait) {
                if (r->not_yet_since_ns == 0) {
                    r->not_yet_since_ns = now;
                }
                ld->st.not_yet++;
                return KVD_INPROGRESS;
            }
            cap = i; /* load only what nobody is loading */
            break;
        }
    }
    if (first >= cap) {
        return req_answer_miss(r, first, matched_out, async_out);
    }
    kvd_store_lease_t *leases = calloc(cap, sizeof *leases);
    if (leases == NULL) {
        return KVD_ERR_NOMEM;
    }
    size_t m = 0;
    ld->st.lookups++;
    kvd_status_t s =
        r->source != NULL && ld->be.lookup_from != NULL
            ? ld->be.lookup_from(ld->be.ctx, r->source, &ld->cfg.ns, r->hashes,
                                 cap, leases, &m)
            : ld->be.lookup(ld->be.ctx, &ld->cfg.ns, r->hashes, cap, leases,
                            &m);
    if (s == KVD_INPROGRESS && !may_wait) {
        /* Not ready and the engine cannot wait: a miss, asked again only
         * if the request comes back (preemption). */
        free(leases);
        return req_answer_miss(r, first, matched_out, async_out);
    }
    if (s != KVD_OK && s != KVD_INPROGRESS) {
        /* The cache failed (a dead daemon, a deadline): the engine
         * computes the prefix; it never waits on or fails for the cache. */
        free(leases);
        ld->st.lookup_errors++;
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 5000,
                            "leader: lookup for request %s failed (%s): "
                            "computed instead",
                            r->id, kvd_status_str(s));
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
    /* Blocks the engine has already are not loaded: give them back. */
    size_t keep_from = first < m ? first : m;
    if (keep_from > 0) {
        (void)ld->be.release(ld->be.ctx, leases, keep_from);
    }
    r->looked_up = true;
    r->first_block = first;
    r->saved_upto = r->save_from = m > first ? m : first;
    r->num_leases = m - keep_from;
    if (r->num_leases > 0) {
        memmove(leases, leases + keep_from, r->num_leases * sizeof *leases);
        r->leases = leases;
    } else {
        free(leases);
    }
    r->async = false;
    for (size_t i = 0; i < r->num_leases; i++) {
        r->async = r->async || leases[i].tier != KVD_STORE_TIER_HOST ||
                   ld->cfg.async_host_loads;
    }
    r->matched_tokens = (uint64_t)r->num_leases * bs;
    if (r->matched_tokens > 0) {
        /* Whole blocks from a block boundary: the first leased block may
         * start below num_computed_tokens only when it is not a boundary,
         * which the engine never does for blocks it caches. */
        r->matched_tokens =
            (uint64_t)(first + r->num_leases) * bs - num_computed_tokens;
    }
    ld->st.leases += r->num_leases;
    ld->st.matched_blocks += r->num_leases;
    *matched_out = r->matched_tokens;
    *async_out = r->async;
    return KVD_OK;
}

KVD_API kvd_status_t kvd_leader_update_state_after_alloc(
    kvd_leader_t *leader, const char *request_id, const uint32_t *block_ids,
    size_t num_block_ids, uint64_t num_external_tokens)
{
    if (leader == NULL || !id_ok(request_id) ||
        (block_ids == NULL && num_block_ids > 0)) {
        return KVD_ERR_INVALID;
    }
    kvd_leader_t *ld = leader;
    lreq_t *r = req_find(ld, request_id);
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
    if (!kvd_grow((void **)&r->block_ids, &r->cap_block_ids, num_block_ids,
                  sizeof *r->block_ids)) {
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
    /* Leases beyond what the engine takes go back now. */
    if (blocks < r->num_leases) {
        (void)ld->be.release(ld->be.ctx, r->leases + blocks,
                             r->num_leases - blocks);
        ld->st.leases -= r->num_leases - blocks;
        r->num_leases = blocks;
    }
    if (blocks == 0) {
        req_release_leases(ld, r);
    }
    r->load_blocks = blocks;
    r->load_tokens = num_external_tokens;
    r->plan_loads = blocks > 0;
    if (r->async && blocks > 0) {
        /* From now on another request matching these blocks waits for this
         * load: in vLLM it is matched in this same schedule() pass, before
         * any plan exists, and would load them a second time. */
        bool ok = true;
        for (size_t b = 0; b < blocks; b++) {
            ok = loading_add(ld, &r->hashes[r->first_block + b]) && ok;
        }
        if (!ok) {
            KVD_LOG_WARN("leader: no memory to track a load; a shared "
                         "prefix may be loaded twice");
        }
        r->loading_marked = true;
    }
    if (r->plan_loads) {
        req_touch(ld, r);
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
    if (leader == NULL || !id_ok(request_id) ||
        (new_block_ids == NULL && num_new_blocks > 0) ||
        (new_tokens == NULL && num_new_tokens > 0) ||
        (new_hashes == NULL && num_new_hashes > 0)) {
        return KVD_ERR_INVALID;
    }
    kvd_leader_t *ld = leader;
    lreq_t *r = req_find(ld, request_id);
    if (r == NULL) {
        return KVD_ERR_NOT_FOUND;
    }
    if (r->finished) {
        return KVD_ERR_STATE;
    }
    if (!kvd_grow((void **)&r->block_ids, &r->cap_block_ids,
                  r->num_block_ids + num_new_blocks, sizeof *r->block_ids) ||
        (num_new_tokens > 0 &&
         !kvd_grow((void **)&r->tokens, &r->cap_tokens,
                   r->num_tokens + num_new_tokens, sizeof *r->tokens)) ||
        (num_new_hashes > 0 &&
         !kvd_grow((void **)&r->hashes, &r->cap_hashes,
                   r->num_hashes + num_new_hashes, sizeof *r->hashes))) {
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
    kvd_status_t s = req_extend_hashes(ld, r);
    if (s != KVD_OK) {
        return s;
    }
    /* Full blocks computed by the end of this step, with a hash and an
     * engine block, and not yet stored or planned. */
    size_t done = (size_t)(num_computed_tokens / ld->cfg.block_size);
    if (done > r->num_hashes) {
        done = r->num_hashes;
    }
    if (done > r->num_block_ids) {
        done = r->num_block_ids;
    }
    if (done > r->saved_upto) {
        r->saved_upto = done;
        req_touch(ld, r);
    }
    return KVD_OK;
}

/* ---- the plan ----------------------------------------------------------- */

typedef struct plan_mem {
    kvd_pb_step_request_t *reqs;
    kvd_pb_step_request_t **req_ptrs;
    kvd_pb_block_load_t *loads;
    kvd_pb_block_load_t **load_ptrs;
    kvd_pb_block_save_t *saves;
    kvd_pb_block_save_t **save_ptrs;
    kvd_pb_object_key_t *keys;
    kvd_pb_block_source_t *sources;
    char **preempted;
} plan_mem_t;

static void plan_mem_free(plan_mem_t *m)
{
    free(m->reqs);
    free(m->req_ptrs);
    free(m->loads);
    free(m->load_ptrs);
    free(m->saves);
    free(m->save_ptrs);
    free(m->keys);
    free(m->sources);
    free(m->preempted);
}

static void plan_key(kvd_leader_t *ld, kvd_pb_object_key_t *k,
                     const kvd_block_hash_t *h)
{
    kvd_pb_object_key_t init = KVDEPOT__V1__OBJECT_KEY__INIT;
    *k = init;
    k->namespace_id.len = KVD_NAMESPACE_BYTES;
    k->namespace_id.data = ld->cfg.ns.bytes;
    k->block_hash.len = KVD_SHA256_BYTES;
    k->block_hash.data = (uint8_t *)h->bytes;
}

KVD_API kvd_status_t kvd_leader_build_connector_meta(kvd_leader_t *leader,
                                                     uint8_t **plan_out,
                                                     size_t *len_out)
{
    if (leader == NULL || plan_out == NULL || len_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_leader_t *ld = leader;
    size_t nreq = 0, nload = 0, nsave = 0, npre = 0;
    for (lreq_t *r = ld->touched; r != NULL; r = r->next_touched) {
        size_t l = r->plan_loads ? r->load_blocks : 0;
        size_t s = r->saved_upto - r->save_from;
        nreq += l > 0 || s > 0;
        nload += l;
        nsave += s;
        npre += r->preempted;
    }
    plan_mem_t m = {0};
    m.reqs = calloc(nreq + 1, sizeof *m.reqs);
    m.req_ptrs = calloc(nreq + 1, sizeof *m.req_ptrs);
    m.loads = calloc(nload + 1, sizeof *m.loads);
    m.load_ptrs = calloc(nload + 1, sizeof *m.load_ptrs);
    m.saves = calloc(nsave + 1, sizeof *m.saves);
    m.save_ptrs = calloc(nsave + 1, sizeof *m.save_ptrs);
    m.keys = calloc(nload + nsave + 1, sizeof *m.keys);
    m.sources = calloc(nload + 1, sizeof *m.sources);
    m.preempted = calloc(npre + 1, sizeof *m.preempted);
    if (m.reqs == NULL || m.req_ptrs == NULL || m.loads == NULL ||
        m.load_ptrs == NULL || m.saves == NULL || m.save_ptrs == NULL ||
        m.keys == NULL || m.sources == NULL || m.preempted == NULL) {
        plan_mem_free(&m);
        return KVD_ERR_NOMEM;
    }
    kvd_pb_step_plan_t plan = KVDEPOT__V1__STEP_PLAN__INIT;
    uint64_t step = ld->step + 1;
    plan.step = step;
    plan.block_size = ld->cfg.block_size;
    size_t ri = 0, li = 0, si = 0, ki = 0, pi = 0;
    for (lreq_t *r = ld->touched; r != NULL; r = r->next_touched) {
        if (r->preempted) {
            m.preempted[pi++] = r->id;
        }
        size_t l = r->plan_loads ? r->load_blocks : 0;
        size_t s = r->saved_upto - r->save_from;
        if (l == 0 && s == 0) {
            continue;
        }
        kvd_pb_step_request_t init = KVDEPOT__V1__STEP_REQUEST__INIT;
        kvd_pb_step_request_t *q = &m.reqs[ri];
        *q = init;
        m.req_ptrs[ri++] = q;
        q->request_id = r->id;
        q->loads = m.load_ptrs + li;
        q->saves = m.save_ptrs + si;
        q->layerwise = ld->cfg.layerwise;
        size_t nl = 0, ns = 0;
        for (size_t b = 0; b < l; b++) {
            size_t blk = r->first_block + b;
            if (r->block_ids[blk] == KVD_LEADER_NO_BLOCK) {
                continue; /* nothing to load into; the lease goes at the end */
            }
            kvd_pb_block_load_t li_init = KVDEPOT__V1__BLOCK_LOAD__INIT;
            kvd_pb_block_source_t src_init = KVDEPOT__V1__BLOCK_SOURCE__INIT;
            kvd_pb_block_load_t *bl = &m.loads[li];
            *bl = li_init;
            m.load_ptrs[li] = bl;
            bl->block_id = r->block_ids[blk];
            plan_key(ld, &m.keys[ki], &r->hashes[blk]);
            bl->key = &m.keys[ki++];
            m.sources[li] = src_init;
            m.sources[li].tier = r->leases[b].tier == KVD_STORE_TIER_DISK
                                     ? KVDEPOT__V1__TIER__TIER_DISK
                                     : KVDEPOT__V1__TIER__TIER_HOST;
            bl->source = &m.sources[li];
            li++;
            nl++;
        }
        q->n_loads = nl;
        r->load_copies = nl;
        /* A load with nothing to copy is asynchronous, so that the worker
         * reports it (and the leases go) like any other. */
        q->async_load = l > 0 && (r->async || nl == 0);
        /* Tokens of the loads planned: whole blocks, but for the request's
         * last external block, which may be partial. */
        uint64_t bs = ld->cfg.block_size, load_tokens = nl * bs;
        if (nl > 0 &&
            r->block_ids[r->first_block + l - 1] != KVD_LEADER_NO_BLOCK) {
            load_tokens = (nl - 1) * bs + (r->load_tokens - (l - 1) * bs);
        }
        q->num_load_tokens = (uint32_t)load_tokens;
        for (size_t blk = r->save_from; blk < r->saved_upto; blk++) {
            if (r->block_ids[blk] == KVD_LEADER_NO_BLOCK) {
                continue; /* the engine dropped it: nothing to save */
            }
            kvd_pb_block_save_t sv_init = KVDEPOT__V1__BLOCK_SAVE__INIT;
            kvd_pb_block_save_t *sv = &m.saves[si];
            *sv = sv_init;
            m.save_ptrs[si++] = sv;
            sv->block_id = r->block_ids[blk];
            plan_key(ld, &m.keys[ki], &r->hashes[blk]);
            sv->key = &m.keys[ki++];
            ns++;
        }
        q->n_saves = ns;
        r->save_copies = ns;
        if (nl == 0 && ns == 0 && !q->async_load) {
            ri--; /* every position was KVD_LEADER_NO_BLOCK: nothing to do */
        }
    }
    plan.n_requests = ri;
    plan.requests = m.req_ptrs;
    plan.n_preempted_request_ids = pi;
    plan.preempted_request_ids = m.preempted;
    uint8_t *buf = NULL;
    size_t len = 0;
    char reason[256] = "";
    kvd_status_t st = kvd_proto_step_plan_pack_alloc(&plan, &buf, &len, reason,
                                                     sizeof reason);
    plan_mem_free(&m);
    if (st != KVD_OK) {
        KVD_LOG_ERROR("leader: step plan %llu not packed: %s",
                      (unsigned long long)step, reason);
        return st;
    }
    /* Packed: now the step state moves on. */
    ld->step = step;
    for (lreq_t *r = ld->touched, *next; r != NULL; r = next) {
        next = r->next_touched;
        if (r->plan_loads && r->load_blocks > 0) {
            r->loads_inflight = true;
            r->load_step = step;
            r->load_reports = 0;
            ld->st.planned_loads += r->load_copies;
        }
        r->plan_loads = false;
        if (r->saved_upto > r->save_from && r->save_copies > 0) {
            ld->st.planned_saves += r->save_copies;
            r->saves_inflight = true;
            r->save_step = step;
            r->save_reports = 0;
        }
        r->save_from = r->saved_upto;
        r->preempted = false;
        r->touched = false;
        r->next_touched = NULL;
    }
    ld->touched = NULL;
    *plan_out = buf;
    *len_out = len;
    return KVD_OK;
}

/* ---- reports ------------------------------------------------------------ */

static bool done_push(kvd_leader_t *ld, const char *id)
{
    if (!kvd_grow((void **)&ld->done_ids, &ld->cap_done, ld->num_done + 1,
                  sizeof *ld->done_ids)) {
        return false;
    }
    snprintf(ld->done_ids[ld->num_done++], LEADER_ID_MAX + 1, "%s", id);
    return true;
}

static void failed_push(kvd_leader_t *ld, uint32_t block_id)
{
    if (kvd_grow((void **)&ld->failed, &ld->cap_failed, ld->num_failed + 1,
                 sizeof *ld->failed)) {
        ld->failed[ld->num_failed++] = block_id;
    } else {
        KVD_LOG_ERROR("leader: no memory to report failed block %u", block_id);
    }
}

/* Drops a finished request once nothing of it is in flight. */
static void req_maybe_drop(kvd_leader_t *ld, lreq_t *r)
{
    if (r->finished && !r->saves_inflight && !r->loads_inflight) {
        req_unlink(ld, r);
        req_release_leases(ld, r);
        req_free(r);
    }
}

KVD_API kvd_status_t kvd_leader_update_connector_output(kvd_leader_t *leader,
                                                        const void *report,
                                                        size_t len)
{
    if (leader == NULL || (report == NULL && len > 0)) {
        return KVD_ERR_INVALID;
    }
    kvd_leader_t *ld = leader;
    kvd_pb_worker_report_t *rep = NULL;
    char reason[256] = "";
    kvd_status_t s = kvd_proto_worker_report_unpack(report, len, &rep, reason,
                                                    sizeof reason);
    if (s != KVD_OK) {
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                            "leader: worker report rejected: %s", reason);
        return s;
    }
    for (size_t i = 0; i < rep->n_failed_loads; i++) {
        lreq_t *r = req_find(ld, rep->failed_loads[i]->request_id);
        failed_push(ld, rep->failed_loads[i]->block_id);
        ld->st.failed_loads++;
        if (r != NULL && r->loads_inflight) {
            /* The engine recomputes from the first bad block: nothing of
             * this load is needed any more. vLLM may put the request back
             * in its queue and ask again: that is a new lookup (the bad
             * objects are gone from the store), and the blocks it computes
             * again are saved again (stored ones answer EXISTS). */
            bool was_async = r->async;
            req_forget_answer(ld, r);
            if (r->save_from == r->saved_upto &&
                r->saved_upto > r->first_block) {
                r->saved_upto = r->save_from = r->first_block;
            }
            if (was_async) {
                (void)done_push(ld, r->id);
            }
            req_maybe_drop(ld, r);
        }
    }
    for (size_t i = 0; i < rep->n_finished_loading; i++) {
        lreq_t *r = req_find(ld, rep->finished_loading[i]);
        if (r == NULL || !r->loads_inflight || rep->step < r->load_step) {
            continue;
        }
        if (++r->load_reports >= ld->cfg.num_workers) {
            bool was_async = r->async;
            req_end_loads(ld, r);
            if (was_async) {
                (void)done_push(ld, r->id);
            }
            req_maybe_drop(ld, r);
        }
    }
    for (size_t i = 0; i < rep->n_finished_saving; i++) {
        lreq_t *r = req_find(ld, rep->finished_saving[i]);
        if (r == NULL || !r->saves_inflight || rep->step < r->save_step) {
            continue;
        }
        if (++r->save_reports >= ld->cfg.num_workers) {
            r->saves_inflight = false;
            req_maybe_drop(ld, r);
        }
    }
    kvd_proto_worker_report_free(rep);
    return KVD_OK;
}

KVD_API size_t kvd_leader_take_failed_blocks(kvd_leader_t *leader,
                                             uint32_t *block_ids, size_t max)
{
    if (leader == NULL || block_ids == NULL) {
        return 0;
    }
    size_t n = leader->num_failed < max ? leader->num_failed : max;
    if (n == 0) {
        return 0;
    }
    memcpy(block_ids, leader->failed, n * sizeof *block_ids);
    memmove(leader->failed, leader->failed + n,
            (leader->num_failed - n) * sizeof *leader->failed);
    leader->num_failed -= n;
    return n;
}

KVD_API size_t kvd_leader_take_finished_loads(kvd_leader_t *leader,
                                              const char **out, size_t max)
{
    if (leader == NULL || out == NULL) {
        return 0;
    }
    size_t n = leader->num_done < max ? leader->num_done : max;
    if (n == 0 || !kvd_grow((void **)&leader->taken, &leader->cap_taken, n,
                            sizeof *leader->taken)) {
        return 0;
    }
    memcpy(leader->taken, leader->done_ids, n * sizeof *leader->taken);
    memmove(leader->done_ids, leader->done_ids + n,
            (leader->num_done - n) * sizeof *leader->done_ids);
    leader->num_done -= n;
    for (size_t i = 0; i < n; i++) {
        out[i] = leader->taken[i];
    }
    return n;
}

/* ---- end of a request --------------------------------------------------- */

KVD_API kvd_status_t kvd_leader_request_preempted(kvd_leader_t *leader,
                                                  const char *request_id)
{
    if (leader == NULL || !id_ok(request_id)) {
        return KVD_ERR_INVALID;
    }
    lreq_t *r = req_find(leader, request_id);
    if (r == NULL) {
        return KVD_ERR_NOT_FOUND;
    }
    if (r->finished) {
        return KVD_ERR_STATE;
    }
    req_forget_answer(leader, r);
    r->num_block_ids = 0; /* the engine frees the blocks */
    r->saved_upto = r->save_from;
    r->preempted = true;
    req_touch(leader, r);
    return KVD_OK;
}

KVD_API kvd_status_t kvd_leader_request_finished(kvd_leader_t *leader,
                                                 const char *request_id,
                                                 bool *delay_free_out)
{
    if (leader == NULL || !id_ok(request_id) || delay_free_out == NULL) {
        return KVD_ERR_INVALID;
    }
    lreq_t *r = req_find(leader, request_id);
    if (r == NULL) {
        return KVD_ERR_NOT_FOUND;
    }
    /* Saves planned but never sent are dropped: nobody will run them. */
    r->saved_upto = r->save_from;
    r->finished = true;
    req_end_loads(leader, r);
    bool delay = r->saves_inflight;
    req_maybe_drop(leader, r);
    *delay_free_out = delay;
    return KVD_OK;
}

KVD_API kvd_status_t kvd_leader_request_finished_transfer(
    kvd_leader_t *leader, const char *request_id, bool *delay_free_out,
    kvd_leader_transfer_t *transfer_out)
{
    if (leader == NULL || !id_ok(request_id) || delay_free_out == NULL ||
        transfer_out == NULL) {
        return KVD_ERR_INVALID;
    }
    lreq_t *r = req_find(leader, request_id);
    if (r == NULL) {
        return KVD_ERR_NOT_FOUND;
    }
    /* Full blocks stored or sent to the workers for saving; saves not yet
     * in a plan are dropped by finishing, so they are not handed off. */
    size_t n = r->save_from;
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
