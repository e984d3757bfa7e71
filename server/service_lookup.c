/*
 * Lookup and Release. Lookup matches the longest stored prefix of a chain
 * of block hashes (asking the cluster for the rest when the request says
 * include_remote), trims it to what the caller's tenant may still lease,
 * and answers where each block is; with a lease TTL the blocks stay leased
 * under one lease id until Release (or the Lookup's own release list, or
 * the deadline) gives them back. A probe (TTL 0) gives them back at once.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "server/svc_int.h"

/* ---- Lookup ------------------------------------------------------------- */

/* The request's hashes, in either form (*n_out of them); malloc'd. */
static kvd_block_hash_t *lookup_hashes(const kvd_pb_lookup_request_t *rq,
                                       size_t *n_out)
{
    size_t n = rq->n_block_hashes;
    kvd_block_hash_t *hashes;
    if (n == 0) { /* the packed form (proto/ checked its length) */
        n = rq->packed_hashes.len / sizeof(kvd_block_hash_t);
        hashes = malloc(n * sizeof *hashes);
        if (hashes != NULL) {
            memcpy(hashes, rq->packed_hashes.data, n * sizeof *hashes);
        }
    } else {
        hashes = svc_hashes(rq->block_hashes, n);
    }
    *n_out = n;
    return hashes;
}

/* Leases the longest stored prefix of `hashes` (*m of them), asking the
 * cluster for the rest when the request says include_remote. */
static kvd_status_t lookup_match(kvd_service_t *svc,
                                 const kvd_pb_lookup_request_t *rq,
                                 const kvd_namespace_t *ns,
                                 const kvd_block_hash_t *hashes, size_t n,
                                 kvd_store_lease_t *leases, size_t *m)
{
    kvd_status_t s = kvd_store_lookup(svc->store, ns, hashes, n, leases, m);
    if (s == KVD_OK && *m < n && rq->include_remote && svc->cfg.miss != NULL &&
        svc->cfg.miss(svc->cfg.cluster_ctx, ns, hashes + *m, n - *m,
                      rq->source_node, svc_caller_id) > 0) {
        /* Other nodes had more of the chain; it is here now. */
        (void)kvd_store_release(svc->store, leases, *m);
        *m = 0;
        s = kvd_store_lookup(svc->store, ns, hashes, n, leases, m);
    }
    return s;
}

/* The tenant's leases stay under its cap: the prefix of the `m` leases
 * that fits is matched, the rest given back (the engine computes it).
 * Returns the prefix's length. */
static size_t lookup_trim(kvd_service_t *svc, kvd_store_lease_t *leases,
                          size_t m)
{
    pthread_mutex_lock(&svc->mu);
    uint64_t room = svc_held_room(svc, svc_caller_id);
    pthread_mutex_unlock(&svc->mu);
    size_t k = 0;
    while (k < m && leases[k].size_bytes <= room) {
        room -= leases[k++].size_bytes;
    }
    if (k < m) {
        (void)kvd_store_release(svc->store, leases + k, m - k);
        svc_count(&svc->leases_refused, m - k);
    }
    return k;
}

/* Writes where each of the `m` leased blocks is into `rsp`: as m
 * sub-messages in `locs` / `locp`, or (packed_form) as three packed arrays
 * in `locp`'s room and *packed_out (malloc'd; the caller frees it). */
static kvd_status_t lookup_locations(kvd_pb_lookup_response_t *rsp,
                                     bool packed_form,
                                     const kvd_store_lease_t *leases, size_t m,
                                     kvd_pb_block_location_t *locs,
                                     kvd_pb_block_location_t **locp,
                                     uint64_t **packed_out)
{
    if (packed_form) {
        /* Three packed arrays instead of m sub-messages; `locs` and `locp`
         * are big enough to hold them (n >= m entries of >= 8 bytes). */
        Kvdepot__V1__Tier *tiers = (Kvdepot__V1__Tier *)(void *)locp;
        uint64_t *offsets = malloc(2 * (m ? m : 1) * sizeof *offsets);
        if (offsets == NULL) {
            return KVD_ERR_NOMEM;
        }
        *packed_out = offsets;
        for (size_t i = 0; i < m; i++) {
            tiers[i] = svc_tier(leases[i].tier);
            offsets[i] = leases[i].tier == KVD_STORE_TIER_HOST
                             ? leases[i].arena_offset
                             : 0;
            offsets[m + i] = leases[i].size_bytes;
        }
        rsp->n_tiers = rsp->n_arena_offsets = rsp->n_sizes = m;
        rsp->tiers = tiers;
        rsp->arena_offsets = offsets;
        rsp->sizes = offsets + m;
        return KVD_OK;
    }
    for (size_t i = 0; i < m; i++) {
        kvdepot__v1__block_location__init(&locs[i]);
        locs[i].tier = svc_tier(leases[i].tier);
        locs[i].size_bytes = leases[i].size_bytes;
        if (leases[i].tier == KVD_STORE_TIER_HOST) {
            locs[i].arena_offset = leases[i].arena_offset;
        }
        locp[i] = &locs[i];
    }
    rsp->n_locations = m;
    rsp->locations = locp;
    return KVD_OK;
}

/* Keeps the `m` leases under a new lease id, written into `rsp`; on
 * KVD_OK the table holds them, on KVD_ERR_NOMEM the caller still does. */
static kvd_status_t lookup_keep(kvd_service_t *svc, const kvd_namespace_t *ns,
                                uint32_t ttl_ms,
                                const kvd_store_lease_t *leases, size_t m,
                                kvd_pb_lookup_response_t *rsp)
{
    svc_lease_t *rec = svc_lease_new(ns, ttl_ms);
    if (rec == NULL || svc_lease_fill(rec, leases, m) != KVD_OK) {
        if (rec != NULL) {
            svc_lease_free(rec);
        }
        return KVD_ERR_NOMEM;
    }
    /* Once in the table the record belongs to it: the housekeeping
     * thread may expire and free it as soon as `mu` is released, so
     * nothing below touches `rec` again. */
    pthread_mutex_lock(&svc->mu);
    rec->id = svc_id_new(svc);
    rec->tenant = svc_caller_id;
    rec->session = svc_caller_session;
    rsp->lease_id = rec->id;
    svc_lease_insert(svc, rec);
    pthread_mutex_unlock(&svc->mu);
    rsp->lease_ttl_ms = ttl_ms;
    return KVD_OK;
}

kvd_status_t svc_lookup(kvd_service_t *svc, const uint8_t *req, size_t len,
                        uint8_t **out, size_t *out_len, char *reason,
                        size_t reason_len)
{
    kvd_pb_lookup_request_t *rq = NULL;
    kvd_status_t s =
        kvd_proto_lookup_request_unpack(req, len, &rq, reason, reason_len);
    if (s != KVD_OK) {
        return s;
    }
    if (rq->n_release_lease_ids > 0) {
        (void)svc_release_ids(svc, rq->release_lease_ids,
                              rq->n_release_lease_ids);
    }
    size_t n = 0, m = 0;
    kvd_namespace_t ns;
    s = svc_ns(&rq->namespace_id, &ns, reason, reason_len);
    if (s != KVD_OK) {
        kvd_proto_lookup_request_free(rq);
        return s;
    }
    kvd_block_hash_t *hashes = lookup_hashes(rq, &n);
    kvd_store_lease_t *leases = malloc(n * sizeof *leases);
    kvd_pb_block_location_t *locs = calloc(n, sizeof *locs);
    kvd_pb_block_location_t **locp = calloc(n, sizeof *locp);
    uint64_t *packed = NULL;
    if (hashes == NULL || leases == NULL || locs == NULL || locp == NULL) {
        s = KVD_ERR_NOMEM;
        goto out;
    }
    s = lookup_match(svc, rq, &ns, hashes, n, leases, &m);
    if (s != KVD_OK) {
        goto out;
    }
    svc_tenant_count_lookup(svc, leases, m, n);
    if (m > 0 && rq->lease_ttl_ms > 0 && svc->cfg.tenant_max_leased_bytes) {
        m = lookup_trim(svc, leases, m);
    }
    kvd_pb_lookup_response_t rsp = KVDEPOT__V1__LOOKUP_RESPONSE__INIT;
    s = lookup_locations(&rsp, rq->packed_locations, leases, m, locs, locp,
                         &packed);
    if (s != KVD_OK) {
        goto out;
    }
    if (m > 0 && rq->lease_ttl_ms > 0) {
        s = lookup_keep(svc, &ns, rq->lease_ttl_ms, leases, m, &rsp);
        if (s != KVD_OK) {
            goto out;
        }
        m = 0; /* the record holds them now */
    }
    s = svc_pack(KVD_PROTO_MSG_LOOKUP_RESPONSE, &rsp.base, out, out_len, reason,
                 reason_len);
    if (s != KVD_OK && rsp.lease_id != 0) {
        pthread_mutex_lock(&svc->mu);
        svc_lease_t *l = svc_lease_find(svc, rsp.lease_id);
        if (l != NULL) {
            svc_lease_unlink(svc, l);
            svc_lease_drop(svc, l);
        }
        pthread_mutex_unlock(&svc->mu);
    }
out:
    if (m > 0) {
        /* Probes (ttl 0) and failures give the leases back at once. */
        (void)kvd_store_release(svc->store, leases, m);
    }
    free(packed);
    free(locp);
    free(locs);
    free(leases);
    free(hashes);
    kvd_proto_lookup_request_free(rq);
    return s;
}

/* ---- Release ------------------------------------------------------------ */

kvd_status_t svc_release(kvd_service_t *svc, const uint8_t *req, size_t len,
                         uint8_t **out, size_t *out_len, char *reason,
                         size_t reason_len)
{
    kvd_pb_release_request_t *rq = NULL;
    kvd_status_t s =
        kvd_proto_release_request_unpack(req, len, &rq, reason, reason_len);
    if (s != KVD_OK) {
        return s;
    }
    uint32_t released = svc_release_ids(svc, rq->lease_ids, rq->n_lease_ids);
    kvd_pb_release_response_t rsp = KVDEPOT__V1__RELEASE_RESPONSE__INIT;
    rsp.num_released = released;
    s = svc_pack(KVD_PROTO_MSG_RELEASE_RESPONSE, &rsp.base, out, out_len,
                 reason, reason_len);
    kvd_proto_release_request_free(rq);
    return s;
}
