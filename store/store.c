/*
 * The embedded store (include/kvdepot/store.h): ties the arena, the two
 * object tables, the NVMe tier and the index together. This file holds the
 * calls a user makes; the I/O thread that moves bytes to and from NVMe is in
 * store_io.c, and the structure both share in store_int.h.
 *
 * Why the calls look the way they do:
 *   - reserve never blocks on I/O. When the arena is full it evicts; a
 *     victim that must go to NVMe first keeps its slot until the I/O thread
 *     has written it, so reserve may wait for that (bounded by
 *     store.reserve_timeout) and then answers KVD_ERR_NOSPACE for the key.
 *   - lookup reads only the two in-memory tables. It alternates between
 *     them (L1 prefix, then L2 prefix from where L1 stopped, ...) so a chain
 *     whose blocks are spread over both tiers still matches whole.
 *   - delete removes index records and syncs the index before an extent is
 *     freed, so a restarted store never finds a record pointing at bytes
 *     that were reused.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "common/time_int.h"
#include "store/engine.h"
#include "store/store_int.h"

_Static_assert(sizeof(kvd_store_key_t) == 48, "the one key type is 48 bytes");

/* Lookups and reserves convert keys in chunks of this many on the stack. */
#define STORE_KEY_CHUNK 64u
/* Victims taken by one eviction step. */
#define STORE_EVICT_BATCH 16u
/* Bounds on the objects the tables hold when the setting is 0 (auto). */
#define STORE_AUTO_OBJ_BYTES (64u << 10)
#define STORE_AUTO_MIN 1024u

/* ---- settings ----------------------------------------------------------- */

static const char *const l1_policy_names[] = {"s3fifo", "lru", NULL};
static const char *const disk_write_names[] = {"back", "through", NULL};
static const char *const admission_names[] = {"all", "second", NULL};
static const char *const mode_names[] = {"embedded", "daemon", NULL};

#define STORE_OFF(m) offsetof(store_settings_t, m)

static const kvd_config_field_t store_own_fields[] = {
    {"store.mode", "embedded",
     "embedded (the store lives in this process) or daemon (a kvdepotd on "
     "this node, at store.address)",
     kvd_config_parse_enum, STORE_OFF(mode), 0, 0, mode_names},
    {"store.address", "unix:/run/kvdepot/kvdepotd.sock",
     "daemon mode: the kvdepotd socket, unix:PATH", kvd_config_parse_string,
     STORE_OFF(address), 0, 0, NULL},
    {"store.timeout", "2s",
     "daemon mode: deadline of every call (a dead daemon costs this, then "
     "the engine recomputes)",
     kvd_config_parse_duration_ms, STORE_OFF(timeout_ms), 1, 600000, NULL},
    {"store.lease_ttl", "30s",
     "daemon mode: how long the daemon keeps a lookup's blocks for this "
     "process before reclaiming them",
     kvd_config_parse_duration_ms, STORE_OFF(lease_ttl_ms), 1, 3600000, NULL},
    {"store.l1_policy", "s3fifo",
     "eviction policy of the host arena: s3fifo or lru", kvd_config_parse_enum,
     STORE_OFF(l1_policy), 0, 0, l1_policy_names},
    {"store.l1_max_objects", "0",
     "most objects in the arena (0: arena_size / 64 KiB, at least 1024)",
     kvd_config_parse_int, STORE_OFF(l1_max_objects), 0, KVD_L1_CAPACITY_MAX,
     NULL},
    {"store.disk_max_objects", "0",
     "most objects on NVMe (0: disk_size / 64 KiB, at least 1024)",
     kvd_config_parse_int, STORE_OFF(disk_max_objects), 0, KVD_L1_CAPACITY_MAX,
     NULL},
    {"store.disk_write", "back",
     "when objects reach NVMe: back (on arena eviction) or through (on "
     "commit)",
     kvd_config_parse_enum, STORE_OFF(disk_write), 0, 0, disk_write_names},
    {"store.disk_admission", "second",
     "which evicted objects write-back keeps: all, or second (seen twice)",
     kvd_config_parse_enum, STORE_OFF(disk_admission), 0, 0, admission_names},
    {"store.index_map_size", "64m", "initial LMDB map of the index",
     kvd_config_parse_size, STORE_OFF(index_map_bytes), 1 << 20, 0, NULL},
    {"store.sync_interval", "1s",
     "how often NVMe files and index are synced (0: after every batch)",
     kvd_config_parse_duration_ms, STORE_OFF(sync_interval_ms), 0, 3600000,
     NULL},
    {"store.reserve_timeout", "100ms",
     "how long reserve waits for write-back to free arena slots",
     kvd_config_parse_duration_ms, STORE_OFF(reserve_timeout_ms), 0, 60000,
     NULL},
    {"store.get_queue", "4096",
     "gets accepted and not yet polled, at most (back-pressure beyond)",
     kvd_config_parse_int, STORE_OFF(get_queue), 1, 1 << 20, NULL},
};

#define STORE_FIELDS_MAX 32u

/* One table for every store.* key: kvd_config_apply rejects a store.* key
 * absent from the table it is given, so the modules' tables are merged
 * with their offsets moved into store_settings_t. */
static size_t store_fields(kvd_config_field_t *out)
{
    size_t n = 0, k = 0;
    const kvd_config_field_t *arena = kvd_arena_config_table(&k);
    for (size_t i = 0; i < k; i++) {
        out[n] = arena[i];
        out[n++].offset += STORE_OFF(arena);
    }
    const kvd_config_field_t *nvme = kvd_nvme_config_table(&k);
    for (size_t i = 0; i < k; i++) {
        out[n] = nvme[i];
        out[n++].offset += STORE_OFF(nvme);
    }
    k = sizeof store_own_fields / sizeof store_own_fields[0];
    for (size_t i = 0; i < k; i++) {
        out[n++] = store_own_fields[i];
    }
    return n;
}

kvd_status_t kvd_store_visit_config(const kvd_config_t *config,
                                    kvd_config_visit_fn fn, void *ctx)
{
    kvd_config_field_t fields[STORE_FIELDS_MAX];
    size_t n = store_fields(fields);
    return kvd_config_visit(config, fields, n, fn, ctx);
}

kvd_status_t kvd_store_print_config(const kvd_config_t *config, FILE *out)
{
    if (out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_config_field_t fields[STORE_FIELDS_MAX];
    size_t n = store_fields(fields);
    return kvd_config_print(config, fields, n, out);
}

static uint32_t store_auto_capacity(int64_t setting, uint64_t bytes)
{
    if (setting > 0) {
        return (uint32_t)setting;
    }
    uint64_t cap = bytes / STORE_AUTO_OBJ_BYTES;
    if (cap < STORE_AUTO_MIN) {
        cap = STORE_AUTO_MIN;
    }
    if (cap > KVD_L1_CAPACITY_MAX) {
        cap = KVD_L1_CAPACITY_MAX;
    }
    return (uint32_t)cap;
}

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
static uint32_t store_part_of(const kvd_embedded_t *st, uint32_t tenant)
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

/* ---- open / close ------------------------------------------------------- */

static kvd_status_t store_settings_load(const kvd_config_t *config,
                                        store_settings_t *cfg, char *err,
                                        size_t err_len)
{
    kvd_config_field_t fields[STORE_FIELDS_MAX];
    size_t n = store_fields(fields);
    memset(cfg, 0, sizeof *cfg);
    return kvd_config_apply(config, fields, n, cfg, err, err_len);
}

KVD_API kvd_status_t kvd_store_check_config(const kvd_config_t *config,
                                            bool *daemon_mode_out, char *err,
                                            size_t err_len)
{
    store_settings_t *cfg = malloc(sizeof *cfg);
    if (cfg == NULL) {
        return KVD_ERR_NOMEM;
    }
    kvd_status_t s = store_settings_load(config, cfg, err, err_len);
    if (s == KVD_OK && daemon_mode_out != NULL) {
        *daemon_mode_out = cfg->mode == STORE_MODE_DAEMON;
    }
    free(cfg);
    return s;
}

kvd_status_t kvd_store_mode_settings(const kvd_config_t *config,
                                     kvd_store_mode_settings_t *out, char *err,
                                     size_t err_len)
{
    if (out == NULL) {
        return KVD_ERR_INVALID;
    }
    store_settings_t *cfg = malloc(sizeof *cfg);
    if (cfg == NULL) {
        return KVD_ERR_NOMEM;
    }
    kvd_status_t s = store_settings_load(config, cfg, err, err_len);
    if (s == KVD_OK) {
        memset(out, 0, sizeof *out);
        out->daemon = cfg->mode == STORE_MODE_DAEMON;
        memcpy(out->address, cfg->address, sizeof out->address);
        out->timeout_ms = cfg->timeout_ms;
        out->lease_ttl_ms = cfg->lease_ttl_ms;
        out->get_queue = (size_t)cfg->get_queue;
    }
    free(cfg);
    return s;
}

static void store_err(char *err, size_t err_len, const char *what,
                      kvd_status_t status)
{
    if (err != NULL && err_len > 0) {
        snprintf(err, err_len, "%s: %s", what, kvd_status_str(status));
    }
}

/* Rebuilds `l2` and the extent allocator from the index. Records that
 * cannot be placed (outside the files, overlapping, beyond the table's
 * capacity, or of the host tier) are deleted from the index. */
static kvd_status_t store_recover(kvd_embedded_t *st)
{
    enum { PAGE = 512 };
    kvd_index_entry_t *page = calloc(PAGE, sizeof *page);
    kvd_store_key_t *bad = calloc(PAGE, sizeof *bad);
    kvd_status_t status = KVD_ERR_NOMEM;
    if (page == NULL || bad == NULL) {
        goto out;
    }
    kvd_store_key_t after;
    bool first = true;
    uint64_t recovered = 0, dropped = 0, corrupt = 0;
    for (;;) {
        size_t got = 0, nbad = 0;
        status = kvd_index_scan(st->index, first ? NULL : &after, page, PAGE,
                                &got, &corrupt);
        if (status != KVD_OK) {
            goto out;
        }
        for (size_t i = 0; i < got; i++) {
            const kvd_index_entry_t *e = &page[i];
            uint32_t extent = KVD_NVME_EXTENT_INVALID;
            kvd_status_t s = KVD_ERR_INVALID;
            if (e->tier == KVD_INDEX_TIER_DISK) {
                s = kvd_nvme_extent_from_location(st->nvme, e->file_id,
                                                  e->offset, &extent);
            }
            if (s == KVD_OK) {
                s = kvd_nvme_extent_mark(st->nvme, extent, e->size_bytes);
            }
            if (s == KVD_OK) {
                kvd_store_key_t key = e->key;
                size_t nv = 0;
                s = kvd_l1_reserve(st->l2, &key, e->tenant_id, e->size_bytes,
                                   extent, NULL, 0, &nv);
                if (s == KVD_OK) {
                    s = kvd_l1_commit(st->l2, &key);
                } else {
                    (void)kvd_nvme_extent_free(st->nvme, extent, e->size_bytes);
                }
            }
            if (s == KVD_OK) {
                recovered++;
            } else {
                bad[nbad++] = e->key;
                dropped++;
            }
        }
        if (nbad > 0) {
            status = kvd_index_delete_batch(st->index, bad, nbad, NULL);
            if (status != KVD_OK) {
                goto out;
            }
        }
        if (got < PAGE) {
            break;
        }
        after = page[got - 1].key;
        first = false;
    }
    if (dropped > 0) {
        status = kvd_index_sync(st->index);
        if (status != KVD_OK) {
            goto out;
        }
        KVD_LOG_WARN("store: dropped %llu index records that no longer "
                     "fit the disk tier",
                     (unsigned long long)dropped);
    }
    KVD_LOG_INFO("store: %llu objects on NVMe (%llu corrupt records skipped)",
                 (unsigned long long)recovered, (unsigned long long)corrupt);
    status = KVD_OK;
out:
    free(bad);
    free(page);
    return status;
}

static kvd_status_t store_disk_open(kvd_embedded_t *st, char *err,
                                    size_t err_len)
{
    kvd_status_t status = kvd_nvme_open(&st->cfg.nvme, &st->nvme);
    if (status != KVD_OK) {
        store_err(err, err_len, "store.disk_path: NVMe tier", status);
        return status;
    }
    /* One fixed buffer per arena chunk: a slot never spans chunks, so its
     * chunk is its buffer index. Without them the tier still works. */
    struct iovec *iov = calloc(st->arena_info.num_chunks, sizeof *iov);
    if (iov != NULL) {
        for (uint32_t i = 0; i < st->arena_info.num_chunks; i++) {
            iov[i].iov_base = (uint8_t *)st->arena_info.base +
                              (uint64_t)i * st->arena_info.chunk_bytes;
            iov[i].iov_len = st->arena_info.chunk_bytes;
        }
        kvd_nvme_info_t info;
        st->fixed_buffers =
            kvd_nvme_buffers_register(st->nvme, iov,
                                      st->arena_info.num_chunks) == KVD_OK &&
            kvd_nvme_query(st->nvme, &info) == KVD_OK && info.buffers > 0;
        free(iov);
    }
    kvd_index_config_t icfg = {.map_size_bytes = st->cfg.index_map_bytes};
    status = kvd_index_open(st->cfg.nvme.path, &icfg, &st->index);
    if (status != KVD_OK) {
        store_err(err, err_len, "store.disk_path: index", status);
        return status;
    }
    kvd_l1_config_t l2cfg = {.capacity =
                                 store_auto_capacity(st->cfg.disk_max_objects,
                                                     st->cfg.nvme.size_bytes),
                             .policy = KVD_L1_S3FIFO};
    status = kvd_l1_create(&l2cfg, &st->l2);
    if (status != KVD_OK) {
        store_err(err, err_len, "disk object table", status);
        return status;
    }
    status = store_recover(st);
    if (status != KVD_OK) {
        store_err(err, err_len, "index recovery", status);
    }
    return status;
}

static void store_free(kvd_embedded_t *st)
{
    if (st->io_thread_started) {
        pthread_mutex_lock(&st->mu);
        st->stopping = true;
        pthread_cond_broadcast(&st->work_cv);
        pthread_mutex_unlock(&st->mu);
        pthread_join(st->io_thread, NULL);
    }
    kvd_nvme_close(st->nvme);
    if (st->index != NULL) {
        (void)kvd_index_sync(st->index);
    }
    kvd_index_close(st->index);
    kvd_l1_destroy(st->l2);
    kvd_l1_destroy(st->l1);
    kvd_arena_destroy(st->arena);
    kvd_ring_destroy(st->cq);
    free(st->sight);
    pthread_cond_destroy(&st->idle_cv);
    pthread_cond_destroy(&st->space_cv);
    pthread_cond_destroy(&st->work_cv);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

static size_t store_pow2_at_least(size_t n)
{
    size_t p = 2;
    while (p < n) {
        p <<= 1;
    }
    return p;
}

/* Checks the partitions and sets them in the arena's settings. */
static kvd_status_t store_set_parts(kvd_embedded_t *st,
                                    const kvd_store_tenant_arena_t *arenas,
                                    size_t n, char *err, size_t err_len)
{
    if (n > KVD_ARENA_PARTS_MAX || (n > 0 && arenas == NULL)) {
        kvd_config_err(err, err_len, "server.tenant_arenas: at most %u tenants",
                       KVD_ARENA_PARTS_MAX);
        return KVD_ERR_INVALID;
    }
    if (n > 0 && st->cfg.mode == STORE_MODE_DAEMON) {
        kvd_config_err(err, err_len,
                       "server.tenant_arenas: tenant arenas belong to the "
                       "daemon's own store, not to store.mode=daemon");
        return KVD_ERR_INVALID;
    }
    if (st->cfg.mode == STORE_MODE_DAEMON) {
        kvd_config_err(err, err_len,
                       "store.mode: daemon stores are opened by "
                       "kvd_store_open, not by the embedded engine");
        return KVD_ERR_INVALID;
    }
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < i; j++) {
            if (arenas[j].tenant == arenas[i].tenant) {
                kvd_config_err(err, err_len,
                               "server.tenant_arenas: tenant id %u twice",
                               arenas[i].tenant);
                return KVD_ERR_INVALID;
            }
        }
        if (arenas[i].tenant == 0) {
            kvd_config_err(err, err_len,
                           "server.tenant_arenas: the default tenant (0) "
                           "uses the main arena");
            return KVD_ERR_INVALID;
        }
        st->part_tenants[i] = arenas[i].tenant;
        st->cfg.arena.part_bytes[i] = arenas[i].bytes;
    }
    st->num_part_tenants = (uint32_t)n;
    st->cfg.arena.num_parts = (uint32_t)n;
    return KVD_OK;
}

kvd_status_t kvd_store_open_partitioned(const kvd_config_t *config,
                                        const kvd_store_tenant_arena_t *arenas,
                                        size_t n, kvd_store_t **store_out,
                                        char *err, size_t err_len)
{
    if (store_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_embedded_t *st = calloc(1, sizeof *st);
    if (st == NULL) {
        return KVD_ERR_NOMEM;
    }
    st->base.ops = &kvd_store_embedded_ops;
    pthread_mutex_init(&st->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&st->work_cv, &ca);
    pthread_cond_init(&st->space_cv, &ca);
    pthread_cond_init(&st->idle_cv, &ca);
    pthread_condattr_destroy(&ca);

    kvd_status_t status = store_settings_load(config, &st->cfg, err, err_len);
    if (status == KVD_OK) {
        status = store_set_parts(st, arenas, n, err, err_len);
    }
    if (status != KVD_OK) {
        goto err;
    }
    st->sight = calloc(STORE_SIGHT_BUCKETS, 1);
    if (st->sight == NULL) {
        status = KVD_ERR_NOMEM;
        goto err;
    }
    status = kvd_arena_create(&st->cfg.arena, &st->arena);
    if (status != KVD_OK) {
        store_err(err, err_len,
                  st->num_part_tenants > 0
                      ? "store.arena_size and server.tenant_arenas: arena"
                      : "store.arena_size: arena",
                  status);
        goto err;
    }
    (void)kvd_arena_query(st->arena, &st->arena_info);
    kvd_l1_config_t l1cfg = {.capacity =
                                 store_auto_capacity(st->cfg.l1_max_objects,
                                                     st->arena_info.size_bytes),
                             .policy = (kvd_l1_policy_t)st->cfg.l1_policy};
    status = kvd_l1_create(&l1cfg, &st->l1);
    for (uint32_t i = 0; status == KVD_OK && i < st->num_part_tenants; i++) {
        /* A partition's objects form its own eviction group. */
        status = kvd_l1_tenant_set_group(st->l1, st->part_tenants[i],
                                         (uint8_t)(i + 1));
    }
    if (status != KVD_OK) {
        store_err(err, err_len, "arena object table", status);
        goto err;
    }
    status = kvd_ring_create(store_pow2_at_least((size_t)st->cfg.get_queue),
                             sizeof(kvd_store_completion_t), &st->cq);
    if (status != KVD_OK) {
        store_err(err, err_len, "completion ring", status);
        goto err;
    }
    if (st->cfg.nvme.path[0] != '\0') {
        status = store_disk_open(st, err, err_len);
        if (status != KVD_OK) {
            goto err;
        }
    }
    int rc = pthread_create(&st->io_thread, NULL, store_io_main, st);
    if (rc != 0) {
        status = kvd_status_from_errno(rc);
        store_err(err, err_len, "I/O thread", status);
        goto err;
    }
    st->io_thread_started = true;
    KVD_LOG_INFO("store: open, arena %llu MiB%s%s",
                 (unsigned long long)(st->arena_info.size_bytes >> 20),
                 st->nvme != NULL ? ", NVMe tier at " : "",
                 st->nvme != NULL ? st->cfg.nvme.path : "");
    *store_out = &st->base;
    return KVD_OK;
err:
    store_free(st);
    return status;
}

static void emb_close(kvd_store_t *base)
{
    store_free(store_embedded(base));
}

/* ---- arena access ------------------------------------------------------- */

static void *emb_arena_ptr(kvd_store_t *base, uint64_t arena_offset,
                           uint64_t len)
{
    kvd_embedded_t *store = store_embedded(base);
    if (len == 0 || arena_offset >= store->arena_info.size_bytes ||
        len > store->arena_info.size_bytes - arena_offset) {
        return NULL;
    }
    return (uint8_t *)store->arena_info.base + arena_offset;
}

static kvd_status_t emb_arena_hold(kvd_store_t *base, void **base_out,
                                   uint64_t *size_bytes_out,
                                   uint32_t *generation_out)
{
    kvd_embedded_t *store = store_embedded(base);
    *base_out = store->arena_info.base;
    *size_bytes_out = store->arena_info.size_bytes;
    *generation_out = 0;
    return KVD_OK;
}

/* The embedded arena never changes: nothing to hold, generation 0. */
static void emb_arena_unhold(kvd_store_t *base, uint32_t generation)
{
    (void)base;
    (void)generation;
}

static uint32_t emb_arena_generation(kvd_store_t *base)
{
    (void)base;
    return 0;
}

static void *emb_lease_ptr(kvd_store_t *base, const kvd_store_lease_t *lease)
{
    if (lease->tier != KVD_STORE_TIER_HOST) {
        return NULL;
    }
    return emb_arena_ptr(base, lease->arena_offset, lease->size_bytes);
}

static void *emb_reservation_ptr(kvd_store_t *base,
                                 const kvd_store_reservation_t *r, uint64_t len)
{
    return emb_arena_ptr(base, r->arena_offset, len);
}

static kvd_status_t emb_arena_export(kvd_store_t *base,
                                     kvd_store_arena_export_t *out)
{
    return kvd_store_arena_export_tenant(base, 0, out);
}

kvd_status_t kvd_store_arena_export_tenant(kvd_store_t *base, uint32_t tenant,
                                           kvd_store_arena_export_t *out)
{
    kvd_embedded_t *store = store_embedded(base);
    if (store == NULL || out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_arena_export_t exp;
    kvd_status_t status =
        kvd_arena_export_part(store->arena, store_part_of(store, tenant), &exp);
    if (status != KVD_OK) {
        return status;
    }
    out->fd = exp.fd;
    out->offset = exp.offset;
    out->map_bytes = exp.map_bytes;
    out->size_bytes = exp.size_bytes;
    return KVD_OK;
}

kvd_status_t kvd_store_arena_partitions(kvd_store_t *base,
                                        kvd_arena_part_stats_t *out, size_t max,
                                        size_t *n_out)
{
    kvd_embedded_t *store = store_embedded(base);
    if (store == NULL || out == NULL || n_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_arena_stats_t *st = malloc(sizeof *st);
    if (st == NULL) {
        return KVD_ERR_NOMEM;
    }
    kvd_status_t s = kvd_arena_stats(store->arena, st);
    size_t n = 0;
    for (; s == KVD_OK && n < st->num_parts && n < max; n++) {
        out[n] = st->parts[n];
    }
    free(st);
    *n_out = n;
    return s;
}

kvd_status_t kvd_store_arena_backing(kvd_store_t *base,
                                     kvd_arena_backing_t *out)
{
    kvd_embedded_t *store = store_embedded(base);
    if (store == NULL || out == NULL) {
        return KVD_ERR_INVALID;
    }
    *out = store->arena_info.backing;
    return KVD_OK;
}

/* ---- save --------------------------------------------------------------- */

static kvd_status_t store_reserve_one(kvd_embedded_t *st,
                                      const kvd_store_key_t *key,
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

static kvd_status_t emb_reserve(kvd_store_t *base, const kvd_namespace_t *ns,
                                const kvd_block_hash_t *hashes,
                                size_t num_hashes, uint64_t object_bytes,
                                uint32_t tenant, kvd_store_reservation_t *out)
{
    kvd_embedded_t *store = store_embedded(base);
    if (object_bytes > store->arena_info.chunk_bytes) {
        return KVD_ERR_INVALID;
    }
    uint32_t class_id;
    kvd_status_t status =
        kvd_arena_class_register(store->arena, object_bytes, &class_id);
    if (status != KVD_OK) {
        return status;
    }
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
static kvd_status_t store_commit_one(kvd_embedded_t *store,
                                     const kvd_store_key_t *key,
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
    return s;
}

static kvd_status_t emb_commit(kvd_store_t *base, const kvd_store_key_t *keys,
                               size_t num, kvd_status_t *statuses_out)
{
    kvd_embedded_t *store = store_embedded(base);
    kvd_status_t first = KVD_OK;
    for (size_t i = 0; i < num; i++) {
        kvd_status_t s = store_commit_one(store, &keys[i], NULL);
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
    return store_commit_one(store, key, &xxh3);
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

static kvd_status_t emb_abort(kvd_store_t *base, const kvd_store_key_t *keys,
                              size_t num, kvd_status_t *statuses_out)
{
    kvd_embedded_t *store = store_embedded(base);
    kvd_status_t first = KVD_OK;
    bool freed = false;
    for (size_t i = 0; i < num; i++) {
        kvd_store_key_t lk;
        lk = keys[i];
        uint32_t slot;
        kvd_status_t s = kvd_l1_abort(store->l1, &lk, &slot);
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
    size_t done = 0;
    while (done < n) {
        size_t c = n - done < STORE_KEY_CHUNK ? n - done : STORE_KEY_CHUNK;
        for (size_t i = 0; i < c; i++) {
            keys[i].ns = *ns;
            keys[i].hash = hashes[done + i];
        }
        size_t m = 0;
        (void)kvd_l1_lookup_prefix(table, keys, c, slots, &m);
        for (size_t i = 0; i < m; i++) {
            kvd_store_lease_t *l = &leases_out[done + i];
            kvd_l1_entry_info_t info;
            memset(l, 0, sizeof *l);
            l->key.ns = *ns;
            l->key.hash = hashes[done + i];
            l->tier = tier;
            /* The lease pins the entry, so its size cannot change. */
            if (kvd_l1_peek(table, &keys[i], &info) == KVD_OK) {
                l->size_bytes = info.size_bytes;
            }
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

static kvd_status_t emb_lookup(kvd_store_t *base, const kvd_namespace_t *ns,
                               const kvd_block_hash_t *hashes,
                               size_t num_hashes, const char *source_node,
                               kvd_store_lease_t *leases_out,
                               size_t *matched_out)
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

static kvd_status_t emb_release(kvd_store_t *base,
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

static kvd_status_t emb_get_submit(kvd_store_t *base,
                                   const kvd_store_get_t *gets, size_t num,
                                   size_t *accepted_out)
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

static size_t emb_poll(kvd_store_t *base, kvd_store_completion_t *out,
                       size_t max)
{
    kvd_embedded_t *store = store_embedded(base);
    size_t n = kvd_ring_pop(store->cq, out, max);
    if (n > 0) {
        __atomic_fetch_sub(&store->gets_outstanding, n, __ATOMIC_RELAXED);
    }
    return n;
}

static kvd_status_t emb_wait(kvd_store_t *base, int timeout_ms)
{
    return kvd_ring_wait(store_embedded(base)->cq, timeout_ms);
}

static int emb_fd(kvd_store_t *base)
{
    return kvd_ring_fd(store_embedded(base)->cq);
}

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

static kvd_status_t emb_delete(kvd_store_t *base, const kvd_store_key_t *keys,
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
        deleted += any ? 1 : 0;
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

static kvd_status_t emb_scan(kvd_store_t *base, uint64_t *cursor,
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

static kvd_status_t emb_tenant_set_quota(kvd_store_t *base, uint32_t tenant,
                                         uint64_t max_bytes)
{
    return kvd_l1_tenant_set_quota(store_embedded(base)->l1, tenant, max_bytes);
}

static kvd_status_t emb_flush(kvd_store_t *base, int timeout_ms)
{
    kvd_embedded_t *store = store_embedded(base);
    uint64_t deadline = kvd_time_deadline_ns(timeout_ms);
    kvd_status_t status = KVD_OK;
    pthread_mutex_lock(&store->mu);
    while (store->writes_pending > 0) {
        if (deadline == KVD_DEADLINE_NEVER) {
            pthread_cond_wait(&store->idle_cv, &store->mu);
            continue;
        }
        struct timespec ts = {.tv_sec = (time_t)(deadline / KVD_NSEC_PER_SEC),
                              .tv_nsec = (long)(deadline % KVD_NSEC_PER_SEC)};
        if (pthread_cond_timedwait(&store->idle_cv, &store->mu, &ts) ==
                ETIMEDOUT &&
            store->writes_pending > 0) {
            status = KVD_ERR_TIMEOUT;
            break;
        }
    }
    pthread_mutex_unlock(&store->mu);
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

static kvd_status_t emb_stats(kvd_store_t *base, kvd_store_stats_t *out)
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

const kvd_store_ops_t kvd_store_embedded_ops = {
    .name = "embedded",
    .close = emb_close,
    .arena_ptr = emb_arena_ptr,
    .arena_hold = emb_arena_hold,
    .arena_unhold = emb_arena_unhold,
    .arena_generation = emb_arena_generation,
    .lease_ptr = emb_lease_ptr,
    .reservation_ptr = emb_reservation_ptr,
    .arena_export = emb_arena_export,
    .reserve = emb_reserve,
    .commit = emb_commit,
    .abort = emb_abort,
    .lookup = emb_lookup,
    .release = emb_release,
    .get_submit = emb_get_submit,
    .poll = emb_poll,
    .wait = emb_wait,
    .fd = emb_fd,
    .delete_keys = emb_delete,
    .scan = emb_scan,
    .tenant_set_quota = emb_tenant_set_quota,
    .flush = emb_flush,
    .stats = emb_stats,
};
