/*
 * Cluster membership through etcd (cluster/membership.h): one thread
 * registers, keeps the lease alive, watches the nodes' prefix and keeps
 * the view; every etcd failure turns into a stale view and a retry.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster/etcd_int.h"
#include "cluster/membership.h"
#include "common/log_int.h"
#include "common/time_int.h"

#define MS_BACKOFF_MIN_MS 100
#define MS_BACKOFF_MAX_MS 5000
#define MS_WATCH_WAIT_MS 200

struct kvd_membership {
    kvd_membership_config_t cfg;
    kvd_member_t self;
    char cluster[101];
    char prefix[sizeof "/kvdepot//nodes/" + 100];
    char key[sizeof "/kvdepot//nodes/" + 100 + KVD_PROTO_MAX_NODE_ID_BYTES];
    uint8_t *value; /* self, packed */
    size_t value_len;
    kvd_etcd_t *etcd;
    pthread_t thread;

    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t cv;
    bool stopping;
    kvd_member_t *nodes; /* sorted by node_id */
    size_t n_nodes;
    kvd_membership_stats_t stats;
};

/* ---- the view (mu held) ------------------------------------------------- */

static size_t view_find(const kvd_membership_t *m, const char *id, bool *found)
{
    size_t lo = 0, hi = m->n_nodes;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(m->nodes[mid].node_id, id);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    *found = false;
    return lo;
}

static void view_put(kvd_membership_t *m, const kvd_member_t *node)
{
    bool found;
    size_t i = view_find(m, node->node_id, &found);
    if (!found) {
        if (m->n_nodes == KVD_MEMBERSHIP_MAX_NODES) {
            m->stats.ignored++;
            return;
        }
        memmove(&m->nodes[i + 1], &m->nodes[i],
                (m->n_nodes - i) * sizeof *m->nodes);
        m->n_nodes++;
    }
    m->nodes[i] = *node;
    m->stats.generation++;
}

static void view_remove(kvd_membership_t *m, const char *id)
{
    bool found;
    size_t i = view_find(m, id, &found);
    if (found) {
        memmove(&m->nodes[i], &m->nodes[i + 1],
                (m->n_nodes - i - 1) * sizeof *m->nodes);
        m->n_nodes--;
        m->stats.generation++;
    }
}

/* ---- decoding ----------------------------------------------------------- */

/* The node id a key names ("<prefix><id>"), or NULL. */
static const char *key_node_id(const kvd_membership_t *m, const char *key)
{
    size_t n = strlen(m->prefix);
    if (strncmp(key, m->prefix, n) != 0 || key[n] == '\0' ||
        strlen(key + n) > KVD_PROTO_MAX_NODE_ID_BYTES ||
        strchr(key + n, '/') != NULL) {
        return NULL;
    }
    return key + n;
}

/* A registration as a member: the value decodes and validates as a
 * NodeInfo whose node_id is the key's. */
static bool decode_member(kvd_membership_t *m, const kvd_etcd_kv_t *kv,
                          kvd_member_t *out)
{
    const char *id = key_node_id(m, kv->key);
    kvd_pb_node_info_t *info = NULL;
    char reason[KVD_PROTO_REASON_MAX];
    if (id == NULL ||
        kvd_proto_node_info_unpack(kv->value, kv->value_len, &info, reason,
                                   sizeof reason) != KVD_OK) {
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 10000,
                            "membership: ignored %s: %s", kv->key,
                            id == NULL ? "not a node key" : reason);
        return false;
    }
    bool ok = strcmp(info->node_id, id) == 0;
    if (ok) {
        memset(out, 0, sizeof *out);
        snprintf(out->node_id, sizeof out->node_id, "%s", info->node_id);
        snprintf(out->grpc_address, sizeof out->grpc_address, "%s",
                 info->grpc_address);
        if (info->ucx_address.len > 0) {
            memcpy(out->ucx_address, info->ucx_address.data,
                   info->ucx_address.len);
        }
        out->ucx_address_len = info->ucx_address.len;
        out->capacity_bytes = info->capacity_bytes;
        snprintf(out->version, sizeof out->version, "%s", info->version);
        out->protocol_revision = info->protocol_revision;
    } else {
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 10000,
                            "membership: ignored %s: it says node %s", kv->key,
                            info->node_id);
    }
    kvd_proto_node_info_free(info);
    return ok;
}

typedef struct listing {
    kvd_membership_t *m;
    kvd_member_t *nodes;
    size_t n;
    uint64_t ignored;
} listing_t;

static kvd_status_t list_one(void *ctx, const kvd_etcd_kv_t *kv)
{
    listing_t *l = ctx;
    if (l->n == KVD_MEMBERSHIP_MAX_NODES ||
        !decode_member(l->m, kv, &l->nodes[l->n])) {
        l->ignored++;
        return KVD_OK;
    }
    l->n++; /* etcd returns keys in order: the array stays sorted */
    return KVD_OK;
}

static kvd_status_t watch_one(void *ctx, enum kvd_etcd_event_type type,
                              const kvd_etcd_kv_t *kv)
{
    kvd_membership_t *m = ctx;
    kvd_member_t node;
    pthread_mutex_lock(&m->mu);
    if (type == KVD_ETCD_DELETE) {
        const char *id = key_node_id(m, kv->key);
        if (id != NULL) {
            view_remove(m, id);
        }
    } else if (decode_member(m, kv, &node)) {
        view_put(m, &node);
    } else {
        m->stats.ignored++;
    }
    pthread_mutex_unlock(&m->mu);
    return KVD_OK;
}

/* ---- the thread --------------------------------------------------------- */

/* Sleeps `ms` unless stopped; true if stopping. */
static bool ms_sleep(kvd_membership_t *m, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&m->mu);
    while (!m->stopping && pthread_cond_timedwait(&m->cv, &m->mu, &ts) == 0) {
    }
    bool stopping = m->stopping;
    pthread_mutex_unlock(&m->mu);
    return stopping;
}

static bool ms_stopping(kvd_membership_t *m)
{
    pthread_mutex_lock(&m->mu);
    bool s = m->stopping;
    pthread_mutex_unlock(&m->mu);
    return s;
}

static void ms_set_stale(kvd_membership_t *m, bool stale, bool registered)
{
    pthread_mutex_lock(&m->mu);
    m->stats.stale = stale;
    m->stats.registered = registered;
    pthread_mutex_unlock(&m->mu);
}

/* Registers under a new lease, reads the view and opens the watch. */
static kvd_status_t ms_register(kvd_membership_t *m, int64_t *lease,
                                kvd_etcd_watch_t **watch)
{
    int64_t ttl = 0, rev = 0;
    kvd_status_t s =
        kvd_etcd_lease_grant(m->etcd, m->cfg.lease_ttl_s, lease, &ttl);
    if (s == KVD_OK) {
        s = kvd_etcd_put(m->etcd, m->key, m->value, m->value_len, *lease);
    }
    listing_t l = {.m = m};
    if (s == KVD_OK) {
        l.nodes = calloc(KVD_MEMBERSHIP_MAX_NODES, sizeof *l.nodes);
        s = l.nodes != NULL
                ? kvd_etcd_get_prefix(m->etcd, m->prefix, list_one, &l, &rev)
                : KVD_ERR_NOMEM;
    }
    if (s == KVD_OK) {
        s = kvd_etcd_watch_open(m->etcd, m->prefix, rev + 1, watch);
    }
    if (s == KVD_OK) {
        pthread_mutex_lock(&m->mu);
        memcpy(m->nodes, l.nodes, l.n * sizeof *l.nodes);
        m->n_nodes = l.n;
        m->stats.ignored += l.ignored;
        m->stats.generation++;
        m->stats.reconnects++;
        m->stats.stale = false;
        m->stats.registered = true;
        pthread_mutex_unlock(&m->mu);
        KVD_LOG_INFO("membership: %s registered in cluster %s (lease %lld, "
                     "%zu nodes)",
                     m->self.node_id, m->cluster, (long long)*lease, l.n);
    } else if (*lease != 0) {
        (void)kvd_etcd_lease_revoke(m->etcd, *lease);
        *lease = 0;
    }
    free(l.nodes);
    return s;
}

static void *ms_main(void *arg)
{
    kvd_membership_t *m = arg;
    int backoff = MS_BACKOFF_MIN_MS;
    int64_t lease = 0;
    kvd_etcd_watch_t *watch = NULL;
    uint64_t keepalive_every_ms = (uint64_t)m->cfg.lease_ttl_s * 1000 / 3;
    if (keepalive_every_ms == 0) {
        keepalive_every_ms = 1;
    }
    uint64_t next_keepalive = 0;
    while (!ms_stopping(m)) {
        kvd_status_t s = KVD_OK;
        if (watch == NULL) {
            lease = 0;
            s = ms_register(m, &lease, &watch);
            next_keepalive = kvd_time_now_ms() + keepalive_every_ms;
        }
        if (s == KVD_OK) {
            uint64_t now = kvd_time_now_ms();
            int wait = next_keepalive > now ? (int)(next_keepalive - now) : 0;
            s = kvd_etcd_watch_next(
                watch, wait < MS_WATCH_WAIT_MS ? wait : MS_WATCH_WAIT_MS,
                watch_one, m);
            if (s == KVD_ERR_TIMEOUT) {
                s = KVD_OK;
            }
        }
        if (s == KVD_OK && kvd_time_now_ms() >= next_keepalive) {
            s = kvd_etcd_lease_keepalive(m->etcd, lease, NULL);
            next_keepalive = kvd_time_now_ms() + keepalive_every_ms;
            if (s == KVD_ERR_NOT_FOUND) {
                /* The lease ran out (a long pause, or etcd lost it): the
                 * key is gone; register again at once. */
                KVD_LOG_WARN("membership: lease %lld expired; registering "
                             "again",
                             (long long)lease);
                kvd_etcd_watch_close(watch);
                watch = NULL;
                ms_set_stale(m, false, false);
                continue;
            }
        }
        if (s == KVD_OK) {
            backoff = MS_BACKOFF_MIN_MS;
            continue;
        }
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 10000,
                            "membership: etcd %s: %s; view stale, retrying "
                            "in %d ms",
                            m->cfg.etcd_endpoint, kvd_status_str(s), backoff);
        kvd_etcd_watch_close(watch);
        watch = NULL;
        ms_set_stale(m, true, false);
        if (ms_sleep(m, backoff)) {
            break;
        }
        backoff =
            backoff * 2 > MS_BACKOFF_MAX_MS ? MS_BACKOFF_MAX_MS : backoff * 2;
    }
    kvd_etcd_watch_close(watch);
    if (lease != 0) {
        (void)kvd_etcd_lease_revoke(m->etcd, lease); /* leave at once */
    }
    return NULL;
}

/* ---- API ---------------------------------------------------------------- */

static bool name_ok(const char *s, size_t max)
{
    size_t n = s != NULL ? strlen(s) : 0;
    return n > 0 && n <= max &&
           strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                     "0123456789._-") == n;
}

kvd_status_t kvd_membership_start(const kvd_membership_config_t *cfg,
                                  kvd_membership_t **out)
{
    if (cfg == NULL || out == NULL || cfg->self == NULL ||
        cfg->etcd_endpoint == NULL || !name_ok(cfg->cluster, 100) ||
        !name_ok(cfg->self->node_id, KVD_PROTO_MAX_NODE_ID_BYTES) ||
        cfg->lease_ttl_s < 1 || cfg->timeout_ms < 1) {
        return KVD_ERR_INVALID;
    }
    kvd_membership_t *m = calloc(1, sizeof *m);
    kvd_member_t *nodes = calloc(KVD_MEMBERSHIP_MAX_NODES, sizeof *nodes);
    if (m == NULL || nodes == NULL) {
        free(m);
        free(nodes);
        return KVD_ERR_NOMEM;
    }
    m->cfg = *cfg;
    m->self = *cfg->self;
    m->cfg.self = &m->self;
    m->nodes = nodes;
    snprintf(m->cluster, sizeof m->cluster, "%s", cfg->cluster);
    snprintf(m->prefix, sizeof m->prefix, "/kvdepot/%s/nodes/", m->cluster);
    snprintf(m->key, sizeof m->key, "%s%s", m->prefix, m->self.node_id);
    m->stats.stale = true;

    kvd_pb_node_info_t info = KVDEPOT__V1__NODE_INFO__INIT;
    info.node_id = m->self.node_id;
    info.grpc_address = m->self.grpc_address;
    info.ucx_address.data = m->self.ucx_address;
    info.ucx_address.len = m->self.ucx_address_len;
    info.capacity_bytes = m->self.capacity_bytes;
    info.version = m->self.version;
    info.protocol_revision = m->self.protocol_revision;
    char reason[KVD_PROTO_REASON_MAX];
    kvd_status_t s = m->self.ucx_address_len <= sizeof m->self.ucx_address
                         ? kvd_proto_pack_alloc(
                               KVD_PROTO_MSG_NODE_INFO, &info.base, &m->value,
                               &m->value_len, reason, sizeof reason)
                         : KVD_ERR_INVALID;
    if (s == KVD_OK && m->value_len > KVD_ETCD_VALUE_MAX) {
        s = KVD_ERR_RANGE;
    }
    if (s == KVD_OK) {
        kvd_etcd_tls_t tls = {.ca_pem = cfg->etcd_tls_ca,
                              .cert_pem = cfg->etcd_tls_cert,
                              .key_pem = cfg->etcd_tls_key};
        s = kvd_etcd_open_tls(cfg->etcd_endpoint, &tls, cfg->timeout_ms,
                              &m->etcd);
        /* The client keeps copies; the caller's texts may go. */
        m->cfg.etcd_tls_ca = m->cfg.etcd_tls_cert = m->cfg.etcd_tls_key = NULL;
    }
    if (s != KVD_OK) {
        free(m->value);
        free(nodes);
        free(m);
        return s;
    }
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    int rc = pthread_create(&m->thread, NULL, ms_main, m);
    if (rc != 0) {
        kvd_etcd_close(m->etcd);
        pthread_cond_destroy(&m->cv);
        pthread_mutex_destroy(&m->mu);
        free(m->value);
        free(nodes);
        free(m);
        return kvd_status_from_errno(rc);
    }
    *out = m;
    return KVD_OK;
}

void kvd_membership_stop(kvd_membership_t *m)
{
    if (m == NULL) {
        return;
    }
    pthread_mutex_lock(&m->mu);
    m->stopping = true;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->thread, NULL);
    kvd_etcd_close(m->etcd);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    free(m->value);
    free(m->nodes);
    free(m);
}

size_t kvd_membership_view(kvd_membership_t *m, kvd_member_t *out, size_t max,
                           kvd_membership_stats_t *stats_out)
{
    if (m == NULL) {
        return 0;
    }
    pthread_mutex_lock(&m->mu);
    size_t n = m->n_nodes;
    if (out != NULL) {
        memcpy(out, m->nodes, (n < max ? n : max) * sizeof *out);
    }
    if (stats_out != NULL) {
        *stats_out = m->stats;
        stats_out->num_nodes = n;
    }
    pthread_mutex_unlock(&m->mu);
    return n;
}
