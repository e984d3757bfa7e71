/*
 * The store's key events for clients (Admin `events`, protocol revision
 * 8): what a connector in daemon mode tells a KV-aware router, since the
 * daemon's store, not the engine's, sees commits and evictions.
 *
 * The store keeps one queue of events that a reader empties
 * (kvd_store_take_events); clients need to read independently, each from
 * where it stopped. So the service moves the store's events into a log of
 * its own, a ring of the newest SVC_EVENTS events numbered 1, 2, ...,
 * whatever their namespace: on every Admin events call and at every
 * housekeeping tick (so the store's queue does not overflow between
 * callers). Each call names its namespaces (the caller's; a caller bound
 * to a tenant names its own and matches its tenant's copies, svc_ns) and
 * passes the last number it saw; it gets the matching events after it, the
 * number to pass next time and how many events after it the log no longer
 * holds (dropped by the store's queue or pushed out of the ring): then it
 * may have missed some. Nothing is recorded until the first call: a
 * daemon nobody asks pays nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "server/svc_int.h"

typedef struct svc_event {
    kvd_store_key_t key;
    uint64_t seq;
    bool removed;
} svc_event_t;

/* The store's queue: events between two drains (a housekeeping tick). */
#define SVC_STORE_EVENTS 65536u

/* Moves the store's queued events into the log; `ev_mu` held. */
static void events_pull_locked(kvd_service_t *svc)
{
    kvd_store_event_t batch[256];
    for (;;) {
        size_t n = 0;
        uint64_t dropped = 0;
        if (kvd_store_take_events(svc->store, batch, 256, &n, &dropped) !=
            KVD_OK) {
            return;
        }
        /* Dropped by the store's queue before we got here: the numbers
         * skip them, so a reader learns it missed them. */
        svc->ev_next += dropped;
        for (size_t i = 0; i < n; i++) {
            if (svc->ev_len == SVC_EVENTS) {
                svc->ev_head = (svc->ev_head + 1) % SVC_EVENTS;
                svc->ev_len--;
            }
            svc_event_t *e =
                &svc->ev[(svc->ev_head + svc->ev_len) % SVC_EVENTS];
            e->key = batch[i].key;
            e->removed = batch[i].kind == KVD_STORE_EVENT_REMOVED;
            e->seq = svc->ev_next++;
            svc->ev_len++;
        }
        if (n < 256) {
            return;
        }
    }
}

void svc_events_pull(kvd_service_t *svc)
{
    if (!__atomic_load_n(&svc->ev_on, __ATOMIC_ACQUIRE)) {
        return;
    }
    pthread_mutex_lock(&svc->ev_mu);
    events_pull_locked(svc);
    pthread_mutex_unlock(&svc->ev_mu);
}

/* Starts recording on the first call; `ev_mu` held. */
static kvd_status_t events_start_locked(kvd_service_t *svc)
{
    if (svc->ev != NULL) {
        return KVD_OK;
    }
    svc->ev = calloc(SVC_EVENTS, sizeof *svc->ev);
    if (svc->ev == NULL) {
        return KVD_ERR_NOMEM;
    }
    kvd_status_t s = kvd_store_events_enable(svc->store, SVC_STORE_EVENTS);
    if (s != KVD_OK) {
        free(svc->ev);
        svc->ev = NULL;
        return s;
    }
    svc->ev_next = 1;
    __atomic_store_n(&svc->ev_on, true, __ATOMIC_RELEASE);
    return KVD_OK;
}

void svc_events_free(kvd_service_t *svc)
{
    free(svc->ev);
    svc->ev = NULL;
}

void svc_events_reply_free(svc_events_reply_t *r)
{
    free(r->events);
    free(r->eventp);
    free(r->hashes);
}

/* The index of `ns` in `want` (n of them), or -1. */
static int ns_index(const kvd_namespace_t *want, size_t n,
                    const kvd_namespace_t *ns)
{
    for (size_t i = 0; i < n; i++) {
        if (memcmp(want[i].bytes, ns->bytes, sizeof ns->bytes) == 0) {
            return (int)i;
        }
    }
    return -1;
}

/* Fills r->reply with the events of `want` after `after`; `ev_mu` held. */
static kvd_status_t events_collect_locked(kvd_service_t *svc,
                                          const kvd_namespace_t *want,
                                          size_t n_want, uint64_t after,
                                          size_t max, svc_events_reply_t *r)
{
    /* No more than the log holds: a call every engine step costs that. */
    max = max < svc->ev_len ? max : svc->ev_len;
    size_t cap = max > 0 ? max : 1;
    r->events = calloc(cap, sizeof *r->events);
    r->eventp = calloc(cap, sizeof *r->eventp);
    r->hashes = calloc(cap, sizeof *r->hashes);
    if (r->events == NULL || r->eventp == NULL || r->hashes == NULL) {
        return KVD_ERR_NOMEM;
    }
    uint64_t newest = svc->ev_next - 1;
    uint64_t oldest =
        svc->ev_len > 0 ? svc->ev[svc->ev_head].seq : svc->ev_next;
    r->reply.next_seq = newest;
    if (after >= newest) {
        return KVD_OK; /* nothing after it: read on from now */
    }
    r->reply.missed = oldest > after + 1 ? oldest - after - 1 : 0;
    size_t k = 0;
    for (size_t i = 0; i < svc->ev_len; i++) {
        const svc_event_t *e = &svc->ev[(svc->ev_head + i) % SVC_EVENTS];
        if (e->seq <= after) {
            continue;
        }
        int idx = ns_index(want, n_want, &e->key.ns);
        if (idx < 0) {
            continue;
        }
        if (k == max) {
            r->reply.next_seq = r->events[k - 1].seq;
            break;
        }
        kvd_pb_store_event_t *pe = &r->events[k];
        *pe = (kvd_pb_store_event_t)KVDEPOT__V1__STORE_EVENT__INIT;
        r->hashes[k] = e->key.hash;
        pe->namespace_index = (uint32_t)idx;
        pe->block_hash.data = r->hashes[k].bytes;
        pe->block_hash.len = KVD_SHA256_BYTES;
        pe->removed = e->removed;
        pe->seq = e->seq;
        r->eventp[k] = pe;
        k++;
    }
    r->reply.n_events = k;
    r->reply.events = r->eventp;
    return KVD_OK;
}

kvd_status_t svc_events(kvd_service_t *svc, const kvd_pb_events_t *rq,
                        svc_events_reply_t *r, char *reason, size_t reason_len)
{
    kvd_namespace_t want[KVD_PROTO_MAX_EVENT_NAMESPACES];
    size_t n_want = rq->n_namespace_ids;
    for (size_t i = 0; i < n_want; i++) {
        kvd_status_t s =
            svc_ns(&rq->namespace_ids[i], &want[i], reason, reason_len);
        if (s != KVD_OK) {
            return s;
        }
    }
    size_t max = rq->max_events != 0 ? rq->max_events : KVD_PROTO_MAX_EVENTS;
    pthread_mutex_lock(&svc->ev_mu);
    kvd_status_t s = events_start_locked(svc);
    if (s == KVD_OK) {
        events_pull_locked(svc);
        s = events_collect_locked(svc, want, n_want, rq->after_seq, max, r);
    }
    pthread_mutex_unlock(&svc->ev_mu);
    if (s != KVD_OK) {
        kvd_config_err(reason, reason_len, "admin events: %s",
                       kvd_status_str(s));
    }
    return s;
}
