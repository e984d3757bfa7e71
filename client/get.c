/*
 * Gets (client_int.h): a get of a HOST-tier lease completes at once (its
 * bytes are already in the mapped arena); a DISK-tier one is queued for the
 * get thread, which asks the daemon (Get, one call per lease id) until the
 * block is READY in the arena, backing off while it is PENDING. Results go
 * through the completion ring the caller polls (kvd_client_poll, _wait,
 * _fd). The get thread also sends the deferred releases no Lookup picked
 * up.
 */
#include <stdlib.h>
#include <time.h>

#include "client/client_int.h"
#include "common/log_int.h"
#include "common/time_int.h"

static void cl_complete(kvd_client_t *c, const kvd_store_get_t *g,
                        kvd_status_t status, uint64_t offset)
{
    kvd_store_completion_t done = {
        .user_data = g->user_data, .status = status, .lease = g->lease};
    if (status == KVD_OK) {
        done.lease.tier = KVD_STORE_TIER_HOST;
        done.lease.arena_offset = offset;
    } else {
        /* store.h: a failed get has given its lease back. */
        uint64_t id = 0;
        pthread_mutex_lock(&c->mu);
        (void)kvd_cl_block_unref(c, &g->lease, &id);
        pthread_mutex_unlock(&c->mu);
        kvd_cl_release_ids(c, &id, id != 0);
    }
    /* The ring holds get_queue entries and at most that many are accepted,
     * so the push finds room. */
    if (kvd_ring_push(c->cq, &done) != KVD_OK) {
        KVD_LOG_ERROR("store client: completion ring full (bug)");
    }
}

/* One Get round for the gets of one lease id; the ones still pending go
 * back on *keep. */
static void cl_get_round(kvd_client_t *c, cl_get_t *list, cl_get_t **keep)
{
    size_t n = 0;
    for (cl_get_t *g = list; g != NULL; g = g->next) {
        n++;
    }
    ProtobufCBinaryData *hb = calloc(n, sizeof *hb);
    cl_get_t **arr = calloc(n, sizeof *arr);
    kvd_status_t s = hb && arr ? KVD_OK : KVD_ERR_NOMEM;
    kvd_pb_get_response_t *rsp = NULL;
    if (s == KVD_OK) {
        size_t i = 0;
        for (cl_get_t *g = list; g != NULL; g = g->next, i++) {
            arr[i] = g;
            hb[i].data = g->get.lease.key.hash.bytes;
            hb[i].len = 32;
        }
        kvd_pb_get_request_t rq = KVDEPOT__V1__GET_REQUEST__INIT;
        rq.namespace_id.data = list->get.lease.key.ns.bytes;
        rq.namespace_id.len = 16;
        rq.n_block_hashes = n;
        rq.block_hashes = hb;
        rq.lease_id = list->lease_id;
        rq.lease_ttl_ms = (uint32_t)c->cfg.lease_ttl_ms;
        uint64_t used;
        uint64_t sent_ns = kvd_time_now_ns();
        s = kvd_cl_call(c, CL_GET, KVD_PROTO_MSG_GET_REQUEST, &rq.base,
                        KVD_PROTO_MSG_GET_RESPONSE, (ProtobufCMessage **)&rsp,
                        &used, false);
        if (s == KVD_OK && rsp->n_entries != n) {
            s = KVD_ERR_PROTO;
        }
        if (s == KVD_OK) {
            /* The Get extended the lease (extend on use). */
            pthread_mutex_lock(&c->mu);
            if (kvd_cl_lease_group(c, &list->get.lease) != NULL) {
                kvd_cl_group_extend(
                    c, c->lblocks[list->get.lease.reserved - 1].group,
                    sent_ns + c->cfg.lease_ttl_ms * 1000000u);
            }
            pthread_mutex_unlock(&c->mu);
        }
    }
    for (size_t i = 0; i < n; i++) {
        cl_get_t *g = arr != NULL ? arr[i] : NULL;
        if (g == NULL) {
            break;
        }
        if (s != KVD_OK) {
            cl_complete(c, &g->get, s, 0);
            free(g);
            continue;
        }
        const kvd_pb_get_entry_t *e = rsp->entries[i];
        switch (e->state) {
        case KVDEPOT__V1__GET_STATE__GET_STATE_READY:
            if (kvd_cl_arena_contains(c, e->arena_offset, e->size_bytes)) {
                cl_complete(c, &g->get, KVD_OK, e->arena_offset);
            } else {
                cl_complete(c, &g->get, KVD_ERR_PROTO, 0);
            }
            free(g);
            break;
        case KVDEPOT__V1__GET_STATE__GET_STATE_PENDING:
            g->next = *keep;
            *keep = g;
            break;
        case KVDEPOT__V1__GET_STATE__GET_STATE_FAILED:
            cl_complete(c, &g->get,
                        e->status < 0 ? (kvd_status_t)e->status : KVD_ERR_IO,
                        0);
            free(g);
            break;
        default:
            cl_complete(c, &g->get, KVD_ERR_NOT_FOUND, 0);
            free(g);
            break;
        }
    }
    if (arr == NULL) {
        /* Out of memory before the round: fail them all. */
        while (list != NULL) {
            cl_get_t *next = list->next;
            cl_complete(c, &list->get, KVD_ERR_NOMEM, 0);
            free(list);
            list = next;
        }
    }
    kvd_proto_free(rsp ? &rsp->base : NULL);
    free(arr);
    free(hb);
}

void *kvd_cl_get_main(void *arg)
{
    kvd_client_t *c = arg;
    int idle_ms = 1;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (c->gets == NULL && !c->stopping) {
            if (c->n_rel == 0) {
                c->rel_timer_armed = false;
                pthread_cond_wait(&c->get_cv, &c->mu);
                continue;
            }
            /* Deferred releases no Lookup picked up: send them. */
            uint64_t due = c->rel_since_ms + CL_RELEASE_DELAY_MS;
            uint64_t now = kvd_time_now_ms();
            if (now >= due) {
                pthread_mutex_unlock(&c->mu);
                kvd_cl_flush_releases(c);
                pthread_mutex_lock(&c->mu);
                continue;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += (long)(due - now) * 1000000L;
            ts.tv_sec += ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
            c->rel_timer_armed = true;
            pthread_cond_timedwait(&c->get_cv, &c->mu, &ts);
        }
        c->rel_timer_armed = false;
        cl_get_t *all = c->gets;
        c->gets = NULL;
        bool stopping = c->stopping;
        pthread_mutex_unlock(&c->mu);
        if (stopping) {
            while (all != NULL) {
                cl_get_t *next = all->next;
                cl_complete(c, &all->get, KVD_ERR_CANCELED, 0);
                free(all);
                all = next;
            }
            return NULL;
        }
        /* Group by lease id, one Get call per group. */
        cl_get_t *keep = NULL;
        while (all != NULL) {
            uint64_t id = all->lease_id;
            cl_get_t *same = NULL, *rest = NULL;
            while (all != NULL) {
                cl_get_t *next = all->next;
                cl_get_t **to = all->lease_id == id ? &same : &rest;
                all->next = *to;
                *to = all;
                all = next;
            }
            cl_get_round(c, same, &keep);
            all = rest;
        }
        pthread_mutex_lock(&c->mu);
        if (keep != NULL) {
            cl_get_t *tail = keep;
            while (tail->next != NULL) {
                tail = tail->next;
            }
            tail->next = c->gets;
            c->gets = keep;
            /* Still being read from disk: ask again soon, backing off. */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += idle_ms * 1000000L;
            ts.tv_sec += ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
            pthread_cond_timedwait(&c->get_cv, &c->mu, &ts);
            idle_ms = idle_ms < 8 ? idle_ms * 2 : 8;
        } else {
            idle_ms = 1;
        }
    }
}

kvd_status_t kvd_client_get_submit(kvd_client_t *c, const kvd_store_get_t *g,
                                   size_t n, size_t *accepted_out)
{
    size_t made = 0;
    kvd_status_t s = KVD_OK;
    pthread_mutex_lock(&c->mu);
    for (; made < n; made++) {
        const cl_group_t *grp = kvd_cl_lease_group(c, &g[made].lease);
        if (grp == NULL) {
            s = made == 0 ? KVD_ERR_INVALID : KVD_OK;
            break;
        }
        if (__atomic_load_n(&c->outstanding, __ATOMIC_RELAXED) >=
            c->cfg.get_queue) {
            s = made == 0 ? KVD_ERR_BUSY : KVD_OK;
            break;
        }
        __atomic_fetch_add(&c->outstanding, 1, __ATOMIC_RELAXED);
        if (g[made].lease.tier == KVD_STORE_TIER_HOST) {
            kvd_store_completion_t done = {.user_data = g[made].user_data,
                                           .lease = g[made].lease};
            (void)kvd_ring_push(c->cq, &done);
            continue;
        }
        cl_get_t *q = calloc(1, sizeof *q);
        if (q == NULL) {
            __atomic_fetch_sub(&c->outstanding, 1, __ATOMIC_RELAXED);
            s = made == 0 ? KVD_ERR_NOMEM : KVD_OK;
            break;
        }
        q->get = g[made];
        q->lease_id = grp->lease_id;
        q->next = c->gets;
        c->gets = q;
    }
    pthread_cond_signal(&c->get_cv);
    pthread_mutex_unlock(&c->mu);
    if (s != KVD_OK) {
        return s;
    }
    *accepted_out = made;
    return KVD_OK;
}

size_t kvd_client_poll(kvd_client_t *c, kvd_store_completion_t *out, size_t max)
{
    /* A caller that asked for the fd may sleep on it after this poll: arm
     * the ring when it is drained (store.h, kvd_store_fd). */
    size_t n = __atomic_load_n(&c->fd_wanted, __ATOMIC_RELAXED)
                   ? kvd_ring_pop_arm(c->cq, out, max)
                   : kvd_ring_pop(c->cq, out, max);
    if (n > 0) {
        __atomic_fetch_sub(&c->outstanding, n, __ATOMIC_RELAXED);
    }
    return n;
}

kvd_status_t kvd_client_wait(kvd_client_t *c, int timeout_ms)
{
    return kvd_ring_wait(c->cq, timeout_ms);
}

int kvd_client_fd(kvd_client_t *c)
{
    __atomic_store_n(&c->fd_wanted, true, __ATOMIC_RELAXED);
    return kvd_ring_fd(c->cq);
}
