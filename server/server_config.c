/*
 * kvdepotd's settings: the `server.*` and `cluster.*` table (name, default,
 * doc, parser), resolving it with the store's own settings, the token and
 * TLS files, kvd_server_print_config / kvd_server_check_config (every
 * check the start makes before it opens anything: values, listeners'
 * addresses, writable directories, readable files, tenants), "did you
 * mean" for unknown keys, and the list of settings Admin config_dump
 * answers with (secrets redacted). The
 * tenant mappings among the settings are parsed by server_tenancy.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "common/config_int.h"
#include "proto/kvd_proto.h"
#include "store/engine.h"
#include "cluster/placement.h"
#include "server/srv_int.h"

#define SRV_OFF(m) offsetof(kvd_server_settings_t, m)

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
    {"server.metrics_max_connections", "32",
     "HTTP connections the metrics listener holds at once (1-1024): one "
     "past it is closed at accept, so idle or slow clients cannot take "
     "the daemon's file descriptors",
     kvd_config_parse_int, SRV_OFF(metrics_max_connections), 1, 1024, NULL},
    {"server.tenants", "",
     "uid -> tenant: a YAML mapping {1001: team-a} or uid=tenant pairs, "
     "comma-separated (\"1001=team-a,1002=team-b\"): a "
     "local client's saves count against the tenant of its user, whatever "
     "the request says; when set, every local call must come with its "
     "arena hand-off session",
     kvd_config_parse_pairs, SRV_OFF(tenants), 0, 0, NULL},
    {"server.token_tenants", "",
     "file of \"tenant token\" lines (mode 0600 or stricter; tokens of 16 "
     "to 256 characters): a TCP caller presenting one of these tokens is "
     "bound to its tenant (saves, listings and drops are that tenant's)",
     kvd_config_parse_string, SRV_OFF(token_tenants), 0, 0, NULL},
    {"server.tls_tenants", "",
     "cn -> tenant: a YAML mapping or cn=tenant pairs, comma-separated "
     "(\"engine-a=team-a\"): a TCP caller "
     "whose client certificate has that common name is bound to the tenant",
     kvd_config_parse_pairs, SRV_OFF(tls_tenants), 0, 0, NULL},
    {"server.tenant_quotas", "",
     "tenant -> size: a YAML mapping or tenant=size pairs, comma-separated "
     "(\"team-a=8g,team-b=4g\"): the most "
     "arena bytes a tenant's objects hold; its saves evict its own objects "
     "beyond that, never another tenant's",
     kvd_config_parse_pairs, SRV_OFF(tenant_quotas), 0, 0, NULL},
    {"server.tenant_arenas", "",
     "tenant -> size: a YAML mapping or tenant=size pairs, comma-separated "
     "(\"team-a=8g\"): each tenant named "
     "gets an arena of that size of its own, in addition to "
     "store.arena_size; its local clients map that arena only, so they "
     "cannot read any other tenant's bytes, and its objects evict only each "
     "other (at most 16 tenants; sizes whole store.arena_chunk multiples)",
     kvd_config_parse_pairs, SRV_OFF(tenant_arenas), 0, 0, NULL},
    {"server.tenant_arena_size", "auto",
     "the arena of each tenant of server.tenants that server.tenant_arenas "
     "does not size: auto (an equal share carved out of store.arena_size: "
     "with n such tenants, 1 / (n + 1) each, the main arena keeping the "
     "rest) | a size (in addition to store.arena_size) | shared (no arena "
     "of its own: tenants in the main arena can read and overwrite each "
     "other's objects through their read-write mapping)",
     kvd_config_parse_string, SRV_OFF(tenant_arena_size), 0, 0, NULL},
    {"cluster.etcd", "",
     "etcd endpoint host:port of the cluster (\"\": this daemon is alone); "
     "the daemon registers there and keeps the view of the others",
     kvd_config_parse_list, SRV_OFF(cluster_etcd), 0, 0, NULL},
    {"cluster.etcd_tls_ca", "",
     "PEM CA certificate etcd's server certificate must be signed by: the "
     "daemon speaks TLS to etcd (\"\": plaintext)",
     kvd_config_parse_string, SRV_OFF(cluster_etcd_tls_ca), 0, 0, NULL},
    {"cluster.etcd_tls_cert", "",
     "PEM client certificate presented to etcd (its --client-cert-auth; "
     "with cluster.etcd_tls_key and cluster.etcd_tls_ca; \"\": none)",
     kvd_config_parse_string, SRV_OFF(cluster_etcd_tls_cert), 0, 0, NULL},
    {"cluster.etcd_tls_key", "", "PEM private key of cluster.etcd_tls_cert",
     kvd_config_parse_string, SRV_OFF(cluster_etcd_tls_key), 0, 0, NULL},
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
    {"server.max_streams", "64",
     "concurrent gRPC calls one connection may have open (HTTP/2 "
     "MAX_CONCURRENT_STREAMS; more wait at the client)",
     kvd_config_parse_int, SRV_OFF(max_streams), 1, 65536, NULL},
    {"server.handshake_timeout", "10s",
     "how long a TCP connection may take to finish its handshake (TLS) "
     "before it is closed; stalled clients hold a file descriptor until "
     "then",
     kvd_config_parse_duration_ms, SRV_OFF(handshake_timeout_ms), 100, 120000,
     NULL},
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
    {"server.max_sessions_per_uid", "256",
     "hand-off sessions (stores open) one user may hold at once; a hand-off "
     "past it is refused with KVD_ERR_BUSY",
     kvd_config_parse_int, SRV_OFF(max_sessions_per_uid), 1,
     SRV_HANDOFF_CONNS_MAX, NULL},
    {"server.reservation_ttl", "30s",
     "reservation lifetime when Reserve asks for 0",
     kvd_config_parse_duration_ms, SRV_OFF(reservation_ttl_ms), 1,
     KVD_PROTO_MAX_TTL_MS, NULL},
    {"server.reservation_ttl_max", "60s",
     "longest reservation lifetime granted: a Reserve asking for more gets "
     "this (the reply says what it got)",
     kvd_config_parse_duration_ms, SRV_OFF(reservation_ttl_max_ms), 1,
     KVD_PROTO_MAX_TTL_MS, NULL},
    {"server.max_reserved_bytes", "0",
     "bytes one caller (a tenant; without tenants, one client session) may "
     "hold reserved at once; beyond it Reserve answers KVD_ERR_NOSPACE for "
     "its blocks (0: a quarter of store.arena_size)",
     kvd_config_parse_size, SRV_OFF(max_reserved_bytes), 0, INT64_MAX, NULL},
    {"server.flush_timeout", "30s", "Admin flush deadline when it asks for 0",
     kvd_config_parse_duration_ms, SRV_OFF(flush_timeout_ms), 1,
     KVD_PROTO_MAX_TTL_MS, NULL},
    {"server.shutdown_grace", "5s",
     "how long SIGTERM waits for calls in progress before cancelling",
     kvd_config_parse_duration_ms, SRV_OFF(shutdown_grace_ms), 0, 600000, NULL},
    {"server.tick", "50ms",
     "housekeeping period: lease and reservation expiry precision",
     kvd_config_parse_duration_ms, SRV_OFF(tick_ms), 1, 10000, NULL},
    {"server.exit_when_idle", "0",
     "stop gracefully (as on SIGTERM) once no local client (arena hand-off "
     "session) has been connected for this long, counted from the start "
     "or from the end of the last one; needs server.unix_socket (0: never)",
     kvd_config_parse_duration_ms, SRV_OFF(exit_when_idle_ms), 0,
     KVD_PROTO_MAX_TTL_MS, NULL},
    {"server.verify_commits", "true",
     "check each committed object's bytes against the client's checksum",
     kvd_config_parse_bool, SRV_OFF(verify_commits), 0, 0, NULL},
};

#define SERVER_NFIELDS (sizeof server_fields / sizeof server_fields[0])

/* Every setting kvdepotd knows, at most (server.*, cluster.*, store.*,
 * the command line's log.*). */
#define SERVER_KNOWN_MAX 256

kvd_status_t kvd_server_print_config(const kvd_config_t *config, FILE *out)
{
    kvd_status_t s =
        kvd_config_print(config, server_fields, SERVER_NFIELDS, out);
    if (s == KVD_OK) {
        s = kvd_store_print_config(config, out);
    }
    return s;
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

kvd_status_t srv_settings(const kvd_config_t *config,
                          kvd_server_settings_t *cfg, unsigned *mode,
                          srv_tenancy_t *tenancy, char *err, size_t err_len)
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
    if (cfg->exit_when_idle_ms != 0 && cfg->unix_socket[0] == '\0') {
        kvd_config_err(err, err_len,
                       "server.exit_when_idle counts local clients: it needs "
                       "server.unix_socket");
        return KVD_ERR_INVALID;
    }
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
        kvd_status_t ts = srv_tenancy_parse(cfg, tenancy, err, err_len);
        if (ts != KVD_OK) {
            return ts;
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

kvd_status_t srv_tls_read(const kvd_server_settings_t *cfg, char *pem[3],
                          char *err, size_t err_len)
{
    const char *keys[3] = {"server.tls_cert", "server.tls_key",
                           "server.tls_client_ca"};
    const char *paths[3] = {cfg->tls_cert, cfg->tls_key, cfg->tls_client_ca};
    int set = 0;
    for (int i = 0; i < 3; i++) {
        pem[i] = NULL;
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
            server_read_pem(keys[i], paths[i], &pem[i], err, err_len);
        if (s != KVD_OK) {
            return s;
        }
    }
    return KVD_OK;
}

kvd_status_t srv_etcd_tls_read(const kvd_server_settings_t *cfg, char *pem[3],
                               char *err, size_t err_len)
{
    const char *keys[3] = {"cluster.etcd_tls_ca", "cluster.etcd_tls_cert",
                           "cluster.etcd_tls_key"};
    const char *paths[3] = {cfg->cluster_etcd_tls_ca,
                            cfg->cluster_etcd_tls_cert,
                            cfg->cluster_etcd_tls_key};
    for (int i = 0; i < 3; i++) {
        pem[i] = NULL;
    }
    bool ca = paths[0][0] != '\0', cert = paths[1][0] != '\0',
         key = paths[2][0] != '\0';
    if ((ca || cert || key) && cfg->cluster_etcd[0] == '\0') {
        kvd_config_err(err, err_len,
                       "cluster.etcd_tls_* are set but cluster.etcd is not");
        return KVD_ERR_INVALID;
    }
    if (cert != key || (cert && !ca)) {
        kvd_config_err(err, err_len,
                       "cluster.etcd_tls_cert and cluster.etcd_tls_key go "
                       "together, and need cluster.etcd_tls_ca");
        return KVD_ERR_INVALID;
    }
    for (int i = 0; i < 3; i++) {
        kvd_status_t s =
            paths[i][0] != '\0'
                ? server_read_pem(keys[i], paths[i], &pem[i], err, err_len)
                : KVD_OK;
        if (s != KVD_OK) {
            return s;
        }
    }
    return KVD_OK;
}

/* The winning value of one store.* setting (kvd_store_visit_config). */
typedef struct server_store_value {
    const char *key;
    char value[KVD_CONFIG_STRING_MAX];
} server_store_value_t;

static kvd_status_t server_store_value_cb(void *ctx,
                                          const kvd_config_field_t *field,
                                          const char *value, const char *source)
{
    server_store_value_t *v = ctx;
    (void)source;
    if (strcmp(field->name, v->key) == 0) {
        snprintf(v->value, sizeof v->value, "%s", value);
    }
    return KVD_OK;
}

/* `dir` is a directory this process may create files in. */
static kvd_status_t server_check_dir(const char *key, const char *what,
                                     const char *dir, char *err, size_t err_len)
{
    struct stat st;
    if (stat(dir, &st) != 0) {
        int e = errno;
        kvd_config_err(err, err_len, "%s: %s %s: %s", key, what, dir,
                       strerror(e));
        return kvd_status_from_errno(e);
    }
    if (!S_ISDIR(st.st_mode)) {
        kvd_config_err(err, err_len, "%s: %s %s is not a directory", key, what,
                       dir);
        return KVD_ERR_INVALID;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        int e = errno;
        kvd_config_err(err, err_len, "%s: %s %s is not writable: %s", key, what,
                       dir, strerror(e));
        return kvd_status_from_errno(e);
    }
    return KVD_OK;
}

/* The directory of `path` (".": none named) into `out`. */
static void server_parent(const char *path, char *out, size_t out_len)
{
    snprintf(out, out_len, "%s", path);
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') {
        out[--n] = '\0';
    }
    char *slash = strrchr(out, '/');
    if (slash == NULL) {
        snprintf(out, out_len, ".");
    } else if (slash == out) {
        out[1] = '\0';
    } else {
        *slash = '\0';
    }
}

/* store.disk_path: an existing writable directory, or one the store can
 * create (it makes the last component only). */
static kvd_status_t server_check_disk_path(const kvd_config_t *config,
                                           char *err, size_t err_len)
{
    server_store_value_t v = {.key = "store.disk_path"};
    kvd_status_t s = kvd_store_visit_config(config, server_store_value_cb, &v);
    if (s != KVD_OK || v.value[0] == '\0') {
        return s;
    }
    struct stat st;
    if (stat(v.value, &st) == 0 || errno != ENOENT) {
        return server_check_dir("store.disk_path", "directory", v.value, err,
                                err_len);
    }
    char parent[KVD_CONFIG_STRING_MAX];
    server_parent(v.value, parent, sizeof parent);
    return server_check_dir("store.disk_path", "parent directory", parent, err,
                            err_len);
}

kvd_status_t srv_check_world(const kvd_server_settings_t *cfg,
                             const srv_tenancy_t *tenancy, char *const pem[3],
                             char *err, size_t err_len)
{
    kvd_rpc_config_t rcfg = {
        .unix_path = cfg->unix_socket,
        .tcp_address = cfg->tcp_address,
        .token = cfg->token,
        .tls_cert_pem = pem[0],
        .tls_key_pem = pem[1],
        .tls_ca_pem = pem[2],
        .n_tenant_tokens = tenancy->n_tokens,
    };
    kvd_status_t s = kvd_rpc_config_check(&rcfg, err, err_len);
    if (s == KVD_OK && cfg->metrics_address[0] != '\0') {
        struct sockaddr_storage sa;
        s = kvd_metrics_address_parse(cfg->metrics_address, &sa, err, err_len);
    }
    return s;
}

kvd_status_t srv_check_paths(const kvd_config_t *config,
                             const kvd_server_settings_t *cfg, char *err,
                             size_t err_len)
{
    kvd_status_t s = KVD_OK;
    if (cfg->unix_socket[0] != '\0') {
        char parent[KVD_CONFIG_STRING_MAX];
        server_parent(cfg->unix_socket, parent, sizeof parent);
        s = server_check_dir("server.unix_socket", "directory", parent, err,
                             err_len);
    }
    if (s == KVD_OK) {
        s = server_check_disk_path(config, err, err_len);
    }
    return s;
}

/* The store side of the settings: valid, and the daemon's own store. */
kvd_status_t srv_store_settings(const kvd_config_t *config, char *err,
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

/* One error of a check: to the caller's report function, or the first
 * into the caller's buffer. */
typedef struct server_check {
    kvd_server_report_fn report;
    void *ctx;
    char *err;
    size_t err_len;
    bool paths; /* srv_check_paths too */
    size_t n_errors;
    kvd_status_t first;
} server_check_t;

static void server_check_fail(server_check_t *c, kvd_status_t s,
                              const char *msg)
{
    if (c->n_errors++ == 0) {
        c->first = s;
        kvd_config_err(c->err, c->err_len, "%s", msg);
    }
    if (c->report != NULL) {
        c->report(c->ctx, msg[0] != '\0' ? msg : kvd_status_str(s));
    }
}

/* The settings that need the server.* ones resolved: TLS files readable,
 * the listeners (srv_check_world), the directories (srv_check_paths,
 * when asked). */
static void server_check_resolved(const kvd_config_t *config,
                                  const kvd_server_settings_t *cfg,
                                  const srv_tenancy_t *tenancy,
                                  server_check_t *c, char *msg, size_t msg_len)
{
    char *pem[3] = {NULL, NULL, NULL};
    char *etcd_pem[3] = {NULL, NULL, NULL};
    msg[0] = '\0';
    kvd_status_t s = srv_tls_read(cfg, pem, msg, msg_len);
    if (s != KVD_OK) {
        server_check_fail(c, s, msg);
    }
    msg[0] = '\0';
    s = srv_etcd_tls_read(cfg, etcd_pem, msg, msg_len);
    if (s != KVD_OK) {
        server_check_fail(c, s, msg);
    }
    msg[0] = '\0';
    s = srv_check_world(cfg, tenancy, pem, msg, msg_len);
    if (s != KVD_OK) {
        server_check_fail(c, s, msg);
    }
    msg[0] = '\0';
    s = c->paths ? srv_check_paths(config, cfg, msg, msg_len) : KVD_OK;
    if (s != KVD_OK) {
        server_check_fail(c, s, msg);
    }
    for (int i = 0; i < 3; i++) {
        if (pem[i] != NULL) {
            OPENSSL_cleanse(pem[i], strlen(pem[i]));
        }
        if (etcd_pem[i] != NULL) {
            OPENSSL_cleanse(etcd_pem[i], strlen(etcd_pem[i]));
        }
        free(pem[i]);
        free(etcd_pem[i]);
    }
}

/* Every check of the start, each independent group reporting its first
 * error: the server.* settings (then what needs them resolved), the
 * store.* settings. */
static void server_check_run(const kvd_config_t *config, server_check_t *c)
{
    char msg[1024] = "";
    kvd_server_settings_t *cfg = calloc(1, sizeof *cfg);
    srv_tenancy_t *tenancy = calloc(1, sizeof *tenancy);
    unsigned mode = 0;
    kvd_status_t s =
        cfg == NULL || tenancy == NULL
            ? KVD_ERR_NOMEM
            : srv_settings(config, cfg, &mode, tenancy, msg, sizeof msg);
    if (s != KVD_OK) {
        server_check_fail(c, s, msg);
    } else {
        server_check_resolved(config, cfg, tenancy, c, msg, sizeof msg);
    }
    if (tenancy != NULL) {
        OPENSSL_cleanse(tenancy, sizeof *tenancy);
    }
    free(tenancy);
    if (cfg != NULL) {
        OPENSSL_cleanse(cfg, sizeof *cfg);
    }
    free(cfg);
    msg[0] = '\0';
    s = srv_store_settings(config, msg, sizeof msg);
    if (s != KVD_OK) {
        server_check_fail(c, s, msg);
    }
}

kvd_status_t kvd_server_check_config(const kvd_config_t *config, char *err,
                                     size_t err_len)
{
    server_check_t c = {.err = err, .err_len = err_len, .paths = true};
    server_check_run(config, &c);
    return c.n_errors == 0 ? KVD_OK : c.first;
}

size_t kvd_server_check_config_each(const kvd_config_t *config, bool paths,
                                    kvd_server_report_fn report, void *ctx)
{
    server_check_t c = {.report = report, .ctx = ctx, .paths = paths};
    server_check_run(config, &c);
    return c.n_errors;
}

/* Gathers the names of the store's settings (kvd_store_visit_config). */
typedef struct server_names {
    const char *names[SERVER_KNOWN_MAX];
    size_t n;
} server_names_t;

static kvd_status_t server_name_cb(void *ctx, const kvd_config_field_t *field,
                                   const char *value, const char *source)
{
    server_names_t *nm = ctx;
    (void)value;
    (void)source;
    if (nm->n < SERVER_KNOWN_MAX) {
        nm->names[nm->n++] = field->name; /* the store's static table */
    }
    return KVD_OK;
}

bool kvd_server_config_known(const char *key, const kvd_config_field_t *extra,
                             size_t n_extra, const char **closest_out)
{
    server_names_t *nm = calloc(1, sizeof *nm);
    bool known = false;
    *closest_out = NULL;
    if (nm == NULL) {
        return true; /* cannot tell: let the start's own check decide */
    }
    for (size_t i = 0; i < n_extra && nm->n < SERVER_KNOWN_MAX; i++) {
        nm->names[nm->n++] = extra[i].name;
    }
    for (size_t i = 0; i < SERVER_NFIELDS && nm->n < SERVER_KNOWN_MAX; i++) {
        nm->names[nm->n++] = server_fields[i].name;
    }
    (void)kvd_store_visit_config(NULL, server_name_cb, nm);
    for (size_t i = 0; i < nm->n && !known; i++) {
        known = strcmp(nm->names[i], key) == 0;
    }
    if (!known) {
        *closest_out = kvd_config_closest(key, nm->names, nm->n);
    }
    free(nm);
    return known;
}
/* ---- Admin config_dump ----------------------------------------------- */

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
kvd_status_t srv_config_entries(kvd_server_t *srv, const kvd_config_t *config)
{
    kvd_status_t s = kvd_config_visit(config, server_fields, SERVER_NFIELDS,
                                      server_config_entry, srv);
    if (s == KVD_OK) {
        s = kvd_store_visit_config(config, server_config_entry, srv);
    }
    return s;
}
