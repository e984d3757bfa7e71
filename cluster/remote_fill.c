/*
 * Lookups that missed here (kvd_remote_fill, cluster/remote.h): the keys
 * of a chain are asked of their homes (the node that computed them first,
 * when named), one LOOKUP per node, all at once, in rounds: a node that
 * fails is skipped for the key's next home in the next round, nodes that
 * just failed are not asked at all. The longest prefix found is then
 * fetched into the local arena, one FETCH per node holding part of it,
 * all within one deadline (cluster.timeout).
 */
#include <stdlib.h>
#include <string.h>

#include "cluster/placement.h"
#include "cluster/remote_int.h"
#include "common/time_int.h"

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

/* One fill: the candidates of each key (the source first, then its homes;
 * suspects left out) and what the rounds found. */
typedef struct remote_fill {
    kvd_remote_t *r;
    const remote_view_t *v;
    const kvd_namespace_t *ns;
    const kvd_block_hash_t *hashes;
    size_t n;
    ptrdiff_t src;     /* the source node's index in the view, or -1 */
    size_t R;          /* candidates per key at most */
    uint64_t deadline; /* CLOCK_MONOTONIC ns */
    size_t *cand;      /* n * R: each key's candidates, best first */
    size_t *ncand;     /* candidates of each key */
    size_t *tried;     /* candidates of each key asked so far */
    uint64_t *found;   /* the key's size at `holder` (0: not found) */
    size_t *holder;
    bool *absent; /* a home answered "not here": the key is settled */
    bool *sus;    /* per node of the view, looked up once */
} remote_fill_t;

static void fill_candidates(remote_fill_t *f)
{
    kvd_remote_t *r = f->r;
    const remote_view_t *v = f->v;
    for (size_t i = 0; i < v->n; i++) {
        f->sus[i] = kvd_remote_suspect(r, v->m[i].node_id);
    }
    for (size_t i = 0; i < f->n; i++) {
        size_t *c = f->cand + i * f->R;
        size_t k = 0;
        if (f->src >= 0) {
            c[k++] = (size_t)f->src;
        }
        size_t homes[KVD_PLACEMENT_MAX_REPLICAS];
        size_t nh = kvd_remote_homes(r, v, f->ns, &f->hashes[i], homes);
        for (size_t j = 0; j < nh; j++) {
            if (f->src < 0 || homes[j] != (size_t)f->src) {
                c[k++] = homes[j];
            }
        }
        /* Suspects are skipped (a key left with none is a quick miss). */
        size_t kept = 0;
        for (size_t j = 0; j < k; j++) {
            if (!f->sus[c[j]]) {
                c[kept++] = c[j];
            } else {
                kvd_remote_count(&r->stats.suspect_skips, 1);
            }
        }
        f->ncand[i] = kept;
    }
}

/* Applies the answers of one round's LOOKUPs (batches `b` of groups
 * `gs`). */
static void fill_answers(remote_fill_t *f, const remote_groups_t *gs,
                         const kvd_peer_batch_t *b)
{
    for (size_t j = 0; j < gs->n; j++) {
        kvd_remote_suspect_note(f->r, f->v->m[gs->g[j].node].node_id,
                                b[j].result);
        if (b[j].result != KVD_OK) {
            kvd_remote_count(&f->r->stats.lookup_errors, 1);
        }
        for (size_t q = 0; q < gs->g[j].n; q++) {
            size_t i = gs->g[j].keys[q];
            f->tried[i]++;
            if (b[j].result != KVD_OK) {
                continue;
            }
            if (gs->g[j].sizes[q] > 0) {
                f->found[i] = gs->g[j].sizes[q];
                f->holder[i] = gs->g[j].node;
            } else if (gs->g[j].node != (size_t)f->src) {
                /* A home's "not here" settles the key; the source's
                 * does not (it may have evicted what it pushed). */
                f->absent[i] = true;
            }
        }
    }
}

/* One round: each key not found yet, up to the first one settled absent
 * or out of candidates, is asked of its next candidate. False when there
 * is nothing more to ask (or no memory, or the deadline passed). */
static bool fill_round(remote_fill_t *f)
{
    size_t limit = f->n;
    for (size_t i = 0; i < f->n; i++) {
        if (f->found[i] == 0 && (f->absent[i] || f->tried[i] >= f->ncand[i])) {
            limit = i;
            break;
        }
    }
    remote_groups_t gs = {.cap_keys = limit};
    bool ok = true;
    for (size_t i = 0; i < limit && ok; i++) {
        if (f->found[i] == 0) {
            ok = groups_add(&gs, f->v->n, f->cand[i * f->R + f->tried[i]], i,
                            &f->hashes[i]);
        }
    }
    kvd_peer_batch_t *b = ok ? groups_batches(&gs, f->v) : NULL;
    if (b == NULL || gs.n == 0) {
        free(b);
        groups_free(&gs);
        return false;
    }
    (void)kvd_peer_lookup(f->r->peer, f->ns, b, gs.n, f->deadline);
    fill_answers(f, &gs, b);
    free(b);
    groups_free(&gs);
    return kvd_time_now_ns() < f->deadline;
}

/* Fetches keys [0, prefix) from the nodes that hold them; returns how
 * many keys from the first are here now. */
static size_t fill_fetch(remote_fill_t *f, size_t prefix, uint32_t tenant)
{
    size_t got = 0;
    remote_groups_t gs = {.cap_keys = prefix};
    bool ok = true;
    for (size_t i = 0; i < prefix && ok; i++) {
        ok = groups_add(&gs, f->v->n, f->holder[i], i, &f->hashes[i]);
    }
    kvd_peer_batch_t *b = ok ? groups_batches(&gs, f->v) : NULL;
    if (b != NULL) {
        for (size_t j = 0; j < gs.n; j++) {
            for (size_t q = 0; q < gs.g[j].n; q++) {
                gs.g[j].sizes[q] = f->found[gs.g[j].keys[q]];
            }
        }
        (void)kvd_peer_fetch(f->r->peer, f->ns, tenant, b, gs.n, f->deadline);
        for (size_t j = 0; j < gs.n; j++) {
            kvd_remote_suspect_note(f->r, f->v->m[gs.g[j].node].node_id,
                                    b[j].result);
        }
        /* Reuse `found` as "here now" for the prefix. */
        uint64_t *here = f->found;
        memset(here, 0, prefix * sizeof *here);
        for (size_t j = 0; j < gs.n; j++) {
            for (size_t q = 0; q < gs.g[j].n; q++) {
                kvd_status_t s = gs.g[j].status[q];
                if (s == KVD_OK) {
                    kvd_remote_count(&f->r->stats.remote_hits, 1);
                }
                here[gs.g[j].keys[q]] = s == KVD_OK || s == KVD_ERR_EXISTS;
            }
        }
        while (got < prefix && here[got]) {
            got++;
        }
    }
    free(b);
    groups_free(&gs);
    return got;
}

static void fill_free(remote_fill_t *f)
{
    free(f->cand);
    free(f->ncand);
    free(f->tried);
    free(f->found);
    free(f->holder);
    free(f->absent);
    free(f->sus);
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
    remote_view_t *v = kvd_remote_view_get(r);
    if (v == NULL || v->n < 2) {
        kvd_remote_view_put(r, v);
        return 0;
    }
    kvd_remote_count(&r->stats.lookups, 1);
    remote_fill_t f = {.r = r, .v = v, .ns = ns, .hashes = hashes, .n = n};
    f.deadline = kvd_time_deadline_ns((int64_t)r->cfg.timeout_ms);
    f.src = source_node != NULL && source_node[0] != '\0' &&
                    strcmp(source_node, r->self_id) != 0
                ? kvd_remote_view_find(v, source_node)
                : -1;
    if (f.src >= 0 && v->m[f.src].ucx_address_len == 0) {
        f.src = -1;
    }
    f.R = r->cfg.replicas + (f.src >= 0); /* candidates per key */
    f.cand = malloc(n * f.R * sizeof *f.cand);
    f.ncand = calloc(n, sizeof *f.ncand);
    f.tried = calloc(n, sizeof *f.tried);
    f.found = calloc(n, sizeof *f.found);
    f.holder = calloc(n, sizeof *f.holder);
    f.absent = calloc(n, sizeof *f.absent);
    f.sus = calloc(v->n, sizeof *f.sus);
    size_t got = 0;
    if (f.cand == NULL || f.ncand == NULL || f.tried == NULL ||
        f.found == NULL || f.holder == NULL || f.absent == NULL ||
        f.sus == NULL) {
        goto out;
    }
    fill_candidates(&f);
    /* Rounds: the first asks each key's first home; a key whose node
     * failed (dead, unreachable, too slow) is asked of its next home in the
     * next round. A home's "not here" settles the key: the prefix ends at
     * the first key settled absent or out of homes. */
    for (size_t round = 0; round < f.R; round++) {
        if (!fill_round(&f)) {
            break;
        }
    }
    size_t prefix = 0;
    while (prefix < n && f.found[prefix] > 0) {
        prefix++;
    }
    if (prefix > 0) {
        got = fill_fetch(&f, prefix, tenant);
    }
out:
    fill_free(&f);
    kvd_remote_view_put(r, v);
    return got;
}
