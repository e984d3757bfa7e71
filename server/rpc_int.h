/*
 * kvdepotd's gRPC transport (the only server file that includes grpc.h):
 * completion-queue threads that take unary calls, check who is calling,
 * and hand the request bytes to the service (service_int.h).
 *
 * Per call: the method must be one of kvdepot.v1.KvStore's (else
 * UNIMPLEMENTED, nothing read); a TCP caller must present
 * `authorization: Bearer <server.token>` or, with TLS on, a client
 * certificate the configured CA signed (else UNAUTHENTICATED). Callers are
 * checked from the call's initial metadata alone: the request message is
 * read only once the caller is admitted, so a refused caller's payload is
 * never buffered (HTTP/2 flow control holds it at the client). A caller
 * that names a daemon instance (metadata `kvdepot-instance`, hex) other
 * than this one gets FAILED_PRECONDITION (its arena mapping and its ids are
 * from a previous daemon). Every reply carries the kvd_status_t as trailing
 * metadata `kvdepot-status` so the client gets the exact status back.
 *
 * Threading: start/stop from one thread; the CQ threads are internal.
 */
#ifndef KVD_STORE_SERVER_RPC_INT_H
#define KVD_STORE_SERVER_RPC_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/service_int.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Metadata keys shared with the client. */
#define KVD_RPC_MD_INSTANCE "kvdepot-instance"
#define KVD_RPC_MD_STATUS "kvdepot-status"
#define KVD_RPC_MD_SESSION "kvdepot-session"

/* Resolves a unix caller's session (the hex text of the secret the arena
 * hand-off gave it) to its tenant: KVD_OK with *tenant_out the tenant its
 * uid maps to (NULL: none, the request's own applies) and *session_out the
 * session's id (never 0; kvd_service_call_session), or KVD_ERR_AUTH for
 * an unknown session. Called from the completion-queue threads. */
typedef kvd_status_t (*kvd_rpc_session_fn)(void *ctx, const char *hex,
                                           size_t len, const char **tenant_out,
                                           uint64_t *session_out);

typedef struct kvd_rpc_server kvd_rpc_server_t;

/* A TCP credential bound to a tenant: a bearer token, or the common name
 * of a client certificate. */
typedef struct kvd_rpc_credential {
    const char *secret; /* the token, or the certificate's CN */
    const char *tenant;
} kvd_rpc_credential_t;

typedef struct kvd_rpc_config {
    kvd_service_t *svc;      /* borrowed; outlives the server */
    const char *unix_path;   /* "" or NULL: no unix socket */
    unsigned unix_mode;      /* permissions set on the socket file */
    const char *tcp_address; /* "" or NULL: no TCP; "127.0.0.1:0" picks */
    const char *token;       /* required for TCP callers; copied */
    /* TLS on TCP with client certificates (all three PEM texts, or all
     * NULL): a caller presenting a certificate the CA signed is admitted
     * without a token, unless a token is set too (then both are needed). */
    const char *tls_cert_pem;
    const char *tls_key_pem;
    const char *tls_ca_pem;
    int threads;              /* completion-queue threads, >= 1 */
    int max_message_bytes;    /* gRPC receive/send limit */
    int max_streams;          /* concurrent calls per connection; 0: 64 */
    int handshake_timeout_ms; /* TCP/TLS handshake deadline; 0: 10 s */
    uint64_t instance_id;
    /* Sessions of unix callers; with sessions_required a unix call without
     * a valid session is UNAUTHENTICATED (tenants are mapped to users). */
    kvd_rpc_session_fn session;
    void *session_ctx;
    bool sessions_required;
    /* Tenants of TCP callers (borrowed; they outlive the server): a caller
     * whose bearer token is one of `tenant_tokens` is bound to its tenant
     * (any token admits when tokens are set: server.token or these); with
     * TLS, a client certificate whose CN is one of `tenant_cns` binds its
     * tenant. A CN tenant and a token tenant that differ are refused. A
     * caller bound by neither acts as an operator (no tenant). */
    const kvd_rpc_credential_t *tenant_tokens;
    size_t n_tenant_tokens;
    const kvd_rpc_credential_t *tenant_cns;
    size_t n_tenant_cns;
} kvd_rpc_config_t;

/*
 * Binds, starts the threads and writes the bound TCP port (0 without TCP)
 * into *tcp_port_out. Errors (nothing left running, the reason in `err`):
 * KVD_ERR_INVALID (no listener, TCP without a token, bad values),
 * KVD_ERR_EXISTS (another daemon answers on the unix socket),
 * KVD_ERR_UNREACHABLE (bind failed), KVD_ERR_NOMEM.
 */
kvd_status_t kvd_rpc_server_start(const kvd_rpc_config_t *cfg,
                                  kvd_rpc_server_t **server_out,
                                  int *tcp_port_out, char *err, size_t err_len);

/* Checks what kvd_rpc_server_start would refuse before binding anything:
 * a listener at all, TCP callers authenticated, the TLS parts together,
 * lengths, and a tcp_address kvd_rpc_address_split accepts. Errors:
 * KVD_ERR_INVALID, the setting and the reason in `err`. Pure; any thread
 * (kvd_server_check_config runs it for --check-config). */
kvd_status_t kvd_rpc_config_check(const kvd_rpc_config_t *cfg, char *err,
                                  size_t err_len);

/* Splits a listen address "host:port", "[v6]:port" or ":port" (host ""):
 * writes the host (brackets removed) and the port, a decimal 0-65535 (0:
 * the system picks). False when malformed or the host does not fit in
 * `host_len`. Pure; any thread. */
bool kvd_rpc_address_split(const char *address, char *host, size_t host_len,
                           int *port_out);

/* Token comparison without a timing side channel: both sides are reduced
 * to their SHA-256 digest and the digests compared with CRYPTO_memcmp, so
 * neither the position of the first differing byte nor the secret's
 * length shows in the time taken (the stored secret's digest is computed
 * once, at start). kvd_rpc_token_digest writes the digest of `prefix`
 * followed by `secret` (either may be empty; NULL with length 0 is
 * accepted) and returns false only if OpenSSL fails.
 * kvd_rpc_token_match says whether the presented value `v` has digest
 * `want`. Both are pure functions, callable from any thread. */
#define KVD_RPC_TOKEN_DIGEST_BYTES 32
bool kvd_rpc_token_digest(const char *prefix, const void *secret, size_t len,
                          uint8_t out[KVD_RPC_TOKEN_DIGEST_BYTES]);
bool kvd_rpc_token_match(const uint8_t want[KVD_RPC_TOKEN_DIGEST_BYTES],
                         const void *v, size_t len);

/* Stops taking calls, lets calls in progress finish for up to `grace_ms`,
 * cancels the rest, joins the threads, removes the unix socket file and
 * frees. NULL is accepted. */
void kvd_rpc_server_stop(kvd_rpc_server_t *server, int grace_ms);

#ifdef __cplusplus
}
#endif

#endif /* KVD_STORE_SERVER_RPC_INT_H */
