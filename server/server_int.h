/*
 * kvdepotd as a library: the settings (`server.*`), and one call that opens
 * the embedded store and starts everything that serves it — the gRPC
 * service (rpc.c), the shared-memory hand-off socket (server_handoff.c),
 * the metrics endpoint (metrics.c) — and one that stops it gracefully.
 * main.c is the command line around it; tests start it in-process or as a
 * process.
 *
 * Threading: open and stop from one thread; everything else is internal.
 */
#ifndef KVD_STORE_SERVER_SERVER_INT_H
#define KVD_STORE_SERVER_SERVER_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kvdepot/common.h"
#include "kvdepot/store.h"
#include "store/arena.h"
#include "server/service_int.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvd_server_settings {
    char unix_socket[KVD_CONFIG_STRING_MAX];
    char unix_mode[KVD_CONFIG_STRING_MAX];
    char tcp_address[KVD_CONFIG_STRING_MAX];
    char token[KVD_CONFIG_STRING_MAX];
    char token_file[KVD_CONFIG_STRING_MAX];
    char tls_cert[KVD_CONFIG_STRING_MAX];
    char tls_key[KVD_CONFIG_STRING_MAX];
    char tls_client_ca[KVD_CONFIG_STRING_MAX];
    char metrics_address[KVD_CONFIG_STRING_MAX];
    int64_t metrics_max_connections; /* HTTP connections held at once */
    char node_id[KVD_CONFIG_STRING_MAX];
    char tenants[KVD_CONFIG_STRING_MAX];
    char token_tenants[KVD_CONFIG_STRING_MAX];
    char tls_tenants[KVD_CONFIG_STRING_MAX];
    char tenant_quotas[KVD_CONFIG_STRING_MAX];
    char tenant_arenas[KVD_CONFIG_STRING_MAX];
    char tenant_arena_size[KVD_CONFIG_STRING_MAX];
    char cluster_etcd[KVD_CONFIG_STRING_MAX];
    char cluster_etcd_tls_ca[KVD_CONFIG_STRING_MAX];
    char cluster_etcd_tls_cert[KVD_CONFIG_STRING_MAX];
    char cluster_etcd_tls_key[KVD_CONFIG_STRING_MAX];
    char cluster_name[KVD_CONFIG_STRING_MAX];
    char cluster_advertise[KVD_CONFIG_STRING_MAX];
    uint64_t cluster_lease_ttl_ms;
    char cluster_token_file[KVD_CONFIG_STRING_MAX];
    char cluster_token[KVD_CONFIG_STRING_MAX]; /* read from the file */
    int64_t cluster_replicas;
    uint64_t cluster_timeout_ms;
    int64_t cluster_queue;
    int64_t cluster_fetch_part_bytes;
    int64_t threads;
    uint64_t max_message_bytes;
    int64_t max_streams;
    uint64_t handshake_timeout_ms; /* TCP connection's handshake */
    uint64_t lease_ttl_ms;
    uint64_t tenant_max_leased_bytes;
    int64_t max_sessions_per_uid; /* live hand-off sessions of one uid */
    uint64_t reservation_ttl_ms;
    uint64_t reservation_ttl_max_ms;
    uint64_t max_reserved_bytes;
    uint64_t flush_timeout_ms;
    uint64_t shutdown_grace_ms;
    uint64_t tick_ms;
    uint64_t exit_when_idle_ms; /* 0: never */
    bool verify_commits;
} kvd_server_settings_t;

typedef struct kvd_server kvd_server_t;

/* Writes every `server.*` and `store.*` setting, resolved from `config`
 * (may be NULL), with its source and doc. */
kvd_status_t kvd_server_print_config(const kvd_config_t *config, FILE *out);

/* Checks every setting kvd_server_open would use (server.* and store.*;
 * store.mode must be embedded) as the start does before it opens the
 * store: values, tenants, token and TLS files readable, the listeners'
 * addresses parse (server.tcp_address, server.metrics_address), a
 * listener at all and authenticated TCP, the unix socket's directory and
 * store.disk_path writable. Starts, binds and creates nothing. The first
 * error's key and reason go to `err`. */
kvd_status_t kvd_server_check_config(const kvd_config_t *config, char *err,
                                     size_t err_len);

/* The same checks, reporting every independent error (one message each:
 * the server.* settings, the listeners, the directories, the store.*
 * settings) to `report`, called on this thread; returns how many (0: the
 * start would accept this configuration, as far as it can be told without
 * binding). Without `paths` the directories are not looked at (for
 * --print-config, which may check a file away from the host it is for). */
typedef void (*kvd_server_report_fn)(void *ctx, const char *msg);
size_t kvd_server_check_config_each(const kvd_config_t *config, bool paths,
                                    kvd_server_report_fn report, void *ctx);

/* Whether `key` is a setting kvdepotd knows (server.*, cluster.*, store.*
 * and the `n_extra` fields of `extra`, the command line's own); when not,
 * *closest_out is the known key nearest to it by edit distance (NULL when
 * none is near), one of the tables' static names. */
bool kvd_server_config_known(const char *key, const kvd_config_field_t *extra,
                             size_t n_extra, const char **closest_out);

/*
 * Resolves the settings, opens the store (store.mode must be embedded),
 * starts the service, the gRPC listeners, the hand-off socket and the
 * metrics endpoint. Errors name the setting and the reason in `err`;
 * nothing is left running.
 */
kvd_status_t kvd_server_open(const kvd_config_t *config,
                             kvd_server_t **server_out, char *err,
                             size_t err_len);

/* Bound ports (0 when that listener is off). */
int kvd_server_tcp_port(const kvd_server_t *server);
int kvd_server_metrics_port(const kvd_server_t *server);

/* Readiness for /readyz: the store opened and the listeners are up, and the
 * daemon is not stopping. */
bool kvd_server_ready(const kvd_server_t *server);

/* The cluster view for /readyz and /metrics: false without a cluster
 * (cluster.etcd empty); else its stats. */
struct kvd_membership_stats;
struct kvd_remote_stats;
/* The cluster view's state and the data plane's counters (either may be
 * NULL); false when the daemon is not in a cluster. */
bool kvd_server_cluster(kvd_server_t *server, struct kvd_membership_stats *out,
                        struct kvd_remote_stats *remote_out);

/* True once server.exit_when_idle has passed with no local client: the
 * hand-off socket is closed and removed by then (a client connecting now
 * finds no daemon), and the owner is to call kvd_server_stop. Any thread. */
bool kvd_server_idle_expired(const kvd_server_t *server);

/* Snapshot for /metrics. */
void kvd_server_collect(kvd_server_t *server, kvd_store_stats_t *store_out,
                        kvd_service_stats_t *svc_out);

/* One arena of the daemon: the main one ("main") or a tenant's
 * (server.tenant_arenas). */
typedef struct kvd_server_arena {
    char name[72];
    uint64_t bytes;      /* its size */
    uint64_t free_bytes; /* in chunks no object size holds */
} kvd_server_arena_t;

/* The daemon's arenas, at most `max`; returns how many were written. */
size_t kvd_server_arenas(kvd_server_t *server, kvd_server_arena_t *out,
                         size_t max);

/* One tenant's usage for /metrics: a tenant named in the settings
 * (server.tenants, server.token_tenants, server.tls_tenants,
 * server.tenant_quotas, server.tenant_arenas), or "(none)" for the objects
 * saved with no tenant (tenant 0). */
typedef struct kvd_server_tenant {
    char name[72];
    /* kvd_store_tenant_stats: per tier objects, bytes, evictions; host
     * capacity_bytes what the tenant may fill. */
    kvd_store_stats_t usage;
    /* Lookups of callers bound to it per tier ([0] host, [1] disk);
     * not counted for "(none)" (has_lookups false). */
    uint64_t hits[2], misses[2];
    bool has_lookups;
} kvd_server_tenant_t;

/* The most tenants kvd_server_tenants reports: every distinct name the
 * five tenant settings can hold (64 each) and "(none)". */
#define KVD_SERVER_TENANTS_MAX (5 * 64 + 1)

/* Each tenant of the settings once, "(none)" first, at most `max`;
 * returns how many were written. Read-only. Thread: any. */
size_t kvd_server_tenants(kvd_server_t *server, kvd_server_tenant_t *out,
                          size_t max);

/* The namespaces /metrics lists: the KVD_SERVER_NS_TOP holding the most
 * bytes, from a scan of the store made at most every 30 s (the figures
 * are that old at most). Returns how many were written to out;
 * *n_all_out how many namespaces hold objects. Thread: any. */
#define KVD_SERVER_NS_TOP 20
size_t kvd_server_namespaces(kvd_server_t *server, kvd_service_ns_usage_t *out,
                             size_t *n_all_out, uint64_t *age_ms_out);

/* What backs the daemon's arena memory (every arena: one mapping). */
kvd_arena_backing_t kvd_server_arena_backing(kvd_server_t *server);

/*
 * Graceful stop: refuses new calls, lets calls in progress finish (up to
 * server.shutdown_grace), gives back leases and aborts reservations, flushes
 * the store's queued NVMe writes and index, closes. NULL is accepted.
 */
void kvd_server_stop(kvd_server_t *server);

/* True while the service's housekeeping thread has finished a pass within
 * the last `max_age_ms` (it passes every server.tick): the store answers
 * its poll and the service's lock is not stuck. Any thread. */
bool kvd_server_alive(kvd_server_t *server, uint64_t max_age_ms);

/* ---- server_notify.c: systemd notifications ----------------------------- */

/* Sends one sd_notify(3) state ("READY=1", "STOPPING=1", "WATCHDOG=1");
 * nothing without $NOTIFY_SOCKET or when built without libsystemd (a
 * failure to send is logged, rate-limited). Any thread. */
void kvd_server_notify(const char *state);

/* Sends "STATUS=<text>" (cut at 500 bytes). Any thread. */
__attribute__((format(printf, 1, 2))) void
kvd_server_notify_status(const char *fmt, ...);

/* The watchdog interval systemd asked for ($WATCHDOG_USEC, for this
 * process: $WATCHDOG_PID), in microseconds; 0 when off or built without
 * libsystemd. */
uint64_t kvd_server_watchdog_usec(void);

/* ---- metrics.c ---------------------------------------------------------- */

typedef struct kvd_metrics kvd_metrics_t;

/* Serves /metrics (Prometheus text), /healthz and /readyz on `address`
 * ("127.0.0.1:9464" or "[::1]:9464"; port 0 picks one), writing the bound port.
 * At most `max_connections` HTTP connections are held at once (one more is
 * closed as it is accepted); a connection idle for 5 s is closed and a request
 * whose line and headers pass 16 KiB is answered with an error. Errors:
 * KVD_ERR_INVALID (address), KVD_ERR_UNREACHABLE (cannot listen),
 * KVD_ERR_NOMEM. The endpoint has its own thread; stop it with
 * kvd_metrics_stop before `server` goes. */
kvd_status_t kvd_metrics_start(kvd_server_t *server, const char *address,
                               int max_connections, kvd_metrics_t **metrics_out,
                               int *port_out, char *err, size_t err_len);
void kvd_metrics_stop(kvd_metrics_t *metrics);

/* Parses server.metrics_address as kvd_metrics_start does: a numeric IPv4
 * "host:port" or IPv6 "[host]:port" (no name lookup). Errors:
 * KVD_ERR_INVALID, the setting and the reason in `err`. Pure. */
struct sockaddr_storage;
kvd_status_t kvd_metrics_address_parse(const char *address,
                                       struct sockaddr_storage *sa_out,
                                       char *err, size_t err_len);

/* The /metrics body into a malloc'd string (for the endpoint and tests). */
char *kvd_metrics_render(kvd_server_t *server);

#ifdef __cplusplus
}
#endif

#endif /* KVD_STORE_SERVER_SERVER_INT_H */
