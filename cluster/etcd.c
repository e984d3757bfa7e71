/*
 * etcd v3 over the gRPC C core (etcd_int.h). Unary calls (and a lease
 * keep-alive, which is a bidirectional stream that one request, a
 * half-close and one reply use like a unary call) go through etcd_call; a
 * watch keeps its stream open with one receive pending at a time.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <openssl/crypto.h>

#include "cluster/etcd_int.h"
#include "common/log_int.h"
#include "common/status_int.h"
#include "rpc.pb-c.h"

#define ETCD_MAX_REPLY (4 << 20)

struct kvd_etcd {
    pthread_mutex_t mu;
    grpc_channel *ch; /* under mu: replaced after a failed connection */
    bool reset;       /* under mu: the next call opens a new channel */
    size_t cur;       /* under mu: the endpoint `ch` goes to */
    size_t n_eps;
    int timeout_ms;
    char *tls_ca, *tls_cert, *tls_key; /* PEM copies; NULL: plaintext */
    char endpoint[256]; /* as given: every endpoint, for the logs */
    char eps[KVD_ETCD_ENDPOINTS_MAX][256];
};

struct kvd_etcd_watch {
    kvd_etcd_t *etcd;
    grpc_completion_queue *cq;
    grpc_call *call;
    grpc_metadata_array initial, trailing;
    grpc_status_code code;
    grpc_slice details;
    grpc_byte_buffer *recv;
    bool recv_pending;  /* a RECV_MESSAGE batch is out (tag: &recv) */
    bool status_posted; /* the RECV_STATUS_ON_CLIENT batch (tag: &code) */
    bool ended;         /* the stream is over */
};

static gpr_timespec etcd_deadline(int ms)
{
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_millis(ms, GPR_TIMESPAN));
}

/* Packs a request into a byte buffer, or NULL. */
static grpc_byte_buffer *etcd_pack(const ProtobufCMessage *req)
{
    size_t len = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(len ? len : 1);
    if (buf == NULL) {
        return NULL;
    }
    protobuf_c_message_pack(req, buf);
    grpc_slice s = grpc_slice_new(buf, len, free);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* Decodes a reply of type `desc`, or NULL. */
static ProtobufCMessage *etcd_unpack(const ProtobufCMessageDescriptor *desc,
                                     grpc_byte_buffer *bb)
{
    grpc_byte_buffer_reader rd;
    if (bb == NULL || !grpc_byte_buffer_reader_init(&rd, bb)) {
        return NULL;
    }
    grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    ProtobufCMessage *m = NULL;
    if (GRPC_SLICE_LENGTH(all) <= ETCD_MAX_REPLY) {
        m = protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(all),
                                      GRPC_SLICE_START_PTR(all));
    }
    grpc_slice_unref(all);
    return m;
}

/* TLS credentials when a CA is set (server authentication, and this
 * client's certificate when one is set too), else plaintext. */
static grpc_channel_credentials *etcd_credentials(const kvd_etcd_t *e)
{
    if (e->tls_ca == NULL) {
        return grpc_insecure_credentials_create();
    }
    grpc_ssl_pem_key_cert_pair pair = {.private_key = e->tls_key,
                                       .cert_chain = e->tls_cert};
    return grpc_ssl_credentials_create(
        e->tls_ca, e->tls_cert != NULL ? &pair : NULL, NULL, NULL);
}

static grpc_channel *etcd_channel(const kvd_etcd_t *e, const char *endpoint)
{
    grpc_arg args[3] = {
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = ETCD_MAX_REPLY},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
         .value.integer = 1000},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
         .value.integer = 100},
    };
    grpc_channel_args cargs = {.num_args = 3, .args = args};
    grpc_channel_credentials *creds = etcd_credentials(e);
    if (creds == NULL) {
        return NULL;
    }
    grpc_channel *ch = grpc_channel_create(endpoint, creds, &cargs);
    grpc_channel_credentials_release(creds);
    return ch;
}

/* The channel for a new call. A channel whose connection failed is
 * replaced: with etcd 3.4 (cmux in front of its gRPC server), a gRPC C
 * core channel that failed to connect while etcd was down kept failing
 * after etcd was back (connection attempts time out waiting for the
 * server's SETTINGS), whereas a new channel connects at once. Calls in
 * flight keep the old channel alive until they end. */
static grpc_channel *etcd_channel_get(kvd_etcd_t *e)
{
    pthread_mutex_lock(&e->mu);
    if (e->reset) {
        grpc_channel *fresh = etcd_channel(e, e->eps[e->cur]);
        if (fresh != NULL) {
            grpc_channel_destroy(e->ch);
            e->ch = fresh;
            e->reset = false;
        }
    }
    grpc_channel *ch = e->ch;
    pthread_mutex_unlock(&e->mu);
    return ch;
}

/* After a call on `ch` failed to reach etcd, the next call opens a new
 * channel to the next endpoint (the same one when there is only one). A
 * failure on a channel already replaced changes nothing, so calls failing
 * together move on by one endpoint, not by one each. */
static void etcd_channel_failed(kvd_etcd_t *e, grpc_channel *ch, kvd_status_t s)
{
    if (s == KVD_ERR_UNREACHABLE || s == KVD_ERR_TIMEOUT) {
        pthread_mutex_lock(&e->mu);
        if (ch == e->ch && !e->reset) {
            e->reset = true;
            e->cur = (e->cur + 1) % e->n_eps;
        }
        pthread_mutex_unlock(&e->mu);
    }
}

/* Whether a failed call's details tell of a TLS handshake that failed
 * (gRPC reports it as UNAVAILABLE, like a refused connection). */
static bool etcd_tls_failed(grpc_slice details)
{
    static const char *const marks[] = {"handshake", "SSL", "certificate",
                                        "Handshake", "ssl", "Certificate"};
    char text[512];
    size_t n = GRPC_SLICE_LENGTH(details);
    n = n < sizeof text - 1 ? n : sizeof text - 1;
    memcpy(text, GRPC_SLICE_START_PTR(details), n);
    text[n] = '\0';
    for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++) {
        if (strstr(text, marks[i]) != NULL) {
            return true;
        }
    }
    return false;
}

/* A call that failed: KVD_ERR_AUTH, with a warning saying why, when TLS
 * is on and the handshake failed (a wrong CA or client certificate, a
 * certificate not for this host, a plaintext etcd); `s` otherwise. */
static kvd_status_t etcd_failure(const kvd_etcd_t *e, const char *path,
                                 kvd_status_t s, grpc_slice details)
{
    if (s == KVD_ERR_UNREACHABLE && e->tls_ca != NULL &&
        etcd_tls_failed(details)) {
        KVD_LOG_RATELIMITED(
            KVD_LOG_LEVEL_WARN, 10000,
            "etcd %s: TLS handshake failed (check cluster.etcd_tls_ca, "
            "cluster.etcd_tls_cert, cluster.etcd_tls_key and that etcd "
            "serves TLS): %.*s",
            e->endpoint, (int)GRPC_SLICE_LENGTH(details),
            (const char *)GRPC_SLICE_START_PTR(details));
        return KVD_ERR_AUTH;
    }
    KVD_LOG_DEBUG("etcd %s%s: %s (%.*s)", e->endpoint, path, kvd_status_str(s),
                  (int)GRPC_SLICE_LENGTH(details),
                  (const char *)GRPC_SLICE_START_PTR(details));
    return s;
}

/* One request, one reply, within the timeout. */
static kvd_status_t etcd_call_once(kvd_etcd_t *e, const char *path,
                                   const ProtobufCMessage *req,
                                   const ProtobufCMessageDescriptor *rsp_desc,
                                   ProtobufCMessage **rsp_out)
{
    *rsp_out = NULL;
    grpc_byte_buffer *send = etcd_pack(req);
    if (send == NULL) {
        return KVD_ERR_NOMEM;
    }
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline = etcd_deadline(e->timeout_ms);
    grpc_channel *ch = etcd_channel_get(e);
    grpc_call *call = grpc_channel_create_call(
        ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
        grpc_slice_from_static_string(path), NULL, deadline, NULL);
    grpc_metadata_array initial, trailing;
    grpc_metadata_array_init(&initial);
    grpc_metadata_array_init(&trailing);
    grpc_byte_buffer *recv = NULL;
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &details;
    kvd_status_t s = KVD_ERR_PEER;
    if (grpc_call_start_batch(call, ops, 6, ops, NULL) == GRPC_CALL_OK) {
        (void)grpc_completion_queue_pluck(
            cq, ops,
            gpr_time_add(deadline, gpr_time_from_millis(1000, GPR_TIMESPAN)),
            NULL);
        s = kvd_status_from_grpc((int)code, path);
        etcd_channel_failed(e, ch, s);
        if (s == KVD_OK) {
            *rsp_out = etcd_unpack(rsp_desc, recv);
            s = *rsp_out != NULL ? KVD_OK : KVD_ERR_PROTO;
        } else {
            s = etcd_failure(e, path, s, details);
        }
    }
    if (recv != NULL) {
        grpc_byte_buffer_destroy(recv);
    }
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&initial);
    grpc_metadata_array_destroy(&trailing);
    grpc_byte_buffer_destroy(send);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL,
                                       gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
               .type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
    return s;
}

/* A call that could not reach etcd (refused, no route: it never got
 * there) goes to the next endpoint at once, each endpoint once. A timeout
 * is not tried again: the deadline is spent, and the request may have
 * been applied. */
static kvd_status_t etcd_call(kvd_etcd_t *e, const char *path,
                              const ProtobufCMessage *req,
                              const ProtobufCMessageDescriptor *rsp_desc,
                              ProtobufCMessage **rsp_out)
{
    kvd_status_t s = KVD_ERR_UNREACHABLE;
    for (size_t i = 0; i < e->n_eps && s == KVD_ERR_UNREACHABLE; i++) {
        s = etcd_call_once(e, path, req, rsp_desc, rsp_out);
    }
    return s;
}

/* Splits "a:p,b:p" into e->eps; false when an endpoint is empty or there
 * are too many. */
static bool etcd_endpoints(kvd_etcd_t *e, const char *list)
{
    const char *p = list;
    for (;;) {
        size_t n = strcspn(p, ",");
        if (n == 0 || e->n_eps == KVD_ETCD_ENDPOINTS_MAX) {
            return false;
        }
        snprintf(e->eps[e->n_eps++], sizeof e->eps[0], "%.*s", (int)n, p);
        if (p[n] == '\0') {
            return true;
        }
        p += n + 1;
    }
}

static void etcd_free(kvd_etcd_t *e)
{
    free(e->tls_ca);
    free(e->tls_cert);
    if (e->tls_key != NULL) {
        OPENSSL_cleanse(e->tls_key, strlen(e->tls_key));
        free(e->tls_key);
    }
    free(e);
}

/* Copies the TLS PEMs into `e`; KVD_ERR_INVALID when they do not go
 * together (a certificate without its key, either without a CA). */
static kvd_status_t etcd_tls_copy(kvd_etcd_t *e, const kvd_etcd_tls_t *tls)
{
    if (tls == NULL || tls->ca_pem == NULL) {
        return tls != NULL && (tls->cert_pem != NULL || tls->key_pem != NULL)
                   ? KVD_ERR_INVALID
                   : KVD_OK;
    }
    if ((tls->cert_pem == NULL) != (tls->key_pem == NULL)) {
        return KVD_ERR_INVALID;
    }
    e->tls_ca = strdup(tls->ca_pem);
    e->tls_cert = tls->cert_pem != NULL ? strdup(tls->cert_pem) : NULL;
    e->tls_key = tls->key_pem != NULL ? strdup(tls->key_pem) : NULL;
    if (e->tls_ca == NULL || (tls->cert_pem != NULL && e->tls_cert == NULL) ||
        (tls->key_pem != NULL && e->tls_key == NULL)) {
        return KVD_ERR_NOMEM;
    }
    return KVD_OK;
}

kvd_status_t kvd_etcd_open_tls(const char *endpoint, const kvd_etcd_tls_t *tls,
                               int timeout_ms, kvd_etcd_t **out)
{
    if (endpoint == NULL || out == NULL || timeout_ms <= 0 ||
        strlen(endpoint) == 0 || strlen(endpoint) >= 256) {
        return KVD_ERR_INVALID;
    }
    kvd_etcd_t *e = calloc(1, sizeof *e);
    if (e == NULL) {
        return KVD_ERR_NOMEM;
    }
    if (!etcd_endpoints(e, endpoint)) {
        free(e);
        return KVD_ERR_INVALID;
    }
    kvd_status_t s = etcd_tls_copy(e, tls);
    if (s != KVD_OK) {
        etcd_free(e);
        return s;
    }
    snprintf(e->endpoint, sizeof e->endpoint, "%s", endpoint);
    e->timeout_ms = timeout_ms;
    grpc_init();
    e->ch = etcd_channel(e, e->eps[0]);
    if (e->ch == NULL) {
        grpc_shutdown();
        etcd_free(e);
        return KVD_ERR_NOMEM;
    }
    pthread_mutex_init(&e->mu, NULL);
    *out = e;
    return KVD_OK;
}

kvd_status_t kvd_etcd_open(const char *endpoint, int timeout_ms,
                           kvd_etcd_t **out)
{
    return kvd_etcd_open_tls(endpoint, NULL, timeout_ms, out);
}

void kvd_etcd_close(kvd_etcd_t *e)
{
    if (e == NULL) {
        return;
    }
    grpc_channel_destroy(e->ch);
    pthread_mutex_destroy(&e->mu);
    grpc_shutdown();
    etcd_free(e);
}

kvd_status_t kvd_etcd_lease_grant(kvd_etcd_t *e, int64_t ttl_s, int64_t *id_out,
                                  int64_t *ttl_out)
{
    if (e == NULL || ttl_s <= 0 || id_out == NULL) {
        return KVD_ERR_INVALID;
    }
    Etcdserverpb__LeaseGrantRequest rq =
        ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
    rq.ttl = ttl_s;
    Etcdserverpb__LeaseGrantResponse *rsp = NULL;
    kvd_status_t s = etcd_call(e, "/etcdserverpb.Lease/LeaseGrant", &rq.base,
                               &etcdserverpb__lease_grant_response__descriptor,
                               (ProtobufCMessage **)&rsp);
    if (s == KVD_OK && (rsp->id == 0 || rsp->error[0] != '\0')) {
        KVD_LOG_ERROR("etcd %s: lease grant refused: %s", e->endpoint,
                      rsp->error[0] ? rsp->error : "no id");
        s = KVD_ERR_PEER;
    }
    if (s == KVD_OK) {
        *id_out = rsp->id;
        if (ttl_out != NULL) {
            *ttl_out = rsp->ttl;
        }
    }
    if (rsp != NULL) {
        protobuf_c_message_free_unpacked(&rsp->base, NULL);
    }
    return s;
}

kvd_status_t kvd_etcd_lease_keepalive(kvd_etcd_t *e, int64_t id,
                                      int64_t *ttl_out)
{
    if (e == NULL || id == 0) {
        return KVD_ERR_INVALID;
    }
    Etcdserverpb__LeaseKeepAliveRequest rq =
        ETCDSERVERPB__LEASE_KEEP_ALIVE_REQUEST__INIT;
    rq.id = id;
    Etcdserverpb__LeaseKeepAliveResponse *rsp = NULL;
    kvd_status_t s =
        etcd_call(e, "/etcdserverpb.Lease/LeaseKeepAlive", &rq.base,
                  &etcdserverpb__lease_keep_alive_response__descriptor,
                  (ProtobufCMessage **)&rsp);
    /* etcd answers a lease it does not know with TTL 0 (or less). */
    if (s == KVD_OK && rsp->ttl <= 0) {
        s = KVD_ERR_NOT_FOUND;
    }
    if (s == KVD_OK && ttl_out != NULL) {
        *ttl_out = rsp->ttl;
    }
    if (rsp != NULL) {
        protobuf_c_message_free_unpacked(&rsp->base, NULL);
    }
    return s;
}

kvd_status_t kvd_etcd_lease_revoke(kvd_etcd_t *e, int64_t id)
{
    if (e == NULL || id == 0) {
        return KVD_ERR_INVALID;
    }
    Etcdserverpb__LeaseRevokeRequest rq =
        ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
    rq.id = id;
    ProtobufCMessage *rsp = NULL;
    kvd_status_t s =
        etcd_call(e, "/etcdserverpb.Lease/LeaseRevoke", &rq.base,
                  &etcdserverpb__lease_revoke_response__descriptor, &rsp);
    if (rsp != NULL) {
        protobuf_c_message_free_unpacked(rsp, NULL);
    }
    return s;
}

kvd_status_t kvd_etcd_put(kvd_etcd_t *e, const char *key, const void *value,
                          size_t len, int64_t lease)
{
    if (e == NULL || key == NULL || key[0] == '\0' ||
        strlen(key) > KVD_ETCD_KEY_MAX || (value == NULL && len > 0) ||
        len > KVD_ETCD_VALUE_MAX) {
        return KVD_ERR_INVALID;
    }
    Etcdserverpb__PutRequest rq = ETCDSERVERPB__PUT_REQUEST__INIT;
    rq.key.data = (uint8_t *)key;
    rq.key.len = strlen(key);
    rq.value.data = (uint8_t *)value;
    rq.value.len = len;
    rq.lease = lease;
    ProtobufCMessage *rsp = NULL;
    kvd_status_t s = etcd_call(e, "/etcdserverpb.KV/Put", &rq.base,
                               &etcdserverpb__put_response__descriptor, &rsp);
    if (rsp != NULL) {
        protobuf_c_message_free_unpacked(rsp, NULL);
    }
    return s;
}

/* The end of the key range holding every key that starts with `prefix`:
 * the prefix with its last byte below 0xff incremented and the rest cut. */
static size_t etcd_prefix_end(const char *prefix, uint8_t *end, size_t cap)
{
    size_t n = strlen(prefix);
    if (n > cap) {
        return 0;
    }
    memcpy(end, prefix, n);
    while (n > 0) {
        if (end[n - 1] != 0xff) {
            end[n - 1]++;
            return n;
        }
        n--;
    }
    end[0] = 0; /* every key: range_end "\0" */
    return 1;
}

/* A decoded pair as the callbacks see it; false if it breaks the bounds. */
static bool etcd_kv(const Mvccpb__KeyValue *in, char *key, kvd_etcd_kv_t *out)
{
    if (in == NULL || in->key.len == 0 || in->key.len > KVD_ETCD_KEY_MAX ||
        memchr(in->key.data, 0, in->key.len) != NULL ||
        in->value.len > KVD_ETCD_VALUE_MAX) {
        return false;
    }
    memcpy(key, in->key.data, in->key.len);
    key[in->key.len] = '\0';
    out->key = key;
    out->value = in->value.data;
    out->value_len = in->value.len;
    out->mod_revision = in->mod_revision;
    out->lease = in->lease;
    return true;
}

kvd_status_t kvd_etcd_get_prefix(kvd_etcd_t *e, const char *prefix,
                                 kvd_etcd_kv_fn fn, void *ctx,
                                 int64_t *revision_out)
{
    uint8_t end[KVD_ETCD_KEY_MAX];
    size_t end_len = 0;
    if (e == NULL || prefix == NULL || prefix[0] == '\0' || fn == NULL ||
        (end_len = etcd_prefix_end(prefix, end, sizeof end)) == 0) {
        return KVD_ERR_INVALID;
    }
    Etcdserverpb__RangeRequest rq = ETCDSERVERPB__RANGE_REQUEST__INIT;
    rq.key.data = (uint8_t *)prefix;
    rq.key.len = strlen(prefix);
    rq.range_end.data = end;
    rq.range_end.len = end_len;
    Etcdserverpb__RangeResponse *rsp = NULL;
    kvd_status_t s = etcd_call(e, "/etcdserverpb.KV/Range", &rq.base,
                               &etcdserverpb__range_response__descriptor,
                               (ProtobufCMessage **)&rsp);
    if (s == KVD_OK && rsp->header == NULL) {
        s = KVD_ERR_PROTO;
    }
    char key[KVD_ETCD_KEY_MAX + 1];
    for (size_t i = 0; s == KVD_OK && i < rsp->n_kvs; i++) {
        kvd_etcd_kv_t kv;
        if (!etcd_kv(rsp->kvs[i], key, &kv)) {
            KVD_LOG_WARN("etcd %s: skipped a key under %s out of bounds",
                         e->endpoint, prefix);
            continue;
        }
        s = fn(ctx, &kv);
    }
    if (s == KVD_OK && revision_out != NULL) {
        *revision_out = rsp->header->revision;
    }
    if (rsp != NULL) {
        protobuf_c_message_free_unpacked(&rsp->base, NULL);
    }
    return s;
}

/* ---- watch --------------------------------------------------------------- */

/* Posts the next receive (tag &w->recv). */
static bool watch_post_recv(kvd_etcd_watch_t *w)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &w->recv;
    w->recv = NULL;
    if (grpc_call_start_batch(w->call, &op, 1, &w->recv, NULL) !=
        GRPC_CALL_OK) {
        return false;
    }
    w->recv_pending = true;
    return true;
}

/* Waits for the pending receive; KVD_OK with w->recv set (NULL: the stream
 * ended), or KVD_ERR_TIMEOUT with the receive still pending. */
static kvd_status_t watch_wait(kvd_etcd_watch_t *w, int wait_ms)
{
    grpc_event ev = grpc_completion_queue_pluck(
        w->cq, &w->recv, etcd_deadline(wait_ms < 0 ? 0 : wait_ms), NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
        return KVD_ERR_TIMEOUT;
    }
    w->recv_pending = false;
    if (ev.type != GRPC_OP_COMPLETE || !ev.success || w->recv == NULL) {
        w->ended = true;
    }
    return KVD_OK;
}

kvd_status_t kvd_etcd_watch_open(kvd_etcd_t *e, const char *prefix,
                                 int64_t start_revision, kvd_etcd_watch_t **out)
{
    uint8_t end[KVD_ETCD_KEY_MAX];
    size_t end_len = 0;
    if (e == NULL || prefix == NULL || prefix[0] == '\0' || out == NULL ||
        start_revision < 0 ||
        (end_len = etcd_prefix_end(prefix, end, sizeof end)) == 0) {
        return KVD_ERR_INVALID;
    }
    kvd_etcd_watch_t *w = calloc(1, sizeof *w);
    if (w == NULL) {
        return KVD_ERR_NOMEM;
    }
    w->etcd = e;
    w->cq = grpc_completion_queue_create_for_pluck(NULL);
    w->details = grpc_empty_slice();
    grpc_metadata_array_init(&w->initial);
    grpc_metadata_array_init(&w->trailing);
    grpc_channel *ch = etcd_channel_get(e);
    w->call = grpc_channel_create_call(
        ch, NULL, GRPC_PROPAGATE_DEFAULTS, w->cq,
        grpc_slice_from_static_string("/etcdserverpb.Watch/Watch"), NULL,
        gpr_inf_future(GPR_CLOCK_REALTIME), NULL);

    Etcdserverpb__WatchCreateRequest cr =
        ETCDSERVERPB__WATCH_CREATE_REQUEST__INIT;
    cr.key.data = (uint8_t *)prefix;
    cr.key.len = strlen(prefix);
    cr.range_end.data = end;
    cr.range_end.len = end_len;
    cr.start_revision = start_revision;
    Etcdserverpb__WatchRequest rq = ETCDSERVERPB__WATCH_REQUEST__INIT;
    rq.request_union_case =
        ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST;
    rq.create_request = &cr;
    grpc_byte_buffer *send = etcd_pack(&rq.base);
    kvd_status_t s = send != NULL ? KVD_OK : KVD_ERR_NOMEM;

    /* The status is asked for up front: it completes when the stream ends. */
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &w->trailing;
    ops[0].data.recv_status_on_client.status = &w->code;
    ops[0].data.recv_status_on_client.status_details = &w->details;
    if (s == KVD_OK) {
        w->status_posted = grpc_call_start_batch(w->call, ops, 1, &w->code,
                                                 NULL) == GRPC_CALL_OK;
        s = w->status_posted ? KVD_OK : KVD_ERR_PEER;
    }
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[2].data.recv_initial_metadata.recv_initial_metadata = &w->initial;
    if (s == KVD_OK) {
        if (grpc_call_start_batch(w->call, ops, 3, ops, NULL) != GRPC_CALL_OK) {
            s = KVD_ERR_PEER;
        } else {
            grpc_event ev = grpc_completion_queue_pluck(
                w->cq, ops, etcd_deadline(e->timeout_ms), NULL);
            if (ev.type == GRPC_QUEUE_TIMEOUT) {
                /* The batch still uses `send`: end it before freeing. */
                grpc_call_cancel(w->call, NULL);
                (void)grpc_completion_queue_pluck(
                    w->cq, ops, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
                s = KVD_ERR_TIMEOUT;
            } else if (!ev.success) {
                s = KVD_ERR_UNREACHABLE;
            }
        }
    }
    if (send != NULL) {
        grpc_byte_buffer_destroy(send);
    }
    /* etcd confirms with a response that says `created`. */
    if (s == KVD_OK) {
        s = watch_post_recv(w) ? watch_wait(w, e->timeout_ms) : KVD_ERR_PEER;
    }
    if (s == KVD_OK) {
        Etcdserverpb__WatchResponse *r =
            w->ended ? NULL
                     : (Etcdserverpb__WatchResponse *)etcd_unpack(
                           &etcdserverpb__watch_response__descriptor, w->recv);
        if (w->ended) {
            s = KVD_ERR_UNREACHABLE;
        } else if (r == NULL || !r->created || r->canceled) {
            s = r == NULL ? KVD_ERR_PROTO : KVD_ERR_STATE;
        }
        if (r != NULL) {
            protobuf_c_message_free_unpacked(&r->base, NULL);
        }
        if (w->recv != NULL) {
            grpc_byte_buffer_destroy(w->recv);
            w->recv = NULL;
        }
    }
    if (s != KVD_OK) {
        etcd_channel_failed(e, ch, s);
        KVD_LOG_DEBUG("etcd %s: watch %s from %lld: %s", e->endpoint, prefix,
                      (long long)start_revision, kvd_status_str(s));
        kvd_etcd_watch_close(w);
        return s;
    }
    *out = w;
    return KVD_OK;
}

kvd_status_t kvd_etcd_watch_next(kvd_etcd_watch_t *w, int wait_ms,
                                 kvd_etcd_event_fn fn, void *ctx)
{
    if (w == NULL || fn == NULL) {
        return KVD_ERR_INVALID;
    }
    if (w->ended) {
        return KVD_ERR_UNREACHABLE;
    }
    if (!w->recv_pending && !watch_post_recv(w)) {
        w->ended = true;
        return KVD_ERR_UNREACHABLE;
    }
    kvd_status_t s = watch_wait(w, wait_ms);
    if (s != KVD_OK) {
        return s;
    }
    if (w->ended) {
        return KVD_ERR_UNREACHABLE;
    }
    Etcdserverpb__WatchResponse *r = (Etcdserverpb__WatchResponse *)etcd_unpack(
        &etcdserverpb__watch_response__descriptor, w->recv);
    grpc_byte_buffer_destroy(w->recv);
    w->recv = NULL;
    if (r == NULL) {
        return KVD_ERR_PROTO;
    }
    if (r->canceled) {
        KVD_LOG_WARN("etcd %s: watch cancelled (%s; compacted at %lld)",
                     w->etcd->endpoint, r->cancel_reason,
                     (long long)r->compact_revision);
        w->ended = true;
        s = KVD_ERR_STATE;
    }
    char key[KVD_ETCD_KEY_MAX + 1];
    for (size_t i = 0; s == KVD_OK && i < r->n_events; i++) {
        const Mvccpb__Event *ev = r->events[i];
        kvd_etcd_kv_t kv;
        if (ev == NULL || !etcd_kv(ev->kv, key, &kv)) {
            continue;
        }
        s = fn(ctx,
               ev->type == MVCCPB__EVENT__EVENT_TYPE__DELETE ? KVD_ETCD_DELETE
                                                             : KVD_ETCD_PUT,
               &kv);
    }
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return s;
}

void kvd_etcd_watch_close(kvd_etcd_watch_t *w)
{
    if (w == NULL) {
        return;
    }
    if (w->call != NULL) {
        grpc_call_cancel(w->call, NULL);
        /* Both outstanding batches complete once the call is cancelled. */
        if (w->recv_pending) {
            (void)grpc_completion_queue_pluck(
                w->cq, &w->recv, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        }
        if (w->status_posted) {
            (void)grpc_completion_queue_pluck(
                w->cq, &w->code, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        }
        grpc_call_unref(w->call);
    }
    if (w->recv != NULL) {
        grpc_byte_buffer_destroy(w->recv);
    }
    grpc_slice_unref(w->details);
    grpc_metadata_array_destroy(&w->initial);
    grpc_metadata_array_destroy(&w->trailing);
    grpc_completion_queue_shutdown(w->cq);
    while (grpc_completion_queue_pluck(w->cq, NULL,
                                       gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
               .type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(w->cq);
    free(w);
}
