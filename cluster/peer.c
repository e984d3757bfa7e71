/*
 * The UCX data plane between nodes (cluster/peer.h): its life and its
 * progress thread. kvd_peer_start creates the UCX context and worker (the
 * active-message handler of peer_recv.c on it) and starts the thread;
 * kvd_peer_stop joins it, then drains what is in flight on this thread
 * before the worker goes. The other files of the data plane are listed in
 * cluster/peer_int.h.
 *
 * The progress thread, each turn: sends what callers queued, sends what
 * reads from NVMe brought in, serves one object of a queued FETCH, drives
 * UCX until it has nothing more to do, fails the endpoints of peers that
 * took none of the objects sent to them for stall_ms, and closes failed
 * endpoints. While
 * transfers are under way it polls; when idle it sleeps on the worker's
 * event fd (callers wake it with ucp_worker_signal).
 */
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <openssl/crypto.h>

#include "cluster/peer_int.h"
#include "common/hash_int.h"
#include "common/log_int.h"
#include "common/time_int.h"
#include "proto/kvd_proto.h"

#define PEER_SPIN_NS (200 * KVD_NSEC_PER_USEC)
#define PEER_DRAIN_QUIET_NS (50 * KVD_NSEC_PER_MSEC)
#define PEER_STALL_DEFAULT_MS 10000u

static void *peer_main(void *arg)
{
    kvd_peer_t *p = arg;
    uint64_t busy_until = 0;
    while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) {
        kvd_peer_queue_drain(p);
        kvd_peer_disk_drain(p);
        bool progressed = kvd_peer_serve_step(p);
        while (ucp_worker_progress(p->worker) != 0) {
            progressed = true;
        }
        kvd_peer_eps_check_stalled(p);
        kvd_peer_eps_close_dead(p, false);
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

/* The UCX context (active messages, wake-ups) and its worker with its
 * event fd. KVD_ERR_PEER (reason in `err`) when UCX refuses. */
static kvd_status_t ucx_open(kvd_peer_t *p, char *err, size_t err_len)
{
    ucp_config_t *ucfg = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &ucfg);
    if (st != UCS_OK) {
        snprintf(err, err_len, "cluster: UCX configuration: %s",
                 ucs_status_string(st));
        return KVD_ERR_PEER;
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
        return KVD_ERR_PEER;
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
        return KVD_ERR_PEER;
    }
    return KVD_OK;
}

/* Keeps the worker's address (network transports only, for NodeInfo) and
 * sets the active-message handler. KVD_ERR_PEER (reason in `err`). */
static kvd_status_t ucx_publish(kvd_peer_t *p, char *err, size_t err_len)
{
    ucp_worker_attr_t wa;
    memset(&wa, 0, sizeof wa);
    wa.field_mask =
        UCP_WORKER_ATTR_FIELD_ADDRESS | UCP_WORKER_ATTR_FIELD_ADDRESS_FLAGS;
    wa.address_flags = UCP_WORKER_ADDRESS_FLAG_NET_ONLY;
    ucs_status_t st = ucp_worker_query(p->worker, &wa);
    if (st != UCS_OK) {
        snprintf(err, err_len, "cluster: UCX worker address: %s",
                 ucs_status_string(st));
        return KVD_ERR_PEER;
    }
    if (wa.address_length > KVD_PROTO_MAX_UCX_ADDRESS_BYTES ||
        (p->address = malloc(wa.address_length)) == NULL) {
        ucp_worker_release_address(p->worker, wa.address);
        snprintf(err, err_len,
                 "cluster: UCX worker address of %zu bytes (at most %d); "
                 "narrow UCX_TLS / UCX_NET_DEVICES",
                 wa.address_length, KVD_PROTO_MAX_UCX_ADDRESS_BYTES);
        return KVD_ERR_PEER;
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
    hp.cb = kvd_peer_am_recv;
    hp.arg = p;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    st = ucp_worker_set_am_recv_handler(p->worker, &hp);
    if (st != UCS_OK) {
        snprintf(err, err_len, "cluster: UCX handler: %s",
                 ucs_status_string(st));
        return KVD_ERR_PEER;
    }
    return KVD_OK;
}

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
    p->stall_ns =
        (uint64_t)(cfg->stall_ms != 0 ? cfg->stall_ms : PEER_STALL_DEFAULT_MS) *
        KVD_NSEC_PER_MSEC;
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
    s = ucx_open(p, err, err_len);
    if (s == KVD_OK) {
        s = ucx_publish(p, err, err_len);
    }
    if (s != KVD_OK) {
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
        kvd_peer_queue_drain(p);
        kvd_peer_disk_forget(p);
        p->closing = true;
        kvd_peer_serve_clear(p);
        kvd_peer_eps_close_dead(p, true);
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
        kvd_peer_serve_clear(p);
        pthread_mutex_lock(&p->mu);
        for (size_t b = 0; b < PEER_BUCKETS; b++) {
            while (p->table[b] != NULL) {
                peer_op_t *op = p->table[b];
                kvd_peer_op_fail(p, op, KVD_ERR_CANCELED);
                if (p->table[b] == op) { /* bytes still "arriving" */
                    op->receiving = 0;
                    kvd_peer_table_remove(p, op);
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
