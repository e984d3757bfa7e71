/*
 * Get and Promote. Get leases blocks one by one under a lease id (a new
 * one, or the one a Lookup answered) and answers READY with the arena
 * offset of each block in the host tier; a block on the disk tier is
 * fetched with a store get and answers PENDING until the housekeeping
 * thread applies the completion (then READY, or FAILED with the status).
 * Promote starts the same fetches without a lease the client holds: each
 * block is given back as soon as it is in the arena.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/config_int.h"
#include "common/time_int.h"
#include "server/svc_int.h"

kvd_status_t svc_get(kvd_service_t *svc, const uint8_t *req, size_t len,
                     uint8_t **out, size_t *out_len, char *reason,
                     size_t reason_len)
{
    kvd_pb_get_request_t *rq = NULL;
    kvd_status_t s =
        kvd_proto_get_request_unpack(req, len, &rq, reason, reason_len);
    if (s != KVD_OK) {
        return s;
    }
    size_t n = rq->n_block_hashes;
    kvd_namespace_t ns;
    s = svc_ns(&rq->namespace_id, &ns, reason, reason_len);
    if (s != KVD_OK) {
        kvd_proto_get_request_free(rq);
        return s;
    }
    uint32_t ttl = svc_ttl(rq->lease_ttl_ms, svc->cfg.lease_ttl_ms);
    kvd_pb_get_entry_t *ents = calloc(n, sizeof *ents);
    kvd_pb_get_entry_t **ep = calloc(n, sizeof *ep);
    if (ents == NULL || ep == NULL) {
        free(ents);
        free(ep);
        kvd_proto_get_request_free(rq);
        return KVD_ERR_NOMEM;
    }
    pthread_mutex_lock(&svc->mu);
    svc_lease_t *l = NULL;
    bool fresh = false;
    if (rq->lease_id != 0) {
        l = svc_lease_find(svc, rq->lease_id);
        if (l == NULL || memcmp(&l->ns, &ns, sizeof ns) != 0) {
            pthread_mutex_unlock(&svc->mu);
            kvd_config_err(reason, reason_len,
                           "lease_id %llu: unknown, expired, released or of "
                           "another namespace",
                           (unsigned long long)rq->lease_id);
            s = KVD_ERR_NOT_FOUND;
            goto out;
        }
        l->ttl_ms = ttl;
    } else {
        l = svc_lease_new(&ns, ttl);
        if (l == NULL) {
            pthread_mutex_unlock(&svc->mu);
            s = KVD_ERR_NOMEM;
            goto out;
        }
        l->id = svc_id_new(svc);
        l->tenant = svc_caller_id;
        l->session = svc_caller_session;
        fresh = true;
    }
    l->deadline_ns = kvd_time_now_ns() + (uint64_t)ttl * 1000000u;
    bool any_held = false;
    for (size_t i = 0; i < n; i++) {
        kvd_pb_get_entry_t *e = &ents[i];
        kvdepot__v1__get_entry__init(e);
        ep[i] = e;
        e->block_hash = rq->block_hashes[i];
        svc_block_t *b = svc_lease_block(l, rq->block_hashes[i].data);
        if (b == NULL) {
            kvd_block_hash_t h;
            memcpy(h.bytes, rq->block_hashes[i].data, sizeof h.bytes);
            kvd_status_t ts = KVD_OK;
            if (svc_lease_take_one(svc, l, &h, &ts)) {
                b = l->blocks[l->n - 1];
            } else if (ts != KVD_OK) {
                e->state = KVDEPOT__V1__GET_STATE__GET_STATE_FAILED;
                e->status = ts;
                continue;
            }
        }
        if (b == NULL) {
            e->state = KVDEPOT__V1__GET_STATE__GET_STATE_MISSING;
            continue;
        }
        if (b->state == SVC_HELD && b->lease.tier == KVD_STORE_TIER_DISK) {
            svc_block_fetch(svc, b);
        }
        if (b->state == SVC_HELD && b->lease.tier == KVD_STORE_TIER_HOST) {
            e->state = KVDEPOT__V1__GET_STATE__GET_STATE_READY;
            e->arena_offset = b->lease.arena_offset;
            e->size_bytes = b->lease.size_bytes;
            any_held = true;
        } else if (b->state == SVC_FAILED) {
            e->state = KVDEPOT__V1__GET_STATE__GET_STATE_FAILED;
            e->status = b->status;
        } else {
            e->state = KVDEPOT__V1__GET_STATE__GET_STATE_PENDING;
            any_held = true;
        }
    }
    kvd_pb_get_response_t rsp = KVDEPOT__V1__GET_RESPONSE__INIT;
    rsp.n_entries = n;
    rsp.entries = ep;
    if (fresh) {
        if (any_held) {
            svc_lease_insert(svc, l);
        } else {
            svc_lease_drop(svc, l);
            l = NULL;
        }
    }
    /* The reply names the lease only when it covers one of its entries
     * (GetResponse.lease_id): a lease whose every asked block failed is
     * still open for its other blocks, but not part of this answer. */
    if (l != NULL && any_held) {
        rsp.lease_id = l->id;
        rsp.lease_ttl_ms = ttl;
    }
    pthread_mutex_unlock(&svc->mu);
    s = svc_pack(KVD_PROTO_MSG_GET_RESPONSE, &rsp.base, out, out_len, reason,
                 reason_len);
out:
    free(ep);
    free(ents);
    kvd_proto_get_request_free(rq);
    return s;
}

kvd_status_t svc_promote(kvd_service_t *svc, const uint8_t *req, size_t len,
                         uint8_t **out, size_t *out_len, char *reason,
                         size_t reason_len)
{
    kvd_pb_promote_request_t *rq = NULL;
    kvd_status_t s =
        kvd_proto_promote_request_unpack(req, len, &rq, reason, reason_len);
    if (s != KVD_OK) {
        return s;
    }
    uint32_t accepted = 0;
    kvd_namespace_t ns;
    s = svc_ns(&rq->namespace_id, &ns, reason, reason_len);
    if (s != KVD_OK) {
        kvd_proto_promote_request_free(rq);
        return s;
    }
    /* Only promotion into the arena exists: the disk tier already keeps
     * what write-back admits, so TIER_DISK accepts nothing. */
    if (rq->target_tier == KVDEPOT__V1__TIER__TIER_HOST) {
        pthread_mutex_lock(&svc->mu);
        svc_lease_t *l = svc_lease_new(&ns, svc->cfg.lease_ttl_ms);
        if (l == NULL) {
            pthread_mutex_unlock(&svc->mu);
            kvd_proto_promote_request_free(rq);
            return KVD_ERR_NOMEM;
        }
        l->id = svc_id_new(svc);
        l->tenant = svc_caller_id;
        l->promote = true;
        for (size_t i = 0; i < rq->n_block_hashes; i++) {
            kvd_block_hash_t h;
            memcpy(h.bytes, rq->block_hashes[i].data, sizeof h.bytes);
            kvd_status_t ts = KVD_OK;
            if (!svc_lease_take_one(svc, l, &h, &ts)) {
                continue;
            }
            svc_block_t *b = l->blocks[l->n - 1];
            if (b->lease.tier == KVD_STORE_TIER_DISK) {
                svc_block_fetch(svc, b);
                accepted += b->state == SVC_PENDING;
            }
        }
        /* Promote leases are never named by a client: out of the table at
         * once; the completion releases each block. */
        svc_lease_drop(svc, l);
        pthread_mutex_unlock(&svc->mu);
    }
    kvd_pb_promote_response_t rsp = KVDEPOT__V1__PROMOTE_RESPONSE__INIT;
    rsp.num_accepted = accepted;
    s = svc_pack(KVD_PROTO_MSG_PROMOTE_RESPONSE, &rsp.base, out, out_len,
                 reason, reason_len);
    kvd_proto_promote_request_free(rq);
    return s;
}
