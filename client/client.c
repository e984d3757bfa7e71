/*
 * The store client's life (client/client.h; its inside is client_int.h):
 * kvd_client_open checks the address, maps the daemon's arena, checks the
 * daemon answers over gRPC and starts the get thread (over TCP: no arena
 * and no get thread, the operator calls only, with a bearer token and
 * TLS when given); kvd_client_close
 * stops the thread, gives back what the caller still holds and frees. The
 * calls themselves live in the other files of client/ (client_int.h lists
 * them).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/client_int.h"
#include "common/log_int.h"
#include "store/ops.h"

/* Reads a small file an operator wrote into a new NUL-terminated buffer,
 * trailing newlines cut: a bearer token (at most 4 KiB), or with `pem` a
 * PEM text (at most 1 MiB, with a BEGIN line). `private`: refused unless
 * only its owner may read it (a token, a key). */
static kvd_status_t cl_read_file(const char *what, const char *path,
                                 bool private, bool pem, char **out, char *err,
                                 size_t err_len)
{
    size_t max = pem ? 1u << 20 : 4096;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        kvd_config_err(err, err_len, "%s \"%s\": %s", what, path,
                       strerror(errno));
        return KVD_ERR_INVALID;
    }
    struct stat st;
    kvd_status_t s = KVD_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        kvd_config_err(err, err_len, "%s \"%s\": not a regular file", what,
                       path);
        s = KVD_ERR_INVALID;
    } else if (private && (st.st_mode & 077) != 0) {
        kvd_config_err(err, err_len,
                       "%s \"%s\": readable by others (mode %03o); "
                       "chmod 600 it",
                       what, path, (unsigned)(st.st_mode & 0777));
        s = KVD_ERR_INVALID;
    } else if ((uint64_t)st.st_size > max) {
        kvd_config_err(err, err_len, "%s \"%s\": over %zu bytes", what, path,
                       max);
        s = KVD_ERR_INVALID;
    }
    char *buf = s == KVD_OK ? malloc((size_t)st.st_size + 1) : NULL;
    if (s == KVD_OK && buf == NULL) {
        s = KVD_ERR_NOMEM;
    }
    size_t len = 0;
    while (s == KVD_OK && len < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + len, (size_t)st.st_size - len);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) {
                continue;
            }
            break; /* shorter than its size said: take what was read */
        }
        len += (size_t)n;
    }
    close(fd);
    if (s != KVD_OK) {
        free(buf);
        return s;
    }
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) {
        len--;
    }
    buf[len] = '\0';
    if (len == 0 || strlen(buf) != len ||
        (pem && strstr(buf, "-----BEGIN") == NULL)) {
        kvd_config_err(err, err_len, "%s \"%s\": %s", what, path,
                       pem ? "not PEM" : "empty or not text");
        free(buf);
        return KVD_ERR_INVALID;
    }
    *out = buf;
    return KVD_OK;
}

/* tcp:HOST:PORT -> gRPC's dns:///HOST:PORT (HOST may be [v6]). */
static bool cl_tcp_target(const char *address, char *out, size_t out_len)
{
    const char *hp = address + 4;
    const char *colon = strrchr(hp, ':');
    if (colon == NULL || colon == hp || colon[1] == '\0' ||
        strspn(colon + 1, "0123456789") != strlen(colon + 1) ||
        strlen(colon + 1) > 5 || atoi(colon + 1) <= 0 ||
        atoi(colon + 1) > 65535) {
        return false;
    }
    if (hp[0] == '[' && colon[-1] != ']') {
        return false;
    }
    int n = snprintf(out, out_len, "dns:///%s", hp);
    return n > 0 && (size_t)n < out_len;
}

static kvd_status_t cl_open_remote(kvd_client_t *c,
                                   const kvd_client_config_t *cfg, char *err,
                                   size_t err_len)
{
    if (!cl_tcp_target(cfg->address, c->address, sizeof c->address)) {
        kvd_config_err(err, err_len, "store.address \"%s\": want tcp:HOST:PORT",
                       cfg->address);
        return KVD_ERR_INVALID;
    }
    c->remote = true;
    c->base.ops = &kvd_client_remote_ops;
    kvd_status_t s;
    if (cfg->token_file != NULL && cfg->token_file[0] != '\0') {
        char *token = NULL;
        s = cl_read_file("store.token_file", cfg->token_file, true, false,
                         &token, err, err_len);
        if (s != KVD_OK) {
            return s;
        }
        size_t n = strlen("Bearer ") + strlen(token) + 1;
        c->auth = malloc(n);
        if (c->auth != NULL) {
            snprintf(c->auth, n, "Bearer %s", token);
        }
        explicit_bzero(token, strlen(token));
        free(token);
        if (c->auth == NULL) {
            return KVD_ERR_NOMEM;
        }
    }
    if (cfg->tls_ca != NULL && cfg->tls_ca[0] != '\0') {
        s = cl_read_file("store.tls_ca", cfg->tls_ca, false, true,
                         &c->tls_ca_pem, err, err_len);
        if (s != KVD_OK) {
            return s;
        }
    }
    bool has_cert = cfg->tls_cert != NULL && cfg->tls_cert[0] != '\0';
    bool has_key = cfg->tls_key != NULL && cfg->tls_key[0] != '\0';
    if (has_cert != has_key || (has_cert && c->tls_ca_pem == NULL)) {
        kvd_config_err(err, err_len,
                       "store.tls_cert and store.tls_key go together, with "
                       "store.tls_ca");
        return KVD_ERR_INVALID;
    }
    if (has_cert) {
        s = cl_read_file("store.tls_cert", cfg->tls_cert, false, true,
                         &c->tls_cert_pem, err, err_len);
        if (s == KVD_OK) {
            s = cl_read_file("store.tls_key", cfg->tls_key, true, true,
                             &c->tls_key_pem, err, err_len);
        }
        if (s != KVD_OK) {
            return s;
        }
    }
    kvd_cl_channel_open(c);
    char version[64], node[KVD_PROTO_MAX_NODE_ID_BYTES + 1];
    s = kvd_client_ping(c, version, sizeof version, node, sizeof node);
    if (s != KVD_OK) {
        kvd_config_err(err, err_len, "store.address %s: ping: %s%s",
                       cfg->address, kvd_status_str(s),
                       s == KVD_ERR_AUTH
                           ? (c->auth == NULL
                                  ? " (the daemon wants a bearer token: "
                                    "store.token_file)"
                                  : " (the token was refused)")
                           : "");
        return s;
    }
    KVD_LOG_INFO("store client: kvdepotd %s (node %s) at %s over TCP%s "
                 "(operator calls only)",
                 version, node, cfg->address,
                 c->tls_ca_pem != NULL ? " with TLS" : "");
    return KVD_OK;
}

kvd_status_t kvd_client_open(const kvd_client_config_t *cfg,
                             kvd_client_t **client_out, char *err,
                             size_t err_len)
{
    if (cfg == NULL || cfg->address == NULL || client_out == NULL ||
        cfg->timeout_ms == 0 || cfg->get_queue == 0) {
        return KVD_ERR_INVALID;
    }
    if (strncmp(cfg->address, "tcp:", 4) == 0) {
        kvd_client_t *c = calloc(1, sizeof *c);
        if (c == NULL) {
            return KVD_ERR_NOMEM;
        }
        c->cfg = *cfg;
        c->cfg.address = c->address;
        c->cfg.token_file = NULL;
        c->cfg.tls_ca = NULL;
        c->cfg.tls_cert = NULL;
        c->cfg.tls_key = NULL;
        c->arena_fd = -1;
        c->handoff_fd = -1;
        pthread_mutex_init(&c->mu, NULL);
        pthread_mutex_init(&c->ev_mu, NULL);
        pthread_cond_init(&c->get_cv, NULL);
        kvd_status_t s = cl_open_remote(c, cfg, err, err_len);
        if (s != KVD_OK) {
            kvd_client_close(c);
            return s;
        }
        *client_out = c;
        return KVD_OK;
    }
    size_t path_max =
        sizeof(((struct sockaddr_un *)0)->sun_path) - sizeof KVD_HANDOFF_SUFFIX;
    if (strncmp(cfg->address, "unix:", 5) != 0 || cfg->address[5] == '\0' ||
        strlen(cfg->address + 5) >= path_max) {
        kvd_config_err(err, err_len,
                       "store.address \"%s\": want unix:PATH (the daemon's "
                       "socket on this node: the arena is shared through it), "
                       "or tcp:HOST:PORT for the operator calls",
                       cfg->address);
        return KVD_ERR_INVALID;
    }
    kvd_client_t *c = calloc(1, sizeof *c);
    if (c == NULL) {
        return KVD_ERR_NOMEM;
    }
    c->base.ops = &kvd_client_store_ops;
    c->cfg = *cfg;
    snprintf(c->address, sizeof c->address, "%s", cfg->address);
    c->cfg.address = c->address;
    size_t plen = strlen(cfg->address + 5); /* < path_max, checked above */
    memcpy(c->shm_path, cfg->address + 5, plen);
    memcpy(c->shm_path + plen, KVD_HANDOFF_SUFFIX, sizeof KVD_HANDOFF_SUFFIX);
    c->arena_fd = -1;
    c->handoff_fd = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->ev_mu, NULL);
    pthread_cond_init(&c->get_cv, NULL);
    size_t cap = 2;
    while (cap < cfg->get_queue) {
        cap <<= 1;
    }
    kvd_status_t s =
        kvd_ring_create(cap, sizeof(kvd_store_completion_t), &c->cq);
    if (s != KVD_OK) {
        goto err;
    }
    kvd_cl_channel_open(c);
    pthread_mutex_lock(&c->mu);
    s = kvd_cl_arena_map(c, err, err_len);
    pthread_mutex_unlock(&c->mu);
    if (s != KVD_OK) {
        goto err;
    }
    /* The gRPC side answers too (same daemon, same instance). */
    char version[64], node[KVD_PROTO_MAX_NODE_ID_BYTES + 1];
    s = kvd_client_ping(c, version, sizeof version, node, sizeof node);
    if (s != KVD_OK) {
        kvd_config_err(err, err_len, "store.address %s: ping: %s", c->address,
                       kvd_status_str(s));
        goto err;
    }
    int rc = pthread_create(&c->get_thread, NULL, kvd_cl_get_main, c);
    if (rc != 0) {
        s = kvd_status_from_errno(rc);
        goto err;
    }
    c->get_thread_started = true;
    KVD_LOG_INFO("store client: kvdepotd %s (node %s) at %s, arena %llu MiB",
                 version, node, c->address,
                 (unsigned long long)(c->size_bytes >> 20));
    *client_out = c;
    return KVD_OK;
err:
    kvd_client_close(c);
    return s;
}

void kvd_client_close(kvd_client_t *c)
{
    if (c == NULL) {
        return;
    }
    pthread_mutex_lock(&c->mu);
    c->stopping = true;
    pthread_cond_broadcast(&c->get_cv);
    pthread_mutex_unlock(&c->mu);
    if (c->get_thread_started) {
        pthread_join(c->get_thread, NULL);
    }
    if (c->ch != NULL) {
        kvd_cl_flush_releases(c);
    }
    /* Leases and reservations still held are the daemon's to reclaim at
     * their TTL; give the leases back now to spare it the wait. */
    uint64_t *ids = c->n_groups ? calloc(c->n_groups, sizeof *ids) : NULL;
    size_t k = 0;
    for (uint32_t i = 0; ids != NULL && i < c->n_groups; i++) {
        if (c->groups[i].refs > 0 && c->groups[i].instance == c->instance) {
            ids[k++] = c->groups[i].lease_id;
        }
    }
    for (size_t off = 0; c->ch != NULL && off < k; off += 4096) {
        kvd_cl_release_ids(c, ids + off, k - off < 4096 ? k - off : 4096);
    }
    free(ids);
    for (size_t b = 0; b < CL_BUCKETS; b++) {
        while (c->resv[b] != NULL) {
            cl_resv_t *r = c->resv[b];
            c->resv[b] = r->next;
            free(r);
        }
    }
    kvd_cl_channel_close(c);
    kvd_cl_arena_unmap_all(c);
    if (c->auth != NULL) {
        explicit_bzero(c->auth, strlen(c->auth));
    }
    free(c->auth);
    free(c->tls_ca_pem);
    free(c->tls_cert_pem);
    if (c->tls_key_pem != NULL) {
        explicit_bzero(c->tls_key_pem, strlen(c->tls_key_pem));
    }
    free(c->tls_key_pem);
    kvd_ring_destroy(c->cq);
    free(c->rel);
    free(c->groups);
    free(c->lblocks);
    pthread_cond_destroy(&c->get_cv);
    pthread_mutex_destroy(&c->ev_mu);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

kvd_store_t *kvd_client_store(kvd_client_t *c)
{
    return c == NULL ? NULL : &c->base;
}

kvd_client_t *kvd_client_of(kvd_store_t *store)
{
    return store != NULL && (store->ops == &kvd_client_store_ops ||
                             store->ops == &kvd_client_remote_ops)
               ? (kvd_client_t *)store
               : NULL;
}
