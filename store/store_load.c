/*
 * The embedded store's load path: lookup (the longest stored prefix,
 * leased, across both tiers), release, and gets that bring DISK-tier
 * objects into the arena through the I/O thread (store_io.c), completed
 * through the completion ring that poll/wait/fd drain.
 *
 * lookup reads only the two in-memory tables. It alternates between them
 * (L1 prefix, then L2 prefix from where L1 stopped, ...) so a chain whose
 * blocks are spread over both tiers still matches whole.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "common/time_int.h"
#include "store/engine.h"
#include "store/store_int.h"

/* ---- load --------------------------------------------------------------- */

/* Leases the longest prefix of keys[0..n) in one table; returns its length
 * and fills leases_out with `tier`. */
static size_t store_lookup_tier(kvd_embedded_t *st, kvd_l1_t *table,
                                kvd_store_tier_t tier,
                                const kvd_namespace_t *ns,
                                const kvd_block_hash_t *hashes, size_t n,
                                kvd_store_lease_t *leases_out)
{
    kvd_store_key_t keys[STORE_KEY_CHUNK];
    uint32_t slots[STORE_KEY_CHUNK];
    uint64_t sizes[STORE_KEY_CHUNK];
    size_t done = 0;
    while (done < n) {
        size_t c = n - done < STORE_KEY_CHUNK ? n - done : STORE_KEY_CHUNK;
        for (size_t i = 0; i < c; i++) {
            keys[i].ns = *ns;
            keys[i].hash = hashes[done + i];
        }
        size_t m = 0;
        (void)kvd_l1_lookup_prefix(table, keys, c, slots, sizes, &m);
        for (size_t i = 0; i < m; i++) {
            kvd_store_lease_t *l = &leases_out[done + i];
            memset(l, 0, sizeof *l);
            l->key.ns = *ns;
            l->key.hash = hashes[done + i];
            l->tier = tier;
            l->size_bytes = sizes[i];
            l->arena_offset = tier == KVD_STORE_TIER_HOST
                                  ? kvd_arena_slot_offset(st->arena, slots[i])
                                  : 0;
        }
        done += m;
        if (m < c) {
            break;
        }
    }
    return done;
}

kvd_status_t store_op_lookup(kvd_store_t *base, const kvd_namespace_t *ns,
                             const kvd_block_hash_t *hashes, size_t num_hashes,
                             const char *source_node,
                             kvd_store_lease_t *leases_out, size_t *matched_out)
{
    kvd_embedded_t *store = store_embedded(base);
    /* Embedded: this process is the only node; nothing to ask. */
    (void)source_node;
    size_t m = 0;
    for (size_t i = 0; i < num_hashes; i++) {
        kvd_store_key_t key = {.ns = *ns, .hash = hashes[i]};
        store_sight(store, &key);
    }
    while (m < num_hashes) {
        size_t a =
            store_lookup_tier(store, store->l1, KVD_STORE_TIER_HOST, ns,
                              hashes + m, num_hashes - m, leases_out + m);
        store_count(&store->n.host_hits, a);
        m += a;
        if (m == num_hashes) {
            break;
        }
        store_count(&store->n.host_misses, 1);
        if (store->l2 == NULL) {
            break;
        }
        size_t b =
            store_lookup_tier(store, store->l2, KVD_STORE_TIER_DISK, ns,
                              hashes + m, num_hashes - m, leases_out + m);
        store_count(&store->n.disk_hits, b);
        m += b;
        if (b == 0) {
            store_count(&store->n.disk_misses, 1);
            break;
        }
    }
    *matched_out = m;
    return KVD_OK;
}

kvd_status_t store_op_release(kvd_store_t *base,
                              const kvd_store_lease_t *leases, size_t num)
{
    kvd_embedded_t *store = store_embedded(base);
    kvd_status_t first = KVD_OK;
    for (size_t i = 0; i < num; i++) {
        kvd_store_key_t lk;
        kvd_status_t s;
        if (leases[i].tier == KVD_STORE_TIER_HOST) {
            /* A run of arena leases goes back under one lock hold. */
            kvd_store_key_t run[STORE_KEY_CHUNK];
            size_t k = 0;
            while (i + k < num && k < STORE_KEY_CHUNK &&
                   leases[i + k].tier == KVD_STORE_TIER_HOST) {
                run[k] = leases[i + k].key;
                k++;
            }
            s = kvd_l1_release_many(store->l1, run, k);
            i += k - 1;
            if (s != KVD_OK && first == KVD_OK) {
                first = s;
            }
            continue;
        }
        lk = leases[i].key;
        if (leases[i].tier == KVD_STORE_TIER_DISK && store->l2 != NULL) {
            s = kvd_l1_release(store->l2, &lk);
            kvd_l1_entry_info_t info;
            if (s == KVD_OK && kvd_l1_peek(store->l2, &lk, &info) == KVD_OK &&
                info.doomed && info.refs == 0) {
                /* The last reader of a doomed object: remove it now. */
                store_forget_corrupt(store, &leases[i].key);
            }
        } else {
            s = KVD_ERR_INVALID;
        }
        if (s != KVD_OK && first == KVD_OK) {
            first = s;
        }
    }
    return first;
}

kvd_status_t store_op_get_submit(kvd_store_t *base, const kvd_store_get_t *gets,
                                 size_t num, size_t *accepted_out)
{
    kvd_embedded_t *store = store_embedded(base);
    for (size_t i = 0; i < num; i++) {
        uint32_t tier = gets[i].lease.tier;
        if ((tier != KVD_STORE_TIER_HOST && tier != KVD_STORE_TIER_DISK) ||
            (tier == KVD_STORE_TIER_DISK && store->l2 == NULL)) {
            return KVD_ERR_INVALID;
        }
    }
    /* Admission against the completion ring's room, so a completion can
     * always be pushed. */
    uint64_t cap = (uint64_t)store->cfg.get_queue;
    uint64_t cur = __atomic_load_n(&store->gets_outstanding, __ATOMIC_RELAXED);
    size_t take;
    do {
        take = cur >= cap ? 0 : (size_t)(cap - cur < num ? cap - cur : num);
        if (take == 0) {
            return KVD_ERR_BUSY;
        }
    } while (!__atomic_compare_exchange_n(&store->gets_outstanding, &cur,
                                          cur + take, false, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    store_job_t *list = NULL, **tail = &list;
    size_t made = 0;
    for (; made < take; made++) {
        store_job_t *job = calloc(1, sizeof *job);
        if (job == NULL) {
            break;
        }
        job->store = store;
        job->kind = STORE_JOB_READ;
        job->get = gets[made];
        job->key = gets[made].lease.key;
        job->size_bytes = gets[made].lease.size_bytes;
        job->slot = KVD_ARENA_SLOT_INVALID;
        job->extent = KVD_NVME_EXTENT_INVALID;
        job->deadline_ns = 0; /* set when it first waits for a slot */
        *tail = job;
        tail = &job->next;
    }
    if (made < take) {
        __atomic_fetch_sub(&store->gets_outstanding, take - made,
                           __ATOMIC_RELAXED);
    }
    if (made == 0) {
        return KVD_ERR_NOMEM;
    }
    pthread_mutex_lock(&store->mu);
    for (store_job_t *j = list, *next; j != NULL; j = next) {
        next = j->next;
        store_queue_push(&store->gq, j);
    }
    pthread_cond_signal(&store->work_cv);
    pthread_mutex_unlock(&store->mu);
    *accepted_out = made;
    return KVD_OK;
}

size_t store_op_poll(kvd_store_t *base, kvd_store_completion_t *out, size_t max)
{
    kvd_embedded_t *store = store_embedded(base);
    /* A caller that asked for the fd may sleep on it after this poll: arm
     * the ring when it is drained (store.h, kvd_store_fd). */
    size_t n = __atomic_load_n(&store->fd_wanted, __ATOMIC_RELAXED)
                   ? kvd_ring_pop_arm(store->cq, out, max)
                   : kvd_ring_pop(store->cq, out, max);
    if (n > 0) {
        __atomic_fetch_sub(&store->gets_outstanding, n, __ATOMIC_RELAXED);
    }
    return n;
}

kvd_status_t store_op_wait(kvd_store_t *base, int timeout_ms)
{
    return kvd_ring_wait(store_embedded(base)->cq, timeout_ms);
}

int store_op_fd(kvd_store_t *base)
{
    kvd_embedded_t *store = (kvd_embedded_t *)base; /* the engine's op */
    __atomic_store_n(&store->fd_wanted, true, __ATOMIC_RELAXED);
    return kvd_ring_fd(store->cq);
}
