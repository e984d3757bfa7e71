/*
 * The store client (docs/architecture.md, docs/daemon.md): the calls of
 * include/kvdepot/store.h served by a kvdepotd on this node instead of an
 * embedded store. A client is a kvd_store_t whose ops
 * (kvd_client_store_ops, client/client_store.c) are the functions here;
 * kvd_store_open (client/open.c) opens one for `store.mode: daemon`, so the
 * leader and the worker switch by configuration. A documented internal
 * header of client/, for the CLI's operator calls and the tests.
 *
 * Control over gRPC (the unix socket in store.address), data through the
 * daemon's arena mapped in this process (the memfd comes over the hand-off
 * socket, client/handoff.h). Every call has a deadline (store.timeout):
 * a dead daemon turns into errors the caller already handles (lookups find
 * nothing, reserves are rejected, gets fail), never a hang. After a daemon
 * restart the client maps the new arena and goes on; ids taken from the
 * old daemon (leases, reservations) are gone with it and report
 * KVD_ERR_NOT_FOUND.
 *
 * Leases: the daemon leases a Lookup's blocks under one id; the client
 * counts the blocks of each id it has handed out (in the lease's
 * `reserved` word) and releases the id when the last one is released.
 *
 * Threading: as store.h (every call thread-safe; poll/wait from one thread).
 * One internal thread drives gets of disk-tier blocks to completion.
 */
#ifndef KVD_CLIENT_CLIENT_H
#define KVD_CLIENT_CLIENT_H

#include <stdint.h>

#include "kvdepot/store.h"
#include "proto/kvd_proto.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvd_client kvd_client_t;

typedef struct kvd_client_config {
    /* "unix:/run/kvdepot/kvdepotd.sock", or "tcp:HOST:PORT" for a remote
     * client: the operator calls only (stats, lookup, release, delete,
     * admin); no arena is mapped, the data calls answer
     * KVD_ERR_UNSUPPORTED. */
    const char *address;
    const char *token_file; /* tcp: the bearer token's file ("" or NULL:
                               none) */
    const char *tls_ca;     /* tcp: PEM CA of the daemon's certificate
                               ("" or NULL: plain TCP) */
    const char *tls_cert;   /* tcp with TLS: this client's PEM certificate
                               (the daemon wants one its CA signed) */
    const char *tls_key;    /* tcp with TLS: its PEM key (mode 0600) */
    uint64_t timeout_ms;    /* per call */
    uint64_t lease_ttl_ms;  /* asked of Lookup and Get */
    size_t get_queue;       /* gets accepted and not yet polled */
} kvd_client_config_t;

/* Connects, maps the daemon's arena and checks the daemon answers.
 * Errors (nothing left open, reason in `err`): KVD_ERR_INVALID (address not
 * unix:PATH), KVD_ERR_UNREACHABLE (no daemon), KVD_ERR_PROTO (bad hand-off),
 * KVD_ERR_TIMEOUT, KVD_ERR_NOMEM. */
kvd_status_t kvd_client_open(const kvd_client_config_t *cfg,
                             kvd_client_t **client_out, char *err,
                             size_t err_len);
void kvd_client_close(kvd_client_t *c);

/* The store calls of a client: the kvd_store_t whose ops are the functions
 * below (client/client_store.c). kvd_store_close on it closes the client.
 * Valid until the client is closed. */
kvd_store_t *kvd_client_store(kvd_client_t *c);

/* The client's ops table (client/client_store.c). */
extern const struct kvd_store_ops kvd_client_store_ops;
/* The same for a client over TCP: the calls that need no arena. */
extern const struct kvd_store_ops kvd_client_remote_ops;

void *kvd_client_arena_ptr(kvd_client_t *c, uint64_t offset, uint64_t len);
/* The bytes of a HOST lease or of a reservation in the arena of the daemon
 * instance that gave it (store.h, kvd_store_lease_ptr); NULL when the lease
 * is not held or that arena is no longer mapped. */
void *kvd_client_lease_ptr(kvd_client_t *c, const kvd_store_lease_t *lease);
/* store.h's kvd_store_arena_hold / _unhold / _generation. */
kvd_status_t kvd_client_arena_hold(kvd_client_t *c, void **base_out,
                                   uint64_t *size_bytes_out,
                                   uint32_t *generation_out);
void kvd_client_arena_unhold(kvd_client_t *c, uint32_t generation);
uint32_t kvd_client_arena_generation(kvd_client_t *c);
void *kvd_client_reservation_ptr(kvd_client_t *c,
                                 const kvd_store_reservation_t *r,
                                 uint64_t len);
kvd_status_t kvd_client_arena_export(kvd_client_t *c,
                                     kvd_store_arena_export_t *out);
kvd_status_t kvd_client_reserve(kvd_client_t *c, const kvd_namespace_t *ns,
                                const kvd_block_hash_t *hashes, size_t n,
                                uint64_t object_bytes, uint32_t tenant,
                                kvd_store_reservation_t *out);
kvd_status_t kvd_client_commit(kvd_client_t *c, const kvd_store_key_t *keys,
                               size_t n, kvd_status_t *statuses_out);
kvd_status_t kvd_client_abort(kvd_client_t *c, const kvd_store_key_t *keys,
                              size_t n, kvd_status_t *statuses_out);
/* kvd_store_reserve_part and kvd_store_commit_part / abort_part (revision
 * 9). A daemon before revision 9 serves a Reserve in parts as a plain one:
 * the client gives those slots back and answers KVD_ERR_UNSUPPORTED for
 * every key. published_out[i] (may be NULL) is true for a committed object
 * of one part; the daemon does not say which part's commit published an
 * object in parts (false). */
kvd_status_t kvd_client_reserve_part(kvd_client_t *c, const kvd_namespace_t *ns,
                                     const kvd_block_hash_t *hashes, size_t n,
                                     uint64_t object_bytes, uint32_t tenant,
                                     uint32_t part, uint32_t num_parts,
                                     kvd_store_reservation_t *out);
kvd_status_t kvd_client_end_part(kvd_client_t *c, const kvd_store_key_t *keys,
                                 size_t n, uint32_t part, bool commit,
                                 kvd_status_t *statuses_out,
                                 bool *published_out);
/* `source_node`: kvd_store_lookup_from's (NULL or "": none). */
kvd_status_t kvd_client_lookup(kvd_client_t *c, const kvd_namespace_t *ns,
                               const kvd_block_hash_t *hashes, size_t n,
                               const char *source_node,
                               kvd_store_lease_t *leases_out,
                               size_t *matched_out);
kvd_status_t kvd_client_release(kvd_client_t *c,
                                const kvd_store_lease_t *leases, size_t n);
kvd_status_t kvd_client_get_submit(kvd_client_t *c, const kvd_store_get_t *g,
                                   size_t n, size_t *accepted_out);
size_t kvd_client_poll(kvd_client_t *c, kvd_store_completion_t *out,
                       size_t max);
kvd_status_t kvd_client_wait(kvd_client_t *c, int timeout_ms);
int kvd_client_fd(kvd_client_t *c);
kvd_status_t kvd_client_flush(kvd_client_t *c, int timeout_ms);
kvd_status_t kvd_client_delete(kvd_client_t *c, const kvd_store_key_t *keys,
                               size_t n, size_t *num_deleted_out);
kvd_status_t kvd_client_stats(kvd_client_t *c, kvd_store_stats_t *out);

/* ---- operator calls (the kvdepot CLI) ---------------------------------- */

/* The client behind a store opened in daemon mode (kvd_store_open with
 * store.mode daemon); NULL for any other store. The client and the store
 * are one object: valid until kvd_store_close. */
kvd_client_t *kvd_client_of(kvd_store_t *store);

typedef struct kvd_client_ns_usage {
    kvd_namespace_t ns;
    uint64_t host_objects, disk_objects, bytes;
} kvd_client_ns_usage_t;

typedef struct kvd_client_tenant_usage {
    uint32_t tenant;
    uint64_t objects, bytes;
    /* The daemon's name for it (TenantUsage.tenant_name, at most
     * KVD_PROTO_MAX_ID_BYTES): "" for the default tenant, for an id no
     * setting of the daemon names, and from a daemon before revision 6. */
    char name[257];
} kvd_client_tenant_usage_t;

/* Admin list_namespaces: malloc'd arrays (free them), counts, and whether
 * the daemon had more than a reply holds. */
kvd_status_t kvd_client_list(kvd_client_t *c, kvd_client_ns_usage_t **ns_out,
                             size_t *num_ns_out,
                             kvd_client_tenant_usage_t **tenants_out,
                             size_t *num_tenants_out, bool *truncated_out);

/* Admin drop_namespace: deletes the namespace's objects (leased ones stay). */
kvd_status_t kvd_client_drop_namespace(kvd_client_t *c,
                                       const kvd_namespace_t *ns,
                                       uint64_t *dropped_out);

/* Admin drain: refuse (enable) or take again new saves; writes the leases
 * and reservations still held. */
kvd_status_t kvd_client_drain(kvd_client_t *c, bool enable,
                              uint64_t *leases_out, uint64_t *reservations_out);

/* Admin drop_tenant: deletes every object `tenant` saved (leased ones
 * stay); writes how many went. A caller bound to a tenant may only name
 * its own ("" = its own). */
kvd_status_t kvd_client_drop_tenant(kvd_client_t *c, const char *tenant,
                                    uint64_t *dropped_out);

/* Admin config_dump: the settings the daemon started with, one
 * "key = value  # from: source" line each (secrets "<redacted>"), into a
 * malloc'd text (free it). KVD_ERR_AUTH for a caller bound to a tenant. */
kvd_status_t kvd_client_config_dump(kvd_client_t *c, char **text_out);

/* Admin pin (revision 7), kvd_store_pin's daemon side: one call per run of
 * keys of one namespace (at most KVD_PROTO_MAX_PIN_KEYS each). A reply
 * saying store.pin_max_bytes was reached stops there with KVD_ERR_QUOTA
 * (its counts included); a failed call stops there too, the counts then
 * covering the calls before it. */
kvd_status_t kvd_client_pin(kvd_client_t *c, const kvd_store_key_t *keys,
                            size_t num, bool pinned, size_t *num_done_out,
                            size_t *num_missing_out);

/* One node of the daemon's cluster view (Admin cluster_nodes). */
typedef struct kvd_client_node {
    char node_id[KVD_PROTO_MAX_NODE_ID_BYTES + 1];
    char grpc_address[KVD_PROTO_MAX_ADDRESS_BYTES + 1];
    uint64_t capacity_bytes;
    char version[KVD_PROTO_MAX_ID_BYTES + 1];
    uint32_t protocol_revision;
    bool ucx; /* it advertises a UCX address (data plane) */
} kvd_client_node_t;

typedef struct kvd_client_cluster {
    bool clustered;  /* false: the daemon runs alone */
    bool stale;      /* etcd has not answered lately: the view may be old */
    bool registered; /* the daemon's own key is in etcd */
    bool truncated;  /* more nodes than the reply holds */
    uint64_t generation, reconnects;
    char self[KVD_PROTO_MAX_NODE_ID_BYTES + 1];
    kvd_client_node_t *nodes; /* malloc'd (free it), ordered by node id */
    size_t num_nodes;
} kvd_client_cluster_t;

/* Admin cluster_nodes (revision 7): the daemon's view of its cluster into
 * *out. KVD_ERR_UNSUPPORTED from a daemon before revision 7; KVD_ERR_AUTH
 * for a caller bound to a tenant. */
kvd_status_t kvd_client_cluster_nodes(kvd_client_t *c,
                                      kvd_client_cluster_t *out);

/* Admin ping: the daemon's version and node id (for the CLI). */
/* Key events of the daemon's store (Admin events, protocol revision 8),
 * behind kvd_store_events_enable / _take_events / _events_watch in daemon
 * mode (store.h): enable starts reading from the daemon's newest event,
 * take asks for the watched namespaces' events after the last one read
 * (*dropped_out: events the daemon no longer held). Thread: any. */
kvd_status_t kvd_client_events_enable(kvd_client_t *c, size_t capacity);
kvd_status_t kvd_client_take_events(kvd_client_t *c, kvd_store_event_t *out,
                                    size_t max, size_t *n_out,
                                    uint64_t *dropped_out);
kvd_status_t kvd_client_events_watch(kvd_client_t *c, const kvd_namespace_t *ns,
                                     size_t num);

kvd_status_t kvd_client_ping(kvd_client_t *c, char *version, size_t version_len,
                             char *node_id, size_t node_len);

#ifdef __cplusplus
}
#endif

#endif /* KVD_CLIENT_CLIENT_H */
