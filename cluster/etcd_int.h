/*
 * A small etcd v3 client over the gRPC C core (issue "Cluster and
 * disaggregation", docs/cluster.md): what the daemon's membership needs and
 * nothing more. The messages are etcd's own rpc.proto, kv.proto and
 * auth.proto, taken at build time from Debian's golang-etcd-server-dev and
 * compiled with protoc-c (scripts/etcd_protos.py; docs/cluster.md says why
 * gRPC and not the JSON gateway).
 *
 * Every call has a deadline (the client's timeout) and returns KVD_OK or:
 * KVD_ERR_UNREACHABLE (no etcd answers: refused, unavailable),
 * KVD_ERR_TIMEOUT (the deadline passed), KVD_ERR_NOT_FOUND (an unknown or
 * expired lease), KVD_ERR_PROTO (a reply that does not decode or lacks what
 * it must carry), KVD_ERR_INVALID (bad arguments), KVD_ERR_NOMEM,
 * KVD_ERR_PEER (gRPC would not start the call), or any other error etcd
 * reports as kvd_status_from_grpc translates its code (common/status_int.h:
 * KVD_ERR_BUSY, KVD_ERR_AUTH, ..., KVD_ERR_RPC for the rest; logged with
 * its text).
 *
 * Threading: one kvd_etcd_t may be used from several threads at once (the
 * gRPC channel is); a watch belongs to one thread at a time.
 */
#ifndef KVD_CLUSTER_ETCD_INT_H
#define KVD_CLUSTER_ETCD_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kvdepot/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvd_etcd kvd_etcd_t;
typedef struct kvd_etcd_watch kvd_etcd_watch_t;

/* Keys and values are bounded so a broken or hostile etcd cannot make the
 * daemon hold large replies. */
#define KVD_ETCD_KEY_MAX 512
#define KVD_ETCD_VALUE_MAX 4096

/* Endpoints one client may be given. */
#define KVD_ETCD_ENDPOINTS_MAX 8

/* Connects lazily to `endpoint` ("host:port", plaintext), or to the first
 * of several ("a:p,b:p", at most KVD_ETCD_ENDPOINTS_MAX, the whole text
 * under 256 bytes): a call that cannot reach one (KVD_ERR_UNREACHABLE) is
 * tried at once on the next, each once, and one that times out leaves
 * the next call to the next endpoint; the client stays on an endpoint
 * while it answers. Calls time out after `timeout_ms`. KVD_ERR_INVALID:
 * an empty endpoint or too many. */
kvd_status_t kvd_etcd_open(const char *endpoint, int timeout_ms,
                           kvd_etcd_t **out);

/* TLS to etcd: PEM texts (not file names), copied by kvd_etcd_open_tls.
 * ca_pem alone: the client checks etcd's certificate against this CA (and
 * its subjectAltName against the endpoint's host); with cert_pem and
 * key_pem it also presents that certificate (etcd's --client-cert-auth). */
typedef struct kvd_etcd_tls {
    const char *ca_pem;   /* NULL: plaintext (the others must be NULL) */
    const char *cert_pem; /* NULL: no client certificate */
    const char *key_pem;  /* with cert_pem */
} kvd_etcd_tls_t;

/* kvd_etcd_open over TLS when `tls` is not NULL and names a CA. A TLS
 * handshake that fails (etcd's certificate not signed by the CA, or not
 * for the endpoint's host; etcd refusing this client's certificate; a
 * plaintext etcd) fails each call with KVD_ERR_AUTH, and the reason is
 * logged as a warning. KVD_ERR_INVALID also: a certificate without its
 * key or the reverse, either without a CA. */
kvd_status_t kvd_etcd_open_tls(const char *endpoint, const kvd_etcd_tls_t *tls,
                               int timeout_ms, kvd_etcd_t **out);
void kvd_etcd_close(kvd_etcd_t *etcd);

/* A lease of `ttl_s` seconds; its id (never 0) and the TTL etcd granted. */
kvd_status_t kvd_etcd_lease_grant(kvd_etcd_t *etcd, int64_t ttl_s,
                                  int64_t *id_out, int64_t *ttl_out);
/* Renews a lease once; the TTL it has again. KVD_ERR_NOT_FOUND if etcd no
 * longer knows it (expired or revoked). */
kvd_status_t kvd_etcd_lease_keepalive(kvd_etcd_t *etcd, int64_t id,
                                      int64_t *ttl_out);
/* Revokes a lease (its keys go at once). */
kvd_status_t kvd_etcd_lease_revoke(kvd_etcd_t *etcd, int64_t id);

/* Puts `key` = `value` (len bytes), attached to `lease` (0: none). */
kvd_status_t kvd_etcd_put(kvd_etcd_t *etcd, const char *key, const void *value,
                          size_t len, int64_t lease);

/* One key-value pair of a read or a watch event. */
typedef struct kvd_etcd_kv {
    const char *key; /* NUL-terminated */
    const uint8_t *value;
    size_t value_len;
    int64_t mod_revision;
    int64_t lease;
} kvd_etcd_kv_t;

/* Called for each pair; a status other than KVD_OK stops and is returned. */
typedef kvd_status_t (*kvd_etcd_kv_fn)(void *ctx, const kvd_etcd_kv_t *kv);

/* Every key under `prefix`, in key order, then the store revision the read
 * saw (watch from revision + 1 to miss nothing). */
kvd_status_t kvd_etcd_get_prefix(kvd_etcd_t *etcd, const char *prefix,
                                 kvd_etcd_kv_fn fn, void *ctx,
                                 int64_t *revision_out);

enum kvd_etcd_event_type { KVD_ETCD_PUT = 0, KVD_ETCD_DELETE = 1 };

typedef kvd_status_t (*kvd_etcd_event_fn)(void *ctx,
                                          enum kvd_etcd_event_type type,
                                          const kvd_etcd_kv_t *kv);

/* Watches every key under `prefix` from `start_revision` on; waits for
 * etcd to confirm the watch. */
kvd_status_t kvd_etcd_watch_open(kvd_etcd_t *etcd, const char *prefix,
                                 int64_t start_revision,
                                 kvd_etcd_watch_t **out);
/* Waits up to `wait_ms` for the next batch of events and hands each to
 * `fn`. KVD_ERR_TIMEOUT when none came (the watch stays usable);
 * KVD_ERR_UNREACHABLE when the stream ended (open a new one), KVD_ERR_STATE
 * when etcd cancelled it (e.g. the revision was compacted). */
kvd_status_t kvd_etcd_watch_next(kvd_etcd_watch_t *watch, int wait_ms,
                                 kvd_etcd_event_fn fn, void *ctx);
/* Cancels the stream and frees. NULL is accepted. */
void kvd_etcd_watch_close(kvd_etcd_watch_t *watch);

#ifdef __cplusplus
}
#endif

#endif /* KVD_CLUSTER_ETCD_INT_H */
