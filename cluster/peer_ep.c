/*
 * The data plane's endpoint cache (cluster/peer_int.h): one UCX endpoint
 * per peer worker address, created on first use with UCX's PEER error
 * handling. When UCX fails an endpoint, every operation that went out on
 * it fails with KVD_ERR_PEER and the FETCHes queued for its address are
 * dropped; the progress loop closes the dead endpoint after its turn, and
 * the next call to that address opens a new one.
 *
 * Threading: the progress thread only (and kvd_peer_stop once it is gone).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/peer_int.h"
#include "common/log_int.h"
#include "common/time_int.h"

#define PEER_STALL_CHECK_NS (50 * KVD_NSEC_PER_MSEC)

/* `e` failed: its operations fail, its queued FETCHes are dropped; the
 * progress loop closes it after its turn. */
static void ep_fail(kvd_peer_t *p, peer_ep_t *e)
{
    ucp_ep_h ep = e->ep;
    e->dead = true;
    kvd_peer_serve_drop_addr(p, e->addr, e->addr_len);
    pthread_mutex_lock(&p->mu);
    for (size_t b = 0; b < PEER_BUCKETS; b++) {
        peer_op_t *op = p->table[b];
        while (op != NULL) {
            peer_op_t *next = op->next;
            if (op->ep == ep) {
                kvd_peer_op_fail(p, op, KVD_ERR_PEER);
            }
            op = next;
        }
    }
    pthread_mutex_unlock(&p->mu);
}

static void ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    peer_ep_t *e = arg;
    kvd_peer_t *p = e->p;
    KVD_LOG_WARN("cluster: peer endpoint failed: %s",
                 ucs_status_string(status));
    kvd_peer_stat_add(p, &p->stats.peer_errors, 1);
    if (!e->dead) {
        ep_fail(p, e);
    }
}

void kvd_peer_eps_check_stalled(kvd_peer_t *p)
{
    uint64_t now = kvd_time_now_ns();
    if (now < p->stall_check_ns) {
        return;
    }
    p->stall_check_ns = now + PEER_STALL_CHECK_NS;
    for (peer_ep_t *e = p->eps; e != NULL; e = e->next) {
        if (!e->dead && e->objects > 0 && now - e->last_ns > p->stall_ns) {
            KVD_LOG_RATELIMITED(
                KVD_LOG_LEVEL_WARN, 1000,
                "cluster: a peer moved none of the %u objects on their way "
                "to or from it for %llu ms; its endpoint fails",
                e->objects,
                (unsigned long long)(p->stall_ns / KVD_NSEC_PER_MSEC));
            kvd_peer_stat_add(p, &p->stats.stalled, 1);
            ep_fail(p, e);
        }
    }
}

bool kvd_peer_ep_known(const kvd_peer_t *p, const uint8_t *addr, size_t len)
{
    for (const peer_ep_t *e = p->eps; e != NULL; e = e->next) {
        if (!e->dead && e->addr_len == len && memcmp(e->addr, addr, len) == 0) {
            return true;
        }
    }
    return false;
}

bool kvd_peer_ep_wedged(const kvd_peer_t *p, const uint8_t *addr, size_t len)
{
    for (const peer_ep_t *e = p->eps; e != NULL; e = e->next) {
        if (e->dead && e->parts > 0 && e->addr_len == len &&
            memcmp(e->addr, addr, len) == 0) {
            return true;
        }
    }
    return false;
}

peer_ep_t *kvd_peer_ep_find(kvd_peer_t *p, ucp_ep_h ep)
{
    if (ep == NULL) {
        return NULL;
    }
    for (peer_ep_t *e = p->eps; e != NULL; e = e->next) {
        if (e->ep == ep) {
            return e;
        }
    }
    return NULL;
}

peer_ep_t *kvd_peer_ep_moving(kvd_peer_t *p, ucp_ep_h ep)
{
    peer_ep_t *e = kvd_peer_ep_find(p, ep);
    if (e != NULL) {
        if (e->objects++ == 0) {
            e->last_ns = kvd_time_now_ns();
        }
        e->refs++;
    }
    return e;
}

void kvd_peer_ep_moved(peer_ep_t *e)
{
    if (e != NULL) {
        e->objects--;
        e->last_ns = kvd_time_now_ns();
        kvd_peer_ep_unref(e);
    }
}

peer_ep_t *kvd_peer_ep_serving(kvd_peer_t *p, ucp_ep_h ep)
{
    peer_ep_t *e = kvd_peer_ep_find(p, ep);
    if (e != NULL) {
        e->serving++;
        e->refs++;
    }
    return e;
}

void kvd_peer_ep_served(peer_ep_t *e)
{
    if (e != NULL) {
        e->serving--;
        kvd_peer_ep_unref(e);
    }
}

void kvd_peer_ep_unref(peer_ep_t *e)
{
    if (--e->refs == 0) {
        free(e->addr);
        free(e);
    }
}

static void ep_close(kvd_peer_t *p, peer_ep_t *e)
{
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(e->ep, &prm);
    if (UCS_PTR_IS_PTR(r)) {
        uint64_t until = kvd_time_now_ns() + KVD_NSEC_PER_SEC;
        while (ucp_request_check_status(r) == UCS_INPROGRESS &&
               kvd_time_now_ns() < until) {
            ucp_worker_progress(p->worker);
        }
        ucp_request_free(r);
    }
    e->ep = NULL; /* its objects still in flight (if any) hold `e` */
    kvd_peer_ep_unref(e);
}

void kvd_peer_eps_close_dead(kvd_peer_t *p, bool all)
{
    peer_ep_t **pp = &p->eps;
    while (*pp != NULL) {
        peer_ep_t *e = *pp;
        if ((e->dead && e->parts == 0) || all) {
            *pp = e->next;
            ep_close(p, e);
        } else {
            pp = &e->next;
        }
    }
}

ucp_ep_h kvd_peer_ep_get(kvd_peer_t *p, const uint8_t *addr, size_t len)
{
    for (peer_ep_t *e = p->eps; e != NULL; e = e->next) {
        if (!e->dead && e->addr_len == len && memcmp(e->addr, addr, len) == 0) {
            return e->ep;
        }
    }
    peer_ep_t *e = calloc(1, sizeof *e);
    if (e == NULL || (e->addr = malloc(len)) == NULL) {
        free(e);
        return NULL;
    }
    memcpy(e->addr, addr, len);
    e->addr_len = len;
    e->p = p;
    e->refs = 1;
    ucp_ep_params_t ep_params;
    memset(&ep_params, 0, sizeof ep_params);
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                           UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                           UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep_params.address = (const ucp_address_t *)e->addr;
    ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep_params.err_handler.cb = ep_error;
    ep_params.err_handler.arg = e;
    ucs_status_t st = ucp_ep_create(p->worker, &ep_params, &e->ep);
    if (st != UCS_OK) {
        KVD_LOG_WARN("cluster: cannot reach a peer: %s", ucs_status_string(st));
        free(e->addr);
        free(e);
        return NULL;
    }
    e->next = p->eps;
    p->eps = e;
    return e->ep;
}
