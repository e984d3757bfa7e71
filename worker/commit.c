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
 * the side streams are drained), the step's synchronous loads are finished
 * as always, and each request with saves is reported as finished saving
 * exactly once, since nothing of it is in flight any more.
 *
 * With async_saves the first way is split: wait_for_save only detaches
 * the step onto the drain list (kvd_worker_step_detach) and returns (its
 * copies end before the next step is bound, kvd_worker_earlier_copies_wait:
 * the engine may reuse blocks from then on); the
 * worker's committer thread ends each drained step, oldest first, once its
 * copy tasks ran (CUDA: it then waits for the side streams, and finishes
 * the step's loads too), with the store's calls outside the worker's lock. The
 * step's keys use the namespace of its bind (a set_namespace in between does
 * not move them). A request saving in several steps in flight is reported once,
 * when the last of them ended.
 */
#include <string.h>

#include "common/failpoint_int.h"
#include "common/log_int.h"
#include "worker/worker_int.h"

/* The store's part: one commit call for the copied objects and one abort
 * call for the others, in the step's key array (ok ones first, then the
 * rest). Only the thread ending the step touches these arrays. */
static size_t saves_store(kvd_worker_t *w, wstep_t *s)
{
    /* A slow store (delay: a busy daemon, a remote one) or a failed commit
     * (an errno: the step's objects are aborted), in tests and benchmarks. */
    int inject = s->n_saves > 0 ? KVD_FAILPOINT("worker.commit") : 0;
    for (size_t i = 0; inject != 0 && i < s->n_saves; i++) {
        if (s->saves[i]->status == KVD_OK) {
            s->saves[i]->status = kvd_status_from_errno(inject);
        }
    }
    size_t ok = 0, bad = s->n_saves;
    for (size_t i = 0; i < s->n_saves; i++) {
        wblock_t *b = s->saves[i];
        size_t at = b->status == KVD_OK ? ok++ : --bad;
        s->save_keys[at].ns = s->ns;
        s->save_keys[at].hash = b->hash;
        s->save_order[at] = b;
    }
    if (ok > 0) {
        (void)kvd_store_commit_part(w->store, s->save_keys, ok, w->part,
                                    s->save_status, NULL);
    }
    if (ok < s->n_saves) {
        (void)kvd_store_abort_part(w->store, s->save_keys + ok, s->n_saves - ok,
                                   w->part, s->save_status + ok);
    }
    return ok;
}

/* Counts what saves_store did (mu held). */
static void saves_count(kvd_worker_t *w, wstep_t *s, size_t ok)
{
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
    w->inflight_save_bytes -= s->save_bytes;
    w->st.saves_inflight -= s->n_saves;
    s->save_bytes = 0;
}

void kvd_worker_saves_commit(kvd_worker_t *w, wstep_t *s)
{
    saves_count(w, s, saves_store(w, s));
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

/* Queues the step's requests with saves as finished saving (mu held; the
 * step's saves_done set). A request is reported when none of its saves is
 * in flight any more: another step still saving for it (async_saves)
 * reports it when that step ends, and this step's room goes back. */
static void reports_queue(kvd_worker_t *w, const wstep_t *s)
{
    for (size_t i = 0; i < s->n_reqs; i++) {
        const wreq_t *r = s->reqs[i];
        if (r == NULL || r->n_saves == 0) {
            continue;
        }
        if (kvd_worker_req_saving(w, r->id)) {
            kvd_worker_queue_unreserve(&w->fin_save, 1);
            continue;
        }
        wfin_t f;
        memcpy(f.id, r->id, sizeof f.id);
        f.async = false;
        kvd_worker_queue_push(w, &w->fin_save, &f);
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
    s->saves_done = true; /* before reports_queue: nothing in flight */
    reports_queue(w, s);
    kvd_worker_notify(w);
    pthread_mutex_unlock(&w->mu);
}

void kvd_worker_step_detach(kvd_worker_t *w, wstep_t *s)
{
    pthread_mutex_lock(&w->mu);
    /* The step's loads are enqueued (host: done); a backend whose tasks
     * only enqueue finishes them with the saves, on the committer. */
    while (!kvd_worker_loads_enqueued(s)) {
        pthread_cond_wait(&w->done_cv, &w->mu);
    }
    s->detached = true;
    s->drain_next = NULL;
    if (w->drain_tail != NULL) {
        w->drain_tail->drain_next = s;
    } else {
        w->drain_head = s;
    }
    w->drain_tail = s;
    pthread_cond_broadcast(&w->done_cv);
    pthread_mutex_unlock(&w->mu);
}

/* async_saves: the copies of earlier steps' saves read the engine's blocks,
 * and from its next step on the engine may give blocks to other requests
 * without telling the connector first (vLLM frees the blocks that left a
 * sliding window or a local-attention chunk while the request runs). So a
 * new step is bound only once those copies ran (host) or are enqueued
 * ahead of anything it enqueues (CUDA: the side streams run them first,
 * and start_load_kv orders the engine's stream after them); only the
 * commits, the store's calls, outlive the step (mu not held). */
void kvd_worker_earlier_copies_wait(kvd_worker_t *w)
{
    pthread_mutex_lock(&w->mu);
    const wstep_t *d = w->drain_head;
    while (d != NULL) {
        if (d->save_tasks_left > 0) {
            pthread_cond_wait(&w->done_cv, &w->mu);
            d = w->drain_head; /* the list may have moved meanwhile */
            continue;
        }
        d = d->drain_next;
    }
    w->order_reads = w->drain_head != NULL;
    pthread_mutex_unlock(&w->mu);
}

kvd_status_t kvd_worker_reads_order(kvd_worker_t *w, void *stream)
{
    if (!w->order_reads) {
        return KVD_OK;
    }
    w->order_reads = false;
    /* A CUDA error recording or waiting on the event (simulated here). */
    kvd_status_t st = KVD_FAILPOINT("worker.reads_order") != 0
                          ? KVD_ERR_IO
                          : w->dev->reads_order(w, stream);
    if (st != KVD_OK) {
        /* The copies are waited for on the CPU instead: once they ran,
         * the engine may write its blocks, so the fence held. Only when
         * that wait fails too is the engine told. */
        KVD_LOG_ERROR("worker: the engine's stream could not be ordered after "
                      "the earlier saves' copies (%s): waiting for them",
                      kvd_status_str(st));
        st = w->dev->drain(w);
    }
    return st;
}

/* Ends the saves of the oldest draining step, whose copies all ran (mu
 * held; dropped around the store's calls, which may be a daemon's). */
static void drain_one(kvd_worker_t *w, wstep_t *s)
{
    /* A committer that falls behind (delay) or is held (block), in tests:
     * the step stays at the head meanwhile, only this thread removes it. */
    pthread_mutex_unlock(&w->mu);
    (void)KVD_FAILPOINT("worker.drain");
    pthread_mutex_lock(&w->mu);
    /* CUDA: the side streams have run the step's copies (and its loads are
     * finished: leases back, failures reported); may drop mu. */
    kvd_worker_copies_finish(w, s);
    pthread_mutex_unlock(&w->mu);
    size_t ok = saves_store(w, s);
    pthread_mutex_lock(&w->mu);
    saves_count(w, s, ok);
    s->saves_done = true;
    w->drain_head = s->drain_next;
    if (w->drain_head == NULL) {
        w->drain_tail = NULL;
    }
    reports_queue(w, s);
    bool release = s->released;
    pthread_cond_broadcast(&w->done_cv);
    kvd_worker_notify(w);
    if (release) {
        pthread_mutex_unlock(&w->mu);
        kvd_worker_step_free(s);
        pthread_mutex_lock(&w->mu);
    }
}

void *kvd_worker_committer_main(void *arg)
{
    kvd_worker_t *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        wstep_t *s = w->drain_head;
        if (s == NULL && w->quit) {
            break;
        }
        if (s == NULL || s->save_tasks_left > 0) {
            pthread_cond_wait(&w->done_cv, &w->mu);
            continue;
        }
        drain_one(w, s);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}
