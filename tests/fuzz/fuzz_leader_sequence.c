/*
 * Fuzz target for the leader's call sequences: the input is a program of
 * engine calls (match, allocate, schedule, plan, worker report, preempt,
 * finish, drain, and with chunk reuse on the chunk match) over four
 * requests whose prompts share prefixes, against a scripted store whose
 * contents (content keys too), tiers and readiness the input also
 * chooses. The leader must never crash, every plan it builds must unpack
 * and validate (kvd_proto_step_plan_unpack: the round trip through the
 * protocol) and name only requests and engine blocks the engine gave it,
 * and once every request is finished and the leader destroyed, every lease
 * the store handed out must have come back exactly once.
 *
 * Reports are made from the last plan (finished saves and loads, failed
 * blocks, chosen by the input) and packed with the proto layer, as a
 * worker would. Any byte string is a valid program; seeds in
 * corpus/leader_sequence/ are short hand-written programs.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvdepot/leader.h"
#include "proto/kvd_proto.h"
#include "store/ops.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define BS 4u
#define SLOTS 4u
#define MAX_TOKENS 48u
#define MAX_BLOCKS (MAX_TOKENS / BS + 4u)

/* ---- the scripted store ------------------------------------------------- */

typedef struct fstore {
    kvd_store_t self;     /* first: a store with lookup and release */
    uint32_t stored_mask; /* bit i: block i of the base prompt is stored */
    uint32_t disk_mask;   /* bit i: ... on DISK */
    bool busy;            /* lookups answer KVD_AGAIN */
    unsigned content;     /* 0..4: how often a content key is stored */
    long leases;
    kvd_block_hash_t base[MAX_BLOCKS];
    size_t num_base;
    kvd_block_hash_t first[SLOTS]; /* each prompt's block 0: a prefix lookup */
    size_t num_first;
} fstore_t;

/* True for a prefix lookup (a request's chain starts with its block 0). */
static bool fs_prefix(const fstore_t *f, const kvd_block_hash_t *h)
{
    for (size_t i = 0; i < f->num_first; i++) {
        if (memcmp(h, &f->first[i], sizeof *h) == 0) {
            return true;
        }
    }
    return f->num_base > 0 && memcmp(h, &f->base[0], sizeof *h) == 0;
}

static kvd_status_t fs_lookup(kvd_store_t *ctx, const kvd_namespace_t *ns,
                              const kvd_block_hash_t *hashes, size_t n,
                              const char *source, kvd_store_lease_t *out,
                              size_t *matched)
{
    (void)source;
    fstore_t *f = (fstore_t *)ctx;
    if (f->busy) {
        return KVD_AGAIN;
    }
    size_t m = 0;
    if (!fs_prefix(f, &hashes[0])) {
        /* Not the base prompt's chain: content keys (chunk reuse), stored
         * for some hashes; the lookup stops at the first missing one. */
        for (; m < n && hashes[m].bytes[0] % 4u < f->content; m++) {
            memset(&out[m], 0, sizeof out[m]);
            out[m].key.ns = *ns;
            out[m].key.hash = hashes[m];
            out[m].tier = hashes[m].bytes[1] & 1u ? KVD_STORE_TIER_DISK
                                                  : KVD_STORE_TIER_HOST;
            out[m].size_bytes = 1;
        }
        f->leases += (long)m;
        *matched = m;
        return KVD_OK;
    }
    for (; m < n && m < f->num_base; m++) {
        if (!(f->stored_mask >> m & 1u) ||
            memcmp(&hashes[m], &f->base[m], sizeof hashes[m]) != 0) {
            break;
        }
        memset(&out[m], 0, sizeof out[m]);
        out[m].key.ns = *ns;
        out[m].key.hash = hashes[m];
        out[m].tier = (f->disk_mask >> m & 1u) ? KVD_STORE_TIER_DISK
                                               : KVD_STORE_TIER_HOST;
        out[m].size_bytes = 1;
    }
    f->leases += (long)m;
    *matched = m;
    return KVD_OK;
}

static kvd_status_t fs_release(kvd_store_t *ctx, const kvd_store_lease_t *l,
                               size_t n)
{
    (void)l;
    fstore_t *f = (fstore_t *)ctx;
    f->leases -= (long)n;
    if (f->leases < 0) {
        abort(); /* given back twice */
    }
    return KVD_OK;
}

/* ---- the program -------------------------------------------------------- */

typedef struct prog {
    const uint8_t *p;
    size_t left;
} prog_t;

static unsigned next(prog_t *g)
{
    if (g->left == 0) {
        return 0;
    }
    g->left--;
    return *g->p++;
}

typedef struct slot {
    char id[8];
    uint32_t tok[MAX_TOKENS];
    size_t num_tokens;
    uint32_t blocks[MAX_BLOCKS];
    size_t num_blocks;
    uint64_t matched;
    bool live;
    uint8_t given[1000]; /* engine block ids the leader accepted for it */
} slot_t;

typedef struct world {
    kvd_leader_t *ld;
    fstore_t store;
    slot_t slot[SLOTS];
    kvd_pb_step_plan_t *plan; /* the last one, for reports */
    uint32_t num_workers;
    uint32_t next_block;
} world_t;

static slot_t *slot_by_id(world_t *w, const char *id)
{
    for (unsigned i = 0; i < SLOTS; i++) {
        if (strcmp(w->slot[i].id, id) == 0) {
            return &w->slot[i];
        }
    }
    return NULL;
}

static bool has_block(const slot_t *s, uint32_t b)
{
    return b < sizeof s->given && s->given[b];
}

static void give(slot_t *s, const uint32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        s->given[ids[i] % sizeof s->given] = 1;
    }
}

/* Every plan must survive the protocol's validation and name only what
 * the engine gave the leader. */
static void plan_check(world_t *w, const uint8_t *buf, size_t len)
{
    kvd_pb_step_plan_t *p = NULL;
    char why[256] = "";
    if (kvd_proto_step_plan_unpack(buf, len, &p, why, sizeof why) != KVD_OK) {
        fprintf(stderr, "plan does not validate: %s\n", why);
        abort();
    }
    if (p->block_size != BS) {
        abort();
    }
    for (size_t i = 0; i < p->n_requests; i++) {
        const kvd_pb_step_request_t *q = p->requests[i];
        slot_t *s = slot_by_id(w, q->request_id);
        if (s == NULL) {
            abort();
        }
        for (size_t k = 0; k < q->n_loads; k++) {
            if (!has_block(s, q->loads[k]->block_id)) {
                abort();
            }
        }
        for (size_t k = 0; k < q->n_saves; k++) {
            if (!has_block(s, q->saves[k]->block_id)) {
                abort();
            }
        }
    }
    kvd_proto_step_plan_free(w->plan);
    w->plan = p;
}

/* A worker's report on the last plan: the input picks what finished. */
static void report(world_t *w, prog_t *g)
{
    if (w->plan == NULL) {
        return;
    }
    kvd_pb_worker_report_t r = KVDEPOT__V1__WORKER_REPORT__INIT;
    char *saving[SLOTS], *loading[SLOTS];
    kvd_pb_failed_load_t fl[SLOTS];
    kvd_pb_failed_load_t *flp[SLOTS];
    size_t ns = 0, nl = 0, nf = 0;
    unsigned pick = next(g);
    for (size_t i = 0; i < w->plan->n_requests && i < SLOTS; i++) {
        kvd_pb_step_request_t *q = w->plan->requests[i];
        if (q->n_saves > 0 && (pick >> (i % 8) & 1u)) {
            saving[ns++] = q->request_id;
        }
        if (q->n_loads > 0 && (pick >> ((i + 4) % 8) & 1u)) {
            loading[nl++] = q->request_id;
            if ((next(g) & 3u) == 0) {
                kvd_pb_failed_load_t init = KVDEPOT__V1__FAILED_LOAD__INIT;
                fl[nf] = init;
                fl[nf].request_id = q->request_id;
                fl[nf].block_id = q->loads[q->n_loads - 1]->block_id;
                fl[nf].status = KVD_ERR_CHECKSUM;
                flp[nf] = &fl[nf];
                nf++;
            }
        }
    }
    r.step = w->plan->step;
    r.worker_rank = next(g) % (w->num_workers + 1); /* sometimes invalid */
    r.n_finished_saving = ns;
    r.finished_saving = saving;
    r.n_finished_loading = nl;
    r.finished_loading = loading;
    r.n_failed_loads = nf;
    r.failed_loads = flp;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (kvd_proto_worker_report_pack_alloc(&r, &buf, &len, NULL, 0) != KVD_OK) {
        abort(); /* made from a valid plan: must pack */
    }
    (void)kvd_leader_update_connector_output(w->ld, buf, len);
    free(buf);
}

static void op(world_t *w, prog_t *g)
{
    unsigned code = next(g);
    slot_t *s = &w->slot[(code >> 4) % SLOTS];
    switch ((code & 15u) % 11) {
    case 0: { /* get_num_new_matched_tokens */
        kvd_leader_request_t q = {
            .request_id = s->id, .tokens = s->tok, .num_tokens = s->num_tokens};
        uint64_t computed = (uint64_t)(next(g) % 3) * BS;
        bool async = false;
        uint64_t m = 0;
        kvd_status_t st = kvd_leader_get_num_new_matched_tokens(
            w->ld, &q, computed, &m, &async);
        if (st == KVD_OK) {
            if (m > 0 && computed + m >= s->num_tokens) {
                abort(); /* claimed the last token: the engine computes it */
            }
            s->matched = m;
            s->live = true;
        }
        break;
    }
    case 1: { /* update_state_after_alloc */
        size_t n = (s->num_tokens + BS - 1) / BS;
        s->num_blocks = n;
        for (size_t i = 0; i < n; i++) {
            s->blocks[i] = w->next_block++ % 1000u;
        }
        uint64_t ext = (next(g) & 1u) ? s->matched : 0;
        if (kvd_leader_update_state_after_alloc(w->ld, s->id, s->blocks, n,
                                                ext) == KVD_OK) {
            give(s, s->blocks, n);
        }
        break;
    }
    case 2: { /* request_scheduled: all or part of the prompt computed */
        uint64_t done = next(g) % (s->num_tokens + 1);
        (void)kvd_leader_request_scheduled(w->ld, s->id, NULL, 0, NULL, 0, NULL,
                                           0, done);
        break;
    }
    case 3: { /* decode: one token, maybe one more block */
        if (s->num_tokens < MAX_TOKENS && s->num_blocks < MAX_BLOCKS) {
            uint32_t t = next(g);
            s->tok[s->num_tokens++] = t;
            uint32_t nb = 0;
            size_t nbn = 0;
            if (s->num_tokens > s->num_blocks * BS) {
                nb = w->next_block++ % 1000u;
                s->blocks[s->num_blocks++] = nb;
                nbn = 1;
            }
            if (kvd_leader_request_scheduled(w->ld, s->id, &nb, nbn, &t, 1,
                                             NULL, 0,
                                             s->num_tokens) == KVD_OK) {
                give(s, &nb, nbn);
            }
        }
        break;
    }
    case 4: { /* build_connector_meta */
        uint8_t *buf = NULL;
        size_t len = 0;
        if (kvd_leader_build_connector_meta(w->ld, &buf, &len) == KVD_OK) {
            plan_check(w, buf, len);
            free(buf);
        }
        break;
    }
    case 5: report(w, g); break;
    case 6: (void)kvd_leader_request_preempted(w->ld, s->id); break;
    case 7: {
        bool delay = false;
        if (kvd_leader_request_finished(w->ld, s->id, &delay) == KVD_OK) {
            s->live = false;
        }
        break;
    }
    case 8: {
        uint32_t failed[16];
        const char *done[16];
        (void)kvd_leader_take_failed_blocks(w->ld, failed, 16);
        (void)kvd_leader_take_finished_loads(w->ld, done, 16);
        break;
    }
    case 9: w->store.busy = !w->store.busy; break;
    case 10: { /* chunk reuse's match, in any state */
        uint8_t src[MAX_BLOCKS];
        uint32_t rec[MAX_TOKENS];
        kvd_leader_chunk_match_t m;
        size_t max_blocks = next(g) & 1u ? MAX_BLOCKS : 1;
        (void)kvd_leader_match_chunks(w->ld, s->id, src, max_blocks, rec,
                                      next(g) % (MAX_TOKENS + 1), &m);
        break;
    }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    prog_t g = {data, size};
    world_t w;
    memset(&w, 0, sizeof w);
    unsigned flags = next(&g);
    kvd_leader_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.block_size = BS;
    cfg.num_workers = 1 + (flags & 1u);
    cfg.no_retry = flags & 2u;
    cfg.layerwise = flags & 4u;
    cfg.async_host_loads = flags & 8u;
    w.num_workers = cfg.num_workers;
    if (kvd_block_hash_seed(KVD_BLOCK_HASH_DEFAULT_SEED, &cfg.root) != KVD_OK) {
        abort();
    }
    w.store.stored_mask = next(&g) | next(&g) << 8;
    w.store.disk_mask = next(&g) | next(&g) << 8;

    /* Prompts: slot i shares the base prompt up to a point the input
     * picks, then differs. */
    uint32_t base[MAX_TOKENS];
    for (uint32_t i = 0; i < MAX_TOKENS; i++) {
        base[i] = i * 7u + 1u;
    }
    size_t nb = 0;
    if (kvd_block_hash_chain(&cfg.root, base, MAX_TOKENS, BS, NULL, NULL,
                             w.store.base, MAX_BLOCKS, &nb) != KVD_OK) {
        abort();
    }
    w.store.num_base = nb;
    for (unsigned i = 0; i < SLOTS; i++) {
        slot_t *s = &w.slot[i];
        snprintf(s->id, sizeof s->id, "r%u", i);
        s->num_tokens = 5 + next(&g) % (MAX_TOKENS - 12);
        size_t split = next(&g) % (s->num_tokens + 1);
        for (size_t t = 0; t < s->num_tokens; t++) {
            s->tok[t] = t < split ? base[t] : base[t] + 1000u + i;
        }
        size_t nf = 0;
        if (s->num_tokens >= BS &&
            kvd_block_hash_chain(&cfg.root, s->tok, BS, BS, NULL, NULL,
                                 &w.store.first[w.store.num_first], 1,
                                 &nf) == KVD_OK &&
            nf == 1) {
            w.store.num_first++;
        }
    }

    static const kvd_store_ops_t fs_ops = {
        .name = "scripted", .lookup = fs_lookup, .release = fs_release};
    w.store.self.ops = &fs_ops;
    if (kvd_leader_create(&cfg, &w.store.self, &w.ld) != KVD_OK) {
        abort();
    }
    if (flags & 16u) {
        kvd_leader_chunk_config_t cc = {
            .enabled = true,
            .repair = (kvd_repair_t)(flags >> 5 & 3u) % 3u,
            .boundary_window = 4,
            .recompute_ratio = 0.5,
            .overlap_k = flags >> 7 & 1u ? 8 : 0,
            .sink_tokens = 4};
        if (kvd_leader_set_chunk_reuse(w.ld, &cc) != KVD_OK) {
            abort();
        }
        w.store.content = next(&g) % 5;
    }
    for (int steps = 0; g.left > 0 && steps < 4096; steps++) {
        op(&w, &g);
    }
    for (unsigned i = 0; i < SLOTS; i++) {
        bool delay = false;
        (void)kvd_leader_request_finished(w.ld, w.slot[i].id, &delay);
    }
    kvd_leader_destroy(w.ld);
    kvd_proto_step_plan_free(w.plan);
    if (w.store.leases != 0) {
        fprintf(stderr, "%ld leases left\n", w.store.leases);
        abort();
    }
    return 0;
}
