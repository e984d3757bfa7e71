/*
 * The calls of include/kvdepot/store.h, over the ops interface
 * (store/ops.h): each checks its arguments once, as store.h states, and
 * hands the call to the store's implementation (the embedded engine or the
 * kvdepotd client). kvd_store_open is in client/open.c, the one place that
 * knows both implementations.
 *
 * An op left NULL (a store that implements only some calls, such as a
 * test double of the leader's store) answers KVD_ERR_UNSUPPORTED, or NULL,
 * 0 or -1 for the calls that return those.
 */
#include <stddef.h>

#include "store/ops.h"

KVD_API void kvd_store_close(kvd_store_t *store)
{
    if (store != NULL && store->ops->close != NULL) {
        store->ops->close(store);
    }
}

KVD_API void *kvd_store_arena_ptr(kvd_store_t *store, uint64_t arena_offset,
                                  uint64_t len)
{
    return store == NULL ? NULL
                         : store->ops->arena_ptr(store, arena_offset, len);
}

KVD_API kvd_status_t kvd_store_arena_hold(kvd_store_t *store, void **base_out,
                                          uint64_t *size_bytes_out,
                                          uint32_t *generation_out)
{
    if (store == NULL || base_out == NULL || size_bytes_out == NULL ||
        generation_out == NULL) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->arena_hold == NULL) {
        return KVD_ERR_UNSUPPORTED;
    }
    return store->ops->arena_hold(store, base_out, size_bytes_out,
                                  generation_out);
}

KVD_API void kvd_store_arena_unhold(kvd_store_t *store, uint32_t generation)
{
    if (store != NULL && store->ops->arena_unhold != NULL) {
        store->ops->arena_unhold(store, generation);
    }
}

KVD_API uint32_t kvd_store_arena_generation(kvd_store_t *store)
{
    if (store == NULL || store->ops->arena_generation == NULL) {
        return 0;
    }
    return store->ops->arena_generation(store);
}

KVD_API void *kvd_store_lease_ptr(kvd_store_t *store,
                                  const kvd_store_lease_t *lease)
{
    if (store == NULL || lease == NULL || store->ops->lease_ptr == NULL) {
        return NULL;
    }
    return store->ops->lease_ptr(store, lease);
}

KVD_API void *kvd_store_reservation_ptr(kvd_store_t *store,
                                        const kvd_store_reservation_t *r,
                                        uint64_t len)
{
    if (store == NULL || r == NULL || r->status != KVD_OK ||
        store->ops->reservation_ptr == NULL) {
        return NULL;
    }
    return store->ops->reservation_ptr(store, r, len);
}

KVD_API kvd_status_t kvd_store_arena_export(kvd_store_t *store,
                                            kvd_store_arena_export_t *out)
{
    if (store == NULL || out == NULL) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->arena_export == NULL) {
        return KVD_ERR_UNSUPPORTED;
    }
    return store->ops->arena_export(store, out);
}

KVD_API kvd_status_t kvd_store_reserve(kvd_store_t *store,
                                       const kvd_namespace_t *ns,
                                       const kvd_block_hash_t *hashes,
                                       size_t num_hashes, uint64_t object_bytes,
                                       uint32_t tenant,
                                       kvd_store_reservation_t *out)
{
    if (store == NULL || ns == NULL ||
        (num_hashes > 0 && (hashes == NULL || out == NULL)) ||
        object_bytes == 0) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->reserve == NULL) {
        return KVD_ERR_UNSUPPORTED;
    }
    kvd_status_t st = store->ops->reserve(store, ns, hashes, num_hashes,
                                          object_bytes, tenant, out);
    for (size_t i = 0; st == KVD_OK && i < num_hashes; i++) {
        out[i].first = out[i].status == KVD_OK;
    }
    return st;
}

KVD_API kvd_status_t
kvd_store_reserve_part(kvd_store_t *store, const kvd_namespace_t *ns,
                       const kvd_block_hash_t *hashes, size_t num_hashes,
                       uint64_t object_bytes, uint32_t tenant, uint32_t part,
                       uint32_t num_parts, kvd_store_reservation_t *out)
{
    if (num_parts == 0 || num_parts > KVD_STORE_MAX_PARTS ||
        part >= num_parts) {
        return KVD_ERR_INVALID;
    }
    if (num_parts == 1) {
        return kvd_store_reserve(store, ns, hashes, num_hashes, object_bytes,
                                 tenant, out);
    }
    if (store == NULL || ns == NULL ||
        (num_hashes > 0 && (hashes == NULL || out == NULL)) ||
        object_bytes == 0) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->reserve_part == NULL) {
        return KVD_ERR_UNSUPPORTED;
    }
    return store->ops->reserve_part(store, ns, hashes, num_hashes, object_bytes,
                                    tenant, part, num_parts, out);
}

/* A store without parts has only keys of one part: the plain calls. */
static kvd_status_t store_end_part(kvd_store_t *store,
                                   const kvd_store_key_t *keys, size_t num,
                                   uint32_t part, bool commit,
                                   kvd_status_t *statuses_out,
                                   bool *published_out)
{
    if (store == NULL || (num > 0 && keys == NULL) ||
        part >= KVD_STORE_MAX_PARTS) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->end_part != NULL) {
        return store->ops->end_part(store, keys, num, part, commit,
                                    statuses_out, published_out);
    }
    kvd_status_t st = commit ? kvd_store_commit(store, keys, num, statuses_out)
                             : kvd_store_abort(store, keys, num, statuses_out);
    for (size_t i = 0; published_out != NULL && i < num; i++) {
        published_out[i] =
            statuses_out != NULL ? statuses_out[i] == KVD_OK : st == KVD_OK;
    }
    return st;
}

KVD_API kvd_status_t kvd_store_commit_part(kvd_store_t *store,
                                           const kvd_store_key_t *keys,
                                           size_t num, uint32_t part,
                                           kvd_status_t *statuses_out,
                                           bool *published_out)
{
    return store_end_part(store, keys, num, part, true, statuses_out,
                          published_out);
}

KVD_API kvd_status_t kvd_store_abort_part(kvd_store_t *store,
                                          const kvd_store_key_t *keys,
                                          size_t num, uint32_t part,
                                          kvd_status_t *statuses_out)
{
    return store_end_part(store, keys, num, part, false, statuses_out, NULL);
}

KVD_API kvd_status_t kvd_store_commit(kvd_store_t *store,
                                      const kvd_store_key_t *keys, size_t num,
                                      kvd_status_t *statuses_out)
{
    if (store == NULL || (num > 0 && keys == NULL)) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->commit == NULL) {
        return KVD_ERR_UNSUPPORTED;
    }
    return store->ops->commit(store, keys, num, statuses_out);
}

KVD_API kvd_status_t kvd_store_abort(kvd_store_t *store,
                                     const kvd_store_key_t *keys, size_t num,
                                     kvd_status_t *statuses_out)
{
    if (store == NULL || (num > 0 && keys == NULL)) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->abort == NULL) {
        return KVD_ERR_UNSUPPORTED;
    }
    return store->ops->abort(store, keys, num, statuses_out);
}

KVD_API kvd_status_t kvd_store_lookup(kvd_store_t *store,
                                      const kvd_namespace_t *ns,
                                      const kvd_block_hash_t *hashes,
                                      size_t num_hashes,
                                      kvd_store_lease_t *leases_out,
                                      size_t *matched_out)
{
    return kvd_store_lookup_from(store, ns, hashes, num_hashes, NULL,
                                 leases_out, matched_out);
}

KVD_API kvd_status_t kvd_store_lookup_from(
    kvd_store_t *store, const kvd_namespace_t *ns,
    const kvd_block_hash_t *hashes, size_t num_hashes, const char *source_node,
    kvd_store_lease_t *leases_out, size_t *matched_out)
{
    if (store == NULL || ns == NULL || matched_out == NULL ||
        (num_hashes > 0 && (hashes == NULL || leases_out == NULL))) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->lookup == NULL) {
        return KVD_ERR_UNSUPPORTED;
    }
    return store->ops->lookup(store, ns, hashes, num_hashes, source_node,
                              leases_out, matched_out);
}

KVD_API kvd_status_t kvd_store_release(kvd_store_t *store,
                                       const kvd_store_lease_t *leases,
                                       size_t num)
{
    if (store == NULL || (num > 0 && leases == NULL)) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->release == NULL) {
        return KVD_ERR_UNSUPPORTED;
    }
    return store->ops->release(store, leases, num);
}

KVD_API kvd_status_t kvd_store_get_submit(kvd_store_t *store,
                                          const kvd_store_get_t *gets,
                                          size_t num, size_t *accepted_out)
{
    if (store == NULL || accepted_out == NULL || (num > 0 && gets == NULL)) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->get_submit == NULL) {
        return KVD_ERR_UNSUPPORTED;
    }
    return store->ops->get_submit(store, gets, num, accepted_out);
}

KVD_API size_t kvd_store_poll(kvd_store_t *store, kvd_store_completion_t *out,
                              size_t max)
{
    if (store == NULL || out == NULL || store->ops->poll == NULL) {
        return 0;
    }
    return store->ops->poll(store, out, max);
}

KVD_API kvd_status_t kvd_store_wait(kvd_store_t *store, int timeout_ms)
{
    if (store == NULL) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->wait == NULL) {
        return KVD_ERR_UNSUPPORTED;
    }
    return store->ops->wait(store, timeout_ms);
}

KVD_API int kvd_store_fd(kvd_store_t *store)
{
    if (store == NULL || store->ops->fd == NULL) {
        return -1;
    }
    return store->ops->fd(store);
}

KVD_API kvd_status_t kvd_store_delete(kvd_store_t *store,
                                      const kvd_store_key_t *keys, size_t num,
                                      size_t *num_deleted_out)
{
    if (store == NULL || (num > 0 && keys == NULL)) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->delete_keys == NULL) {
        return KVD_ERR_UNSUPPORTED;
    }
    return store->ops->delete_keys(store, keys, num, num_deleted_out);
}

KVD_API kvd_status_t kvd_store_pin(kvd_store_t *store,
                                   const kvd_store_key_t *keys, size_t num,
                                   bool pinned, size_t *num_done_out,
                                   size_t *num_missing_out)
{
    if (store == NULL || (num > 0 && keys == NULL)) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->pin == NULL) {
        return KVD_ERR_UNSUPPORTED;
    }
    return store->ops->pin(store, keys, num, pinned, num_done_out,
                           num_missing_out);
}

KVD_API kvd_status_t kvd_store_scan(kvd_store_t *store, uint64_t *cursor,
                                    kvd_store_object_t *out, size_t max,
                                    size_t *n_out)
{
    if (store == NULL || cursor == NULL || n_out == NULL ||
        (max > 0 && out == NULL)) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->scan == NULL) {
        return KVD_ERR_UNSUPPORTED;
    }
    return store->ops->scan(store, cursor, out, max, n_out);
}

KVD_API kvd_status_t kvd_store_tenant_set_quota(kvd_store_t *store,
                                                uint32_t tenant,
                                                uint64_t max_bytes)
{
    if (store == NULL) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->tenant_set_quota == NULL) {
        return KVD_ERR_UNSUPPORTED;
    }
    return store->ops->tenant_set_quota(store, tenant, max_bytes);
}

KVD_API kvd_status_t kvd_store_flush(kvd_store_t *store, int timeout_ms)
{
    if (store == NULL) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->flush == NULL) {
        return KVD_ERR_UNSUPPORTED;
    }
    return store->ops->flush(store, timeout_ms);
}

KVD_API kvd_status_t kvd_store_stats(kvd_store_t *store, kvd_store_stats_t *out)
{
    if (store == NULL || out == NULL) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->stats == NULL) {
        return KVD_ERR_UNSUPPORTED;
    }
    return store->ops->stats(store, out);
}

KVD_API kvd_status_t kvd_store_events_enable(kvd_store_t *store,
                                             size_t capacity)
{
    if (store == NULL || capacity > KVD_STORE_EVENTS_MAX) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->events_enable == NULL) {
        return KVD_ERR_UNSUPPORTED;
    }
    return store->ops->events_enable(store, capacity);
}

KVD_API kvd_status_t kvd_store_take_events(kvd_store_t *store,
                                           kvd_store_event_t *out, size_t max,
                                           size_t *n_out, uint64_t *dropped_out)
{
    if (store == NULL || n_out == NULL || (max > 0 && out == NULL)) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->take_events == NULL) {
        return KVD_ERR_UNSUPPORTED;
    }
    return store->ops->take_events(store, out, max, n_out, dropped_out);
}

KVD_API kvd_status_t kvd_store_events_watch(kvd_store_t *store,
                                            const kvd_namespace_t *ns,
                                            size_t num)
{
    if (store == NULL || (num > 0 && ns == NULL) ||
        num > KVD_STORE_EVENTS_WATCH_MAX) {
        return KVD_ERR_INVALID;
    }
    if (store->ops->events_watch == NULL) {
        return KVD_ERR_UNSUPPORTED;
    }
    return store->ops->events_watch(store, ns, num);
}
