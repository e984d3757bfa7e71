/*
 * The client as a store: kvd_client_store_ops, the ops table (store/ops.h)
 * whose entries hand each store.h call to the kvd_client_* function that
 * does it over gRPC and the mapped arena. Arguments arrive checked by
 * store/store_api.c. A daemon owns its objects and quotas: scan and
 * tenant_set_quota are left out (KVD_ERR_UNSUPPORTED); operators ask the
 * daemon through the admin calls of client/client.h.
 *
 * kvd_client_remote_ops: a client over TCP (store.address tcp:HOST:PORT)
 * maps no arena, so only the calls that need none are there: lookup,
 * release, delete, flush, stats (and the admin calls of client.h); the
 * rest are left out (KVD_ERR_UNSUPPORTED, NULL pointers). Both read the
 * daemon's key events (kvd_client_events_*).
 */
#include "client/client.h"
#include "store/ops.h"

static kvd_client_t *cl(kvd_store_t *s)
{
    return (kvd_client_t *)s; /* kvd_client_t starts with its kvd_store_t */
}

static void cl_close(kvd_store_t *s)
{
    kvd_client_close(cl(s));
}

static void *cl_arena_ptr(kvd_store_t *s, uint64_t off, uint64_t len)
{
    return kvd_client_arena_ptr(cl(s), off, len);
}

static kvd_status_t cl_arena_hold(kvd_store_t *s, void **base_out,
                                  uint64_t *size_bytes_out,
                                  uint32_t *generation_out)
{
    return kvd_client_arena_hold(cl(s), base_out, size_bytes_out,
                                 generation_out);
}

static void cl_arena_unhold(kvd_store_t *s, uint32_t generation)
{
    kvd_client_arena_unhold(cl(s), generation);
}

static uint32_t cl_arena_generation(kvd_store_t *s)
{
    return kvd_client_arena_generation(cl(s));
}

static void *cl_lease_ptr(kvd_store_t *s, const kvd_store_lease_t *lease)
{
    return kvd_client_lease_ptr(cl(s), lease);
}

static void *cl_reservation_ptr(kvd_store_t *s,
                                const kvd_store_reservation_t *r, uint64_t len)
{
    return kvd_client_reservation_ptr(cl(s), r, len);
}

static kvd_status_t cl_arena_export(kvd_store_t *s,
                                    kvd_store_arena_export_t *out)
{
    return kvd_client_arena_export(cl(s), out);
}

static kvd_status_t cl_reserve(kvd_store_t *s, const kvd_namespace_t *ns,
                               const kvd_block_hash_t *hashes, size_t n,
                               uint64_t object_bytes, uint32_t tenant,
                               kvd_store_reservation_t *out)
{
    return kvd_client_reserve(cl(s), ns, hashes, n, object_bytes, tenant, out);
}

static kvd_status_t cl_commit(kvd_store_t *s, const kvd_store_key_t *keys,
                              size_t n, kvd_status_t *statuses_out)
{
    return kvd_client_commit(cl(s), keys, n, statuses_out);
}

static kvd_status_t cl_abort(kvd_store_t *s, const kvd_store_key_t *keys,
                             size_t n, kvd_status_t *statuses_out)
{
    return kvd_client_abort(cl(s), keys, n, statuses_out);
}

static kvd_status_t cl_reserve_part(kvd_store_t *s, const kvd_namespace_t *ns,
                                    const kvd_block_hash_t *hashes, size_t n,
                                    uint64_t object_bytes, uint32_t tenant,
                                    uint32_t part, uint32_t num_parts,
                                    kvd_store_reservation_t *out)
{
    return kvd_client_reserve_part(cl(s), ns, hashes, n, object_bytes, tenant,
                                   part, num_parts, out);
}

static kvd_status_t cl_end_part(kvd_store_t *s, const kvd_store_key_t *keys,
                                size_t n, uint32_t part, bool commit,
                                kvd_status_t *statuses_out, bool *published_out)
{
    return kvd_client_end_part(cl(s), keys, n, part, commit, statuses_out,
                               published_out);
}

static kvd_status_t cl_lookup(kvd_store_t *s, const kvd_namespace_t *ns,
                              const kvd_block_hash_t *hashes, size_t n,
                              const char *source_node,
                              kvd_store_lease_t *leases_out,
                              size_t *matched_out)
{
    return kvd_client_lookup(cl(s), ns, hashes, n, source_node, leases_out,
                             matched_out);
}

static kvd_status_t cl_release(kvd_store_t *s, const kvd_store_lease_t *leases,
                               size_t n)
{
    return kvd_client_release(cl(s), leases, n);
}

static kvd_status_t cl_get_submit(kvd_store_t *s, const kvd_store_get_t *g,
                                  size_t n, size_t *accepted_out)
{
    return kvd_client_get_submit(cl(s), g, n, accepted_out);
}

static size_t cl_poll(kvd_store_t *s, kvd_store_completion_t *out, size_t max)
{
    return kvd_client_poll(cl(s), out, max);
}

static kvd_status_t cl_wait(kvd_store_t *s, int timeout_ms)
{
    return kvd_client_wait(cl(s), timeout_ms);
}

static int cl_fd(kvd_store_t *s)
{
    return kvd_client_fd(cl(s));
}

static kvd_status_t cl_delete(kvd_store_t *s, const kvd_store_key_t *keys,
                              size_t n, size_t *num_deleted_out)
{
    return kvd_client_delete(cl(s), keys, n, num_deleted_out);
}

static kvd_status_t cl_pin(kvd_store_t *s, const kvd_store_key_t *keys,
                           size_t num, bool pinned, size_t *num_done_out,
                           size_t *num_missing_out)
{
    return kvd_client_pin(cl(s), keys, num, pinned, num_done_out,
                          num_missing_out);
}

static kvd_status_t cl_flush(kvd_store_t *s, int timeout_ms)
{
    return kvd_client_flush(cl(s), timeout_ms);
}

static kvd_status_t cl_stats(kvd_store_t *s, kvd_store_stats_t *out)
{
    return kvd_client_stats(cl(s), out);
}

static kvd_status_t cl_events_enable(kvd_store_t *s, size_t capacity)
{
    return kvd_client_events_enable(cl(s), capacity);
}

static kvd_status_t cl_take_events(kvd_store_t *s, kvd_store_event_t *out,
                                   size_t max, size_t *n_out,
                                   uint64_t *dropped_out)
{
    return kvd_client_take_events(cl(s), out, max, n_out, dropped_out);
}

static kvd_status_t cl_events_watch(kvd_store_t *s, const kvd_namespace_t *ns,
                                    size_t num)
{
    return kvd_client_events_watch(cl(s), ns, num);
}

const kvd_store_ops_t kvd_client_store_ops = {
    .name = "daemon",
    .close = cl_close,
    .arena_ptr = cl_arena_ptr,
    .arena_hold = cl_arena_hold,
    .arena_unhold = cl_arena_unhold,
    .arena_generation = cl_arena_generation,
    .lease_ptr = cl_lease_ptr,
    .reservation_ptr = cl_reservation_ptr,
    .arena_export = cl_arena_export,
    .reserve = cl_reserve,
    .commit = cl_commit,
    .abort = cl_abort,
    .reserve_part = cl_reserve_part,
    .end_part = cl_end_part,
    .lookup = cl_lookup,
    .release = cl_release,
    .get_submit = cl_get_submit,
    .poll = cl_poll,
    .wait = cl_wait,
    .fd = cl_fd,
    .delete_keys = cl_delete,
    .scan = NULL,
    .tenant_set_quota = NULL,
    .flush = cl_flush,
    .pin = cl_pin,
    .stats = cl_stats,
    .events_enable = cl_events_enable,
    .take_events = cl_take_events,
    .events_watch = cl_events_watch,
};

static void *cl_remote_arena_ptr(kvd_store_t *s, uint64_t off, uint64_t len)
{
    (void)s;
    (void)off;
    (void)len;
    return NULL; /* no arena over TCP */
}

const kvd_store_ops_t kvd_client_remote_ops = {
    .name = "daemon (tcp)",
    .close = cl_close,
    .arena_ptr = cl_remote_arena_ptr,
    .lookup = cl_lookup,
    .release = cl_release,
    .delete_keys = cl_delete,
    .flush = cl_flush,
    .pin = cl_pin,
    .stats = cl_stats,
    .events_enable = cl_events_enable,
    .take_events = cl_take_events,
    .events_watch = cl_events_watch,
};
