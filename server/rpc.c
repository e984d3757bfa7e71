/*
 * gRPC C core server for kvdepotd (rpc_int.h). The C core gives one
 * completion queue event per batch. Every KvStore method is registered
 * without its payload (GRPC_SRM_PAYLOAD_NONE): a call arrives with its
 * initial metadata only, so credentials are checked before a byte of the
 * request is taken in. A caller that is refused never has its message read:
 * the stream's flow-control window stays at what HTTP/2 grants before any
 * read, and the status goes out at once. Registering with the payload read
 * up front made the core buffer the whole message (up to
 * server.max_message) before we could refuse it. A call walks three stages:
 *   NEW   keep one more call of that method requested, check credentials;
 *         refused: the status (stage DONE); admitted: {RECV_MESSAGE};
 *   RECV  the message is in: serve, then {SEND_INITIAL_METADATA,
 *         SEND_MESSAGE, SEND_STATUS_FROM_SERVER, RECV_CLOSE_ON_SERVER};
 *   DONE  the status went out: free the call.
 * Any other path comes through a generic request_call and is answered
 * UNIMPLEMENTED without reading anything. Each thread owns a completion queue
 * with RPC_PENDING calls of each kind requested on it, so a burst never waits
 * for a thread to ask for the next call. Connections are capped at
 * server.max_streams concurrent calls (GRPC_ARG_MAX_CONCURRENT_STREAMS), and
 * a TCP connection must finish its handshake within server.handshake_timeout
 * (GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS).
 * Bearer tokens are compared by SHA-256 digest (kvd_rpc_token_match), so
 * the comparison's time says nothing of the token's bytes or length.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "common/time_int.h"
#include "server/rpc_accept_int.h"
#include "server/rpc_int.h"

#define RPC_PENDING 8 /* request_call outstanding per thread */
#define RPC_TOKEN_MAX 256
#define RPC_LOOKAHEAD_BYTES 65536
#define RPC_MAX_STREAMS 64 /* server.max_streams when the config says 0 */
/* server.handshake_timeout when the config says 0 (gRPC's own is 120 s) */
#define RPC_HANDSHAKE_TIMEOUT_MS 10000

enum rpc_stage { RPC_NEW = 0, RPC_RECV = 1, RPC_DONE = 2 };

typedef struct rpc_thread rpc_thread_t;

typedef struct rpc_call {
    rpc_thread_t *t;
    enum rpc_stage stage;
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
    grpc_byte_buffer *recv;
    grpc_byte_buffer *send;
    int cancelled;
    int method;
    bool registered; /* a KvStore method (its message read once admitted) */
    gpr_timespec deadline;
    const char *tenant; /* bound by the caller's session, or NULL */
    uint64_t session;   /* the caller's hand-off session, or 0 */
    grpc_metadata trailing;
    char status_text[16];
    grpc_slice details_slice;
} rpc_call_t;

struct rpc_thread {
    kvd_rpc_server_t *srv;
    grpc_completion_queue *cq;
    pthread_t thread;
    bool started;
};

struct kvd_rpc_server {
    kvd_rpc_config_t cfg;
    char unix_path[108];
    bool unix_bound; /* ours to unlink at stop */
    bool started;    /* grpc_server_start was called */
    bool tls;        /* TCP speaks TLS with client certificates */
    bool has_token;  /* server.token is set */
    uint8_t token_digest[KVD_RPC_TOKEN_DIGEST_BYTES]; /* of "Bearer " + token */
    uint8_t (*tenant_digests)[KVD_RPC_TOKEN_DIGEST_BYTES]; /* one per token */
    size_t n_tenant_tokens, n_tenant_cns;
    char instance_hex[17];
    grpc_server *server;
    rpc_accept_t *acceptor; /* plain TCP: ours, so a connection can be shut */
    void *registered[KVD_RPC_COUNT]; /* grpc_server_register_method */
    rpc_thread_t *threads;
    int nthreads;
    bool stopping; /* atomic */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool shutdown_done;
    int shutdown_tag; /* its address is the tag */
};

/* The one translation from kvd_status_t to gRPC's status codes. */
static grpc_status_code rpc_code(kvd_status_t s)
{
    switch (s) {
    case KVD_OK: return GRPC_STATUS_OK;
    case KVD_ERR_PROTO:
    case KVD_ERR_INVALID:
    case KVD_ERR_RANGE: return GRPC_STATUS_INVALID_ARGUMENT;
    case KVD_ERR_NOT_FOUND: return GRPC_STATUS_NOT_FOUND;
    case KVD_ERR_EXISTS: return GRPC_STATUS_ALREADY_EXISTS;
    case KVD_ERR_UNSUPPORTED: return GRPC_STATUS_UNIMPLEMENTED;
    case KVD_ERR_STATE: return GRPC_STATUS_FAILED_PRECONDITION;
    case KVD_ERR_CANCELED: return GRPC_STATUS_CANCELLED;
    case KVD_ERR_NOMEM:
    case KVD_ERR_BUSY:
    case KVD_ERR_NOSPACE:
    case KVD_ERR_QUOTA: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case KVD_ERR_TIMEOUT: return GRPC_STATUS_DEADLINE_EXCEEDED;
    case KVD_ERR_AUTH: return GRPC_STATUS_UNAUTHENTICATED;
    case KVD_ERR_IO:
    case KVD_ERR_CHECKSUM:
    case KVD_ERR_CORRUPT: return GRPC_STATUS_DATA_LOSS;
    case KVD_ERR_UNREACHABLE:
    case KVD_ERR_PEER: return GRPC_STATUS_UNAVAILABLE;
    default: return GRPC_STATUS_INTERNAL;
    }
}

static bool slice_eq(grpc_slice s, const char *text, size_t len)
{
    return GRPC_SLICE_LENGTH(s) == len &&
           memcmp(GRPC_SLICE_START_PTR(s), text, len) == 0;
}

/* The value of metadata `key`, or false. */
static bool md_find(const grpc_metadata_array *md, const char *key,
                    grpc_slice *value)
{
    size_t klen = strlen(key);
    for (size_t i = 0; i < md->count; i++) {
        if (slice_eq(md->metadata[i].key, key, klen)) {
            *value = md->metadata[i].value;
            return true;
        }
    }
    return false;
}

static void rpc_call_free(rpc_call_t *c)
{
    if (c->call != NULL) {
        grpc_call_unref(c->call);
    }
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->md);
    if (c->recv != NULL) {
        grpc_byte_buffer_destroy(c->recv);
    }
    if (c->send != NULL) {
        grpc_byte_buffer_destroy(c->send);
    }
    grpc_slice_unref(c->details_slice);
    free(c);
}

/* Asks for one more call of `method` (its message read with it), or for
 * one more call of any other path when `method` is negative. */
static void rpc_request_one(rpc_thread_t *t, int method)
{
    kvd_rpc_server_t *srv = t->srv;
    if (__atomic_load_n(&srv->stopping, __ATOMIC_ACQUIRE)) {
        return;
    }
    rpc_call_t *c = calloc(1, sizeof *c);
    if (c == NULL) {
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_ERROR, 1000,
                            "kvdepotd: out of memory for a new call");
        return;
    }
    c->t = t;
    c->details_slice = grpc_empty_slice();
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->md);
    grpc_call_error e;
    if (method >= 0) {
        c->method = method;
        c->registered = true;
        e = grpc_server_request_registered_call(
            srv->server, srv->registered[method], &c->call, &c->deadline,
            &c->md, NULL, t->cq, t->cq, c);
    } else {
        c->method = -1;
        e = grpc_server_request_call(srv->server, &c->call, &c->details, &c->md,
                                     t->cq, t->cq, c);
    }
    if (e != GRPC_CALL_OK) {
        KVD_LOG_ERROR("kvdepotd: grpc_server_request_call: %d", (int)e);
        rpc_call_free(c);
    }
}

/* Sends the reply (message when `resp` is non-NULL) and the status. */
static void rpc_finish(rpc_call_t *c, kvd_status_t status, const char *reason,
                       uint8_t *resp, size_t resp_len)
{
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (resp != NULL) {
        grpc_slice s = grpc_slice_new(resp, resp_len, free);
        c->send = grpc_raw_byte_buffer_create(&s, 1);
        grpc_slice_unref(s);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = c->send;
    }
    snprintf(c->status_text, sizeof c->status_text, "%d", (int)status);
    c->trailing.key = grpc_slice_from_static_string(KVD_RPC_MD_STATUS);
    c->trailing.value = grpc_slice_from_static_string(c->status_text);
    grpc_slice_unref(c->details_slice);
    c->details_slice = grpc_slice_from_copied_string(reason ? reason : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = rpc_code(status);
    ops[n].data.send_status_from_server.status_details =
        status == KVD_OK ? NULL : &c->details_slice;
    ops[n].data.send_status_from_server.trailing_metadata_count = 1;
    ops[n++].data.send_status_from_server.trailing_metadata = &c->trailing;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
    c->stage = RPC_DONE;
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, c, NULL);
    if (e != GRPC_CALL_OK) {
        KVD_LOG_ERROR("kvdepotd: reply batch: %d", (int)e);
        rpc_call_free(c);
    }
}

/* The tenant a verified client certificate's common name is bound to, or
 * NULL (no CN, or one no tenant names). */
static const char *rpc_cn_tenant(const kvd_rpc_server_t *srv,
                                 const grpc_auth_context *ctx)
{
    grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(
        ctx, GRPC_X509_CN_PROPERTY_NAME);
    const grpc_auth_property *p;
    while ((p = grpc_auth_property_iterator_next(&it)) != NULL) {
        for (size_t i = 0; i < srv->n_tenant_cns; i++) {
            const char *cn = srv->cfg.tenant_cns[i].secret;
            if (p->value_length == strlen(cn) &&
                memcmp(p->value, cn, p->value_length) == 0) {
                return srv->cfg.tenant_cns[i].tenant;
            }
        }
    }
    return NULL;
}

bool kvd_rpc_token_digest(const char *prefix, const void *secret, size_t len,
                          uint8_t out[KVD_RPC_TOKEN_DIGEST_BYTES])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned n = 0;
    bool ok = ctx != NULL && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 &&
              (prefix == NULL ||
               EVP_DigestUpdate(ctx, prefix, strlen(prefix)) == 1) &&
              (len == 0 || EVP_DigestUpdate(ctx, secret, len) == 1) &&
              EVP_DigestFinal_ex(ctx, out, &n) == 1 &&
              n == KVD_RPC_TOKEN_DIGEST_BYTES;
    EVP_MD_CTX_free(ctx);
    return ok;
}

bool kvd_rpc_token_match(const uint8_t want[KVD_RPC_TOKEN_DIGEST_BYTES],
                         const void *v, size_t len)
{
    uint8_t got[KVD_RPC_TOKEN_DIGEST_BYTES];
    if (!kvd_rpc_token_digest(NULL, v, len, got)) {
        return false;
    }
    return CRYPTO_memcmp(got, want, sizeof got) == 0;
}

/* Whether `v` ("Bearer <token>") is server.token or a tenant's token; the
 * tenant's name goes to *tenant_out. `v` is hashed once and its digest
 * compared with every candidate's, each with CRYPTO_memcmp over the whole
 * digest, so the time taken says nothing about which one matched, nor
 * where a wrong token differs, nor how long the right one is. */
static bool rpc_token_ok(const kvd_rpc_server_t *srv, grpc_slice v,
                         const char **tenant_out)
{
    uint8_t got[KVD_RPC_TOKEN_DIGEST_BYTES];
    *tenant_out = NULL;
    if (!kvd_rpc_token_digest(NULL, GRPC_SLICE_START_PTR(v),
                              GRPC_SLICE_LENGTH(v), got)) {
        return false;
    }
    bool ok = srv->has_token &&
              CRYPTO_memcmp(got, srv->token_digest, sizeof got) == 0;
    for (size_t i = 0; i < srv->n_tenant_tokens; i++) {
        if (CRYPTO_memcmp(got, srv->tenant_digests[i], sizeof got) == 0) {
            ok = true;
            *tenant_out = srv->cfg.tenant_tokens[i].tenant;
        }
    }
    return ok;
}

/* Checks credentials and the daemon instance; writes the reason. */
static kvd_status_t rpc_admit(kvd_rpc_server_t *srv, rpc_call_t *c,
                              char *reason, size_t reason_len)
{
    char *peer = grpc_call_get_peer(c->call);
    bool local = peer != NULL && strncmp(peer, "unix:", 5) == 0;
    kvd_status_t s = KVD_OK;
    const char *cn_tenant = NULL;
    if (!local && srv->tls) {
        /* The handshake already required a certificate the CA signed; say
         * so only if the auth context agrees. */
        grpc_auth_context *ctx = grpc_call_auth_context(c->call);
        bool verified =
            ctx != NULL && grpc_auth_context_peer_is_authenticated(ctx);
        if (verified) {
            cn_tenant = rpc_cn_tenant(srv, ctx);
        }
        grpc_auth_context_release(ctx);
        if (!verified) {
            kvd_config_err(reason, reason_len,
                           "TCP callers need a client certificate");
            s = KVD_ERR_AUTH;
        }
    }
    if (s == KVD_OK && !local) {
        c->tenant = cn_tenant;
    }
    if (s == KVD_OK && !local && (srv->has_token || srv->n_tenant_tokens > 0)) {
        grpc_slice v;
        const char *token_tenant = NULL;
        if (!md_find(&c->md, "authorization", &v) ||
            !rpc_token_ok(srv, v, &token_tenant)) {
            kvd_config_err(reason, reason_len,
                           "TCP callers need authorization: Bearer <token>");
            KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                                "kvdepotd: refused %s: bad or missing token",
                                peer ? peer : "?");
            s = KVD_ERR_AUTH;
        } else if (token_tenant != NULL && cn_tenant != NULL &&
                   strcmp(token_tenant, cn_tenant) != 0) {
            kvd_config_err(reason, reason_len,
                           "the token's tenant and the certificate's differ");
            s = KVD_ERR_AUTH;
        } else if (token_tenant != NULL) {
            c->tenant = token_tenant;
        }
    }
    grpc_slice inst;
    if (s == KVD_OK && md_find(&c->md, KVD_RPC_MD_INSTANCE, &inst) &&
        !slice_eq(inst, srv->instance_hex, strlen(srv->instance_hex))) {
        kvd_config_err(reason, reason_len,
                       "daemon restarted: instance %s, the caller's is "
                       "another; map the arena again",
                       srv->instance_hex);
        s = KVD_ERR_STATE;
    }
    grpc_slice sess;
    bool has_session = md_find(&c->md, KVD_RPC_MD_SESSION, &sess);
    if (s == KVD_OK && local && has_session && srv->cfg.session != NULL) {
        s = srv->cfg.session(srv->cfg.session_ctx,
                             (const char *)GRPC_SLICE_START_PTR(sess),
                             GRPC_SLICE_LENGTH(sess), &c->tenant, &c->session);
        if (s != KVD_OK) {
            kvd_config_err(reason, reason_len,
                           "unknown session: hand off the arena again");
        }
    } else if (s == KVD_OK && local && !has_session &&
               srv->cfg.sessions_required) {
        kvd_config_err(reason, reason_len,
                       "tenants are mapped to users here: calls need the "
                       "session the arena hand-off gives");
        s = KVD_ERR_AUTH;
    }
    gpr_free(peer);
    return s;
}

/* A call its connection wasted (refused, or cancelled before its message):
 * a plain-TCP connection that wastes too many is shut (rpc_accept_int.h). */
static void rpc_strike(rpc_call_t *c)
{
    kvd_rpc_server_t *srv = c->t->srv;
    if (srv->acceptor == NULL) {
        return;
    }
    char *peer = grpc_call_get_peer(c->call);
    (void)rpc_accept_strike(srv->acceptor, peer);
    gpr_free(peer);
}

/* Serves the request read after admission (c->recv) and replies. */
static void rpc_serve(rpc_call_t *c)
{
    kvd_rpc_server_t *srv = c->t->srv;
    char reason[256] = "";
    if (c->recv == NULL) {
        rpc_strike(c);
        rpc_finish(c, KVD_ERR_PROTO, "no request message", NULL, 0);
        return;
    }
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, c->recv)) {
        rpc_finish(c, KVD_ERR_PROTO, "undecodable request", NULL, 0);
        return;
    }
    grpc_slice body = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    uint8_t *resp = NULL;
    size_t resp_len = 0;
    kvd_status_t s = kvd_service_call_session(
        srv->cfg.svc, (kvd_rpc_method_t)c->method,
        GRPC_SLICE_LENGTH(body) ? GRPC_SLICE_START_PTR(body) : NULL,
        GRPC_SLICE_LENGTH(body), c->tenant, c->session, &resp, &resp_len,
        reason, sizeof reason);
    grpc_slice_unref(body);
    if (s != KVD_OK) {
        KVD_LOG_DEBUG("kvdepotd: %s: %s", kvd_rpc_method_name(c->method),
                      reason);
        rpc_finish(c, s, reason, NULL, 0);
        return;
    }
    rpc_finish(c, KVD_OK, NULL, resp, resp_len);
}

/* Reads the request message of an admitted call (stage RECV). */
static void rpc_recv(rpc_call_t *c)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv;
    c->stage = RPC_RECV;
    grpc_call_error e = grpc_call_start_batch(c->call, &op, 1, c, NULL);
    if (e != GRPC_CALL_OK) {
        KVD_LOG_ERROR("kvdepotd: receive batch: %d", (int)e);
        rpc_finish(c, KVD_ERR_INTERNAL, "cannot read the request", NULL, 0);
    }
}

static void rpc_on_new(rpc_call_t *c)
{
    kvd_rpc_server_t *srv = c->t->srv;
    rpc_request_one(c->t, c->registered ? c->method : -1);
    char reason[256] = "";
    if (c->registered) {
        kvd_status_t s = rpc_admit(srv, c, reason, sizeof reason);
        if (s != KVD_OK) {
            kvd_service_count_refused(srv->cfg.svc, s);
            rpc_strike(c);
            rpc_finish(c, s, reason, NULL, 0);
            return;
        }
        if (srv->acceptor != NULL) {
            char *peer = grpc_call_get_peer(c->call);
            rpc_accept_admit(srv->acceptor, peer);
            gpr_free(peer);
        }
        rpc_recv(c);
        return;
    }
    /* Every KvStore method is registered: what comes here is another. */
    kvd_config_err(reason, sizeof reason, "unknown method %.*s",
                   (int)GRPC_SLICE_LENGTH(c->details.method),
                   (const char *)GRPC_SLICE_START_PTR(c->details.method));
    kvd_service_count_refused(srv->cfg.svc, KVD_ERR_UNSUPPORTED);
    rpc_strike(c);
    rpc_finish(c, KVD_ERR_UNSUPPORTED, reason, NULL, 0);
}

static void *rpc_thread_main(void *arg)
{
    rpc_thread_t *t = arg;
    kvd_rpc_server_t *srv = t->srv;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(
            t->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) {
            break;
        }
        if (ev.type != GRPC_OP_COMPLETE) {
            continue;
        }
        if (ev.tag == &srv->shutdown_tag) {
            pthread_mutex_lock(&srv->mu);
            srv->shutdown_done = true;
            pthread_cond_broadcast(&srv->cv);
            pthread_mutex_unlock(&srv->mu);
            continue;
        }
        rpc_call_t *c = ev.tag;
        if (!ev.success) {
            /* request_call ended by shutdown, or the peer went away. */
            rpc_call_free(c);
            continue;
        }
        switch (c->stage) {
        case RPC_NEW: rpc_on_new(c); break;
        case RPC_RECV: rpc_serve(c); break;
        case RPC_DONE: rpc_call_free(c); break;
        }
    }
    return NULL;
}

/* A socket file at `path` that nobody answers on is stale: remove it. A
 * live one means another daemon. */
static kvd_status_t rpc_unix_prepare(const char *path, char *err,
                                     size_t err_len)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        return KVD_OK;
    }
    if (!S_ISSOCK(st.st_mode)) {
        kvd_config_err(err, err_len,
                       "server.unix_socket %s: exists and is not a socket",
                       path);
        return KVD_ERR_EXISTS;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return kvd_status_from_errno(errno);
    }
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    int rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    close(fd);
    if (rc == 0) {
        kvd_config_err(err, err_len,
                       "server.unix_socket %s: another daemon is listening",
                       path);
        return KVD_ERR_EXISTS;
    }
    (void)unlink(path);
    return KVD_OK;
}

static kvd_status_t rpc_bind(kvd_rpc_server_t *srv, int *tcp_port, char *err,
                             size_t err_len)
{
    grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
    kvd_status_t s = KVD_OK;
    if (srv->unix_path[0] != '\0') {
        s = rpc_unix_prepare(srv->unix_path, err, err_len);
        if (s == KVD_OK) {
            char addr[128];
            snprintf(addr, sizeof addr, "unix:%s", srv->unix_path);
            if (grpc_server_add_http2_port(srv->server, addr, creds) == 0) {
                kvd_config_err(err, err_len,
                               "server.unix_socket %s: cannot bind",
                               srv->unix_path);
                s = KVD_ERR_UNREACHABLE;
            } else {
                srv->unix_bound = true;
            }
        }
    }
    *tcp_port = 0;
    if (s == KVD_OK && srv->cfg.tcp_address != NULL &&
        srv->cfg.tcp_address[0] != '\0') {
        grpc_server_credentials *tcp_creds = creds;
        grpc_ssl_pem_key_cert_pair pair = {.private_key = srv->cfg.tls_key_pem,
                                           .cert_chain = srv->cfg.tls_cert_pem};
        if (srv->tls) {
            tcp_creds = grpc_ssl_server_credentials_create_ex(
                srv->cfg.tls_ca_pem, &pair, 1,
                GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY,
                NULL);
        }
        if (!srv->tls) {
            /* Plain TCP: our own acceptor (rpc_accept_int.h). */
            s = rpc_accept_open(srv->cfg.tcp_address, &srv->acceptor, tcp_port,
                                err, err_len);
            grpc_server_credentials_release(creds);
            return s;
        }
        *tcp_port = tcp_creds == NULL
                        ? 0
                        : grpc_server_add_http2_port(
                              srv->server, srv->cfg.tcp_address, tcp_creds);
        if (tcp_creds != NULL) {
            grpc_server_credentials_release(tcp_creds);
        }
        if (*tcp_port == 0) {
            kvd_config_err(err, err_len, "server.tcp_address %s: cannot bind",
                           srv->cfg.tcp_address);
            s = KVD_ERR_UNREACHABLE;
        }
    }
    grpc_server_credentials_release(creds);
    return s;
}

kvd_status_t kvd_rpc_config_check(const kvd_rpc_config_t *cfg, char *err,
                                  size_t err_len)
{
    bool has_unix = cfg->unix_path != NULL && cfg->unix_path[0] != '\0';
    bool has_tcp = cfg->tcp_address != NULL && cfg->tcp_address[0] != '\0';
    size_t token_len = cfg->token != NULL ? strlen(cfg->token) : 0;
    if (!has_unix && !has_tcp) {
        kvd_config_err(err, err_len,
                       "server.unix_socket and server.tcp_address are both "
                       "empty: nothing to listen on");
        return KVD_ERR_INVALID;
    }
    int tls_parts = (cfg->tls_cert_pem != NULL) + (cfg->tls_key_pem != NULL) +
                    (cfg->tls_ca_pem != NULL);
    if (tls_parts != 0 && tls_parts != 3) {
        kvd_config_err(err, err_len,
                       "server.tls_cert, server.tls_key and "
                       "server.tls_client_ca go together");
        return KVD_ERR_INVALID;
    }
    if (has_tcp && token_len == 0 && cfg->n_tenant_tokens == 0 &&
        tls_parts == 0) {
        kvd_config_err(err, err_len,
                       "server.tcp_address is set but neither server.token "
                       "nor TLS client certificates (server.tls_*) are: TCP "
                       "callers must authenticate");
        return KVD_ERR_INVALID;
    }
    char host[256];
    int port = 0;
    if (has_tcp &&
        !kvd_rpc_address_split(cfg->tcp_address, host, sizeof host, &port)) {
        kvd_config_err(err, err_len,
                       "server.tcp_address \"%s\": want host:port, [v6]:port "
                       "or :port (port 0-65535)",
                       cfg->tcp_address);
        return KVD_ERR_INVALID;
    }
    if (token_len > RPC_TOKEN_MAX ||
        (has_unix &&
         strlen(cfg->unix_path) >=
             sizeof(((struct sockaddr_un *)0)->sun_path) - sizeof ".shm")) {
        kvd_config_err(err, err_len, "%s: too long",
                       token_len > RPC_TOKEN_MAX ? "server.token"
                                                 : "server.unix_socket");
        return KVD_ERR_INVALID;
    }
    return KVD_OK;
}

/* The digests of "Bearer " + each token the server accepts (precomputed,
 * so a call's check hashes only what the caller presents). */
static bool rpc_digests_init(kvd_rpc_server_t *srv, size_t token_len)
{
    const kvd_rpc_config_t *cfg = &srv->cfg;
    srv->has_token = token_len > 0;
    if (srv->has_token && !kvd_rpc_token_digest("Bearer ", cfg->token,
                                                token_len, srv->token_digest)) {
        return false;
    }
    if (cfg->n_tenant_tokens == 0) {
        return true;
    }
    srv->tenant_digests =
        calloc(cfg->n_tenant_tokens, sizeof *srv->tenant_digests);
    if (srv->tenant_digests == NULL) {
        return false;
    }
    for (size_t i = 0; i < cfg->n_tenant_tokens; i++) {
        const char *t = cfg->tenant_tokens[i].secret;
        if (!kvd_rpc_token_digest("Bearer ", t, strlen(t),
                                  srv->tenant_digests[i])) {
            return false;
        }
    }
    return true;
}

/* The server's record, nothing started yet; NULL on OOM. */
static kvd_rpc_server_t *rpc_server_new(const kvd_rpc_config_t *cfg)
{
    bool has_unix = cfg->unix_path != NULL && cfg->unix_path[0] != '\0';
    size_t token_len = cfg->token != NULL ? strlen(cfg->token) : 0;
    kvd_rpc_server_t *srv = calloc(1, sizeof *srv);
    if (srv == NULL) {
        return NULL;
    }
    srv->cfg = *cfg;
    srv->tls = cfg->tls_cert_pem != NULL && cfg->tls_key_pem != NULL &&
               cfg->tls_ca_pem != NULL;
    if (has_unix) {
        snprintf(srv->unix_path, sizeof srv->unix_path, "%s", cfg->unix_path);
    }
    srv->n_tenant_cns = srv->tls ? cfg->n_tenant_cns : 0;
    srv->n_tenant_tokens = cfg->n_tenant_tokens;
    if (!rpc_digests_init(srv, token_len)) {
        free(srv->tenant_digests);
        free(srv);
        return NULL;
    }
    snprintf(srv->instance_hex, sizeof srv->instance_hex, "%016" PRIx64,
             cfg->instance_id);
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->cv, NULL);
    srv->nthreads = cfg->threads;
    srv->threads = calloc((size_t)cfg->threads, sizeof *srv->threads);
    if (srv->threads == NULL) {
        pthread_cond_destroy(&srv->cv);
        pthread_mutex_destroy(&srv->mu);
        free(srv->tenant_digests);
        free(srv);
        return NULL;
    }
    return srv;
}

/* Creates the gRPC server, one completion queue per thread, and registers
 * the methods. */
static kvd_status_t rpc_grpc_create(kvd_rpc_server_t *srv, char *err,
                                    size_t err_len)
{
    grpc_init();
    int streams =
        srv->cfg.max_streams > 0 ? srv->cfg.max_streams : RPC_MAX_STREAMS;
    int handshake_ms = srv->cfg.handshake_timeout_ms > 0
                           ? srv->cfg.handshake_timeout_ms
                           : RPC_HANDSHAKE_TIMEOUT_MS;
    grpc_arg args[6] = {
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = srv->cfg.max_message_bytes},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
         .value.integer = srv->cfg.max_message_bytes},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_MAX_CONCURRENT_STREAMS,
         .value.integer = streams},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
         .value.integer = RPC_LOOKAHEAD_BYTES},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_HTTP2_BDP_PROBE,
         .value.integer = 0},
        /* A client stalled in the TLS handshake holds a descriptor until
         * this deadline (gRPC's default was 120 s). */
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
         .value.integer = handshake_ms},
    };
    grpc_channel_args cargs = {.num_args = 6, .args = args};
    srv->server = grpc_server_create(&cargs, NULL);
    for (int i = 0; i < srv->nthreads; i++) {
        srv->threads[i].srv = srv;
        srv->threads[i].cq = grpc_completion_queue_create_for_next(NULL);
        grpc_server_register_completion_queue(srv->server, srv->threads[i].cq,
                                              NULL);
    }
    for (int m = 0; m < KVD_RPC_COUNT; m++) {
        srv->registered[m] = grpc_server_register_method(
            srv->server, kvd_rpc_method_path((kvd_rpc_method_t)m), NULL,
            GRPC_SRM_PAYLOAD_NONE, 0);
        if (srv->registered[m] == NULL) {
            kvd_config_err(err, err_len, "gRPC refused to register %s",
                           kvd_rpc_method_path((kvd_rpc_method_t)m));
            return KVD_ERR_INVALID;
        }
    }
    return KVD_OK;
}

/* Asks for the first calls on every queue and starts its thread. */
static kvd_status_t rpc_threads_start(kvd_rpc_server_t *srv, char *err,
                                      size_t err_len)
{
    for (int i = 0; i < srv->nthreads; i++) {
        for (int k = 0; k < RPC_PENDING; k++) {
            for (int m = -1; m < KVD_RPC_COUNT; m++) {
                rpc_request_one(&srv->threads[i], m);
            }
        }
        int rc = pthread_create(&srv->threads[i].thread, NULL, rpc_thread_main,
                                &srv->threads[i]);
        if (rc != 0) {
            kvd_config_err(err, err_len, "completion-queue thread: %s",
                           strerror(rc));
            return kvd_status_from_errno(rc);
        }
        srv->threads[i].started = true;
    }
    return KVD_OK;
}

kvd_status_t kvd_rpc_server_start(const kvd_rpc_config_t *cfg,
                                  kvd_rpc_server_t **server_out,
                                  int *tcp_port_out, char *err, size_t err_len)
{
    if (cfg == NULL || server_out == NULL || tcp_port_out == NULL ||
        cfg->svc == NULL || cfg->threads < 1 || cfg->max_message_bytes < 1) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t s = kvd_rpc_config_check(cfg, err, err_len);
    if (s != KVD_OK) {
        return s;
    }
    bool has_unix = cfg->unix_path != NULL && cfg->unix_path[0] != '\0';
    bool has_tcp = cfg->tcp_address != NULL && cfg->tcp_address[0] != '\0';
    kvd_rpc_server_t *srv = rpc_server_new(cfg);
    if (srv == NULL) {
        return KVD_ERR_NOMEM;
    }
    s = rpc_grpc_create(srv, err, err_len);
    if (s != KVD_OK) {
        goto err_server;
    }
    int port = 0;
    s = rpc_bind(srv, &port, err, err_len);
    if (s != KVD_OK) {
        goto err_server;
    }
    grpc_server_start(srv->server);
    srv->started = true;
    if (srv->acceptor != NULL) {
        s = rpc_accept_start(srv->acceptor, srv->server,
                             srv->cfg.handshake_timeout_ms > 0
                                 ? srv->cfg.handshake_timeout_ms
                                 : RPC_HANDSHAKE_TIMEOUT_MS);
        if (s != KVD_OK) {
            kvd_config_err(err, err_len, "TCP accept thread: %s",
                           kvd_status_str(s));
            goto err_started;
        }
    }
    if (has_unix && chmod(srv->unix_path, cfg->unix_mode) != 0) {
        s = kvd_status_from_errno(errno);
        kvd_config_err(err, err_len, "server.unix_socket %s: chmod: %s",
                       srv->unix_path, strerror(errno));
        goto err_started;
    }
    s = rpc_threads_start(srv, err, err_len);
    if (s != KVD_OK) {
        goto err_started;
    }
    KVD_LOG_INFO("kvdepotd: gRPC on %s%s%s%s, %d threads",
                 has_unix ? "unix:" : "", has_unix ? srv->unix_path : "",
                 has_unix && has_tcp ? " and " : "",
                 has_tcp ? cfg->tcp_address : "", srv->nthreads);
    *tcp_port_out = port;
    *server_out = srv;
    return KVD_OK;

err_started:
err_server:
    kvd_rpc_server_stop(srv, 0);
    return s;
}

void kvd_rpc_server_stop(kvd_rpc_server_t *srv, int grace_ms)
{
    if (srv == NULL) {
        return;
    }
    __atomic_store_n(&srv->stopping, true, __ATOMIC_RELEASE);
    rpc_accept_stop(srv->acceptor); /* no new connections from here */
    if (!srv->started) {
        goto destroy;
    }
    /* The notification goes to a queue some thread drains. */
    int notify = 0;
    while (notify < srv->nthreads && !srv->threads[notify].started) {
        notify++;
    }
    bool any_thread = notify < srv->nthreads;
    if (!any_thread) {
        notify = 0;
    }
    grpc_server_shutdown_and_notify(srv->server, srv->threads[notify].cq,
                                    &srv->shutdown_tag);
    if (!any_thread) {
        /* Nobody drains the queue: cancel everything and drain here. */
        grpc_server_cancel_all_calls(srv->server);
        for (;;) {
            grpc_event ev = grpc_completion_queue_next(
                srv->threads[notify].cq, gpr_inf_future(GPR_CLOCK_MONOTONIC),
                NULL);
            if (ev.tag == &srv->shutdown_tag) {
                break;
            }
            if (ev.type == GRPC_OP_COMPLETE) {
                rpc_call_free(ev.tag);
            }
        }
    } else {
        uint64_t deadline = kvd_time_deadline_ns(grace_ms);
        pthread_mutex_lock(&srv->mu);
        while (!srv->shutdown_done) {
            struct timespec ts;
            uint64_t now = kvd_time_now_ns();
            if (now >= deadline) {
                break;
            }
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t wait = deadline - now;
            if (wait > 100000000u) {
                wait = 100000000u;
            }
            ts.tv_nsec += (long)wait;
            ts.tv_sec += ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
            pthread_cond_timedwait(&srv->cv, &srv->mu, &ts);
        }
        bool done = srv->shutdown_done;
        pthread_mutex_unlock(&srv->mu);
        if (!done) {
            grpc_server_cancel_all_calls(srv->server);
            pthread_mutex_lock(&srv->mu);
            while (!srv->shutdown_done) {
                pthread_cond_wait(&srv->cv, &srv->mu);
            }
            pthread_mutex_unlock(&srv->mu);
        }
    }
destroy:
    grpc_server_destroy(srv->server);
    for (int i = 0; i < srv->nthreads; i++) {
        grpc_completion_queue_shutdown(srv->threads[i].cq);
        if (srv->threads[i].started) {
            pthread_join(srv->threads[i].thread, NULL);
        } else {
            for (;;) {
                grpc_event ev = grpc_completion_queue_next(
                    srv->threads[i].cq, gpr_inf_future(GPR_CLOCK_MONOTONIC),
                    NULL);
                if (ev.type == GRPC_QUEUE_SHUTDOWN) {
                    break;
                }
                if (ev.type == GRPC_OP_COMPLETE &&
                    ev.tag != &srv->shutdown_tag) {
                    rpc_call_free(ev.tag);
                }
            }
        }
        grpc_completion_queue_destroy(srv->threads[i].cq);
    }
    rpc_accept_free(srv->acceptor); /* no thread reports to it any more */
    if (srv->unix_bound) {
        (void)unlink(srv->unix_path);
    }
    grpc_shutdown();
    free(srv->threads);
    free(srv->tenant_digests);
    pthread_cond_destroy(&srv->cv);
    pthread_mutex_destroy(&srv->mu);
    free(srv);
}
