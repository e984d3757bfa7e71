/*
 * A clustered node's share of the one cache (cluster/remote.h).
 *
 * The view of the live nodes is a refcounted snapshot, taken again when
 * the membership's generation moves, so a lookup keeps a consistent view
 * for its whole duration without holding a lock while it waits on peers.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/placement.h"
#include "cluster/remote.h"
#include "common/failpoint_int.h"
#include "common/log_int.h"
#include "common/time_int.h"

#define REMOTE_BATCH 1024u /* jobs the mover takes at once */
#define REMOTE_PULL_TIMEOUT_MS 30000u
#define REMOTE_SUSPECTS 64u
#define REMOTE_REPAIR_BATCH 256u /* objects scanned per mover turn */
#define REMOTE_TICK_MS 200u      /* the mover looks at the view this often */
/* A push whose offer failed, or a pull whose fetch failed, is tried again
 * after 0.5, 1 and 2 s (a peer restarting, a connection being set up, a
 * short partition), then given up; at most this many wait at once. */
#define REMOTE_RETRY_MAX 3u
#define REMOTE_RETRY_BASE_MS 500u
#define REMOTE_RETRIES 4096u

enum { JOB_PUSH = 1, JOB_PULL = 2 };

typedef struct remote_job {
    uint8_t kind;
    uint8_t attempts;       /* failed tries so far */
    uint64_t not_before_ns; /* a retry waits until then */
    kvd_namespace_t ns;
    kvd_block_hash_t hash;
    uint64_t size;
    uint32_t tenant;                     /* the store tenant it was saved for */
    char node[KVD_PEER_MAX_NODE_ID + 1]; /* JOB_PULL: who offered it */
} remote_job_t;

typedef struct remote_view {
    int refs;
    uint64_t generation;
    size_t n;
    kvd_member_t *m;
} remote_view_t;

struct kvd_remote {
    kvd_remote_config_t cfg;
    char self_id[KVD_PROTO_MAX_NODE_ID_BYTES + 1];
    kvd_peer_t *peer;
    kvd_membership_t *membership;

    pthread_mutex_t view_mu;
    remote_view_t *view;

    pthread_mutex_t mu; /* the job ring */
    pthread_cond_t cv;
    remote_job_t *jobs;
    size_t head, count;
    bool stop;
    pthread_t mover;
    bool mover_started;

    /* Failed jobs waiting for their next try: the mover's own, no lock. */
    remote_job_t *retry;
    size_t n_retry;

    /* Nodes whose last call failed (dead, cut off, too slow): skipped
     * until `until_ns`, so lookups do not each wait out the deadline on a
     * node that is still in the view. */
    pthread_mutex_t suspect_mu;
    struct {
        char node[KVD_PROTO_MAX_NODE_ID_BYTES + 1];
        uint64_t until_ns;
    } suspects[REMOTE_SUSPECTS];

    /* Repair (the mover's own): when a node joins the view, or the view
     * comes back from stale (etcd or the network was away: pushes may
     * have failed), the local store is scanned and every object whose
     * homes include such a node is offered to its homes again. */
    struct {
        bool started; /* the first view has been seen */
        bool was_stale;
        uint64_t generation;
        char (*known)[KVD_PROTO_MAX_NODE_ID_BYTES + 1]; /* last view */
        size_t n_known;
        bool active, all; /* scanning; for every node or for `targets` */
        uint64_t cursor;
        char (*targets)[KVD_PROTO_MAX_NODE_ID_BYTES + 1];
        size_t n_targets;
    } rep;

    kvd_remote_stats_t stats; /* counters only; atomics */
};

static void count(uint64_t *c, uint64_t v)
{
    __atomic_fetch_add(c, v, __ATOMIC_RELAXED);
}

/* ---- the view ------------------------------------------------------------ */

static void view_put(kvd_remote_t *r, remote_view_t *v)
{
    if (v == NULL) {
        return;
    }
    pthread_mutex_lock(&r->view_mu);
    bool last = --v->refs == 0;
    pthread_mutex_unlock(&r->view_mu);
    if (last) {
        free(v->m);
        free(v);
    }
}

/* The current view (taken again when it changed); release with view_put.
 * NULL once the node has left (or without memory). */
static remote_view_t *view_get(kvd_remote_t *r)
{
    pthread_mutex_lock(&r->view_mu);
    remote_view_t *v = r->view;
    kvd_membership_stats_t st;
    if (r->membership == NULL) {
        pthread_mutex_unlock(&r->view_mu);
        return NULL;
    }
    (void)kvd_membership_view(r->membership, NULL, 0, &st);
    if (v != NULL && v->generation == st.generation) {
        v->refs++;
        pthread_mutex_unlock(&r->view_mu);
        return v;
    }
    remote_view_t *nv = calloc(1, sizeof *nv);
    size_t cap = st.num_nodes + 4;
    if (nv == NULL || (nv->m = calloc(cap, sizeof *nv->m)) == NULL) {
        pthread_mutex_unlock(&r->view_mu);
        free(nv);
        return NULL;
    }
    size_t n = kvd_membership_view(r->membership, nv->m, cap, &st);
    nv->n = n < cap ? n : cap;
    nv->generation = st.generation;
    nv->refs = 2; /* the remote's and the caller's */
    r->view = nv;
    bool last = v != NULL && --v->refs == 0;
    pthread_mutex_unlock(&r->view_mu);
    if (last) {
        free(v->m);
        free(v);
    }
    return nv;
}

static ptrdiff_t view_find(const remote_view_t *v, const char *node_id)
{
    for (size_t i = 0; i < v->n; i++) {
        if (strcmp(v->m[i].node_id, node_id) == 0) {
            return (ptrdiff_t)i;
        }
    }
    return -1;
}

/* The homes of (ns, hash) other than this node, best first. */
static size_t homes_of(kvd_remote_t *r, const remote_view_t *v,
                       const kvd_namespace_t *ns, const kvd_block_hash_t *h,
                       size_t *out)
{
    kvd_store_key_t key;
    key.ns = *ns;
    key.hash = *h;
    size_t idx[KVD_PLACEMENT_MAX_REPLICAS];
    size_t n = kvd_placement_homes(&key, v->m, v->n, r->cfg.replicas, idx);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(v->m[idx[i]].node_id, r->self_id) != 0 &&
            v->m[idx[i]].ucx_address_len > 0) {
            out[k++] = idx[i];
        }
    }
    return k;
}

/* ---- nodes that failed ----------------------------------------------------
 */

static bool suspect(kvd_remote_t *r, const char *node)
{
    uint64_t now = kvd_time_now_ns();
    bool s = false;
    pthread_mutex_lock(&r->suspect_mu);
    for (size_t i = 0; i < REMOTE_SUSPECTS && !s; i++) {
        s = r->suspects[i].until_ns > now &&
            strcmp(r->suspects[i].node, node) == 0;
    }
    pthread_mutex_unlock(&r->suspect_mu);
    return s;
}

/* After a call to `node`: a failure makes it a suspect for a lease TTL
 * (by then it has left the view, or answers again); success clears it. */
static void suspect_note(kvd_remote_t *r, const char *node, kvd_status_t s)
{
    bool failed =
        s == KVD_ERR_TIMEOUT || s == KVD_ERR_UNREACHABLE || s == KVD_ERR_PEER;
    if (s != KVD_OK && !failed) {
        return;
    }
    uint64_t now = kvd_time_now_ns();
    pthread_mutex_lock(&r->suspect_mu);
    size_t slot = REMOTE_SUSPECTS, oldest = 0;
    for (size_t i = 0; i < REMOTE_SUSPECTS; i++) {
        if (strcmp(r->suspects[i].node, node) == 0) {
            slot = i;
            break;
        }
        if (r->suspects[i].until_ns < r->suspects[oldest].until_ns) {
            oldest = i;
        }
    }
    if (slot == REMOTE_SUSPECTS && failed) {
        slot = oldest;
        snprintf(r->suspects[slot].node, sizeof r->suspects[slot].node, "%s",
                 node);
    }
    if (slot < REMOTE_SUSPECTS) {
        r->suspects[slot].until_ns =
            failed ? now + (uint64_t)r->cfg.lease_ttl_s * KVD_NSEC_PER_SEC : 0;
    }
    pthread_mutex_unlock(&r->suspect_mu);
}

/* ---- lookups that missed here -------------------------------------------- */

/* Keys grouped by the node asked for them. */
typedef struct remote_group {
    size_t node;
    size_t n;
    size_t *keys;             /* indexes into the caller's hashes */
    kvd_block_hash_t *hashes; /* those keys, in that order */
    uint64_t *sizes;
    kvd_status_t *status;
} remote_group_t;

typedef struct remote_groups {
    remote_group_t *g;
    size_t n;
    size_t cap_keys; /* each group's arrays hold this many */
} remote_groups_t;

static void groups_free(remote_groups_t *gs)
{
    for (size_t i = 0; i < gs->n; i++) {
        free(gs->g[i].keys);
        free(gs->g[i].hashes);
        free(gs->g[i].sizes);
        free(gs->g[i].status);
    }
    free(gs->g);
    memset(gs, 0, sizeof *gs);
}

/* Adds key `k` (hash h) to the group of `node`; false when out of memory. */
static bool groups_add(remote_groups_t *gs, size_t max_groups, size_t node,
                       size_t k, const kvd_block_hash_t *h)
{
    remote_group_t *g = NULL;
    for (size_t i = 0; i < gs->n; i++) {
        if (gs->g[i].node == node) {
            g = &gs->g[i];
            break;
        }
    }
    if (g == NULL) {
        if (gs->g == NULL) {
            gs->g = calloc(max_groups, sizeof *gs->g);
            if (gs->g == NULL) {
                return false;
            }
        }
        g = &gs->g[gs->n];
        g->node = node;
        g->keys = malloc(gs->cap_keys * sizeof *g->keys);
        g->hashes = malloc(gs->cap_keys * sizeof *g->hashes);
        g->sizes = calloc(gs->cap_keys, sizeof *g->sizes);
        g->status = calloc(gs->cap_keys, sizeof *g->status);
        gs->n++;
        if (g->keys == NULL || g->hashes == NULL || g->sizes == NULL ||
            g->status == NULL) {
            return false;
        }
    }
    g->keys[g->n] = k;
    g->hashes[g->n] = *h;
    g->n++;
    return true;
}

static kvd_peer_batch_t *groups_batches(const remote_groups_t *gs,
                                        const remote_view_t *v)
{
    kvd_peer_batch_t *b = calloc(gs->n ? gs->n : 1, sizeof *b);
    if (b == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < gs->n; i++) {
        const kvd_member_t *m = &v->m[gs->g[i].node];
        b[i].address = m->ucx_address;
        b[i].address_len = m->ucx_address_len;
        b[i].hashes = gs->g[i].hashes;
        b[i].n = gs->g[i].n;
        b[i].sizes = gs->g[i].sizes;
        b[i].status = gs->g[i].status;
    }
    return b;
}

size_t kvd_remote_fill(kvd_remote_t *r, const kvd_namespace_t *ns,
                       const kvd_block_hash_t *hashes, size_t n,
                       const char *source_node, uint32_t tenant)
{
    if (r == NULL || ns == NULL || hashes == NULL || n == 0) {
        return 0;
    }
    if (n > KVD_PEER_MAX_KEYS) {
        n = KVD_PEER_MAX_KEYS;
    }
    remote_view_t *v = view_get(r);
    if (v == NULL || v->n < 2) {
        view_put(r, v);
        return 0;
    }
    count(&r->stats.lookups, 1);
    uint64_t deadline = kvd_time_deadline_ns((int64_t)r->cfg.timeout_ms);
    ptrdiff_t src = source_node != NULL && source_node[0] != '\0' &&
                            strcmp(source_node, r->self_id) != 0
                        ? view_find(v, source_node)
                        : -1;
    if (src >= 0 && v->m[src].ucx_address_len == 0) {
        src = -1;
    }
    size_t R = r->cfg.replicas + (src >= 0); /* candidates per key */
    size_t *cand = malloc(n * R * sizeof *cand);
    size_t *ncand = calloc(n, sizeof *ncand);
    size_t *tried = calloc(n, sizeof *tried);
    uint64_t *found = calloc(n, sizeof *found);
    size_t *holder = calloc(n, sizeof *holder);
    bool *absent = calloc(n, sizeof *absent);
    bool *sus = calloc(v->n, sizeof *sus); /* per node, looked up once */
    size_t got = 0;
    if (cand == NULL || ncand == NULL || tried == NULL || found == NULL ||
        holder == NULL || absent == NULL || sus == NULL) {
        goto out;
    }
    for (size_t i = 0; i < v->n; i++) {
        sus[i] = suspect(r, v->m[i].node_id);
    }
    for (size_t i = 0; i < n; i++) {
        size_t *c = cand + i * R;
        size_t k = 0;
        if (src >= 0) {
            c[k++] = (size_t)src;
        }
        size_t homes[KVD_PLACEMENT_MAX_REPLICAS];
        size_t nh = homes_of(r, v, ns, &hashes[i], homes);
        for (size_t j = 0; j < nh; j++) {
            if (src < 0 || homes[j] != (size_t)src) {
                c[k++] = homes[j];
            }
        }
        /* Suspects are skipped (a key left with none is a quick miss). */
        size_t kept = 0;
        for (size_t j = 0; j < k; j++) {
            if (!sus[c[j]]) {
                c[kept++] = c[j];
            } else {
                count(&r->stats.suspect_skips, 1);
            }
        }
        ncand[i] = kept;
    }
    /* Rounds: the first asks each key's first home; a key whose node
     * failed (dead, unreachable, too slow) is asked of its next home in the
     * next round. A home's "not here" settles the key: the prefix ends at
     * the first key settled absent or out of homes. */
    for (size_t round = 0; round < R; round++) {
        size_t limit = n;
        for (size_t i = 0; i < n; i++) {
            if (found[i] == 0 && (absent[i] || tried[i] >= ncand[i])) {
                limit = i;
                break;
            }
        }
        remote_groups_t gs = {.cap_keys = limit};
        bool ok = true;
        for (size_t i = 0; i < limit && ok; i++) {
            if (found[i] == 0) {
                ok = groups_add(&gs, v->n, cand[i * R + tried[i]], i,
                                &hashes[i]);
            }
        }
        kvd_peer_batch_t *b = ok ? groups_batches(&gs, v) : NULL;
        if (b == NULL || gs.n == 0) {
            free(b);
            groups_free(&gs);
            break;
        }
        (void)kvd_peer_lookup(r->peer, ns, b, gs.n, deadline);
        for (size_t j = 0; j < gs.n; j++) {
            suspect_note(r, v->m[gs.g[j].node].node_id, b[j].result);
            if (b[j].result != KVD_OK) {
                count(&r->stats.lookup_errors, 1);
            }
            for (size_t q = 0; q < gs.g[j].n; q++) {
                size_t i = gs.g[j].keys[q];
                tried[i]++;
                if (b[j].result != KVD_OK) {
                    continue;
                }
                if (gs.g[j].sizes[q] > 0) {
                    found[i] = gs.g[j].sizes[q];
                    holder[i] = gs.g[j].node;
                } else if (gs.g[j].node != (size_t)src) {
                    /* A home's "not here" settles the key; the source's
                     * does not (it may have evicted what it pushed). */
                    absent[i] = true;
                }
            }
        }
        free(b);
        groups_free(&gs);
        if (kvd_time_now_ns() >= deadline) {
            break;
        }
    }
    size_t prefix = 0;
    while (prefix < n && found[prefix] > 0) {
        prefix++;
    }
    if (prefix == 0) {
        goto out;
    }
    remote_groups_t gs = {.cap_keys = prefix};
    bool ok = true;
    for (size_t i = 0; i < prefix && ok; i++) {
        ok = groups_add(&gs, v->n, holder[i], i, &hashes[i]);
    }
    kvd_peer_batch_t *b = ok ? groups_batches(&gs, v) : NULL;
    if (b != NULL) {
        for (size_t j = 0; j < gs.n; j++) {
            for (size_t q = 0; q < gs.g[j].n; q++) {
                gs.g[j].sizes[q] = found[gs.g[j].keys[q]];
            }
        }
        (void)kvd_peer_fetch(r->peer, ns, tenant, b, gs.n, deadline);
        for (size_t j = 0; j < gs.n; j++) {
            suspect_note(r, v->m[gs.g[j].node].node_id, b[j].result);
        }
        /* Reuse `found` as "here now" for the prefix. */
        memset(found, 0, prefix * sizeof *found);
        for (size_t j = 0; j < gs.n; j++) {
            for (size_t q = 0; q < gs.g[j].n; q++) {
                kvd_status_t s = gs.g[j].status[q];
                if (s == KVD_OK) {
                    count(&r->stats.remote_hits, 1);
                }
                found[gs.g[j].keys[q]] = s == KVD_OK || s == KVD_ERR_EXISTS;
            }
        }
        while (got < prefix && found[got]) {
            got++;
        }
    }
    free(b);
    groups_free(&gs);
out:
    free(cand);
    free(ncand);
    free(tried);
    free(found);
    free(holder);
    free(absent);
    free(sus);
    view_put(r, v);
    return got;
}

/* ---- the mover ----------------------------------------------------------- */

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
        count(&r->stats.dropped, 1);
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

static void on_offer(void *ctx, const char *node_id, const kvd_namespace_t *ns,
                     uint32_t tenant, const kvd_block_hash_t *hashes,
                     const uint64_t *sizes, size_t n)
{
    kvd_remote_t *r = ctx;
    /* It talks to us: whatever failed before, it answers again. */
    suspect_note(r, node_id, KVD_OK);
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
        count(&r->stats.dropped, 1);
        return;
    }
    remote_job_t *q = &r->retry[r->n_retry++];
    *q = *j;
    q->attempts++;
    uint64_t wait_ns = (uint64_t)REMOTE_RETRY_BASE_MS * 1000000ull;
    q->not_before_ns = kvd_time_now_ns() + (wait_ns << (q->attempts - 1));
    count(&r->stats.retries, 1);
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
        count(&r->stats.dropped, n);
        goto out;
    }
    const size_t R = KVD_PLACEMENT_MAX_REPLICAS;
    if (KVD_FAILPOINT("cluster.push") != 0) { /* as if the queue were full */
        count(&r->stats.dropped, n);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        nh[i] = homes_of(r, v, &jobs[i].ns, &jobs[i].hash, homes + i * R);
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
            count(s == KVD_OK ? &r->stats.pushes : &r->stats.push_errors, k);
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
        count(&r->stats.pull_errors, n);
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
        ptrdiff_t node = view_find(v, jobs[i].node);
        if (node < 0 || v->m[node].ucx_address_len == 0 ||
            suspect(r, jobs[i].node)) {
            count(&r->stats.pull_errors, k);
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
        suspect_note(r, jobs[i].node, b.result);
        for (size_t q = 0; q < k; q++) {
            if (status[q] == KVD_OK) {
                count(&r->stats.pulls, 1);
            } else if (status[q] != KVD_ERR_EXISTS) {
                count(&r->stats.pull_errors, 1);
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
    count(&r->stats.repairs, 1);
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
        size_t nh = homes_of(r, v, &objs[i].key.ns, &objs[i].key.hash, homes);
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
        count(&r->stats.repair_offers, k);
        do_pushes(r, v, jobs, k);
    }
    if (n < REMOTE_REPAIR_BATCH) {
        r->rep.active = false;
    }
}

static void *mover_main(void *arg)
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
        remote_view_t *v = view_get(r);
        if (v == NULL) {
            count(&r->stats.dropped, n);
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
        view_put(r, v);
    }
    free(batch);
    free(pulls);
    return NULL;
}

/* ---- life ---------------------------------------------------------------- */

void kvd_remote_store_completion(kvd_remote_t *r,
                                 const kvd_store_completion_t *c)
{
    kvd_peer_store_completion(r->peer, c);
}

kvd_status_t kvd_remote_start(const kvd_remote_config_t *cfg,
                              kvd_remote_t **out, char *err, size_t err_len)
{
    if (cfg == NULL || out == NULL || cfg->store == NULL || cfg->self == NULL ||
        cfg->replicas < 1 || cfg->replicas > KVD_PLACEMENT_MAX_REPLICAS ||
        cfg->queue < 1 || cfg->timeout_ms < 1) {
        snprintf(err, err_len, "cluster: bad settings");
        return KVD_ERR_INVALID;
    }
    kvd_remote_t *r = calloc(1, sizeof *r);
    if (r == NULL) {
        return KVD_ERR_NOMEM;
    }
    r->cfg = *cfg;
    snprintf(r->self_id, sizeof r->self_id, "%s", cfg->self->node_id);
    pthread_mutex_init(&r->view_mu, NULL);
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->suspect_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    r->jobs = calloc(cfg->queue, sizeof *r->jobs);
    r->retry = calloc(REMOTE_RETRIES, sizeof *r->retry);
    if (r->jobs == NULL || r->retry == NULL) {
        kvd_remote_stop(r);
        return KVD_ERR_NOMEM;
    }
    kvd_peer_config_t pc = {
        .store = cfg->store,
        .node_id = r->self_id,
        .token = cfg->token,
        .disk_gets = true, /* kvdepotd's service routes their completions */
        .part_bytes = cfg->part_bytes,
        .on_offer = on_offer,
        .offer_ctx = r,
    };
    kvd_status_t s = kvd_peer_start(&pc, &r->peer, err, err_len);
    if (s != KVD_OK) {
        kvd_remote_stop(r);
        return s;
    }
    size_t alen = 0;
    const uint8_t *addr = kvd_peer_address(r->peer, &alen);
    memcpy(cfg->self->ucx_address, addr, alen);
    cfg->self->ucx_address_len = alen;
    if (pthread_create(&r->mover, NULL, mover_main, r) != 0) {
        snprintf(err, err_len, "cluster: cannot start the mover thread");
        kvd_remote_stop(r);
        return KVD_ERR_INTERNAL;
    }
    r->mover_started = true;
    kvd_membership_config_t mc = {
        .etcd_endpoint = cfg->etcd_endpoint,
        .cluster = cfg->cluster,
        .self = cfg->self,
        .lease_ttl_s = cfg->lease_ttl_s,
        .timeout_ms = 2000,
    };
    s = kvd_membership_start(&mc, &r->membership);
    if (s != KVD_OK) {
        snprintf(err, err_len,
                 "cluster: cannot join (cluster.name and server.node_id "
                 "must be letters, digits, . _ -): %s",
                 kvd_status_str(s));
        kvd_remote_stop(r);
        return s;
    }
    *out = r;
    return KVD_OK;
}

void kvd_remote_leave(kvd_remote_t *r)
{
    if (r == NULL) {
        return;
    }
    pthread_mutex_lock(&r->view_mu);
    kvd_membership_t *m = r->membership;
    r->membership = NULL;
    pthread_mutex_unlock(&r->view_mu);
    kvd_membership_stop(m);
}

void kvd_remote_stop(kvd_remote_t *r)
{
    if (r == NULL) {
        return;
    }
    kvd_remote_leave(r); /* first, so the others stop sending here */
    if (r->mover_started) {
        pthread_mutex_lock(&r->mu);
        r->stop = true;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->mover, NULL);
    }
    kvd_peer_stop(r->peer);
    if (r->view != NULL) {
        free(r->view->m);
        free(r->view);
    }
    free(r->jobs);
    free(r->retry);
    free(r->rep.known);
    free(r->rep.targets);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->view_mu);
    pthread_mutex_destroy(&r->suspect_mu);
    free(r);
}

bool kvd_remote_view_stats(kvd_remote_t *r, kvd_membership_stats_t *out)
{
    if (r == NULL) {
        return false;
    }
    pthread_mutex_lock(&r->view_mu);
    bool in = r->membership != NULL;
    if (in) {
        (void)kvd_membership_view(r->membership, NULL, 0, out);
    }
    pthread_mutex_unlock(&r->view_mu);
    return in;
}

void kvd_remote_stats(kvd_remote_t *r, kvd_remote_stats_t *out)
{
    memset(out, 0, sizeof *out);
    if (r == NULL) {
        return;
    }
    const uint64_t *src = (const uint64_t *)&r->stats;
    uint64_t *dst = (uint64_t *)out;
    size_t words = offsetof(kvd_remote_stats_t, peer) / sizeof(uint64_t);
    for (size_t i = 0; i < words; i++) {
        dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
    }
    kvd_peer_stats(r->peer, &out->peer);
}
