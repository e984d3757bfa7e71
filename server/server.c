/*
 * kvdepotd's assembly (server_int.h): settings, the store, the service, the
 * gRPC listeners, the shared-memory hand-off listener and metrics, started
 * in that order and stopped in reverse.
 *
 * The hand-off listener is one thread: each exchange is one 16-byte HELLO
 * and one 56-byte REPLY with the memfd, bounded by a 1 s receive timeout, so
 * a stuck client delays the next one by at most that.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "proto/kvd_proto.h"
#include "client/handoff.h"
#include "store/engine.h"
#include "cluster/membership.h"
#include "cluster/placement.h"
#include "cluster/remote.h"
#include "server/rpc_int.h"
#include "server/server_int.h"

#define SRV_OFF(m) offsetof(kvd_server_settings_t, m)
#define SRV_HANDOFF_TIMEOUT_MS 1000
#define SRV_TENANTS_MAX 64
#define SRV_TENANT_NAME_MAX 64
/* Sessions remembered (one per arena hand-off); the oldest is forgotten
 * first, and its client is told to hand off again. */
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
    bool used;
} srv_session_t;

static const kvd_config_field_t server_fields[] = {
    {"server.unix_socket", "/run/kvdepot/kvdepotd.sock",
     "gRPC unix socket for engines on this node (\"\": none); the arena "
     "hand-off listens at this path + \".shm\"",
     kvd_config_parse_string, SRV_OFF(unix_socket), 0, 0, NULL},
    {"server.unix_mode", "0660",
     "permissions (octal) of both unix sockets: who may connect",
     kvd_config_parse_string, SRV_OFF(unix_mode), 0, 0, NULL},
    {"server.tcp_address", "",
     "gRPC TCP listener for peers and admin, host:port (\"\": none; port 0 "
     "picks one); needs server.token",
     kvd_config_parse_string, SRV_OFF(tcp_address), 0, 0, NULL},
    {"server.token", "",
     "bearer token TCP callers must send (authorization: Bearer <token>)",
     kvd_config_parse_string, SRV_OFF(token), 0, 0, NULL},
    {"server.token_file", "",
     "file whose first line is the token (instead of server.token)",
     kvd_config_parse_string, SRV_OFF(token_file), 0, 0, NULL},
    {"server.tls_cert", "",
     "PEM certificate chain for TLS on the TCP listener (with tls_key and "
     "tls_client_ca; \"\": plain TCP)",
     kvd_config_parse_string, SRV_OFF(tls_cert), 0, 0, NULL},
    {"server.tls_key", "", "PEM private key of server.tls_cert",
     kvd_config_parse_string, SRV_OFF(tls_key), 0, 0, NULL},
    {"server.tls_client_ca", "",
     "PEM CA that signs client certificates: TCP callers must present one",
     kvd_config_parse_string, SRV_OFF(tls_client_ca), 0, 0, NULL},
    {"server.metrics_address", "",
     "HTTP listener for /metrics, /healthz, /readyz, host:port (\"\": none)",
     kvd_config_parse_string, SRV_OFF(metrics_address), 0, 0, NULL},
    {"server.tenants", "",
     "uid=tenant pairs, comma-separated (\"1001=team-a,1002=team-b\"): a "
     "local client's saves count against the tenant of its user, whatever "
     "the request says; when set, every local call must come with its "
     "arena hand-off session",
     kvd_config_parse_string, SRV_OFF(tenants), 0, 0, NULL},
    {"server.token_tenants", "",
     "file of \"tenant token\" lines (mode 0600 or stricter; tokens of 16 "
     "to 256 characters): a TCP caller presenting one of these tokens is "
     "bound to its tenant (saves, listings and drops are that tenant's)",
     kvd_config_parse_string, SRV_OFF(token_tenants), 0, 0, NULL},
    {"server.tls_tenants", "",
     "cn=tenant pairs, comma-separated (\"engine-a=team-a\"): a TCP caller "
     "whose client certificate has that common name is bound to the tenant",
     kvd_config_parse_string, SRV_OFF(tls_tenants), 0, 0, NULL},
    {"server.tenant_quotas", "",
     "tenant=size pairs, comma-separated (\"team-a=8g,team-b=4g\"): the most "
     "arena bytes a tenant's objects hold; its saves evict its own objects "
     "beyond that, never another tenant's",
     kvd_config_parse_string, SRV_OFF(tenant_quotas), 0, 0, NULL},
    {"server.tenant_arenas", "",
     "tenant=size pairs, comma-separated (\"team-a=8g\"): each tenant named "
     "gets an arena of that size of its own, in addition to "
     "store.arena_size; its local clients map that arena only, so they "
     "cannot read any other tenant's bytes, and its objects evict only each "
     "other (at most 16 tenants; sizes whole store.arena_chunk multiples)",
     kvd_config_parse_string, SRV_OFF(tenant_arenas), 0, 0, NULL},
    {"cluster.etcd", "",
     "etcd endpoint host:port of the cluster (\"\": this daemon is alone); "
     "the daemon registers there and keeps the view of the others",
     kvd_config_parse_string, SRV_OFF(cluster_etcd), 0, 0, NULL},
    {"cluster.name", "default",
     "the cluster's name: its nodes are /kvdepot/<name>/nodes/<node_id>",
     kvd_config_parse_string, SRV_OFF(cluster_name), 0, 0, NULL},
    {"cluster.advertise", "",
     "host:port peers reach this daemon's gRPC at (\"\": server.tcp_address "
     "with its bound port)",
     kvd_config_parse_string, SRV_OFF(cluster_advertise), 0, 0, NULL},
    {"cluster.lease_ttl", "10s",
     "etcd lease of this node's registration: a dead node leaves the "
     "others' views after this",
     kvd_config_parse_duration_ms, SRV_OFF(cluster_lease_ttl_ms), 1000, 3600000,
     NULL},
    {"cluster.token_file", "",
     "file whose first line is the cluster token (16 to 256 characters; "
     "mode 0600 or stricter): every node of the cluster has the same, and "
     "peer messages without it are dropped (\"\": no token; private networks "
     "only)",
     kvd_config_parse_string, SRV_OFF(cluster_token_file), 0, 0, NULL},
    {"cluster.replicas", "1",
     "home nodes of each object (R): saves are pushed to them, and a lookup "
     "that misses here asks them in turn",
     kvd_config_parse_int, SRV_OFF(cluster_replicas), 1,
     KVD_PLACEMENT_MAX_REPLICAS, NULL},
    {"cluster.timeout", "1s",
     "deadline of a lookup's questions to other nodes and its fetches",
     kvd_config_parse_duration_ms, SRV_OFF(cluster_timeout_ms), 1, 600000,
     NULL},
    {"cluster.queue", "16384",
     "keys waiting to be pushed to their homes or pulled from a node that "
     "offered them; beyond this they are dropped (and counted)",
     kvd_config_parse_int, SRV_OFF(cluster_queue), 1, 1 << 24, NULL},
    {"cluster.fetch_part", "60k",
     "objects pulled from other nodes come in parts of this size, sent "
     "eagerly and hashed as each lands (4k to 1m; 0: each object whole by "
     "UCX rendezvous)",
     kvd_config_parse_size, SRV_OFF(cluster_fetch_part_bytes), 0, 1 << 20,
     NULL},
    {"server.node_id", "", "this daemon's node id (\"\": the host name)",
     kvd_config_parse_string, SRV_OFF(node_id), 0, 0, NULL},
    {"server.threads", "2", "gRPC completion-queue threads",
     kvd_config_parse_int, SRV_OFF(threads), 1, 64, NULL},
    {"server.max_message", "32m",
     "largest gRPC message accepted or sent (protocol caps are lower)",
     kvd_config_parse_size, SRV_OFF(max_message_bytes), 1 << 16, 1 << 30, NULL},
    {"server.lease_ttl", "30s",
     "lease lifetime when Get asks for 0 (a dead client's leases return "
     "after this)",
     kvd_config_parse_duration_ms, SRV_OFF(lease_ttl_ms), 1,
     KVD_PROTO_MAX_TTL_MS, NULL},
    {"server.tenant_max_leased", "0",
     "bytes of objects one tenant may hold leased at once (callers without "
     "a tenant count as one; 0: no limit): beyond it lookups match a "
     "shorter prefix",
     kvd_config_parse_size, SRV_OFF(tenant_max_leased_bytes), 0, INT64_MAX,
     NULL},
    {"server.reservation_ttl", "30s",
     "reservation lifetime when Reserve asks for 0",
     kvd_config_parse_duration_ms, SRV_OFF(reservation_ttl_ms), 1,
     KVD_PROTO_MAX_TTL_MS, NULL},
    {"server.flush_timeout", "30s", "Admin flush deadline when it asks for 0",
     kvd_config_parse_duration_ms, SRV_OFF(flush_timeout_ms), 1,
     KVD_PROTO_MAX_TTL_MS, NULL},
    {"server.shutdown_grace", "5s",
     "how long SIGTERM waits for calls in progress before cancelling",
     kvd_config_parse_duration_ms, SRV_OFF(shutdown_grace_ms), 0, 600000, NULL},
    {"server.tick", "50ms",
     "housekeeping period: lease and reservation expiry precision",
     kvd_config_parse_duration_ms, SRV_OFF(tick_ms), 1, 10000, NULL},
    {"server.verify_commits", "true",
     "check each committed object's bytes against the client's checksum",
     kvd_config_parse_bool, SRV_OFF(verify_commits), 0, 0, NULL},
};

#define SERVER_NFIELDS (sizeof server_fields / sizeof server_fields[0])

struct kvd_server {
    kvd_server_settings_t cfg;
    char *tls_pem[3]; /* cert, key, client CA texts; NULL without TLS */
    srv_tenancy_t *tenancy;
    kvd_rpc_credential_t rpc_tokens[SRV_TENANTS_MAX];
    kvd_rpc_credential_t rpc_cns[SRV_TENANTS_MAX];
    /* Admin config_dump's answer: the settings at start, secrets redacted. */
    kvd_service_config_entry_t *config_entries;
    size_t n_config_entries, cap_config_entries;
    pthread_mutex_t sess_mu;
    srv_session_t *sessions; /* SRV_SESSIONS_MAX, a ring */
    size_t sess_next;
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
    bool stopping; /* atomic */
    bool ready;    /* atomic */
};

kvd_status_t kvd_server_print_config(const kvd_config_t *config, FILE *out)
{
    kvd_status_t s =
        kvd_config_print(config, server_fields, SERVER_NFIELDS, out);
    if (s == KVD_OK) {
        s = kvd_store_print_config(config, out);
    }
    return s;
}

static bool srv_tenant_name_ok(const char *name, size_t len)
{
    return len > 0 && len <= SRV_TENANT_NAME_MAX &&
           strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTU"
                        "VWXYZ0123456789._-") == len;
}

/* Opens a secrets file (`key` names the setting in errors): a regular
 * file that neither group nor others may read. NULL with *status set
 * otherwise. */
static FILE *srv_open_private(const char *key, const char *path,
                              kvd_status_t *status, char *err, size_t err_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        int e = errno;
        kvd_config_err(err, err_len, "%s %s: %s", key, path, strerror(e));
        if (fd >= 0) {
            close(fd);
        }
        *status = kvd_status_from_errno(e);
        return NULL;
    }
    if ((st.st_mode & 077) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        kvd_config_err(err, err_len, "%s %s: %s", key, path,
                       S_ISREG(st.st_mode)
                           ? "readable by group or others (chmod 600 it)"
                           : "not a regular file");
        *status = KVD_ERR_AUTH;
        return NULL;
    }
    FILE *f = fdopen(fd, "r");
    if (f == NULL) {
        close(fd);
        *status = KVD_ERR_NOMEM;
    }
    return f;
}

/* cluster.token_file: its first line, 16 to 256 characters. */
static kvd_status_t server_cluster_token(kvd_server_settings_t *cfg, char *err,
                                         size_t err_len)
{
    kvd_status_t s = KVD_OK;
    FILE *f = srv_open_private("cluster.token_file", cfg->cluster_token_file,
                               &s, err, err_len);
    if (f == NULL) {
        return s;
    }
    char *line = fgets(cfg->cluster_token, (int)sizeof cfg->cluster_token, f);
    fclose(f);
    size_t n = line != NULL ? strcspn(cfg->cluster_token, "\r\n") : 0;
    cfg->cluster_token[n] = '\0';
    if (n < SRV_TOKEN_MIN || n > SRV_TOKEN_MAX) {
        OPENSSL_cleanse(cfg->cluster_token, sizeof cfg->cluster_token);
        kvd_config_err(err, err_len,
                       "cluster.token_file %s: the first line must be a "
                       "token of %d to %d characters",
                       cfg->cluster_token_file, SRV_TOKEN_MIN, SRV_TOKEN_MAX);
        return KVD_ERR_INVALID;
    }
    return KVD_OK;
}

/* server.token_tenants: "tenant token" lines of a file only its owner can
 * read; blank lines and lines starting with # are skipped. */
static kvd_status_t server_token_tenants(const char *path, srv_tenancy_t *t,
                                         char *err, size_t err_len)
{
    kvd_status_t s = KVD_OK;
    FILE *f = srv_open_private("server.token_tenants", path, &s, err, err_len);
    if (f == NULL) {
        return s;
    }
    char line[SRV_TENANT_NAME_MAX + SRV_TOKEN_MAX + 16];
    for (unsigned no = 1; s == KVD_OK && fgets(line, sizeof line, f) != NULL;
         no++) {
        size_t n = strlen(line);
        if (n == sizeof line - 1 && line[n - 1] != '\n') {
            kvd_config_err(err, err_len, "server.token_tenants %s:%u: too long",
                           path, no);
            s = KVD_ERR_INVALID;
            break;
        }
        line[strcspn(line, "\r\n")] = '\0';
        char *save = NULL;
        char *name = strtok_r(line, " \t", &save);
        if (name == NULL || name[0] == '#') {
            continue;
        }
        char *token = strtok_r(NULL, " \t", &save);
        size_t tlen = token != NULL ? strlen(token) : 0;
        if (!srv_tenant_name_ok(name, strlen(name)) || tlen < SRV_TOKEN_MIN ||
            tlen > SRV_TOKEN_MAX || strtok_r(NULL, " \t", &save) != NULL ||
            t->n_tokens == SRV_TENANTS_MAX) {
            kvd_config_err(err, err_len,
                           "server.token_tenants %s:%u: want \"tenant "
                           "token\" (at most %d lines; tenant names of "
                           "letters, digits, . _ -; tokens of %d to %d "
                           "characters without spaces)",
                           path, no, SRV_TENANTS_MAX, SRV_TOKEN_MIN,
                           SRV_TOKEN_MAX);
            s = KVD_ERR_INVALID;
            break;
        }
        for (size_t i = 0; i < t->n_tokens; i++) {
            if (strcmp(t->tokens[i].secret, token) == 0) {
                kvd_config_err(err, err_len,
                               "server.token_tenants %s:%u: the token of "
                               "tenant %s again",
                               path, no, t->tokens[i].tenant);
                s = KVD_ERR_INVALID;
            }
        }
        if (s == KVD_OK) {
            srv_cred_t *c = &t->tokens[t->n_tokens++];
            snprintf(c->secret, sizeof c->secret, "%s", token);
            snprintf(c->tenant, sizeof c->tenant, "%s", name);
        }
    }
    OPENSSL_cleanse(line, sizeof line);
    fclose(f);
    return s;
}

/* One "left=right" pair of a comma-separated list (split at the last '=':
 * a certificate's common name may hold one); false: the pair is bad. */
typedef bool (*srv_pair_fn)(srv_tenancy_t *t, const char *left, size_t left_len,
                            const char *right);

/* Hands every pair of `text` to `fn`; on a pair without '=' or one `fn`
 * refuses, writes "`key` \"text\": want `want`" and fails. */
static kvd_status_t srv_pairs(const char *key, const char *text,
                              const char *want, srv_pair_fn fn,
                              srv_tenancy_t *t, char *err, size_t err_len)
{
    char *save = NULL, list[KVD_CONFIG_STRING_MAX];
    snprintf(list, sizeof list, "%s", text);
    for (char *tok = strtok_r(list, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        char *eq = strrchr(tok, '=');
        if (eq == NULL || eq == tok ||
            !fn(t, tok, (size_t)(eq - tok), eq + 1)) {
            kvd_config_err(err, err_len, "%s \"%s\": want %s (at most %d)", key,
                           text, want, SRV_TENANTS_MAX);
            return KVD_ERR_INVALID;
        }
    }
    return KVD_OK;
}

/* server.tenants: uid=tenant. */
static bool srv_uid_pair(srv_tenancy_t *t, const char *left, size_t left_len,
                         const char *right)
{
    char *end = NULL;
    unsigned long uid = strtoul(left, &end, 10);
    if (end != left + left_len || uid > UINT32_MAX ||
        !srv_tenant_name_ok(right, strlen(right)) ||
        t->n_uids == SRV_TENANTS_MAX) {
        return false;
    }
    t->uids[t->n_uids].uid = (uint32_t)uid;
    snprintf(t->uids[t->n_uids].name, sizeof t->uids[0].name, "%s", right);
    t->n_uids++;
    return true;
}

/* server.tls_tenants: cn=tenant. */
static bool srv_cn_pair(srv_tenancy_t *t, const char *left, size_t left_len,
                        const char *right)
{
    if (left_len > SRV_CN_MAX || !srv_tenant_name_ok(right, strlen(right)) ||
        t->n_cns == SRV_TENANTS_MAX) {
        return false;
    }
    srv_cred_t *c = &t->cns[t->n_cns++];
    snprintf(c->secret, sizeof c->secret, "%.*s", (int)left_len, left);
    snprintf(c->tenant, sizeof c->tenant, "%s", right);
    return true;
}

/* tenant=size, above 0, appended to `list` (of `*n`); a tenant given
 * twice is refused. */
static bool srv_bytes_pair(struct srv_tenant_bytes *list, size_t *n,
                           const char *left, size_t left_len, const char *right)
{
    static const kvd_config_field_t size_field = {
        "server.tenant_bytes", "", "", kvd_config_parse_size, 0, 0, 0, NULL};
    uint64_t bytes = 0;
    if (!srv_tenant_name_ok(left, left_len) || *n == SRV_TENANTS_MAX ||
        kvd_config_parse_size(&size_field, right, &bytes, NULL, 0) != KVD_OK ||
        bytes == 0) {
        return false;
    }
    for (size_t i = 0; i < *n; i++) {
        if (strlen(list[i].tenant) == left_len &&
            memcmp(list[i].tenant, left, left_len) == 0) {
            return false;
        }
    }
    snprintf(list[*n].tenant, sizeof list[0].tenant, "%.*s", (int)left_len,
             left);
    list[(*n)++].bytes = bytes;
    return true;
}

/* server.tenant_quotas: tenant=size, above 0. */
static bool srv_quota_pair(srv_tenancy_t *t, const char *left, size_t left_len,
                           const char *right)
{
    return srv_bytes_pair(t->quotas, &t->n_quotas, left, left_len, right);
}

/* server.tenant_arenas: tenant=size, above 0. */
static bool srv_arena_pair(srv_tenancy_t *t, const char *left, size_t left_len,
                           const char *right)
{
    return srv_bytes_pair(t->arenas, &t->n_arenas, left, left_len, right);
}

#define SRV_NAMES "tenant names of letters, digits, . _ -"

static kvd_status_t server_settings(const kvd_config_t *config,
                                    kvd_server_settings_t *cfg, unsigned *mode,
                                    srv_tenancy_t *tenancy, char *err,
                                    size_t err_len)
{
    /* kvdepotd knows every component it reads: a key of any other section
     * is a typo, not another component's. */
    static const char *const sections[] = {"log", "server", "cluster", "store",
                                           NULL};
    kvd_status_t s = kvd_config_check_sections(config, sections, err, err_len);
    if (s != KVD_OK) {
        return s;
    }
    s = kvd_config_apply(config, server_fields, SERVER_NFIELDS, cfg, err,
                         err_len);
    if (s != KVD_OK) {
        return s;
    }
    char *end = NULL;
    errno = 0;
    unsigned long m = strtoul(cfg->unix_mode, &end, 8);
    if (errno != 0 || end == cfg->unix_mode || *end != '\0' || m > 0777) {
        kvd_config_err(err, err_len,
                       "server.unix_mode \"%s\": want octal permissions such "
                       "as 0660",
                       cfg->unix_mode);
        return KVD_ERR_INVALID;
    }
    *mode = (unsigned)m;
    if (cfg->token_file[0] != '\0') {
        if (cfg->token[0] != '\0') {
            kvd_config_err(err, err_len,
                           "server.token and server.token_file are both set");
            return KVD_ERR_INVALID;
        }
        FILE *f = fopen(cfg->token_file, "re");
        if (f == NULL || fgets(cfg->token, (int)sizeof cfg->token, f) == NULL) {
            kvd_config_err(err, err_len, "server.token_file %s: %s",
                           cfg->token_file,
                           f == NULL ? strerror(errno) : "empty");
            if (f != NULL) {
                fclose(f);
            }
            return f == NULL ? kvd_status_from_errno(errno) : KVD_ERR_INVALID;
        }
        fclose(f);
        cfg->token[strcspn(cfg->token, "\r\n")] = '\0';
    }
    if (cfg->cluster_token_file[0] != '\0') {
        kvd_status_t ts = server_cluster_token(cfg, err, err_len);
        if (ts != KVD_OK) {
            return ts;
        }
    }
    if (tenancy != NULL) {
        tenancy->n_uids = tenancy->n_tokens = tenancy->n_cns = 0;
        tenancy->n_quotas = 0;
        tenancy->n_arenas = 0;
        kvd_status_t ts = srv_pairs("server.tenants", cfg->tenants,
                                    "uid=tenant pairs, " SRV_NAMES,
                                    srv_uid_pair, tenancy, err, err_len);
        if (ts == KVD_OK && cfg->token_tenants[0] != '\0') {
            ts =
                server_token_tenants(cfg->token_tenants, tenancy, err, err_len);
        }
        if (ts == KVD_OK) {
            ts = srv_pairs("server.tls_tenants", cfg->tls_tenants,
                           "cn=tenant pairs, " SRV_NAMES, srv_cn_pair, tenancy,
                           err, err_len);
        }
        if (ts == KVD_OK) {
            ts = srv_pairs("server.tenant_quotas", cfg->tenant_quotas,
                           "tenant=size pairs such as team-a=8g, sizes above 0",
                           srv_quota_pair, tenancy, err, err_len);
        }
        if (ts == KVD_OK) {
            ts = srv_pairs("server.tenant_arenas", cfg->tenant_arenas,
                           "tenant=size pairs such as team-a=8g, each tenant "
                           "once, sizes above 0",
                           srv_arena_pair, tenancy, err, err_len);
        }
        if (ts != KVD_OK) {
            return ts;
        }
        if (tenancy->n_cns > 0 && cfg->tls_cert[0] == '\0') {
            kvd_config_err(err, err_len,
                           "server.tls_tenants is set but TLS is not "
                           "(server.tls_cert, server.tls_key, "
                           "server.tls_client_ca)");
            return KVD_ERR_INVALID;
        }
    }
    if (cfg->node_id[0] == '\0' &&
        gethostname(cfg->node_id, sizeof cfg->node_id - 1) != 0) {
        snprintf(cfg->node_id, sizeof cfg->node_id, "kvdepotd");
    }
    if (strlen(cfg->node_id) > KVD_PROTO_MAX_NODE_ID_BYTES) {
        kvd_config_err(err, err_len, "server.node_id: longer than %d bytes",
                       KVD_PROTO_MAX_NODE_ID_BYTES);
        return KVD_ERR_RANGE;
    }
    return KVD_OK;
}

#define SRV_PEM_MAX (1u << 20)

/* Reads a PEM file whole (NUL-terminated, malloc'd). */
static kvd_status_t server_read_pem(const char *key, const char *path,
                                    char **out, char *err, size_t err_len)
{
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        int e = errno;
        kvd_config_err(err, err_len, "%s %s: %s", key, path, strerror(e));
        return kvd_status_from_errno(e);
    }
    char *buf = malloc(SRV_PEM_MAX + 1);
    size_t n = buf != NULL ? fread(buf, 1, SRV_PEM_MAX + 1, f) : 0;
    fclose(f);
    if (buf == NULL) {
        return KVD_ERR_NOMEM;
    }
    if (n == 0 || n > SRV_PEM_MAX || strstr(buf, "-----BEGIN") == NULL) {
        buf[n > SRV_PEM_MAX ? SRV_PEM_MAX : n] = '\0';
        kvd_config_err(err, err_len, "%s %s: %s", key, path,
                       n > SRV_PEM_MAX ? "larger than 1 MiB" : "not PEM");
        free(buf);
        return KVD_ERR_INVALID;
    }
    buf[n] = '\0';
    *out = buf;
    return KVD_OK;
}

static kvd_status_t server_tls_load(kvd_server_t *srv, char *err,
                                    size_t err_len)
{
    const char *keys[3] = {"server.tls_cert", "server.tls_key",
                           "server.tls_client_ca"};
    const char *paths[3] = {srv->cfg.tls_cert, srv->cfg.tls_key,
                            srv->cfg.tls_client_ca};
    int set = 0;
    for (int i = 0; i < 3; i++) {
        set += paths[i][0] != '\0';
    }
    if (set == 0) {
        return KVD_OK;
    }
    if (set != 3) {
        kvd_config_err(err, err_len,
                       "server.tls_cert, server.tls_key and "
                       "server.tls_client_ca go together");
        return KVD_ERR_INVALID;
    }
    for (int i = 0; i < 3; i++) {
        kvd_status_t s =
            server_read_pem(keys[i], paths[i], &srv->tls_pem[i], err, err_len);
        if (s != KVD_OK) {
            return s;
        }
    }
    return KVD_OK;
}

/* The store side of the settings: valid, and the daemon's own store. */
static kvd_status_t server_store_settings(const kvd_config_t *config, char *err,
                                          size_t err_len)
{
    bool daemon_mode = false;
    kvd_status_t s = kvd_store_check_config(config, &daemon_mode, err, err_len);
    if (s == KVD_OK && daemon_mode) {
        kvd_config_err(err, err_len,
                       "store.mode: daemon is for engines; kvdepotd serves "
                       "its own store (embedded)");
        s = KVD_ERR_INVALID;
    }
    return s;
}

kvd_status_t kvd_server_check_config(const kvd_config_t *config, char *err,
                                     size_t err_len)
{
    kvd_server_settings_t *cfg = calloc(1, sizeof *cfg);
    if (cfg == NULL) {
        return KVD_ERR_NOMEM;
    }
    unsigned mode = 0;
    srv_tenancy_t *tenancy = calloc(1, sizeof *tenancy);
    kvd_status_t s = tenancy == NULL ? KVD_ERR_NOMEM
                                     : server_settings(config, cfg, &mode,
                                                       tenancy, err, err_len);
    if (tenancy != NULL) {
        OPENSSL_cleanse(tenancy, sizeof *tenancy);
    }
    free(tenancy);
    if (s == KVD_OK) {
        s = server_store_settings(config, err, err_len);
    }
    free(cfg);
    return s;
}

/* ---- shared-memory hand-off --------------------------------------------- */

/* The tenant `uid` maps to (server.tenants), or NULL. */
static const char *server_uid_tenant(const kvd_server_t *srv, uint32_t uid)
{
    const char *tenant = NULL;
    for (size_t i = 0; i < srv->tenancy->n_uids; i++) {
        if (srv->tenancy->uids[i].uid == uid) {
            tenant = srv->tenancy->uids[i].name;
        }
    }
    return tenant;
}

/* A fresh session secret for a client of `tenant` (its uid's, or NULL),
 * remembered with it. */
static void server_session_new(kvd_server_t *srv, const char *tenant,
                               uint8_t *secret_out)
{
    if (getrandom(secret_out, KVD_HANDOFF_SESSION_BYTES, 0) !=
        (ssize_t)KVD_HANDOFF_SESSION_BYTES) {
        /* No randomness: an all-zero secret no client can present (the
         * session check refuses it), so mapped users are refused, not
         * confused. */
        memset(secret_out, 0, KVD_HANDOFF_SESSION_BYTES);
        return;
    }
    pthread_mutex_lock(&srv->sess_mu);
    srv_session_t *e = &srv->sessions[srv->sess_next];
    srv->sess_next = (srv->sess_next + 1) % SRV_SESSIONS_MAX;
    memcpy(e->secret, secret_out, KVD_HANDOFF_SESSION_BYTES);
    e->tenant = tenant;
    e->used = true;
    pthread_mutex_unlock(&srv->sess_mu);
}

static int hex_nibble(char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    return -1;
}

/* kvd_rpc_session_fn: the tenant of a session, by its secret in hex. */
static kvd_status_t server_session_tenant(void *ctx, const char *hex,
                                          size_t len, const char **tenant_out)
{
    kvd_server_t *srv = ctx;
    uint8_t secret[KVD_HANDOFF_SESSION_BYTES], zero[KVD_HANDOFF_SESSION_BYTES];
    if (len != 2 * KVD_HANDOFF_SESSION_BYTES) {
        return KVD_ERR_AUTH;
    }
    for (size_t i = 0; i < KVD_HANDOFF_SESSION_BYTES; i++) {
        int hi = hex_nibble(hex[2 * i]), lo = hex_nibble(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            return KVD_ERR_AUTH;
        }
        secret[i] = (uint8_t)(hi << 4 | lo);
    }
    memset(zero, 0, sizeof zero);
    if (memcmp(secret, zero, sizeof zero) == 0) {
        return KVD_ERR_AUTH;
    }
    kvd_status_t s = KVD_ERR_AUTH;
    pthread_mutex_lock(&srv->sess_mu);
    for (size_t i = 0; i < SRV_SESSIONS_MAX; i++) {
        const srv_session_t *e = &srv->sessions[i];
        if (e->used && CRYPTO_memcmp(e->secret, secret, sizeof secret) == 0) {
            *tenant_out = e->tenant;
            s = KVD_OK;
            break;
        }
    }
    pthread_mutex_unlock(&srv->sess_mu);
    return s;
}

static void handoff_serve(kvd_server_t *srv, int conn)
{
    uint8_t hello[KVD_HANDOFF_HELLO_BYTES];
    uint8_t reply_buf[KVD_HANDOFF_REPLY_BYTES];
    char why[128] = "";
    int junk_fd = -1;
    kvd_handoff_reply_t reply = {.instance_id = srv->instance_id};
    kvd_status_t s = kvd_handoff_recv(conn, hello, sizeof hello,
                                      SRV_HANDOFF_TIMEOUT_MS, &junk_fd);
    if (junk_fd >= 0) {
        close(junk_fd);
        s = KVD_ERR_PROTO;
        snprintf(why, sizeof why, "hello carried a descriptor");
    }
    if (s == KVD_OK) {
        s = kvd_handoff_hello_decode(hello, sizeof hello, why, sizeof why);
    }
    struct ucred cred = {0};
    socklen_t cl = sizeof cred;
    (void)getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &cl);
    if (s != KVD_OK) {
        KVD_LOG_WARN("kvdepotd: hand-off from pid %d uid %d refused: %s",
                     (int)cred.pid, (int)cred.uid,
                     why[0] ? why : kvd_status_str(s));
        if (s == KVD_ERR_TIMEOUT || s == KVD_ERR_PEER) {
            return;
        }
        reply.status = s;
        kvd_handoff_reply_encode(&reply, reply_buf);
        (void)kvd_handoff_send(conn, reply_buf, sizeof reply_buf, -1);
        return;
    }
    /* The caller's tenant's partition: with server.tenant_arenas, a tenant
     * of its own never receives the memfd of another's bytes. */
    const char *tenant = server_uid_tenant(srv, (uint32_t)cred.uid);
    kvd_store_arena_export_t exp;
    s = kvd_store_arena_export_tenant(srv->store, kvd_service_tenant_id(tenant),
                                      &exp);
    if (s != KVD_OK) {
        reply.status = s;
        kvd_handoff_reply_encode(&reply, reply_buf);
        (void)kvd_handoff_send(conn, reply_buf, sizeof reply_buf, -1);
        return;
    }
    reply.map_bytes = exp.map_bytes;
    reply.size_bytes = exp.size_bytes;
    reply.offset = exp.offset;
    server_session_new(srv, tenant, reply.session);
    kvd_handoff_reply_encode(&reply, reply_buf);
    s = kvd_handoff_send(conn, reply_buf, sizeof reply_buf, exp.fd);
    close(exp.fd);
    KVD_LOG_DEBUG("kvdepotd: arena handed to pid %d uid %d: %s", (int)cred.pid,
                  (int)cred.uid, kvd_status_str(s));
}

static void *handoff_main(void *arg)
{
    kvd_server_t *srv = arg;
    while (!__atomic_load_n(&srv->stopping, __ATOMIC_ACQUIRE)) {
        struct pollfd p = {.fd = srv->handoff_fd, .events = POLLIN};
        int rc = poll(&p, 1, 100);
        if (rc <= 0) {
            continue;
        }
        int conn = accept4(srv->handoff_fd, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0) {
            continue;
        }
        handoff_serve(srv, conn);
        close(conn);
    }
    return NULL;
}

static kvd_status_t handoff_open(kvd_server_t *srv, unsigned mode, char *err,
                                 size_t err_len)
{
    size_t n = strlen(srv->cfg.unix_socket);
    if (n + sizeof KVD_HANDOFF_SUFFIX > sizeof srv->handoff_path) {
        kvd_config_err(err, err_len, "server.unix_socket: too long");
        return KVD_ERR_INVALID;
    }
    memcpy(srv->handoff_path, srv->cfg.unix_socket, n);
    memcpy(srv->handoff_path + n, KVD_HANDOFF_SUFFIX,
           sizeof KVD_HANDOFF_SUFFIX);
    /* rpc.c already refused to start if another daemon owns the gRPC
     * socket beside this one, so a file here is stale. */
    (void)unlink(srv->handoff_path);
    srv->handoff_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (srv->handoff_fd < 0) {
        return kvd_status_from_errno(errno);
    }
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", srv->handoff_path);
    if (bind(srv->handoff_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        chmod(srv->handoff_path, mode) != 0 ||
        listen(srv->handoff_fd, 64) != 0) {
        int e = errno;
        kvd_config_err(err, err_len, "hand-off socket %s: %s",
                       srv->handoff_path, strerror(e));
        return kvd_status_from_errno(e);
    }
    int rc = pthread_create(&srv->handoff_thread, NULL, handoff_main, srv);
    if (rc != 0) {
        return kvd_status_from_errno(rc);
    }
    srv->handoff_started = true;
    return KVD_OK;
}

/* ---- open / stop -------------------------------------------------------- */

/* Settings whose values Admin config_dump never shows. */
static bool server_secret_key(const char *key)
{
    return strcmp(key, "server.token") == 0;
}

static kvd_status_t server_config_entry(void *ctx,
                                        const kvd_config_field_t *field,
                                        const char *value, const char *source)
{
    kvd_server_t *srv = ctx;
    if (srv->n_config_entries == srv->cap_config_entries) {
        size_t cap = srv->cap_config_entries ? srv->cap_config_entries * 2 : 64;
        kvd_service_config_entry_t *e =
            realloc(srv->config_entries, cap * sizeof *e);
        if (e == NULL) {
            return KVD_ERR_NOMEM;
        }
        srv->config_entries = e;
        srv->cap_config_entries = cap;
    }
    bool hide = server_secret_key(field->name) && value[0] != '\0';
    kvd_service_config_entry_t *e = &srv->config_entries[srv->n_config_entries];
    e->key = strdup(field->name);
    e->value = strdup(hide ? "<redacted>" : value);
    e->source = strdup(source);
    srv->n_config_entries++;
    return e->key != NULL && e->value != NULL && e->source != NULL
               ? KVD_OK
               : KVD_ERR_NOMEM;
}

/* Every server.* and store.* setting as the daemon starts with it. */
static kvd_status_t server_config_entries(kvd_server_t *srv,
                                          const kvd_config_t *config)
{
    kvd_status_t s = kvd_config_visit(config, server_fields, SERVER_NFIELDS,
                                      server_config_entry, srv);
    if (s == KVD_OK) {
        s = kvd_store_visit_config(config, server_config_entry, srv);
    }
    return s;
}

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
    kvd_service_destroy(srv->svc);
    if (srv->store != NULL) {
        kvd_status_t s = kvd_store_flush(srv->store, 10000);
        if (s != KVD_OK) {
            KVD_LOG_WARN("kvdepotd: final flush: %s", kvd_status_str(s));
        }
    }
    kvd_store_close(srv->store);
    for (int i = 0; i < 3; i++) {
        free(srv->tls_pem[i]);
    }
    free(srv->sessions);
    pthread_mutex_destroy(&srv->sess_mu);
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

kvd_status_t kvd_server_open(const kvd_config_t *config,
                             kvd_server_t **server_out, char *err,
                             size_t err_len)
{
    if (server_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_server_t *srv = calloc(1, sizeof *srv);
    if (srv == NULL) {
        return KVD_ERR_NOMEM;
    }
    srv->handoff_fd = -1;
    pthread_mutex_init(&srv->sess_mu, NULL);
    pthread_rwlock_init(&srv->remote_lock, NULL);
    srv->sessions = calloc(SRV_SESSIONS_MAX, sizeof *srv->sessions);
    if (srv->sessions == NULL) {
        pthread_mutex_destroy(&srv->sess_mu);
        free(srv);
        return KVD_ERR_NOMEM;
    }
    unsigned mode = 0;
    srv->tenancy = calloc(1, sizeof *srv->tenancy);
    kvd_status_t s = srv->tenancy == NULL
                         ? KVD_ERR_NOMEM
                         : server_settings(config, &srv->cfg, &mode,
                                           srv->tenancy, err, err_len);
    if (s == KVD_OK) {
        s = server_config_entries(srv, config);
    }
    if (s != KVD_OK) {
        goto err;
    }
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
    s = server_store_settings(config, err, err_len);
    if (s == KVD_OK) {
        s = server_tls_load(srv, err, err_len);
    }
    if (s != KVD_OK) {
        goto err;
    }
    kvd_store_tenant_arena_t arenas[SRV_TENANTS_MAX];
    for (size_t i = 0; i < srv->tenancy->n_arenas; i++) {
        arenas[i] = (kvd_store_tenant_arena_t){
            .tenant = kvd_service_tenant_id(srv->tenancy->arenas[i].tenant),
            .bytes = srv->tenancy->arenas[i].bytes,
        };
    }
    s = kvd_store_open_partitioned(config, arenas, srv->tenancy->n_arenas,
                                   &srv->store, err, err_len);
    if (s != KVD_OK) {
        goto err;
    }
    for (size_t i = 0; i < srv->tenancy->n_quotas; i++) {
        s = kvd_store_tenant_set_quota(
            srv->store, kvd_service_tenant_id(srv->tenancy->quotas[i].tenant),
            srv->tenancy->quotas[i].bytes);
        if (s != KVD_OK) {
            kvd_config_err(err, err_len, "server.tenant_quotas %s: %s",
                           srv->tenancy->quotas[i].tenant, kvd_status_str(s));
            goto err;
        }
    }
    kvd_service_config_t scfg = {
        .store = srv->store,
        .node_id = srv->cfg.node_id,
        .lease_ttl_ms = (uint32_t)srv->cfg.lease_ttl_ms,
        .reservation_ttl_ms = (uint32_t)srv->cfg.reservation_ttl_ms,
        .flush_timeout_ms = (uint32_t)srv->cfg.flush_timeout_ms,
        .verify_commits = srv->cfg.verify_commits,
        .tenant_max_leased_bytes = srv->cfg.tenant_max_leased_bytes,
        .tick_ms = (uint32_t)srv->cfg.tick_ms,
        .config_entries = srv->config_entries,
        .n_config_entries = srv->n_config_entries,
    };
    if (srv->cfg.cluster_etcd[0] != '\0') {
        scfg.miss = server_miss;
        scfg.saved = server_saved;
        scfg.foreign_completion = server_foreign_completion;
        scfg.cluster_ctx = srv;
    }
    s = kvd_service_create(&scfg, &srv->svc);
    if (s != KVD_OK) {
        kvd_config_err(err, err_len, "service: %s", kvd_status_str(s));
        goto err;
    }
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
        .instance_id = srv->instance_id,
        .session = server_session_tenant,
        .session_ctx = srv,
        .sessions_required = srv->tenancy->n_uids > 0,
        .tenant_tokens = srv->rpc_tokens,
        .n_tenant_tokens = srv->tenancy->n_tokens,
        .tenant_cns = srv->rpc_cns,
        .n_tenant_cns = srv->tenancy->n_cns,
    };
    s = kvd_rpc_server_start(&rcfg, &srv->rpc, &srv->tcp_port, err, err_len);
    if (s != KVD_OK) {
        goto err;
    }
    if (srv->cfg.unix_socket[0] != '\0') {
        s = handoff_open(srv, mode, err, err_len);
        if (s != KVD_OK) {
            goto err;
        }
    }
    if (srv->cfg.cluster_etcd[0] != '\0') {
        s = server_join_cluster(srv, err, err_len);
        if (s != KVD_OK) {
            goto err;
        }
    }
    if (srv->cfg.metrics_address[0] != '\0') {
        s = kvd_metrics_start(srv, srv->cfg.metrics_address, &srv->metrics,
                              &srv->metrics_port, err, err_len);
        if (s != KVD_OK) {
            goto err;
        }
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
