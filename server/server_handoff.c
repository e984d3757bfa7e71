/*
 * The shared-memory hand-off listener (server.unix_socket + ".shm"): a
 * local client sends a HELLO (client/handoff.h) and gets a REPLY with the
 * memfd of the arena its user's tenant may map (its own with
 * server.tenant_arenas) and a fresh session secret; its gRPC calls then
 * name that session, which binds them to the tenant (srv_session_tenant).
 *
 * The listener is one thread: each exchange is one 16-byte HELLO and one
 * 64-byte REPLY with the memfd, bounded by a 1 s receive timeout, so a
 * stuck client delays the next one by at most that.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
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
kvd_status_t srv_session_tenant(void *ctx, const char *hex, size_t len,
                                const char **tenant_out)
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
