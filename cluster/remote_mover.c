/*
 * The mover thread of a clustered node (cluster/remote.h). Keys saved
 * here are queued as pushes (an OFFER to each home other than this node),
 * keys offered here as pulls (a FETCH from the node that offered them);
 * the mover takes them in batches, grouped per node and namespace. A
 * failed push or pull is tried again later, a few times. It also repairs:
 * when a node joins the view (or this node starts), or the view is fresh
 * again after being stale, it scans the local store and offers again the
 * objects whose homes include such a node.
 *
 * Threading: kvd_remote_saved and kvd_remote_on_offer from any thread
 * (they only queue, never block); the rest on the mover.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster/placement.h"
#include "cluster/remote_int.h"
#include "common/failpoint_int.h"
#include "common/log_int.h"
#include "common/time_int.h"

#define REMOTE_BATCH 1024u /* jobs the mover takes at once */
#define REMOTE_PULL_TIMEOUT_MS 30000u
#define REMOTE_REPAIR_BATCH 256u /* objects scanned per mover turn */
#define REMOTE_TICK_MS 200u      /* the mover looks at the view this often */
/* A push whose offer failed, or a pull whose fetch failed, is tried again
 * after 0.5, 1 and 2 s (a peer restarting, a connection being set up, a
 * short partition), then given up; at most REMOTE_RETRIES wait at once. */
#define REMOTE_RETRY_MAX 3u
#define REMOTE_RETRY_BASE_MS 500u

static bool enqueue(kvd_remote_t *r, const remote_job_t *j)
{
    pthread_mutex_lock(&r->mu);
    bool ok = r->count < r->cfg.queue && !r->stop;
    if (ok) {
        r->jobs[(r->head + r->count) % r->cfg.queue] = *j;
        r->count++;
        pthread_cond_signal(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    if (!ok) {
        kvd_remote_count(&r->stats.dropped, 1);
    }
    return ok;
}

void kvd_remote_saved(kvd_remote_t *r, const kvd_namespace_t *ns,
                      const kvd_block_hash_t *hashes, size_t n,
                      uint64_t object_bytes, uint32_t tenant)
{
    if (r == NULL || n == 0) {
        return;
    }
    remote_job_t j;
    memset(&j, 0, sizeof j);
    j.kind = JOB_PUSH;
    j.ns = *ns;
    j.size = object_bytes;
    j.tenant = tenant;
    for (size_t i = 0; i < n; i++) {
        j.hash = hashes[i];
        (void)enqueue(r, &j);
    }
}

void kvd_remote_on_offer(void *ctx, const char *node_id,
                         const kvd_namespace_t *ns, uint32_t tenant,
                         const kvd_block_hash_t *hashes, const uint64_t *sizes,
                         size_t n)
{
    kvd_remote_t *r = ctx;
    /* It talks to us: whatever failed before, it answers again. */
    kvd_remote_suspect_note(r, node_id, KVD_OK);
    remote_job_t j;
    memset(&j, 0, sizeof j);
    j.kind = JOB_PULL;
    j.ns = *ns;
    j.tenant = tenant;
    snprintf(j.node, sizeof j.node, "%s", node_id);
    for (size_t i = 0; i < n; i++) {
        j.hash = hashes[i];
        j.size = sizes[i];
        (void)enqueue(r, &j);
    }
}

/* Queues a failed job for another try, or gives it up (the mover). */
static void retry_later(kvd_remote_t *r, const remote_job_t *j)
{
    if (j->attempts >= REMOTE_RETRY_MAX || r->n_retry == REMOTE_RETRIES) {
        kvd_remote_count(&r->stats.dropped, 1);
        return;
    }
    remote_job_t *q = &r->retry[r->n_retry++];
    *q = *j;
    q->attempts++;
    uint64_t wait_ns = (uint64_t)REMOTE_RETRY_BASE_MS * 1000000ull;
    q->not_before_ns = kvd_time_now_ns() + (wait_ns << (q->attempts - 1));
    kvd_remote_count(&r->stats.retries, 1);
}

/* Moves the retries that are due into `batch` (n jobs so far, room for
 * REMOTE_BATCH); returns the new count. */
static size_t retries_due(kvd_remote_t *r, remote_job_t *batch, size_t n)
{
    uint64_t now = kvd_time_now_ns();
    for (size_t i = 0; i < r->n_retry && n < REMOTE_BATCH;) {
        if (r->retry[i].not_before_ns <= now) {
            batch[n++] = r->retry[i];
            r->retry[i] = r->retry[--r->n_retry];
        } else {
            i++;
        }
    }
    return n;
}

/* Offers the push jobs to their homes: one OFFER per (home, namespace).
 * A job whose offer to any home failed is tried again later. */
static void do_pushes(kvd_remote_t *r, remote_view_t *v, remote_job_t *jobs,
                      size_t n)
{
    kvd_block_hash_t *hashes = malloc(n * sizeof *hashes);
    uint64_t *sizes = malloc(n * sizeof *sizes);
    bool *done = calloc(n * KVD_PLACEMENT_MAX_REPLICAS, sizeof *done);
    size_t *homes = malloc(n * KVD_PLACEMENT_MAX_REPLICAS * sizeof *homes);
    size_t *nh = calloc(n, sizeof *nh);
    size_t *group = malloc(n * sizeof *group);
    bool *failed = calloc(n, sizeof *failed);
    if (hashes == NULL || sizes == NULL || done == NULL || homes == NULL ||
        nh == NULL || group == NULL || failed == NULL) {
        kvd_remote_count(&r->stats.dropped, n);
        goto out;
    }
    const size_t R = KVD_PLACEMENT_MAX_REPLICAS;
    if (KVD_FAILPOINT("cluster.push") != 0) { /* as if the queue were full */
        kvd_remote_count(&r->stats.dropped, n);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        nh[i] =
            kvd_remote_homes(r, v, &jobs[i].ns, &jobs[i].hash, homes + i * R);
    }
    /* Each unsent (job, home) pair starts a group of every later pair with
     * the same home and namespace. */
    for (size_t i = 0; i < n; i++) {
        for (size_t h = 0; h < nh[i]; h++) {
            if (done[i * R + h]) {
                continue;
            }
            size_t node = homes[i * R + h];
            size_t k = 0;
            for (size_t j = i; j < n; j++) {
                if (memcmp(&jobs[j].ns, &jobs[i].ns, sizeof jobs[i].ns) != 0 ||
                    jobs[j].tenant != jobs[i].tenant) {
                    continue;
                }
                for (size_t g = 0; g < nh[j]; g++) {
                    if (!done[j * R + g] && homes[j * R + g] == node) {
                        done[j * R + g] = true;
                        hashes[k] = jobs[j].hash;
                        sizes[k] = jobs[j].size;
                        group[k++] = j;
                    }
                }
            }
            const kvd_member_t *m = &v->m[node];
            /* "cluster.offer": the offer fails as if the home were down. */
            kvd_status_t s =
                KVD_FAILPOINT("cluster.offer") != 0
                    ? KVD_ERR_PEER
                    : kvd_peer_offer(r->peer, m->ucx_address,
                                     m->ucx_address_len, &jobs[i].ns,
                                     jobs[i].tenant, hashes, sizes, k);
            kvd_remote_count(
                s == KVD_OK ? &r->stats.pushes : &r->stats.push_errors, k);
            for (size_t q = 0; s != KVD_OK && q < k; q++) {
                failed[group[q]] = true;
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (failed[i]) {
            retry_later(r, &jobs[i]);
        }
    }
out:
    free(hashes);
    free(sizes);
    free(done);
    free(homes);
    free(nh);
    free(group);
    free(failed);
}

/* Fetches the pull jobs from the nodes that offered them: one FETCH per
 * (node, namespace). */
static void do_pulls(kvd_remote_t *r, remote_view_t *v, remote_job_t *jobs,
                     size_t n)
{
    kvd_block_hash_t *hashes = malloc(n * sizeof *hashes);
    uint64_t *sizes = malloc(n * sizeof *sizes);
    kvd_status_t *status = malloc(n * sizeof *status);
    bool *done = calloc(n, sizeof *done);
    size_t *group = malloc(n * sizeof *group);
    if (hashes == NULL || sizes == NULL || status == NULL || done == NULL ||
        group == NULL) {
        kvd_remote_count(&r->stats.pull_errors, n);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (done[i]) {
            continue;
        }
        size_t k = 0;
        for (size_t j = i; j < n; j++) {
            if (!done[j] && strcmp(jobs[j].node, jobs[i].node) == 0 &&
                memcmp(&jobs[j].ns, &jobs[i].ns, sizeof jobs[i].ns) == 0 &&
                jobs[j].tenant == jobs[i].tenant) {
                done[j] = true;
                hashes[k] = jobs[j].hash;
                sizes[k] = jobs[j].size;
                group[k++] = j;
            }
        }
        ptrdiff_t node = kvd_remote_view_find(v, jobs[i].node);
        if (node < 0 || v->m[node].ucx_address_len == 0 ||
            kvd_remote_suspect(r, jobs[i].node)) {
            kvd_remote_count(&r->stats.pull_errors, k);
            for (size_t q = 0; q < k; q++) {
                retry_later(r, &jobs[group[q]]);
            }
            continue;
        }
        kvd_peer_batch_t b;
        memset(&b, 0, sizeof b);
        b.address = v->m[node].ucx_address;
        b.address_len = v->m[node].ucx_address_len;
        b.hashes = hashes;
        b.n = k;
        b.sizes = sizes;
        b.status = status;
        uint64_t t = r->cfg.timeout_ms > REMOTE_PULL_TIMEOUT_MS
                         ? r->cfg.timeout_ms
                         : REMOTE_PULL_TIMEOUT_MS;
        (void)kvd_peer_fetch(r->peer, &jobs[i].ns, jobs[i].tenant, &b, 1,
                             kvd_time_deadline_ns((int64_t)t));
        kvd_remote_suspect_note(r, jobs[i].node, b.result);
        for (size_t q = 0; q < k; q++) {
            if (status[q] == KVD_OK) {
                kvd_remote_count(&r->stats.pulls, 1);
            } else if (status[q] != KVD_ERR_EXISTS) {
                kvd_remote_count(&r->stats.pull_errors, 1);
                /* Gone from the node that offered it: nothing to retry. */
                if (status[q] != KVD_ERR_NOT_FOUND) {
                    retry_later(r, &jobs[group[q]]);
                }
            }
        }
    }
out:
    free(hashes);
    free(sizes);
    free(status);
    free(done);
    free(group);
}

static bool name_in(const char (*names)[KVD_PROTO_MAX_NODE_ID_BYTES + 1],
                    size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(names[i], name) == 0) {
            return true;
        }
    }
    return false;
}

/* Starts (or widens and restarts) a repair scan: for the nodes of `v`
 * flagged in `is_new`, or for every node when `all`. */
static void repair_start(kvd_remote_t *r, const remote_view_t *v,
                         const bool *is_new, bool all)
{
    if (all || (r->rep.active && r->rep.all)) {
        r->rep.all = true;
    } else {
        size_t cap = r->rep.n_targets + v->n;
        void *t = realloc(r->rep.targets, cap * sizeof *r->rep.targets);
        if (t == NULL) {
            r->rep.all = true; /* cannot list them: repair for everyone */
        } else {
            r->rep.targets = t;
            if (!r->rep.active) {
                r->rep.n_targets = 0;
            }
            for (size_t i = 0; i < v->n; i++) {
                if (is_new[i] && !name_in(r->rep.targets, r->rep.n_targets,
                                          v->m[i].node_id)) {
                    snprintf(r->rep.targets[r->rep.n_targets++],
                             sizeof r->rep.targets[0], "%s", v->m[i].node_id);
                }
            }
            r->rep.all = false;
        }
    }
    r->rep.active = true;
    r->rep.cursor = 0;
    kvd_remote_count(&r->stats.repairs, 1);
}

/* After each look at the view: a node new since the last view, the first
 * view (a node that just started may hold objects from before), or a view
 * fresh again after being stale start a repair. */
static void repair_check(kvd_remote_t *r, const remote_view_t *v)
{
    kvd_membership_stats_t st;
    if (!kvd_remote_view_stats(r, &st)) {
        return;
    }
    bool refreshed = r->rep.started && r->rep.was_stale && !st.stale;
    r->rep.was_stale = st.stale;
    if (r->rep.started && v->generation == r->rep.generation && !refreshed) {
        return;
    }
    bool *is_new = calloc(v->n ? v->n : 1, sizeof *is_new);
    void *known = malloc((v->n ? v->n : 1) * sizeof *r->rep.known);
    if (is_new == NULL || known == NULL) {
        free(is_new);
        free(known);
        return; /* next turn */
    }
    size_t others = 0, fresh = 0;
    for (size_t i = 0; i < v->n; i++) {
        if (strcmp(v->m[i].node_id, r->self_id) == 0) {
            continue;
        }
        others++;
        is_new[i] = !r->rep.started ||
                    !name_in(r->rep.known, r->rep.n_known, v->m[i].node_id);
        fresh += is_new[i];
    }
    if (others > 0 && (fresh > 0 || refreshed)) {
        repair_start(r, v, is_new, refreshed || !r->rep.started);
    }
    /* Remember this view's other nodes. */
    char(*k)[KVD_PROTO_MAX_NODE_ID_BYTES + 1] = known;
    size_t nk = 0;
    for (size_t i = 0; i < v->n; i++) {
        if (strcmp(v->m[i].node_id, r->self_id) != 0) {
            snprintf(k[nk++], sizeof k[0], "%s", v->m[i].node_id);
        }
    }
    free(r->rep.known);
    r->rep.known = k;
    r->rep.n_known = nk;
    r->rep.generation = v->generation;
    r->rep.started = r->rep.started || st.num_nodes > 0;
    free(is_new);
}

/* One turn of a repair scan: up to REMOTE_REPAIR_BATCH objects, those with
 * a home among the targets offered to their homes again (a home that has
 * one answers "exists" without a transfer). `jobs`: REMOTE_BATCH room. */
static void repair_step(kvd_remote_t *r, remote_view_t *v, remote_job_t *jobs)
{
    kvd_store_object_t objs[REMOTE_REPAIR_BATCH];
    size_t n = 0;
    if (kvd_store_scan(r->cfg.store, &r->rep.cursor, objs, REMOTE_REPAIR_BATCH,
                       &n) != KVD_OK) {
        r->rep.active = false;
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < n && k < REMOTE_BATCH; i++) {
        size_t homes[KVD_PLACEMENT_MAX_REPLICAS];
        size_t nh =
            kvd_remote_homes(r, v, &objs[i].key.ns, &objs[i].key.hash, homes);
        bool wanted = false;
        for (size_t h = 0; h < nh && !wanted; h++) {
            wanted = r->rep.all || name_in(r->rep.targets, r->rep.n_targets,
                                           v->m[homes[h]].node_id);
        }
        if (!wanted) {
            continue;
        }
        memset(&jobs[k], 0, sizeof jobs[k]);
        jobs[k].kind = JOB_PUSH;
        jobs[k].ns = objs[i].key.ns;
        jobs[k].hash = objs[i].key.hash;
        jobs[k].size = objs[i].size_bytes;
        jobs[k].tenant = objs[i].tenant;
        k++;
    }
    if (k > 0) {
        kvd_remote_count(&r->stats.repair_offers, k);
        do_pushes(r, v, jobs, k);
    }
    if (n < REMOTE_REPAIR_BATCH) {
        r->rep.active = false;
    }
}

void *kvd_remote_mover_main(void *arg)
{
    kvd_remote_t *r = arg;
    remote_job_t *batch = malloc(REMOTE_BATCH * sizeof *batch);
    remote_job_t *pulls = malloc(REMOTE_BATCH * sizeof *pulls);
    if (batch == NULL || pulls == NULL) {
        KVD_LOG_ERROR("cluster: the mover has no memory; pushes stop");
        free(batch);
        free(pulls);
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&r->mu);
        if (r->count == 0 && !r->stop && !r->rep.active) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            uint64_t ns = (uint64_t)ts.tv_nsec + REMOTE_TICK_MS * 1000000ull;
            ts.tv_sec += (time_t)(ns / KVD_NSEC_PER_SEC);
            ts.tv_nsec = (long)(ns % KVD_NSEC_PER_SEC);
            (void)pthread_cond_timedwait(&r->cv, &r->mu, &ts);
        }
        if (r->stop) {
            pthread_mutex_unlock(&r->mu);
            break;
        }
        size_t n = 0;
        while (n < REMOTE_BATCH && r->count > 0) {
            batch[n++] = r->jobs[r->head];
            r->head = (r->head + 1) % r->cfg.queue;
            r->count--;
        }
        pthread_mutex_unlock(&r->mu);
        n = retries_due(r, batch, n);
        /* Pushes first, in place; pulls after, copied apart. */
        size_t np = 0, nl = 0;
        for (size_t i = 0; i < n; i++) {
            if (batch[i].kind == JOB_PUSH) {
                batch[np++] = batch[i];
            } else {
                pulls[nl++] = batch[i];
            }
        }
        remote_view_t *v = kvd_remote_view_get(r);
        if (v == NULL) {
            kvd_remote_count(&r->stats.dropped, n);
            continue;
        }
        repair_check(r, v);
        if (np > 0) {
            do_pushes(r, v, batch, np);
        }
        if (nl > 0) {
            do_pulls(r, v, pulls, nl);
        }
        if (r->rep.active) {
            repair_step(r, v, batch);
        }
        kvd_remote_view_put(r, v);
    }
    free(batch);
    free(pulls);
    return NULL;
}
