/*
 * The shared-memory hand-off listener (server.unix_socket + ".shm"): a
 * local client sends a HELLO (client/handoff.h) and gets a REPLY with the
 * memfd of the arena its user's tenant may map (its own with
 * server.tenant_arenas) and a fresh session secret; its gRPC calls then
 * name that session, which binds them to the tenant (srv_session_tenant).
 *
 * The listener is one thread: each exchange is one 16-byte HELLO and one
 * 64-byte REPLY with the memfd, bounded by a 1 s receive timeout, so a
 * stuck client delays the next one by at most that. After the exchange
 * the connection stays open for as long as the client keeps it (the life
 * of its mapping); the thread polls those connections with the listener,
 * and when one ends (the client closed its store or died: the kernel
 * closes the socket) the session is closed in the service, which gives
 * back the expired leases and reservations it kept quarantined for it.
 * A client that closes the connection at once (an older one) has its
 * session closed at once: its expired leases go back at their deadline.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "store/engine.h"
#include "server/srv_int.h"

#define SRV_HANDOFF_TIMEOUT_MS 1000

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
static uint64_t server_session_new(kvd_server_t *srv, const char *tenant,
                                   uint8_t *secret_out)
{
    if (getrandom(secret_out, KVD_HANDOFF_SESSION_BYTES, 0) !=
        (ssize_t)KVD_HANDOFF_SESSION_BYTES) {
        /* No randomness: an all-zero secret no client can present (the
         * session check refuses it), so mapped users are refused, not
         * confused. */
        memset(secret_out, 0, KVD_HANDOFF_SESSION_BYTES);
        return 0;
    }
    pthread_mutex_lock(&srv->sess_mu);
    uint64_t id = ++srv->sess_ids;
    srv_session_t *e = &srv->sessions[srv->sess_next];
    srv->sess_next = (srv->sess_next + 1) % SRV_SESSIONS_MAX;
    memcpy(e->secret, secret_out, KVD_HANDOFF_SESSION_BYTES);
    e->tenant = tenant;
    e->id = id;
    e->used = true;
    pthread_mutex_unlock(&srv->sess_mu);
    /* Open in the service before the client can make a call with it. */
    if (kvd_service_session_open(srv->svc, id) != KVD_OK) {
        return 0; /* no quarantine for it; calls still work */
    }
    return id;
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
kvd_status_t srv_session_tenant(void *ctx, const char *hex, size_t len,
                                const char **tenant_out, uint64_t *session_out)
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
            *session_out = e->id;
            s = KVD_OK;
            break;
        }
    }
    pthread_mutex_unlock(&srv->sess_mu);
    return s;
}

/* Serves one exchange on `conn`; returns the session it opened (0: none,
 * the connection is to be closed). */
static uint64_t handoff_serve(kvd_server_t *srv, int conn)
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
            return 0;
        }
        reply.status = s;
        kvd_handoff_reply_encode(&reply, reply_buf);
        (void)kvd_handoff_send(conn, reply_buf, sizeof reply_buf, -1);
        return 0;
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
        return 0;
    }
    reply.map_bytes = exp.map_bytes;
    reply.size_bytes = exp.size_bytes;
    reply.offset = exp.offset;
    uint64_t session = server_session_new(srv, tenant, reply.session);
    kvd_handoff_reply_encode(&reply, reply_buf);
    s = kvd_handoff_send(conn, reply_buf, sizeof reply_buf, exp.fd);
    close(exp.fd);
    KVD_LOG_DEBUG("kvdepotd: arena handed to pid %d uid %d (session %llu): "
                  "%s",
                  (int)cred.pid, (int)cred.uid, (unsigned long long)session,
                  kvd_status_str(s));
    if (s != KVD_OK) {
        kvd_service_session_close(srv->svc, session);
        return 0;
    }
    return session;
}

/* Ends connection `i`: the client is gone, and so is its session. */
static void handoff_conn_end(kvd_server_t *srv, size_t i)
{
    close(srv->conns[i].fd);
    kvd_service_session_close(srv->svc, srv->conns[i].session);
    srv->conns[i] = srv->conns[--srv->n_conns];
}

/* Accepts and serves one client; keeps its connection while it has a
 * session and there is room. */
static void handoff_accept(kvd_server_t *srv)
{
    int conn = accept4(srv->handoff_fd, NULL, NULL, SOCK_CLOEXEC);
    if (conn < 0) {
        return;
    }
    uint64_t session = handoff_serve(srv, conn);
    if (session != 0 && srv->n_conns < SRV_HANDOFF_CONNS_MAX) {
        srv->conns[srv->n_conns++] = (srv_handoff_conn_t){conn, session};
        return;
    }
    if (session != 0) {
        KVD_LOG_WARN("kvdepotd: %d hand-off connections open; session %llu "
                     "is not kept (its expired leases are not quarantined)",
                     SRV_HANDOFF_CONNS_MAX, (unsigned long long)session);
        kvd_service_session_close(srv->svc, session);
    }
    close(conn);
}

static void *handoff_main(void *arg)
{
    kvd_server_t *srv = arg;
    struct pollfd *p = calloc(SRV_HANDOFF_CONNS_MAX + 1, sizeof *p);
    srv->conns = calloc(SRV_HANDOFF_CONNS_MAX, sizeof *srv->conns);
    if (p == NULL || srv->conns == NULL) {
        KVD_LOG_ERROR("kvdepotd: hand-off thread: out of memory");
        free(p);
        return NULL;
    }
    while (!__atomic_load_n(&srv->stopping, __ATOMIC_ACQUIRE)) {
        p[0] = (struct pollfd){.fd = srv->handoff_fd, .events = POLLIN};
        for (size_t i = 0; i < srv->n_conns; i++) {
            p[i + 1] =
                (struct pollfd){.fd = srv->conns[i].fd, .events = POLLIN};
        }
        size_t n = srv->n_conns;
        int rc = poll(p, n + 1, 100);
        if (rc <= 0) {
            continue;
        }
        /* A kept connection carries nothing after the exchange: any
         * event on it (hang-up, error, stray bytes) ends it. From the
         * last, so the swap-removal keeps the indexes still to visit. */
        for (size_t i = n; i > 0; i--) {
            if (p[i].revents != 0) {
                handoff_conn_end(srv, i - 1);
            }
        }
        if (p[0].revents & POLLIN) {
            handoff_accept(srv);
        }
    }
    free(p);
    return NULL;
}

void srv_handoff_conns_close(kvd_server_t *srv)
{
    while (srv->n_conns > 0) {
        handoff_conn_end(srv, srv->n_conns - 1);
    }
    free(srv->conns);
    srv->conns = NULL;
}

kvd_status_t srv_handoff_open(kvd_server_t *srv, unsigned mode, char *err,
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
