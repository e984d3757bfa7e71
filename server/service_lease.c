/*
 * The service's lease records: one lease id over a batch of store leases
 * (a Lookup's, taken at once in one slab; a Get's, added block by block),
 * kept in a hash table by id until Release, a Lookup's release list or the
 * deadline (service_housekeeping.c) ends them. A block on the disk tier is
 * fetched with a store get whose completion the housekeeping thread
 * applies; a record with gets in flight stays in the graveyard until the
 * last one completes. Every record counts its object bytes against its
 * tenant (service_tenant.c).
 */
#include <stdlib.h>
#include <string.h>

#include "common/time_int.h"
#include "server/svc_int.h"

/* A lease by id, if this thread's caller may use it. */
svc_lease_t *svc_lease_find(kvd_service_t *svc, uint64_t id)
{
    for (svc_lease_t *l = svc->leases[svc_bucket(id)]; l != NULL; l = l->next) {
        if (l->id == id) {
            return svc_owns(l->tenant) ? l : NULL;
        }
    }
    return NULL;
}

void svc_lease_insert(kvd_service_t *svc, svc_lease_t *l)
{
    size_t b = svc_bucket(l->id);
    l->next = svc->leases[b];
    svc->leases[b] = l;
    l->in_table = true;
    svc->n_leases++;
    svc->n_leased_blocks += l->n;
    svc_held_add(svc, l->tenant, l->bytes, true);
}

void svc_lease_unlink(kvd_service_t *svc, svc_lease_t *l)
{
    svc_lease_t **pp = &svc->leases[svc_bucket(l->id)];
    while (*pp != l) {
        pp = &(*pp)->next;
    }
    *pp = l->next;
    l->next = NULL;
    l->in_table = false;
    svc->n_leases--;
    svc->n_leased_blocks -= l->n;
    svc_held_add(svc, l->tenant, l->bytes, false);
}

void svc_lease_free(svc_lease_t *l)
{
    for (size_t i = 0; i < l->n; i++) {
        if (!l->blocks[i]->in_slab) {
            free(l->blocks[i]);
        }
    }
    free(l->slab);
    free(l->blocks);
    free(l);
}

/* Fills a new record with `m` held store leases in two allocations (a
 * Lookup's batch; later Gets add blocks one by one). */
kvd_status_t svc_lease_fill(svc_lease_t *l, const kvd_store_lease_t *sl,
                            size_t m)
{
    l->slab = calloc(m, sizeof *l->slab);
    l->blocks = malloc(m * sizeof *l->blocks);
    if (l->slab == NULL || l->blocks == NULL) {
        free(l->slab);
        free(l->blocks);
        l->slab = NULL;
        l->blocks = NULL;
        return KVD_ERR_NOMEM;
    }
    for (size_t i = 0; i < m; i++) {
        svc_block_t *b = &l->slab[i];
        b->lease = sl[i];
        b->owner = l;
        b->state = SVC_HELD;
        b->in_slab = true;
        l->blocks[i] = b;
        l->bytes += sl[i].size_bytes;
    }
    l->n = l->cap = m;
    return KVD_OK;
}

svc_lease_t *svc_lease_new(const kvd_namespace_t *ns, uint32_t ttl_ms)
{
    svc_lease_t *l = calloc(1, sizeof *l);
    if (l != NULL) {
        l->ns = *ns;
        l->ttl_ms = ttl_ms;
        l->deadline_ns = kvd_time_now_ns() + (uint64_t)ttl_ms * 1000000u;
    }
    return l;
}

/* Appends a held store lease; KVD_ERR_NOMEM leaves `l` as it was. */
static kvd_status_t lease_add(svc_lease_t *l, const kvd_store_lease_t *sl)
{
    if (l->n == l->cap) {
        size_t cap = l->cap == 0 ? 8 : l->cap * 2;
        svc_block_t **b = realloc(l->blocks, cap * sizeof *b);
        if (b == NULL) {
            return KVD_ERR_NOMEM;
        }
        l->blocks = b;
        l->cap = cap;
    }
    svc_block_t *blk = calloc(1, sizeof *blk);
    if (blk == NULL) {
        return KVD_ERR_NOMEM;
    }
    blk->lease = *sl;
    blk->owner = l;
    blk->state = SVC_HELD;
    l->blocks[l->n++] = blk;
    l->bytes += sl->size_bytes;
    return KVD_OK;
}

/* Gives back what an out-of-table record holds; frees it unless gets are
 * in flight (then the housekeeping thread frees it). `mu` held. */
void svc_lease_drop(kvd_service_t *svc, svc_lease_t *l)
{
    /* Back to the store in batches: one table lock per batch, not one per
     * block. */
    kvd_store_lease_t batch[64];
    size_t k = 0;
    for (size_t i = 0; i < l->n; i++) {
        svc_block_t *b = l->blocks[i];
        if (b->state == SVC_HELD) {
            batch[k++] = b->lease;
            b->state = SVC_FAILED;
            b->status = KVD_ERR_CANCELED;
        }
        if (k == sizeof batch / sizeof batch[0] || (i + 1 == l->n && k > 0)) {
            (void)kvd_store_release(svc->store, batch, k);
            k = 0;
        }
    }
    if (l->pending > 0) {
        l->dead = true;
        l->next = svc->graveyard;
        svc->graveyard = l;
        return;
    }
    svc_lease_free(l);
}

/* The record's block for `hash`, or NULL. `mu` held. */
svc_block_t *svc_lease_block(svc_lease_t *l, const uint8_t *hash)
{
    for (size_t i = 0; i < l->n; i++) {
        if (memcmp(l->blocks[i]->lease.key.hash.bytes, hash,
                   KVD_SHA256_BYTES) == 0) {
            return l->blocks[i];
        }
    }
    return NULL;
}

/* Takes a store lease on one key into `l`; false if stored nowhere. `mu`
 * held (lookup of one key is an in-memory probe). */
bool svc_lease_take_one(kvd_service_t *svc, svc_lease_t *l,
                        const kvd_block_hash_t *hash, kvd_status_t *err)
{
    kvd_store_lease_t sl;
    size_t m = 0;
    if (kvd_store_lookup(svc->store, &l->ns, hash, 1, &sl, &m) != KVD_OK ||
        m == 0) {
        return false;
    }
    if (sl.size_bytes > svc_held_room(svc, l->tenant)) {
        (void)kvd_store_release(svc->store, &sl, 1);
        svc_count(&svc->leases_refused, 1);
        *err = KVD_ERR_QUOTA;
        return false;
    }
    *err = lease_add(l, &sl);
    if (*err != KVD_OK) {
        (void)kvd_store_release(svc->store, &sl, 1);
        return false;
    }
    if (l->in_table) {
        svc->n_leased_blocks++;
        svc_held_add(svc, l->tenant, sl.size_bytes, true);
    }
    return true;
}

/* Starts the store get of a DISK block. `mu` held. */
void svc_block_fetch(kvd_service_t *svc, svc_block_t *b)
{
    kvd_store_get_t g = {.lease = b->lease,
                         .user_data = (uint64_t)(uintptr_t)b};
    size_t accepted = 0;
    kvd_status_t s = kvd_store_get_submit(svc->store, &g, 1, &accepted);
    if (s == KVD_OK && accepted == 1) {
        b->state = SVC_PENDING;
        b->owner->pending++;
    } else if (s != KVD_OK && s != KVD_ERR_BUSY) {
        (void)kvd_store_release(svc->store, &b->lease, 1);
        b->state = SVC_FAILED;
        b->status = s;
    }
    /* KVD_ERR_BUSY or nothing accepted: stays HELD on disk, PENDING to the
     * caller, submitted again on its next Get. */
}

/* Ends the leases named (unknown ids are skipped); returns how many were
 * held. */
uint32_t svc_release_ids(kvd_service_t *svc, const uint64_t *ids, size_t n)
{
    uint32_t released = 0;
    pthread_mutex_lock(&svc->mu);
    for (size_t i = 0; i < n; i++) {
        svc_lease_t *l = svc_lease_find(svc, ids[i]);
        if (l != NULL) {
            svc_lease_unlink(svc, l);
            svc_lease_drop(svc, l);
            released++;
        } else if (svc_quarantine_release_lease(svc, ids[i])) {
            released++; /* the session acknowledged its expiry */
        }
    }
    pthread_mutex_unlock(&svc->mu);
    return released;
}
