/*
 * The embedded store's key events (kvd_store_events_enable,
 * kvd_store_take_events): a bounded queue of "this key was committed" and
 * "this key left the last tier that held it", for an engine connector to
 * tell a KV-aware router which prefixes this node holds (vLLM's
 * BlockStored / BlockRemoved). The store's tables report nothing of the
 * kind themselves, so the places where an object is committed or leaves a
 * tier (store_save.c, store_io.c, store_manage.c) call store_event; while
 * recording is off that is one relaxed load. The queue drops its oldest
 * event when full and counts it, so a slow reader costs memory bounded by
 * the capacity it chose and learns that it missed events.
 */
#include <stdlib.h>
#include <string.h>

#include "store/store_int.h"

void store_event(kvd_embedded_t *st, const kvd_store_key_t *key,
                 kvd_store_event_kind_t kind)
{
    if (!__atomic_load_n(&st->ev_on, __ATOMIC_RELAXED)) {
        return;
    }
    pthread_mutex_lock(&st->ev_mu);
    if (st->ev_cap > 0) {
        if (st->ev_len == st->ev_cap) { /* drop the oldest */
            st->ev_head = (st->ev_head + 1) % st->ev_cap;
            st->ev_len--;
            st->ev_dropped++;
        }
        kvd_store_event_t *e = &st->ev[(st->ev_head + st->ev_len) % st->ev_cap];
        e->key = *key;
        e->kind = kind;
        st->ev_len++;
    }
    pthread_mutex_unlock(&st->ev_mu);
}

void store_event_removed(kvd_embedded_t *st, const kvd_store_key_t *key,
                         kvd_l1_t *other)
{
    if (!__atomic_load_n(&st->ev_on, __ATOMIC_RELAXED)) {
        return;
    }
    kvd_l1_entry_info_t info;
    kvd_store_key_t lk = *key;
    if (other != NULL && kvd_l1_peek(other, &lk, &info) == KVD_OK) {
        return; /* still held by the other tier */
    }
    store_event(st, key, KVD_STORE_EVENT_REMOVED);
}

kvd_status_t store_op_events_enable(kvd_store_t *base, size_t capacity)
{
    kvd_embedded_t *st = store_embedded(base);
    kvd_store_event_t *ev = NULL;
    if (capacity > 0) {
        ev = calloc(capacity, sizeof *ev);
        if (ev == NULL) {
            return KVD_ERR_NOMEM;
        }
    }
    pthread_mutex_lock(&st->ev_mu);
    kvd_store_event_t *old = st->ev;
    st->ev = ev;
    st->ev_cap = capacity;
    st->ev_head = st->ev_len = 0;
    st->ev_dropped = 0;
    __atomic_store_n(&st->ev_on, capacity > 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&st->ev_mu);
    free(old);
    return KVD_OK;
}

kvd_status_t store_op_events_watch(kvd_store_t *base, const kvd_namespace_t *ns,
                                   size_t num)
{
    kvd_embedded_t *st = store_embedded(base);
    pthread_mutex_lock(&st->ev_mu);
    if (num > 0) {
        memcpy(st->ev_watch, ns, num * sizeof *ns);
    }
    st->ev_n_watch = num;
    pthread_mutex_unlock(&st->ev_mu);
    return KVD_OK;
}

/* Whether `ns` is watched (`ev_mu` held). */
static bool watched(const kvd_embedded_t *st, const kvd_namespace_t *ns)
{
    if (st->ev_n_watch == 0) {
        return true;
    }
    for (size_t i = 0; i < st->ev_n_watch; i++) {
        if (memcmp(st->ev_watch[i].bytes, ns->bytes, sizeof ns->bytes) == 0) {
            return true;
        }
    }
    return false;
}

kvd_status_t store_op_take_events(kvd_store_t *base, kvd_store_event_t *out,
                                  size_t max, size_t *n_out,
                                  uint64_t *dropped_out)
{
    kvd_embedded_t *st = store_embedded(base);
    pthread_mutex_lock(&st->ev_mu);
    size_t n = 0;
    while (st->ev_len > 0 && n < max) {
        const kvd_store_event_t *e = &st->ev[st->ev_head];
        if (watched(st, &e->key.ns)) {
            out[n++] = *e;
        }
        st->ev_head = (st->ev_head + 1) % st->ev_cap;
        st->ev_len--;
    }
    if (dropped_out != NULL) {
        *dropped_out = st->ev_dropped;
    }
    st->ev_dropped = 0;
    pthread_mutex_unlock(&st->ev_mu);
    *n_out = n;
    return KVD_OK;
}
