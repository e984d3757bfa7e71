/*
 * The end of a step's saves: committed, or aborted as a whole.
 *
 * An object becomes visible to lookups only when it is committed, and it
 * must then hold every layer of the step. A step can end three ways:
 * wait_for_save with every layer copied (the objects whose copies
 * succeeded are committed); wait_for_save with a layer the engine never
 * saved although it saves layer by layer (layerwise_saves: the forward pass
 * stopped short); or no wait_for_save at all (kvd_worker_abort_step,
 * clear_metadata, the next bind_metadata, destroy). The last two abort
 * every save of the step: committing them would serve layers the engine
 * never wrote, stale bytes a later lookup would load without an error.
 *
 * Either way the copies already started are waited for first (the
 * reserved slots must not be given back while a copy writes them; CUDA:
 * the side stream is drained), the step's synchronous loads are finished
 * as always, and each request with saves is reported as finished saving
 * exactly once, since nothing of it is in flight any more.
 */
#include <string.h>

#include "common/log_int.h"
#include "worker/worker_int.h"

void kvd_worker_saves_commit(kvd_worker_t *w, wstep_t *s)
{
    /* One commit call for the copied objects and one abort call for the
     * others, in the step's key array (ok ones first, then the rest). */
    size_t ok = 0, bad = s->n_saves;
    for (size_t i = 0; i < s->n_saves; i++) {
        wblock_t *b = s->saves[i];
        size_t at = b->status == KVD_OK ? ok++ : --bad;
        s->save_keys[at].ns = w->cfg.ns;
        s->save_keys[at].hash = b->hash;
        s->save_order[at] = b;
    }
    if (ok > 0) {
        (void)kvd_store_commit(w->store, s->save_keys, ok, s->save_status);
    }
    if (ok < s->n_saves) {
        (void)kvd_store_abort(w->store, s->save_keys + ok, s->n_saves - ok,
                              s->save_status + ok);
    }
    for (size_t i = 0; i < s->n_saves; i++) {
        wblock_t *b = s->save_order[i];
        kvd_status_t st = s->save_status[i];
        if (i < ok && st == KVD_OK) {
            w->st.blocks_saved++;
            w->st.bytes_saved += w->object_bytes;
            continue;
        }
        if (b->aborted) {
            w->st.saves_aborted++;
        } else {
            w->st.saves_dropped++;
        }
        if (st != KVD_OK) {
            KVD_LOG_WARN("worker: block %d of request %s: %s: %s", b->block_id,
                         b->req->id, i < ok ? "commit" : "abort",
                         kvd_status_str(st));
        }
    }
}

/* Marks every save of the step not failed already as aborted (mu held). */
static void saves_abort(wstep_t *s, const char *why)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n_saves; i++) {
        wblock_t *b = s->saves[i];
        if (b->status == KVD_OK) {
            b->status = KVD_ERR_CANCELED;
            b->aborted = true;
            n++;
        }
    }
    if (n > 0) {
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                            "worker: step %llu: %zu saves aborted, none "
                            "committed: %s",
                            (unsigned long long)s->step, n, why);
    }
}

void kvd_worker_step_end(kvd_worker_t *w, wstep_t *s, const char *abort_why)
{
    pthread_mutex_lock(&w->mu);
    while (s->save_tasks_left > 0 || !kvd_worker_loads_enqueued(s)) {
        pthread_cond_wait(&w->done_cv, &w->mu);
    }
    kvd_worker_copies_finish(w, s);
    if (abort_why != NULL) {
        saves_abort(s, abort_why);
    }
    kvd_worker_saves_commit(w, s);
    for (size_t i = 0; i < s->n_reqs; i++) {
        wreq_t *r = s->reqs[i];
        if (r != NULL && r->n_saves > 0) {
            wfin_t f;
            memcpy(f.id, r->id, sizeof f.id);
            f.async = false;
            kvd_worker_queue_push(w, &w->fin_save, &f);
        }
    }
    s->saves_done = true;
    kvd_worker_notify(w);
    pthread_mutex_unlock(&w->mu);
}
