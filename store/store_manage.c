/*
 * The embedded store's management calls: delete (both tiers; index records
 * are removed and synced before an extent is reused, so a restarted store
 * never finds a record pointing at reused bytes), scan, tenant quotas,
 * flush (every object of the arena written to NVMe, synced) and stats.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "common/time_int.h"
#include "store/engine.h"
#include "store/store_int.h"

/* ---- management --------------------------------------------------------- */

static bool store_write_queued(kvd_embedded_t *st, const kvd_store_key_t *key)
{
    bool found = false;
    pthread_mutex_lock(&st->mu);
    for (store_job_t *j = st->wq.head; j != NULL && !found; j = j->next) {
        found = memcmp(&j->key, key, sizeof *key) == 0;
    }
    pthread_mutex_unlock(&st->mu);
    return found;
}

kvd_status_t store_l2_victims_dispose(kvd_embedded_t *st,
                                      const kvd_l1_victim_t *victims, size_t n)
{
    kvd_status_t first = KVD_OK;
    if (n == 0) {
        return KVD_OK;
    }
    kvd_store_key_t keys[STORE_EVICT_BATCH];
    for (size_t done = 0; done < n;) {
        size_t c = n - done < STORE_EVICT_BATCH ? n - done : STORE_EVICT_BATCH;
        for (size_t i = 0; i < c; i++) {
            keys[i] = victims[done + i].key;
        }
        kvd_status_t s = kvd_index_delete_batch(st->index, keys, c, NULL);
        if (s == KVD_OK) {
            s = kvd_index_sync(st->index);
        }
        /* An extent whose record may survive must not be reused: on error
         * it stays allocated until the next open drops the record or
         * finds it again. */
        for (size_t i = 0; i < c && s == KVD_OK; i++) {
            (void)kvd_nvme_extent_free(st->nvme, victims[done + i].slot,
                                       victims[done + i].size_bytes);
        }
        if (s != KVD_OK) {
            KVD_LOG_ERROR("store: cannot remove %zu NVMe objects from the "
                          "index: %s; their space is held until restart",
                          c, kvd_status_str(s));
            store_count(&st->n.disk_errors, 1);
            if (first == KVD_OK) {
                first = KVD_ERR_IO;
            }
        }
        done += c;
    }
    return first;
}

kvd_status_t store_op_pin(kvd_store_t *base, const kvd_store_key_t *keys,
                          size_t num, bool pinned, size_t *num_done_out,
                          size_t *num_missing_out)
{
    kvd_embedded_t *store = store_embedded(base);
    uint64_t cap = store->cfg.pin_max_bytes != 0
                       ? store->cfg.pin_max_bytes
                       : store->arena_info.size_bytes / 2;
    size_t done = 0, missing = 0;
    kvd_status_t s = KVD_OK;
    for (size_t i = 0; i < num && s == KVD_OK; i++) {
        s = kvd_l1_pin(store->l1, &keys[i], pinned, cap);
        if (s == KVD_OK) {
            done++;
        } else if (s == KVD_ERR_NOT_FOUND) {
            missing++; /* not in the arena: absent, or on NVMe only */
            s = KVD_OK;
        }
    }
    if (num_done_out != NULL) {
        *num_done_out = done;
    }
    if (num_missing_out != NULL) {
        *num_missing_out = missing;
    }
    return s;
}

kvd_status_t store_op_delete(kvd_store_t *base, const kvd_store_key_t *keys,
                             size_t num, size_t *num_deleted_out)
{
    kvd_embedded_t *store = store_embedded(base);
    size_t deleted = 0;
    bool busy = false;
    kvd_status_t io = KVD_OK; /* an NVMe record that could not be removed */
    kvd_l1_victim_t l2v[STORE_EVICT_BATCH];
    size_t nl2 = 0;
    for (size_t i = 0; i < num; i++) {
        kvd_store_key_t lk;
        lk = keys[i];
        if (store->l2 != NULL && store_write_queued(store, &keys[i])) {
            busy = true;
            continue;
        }
        kvd_l1_victim_t v;
        bool any = false;
        kvd_status_t s = kvd_l1_delete(store->l1, &lk, &v);
        if (s == KVD_OK) {
            (void)kvd_arena_slot_free(store->arena, v.slot);
            any = true;
        } else if (s == KVD_ERR_BUSY || s == KVD_ERR_STATE) {
            busy = true;
        }
        if (store->l2 != NULL) {
            s = kvd_l1_delete(store->l2, &lk, &l2v[nl2]);
            if (s == KVD_OK) {
                any = true;
                if (++nl2 == STORE_EVICT_BATCH) {
                    kvd_status_t ds = store_l2_victims_dispose(store, l2v, nl2);
                    io = io != KVD_OK ? io : ds;
                    nl2 = 0;
                }
            } else if (s == KVD_ERR_BUSY || s == KVD_ERR_STATE) {
                busy = true;
            }
        }
        if (any) {
            store_event(store, &keys[i], KVD_STORE_EVENT_REMOVED);
            deleted++;
        }
    }
    kvd_status_t ds = store_l2_victims_dispose(store, l2v, nl2);
    io = io != KVD_OK ? io : ds;
    if (num_deleted_out != NULL) {
        *num_deleted_out = deleted;
    }
    return io != KVD_OK ? io : busy ? KVD_ERR_BUSY : KVD_OK;
}

/* The cursor walks L1 first, then L2: its top bit says which. */
#define STORE_SCAN_L2 (UINT64_C(1) << 63)

kvd_status_t store_op_scan(kvd_store_t *base, uint64_t *cursor,
                           kvd_store_object_t *out, size_t max, size_t *n_out)
{
    kvd_embedded_t *store = store_embedded(base);
    size_t n = 0;
    kvd_l1_scan_entry_t chunk[STORE_KEY_CHUNK];
    while (n < max) {
        bool l2 = (*cursor & STORE_SCAN_L2) != 0;
        kvd_l1_t *table = l2 ? store->l2 : store->l1;
        if (table == NULL) {
            break; /* no disk tier */
        }
        uint64_t pos = *cursor & ~STORE_SCAN_L2;
        size_t want = max - n < STORE_KEY_CHUNK ? max - n : STORE_KEY_CHUNK;
        size_t got = 0;
        kvd_status_t s = kvd_l1_scan(table, &pos, chunk, want, &got);
        if (s != KVD_OK) {
            return s;
        }
        for (size_t i = 0; i < got; i++) {
            out[n].key = chunk[i].key;
            out[n].tier = l2 ? KVD_STORE_TIER_DISK : KVD_STORE_TIER_HOST;
            out[n].tenant = chunk[i].tenant;
            out[n].size_bytes = chunk[i].size_bytes;
            n++;
        }
        if (got < want) {
            if (l2) {
                *cursor = STORE_SCAN_L2 | pos;
                break;
            }
            *cursor = STORE_SCAN_L2; /* L1 done: L2 from its start */
            continue;
        }
        *cursor = (l2 ? STORE_SCAN_L2 : 0) | pos;
    }
    *n_out = n;
    return KVD_OK;
}

kvd_status_t store_op_tenant_set_quota(kvd_store_t *base, uint32_t tenant,
                                       uint64_t max_bytes)
{
    return kvd_l1_tenant_set_quota(store_embedded(base)->l1, tenant, max_bytes);
}

/* Waits until at most `most` NVMe writes are queued or in flight, or the
 * deadline passes (KVD_ERR_TIMEOUT). */
static kvd_status_t store_writes_wait(kvd_embedded_t *store, uint64_t most,
                                      uint64_t deadline)
{
    kvd_status_t status = KVD_OK;
    pthread_mutex_lock(&store->mu);
    while (store->writes_pending > most) {
        if (deadline == KVD_DEADLINE_NEVER) {
            pthread_cond_wait(&store->idle_cv, &store->mu);
            continue;
        }
        struct timespec ts = {.tv_sec = (time_t)(deadline / KVD_NSEC_PER_SEC),
                              .tv_nsec = (long)(deadline % KVD_NSEC_PER_SEC)};
        if (pthread_cond_timedwait(&store->idle_cv, &store->mu, &ts) ==
                ETIMEDOUT &&
            store->writes_pending > most) {
            status = KVD_ERR_TIMEOUT;
            break;
        }
    }
    pthread_mutex_unlock(&store->mu);
    return status;
}

/* Queues the write-back of one host-only object, pinned by a lease of its
 * own that the write job releases. Returns whether a job was queued: an
 * object evicted, deleted or written to NVMe meanwhile is skipped. */
static bool store_write_back_one(kvd_embedded_t *st, const kvd_store_key_t *key)
{
    kvd_store_key_t lk;
    lk = *key;
    kvd_l1_entry_info_t info;
    uint32_t slot;
    if (kvd_l1_peek(st->l2, &lk, &info) == KVD_OK ||
        kvd_l1_acquire(st->l1, &lk, &slot) != KVD_OK) {
        return false;
    }
    store_job_t *job = NULL;
    if (kvd_l1_peek(st->l1, &lk, &info) == KVD_OK && info.slot == slot) {
        job = calloc(1, sizeof *job);
    }
    if (job == NULL) {
        (void)kvd_l1_release(st->l1, &lk);
        return false;
    }
    job->store = st;
    job->kind = STORE_JOB_WRITE;
    job->key = *key;
    job->tenant = info.tenant;
    job->size_bytes = info.size_bytes;
    job->slot = slot;
    job->extent = KVD_NVME_EXTENT_INVALID;
    job->leased = true;
    job->has_checksum = info.has_checksum;
    job->checksum = info.checksum;
    pthread_mutex_lock(&st->mu);
    store_queue_push(&st->wq, job);
    st->writes_pending++;
    pthread_cond_signal(&st->work_cv);
    pthread_mutex_unlock(&st->mu);
    return true;
}

/* Write-backs the flush keeps queued at once: enough to keep the NVMe
 * queue busy, few enough that a flush past its deadline leaves little
 * behind for the I/O thread. */
#define STORE_FLUSH_WINDOW (2u * STORE_KEY_CHUNK)

/* Walks the arena's objects and queues the write-back of every one with no
 * NVMe copy, STORE_FLUSH_WINDOW at a time; *queued_out counts them. */
static kvd_status_t store_write_back_all(kvd_embedded_t *st, uint64_t deadline,
                                         uint64_t *queued_out)
{
    kvd_l1_scan_entry_t chunk[STORE_KEY_CHUNK];
    uint64_t cursor = 0;
    size_t got = STORE_KEY_CHUNK;
    while (got == STORE_KEY_CHUNK) {
        kvd_status_t s =
            kvd_l1_scan(st->l1, &cursor, chunk, STORE_KEY_CHUNK, &got);
        if (s != KVD_OK) {
            return s;
        }
        for (size_t i = 0; i < got; i++) {
            *queued_out += store_write_back_one(st, &chunk[i].key) ? 1 : 0;
        }
        s = store_writes_wait(st, STORE_FLUSH_WINDOW - STORE_KEY_CHUNK,
                              deadline);
        if (s != KVD_OK) {
            return s;
        }
    }
    return KVD_OK;
}

uint64_t store_host_only_count(kvd_embedded_t *st)
{
    kvd_l1_scan_entry_t chunk[STORE_KEY_CHUNK];
    uint64_t cursor = 0, n = 0;
    size_t got = STORE_KEY_CHUNK;
    while (st->l2 != NULL && got == STORE_KEY_CHUNK) {
        if (kvd_l1_scan(st->l1, &cursor, chunk, STORE_KEY_CHUNK, &got) !=
            KVD_OK) {
            break;
        }
        for (size_t i = 0; i < got; i++) {
            kvd_store_key_t lk;
            lk = chunk[i].key;
            kvd_l1_entry_info_t info;
            n += kvd_l1_peek(st->l2, &lk, &info) == KVD_OK ? 0 : 1;
        }
    }
    return n;
}

kvd_status_t store_flush(kvd_embedded_t *store, int timeout_ms,
                         uint64_t *queued_out)
{
    uint64_t deadline = kvd_time_deadline_ns(timeout_ms);
    uint64_t queued = 0;
    kvd_status_t status = KVD_OK;
    if (store->nvme != NULL) {
        status = store_write_back_all(store, deadline, &queued);
    }
    if (status == KVD_OK) {
        status = store_writes_wait(store, 0, deadline);
    }
    if (queued_out != NULL) {
        *queued_out = queued;
    }
    if (status == KVD_OK && store->nvme != NULL) {
        status = kvd_nvme_sync(store->nvme);
        if (status == KVD_OK) {
            status = kvd_index_sync(store->index);
        }
    }
    /* Writes that finished by being dropped (an I/O error, no space, the
     * index refusing them) are not durable either: say so, once. A flush
     * that failed otherwise leaves them for the next one to report. */
    if (status != KVD_OK) {
        return status;
    }
    uint64_t dropped = store_read(&store->n.dropped_writes);
    uint64_t seen = __atomic_exchange_n(&store->flush_dropped_seen, dropped,
                                        __ATOMIC_RELAXED);
    if (dropped > seen) {
        kvd_status_t why = (kvd_status_t)__atomic_load_n(
            &store->last_drop_status, __ATOMIC_RELAXED);
        status = why < 0 ? why : KVD_ERR_IO;
        KVD_LOG_WARN("store: flush: %llu NVMe writes dropped since the "
                     "previous flush (the latest: %s); those objects are in "
                     "the arena only",
                     (unsigned long long)(dropped - seen), kvd_status_str(why));
    }
    return status;
}

kvd_status_t store_op_flush(kvd_store_t *base, int timeout_ms)
{
    return store_flush(store_embedded(base), timeout_ms, NULL);
}

kvd_status_t store_op_stats(kvd_store_t *base, kvd_store_stats_t *out)
{
    kvd_embedded_t *store = store_embedded(base);
    memset(out, 0, sizeof *out);
    kvd_l1_stats_t s1;
    (void)kvd_l1_stats(store->l1, &s1);
    out->host.capacity_bytes = store->arena_info.size_bytes;
    out->host.bytes = s1.bytes;
    out->host.objects = s1.objects;
    out->host.hits = store_read(&store->n.host_hits);
    out->host.misses = store_read(&store->n.host_misses);
    out->host.evictions = store_read(&store->n.host_evictions);
    out->host.errors = store_read(&store->n.host_errors);
    out->leases = s1.leases;
    if (store->l2 != NULL) {
        kvd_l1_stats_t s2;
        kvd_nvme_info_t info;
        (void)kvd_l1_stats(store->l2, &s2);
        (void)kvd_nvme_query(store->nvme, &info);
        out->disk.capacity_bytes = info.total_bytes;
        out->disk.bytes = s2.bytes;
        out->disk.objects = s2.objects;
        out->disk.hits = store_read(&store->n.disk_hits);
        out->disk.misses = store_read(&store->n.disk_misses);
        out->disk.evictions = store_read(&store->n.disk_evictions);
        out->disk.bytes_written = store_read(&store->n.disk_bytes_written);
        out->disk.bytes_read = store_read(&store->n.disk_bytes_read);
        out->disk.errors = store_read(&store->n.disk_errors);
        out->leases += s2.leases;
    }
    /* Bytes that crossed between the tiers, seen from the host side. */
    out->host.bytes_written = out->disk.bytes_read;
    out->host.bytes_read = out->disk.bytes_written;
    pthread_mutex_lock(&store->mu);
    out->writes_pending = store->writes_pending;
    pthread_mutex_unlock(&store->mu);
    out->admission_rejects = store_read(&store->n.admission_rejects);
    out->checksum_errors = store_read(&store->n.checksum_errors);
    out->dropped_writes = store_read(&store->n.dropped_writes);
    return KVD_OK;
}

/* The host capacity a tenant may fill: its own partition's size, or the
 * main partition's (shared with every tenant without one), capped by its
 * quota when it has one. */
static uint64_t store_tenant_capacity(kvd_embedded_t *store, uint32_t tenant,
                                      uint64_t quota_bytes)
{
    uint64_t cap = store->arena_info.size_bytes;
    kvd_arena_stats_t *as = malloc(sizeof *as);
    uint32_t part = store_part_of(store, tenant);
    if (as != NULL && kvd_arena_stats(store->arena, as) == KVD_OK &&
        part < as->num_parts) {
        cap = as->parts[part].bytes_total;
    }
    free(as);
    return quota_bytes != 0 && quota_bytes < cap ? quota_bytes : cap;
}

kvd_status_t kvd_store_tenant_stats(kvd_store_t *base, uint32_t tenant,
                                    kvd_store_stats_t *out)
{
    kvd_embedded_t *store = store_embedded(base);
    if (store == NULL || out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_store_stats_t s;
    memset(&s, 0, sizeof s);
    kvd_l1_tenant_stats_t t;
    uint64_t quota = 0;
    /* A tenant the store never saw holds nothing: zeros, not an error. */
    if (kvd_l1_tenant_stats(store->l1, tenant, &t) == KVD_OK) {
        s.host.objects = t.objects;
        s.host.bytes = t.bytes;
        s.host.evictions = t.evictions;
        quota = t.quota_bytes;
    }
    s.host.capacity_bytes = store_tenant_capacity(store, tenant, quota);
    if (store->l2 != NULL) {
        kvd_nvme_info_t info;
        (void)kvd_nvme_query(store->nvme, &info);
        s.disk.capacity_bytes = info.total_bytes;
        if (kvd_l1_tenant_stats(store->l2, tenant, &t) == KVD_OK) {
            s.disk.objects = t.objects;
            s.disk.bytes = t.bytes;
            s.disk.evictions = t.evictions;
        }
    }
    *out = s;
    return KVD_OK;
}
