/*
 * The worker's reports (include/kvdepot/worker.h kvd_worker_get_finished):
 * what the background threads queued as finished (saves, loads, failed
 * blocks, each request once) and the loads' timings per tier, handed to
 * the engine and packed as a kvdepot.v1.WorkerReport for the leader; and
 * the worker's counters.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/grow_int.h"
#include "common/log_int.h"
#include "proto/kvd_proto.h"
#include "worker/worker_int.h"

/* ---- reports ----------------------------------------------------------- */

static int fin_cmp(const void *a, const void *b)
{
    return strcmp(((const wfin_t *)a)->id, ((const wfin_t *)b)->id);
}

static int fail_cmp(const void *a, const void *b)
{
    const wfail_t *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    return c != 0 ? c
                  : (x->block_id > y->block_id) - (x->block_id < y->block_id);
}

/* Sorts and merges entries for the same request (a request finishing in
 * two steps is reported once); returns the new count. */
static size_t fin_unique(wfin_t *v, size_t n)
{
    qsort(v, n, sizeof *v, fin_cmp);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k > 0 && strcmp(v[k - 1].id, v[i].id) == 0) {
            v[k - 1].async |= v[i].async;
        } else {
            v[k++] = v[i];
        }
    }
    return k;
}

static size_t fail_unique(wfail_t *v, size_t n)
{
    qsort(v, n, sizeof *v, fail_cmp);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k == 0 || fail_cmp(&v[k - 1], &v[i]) != 0) {
            v[k++] = v[i];
        }
    }
    return k;
}

/* Moves up to `max` items from the front of `q` into `dst` (mu held). */
static size_t queue_take(wqueue_t *q, void *dst, size_t max)
{
    size_t n = q->num < max ? q->num : max;
    if (n == 0) {
        return 0; /* items may still be NULL */
    }
    memcpy(dst, q->items, n * q->item_bytes);
    memmove(q->items, (char *)q->items + n * q->item_bytes,
            (q->num - n) * q->item_bytes);
    q->num -= n;
    return n;
}

static kvd_status_t report_pack(kvd_worker_t *w, kvd_worker_finished_t *out,
                                const wtier_t *tiers)
{
    kvd_pb_worker_report_t rep = KVDEPOT__V1__WORKER_REPORT__INIT;
    kvd_pb_tier_load_t tl[2];
    kvd_pb_tier_load_t *tlp[2];
    for (unsigned t = 0; t < 2; t++) {
        if (tiers[t].blocks == 0) {
            continue;
        }
        kvd_pb_tier_load_t init = KVDEPOT__V1__TIER_LOAD__INIT;
        kvd_pb_tier_load_t *e = &tl[rep.n_tier_loads];
        *e = init;
        e->tier = t == 0 ? KVDEPOT__V1__TIER__TIER_HOST
                         : KVDEPOT__V1__TIER__TIER_DISK;
        /* Within the protocol's ranges; sums this large are not met. */
        e->loads = (uint32_t)(tiers[t].loads < KVD_PROTO_MAX_BLOCKS_PER_PLAN
                                  ? tiers[t].loads
                                  : KVD_PROTO_MAX_BLOCKS_PER_PLAN);
        e->blocks = (uint32_t)(tiers[t].blocks < KVD_PROTO_MAX_BLOCKS_PER_PLAN
                                   ? tiers[t].blocks
                                   : KVD_PROTO_MAX_BLOCKS_PER_PLAN);
        e->bytes = tiers[t].bytes;
        e->nanos = tiers[t].nanos;
        tlp[rep.n_tier_loads++] = e;
    }
    rep.tier_loads = tlp;
    rep.step = out->step;
    rep.worker_rank = w->cfg.worker_rank;
    rep.n_finished_saving = out->num_finished_saving;
    rep.finished_saving = (char **)out->finished_saving;
    rep.n_finished_loading = out->num_finished_loading;
    rep.finished_loading = (char **)out->finished_loading;
    size_t nf = out->num_failed_loads;
    kvd_pb_failed_load_t *fl = calloc(nf + 1, sizeof *fl);
    kvd_pb_failed_load_t **flp = calloc(nf + 1, sizeof *flp);
    kvd_status_t st = KVD_ERR_NOMEM;
    if (fl != NULL && flp != NULL) {
        for (size_t i = 0; i < nf; i++) {
            kvd_pb_failed_load_t init = KVDEPOT__V1__FAILED_LOAD__INIT;
            fl[i] = init;
            fl[i].request_id = (char *)out->failed_loads[i].request_id;
            fl[i].block_id = (uint32_t)out->failed_loads[i].block_id;
            fl[i].status = out->failed_loads[i].status;
            flp[i] = &fl[i];
        }
        rep.n_failed_loads = nf;
        rep.failed_loads = flp;
        char why[200] = "";
        free(w->report);
        w->report = NULL;
        size_t len = 0;
        st = kvd_proto_worker_report_pack_alloc(&rep, &w->report, &len, why,
                                                sizeof why);
        if (st != KVD_OK) {
            KVD_LOG_ERROR("worker: report not packed: %s", why);
        } else {
            out->report = w->report;
            out->report_len = len;
        }
    }
    free(fl);
    free(flp);
    return st;
}

KVD_API kvd_status_t kvd_worker_get_finished(
    kvd_worker_t *worker, const char *const *finished_req_ids,
    size_t num_finished_req_ids, kvd_worker_finished_t *out)
{
    if (worker == NULL || out == NULL ||
        (finished_req_ids == NULL && num_finished_req_ids > 0)) {
        return KVD_ERR_INVALID;
    }
    kvd_worker_t *w = worker;
    uint64_t drained;
    ssize_t rd = read(w->efd, &drained, sizeof drained);
    (void)rd; /* EAGAIN: nothing was signalled */
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < num_finished_req_ids; i++) {
        for (wreq_t *r = w->async; r != NULL && finished_req_ids[i] != NULL;
             r = r->next) {
            if (!r->running && strcmp(r->id, finished_req_ids[i]) == 0) {
                r->canceled = true;
            }
        }
    }
    size_t ns = w->fin_save.num < KVD_PROTO_MAX_REQUESTS
                    ? w->fin_save.num
                    : KVD_PROTO_MAX_REQUESTS;
    size_t nl = w->fin_load.num < KVD_PROTO_MAX_REQUESTS
                    ? w->fin_load.num
                    : KVD_PROTO_MAX_REQUESTS;
    size_t nf = w->failed.num < KVD_PROTO_MAX_BLOCKS_PER_PLAN
                    ? w->failed.num
                    : KVD_PROTO_MAX_BLOCKS_PER_PLAN;
    bool ok = kvd_grow((void **)&w->taken_save, &w->cap_taken_save, ns + 1,
                       sizeof *w->taken_save) &&
              kvd_grow((void **)&w->taken_load, &w->cap_taken_load, nl + 1,
                       sizeof *w->taken_load) &&
              kvd_grow((void **)&w->taken_failed, &w->cap_taken_failed, nf + 1,
                       sizeof *w->taken_failed);
    ok = ok &&
         kvd_grow((void **)&w->out_save, &w->cap_out_save, ns + 1,
                  sizeof *w->out_save) &&
         kvd_grow((void **)&w->out_load, &w->cap_out_load, nl + 1,
                  sizeof *w->out_load) &&
         kvd_grow((void **)&w->out_async, &w->cap_out_async, nl + 1,
                  sizeof *w->out_async) &&
         kvd_grow((void **)&w->out_failed, &w->cap_out_failed, nf + 1,
                  sizeof *w->out_failed);
    if (!ok) {
        pthread_mutex_unlock(&w->mu);
        return KVD_ERR_NOMEM;
    }
    ns = queue_take(&w->fin_save, w->taken_save, ns);
    /* A request reported when an earlier step's saves ended but saving
     * again in a step not ended yet (async_saves): that step reports it. */
    size_t kept = 0;
    for (size_t i = 0; i < ns; i++) {
        if (!kvd_worker_req_saving(w, w->taken_save[i].id)) {
            w->taken_save[kept++] = w->taken_save[i];
        }
    }
    ns = kept;
    nl = queue_take(&w->fin_load, w->taken_load, nl);
    nf = queue_take(&w->failed, w->taken_failed, nf);
    wtier_t tiers[2];
    memcpy(tiers, w->tier_acc, sizeof tiers);
    memset(w->tier_acc, 0, sizeof w->tier_acc);
    uint64_t step = w->last_step;
    if (w->fin_save.num + w->fin_load.num + w->failed.num > 0) {
        kvd_worker_notify(w); /* more than one report's worth */
    }
    pthread_mutex_unlock(&w->mu);

    ns = fin_unique(w->taken_save, ns);
    nl = fin_unique(w->taken_load, nl);
    nf = fail_unique(w->taken_failed, nf);
    for (size_t i = 0; i < ns; i++) {
        w->out_save[i] = w->taken_save[i].id;
    }
    for (size_t i = 0; i < nl; i++) {
        w->out_load[i] = w->taken_load[i].id;
        w->out_async[i] = w->taken_load[i].async;
    }
    for (size_t i = 0; i < nf; i++) {
        w->out_failed[i].request_id = w->taken_failed[i].id;
        w->out_failed[i].block_id = w->taken_failed[i].block_id;
        w->out_failed[i].status = w->taken_failed[i].status;
    }
    kvd_worker_finished_t f = {0};
    f.step = step;
    f.finished_saving = w->out_save;
    f.num_finished_saving = ns;
    f.finished_loading = w->out_load;
    f.loading_async = w->out_async;
    f.num_finished_loading = nl;
    f.failed_loads = w->out_failed;
    f.num_failed_loads = nf;
    kvd_status_t st = report_pack(w, &f, tiers);
    if (st != KVD_OK) {
        return st;
    }
    *out = f;
    return KVD_OK;
}

KVD_API int kvd_worker_fd(kvd_worker_t *worker)
{
    return worker == NULL ? -1 : worker->efd;
}

KVD_API kvd_status_t kvd_worker_stats(kvd_worker_t *worker,
                                      kvd_worker_stats_t *out)
{
    if (worker == NULL || out == NULL) {
        return KVD_ERR_INVALID;
    }
    pthread_mutex_lock(&worker->mu);
    *out = worker->st;
    pthread_mutex_unlock(&worker->mu);
    out->copy_ops = atomic_load(&worker->copy_ops);
    return KVD_OK;
}
