/*
 * kvdepotd's assembly (server_int.h): the store, the service, the gRPC
 * listeners, the shared-memory hand-off listener, the cluster and metrics,
 * started in that order by kvd_server_open and stopped in reverse by
 * kvd_server_stop; the accessors /metrics and /readyz read. The settings
 * are resolved by server_config.c, the hand-off served by
 * server_handoff.c.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "common/time_int.h"
#include "proto/kvd_proto.h"
#include "store/engine.h"
#include "cluster/membership.h"
#include "cluster/remote.h"
#include "server/srv_int.h"

static void server_free(kvd_server_t *srv)
{
    __atomic_store_n(&srv->ready, false, __ATOMIC_RELEASE);
    __atomic_store_n(&srv->stopping, true, __ATOMIC_RELEASE);
    kvd_metrics_stop(srv->metrics);
    kvd_remote_leave(srv->remote); /* leave the cluster first */
    kvd_rpc_server_stop(srv->rpc, (int)srv->cfg.shutdown_grace_ms);
    pthread_rwlock_wrlock(&srv->remote_lock);
    kvd_remote_t *remote = srv->remote;
    __atomic_store_n(&srv->remote, NULL, __ATOMIC_RELEASE);
    pthread_rwlock_unlock(&srv->remote_lock);
    kvd_remote_stop(remote); /* no call can use it now */
    if (srv->handoff_started) {
        pthread_join(srv->handoff_thread, NULL);
    }
    if (srv->handoff_fd >= 0) {
        close(srv->handoff_fd);
        (void)unlink(srv->handoff_path);
    }
    srv_handoff_conns_close(srv);
    kvd_service_destroy(srv->svc);
    /* The store's close writes the arena's objects to NVMe, within
     * store.stop_flush_timeout, and logs how many it wrote and left. */
    kvd_store_close(srv->store);
    for (int i = 0; i < 3; i++) {
        free(srv->tls_pem[i]);
        if (srv->etcd_pem[i] != NULL) {
            OPENSSL_cleanse(srv->etcd_pem[i], strlen(srv->etcd_pem[i]));
        }
        free(srv->etcd_pem[i]);
    }
    free(srv->sessions);
    pthread_mutex_destroy(&srv->sess_mu);
    pthread_mutex_destroy(&srv->ns_mu);
    pthread_rwlock_destroy(&srv->remote_lock);
    if (srv->tenancy != NULL) {
        OPENSSL_cleanse(srv->tenancy, sizeof *srv->tenancy);
        free(srv->tenancy);
    }
    for (size_t i = 0; i < srv->n_config_entries; i++) {
        free((char *)srv->config_entries[i].key);
        free((char *)srv->config_entries[i].value);
        free((char *)srv->config_entries[i].source);
    }
    free(srv->config_entries);
    OPENSSL_cleanse(srv->cfg.token, sizeof srv->cfg.token);
    OPENSSL_cleanse(srv->cfg.cluster_token, sizeof srv->cfg.cluster_token);
    free(srv);
}

/* Registers this daemon in its cluster (cluster.etcd): node id, the gRPC
 * address peers use, the capacity it offers. The membership thread does
 * the rest; an unreachable etcd only makes the view stale. */
static kvd_status_t server_join_cluster(kvd_server_t *srv, char *err,
                                        size_t err_len)
{
    kvd_member_t *self = calloc(1, sizeof *self);
    if (self == NULL) {
        return KVD_ERR_NOMEM;
    }
    snprintf(self->node_id, sizeof self->node_id, "%.*s",
             KVD_PROTO_MAX_NODE_ID_BYTES, srv->cfg.node_id);
    if (srv->cfg.cluster_advertise[0] != '\0') {
        snprintf(self->grpc_address, sizeof self->grpc_address, "%s",
                 srv->cfg.cluster_advertise);
    } else if (srv->cfg.tcp_address[0] != '\0') {
        const char *colon = strrchr(srv->cfg.tcp_address, ':');
        int host_len = colon != NULL ? (int)(colon - srv->cfg.tcp_address)
                                     : (int)strlen(srv->cfg.tcp_address);
        snprintf(self->grpc_address, sizeof self->grpc_address, "%.*s:%d",
                 host_len, srv->cfg.tcp_address, srv->tcp_port);
    }
    kvd_store_stats_t st;
    memset(&st, 0, sizeof st);
    (void)kvd_store_stats(srv->store, &st);
    self->capacity_bytes = st.host.capacity_bytes + st.disk.capacity_bytes;
    snprintf(self->version, sizeof self->version, "%s", kvd_version());
    self->protocol_revision = KVD_PROTO_REVISION;
    kvd_remote_config_t rc = {
        .store = srv->store,
        .etcd_endpoint = srv->cfg.cluster_etcd,
        .etcd_tls_ca = srv->etcd_pem[0],
        .etcd_tls_cert = srv->etcd_pem[1],
        .etcd_tls_key = srv->etcd_pem[2],
        .cluster = srv->cfg.cluster_name,
        .self = self,
        .lease_ttl_s = (int)((srv->cfg.cluster_lease_ttl_ms + 999) / 1000),
        .token = srv->cfg.cluster_token,
        .replicas = (size_t)srv->cfg.cluster_replicas,
        .timeout_ms = srv->cfg.cluster_timeout_ms,
        .queue = (size_t)srv->cfg.cluster_queue,
        .part_bytes = (uint32_t)srv->cfg.cluster_fetch_part_bytes,
    };
    kvd_remote_t *remote = NULL;
    kvd_status_t s = kvd_remote_start(&rc, &remote, err, err_len);
    free(self);
    if (s == KVD_OK) {
        __atomic_store_n(&srv->remote, remote, __ATOMIC_RELEASE);
    }
    return s;
}

/* The service's cluster hooks: no-ops until the daemon has joined. */
static size_t server_miss(void *ctx, const kvd_namespace_t *ns,
                          const kvd_block_hash_t *hashes, size_t n,
                          const char *source_node, uint32_t tenant)
{
    kvd_server_t *srv = ctx;
    kvd_remote_t *r = __atomic_load_n(&srv->remote, __ATOMIC_ACQUIRE);
    return r != NULL ? kvd_remote_fill(r, ns, hashes, n, source_node, tenant)
                     : 0;
}

/* A store get the data plane submitted (an object on NVMe another node
 * asked for) completed; once the cluster has stopped, its lease goes back
 * here. */
static void server_foreign_completion(void *ctx,
                                      const kvd_store_completion_t *c)
{
    kvd_server_t *srv = ctx;
    pthread_rwlock_rdlock(&srv->remote_lock);
    kvd_remote_t *r = __atomic_load_n(&srv->remote, __ATOMIC_ACQUIRE);
    if (r != NULL) {
        kvd_remote_store_completion(r, c);
    } else {
        kvd_peer_forget_completion(srv->store, c);
    }
    pthread_rwlock_unlock(&srv->remote_lock);
}

static size_t server_members(void *ctx, kvd_member_t *out, size_t max,
                             kvd_membership_stats_t *stats_out)
{
    kvd_server_t *srv = ctx;
    kvd_remote_t *r = __atomic_load_n(&srv->remote, __ATOMIC_ACQUIRE);
    return kvd_remote_members(r, out, max, stats_out);
}

static void server_saved(void *ctx, const kvd_namespace_t *ns,
                         const kvd_block_hash_t *hashes, size_t n,
                         uint64_t object_bytes, uint32_t tenant)
{
    kvd_server_t *srv = ctx;
    kvd_remote_t *r = __atomic_load_n(&srv->remote, __ATOMIC_ACQUIRE);
    if (r != NULL) {
        kvd_remote_saved(r, ns, hashes, n, object_bytes, tenant);
    }
}

/* A server with nothing started (server_free undoes it); NULL on OOM. */
static kvd_server_t *server_new(void)
{
    kvd_server_t *srv = calloc(1, sizeof *srv);
    if (srv == NULL) {
        return NULL;
    }
    srv->handoff_fd = -1;
    pthread_mutex_init(&srv->sess_mu, NULL);
    pthread_mutex_init(&srv->ns_mu, NULL);
    pthread_rwlock_init(&srv->remote_lock, NULL);
    srv->sessions = calloc(SRV_SESSIONS_MAX, sizeof *srv->sessions);
    if (srv->sessions == NULL) {
        pthread_mutex_destroy(&srv->sess_mu);
        pthread_mutex_destroy(&srv->ns_mu);
        pthread_rwlock_destroy(&srv->remote_lock);
        free(srv);
        return NULL;
    }
    return srv;
}

/* The TCP credentials bound to tenants, as rpc.c takes them, and this
 * daemon's instance id. */
static void server_identity(kvd_server_t *srv)
{
    for (size_t i = 0; i < srv->tenancy->n_tokens; i++) {
        srv->rpc_tokens[i].secret = srv->tenancy->tokens[i].secret;
        srv->rpc_tokens[i].tenant = srv->tenancy->tokens[i].tenant;
    }
    for (size_t i = 0; i < srv->tenancy->n_cns; i++) {
        srv->rpc_cns[i].secret = srv->tenancy->cns[i].secret;
        srv->rpc_cns[i].tenant = srv->tenancy->cns[i].tenant;
    }
    if (getrandom(&srv->instance_id, sizeof srv->instance_id, 0) !=
            (ssize_t)sizeof srv->instance_id ||
        srv->instance_id == 0) {
        srv->instance_id = (uint64_t)getpid() << 32 | (uint64_t)time(NULL);
    }
}

/* Opens the store with the tenants' own arenas (server.tenant_arenas) and
 * sets their quotas (server.tenant_quotas). */
static kvd_status_t server_open_store(kvd_server_t *srv,
                                      const kvd_config_t *config, char *err,
                                      size_t err_len)
{
    kvd_store_tenant_arena_t arenas[SRV_TENANTS_MAX];
    for (size_t i = 0; i < srv->tenancy->n_arenas; i++) {
        arenas[i] = (kvd_store_tenant_arena_t){
            .tenant = kvd_service_tenant_id(srv->tenancy->arenas[i].tenant),
            .bytes = srv->tenancy->arenas[i].bytes,
        };
    }
    /* The long step of a start: a large arena is touched page by page
     * (store.arena_prefault) and the index opened and checked; a
     * Type=notify unit shows this until READY=1. */
    kvd_server_notify_status("opening the store: preparing the arena "
                             "(touching its pages when prefaulted) and "
                             "opening the index");
    kvd_status_t s = kvd_store_open_partitioned(
        config, arenas, srv->tenancy->n_arenas, &srv->store, err, err_len);
    if (s != KVD_OK) {
        return s;
    }
    for (size_t i = 0; i < srv->tenancy->n_quotas; i++) {
        s = kvd_store_tenant_set_quota(
            srv->store, kvd_service_tenant_id(srv->tenancy->quotas[i].tenant),
            srv->tenancy->quotas[i].bytes);
        if (s != KVD_OK) {
            kvd_config_err(err, err_len, "server.tenant_quotas %s: %s",
                           srv->tenancy->quotas[i].tenant, kvd_status_str(s));
            return s;
        }
    }
    return KVD_OK;
}

/* server.max_reserved_bytes, 0 meaning a quarter of the arena. */
static uint64_t server_max_reserved(const kvd_server_t *srv)
{
    if (srv->cfg.max_reserved_bytes != 0) {
        return srv->cfg.max_reserved_bytes;
    }
    kvd_store_stats_t st;
    if (kvd_store_stats(srv->store, &st) != KVD_OK ||
        st.host.capacity_bytes < 4) {
        return 0;
    }
    return st.host.capacity_bytes / 4;
}

/* Adds `name` to srv->tenant_names unless it is there already. */
static void server_name_add(kvd_server_t *srv, const char *name)
{
    size_t max = sizeof srv->tenant_names / sizeof srv->tenant_names[0];
    for (size_t i = 0; i < srv->n_tenant_names; i++) {
        if (strcmp(srv->tenant_names[i], name) == 0) {
            return;
        }
    }
    if (name[0] != '\0' && srv->n_tenant_names < max) {
        srv->tenant_names[srv->n_tenant_names++] = name;
    }
}

/* Every tenant name the settings give, once each. */
static void server_collect_names(kvd_server_t *srv)
{
    const srv_tenancy_t *tn = srv->tenancy;
    srv->n_tenant_names = 0;
    for (size_t i = 0; i < tn->n_uids; i++) {
        server_name_add(srv, tn->uids[i].name);
    }
    for (size_t i = 0; i < tn->n_tokens; i++) {
        server_name_add(srv, tn->tokens[i].tenant);
    }
    for (size_t i = 0; i < tn->n_cns; i++) {
        server_name_add(srv, tn->cns[i].tenant);
    }
    for (size_t i = 0; i < tn->n_quotas; i++) {
        server_name_add(srv, tn->quotas[i].tenant);
    }
    for (size_t i = 0; i < tn->n_arenas; i++) {
        server_name_add(srv, tn->arenas[i].tenant);
    }
}

static kvd_status_t server_start_service(kvd_server_t *srv, char *err,
                                         size_t err_len)
{
    server_collect_names(srv);
    kvd_service_config_t scfg = {
        .store = srv->store,
        .node_id = srv->cfg.node_id,
        .lease_ttl_ms = (uint32_t)srv->cfg.lease_ttl_ms,
        .reservation_ttl_ms = (uint32_t)srv->cfg.reservation_ttl_ms,
        .reservation_ttl_max_ms = (uint32_t)srv->cfg.reservation_ttl_max_ms,
        .max_reserved_bytes = server_max_reserved(srv),
        .flush_timeout_ms = (uint32_t)srv->cfg.flush_timeout_ms,
        .verify_commits = srv->cfg.verify_commits,
        .tenant_max_leased_bytes = srv->cfg.tenant_max_leased_bytes,
        .tick_ms = (uint32_t)srv->cfg.tick_ms,
        .config_entries = srv->config_entries,
        .n_config_entries = srv->n_config_entries,
        .tenant_names = srv->tenant_names,
        .n_tenant_names = srv->n_tenant_names,
    };
    if (srv->cfg.cluster_etcd[0] != '\0') {
        scfg.miss = server_miss;
        scfg.saved = server_saved;
        scfg.foreign_completion = server_foreign_completion;
        scfg.members = server_members;
        scfg.cluster_ctx = srv;
    }
    kvd_status_t s = kvd_service_create(&scfg, &srv->svc);
    if (s != KVD_OK) {
        kvd_config_err(err, err_len, "service: %s", kvd_status_str(s));
    }
    return s;
}

static kvd_status_t server_start_rpc(kvd_server_t *srv, unsigned mode,
                                     char *err, size_t err_len)
{
    kvd_rpc_config_t rcfg = {
        .svc = srv->svc,
        .unix_path = srv->cfg.unix_socket,
        .unix_mode = mode,
        .tcp_address = srv->cfg.tcp_address,
        .token = srv->cfg.token,
        .tls_cert_pem = srv->tls_pem[0],
        .tls_key_pem = srv->tls_pem[1],
        .tls_ca_pem = srv->tls_pem[2],
        .threads = (int)srv->cfg.threads,
        .max_message_bytes = (int)srv->cfg.max_message_bytes,
        .max_streams = (int)srv->cfg.max_streams,
        .handshake_timeout_ms = (int)srv->cfg.handshake_timeout_ms,
        .instance_id = srv->instance_id,
        .session = srv_session_tenant,
        .session_ctx = srv,
        .sessions_required = srv->tenancy->n_uids > 0,
        .tenant_tokens = srv->rpc_tokens,
        .n_tenant_tokens = srv->tenancy->n_tokens,
        .tenant_cns = srv->rpc_cns,
        .n_tenant_cns = srv->tenancy->n_cns,
    };
    return kvd_rpc_server_start(&rcfg, &srv->rpc, &srv->tcp_port, err, err_len);
}

/* The listeners after the service: gRPC, the hand-off socket, the
 * cluster, metrics. */
static kvd_status_t server_start_listeners(kvd_server_t *srv, unsigned mode,
                                           char *err, size_t err_len)
{
    kvd_status_t s = server_start_rpc(srv, mode, err, err_len);
    if (s != KVD_OK) {
        return s;
    }
    if (srv->cfg.unix_socket[0] != '\0') {
        s = srv_handoff_open(srv, mode, err, err_len);
        if (s != KVD_OK) {
            return s;
        }
    }
    if (srv->cfg.cluster_etcd[0] != '\0') {
        s = server_join_cluster(srv, err, err_len);
        if (s != KVD_OK) {
            return s;
        }
    }
    if (srv->cfg.metrics_address[0] != '\0') {
        s = kvd_metrics_start(srv, srv->cfg.metrics_address,
                              (int)srv->cfg.metrics_max_connections,
                              &srv->metrics, &srv->metrics_port, err, err_len);
    }
    return s;
}

kvd_status_t kvd_server_open(const kvd_config_t *config,
                             kvd_server_t **server_out, char *err,
                             size_t err_len)
{
    if (server_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_server_t *srv = server_new();
    if (srv == NULL) {
        return KVD_ERR_NOMEM;
    }
    unsigned mode = 0;
    srv->tenancy = calloc(1, sizeof *srv->tenancy);
    kvd_status_t s = srv->tenancy == NULL
                         ? KVD_ERR_NOMEM
                         : srv_settings(config, &srv->cfg, &mode, srv->tenancy,
                                        err, err_len);
    if (s == KVD_OK) {
        s = srv_config_entries(srv, config);
    }
    if (s != KVD_OK) {
        goto err;
    }
    server_identity(srv);
    s = srv_store_settings(config, err, err_len);
    if (s == KVD_OK) {
        s = srv_tls_read(&srv->cfg, srv->tls_pem, err, err_len);
    }
    if (s == KVD_OK) {
        s = srv_etcd_tls_read(&srv->cfg, srv->etcd_pem, err, err_len);
    }
    if (s == KVD_OK) {
        /* Before the store: a bad address or path fails the start at
         * once, not after the arena has been touched. */
        s = srv_check_world(&srv->cfg, srv->tenancy, srv->tls_pem, err,
                            err_len);
    }
    if (s == KVD_OK) {
        s = server_open_store(srv, config, err, err_len);
    }
    if (s == KVD_OK) {
        s = server_start_service(srv, err, err_len);
    }
    if (s == KVD_OK) {
        kvd_server_notify_status("starting the listeners");
        s = server_start_listeners(srv, mode, err, err_len);
    }
    if (s != KVD_OK) {
        goto err;
    }
    __atomic_store_n(&srv->ready, true, __ATOMIC_RELEASE);
    KVD_LOG_INFO("kvdepotd: ready (node %s, instance %016llx)",
                 srv->cfg.node_id, (unsigned long long)srv->instance_id);
    *server_out = srv;
    return KVD_OK;
err:
    server_free(srv);
    return s;
}

bool kvd_server_cluster(kvd_server_t *server, struct kvd_membership_stats *out,
                        struct kvd_remote_stats *remote_out)
{
    kvd_remote_t *r = server != NULL
                          ? __atomic_load_n(&server->remote, __ATOMIC_ACQUIRE)
                          : NULL;
    kvd_membership_stats_t ms;
    if (!kvd_remote_view_stats(r, out != NULL ? out : &ms)) {
        return false;
    }
    if (remote_out != NULL) {
        kvd_remote_stats(r, remote_out);
    }
    return true;
}

int kvd_server_tcp_port(const kvd_server_t *server)
{
    return server != NULL ? server->tcp_port : 0;
}

int kvd_server_metrics_port(const kvd_server_t *server)
{
    return server != NULL ? server->metrics_port : 0;
}

bool kvd_server_idle_expired(const kvd_server_t *server)
{
    return server != NULL &&
           __atomic_load_n(&server->idle_expired, __ATOMIC_ACQUIRE);
}

bool kvd_server_alive(kvd_server_t *server, uint64_t max_age_ms)
{
    uint64_t beat = server != NULL ? kvd_service_heartbeat_ns(server->svc) : 0;
    uint64_t now = kvd_time_now_ns();
    return beat != 0 && (beat >= now || now - beat <= max_age_ms * 1000000u);
}

bool kvd_server_ready(const kvd_server_t *server)
{
    return server != NULL &&
           __atomic_load_n(&server->ready, __ATOMIC_ACQUIRE) &&
           !kvd_service_draining(server->svc);
}

void kvd_server_collect(kvd_server_t *server, kvd_store_stats_t *store_out,
                        kvd_service_stats_t *svc_out)
{
    memset(store_out, 0, sizeof *store_out);
    (void)kvd_store_stats(server->store, store_out);
    kvd_service_stats(server->svc, svc_out);
}

size_t kvd_server_arenas(kvd_server_t *server, kvd_server_arena_t *out,
                         size_t max)
{
    kvd_arena_part_stats_t parts[KVD_ARENA_PARTS_MAX + 1];
    size_t n = 0;
    if (kvd_store_arena_partitions(server->store, parts,
                                   KVD_ARENA_PARTS_MAX + 1, &n) != KVD_OK) {
        return 0;
    }
    size_t k = 0;
    for (size_t i = 0; i < n && k < max; i++, k++) {
        const char *name = i == 0 ? "main"
                           : i - 1 < server->tenancy->n_arenas
                               ? server->tenancy->arenas[i - 1].tenant
                               : "?";
        snprintf(out[k].name, sizeof out[k].name, "%s", name);
        out[k].bytes = parts[i].bytes_total;
        out[k].free_bytes = parts[i].chunks_total == 0
                                ? 0
                                : parts[i].bytes_total / parts[i].chunks_total *
                                      parts[i].chunks_free;
    }
    return k;
}

/* Adds `name` to out[0..*n) unless it is there already (or out is full). */
static void server_tenant_add(kvd_server_t *server, kvd_server_tenant_t *out,
                              size_t max, size_t *n, const char *name)
{
    for (size_t i = 0; i < *n; i++) {
        if (strcmp(out[i].name, name) == 0) {
            return;
        }
    }
    if (*n == max) {
        return;
    }
    kvd_server_tenant_t *t = &out[(*n)++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    (void)kvd_store_tenant_stats(server->store, kvd_service_tenant_id(name),
                                 &t->usage);
    kvd_service_tenant_lookups(server->svc, name, t->hits, t->misses);
    t->has_lookups = true;
}

size_t kvd_server_tenants(kvd_server_t *server, kvd_server_tenant_t *out,
                          size_t max)
{
    if (max == 0) {
        return 0;
    }
    size_t n = 1;
    memset(&out[0], 0, sizeof out[0]);
    snprintf(out[0].name, sizeof out[0].name, "(none)");
    (void)kvd_store_tenant_stats(server->store, 0, &out[0].usage);
    const srv_tenancy_t *tn = server->tenancy;
    for (size_t i = 0; i < tn->n_uids; i++) {
        server_tenant_add(server, out, max, &n, tn->uids[i].name);
    }
    for (size_t i = 0; i < tn->n_tokens; i++) {
        server_tenant_add(server, out, max, &n, tn->tokens[i].tenant);
    }
    for (size_t i = 0; i < tn->n_cns; i++) {
        server_tenant_add(server, out, max, &n, tn->cns[i].tenant);
    }
    for (size_t i = 0; i < tn->n_quotas; i++) {
        server_tenant_add(server, out, max, &n, tn->quotas[i].tenant);
    }
    for (size_t i = 0; i < tn->n_arenas; i++) {
        server_tenant_add(server, out, max, &n, tn->arenas[i].tenant);
    }
    return n;
}

#define SRV_NS_REFRESH_MS 30000u

size_t kvd_server_namespaces(kvd_server_t *server, kvd_service_ns_usage_t *out,
                             size_t *n_all_out, uint64_t *age_ms_out)
{
    pthread_mutex_lock(&server->ns_mu);
    uint64_t now = kvd_time_now_ns();
    if (server->ns_at_ns == 0 ||
        now - server->ns_at_ns >= SRV_NS_REFRESH_MS * UINT64_C(1000000)) {
        size_t n = 0, all = 0;
        if (kvd_service_namespace_usage(server->svc, server->ns_top,
                                        KVD_SERVER_NS_TOP, &n,
                                        &all) == KVD_OK) {
            server->ns_n = n;
            server->ns_all = all;
            server->ns_at_ns = now;
        }
    }
    size_t n = server->ns_n;
    memcpy(out, server->ns_top, n * sizeof *out);
    *n_all_out = server->ns_all;
    *age_ms_out =
        server->ns_at_ns != 0 ? (now - server->ns_at_ns) / 1000000u : 0;
    pthread_mutex_unlock(&server->ns_mu);
    return n;
}

kvd_arena_backing_t kvd_server_arena_backing(kvd_server_t *server)
{
    kvd_arena_backing_t b = KVD_ARENA_BACKING_PLAIN;
    (void)kvd_store_arena_backing(server->store, &b);
    return b;
}

void kvd_server_stop(kvd_server_t *server)
{
    if (server == NULL) {
        return;
    }
    KVD_LOG_INFO("kvdepotd: stopping");
    server_free(server);
}
