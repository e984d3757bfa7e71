/*
 * A clustered node's share of the one cache (cluster/remote.h): its life
 * (the data plane, the mover thread and the membership started in that
 * order, and stopped in reverse, leaving the cluster first), the view of
 * the live nodes and the nodes that just failed. Lookups that missed are
 * in remote_fill.c, pushes, pulls and repair in remote_mover.c.
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
#include "cluster/remote_int.h"
#include "common/time_int.h"

void kvd_remote_view_put(kvd_remote_t *r, remote_view_t *v)
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
remote_view_t *kvd_remote_view_get(kvd_remote_t *r)
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

ptrdiff_t kvd_remote_view_find(const remote_view_t *v, const char *node_id)
{
    for (size_t i = 0; i < v->n; i++) {
        if (strcmp(v->m[i].node_id, node_id) == 0) {
            return (ptrdiff_t)i;
        }
    }
    return -1;
}

/* Whether `addr` is the UCX worker address of a member of the view (the
 * data plane serves FETCHes to such addresses only). Progress thread. */
static bool remote_address_ok(void *ctx, const uint8_t *addr, size_t len)
{
    kvd_remote_t *r = ctx;
    remote_view_t *v = kvd_remote_view_get(r);
    bool ok = false;
    for (size_t i = 0; v != NULL && i < v->n && !ok; i++) {
        ok = v->m[i].ucx_address_len == len &&
             memcmp(v->m[i].ucx_address, addr, len) == 0;
    }
    kvd_remote_view_put(r, v);
    return ok;
}

/* The homes of (ns, hash) other than this node, best first. */
size_t kvd_remote_homes(kvd_remote_t *r, const remote_view_t *v,
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

bool kvd_remote_suspect(kvd_remote_t *r, const char *node)
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
void kvd_remote_suspect_note(kvd_remote_t *r, const char *node, kvd_status_t s)
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
        .address_ok = remote_address_ok,
        .address_ctx = r,
        .store = cfg->store,
        .node_id = r->self_id,
        .token = cfg->token,
        .disk_gets = true, /* kvdepotd's service routes their completions */
        .part_bytes = cfg->part_bytes,
        .on_offer = kvd_remote_on_offer,
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
    kvd_membership_config_t mc = {
        .etcd_endpoint = cfg->etcd_endpoint,
        .etcd_tls_ca = cfg->etcd_tls_ca,
        .etcd_tls_cert = cfg->etcd_tls_cert,
        .etcd_tls_key = cfg->etcd_tls_key,
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
    /* The mover starts once the membership is in place: offers that
     * arrive while the node joins wait in the queue instead of meeting a
     * node without a view (and being dropped as if it had left). */
    if (pthread_create(&r->mover, NULL, kvd_remote_mover_main, r) != 0) {
        snprintf(err, err_len, "cluster: cannot start the mover thread");
        kvd_remote_stop(r);
        return KVD_ERR_INTERNAL;
    }
    r->mover_started = true;
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

size_t kvd_remote_members(kvd_remote_t *r, kvd_member_t *out, size_t max,
                          kvd_membership_stats_t *stats_out)
{
    if (r == NULL) {
        return 0;
    }
    pthread_mutex_lock(&r->view_mu);
    size_t n = r->membership != NULL
                   ? kvd_membership_view(r->membership, out, max, stats_out)
                   : 0;
    pthread_mutex_unlock(&r->view_mu);
    return n;
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
