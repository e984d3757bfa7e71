/*
 * The shared-memory hand-off listener (server.unix_socket + ".shm"): a
 * local client sends a HELLO (client/handoff.h) and gets a REPLY with the
 * memfd of the arena its user's tenant may map (its own with
 * server.tenant_arenas) and a fresh session secret; its gRPC calls then
 * name that session, which binds them to the tenant (srv_session_tenant).
 *
 * The listener is one thread that never blocks on a peer: accepted
 * connections are non-blocking and sit in its poll set while their HELLO
 * arrives, in whatever pieces, until SRV_HANDOFF_DEADLINE_MS after the
 * accept; a connection that has not sent all of it by then is closed, and
 * one uid may have at most SRV_HANDOFF_PENDING_PER_UID of them pending, so
 * a caller that connects and stalls delays nobody else, and a stop waits
 * for no peer (the thread wakes every 100 ms). After the exchange the
 * connection stays open for as long as the client keeps it (the life of
 * its mapping); when it ends (the client closed its store or died: the
 * kernel closes the socket) the session is closed in the service, which
 * gives back the expired leases and reservations it kept quarantined for
 * it.
 *
 * Sessions: a session whose connection is open is live and is never
 * forgotten; one uid may hold server.max_sessions_per_uid live sessions
 * and its hand-offs past that are refused (KVD_ERR_BUSY, to that caller
 * only). A session whose connection ended stays known (an older client
 * closes the connection at once and still calls with it) until the table
 * needs its slot: then the oldest such session is forgotten, and its
 * client, if it calls again, gets KVD_ERR_AUTH and hands off again.
 *
 * Idle exit (server.exit_when_idle, for a daemon started on demand by the
 * engine's own processes): every engine process keeps one hand-off
 * connection open for the life of its store, so "no connection, pending
 * or kept, for that long" means no engine is left, however its processes
 * ended (a kill -9 closes their sockets too). The clock runs from the
 * start and from the end of the last connection. This thread is the only
 * one that accepts, so it decides and closes the listening socket in one
 * step: a client that connects after that finds no socket (or a reset on
 * one that was queued), never a daemon that accepted it and then stops.
 */
#include <errno.h>
#include <stdbool.h>
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
#include "common/time_int.h"
#include "store/engine.h"
#include "server/srv_int.h"

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

/* The slot for a new session (`sess_mu` held): a free one, else the
 * oldest whose connection has ended; NULL only if every one is live. */
static srv_session_t *session_slot(kvd_server_t *srv)
{
    srv_session_t *best = NULL;
    for (size_t i = 0; i < SRV_SESSIONS_MAX; i++) {
        srv_session_t *e = &srv->sessions[i];
        if (!e->used) {
            return e;
        }
        if (!e->live && (best == NULL || e->id < best->id)) {
            best = e;
        }
    }
    return best;
}

/* Live sessions of `uid` (`sess_mu` held). */
static int64_t session_live_of(const kvd_server_t *srv, uint32_t uid)
{
    int64_t n = 0;
    for (size_t i = 0; i < SRV_SESSIONS_MAX; i++) {
        const srv_session_t *e = &srv->sessions[i];
        n += e->used && e->live && e->uid == uid;
    }
    return n;
}

/* A fresh live session for a client of `uid` and `tenant` (its uid's, or
 * NULL), its secret in secret_out. KVD_ERR_BUSY when `uid` holds
 * server.max_sessions_per_uid live sessions already (or the table is all
 * live), KVD_ERR_IO without randomness. */
static kvd_status_t server_session_new(kvd_server_t *srv, uint32_t uid,
                                       const char *tenant, uint8_t *secret_out,
                                       uint64_t *id_out)
{
    if (getrandom(secret_out, KVD_HANDOFF_SESSION_BYTES, 0) !=
        (ssize_t)KVD_HANDOFF_SESSION_BYTES) {
        memset(secret_out, 0, KVD_HANDOFF_SESSION_BYTES);
        return KVD_ERR_IO;
    }
    pthread_mutex_lock(&srv->sess_mu);
    srv_session_t *e = NULL;
    if (session_live_of(srv, uid) < srv->cfg.max_sessions_per_uid) {
        e = session_slot(srv);
    }
    if (e == NULL) {
        pthread_mutex_unlock(&srv->sess_mu);
        memset(secret_out, 0, KVD_HANDOFF_SESSION_BYTES);
        return KVD_ERR_BUSY;
    }
    uint64_t id = ++srv->sess_ids;
    *e = (srv_session_t){
        .tenant = tenant, .id = id, .uid = uid, .used = true, .live = true};
    memcpy(e->secret, secret_out, KVD_HANDOFF_SESSION_BYTES);
    pthread_mutex_unlock(&srv->sess_mu);
    /* Open in the service before the client can make a call with it; if
     * that fails calls still work, without a quarantine. */
    (void)kvd_service_session_open(srv->svc, id);
    *id_out = id;
    return KVD_OK;
}

/* Session `id`'s connection ended: it may be forgotten from now on. */
static void server_session_orphan(kvd_server_t *srv, uint64_t id)
{
    pthread_mutex_lock(&srv->sess_mu);
    for (size_t i = 0; id != 0 && i < SRV_SESSIONS_MAX; i++) {
        if (srv->sessions[i].used && srv->sessions[i].id == id) {
            srv->sessions[i].live = false;
            break;
        }
    }
    pthread_mutex_unlock(&srv->sess_mu);
    if (id != 0) {
        kvd_service_session_close(srv->svc, id);
    }
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

/* Sends a refusal with `s` (best effort: the socket is non-blocking and
 * a fresh connection's buffer is empty). */
static void handoff_refuse(kvd_server_t *srv, int conn, kvd_status_t s)
{
    uint8_t reply_buf[KVD_HANDOFF_REPLY_BYTES];
    kvd_handoff_reply_t reply = {.instance_id = srv->instance_id, .status = s};
    kvd_handoff_reply_encode(&reply, reply_buf);
    (void)kvd_handoff_send(conn, reply_buf, sizeof reply_buf, -1);
}

/* Answers the complete HELLO of pending connection `c`; returns the
 * session it opened (0: none, the connection is to be closed). */
static uint64_t handoff_serve(kvd_server_t *srv, const srv_handoff_conn_t *c)
{
    char why[128] = "";
    kvd_status_t s =
        kvd_handoff_hello_decode(c->hello, sizeof c->hello, why, sizeof why);
    if (s != KVD_OK) {
        KVD_LOG_WARN("kvdepotd: hand-off from uid %u refused: %s",
                     (unsigned)c->uid, why);
        handoff_refuse(srv, c->fd, s);
        return 0;
    }
    /* The caller's tenant's partition: with server.tenant_arenas, a tenant
     * of its own never receives the memfd of another's bytes. */
    const char *tenant = server_uid_tenant(srv, c->uid);
    kvd_store_arena_export_t exp;
    s = kvd_store_arena_export_tenant(srv->store, kvd_service_tenant_id(tenant),
                                      &exp);
    if (s != KVD_OK) {
        handoff_refuse(srv, c->fd, s);
        return 0;
    }
    kvd_handoff_reply_t reply = {.instance_id = srv->instance_id,
                                 .map_bytes = exp.map_bytes,
                                 .size_bytes = exp.size_bytes,
                                 .offset = exp.offset};
    uint64_t session = 0;
    s = server_session_new(srv, c->uid, tenant, reply.session, &session);
    if (s != KVD_OK) {
        close(exp.fd);
        KVD_LOG_WARN("kvdepotd: hand-off from uid %u refused: %s (%lld "
                     "sessions open, server.max_sessions_per_uid)",
                     (unsigned)c->uid, kvd_status_str(s),
                     (long long)srv->cfg.max_sessions_per_uid);
        handoff_refuse(srv, c->fd, s);
        return 0;
    }
    uint8_t reply_buf[KVD_HANDOFF_REPLY_BYTES];
    kvd_handoff_reply_encode(&reply, reply_buf);
    s = kvd_handoff_send(c->fd, reply_buf, sizeof reply_buf, exp.fd);
    close(exp.fd);
    KVD_LOG_DEBUG("kvdepotd: arena handed to uid %u (session %llu): %s",
                  (unsigned)c->uid, (unsigned long long)session,
                  kvd_status_str(s));
    if (s != KVD_OK) {
        server_session_orphan(srv, session);
        return 0;
    }
    return session;
}

/* Ends connection `i`: the client is gone, and so is its session. */
static void handoff_conn_end(kvd_server_t *srv, size_t i)
{
    close(srv->conns[i].fd);
    server_session_orphan(srv, srv->conns[i].session);
    srv->conns[i] = srv->conns[--srv->n_conns];
}

/* Reads what pending connection `i` has sent; answers a complete HELLO.
 * Returns false when the connection is to be ended. */
static bool handoff_pending_read(kvd_server_t *srv, size_t i)
{
    srv_handoff_conn_t *c = &srv->conns[i];
    kvd_handoff_piece_t piece;
    kvd_status_t s = kvd_handoff_read(c->fd, c->hello + c->got,
                                      sizeof c->hello - c->got, &piece);
    if (s == KVD_AGAIN) {
        return true;
    }
    if (s != KVD_OK) {
        return false;
    }
    if (piece.fd >= 0) {
        close(piece.fd);
    }
    if (piece.num_fds > 0 || piece.truncated) {
        KVD_LOG_WARN("kvdepotd: hand-off from uid %u refused: hello carried "
                     "a descriptor",
                     (unsigned)c->uid);
        handoff_refuse(srv, c->fd, KVD_ERR_PROTO);
        return false;
    }
    if (piece.n == 0) {
        return false; /* closed before its HELLO was complete */
    }
    c->got = (uint8_t)(c->got + piece.n);
    if (c->got < sizeof c->hello) {
        return true;
    }
    c->session = handoff_serve(srv, c);
    return c->session != 0;
}

/* Accepts one client as a pending connection, unless the table is full or
 * its uid has SRV_HANDOFF_PENDING_PER_UID pending already. */
static void handoff_accept(kvd_server_t *srv)
{
    int conn =
        accept4(srv->handoff_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) {
        return;
    }
    struct ucred cred = {0};
    socklen_t cl = sizeof cred;
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) {
        close(conn);
        return;
    }
    size_t pending = 0;
    for (size_t i = 0; i < srv->n_conns; i++) {
        pending += srv->conns[i].session == 0 &&
                   srv->conns[i].uid == (uint32_t)cred.uid;
    }
    if (srv->n_conns == SRV_HANDOFF_CONNS_MAX ||
        pending >= SRV_HANDOFF_PENDING_PER_UID) {
        KVD_LOG_WARN("kvdepotd: hand-off from pid %d uid %d dropped: %zu "
                     "connections open, %zu of them its own pending",
                     (int)cred.pid, (int)cred.uid, srv->n_conns, pending);
        close(conn);
        return;
    }
    srv->conns[srv->n_conns++] = (srv_handoff_conn_t){
        .fd = conn,
        .uid = (uint32_t)cred.uid,
        .deadline_ns = kvd_time_now_ns() +
                       (uint64_t)SRV_HANDOFF_DEADLINE_MS * KVD_NSEC_PER_MSEC};
}

/* One pass over the events of the `n` connections in p[1..n]. */
static void handoff_conns_events(kvd_server_t *srv, const struct pollfd *p,
                                 size_t n)
{
    uint64_t now = kvd_time_now_ns();
    /* From the last, so the swap-removal keeps the indexes still to visit. */
    for (size_t i = n; i > 0; i--) {
        srv_handoff_conn_t *c = &srv->conns[i - 1];
        bool keep = true;
        if (c->session != 0) {
            /* A kept connection carries nothing after the exchange: any
             * event on it (hang-up, error, stray bytes) ends it. */
            keep = p[i].revents == 0;
        } else if (p[i].revents != 0) {
            keep = handoff_pending_read(srv, i - 1);
        }
        if (keep && c->session == 0 && now >= c->deadline_ns) {
            KVD_LOG_WARN("kvdepotd: hand-off from uid %u dropped: no hello "
                         "within %d ms",
                         (unsigned)c->uid, SRV_HANDOFF_DEADLINE_MS);
            keep = false;
        }
        if (!keep) {
            handoff_conn_end(srv, i - 1);
        }
    }
}

/* server.exit_when_idle: true (the listener closed and removed) once
 * this thread has held no connection for that long. */
static bool handoff_idle_expired(kvd_server_t *srv)
{
    uint64_t now = kvd_time_now_ns();
    if (srv->cfg.exit_when_idle_ms == 0) {
        return false;
    }
    if (srv->n_conns > 0) {
        srv->idle_since_ns = now;
        return false;
    }
    if (now - srv->idle_since_ns <
        srv->cfg.exit_when_idle_ms * KVD_NSEC_PER_MSEC) {
        return false;
    }
    KVD_LOG_INFO("kvdepotd: no local client for %llu ms "
                 "(server.exit_when_idle): stopping",
                 (unsigned long long)srv->cfg.exit_when_idle_ms);
    close(srv->handoff_fd);
    srv->handoff_fd = -1;
    (void)unlink(srv->handoff_path);
    __atomic_store_n(&srv->ready, false, __ATOMIC_RELEASE);
    __atomic_store_n(&srv->idle_expired, true, __ATOMIC_RELEASE);
    return true;
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
        if (rc < 0) {
            continue;
        }
        if (rc == 0) {
            for (size_t i = 0; i <= n; i++) {
                p[i].revents = 0;
            }
        }
        handoff_conns_events(srv, p, n);
        if (p[0].revents & POLLIN) {
            handoff_accept(srv);
        }
        if (handoff_idle_expired(srv)) {
            break;
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
    srv->idle_since_ns = kvd_time_now_ns();
    int rc = pthread_create(&srv->handoff_thread, NULL, handoff_main, srv);
    if (rc != 0) {
        return kvd_status_from_errno(rc);
    }
    srv->handoff_started = true;
    return KVD_OK;
}
