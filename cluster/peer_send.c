/*
 * Messages leaving this node (cluster/peer_int.h): the requests callers
 * queued (sent from the progress loop on the endpoint to their node), the
 * replies of the serving side, and the objects sent in parts. Each send
 * owns what UCX reads until UCX is done with it: its header, an owned
 * body, a store lease on the arena bytes it sends, or its share of an
 * object going out in parts. A failed request send fails its operation.
 * Object sends in flight are counted on their endpoint, so that a peer
 * that stops taking them is found (kvd_peer_eps_check_stalled).
 *
 * Threading: the progress thread only (and kvd_peer_stop once it is gone).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/peer_int.h"

/* `done` parts of `x` are over (sent, failed or never started). */
void kvd_peer_xfer_put(kvd_peer_t *p, peer_xfer_t *x, uint32_t done)
{
    x->parts -= done;
    if (x->parts == 0) {
        (void)kvd_store_release(p->cfg.store, &x->lease, 1);
        kvd_peer_ep_served(x->pe);
        p->xfers--;
        free(x);
    }
}

static void send_finish(peer_send_t *s, ucs_status_t st)
{
    kvd_peer_t *p = s->p;
    if (s->pe != NULL && s->xfer != NULL) {
        s->pe->parts--;
    }
    kvd_peer_ep_moved(s->pe); /* an object the peer took (or its end) */
    if (s->has_lease) {
        (void)kvd_store_release(p->cfg.store, &s->lease, 1);
    }
    kvd_peer_ep_served(s->window);
    if (s->xfer != NULL) {
        kvd_peer_xfer_put(p, s->xfer, 1);
    }
    if (s->op != NULL) {
        pthread_mutex_lock(&p->mu);
        if (st != UCS_OK) {
            kvd_peer_op_fail(p, s->op, KVD_ERR_PEER);
        } else if (s->op->kind == KVD_PEER_OP_OFFER) {
            kvd_peer_op_finish(p, s->op);
        }
        kvd_peer_op_unref(s->op);
        pthread_mutex_unlock(&p->mu);
    }
    free(s->owned);
    free(s);
}

static void send_cb(void *request, ucs_status_t st, void *user_data)
{
    peer_send_t *s = user_data;
    __atomic_fetch_sub(&s->p->active, 1, __ATOMIC_RELAXED);
    ucp_request_free(request);
    send_finish(s, st);
}

/* Sends header + body; `s` is consumed (finished now or at completion). */
void kvd_peer_send_msg(kvd_peer_t *p, ucp_ep_h ep, peer_send_t *s,
                       const void *body, size_t len, uint32_t flags)
{
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                       UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    prm.cb.send = send_cb;
    prm.user_data = s;
    prm.flags = flags;
    ucs_status_ptr_t r =
        ucp_am_send_nbx(ep, PEER_AM_ID, s->hdr, s->hdr_len, body, len, &prm);
    if (r == NULL) {
        send_finish(s, UCS_OK);
    } else if (UCS_PTR_IS_ERR(r)) {
        send_finish(s, UCS_PTR_STATUS(r));
    } else {
        __atomic_fetch_add(&p->active, 1, __ATOMIC_RELAXED);
        if (s->has_lease || s->xfer != NULL) {
            /* An object (or a part) waits for the peer to take it. */
            s->pe = kvd_peer_ep_moving(p, ep);
            if (s->pe != NULL && s->xfer != NULL) {
                s->pe->parts++;
            }
        }
    }
}

void kvd_peer_hdr_init(const kvd_peer_t *p, kvd_peer_hdr_t *h, uint16_t op,
                       uint64_t req_id, const kvd_namespace_t *ns)
{
    memset(h, 0, sizeof *h);
    h->op = op;
    h->req_id = req_id;
    if (ns != NULL) {
        h->ns = *ns;
    }
    memcpy(h->auth, p->auth, KVD_PEER_AUTH_BYTES);
}

void kvd_peer_reply(kvd_peer_t *p, ucp_ep_h ep, const kvd_peer_hdr_t *h,
                    void *owned, const void *body, size_t len,
                    const kvd_store_lease_t *lease, uint32_t flags)
{
    peer_send_t *s = calloc(1, sizeof *s);
    if (s != NULL && lease != NULL) { /* a whole object: its window */
        s->window = kvd_peer_ep_serving(p, ep);
    }
    if (s == NULL) {
        if (lease != NULL) {
            (void)kvd_store_release(p->cfg.store, lease, 1);
        }
        free(owned);
        return;
    }
    s->p = p;
    s->owned = owned;
    if (lease != NULL) {
        s->lease = *lease;
        s->has_lease = true;
    }
    s->hdr_len = kvd_peer_hdr_encode(h, s->hdr);
    kvd_peer_send_msg(p, ep, s, body, len, flags);
}

/* Takes queued requests and sends them. */
void kvd_peer_queue_drain(kvd_peer_t *p)
{
    pthread_mutex_lock(&p->mu);
    peer_op_t *list = p->queue;
    p->queue = p->queue_tail = NULL;
    p->queued = 0;
    pthread_mutex_unlock(&p->mu);
    while (list != NULL) {
        peer_op_t *op = list;
        list = op->qnext;
        pthread_mutex_lock(&p->mu);
        bool skip = op->finished; /* its caller gave up already */
        pthread_mutex_unlock(&p->mu);
        ucp_ep_h ep = skip ? NULL : kvd_peer_ep_get(p, op->addr, op->addr_len);
        pthread_mutex_lock(&p->mu);
        if (skip || ep == NULL) {
            if (!skip) {
                kvd_peer_op_fail(p, op, KVD_ERR_UNREACHABLE);
            }
            kvd_peer_op_unref(op); /* the queue's reference */
            pthread_mutex_unlock(&p->mu);
            continue;
        }
        op->ep = ep;
        pthread_mutex_unlock(&p->mu);
        peer_send_t *s = calloc(1, sizeof *s);
        if (s == NULL) {
            pthread_mutex_lock(&p->mu);
            kvd_peer_op_fail(p, op, KVD_ERR_NOMEM);
            kvd_peer_op_unref(op);
            pthread_mutex_unlock(&p->mu);
            continue;
        }
        s->p = p;
        s->op = op; /* takes over the queue's reference */
        memcpy(s->hdr, op->hdr, KVD_PEER_HDR_BYTES);
        s->hdr_len = KVD_PEER_HDR_BYTES;
        kvd_peer_stat_add(p, &p->stats.requests_sent, 1);
        kvd_peer_send_msg(p, ep, s, op->body, op->body_len,
                          UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER);
    }
}
