/*
 * The store ops interface: what every kvd_store_t is behind the calls of
 * include/kvdepot/store.h. A documented internal header of store/, for the
 * implementations that fill it and for the function that opens one.
 *
 * Two implementations fill the table: the embedded engine
 * (kvd_store_embedded_ops, store/store.c) and the kvdepotd client
 * (client/client_store.c). kvd_store_open (client/open.c) reads store.mode
 * and opens one of them; every other kvd_store_* call goes through
 * store/store_api.c, which checks the arguments once for both and then calls
 * the store's op. So store/ never names the client, and the leader and the
 * worker, which hold a kvd_store_t, never know which one they use.
 *
 * A store is a struct whose first member is a kvd_store_t naming its ops:
 * the handle a caller holds and the implementation are one pointer.
 *
 * Contract of each op: the same as the store.h call of that name, with the
 * arguments already checked as store.h says (store non-NULL, NULL pointers
 * with a non-zero count rejected with KVD_ERR_INVALID before the op is
 * called). `lookup` is kvd_store_lookup_from (source_node NULL or "" for
 * none). `scan`, `tenant_set_quota`, `events_enable`, `take_events`,
 * `events_watch`, `reserve_part` and `end_part` may be NULL: the call then
 * answers KVD_ERR_UNSUPPORTED. Threading as store.h.
 */
#ifndef KVD_STORE_OPS_H
#define KVD_STORE_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvdepot/store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvd_store_ops {
    const char *name; /* "embedded", "daemon": for logs and errors */
    void (*close)(kvd_store_t *s);
    void *(*arena_ptr)(kvd_store_t *s, uint64_t arena_offset, uint64_t len);
    kvd_status_t (*arena_hold)(kvd_store_t *s, void **base_out,
                               uint64_t *size_bytes_out,
                               uint32_t *generation_out);
    void (*arena_unhold)(kvd_store_t *s, uint32_t generation);
    uint32_t (*arena_generation)(kvd_store_t *s);
    void *(*lease_ptr)(kvd_store_t *s, const kvd_store_lease_t *lease);
    void *(*reservation_ptr)(kvd_store_t *s, const kvd_store_reservation_t *r,
                             uint64_t len);
    kvd_status_t (*arena_export)(kvd_store_t *s, kvd_store_arena_export_t *out);
    kvd_status_t (*reserve)(kvd_store_t *s, const kvd_namespace_t *ns,
                            const kvd_block_hash_t *hashes, size_t num_hashes,
                            uint64_t object_bytes, uint32_t tenant,
                            kvd_store_reservation_t *out);
    kvd_status_t (*commit)(kvd_store_t *s, const kvd_store_key_t *keys,
                           size_t num, kvd_status_t *statuses_out);
    kvd_status_t (*abort)(kvd_store_t *s, const kvd_store_key_t *keys,
                          size_t num, kvd_status_t *statuses_out);
    kvd_status_t (*reserve_part)(kvd_store_t *s, const kvd_namespace_t *ns,
                                 const kvd_block_hash_t *hashes,
                                 size_t num_hashes, uint64_t object_bytes,
                                 uint32_t tenant, uint32_t part,
                                 uint32_t num_parts,
                                 kvd_store_reservation_t *out);
    /* kvd_store_commit_part (commit true) and kvd_store_abort_part
     * (published_out NULL). */
    kvd_status_t (*end_part)(kvd_store_t *s, const kvd_store_key_t *keys,
                             size_t num, uint32_t part, bool commit,
                             kvd_status_t *statuses_out, bool *published_out);
    kvd_status_t (*lookup)(kvd_store_t *s, const kvd_namespace_t *ns,
                           const kvd_block_hash_t *hashes, size_t num_hashes,
                           const char *source_node,
                           kvd_store_lease_t *leases_out, size_t *matched_out);
    kvd_status_t (*release)(kvd_store_t *s, const kvd_store_lease_t *leases,
                            size_t num);
    kvd_status_t (*get_submit)(kvd_store_t *s, const kvd_store_get_t *gets,
                               size_t num, size_t *accepted_out);
    size_t (*poll)(kvd_store_t *s, kvd_store_completion_t *out, size_t max);
    kvd_status_t (*wait)(kvd_store_t *s, int timeout_ms);
    int (*fd)(kvd_store_t *s);
    kvd_status_t (*delete_keys)(kvd_store_t *s, const kvd_store_key_t *keys,
                                size_t num, size_t *num_deleted_out);
    kvd_status_t (*scan)(kvd_store_t *s, uint64_t *cursor,
                         kvd_store_object_t *out, size_t max, size_t *n_out);
    kvd_status_t (*tenant_set_quota)(kvd_store_t *s, uint32_t tenant,
                                     uint64_t max_bytes);
    kvd_status_t (*flush)(kvd_store_t *s, int timeout_ms);
    kvd_status_t (*pin)(kvd_store_t *s, const kvd_store_key_t *keys, size_t num,
                        bool pinned, size_t *num_done_out,
                        size_t *num_missing_out);
    kvd_status_t (*stats)(kvd_store_t *s, kvd_store_stats_t *out);
    kvd_status_t (*events_enable)(kvd_store_t *s, size_t capacity);
    kvd_status_t (*take_events)(kvd_store_t *s, kvd_store_event_t *out,
                                size_t max, size_t *n_out,
                                uint64_t *dropped_out);
    kvd_status_t (*events_watch)(kvd_store_t *s, const kvd_namespace_t *ns,
                                 size_t num);
} kvd_store_ops_t;

/* The head of every store implementation. */
struct kvd_store {
    const kvd_store_ops_t *ops;
};

/* The embedded engine's table (store/store.c). */
extern const kvd_store_ops_t kvd_store_embedded_ops;

/* What kvd_store_open needs to pick an implementation: the `store.*`
 * settings of daemon mode, resolved and checked as kvd_store_open does
 * (every store.* key is checked, not only these). */
typedef struct kvd_store_mode_settings {
    bool daemon;                            /* store.mode == daemon */
    char address[KVD_CONFIG_STRING_MAX];    /* store.address */
    char token_file[KVD_CONFIG_STRING_MAX]; /* store.token_file */
    char tls_ca[KVD_CONFIG_STRING_MAX];     /* store.tls_ca */
    char tls_cert[KVD_CONFIG_STRING_MAX];   /* store.tls_cert */
    char tls_key[KVD_CONFIG_STRING_MAX];    /* store.tls_key */
    uint64_t timeout_ms;                    /* store.timeout */
    uint64_t lease_ttl_ms;                  /* store.lease_ttl */
    size_t get_queue;                       /* store.get_queue */
} kvd_store_mode_settings_t;

/* Resolves the settings above from `config` (may be NULL). Errors as
 * kvd_store_check_config, the reason in `err`. */
kvd_status_t kvd_store_mode_settings(const kvd_config_t *config,
                                     kvd_store_mode_settings_t *out, char *err,
                                     size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* KVD_STORE_OPS_H */
