/*
 * The embedded store (include/kvdepot/store.h): ties the arena, the two
 * object tables, the NVMe tier and the index together. This file holds the
 * settings, open and close, arena access and the ops table
 * (kvd_store_embedded_ops, store/ops.h) through which every store.h call
 * reaches the engine; the calls themselves are in store_save.c (reserve,
 * commit, abort, eviction), store_load.c (lookup, release, gets) and
 * store_manage.c (delete, scan, flush, stats). The I/O thread that moves
 * bytes to and from NVMe is in store_io.c, and the structure all share in
 * store_int.h.
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
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "common/time_int.h"
#include "store/engine.h"
#include "store/store_int.h"

_Static_assert(sizeof(kvd_store_key_t) == 48, "the one key type is 48 bytes");

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
     "daemon mode: the kvdepotd socket, unix:PATH; or tcp:HOST:PORT, the "
     "daemon's server.tcp_address, for the operator calls only (stats, "
     "lookup, evict, admin: no arena is shared over TCP)",
     kvd_config_parse_string, STORE_OFF(address), 0, 0, NULL},
    {"store.token_file", "",
     "daemon mode over tcp: file holding the bearer token the daemon wants "
     "(its server.token or a tenant's)",
     kvd_config_parse_string, STORE_OFF(token_file), 0, 0, NULL},
    {"store.tls_ca", "",
     "daemon mode over tcp: PEM file of the CA that signed the daemon's "
     "certificate (server.tls_cert); empty: plain TCP",
     kvd_config_parse_string, STORE_OFF(tls_ca), 0, 0, NULL},
    {"store.tls_cert", "",
     "daemon mode over tcp with TLS: PEM certificate of this client, signed "
     "by the daemon's server.tls_client_ca",
     kvd_config_parse_string, STORE_OFF(tls_cert), 0, 0, NULL},
    {"store.tls_key", "",
     "daemon mode over tcp with TLS: PEM private key of store.tls_cert (mode "
     "0600)",
     kvd_config_parse_string, STORE_OFF(tls_key), 0, 0, NULL},
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
    {"store.pin_max_bytes", "0",
     "bytes of the host arena kvd_store_pin may keep from eviction (0: half "
     "of store.arena_size); a pin past it is refused",
     kvd_config_parse_size, STORE_OFF(pin_max_bytes), 0, 0, NULL},
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
    {"store.stop_flush_timeout", "30s",
     "close: how long writing the arena's objects to NVMe may take, so a "
     "restart finds them (0: not written)",
     kvd_config_parse_duration_ms, STORE_OFF(stop_flush_ms), 0, 3600000, NULL},
    {"store.reserve_timeout", "100ms",
     "how long reserve waits for write-back to free arena slots",
     kvd_config_parse_duration_ms, STORE_OFF(reserve_timeout_ms), 0, 60000,
     NULL},
    {"store.part_timeout", "30s",
     "an object written in parts (tensor-parallel ranks) whose parts have "
     "not all committed this long after the first reserved it is abandoned",
     kvd_config_parse_duration_ms, STORE_OFF(part_timeout_ms), 1, 3600000,
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

/* The arena's sizes as kvd_arena_create checks them (store/arena.c), so a
 * configuration check refuses what the open would. */
static kvd_status_t store_check_arena(const kvd_arena_config_t *a, char *err,
                                      size_t err_len)
{
    if (a->chunk_bytes == 0 || a->chunk_bytes % KVD_ARENA_SLOT_ALIGN != 0 ||
        a->chunk_bytes > KVD_ARENA_CHUNK_BYTES_MAX) {
        kvd_config_err(err, err_len,
                       "store.arena_chunk: %llu bytes; want a multiple of %u "
                       "of at most 1 GiB",
                       (unsigned long long)a->chunk_bytes,
                       KVD_ARENA_SLOT_ALIGN);
        return KVD_ERR_RANGE;
    }
    if (a->size_bytes < a->chunk_bytes) {
        kvd_config_err(err, err_len,
                       "store.arena_size: %llu bytes is less than one "
                       "store.arena_chunk (%llu bytes)",
                       (unsigned long long)a->size_bytes,
                       (unsigned long long)a->chunk_bytes);
        return KVD_ERR_RANGE;
    }
    return KVD_OK;
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
    if (s == KVD_OK && cfg->mode != STORE_MODE_DAEMON) {
        s = store_check_arena(&cfg->arena, err, err_len);
    }
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
        memcpy(out->token_file, cfg->token_file, sizeof out->token_file);
        memcpy(out->tls_ca, cfg->tls_ca, sizeof out->tls_ca);
        memcpy(out->tls_cert, cfg->tls_cert, sizeof out->tls_cert);
        memcpy(out->tls_key, cfg->tls_key, sizeof out->tls_key);
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

/* fsyncs directory `path`, and its parent when `parent` is set. Only an
 * I/O error fails: a directory this process may not open (a parent without
 * read permission) or a file system that cannot sync directories is logged
 * and left as it was before this sync existed. */
static kvd_status_t store_dir_sync(const char *path, bool parent)
{
    char dir[KVD_CONFIG_STRING_MAX + 4];
    snprintf(dir, sizeof dir, "%s%s", path, parent ? "/.." : "");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) {
        int e = errno;
        if (fd >= 0) {
            close(fd);
        }
        if (e == EIO) {
            KVD_LOG_ERROR("store: fsync of directory %s: %s", dir, strerror(e));
            return KVD_ERR_IO;
        }
        KVD_LOG_WARN("store: cannot fsync directory %s (%s): the names of "
                     "files created there may not survive a power loss",
                     dir, strerror(e));
        return KVD_OK;
    }
    close(fd);
    return KVD_OK;
}

/* Makes the names of the tier's files (and of its directory) durable: a
 * file's own fdatasync does not, so after a power loss the data files or
 * the index created by this open could vanish with every object flushed
 * into them. */
static kvd_status_t store_disk_names_sync(kvd_embedded_t *st)
{
    kvd_status_t status = store_dir_sync(st->cfg.nvme.path, false);
    return status == KVD_OK ? store_dir_sync(st->cfg.nvme.path, true) : status;
}

static kvd_status_t store_disk_open(kvd_embedded_t *st, char *err,
                                    size_t err_len)
{
    kvd_status_t status = kvd_nvme_open(&st->cfg.nvme, &st->nvme);
    if (status != KVD_OK) {
        store_err(err, err_len,
                  status == KVD_ERR_NOSPACE
                      ? "store.disk_size: NVMe tier larger than the free "
                        "space of its file system (the log has both sizes)"
                      : "store.disk_path: NVMe tier",
                  status);
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
    status = store_disk_names_sync(st);
    if (status != KVD_OK) {
        store_err(err, err_len, "store.disk_path: directory sync", status);
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
    store_parts_free(st);
    pthread_cond_destroy(&st->idle_cv);
    pthread_cond_destroy(&st->space_cv);
    pthread_cond_destroy(&st->work_cv);
    pthread_mutex_destroy(&st->mu);
    pthread_mutex_destroy(&st->ev_mu);
    free(st->ev);
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

/* Partitions of 0 bytes take an equal share of store.arena_size: with n
 * of them and c whole chunks, each gets c / (n + 1) chunks and the main
 * arena keeps the rest, so the arena's memory stays store.arena_size.
 * KVD_ERR_RANGE when a share would be under one chunk. */
static kvd_status_t store_share_parts(kvd_arena_config_t *a, char *err,
                                      size_t err_len)
{
    uint32_t n_share = 0;
    for (uint32_t i = 0; i < a->num_parts; i++) {
        n_share += a->part_bytes[i] == 0;
    }
    if (n_share == 0) {
        return KVD_OK;
    }
    uint64_t chunks = a->chunk_bytes == 0 ? 0 : a->size_bytes / a->chunk_bytes;
    uint64_t share = chunks / (n_share + 1u);
    if (share == 0) {
        kvd_config_err(err, err_len,
                       "store.arena_size: %llu whole chunks of "
                       "store.arena_chunk cannot give %u tenants and the main "
                       "arena one chunk each (server.tenant_arena_size=auto); "
                       "give a larger arena, a tenant_arena_size, or "
                       "tenant_arena_size=shared",
                       (unsigned long long)chunks, n_share);
        return KVD_ERR_RANGE;
    }
    for (uint32_t i = 0; i < a->num_parts; i++) {
        if (a->part_bytes[i] == 0) {
            a->part_bytes[i] = share * a->chunk_bytes;
        }
    }
    a->size_bytes = (chunks - share * n_share) * a->chunk_bytes;
    return KVD_OK;
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
    return store_share_parts(&st->cfg.arena, err, err_len);
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
    pthread_mutex_init(&st->ev_mu, NULL);
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
    if (st->sight == NULL || store_parts_init(st) != KVD_OK) {
        status = KVD_ERR_NOMEM;
        goto err;
    }
    status = kvd_arena_create(&st->cfg.arena, &st->arena);
    if (status != KVD_OK) {
        char what[200];
        snprintf(what, sizeof what, "%s: arena%s",
                 st->num_part_tenants > 0
                     ? "store.arena_size and server.tenant_arenas"
                     : "store.arena_size",
                 status == KVD_ERR_NOMEM
                     ? " larger than the memory available to this process "
                       "(the log has both sizes)"
                     : "");
        store_err(err, err_len, what, status);
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

/* The graceful stop's write-back of the arena (store.stop_flush_timeout),
 * so that a store reopened on the same directory finds its objects. */
static void store_stop_flush(kvd_embedded_t *st)
{
    if (st->nvme == NULL || st->cfg.stop_flush_ms == 0) {
        return;
    }
    uint64_t t0 = kvd_time_now_ns();
    uint64_t before = store_host_only_count(st);
    int ms = st->cfg.stop_flush_ms > INT32_MAX ? INT32_MAX
                                               : (int)st->cfg.stop_flush_ms;
    kvd_status_t s = store_flush(st, ms, NULL);
    uint64_t left = store_host_only_count(st);
    uint64_t took = (kvd_time_now_ns() - t0) / KVD_NSEC_PER_MSEC;
    uint64_t written = before > left ? before - left : 0;
    if (s == KVD_OK && left == 0) {
        KVD_LOG_INFO("store: stop: %llu objects written to NVMe in %llu ms; "
                     "none left in the arena only",
                     (unsigned long long)written, (unsigned long long)took);
    } else {
        KVD_LOG_WARN("store: stop: %llu objects written to NVMe in %llu ms; "
                     "%llu left in the arena only, lost (%s)",
                     (unsigned long long)written, (unsigned long long)took,
                     (unsigned long long)left, kvd_status_str(s));
    }
}

static void emb_close(kvd_store_t *base)
{
    kvd_embedded_t *st = store_embedded(base);
    store_stop_flush(st);
    store_free(st);
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
    .reserve = store_op_reserve,
    .commit = store_op_commit,
    .abort = store_op_abort,
    .reserve_part = store_op_reserve_part,
    .end_part = store_op_end_part,
    .lookup = store_op_lookup,
    .release = store_op_release,
    .get_submit = store_op_get_submit,
    .poll = store_op_poll,
    .wait = store_op_wait,
    .fd = store_op_fd,
    .delete_keys = store_op_delete,
    .pin = store_op_pin,
    .scan = store_op_scan,
    .tenant_set_quota = store_op_tenant_set_quota,
    .flush = store_op_flush,
    .stats = store_op_stats,
    .events_enable = store_op_events_enable,
    .take_events = store_op_take_events,
    .events_watch = store_op_events_watch,
};
