/*
 * Reservations: Reserve takes arena slots for a batch of new blocks under
 * one reservation id; the client writes the bytes through its mapping and
 * Commit publishes each block (after checking its checksum when
 * server.verify_commits is on) or Abort gives its slot back. A Reserve in
 * parts (revision 9: ranks writing their heads of one object) joins the
 * store's slot of each block as its part (kvd_store_reserve_part); its
 * Commit ends that part, unverified (no writer knows the whole bytes),
 * and the object is published, and offered to the cluster, with its last
 * part; its Abort, or its deadline, abandons the object. Whatever is
 * still reserved at the deadline is aborted by the housekeeping thread, or
 * quarantined while the creator's hand-off session is open
 * (service_quarantine.c): then its Commit answers KVD_ERR_TIMEOUT and
 * publishes nothing, and Commit or Abort gives its slots back.
 * While the service drains (Admin drain) Reserve refuses every block.
 * Two caps keep one caller from pinning the arena: no deadline is later
 * than server.reservation_ttl_max, and a caller's blocks past
 * server.max_reserved_bytes are refused (KVD_ERR_NOSPACE) before the store
 * is asked, so they evict nothing.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/config_int.h"
#include "common/time_int.h"
#include "server/svc_int.h"

static svc_resv_t *resv_find(kvd_service_t *svc, uint64_t id)
{
    for (svc_resv_t *r = svc->resvs[svc_bucket(id)]; r != NULL; r = r->next) {
        if (r->id == id) {
            return r;
        }
    }
    return NULL;
}

void svc_resv_unlink(kvd_service_t *svc, svc_resv_t *r)
{
    svc_resv_t **pp = &svc->resvs[svc_bucket(r->id)];
    while (*pp != r) {
        pp = &(*pp)->next;
    }
    *pp = r->next;
    svc->n_resvs--;
}

void svc_resv_free(svc_resv_t *r)
{
    if (r != NULL) {
        free(r->keys);
        free(r);
    }
}

/* Aborts every key still reserved. `mu` held. */
void svc_resv_abort_open(kvd_service_t *svc, svc_resv_t *r)
{
    for (size_t i = 0; i < r->n; i++) {
        if (r->keys[i].state == SVC_RESERVED) {
            kvd_store_key_t k = {.ns = r->ns, .hash = r->keys[i].hash};
            (void)kvd_store_abort_part(svc->store, &k, 1, r->part, NULL);
            r->keys[i].state = SVC_DONE;
        }
    }
    r->open = 0;
}

/* ---- Reserve / Commit / Abort ------------------------------------------- */

static Kvdepot__V1__ReserveOutcome svc_outcome(kvd_status_t s)
{
    if (s == KVD_OK) {
        return KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_RESERVED;
    }
    if (s == KVD_ERR_EXISTS) {
        return KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_EXISTS;
    }
    return KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_REJECTED;
}

/* How many of `n` blocks of `object_bytes` this thread's caller may ask
 * the store for under server.max_reserved_bytes. Takes `mu`. */
static size_t resv_cap_blocks(kvd_service_t *svc, size_t n,
                              uint64_t object_bytes)
{
    pthread_mutex_lock(&svc->mu);
    uint64_t room = svc_reserved_room(svc);
    pthread_mutex_unlock(&svc->mu);
    if (room == UINT64_MAX || object_bytes == 0) {
        return n;
    }
    uint64_t fit = room / object_bytes;
    return fit < n ? (size_t)fit : n;
}

/* Gives back the slots in `res` that would take this thread's caller past
 * server.max_reserved_bytes now (another Reserve of the same caller took
 * the room since resv_cap_blocks), marking them KVD_ERR_NOSPACE. `mu`
 * held, until the reservation is in the table. */
static void resv_trim_to_cap(kvd_service_t *svc, const svc_resv_t *rec,
                             const kvd_namespace_t *ns,
                             const kvd_block_hash_t *hashes,
                             kvd_store_reservation_t *res, size_t n,
                             uint64_t object_bytes)
{
    uint64_t room = svc_reserved_room(svc);
    if (room == UINT64_MAX) {
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (res[i].status != KVD_OK) {
            continue;
        }
        if (room >= object_bytes) {
            room -= object_bytes;
            continue;
        }
        kvd_store_key_t k = {.ns = *ns, .hash = hashes[i]};
        (void)kvd_store_abort_part(svc->store, &k, 1, rec->part, NULL);
        res[i].status = KVD_ERR_NOSPACE;
    }
}

/* Fills the reply's blocks from the store's answers and records the
 * reserved ones in `rec`; returns whether any was reserved. */
static bool resv_blocks(const kvd_pb_reserve_request_t *rq,
                        const kvd_block_hash_t *hashes,
                        const kvd_store_reservation_t *res,
                        kvd_pb_block_reservation_t *blocks,
                        kvd_pb_block_reservation_t **bp, svc_resv_t *rec)
{
    bool reserved_any = false;
    for (size_t i = 0; i < rq->n_block_hashes; i++) {
        kvdepot__v1__block_reservation__init(&blocks[i]);
        blocks[i].block_hash = rq->block_hashes[i];
        blocks[i].outcome = svc_outcome(res[i].status);
        if (blocks[i].outcome ==
            KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_REJECTED) {
            blocks[i].status = (int32_t)res[i].status;
        }
        if (res[i].status == KVD_OK) {
            blocks[i].arena_offset = res[i].arena_offset;
            blocks[i].first = res[i].first;
            svc_resv_key_t *k = &rec->keys[rec->n++];
            k->hash = hashes[i];
            k->offset = res[i].arena_offset;
            k->state = SVC_RESERVED;
            reserved_any = true;
        }
        bp[i] = &blocks[i];
    }
    rec->open = rec->n;
    return reserved_any;
}

/* The store's answers for a Reserve of `n` blocks: every block refused
 * while draining; blocks past the caller's server.max_reserved_bytes
 * KVD_ERR_NOSPACE without asking the store (which would evict for them). */
static kvd_status_t resv_store(kvd_service_t *svc,
                               const kvd_pb_reserve_request_t *rq,
                               const kvd_namespace_t *ns,
                               const kvd_block_hash_t *hashes, size_t n,
                               svc_resv_t *rec, kvd_store_reservation_t *res)
{
    if (__atomic_load_n(&svc->draining, __ATOMIC_ACQUIRE)) {
        /* Draining for a restart: no new saves (REJECTED = skip). */
        for (size_t i = 0; i < n; i++) {
            res[i].status = KVD_ERR_BUSY;
        }
        return KVD_OK;
    }
    const char *tenant =
        svc_caller_tenant != NULL ? svc_caller_tenant : rq->tenant;
    rec->store_tenant = svc_tenant_id(tenant);
    size_t fit = resv_cap_blocks(svc, n, rq->object_size_bytes);
    for (size_t i = fit; i < n; i++) {
        res[i].status = KVD_ERR_NOSPACE;
    }
    if (fit == 0) {
        return KVD_OK;
    }
    return kvd_store_reserve_part(svc->store, ns, hashes, fit,
                                  rq->object_size_bytes, rec->store_tenant,
                                  rec->part, rec->num_parts, res);
}

kvd_status_t svc_reserve(kvd_service_t *svc, const uint8_t *req, size_t len,
                         uint8_t **out, size_t *out_len, char *reason,
                         size_t reason_len)
{
    kvd_pb_reserve_request_t *rq = NULL;
    kvd_status_t s =
        kvd_proto_reserve_request_unpack(req, len, &rq, reason, reason_len);
    if (s != KVD_OK) {
        return s;
    }
    size_t n = rq->n_block_hashes;
    kvd_namespace_t ns;
    s = svc_ns(&rq->namespace_id, &ns, reason, reason_len);
    if (s != KVD_OK) {
        kvd_proto_reserve_request_free(rq);
        return s;
    }
    kvd_block_hash_t *hashes = svc_hashes(rq->block_hashes, n);
    kvd_store_reservation_t *res = calloc(n, sizeof *res);
    kvd_pb_block_reservation_t *blocks = calloc(n, sizeof *blocks);
    kvd_pb_block_reservation_t **bp = calloc(n, sizeof *bp);
    svc_resv_t *rec = calloc(1, sizeof *rec);
    if (rec != NULL) {
        rec->keys = calloc(n, sizeof *rec->keys);
    }
    if (hashes == NULL || res == NULL || blocks == NULL || bp == NULL ||
        rec == NULL || rec->keys == NULL) {
        s = KVD_ERR_NOMEM;
        goto out;
    }
    rec->part = rq->part;
    rec->num_parts = rq->num_parts > 1 ? rq->num_parts : 1;
    s = resv_store(svc, rq, &ns, hashes, n, rec, res);
    if (s != KVD_OK) {
        kvd_config_err(reason, reason_len, "object_size_bytes %llu: %s",
                       (unsigned long long)rq->object_size_bytes,
                       kvd_status_str(s));
        goto out;
    }
    uint32_t ttl = svc_ttl(rq->ttl_ms, svc->cfg.reservation_ttl_ms);
    if (svc->cfg.reservation_ttl_max_ms != 0 &&
        ttl > svc->cfg.reservation_ttl_max_ms) {
        ttl = svc->cfg.reservation_ttl_max_ms; /* the reply says so */
    }
    rec->ns = ns;
    rec->object_bytes = rq->object_size_bytes;
    rec->deadline_ns = kvd_time_now_ns() + (uint64_t)ttl * 1000000u;
    kvd_pb_reserve_response_t rsp = KVDEPOT__V1__RESERVE_RESPONSE__INIT;
    rsp.n_blocks = n;
    rsp.blocks = bp;
    rsp.num_parts = rq->num_parts;
    /* The cap's check and the insertion happen under one hold of `mu`. */
    pthread_mutex_lock(&svc->mu);
    resv_trim_to_cap(svc, rec, &ns, hashes, res, n, rq->object_size_bytes);
    if (resv_blocks(rq, hashes, res, blocks, bp, rec)) {
        rsp.ttl_ms = ttl;
        rec->id = svc_id_new(svc);
        rec->tenant = svc_caller_id;
        rec->session = svc_caller_session;
        size_t b = svc_bucket(rec->id);
        rec->next = svc->resvs[b];
        svc->resvs[b] = rec;
        svc->n_resvs++;
        rsp.reservation_id = rec->id;
        s = svc_pack(KVD_PROTO_MSG_RESERVE_RESPONSE, &rsp.base, out, out_len,
                     reason, reason_len);
        if (s != KVD_OK) {
            svc_resv_unlink(svc, rec);
            svc_resv_abort_open(svc, rec);
            svc_resv_free(rec);
        }
        rec = NULL;
    } else {
        s = svc_pack(KVD_PROTO_MSG_RESERVE_RESPONSE, &rsp.base, out, out_len,
                     reason, reason_len);
    }
    pthread_mutex_unlock(&svc->mu);
out:
    if (rec != NULL && rec->n > 0) {
        pthread_mutex_lock(&svc->mu);
        svc_resv_abort_open(svc, rec);
        pthread_mutex_unlock(&svc->mu);
    }
    svc_resv_free(rec);
    free(bp);
    free(blocks);
    free(res);
    free(hashes);
    kvd_proto_reserve_request_free(rq);
    return s;
}

/* Takes `mu` and returns reservation `id`; or, when there is none, writes
 * why into `reason` and returns NULL with `mu` released. */
static svc_resv_t *resv_lock(kvd_service_t *svc, uint64_t id, char *reason,
                             size_t reason_len)
{
    pthread_mutex_lock(&svc->mu);
    svc_resv_t *r = resv_find(svc, id);
    if (r != NULL && !svc_owns(r->tenant)) {
        r = NULL;
    }
    if (r == NULL) {
        pthread_mutex_unlock(&svc->mu);
        kvd_config_err(reason, reason_len,
                       "reservation_id %llu: unknown, expired or done",
                       (unsigned long long)id);
    }
    return r;
}

/* The caller's acknowledgement of an expired reservation it still had in
 * quarantine: its slots go back now. Takes `mu`. */
static bool resv_ack_expired(kvd_service_t *svc, uint64_t id,
                             uint32_t *aborted_out)
{
    pthread_mutex_lock(&svc->mu);
    bool found = svc_quarantine_release_resv(svc, id, aborted_out);
    pthread_mutex_unlock(&svc->mu);
    return found;
}

/* The reservation's key for `hash`, or NULL. `mu` held. */
static svc_resv_key_t *resv_key(svc_resv_t *r, const uint8_t *hash)
{
    for (size_t k = 0; k < r->n; k++) {
        size_t i = (r->cursor + k) % r->n;
        if (memcmp(r->keys[i].hash.bytes, hash, KVD_SHA256_BYTES) == 0) {
            r->cursor = i + 1;
            return &r->keys[i];
        }
    }
    return NULL;
}

/* Removes a reservation with nothing left open. `mu` held. */
static void resv_maybe_done(kvd_service_t *svc, svc_resv_t *r)
{
    if (r->open == 0) {
        svc_resv_unlink(svc, r);
        svc_resv_free(r);
    }
}

/* Commits a plain reservation's key: with server.verify_commits, only if
 * the slot's bytes match the entry's checksum (an entry without one is
 * refused), which is then kept with the object (the cluster data plane
 * sends it with the bytes instead of hashing them again). `mu` held. */
static kvd_status_t resv_commit_one(kvd_service_t *svc, const svc_resv_t *r,
                                    const svc_resv_key_t *k,
                                    const kvd_store_key_t *key,
                                    const kvd_pb_commit_entry_t *e)
{
    if (!svc->cfg.verify_commits || e->n_layer_checksums > 1) {
        return kvd_store_commit(svc->store, key, 1, NULL);
    }
    const void *p = kvd_store_arena_ptr(svc->store, k->offset, r->object_bytes);
    if (e->n_layer_checksums == 0 || p == NULL ||
        kvd_xxh3_64(p, r->object_bytes) != e->layer_checksums[0]) {
        svc_count(&svc->checksum_errors, 1);
        (void)kvd_store_abort(svc->store, key, 1, NULL);
        return KVD_ERR_CHECKSUM;
    }
    return kvd_store_commit_checksum(svc->store, key, e->layer_checksums[0]);
}

/* Ends the caller's part of a key of an object written in parts; the
 * object is published with its last part. `mu` held. */
static kvd_status_t resv_commit_part(kvd_service_t *svc, const svc_resv_t *r,
                                     const kvd_store_key_t *key,
                                     bool *published)
{
    kvd_status_t ks = KVD_ERR_INTERNAL;
    (void)kvd_store_commit_part(svc->store, key, 1, r->part, &ks, published);
    return ks;
}

kvd_status_t svc_commit(kvd_service_t *svc, const uint8_t *req, size_t len,
                        uint8_t **out, size_t *out_len, char *reason,
                        size_t reason_len)
{
    kvd_pb_commit_request_t *rq = NULL;
    kvd_status_t s =
        kvd_proto_commit_request_unpack(req, len, &rq, reason, reason_len);
    if (s != KVD_OK) {
        return s;
    }
    size_t n = rq->n_entries;
    int32_t *statuses = calloc(n, sizeof *statuses);
    if (statuses == NULL) {
        kvd_proto_commit_request_free(rq);
        return KVD_ERR_NOMEM;
    }
    uint32_t committed = 0, n_saved = 0;
    kvd_block_hash_t *saved =
        svc->cfg.saved != NULL ? malloc(n * sizeof *saved) : NULL;
    uint32_t given_back = 0;
    if (resv_ack_expired(svc, rq->reservation_id, &given_back)) {
        /* Written after its deadline, maybe after its slots could have
         * been reused: never published. */
        kvd_config_err(reason, reason_len,
                       "reservation_id %llu: expired; its %u open slots "
                       "were given back",
                       (unsigned long long)rq->reservation_id, given_back);
        free(saved);
        free(statuses);
        kvd_proto_commit_request_free(rq);
        return KVD_ERR_TIMEOUT;
    }
    svc_resv_t *r = resv_lock(svc, rq->reservation_id, reason, reason_len);
    if (r == NULL) {
        free(saved);
        free(statuses);
        kvd_proto_commit_request_free(rq);
        return KVD_ERR_NOT_FOUND;
    }
    for (size_t i = 0; i < n; i++) {
        const kvd_pb_commit_entry_t *e = rq->entries[i];
        svc_resv_key_t *k = resv_key(r, e->block_hash.data);
        if (k == NULL || k->state != SVC_RESERVED) {
            statuses[i] = KVD_ERR_NOT_FOUND;
            continue;
        }
        kvd_store_key_t key = {.ns = r->ns, .hash = k->hash};
        bool published = false;
        kvd_status_t ks = r->num_parts > 1
                              ? resv_commit_part(svc, r, &key, &published)
                              : resv_commit_one(svc, r, k, &key, e);
        published |= r->num_parts == 1 && ks == KVD_OK;
        k->state = SVC_DONE;
        r->open--;
        statuses[i] = (int32_t)ks;
        if (published && saved != NULL) {
            saved[n_saved++] = k->hash;
        }
        committed += ks == KVD_OK;
    }
    kvd_namespace_t ns = r->ns;
    uint64_t object_bytes = r->object_bytes;
    uint32_t store_tenant = r->store_tenant;
    resv_maybe_done(svc, r);
    pthread_mutex_unlock(&svc->mu);
    if (saved != NULL && n_saved > 0) {
        svc->cfg.saved(svc->cfg.cluster_ctx, &ns, saved, n_saved, object_bytes,
                       store_tenant);
    }
    free(saved);

    kvd_pb_commit_response_t rsp = KVDEPOT__V1__COMMIT_RESPONSE__INIT;
    rsp.num_committed = committed;
    rsp.n_statuses = n;
    rsp.statuses = statuses;
    s = svc_pack(KVD_PROTO_MSG_COMMIT_RESPONSE, &rsp.base, out, out_len, reason,
                 reason_len);
    free(statuses);
    kvd_proto_commit_request_free(rq);
    return s;
}

/* Aborts the keys `rq` names (all that are open when it names none);
 * returns how many. `mu` held. */
static uint32_t resv_abort_keys(kvd_service_t *svc, svc_resv_t *r,
                                const kvd_pb_abort_request_t *rq)
{
    if (rq->n_block_hashes == 0) {
        uint32_t aborted = (uint32_t)r->open;
        svc_resv_abort_open(svc, r);
        return aborted;
    }
    uint32_t aborted = 0;
    for (size_t i = 0; i < rq->n_block_hashes; i++) {
        svc_resv_key_t *k = resv_key(r, rq->block_hashes[i].data);
        if (k == NULL || k->state != SVC_RESERVED) {
            continue;
        }
        kvd_store_key_t key = {.ns = r->ns, .hash = k->hash};
        (void)kvd_store_abort_part(svc->store, &key, 1, r->part, NULL);
        k->state = SVC_DONE;
        r->open--;
        aborted++;
    }
    return aborted;
}

kvd_status_t svc_abort(kvd_service_t *svc, const uint8_t *req, size_t len,
                       uint8_t **out, size_t *out_len, char *reason,
                       size_t reason_len)
{
    kvd_pb_abort_request_t *rq = NULL;
    kvd_status_t s =
        kvd_proto_abort_request_unpack(req, len, &rq, reason, reason_len);
    if (s != KVD_OK) {
        return s;
    }
    uint32_t aborted = 0;
    /* An expired one the caller still had in quarantine goes back whole
     * (none of it can be committed any more). */
    if (!resv_ack_expired(svc, rq->reservation_id, &aborted)) {
        svc_resv_t *r = resv_lock(svc, rq->reservation_id, reason, reason_len);
        if (r == NULL) {
            kvd_proto_abort_request_free(rq);
            return KVD_ERR_NOT_FOUND;
        }
        aborted = resv_abort_keys(svc, r, rq);
        resv_maybe_done(svc, r);
        pthread_mutex_unlock(&svc->mu);
    }
    kvd_pb_abort_response_t rsp = KVDEPOT__V1__ABORT_RESPONSE__INIT;
    rsp.num_aborted = aborted;
    s = svc_pack(KVD_PROTO_MSG_ABORT_RESPONSE, &rsp.base, out, out_len, reason,
                 reason_len);
    kvd_proto_abort_request_free(rq);
    return s;
}
