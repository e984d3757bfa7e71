/*
 * Leases (client_int.h): a Lookup leases the hit prefix under one daemon
 * lease id; the client keeps one entry per block it has handed out (whose
 * index + 1 is the lease's `reserved` word, so a block is released once and
 * its pointer refused after that) and counts them per id (a lease group,
 * with the deadline the reply's TTL gives); it releases the id when the
 * last block is released. Past the deadline the daemon may have ended the
 * lease: the group's pointers are refused and releases answer
 * KVD_ERR_TIMEOUT, so a copy that ended late is not trusted. Releases are
 * deferred and batched: the next Lookup carries them, or the get thread sends
 * them after CL_RELEASE_DELAY_MS, so releasing costs no call of its own.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_int.h"
#include "common/log_int.h"
#include "common/time_int.h"

/* ---- lease groups -------------------------------------------------------- */

/* `mu` held. Returns the index + 1, or 0 when out of memory. */
static uint32_t group_new(kvd_client_t *c, uint64_t lease_id, uint64_t inst,
                          uint32_t refs, uint64_t deadline_ns)
{
    uint32_t i;
    if (c->free_head != 0) {
        i = c->free_head - 1;
        c->free_head = c->groups[i].next_free;
    } else {
        if (c->n_groups == c->cap_groups) {
            uint32_t cap = c->cap_groups ? c->cap_groups * 2 : 256;
            cl_group_t *g = realloc(c->groups, cap * sizeof *g);
            if (g == NULL) {
                return 0;
            }
            c->groups = g;
            c->cap_groups = cap;
        }
        i = c->n_groups++;
    }
    c->groups[i] = (cl_group_t){.lease_id = lease_id,
                                .instance = inst,
                                .deadline_ns = deadline_ns,
                                .refs = refs};
    kvd_cl_map_held(c, inst, refs);
    return i + 1;
}

static uint64_t lease_tag(const kvd_store_lease_t *lease)
{
    uint64_t t;
    memcpy(&t, lease->key.hash.bytes, sizeof t);
    return t;
}

/* Room for `m` more block entries; false when out of memory. `mu` held. */
static bool lblocks_room(kvd_client_t *c, size_t m)
{
    size_t free_n = 0;
    for (uint32_t f = c->lblock_free; f != 0 && free_n < m;
         f = c->lblocks[f - 1].next_free) {
        free_n++;
    }
    size_t need = c->n_lblocks + (m - free_n);
    if (free_n >= m || need <= c->cap_lblocks) {
        return true;
    }
    if (need > UINT32_MAX - 1) {
        return false;
    }
    size_t cap = c->cap_lblocks ? c->cap_lblocks : 1024;
    while (cap < need) {
        cap *= 2;
    }
    cl_lblock_t *b = realloc(c->lblocks, cap * sizeof *b);
    if (b == NULL) {
        return false;
    }
    c->lblocks = b;
    c->cap_lblocks = (uint32_t)(cap < UINT32_MAX ? cap : UINT32_MAX);
    return true;
}

/* A block entry of group `g` for `lease` (lblocks_room made room); its
 * index + 1. `mu` held. */
static uint32_t lblock_new(kvd_client_t *c, uint32_t g,
                           const kvd_store_lease_t *lease)
{
    uint32_t i;
    if (c->lblock_free != 0) {
        i = c->lblock_free - 1;
        c->lblock_free = c->lblocks[i].next_free;
    } else {
        i = c->n_lblocks++;
    }
    c->lblocks[i] = (cl_lblock_t){.group = g, .tag = lease_tag(lease)};
    return i + 1;
}

cl_group_t *kvd_cl_lease_group(kvd_client_t *c, const kvd_store_lease_t *lease)
{
    uint32_t b = lease->reserved;
    if (b == 0 || b > c->n_lblocks || c->lblocks[b - 1].group == 0 ||
        c->lblocks[b - 1].tag != lease_tag(lease)) {
        return NULL;
    }
    cl_group_t *grp = &c->groups[c->lblocks[b - 1].group - 1];
    return grp->refs > 0 ? grp : NULL;
}

kvd_status_t kvd_cl_block_unref(kvd_client_t *c, const kvd_store_lease_t *lease,
                                uint64_t *release)
{
    *release = 0;
    cl_group_t *grp = kvd_cl_lease_group(c, lease);
    if (grp == NULL) {
        return KVD_ERR_NOT_FOUND;
    }
    uint32_t b = lease->reserved;
    uint32_t g = c->lblocks[b - 1].group;
    c->lblocks[b - 1] = (cl_lblock_t){.next_free = c->lblock_free};
    c->lblock_free = b;
    kvd_status_t s =
        kvd_time_now_ns() < grp->deadline_ns ? KVD_OK : KVD_ERR_TIMEOUT;
    kvd_cl_map_held(c, grp->instance, -1);
    if (--grp->refs == 0) {
        /* Also the acknowledgement that ends the quarantine of an expired
         * lease's slots on the daemon. */
        if (grp->instance == c->instance) {
            *release = grp->lease_id;
        }
        grp->next_free = c->free_head;
        c->free_head = g;
    }
    return s;
}

void kvd_cl_group_extend(kvd_client_t *c, uint32_t g, uint64_t deadline_ns)
{
    if (g != 0 && g <= c->n_groups && c->groups[g - 1].refs > 0 &&
        c->groups[g - 1].deadline_ns < deadline_ns) {
        c->groups[g - 1].deadline_ns = deadline_ns;
    }
}

void kvd_cl_release_ids(kvd_client_t *c, uint64_t *ids, size_t n)
{
    if (n == 0) {
        return;
    }
    kvd_pb_release_request_t rq = KVDEPOT__V1__RELEASE_REQUEST__INIT;
    rq.n_lease_ids = n;
    rq.lease_ids = ids;
    ProtobufCMessage *rsp = NULL;
    uint64_t used;
    kvd_status_t s =
        kvd_cl_call(c, CL_RELEASE, KVD_PROTO_MSG_RELEASE_REQUEST, &rq.base,
                    KVD_PROTO_MSG_RELEASE_RESPONSE, &rsp, &used, false);
    if (s != KVD_OK) {
        /* The daemon reclaims them at their TTL. */
        KVD_LOG_DEBUG("store client: release of %zu leases: %s", n,
                      kvd_status_str(s));
    }
    kvd_proto_free(rsp);
}

/* ---- deferred releases --------------------------------------------------- */

/* Moves up to `max` deferred release ids into `out`; `mu` held. */
static size_t rel_take(kvd_client_t *c, uint64_t *out, size_t max)
{
    size_t n = c->n_rel < max ? c->n_rel : max;
    if (n == 0) {
        return 0; /* c->rel may still be NULL: no memcpy from it */
    }
    memcpy(out, c->rel + (c->n_rel - n), n * sizeof *out);
    c->n_rel -= n;
    return n;
}

/* Sends every deferred release now (before calls whose answer depends on
 * them: stats, admin, delete, close). */
void kvd_cl_flush_releases(kvd_client_t *c)
{
    uint64_t ids[256];
    for (;;) {
        pthread_mutex_lock(&c->mu);
        size_t n = rel_take(c, ids, sizeof ids / sizeof ids[0]);
        pthread_mutex_unlock(&c->mu);
        if (n == 0) {
            return;
        }
        kvd_cl_release_ids(c, ids, n);
    }
}

/* ---- lookup / release ---------------------------------------------------- */

kvd_status_t kvd_client_lookup(kvd_client_t *c, const kvd_namespace_t *ns,
                               const kvd_block_hash_t *hashes, size_t n,
                               const char *source_node,
                               kvd_store_lease_t *leases_out,
                               size_t *matched_out)
{
    if (n == 0) {
        *matched_out = 0;
        return KVD_OK;
    }
    /* The chain goes packed: the hashes array is already 32 bytes each,
     * back to back. */
    kvd_pb_lookup_request_t rq = KVDEPOT__V1__LOOKUP_REQUEST__INIT;
    rq.namespace_id.data = (uint8_t *)ns->bytes;
    rq.namespace_id.len = sizeof ns->bytes;
    rq.packed_hashes.data = (uint8_t *)hashes;
    rq.packed_hashes.len = n * sizeof *hashes;
    rq.lease_ttl_ms = (uint32_t)c->cfg.lease_ttl_ms;
    rq.packed_locations = true;
    /* In a cluster the daemon fills a local miss from the other nodes. */
    rq.include_remote = true;
    rq.source_node = (char *)(source_node != NULL ? source_node : "");
    /* Releases ride along (a failed call leaves them to the daemon's TTL). */
    uint64_t rel[256];
    pthread_mutex_lock(&c->mu);
    rq.n_release_lease_ids = rel_take(c, rel, sizeof rel / sizeof rel[0]);
    pthread_mutex_unlock(&c->mu);
    rq.release_lease_ids = rel;
    kvd_pb_lookup_response_t *rsp = NULL;
    uint64_t used;
    /* The daemon's deadline starts when it serves the call, after this. */
    uint64_t sent_ns = kvd_time_now_ns();
    kvd_status_t s = kvd_cl_call(c, CL_LOOKUP, KVD_PROTO_MSG_LOOKUP_REQUEST,
                                 &rq.base, KVD_PROTO_MSG_LOOKUP_RESPONSE,
                                 (ProtobufCMessage **)&rsp, &used, true);
    if (s != KVD_OK) {
        return s;
    }
    /* A daemon of revision 1 answers with one message per location. */
    bool packed = rsp->n_tiers > 0;
    size_t m = packed ? rsp->n_tiers : rsp->n_locations;
    uint32_t g = 0;
    if (m > n || (m > 0 && rsp->lease_id == 0)) {
        KVD_LOG_ERROR("store client: Lookup reply: %zu hits of %zu, lease "
                      "%" PRIu64,
                      m, n, rsp->lease_id);
        s = KVD_ERR_PROTO;
    }
    for (size_t i = 0; s == KVD_OK && i < m; i++) {
        Kvdepot__V1__Tier tier =
            packed ? rsp->tiers[i] : rsp->locations[i]->tier;
        kvd_store_lease_t *o = &leases_out[i];
        memset(o, 0, sizeof *o);
        o->key.ns = *ns;
        o->key.hash = hashes[i];
        o->tier = tier == KVDEPOT__V1__TIER__TIER_HOST ? KVD_STORE_TIER_HOST
                                                       : KVD_STORE_TIER_DISK;
        o->arena_offset =
            packed ? rsp->arena_offsets[i] : rsp->locations[i]->arena_offset;
        o->size_bytes = packed ? rsp->sizes[i] : rsp->locations[i]->size_bytes;
    }
    if (s == KVD_OK && m > 0) {
        /* A daemon that names no TTL keeps the one asked for. */
        uint64_t ttl_ms =
            rsp->lease_ttl_ms ? rsp->lease_ttl_ms : c->cfg.lease_ttl_ms;
        pthread_mutex_lock(&c->mu);
        if (lblocks_room(c, m)) {
            g = group_new(c, rsp->lease_id, used, (uint32_t)m,
                          sent_ns + ttl_ms * 1000000u);
        }
        for (size_t i = 0; g != 0 && i < m; i++) {
            leases_out[i].reserved = lblock_new(c, g, &leases_out[i]);
        }
        pthread_mutex_unlock(&c->mu);
        if (g == 0) {
            s = KVD_ERR_NOMEM;
        }
    }
    if (s != KVD_OK) {
        if (rsp->lease_id != 0) {
            kvd_cl_release_ids(c, &rsp->lease_id, 1);
        }
        kvd_proto_lookup_response_free(rsp);
        return s;
    }
    kvd_proto_lookup_response_free(rsp);
    *matched_out = m;
    return KVD_OK;
}

kvd_status_t kvd_client_release(kvd_client_t *c,
                                const kvd_store_lease_t *leases, size_t n)
{
    kvd_status_t first = KVD_OK;
    bool flush = false;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        uint64_t id = 0;
        kvd_status_t s = kvd_cl_block_unref(c, &leases[i], &id);
        if (s != KVD_OK && first == KVD_OK) {
            first = s;
        }
        if (id == 0) {
            continue;
        }
        if (c->n_rel == c->cap_rel) {
            size_t cap = c->cap_rel ? c->cap_rel * 2 : 64;
            uint64_t *r = realloc(c->rel, cap * sizeof *r);
            if (r == NULL) {
                pthread_mutex_unlock(&c->mu);
                kvd_cl_release_ids(c, &id, 1); /* no room to defer it */
                pthread_mutex_lock(&c->mu);
                continue;
            }
            c->rel = r;
            c->cap_rel = cap;
        }
        if (c->n_rel == 0) {
            c->rel_since_ms = kvd_time_now_ms();
            if (!c->rel_timer_armed) {
                pthread_cond_signal(&c->get_cv); /* arms the timed flush */
            }
        }
        c->rel[c->n_rel++] = id;
        flush = c->n_rel >= CL_RELEASE_BATCH;
    }
    pthread_mutex_unlock(&c->mu);
    if (flush) {
        kvd_cl_flush_releases(c);
    }
    return first;
}
