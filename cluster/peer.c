/*
 * The UCX data plane between nodes (cluster/peer_int.h).
 *
 * Ownership: the progress thread alone touches the UCX worker and the
 * endpoint cache. Callers hand it operations through `queue` and wake it
 * with ucp_worker_signal(); they wait on their call's condition variable
 * with the deadline. `mu` guards the queue, the table of operations
 * waiting for answers and every operation's state.
 *
 * An operation (one request to one node) holds a reference for its
 * caller, one while it is in the table (answers find it there) and one per
 * UCX request in flight (the send of the request, each rendezvous receive).
 * It is freed when the last goes. A caller that reaches its deadline gives
 * its keys that have not started arriving back to the store at once; keys
 * whose bytes are arriving are finished by the progress thread.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <ucp/api/ucp.h>

#include <openssl/crypto.h>

#include "cluster/peer_int.h"
#include "common/copy_int.h"
#include "common/endian_int.h"
#include "common/failpoint_int.h"
#include "common/hash_int.h"
#include "common/log_int.h"
#include "common/time_int.h"
#include "proto/kvd_proto.h"
#include "store/engine.h"

#define PEER_AM_ID 17u
#define PEER_BUCKETS 256u
#define PEER_QUEUE_MAX 4096u
#define PEER_SPIN_NS (200 * KVD_NSEC_PER_USEC)
#define PEER_DRAIN_QUIET_NS (50 * KVD_NSEC_PER_MSEC)
#define PEER_SERVE_MAX 1024u
#define PEER_DISK_MAX 256u
/* Objects a server sends in parts at once: the next one's parts queue
 * behind the current one's, so the socket never waits for a turn of the
 * progress loop, and no more. */
#define PEER_XFER_WINDOW 2u
/* Bytes of a part hashed, then copied into its slot, per step (L1/L2). */
#define PEER_HASH_STEP (16u << 10)

/* A FETCH entry: waiting, a rendezvous receive in flight (UCX writes the
 * slot), parts arriving (written under mu by the progress thread), done. */
enum { ENTRY_WAIT = 0, ENTRY_RECV = 1, ENTRY_DONE = 2, ENTRY_PARTS = 3 };

/* An object arriving in parts: the hash of the bytes in order so far. */
typedef struct peer_rx {
    kvd_xxh3_stream_t *hash;
    uint64_t next;     /* the hash covers [0, next) */
    uint64_t received; /* bytes of parts copied in */
    bool ordered;      /* every part came at `next` (else hash it at the end) */
} peer_rx_t;

typedef struct peer_call {
    pthread_cond_t cv;
    size_t pending; /* operations not finished */
} peer_call_t;

typedef struct peer_op {
    struct peer_op *next;  /* table chain */
    struct peer_op *qnext; /* queue */
    peer_call_t *call;     /* NULL: an offer, nobody waits */
    uint64_t id;
    uint16_t kind;
    int refs;
    bool in_table, finished, abandoned;
    kvd_status_t result;
    uint8_t *addr;
    size_t addr_len;
    ucp_ep_h ep; /* the endpoint the request went out on */
    uint8_t hdr[KVD_PEER_HDR_MAX_BYTES]; /* KVD_PEER_HDR_BYTES used */
    uint8_t *body;
    size_t body_len;
    kvd_namespace_t ns;
    size_t n, remaining, receiving;
    kvd_block_hash_t *hashes;
    uint64_t *sizes;      /* LOOKUP: answers; FETCH: expected sizes */
    uint64_t *offsets;    /* FETCH: reserved arena slots */
    uint64_t *checksums;  /* FETCH: from each DATA */
    kvd_status_t *status; /* FETCH */
    size_t *batch_index;  /* FETCH: entry -> key of the caller's batch */
    uint32_t tenant;      /* OFFER: the keys' store tenant */
    uint8_t *state;       /* FETCH */
    peer_rx_t **rx;       /* FETCH: entries in ENTRY_PARTS */
} peer_op_t;

typedef struct peer_ep {
    uint8_t *addr;
    size_t addr_len;
    ucp_ep_h ep;
    bool dead;
    struct peer_ep *next;
    kvd_peer_t *p;
} peer_ep_t;

/* An object going out in parts: its lease goes back when UCX is done with
 * the last part. Progress thread only. */
typedef struct peer_xfer {
    kvd_store_lease_t lease;
    uint32_t parts; /* not completed yet */
} peer_xfer_t;

/* One reply or request on its way out, alive until UCX is done with it. */
typedef struct peer_send {
    kvd_peer_t *p;
    peer_op_t *op; /* a request's operation, or NULL for replies */
    uint8_t hdr[KVD_PEER_HDR_MAX_BYTES];
    size_t hdr_len;
    void *owned; /* freed with it */
    kvd_store_lease_t lease;
    bool has_lease;
    peer_xfer_t *xfer; /* a part of this object */
} peer_send_t;

/* A FETCH being served, one object per progress-loop turn. */
typedef struct peer_serve {
    struct peer_serve *next;
    uint8_t *addr; /* the requester's worker address */
    size_t addr_len;
    uint64_t req_id;
    kvd_namespace_t ns;
    uint8_t *entries; /* n (hash, size) */
    uint32_t n, next_entry;
    uint32_t part; /* bytes per DATA_PART (0: whole objects) */
    bool dead;     /* its endpoint failed: drop */
} peer_serve_t;

/* An object of a FETCH being read from NVMe into the arena (a store get),
 * sent when its completion comes back; one allocation, address inline. */
typedef struct peer_diskget {
    struct peer_diskget *next; /* the done list */
    uint64_t req_id;
    kvd_namespace_t ns;
    uint32_t idx;
    uint64_t want;
    uint32_t part;
    kvd_store_completion_t c;
    size_t addr_len;
    uint8_t addr[]; /* the requester's worker address */
} peer_diskget_t;

typedef struct peer_recv {
    kvd_peer_t *p;
    peer_op_t *op;
    size_t idx;
} peer_recv_t;

struct kvd_peer {
    kvd_peer_config_t cfg;
    char node_id[KVD_PEER_MAX_NODE_ID + 1];
    uint8_t auth[KVD_PEER_AUTH_BYTES];
    ucp_context_h ctx;
    ucp_worker_h worker;
    int efd;
    uint8_t *address;
    size_t address_len;
    pthread_t thread;
    bool started;
    bool stop; /* atomic */

    pthread_mutex_t mu;
    peer_op_t *queue, *queue_tail;
    size_t queued;
    peer_op_t *table[PEER_BUCKETS];
    uint64_t next_id;
    peer_ep_t *eps;                        /* progress thread only */
    peer_serve_t *serve_head, *serve_tail; /* progress thread only */
    size_t serve_count;
    size_t disk_inflight;      /* progress thread only */
    size_t xfers;              /* objects going out in parts (ditto) */
    bool closing;              /* kvd_peer_stop is draining (on its thread) */
    peer_diskget_t *disk_done; /* under mu */
    uint32_t active;           /* UCX requests in flight (atomic) */
    kvd_peer_stats_t stats;
};

static void stat_add(kvd_peer_t *p, uint64_t *field, uint64_t v)
{
    (void)p;
    __atomic_fetch_add(field, v, __ATOMIC_RELAXED);
}

static bool auth_ok(const kvd_peer_t *p, const kvd_peer_hdr_t *h)
{
    return CRYPTO_memcmp(p->auth, h->auth, KVD_PEER_AUTH_BYTES) == 0;
}

/* ---- operations ---------------------------------------------------------- */

static void rx_free(peer_rx_t *rx)
{
    if (rx != NULL) {
        kvd_xxh3_stream_free(rx->hash);
        free(rx);
    }
}

static void op_free(peer_op_t *op)
{
    if (op->rx != NULL) {
        for (size_t i = 0; i < op->n; i++) {
            rx_free(op->rx[i]);
        }
    }
    free(op->rx);
    free(op->addr);
    free(op->body);
    free(op->hashes);
    free(op->sizes);
    free(op->offsets);
    free(op->checksums);
    free(op->status);
    free(op->batch_index);
    free(op->state);
    free(op);
}

/* Under mu. */
static void op_unref(peer_op_t *op)
{
    if (--op->refs == 0) {
        op_free(op);
    }
}

/* Under mu. */
static void table_remove(kvd_peer_t *p, peer_op_t *op)
{
    if (!op->in_table) {
        return;
    }
    peer_op_t **pp = &p->table[op->id % PEER_BUCKETS];
    while (*pp != NULL && *pp != op) {
        pp = &(*pp)->next;
    }
    if (*pp == op) {
        *pp = op->next;
    }
    op->in_table = false;
    op_unref(op);
}

/* Under mu. */
static peer_op_t *table_find(kvd_peer_t *p, uint64_t id)
{
    for (peer_op_t *op = p->table[id % PEER_BUCKETS]; op != NULL;
         op = op->next) {
        if (op->id == id) {
            return op;
        }
    }
    return NULL;
}

/* The operation is over for its caller (under mu). It stays in the table
 * while bytes are still arriving into its slots. */
static void op_finish(kvd_peer_t *p, peer_op_t *op)
{
    if (!op->finished) {
        op->finished = true;
        if (op->call != NULL && op->call->pending > 0) {
            op->call->pending--;
            pthread_cond_broadcast(&op->call->cv);
        }
    }
    if (op->receiving == 0) {
        table_remove(p, op);
    }
}

static kvd_store_key_t op_key(const peer_op_t *op, size_t i)
{
    kvd_store_key_t k;
    k.ns = op->ns;
    k.hash = op->hashes[i];
    return k;
}

/* A fetched key reached its end (under mu): committed when `s` is KVD_OK,
 * else its slot goes back. */
static void entry_done(kvd_peer_t *p, peer_op_t *op, size_t i, kvd_status_t s)
{
    if (op->state[i] == ENTRY_DONE) {
        return;
    }
    if (op->state[i] == ENTRY_RECV) {
        op->receiving--;
    }
    if (op->state[i] == ENTRY_PARTS) {
        rx_free(op->rx[i]);
        op->rx[i] = NULL;
    }
    op->state[i] = ENTRY_DONE;
    kvd_store_key_t k = op_key(op, i);
    if (s == KVD_OK) { /* verified: the store keeps the checksum */
        s = kvd_store_commit_checksum(p->cfg.store, &k, op->checksums[i]);
        if (s == KVD_OK) {
            stat_add(p, &p->stats.objects_fetched, 1);
            stat_add(p, &p->stats.bytes_fetched, op->sizes[i]);
        }
    } else {
        (void)kvd_store_abort(p->cfg.store, &k, 1, NULL);
    }
    op->status[i] = s;
    if (op->remaining > 0) {
        op->remaining--;
    }
    if (op->remaining == 0 || (op->finished && op->receiving == 0)) {
        op_finish(p, op);
    }
}

/* The whole operation failed with `s` (under mu): keys not yet arriving
 * and keys arriving in parts fail now (no part is written after this);
 * keys arriving by rendezvous finish when UCX says so. */
static void op_fail(kvd_peer_t *p, peer_op_t *op, kvd_status_t s)
{
    if (op->finished && op->receiving == 0) {
        return;
    }
    if (op->result == KVD_OK) {
        op->result = s;
    }
    if (op->kind == KVD_PEER_OP_FETCH) {
        for (size_t i = 0; i < op->n; i++) {
            if (op->state[i] == ENTRY_WAIT || op->state[i] == ENTRY_PARTS) {
                entry_done(p, op, i, s);
            }
        }
    }
    op_finish(p, op);
}

/* ---- endpoints (progress thread) ---------------------------------------- */

static void serve_drop_addr(kvd_peer_t *p, const uint8_t *addr, size_t len);

static void ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    peer_ep_t *e = arg;
    kvd_peer_t *p = e->p;
    KVD_LOG_WARN("cluster: peer endpoint failed: %s",
                 ucs_status_string(status));
    e->dead = true;
    stat_add(p, &p->stats.peer_errors, 1);
    serve_drop_addr(p, e->addr, e->addr_len);
    pthread_mutex_lock(&p->mu);
    for (size_t b = 0; b < PEER_BUCKETS; b++) {
        peer_op_t *op = p->table[b];
        while (op != NULL) {
            peer_op_t *next = op->next;
            if (op->ep == ep) {
                op_fail(p, op, KVD_ERR_PEER);
            }
            op = next;
        }
    }
    pthread_mutex_unlock(&p->mu);
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
    free(e->addr);
    free(e);
}

static void eps_close_dead(kvd_peer_t *p, bool all)
{
    peer_ep_t **pp = &p->eps;
    while (*pp != NULL) {
        peer_ep_t *e = *pp;
        if (e->dead || all) {
            *pp = e->next;
            ep_close(p, e);
        } else {
            pp = &e->next;
        }
    }
}

static ucp_ep_h ep_get(kvd_peer_t *p, const uint8_t *addr, size_t len)
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

/* ---- sending (progress thread) ------------------------------------------ */

/* `done` parts of `x` are over (sent, failed or never started). */
static void xfer_put(kvd_peer_t *p, peer_xfer_t *x, uint32_t done)
{
    x->parts -= done;
    if (x->parts == 0) {
        (void)kvd_store_release(p->cfg.store, &x->lease, 1);
        p->xfers--;
        free(x);
    }
}

static void send_finish(peer_send_t *s, ucs_status_t st)
{
    kvd_peer_t *p = s->p;
    if (s->has_lease) {
        (void)kvd_store_release(p->cfg.store, &s->lease, 1);
    }
    if (s->xfer != NULL) {
        xfer_put(p, s->xfer, 1);
    }
    if (s->op != NULL) {
        pthread_mutex_lock(&p->mu);
        if (st != UCS_OK) {
            op_fail(p, s->op, KVD_ERR_PEER);
        } else if (s->op->kind == KVD_PEER_OP_OFFER) {
            op_finish(p, s->op);
        }
        op_unref(s->op);
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
static void send_msg(kvd_peer_t *p, ucp_ep_h ep, peer_send_t *s,
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
    }
}

static void hdr_init(const kvd_peer_t *p, kvd_peer_hdr_t *h, uint16_t op,
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

/* Takes queued requests and sends them. */
static void queue_drain(kvd_peer_t *p)
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
        ucp_ep_h ep = skip ? NULL : ep_get(p, op->addr, op->addr_len);
        pthread_mutex_lock(&p->mu);
        if (skip || ep == NULL) {
            if (!skip) {
                op_fail(p, op, KVD_ERR_UNREACHABLE);
            }
            op_unref(op); /* the queue's reference */
            pthread_mutex_unlock(&p->mu);
            continue;
        }
        op->ep = ep;
        pthread_mutex_unlock(&p->mu);
        peer_send_t *s = calloc(1, sizeof *s);
        if (s == NULL) {
            pthread_mutex_lock(&p->mu);
            op_fail(p, op, KVD_ERR_NOMEM);
            op_unref(op);
            pthread_mutex_unlock(&p->mu);
            continue;
        }
        s->p = p;
        s->op = op; /* takes over the queue's reference */
        memcpy(s->hdr, op->hdr, KVD_PEER_HDR_BYTES);
        s->hdr_len = KVD_PEER_HDR_BYTES;
        stat_add(p, &p->stats.requests_sent, 1);
        send_msg(p, ep, s, op->body, op->body_len,
                 UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER);
    }
}

/* ---- serving requests (progress thread) --------------------------------- */

static void reply(kvd_peer_t *p, ucp_ep_h ep, const kvd_peer_hdr_t *h,
                  void *owned, const void *body, size_t len,
                  const kvd_store_lease_t *lease, uint32_t flags)
{
    peer_send_t *s = calloc(1, sizeof *s);
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
    send_msg(p, ep, s, body, len, flags);
}

/* Leases `hash` when this node can serve it: in the arena, or on NVMe
 * with disk_gets; false otherwise. */
static bool lease_servable(kvd_peer_t *p, const kvd_namespace_t *ns,
                           const uint8_t *hash, kvd_store_lease_t *lease)
{
    kvd_block_hash_t h;
    memcpy(h.bytes, hash, sizeof h.bytes);
    size_t m = 0;
    if (kvd_store_lookup(p->cfg.store, ns, &h, 1, lease, &m) != KVD_OK ||
        m != 1) {
        return false;
    }
    if (lease->tier != KVD_STORE_TIER_HOST &&
        !(lease->tier == KVD_STORE_TIER_DISK && p->cfg.disk_gets)) {
        (void)kvd_store_release(p->cfg.store, lease, 1);
        return false;
    }
    return true;
}

static void serve_lookup(kvd_peer_t *p, ucp_ep_h ep, const kvd_peer_hdr_t *rq,
                         const uint8_t *body)
{
    kvd_peer_hdr_t h;
    hdr_init(p, &h, KVD_PEER_OP_LOOKUP_REPLY, rq->req_id, &rq->ns);
    uint8_t *sizes = malloc((size_t)rq->count * 8);
    if (sizes == NULL) {
        h.status = KVD_ERR_NOMEM;
        reply(p, ep, &h, NULL, NULL, 0, NULL, UCP_AM_SEND_FLAG_EAGER);
        return;
    }
    h.count = rq->count;
    for (size_t i = 0; i < rq->count; i++) {
        kvd_store_lease_t lease;
        uint64_t size = 0;
        if (lease_servable(p, &rq->ns, body + i * 32, &lease)) {
            size = lease.size_bytes;
            (void)kvd_store_release(p->cfg.store, &lease, 1);
        }
        kvd_put_le64(sizes + i * 8, size);
    }
    reply(p, ep, &h, sizes, sizes, (size_t)rq->count * 8, NULL,
          UCP_AM_SEND_FLAG_EAGER);
}

/* Sends a leased object as DATA_PART messages of `part` bytes, eagerly
 * from the arena, in order; the lease goes back with the last part. */
static void send_parts(kvd_peer_t *p, ucp_ep_h ep, kvd_peer_hdr_t *h,
                       const kvd_store_lease_t *lease, const uint8_t *data,
                       uint64_t want, uint32_t part)
{
    uint32_t n = (uint32_t)((want + part - 1) / part);
    peer_xfer_t *x = malloc(sizeof *x);
    if (x == NULL) {
        (void)kvd_store_release(p->cfg.store, lease, 1);
        h->status = KVD_ERR_BUSY;
        reply(p, ep, h, NULL, NULL, 0, NULL, 0);
        return;
    }
    x->lease = *lease;
    x->parts = n;
    p->xfers++;
    h->op = KVD_PEER_OP_DATA_PART;
    /* Stand-ins for a transport that reorders or repeats messages: the
     * parts last first, or the first part again instead of the last. */
    bool reversed = KVD_FAILPOINT("peer.parts_reversed") != 0;
    bool gap = n > 1 && KVD_FAILPOINT("peer.parts_gap") != 0;
    for (uint32_t k = 0; k < n; k++) {
        peer_send_t *s = calloc(1, sizeof *s);
        if (s == NULL) {
            /* The requester's deadline ends the object. */
            xfer_put(p, x, n - k);
            return;
        }
        uint32_t which = reversed ? n - 1 - k : k;
        uint64_t off = (gap && which == n - 1 ? 0 : (uint64_t)which) * part;
        uint64_t len = want - off < part ? want - off : part;
        h->offset = off;
        s->p = p;
        s->xfer = x;
        s->hdr_len = kvd_peer_hdr_encode(h, s->hdr);
        send_msg(p, ep, s, data + off, len, UCP_AM_SEND_FLAG_EAGER);
    }
}

/* Sends a leased arena object as DATA (the lease goes back when UCX is
 * done with the bytes), in parts of `part` bytes when it is not 0, or
 * `status` when it cannot. */
static void send_object(kvd_peer_t *p, ucp_ep_h ep, kvd_peer_hdr_t *h,
                        const kvd_store_lease_t *lease, uint64_t want,
                        uint32_t part)
{
    void *data = kvd_store_arena_ptr(p->cfg.store, lease->arena_offset, want);
    if (lease->size_bytes != want || data == NULL) {
        (void)kvd_store_release(p->cfg.store, lease, 1);
        h->status = KVD_ERR_STATE; /* replaced since the LOOKUP */
        reply(p, ep, h, NULL, NULL, 0, NULL, 0);
        return;
    }
    h->size = want;
    /* The checksum verified when the object was committed, else read the
     * bytes once more for it. */
    if (!kvd_store_lease_checksum(p->cfg.store, lease, &h->checksum)) {
        h->checksum = kvd_xxh3_64(data, want);
    }
    if (KVD_FAILPOINT("peer.corrupt") != 0) {
        h->checksum ^= 1; /* stands in for bytes damaged on the way */
    }
    stat_add(p, &p->stats.objects_served, 1);
    stat_add(p, &p->stats.bytes_served, want);
    if (part != 0) {
        send_parts(p, ep, h, lease, data, want, part);
        return;
    }
    reply(p, ep, h, NULL, data, want, lease, 0);
}

/* Starts reading an NVMe object into the arena for entry `i` of `job`;
 * false when it cannot (too many reads in flight, the store refused). */
static bool disk_get(kvd_peer_t *p, const peer_serve_t *job, uint32_t i,
                     const kvd_store_lease_t *lease, uint64_t want)
{
    if (p->disk_inflight >= PEER_DISK_MAX) {
        return false;
    }
    peer_diskget_t *dg = malloc(sizeof *dg + job->addr_len);
    if (dg == NULL) {
        return false;
    }
    memset(dg, 0, sizeof *dg);
    dg->req_id = job->req_id;
    dg->ns = job->ns;
    dg->idx = i;
    dg->want = want;
    dg->part = job->part;
    dg->addr_len = job->addr_len;
    memcpy(dg->addr, job->addr, job->addr_len);
    kvd_store_get_t g = {.lease = *lease,
                         .user_data = (uint64_t)(uintptr_t)dg | 1u};
    size_t accepted = 0;
    if (kvd_store_get_submit(p->cfg.store, &g, 1, &accepted) != KVD_OK ||
        accepted != 1) {
        free(dg);
        return false;
    }
    p->disk_inflight++;
    return true;
}

/* Sends entry `i` of a queued FETCH: its object by rendezvous from the
 * arena (leased until UCX is done), after a read from NVMe when it is
 * there only, or its status. */
static void serve_one(kvd_peer_t *p, ucp_ep_h ep, const peer_serve_t *job,
                      uint32_t i)
{
    const uint8_t *e = job->entries + (size_t)i * 40;
    uint64_t want = kvd_get_le64(e + 32);
    kvd_peer_hdr_t h;
    hdr_init(p, &h, KVD_PEER_OP_DATA, job->req_id, &job->ns);
    h.count = i;
    kvd_store_lease_t lease;
    if (!lease_servable(p, &job->ns, e, &lease)) {
        h.status = KVD_ERR_NOT_FOUND;
        reply(p, ep, &h, NULL, NULL, 0, NULL, 0);
        return;
    }
    if (lease.tier == KVD_STORE_TIER_DISK) {
        if (lease.size_bytes == want && disk_get(p, job, i, &lease, want)) {
            return; /* sent by disk_finish */
        }
        (void)kvd_store_release(p->cfg.store, &lease, 1);
        h.status = lease.size_bytes == want ? KVD_ERR_BUSY : KVD_ERR_STATE;
        reply(p, ep, &h, NULL, NULL, 0, NULL, 0);
        return;
    }
    send_object(p, ep, &h, &lease, want, job->part);
}

/* A read from NVMe for a FETCH finished: the object goes out (or the
 * failure) to its requester. */
static void disk_finish(kvd_peer_t *p, peer_diskget_t *dg)
{
    p->disk_inflight--;
    ucp_ep_h ep = ep_get(p, dg->addr, dg->addr_len);
    kvd_peer_hdr_t h;
    hdr_init(p, &h, KVD_PEER_OP_DATA, dg->req_id, &dg->ns);
    h.count = dg->idx;
    if (dg->c.status != KVD_OK) {
        /* A read error or a corrupt object (the store dropped it): gone. */
        h.status = KVD_ERR_NOT_FOUND;
        if (ep != NULL) {
            reply(p, ep, &h, NULL, NULL, 0, NULL, 0);
        }
    } else if (ep == NULL) {
        (void)kvd_store_release(p->cfg.store, &dg->c.lease, 1);
    } else {
        send_object(p, ep, &h, &dg->c.lease, dg->want, dg->part);
    }
    free(dg);
}

static void disk_drain(kvd_peer_t *p)
{
    pthread_mutex_lock(&p->mu);
    peer_diskget_t *list = p->disk_done;
    p->disk_done = NULL;
    pthread_mutex_unlock(&p->mu);
    while (list != NULL) {
        peer_diskget_t *dg = list;
        list = dg->next;
        disk_finish(p, dg);
    }
}

void kvd_peer_store_completion(kvd_peer_t *p, const kvd_store_completion_t *c)
{
    peer_diskget_t *dg =
        (peer_diskget_t *)(uintptr_t)(c->user_data & ~(uint64_t)1);
    dg->c = *c;
    pthread_mutex_lock(&p->mu);
    dg->next = p->disk_done;
    p->disk_done = dg;
    pthread_mutex_unlock(&p->mu);
    (void)ucp_worker_signal(p->worker);
}

void kvd_peer_forget_completion(kvd_store_t *store,
                                const kvd_store_completion_t *c)
{
    if (c->status == KVD_OK) {
        (void)kvd_store_release(store, &c->lease, 1);
    }
    free((void *)(uintptr_t)(c->user_data & ~(uint64_t)1));
}

static void serve_free(peer_serve_t *job)
{
    free(job->addr);
    free(job->entries);
    free(job);
}

/* Queues a FETCH; the progress loop serves it one object at a time
 * (serve_step). A full queue answers every key "busy" at once. */
static void serve_fetch(kvd_peer_t *p, ucp_ep_h reply_ep,
                        const kvd_peer_hdr_t *rq, const uint8_t *body,
                        size_t len)
{
    const uint8_t *addr = NULL, *entries = NULL;
    size_t alen = 0;
    if (kvd_peer_fetch_decode(body, len, rq->count, &addr, &alen, &entries) !=
        KVD_OK) {
        stat_add(p, &p->stats.malformed, 1);
        return;
    }
    peer_serve_t *job =
        p->serve_count < PEER_SERVE_MAX ? calloc(1, sizeof *job) : NULL;
    if (job != NULL) {
        job->addr = malloc(alen);
        job->entries = malloc((size_t)rq->count * 40);
    }
    if (job == NULL || job->addr == NULL || job->entries == NULL) {
        if (job != NULL) {
            serve_free(job);
        }
        for (uint32_t i = 0; i < rq->count; i++) {
            kvd_peer_hdr_t h;
            hdr_init(p, &h, KVD_PEER_OP_DATA, rq->req_id, &rq->ns);
            h.count = i;
            h.status = KVD_ERR_BUSY;
            reply(p, reply_ep, &h, NULL, NULL, 0, NULL, 0);
        }
        return;
    }
    memcpy(job->addr, addr, alen);
    job->addr_len = alen;
    memcpy(job->entries, entries, (size_t)rq->count * 40);
    job->n = rq->count;
    job->part = rq->size == 0                  ? 0
                : rq->size < KVD_PEER_PART_MIN ? KVD_PEER_PART_MIN
                : rq->size > KVD_PEER_PART_MAX ? KVD_PEER_PART_MAX
                                               : (uint32_t)rq->size;
    job->req_id = rq->req_id;
    job->ns = rq->ns;
    if (p->serve_tail != NULL) {
        p->serve_tail->next = job;
    } else {
        p->serve_head = job;
    }
    p->serve_tail = job;
    p->serve_count++;
}

/* Serves the next object of the oldest queued FETCH; false when none or
 * when PEER_XFER_WINDOW objects are going out in parts. */
static bool serve_step(kvd_peer_t *p)
{
    peer_serve_t *job = p->serve_head;
    if (job == NULL || p->xfers >= PEER_XFER_WINDOW) {
        return false;
    }
    ucp_ep_h ep = job->dead ? NULL : ep_get(p, job->addr, job->addr_len);
    if (ep != NULL) {
        serve_one(p, ep, job, job->next_entry);
    }
    if (ep == NULL || ++job->next_entry == job->n) {
        p->serve_head = job->next;
        if (p->serve_head == NULL) {
            p->serve_tail = NULL;
        }
        p->serve_count--;
        serve_free(job);
    }
    return true;
}

/* Drops every queued FETCH (stopping). */
static void serve_clear(kvd_peer_t *p)
{
    while (p->serve_head != NULL) {
        peer_serve_t *job = p->serve_head;
        p->serve_head = job->next;
        serve_free(job);
    }
    p->serve_tail = NULL;
    p->serve_count = 0;
}

/* The endpoint to `addr` failed: the FETCHes still queued for it are
 * dropped (their requester is gone or will time out). */
static void serve_drop_addr(kvd_peer_t *p, const uint8_t *addr, size_t len)
{
    for (peer_serve_t *job = p->serve_head; job != NULL; job = job->next) {
        if (job->addr_len == len && memcmp(job->addr, addr, len) == 0) {
            job->dead = true;
        }
    }
}

static void serve_offer(kvd_peer_t *p, const kvd_peer_hdr_t *rq,
                        const uint8_t *body, size_t len)
{
    char node[KVD_PEER_MAX_NODE_ID + 1];
    const uint8_t *entries = NULL;
    if (kvd_peer_offer_decode(body, len, rq->count, node, &entries) != KVD_OK) {
        stat_add(p, &p->stats.malformed, 1);
        return;
    }
    stat_add(p, &p->stats.offers_received, 1);
    if (p->cfg.on_offer == NULL) {
        return;
    }
    kvd_block_hash_t *hashes = malloc(rq->count * sizeof *hashes);
    uint64_t *sizes = malloc(rq->count * sizeof *sizes);
    if (hashes != NULL && sizes != NULL) {
        for (uint32_t i = 0; i < rq->count; i++) {
            memcpy(hashes[i].bytes, entries + (size_t)i * 40, 32);
            sizes[i] = kvd_get_le64(entries + (size_t)i * 40 + 32);
        }
        p->cfg.on_offer(p->cfg.offer_ctx, node, &rq->ns, (uint32_t)rq->size,
                        hashes, sizes, rq->count);
    }
    free(hashes);
    free(sizes);
}

/* ---- answers (progress thread) ------------------------------------------ */

static void got_lookup_reply(kvd_peer_t *p, const kvd_peer_hdr_t *h,
                             const uint8_t *body)
{
    pthread_mutex_lock(&p->mu);
    peer_op_t *op = table_find(p, h->req_id);
    if (op != NULL && op->kind == KVD_PEER_OP_LOOKUP && !op->finished) {
        if (h->status != KVD_OK) {
            op->result = KVD_ERR_PEER;
        } else if (h->count != op->n) {
            stat_add(p, &p->stats.malformed, 1);
            op->result = KVD_ERR_PEER;
        } else {
            for (size_t i = 0; i < op->n; i++) {
                op->sizes[i] = kvd_get_le64(body + i * 8);
            }
        }
        op_finish(p, op);
    }
    pthread_mutex_unlock(&p->mu);
}

/* Every byte of entry `idx` is in its slot; `ok`: they hash to the
 * checksum its server sent (under mu). Committed or aborted. */
static void entry_verified(kvd_peer_t *p, peer_op_t *op, size_t idx, bool ok)
{
    kvd_status_t s = KVD_OK;
    if (!ok) {
        stat_add(p, &p->stats.checksum_errors, 1);
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                            "cluster: an object arrived with a bad checksum; "
                            "not cached");
        s = KVD_ERR_CHECKSUM;
    }
    entry_done(p, op, idx, s);
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
    pthread_mutex_lock(&p->mu);
    if (st == UCS_OK && length == r->op->sizes[r->idx]) {
        data_arrived(p, r->op, r->idx);
    } else {
        entry_done(p, r->op, r->idx, KVD_ERR_PEER);
    }
    op_unref(r->op);
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
    peer_op_t *op = table_find(p, h->req_id);
    size_t i = h->count;
    if (op == NULL || op->kind != KVD_PEER_OP_FETCH || i >= op->n ||
        op->state[i] != ENTRY_WAIT) {
        goto out; /* late (given up) or not ours: dropped */
    }
    if (h->status != KVD_OK) {
        entry_done(p, op, i, data_status(h->status));
        goto out;
    }
    if (h->size != op->sizes[i]) {
        stat_add(p, &p->stats.malformed, 1);
        entry_done(p, op, i, KVD_ERR_PEER);
        goto out;
    }
    op->checksums[i] = h->checksum;
    void *dst = kvd_store_arena_ptr(p->cfg.store, op->offsets[i], length);
    if (dst == NULL) {
        entry_done(p, op, i, KVD_ERR_INTERNAL);
        goto out;
    }
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        memcpy(dst, data, length);
        data_arrived(p, op, i);
        goto out;
    }
    peer_recv_t *r = malloc(sizeof *r);
    if (r == NULL) {
        entry_done(p, op, i, KVD_ERR_NOMEM);
        goto out;
    }
    r->p = p;
    r->op = op;
    r->idx = i;
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
        op_unref(op);
        free(r);
    } else if (UCS_PTR_IS_ERR(rq)) {
        entry_done(p, op, i, KVD_ERR_PEER);
        op_unref(op);
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
    peer_op_t *op = table_find(p, h->req_id);
    size_t i = h->count;
    if (op == NULL || op->kind != KVD_PEER_OP_FETCH || i >= op->n ||
        (op->state[i] != ENTRY_WAIT && op->state[i] != ENTRY_PARTS)) {
        goto out; /* late (given up) or not ours: dropped */
    }
    uint64_t size = op->sizes[i];
    if (h->size != size ||
        (op->state[i] == ENTRY_PARTS && h->checksum != op->checksums[i])) {
        stat_add(p, &p->stats.malformed, 1);
        entry_done(p, op, i, KVD_ERR_PEER);
        goto out;
    }
    uint8_t *slot = kvd_store_arena_ptr(p->cfg.store, op->offsets[i], size);
    if (slot == NULL) {
        entry_done(p, op, i, KVD_ERR_INTERNAL);
        goto out;
    }
    if (op->state[i] == ENTRY_WAIT) {
        peer_rx_t *rx = calloc(1, sizeof *rx);
        if (rx == NULL || (rx->hash = kvd_xxh3_stream_new()) == NULL) {
            free(rx);
            entry_done(p, op, i, KVD_ERR_NOMEM);
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

static ucs_status_t am_cb(void *arg, const void *header, size_t header_length,
                          void *data, size_t length,
                          const ucp_am_recv_param_t *param)
{
    kvd_peer_t *p = arg;
    kvd_peer_hdr_t h;
    if (kvd_peer_hdr_decode(header, header_length, length, &h) != KVD_OK) {
        stat_add(p, &p->stats.malformed, 1);
        return UCS_OK;
    }
    if (!auth_ok(p, &h)) {
        stat_add(p, &p->stats.auth_rejected, 1);
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
        stat_add(p, &p->stats.malformed, 1);
        return UCS_OK;
    }
    switch (h.op) {
    case KVD_PEER_OP_DATA_PART: return got_part(p, &h, data, length);
    case KVD_PEER_OP_LOOKUP_REPLY: got_lookup_reply(p, &h, data); return UCS_OK;
    case KVD_PEER_OP_OFFER: serve_offer(p, &h, data, length); return UCS_OK;
    default: break;
    }
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
        stat_add(p, &p->stats.malformed, 1);
        return UCS_OK;
    }
    if (p->closing) { /* stopping: new requests are not served */
        return UCS_OK;
    }
    stat_add(p, &p->stats.requests_served, 1);
    if (h.op == KVD_PEER_OP_LOOKUP) {
        serve_lookup(p, param->reply_ep, &h, data);
    } else {
        serve_fetch(p, param->reply_ep, &h, data, length);
    }
    return UCS_OK;
}

/* ---- the progress thread ------------------------------------------------ */

static void *peer_main(void *arg)
{
    kvd_peer_t *p = arg;
    uint64_t busy_until = 0;
    while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) {
        queue_drain(p);
        disk_drain(p);
        bool progressed = serve_step(p);
        while (ucp_worker_progress(p->worker) != 0) {
            progressed = true;
        }
        eps_close_dead(p, false);
        /* While transfers are under way, poll instead of sleeping: over
         * TCP each wake-up costs a context switch per socket buffer. */
        uint64_t now = kvd_time_now_ns();
        if (progressed || __atomic_load_n(&p->active, __ATOMIC_RELAXED) > 0) {
            busy_until = now + PEER_SPIN_NS;
        }
        if (now < busy_until) {
            sched_yield();
            continue;
        }
        ucs_status_t st = ucp_worker_arm(p->worker);
        if (st == UCS_ERR_BUSY) {
            continue;
        }
        pthread_mutex_lock(&p->mu);
        bool more = p->queue != NULL || p->disk_done != NULL;
        pthread_mutex_unlock(&p->mu);
        if (more) {
            continue;
        }
        struct pollfd pfd = {.fd = p->efd, .events = POLLIN};
        (void)poll(&pfd, 1, 100);
    }
    return NULL;
}

/* ---- public calls ------------------------------------------------------- */

kvd_status_t kvd_peer_start(const kvd_peer_config_t *cfg, kvd_peer_t **out,
                            char *err, size_t err_len)
{
    if (cfg == NULL || out == NULL || cfg->store == NULL ||
        cfg->node_id == NULL || cfg->node_id[0] == '\0' ||
        strlen(cfg->node_id) > KVD_PEER_MAX_NODE_ID) {
        return KVD_ERR_INVALID;
    }
    kvd_peer_t *p = calloc(1, sizeof *p);
    if (p == NULL) {
        return KVD_ERR_NOMEM;
    }
    p->cfg = *cfg;
    snprintf(p->node_id, sizeof p->node_id, "%s", cfg->node_id);
    p->cfg.node_id = p->node_id;
    p->cfg.token = NULL;
    p->efd = -1;
    pthread_mutex_init(&p->mu, NULL);
    if (getrandom(&p->next_id, sizeof p->next_id, 0) !=
        (ssize_t)sizeof p->next_id) {
        p->next_id = (uint64_t)kvd_time_now_ns();
    }
    kvd_status_t s = KVD_OK;
    if (cfg->token != NULL && cfg->token[0] != '\0') {
        s = kvd_sha256(cfg->token, strlen(cfg->token), p->auth);
        if (s != KVD_OK) {
            snprintf(err, err_len, "cluster: cannot digest the token: %s",
                     kvd_status_str(s));
            goto fail;
        }
    }
    ucp_config_t *ucfg = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &ucfg);
    if (st != UCS_OK) {
        snprintf(err, err_len, "cluster: UCX configuration: %s",
                 ucs_status_string(st));
        s = KVD_ERR_PEER;
        goto fail;
    }
    ucp_params_t params;
    memset(&params, 0, sizeof params);
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    params.name = "kvdepot";
    st = ucp_init(&params, ucfg, &p->ctx);
    ucp_config_release(ucfg);
    if (st != UCS_OK) {
        snprintf(err, err_len, "cluster: UCX init: %s", ucs_status_string(st));
        s = KVD_ERR_PEER;
        goto fail;
    }
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    st = ucp_worker_create(p->ctx, &wp, &p->worker);
    if (st == UCS_OK) {
        st = ucp_worker_get_efd(p->worker, &p->efd);
    }
    if (st != UCS_OK) {
        snprintf(err, err_len, "cluster: UCX worker: %s",
                 ucs_status_string(st));
        s = KVD_ERR_PEER;
        goto fail;
    }
    ucp_worker_attr_t wa;
    memset(&wa, 0, sizeof wa);
    wa.field_mask =
        UCP_WORKER_ATTR_FIELD_ADDRESS | UCP_WORKER_ATTR_FIELD_ADDRESS_FLAGS;
    wa.address_flags = UCP_WORKER_ADDRESS_FLAG_NET_ONLY;
    st = ucp_worker_query(p->worker, &wa);
    if (st != UCS_OK) {
        snprintf(err, err_len, "cluster: UCX worker address: %s",
                 ucs_status_string(st));
        s = KVD_ERR_PEER;
        goto fail;
    }
    if (wa.address_length > KVD_PROTO_MAX_UCX_ADDRESS_BYTES ||
        (p->address = malloc(wa.address_length)) == NULL) {
        ucp_worker_release_address(p->worker, wa.address);
        snprintf(err, err_len,
                 "cluster: UCX worker address of %zu bytes (at most %d); "
                 "narrow UCX_TLS / UCX_NET_DEVICES",
                 wa.address_length, KVD_PROTO_MAX_UCX_ADDRESS_BYTES);
        s = KVD_ERR_PEER;
        goto fail;
    }
    memcpy(p->address, wa.address, wa.address_length);
    p->address_len = wa.address_length;
    ucp_worker_release_address(p->worker, wa.address);
    ucp_am_handler_param_t hp;
    memset(&hp, 0, sizeof hp);
    hp.field_mask =
        UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
        UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.id = PEER_AM_ID;
    hp.cb = am_cb;
    hp.arg = p;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    st = ucp_worker_set_am_recv_handler(p->worker, &hp);
    if (st != UCS_OK) {
        snprintf(err, err_len, "cluster: UCX handler: %s",
                 ucs_status_string(st));
        s = KVD_ERR_PEER;
        goto fail;
    }
    if (pthread_create(&p->thread, NULL, peer_main, p) != 0) {
        snprintf(err, err_len, "cluster: cannot start the UCX thread");
        s = KVD_ERR_INTERNAL;
        goto fail;
    }
    p->started = true;
    *out = p;
    return KVD_OK;
fail:
    kvd_peer_stop(p);
    return s;
}

void kvd_peer_stop(kvd_peer_t *p)
{
    if (p == NULL) {
        return;
    }
    if (p->started) {
        __atomic_store_n(&p->stop, true, __ATOMIC_RELEASE);
        (void)ucp_worker_signal(p->worker);
        pthread_join(p->thread, NULL);
    }
    if (p->worker != NULL) {
        /* The thread is gone: this one owns the worker now. Closing the
         * endpoints fails what is in flight through the usual callbacks. */
        queue_drain(p);
        pthread_mutex_lock(&p->mu);
        peer_diskget_t *done = p->disk_done;
        p->disk_done = NULL;
        pthread_mutex_unlock(&p->mu);
        while (done != NULL) { /* read, never sent: give the leases back */
            peer_diskget_t *dg = done;
            done = dg->next;
            kvd_peer_forget_completion(p->cfg.store, &dg->c);
        }
        p->closing = true;
        serve_clear(p);
        eps_close_dead(p, true);
        /* Let what is in flight finish or fail, and wire-up exchanges with
         * peers settle: UCX 1.13 aborts in ucp_worker_destroy when it must
         * purge a pending wire-up reply of an endpoint a peer opened. Until
         * 50 ms pass without progress (2 s at most). */
        uint64_t end = kvd_time_now_ns() + 2 * KVD_NSEC_PER_SEC;
        uint64_t quiet = kvd_time_now_ns() + PEER_DRAIN_QUIET_NS;
        for (uint64_t now = kvd_time_now_ns(); now < end && now < quiet;
             now = kvd_time_now_ns()) {
            if (ucp_worker_progress(p->worker) != 0 ||
                __atomic_load_n(&p->active, __ATOMIC_RELAXED) > 0) {
                quiet = now + PEER_DRAIN_QUIET_NS;
            } else {
                sched_yield();
            }
        }
        serve_clear(p);
        pthread_mutex_lock(&p->mu);
        for (size_t b = 0; b < PEER_BUCKETS; b++) {
            while (p->table[b] != NULL) {
                peer_op_t *op = p->table[b];
                op_fail(p, op, KVD_ERR_CANCELED);
                if (p->table[b] == op) { /* bytes still "arriving" */
                    op->receiving = 0;
                    table_remove(p, op);
                }
            }
        }
        pthread_mutex_unlock(&p->mu);
        ucp_worker_destroy(p->worker);
    }
    if (p->ctx != NULL) {
        ucp_cleanup(p->ctx);
    }
    free(p->address);
    pthread_mutex_destroy(&p->mu);
    OPENSSL_cleanse(p->auth, sizeof p->auth);
    free(p);
}

const uint8_t *kvd_peer_address(const kvd_peer_t *p, size_t *len_out)
{
    *len_out = p != NULL ? p->address_len : 0;
    return p != NULL ? p->address : NULL;
}

static peer_op_t *op_new(kvd_peer_t *p, uint16_t kind, const uint8_t *addr,
                         size_t addr_len, const kvd_namespace_t *ns, size_t n)
{
    peer_op_t *op = calloc(1, sizeof *op);
    if (op == NULL) {
        return NULL;
    }
    op->kind = kind;
    op->ns = *ns;
    op->n = n;
    op->addr = malloc(addr_len ? addr_len : 1);
    op->hashes = calloc(n, sizeof *op->hashes);
    op->sizes = calloc(n, sizeof *op->sizes);
    if (op->addr == NULL || op->hashes == NULL || op->sizes == NULL) {
        op_free(op);
        return NULL;
    }
    memcpy(op->addr, addr, addr_len);
    op->addr_len = addr_len;
    (void)p;
    return op;
}

/* Puts prepared operations into the table and the queue (one caller
 * reference each is already counted) and wakes the thread. */
static kvd_status_t ops_submit(kvd_peer_t *p, peer_op_t **ops, size_t n)
{
    pthread_mutex_lock(&p->mu);
    if (p->queued + n > PEER_QUEUE_MAX) {
        pthread_mutex_unlock(&p->mu);
        return KVD_ERR_BUSY;
    }
    for (size_t i = 0; i < n; i++) {
        peer_op_t *op = ops[i];
        op->id = ++p->next_id;
        kvd_peer_hdr_t h;
        hdr_init(p, &h, op->kind, op->id, &op->ns);
        h.count = (uint32_t)op->n;
        if (op->kind == KVD_PEER_OP_OFFER) {
            h.size = op->tenant;
        } else if (op->kind == KVD_PEER_OP_FETCH) {
            h.size = p->cfg.part_bytes;
        }
        kvd_peer_hdr_encode(&h, op->hdr);
        op->refs += 2; /* the table's and the queue's (then the send's) */
        op->in_table = op->kind != KVD_PEER_OP_OFFER;
        if (!op->in_table) {
            op->refs--;
        } else {
            op->next = p->table[op->id % PEER_BUCKETS];
            p->table[op->id % PEER_BUCKETS] = op;
        }
        op->qnext = NULL;
        if (p->queue_tail != NULL) {
            p->queue_tail->qnext = op;
        } else {
            p->queue = op;
        }
        p->queue_tail = op;
        p->queued++;
    }
    pthread_mutex_unlock(&p->mu);
    (void)ucp_worker_signal(p->worker);
    return KVD_OK;
}

/* Waits for the call's operations; at the deadline the ones not finished
 * fail with KVD_ERR_TIMEOUT. */
static void call_wait(kvd_peer_t *p, peer_call_t *call, peer_op_t **ops,
                      size_t n, uint64_t deadline_ns)
{
    pthread_mutex_lock(&p->mu);
    while (call->pending > 0) {
        uint64_t now = kvd_time_now_ns();
        if (now >= deadline_ns) {
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t wait = deadline_ns - now;
        uint64_t ns = (uint64_t)ts.tv_nsec + wait % KVD_NSEC_PER_SEC;
        ts.tv_sec += (time_t)(wait / KVD_NSEC_PER_SEC + ns / KVD_NSEC_PER_SEC);
        ts.tv_nsec = (long)(ns % KVD_NSEC_PER_SEC);
        (void)pthread_cond_timedwait(&call->cv, &p->mu, &ts);
    }
    bool timed_out = false;
    for (size_t i = 0; i < n; i++) {
        if (ops[i] != NULL && !ops[i]->finished) {
            timed_out = true;
            op_fail(p, ops[i], KVD_ERR_TIMEOUT);
        }
        if (ops[i] != NULL) {
            ops[i]->call = NULL;
        }
    }
    pthread_mutex_unlock(&p->mu);
    if (timed_out) {
        stat_add(p, &p->stats.timeouts, 1);
    }
}

static void call_init(peer_call_t *call)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&call->cv, &ca);
    pthread_condattr_destroy(&ca);
    call->pending = 0;
}

static bool batch_ok(const kvd_peer_batch_t *b, bool fetch)
{
    return b->address != NULL && b->address_len > 0 && b->hashes != NULL &&
           b->n >= 1 && b->n <= KVD_PEER_MAX_KEYS && b->sizes != NULL &&
           (!fetch || b->status != NULL);
}

kvd_status_t kvd_peer_lookup(kvd_peer_t *p, const kvd_namespace_t *ns,
                             kvd_peer_batch_t *batches, size_t nb,
                             uint64_t deadline_ns)
{
    if (p == NULL || ns == NULL || (batches == NULL && nb > 0)) {
        return KVD_ERR_INVALID;
    }
    for (size_t b = 0; b < nb; b++) {
        if (!batch_ok(&batches[b], false)) {
            return KVD_ERR_INVALID;
        }
    }
    peer_op_t **ops = calloc(nb ? nb : 1, sizeof *ops);
    if (ops == NULL) {
        return KVD_ERR_NOMEM;
    }
    peer_call_t call;
    call_init(&call);
    kvd_status_t s = KVD_OK;
    for (size_t b = 0; b < nb; b++) {
        kvd_peer_batch_t *bt = &batches[b];
        memset(bt->sizes, 0, bt->n * sizeof *bt->sizes);
        peer_op_t *op = op_new(p, KVD_PEER_OP_LOOKUP, bt->address,
                               bt->address_len, ns, bt->n);
        if (op != NULL && (op->body = malloc(bt->n * 32)) == NULL) {
            op_free(op);
            op = NULL;
        }
        if (op == NULL) {
            s = KVD_ERR_NOMEM;
            break;
        }
        memcpy(op->body, bt->hashes, bt->n * 32);
        op->body_len = bt->n * 32;
        op->refs = 1;
        op->call = &call;
        ops[b] = op;
    }
    if (s == KVD_OK) {
        call.pending = nb;
        s = ops_submit(p, ops, nb);
    }
    if (s != KVD_OK) {
        for (size_t b = 0; b < nb; b++) {
            if (ops[b] != NULL) {
                op_free(ops[b]);
            }
        }
        free(ops);
        pthread_cond_destroy(&call.cv);
        return s;
    }
    call_wait(p, &call, ops, nb, deadline_ns);
    pthread_mutex_lock(&p->mu);
    for (size_t b = 0; b < nb; b++) {
        batches[b].result = ops[b]->result;
        if (ops[b]->result == KVD_OK) {
            memcpy(batches[b].sizes, ops[b]->sizes,
                   batches[b].n * sizeof *batches[b].sizes);
        } else if (s == KVD_OK) {
            s = ops[b]->result;
        }
        op_unref(ops[b]);
    }
    pthread_mutex_unlock(&p->mu);
    free(ops);
    pthread_cond_destroy(&call.cv);
    return s;
}

/* Reserves a slot per key of `bt` and builds the FETCH for those reserved;
 * *op_out stays NULL when none needs fetching. */
static kvd_status_t fetch_prepare(kvd_peer_t *p, const kvd_namespace_t *ns,
                                  uint32_t tenant, kvd_peer_batch_t *bt,
                                  peer_op_t **op_out)
{
    *op_out = NULL;
    peer_op_t *op =
        op_new(p, KVD_PEER_OP_FETCH, bt->address, bt->address_len, ns, bt->n);
    if (op == NULL) {
        return KVD_ERR_NOMEM;
    }
    op->offsets = calloc(bt->n, sizeof *op->offsets);
    op->checksums = calloc(bt->n, sizeof *op->checksums);
    op->status = calloc(bt->n, sizeof *op->status);
    op->batch_index = calloc(bt->n, sizeof *op->batch_index);
    op->state = calloc(bt->n, 1);
    op->rx = calloc(bt->n, sizeof *op->rx);
    /* The body: this worker's address (the objects come to it), then the
     * entries. */
    size_t head = 2 + p->address_len;
    op->body = malloc(head + bt->n * 40);
    if (op->offsets == NULL || op->checksums == NULL || op->status == NULL ||
        op->batch_index == NULL || op->state == NULL || op->rx == NULL ||
        op->body == NULL) {
        op_free(op);
        return KVD_ERR_NOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < bt->n; i++) {
        if (bt->sizes[i] == 0 || bt->sizes[i] > KVD_PROTO_MAX_OBJECT_BYTES) {
            bt->status[i] = KVD_ERR_INVALID;
            continue;
        }
        kvd_store_reservation_t r;
        kvd_status_t s = kvd_store_reserve(p->cfg.store, ns, &bt->hashes[i], 1,
                                           bt->sizes[i], tenant, &r);
        if (s == KVD_OK) {
            s = r.status;
        }
        bt->status[i] = s;
        if (s != KVD_OK) {
            continue;
        }
        op->hashes[k] = bt->hashes[i];
        op->sizes[k] = bt->sizes[i];
        op->offsets[k] = r.arena_offset;
        op->batch_index[k] = i;
        memcpy(op->body + head + k * 40, bt->hashes[i].bytes, 32);
        kvd_put_le64(op->body + head + k * 40 + 32, bt->sizes[i]);
        k++;
    }
    if (k == 0) {
        op_free(op);
        return KVD_OK;
    }
    kvd_put_le16(op->body, (uint16_t)p->address_len);
    memcpy(op->body + 2, p->address, p->address_len);
    op->n = op->remaining = k;
    op->body_len = head + k * 40;
    op->refs = 1;
    *op_out = op;
    return KVD_OK;
}

/* Gives back the slots of an operation that was never submitted. */
static void fetch_unprepare(kvd_peer_t *p, peer_op_t *op, kvd_peer_batch_t *bt,
                            kvd_status_t s)
{
    for (size_t i = 0; i < op->n; i++) {
        kvd_store_key_t k = op_key(op, i);
        (void)kvd_store_abort(p->cfg.store, &k, 1, NULL);
        bt->status[op->batch_index[i]] = s;
    }
    op_free(op);
}

kvd_status_t kvd_peer_fetch(kvd_peer_t *p, const kvd_namespace_t *ns,
                            uint32_t tenant, kvd_peer_batch_t *batches,
                            size_t nb, uint64_t deadline_ns)
{
    if (p == NULL || ns == NULL || (batches == NULL && nb > 0)) {
        return KVD_ERR_INVALID;
    }
    for (size_t b = 0; b < nb; b++) {
        if (!batch_ok(&batches[b], true)) {
            return KVD_ERR_INVALID;
        }
    }
    peer_op_t **ops = calloc(nb ? nb : 1, sizeof *ops);
    if (ops == NULL) {
        return KVD_ERR_NOMEM;
    }
    /* Which batch each operation belongs to (batches with nothing to
     * fetch have none). */
    size_t *owner = calloc(nb ? nb : 1, sizeof *owner);
    peer_call_t call;
    call_init(&call);
    kvd_status_t s = owner == NULL ? KVD_ERR_NOMEM : KVD_OK;
    size_t live = 0;
    for (size_t b = 0; b < nb && s == KVD_OK; b++) {
        batches[b].result = KVD_OK;
        s = fetch_prepare(p, ns, tenant, &batches[b], &ops[live]);
        if (s == KVD_OK && ops[live] != NULL) {
            ops[live]->call = &call;
            owner[live++] = b;
        }
    }
    if (s == KVD_OK && live > 0) {
        call.pending = live;
        s = ops_submit(p, ops, live);
    }
    if (s != KVD_OK) {
        for (size_t j = 0; j < live; j++) {
            fetch_unprepare(p, ops[j], &batches[owner[j]], s);
        }
        free(owner);
        free(ops);
        pthread_cond_destroy(&call.cv);
        return s;
    }
    call_wait(p, &call, ops, live, deadline_ns);
    pthread_mutex_lock(&p->mu);
    for (size_t j = 0; j < live; j++) {
        peer_op_t *op = ops[j];
        kvd_peer_batch_t *bt = &batches[owner[j]];
        bt->result = op->result;
        for (size_t i = 0; i < op->n; i++) {
            /* Keys still arriving report the timeout; the progress thread
             * commits or aborts them when UCX finishes. */
            bt->status[op->batch_index[i]] =
                op->state[i] == ENTRY_DONE ? op->status[i] : KVD_ERR_TIMEOUT;
        }
        if (op->result != KVD_OK && s == KVD_OK) {
            s = op->result;
        }
        op_unref(op);
    }
    pthread_mutex_unlock(&p->mu);
    free(owner);
    free(ops);
    pthread_cond_destroy(&call.cv);
    return s;
}

kvd_status_t kvd_peer_offer(kvd_peer_t *p, const uint8_t *address,
                            size_t address_len, const kvd_namespace_t *ns,
                            uint32_t tenant, const kvd_block_hash_t *hashes,
                            const uint64_t *sizes, size_t n)
{
    if (p == NULL || address == NULL || address_len == 0 || ns == NULL ||
        hashes == NULL || sizes == NULL || n == 0 || n > KVD_PEER_MAX_KEYS) {
        return KVD_ERR_INVALID;
    }
    peer_op_t *op = op_new(p, KVD_PEER_OP_OFFER, address, address_len, ns, 1);
    size_t id_len = strlen(p->node_id);
    if (op != NULL && (op->body = malloc(2 + id_len + n * 40)) == NULL) {
        op_free(op);
        op = NULL;
    }
    if (op == NULL) {
        return KVD_ERR_NOMEM;
    }
    kvd_put_le16(op->body, (uint16_t)id_len);
    memcpy(op->body + 2, p->node_id, id_len);
    uint8_t *e = op->body + 2 + id_len;
    for (size_t i = 0; i < n; i++) {
        memcpy(e + i * 40, hashes[i].bytes, 32);
        kvd_put_le64(e + i * 40 + 32, sizes[i]);
    }
    op->body_len = 2 + id_len + n * 40;
    op->n = n; /* the header's count */
    op->tenant = tenant;
    op->refs = 0;
    kvd_status_t s = ops_submit(p, &op, 1);
    if (s != KVD_OK) {
        op_free(op);
        return s;
    }
    stat_add(p, &p->stats.offers_sent, 1);
    return KVD_OK;
}

void kvd_peer_stats(kvd_peer_t *p, kvd_peer_stats_t *out)
{
    memset(out, 0, sizeof *out);
    if (p == NULL) {
        return;
    }
    const uint64_t *src = (const uint64_t *)&p->stats;
    uint64_t *dst = (uint64_t *)out;
    for (size_t i = 0; i < sizeof *out / sizeof(uint64_t); i++) {
        dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
    }
}
