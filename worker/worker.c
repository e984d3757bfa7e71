/*
 * The worker (include/kvdepot/worker.h): its life cycle, the plan of each
 * step and the engine's per-layer calls; the reports are report.c's.
 *
 * A plan is untrusted bytes. bind_metadata unpacks and validates it, checks
 * every key's namespace and block id against this worker, and only then
 * builds the step: one wreq per request with its blocks, the step's
 * synchronous loads, and an arena reservation for every save. Room in the
 * finished queues for everything the step can report is reserved here too,
 * so the background threads never allocate to report.
 *
 * The engine's calls then only queue work and wait on counters (exec.c):
 * wait_for_layer_load(l) on the layer's load tasks, wait_for_save on all
 * of the step's copies. Committing happens on the engine thread in
 * wait_for_save, after the last copy, so an object becomes visible to
 * lookups only once all its layers are written (commit.c). A step that
 * ends any other way (abort_step, clear_metadata or bind_metadata before
 * wait_for_save, destroy), or whose engine skipped a layer it says it
 * saves (layerwise_saves), commits nothing.
 *
 * The copies, and the stream ordering around them, go through the device
 * backend (w->dev). With the CUDA backend (device_cuda.c) a finished task
 * means its copies are enqueued on the side streams; the engine's calls add
 * the stream ordering: wait_for_layer_load(l) makes the engine's stream
 * wait for layer l's event, save_kv_layer orders the kernel stream after the
 * engine's, and wait_for_save synchronizes the side streams before the
 * commits (kvd_worker_copies_finish). The host backend's stream calls do
 * nothing.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/grow_int.h"
#include "common/config_int.h"
#include "common/log_int.h"
#include "proto/kvd_proto.h"
#include "worker/worker_int.h"

#define WORKER_DEFAULT_THREADS 2u
#define WORKER_DEFAULT_INFLIGHT_SAVE_BYTES (1ull << 30)

/* ---- stores in use: the workers of each store share its completions ----- */

typedef struct wstore {
    kvd_store_t *store; /* NULL: a free entry */
    unsigned workers;
    pthread_mutex_t poll_mu;
} wstore_t;

#define WORKER_MAX_STORES 64
static pthread_mutex_t g_stores_mu = PTHREAD_MUTEX_INITIALIZER;
static wstore_t g_stores[WORKER_MAX_STORES];

/* The poll lock of `store`'s entry, taken by one more worker; NULL when
 * WORKER_MAX_STORES other stores are in use. */
static pthread_mutex_t *store_claim(kvd_store_t *store)
{
    wstore_t *e = NULL, *free_e = NULL;
    pthread_mutex_lock(&g_stores_mu);
    for (size_t i = 0; i < WORKER_MAX_STORES && e == NULL; i++) {
        if (g_stores[i].store == store) {
            e = &g_stores[i];
        } else if (g_stores[i].store == NULL && free_e == NULL) {
            free_e = &g_stores[i];
        }
    }
    if (e == NULL && free_e != NULL) {
        e = free_e;
        e->store = store;
        e->workers = 0;
        pthread_mutex_init(&e->poll_mu, NULL);
    }
    if (e != NULL) {
        e->workers++;
    }
    pthread_mutex_unlock(&g_stores_mu);
    return e != NULL ? &e->poll_mu : NULL;
}

static void store_unclaim(kvd_store_t *store)
{
    pthread_mutex_lock(&g_stores_mu);
    for (size_t i = 0; i < WORKER_MAX_STORES; i++) {
        wstore_t *e = &g_stores[i];
        if (e->store == store && --e->workers == 0) {
            pthread_mutex_destroy(&e->poll_mu);
            e->store = NULL;
        }
    }
    pthread_mutex_unlock(&g_stores_mu);
}

/* ---- queues -------------------------------------------------------------- */

static bool queue_reserve(wqueue_t *q, size_t more)
{
    if (!kvd_grow(&q->items, &q->cap, q->num + q->reserved + more,
                  q->item_bytes)) {
        return false;
    }
    q->reserved += more;
    return true;
}

void kvd_worker_queue_unreserve(wqueue_t *q, size_t n)
{
    q->reserved -= n < q->reserved ? n : q->reserved;
}

void kvd_worker_queue_push(kvd_worker_t *w, wqueue_t *q, const void *item)
{
    (void)w;
    if (q->reserved == 0 || q->num == q->cap) {
        /* Unreachable while reservations hold; never write past. */
        KVD_LOG_ERROR("worker: no room reserved for a report");
        return;
    }
    memcpy((char *)q->items + q->num * q->item_bytes, item, q->item_bytes);
    q->num++;
    q->reserved--;
}

void kvd_worker_notify(kvd_worker_t *w)
{
    uint64_t one = 1;
    ssize_t n = write(w->efd, &one, sizeof one);
    (void)n; /* EAGAIN: the counter is already non-zero, readable anyway */
}

/* ---- requests and steps ------------------------------------------------- */

void kvd_worker_req_free(wreq_t *r)
{
    if (r == NULL) {
        return;
    }
    free(r->loads);
    free(r->saves);
    free(r->ids);
    free(r->objs);
    free(r->deltas);
    free(r);
}

void kvd_worker_step_free(wstep_t *s)
{
    if (s == NULL) {
        return;
    }
    for (size_t i = 0; i < s->n_reqs; i++) {
        kvd_worker_req_free(s->reqs[i]);
    }
    free(s->reqs);
    free(s->sync);
    free(s->load_ids);
    free(s->load_objs);
    free(s->load_deltas);
    free(s->load_blocks);
    free(s->layer_left);
    free(s->saves);
    free(s->save_ids);
    free(s->save_objs);
    free(s->save_keys);
    free(s->save_order);
    free(s->save_status);
    free(s->save_issued);
    free(s->tasks);
    free(s);
}

static bool step_saves_for(const wstep_t *s, const char *id)
{
    for (size_t i = 0; i < s->n_reqs; i++) {
        if (s->reqs[i] != NULL && s->reqs[i]->n_saves > 0 &&
            strcmp(s->reqs[i]->id, id) == 0) {
            return true;
        }
    }
    return false;
}

bool kvd_worker_req_saving(const kvd_worker_t *w, const char *id)
{
    for (const wstep_t *s = w->drain_head; s != NULL; s = s->drain_next) {
        if (!s->saves_done && step_saves_for(s, id)) {
            return true;
        }
    }
    const wstep_t *b = w->step;
    return b != NULL && !b->saves_done && !b->detached && step_saves_for(b, id);
}

/* ---- create / destroy --------------------------------------------------- */

static bool format_uses_tq(const kvd_object_format_t *f)
{
    for (uint32_t p = 0; p < f->num_planes && p < 2; p++) {
        if (f->codec[p] >= KVD_CODEC_TQ4 && f->codec[p] <= KVD_CODEC_TQ2) {
            return true;
        }
    }
    return false;
}

/* The stored object's format (cfg->format, or every rank's heads with
 * object_heads), after the checks of a shared object's split. */
static kvd_status_t store_format(const kvd_worker_config_t *cfg,
                                 kvd_object_format_t *out, char *err,
                                 size_t err_len)
{
    *out = cfg->format;
    uint32_t n = cfg->format.num_heads;
    if (cfg->object_heads == 0 && cfg->head_start == 0) {
        return KVD_OK;
    }
    if (n == 0 || cfg->object_heads % n != 0 || cfg->head_start % n != 0 ||
        cfg->head_start >= cfg->object_heads ||
        cfg->object_heads / n > KVD_STORE_MAX_PARTS) {
        kvd_config_err(err, err_len,
                       "worker: heads %u..%u of object_heads %u: the object "
                       "must split into at most %u equal parts, this one "
                       "among them",
                       cfg->head_start, cfg->head_start + n, cfg->object_heads,
                       KVD_STORE_MAX_PARTS);
        return KVD_ERR_INVALID;
    }
    out->num_heads = cfg->object_heads;
    kvd_object_format_t mine;
    char why[200] = "";
    kvd_status_t s = kvd_object_shard_format(out, cfg->head_start, n, &mine,
                                             why, sizeof why);
    if (s != KVD_OK) {
        kvd_config_err(err, err_len, "worker: object_heads: %s", why);
    }
    return s;
}

/* The configuration's checks before anything is allocated; *dev_out gets
 * the device backend. */
static kvd_status_t config_check(const kvd_worker_config_t *cfg,
                                 const wdevice_ops_t **dev_out, char *err,
                                 size_t err_len)
{
    if (cfg->device != KVD_WORKER_DEVICE_HOST &&
        cfg->device != KVD_WORKER_DEVICE_CUDA) {
        kvd_config_err(err, err_len, "worker: device %d is not a backend",
                       (int)cfg->device);
        return KVD_ERR_UNSUPPORTED;
    }
    *dev_out = cfg->device == KVD_WORKER_DEVICE_CUDA
                   ? KVD_WORKER_DEVICE_CUDA_OPS
                   : &kvd_worker_device_host;
    if (*dev_out == NULL) {
        kvd_config_err(
            err, err_len,
            "worker: device cuda: this build of kvdepot has no CUDA "
            "support (it is built when nvcc is found at configure time, "
            "KVD_WITH_CUDA=AUTO or ON)");
        return KVD_ERR_UNSUPPORTED;
    }
    if (cfg->num_threads > KVD_WORKER_MAX_THREADS) {
        kvd_config_err(err, err_len, "worker: num_threads %u > %u",
                       cfg->num_threads, KVD_WORKER_MAX_THREADS);
        return KVD_ERR_INVALID;
    }
    char why[200] = "";
    kvd_status_t s = kvd_object_format_check(&cfg->format, why, sizeof why);
    if (s != KVD_OK) {
        kvd_config_err(err, err_len, "worker: format: %s", why);
        return s;
    }
    kvd_object_format_t whole;
    s = store_format(cfg, &whole, err, err_len);
    if (s != KVD_OK) {
        return s;
    }
    size_t obj_bytes = kvd_object_stored_bytes(&whole);
    if (cfg->async_saves && cfg->max_inflight_save_bytes != 0 &&
        cfg->max_inflight_save_bytes < obj_bytes) {
        /* Every save would be shed. */
        kvd_config_err(err, err_len,
                       "worker: max_inflight_save_bytes %llu is less than "
                       "one object (%zu bytes)",
                       (unsigned long long)cfg->max_inflight_save_bytes,
                       obj_bytes);
        return KVD_ERR_INVALID;
    }
    return KVD_OK;
}

KVD_API kvd_status_t kvd_worker_create(const kvd_worker_config_t *cfg,
                                       kvd_worker_t **worker_out, char *err,
                                       size_t err_len)
{
    if (cfg == NULL || worker_out == NULL || cfg->store == NULL) {
        kvd_config_err(err, err_len, "worker: NULL config, store or out");
        return KVD_ERR_INVALID;
    }
    const wdevice_ops_t *dev = NULL;
    kvd_status_t s = config_check(cfg, &dev, err, err_len);
    if (s != KVD_OK) {
        return s;
    }
    kvd_worker_t *w = calloc(1, sizeof *w);
    if (w == NULL) {
        return KVD_ERR_NOMEM;
    }
    w->cfg = *cfg;
    w->dev = dev;
    w->store = cfg->store;
    static const kvd_namespace_t zero_ns;
    w->plan_ns = memcmp(&cfg->plan_ns, &zero_ns, sizeof zero_ns) == 0
                     ? cfg->ns
                     : cfg->plan_ns;
    (void)store_format(cfg, &w->store_fmt, NULL, 0);
    w->shard = w->store_fmt.num_heads != cfg->format.num_heads;
    w->num_parts = w->store_fmt.num_heads / cfg->format.num_heads;
    w->part = cfg->head_start / cfg->format.num_heads;
    w->shard_direct =
        w->shard && kvd_object_shard_direct(&w->store_fmt, cfg->head_start,
                                            cfg->format.num_heads);
    w->payload_bytes = kvd_object_bytes(&w->store_fmt);
    w->object_bytes = kvd_object_stored_bytes(&w->store_fmt);
    w->num_threads =
        cfg->num_threads != 0 ? cfg->num_threads : WORKER_DEFAULT_THREADS;
    w->async_saves = cfg->async_saves;
    w->max_inflight_save_bytes = cfg->max_inflight_save_bytes != 0
                                     ? cfg->max_inflight_save_bytes
                                     : WORKER_DEFAULT_INFLIGHT_SAVE_BYTES;
    w->fin_save.item_bytes = sizeof(wfin_t);
    w->fin_load.item_bytes = sizeof(wfin_t);
    w->failed.item_bytes = sizeof(wfail_t);
    w->efd = -1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->task_cv, NULL);
    pthread_cond_init(&w->done_cv, NULL);
    pthread_cond_init(&w->poll_cv, NULL);

    if (format_uses_tq(&cfg->format)) {
        s = kvd_codec_tables_create(&cfg->format, &w->tables);
        if (s != KVD_OK) {
            kvd_config_err(err, err_len, "worker: codec tables: %s",
                           kvd_status_str(s));
            goto err_free;
        }
    }
    s = w->dev->create(w, err, err_len);
    if (s != KVD_OK) {
        goto err_free;
    }
    w->bases = calloc(cfg->format.num_layers, sizeof *w->bases);
    w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->bases == NULL || w->efd < 0) {
        s = w->bases == NULL ? KVD_ERR_NOMEM : kvd_status_from_errno(errno);
        kvd_config_err(err, err_len, "worker: %s", kvd_status_str(s));
        goto err_free;
    }
    w->poll_mu = store_claim(cfg->store);
    if (w->poll_mu == NULL) {
        kvd_config_err(err, err_len, "worker: %d stores already serve workers",
                       WORKER_MAX_STORES);
        s = KVD_ERR_STATE;
        goto err_free;
    }
    s = kvd_worker_exec_start(w);
    if (s != KVD_OK) {
        kvd_config_err(err, err_len, "worker: threads not started");
        kvd_worker_exec_stop(w);
        store_unclaim(cfg->store);
        goto err_free;
    }
    *worker_out = w;
    return KVD_OK;

err_free:
    w->dev->destroy(w);
    if (w->efd >= 0) {
        close(w->efd);
    }
    free(w->threads);
    free(w->bases);
    kvd_codec_tables_destroy(w->tables);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->task_cv);
    pthread_cond_destroy(&w->done_cv);
    pthread_cond_destroy(&w->poll_cv);
    free(w);
    return s;
}

KVD_API void kvd_worker_destroy(kvd_worker_t *worker)
{
    if (worker == NULL) {
        return;
    }
    kvd_worker_t *w = worker;
    (void)kvd_worker_clear_metadata(w);
    kvd_worker_exec_stop(w);
    /* After the threads: an asynchronous copy may still be on the stream
     * until then. */
    w->dev->destroy(w);
    store_unclaim(w->store);
    close(w->efd);
    free(w->threads);
    free(w->bases);
    free(w->backlog);
    free(w->fin_save.items);
    free(w->fin_load.items);
    free(w->failed.items);
    free(w->taken_save);
    free(w->taken_load);
    free(w->taken_failed);
    free(w->out_save);
    free(w->out_load);
    free(w->out_async);
    free(w->out_failed);
    free(w->report);
    kvd_codec_tables_destroy(w->tables);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->task_cv);
    pthread_cond_destroy(&w->done_cv);
    pthread_cond_destroy(&w->poll_cv);
    free(w);
}

KVD_API kvd_status_t kvd_worker_register_kv_caches(
    kvd_worker_t *worker, const kvd_kv_layout_t *layout, char *err,
    size_t err_len)
{
    if (worker == NULL || layout == NULL || layout->layer_base == NULL) {
        kvd_config_err(err, err_len, "worker: NULL layout");
        return KVD_ERR_INVALID;
    }
    kvd_worker_t *w = worker;
    char why[200] = "";
    kvd_status_t s =
        kvd_kv_layout_check(layout, &w->cfg.format, why, sizeof why);
    if (s != KVD_OK) {
        kvd_config_err(err, err_len, "worker: layout: %s", why);
        return s;
    }
    pthread_mutex_lock(&w->mu);
    bool busy = w->step != NULL || w->async_active > 0 || w->drain_head != NULL;
    pthread_mutex_unlock(&w->mu);
    if (busy) {
        kvd_config_err(err, err_len,
                       "worker: a plan is bound or loads or saves are in "
                       "flight");
        return KVD_ERR_STATE;
    }
    s = w->dev->register_caches(w, layout, err, err_len);
    if (s != KVD_OK) {
        return s;
    }
    memcpy(w->bases, layout->layer_base,
           w->cfg.format.num_layers * sizeof *w->bases);
    w->layout = *layout;
    w->layout.layer_base = w->bases;
    w->registered = true;
    return KVD_OK;
}

/* ---- bind ------------------------------------------------------------- */

/* Checks one key and block id of the plan; copies the hash into `b`. */
static kvd_status_t plan_block(kvd_worker_t *w, const kvd_pb_object_key_t *key,
                               uint32_t block_id, wreq_t *r, wblock_t *b,
                               char *err, size_t err_len)
{
    if (memcmp(key->namespace_id.data, w->plan_ns.bytes, KVD_NAMESPACE_BYTES) !=
        0) {
        kvd_config_err(
            err, err_len,
            "worker: plan: request %s block %u: key of another namespace",
            r->id, block_id);
        return KVD_ERR_PROTO;
    }
    if (block_id >= w->layout.num_blocks) {
        kvd_config_err(
            err, err_len,
            "worker: plan: request %s block %u outside the cache (%u "
            "blocks)",
            r->id, block_id, w->layout.num_blocks);
        return KVD_ERR_RANGE;
    }
    b->worker = w;
    b->req = r;
    b->block_id = (int32_t)block_id;
    memcpy(b->hash.bytes, key->block_hash.data, KVD_SHA256_BYTES);
    b->status = KVD_OK;
    return KVD_OK;
}

static kvd_status_t req_build(kvd_worker_t *w, const kvd_pb_step_request_t *q,
                              wreq_t **out, char *err, size_t err_len)
{
    wreq_t *r = calloc(1, sizeof *r);
    if (r == NULL) {
        return KVD_ERR_NOMEM;
    }
    snprintf(r->id, sizeof r->id, "%s", q->request_id);
    r->async_load = q->async_load;
    r->layerwise = q->layerwise;
    r->n_loads = q->n_loads;
    /* A save with a content key is two objects from one engine block. */
    r->n_saves = q->n_saves;
    for (size_t i = 0; i < q->n_saves; i++) {
        r->n_saves += q->saves[i]->content_key != NULL;
    }
    r->loads = calloc(q->n_loads + 1, sizeof *r->loads);
    r->saves = calloc(r->n_saves + 1, sizeof *r->saves);
    if (r->async_load) {
        r->ids = calloc(q->n_loads + 1, sizeof *r->ids);
        r->objs = calloc(q->n_loads + 1, sizeof *r->objs);
        r->deltas = calloc(q->n_loads + 1, sizeof *r->deltas);
    }
    kvd_status_t s = KVD_OK;
    if (r->loads == NULL || r->saves == NULL ||
        (r->async_load &&
         (r->ids == NULL || r->objs == NULL || r->deltas == NULL))) {
        s = KVD_ERR_NOMEM;
    }
    for (size_t i = 0; s == KVD_OK && i < q->n_loads; i++) {
        s = plan_block(w, q->loads[i]->key, q->loads[i]->block_id, r,
                       &r->loads[i], err, err_len);
        r->loads[i].position = q->loads[i]->position;
        r->loads[i].content = q->loads[i]->content;
    }
    for (size_t i = 0, j = 0; s == KVD_OK && i < q->n_saves; i++) {
        const kvd_pb_block_save_t *sv = q->saves[i];
        s = plan_block(w, sv->key, sv->block_id, r, &r->saves[j], err, err_len);
        r->saves[j++].position = sv->position;
        if (s == KVD_OK && sv->content_key != NULL) {
            s = plan_block(w, sv->content_key, sv->block_id, r, &r->saves[j],
                           err, err_len);
            r->saves[j++].position = sv->position;
        }
    }
    if (s != KVD_OK) {
        kvd_worker_req_free(r);
        return s;
    }
    *out = r;
    return KVD_OK;
}

/* How many of the request's saves (a prefix) fit under
 * max_inflight_save_bytes with async_saves; the rest are shed (mu held). */
static size_t saves_room(kvd_worker_t *w, const wstep_t *s, wreq_t *r)
{
    if (!w->async_saves) {
        return r->n_saves;
    }
    uint64_t used = w->inflight_save_bytes, cap = w->max_inflight_save_bytes;
    uint64_t fit = used < cap ? (cap - used) / w->object_bytes : 0;
    size_t n = fit < r->n_saves ? (size_t)fit : r->n_saves;
    for (size_t b = n; b < r->n_saves; b++) {
        r->saves[b].status = KVD_ERR_BUSY;
        w->st.saves_shed++;
    }
    if (n < r->n_saves) {
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                            "worker: step %llu: %zu saves of request %s "
                            "shed: %llu bytes of saves in flight",
                            (unsigned long long)s->step, r->n_saves - n, r->id,
                            (unsigned long long)used);
    }
    return n;
}

/* Reserves arena slots for the saves of every request; keeps the granted
 * ones in the step. */
static kvd_status_t step_reserve(kvd_worker_t *w, wstep_t *s, char *err,
                                 size_t err_len)
{
    size_t total = 0, most = 0;
    for (size_t i = 0; i < s->n_reqs; i++) {
        total += s->reqs[i]->n_saves;
        most = s->reqs[i]->n_saves > most ? s->reqs[i]->n_saves : most;
    }
    s->saves = calloc(total + 1, sizeof *s->saves);
    s->save_ids = calloc(total + 1, sizeof *s->save_ids);
    s->save_objs = calloc(total + 1, sizeof *s->save_objs);
    s->save_keys = calloc(total + 1, sizeof *s->save_keys);
    s->save_order = calloc(total + 1, sizeof *s->save_order);
    s->save_status = calloc(total + 1, sizeof *s->save_status);
    kvd_block_hash_t *hashes = calloc(most + 1, sizeof *hashes);
    kvd_store_reservation_t *res = calloc(most + 1, sizeof *res);
    kvd_status_t st = KVD_OK;
    if (s->saves == NULL || s->save_ids == NULL || s->save_objs == NULL ||
        s->save_keys == NULL || s->save_order == NULL ||
        s->save_status == NULL || hashes == NULL || res == NULL) {
        st = KVD_ERR_NOMEM;
    }
    for (size_t i = 0; st == KVD_OK && i < s->n_reqs; i++) {
        wreq_t *r = s->reqs[i];
        if (r->n_saves == 0) {
            continue;
        }
        size_t n = saves_room(w, s, r);
        for (size_t b = 0; b < n; b++) {
            hashes[b] = r->saves[b].hash;
        }
        st = n == 0 ? KVD_OK
                    : kvd_store_reserve_part(w->store, &s->ns, hashes, n,
                                             w->object_bytes, w->cfg.tenant,
                                             w->part, w->num_parts, res);
        if (st != KVD_OK) {
            kvd_config_err(err, err_len,
                           "worker: reserving %zu objects of %zu "
                           "bytes: %s",
                           r->n_saves, w->object_bytes, kvd_status_str(st));
            break;
        }
        for (size_t b = 0; b < n; b++) {
            wblock_t *blk = &r->saves[b];
            if (res[b].status == KVD_OK) {
                blk->arena_offset = res[b].arena_offset;
                blk->obj = kvd_store_reservation_ptr(w->store, &res[b],
                                                     w->object_bytes);
                if (blk->obj == NULL) {
                    /* The arena it was made in is no longer mapped (the
                     * daemon restarted since): give the slot back. */
                    kvd_store_key_t k = {s->ns, blk->hash};
                    kvd_status_t ast;
                    (void)kvd_store_abort_part(w->store, &k, 1, w->part, &ast);
                    blk->status = KVD_ERR_STATE;
                    w->st.saves_dropped++;
                    continue;
                }
                /* The header first: the payload is written by the copies,
                 * and everything goes to the store at commit. In a shared
                 * object, the part that made the slot writes the bytes no
                 * part owns. */
                if (res[b].first) {
                    (void)kvd_object_header_pack_at(
                        &w->store_fmt, &s->ns, &blk->hash, blk->position,
                        (uint8_t *)blk->obj + w->payload_bytes);
                }
                if (res[b].first && w->shard) {
                    kvd_object_zero_padding(&w->store_fmt, blk->obj);
                }
                s->saves[s->n_saves] = blk;
                s->save_ids[s->n_saves] = blk->block_id;
                s->save_objs[s->n_saves] = blk->obj;
                s->n_saves++;
                s->save_bytes += w->object_bytes;
                w->inflight_save_bytes += w->object_bytes;
                w->st.saves_inflight++;
            } else if (res[b].status == KVD_ERR_EXISTS) {
                blk->status = KVD_ERR_EXISTS;
                w->st.saves_skipped++;
            } else {
                blk->status = res[b].status;
                w->st.saves_dropped++;
                KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                                    "worker: block %d of request %s not "
                                    "saved: %s",
                                    blk->block_id, r->id,
                                    kvd_status_str(res[b].status));
            }
        }
    }
    free(hashes);
    free(res);
    return st;
}

/* Aborts every reservation of a step that will not run (bind failed). */
static void step_abort(kvd_worker_t *w, wstep_t *s)
{
    for (size_t i = 0; i < s->n_saves; i++) {
        s->saves[i]->status = KVD_ERR_CANCELED;
    }
    kvd_worker_saves_commit(w, s);
}

/* The step's synchronous loads, per-layer counters and task storage. */
static kvd_status_t step_arrays(kvd_worker_t *w, wstep_t *s)
{
    uint32_t layers = w->cfg.format.num_layers;
    for (size_t i = 0; i < s->n_reqs; i++) {
        wreq_t *r = s->reqs[i];
        if (!r->async_load) {
            s->n_sync += r->n_loads;
            s->any_sync_whole |= r->n_loads > 0 && !r->layerwise;
        }
    }
    s->sync = calloc(s->n_sync + 1, sizeof *s->sync);
    s->load_ids = calloc(s->n_sync + 1, sizeof *s->load_ids);
    s->load_objs = calloc(s->n_sync + 1, sizeof *s->load_objs);
    s->load_deltas = calloc(s->n_sync + 1, sizeof *s->load_deltas);
    s->load_blocks = calloc(s->n_sync + 1, sizeof *s->load_blocks);
    s->layer_left = calloc(layers, sizeof *s->layer_left);
    s->save_issued = calloc(layers, sizeof *s->save_issued);
    if (s->sync == NULL || s->load_ids == NULL || s->load_objs == NULL ||
        s->load_deltas == NULL || s->load_blocks == NULL ||
        s->layer_left == NULL || s->save_issued == NULL) {
        return KVD_ERR_NOMEM;
    }
    size_t n = 0;
    for (size_t i = 0; i < s->n_reqs; i++) {
        wreq_t *r = s->reqs[i];
        for (size_t b = 0; !r->async_load && b < r->n_loads; b++) {
            s->sync[n++] = &r->loads[b];
        }
    }
    return KVD_OK;
}

/* Room in the finished queues for everything the step can report. */
static bool step_queue_room(kvd_worker_t *w, const wstep_t *s, bool take)
{
    size_t loads = 0, load_reqs = 0, save_reqs = 0;
    for (size_t i = 0; i < s->n_reqs; i++) {
        loads += s->reqs[i]->n_loads;
        load_reqs += s->reqs[i]->n_loads > 0 || s->reqs[i]->async_load;
        save_reqs += s->reqs[i]->n_saves > 0;
    }
    pthread_mutex_lock(&w->mu);
    bool ok = true;
    if (take) {
        ok = queue_reserve(&w->fin_load, load_reqs) &&
             queue_reserve(&w->fin_save, save_reqs) &&
             queue_reserve(&w->failed, loads);
        if (!ok) {
            take = false; /* give back what was taken */
        }
    }
    if (!take) {
        kvd_worker_queue_unreserve(&w->fin_load, load_reqs);
        kvd_worker_queue_unreserve(&w->fin_save, save_reqs);
        kvd_worker_queue_unreserve(&w->failed, loads);
    }
    pthread_mutex_unlock(&w->mu);
    return ok;
}

/* Splits the plan into requests. An asynchronous request's saves (a plan
 * may carry both) go into a request of their own, so the step never points
 * into a request the background may free. */
static kvd_status_t step_requests(kvd_worker_t *w, wstep_t *s,
                                  const kvd_pb_step_plan_t *plan, char *err,
                                  size_t err_len)
{
    s->reqs = calloc(2 * plan->n_requests + 1, sizeof *s->reqs);
    if (s->reqs == NULL) {
        return KVD_ERR_NOMEM;
    }
    for (size_t i = 0; i < plan->n_requests; i++) {
        const kvd_pb_step_request_t *q = plan->requests[i];
        wreq_t *r = NULL;
        kvd_status_t st = req_build(w, q, &r, err, err_len);
        if (st != KVD_OK) {
            return st;
        }
        s->reqs[s->n_reqs++] = r;
        if (r->async_load && r->n_saves > 0) {
            kvd_pb_step_request_t saves_only = *q;
            saves_only.n_loads = 0;
            saves_only.async_load = false;
            st = req_build(w, &saves_only, &s->reqs[s->n_reqs], err, err_len);
            if (st != KVD_OK) {
                return st;
            }
            s->n_reqs++;
            r->n_saves = 0;
        }
    }
    return KVD_OK;
}

KVD_API kvd_status_t kvd_worker_bind_metadata(kvd_worker_t *worker,
                                              const void *plan, size_t len,
                                              char *err, size_t err_len)
{
    if (worker == NULL || (plan == NULL && len > 0)) {
        kvd_config_err(err, err_len, "worker: NULL plan");
        return KVD_ERR_INVALID;
    }
    kvd_worker_t *w = worker;
    if (!w->registered) {
        kvd_config_err(err, err_len, "worker: no KV cache registered");
        return KVD_ERR_STATE;
    }
    if (w->step != NULL) {
        KVD_LOG_DEBUG("worker: step %llu still bound: ending it; saves not "
                      "committed yet are aborted",
                      (unsigned long long)w->step->step);
        (void)kvd_worker_clear_metadata(w);
    }
    char why[256] = "";
    kvd_pb_step_plan_t *msg = NULL;
    kvd_status_t st =
        kvd_proto_step_plan_unpack(plan, len, &msg, why, sizeof why);
    if (st != KVD_OK) {
        kvd_config_err(err, err_len, "worker: plan: %s", why);
        return st;
    }
    if (msg->block_size != w->cfg.format.block_size) {
        kvd_config_err(err, err_len,
                       "worker: plan: block_size %u, the cache's %u",
                       msg->block_size, w->cfg.format.block_size);
        kvd_proto_step_plan_free(msg);
        return KVD_ERR_PROTO;
    }
    wstep_t *s = calloc(1, sizeof *s);
    if (s == NULL) {
        kvd_proto_step_plan_free(msg);
        return KVD_ERR_NOMEM;
    }
    s->step = msg->step;
    s->ns = w->cfg.ns;
    /* Also what makes the blocks of the plan's preempted requests safe to
     * reuse: their saves' copies ran, only commits may be left. */
    kvd_worker_earlier_copies_wait(w);
    st = step_requests(w, s, msg, err, err_len);
    kvd_proto_step_plan_free(msg);
    if (st == KVD_OK) {
        st = step_arrays(w, s);
    }
    if (st != KVD_OK) {
        goto err_step;
    }
    if (!step_queue_room(w, s, true)) {
        st = KVD_ERR_NOMEM;
        goto err_step;
    }
    pthread_mutex_lock(&w->mu);
    st = step_reserve(w, s, err, err_len);
    pthread_mutex_unlock(&w->mu);
    if (st == KVD_OK) {
        size_t per_layer =
            kvd_worker_chunks(w, s->n_sync) + kvd_worker_chunks(w, s->n_saves);
        s->n_tasks = per_layer * w->cfg.format.num_layers;
        s->tasks = calloc(s->n_tasks + 1, sizeof *s->tasks);
        st = s->tasks == NULL ? KVD_ERR_NOMEM : KVD_OK;
    }
    if (st != KVD_OK) {
        goto err_reserved;
    }
    pthread_mutex_lock(&w->mu);
    w->step = s;
    w->last_step = s->step;
    pthread_mutex_unlock(&w->mu);
    return KVD_OK;

err_reserved:
    pthread_mutex_lock(&w->mu);
    step_abort(w, s);
    pthread_mutex_unlock(&w->mu);
    (void)step_queue_room(w, s, false);
err_step:
    if (st == KVD_ERR_NOMEM) {
        kvd_config_err(err, err_len, "worker: out of memory binding a plan");
    }
    kvd_worker_step_free(s);
    return st;
}

/* ---- the engine's per-step calls ----------------------------------------- */

/* CUDA: the kernel stream could not be ordered after the engine's, so the
 * step's saves might read the cache before the engine wrote it; none of
 * them is committed. */
static void saves_fail(kvd_worker_t *w, wstep_t *s, kvd_status_t st)
{
    KVD_LOG_ERROR("worker: step %llu: saves not ordered after the engine's "
                  "stream (%s): dropped",
                  (unsigned long long)s->step, kvd_status_str(st));
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < s->n_saves; i++) {
        if (s->saves[i]->status == KVD_OK) {
            s->saves[i]->status = st;
        }
    }
    pthread_mutex_unlock(&w->mu);
}

KVD_API kvd_status_t kvd_worker_start_load_kv(kvd_worker_t *worker,
                                              void *stream)
{
    if (worker == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_worker_t *w = worker;
    wstep_t *s = w->step;
    if (s == NULL) {
        return KVD_OK;
    }
    /* Before the step's forward pass writes any block: the earlier steps'
     * copies out of the cache come first (CUDA). */
    (void)kvd_worker_reads_order(w, stream);
    if (!s->loads_started) {
        kvd_worker_loads_start(w, s);
    }
    if (s->any_sync_whole) {
        pthread_mutex_lock(&w->mu);
        while (!kvd_worker_loads_enqueued(s)) {
            pthread_cond_wait(&w->done_cv, &w->mu);
        }
        bool copied = s->n_load_ok > 0;
        pthread_mutex_unlock(&w->mu);
        if (copied) {
            return w->dev->stream_wait(w, KVD_WORKER_ALL_LAYERS, stream);
        }
    }
    return KVD_OK;
}

KVD_API kvd_status_t kvd_worker_wait_for_layer_load(kvd_worker_t *worker,
                                                    uint32_t layer,
                                                    void *stream)
{
    if (worker == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_worker_t *w = worker;
    if (layer >= w->cfg.format.num_layers) {
        return KVD_ERR_RANGE;
    }
    wstep_t *s = w->step;
    if (s == NULL) {
        return KVD_OK;
    }
    if (!s->loads_started) {
        kvd_worker_loads_start(w, s);
    }
    pthread_mutex_lock(&w->mu);
    while (!s->loads_done && !(s->loads_issued && s->layer_left[layer] == 0)) {
        pthread_cond_wait(&w->done_cv, &w->mu);
    }
    bool copied = s->n_load_ok > 0;
    pthread_mutex_unlock(&w->mu);
    if (copied) {
        /* CUDA: enqueued, not done: the engine's stream waits, not the
         * host. */
        return w->dev->stream_wait(w, layer, stream);
    }
    return KVD_OK;
}

KVD_API kvd_status_t kvd_worker_save_kv_layer(kvd_worker_t *worker,
                                              uint32_t layer, void *stream)
{
    if (worker == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_worker_t *w = worker;
    if (layer >= w->cfg.format.num_layers) {
        return KVD_ERR_RANGE;
    }
    wstep_t *s = w->step;
    if (s == NULL || s->saves_done || s->detached) {
        return KVD_OK;
    }
    kvd_status_t st = KVD_OK;
    if (s->n_saves > 0 && !s->save_issued[layer]) {
        /* The gather must see what the engine's stream wrote so far. */
        st = w->dev->save_order(w, stream);
        if (st != KVD_OK) {
            saves_fail(w, s, st);
        }
    }
    pthread_mutex_lock(&w->mu);
    kvd_worker_saves_issue(w, s, layer);
    pthread_mutex_unlock(&w->mu);
    return st;
}

/* The first layer save_kv_layer was not called for in the step, or
 * num_layers when it came for all. */
static uint32_t saves_first_missing(const kvd_worker_t *w, const wstep_t *s)
{
    uint32_t l = 0;
    while (l < w->cfg.format.num_layers && s->save_issued[l]) {
        l++;
    }
    return l;
}

KVD_API kvd_status_t kvd_worker_wait_for_save(kvd_worker_t *worker,
                                              void *stream)
{
    if (worker == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_worker_t *w = worker;
    wstep_t *s = w->step;
    if (s == NULL || s->saves_done || s->detached) {
        return KVD_OK;
    }
    if (!s->loads_started) {
        kvd_worker_loads_start(w, s);
    }
    uint32_t missing = saves_first_missing(w, s);
    if (s->n_saves > 0 && missing < w->cfg.format.num_layers) {
        if (w->cfg.layerwise_saves) {
            /* The engine saves every layer it computes: this one was not
             * computed, so no object of the step is whole. */
            char why[80];
            snprintf(why, sizeof why,
                     "save_kv_layer was not called for layer %u", missing);
            kvd_worker_step_end(w, s, why);
            return KVD_OK;
        }
        /* Layers save_kv_layer was not called for: after the work on this
         * stream. */
        kvd_status_t st = w->dev->save_order(w, stream);
        if (st != KVD_OK) {
            saves_fail(w, s, st);
        }
    }
    pthread_mutex_lock(&w->mu);
    for (uint32_t l = 0; l < w->cfg.format.num_layers; l++) {
        kvd_worker_saves_issue(w, s, l);
    }
    pthread_mutex_unlock(&w->mu);
    if (w->async_saves && s->n_saves > 0) {
        kvd_worker_step_detach(w, s);
    } else {
        kvd_worker_step_end(w, s, NULL);
    }
    return KVD_OK;
}

KVD_API kvd_status_t kvd_worker_blocks_fence(kvd_worker_t *worker, void *stream)
{
    if (worker == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_worker_earlier_copies_wait(worker);
    return kvd_worker_reads_order(worker, stream);
}

KVD_API kvd_status_t kvd_worker_flush_saves(kvd_worker_t *worker)
{
    if (worker == NULL) {
        return KVD_ERR_INVALID;
    }
    pthread_mutex_lock(&worker->mu);
    while (worker->drain_head != NULL) {
        pthread_cond_wait(&worker->done_cv, &worker->mu);
    }
    pthread_mutex_unlock(&worker->mu);
    return KVD_OK;
}

KVD_API kvd_status_t kvd_worker_request_saving(kvd_worker_t *worker,
                                               const char *request_id,
                                               bool *saving_out)
{
    if (worker == NULL || request_id == NULL || saving_out == NULL) {
        return KVD_ERR_INVALID;
    }
    pthread_mutex_lock(&worker->mu);
    *saving_out = kvd_worker_req_saving(worker, request_id);
    pthread_mutex_unlock(&worker->mu);
    return KVD_OK;
}

/* Ends the bound step without committing its saves (loads finish). */
static void step_abandon(kvd_worker_t *w, wstep_t *s, const char *why)
{
    if (s->saves_done || s->detached) {
        return;
    }
    if (!s->loads_started) {
        kvd_worker_loads_start(w, s);
    }
    kvd_worker_step_end(w, s, why);
}

KVD_API kvd_status_t kvd_worker_abort_step(kvd_worker_t *worker)
{
    if (worker == NULL) {
        return KVD_ERR_INVALID;
    }
    if (worker->step != NULL) {
        step_abandon(worker, worker->step, "the engine aborted the step");
    }
    return KVD_OK;
}

KVD_API kvd_status_t kvd_worker_set_namespace(kvd_worker_t *worker,
                                              const kvd_namespace_t *ns,
                                              const kvd_namespace_t *plan_ns)
{
    if (worker == NULL || ns == NULL || plan_ns == NULL) {
        return KVD_ERR_INVALID;
    }
    if (worker->step != NULL) {
        return KVD_ERR_STATE;
    }
    static const kvd_namespace_t zero_ns;
    /* The poller reads cfg.ns under mu (header checks of promotions). */
    pthread_mutex_lock(&worker->mu);
    worker->cfg.ns = *ns;
    worker->cfg.plan_ns = *plan_ns;
    worker->plan_ns =
        memcmp(plan_ns, &zero_ns, sizeof zero_ns) == 0 ? *ns : *plan_ns;
    pthread_mutex_unlock(&worker->mu);
    return KVD_OK;
}

KVD_API kvd_status_t kvd_worker_set_rope(kvd_worker_t *worker,
                                         const kvd_rope_t *rope)
{
    if (worker == NULL) {
        return KVD_ERR_INVALID;
    }
    if (worker->step != NULL) {
        return KVD_ERR_STATE;
    }
    const kvd_object_format_t *f = &worker->cfg.format;
    if (rope != NULL) {
        if (kvd_rope_check(rope, NULL, 0) != KVD_OK ||
            rope->head_dim != f->head_dim) {
            return KVD_ERR_INVALID;
        }
        if (f->num_planes != 2 || kvd_dtype_is_fp8(f->dtype)) {
            return KVD_ERR_UNSUPPORTED;
        }
    }
    /* The poller reads it under mu (header checks of promotions); the pool
     * threads read it without, while they copy an asynchronous load: none
     * may be in flight. */
    pthread_mutex_lock(&worker->mu);
    if (worker->async != NULL) {
        pthread_mutex_unlock(&worker->mu);
        return KVD_ERR_STATE;
    }
    worker->has_rope = rope != NULL;
    if (rope != NULL) {
        worker->rope = *rope;
    }
    __atomic_add_fetch(&worker->rope_gen, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&worker->mu);
    return KVD_OK;
}

KVD_API kvd_status_t kvd_worker_clear_metadata(kvd_worker_t *worker)
{
    if (worker == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_worker_t *w = worker;
    wstep_t *s = w->step;
    if (s == NULL) {
        return KVD_OK;
    }
    step_abandon(w, s, "the step ended without wait_for_save");
    pthread_mutex_lock(&w->mu);
    w->step = NULL;
    /* A step still draining is the committer's to free. */
    bool mine = !s->detached || s->saves_done;
    s->released = true;
    pthread_mutex_unlock(&w->mu);
    if (mine) {
        kvd_worker_step_free(s);
    }
    return KVD_OK;
}
