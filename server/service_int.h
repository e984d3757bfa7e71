/*
 * The KvStore service of kvdepotd (proto/kvdepot/v1/store.proto), without
 * the transport: a request's bytes in, a response's bytes out. rpc.c feeds
 * it from gRPC; tests/fuzz/fuzz_service.c drives it in-process.
 *
 * State kept here, on top of the embedded store it serves:
 *   - leases: a Lookup or Get takes store leases on a batch of blocks and
 *     answers one lease id for them; Release, or the lease's deadline
 *     (reclaimed by the housekeeping thread: a crashed client's leases come
 *     back after their TTL), gives them back. Get extends the deadline.
 *   - reservations: Reserve's slots under one id until Commit / Abort / the
 *     deadline, which aborts what is left.
 *   - quarantine: a lease or reservation of a hand-off session that
 *     expires while the session is open keeps its slots until the session
 *     acknowledges (releases / aborts the id) or closes
 *     (kvd_service_call_session).
 *   - gets in flight: a Get on a block in the disk tier submits a store get
 *     and answers PENDING; the housekeeping thread applies the completion,
 *     and the next Get answers READY (or FAILED with the status).
 * Counters and per-method latency histograms for /metrics.
 *
 * Threading: kvd_service_call from any number of threads at once; one
 * mutex guards the lease and reservation tables. The housekeeping thread is
 * the store's only poller (kvd_store_poll), as store.h requires.
 */
#ifndef KVD_STORE_SERVER_SERVICE_INT_H
#define KVD_STORE_SERVER_SERVICE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cluster/membership.h"
#include "kvdepot/store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The methods of kvdepot.v1.KvStore, in proto order. */
typedef enum kvd_rpc_method {
    KVD_RPC_LOOKUP = 0,
    KVD_RPC_RESERVE,
    KVD_RPC_COMMIT,
    KVD_RPC_ABORT,
    KVD_RPC_RELEASE,
    KVD_RPC_GET,
    KVD_RPC_PROMOTE,
    KVD_RPC_STATS,
    KVD_RPC_ADMIN,
    KVD_RPC_DELETE,
    KVD_RPC_COUNT
} kvd_rpc_method_t;

/* "/kvdepot.v1.KvStore/Lookup", ...; NULL for a bad value. */
const char *kvd_rpc_method_path(kvd_rpc_method_t method);
/* "Lookup", ...; NULL for a bad value. */
const char *kvd_rpc_method_name(kvd_rpc_method_t method);
/* The method whose path is path[0..len), or -1. */
int kvd_rpc_method_find(const char *path, size_t len);

typedef struct kvd_service kvd_service_t;

/* One setting the daemon runs with, for Admin config_dump. */
typedef struct kvd_service_config_entry {
    const char *key, *value, *source;
} kvd_service_config_entry_t;

typedef struct kvd_service_config {
    kvd_store_t *store;          /* borrowed; outlives the service */
    const char *node_id;         /* PingReply.node_id, copied */
    uint32_t lease_ttl_ms;       /* Get's lease when the request says 0 */
    uint32_t reservation_ttl_ms; /* Reserve's when the request says 0 */
    /* The longest reservation granted (0: no cap): a longer request gets
     * this, and the reply's ttl_ms says so. */
    uint32_t reservation_ttl_max_ms;
    /* Object bytes one caller may hold reserved at once (0: no limit),
     * quarantined reservations included. The caller is its tenant when
     * bound to one, else its hand-off session, else every unbound caller
     * without a session together. Blocks beyond it are REJECTED with
     * KVD_ERR_NOSPACE, before the store is asked (no eviction for them). */
    uint64_t max_reserved_bytes;
    uint32_t flush_timeout_ms; /* Admin flush when the request says 0 */
    bool verify_commits;       /* check a whole-object checksum on Commit */
    /* Bytes of objects one tenant may hold leased at once (callers bound
     * to no tenant count as one); 0: no limit. A Lookup beyond it matches
     * a shorter prefix, a Get's new block fails with KVD_ERR_QUOTA. Checked
     * per call: calls in flight at once may pass it by their own size. */
    uint64_t tenant_max_leased_bytes;
    uint32_t tick_ms; /* housekeeping period (expiry precision) */
    /* Admin config_dump's answer (secrets already redacted); borrowed, it
     * outlives the service. */
    const kvd_service_config_entry_t *config_entries;
    size_t n_config_entries;
    /* The tenant names the settings give (server.tenants, token_tenants,
     * tls_tenants, tenant_quotas, tenant_arenas), so that Admin
     * list_namespaces can name each tenant id (TenantUsage.tenant_name);
     * borrowed, they outlive the service. */
    const char *const *tenant_names;
    size_t n_tenant_names;
    /* Clustered daemons (cluster/remote.h); NULL when alone. `miss`
     * fetches what the cluster holds of a lookup's missing keys into the
     * store (for lookups that set include_remote; source_node, when set,
     * asked first) and returns how many of them (a prefix) are here now;
     * `saved`
     * hears of each commit. Both run on the calling thread. */
    size_t (*miss)(void *ctx, const kvd_namespace_t *ns,
                   const kvd_block_hash_t *hashes, size_t n,
                   const char *source_node, uint32_t tenant);
    void (*saved)(void *ctx, const kvd_namespace_t *ns,
                  const kvd_block_hash_t *hashes, size_t n,
                  uint64_t object_bytes, uint32_t tenant);
    /* Store gets submitted by others (the cluster's data plane, reading
     * an object from NVMe for another node) carry user_data with
     * KVD_SERVICE_FOREIGN set; their completions, drained by the service's
     * thread like its own, go here (NULL: an OK lease is released). */
    void (*foreign_completion)(void *ctx, const kvd_store_completion_t *c);
    /* Admin cluster_nodes: the membership view (kvd_membership_view's
     * contract: up to `max` members into `out`, the count returned). */
    size_t (*members)(void *ctx, kvd_member_t *out, size_t max,
                      kvd_membership_stats_t *stats_out);
    void *cluster_ctx;
} kvd_service_config_t;

/* user_data bit of a foreign get (the service's own are aligned pointers). */
#define KVD_SERVICE_FOREIGN UINT64_C(1)

/* The store's tenant id (quota domain) of a tenant name: 0 for NULL or "",
 * never 0 otherwise. What a bound caller's saves are counted under. */
uint32_t kvd_service_tenant_id(const char *tenant);

/* Creates the service and starts its housekeeping thread. Errors:
 * KVD_ERR_INVALID (NULL store, zero TTLs), KVD_ERR_NOMEM, thread errors. */
kvd_status_t kvd_service_create(const kvd_service_config_t *cfg,
                                kvd_service_t **svc_out);

/* Stops the thread, gives back every lease and aborts every reservation,
 * frees. No call may be running. NULL is accepted. */
void kvd_service_destroy(kvd_service_t *svc);

/*
 * Serves one call: `req` (len bytes, hostile) is unpacked and validated as
 * the method's request; on KVD_OK *resp_out (malloc'd, caller frees) holds
 * the packed response. `tenant`, when not NULL, is the caller's tenant as
 * its credentials say (server.tenants, server.token_tenants,
 * server.tls_tenants): it replaces whatever tenant the request names, Admin
 * list_namespaces and drop_namespace see only that tenant's objects, and
 * Admin drain and config_dump and Delete are refused (KVD_ERR_AUTH). Errors
 * (nothing allocated; the reason in `reason`): KVD_ERR_PROTO (malformed or
 * invalid request; gRPC INVALID_ARGUMENT), KVD_ERR_NOT_FOUND (unknown or
 * expired lease / reservation id), KVD_ERR_INVALID (bad method), KVD_ERR_NOMEM,
 * errors of the store.
 */
kvd_status_t kvd_service_call(kvd_service_t *svc, kvd_rpc_method_t method,
                              const uint8_t *req, size_t len,
                              const char *tenant, uint8_t **resp_out,
                              size_t *resp_len_out, char *reason,
                              size_t reason_len);

/*
 * kvd_service_call for a caller of hand-off session `session` (0: none,
 * as kvd_service_call): the leases and reservations it makes remember the
 * session, and when one expires while that session is open
 * (kvd_service_session_open) its slots are quarantined, not given back: no
 * other key can be stored in them while the client that mapped them may
 * still read or write them. The quarantine ends when that session releases
 * the lease id (Release, a Lookup's release list) or aborts / commits the
 * reservation id (Commit then answers KVD_ERR_TIMEOUT), or when the session
 * closes. Quarantined bytes keep counting against the tenant's limits
 * (server.tenant_max_leased for leases, the store's tenant quota for
 * reservations), which bounds what one caller can pin.
 */
kvd_status_t kvd_service_call_session(kvd_service_t *svc,
                                      kvd_rpc_method_t method,
                                      const uint8_t *req, size_t len,
                                      const char *tenant, uint64_t session,
                                      uint8_t **resp_out, size_t *resp_len_out,
                                      char *reason, size_t reason_len);

/* A hand-off session (a client that has mapped the arena) is open from
 * kvd_service_session_open until kvd_service_session_close, which gives
 * back every lease and reservation of it that is quarantined (its client is
 * gone: nothing can touch the slots any more). `session` is never 0; an id
 * is opened once. Errors: KVD_ERR_INVALID (0), KVD_ERR_NOMEM. Thread: any. */
kvd_status_t kvd_service_session_open(kvd_service_t *svc, uint64_t session);
void kvd_service_session_close(kvd_service_t *svc, uint64_t session);

/* Latency histogram bucket bounds, microseconds (the last is +Inf): 25 us
 * to 30 s, so the slowest calls a client still waits for (store.timeout,
 * 2 s by default) and the longest server-side waits (an Admin flush's
 * server.flush_timeout, the lease and reservation TTLs: 30 s) land in a
 * bucket of their own rather than in +Inf. */
#define KVD_SERVICE_LATENCY_BUCKETS 20
extern const uint64_t
    kvd_service_latency_bounds_us[KVD_SERVICE_LATENCY_BUCKETS];

typedef struct kvd_service_method_stats {
    uint64_t calls;
    uint64_t errors;
    uint64_t latency_sum_us;
    uint64_t latency_buckets[KVD_SERVICE_LATENCY_BUCKETS]; /* cumulative */
} kvd_service_method_stats_t;

/* Errors are counted per kvd_status_t value: index -status, 0..127. */
#define KVD_SERVICE_ERROR_KINDS 128

typedef struct kvd_service_stats {
    kvd_service_method_stats_t methods[KVD_RPC_COUNT];
    uint64_t errors_by_status[KVD_SERVICE_ERROR_KINDS];
    uint64_t leases;               /* lease ids held now */
    uint64_t leased_blocks;        /* blocks under them */
    uint64_t reservations;         /* reservation ids open now */
    uint64_t leases_expired;       /* reclaimed at their deadline */
    uint64_t leases_refused;       /* blocks not leased: tenant at its cap */
    uint64_t reservations_expired; /* aborted at their deadline */
    uint64_t leases_quarantined;   /* expired, kept for their session now */
    uint64_t reservations_quarantined; /* likewise */
    uint64_t quarantined_bytes;        /* object bytes of both */
    uint64_t sessions;                 /* hand-off sessions open now */
    uint64_t commit_checksum_errors;
    uint64_t uptime_ms;
} kvd_service_stats_t;

/* A consistent-enough snapshot (counters are read relaxed). */
void kvd_service_stats(kvd_service_t *svc, kvd_service_stats_t *out);

/* Whether an operator put the service in draining mode (Admin drain): new
 * saves are refused, /readyz reports not ready. */
bool kvd_service_draining(kvd_service_t *svc);

/* Monotonic time (ns, common/time_int.h) at which the housekeeping thread
 * last finished a pass with the service's lock taken and released (every
 * server.tick while it is healthy); 0 before the first. The systemd
 * watchdog is fed only while this moves. Any thread. */
uint64_t kvd_service_heartbeat_ns(kvd_service_t *svc);

/* Counts a call refused before it reached the service (bad method,
 * failed authentication) under `status`. */
void kvd_service_count_refused(kvd_service_t *svc, kvd_status_t status);

/* The lookup hits and misses per tier ([0] host, [1] disk) of callers
 * bound to `tenant` (a name of the server.* tenant settings), as Stats
 * gives a bound caller; zeros for a tenant that has looked up nothing.
 * Callers bound to no tenant are not counted per tenant. Read-only; takes
 * the service's lock briefly. Thread: any. */
/* One namespace's usage (kvd_service_namespace_usage): the stored
 * namespace (a tenant's copy for a tenant's objects), the tenant of its
 * objects (and its name in the settings, "" if none; borrowed from the
 * service), objects per tier and bytes. */
typedef struct kvd_service_ns_usage {
    kvd_namespace_t ns;
    uint32_t tenant;
    const char *tenant_name;
    uint64_t host_objects, disk_objects, bytes;
} kvd_service_ns_usage_t;

/* The `max` namespaces holding the most bytes, most first, into out
 * (*n_out of them); *n_all_out how many namespaces hold objects (counted
 * up to KVD_PROTO_MAX_NAMESPACES). Scans every stored object: call it
 * seldom (/metrics caches it). Thread: any. */
kvd_status_t kvd_service_namespace_usage(kvd_service_t *svc,
                                         kvd_service_ns_usage_t *out,
                                         size_t max, size_t *n_out,
                                         size_t *n_all_out);

void kvd_service_tenant_lookups(kvd_service_t *svc, const char *tenant,
                                uint64_t hits_out[2], uint64_t misses_out[2]);

#ifdef __cplusplus
}
#endif

#endif /* KVD_STORE_SERVER_SERVICE_INT_H */
