/*
 * The demo's engine (demo/engine_int.h): one request through the model
 * with the leader, the worker and the embedded store, as vLLM would drive
 * a KV connector.
 *
 * Every engine step is the same few calls: the leader builds the plan, the
 * worker binds it and starts its loads, the model runs (or not, while the
 * request waits for an asynchronous load) with wait_for_layer_load before
 * and save_kv_layer after each layer, wait_for_save, then the worker's
 * report goes back to the leader. Saves are written through to the NVMe
 * tier, so everything the process computed is on disk when it exits; a new
 * process finds it there, loads it asynchronously, and computes only the
 * rest.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "demo/engine_int.h"
#include "kvdepot/leader.h"
#include "kvdepot/worker.h"
#ifdef KVD_HAVE_CUDA
#include "kvdepot/kernels_cuda.h"
#endif

#define REQ_ID "demo"
#define MAX_STEPS 100000

static const char demo_text[] =
    "An inference engine keeps the attention keys and values of every "
    "token it has seen in a paged cache on the GPU. When memory runs out, "
    "it throws blocks away and computes them again the next time the same "
    "prefix comes back: a long system prompt, a shared document, the "
    "history of a conversation. kvdepot keeps those blocks instead, in "
    "host memory and on NVMe, names them by a hash of their tokens, and "
    "gives them back to any process that asks for the same prefix, so the "
    "engine skips the prefill it has already paid for. ";

void kvd_demo_prompt(uint32_t prompt_tokens, const char *question,
                     uint32_t *tokens_out)
{
    size_t qlen = question != NULL ? strlen(question) : 0;
    if (qlen > prompt_tokens) {
        qlen = prompt_tokens;
    }
    size_t body = prompt_tokens - qlen, tlen = sizeof demo_text - 1;
    for (size_t i = 0; i < body; i++) {
        tokens_out[i] = (unsigned char)demo_text[i % tlen];
    }
    for (size_t i = 0; i < qlen; i++) {
        tokens_out[body + i] = (unsigned char)question[i];
    }
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Proto enum numbers for the namespace (kvdepot.v1 Codec = ours + 1). */
#define PROTO_DTYPE_FP16 1u

typedef struct engine {
    const kvd_demo_opts_t *o;
    kvd_demo_model_t model;
    kvd_demo_cache_t cache;
    kvd_store_t *store;
    kvd_leader_t *leader;
    kvd_worker_t *worker;
    uint32_t *table; /* engine block table: block i of the request */
    uint32_t num_blocks;
    bool cuda;           /* the cache is in GPU memory */
    void **dev;          /* CUDA: per layer, the cache in GPU memory */
    kvd_status_t dev_st; /* CUDA: the first failed copy of a step */
    /* Chunk reuse (opts.chunks): the leader's answer per prompt block
     * (kvd_chunk_source_t), the selective repair's positions, the
     * CacheBlend budget, and the request blocks whose load failed. */
    uint8_t *src;
    uint32_t *repair;
    kvd_leader_chunk_match_t chunk;
    uint8_t *failed_mask;
    char *err;
    size_t err_len;
} engine_t;

/* ---- the cache on the GPU ----------------------------------------------- */

/* Resolves opts.device; with CUDA, the cache's layers get GPU twins
 * (zeroed, as the host cache is) that the worker loads into and saves
 * from. */
static kvd_status_t device_open(engine_t *e)
{
    if (e->o->device == KVD_DEMO_DEVICE_HOST) {
        return KVD_OK;
    }
#ifdef KVD_HAVE_CUDA
    int count = 0;
    if (kvd_cuda_device_count(&count) == KVD_OK && count > 0) {
        uint32_t L = e->cache.num_layers;
        e->dev = calloc(L, sizeof *e->dev);
        kvd_status_t st = e->dev == NULL ? KVD_ERR_NOMEM : KVD_OK;
        for (uint32_t l = 0; st == KVD_OK && l < L; l++) {
            st = kvd_cuda_mem_create(e->cache.layer_bytes, &e->dev[l]);
            if (st == KVD_OK) {
                st = kvd_cuda_mem_set(e->dev[l], 0, e->cache.layer_bytes);
            }
        }
        if (st != KVD_OK) {
            snprintf(e->err, e->err_len, "KV cache in GPU memory: %s",
                     kvd_status_str(st));
        }
        e->cuda = true;
        return st;
    }
#endif
    if (e->o->device == KVD_DEMO_DEVICE_CUDA) {
        snprintf(e->err, e->err_len,
                 "--device cuda: no CUDA device (or a build without CUDA)");
        return KVD_ERR_NO_DEVICE;
    }
    return KVD_OK;
}

static void device_close(engine_t *e)
{
#ifdef KVD_HAVE_CUDA
    for (uint32_t l = 0; e->dev != NULL && l < e->cache.num_layers; l++) {
        kvd_cuda_mem_destroy(e->dev[l]);
    }
#endif
    free(e->dev);
    e->dev = NULL;
}

/* Copies layer `l` of the cache between GPU memory and the host copy the
 * model computes on (to_host: after the layer's loads; else after the
 * layer, before its save). The copies are ordered after the work on the
 * default stream, where the worker made the layer's load visible. */
static void device_layer(engine_t *e, uint32_t l, bool to_host)
{
#ifdef KVD_HAVE_CUDA
    if (!e->cuda || e->dev_st != KVD_OK) {
        return;
    }
    void *host = e->cache.layer[l];
    e->dev_st = to_host
                    ? kvd_cuda_mem_copy(host, e->dev[l], e->cache.layer_bytes)
                    : kvd_cuda_mem_copy(e->dev[l], host, e->cache.layer_bytes);
#else
    (void)e;
    (void)l;
    (void)to_host;
#endif
}

/* ---- set-up ------------------------------------------------------------- */

static kvd_status_t open_store(engine_t *e)
{
    kvd_config_t *cfg = NULL;
    kvd_status_t st = kvd_config_create(&cfg);
    if (st == KVD_OK && e->o->store_address != NULL) {
        /* The daemon's own config sets the tiers and sizes. */
        st = kvd_config_set(cfg, "store.mode", "daemon");
        if (st == KVD_OK) {
            st = kvd_config_set(cfg, "store.address", e->o->store_address);
        }
        if (st == KVD_OK) {
            st = kvd_store_open(cfg, &e->store, e->err, e->err_len);
        }
        kvd_config_destroy(cfg);
        return st;
    }
    static const char *const kv[] = {
        "store.arena_size",     "64m",     "store.arena_chunk",    "1m",
        "store.arena_prefault", "false",   "store.disk_size",      "256m",
        "store.disk_write",     "through", "store.disk_admission", "all",
        "store.sync_interval",  "0"};
    for (size_t i = 0; st == KVD_OK && i < sizeof kv / sizeof *kv; i += 2) {
        st = kvd_config_set(cfg, kv[i], kv[i + 1]);
    }
    if (st == KVD_OK) {
        st = kvd_config_set(cfg, "store.disk_path", e->o->store_dir);
    }
    if (st == KVD_OK) {
        st = kvd_store_open(cfg, &e->store, e->err, e->err_len);
    }
    kvd_config_destroy(cfg);
    return st;
}

kvd_status_t kvd_demo_namespace(const kvd_demo_opts_t *o,
                                const kvd_demo_model_t *m, kvd_namespace_t *ns)
{
    const kvd_demo_config_t *c = &m->cfg;
    char model_id[200];
    snprintf(model_id, sizeof model_id,
             "kvdepot-demo/%s/d%u-h%u-kv%u-f%u-l%u-v%u-seed%llu",
             o->checkpoint != NULL ? o->checkpoint : "seeded", c->dim,
             c->num_heads, c->num_kv_heads, c->hidden_dim, c->num_layers,
             c->vocab_size, (unsigned long long)o->seed);
    kvd_namespace_desc_t d = {0};
    d.model_id = model_id;
    d.dtype = PROTO_DTYPE_FP16;
    d.k_codec = d.v_codec = (uint32_t)o->codec + 1u;
    d.num_layers = c->num_layers;
    d.num_kv_heads = d.total_kv_heads = c->num_kv_heads;
    d.head_dim = m->head_dim;
    d.block_size = KVD_DEMO_BLOCK_SIZE;
    d.tp_size = 1;
    return kvd_namespace_digest(&d, ns);
}

/* Chunk reuse on: content keys on every save, the repair the request
 * asks for, and the model's rotary embedding (pairs (2i, 2i + 1), all of
 * head_dim) for the worker's rotation of reused keys. */
static kvd_status_t chunks_setup(engine_t *e)
{
    static const kvd_repair_t repairs[] = {
        [KVD_DEMO_REUSE_PREFIX] = KVD_REPAIR_NONE,
        [KVD_DEMO_REUSE_CHUNKS] = KVD_REPAIR_NONE,
        [KVD_DEMO_REUSE_SELECTIVE] = KVD_REPAIR_SELECTIVE,
        [KVD_DEMO_REUSE_CACHEBLEND] = KVD_REPAIR_CACHEBLEND};
    kvd_leader_chunk_config_t cc = {.enabled = true,
                                    .repair = repairs[e->o->reuse],
                                    .boundary_window = KVD_DEMO_BLOCK_SIZE,
                                    .recompute_ratio = 0.15};
    kvd_rope_t rope = {.head_dim = e->model.head_dim,
                       .rotary_dim = e->model.head_dim,
                       .style = KVD_ROPE_GPTJ,
                       .base = e->model.cfg.rope_theta,
                       .scaling = KVD_ROPE_SCALING_NONE};
    kvd_status_t st = kvd_leader_set_chunk_reuse(e->leader, &cc);
    if (st == KVD_OK) {
        st = kvd_worker_set_rope(e->worker, &rope);
    }
    if (st != KVD_OK) {
        snprintf(e->err, e->err_len, "chunk reuse: %s", kvd_status_str(st));
    }
    return st;
}

static kvd_status_t open_connector(engine_t *e)
{
    const kvd_demo_config_t *c = &e->model.cfg;
    kvd_namespace_t ns;
    kvd_status_t st = kvd_demo_namespace(e->o, &e->model, &ns);
    if (st != KVD_OK) {
        snprintf(e->err, e->err_len, "namespace: %s", kvd_status_str(st));
        return st;
    }

    kvd_leader_config_t lc = {0};
    lc.block_size = KVD_DEMO_BLOCK_SIZE;
    lc.ns = ns;
    lc.num_workers = 1;
    lc.layerwise = true;
    st = kvd_block_hash_seed(KVD_BLOCK_HASH_DEFAULT_SEED, &lc.root);
    if (st == KVD_OK) {
        st = kvd_leader_create(&lc, e->store, &e->leader);
    }
    if (st == KVD_OK && e->o->gate != NULL) {
        st = kvd_leader_set_gate(e->leader, e->o->gate);
    }
    if (st != KVD_OK) {
        snprintf(e->err, e->err_len, "leader: %s", kvd_status_str(st));
        return st;
    }

    kvd_worker_config_t wc = {0};
    wc.store = e->store;
    wc.ns = ns;
    wc.device = e->cuda ? KVD_WORKER_DEVICE_CUDA : KVD_WORKER_DEVICE_HOST;
    wc.format = (kvd_object_format_t){KVD_DTYPE_FP16,
                                      c->num_layers,
                                      2,
                                      c->num_kv_heads,
                                      e->model.head_dim,
                                      KVD_DEMO_BLOCK_SIZE,
                                      {e->o->codec, e->o->codec},
                                      0x6b76646570u};
    /* The demo saves after every layer: a step that stops early commits
     * nothing (worker.h, layerwise_saves). */
    wc.layerwise_saves = true;
    st = kvd_worker_create(&wc, &e->worker, e->err, e->err_len);
    if (st == KVD_OK && e->o->chunks) {
        st = chunks_setup(e);
    }
    if (st != KVD_OK) {
        return st;
    }
    int64_t el = 2, kvd = (int64_t)c->num_kv_heads * e->model.head_dim;
    void *const *bases =
        e->cuda ? (void *const *)e->dev : (void *const *)e->cache.layer;
    kvd_kv_layout_t lo = {bases,
                          e->cache.num_blocks,
                          (int64_t)e->cache.num_blocks * KVD_DEMO_BLOCK_SIZE *
                              kvd * el,
                          (int64_t)KVD_DEMO_BLOCK_SIZE * kvd * el,
                          kvd * el,
                          (int64_t)e->model.head_dim * el};
    return kvd_worker_register_kv_caches(e->worker, &lo, e->err, e->err_len);
}

static void engine_close(engine_t *e)
{
    kvd_worker_destroy(e->worker);
    device_close(e);
    kvd_leader_destroy(e->leader);
    if (e->store != NULL) {
        (void)kvd_store_flush(e->store, 10000);
        kvd_store_close(e->store);
    }
    kvd_demo_cache_free(&e->cache);
    kvd_demo_model_free(&e->model);
    free(e->table);
    free(e->src);
    free(e->repair);
    free(e->failed_mask);
}

/* ---- one engine step ---------------------------------------------------- */

typedef struct step_forward {
    const uint32_t *tokens;
    const uint32_t *pos; /* NULL: pos0, pos0 + 1, ... */
    size_t n;
    uint32_t pos0;
    const kvd_demo_blend_t *blend;
    uint32_t next;
    float *logits; /* or NULL */
} step_forward_t;

/* The model over the step's tokens (positions from pos0 unless given). */
static kvd_status_t step_model(engine_t *e, step_forward_t *fw,
                               const kvd_demo_hooks_t *hooks)
{
    if (fw->pos == NULL && fw->logits == NULL) {
        return kvd_demo_forward(&e->model, &e->cache, e->table, fw->tokens,
                                fw->n, fw->pos0, hooks, &fw->next);
    }
    uint32_t *own = NULL;
    const uint32_t *pos = fw->pos;
    if (pos == NULL) {
        own = malloc(fw->n * sizeof *own);
        if (own == NULL) {
            return KVD_ERR_NOMEM;
        }
        for (size_t t = 0; t < fw->n; t++) {
            own[t] = fw->pos0 + (uint32_t)t;
        }
        pos = own;
    }
    kvd_status_t st =
        kvd_demo_forward_at(&e->model, &e->cache, e->table, fw->tokens, pos,
                            fw->n, fw->blend, hooks, &fw->next, fw->logits);
    free(own);
    return st;
}

static void hook_before(void *ctx, uint32_t layer)
{
    engine_t *e = ctx;
    (void)kvd_worker_wait_for_layer_load(e->worker, layer, NULL);
    device_layer(e, layer, true);
}

static void hook_after(void *ctx, uint32_t layer)
{
    engine_t *e = ctx;
    device_layer(e, layer, false);
    (void)kvd_worker_save_kv_layer(e->worker, layer, NULL);
}

/* Plan, worker, model (when `fw` is not NULL), report. The block ids whose
 * load failed this step are added to *failed_min (lowest request block
 * index). */
static kvd_status_t engine_step(engine_t *e, step_forward_t *fw,
                                uint32_t *failed_min)
{
    uint8_t *plan = NULL;
    size_t len = 0;
    kvd_status_t st = kvd_leader_build_connector_meta(e->leader, &plan, &len);
    if (st == KVD_OK) {
        st = kvd_worker_bind_metadata(e->worker, plan, len, e->err, e->err_len);
    }
    free(plan);
    if (st != KVD_OK) {
        return st;
    }
    (void)kvd_worker_start_load_kv(e->worker, NULL);
    if (fw != NULL) {
        kvd_demo_hooks_t hooks = {e, hook_before, hook_after};
        st = step_model(e, fw, &hooks);
        if (st == KVD_OK && e->dev_st != KVD_OK) {
            snprintf(e->err, e->err_len, "KV cache copy to or from the GPU: %s",
                     kvd_status_str(e->dev_st));
            st = e->dev_st;
        }
    }
    (void)kvd_worker_wait_for_save(e->worker, NULL);
    kvd_worker_finished_t f;
    kvd_status_t rs = kvd_worker_get_finished(e->worker, NULL, 0, &f);
    if (rs == KVD_OK) {
        rs = kvd_leader_update_connector_output(e->leader, f.report,
                                                f.report_len);
    }
    (void)kvd_worker_clear_metadata(e->worker);
    uint32_t ids[64];
    size_t n;
    while ((n = kvd_leader_take_failed_blocks(e->leader, ids, 64)) > 0) {
        for (size_t i = 0; i < n; i++) {
            for (uint32_t b = 0; b < e->num_blocks; b++) {
                if (e->table[b] == ids[i] && b < *failed_min) {
                    *failed_min = b;
                }
                if (e->table[b] == ids[i] && e->failed_mask != NULL) {
                    e->failed_mask[b] = 1;
                }
            }
        }
    }
    if (st == KVD_OK && rs != KVD_OK) {
        snprintf(e->err, e->err_len, "report: %s", kvd_status_str(rs));
        st = rs;
    }
    return st;
}

/* ---- the request -------------------------------------------------------- */

/* The content matches after the prefix (docs/chunk-reuse.md). */
static kvd_status_t match_chunks(engine_t *e, uint32_t n,
                                 uint32_t prompt_blocks, bool *async)
{
    e->src = calloc(prompt_blocks + 1, 1);
    e->repair = calloc(n + 1, sizeof *e->repair);
    e->failed_mask = calloc(e->num_blocks + 1, 1);
    if (e->src == NULL || e->repair == NULL || e->failed_mask == NULL) {
        return KVD_ERR_NOMEM;
    }
    kvd_status_t st = kvd_leader_match_chunks(
        e->leader, REQ_ID, e->src, prompt_blocks, e->repair, n, &e->chunk);
    if (st != KVD_OK) {
        snprintf(e->err, e->err_len, "chunk match: %s", kvd_status_str(st));
        return st;
    }
    *async = e->chunk.async;
    return KVD_OK;
}

/* Matches the prompt and brings what is stored into the cache; returns the
 * number of prompt tokens the cache now holds. */
static kvd_status_t admit(engine_t *e, const uint32_t *prompt, uint32_t n,
                          kvd_demo_result_t *r, uint32_t *have_out)
{
    kvd_leader_request_t q = {
        .request_id = REQ_ID, .tokens = prompt, .num_tokens = n};
    uint64_t m = 0;
    bool async = false;
    kvd_status_t st = KVD_AGAIN;
    for (int i = 0; i < MAX_STEPS && st == KVD_AGAIN; i++) {
        st =
            kvd_leader_get_num_new_matched_tokens(e->leader, &q, 0, &m, &async);
    }
    if (st != KVD_OK) {
        snprintf(e->err, e->err_len, "match: %s", kvd_status_str(st));
        return st;
    }
    r->matched_tokens = (uint32_t)m;
    uint32_t prompt_blocks =
        (n + KVD_DEMO_BLOCK_SIZE - 1) / KVD_DEMO_BLOCK_SIZE;
    if (e->o->chunks && e->o->reuse != KVD_DEMO_REUSE_PREFIX) {
        st = match_chunks(e, n, prompt_blocks, &async);
        if (st != KVD_OK) {
            return st;
        }
    }
    st = kvd_leader_update_state_after_alloc(e->leader, REQ_ID, e->table,
                                             prompt_blocks, m);
    if (st != KVD_OK) {
        snprintf(e->err, e->err_len, "alloc: %s", kvd_status_str(st));
        return st;
    }
    uint32_t failed = UINT32_MAX;
    if (!async && e->src != NULL && e->chunk.reused_tokens > 0) {
        /* Content loads land before the forward pass, so that one that
         * failed is computed rather than used. */
        st = engine_step(e, NULL, &failed);
    }
    if (async) {
        /* The request waits while the worker brings its blocks from NVMe;
         * the engine keeps stepping (other requests would run here). */
        const char *done[1];
        bool loaded = false;
        for (int i = 0; i < MAX_STEPS && !loaded && st == KVD_OK; i++) {
            st = engine_step(e, NULL, &failed);
            loaded = kvd_leader_take_finished_loads(e->leader, done, 1) == 1;
            if (!loaded) {
                struct timespec nap = {0, 200000};
                nanosleep(&nap, NULL);
            }
        }
        if (st == KVD_OK && !loaded) {
            snprintf(e->err, e->err_len, "the load never finished");
            st = KVD_ERR_TIMEOUT;
        }
    }
    uint32_t have = (uint32_t)m;
    if (failed != UINT32_MAX && failed * KVD_DEMO_BLOCK_SIZE < have) {
        r->failed_blocks = have / KVD_DEMO_BLOCK_SIZE - failed;
        have = failed * KVD_DEMO_BLOCK_SIZE;
    }
    *have_out = have;
    return st;
}

/* With content matches: the positions from `have` on that the forward
 * pass computes (and, for CacheBlend, the reused ones it may keep), and
 * the counts of the result. */
typedef struct chunk_plan {
    uint32_t *pos, *tok;
    size_t n;
    uint8_t *reused; /* per position */
    kvd_demo_blend_t blend;
} chunk_plan_t;

static kvd_status_t chunk_plan(engine_t *e, const uint32_t *prompt, uint32_t n,
                               uint32_t have, kvd_demo_result_t *r,
                               chunk_plan_t *cp)
{
    cp->pos = calloc(n + 1, sizeof *cp->pos);
    cp->tok = calloc(n + 1, sizeof *cp->tok);
    cp->reused = calloc(n + 1, 1);
    if (cp->pos == NULL || cp->tok == NULL || cp->reused == NULL) {
        return KVD_ERR_NOMEM;
    }
    kvd_demo_reuse_t mode = e->o->reuse;
    size_t ri = 0;
    for (uint32_t p = have; p < n; p++) {
        uint32_t b = p / KVD_DEMO_BLOCK_SIZE;
        bool reused = b < e->chunk.num_blocks &&
                      e->src[b] == KVD_CHUNK_CONTENT && !e->failed_mask[b];
        while (ri < e->chunk.num_recompute && e->repair[ri] < p) {
            ri++;
        }
        bool repair = mode == KVD_DEMO_REUSE_SELECTIVE && reused &&
                      ri < e->chunk.num_recompute && e->repair[ri] == p;
        cp->reused[p] = reused;
        r->reused_tokens += reused;
        r->recomputed_tokens += repair;
        r->computed_tokens += !reused;
        if (!reused || repair || mode == KVD_DEMO_REUSE_CACHEBLEND) {
            cp->pos[cp->n] = p;
            cp->tok[cp->n++] = prompt[p];
        }
    }
    if (mode == KVD_DEMO_REUSE_CACHEBLEND) {
        uint64_t budget = e->chunk.recompute_budget;
        cp->blend.reused = cp->reused;
        cp->blend.check_layer = e->model.cfg.num_layers > 1 ? 1 : 0;
        cp->blend.budget =
            (uint32_t)(budget < r->reused_tokens ? budget : r->reused_tokens);
        r->recomputed_tokens = cp->blend.budget;
    }
    return KVD_OK;
}

/* Prefill with content matches: one forward pass over the planned
 * positions (their loads landed before it). */
static kvd_status_t prefill_chunks(engine_t *e, const uint32_t *prompt,
                                   uint32_t n, uint32_t have,
                                   kvd_demo_result_t *r, uint32_t *first_out,
                                   float *logits)
{
    chunk_plan_t cp = {0};
    kvd_status_t st = chunk_plan(e, prompt, n, have, r, &cp);
    if (st == KVD_OK) {
        st = kvd_leader_request_scheduled(e->leader, REQ_ID, NULL, 0, NULL, 0,
                                          NULL, 0, n);
    }
    if (st == KVD_OK) {
        uint32_t failed = UINT32_MAX;
        step_forward_t fw = {cp.tok, cp.pos, cp.n, 0, NULL, 0, logits};
        if (e->o->reuse == KVD_DEMO_REUSE_CACHEBLEND) {
            fw.blend = &cp.blend;
        }
        st = engine_step(e, &fw, &failed);
        *first_out = fw.next;
    }
    free(cp.pos);
    free(cp.tok);
    free(cp.reused);
    return st;
}

/* Prefills prompt[have..n) (synchronous loads, if any, arrive in the same
 * step); computes again from a block whose load failed. */
static kvd_status_t prefill(engine_t *e, const uint32_t *prompt, uint32_t n,
                            uint32_t have, kvd_demo_result_t *r,
                            uint32_t *first_out, float *logits)
{
    if (e->src != NULL) {
        return prefill_chunks(e, prompt, n, have, r, first_out, logits);
    }
    kvd_status_t st = kvd_leader_request_scheduled(e->leader, REQ_ID, NULL, 0,
                                                   NULL, 0, NULL, 0, n);
    for (int round = 0; st == KVD_OK && round < 2; round++) {
        uint32_t failed = UINT32_MAX;
        step_forward_t fw = {prompt + have, NULL, n - have, have,
                             NULL,          0,    logits};
        st = engine_step(e, &fw, &failed);
        r->computed_tokens += n - have;
        *first_out = fw.next;
        if (failed == UINT32_MAX || failed * KVD_DEMO_BLOCK_SIZE >= have) {
            return st;
        }
        /* A synchronous load failed under the forward pass: what came
         * after it is wrong, compute from the failed block on. */
        r->failed_blocks += have / KVD_DEMO_BLOCK_SIZE - failed;
        have = failed * KVD_DEMO_BLOCK_SIZE;
    }
    return st;
}

/* Log-softmax of step `i`'s logits into the result (first steps only). */
static void keep_logp(const engine_t *e, kvd_demo_result_t *r, uint32_t i,
                      const float *logits)
{
    uint32_t v = e->model.cfg.vocab_size;
    if (i >= KVD_DEMO_LOGP_STEPS || v > KVD_DEMO_LOGP_VOCAB) {
        return;
    }
    double mx = logits[0], sum = 0;
    for (uint32_t k = 1; k < v; k++) {
        mx = logits[k] > mx ? logits[k] : mx;
    }
    for (uint32_t k = 0; k < v; k++) {
        sum += exp(logits[k] - mx);
    }
    double lse = mx + log(sum);
    for (uint32_t k = 0; k < v; k++) {
        r->logp[i][k] = (float)(logits[k] - lse);
    }
}

/* Mean KL(reference || this run) over the kept steps. */
static double mean_kl(const engine_t *e, const kvd_demo_result_t *r)
{
    uint32_t v = e->model.cfg.vocab_size, steps = r->num_tokens;
    steps = steps < KVD_DEMO_LOGP_STEPS ? steps : KVD_DEMO_LOGP_STEPS;
    if (e->o->ref_logp == NULL || v > KVD_DEMO_LOGP_VOCAB || steps == 0) {
        return 0;
    }
    double total = 0;
    for (uint32_t i = 0; i < steps; i++) {
        const float *ref = e->o->ref_logp + (size_t)i * KVD_DEMO_LOGP_VOCAB;
        for (uint32_t k = 0; k < v; k++) {
            total += exp(ref[k]) * ((double)ref[k] - r->logp[i][k]);
        }
    }
    return total / steps;
}

static kvd_status_t decode(engine_t *e, uint32_t n, uint32_t first,
                           kvd_demo_result_t *r)
{
    uint32_t tok = first;
    r->tokens[0] = first;
    r->num_tokens = 1;
    kvd_status_t st = KVD_OK;
    float *logits = malloc(e->model.cfg.vocab_size * sizeof *logits);
    if (logits == NULL) {
        return KVD_ERR_NOMEM;
    }
    for (uint32_t i = 1; i < e->o->gen_tokens && st == KVD_OK; i++) {
        if (e->o->force != NULL) {
            tok = e->o->force[i - 1]; /* teacher forcing */
        }
        uint32_t pos = n + i - 1; /* where `tok` goes */
        uint32_t blk = pos / KVD_DEMO_BLOCK_SIZE, new_block = 0;
        size_t num_new = 0;
        if (pos % KVD_DEMO_BLOCK_SIZE == 0) {
            new_block = e->table[blk];
            num_new = 1;
        }
        st = kvd_leader_request_scheduled(e->leader, REQ_ID, &new_block,
                                          num_new, &tok, 1, NULL, 0, pos + 1);
        uint32_t failed = UINT32_MAX;
        step_forward_t fw = {&tok, NULL, 1, pos, NULL, 0, logits};
        if (st == KVD_OK) {
            st = engine_step(e, &fw, &failed);
        }
        keep_logp(e, r, i, logits);
        tok = fw.next;
        r->tokens[r->num_tokens++] = tok;
    }
    free(logits);
    r->kl_mean = mean_kl(e, r);
    return st;
}

kvd_status_t kvd_demo_run(const kvd_demo_opts_t *o, kvd_demo_result_t *r,
                          char *err, size_t err_len)
{
    memset(r, 0, sizeof *r);
    if (o->gen_tokens == 0 || o->gen_tokens > KVD_DEMO_MAX_GEN ||
        o->prompt_tokens < 2) {
        snprintf(err, err_len, "gen_tokens 1..%u, prompt_tokens >= 2",
                 KVD_DEMO_MAX_GEN);
        return KVD_ERR_INVALID;
    }
    engine_t e = {0};
    e.o = o;
    e.err = err;
    e.err_len = err_len;
    kvd_status_t st =
        o->checkpoint != NULL
            ? kvd_demo_model_load(o->checkpoint, &e.model, err, err_len)
            : kvd_demo_model_init(&o->model, o->seed, &e.model);
    if (st != KVD_OK && o->checkpoint == NULL) {
        snprintf(err, err_len,
                 "model sizes: dim %u, %u heads, %u kv heads, hidden %u, "
                 "%u layers (heads must divide dim, kv heads divide heads, "
                 "head_dim even)",
                 o->model.dim, o->model.num_heads, o->model.num_kv_heads,
                 o->model.hidden_dim, o->model.num_layers);
    }
    uint32_t n = o->prompt_tokens;
    if (st == KVD_OK && (size_t)n + o->gen_tokens > e.model.cfg.max_seq) {
        snprintf(err, err_len, "prompt + generation exceed max_seq %u",
                 e.model.cfg.max_seq);
        st = KVD_ERR_RANGE;
    }
    e.num_blocks =
        (n + o->gen_tokens + KVD_DEMO_BLOCK_SIZE - 1) / KVD_DEMO_BLOCK_SIZE;
    uint32_t *prompt = calloc(n, sizeof *prompt);
    e.table = calloc(e.num_blocks, sizeof *e.table);
    if (st == KVD_OK && (prompt == NULL || e.table == NULL)) {
        st = KVD_ERR_NOMEM;
    }
    if (st == KVD_OK) {
        /* Blocks in a scattered order, as an engine's free list gives. */
        for (uint32_t i = 0; i < e.num_blocks; i++) {
            e.table[i] = (i * 7u + 3u) % e.num_blocks;
        }
        if (e.num_blocks % 7u == 0) {
            for (uint32_t i = 0; i < e.num_blocks; i++) {
                e.table[i] = e.num_blocks - 1 - i;
            }
        }
        if (o->prompt != NULL) {
            memcpy(prompt, o->prompt, (size_t)n * sizeof *prompt);
        } else {
            kvd_demo_prompt(n, o->question, prompt);
        }
        st = kvd_demo_cache_init(&e.model, e.num_blocks, KVD_DEMO_BLOCK_SIZE,
                                 &e.cache);
    }
    if (st == KVD_OK) {
        st = device_open(&e);
    }
    r->on_cuda = e.cuda;
    if (st == KVD_OK) {
        st = open_store(&e);
    }
    if (st == KVD_OK) {
        st = open_connector(&e);
    }
    double t0 = now_ms();
    uint32_t have = 0, first = 0;
    if (st == KVD_OK) {
        st = admit(&e, prompt, n, r, &have);
    }
    float *logits = calloc(e.model.cfg.vocab_size + 1, sizeof *logits);
    if (st == KVD_OK && logits == NULL) {
        st = KVD_ERR_NOMEM;
    }
    if (st == KVD_OK) {
        st = prefill(&e, prompt, n, have, r, &first, logits);
    }
    r->ttft_ms = now_ms() - t0;
    if (st == KVD_OK) {
        keep_logp(&e, r, 0, logits);
    }
    free(logits);
    r->prompt_tokens = n;
    if (st == KVD_OK) {
        st = decode(&e, n, first, r);
    }
    bool delay = false;
    if (st == KVD_OK) {
        st = kvd_leader_request_finished(e.leader, REQ_ID, &delay);
    }
    for (uint32_t l = 0; st == KVD_OK && l < e.cache.num_layers; l++) {
        device_layer(&e, l, true); /* what the GPU holds, not the copy */
        st = e.dev_st;
    }
    if (st == KVD_OK) {
        r->kv_digest = kvd_demo_cache_digest(
            &e.cache, e.table, n + r->num_tokens - 1,
            (size_t)e.model.cfg.num_kv_heads * e.model.head_dim);
    }
    r->total_ms = now_ms() - t0;
    kvd_worker_stats_t ws;
    if (e.worker != NULL && kvd_worker_stats(e.worker, &ws) == KVD_OK) {
        r->bytes_loaded = ws.bytes_loaded;
        r->bytes_stored = ws.bytes_saved;
    }
    if (e.leader != NULL) {
        (void)kvd_leader_gate_estimates(e.leader, &r->gate_est);
    }
    engine_close(&e);
    free(prompt);
    return st;
}
