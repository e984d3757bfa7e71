/*
 * The KvStore service over an embedded store (service_int.h): the method
 * table, kvd_service_call (which sets the caller's tenant around the
 * method's handler and counts calls, errors and latency), the helpers every
 * handler shares, and the service's life: create, destroy, stats. Requests
 * are unpacked and validated by proto/ before any handler reads them; every
 * response is built from stack or malloc'd arrays and packed (which
 * validates it again, so a bug here cannot send an invalid message). The
 * handlers live in service_<concept>.c; svc_int.h has the ordering rules.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "common/time_int.h"
#include "server/svc_int.h"

const uint64_t kvd_service_latency_bounds_us[KVD_SERVICE_LATENCY_BUCKETS] = {
    25,      50,      100,     250,      500,      1000,      2500,
    5000,    10000,   25000,   50000,    100000,   250000,    500000,
    1000000, 2500000, 5000000, 10000000, 30000000, UINT64_MAX};

static const struct {
    const char *path;
    const char *name;
} svc_methods[KVD_RPC_COUNT] = {
    {"/kvdepot.v1.KvStore/Lookup", "Lookup"},
    {"/kvdepot.v1.KvStore/Reserve", "Reserve"},
    {"/kvdepot.v1.KvStore/Commit", "Commit"},
    {"/kvdepot.v1.KvStore/Abort", "Abort"},
    {"/kvdepot.v1.KvStore/Release", "Release"},
    {"/kvdepot.v1.KvStore/Get", "Get"},
    {"/kvdepot.v1.KvStore/Promote", "Promote"},
    {"/kvdepot.v1.KvStore/Stats", "Stats"},
    {"/kvdepot.v1.KvStore/Admin", "Admin"},
    {"/kvdepot.v1.KvStore/Delete", "Delete"},
};

const char *kvd_rpc_method_path(kvd_rpc_method_t method)
{
    return (unsigned)method < KVD_RPC_COUNT ? svc_methods[method].path : NULL;
}

const char *kvd_rpc_method_name(kvd_rpc_method_t method)
{
    return (unsigned)method < KVD_RPC_COUNT ? svc_methods[method].name : NULL;
}

int kvd_rpc_method_find(const char *path, size_t len)
{
    if (path == NULL) {
        return -1;
    }
    for (int m = 0; m < KVD_RPC_COUNT; m++) {
        if (strlen(svc_methods[m].path) == len &&
            memcmp(svc_methods[m].path, path, len) == 0) {
            return m;
        }
    }
    return -1;
}

uint64_t svc_id_new(kvd_service_t *svc)
{
    /* `mu` held. Ids start at a random point so a restarted daemon does
     * not hand out ids a client still holds from its predecessor. */
    uint64_t id = ++svc->next_id;
    if (id == 0) {
        id = ++svc->next_id;
    }
    return id;
}

/* ---- helpers ------------------------------------------------------------ */

/* The request's hashes as one array (proto/ checked each is 32 bytes). */
kvd_block_hash_t *svc_hashes(const ProtobufCBinaryData *src, size_t n)
{
    kvd_block_hash_t *h = malloc((n ? n : 1) * sizeof *h);
    if (h != NULL) {
        for (size_t i = 0; i < n; i++) {
            memcpy(h[i].bytes, src[i].data, sizeof h[i].bytes);
        }
    }
    return h;
}

Kvdepot__V1__Tier svc_tier(uint32_t tier)
{
    return tier == KVD_STORE_TIER_HOST ? KVDEPOT__V1__TIER__TIER_HOST
                                       : KVDEPOT__V1__TIER__TIER_DISK;
}

kvd_status_t svc_pack(kvd_proto_msg_t type, const ProtobufCMessage *msg,
                      uint8_t **out, size_t *len, char *reason,
                      size_t reason_len)
{
    kvd_status_t s =
        kvd_proto_pack_alloc(type, msg, out, len, reason, reason_len);
    if (s == KVD_ERR_PROTO) {
        /* Our own response failed validation: a bug here, not the
         * caller's fault. */
        KVD_LOG_ERROR("service: invalid %s built: %s", kvd_proto_msg_name(type),
                      reason);
        return KVD_ERR_INTERNAL;
    }
    return s;
}

bool kvd_service_draining(kvd_service_t *svc)
{
    return svc != NULL && __atomic_load_n(&svc->draining, __ATOMIC_ACQUIRE);
}

uint64_t kvd_service_heartbeat_ns(kvd_service_t *svc)
{
    return svc != NULL ? __atomic_load_n(&svc->heartbeat_ns, __ATOMIC_ACQUIRE)
                       : 0;
}

/* ---- dispatch ----------------------------------------------------------- */

typedef kvd_status_t (*svc_handler_fn)(kvd_service_t *, const uint8_t *, size_t,
                                       uint8_t **, size_t *, char *, size_t);

static const svc_handler_fn svc_handlers[KVD_RPC_COUNT] = {
    svc_lookup, svc_reserve, svc_commit, svc_abort, svc_release,
    svc_get,    svc_promote, svc_stats,  svc_admin, svc_delete,
};

static void svc_count_error(kvd_service_t *svc, kvd_status_t s)
{
    int k = -(int)s;
    if (k > 0 && k < KVD_SERVICE_ERROR_KINDS) {
        svc_count(&svc->errors_by_status[k], 1);
    }
}

void kvd_service_count_refused(kvd_service_t *svc, kvd_status_t status)
{
    if (svc != NULL) {
        svc_count_error(svc, status);
    }
}

kvd_status_t kvd_service_call(kvd_service_t *svc, kvd_rpc_method_t method,
                              const uint8_t *req, size_t len,
                              const char *tenant, uint8_t **resp_out,
                              size_t *resp_len_out, char *reason,
                              size_t reason_len)
{
    return kvd_service_call_session(svc, method, req, len, tenant, 0, resp_out,
                                    resp_len_out, reason, reason_len);
}

kvd_status_t kvd_service_call_session(kvd_service_t *svc,
                                      kvd_rpc_method_t method,
                                      const uint8_t *req, size_t len,
                                      const char *tenant, uint64_t session,
                                      uint8_t **resp_out, size_t *resp_len_out,
                                      char *reason, size_t reason_len)
{
    if (reason_len > 0) {
        reason[0] = '\0';
    }
    if (svc == NULL || (unsigned)method >= KVD_RPC_COUNT || resp_out == NULL ||
        resp_len_out == NULL || (req == NULL && len > 0)) {
        return KVD_ERR_INVALID;
    }
    uint64_t t0 = kvd_time_now_ns();
    uint8_t *out = NULL;
    size_t out_len = 0;
    svc_caller_tenant = tenant;
    svc_caller_id = svc_tenant_id(tenant);
    svc_caller_session = session;
    kvd_status_t s =
        svc_handlers[method](svc, req, len, &out, &out_len, reason, reason_len);
    svc_caller_tenant = NULL;
    svc_caller_id = 0;
    svc_caller_session = 0;
    uint64_t us = (kvd_time_now_ns() - t0) / 1000u;
    kvd_service_method_stats_t *m = &svc->m[method];
    svc_count(&m->calls, 1);
    svc_count(&m->latency_sum_us, us);
    for (int b = 0; b < KVD_SERVICE_LATENCY_BUCKETS; b++) {
        if (us <= kvd_service_latency_bounds_us[b]) {
            svc_count(&m->latency_buckets[b], 1);
        }
    }
    if (s != KVD_OK) {
        svc_count(&m->errors, 1);
        svc_count_error(svc, s);
        free(out);
        if (reason_len > 0 && reason[0] == '\0') {
            kvd_config_err(reason, reason_len, "%s", kvd_status_str(s));
        }
        return s;
    }
    *resp_out = out;
    *resp_len_out = out_len;
    return KVD_OK;
}

/* ---- life ---------------------------------------------------------------- */

kvd_status_t kvd_service_create(const kvd_service_config_t *cfg,
                                kvd_service_t **svc_out)
{
    if (cfg == NULL || svc_out == NULL || cfg->store == NULL ||
        cfg->lease_ttl_ms == 0 || cfg->reservation_ttl_ms == 0 ||
        cfg->tick_ms == 0) {
        return KVD_ERR_INVALID;
    }
    kvd_service_t *svc = calloc(1, sizeof *svc);
    if (svc == NULL) {
        return KVD_ERR_NOMEM;
    }
    svc->cfg = *cfg;
    svc->store = cfg->store;
    if (cfg->node_id != NULL) {
        snprintf(svc->node_id, sizeof svc->node_id, "%s", cfg->node_id);
    }
    svc->cfg.node_id = svc->node_id;
    svc->started_ns = kvd_time_now_ns();
    if (getrandom(&svc->next_id, sizeof svc->next_id, 0) !=
        (ssize_t)sizeof svc->next_id) {
        svc->next_id = svc->started_ns;
    }
    svc->next_id >>= 1; /* room before wrapping */
    pthread_mutex_init(&svc->mu, NULL);
    pthread_mutex_init(&svc->ev_mu, NULL);
    int rc = pthread_create(&svc->thread, NULL, svc_main, svc);
    if (rc != 0) {
        pthread_mutex_destroy(&svc->ev_mu);
        pthread_mutex_destroy(&svc->mu);
        free(svc);
        return kvd_status_from_errno(rc);
    }
    svc->thread_started = true;
    *svc_out = svc;
    return KVD_OK;
}

void kvd_service_destroy(kvd_service_t *svc)
{
    if (svc == NULL) {
        return;
    }
    __atomic_store_n(&svc->stopping, true, __ATOMIC_RELEASE);
    if (svc->thread_started) {
        pthread_join(svc->thread, NULL);
    }
    pthread_mutex_lock(&svc->mu);
    svc_reclaim_all(svc);
    pthread_mutex_unlock(&svc->mu);
    pthread_mutex_destroy(&svc->mu);
    svc_events_free(svc);
    pthread_mutex_destroy(&svc->ev_mu);
    free(svc->held);
    free(svc->sessions);
    free(svc);
}

void kvd_service_stats(kvd_service_t *svc, kvd_service_stats_t *out)
{
    memset(out, 0, sizeof *out);
    for (int m = 0; m < KVD_RPC_COUNT; m++) {
        kvd_service_method_stats_t *src = &svc->m[m], *dst = &out->methods[m];
        dst->calls = __atomic_load_n(&src->calls, __ATOMIC_RELAXED);
        dst->errors = __atomic_load_n(&src->errors, __ATOMIC_RELAXED);
        dst->latency_sum_us =
            __atomic_load_n(&src->latency_sum_us, __ATOMIC_RELAXED);
        for (int b = 0; b < KVD_SERVICE_LATENCY_BUCKETS; b++) {
            dst->latency_buckets[b] =
                __atomic_load_n(&src->latency_buckets[b], __ATOMIC_RELAXED);
        }
    }
    for (int k = 0; k < KVD_SERVICE_ERROR_KINDS; k++) {
        out->errors_by_status[k] =
            __atomic_load_n(&svc->errors_by_status[k], __ATOMIC_RELAXED);
    }
    out->leases_expired =
        __atomic_load_n(&svc->leases_expired, __ATOMIC_RELAXED);
    out->leases_refused =
        __atomic_load_n(&svc->leases_refused, __ATOMIC_RELAXED);
    out->reservations_expired =
        __atomic_load_n(&svc->resvs_expired, __ATOMIC_RELAXED);
    out->commit_checksum_errors =
        __atomic_load_n(&svc->checksum_errors, __ATOMIC_RELAXED);
    out->uptime_ms = (kvd_time_now_ns() - svc->started_ns) / 1000000u;
    pthread_mutex_lock(&svc->mu);
    out->leases = svc->n_leases;
    out->leased_blocks = svc->n_leased_blocks;
    out->reservations = svc->n_resvs;
    out->leases_quarantined = svc->n_q_leases;
    out->reservations_quarantined = svc->n_q_resvs;
    out->quarantined_bytes = svc->q_bytes;
    out->sessions = svc->n_sessions;
    pthread_mutex_unlock(&svc->mu);
}
