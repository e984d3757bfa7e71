/*
 * The worker's execution: a pool of threads running copy tasks (through
 * the device backend, w->dev: the CPU reference kernels of device_host.c,
 * or the enqueueing of device copies of device_cuda.c), and one poller
 * thread owning the store's completion queue (promotions of DISK-tier
 * objects into the arena).
 *
 * A step's synchronous loads run in two phases. Resolving (engine thread):
 * every block is looked up in the store and leased; a DISK-tier lease is
 * submitted for promotion. Copying: once no promotion of the step is
 * pending, the blocks that resolved are cut into one chunk per thread and
 * one task per (layer, chunk) is queued, layer 0 first, so
 * wait_for_layer_load(0) returns as soon as layer 0 is in place while later
 * layers are still being written. The last task gives the leases back and
 * queues the reports. An asynchronous request goes through the same two
 * phases on its own, with one task for all its layers, and may span steps.
 *
 * Saves: one task per (layer, chunk) of the reserved blocks, queued by
 * save_kv_layer or, for layers it was not called for, by wait_for_save.
 *
 * The CUDA backend uses the same tasks with one chunk per layer (the copies
 * share one stream and one staging buffer, so splitting a layer gains
 * nothing). Its tasks only enqueue: a step's loads are finished (leases
 * back, reports queued) by kvd_worker_copies_finish at wait_for_save, once
 * the stream has run them, and an asynchronous request waits for its own
 * copies on its pool thread before it finishes.
 *
 * The poller sleeps on its condition variable while nothing is
 * outstanding, and in kvd_store_wait (10 ms slices, so the backlog of
 * promotions the store refused for the moment is retried) while something
 * is. Every promotion accepted by the store is polled before the poller
 * leaves, so no completion is lost and no lease leaks.
 */
#include <stdlib.h>
#include <string.h>

#include "common/failpoint_int.h"
#include "common/grow_int.h"
#include "common/log_int.h"
#include "common/time_int.h"
#include "worker/worker_int.h"

#define POLL_BATCH 64u
#define POLL_SLICE_MS 10

/* ---- the task queue (mu held) ------------------------------------------- */

static void task_push(kvd_worker_t *w, wtask_t *t)
{
    t->next = NULL;
    if (w->q_tail != NULL) {
        w->q_tail->next = t;
    } else {
        w->q_head = t;
    }
    w->q_tail = t;
    pthread_cond_signal(&w->task_cv);
}

size_t kvd_worker_chunks(const kvd_worker_t *w, size_t n)
{
    return w->dev->chunks(w, n);
}

/* Queues one task per chunk of `n` blocks for `layer`; returns how many. */
static size_t tasks_queue(kvd_worker_t *w, wstep_t *s, wtask_kind_t kind,
                          uint32_t layer, size_t n)
{
    size_t chunks = kvd_worker_chunks(w, n);
    for (size_t c = 0; c < chunks; c++) {
        /* Room for 2 * layers * chunks tasks was allocated at bind. */
        wtask_t *t = &s->tasks[s->used_tasks++];
        t->kind = kind;
        t->step = s;
        t->layer = layer;
        t->first = n * c / chunks;
        t->count = n * (c + 1) / chunks - t->first;
        t->req = NULL;
        task_push(w, t);
    }
    return chunks;
}

/* ---- failures and reports (mu held) ------------------------------------- */

static void block_fail(wblock_t *b, kvd_status_t status)
{
    if (b->status == KVD_OK) {
        b->status = status;
    }
}

/* Gives back a load's lease; queues its failure, if any. */
static void load_block_finish(kvd_worker_t *w, wblock_t *b)
{
    if (b->leased) {
        /* Released only after the last copy of the block ended: a lease
         * that had expired by then (daemon mode: KVD_ERR_TIMEOUT) may have
         * lost its slot during the copy, so the block is a load error. */
        kvd_status_t s = kvd_store_release(w->store, &b->lease, 1);
        if (s != KVD_OK) {
            KVD_LOG_WARN("worker: lease of block %d (request %s) not given "
                         "back: %s",
                         b->block_id, b->req->id, kvd_status_str(s));
            block_fail(b, s);
        }
        b->leased = false;
    }
    if (b->status != KVD_OK) {
        wfail_t f;
        memcpy(f.id, b->req->id, sizeof f.id);
        f.block_id = b->block_id;
        f.status = b->status;
        kvd_worker_queue_push(w, &w->failed, &f);
        w->st.load_errors++;
        if (b->bad_header) {
            w->st.header_errors++;
        }
    } else {
        w->st.blocks_loaded++;
        w->st.bytes_loaded += w->object_bytes;
    }
}

/* A content load: the rotation from the position its header records to
 * the plan's. A block that needs one the worker cannot do fails (a load
 * error: the engine computes it). */
static void block_delta(kvd_worker_t *w, wblock_t *b)
{
    b->delta = 0;
    if (!b->content) {
        return;
    }
    kvd_object_header_t h;
    if (kvd_object_header_unpack((const uint8_t *)b->obj + w->payload_bytes,
                                 KVD_OBJECT_HEADER_BYTES, &h, NULL,
                                 0) != KVD_OK) {
        b->status = KVD_ERR_CORRUPT; /* checked just before: not reached */
        return;
    }
    b->delta = (int64_t)b->position - (int64_t)h.position;
    if (b->delta != 0 && (!w->has_rope || !w->dev->can_rotate)) {
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                            "worker: block %d (request %s) reused by content "
                            "at another position, but %s: computed instead",
                            b->block_id, b->req->id,
                            w->has_rope ? "this backend cannot rotate keys"
                                        : "no rotary embedding is set "
                                          "(kvd_worker_set_rope)");
        b->status = KVD_ERR_UNSUPPORTED;
    }
}

/* The object `b` leased is the one asked for, as its header says; else
 * the block fails (a load error, never the bytes). The first mismatch is
 * logged with its reason, later ones at DEBUG (counted: header_errors). */
static void block_header_check(kvd_worker_t *w, wblock_t *b)
{
    char why[160] = "";
    if (kvd_object_header_check(&w->store_fmt, &w->cfg.ns, &b->hash, b->obj,
                                b->lease.size_bytes, why,
                                sizeof why) == KVD_OK) {
        block_delta(w, b);
        return;
    }
    bool first =
        !__atomic_exchange_n(&w->header_logged, true, __ATOMIC_RELAXED);
    KVD_LOG(first ? KVD_LOG_LEVEL_WARN : KVD_LOG_LEVEL_DEBUG,
            "worker: block %d (request %s) not loaded: %s%s", b->block_id,
            b->req->id, why,
            first ? " (further mismatches are counted in header_errors)" : "");
    b->status = KVD_ERR_CORRUPT;
    b->bad_header = true;
}

static void req_loads_report(kvd_worker_t *w, wreq_t *r)
{
    wfin_t f;
    memcpy(f.id, r->id, sizeof f.id);
    f.async = r->async_load;
    kvd_worker_queue_push(w, &w->fin_load, &f);
    /* Its timing, for the leader's gate: the blocks that loaded. */
    uint64_t ok = 0;
    for (size_t i = 0; i < r->n_loads; i++) {
        ok += r->loads[i].status == KVD_OK;
    }
    if (ok > 0 && r->load_start_ns != 0) {
        wtier_t *t = &w->tier_acc[r->load_disk ? 1 : 0];
        t->loads++;
        t->blocks += ok;
        t->bytes += ok * w->object_bytes;
        t->nanos += kvd_time_now_ns() - r->load_start_ns;
    }
}

/* Every copy of the step's synchronous loads ran (or none was needed). */
static void step_loads_finish(kvd_worker_t *w, wstep_t *s)
{
    for (size_t i = 0; i < s->n_sync; i++) {
        load_block_finish(w, s->sync[i]);
    }
    for (size_t i = 0; i < s->n_reqs; i++) {
        wreq_t *r = s->reqs[i];
        if (r != NULL && !r->async_load && r->n_loads > 0) {
            req_loads_report(w, r);
        }
    }
    s->loads_done = true;
    pthread_cond_broadcast(&w->done_cv);
    kvd_worker_notify(w);
}

/* The step's promotions are done: queue the copies. */
static void step_loads_issue(kvd_worker_t *w, wstep_t *s)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n_sync; i++) {
        wblock_t *b = s->sync[i];
        if (b->status == KVD_OK) {
            s->load_ids[n] = b->block_id;
            s->load_objs[n] = b->obj;
            s->load_deltas[n] = b->delta;
            s->any_delta = s->any_delta || b->delta != 0;
            s->load_blocks[n] = b;
            n++;
        }
    }
    s->n_load_ok = n;
    s->loads_issued = true;
    if (n == 0) {
        step_loads_finish(w, s);
        return;
    }
    for (uint32_t l = 0; l < w->cfg.format.num_layers; l++) {
        size_t q = tasks_queue(w, s, WTASK_LOAD, l, n);
        s->layer_left[l] = (uint32_t)q;
        s->load_tasks_left += q;
    }
}

static void async_queue(kvd_worker_t *w, wreq_t *r)
{
    r->task.kind = WTASK_ASYNC;
    r->task.req = r;
    task_push(w, &r->task);
}

/* A promotion of `b` finished (or was never accepted). */
static void promotion_done(kvd_worker_t *w, wblock_t *b, kvd_status_t status,
                           const kvd_store_lease_t *lease)
{
    if (status == KVD_OK) {
        b->lease = *lease;
        b->obj = kvd_store_lease_ptr(w->store, lease);
        w->st.promotions++;
        if (b->obj == NULL || lease->size_bytes != w->object_bytes) {
            block_fail(b, KVD_ERR_CORRUPT);
        } else {
            block_header_check(w, b);
        }
    } else {
        /* The store gave the DISK lease back with the failure. */
        b->leased = false;
        block_fail(b, status);
    }
    wreq_t *r = b->req;
    if (r->async_load) {
        if (--r->gets_pending == 0) {
            async_queue(w, r);
        }
    } else if (--w->step->gets_pending == 0) {
        step_loads_issue(w, w->step);
    }
}

/* ---- resolving ---------------------------------------------------------- */

/* Takes the lease the lookup of `b` returned; a DISK lease is added to
 * `gets`. */
static void block_accept(kvd_worker_t *w, wblock_t *b,
                         const kvd_store_lease_t *lease, kvd_store_get_t *gets,
                         size_t *num_gets)
{
    b->lease = *lease;
    b->leased = true;
    if (lease->tier != KVD_STORE_TIER_HOST) {
        b->req->load_disk = true;
    }
    if (b->lease.size_bytes != w->object_bytes) {
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                            "worker: object of block %d (request %s) has %llu "
                            "bytes, the format %zu",
                            b->block_id, b->req->id,
                            (unsigned long long)b->lease.size_bytes,
                            w->object_bytes);
        b->status = KVD_ERR_CORRUPT;
        return;
    }
    if (b->lease.tier == KVD_STORE_TIER_DISK) {
        gets[*num_gets].lease = b->lease;
        gets[*num_gets].user_data = (uint64_t)(uintptr_t)b;
        (*num_gets)++;
        return;
    }
    b->obj = kvd_store_lease_ptr(w->store, &b->lease);
    if (b->obj == NULL) {
        b->status = KVD_ERR_CORRUPT;
        return;
    }
    block_header_check(w, b);
}

/* Length of the run of blocks from `i` with no hash twice (a store batch
 * names each key once; two requests of a step may share a prefix). `seen`
 * is an open-addressing set of 2^bits slots, cleared here. */
static size_t blocks_unique_run(wblock_t **blocks, size_t i, size_t n,
                                const wblock_t **seen, unsigned bits)
{
    size_t mask = ((size_t)1 << bits) - 1;
    memset(seen, 0, (mask + 1) * sizeof *seen);
    size_t k = i;
    for (; k < n; k++) {
        uint64_t h;
        memcpy(&h, blocks[k]->hash.bytes, sizeof h);
        size_t slot = (size_t)(h * 0x9E3779B97F4A7C15ull >> 20) & mask;
        bool dup = false;
        while (seen[slot] != NULL) {
            if (memcmp(seen[slot]->hash.bytes, blocks[k]->hash.bytes,
                       sizeof blocks[k]->hash.bytes) == 0) {
                dup = true;
                break;
            }
            slot = (slot + 1) & mask;
        }
        if (dup) {
            break;
        }
        seen[slot] = blocks[k];
    }
    return k - i;
}

/* Looks blocks up and leases them, one store call per run of stored blocks
 * rather than one per block (with the store behind kvdepotd each call is
 * an RPC): a lookup matches a prefix of the list, the first block it
 * misses is marked missing, and the rest is looked up again. */
static void blocks_resolve(kvd_worker_t *w, wblock_t **blocks, size_t n,
                           kvd_store_get_t *gets, size_t *num_gets)
{
    unsigned bits = 4;
    while (((size_t)1 << bits) < 2 * n) {
        bits++;
    }
    kvd_block_hash_t *hashes = malloc((n ? n : 1) * sizeof *hashes);
    kvd_store_lease_t *leases = malloc((n ? n : 1) * sizeof *leases);
    const wblock_t **seen = malloc(((size_t)1 << bits) * sizeof *seen);
    size_t i = 0;
    while (i < n) {
        if (hashes == NULL || leases == NULL || seen == NULL) {
            blocks[i++]->status = KVD_ERR_NOMEM;
            continue;
        }
        size_t run = blocks_unique_run(blocks, i, n, seen, bits);
        for (size_t k = 0; k < run; k++) {
            hashes[k] = blocks[i + k]->hash;
        }
        size_t m = 0;
        kvd_status_t s =
            kvd_store_lookup(w->store, &w->cfg.ns, hashes, run, leases, &m);
        if (s != KVD_OK) {
            for (size_t k = 0; k < run; k++) {
                blocks[i + k]->status = s;
            }
            i += run;
            continue;
        }
        for (size_t j = 0; j < m; j++) {
            block_accept(w, blocks[i + j], &leases[j], gets, num_gets);
        }
        i += m;
        if (m < run) {
            blocks[i++]->status = KVD_ERR_NOT_FOUND;
        }
    }
    free(seen);
    free(leases);
    free(hashes);
}

/* Submits promotions; what the store does not take now waits in the
 * backlog for the poller. The owners' pending counts include them all. */
static void gets_submit(kvd_worker_t *w, const kvd_store_get_t *gets, size_t n)
{
    size_t accepted = 0;
    kvd_status_t s =
        n > 0 ? kvd_store_get_submit(w->store, gets, n, &accepted) : KVD_OK;
    pthread_mutex_lock(&w->mu);
    if (s != KVD_OK && s != KVD_ERR_BUSY) {
        KVD_LOG_WARN("worker: %zu promotions refused: %s", n,
                     kvd_status_str(s));
        for (size_t i = 0; i < n; i++) {
            wblock_t *b = (wblock_t *)(uintptr_t)gets[i].user_data;
            (void)kvd_store_release(w->store, &b->lease, 1);
            promotion_done(w, b, s, NULL);
        }
        pthread_mutex_unlock(&w->mu);
        return;
    }
    w->gets_outstanding += accepted;
    size_t rest = n - accepted;
    if (rest > 0) {
        if (!kvd_grow((void **)&w->backlog, &w->cap_backlog,
                      w->n_backlog + rest, sizeof *w->backlog)) {
            for (size_t i = accepted; i < n; i++) {
                wblock_t *b = (wblock_t *)(uintptr_t)gets[i].user_data;
                (void)kvd_store_release(w->store, &b->lease, 1);
                promotion_done(w, b, KVD_ERR_NOMEM, NULL);
            }
            rest = 0;
        }
        if (rest > 0) {
            memcpy(w->backlog + w->n_backlog, gets + accepted,
                   rest * sizeof *gets);
            w->n_backlog += rest;
        }
    }
    pthread_cond_signal(&w->poll_cv);
    pthread_mutex_unlock(&w->mu);
}

/* Puts `r` on the asynchronous list with `num_gets` promotions pending
 * (its blocks are resolved); queues its copy when none is. */
static void async_begin(kvd_worker_t *w, wreq_t *r, size_t num_gets)
{
    pthread_mutex_lock(&w->mu);
    r->next = w->async;
    w->async = r;
    w->async_active++;
    w->st.async_loads_active = w->async_active;
    r->gets_pending = num_gets;
    if (num_gets == 0) {
        async_queue(w, r);
    }
    pthread_mutex_unlock(&w->mu);
}

void kvd_worker_loads_start(kvd_worker_t *w, wstep_t *s)
{
    s->loads_started = true;
    uint64_t now = kvd_time_now_ns();
    for (size_t i = 0; i < s->n_reqs; i++) {
        s->reqs[i]->load_start_ns = now;
    }
    size_t most = s->n_sync;
    for (size_t i = 0; i < s->n_reqs; i++) {
        if (s->reqs[i]->async_load && s->reqs[i]->n_loads > most) {
            most = s->reqs[i]->n_loads;
        }
    }
    kvd_store_get_t stack[32];
    kvd_store_get_t *gets = most <= 32 ? stack : malloc(most * sizeof *gets);
    for (size_t i = 0; i < s->n_reqs; i++) {
        wreq_t *r = s->reqs[i];
        if (!r->async_load) {
            continue;
        }
        /* An asynchronous load with no block to copy (the engine holds none
         * of its positions) still finishes, and is reported, like any. */
        size_t n = 0;
        wblock_t **list = malloc((r->n_loads + 1) * sizeof *list);
        for (size_t b = 0; b < r->n_loads; b++) {
            if (list != NULL) {
                list[b] = &r->loads[b];
            }
            if (gets == NULL || list == NULL) {
                r->loads[b].status = KVD_ERR_NOMEM;
            }
        }
        if (gets != NULL && list != NULL) {
            blocks_resolve(w, list, r->n_loads, gets, &n);
        }
        free(list);
        /* The asynchronous list owns it from here; it may finish (and be
         * freed) as soon as it is on the list. */
        s->reqs[i] = NULL;
        async_begin(w, r, n);
        gets_submit(w, gets, n);
    }
    size_t n = 0;
    if (gets != NULL) {
        blocks_resolve(w, s->sync, s->n_sync, gets, &n);
    } else {
        for (size_t i = 0; i < s->n_sync; i++) {
            s->sync[i]->status = KVD_ERR_NOMEM;
        }
    }
    pthread_mutex_lock(&w->mu);
    s->gets_pending = n;
    if (n == 0) {
        step_loads_issue(w, s);
    }
    pthread_mutex_unlock(&w->mu);
    gets_submit(w, gets, n);
    if (gets != stack) {
        free(gets);
    }
}

void kvd_worker_saves_issue(kvd_worker_t *w, wstep_t *s, uint32_t layer)
{
    if (s->save_issued[layer]) {
        return;
    }
    s->save_issued[layer] = true;
    if (s->n_saves > 0) {
        s->save_tasks_left += tasks_queue(w, s, WTASK_SAVE, layer, s->n_saves);
    }
}

bool kvd_worker_loads_enqueued(const wstep_t *s)
{
    return s->loads_done || (s->loads_issued && s->load_tasks_left == 0);
}

void kvd_worker_copies_finish(kvd_worker_t *w, wstep_t *s)
{
    if (w->dev->tasks_complete || (s->loads_done && s->n_saves == 0)) {
        return; /* host: the tasks did the copies themselves */
    }
    /* Every task of the step ran, so nothing else touches the step while
     * mu is dropped; promotions of the step are done (loads issued). */
    pthread_mutex_unlock(&w->mu);
    kvd_status_t st = w->dev->drain(w);
    pthread_mutex_lock(&w->mu);
    if (st != KVD_OK) {
        /* A device fault: no copy of the step can be trusted. */
        KVD_LOG_ERROR("worker: cuda: step %llu's copies failed: %s",
                      (unsigned long long)s->step, kvd_status_str(st));
        for (size_t i = 0; !s->loads_done && i < s->n_load_ok; i++) {
            block_fail(s->load_blocks[i], st);
        }
        for (size_t i = 0; i < s->n_saves; i++) {
            block_fail(s->saves[i], st);
        }
    }
    if (w->dev->step_done != NULL) {
        w->dev->step_done(w, s);
    }
    if (!s->loads_done) {
        step_loads_finish(w, s);
    }
}

/* ---- tasks -------------------------------------------------------------- */

static void run_load(kvd_worker_t *w, wstep_t *s, const wtask_t *t)
{
    kvd_status_t st = w->dev->load(w, s, t->layer, t->first, t->count);
    pthread_mutex_lock(&w->mu);
    if (st != KVD_OK) {
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                            "worker: layer %u of %zu loaded blocks not "
                            "written: %s",
                            t->layer, t->count, kvd_status_str(st));
        for (size_t i = 0; i < t->count; i++) {
            block_fail(s->load_blocks[t->first + i], st);
        }
    }
    s->layer_left[t->layer]--;
    if (--s->load_tasks_left == 0 && w->dev->tasks_complete) {
        step_loads_finish(w, s);
    } else if (s->layer_left[t->layer] == 0) {
        /* CUDA: enqueued only; finished at wait_for_save. */
        pthread_cond_broadcast(&w->done_cv);
    }
    pthread_mutex_unlock(&w->mu);
}

static void run_save(kvd_worker_t *w, wstep_t *s, const wtask_t *t)
{
    /* A slow (delay) or stalled (block) copy out of the cache, or one that
     * fails, in tests and benchmarks. */
    int inject = KVD_FAILPOINT("worker.save");
    kvd_status_t st = inject != 0
                          ? kvd_status_from_errno(inject)
                          : w->dev->save(w, s, t->layer, t->first, t->count);
    pthread_mutex_lock(&w->mu);
    if (st != KVD_OK) {
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                            "worker: layer %u of %zu saved blocks not "
                            "copied: %s",
                            t->layer, t->count, kvd_status_str(st));
        for (size_t i = 0; i < t->count; i++) {
            block_fail(s->saves[t->first + i], st);
        }
    }
    if (--s->save_tasks_left == 0) {
        pthread_cond_broadcast(&w->done_cv);
    }
    pthread_mutex_unlock(&w->mu);
}

static void run_async(kvd_worker_t *w, wreq_t *r)
{
    pthread_mutex_lock(&w->mu);
    bool canceled = r->canceled;
    r->running = true;
    pthread_mutex_unlock(&w->mu);

    size_t n = 0;
    bool any_delta = false;
    for (size_t i = 0; i < r->n_loads && !canceled; i++) {
        wblock_t *b = &r->loads[i];
        if (b->status == KVD_OK) {
            r->ids[n] = b->block_id;
            r->objs[n] = b->obj;
            r->deltas[n] = b->delta;
            any_delta = any_delta || b->delta != 0;
            n++;
        }
    }
    kvd_status_t st = KVD_OK;
    if (n > 0) {
        /* Returns once the copies ran: the leases may go. */
        st = w->dev->load_async(w, r->ids, r->objs,
                                any_delta ? r->deltas : NULL, n);
    }
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < r->n_loads; i++) {
        if (canceled) {
            block_fail(&r->loads[i], KVD_ERR_CANCELED);
        } else if (st != KVD_OK) {
            block_fail(&r->loads[i], st);
        }
        load_block_finish(w, &r->loads[i]);
    }
    req_loads_report(w, r);
    for (wreq_t **p = &w->async; *p != NULL; p = &(*p)->next) {
        if (*p == r) {
            *p = r->next;
            break;
        }
    }
    w->async_active--;
    w->st.async_loads_active = w->async_active;
    pthread_cond_broadcast(&w->done_cv);
    kvd_worker_notify(w);
    pthread_mutex_unlock(&w->mu);
    kvd_worker_req_free(r);
}

static void *pool_main(void *arg)
{
    kvd_worker_t *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (w->q_head == NULL && !w->quit) {
            pthread_cond_wait(&w->task_cv, &w->mu);
        }
        wtask_t *t = w->q_head;
        if (t == NULL) {
            pthread_mutex_unlock(&w->mu);
            return NULL; /* quit, and nothing queued */
        }
        w->q_head = t->next;
        if (w->q_head == NULL) {
            w->q_tail = NULL;
        }
        pthread_mutex_unlock(&w->mu);
        switch (t->kind) {
        case WTASK_LOAD: run_load(w, t->step, t); break;
        case WTASK_SAVE: run_save(w, t->step, t); break;
        case WTASK_ASYNC: run_async(w, t->req); break;
        }
    }
}

/* ---- the poller --------------------------------------------------------- */

/* Submits what the backlog holds (mu held; drops it around the call). */
static void backlog_retry(kvd_worker_t *w)
{
    kvd_store_get_t batch[POLL_BATCH];
    size_t n = w->n_backlog < POLL_BATCH ? w->n_backlog : POLL_BATCH;
    memcpy(batch, w->backlog, n * sizeof *batch);
    if (w->stopping) {
        /* Never submitted: the DISK leases are still ours. */
        for (size_t i = 0; i < n; i++) {
            wblock_t *b = (wblock_t *)(uintptr_t)batch[i].user_data;
            (void)kvd_store_release(w->store, &b->lease, 1);
            promotion_done(w, b, KVD_ERR_CANCELED, NULL);
        }
    } else {
        size_t accepted = 0;
        pthread_mutex_unlock(&w->mu);
        kvd_status_t s = kvd_store_get_submit(w->store, batch, n, &accepted);
        pthread_mutex_lock(&w->mu);
        if (s != KVD_OK && s != KVD_ERR_BUSY) {
            for (size_t i = 0; i < n; i++) {
                wblock_t *b = (wblock_t *)(uintptr_t)batch[i].user_data;
                (void)kvd_store_release(w->store, &b->lease, 1);
                promotion_done(w, b, s, NULL);
            }
            accepted = n;
        } else {
            w->gets_outstanding += accepted;
        }
        n = accepted;
    }
    /* Only the poller removes from the backlog, so its head is `batch`. */
    memmove(w->backlog, w->backlog + n, (w->n_backlog - n) * sizeof *batch);
    w->n_backlog -= n;
}

static void *poller_main(void *arg)
{
    kvd_worker_t *w = arg;
    kvd_store_completion_t comps[POLL_BATCH];
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->gets_outstanding == 0 && w->n_backlog == 0 && !w->quit) {
            pthread_cond_wait(&w->poll_cv, &w->mu);
        }
        if (w->gets_outstanding == 0 && w->n_backlog == 0) {
            break; /* quit, and nothing left to poll */
        }
        if (w->n_backlog > 0) {
            backlog_retry(w);
        }
        pthread_mutex_unlock(&w->mu);
        pthread_mutex_lock(w->poll_mu);
        size_t n = kvd_store_poll(w->store, comps, POLL_BATCH);
        if (n == 0) {
            (void)kvd_store_wait(w->store, POLL_SLICE_MS);
            n = kvd_store_poll(w->store, comps, POLL_BATCH);
        }
        pthread_mutex_unlock(w->poll_mu);
        /* Another worker's promotions (same store) go to it, under its lock
         * only: it cannot leave while they are outstanding. */
        size_t own = 0;
        for (size_t i = 0; i < n; i++) {
            wblock_t *b = (wblock_t *)(uintptr_t)comps[i].user_data;
            kvd_worker_t *o = b->worker;
            if (o == w) {
                comps[own++] = comps[i];
                continue;
            }
            pthread_mutex_lock(&o->mu);
            promotion_done(o, b, comps[i].status, &comps[i].lease);
            o->gets_outstanding--;
            pthread_cond_broadcast(&o->poll_cv);
            pthread_mutex_unlock(&o->mu);
        }
        pthread_mutex_lock(&w->mu);
        for (size_t i = 0; i < own; i++) {
            wblock_t *b = (wblock_t *)(uintptr_t)comps[i].user_data;
            promotion_done(w, b, comps[i].status, &comps[i].lease);
        }
        w->gets_outstanding -= own;
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* ---- start and stop ----------------------------------------------------- */

kvd_status_t kvd_worker_exec_start(kvd_worker_t *w)
{
    w->threads = calloc(w->num_threads, sizeof *w->threads);
    if (w->threads == NULL) {
        return KVD_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < w->num_threads; i++) {
        if (pthread_create(&w->threads[i], NULL, pool_main, w) != 0) {
            return KVD_ERR_NOMEM;
        }
        w->threads_started++;
    }
    if (pthread_create(&w->poller, NULL, poller_main, w) != 0) {
        return KVD_ERR_NOMEM;
    }
    w->poller_started = true;
    if (w->async_saves) {
        if (pthread_create(&w->committer, NULL, kvd_worker_committer_main, w) !=
            0) {
            return KVD_ERR_NOMEM;
        }
        w->committer_started = true;
    }
    return KVD_OK;
}

void kvd_worker_exec_stop(kvd_worker_t *w)
{
    pthread_mutex_lock(&w->mu);
    w->stopping = true;
    for (wreq_t *r = w->async; r != NULL; r = r->next) {
        r->canceled = true;
    }
    pthread_cond_broadcast(&w->poll_cv);
    /* Asynchronous requests finish through promotions and tasks; both
     * threads are still running. */
    while (w->async_active > 0 && w->threads_started > 0 && w->poller_started) {
        pthread_cond_wait(&w->done_cv, &w->mu);
    }
    w->quit = true;
    pthread_cond_broadcast(&w->poll_cv);
    pthread_cond_broadcast(&w->task_cv);
    pthread_cond_broadcast(&w->done_cv); /* the committer */
    pthread_mutex_unlock(&w->mu);
    if (w->poller_started) {
        pthread_join(w->poller, NULL);
        w->poller_started = false;
    }
    for (uint32_t i = 0; i < w->threads_started; i++) {
        pthread_join(w->threads[i], NULL);
    }
    w->threads_started = 0;
    /* After the pool: the draining steps' copies have all run, so the
     * committer commits them and leaves. */
    if (w->committer_started) {
        pthread_join(w->committer, NULL);
        w->committer_started = false;
    }
}
