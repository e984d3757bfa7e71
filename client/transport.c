/*
 * The store client's transport (client_int.h): one unary gRPC call to
 * kvdepotd. The only client file that includes grpc.h.
 *
 * Per call: pack (validated) → one unary call with the deadline and the
 * daemon instance this process mapped → unpack the reply (validated: the
 * daemon is a peer, not trusted memory). The status comes back exactly
 * through the `kvdepot-status` trailer; without it (the daemon is down, the
 * transport failed) gRPC's code is translated by kvd_status_from_grpc
 * (common/status_int.h), the one translation the etcd client uses too.
 *
 * A reply saying the instance changed (KVD_ERR_STATE) means the daemon
 * restarted: the arena is mapped again (mapping.c) and calls that carry no
 * ids are sent once more. A reply saying the session is unknown
 * (KVD_ERR_AUTH, with a hand-off session) means the daemon forgot it: the
 * hand-off is done again and the call sent once more. A client over TCP
 * (remote) also sends `authorization: Bearer <token>` with every call.
 */
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "client/client_int.h"
#include "common/log_int.h"
#include "common/status_int.h"

/* kvd_status_from_grpc takes gRPC's wire codes as ints. */
_Static_assert(GRPC_STATUS_OK == 0 && GRPC_STATUS_DEADLINE_EXCEEDED == 4 &&
                   GRPC_STATUS_UNAVAILABLE == 14 &&
                   GRPC_STATUS_UNAUTHENTICATED == 16,
               "gRPC status codes are its wire codes");

static bool md_status(const grpc_metadata_array *md, kvd_status_t *out)
{
    static const char key[] = "kvdepot-status";
    for (size_t i = 0; i < md->count; i++) {
        grpc_slice k = md->metadata[i].key, v = md->metadata[i].value;
        if (GRPC_SLICE_LENGTH(k) != sizeof key - 1 ||
            memcmp(GRPC_SLICE_START_PTR(k), key, sizeof key - 1) != 0 ||
            GRPC_SLICE_LENGTH(v) == 0 || GRPC_SLICE_LENGTH(v) > 11) {
            continue;
        }
        char buf[12];
        memcpy(buf, GRPC_SLICE_START_PTR(v), GRPC_SLICE_LENGTH(v));
        buf[GRPC_SLICE_LENGTH(v)] = '\0';
        char *end = NULL;
        long s = strtol(buf, &end, 10);
        if (*end == '\0' && s <= 0 && s >= KVD_ERR_INTERNAL) {
            *out = (kvd_status_t)s;
            return true;
        }
    }
    return false;
}

/* ---- one unary call ------------------------------------------------------ */

static const char *const cl_paths[] = {
    "/kvdepot.v1.KvStore/Lookup",  "/kvdepot.v1.KvStore/Reserve",
    "/kvdepot.v1.KvStore/Commit",  "/kvdepot.v1.KvStore/Abort",
    "/kvdepot.v1.KvStore/Release", "/kvdepot.v1.KvStore/Get",
    "/kvdepot.v1.KvStore/Promote", "/kvdepot.v1.KvStore/Stats",
    "/kvdepot.v1.KvStore/Admin",   "/kvdepot.v1.KvStore/Delete",
};

/* The call's initial metadata into md[0..3): the instance and hand-off
 * session this process mapped, and the bearer token of a client over TCP.
 * A remote client maps no arena: it names no instance and no session (the
 * daemon would take an empty one for a restart). Returns how many; the
 * caller unrefs their values. */
static size_t cl_metadata(const kvd_client_t *c, const char *inst,
                          const char *sess, grpc_metadata md[3])
{
    size_t nmd = 0;
    if (!c->remote) {
        md[nmd].key = grpc_slice_from_static_string("kvdepot-instance");
        md[nmd++].value = grpc_slice_from_copied_string(inst);
        md[nmd].key = grpc_slice_from_static_string("kvdepot-session");
        md[nmd++].value = grpc_slice_from_copied_string(sess);
    }
    if (c->auth != NULL) {
        md[nmd].key = grpc_slice_from_static_string("authorization");
        md[nmd++].value = grpc_slice_from_copied_string(c->auth);
    }
    return nmd;
}

/*
 * Sends `req` (of type `rq_type`) and unpacks the reply as `rsp_type` into
 * *rsp_out (kvd_proto_free it). `instance_used` gets the instance the call
 * named, so a caller can tell a restart, and `sess` (sizeof
 * c->session_hex) the session it sent.
 */
static kvd_status_t
cl_call_once(kvd_client_t *c, enum cl_method m, kvd_proto_msg_t rq_type,
             const ProtobufCMessage *req, kvd_proto_msg_t rsp_type,
             ProtobufCMessage **rsp_out, uint64_t *instance_used, char *sess)
{
    char reason[KVD_PROTO_REASON_MAX];
    uint8_t *buf = NULL;
    size_t len = 0;
    kvd_status_t s =
        kvd_proto_pack_alloc(rq_type, req, &buf, &len, reason, sizeof reason);
    if (s != KVD_OK) {
        KVD_LOG_ERROR("store client: %s not sent: %s", cl_paths[m], reason);
        return s;
    }
    char inst[17];
    pthread_mutex_lock(&c->mu);
    memcpy(inst, c->instance_hex, sizeof inst);
    memcpy(sess, c->session_hex, sizeof c->session_hex);
    *instance_used = c->instance;
    pthread_mutex_unlock(&c->mu);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline = gpr_time_add(
        gpr_now(GPR_CLOCK_MONOTONIC),
        gpr_time_from_millis((int64_t)c->cfg.timeout_ms, GPR_TIMESPAN));
    grpc_call *call = grpc_channel_create_call(
        c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
        grpc_slice_from_static_string(cl_paths[m]), NULL, deadline, NULL);
    grpc_slice body = grpc_slice_new(buf, len, free);
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&body, 1);
    grpc_slice_unref(body);
    grpc_metadata md[3];
    size_t nmd = cl_metadata(c, inst, sess, md);
    grpc_metadata_array initial, trailing;
    grpc_metadata_array_init(&initial);
    grpc_metadata_array_init(&trailing);
    grpc_byte_buffer *recv = NULL;
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = nmd;
    ops[0].data.send_initial_metadata.metadata = md;
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
    grpc_call_error e = grpc_call_start_batch(call, ops, 6, ops, NULL);
    if (e == GRPC_CALL_OK) {
        /* The deadline bounds the call; the pluck waits a little longer so
         * the call's own DEADLINE_EXCEEDED is what we see. */
        (void)grpc_completion_queue_pluck(
            cq, ops,
            gpr_time_add(deadline, gpr_time_from_millis(1000, GPR_TIMESPAN)),
            NULL);
        kvd_status_t ks;
        if (md_status(&trailing, &ks)) {
            s = ks;
        } else {
            s = kvd_status_from_grpc((int)code, cl_paths[m]);
        }
        if (s != KVD_OK) {
            KVD_LOG_DEBUG("store client: %s: %s (%.*s)", cl_paths[m],
                          kvd_status_str(s), (int)GRPC_SLICE_LENGTH(details),
                          (const char *)GRPC_SLICE_START_PTR(details));
        }
    } else {
        s = KVD_ERR_RPC;
    }
    if (s == KVD_OK) {
        if (recv == NULL) {
            s = KVD_ERR_PROTO;
        } else {
            grpc_byte_buffer_reader rd;
            if (!grpc_byte_buffer_reader_init(&rd, recv)) {
                s = KVD_ERR_PROTO;
            } else {
                grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
                grpc_byte_buffer_reader_destroy(&rd);
                s = kvd_proto_unpack(rsp_type, GRPC_SLICE_START_PTR(all),
                                     GRPC_SLICE_LENGTH(all), rsp_out, reason,
                                     sizeof reason);
                if (s != KVD_OK) {
                    KVD_LOG_ERROR("store client: %s: invalid reply: %s",
                                  cl_paths[m], reason);
                }
                grpc_slice_unref(all);
            }
        }
    }
    if (recv != NULL) {
        grpc_byte_buffer_destroy(recv);
    }
    grpc_slice_unref(details);
    for (size_t i = 0; i < nmd; i++) {
        grpc_slice_unref(md[i].value);
    }
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

/* A call that names no id: sent again once after a remap. */
kvd_status_t kvd_cl_call(kvd_client_t *c, enum cl_method m,
                         kvd_proto_msg_t rq_type, const ProtobufCMessage *req,
                         kvd_proto_msg_t rsp_type, ProtobufCMessage **rsp_out,
                         uint64_t *instance_used, bool retry)
{
    char sess[sizeof c->session_hex];
    kvd_status_t s = cl_call_once(c, m, rq_type, req, rsp_type, rsp_out,
                                  instance_used, sess);
    if (s == KVD_ERR_AUTH && sess[0] != '\0' &&
        kvd_cl_session_renew(c, sess) == KVD_OK) {
        /* The daemon forgot our hand-off session (it ended, and its slot
         * went to another): the same call again with the new one. */
        s = cl_call_once(c, m, rq_type, req, rsp_type, rsp_out, instance_used,
                         sess);
    }
    if (s == KVD_ERR_STATE && kvd_cl_arena_remap(c, *instance_used) == KVD_OK) {
        if (!retry) {
            return KVD_ERR_NOT_FOUND;
        }
        s = cl_call_once(c, m, rq_type, req, rsp_type, rsp_out, instance_used,
                         sess);
    }
    return s;
}

/* ---- the channel --------------------------------------------------------- */

void kvd_cl_channel_open(kvd_client_t *c)
{
    grpc_init();
    /* The minimal stack leaves out what a local store call does not use
     * (census, compression, retry buffering); deadlines stay on. Reconnect
     * backoff starts at 100 ms and stays under 1 s, so a restarted daemon
     * is found again quickly. GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is left
     * alone: gRPC also takes it as the time one connection attempt may
     * wait for the server's first SETTINGS frame, and a daemon slower than
     * that to answer (a loaded machine, valgrind) failed every call with
     * UNREACHABLE; each call's deadline (store.timeout) bounds the wait. */
    grpc_arg args[6] = {
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_MINIMAL_STACK,
         .value.integer = 1},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_ENABLE_DEADLINE_CHECKS,
         .value.integer = 1},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_ENABLE_RETRIES,
         .value.integer = 0},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = CL_MAX_MESSAGE},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
         .value.integer = 1000},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
         .value.integer = 100},
    };
    grpc_channel_args cargs = {.num_args = 6, .args = args};
    /* Over TCP with store.tls_ca: TLS, the daemon's certificate checked
     * against that CA, and this client's (store.tls_cert) presented. */
    grpc_ssl_pem_key_cert_pair pair = {.private_key = c->tls_key_pem,
                                       .cert_chain = c->tls_cert_pem};
    grpc_channel_credentials *creds =
        c->tls_ca_pem != NULL
            ? grpc_ssl_credentials_create(
                  c->tls_ca_pem, c->tls_cert_pem != NULL ? &pair : NULL, NULL,
                  NULL)
            : grpc_insecure_credentials_create();
    c->ch = grpc_channel_create(c->address, creds, &cargs);
    grpc_channel_credentials_release(creds);
}

void kvd_cl_channel_close(kvd_client_t *c)
{
    if (c->ch != NULL) {
        grpc_channel_destroy(c->ch);
        grpc_shutdown();
    }
}
