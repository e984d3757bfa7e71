/*
 * The store's I/O thread: everything that moves bytes between the arena and
 * NVMe, and every index write, happens here, one job at a time in queue
 * order (store_int.h describes the queues).
 *
 * Write (write-back of an evicted object, or write-through of a commit):
 *   bytes still match the checksum verified at commit, if one was? (else
 *   dropped, see store_write_bytes_match) -> extent alloc (evicting NVMe
 *   objects when the disk is full) -> reserve the key in `l2` (invisible)
 *   -> XXH3 of the bytes, unless verified at commit -> NVMe write -> ... ->
 *   completion -> index put (one LMDB transaction for every write that
 *   completed in the same round) -> commit in `l2` -> free the arena slot
 *   (write-back) or drop the store's lease on it (write-through).
 * The slot is reused only after the index says where the bytes are, and the
 * index says so only after the bytes are written: a crash at any point
 * leaves either no record or a record whose extent holds the object.
 *
 * Read (promotion for kvd_store_get_submit):
 *   already in the arena? lease it -> else index record (checksum, extent)
 *   -> arena slot (evicting) -> reserve the key in `l1` -> NVMe read -> ...
 *   -> completion -> XXH3 check -> commit in `l1` with a lease for the
 *   caller -> completion record; the caller's NVMe lease is released.
 * A read that cannot get a slot waits (retried every few milliseconds, and
 * after every round of completed writes) until store.reserve_timeout, then
 * completes with KVD_ERR_NOSPACE.
 *
 * Sync: NVMe files (fdatasync) then the index, every store.sync_interval
 * when something was written. A record that reaches the disk before its
 * extent's data (power loss between the two) is caught by the checksum on
 * read and dropped; it is never served.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log_int.h"
#include "common/time_int.h"
#include "store/store_int.h"

/* Jobs handed to the NVMe tier in one kvd_nvme_submit call. */
#define STORE_IO_BATCH 64u
/* How often reads waiting for an arena slot try again. */
#define STORE_IO_RETRY_MS 5u

static uint64_t store_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t store_round_block(uint64_t bytes)
{
    return (bytes + KVD_NVME_BLOCK_BYTES - 1) &
           ~(uint64_t)(KVD_NVME_BLOCK_BYTES - 1);
}

static void store_io_done(void *arg, kvd_status_t status)
{
    store_job_t *job = arg;
    kvd_embedded_t *st = job->store;
    job->io_status = status;
    pthread_mutex_lock(&st->mu);
    store_queue_push(&st->doneq, job);
    st->ios_inflight--;
    pthread_cond_signal(&st->work_cv);
    pthread_mutex_unlock(&st->mu);
}

/* ---- writes ------------------------------------------------------------- */

/* The source slot is no longer needed by a write job; the job is freed. */
static void store_write_finish(kvd_embedded_t *st, store_job_t *job)
{
    if (job->leased) {
        kvd_store_key_t lk;
        lk = job->key;
        (void)kvd_l1_release(st->l1, &lk);
    } else {
        (void)kvd_arena_slot_free(st->arena, job->slot);
    }
    pthread_mutex_lock(&st->mu);
    st->writes_pending--;
    pthread_cond_broadcast(&st->space_cv);
    if (st->writes_pending == 0) {
        pthread_cond_broadcast(&st->idle_cv);
    }
    pthread_mutex_unlock(&st->mu);
    free(job);
}

static void store_write_drop(kvd_embedded_t *st, store_job_t *job,
                             kvd_status_t why)
{
    KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                        "store: object not written to NVMe: %s",
                        kvd_status_str(why));
    __atomic_store_n(&st->last_drop_status, (int)why, __ATOMIC_RELAXED);
    store_count(&st->n.dropped_writes, 1);
    store_event_removed(st, &job->key, st->l1);
    store_write_finish(st, job);
}

/* Undoes a write's reservations (extent and `l2` entry). */
static void store_write_unreserve(kvd_embedded_t *st, store_job_t *job)
{
    kvd_store_key_t lk;
    uint32_t extent;
    lk = job->key;
    if (kvd_l1_abort(st->l2, &lk, &extent) == KVD_OK) {
        (void)kvd_nvme_extent_free(st->nvme, extent, job->size_bytes);
    }
    job->extent = KVD_NVME_EXTENT_INVALID;
}

/* Evicts NVMe objects to make room for `bytes` (or one entry). Returns
 * whether anything was evicted. */
static bool store_l2_make_room(kvd_embedded_t *st, uint64_t bytes)
{
    kvd_l1_victim_t victims[16];
    size_t n = 0;
    (void)kvd_l1_evict(st->l2, 1, bytes, victims, 16, &n);
    for (size_t i = 0; i < n; i++) {
        store_event_removed(st, &victims[i].key, st->l1);
    }
    (void)store_l2_victims_dispose(st, victims, n);
    store_count(&st->n.disk_evictions, n);
    return n > 0;
}

/* Whether the slot of a write whose entry remembers the checksum verified
 * at commit still holds those bytes. A mismatch means the slot was written
 * after the commit (through a client's read-write mapping of the arena: a
 * co-tenant or a broken client). Such an object is dropped, not persisted:
 * never written to NVMe, never indexed, counted in checksum_errors (not in
 * dropped_writes: a flush does not fail for it, as nothing that was
 * committed is lost that a reader could have had). A write-through object also
 * stays in the arena: it is doomed there, so no lookup serves the changed bytes
 * again. */
static bool store_write_bytes_match(kvd_embedded_t *st, store_job_t *job)
{
    const void *p = kvd_arena_slot_ptr(st->arena, job->slot);
    if (kvd_xxh3_64(p, job->size_bytes) == job->checksum) {
        return true;
    }
    KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_ERROR, 1000,
                        "store: arena object (%llu bytes) changed after "
                        "its verified commit; dropped, not written to NVMe",
                        (unsigned long long)job->size_bytes);
    store_count(&st->n.checksum_errors, 1);
    if (job->leased) {
        kvd_store_key_t lk;
        lk = job->key;
        (void)kvd_l1_doom(st->l1, &lk);
    }
    return false;
}

/* Extent and `l2` reservation for a write, after checking the bytes against
 * the checksum verified at commit (store_write_bytes_match). KVD_ERR_EXISTS:
 * the key is on NVMe already (or being written there). KVD_ERR_CHECKSUM:
 * the bytes changed since the commit; nothing is reserved. */
static kvd_status_t store_write_prepare(kvd_embedded_t *st, store_job_t *job)
{
    kvd_store_key_t lk;
    lk = job->key;
    kvd_l1_entry_info_t info;
    if (kvd_l1_peek(st->l2, &lk, &info) == KVD_OK) {
        return KVD_ERR_EXISTS;
    }
    if (job->has_checksum && !store_write_bytes_match(st, job)) {
        return KVD_ERR_CHECKSUM;
    }
    uint64_t len = store_round_block(job->size_bytes);
    kvd_status_t status;
    for (;;) {
        status = kvd_nvme_extent_alloc(st->nvme, len, &job->extent);
        if (status != KVD_ERR_NOSPACE || !store_l2_make_room(st, len)) {
            break;
        }
    }
    if (status != KVD_OK) {
        return status;
    }
    for (;;) {
        size_t nv = 0;
        status = kvd_l1_reserve(st->l2, &lk, job->tenant, job->size_bytes,
                                job->extent, NULL, 0, &nv);
        if (status != KVD_ERR_NOSPACE || !store_l2_make_room(st, 0)) {
            break;
        }
    }
    if (status != KVD_OK) {
        (void)kvd_nvme_extent_free(st->nvme, job->extent, len);
        job->extent = KVD_NVME_EXTENT_INVALID;
        return status;
    }
    if (!job->has_checksum) {
        job->checksum = kvd_xxh3_64(kvd_arena_slot_ptr(st->arena, job->slot),
                                    job->size_bytes);
    }
    return KVD_OK;
}

static void store_io_fill(kvd_embedded_t *st, store_job_t *job,
                          kvd_nvme_op_t op, kvd_nvme_io_t *io)
{
    io->op = op;
    io->extent = job->extent;
    io->buf = kvd_arena_slot_ptr(st->arena, job->slot);
    io->len = store_round_block(job->size_bytes);
    io->buf_index = st->fixed_buffers
                        ? (int)kvd_arena_slot_chunk(st->arena, job->slot)
                        : -1;
    io->done = store_io_done;
    io->arg = job;
}

/* Hands `n` prepared jobs to the NVMe tier; returns how many it took. */
static size_t store_io_submit(kvd_embedded_t *st, const kvd_nvme_io_t *ios,
                              size_t n)
{
    if (n == 0) {
        return 0;
    }
    pthread_mutex_lock(&st->mu);
    st->ios_inflight += n; /* before: completions may run at once */
    pthread_mutex_unlock(&st->mu);
    size_t accepted = 0;
    kvd_status_t status = kvd_nvme_submit(st->nvme, ios, n, &accepted);
    if (status != KVD_OK) {
        accepted = 0;
    }
    pthread_mutex_lock(&st->mu);
    st->ios_inflight -= n - accepted;
    pthread_mutex_unlock(&st->mu);
    return accepted;
}

/* Operations the NVMe queue can take now. Only this thread submits, so
 * the room can only grow until it does. */
static size_t store_io_room(kvd_embedded_t *st)
{
    pthread_mutex_lock(&st->mu);
    uint64_t inflight = st->ios_inflight;
    pthread_mutex_unlock(&st->mu);
    uint64_t qd = st->cfg.nvme.queue_depth;
    uint64_t room = inflight < qd ? qd - inflight : 0;
    return room < STORE_IO_BATCH ? (size_t)room : STORE_IO_BATCH;
}

/* Starts the writes of `list`; returns those the NVMe queue had no room
 * for, in order. Jobs are prepared (extent, checksum) only when there is
 * room to submit them. */
static store_job_t *store_writes_start(kvd_embedded_t *st, store_job_t *list)
{
    store_job_t *jobs[STORE_IO_BATCH];
    kvd_nvme_io_t ios[STORE_IO_BATCH];
    while (list != NULL) {
        size_t n = 0, room = store_io_room(st);
        if (room == 0) {
            return list;
        }
        while (list != NULL && n < room) {
            store_job_t *job = list;
            list = job->next;
            kvd_status_t s = store_write_prepare(st, job);
            if (s == KVD_ERR_EXISTS || s == KVD_ERR_CHECKSUM) {
                store_write_finish(st, job);
            } else if (s != KVD_OK) {
                store_write_drop(st, job, s);
            } else {
                store_io_fill(st, job, KVD_NVME_OP_WRITE, &ios[n]);
                jobs[n++] = job;
            }
        }
        size_t accepted = store_io_submit(st, ios, n);
        if (accepted < n) {
            /* Queue full: undo the rest and give them back, in order. */
            store_job_t *back = list;
            for (size_t i = n; i-- > accepted;) {
                store_write_unreserve(st, jobs[i]);
                jobs[i]->next = back;
                back = jobs[i];
            }
            return back;
        }
    }
    return NULL;
}

/* Index put for the writes that completed, then their `l2` commits. */
static void store_writes_complete(kvd_embedded_t *st, store_job_t *list)
{
    size_t n = 0;
    for (store_job_t *j = list; j != NULL; j = j->next) {
        n += j->io_status == KVD_OK;
    }
    kvd_index_entry_t *entries = n > 0 ? calloc(n, sizeof *entries) : NULL;
    kvd_status_t put = n > 0 && entries == NULL ? KVD_ERR_NOMEM : KVD_OK;
    if (entries != NULL) {
        uint64_t now = store_wall_ms();
        size_t k = 0;
        for (store_job_t *j = list; j != NULL; j = j->next) {
            if (j->io_status != KVD_OK) {
                continue;
            }
            kvd_index_entry_t *e = &entries[k++];
            e->key = j->key;
            e->tier = KVD_INDEX_TIER_DISK;
            e->tenant_id = j->tenant;
            (void)kvd_nvme_extent_locate(st->nvme, j->extent, &e->file_id,
                                         &e->offset);
            e->size_bytes = j->size_bytes;
            e->checksum = j->checksum;
            e->created_unix_ms = now;
            e->last_access_unix_ms = now;
        }
        put = kvd_index_put_batch(st->index, entries, n);
        free(entries);
    }
    if (put != KVD_OK) {
        /* A full file system fails every batch until space comes back:
         * one line a second, the rest counted (dropped_writes). */
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_ERROR, 1000,
                            "store: index put of %zu NVMe objects failed: %s",
                            n, kvd_status_str(put));
    }
    for (store_job_t *j = list, *next; j != NULL; j = next) {
        next = j->next;
        kvd_status_t s = j->io_status == KVD_OK ? put : j->io_status;
        if (s == KVD_OK) {
            kvd_store_key_t lk;
            lk = j->key;
            (void)kvd_l1_commit(st->l2, &lk);
            store_count(&st->n.disk_bytes_written, j->size_bytes);
            store_write_finish(st, j);
        } else {
            store_count(&st->n.disk_errors, 1);
            store_write_unreserve(st, j);
            store_write_drop(st, j, s);
        }
    }
}

/* ---- reads -------------------------------------------------------------- */

/* Ends a get: gives the caller's NVMe lease back, removes an object whose
 * bytes failed their checksum (before the caller can see the completion
 * and look the key up again), then publishes the completion. */
static void store_get_complete(kvd_embedded_t *st, store_job_t *job,
                               kvd_status_t status,
                               const kvd_store_lease_t *lease)
{
    kvd_store_completion_t c;
    memset(&c, 0, sizeof c);
    c.user_data = job->get.user_data;
    c.status = status;
    c.lease = lease != NULL ? *lease : job->get.lease;
    /* The caller's NVMe lease ends here whatever the outcome. */
    if (job->get.lease.tier == KVD_STORE_TIER_DISK) {
        kvd_store_key_t lk;
        lk = job->key;
        (void)kvd_l1_release(st->l2, &lk);
        if (status == KVD_ERR_CHECKSUM) {
            store_forget_corrupt(st, &job->key);
        }
    }
    if (kvd_ring_push(st->cq, &c) != KVD_OK) {
        /* Cannot happen: get_submit admits no more than the ring holds. */
        KVD_LOG_ERROR("store: completion ring full; get lost");
    }
    free(job);
}

static void store_get_complete_host(kvd_embedded_t *st, store_job_t *job,
                                    uint32_t slot)
{
    kvd_store_lease_t lease = job->get.lease;
    lease.tier = KVD_STORE_TIER_HOST;
    lease.arena_offset = kvd_arena_slot_offset(st->arena, slot);
    store_get_complete(st, job, KVD_OK, &lease);
}

/* Drops an object whose NVMe bytes failed their checksum. */
static void store_drop_corrupt(kvd_embedded_t *st, store_job_t *job)
{
    kvd_store_key_t ik;
    ik = job->key;
    (void)kvd_index_delete_batch(st->index, &ik, 1, NULL);
    KVD_LOG_ERROR("store: NVMe object at extent %u failed its checksum; "
                  "dropped",
                  job->extent);
    store_count(&st->n.checksum_errors, 1);
    store_count(&st->n.disk_errors, 1);
}

/* After the caller's lease is gone, removes a dropped object from `l2`. If
 * other readers still hold it, it is doomed instead: no lookup matches it
 * again (an engine would load it, fail, recompute and ask again forever),
 * and the last release removes it (kvd_store_release). */
void store_forget_corrupt(kvd_embedded_t *st, const kvd_store_key_t *key)
{
    kvd_store_key_t lk;
    kvd_l1_victim_t v;
    lk = *key;
    kvd_status_t s = kvd_l1_delete(st->l2, &lk, &v);
    if (s == KVD_OK) {
        (void)store_l2_victims_dispose(st, &v, 1);
        store_event_removed(st, key, st->l1);
    } else if (s == KVD_ERR_BUSY) {
        (void)kvd_l1_doom(st->l2, &lk);
    }
}

/* What store_read_prepare decided for a read job. */
typedef enum store_read_prep {
    STORE_READ_SUBMIT = 0, /* a slot is reserved: submit the NVMe read */
    STORE_READ_FINISHED,   /* completed without I/O (or failed): done */
    STORE_READ_WAIT        /* no slot can be had now: wait and retry */
} store_read_prep_t;

/* Prepares a read: reserves its arena slot, or completes it at once when
 * no I/O is needed (already in the arena) or possible. */
static store_read_prep_t store_read_prepare(kvd_embedded_t *st,
                                            store_job_t *job)
{
    kvd_store_key_t lk;
    lk = job->key;
    uint32_t slot;
    if (job->get.lease.tier == KVD_STORE_TIER_HOST) {
        store_get_complete(st, job, KVD_OK, NULL);
        return STORE_READ_FINISHED;
    }
    if (kvd_l1_acquire(st->l1, &lk, &slot) == KVD_OK) {
        store_get_complete_host(st, job, slot);
        return STORE_READ_FINISHED;
    }
    kvd_l1_entry_info_t info;
    if (kvd_l1_peek(st->l1, &lk, &info) == KVD_OK) {
        return STORE_READ_WAIT; /* being written into the arena by someone */
    }
    kvd_store_key_t ik;
    kvd_index_entry_t rec;
    ik = job->key;
    kvd_status_t status = kvd_index_get(st->index, &ik, &rec);
    if (status == KVD_OK) {
        status = kvd_nvme_extent_from_location(st->nvme, rec.file_id,
                                               rec.offset, &job->extent);
    }
    if (status != KVD_OK) {
        store_get_complete(
            st, job, status == KVD_ERR_NOT_FOUND ? status : KVD_ERR_CORRUPT,
            NULL);
        return STORE_READ_FINISHED;
    }
    job->size_bytes = rec.size_bytes;
    job->checksum = rec.checksum;
    job->tenant = rec.tenant_id;
    uint32_t class_id;
    status = kvd_arena_class_register(st->arena, job->size_bytes, &class_id);
    if (status == KVD_OK) {
        status = store_slot_alloc_evicting(st, job->tenant, class_id,
                                           job->size_bytes, &job->slot);
    }
    if (status == KVD_ERR_NOSPACE) {
        /* Every slot is leased or still being written back: wait, up to
         * store.reserve_timeout from the first time. */
        if (job->deadline_ns == 0) {
            job->deadline_ns =
                kvd_time_deadline_ns((int64_t)st->cfg.reserve_timeout_ms);
        }
        if (kvd_time_now_ns() < job->deadline_ns) {
            return STORE_READ_WAIT;
        }
    }
    if (status != KVD_OK) {
        store_get_complete(st, job, status, NULL);
        return STORE_READ_FINISHED;
    }
    kvd_l1_victim_t victims[16];
    size_t nv = 0;
    status = kvd_l1_reserve(st->l1, &lk, job->tenant, job->size_bytes,
                            job->slot, victims, 16, &nv);
    store_victims_dispose(st, victims, nv);
    if (status == KVD_ERR_NOSPACE) {
        (void)kvd_l1_evict(st->l1, 1, 0, victims, 1, &nv);
        store_victims_dispose(st, victims, nv);
    }
    if (status != KVD_OK) {
        (void)kvd_arena_slot_free(st->arena, job->slot);
        job->slot = KVD_ARENA_SLOT_INVALID;
        if (status == KVD_ERR_EXISTS || status == KVD_ERR_NOSPACE) {
            return STORE_READ_WAIT;
        }
        store_get_complete(st, job, status, NULL);
        return STORE_READ_FINISHED;
    }
    return STORE_READ_SUBMIT;
}

static void store_read_unreserve(kvd_embedded_t *st, store_job_t *job)
{
    kvd_store_key_t lk;
    uint32_t slot;
    lk = job->key;
    if (kvd_l1_abort(st->l1, &lk, &slot) == KVD_OK) {
        (void)kvd_arena_slot_free(st->arena, slot);
    }
    job->slot = KVD_ARENA_SLOT_INVALID;
}

/* Starts the reads of `list`; returns those that must wait. */
static store_job_t *store_reads_start(kvd_embedded_t *st, store_job_t *list)
{
    store_job_t *wait = NULL, **wait_tail = &wait;
    store_job_t *jobs[STORE_IO_BATCH];
    kvd_nvme_io_t ios[STORE_IO_BATCH];
    while (list != NULL) {
        size_t n = 0, room = store_io_room(st);
        if (room == 0) {
            *wait_tail = list; /* in order, behind those waiting already */
            return wait;
        }
        while (list != NULL && n < room) {
            store_job_t *job = list;
            list = job->next;
            store_read_prep_t p = store_read_prepare(st, job);
            if (p == STORE_READ_SUBMIT) {
                store_io_fill(st, job, KVD_NVME_OP_READ, &ios[n]);
                jobs[n++] = job;
            } else if (p == STORE_READ_WAIT) {
                job->next = NULL;
                *wait_tail = job;
                wait_tail = &job->next;
            }
        }
        size_t accepted = store_io_submit(st, ios, n);
        for (size_t i = accepted; i < n; i++) {
            store_read_unreserve(st, jobs[i]);
            jobs[i]->next = NULL;
            *wait_tail = jobs[i];
            wait_tail = &jobs[i]->next;
        }
    }
    return wait;
}

static void store_read_complete(kvd_embedded_t *st, store_job_t *job)
{
    kvd_status_t status = job->io_status;
    if (status == KVD_OK) {
        const void *p = kvd_arena_slot_ptr(st->arena, job->slot);
        if (kvd_xxh3_64(p, job->size_bytes) != job->checksum) {
            status = KVD_ERR_CHECKSUM;
            store_drop_corrupt(st, job);
        }
    } else {
        store_count(&st->n.disk_errors, 1);
    }
    if (status != KVD_OK) {
        store_read_unreserve(st, job);
        store_get_complete(st, job, status, NULL);
        return;
    }
    kvd_store_key_t lk;
    lk = job->key;
    store_count(&st->n.disk_bytes_read, job->size_bytes);
    /* The bytes just matched the record's checksum: the entry keeps it. */
    if (kvd_l1_commit_checksum(st->l1, &lk, job->checksum, true) != KVD_OK) {
        store_count(&st->n.host_errors, 1);
        store_read_unreserve(st, job);
        store_get_complete(st, job, KVD_ERR_INTERNAL, NULL);
        return;
    }
    store_get_complete_host(st, job, job->slot);
}

/* ---- the thread --------------------------------------------------------- */

static void store_done_handle(kvd_embedded_t *st, store_job_t *list)
{
    store_job_t *writes = NULL, **wt = &writes;
    for (store_job_t *j = list, *next; j != NULL; j = next) {
        next = j->next;
        if (j->kind == STORE_JOB_WRITE) {
            j->next = NULL;
            *wt = j;
            wt = &j->next;
        } else {
            store_read_complete(st, j);
        }
    }
    if (writes != NULL) {
        store_writes_complete(st, writes);
    }
}

static void store_queue_prepend(store_queue_t *q, store_job_t *list)
{
    if (list == NULL) {
        return;
    }
    store_job_t *last = list;
    size_t n = 1;
    while (last->next != NULL) {
        last = last->next;
        n++;
    }
    last->next = q->head;
    q->head = list;
    if (q->tail == NULL) {
        q->tail = last;
    }
    q->len += n;
}

static void store_gets_cancel(kvd_embedded_t *st, store_job_t *list)
{
    for (store_job_t *j = list, *next; j != NULL; j = next) {
        next = j->next;
        store_get_complete(st, j, KVD_ERR_CANCELED, NULL);
    }
}

void *store_io_main(void *arg)
{
    kvd_embedded_t *st = arg;
    uint64_t queue_depth = st->cfg.nvme.queue_depth;
    uint64_t last_sync_ns = kvd_time_now_ns();
    bool dirty = false;
    store_job_t *waiting = NULL; /* reads waiting for a slot */
    for (;;) {
        pthread_mutex_lock(&st->mu);
        for (;;) {
            bool writable = st->wq.head != NULL && st->nvme != NULL &&
                            st->ios_inflight < queue_depth;
            if (st->doneq.head != NULL || writable || st->gq.head != NULL ||
                (st->stopping && (st->ios_inflight == 0 || waiting != NULL))) {
                break;
            }
            uint64_t wake = KVD_DEADLINE_NEVER;
            if (waiting != NULL) {
                wake =
                    kvd_time_now_ns() + STORE_IO_RETRY_MS * KVD_NSEC_PER_MSEC;
            } else if (dirty) {
                wake =
                    last_sync_ns + st->cfg.sync_interval_ms * KVD_NSEC_PER_MSEC;
            }
            if (wake == KVD_DEADLINE_NEVER) {
                pthread_cond_wait(&st->work_cv, &st->mu);
                continue;
            }
            if (kvd_time_now_ns() >= wake) {
                break;
            }
            struct timespec ts = {.tv_sec = (time_t)(wake / KVD_NSEC_PER_SEC),
                                  .tv_nsec = (long)(wake % KVD_NSEC_PER_SEC)};
            (void)pthread_cond_timedwait(&st->work_cv, &st->mu, &ts);
            break;
        }
        store_job_t *done = store_queue_take(&st->doneq);
        store_job_t *writes = st->nvme != NULL && st->ios_inflight < queue_depth
                                  ? store_queue_take(&st->wq)
                                  : NULL;
        store_job_t *gets = store_queue_take(&st->gq);
        bool stopping = st->stopping;
        pthread_mutex_unlock(&st->mu);

        if (done != NULL) {
            store_done_handle(st, done);
            dirty = true;
        }
        if (writes != NULL) {
            store_job_t *back = store_writes_start(st, writes);
            pthread_mutex_lock(&st->mu);
            store_queue_prepend(&st->wq, back);
            pthread_mutex_unlock(&st->mu);
        }
        /* Reads already waiting go first, then new ones, in order. */
        if (waiting != NULL) {
            store_job_t *last = waiting;
            while (last->next != NULL) {
                last = last->next;
            }
            last->next = gets;
            gets = waiting;
            waiting = NULL;
        }
        if (stopping) {
            store_gets_cancel(st, gets);
        } else if (gets != NULL) {
            waiting = store_reads_start(st, gets);
        }
        if (dirty && st->nvme != NULL &&
            (stopping || kvd_time_now_ns() - last_sync_ns >=
                             st->cfg.sync_interval_ms * KVD_NSEC_PER_MSEC)) {
            kvd_status_t s = kvd_nvme_sync(st->nvme);
            if (s == KVD_OK) {
                s = kvd_index_sync(st->index);
            }
            if (s != KVD_OK) {
                KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                                    "store: sync failed: %s",
                                    kvd_status_str(s));
            }
            dirty = false;
            last_sync_ns = kvd_time_now_ns();
        }
        if (stopping) {
            pthread_mutex_lock(&st->mu);
            bool idle = st->wq.head == NULL && st->doneq.head == NULL &&
                        st->ios_inflight == 0;
            pthread_mutex_unlock(&st->mu);
            if (idle && !dirty) {
                break;
            }
        }
    }
    return NULL;
}
