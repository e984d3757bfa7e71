/*
 * Answering other nodes (cluster/peer_int.h). A LOOKUP is answered at
 * once from the store's index; an OFFER goes to cfg.on_offer. A FETCH is
 * queued and served one object per progress-loop turn, so one large
 * FETCH does not hold up the loop: each object goes out from the arena
 * under a store lease (whole by rendezvous, or in eager parts), or after a
 * store get has read it from NVMe into the arena (disk_gets), or as a
 * status when it is gone or the server is busy. Each requester has a
 * window: PEER_XFER_WINDOW objects in parts, or PEER_RNDV_WINDOW whole
 * objects, on their way to it at once; a FETCH whose requester's window
 * is full waits while the FETCHes of others are served, so a requester
 * that reads slowly, or not at all, holds up no one else and pins no more
 * than its window. One requester has PEER_SERVE_PER_ADDR FETCHes queued
 * at most (of PEER_SERVE_MAX for all).
 *
 * Threading: the progress thread, but for kvd_peer_store_completion (any
 * thread) and kvd_peer_forget_completion (after kvd_peer_stop).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/peer_int.h"
#include "common/endian_int.h"
#include "common/failpoint_int.h"
#include "common/hash_int.h"
#include "common/log_int.h"
#include "store/engine.h"

#define PEER_SERVE_MAX 1024u
#define PEER_DISK_MAX 256u
/* Objects a server sends in parts to one requester at once: the next
 * one's parts queue behind the current one's, so the socket never waits
 * for a turn of the progress loop, and no more. */
#define PEER_XFER_WINDOW 2u
/* Whole objects (rendezvous) on their way to one requester at once. */
#define PEER_RNDV_WINDOW 16u
/* Objects in parts on their way at once, every requester together. */
#define PEER_XFER_MAX 64u
/* FETCHes of one requester queued at once (beyond: answered busy). */
#define PEER_SERVE_PER_ADDR 64u

/* A FETCH being served, one object per progress-loop turn. */
struct peer_serve {
    struct peer_serve *next;
    uint8_t *addr; /* the requester's worker address */
    size_t addr_len;
    uint64_t req_id;
    kvd_namespace_t ns;
    uint8_t *entries; /* n (hash, size) */
    uint32_t n, next_entry;
    uint32_t part; /* bytes per DATA_PART (0: whole objects) */
    bool dead;     /* its endpoint failed: drop */
};

/* An object of a FETCH being read from NVMe into the arena (a store get),
 * sent when its completion comes back; one allocation, address inline. */
struct peer_diskget {
    struct peer_diskget *next; /* the done list */
    uint64_t req_id;
    kvd_namespace_t ns;
    uint32_t idx;
    uint64_t want;
    uint32_t part;
    kvd_store_completion_t c;
    size_t addr_len;
    uint8_t addr[]; /* the requester's worker address */
};

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

void kvd_peer_serve_lookup(kvd_peer_t *p, ucp_ep_h ep, const kvd_peer_hdr_t *rq,
                           const uint8_t *body)
{
    kvd_peer_hdr_t h;
    kvd_peer_hdr_init(p, &h, KVD_PEER_OP_LOOKUP_REPLY, rq->req_id, &rq->ns);
    uint8_t *sizes = malloc((size_t)rq->count * 8);
    if (sizes == NULL) {
        h.status = KVD_ERR_NOMEM;
        kvd_peer_reply(p, ep, &h, NULL, NULL, 0, NULL, UCP_AM_SEND_FLAG_EAGER);
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
    kvd_peer_reply(p, ep, &h, sizes, sizes, (size_t)rq->count * 8, NULL,
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
        kvd_peer_reply(p, ep, h, NULL, NULL, 0, NULL, 0);
        return;
    }
    x->lease = *lease;
    x->parts = n;
    x->pe = kvd_peer_ep_serving(p, ep);
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
            kvd_peer_xfer_put(p, x, n - k);
            return;
        }
        uint32_t which = reversed ? n - 1 - k : k;
        uint64_t off = (gap && which == n - 1 ? 0 : (uint64_t)which) * part;
        uint64_t len = want - off < part ? want - off : part;
        h->offset = off;
        s->p = p;
        s->xfer = x;
        s->hdr_len = kvd_peer_hdr_encode(h, s->hdr);
        kvd_peer_send_msg(p, ep, s, data + off, len, UCP_AM_SEND_FLAG_EAGER);
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
        kvd_peer_reply(p, ep, h, NULL, NULL, 0, NULL, 0);
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
    kvd_peer_stat_add(p, &p->stats.objects_served, 1);
    kvd_peer_stat_add(p, &p->stats.bytes_served, want);
    if (part != 0) {
        send_parts(p, ep, h, lease, data, want, part);
        return;
    }
    kvd_peer_reply(p, ep, h, NULL, data, want, lease, 0);
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
    kvd_peer_hdr_init(p, &h, KVD_PEER_OP_DATA, job->req_id, &job->ns);
    h.count = i;
    kvd_store_lease_t lease;
    if (!lease_servable(p, &job->ns, e, &lease)) {
        h.status = KVD_ERR_NOT_FOUND;
        kvd_peer_reply(p, ep, &h, NULL, NULL, 0, NULL, 0);
        return;
    }
    if (lease.tier == KVD_STORE_TIER_DISK) {
        if (lease.size_bytes == want && disk_get(p, job, i, &lease, want)) {
            return; /* sent by disk_finish */
        }
        (void)kvd_store_release(p->cfg.store, &lease, 1);
        h.status = lease.size_bytes == want ? KVD_ERR_BUSY : KVD_ERR_STATE;
        kvd_peer_reply(p, ep, &h, NULL, NULL, 0, NULL, 0);
        return;
    }
    send_object(p, ep, &h, &lease, want, job->part);
}

/* A read from NVMe for a FETCH finished: the object goes out (or the
 * failure) to its requester. */
static void disk_finish(kvd_peer_t *p, peer_diskget_t *dg)
{
    p->disk_inflight--;
    ucp_ep_h ep = kvd_peer_ep_get(p, dg->addr, dg->addr_len);
    kvd_peer_hdr_t h;
    kvd_peer_hdr_init(p, &h, KVD_PEER_OP_DATA, dg->req_id, &dg->ns);
    h.count = dg->idx;
    if (dg->c.status != KVD_OK) {
        /* A read error or a corrupt object (the store dropped it): gone. */
        h.status = KVD_ERR_NOT_FOUND;
        if (ep != NULL) {
            kvd_peer_reply(p, ep, &h, NULL, NULL, 0, NULL, 0);
        }
    } else if (ep == NULL) {
        (void)kvd_store_release(p->cfg.store, &dg->c.lease, 1);
    } else {
        send_object(p, ep, &h, &dg->c.lease, dg->want, dg->part);
    }
    free(dg);
}

void kvd_peer_disk_drain(kvd_peer_t *p)
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

void kvd_peer_disk_forget(kvd_peer_t *p)
{
    pthread_mutex_lock(&p->mu);
    peer_diskget_t *done = p->disk_done;
    p->disk_done = NULL;
    pthread_mutex_unlock(&p->mu);
    while (done != NULL) { /* read, never sent: give the leases back */
        peer_diskget_t *dg = done;
        done = dg->next;
        kvd_peer_forget_completion(p->cfg.store, &dg->c);
    }
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

/* FETCHes queued for the requester at `addr`. */
static size_t queued_for(const kvd_peer_t *p, const uint8_t *addr, size_t len)
{
    size_t n = 0;
    for (const peer_serve_t *job = p->serve_head; job != NULL;
         job = job->next) {
        n += job->addr_len == len && memcmp(job->addr, addr, len) == 0;
    }
    return n;
}

/* Queues a FETCH; the progress loop serves it one object at a time
 * (kvd_peer_serve_step). A full queue answers every key "busy" at once. */
void kvd_peer_serve_fetch(kvd_peer_t *p, ucp_ep_h reply_ep,
                          const kvd_peer_hdr_t *rq, const uint8_t *body,
                          size_t len)
{
    const uint8_t *addr = NULL, *entries = NULL;
    size_t alen = 0;
    if (kvd_peer_fetch_decode(body, len, rq->count, &addr, &alen, &entries) !=
        KVD_OK) {
        kvd_peer_stat_add(p, &p->stats.malformed, 1);
        return;
    }
    /* UCX unpacks the address without checking it: only a member's. */
    bool trusted = p->cfg.address_ok == NULL ||
                   kvd_peer_ep_known(p, addr, alen) ||
                   p->cfg.address_ok(p->cfg.address_ctx, addr, alen);
    if (!trusted) {
        kvd_peer_stat_add(p, &p->stats.address_refused, 1);
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                            "cluster: a FETCH named a worker address of no "
                            "member of the view; refused");
    }
    /* A requester that stalled keeps what is stuck on its way (its
     * window), and no more, until it reads again or goes. */
    bool room = p->serve_count < PEER_SERVE_MAX &&
                queued_for(p, addr, alen) < PEER_SERVE_PER_ADDR &&
                !kvd_peer_ep_wedged(p, addr, alen);
    peer_serve_t *job = trusted && room ? calloc(1, sizeof *job) : NULL;
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
            kvd_peer_hdr_init(p, &h, KVD_PEER_OP_DATA, rq->req_id, &rq->ns);
            h.count = i;
            h.status = KVD_ERR_BUSY;
            kvd_peer_reply(p, reply_ep, &h, NULL, NULL, 0, NULL, 0);
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

/* Room for one more object of a FETCH with parts of `part` bytes (0:
 * whole) in the window of the requester at `ep`. */
static bool serve_room(kvd_peer_t *p, ucp_ep_h ep, uint32_t part)
{
    if (part != 0 && p->xfers >= PEER_XFER_MAX) {
        return false;
    }
    peer_ep_t *e = kvd_peer_ep_find(p, ep);
    return e == NULL ||
           e->serving < (part != 0 ? PEER_XFER_WINDOW : PEER_RNDV_WINDOW);
}

/* Serves the next object of the oldest queued FETCH whose requester has
 * room in its window; false when none. */
bool kvd_peer_serve_step(kvd_peer_t *p)
{
    peer_serve_t **pp = &p->serve_head, *prev = NULL;
    while (*pp != NULL) {
        peer_serve_t *job = *pp;
        ucp_ep_h ep =
            job->dead ? NULL : kvd_peer_ep_get(p, job->addr, job->addr_len);
        if (ep != NULL && !serve_room(p, ep, job->part)) {
            prev = job;
            pp = &job->next;
            continue;
        }
        if (ep != NULL) {
            serve_one(p, ep, job, job->next_entry);
        }
        if (ep == NULL || ++job->next_entry == job->n) {
            *pp = job->next;
            if (p->serve_tail == job) {
                p->serve_tail = prev;
            }
            p->serve_count--;
            serve_free(job);
        }
        return true;
    }
    return false;
}

/* Drops every queued FETCH (stopping). */
void kvd_peer_serve_clear(kvd_peer_t *p)
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
void kvd_peer_serve_drop_addr(kvd_peer_t *p, const uint8_t *addr, size_t len)
{
    for (peer_serve_t *job = p->serve_head; job != NULL; job = job->next) {
        if (job->addr_len == len && memcmp(job->addr, addr, len) == 0) {
            job->dead = true;
        }
    }
}

void kvd_peer_serve_offer(kvd_peer_t *p, const kvd_peer_hdr_t *rq,
                          const uint8_t *body, size_t len)
{
    char node[KVD_PEER_MAX_NODE_ID + 1];
    const uint8_t *entries = NULL;
    if (kvd_peer_offer_decode(body, len, rq->count, node, &entries) != KVD_OK) {
        kvd_peer_stat_add(p, &p->stats.malformed, 1);
        return;
    }
    kvd_peer_stat_add(p, &p->stats.offers_received, 1);
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
