/*
 * The embedded store's save path: reserve (an arena slot per new key,
 * evicting colder objects when the arena is full), commit (publish, and
 * with write-through queue the NVMe copy) and abort. Eviction lives here
 * too: victims leave L1 and either free their slot or become write-back
 * jobs for the I/O thread (store_io.c), after the admission filter.
 *
 * reserve never blocks on I/O: a victim that must go to NVMe first keeps
 * its slot until the I/O thread has written it, so reserve may wait for
 * that (bounded by store.reserve_timeout) and then answers
 * KVD_ERR_NOSPACE for the key.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "common/time_int.h"
#include "store/engine.h"
#include "store/store_int.h"

/* ---- admission filter --------------------------------------------------- */

static size_t store_sight_bucket(const kvd_store_key_t *key)
{
    return (size_t)(kvd_xxh3_64(key, sizeof *key) & (STORE_SIGHT_BUCKETS - 1));
}

void store_sight(kvd_embedded_t *st, const kvd_store_key_t *key)
{
    uint8_t *c = &st->sight[store_sight_bucket(key)];
    /* Saturating at 2 is all the filter needs; a lost race loses one
     * sighting, which only delays admission. */
    if (__atomic_load_n(c, __ATOMIC_RELAXED) < 2) {
        __atomic_fetch_add(c, 1, __ATOMIC_RELAXED);
    }
}

bool store_sighted_twice(kvd_embedded_t *st, const kvd_store_key_t *key)
{
    return __atomic_load_n(&st->sight[store_sight_bucket(key)],
                           __ATOMIC_RELAXED) >= 2;
}

/* ---- queues ------------------------------------------------------------- */

void store_queue_push(store_queue_t *q, store_job_t *job)
{
    job->next = NULL;
    if (q->tail != NULL) {
        q->tail->next = job;
    } else {
        q->head = job;
    }
    q->tail = job;
    q->len++;
}

store_job_t *store_queue_take(store_queue_t *q)
{
    store_job_t *list = q->head;
    q->head = q->tail = NULL;
    q->len = 0;
    return list;
}

/* Hands a write job to the I/O thread. */
static void store_write_enqueue(kvd_embedded_t *st, store_job_t *job)
{
    pthread_mutex_lock(&st->mu);
    store_queue_push(&st->wq, job);
    st->writes_pending++;
    pthread_cond_signal(&st->work_cv);
    pthread_mutex_unlock(&st->mu);
}

/* ---- eviction ----------------------------------------------------------- */

static bool store_l2_has(kvd_embedded_t *st, const kvd_store_key_t *key)
{
    kvd_l1_entry_info_t info;
    return st->l2 != NULL && kvd_l1_peek(st->l2, key, &info) == KVD_OK;
}

void store_victims_dispose(kvd_embedded_t *st, const kvd_l1_victim_t *victims,
                           size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const kvd_l1_victim_t *v = &victims[i];
        kvd_store_key_t key;
        key = v->key;
        bool keep = st->nvme != NULL && !store_l2_has(st, &v->key);
        if (keep && st->cfg.disk_admission == STORE_ADMIT_SECOND &&
            !store_sighted_twice(st, &key)) {
            store_count(&st->n.admission_rejects, 1);
            keep = false;
        }
        store_job_t *job = keep ? calloc(1, sizeof *job) : NULL;
        if (keep && job == NULL) {
            KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                                "store: no memory for a write-back job; "
                                "evicted object dropped");
            __atomic_store_n(&st->last_drop_status, (int)KVD_ERR_NOMEM,
                             __ATOMIC_RELAXED);
            store_count(&st->n.dropped_writes, 1);
        }
        if (job == NULL) {
            (void)kvd_arena_slot_free(st->arena, v->slot);
            store_event_removed(st, &key, st->l2);
            continue;
        }
        job->store = st;
        job->kind = STORE_JOB_WRITE;
        job->key = key;
        job->tenant = v->tenant;
        job->size_bytes = v->size_bytes;
        job->slot = v->slot;
        job->extent = KVD_NVME_EXTENT_INVALID;
        job->has_checksum = v->has_checksum;
        job->checksum = v->checksum;
        store_write_enqueue(st, job);
    }
    if (n > 0) {
        store_count(&st->n.host_evictions, n);
        pthread_mutex_lock(&st->mu);
        pthread_cond_broadcast(&st->space_cv);
        pthread_mutex_unlock(&st->mu);
    }
}

/* The arena partition of `tenant`'s objects (0: the main one). */
uint32_t store_part_of(const kvd_embedded_t *st, uint32_t tenant)
{
    for (uint32_t i = 0; i < st->num_part_tenants; i++) {
        if (st->part_tenants[i] == tenant) {
            return i + 1;
        }
    }
    return 0;
}

kvd_status_t store_slot_alloc_evicting(kvd_embedded_t *st, uint32_t tenant,
                                       uint32_t class_id, uint64_t object_bytes,
                                       uint32_t *slot_out)
{
    kvd_l1_victim_t victims[STORE_EVICT_BATCH];
    uint32_t part = store_part_of(st, tenant);
    for (;;) {
        kvd_status_t status =
            kvd_arena_slot_alloc_in(st->arena, part, class_id, slot_out);
        if (status != KVD_ERR_NOSPACE) {
            return status;
        }
        size_t n = 0;
        if (st->num_part_tenants == 0) {
            (void)kvd_l1_evict(st->l1, 1, object_bytes, victims,
                               STORE_EVICT_BATCH, &n);
        } else {
            /* Objects of other partitions would free nothing here. */
            (void)kvd_l1_evict_group(st->l1, (uint8_t)part, 1, object_bytes,
                                     victims, STORE_EVICT_BATCH, &n);
        }
        if (n == 0) {
            return KVD_ERR_NOSPACE;
        }
        store_victims_dispose(st, victims, n);
    }
}

/* The slot for a reserve: evict, and if the freed slots are still being
 * written back, wait for them up to store.reserve_timeout. */
static kvd_status_t store_reserve_slot(kvd_embedded_t *st, uint32_t tenant,
                                       uint32_t class_id, uint64_t object_bytes,
                                       uint64_t *deadline_ns,
                                       uint32_t *slot_out)
{
    for (;;) {
        kvd_status_t status = store_slot_alloc_evicting(st, tenant, class_id,
                                                        object_bytes, slot_out);
        if (status != KVD_ERR_NOSPACE) {
            return status;
        }
        if (*deadline_ns == 0) {
            *deadline_ns =
                kvd_time_deadline_ns((int64_t)st->cfg.reserve_timeout_ms);
        }
        pthread_mutex_lock(&st->mu);
        bool waited = false;
        if (st->writes_pending > 0 && kvd_time_now_ns() < *deadline_ns) {
            struct timespec ts = {
                .tv_sec = (time_t)(*deadline_ns / KVD_NSEC_PER_SEC),
                .tv_nsec = (long)(*deadline_ns % KVD_NSEC_PER_SEC)};
            (void)pthread_cond_timedwait(&st->space_cv, &st->mu, &ts);
            waited = true;
        }
        pthread_mutex_unlock(&st->mu);
        if (!waited) {
            return KVD_ERR_NOSPACE;
        }
    }
}

/* ---- save --------------------------------------------------------------- */

kvd_status_t store_reserve_one(kvd_embedded_t *st, const kvd_store_key_t *key,
                               uint32_t class_id, uint64_t object_bytes,
                               uint32_t tenant, uint64_t *deadline_ns,
                               uint64_t *offset_out)
{
    kvd_store_key_t lk;
    lk = *key;
    kvd_l1_entry_info_t info;
    if (kvd_l1_peek(st->l1, &lk, &info) == KVD_OK || store_l2_has(st, &lk)) {
        return KVD_ERR_EXISTS;
    }
    uint32_t slot;
    kvd_status_t status = store_reserve_slot(st, tenant, class_id, object_bytes,
                                             deadline_ns, &slot);
    if (status != KVD_OK) {
        return status;
    }
    kvd_l1_victim_t victims[STORE_EVICT_BATCH];
    for (;;) {
        size_t nv = 0;
        status = kvd_l1_reserve(st->l1, &lk, tenant, object_bytes, slot,
                                victims, STORE_EVICT_BATCH, &nv);
        store_victims_dispose(st, victims, nv);
        if (status == KVD_ERR_NOSPACE) {
            /* The table is full by count (many small objects): make room
             * for one entry. */
            (void)kvd_l1_evict(st->l1, 1, 0, victims, 1, &nv);
            store_victims_dispose(st, victims, nv);
            if (nv > 0) {
                continue;
            }
        } else if (status == KVD_ERR_QUOTA && nv == STORE_EVICT_BATCH) {
            continue; /* more quota victims to take */
        }
        break;
    }
    if (status != KVD_OK) {
        (void)kvd_arena_slot_free(st->arena, slot);
        return status;
    }
    *offset_out = kvd_arena_slot_offset(st->arena, slot);
    return KVD_OK;
}

kvd_status_t store_reserve_class(kvd_embedded_t *st, uint64_t object_bytes,
                                 uint32_t *class_out)
{
    if (object_bytes > st->arena_info.chunk_bytes) {
        return KVD_ERR_INVALID;
    }
    return kvd_arena_class_register(st->arena, object_bytes, class_out);
}

kvd_status_t store_op_reserve(kvd_store_t *base, const kvd_namespace_t *ns,
                              const kvd_block_hash_t *hashes, size_t num_hashes,
                              uint64_t object_bytes, uint32_t tenant,
                              kvd_store_reservation_t *out)
{
    kvd_embedded_t *store = store_embedded(base);
    uint32_t class_id;
    kvd_status_t status = store_reserve_class(store, object_bytes, &class_id);
    if (status != KVD_OK) {
        return status;
    }
    store_parts_tick(store);
    uint64_t deadline_ns = 0;
    for (size_t i = 0; i < num_hashes; i++) {
        kvd_store_key_t key = {.ns = *ns, .hash = hashes[i]};
        store_sight(store, &key);
        out[i].reserved = 0;
        out[i].arena_offset = 0;
        out[i].status =
            store_reserve_one(store, &key, class_id, object_bytes, tenant,
                              &deadline_ns, &out[i].arena_offset);
    }
    return KVD_OK;
}

/* Queues the write-through of a committed, leased object. */
static void store_write_through(kvd_embedded_t *st, const kvd_store_key_t *key,
                                const kvd_store_key_t *lk)
{
    kvd_l1_entry_info_t info;
    store_job_t *job = NULL;
    if (kvd_l1_peek(st->l1, lk, &info) == KVD_OK && !store_l2_has(st, lk)) {
        job = calloc(1, sizeof *job);
    }
    if (job == NULL) {
        (void)kvd_l1_release(st->l1, lk);
        return;
    }
    job->store = st;
    job->kind = STORE_JOB_WRITE;
    job->key = *key;
    job->tenant = info.tenant;
    job->size_bytes = info.size_bytes;
    job->slot = info.slot;
    job->extent = KVD_NVME_EXTENT_INVALID;
    job->leased = true;
    job->has_checksum = info.has_checksum;
    job->checksum = info.checksum;
    store_write_enqueue(st, job);
}

/* Commits one key of an embedded store; `xxh3`, when not NULL, is the
 * checksum of its bytes the caller checked, kept with the entry. */
kvd_status_t store_commit_one(kvd_embedded_t *store, const kvd_store_key_t *key,
                              const uint64_t *xxh3)
{
    bool through =
        store->nvme != NULL && store->cfg.disk_write == STORE_WRITE_THROUGH;
    kvd_store_key_t lk;
    lk = *key;
    kvd_status_t s;
    if (xxh3 != NULL) {
        s = kvd_l1_commit_checksum(store->l1, &lk, *xxh3, through);
    } else if (through) { /* the write-back job holds a reference */
        s = kvd_l1_commit_acquire(store->l1, &lk);
    } else {
        s = kvd_l1_commit(store->l1, &lk);
    }
    if (s == KVD_OK && through) {
        store_write_through(store, key, &lk);
    }
    if (s == KVD_OK) {
        store_event(store, key, KVD_STORE_EVENT_STORED);
    }
    return s;
}

kvd_status_t store_op_commit(kvd_store_t *base, const kvd_store_key_t *keys,
                             size_t num, kvd_status_t *statuses_out)
{
    kvd_embedded_t *store = store_embedded(base);
    kvd_status_t first = KVD_OK;
    for (size_t i = 0; i < num; i++) {
        kvd_status_t s = store_parts_has(store, &keys[i])
                             ? KVD_ERR_STATE
                             : store_commit_one(store, &keys[i], NULL);
        if (statuses_out != NULL) {
            statuses_out[i] = s;
        }
        if (s != KVD_OK && first == KVD_OK) {
            first = s;
        }
    }
    return first;
}

kvd_status_t kvd_store_commit_checksum(kvd_store_t *base,
                                       const kvd_store_key_t *key,
                                       uint64_t xxh3)
{
    if (base == NULL || key == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_embedded_t *store = store_embedded(base);
    if (store == NULL) {
        return kvd_store_commit(base, key, 1, NULL);
    }
    return store_parts_has(store, key) ? KVD_ERR_STATE
                                       : store_commit_one(store, key, &xxh3);
}

bool kvd_store_lease_checksum(kvd_store_t *base, const kvd_store_lease_t *lease,
                              uint64_t *xxh3_out)
{
    kvd_embedded_t *store = store_embedded(base);
    if (store == NULL || lease == NULL || xxh3_out == NULL ||
        lease->tier != KVD_STORE_TIER_HOST) {
        return false;
    }
    kvd_store_key_t lk;
    lk = lease->key;
    kvd_l1_entry_info_t info;
    /* The lease keeps the entry (and its slot) in place; the slot and size
     * are compared anyway, so a caller's stale lease yields no checksum. */
    if (kvd_l1_peek(store->l1, &lk, &info) != KVD_OK || !info.ready ||
        !info.has_checksum || info.size_bytes != lease->size_bytes ||
        kvd_arena_slot_offset(store->arena, info.slot) != lease->arena_offset) {
        return false;
    }
    *xxh3_out = info.checksum;
    return true;
}

kvd_status_t store_op_abort(kvd_store_t *base, const kvd_store_key_t *keys,
                            size_t num, kvd_status_t *statuses_out)
{
    kvd_embedded_t *store = store_embedded(base);
    kvd_status_t first = KVD_OK;
    bool freed = false;
    for (size_t i = 0; i < num; i++) {
        kvd_store_key_t lk;
        lk = keys[i];
        uint32_t slot;
        kvd_status_t s = store_parts_has(store, &lk)
                             ? KVD_ERR_STATE
                             : kvd_l1_abort(store->l1, &lk, &slot);
        if (s == KVD_OK) {
            (void)kvd_arena_slot_free(store->arena, slot);
            freed = true;
        }
        if (statuses_out != NULL) {
            statuses_out[i] = s;
        }
        if (s != KVD_OK && first == KVD_OK) {
            first = s;
        }
    }
    if (freed) {
        pthread_mutex_lock(&store->mu);
        pthread_cond_broadcast(&store->space_cv);
        pthread_mutex_unlock(&store->mu);
    }
    return first;
}
