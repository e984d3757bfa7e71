/*
 * The save path and deletes (client_int.h). Reserve asks the daemon for
 * arena slots and records each reserved key with its reservation id and
 * daemon instance; the caller writes the bytes through the mapped arena;
 * Commit (with each object's checksum) or Abort ends them, one call per
 * reservation id. A reservation from a daemon that has restarted since is
 * gone with it: its commit reports KVD_ERR_NOT_FOUND. Each key keeps the
 * deadline the reply's TTL gives (counted from before the call): past it
 * the write pointer is refused and a commit is turned into an abort that
 * reports KVD_ERR_TIMEOUT, since the daemon may have ended the reservation
 * while the bytes were still being written. Delete sends one call
 * per run of keys of one namespace.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_int.h"
#include "common/log_int.h"
#include "common/time_int.h"

/* ---- reserve / commit / abort -------------------------------------------- */

static void cl_hash_refs(const kvd_block_hash_t *hashes, size_t n,
                         ProtobufCBinaryData *out)
{
    for (size_t i = 0; i < n; i++) {
        out[i].data = (uint8_t *)hashes[i].bytes;
        out[i].len = sizeof hashes[i].bytes;
    }
}

static size_t resv_bucket(const kvd_store_key_t *k)
{
    return (size_t)kvd_xxh3_64(k, sizeof *k) % CL_BUCKETS;
}

static size_t resv_off_bucket(uint64_t instance, uint64_t offset)
{
    return (size_t)(((instance ^ offset) * 0x9E3779B97F4A7C15ull) >> 40) %
           CL_BUCKETS;
}

/* Removes and returns the reservation of part `part` of `k` (0: a plain
 * one), or NULL. `mu` held. */
static cl_resv_t *resv_take(kvd_client_t *c, const kvd_store_key_t *k,
                            uint32_t part)
{
    for (cl_resv_t **pp = &c->resv[resv_bucket(k)]; *pp != NULL;
         pp = &(*pp)->next) {
        if (memcmp(&(*pp)->key, k, sizeof *k) == 0 && (*pp)->part == part) {
            cl_resv_t *r = *pp;
            *pp = r->next;
            cl_resv_t **op =
                &c->resv_off[resv_off_bucket(r->instance, r->offset)];
            while (*op != r) {
                op = &(*op)->next_off;
            }
            *op = r->next_off;
            return r;
        }
    }
    return NULL;
}

/* The open reservation of `instance` at `offset`, or NULL. `mu` held. */
static const cl_resv_t *resv_at(const kvd_client_t *c, uint64_t instance,
                                uint64_t offset)
{
    for (const cl_resv_t *r = c->resv_off[resv_off_bucket(instance, offset)];
         r != NULL; r = r->next_off) {
        if (r->instance == instance && r->offset == offset) {
            return r;
        }
    }
    return NULL;
}

/* Records reservation `r`, replacing one of the same key and part from
 * before. `mu` held. */
static void resv_insert(kvd_client_t *c, cl_resv_t *r)
{
    cl_resv_t *old = resv_take(c, &r->key, r->part);
    if (old != NULL) {
        kvd_cl_map_held(c, old->instance, -1);
        free(old);
    }
    kvd_cl_map_held(c, r->instance, 1);
    size_t bk = resv_bucket(&r->key);
    r->next = c->resv[bk];
    c->resv[bk] = r;
    bk = resv_off_bucket(r->instance, r->offset);
    r->next_off = c->resv_off[bk];
    c->resv_off[bk] = r;
}

/* The status of a block the daemon did not reserve: stored already, or
 * why it was refused (from revision 3 on; before: 0, taken as no space). */
static kvd_status_t resv_refused(const kvd_pb_block_reservation_t *b)
{
    if (b->outcome == KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_EXISTS) {
        return KVD_ERR_EXISTS;
    }
    if (b->outcome == KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_REJECTED &&
        b->status < 0) {
        return (kvd_status_t)b->status;
    }
    return KVD_ERR_NOSPACE;
}

void *kvd_client_reservation_ptr(kvd_client_t *c,
                                 const kvd_store_reservation_t *r, uint64_t len)
{
    void *p = NULL;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; r->status == KVD_OK && len > 0 && i < c->n_maps; i++) {
        if (c->maps[i].gen != r->reserved) {
            continue;
        }
        /* Only a reservation still open, not past its deadline, and only
         * its own bytes: after a commit, an abort or the deadline the slot
         * may be someone else's. */
        const cl_resv_t *rv = resv_at(c, c->maps[i].instance, r->arena_offset);
        if (rv != NULL && len <= rv->size &&
            kvd_time_now_ns() < rv->deadline_ns) {
            p = kvd_arena_mapping_ptr(c->maps[i].map, r->arena_offset, len);
        }
        break;
    }
    pthread_mutex_unlock(&c->mu);
    return p;
}

/* Gives every slot of reservation `id` (0: none) back. */
static void cl_abort_id(kvd_client_t *c, uint64_t id)
{
    if (id == 0) {
        return;
    }
    kvd_pb_abort_request_t ab = KVDEPOT__V1__ABORT_REQUEST__INIT;
    ab.reservation_id = id;
    ProtobufCMessage *ar = NULL;
    uint64_t used;
    (void)kvd_cl_call(c, CL_ABORT, KVD_PROTO_MSG_ABORT_REQUEST, &ab.base,
                      KVD_PROTO_MSG_ABORT_RESPONSE, &ar, &used, false);
    kvd_proto_free(ar);
}

kvd_status_t kvd_client_reserve(kvd_client_t *c, const kvd_namespace_t *ns,
                                const kvd_block_hash_t *hashes, size_t n,
                                uint64_t object_bytes, uint32_t tenant,
                                kvd_store_reservation_t *out)
{
    return kvd_client_reserve_part(c, ns, hashes, n, object_bytes, tenant, 0, 1,
                                   out);
}

kvd_status_t kvd_client_reserve_part(kvd_client_t *c, const kvd_namespace_t *ns,
                                     const kvd_block_hash_t *hashes, size_t n,
                                     uint64_t object_bytes, uint32_t tenant,
                                     uint32_t part, uint32_t num_parts,
                                     kvd_store_reservation_t *out)
{
    if (n == 0) {
        return KVD_OK;
    }
    if (object_bytes == 0 || object_bytes > c->size_bytes) {
        return KVD_ERR_INVALID;
    }
    ProtobufCBinaryData *hb = malloc(n * sizeof *hb);
    if (hb == NULL) {
        return KVD_ERR_NOMEM;
    }
    cl_hash_refs(hashes, n, hb);
    char tenant_name[16] = "";
    if (tenant != 0) {
        snprintf(tenant_name, sizeof tenant_name, "%" PRIu32, tenant);
    }
    kvd_pb_reserve_request_t rq = KVDEPOT__V1__RESERVE_REQUEST__INIT;
    rq.namespace_id.data = (uint8_t *)ns->bytes;
    rq.namespace_id.len = sizeof ns->bytes;
    rq.n_block_hashes = n;
    rq.block_hashes = hb;
    rq.object_size_bytes = object_bytes;
    rq.tenant = tenant_name;
    rq.part = num_parts > 1 ? part : 0;
    rq.num_parts = num_parts > 1 ? num_parts : 0;
    kvd_pb_reserve_response_t *rsp = NULL;
    uint64_t used;
    /* The daemon's deadline starts when it serves the call, after this. */
    uint64_t sent_ns = kvd_time_now_ns();
    kvd_status_t s = kvd_cl_call(c, CL_RESERVE, KVD_PROTO_MSG_RESERVE_REQUEST,
                                 &rq.base, KVD_PROTO_MSG_RESERVE_RESPONSE,
                                 (ProtobufCMessage **)&rsp, &used, true);
    free(hb);
    if (s == KVD_ERR_INVALID || s == KVD_ERR_PROTO) {
        return s; /* the call itself is wrong (e.g. larger than a chunk) */
    }
    if (s != KVD_OK) {
        /* No daemon, or it failed the call: the saves are skipped, the
         * engine goes on; each key says why (not "no space"). */
        for (size_t i = 0; i < n; i++) {
            out[i] = (kvd_store_reservation_t){.status = s};
        }
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 5000,
                            "store client: Reserve failed (%s): saves skipped",
                            kvd_status_str(s));
        return KVD_OK;
    }
    if (rsp->n_blocks != n) {
        KVD_LOG_ERROR("store client: Reserve reply: %zu outcomes for %zu",
                      rsp->n_blocks, n);
        cl_abort_id(c, rsp->reservation_id); /* rather than guess */
        kvd_proto_reserve_response_free(rsp);
        return KVD_ERR_PROTO;
    }
    if (rsp->num_parts != rq.num_parts) {
        /* A daemon before revision 9 reserved whole objects: another part
         * would be told they exist, and one part's bytes published. */
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 5000,
                            "store client: the daemon cannot take objects "
                            "in parts (protocol revision 9): saves skipped");
        cl_abort_id(c, rsp->reservation_id);
        kvd_proto_reserve_response_free(rsp);
        for (size_t i = 0; i < n; i++) {
            out[i] = (kvd_store_reservation_t){.status = KVD_ERR_UNSUPPORTED};
        }
        return KVD_OK;
    }
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        const kvd_pb_block_reservation_t *b = rsp->blocks[i];
        out[i] = (kvd_store_reservation_t){.status = resv_refused(b)};
        if (b->outcome !=
            KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_RESERVED) {
            continue;
        }
        cl_resv_t *r = NULL;
        if (kvd_cl_arena_contains(c, b->arena_offset, object_bytes) &&
            memcmp(b->block_hash.data, hashes[i].bytes, 32) == 0) {
            r = calloc(1, sizeof *r);
        }
        if (r == NULL) {
            /* Not recorded: the daemon aborts it at its TTL. */
            continue;
        }
        r->key.ns = *ns;
        r->key.hash = hashes[i];
        r->part = rq.part;
        r->num_parts = num_parts > 1 ? num_parts : 1;
        r->reservation_id = rsp->reservation_id;
        r->instance = used;
        r->offset = b->arena_offset;
        r->size = object_bytes;
        /* A daemon that names no TTL: no deadline known, none enforced. */
        r->deadline_ns =
            rsp->ttl_ms ? sent_ns + rsp->ttl_ms * 1000000ull : UINT64_MAX;
        resv_insert(c, r);
        cl_map_t *m = kvd_cl_map_of_instance(c, used);
        out[i].status = KVD_OK;
        out[i].reserved = m != NULL ? m->gen : 0;
        out[i].arena_offset = b->arena_offset;
        out[i].first = r->num_parts == 1 || b->first;
    }
    pthread_mutex_unlock(&c->mu);
    kvd_proto_reserve_response_free(rsp);
    return KVD_OK;
}

/* Commits (or aborts) the keys of one reservation id in one call. */
static kvd_status_t cl_finish_batch(kvd_client_t *c, bool commit,
                                    cl_resv_t **rs, size_t n, kvd_status_t *st)
{
    uint64_t used;
    kvd_status_t s;
    if (commit) {
        kvd_pb_commit_entry_t *e = calloc(n, sizeof *e);
        kvd_pb_commit_entry_t **ep = calloc(n, sizeof *ep);
        uint64_t *sums = calloc(n, sizeof *sums);
        if (e == NULL || ep == NULL || sums == NULL) {
            free(e);
            free(ep);
            free(sums);
            return KVD_ERR_NOMEM;
        }
        for (size_t i = 0; i < n; i++) {
            kvdepot__v1__commit_entry__init(&e[i]);
            e[i].block_hash.data = rs[i]->key.hash.bytes;
            e[i].block_hash.len = 32;
            /* A part's commit carries none: the other parts may still be
             * writing the object's other bytes. */
            if (rs[i]->num_parts == 1) {
                const void *p =
                    kvd_client_arena_ptr(c, rs[i]->offset, rs[i]->size);
                sums[i] = p != NULL ? kvd_xxh3_64(p, rs[i]->size) : 0;
                e[i].n_layer_checksums = 1;
                e[i].layer_checksums = &sums[i];
            }
            ep[i] = &e[i];
        }
        kvd_pb_commit_request_t rq = KVDEPOT__V1__COMMIT_REQUEST__INIT;
        rq.reservation_id = rs[0]->reservation_id;
        rq.n_entries = n;
        rq.entries = ep;
        kvd_pb_commit_response_t *rsp = NULL;
        s = kvd_cl_call(c, CL_COMMIT, KVD_PROTO_MSG_COMMIT_REQUEST, &rq.base,
                        KVD_PROTO_MSG_COMMIT_RESPONSE,
                        (ProtobufCMessage **)&rsp, &used, false);
        if (s == KVD_OK) {
            for (size_t i = 0; i < n; i++) {
                st[i] = rsp->n_statuses == n ? (kvd_status_t)rsp->statuses[i]
                                             : KVD_ERR_PROTO;
            }
        }
        kvd_proto_free(rsp ? &rsp->base : NULL);
        free(e);
        free(ep);
        free(sums);
    } else {
        ProtobufCBinaryData *hb = calloc(n, sizeof *hb);
        if (hb == NULL) {
            return KVD_ERR_NOMEM;
        }
        for (size_t i = 0; i < n; i++) {
            hb[i].data = rs[i]->key.hash.bytes;
            hb[i].len = 32;
        }
        kvd_pb_abort_request_t rq = KVDEPOT__V1__ABORT_REQUEST__INIT;
        rq.reservation_id = rs[0]->reservation_id;
        rq.n_block_hashes = n;
        rq.block_hashes = hb;
        ProtobufCMessage *rsp = NULL;
        s = kvd_cl_call(c, CL_ABORT, KVD_PROTO_MSG_ABORT_REQUEST, &rq.base,
                        KVD_PROTO_MSG_ABORT_RESPONSE, &rsp, &used, false);
        for (size_t i = 0; s == KVD_OK && i < n; i++) {
            st[i] = KVD_OK;
        }
        kvd_proto_free(rsp);
        free(hb);
    }
    if (s != KVD_OK) {
        for (size_t i = 0; i < n; i++) {
            st[i] = s;
        }
    }
    return KVD_OK;
}

static kvd_status_t cl_finish(kvd_client_t *c, bool commit,
                              const kvd_store_key_t *keys, size_t n,
                              uint32_t part, kvd_status_t *statuses_out,
                              bool *published_out)
{
    cl_resv_t **rs = calloc(n ? n : 1, sizeof *rs);
    kvd_status_t *st = calloc(n ? n : 1, sizeof *st);
    size_t *idx = calloc(n ? n : 1, sizeof *idx);
    cl_resv_t **batch = calloc(n ? n : 1, sizeof *batch);
    kvd_status_t *bst = calloc(n ? n : 1, sizeof *bst);
    uint32_t *parts = calloc(n ? n : 1, sizeof *parts);
    kvd_status_t first = KVD_OK;
    if (rs == NULL || st == NULL || idx == NULL || batch == NULL ||
        bst == NULL || parts == NULL) {
        first = KVD_ERR_NOMEM;
        goto out;
    }
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        rs[i] = resv_take(c, &keys[i], part);
        st[i] = KVD_ERR_NOT_FOUND;
        parts[i] = rs[i] != NULL ? rs[i]->num_parts : 0;
        if (rs[i] != NULL && rs[i]->instance != c->instance) {
            /* Reserved from a daemon that is gone. */
            kvd_cl_map_held(c, rs[i]->instance, -1);
            free(rs[i]);
            rs[i] = NULL;
        }
    }
    pthread_mutex_unlock(&c->mu);
    /* One call per reservation id, keys in the caller's order. */
    for (size_t i = 0; i < n; i++) {
        if (rs[i] == NULL) {
            continue;
        }
        size_t k = 0;
        uint64_t id = rs[i]->reservation_id;
        for (size_t j = i; j < n; j++) {
            if (rs[j] != NULL && rs[j]->reservation_id == id) {
                idx[k] = j;
                batch[k++] = rs[j];
            }
        }
        /* Past the deadline the slot may have been written after the
         * daemon could end the reservation: never commit it, give it back
         * (which also ends its quarantine on the daemon). */
        bool late = commit && kvd_time_now_ns() >= rs[i]->deadline_ns;
        kvd_status_t s = cl_finish_batch(c, commit && !late, batch, k, bst);
        pthread_mutex_lock(&c->mu);
        for (size_t b = 0; b < k; b++) {
            st[idx[b]] = late ? KVD_ERR_TIMEOUT : s == KVD_OK ? bst[b] : s;
            kvd_cl_map_held(c, rs[idx[b]]->instance, -1);
            free(rs[idx[b]]);
            rs[idx[b]] = NULL;
        }
        pthread_mutex_unlock(&c->mu);
    }
    for (size_t i = 0; i < n; i++) {
        if (statuses_out != NULL) {
            statuses_out[i] = st[i];
        }
        if (published_out != NULL) {
            published_out[i] = commit && st[i] == KVD_OK && parts[i] == 1;
        }
        if (st[i] != KVD_OK && first == KVD_OK) {
            first = st[i];
        }
    }
out:
    free(parts);
    free(bst);
    free(batch);
    free(idx);
    free(st);
    free(rs);
    return first;
}

kvd_status_t kvd_client_commit(kvd_client_t *c, const kvd_store_key_t *keys,
                               size_t n, kvd_status_t *statuses_out)
{
    return cl_finish(c, true, keys, n, 0, statuses_out, NULL);
}

kvd_status_t kvd_client_abort(kvd_client_t *c, const kvd_store_key_t *keys,
                              size_t n, kvd_status_t *statuses_out)
{
    return cl_finish(c, false, keys, n, 0, statuses_out, NULL);
}

kvd_status_t kvd_client_end_part(kvd_client_t *c, const kvd_store_key_t *keys,
                                 size_t n, uint32_t part, bool commit,
                                 kvd_status_t *statuses_out,
                                 bool *published_out)
{
    return cl_finish(c, commit, keys, n, part, statuses_out, published_out);
}

/* ---- delete -------------------------------------------------------------- */

kvd_status_t kvd_client_delete(kvd_client_t *c, const kvd_store_key_t *keys,
                               size_t n, size_t *num_deleted_out)
{
    kvd_cl_flush_releases(c);
    size_t total = 0;
    bool busy = false;
    kvd_status_t s = KVD_OK;
    /* One call per run of keys of one namespace (the request's unit). */
    for (size_t i = 0; i < n && s == KVD_OK;) {
        size_t j = i;
        while (j < n && j - i < KVD_PROTO_MAX_HASHES &&
               memcmp(&keys[j].ns, &keys[i].ns, sizeof keys[i].ns) == 0) {
            j++;
        }
        ProtobufCBinaryData *hb = malloc((j - i) * sizeof *hb);
        if (hb == NULL) {
            return KVD_ERR_NOMEM;
        }
        for (size_t k = i; k < j; k++) {
            hb[k - i].data = (uint8_t *)keys[k].hash.bytes;
            hb[k - i].len = sizeof keys[k].hash.bytes;
        }
        kvd_pb_delete_request_t rq = KVDEPOT__V1__DELETE_REQUEST__INIT;
        rq.namespace_id.data = (uint8_t *)keys[i].ns.bytes;
        rq.namespace_id.len = sizeof keys[i].ns.bytes;
        rq.n_block_hashes = j - i;
        rq.block_hashes = hb;
        kvd_pb_delete_response_t *rsp = NULL;
        uint64_t used;
        s = kvd_cl_call(c, CL_DELETE, KVD_PROTO_MSG_DELETE_REQUEST, &rq.base,
                        KVD_PROTO_MSG_DELETE_RESPONSE,
                        (ProtobufCMessage **)&rsp, &used, true);
        free(hb);
        if (s == KVD_OK) {
            total += rsp->num_deleted;
            busy |= rsp->busy;
            kvd_proto_delete_response_free(rsp);
        }
        i = j;
    }
    if (num_deleted_out != NULL) {
        *num_deleted_out = total;
    }
    if (s != KVD_OK) {
        return s;
    }
    return busy ? KVD_ERR_BUSY : KVD_OK;
}
