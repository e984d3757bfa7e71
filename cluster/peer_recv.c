/*
 * Messages arriving at this node (cluster/peer_int.h). The active-message
 * handler checks each message (its header and body length, then the
 * cluster token's digest), hands requests to the serving side and applies
 * answers to the operation waiting for them: a LOOKUP_REPLY's sizes, a
 * DATA object received into its reserved slot (copied when it came eagerly,
 * else by a UCX rendezvous receive straight into the slot), DATA_PART
 * parts copied in and hashed as they come. An object is committed when its
 * bytes hash to the checksum its server sent, aborted otherwise.
 *
 * Threading: the progress thread (UCX calls the handler and the receive
 * callbacks from ucp_worker_progress).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "cluster/peer_int.h"
#include "common/copy_int.h"
#include "common/endian_int.h"
#include "common/hash_int.h"
#include "common/log_int.h"

/* Bytes of a part hashed, then copied into its slot, per step (L1/L2). */
#define PEER_HASH_STEP (16u << 10)

typedef struct peer_recv {
    kvd_peer_t *p;
    peer_op_t *op;
    size_t idx;
    peer_ep_t *pe; /* counted on the endpoint the FETCH went out on */
} peer_recv_t;

static bool auth_ok(const kvd_peer_t *p, const kvd_peer_hdr_t *h)
{
    return CRYPTO_memcmp(p->auth, h->auth, KVD_PEER_AUTH_BYTES) == 0;
}

static void got_lookup_reply(kvd_peer_t *p, const kvd_peer_hdr_t *h,
                             const uint8_t *body)
{
    pthread_mutex_lock(&p->mu);
    peer_op_t *op = kvd_peer_table_find(p, h->req_id);
    if (op != NULL && op->kind == KVD_PEER_OP_LOOKUP && !op->finished) {
        if (h->status != KVD_OK) {
            op->result = KVD_ERR_PEER;
        } else if (h->count != op->n) {
            kvd_peer_stat_add(p, &p->stats.malformed, 1);
            op->result = KVD_ERR_PEER;
        } else {
            for (size_t i = 0; i < op->n; i++) {
                op->sizes[i] = kvd_get_le64(body + i * 8);
            }
        }
        kvd_peer_op_finish(p, op);
    }
    pthread_mutex_unlock(&p->mu);
}

/* Every byte of entry `idx` is in its slot; `ok`: they hash to the
 * checksum its server sent (under mu). Committed or aborted. */
static void entry_verified(kvd_peer_t *p, peer_op_t *op, size_t idx, bool ok)
{
    kvd_status_t s = KVD_OK;
    if (!ok) {
        kvd_peer_stat_add(p, &p->stats.checksum_errors, 1);
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                            "cluster: an object arrived with a bad checksum; "
                            "not cached");
        s = KVD_ERR_CHECKSUM;
    }
    kvd_peer_entry_done(p, op, idx, s);
}

/* Bytes of entry `idx` are in its slot (under mu). */
static void data_arrived(kvd_peer_t *p, peer_op_t *op, size_t idx)
{
    void *dst =
        kvd_store_arena_ptr(p->cfg.store, op->offsets[idx], op->sizes[idx]);
    entry_verified(p, op, idx,
                   dst != NULL &&
                       kvd_xxh3_64(dst, op->sizes[idx]) == op->checksums[idx]);
}

static void recv_cb(void *request, ucs_status_t st, size_t length,
                    void *user_data)
{
    peer_recv_t *r = user_data;
    kvd_peer_t *p = r->p;
    __atomic_fetch_sub(&p->active, 1, __ATOMIC_RELAXED);
    ucp_request_free(request);
    kvd_peer_ep_moved(r->pe);
    pthread_mutex_lock(&p->mu);
    if (st == UCS_OK && length == r->op->sizes[r->idx]) {
        data_arrived(p, r->op, r->idx);
    } else {
        kvd_peer_entry_done(p, r->op, r->idx, KVD_ERR_PEER);
    }
    kvd_peer_op_unref(r->op);
    pthread_mutex_unlock(&p->mu);
    free(r);
}

static kvd_status_t data_status(int32_t s)
{
    switch (s) {
    case KVD_ERR_NOT_FOUND:
    case KVD_ERR_STATE: return KVD_ERR_NOT_FOUND;
    default: return KVD_ERR_PEER;
    }
}

static ucs_status_t got_data(kvd_peer_t *p, const kvd_peer_hdr_t *h, void *data,
                             size_t length, const ucp_am_recv_param_t *param)
{
    ucs_status_t ret = UCS_OK;
    pthread_mutex_lock(&p->mu);
    peer_op_t *op = kvd_peer_table_find(p, h->req_id);
    size_t i = h->count;
    if (op == NULL || op->kind != KVD_PEER_OP_FETCH || i >= op->n ||
        op->state[i] != ENTRY_WAIT) {
        goto out; /* late (given up) or not ours: dropped */
    }
    if (h->status != KVD_OK) {
        kvd_peer_entry_done(p, op, i, data_status(h->status));
        goto out;
    }
    if (h->size != op->sizes[i]) {
        kvd_peer_stat_add(p, &p->stats.malformed, 1);
        kvd_peer_entry_done(p, op, i, KVD_ERR_PEER);
        goto out;
    }
    op->checksums[i] = h->checksum;
    void *dst = kvd_store_arena_ptr(p->cfg.store, op->offsets[i], length);
    if (dst == NULL) {
        kvd_peer_entry_done(p, op, i, KVD_ERR_INTERNAL);
        goto out;
    }
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        memcpy(dst, data, length);
        data_arrived(p, op, i);
        goto out;
    }
    peer_recv_t *r = malloc(sizeof *r);
    if (r == NULL) {
        kvd_peer_entry_done(p, op, i, KVD_ERR_NOMEM);
        goto out;
    }
    r->p = p;
    r->op = op;
    r->idx = i;
    /* A server that announces an object and never sends its bytes is
     * found by the endpoint's stall check. */
    r->pe = kvd_peer_ep_moving(p, op->ep);
    op->state[i] = ENTRY_RECV;
    op->receiving++;
    op->refs++;
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.recv_am = recv_cb;
    prm.user_data = r;
    /* The receive may complete (and call back) inside this call on some
     * transports: recv_cb takes mu, so let it go first. */
    pthread_mutex_unlock(&p->mu);
    ucs_status_ptr_t rq =
        ucp_am_recv_data_nbx(p->worker, data, dst, length, &prm);
    pthread_mutex_lock(&p->mu);
    if (rq == NULL) {
        data_arrived(p, op, i);
        kvd_peer_op_unref(op);
        kvd_peer_ep_moved(r->pe);
        free(r);
    } else if (UCS_PTR_IS_ERR(rq)) {
        kvd_peer_entry_done(p, op, i, KVD_ERR_PEER);
        kvd_peer_op_unref(op);
        kvd_peer_ep_moved(r->pe);
        free(r);
    } else {
        __atomic_fetch_add(&p->active, 1, __ATOMIC_RELAXED);
    }
    /* UCX owns the descriptor now (the receive was started). */
    ret = UCS_OK;
out:
    pthread_mutex_unlock(&p->mu);
    return ret;
}

/* Copies a part into the slot with non-temporal stores (the slot is cold
 * and stays unread until an engine loads it; common/copy_int.h). A part
 * at the end of what came in order is hashed step by step just before
 * each step's copy, while UCX's receive buffer holds it in the cache. */
static void rx_copy(peer_rx_t *rx, uint8_t *slot, uint64_t off,
                    const uint8_t *src, size_t len)
{
    if (rx->ordered && off == rx->next) {
        for (size_t done = 0; done < len;) {
            size_t step =
                len - done < PEER_HASH_STEP ? len - done : PEER_HASH_STEP;
            kvd_xxh3_stream_update(rx->hash, src + done, step);
            kvd_copy_nt(slot + off + done, src + done, step);
            done += step;
        }
        rx->next += len;
    } else {
        rx->ordered = false; /* hashed whole at the end */
        kvd_copy_nt(slot + off, src, len);
    }
    rx->received += len;
}

/* A DATA_PART: copied into entry `count`'s slot under mu (so nothing is
 * written once the entry is done); the entry is verified and committed
 * when its bytes are all in. */
static ucs_status_t got_part(kvd_peer_t *p, const kvd_peer_hdr_t *h,
                             const void *data, size_t length)
{
    pthread_mutex_lock(&p->mu);
    peer_op_t *op = kvd_peer_table_find(p, h->req_id);
    size_t i = h->count;
    if (op == NULL || op->kind != KVD_PEER_OP_FETCH || i >= op->n ||
        (op->state[i] != ENTRY_WAIT && op->state[i] != ENTRY_PARTS)) {
        goto out; /* late (given up) or not ours: dropped */
    }
    uint64_t size = op->sizes[i];
    if (h->size != size ||
        (op->state[i] == ENTRY_PARTS && h->checksum != op->checksums[i])) {
        kvd_peer_stat_add(p, &p->stats.malformed, 1);
        kvd_peer_entry_done(p, op, i, KVD_ERR_PEER);
        goto out;
    }
    uint8_t *slot = kvd_store_arena_ptr(p->cfg.store, op->offsets[i], size);
    if (slot == NULL) {
        kvd_peer_entry_done(p, op, i, KVD_ERR_INTERNAL);
        goto out;
    }
    if (op->state[i] == ENTRY_WAIT) {
        peer_rx_t *rx = calloc(1, sizeof *rx);
        if (rx == NULL || (rx->hash = kvd_xxh3_stream_new()) == NULL) {
            free(rx);
            kvd_peer_entry_done(p, op, i, KVD_ERR_NOMEM);
            goto out;
        }
        rx->ordered = true;
        op->rx[i] = rx;
        op->state[i] = ENTRY_PARTS;
        op->checksums[i] = h->checksum;
    }
    peer_rx_t *rx = op->rx[i];
    rx_copy(rx, slot, h->offset, data, length);
    if (rx->received < size) {
        goto out;
    }
    /* Every byte came (more than once if parts overlapped: then the whole
     * slot is hashed and a gap shows as a mismatch). */
    uint64_t sum = rx->ordered && rx->next == size
                       ? kvd_xxh3_stream_digest(rx->hash)
                       : kvd_xxh3_64(slot, size);
    entry_verified(p, op, i, sum == op->checksums[i]);
out:
    pthread_mutex_unlock(&p->mu);
    return UCS_OK;
}

ucs_status_t kvd_peer_am_recv(void *arg, const void *header,
                              size_t header_length, void *data, size_t length,
                              const ucp_am_recv_param_t *param)
{
    kvd_peer_t *p = arg;
    kvd_peer_hdr_t h;
    if (kvd_peer_hdr_decode(header, header_length, length, &h) != KVD_OK) {
        kvd_peer_stat_add(p, &p->stats.malformed, 1);
        return UCS_OK;
    }
    if (!auth_ok(p, &h)) {
        kvd_peer_stat_add(p, &p->stats.auth_rejected, 1);
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                            "cluster: a peer message with the wrong cluster "
                            "token was dropped");
        return UCS_OK;
    }
    bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if (h.op == KVD_PEER_OP_DATA) {
        return got_data(p, &h, data, length, param);
    }
    if (rndv) { /* everything but DATA is sent eagerly */
        kvd_peer_stat_add(p, &p->stats.malformed, 1);
        return UCS_OK;
    }
    switch (h.op) {
    case KVD_PEER_OP_DATA_PART: return got_part(p, &h, data, length);
    case KVD_PEER_OP_LOOKUP_REPLY: got_lookup_reply(p, &h, data); return UCS_OK;
    case KVD_PEER_OP_OFFER:
        kvd_peer_serve_offer(p, &h, data, length);
        return UCS_OK;
    default: break;
    }
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
        kvd_peer_stat_add(p, &p->stats.malformed, 1);
        return UCS_OK;
    }
    if (p->closing) { /* stopping: new requests are not served */
        return UCS_OK;
    }
    kvd_peer_stat_add(p, &p->stats.requests_served, 1);
    if (h.op == KVD_PEER_OP_LOOKUP) {
        kvd_peer_serve_lookup(p, param->reply_ep, &h, data);
    } else {
        kvd_peer_serve_fetch(p, param->reply_ep, &h, data, length);
    }
    return UCS_OK;
}
