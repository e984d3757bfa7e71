/*
 * The leader's step plan: every request touched since the last plan gives
 * its loads (key, engine block, tier), its saves (key, engine block) and
 * its preemption, packed as a kvdepot.v1.StepPlan for the workers. The
 * per-step state moves on only once the plan is packed, so a failed pack
 * leaves everything for the next try.
 */
#include <stdlib.h>
#include <string.h>

#include "common/log_int.h"
#include "leader/leader_int.h"
#include "proto/kvd_proto.h"

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

/* Sizes and allocates the plan's arrays for every touched request (one
 * spare entry each, so that no calloc asks for 0 bytes). False, with
 * nothing allocated, when out of memory. */
static bool plan_mem_alloc(kvd_leader_t *ld, plan_mem_t *m)
{
    size_t nreq = 0, nload = 0, nsave = 0, npre = 0;
    for (lreq_t *r = ld->touched; r != NULL; r = r->next_touched) {
        size_t l = r->plan_loads ? r->load_blocks + r->chunk_hits : 0;
        size_t s = r->saved_upto - r->save_from;
        nreq += l > 0 || s > 0;
        nload += l;
        nsave += s;
        npre += r->preempted;
    }
    m->reqs = calloc(nreq + 1, sizeof *m->reqs);
    m->req_ptrs = calloc(nreq + 1, sizeof *m->req_ptrs);
    m->loads = calloc(nload + 1, sizeof *m->loads);
    m->load_ptrs = calloc(nload + 1, sizeof *m->load_ptrs);
    m->saves = calloc(nsave + 1, sizeof *m->saves);
    m->save_ptrs = calloc(nsave + 1, sizeof *m->save_ptrs);
    /* A save may carry a content key too. */
    m->keys = calloc(nload + 2 * nsave + 1, sizeof *m->keys);
    m->sources = calloc(nload + 1, sizeof *m->sources);
    m->preempted = calloc(npre + 1, sizeof *m->preempted);
    if (m->reqs == NULL || m->req_ptrs == NULL || m->loads == NULL ||
        m->load_ptrs == NULL || m->saves == NULL || m->save_ptrs == NULL ||
        m->keys == NULL || m->sources == NULL || m->preempted == NULL) {
        plan_mem_free(m);
        return false;
    }
    return true;
}

/* The plan of this step is packed: now the step state moves on. Loads and
 * saves it carried are in flight, and the touched list starts over. */
static void plan_commit(kvd_leader_t *ld, uint64_t step)
{
    ld->step = step;
    for (lreq_t *r = ld->touched, *next; r != NULL; r = next) {
        next = r->next_touched;
        if (r->plan_loads && (r->load_blocks > 0 || r->chunk_hits > 0)) {
            r->loads_inflight = true;
            r->load_step = step;
            r->load_reports = 0;
            ld->st.planned_loads += r->load_copies;
        }
        r->plan_loads = false;
        if (r->saved_upto > r->save_from && r->save_copies > 0) {
            if (!r->saves_inflight) {
                r->saved_event_from = r->save_from;
            }
            r->saved_event_upto = r->saved_upto;
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
}

/* Appends the request's content loads (kvd_leader_match_chunks) at the
 * plan's load index *li; returns how many. */
static size_t plan_content_loads(kvd_leader_t *ld, lreq_t *r, plan_mem_t *m,
                                 size_t *li, size_t *ki)
{
    size_t n = 0;
    for (size_t b = 0; b < r->chunk_cap; b++) {
        const kvd_store_lease_t *lease = &r->chunk_leases[b];
        if (lease->tier == KVD_STORE_TIER_NONE ||
            r->block_ids[b] == KVD_LEADER_NO_BLOCK) {
            continue;
        }
        kvd_pb_block_load_t li_init = KVDEPOT__V1__BLOCK_LOAD__INIT;
        kvd_pb_block_source_t src_init = KVDEPOT__V1__BLOCK_SOURCE__INIT;
        kvd_pb_block_load_t *bl = &m->loads[*li];
        *bl = li_init;
        m->load_ptrs[*li] = bl;
        bl->block_id = r->block_ids[b];
        plan_key(ld, &m->keys[*ki], &r->content[b]);
        bl->key = &m->keys[(*ki)++];
        bl->position = (uint64_t)b * ld->cfg.block_size;
        bl->content = true;
        m->sources[*li] = src_init;
        m->sources[*li].tier = lease->tier == KVD_STORE_TIER_DISK
                                   ? KVDEPOT__V1__TIER__TIER_DISK
                                   : KVDEPOT__V1__TIER__TIER_HOST;
        bl->source = &m->sources[*li];
        (*li)++;
        n++;
    }
    return n;
}

/* True when an earlier save of this plan's request (saves [first, end))
 * already carries content key `h`: a reservation names each key once. */
static bool plan_content_dup(const plan_mem_t *m, size_t first, size_t end,
                             const kvd_block_hash_t *h)
{
    for (size_t i = first; i < end; i++) {
        const kvd_pb_block_save_t *sv = m->save_ptrs[i];
        const kvd_pb_object_key_t *k =
            sv->content_key != NULL ? sv->content_key : sv->key;
        if (memcmp(k->block_hash.data, h->bytes, KVD_SHA256_BYTES) == 0) {
            return true;
        }
    }
    return false;
}

/* Appends the request's saves [save_from, saved_upto) at *si: under the
 * prefix key, with the content key as a second copy when chunk reuse is on;
 * from chunk_from on, the blocks the engine computed under their content
 * keys only (chunk.c says why). Returns how many. */
static size_t plan_saves(kvd_leader_t *ld, lreq_t *r, plan_mem_t *m, size_t *si,
                         size_t *ki)
{
    size_t first = *si, n = 0;
    for (size_t blk = r->save_from; blk < r->saved_upto; blk++) {
        if (r->block_ids[blk] == KVD_LEADER_NO_BLOCK) {
            continue; /* the engine dropped it: nothing to save */
        }
        bool content = r->chunk_on && blk < r->num_content &&
                       r->has_content[blk] &&
                       !plan_content_dup(m, first, *si, &r->content[blk]);
        bool tainted = blk >= r->chunk_from;
        if (tainted && (!content || r->has_content[blk] == CHUNK_LOADED)) {
            continue; /* loaded by content, or nothing exact to key it */
        }
        kvd_pb_block_save_t sv_init = KVDEPOT__V1__BLOCK_SAVE__INIT;
        kvd_pb_block_save_t *sv = &m->saves[*si];
        *sv = sv_init;
        m->save_ptrs[(*si)++] = sv;
        sv->block_id = r->block_ids[blk];
        sv->position = (uint64_t)blk * ld->cfg.block_size;
        plan_key(ld, &m->keys[*ki],
                 tainted ? &r->content[blk] : &r->hashes[blk]);
        sv->key = &m->keys[(*ki)++];
        if (content && !tainted) {
            plan_key(ld, &m->keys[*ki], &r->content[blk]);
            sv->content_key = &m->keys[(*ki)++];
        }
        n++;
    }
    return n;
}

KVD_API kvd_status_t kvd_leader_build_connector_meta(kvd_leader_t *leader,
                                                     uint8_t **plan_out,
                                                     size_t *len_out)
{
    if (leader == NULL || plan_out == NULL || len_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_leader_t *ld = leader;
    plan_mem_t m = {0};
    if (!plan_mem_alloc(ld, &m)) {
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
        size_t lc = r->plan_loads ? r->chunk_hits : 0;
        size_t s = r->saved_upto - r->save_from;
        if (l == 0 && lc == 0 && s == 0) {
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
        size_t prefix_loads = nl;
        if (lc > 0) {
            nl += plan_content_loads(ld, r, &m, &li, &ki);
        }
        q->n_loads = nl;
        r->load_copies = nl;
        /* A load with nothing to copy is asynchronous, so that the worker
         * reports it (and the leases go) like any other. */
        q->async_load = l + lc > 0 && (r->async || nl == 0);
        /* Tokens of the loads planned: whole blocks, but for the request's
         * last external block, which may be partial. */
        uint64_t bs = ld->cfg.block_size, load_tokens = prefix_loads * bs;
        if (prefix_loads > 0 &&
            r->block_ids[r->first_block + l - 1] != KVD_LEADER_NO_BLOCK) {
            load_tokens =
                (prefix_loads - 1) * bs + (r->load_tokens - (l - 1) * bs);
        }
        /* Content loads are whole blocks outside the prefix: they are not
         * the engine's external tokens. */
        q->num_load_tokens = (uint32_t)load_tokens;
        ns = plan_saves(ld, r, &m, &si, &ki);
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
    plan_commit(ld, step);
    *plan_out = buf;
    *len_out = len;
    return KVD_OK;
}
