/*
 * The tenant mappings of kvdepotd's settings: server.tenants (uid=tenant:
 * a local client's tenant is its user's), server.token_tenants (a file of
 * "tenant token" lines: a TCP caller's bearer token binds its tenant),
 * server.tls_tenants (cn=tenant: a client certificate's common name binds
 * its tenant), server.tenant_quotas and server.tenant_arenas
 * (tenant=size). Secrets files must be private to their owner
 * (srv_open_private); tokens are wiped from the stack once copied.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "common/config_int.h"
#include "server/srv_int.h"
#include "store/arena.h"

static bool srv_tenant_name_ok(const char *name, size_t len)
{
    return len > 0 && len <= SRV_TENANT_NAME_MAX &&
           strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTU"
                        "VWXYZ0123456789._-") == len;
}

/* Opens a secrets file (`key` names the setting in errors): a regular
 * file that neither group nor others may read. NULL with *status set
 * otherwise. */
FILE *srv_open_private(const char *key, const char *path, kvd_status_t *status,
                       char *err, size_t err_len)
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

/* server.tenant_arena_size: every tenant of server.tenants without an
 * entry in server.tenant_arenas gets an arena of its own, of that size or
 * (auto, 0 bytes here) an equal share the store carves out of the main
 * arena; "shared" leaves them in the main arena. */
static kvd_status_t srv_default_arenas(const char *size, srv_tenancy_t *t,
                                       char *err, size_t err_len)
{
    static const kvd_config_field_t size_field = {"server.tenant_arena_size",
                                                  "",
                                                  "",
                                                  kvd_config_parse_size,
                                                  0,
                                                  0,
                                                  0,
                                                  NULL};
    uint64_t bytes = 0;
    if (strcmp(size, "shared") == 0) {
        return KVD_OK;
    }
    if (strcmp(size, "auto") != 0 &&
        (kvd_config_parse_size(&size_field, size, &bytes, NULL, 0) != KVD_OK ||
         bytes == 0)) {
        kvd_config_err(err, err_len,
                       "server.tenant_arena_size \"%s\": want auto, shared or "
                       "a size above 0",
                       size);
        return KVD_ERR_INVALID;
    }
    for (size_t i = 0; i < t->n_uids; i++) {
        bool sized = false;
        for (size_t j = 0; j < t->n_arenas && !sized; j++) {
            sized = strcmp(t->arenas[j].tenant, t->uids[i].name) == 0;
        }
        if (sized) {
            continue;
        }
        if (t->n_arenas == KVD_ARENA_PARTS_MAX) {
            kvd_config_err(err, err_len,
                           "server.tenants: more than %d tenants would have "
                           "an arena of their own; set "
                           "server.tenant_arena_size=shared to keep the "
                           "others in the main arena (they can then read and "
                           "overwrite each other's objects)",
                           (int)KVD_ARENA_PARTS_MAX);
            return KVD_ERR_INVALID;
        }
        struct srv_tenant_bytes *a = &t->arenas[t->n_arenas++];
        snprintf(a->tenant, sizeof a->tenant, "%s", t->uids[i].name);
        a->bytes = bytes;
    }
    return KVD_OK;
}

kvd_status_t srv_tenancy_parse(const kvd_server_settings_t *cfg,
                               srv_tenancy_t *tenancy, char *err,
                               size_t err_len)
{
    tenancy->n_uids = tenancy->n_tokens = tenancy->n_cns = 0;
    tenancy->n_quotas = 0;
    tenancy->n_arenas = 0;
    kvd_status_t ts = srv_pairs("server.tenants", cfg->tenants,
                                "uid=tenant pairs, " SRV_NAMES, srv_uid_pair,
                                tenancy, err, err_len);
    if (ts == KVD_OK && cfg->token_tenants[0] != '\0') {
        ts = server_token_tenants(cfg->token_tenants, tenancy, err, err_len);
    }
    if (ts == KVD_OK) {
        ts = srv_pairs("server.tls_tenants", cfg->tls_tenants,
                       "cn=tenant pairs, " SRV_NAMES, srv_cn_pair, tenancy, err,
                       err_len);
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
    if (ts == KVD_OK) {
        ts = srv_default_arenas(cfg->tenant_arena_size, tenancy, err, err_len);
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
    return KVD_OK;
}
