/*
 * kvdepotd's assembly internals, shared by its files (server/ only; the
 * interface other files use is server_int.h):
 *   server.c          open (store, service, gRPC, hand-off, cluster,
 *                     metrics, in that order) and stop (in reverse), the
 *                     accessors metrics.c reads;
 *   server_config.c   the `server.*` and `cluster.*` settings, TLS files,
 *                     the settings Admin config_dump shows;
 *   server_tenancy.c  the tenant mappings (uids, tokens, certificate names,
 *                     quotas, arenas) and the private files they come from;
 *   server_handoff.c  the shared-memory hand-off listener and the sessions
 *                     it gives unix callers, and server.exit_when_idle.
 *
 * Threading: the settings and tenancy are written by open only and read
 * by every thread afterwards; `sess_mu` guards the session table (the
 * hand-off thread writes it, gRPC threads read it).
 */
#ifndef KVD_SERVER_SRV_INT_H
#define KVD_SERVER_SRV_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/un.h>

#include "client/handoff.h"
#include "cluster/remote.h"
#include "server/rpc_int.h"
#include "server/server_int.h"

#define SRV_TENANTS_MAX 64
#define SRV_TENANT_NAME_MAX 64
/* Sessions remembered (one per arena hand-off). A session whose hand-off
 * connection is open (live) is never forgotten; when the table is full the
 * oldest session whose connection has ended is, and its client (if it
 * still calls) gets KVD_ERR_AUTH and hands off again. Live sessions are at
 * most SRV_HANDOFF_CONNS_MAX, so there is always such a session. */
#define SRV_SESSIONS_MAX 4096

typedef struct srv_tenant {
    uint32_t uid;
    char name[SRV_TENANT_NAME_MAX + 1];
} srv_tenant_t;

/* A TCP credential's tenant: a bearer token (server.token_tenants) or a
 * client certificate's common name (server.tls_tenants). */
#define SRV_TOKEN_MAX 256
#define SRV_TOKEN_MIN 16
#define SRV_CN_MAX 255
typedef struct srv_cred {
    char secret[SRV_TOKEN_MAX + 1];
    char tenant[SRV_TENANT_NAME_MAX + 1];
} srv_cred_t;

/* Every tenant mapping the settings give. */
typedef struct srv_tenancy {
    srv_tenant_t uids[SRV_TENANTS_MAX];
    size_t n_uids;
    srv_cred_t tokens[SRV_TENANTS_MAX];
    size_t n_tokens;
    srv_cred_t cns[SRV_TENANTS_MAX];
    size_t n_cns;
    struct srv_tenant_bytes {
        char tenant[SRV_TENANT_NAME_MAX + 1];
        uint64_t bytes;
    } quotas[SRV_TENANTS_MAX];
    size_t n_quotas;
    struct srv_tenant_bytes arenas[SRV_TENANTS_MAX];
    size_t n_arenas;
} srv_tenancy_t;

typedef struct srv_session {
    uint8_t secret[KVD_HANDOFF_SESSION_BYTES];
    const char *tenant; /* into srv->tenancy->uids, or NULL */
    uint64_t id;        /* kvd_service_session_open's, never 0 */
    uint32_t uid;       /* the caller's (SO_PEERCRED) */
    bool used;
    bool live; /* its hand-off connection is open */
} srv_session_t;

/* A client's hand-off connection: first pending (its HELLO arriving,
 * `session` 0, until `deadline_ns`), then kept open while it maps the
 * arena: its end (the client closed the store, or died) closes the
 * session. */
typedef struct srv_handoff_conn {
    int fd;
    uint64_t session;
    uint64_t deadline_ns; /* pending: when it is dropped */
    uint32_t uid;         /* SO_PEERCRED at accept */
    uint8_t got;          /* pending: HELLO bytes received */
    uint8_t hello[KVD_HANDOFF_HELLO_BYTES];
} srv_handoff_conn_t;

/* Hand-off connections (pending and kept) open at once; past it a new
 * connection is closed at accept. */
#define SRV_HANDOFF_CONNS_MAX 1024
/* Pending hand-offs (HELLO not yet complete) one uid may have at once; a
 * connection past it is closed at accept, so a stalled caller cannot fill
 * the table for others. */
#define SRV_HANDOFF_PENDING_PER_UID 16
/* The whole HELLO must arrive within this of the accept. */
#define SRV_HANDOFF_DEADLINE_MS 1000

struct kvd_server {
    kvd_server_settings_t cfg;
    char *tls_pem[3];  /* cert, key, client CA texts; NULL without TLS */
    char *etcd_pem[3]; /* etcd's CA, client cert, key; NULL: not set */
    srv_tenancy_t *tenancy;
    kvd_rpc_credential_t rpc_tokens[SRV_TENANTS_MAX];
    kvd_rpc_credential_t rpc_cns[SRV_TENANTS_MAX];
    /* Admin config_dump's answer: the settings at start, secrets redacted. */
    kvd_service_config_entry_t *config_entries;
    size_t n_config_entries, cap_config_entries;
    /* Every distinct tenant name of `tenancy` (pointers into it), for the
     * service's tenant listing. */
    const char *tenant_names[5 * SRV_TENANTS_MAX];
    size_t n_tenant_names;
    /* /metrics' namespaces holding the most (kvd_server_namespaces): a
     * scan of the store at most every SRV_NS_REFRESH_MS, under ns_mu. */
    pthread_mutex_t ns_mu;
    kvd_service_ns_usage_t ns_top[KVD_SERVER_NS_TOP];
    size_t ns_n, ns_all;
    uint64_t ns_at_ns; /* when ns_top was taken; 0: never */
    pthread_mutex_t sess_mu;
    srv_session_t *sessions; /* SRV_SESSIONS_MAX */
    uint64_t sess_ids;       /* the last session id given */
    /* The hand-off thread's own. */
    srv_handoff_conn_t *conns;
    size_t n_conns;
    uint64_t instance_id;
    kvd_store_t *store;
    kvd_service_t *svc;
    kvd_rpc_server_t *rpc;
    kvd_metrics_t *metrics;
    kvd_remote_t *remote; /* NULL without cluster.etcd */
    /* Guards `remote` against the service thread's foreign completions
     * while the cluster stops (the RPC threads are gone by then). */
    pthread_rwlock_t remote_lock;
    int tcp_port, metrics_port;

    char handoff_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int handoff_fd;
    pthread_t handoff_thread;
    bool handoff_started;
    /* server.exit_when_idle: since when the hand-off thread has held no
     * connection (its own), and whether that lasted long enough (atomic;
     * the thread has closed the hand-off socket then). */
    uint64_t idle_since_ns;
    bool idle_expired;
    bool stopping; /* atomic */
    bool ready;    /* atomic */
};

/* ---- server_config.c ---------------------------------------------------- */

/* Resolves the `server.*` and `cluster.*` settings from `config` into
 * `cfg` (tokens read from their files), the unix sockets' permissions into
 * *mode and, when `tenancy` is not NULL, the tenant mappings. Errors name
 * the setting in `err`: KVD_ERR_INVALID, KVD_ERR_RANGE, KVD_ERR_AUTH (a
 * secrets file others may read), errors of open/read. */
kvd_status_t srv_settings(const kvd_config_t *config,
                          kvd_server_settings_t *cfg, unsigned *mode,
                          srv_tenancy_t *tenancy, char *err, size_t err_len);

/* The store side of the settings: valid, and the daemon's own store
 * (store.mode embedded). */
kvd_status_t srv_store_settings(const kvd_config_t *config, char *err,
                                size_t err_len);

/* Reads the TLS PEM files (server.tls_*; all three or none) into `pem`
 * (malloc'd, NULL when TLS is off; on error the caller frees what was
 * read). */
kvd_status_t srv_tls_read(const kvd_server_settings_t *cfg, char *pem[3],
                          char *err, size_t err_len);

/* Reads the PEM files of TLS to etcd (cluster.etcd_tls_ca, _cert, _key)
 * into `pem` in that order (malloc'd, NULL when unset; on error the caller
 * frees what was read). KVD_ERR_INVALID: a certificate without its key or
 * the reverse, either without a CA, any of them without cluster.etcd. */
kvd_status_t srv_etcd_tls_read(const kvd_server_settings_t *cfg, char *pem[3],
                               char *err, size_t err_len);

/* The listeners' settings as kvd_rpc_server_start and kvd_metrics_start
 * take them (a listener, authenticated TCP, addresses that parse), checked
 * before the store opens. `pem` as srv_tls_read wrote it. Binds nothing. */
kvd_status_t srv_check_world(const kvd_server_settings_t *cfg,
                             const srv_tenancy_t *tenancy, char *const pem[3],
                             char *err, size_t err_len);

/* The directories the start writes in: the unix socket's, and
 * store.disk_path (or its parent, where the store creates it). */
kvd_status_t srv_check_paths(const kvd_config_t *config,
                             const kvd_server_settings_t *cfg, char *err,
                             size_t err_len);

/* Records every server.* and store.* setting as the daemon starts with it
 * (secrets redacted) in srv->config_entries. KVD_ERR_NOMEM. */
kvd_status_t srv_config_entries(kvd_server_t *srv, const kvd_config_t *config);

/* ---- server_tenancy.c --------------------------------------------------- */

/* Opens a secrets file (`key` names the setting in errors): a regular
 * file that neither group nor others may read. NULL with *status set
 * otherwise. */
FILE *srv_open_private(const char *key, const char *path, kvd_status_t *status,
                       char *err, size_t err_len);

/* Fills `tenancy` from server.tenants, server.token_tenants,
 * server.tls_tenants, server.tenant_quotas and server.tenant_arenas.
 * Errors name the setting in `err`: KVD_ERR_INVALID, those of
 * srv_open_private. */
kvd_status_t srv_tenancy_parse(const kvd_server_settings_t *cfg,
                               srv_tenancy_t *tenancy, char *err,
                               size_t err_len);

/* ---- server_handoff.c --------------------------------------------------- */

/* Binds the hand-off socket (server.unix_socket + ".shm") with `mode` and
 * starts its thread. Errors name the socket in `err`. */
kvd_status_t srv_handoff_open(kvd_server_t *srv, unsigned mode, char *err,
                              size_t err_len);

/* kvd_rpc_session_fn over the sessions the hand-off gave (ctx: the
 * server). */
kvd_status_t srv_session_tenant(void *ctx, const char *hex, size_t len,
                                const char **tenant_out, uint64_t *session_out);
/* Closes the hand-off connections still open (their sessions with them);
 * after the hand-off thread has stopped. */
void srv_handoff_conns_close(kvd_server_t *srv);

#endif /* KVD_SERVER_SRV_INT_H */
