/*
 * The persistent index on LMDB (contract, record layout and durability rules
 * in index.h). One MDB_env with its unnamed database; keys are the raw
 * 48-byte kvd_store_key_t, values the 64-byte versioned record.
 *
 * Concurrency: LMDB lets readers run beside one writer without locks. Two
 * locks of ours sit around it. `write_mutex` serializes this process's
 * writers, so that the map-grow decision after MDB_MAP_FULL is taken by one
 * thread at a time. `map_lock` (an rwlock, writer-preferring so that a
 * resize is not starved by a stream of lookups) is held shared by every
 * live transaction, read or write, and exclusively by mdb_env_set_mapsize,
 * which LMDB allows only while no transaction of this process is live.
 * Lock order: write_mutex, then map_lock, then pool_mutex.
 *
 * Read transactions are recycled through a small pool: a released one is
 * mdb_txn_reset (it keeps its reader slot but pins no snapshot) and the next
 * reader mdb_txn_renew's it, so a lookup allocates nothing. MDB_NOTLS makes
 * that legal across threads.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lmdb.h>

#include "common/endian_int.h"
#include "common/failpoint_int.h"
#include "common/log_int.h"
#include "store/index.h"

_Static_assert(sizeof(kvd_store_key_t) == KVD_INDEX_KEY_BYTES,
               "the key struct is used as the LMDB key bytes");

#define INDEX_MAP_ALIGN (1ull << 20)
/* Reset read transactions kept for reuse; more readers than this at once
 * still work, their transactions are simply freed afterwards. */
#define INDEX_POOL_MAX 32
/* Bound on retries after MDB_MAP_RESIZED, which only another process's
 * growth can cause; more than a few in a row means something is wrong. */
#define INDEX_RESIZED_RETRIES 8
#define INDEX_LOG_INTERVAL_MS 1000

struct kvd_index {
    MDB_env *env;
    MDB_dbi dbi;
    uint64_t map_size_max;
    uint64_t map_size; /* atomic: read by query without map_lock */
    pthread_mutex_t write_mutex;
    pthread_rwlock_t map_lock;
    pthread_mutex_t pool_mutex;
    MDB_txn *pool[INDEX_POOL_MAX];
    size_t pool_len;
};

/* ------------------------------------------------------------------------ */
/* Error translation: the one place MDB_* and errno values become statuses */
/* ------------------------------------------------------------------------ */

static kvd_status_t index_status(int rc, const char *what)
{
    kvd_status_t status;

    switch (rc) {
    case MDB_SUCCESS: return KVD_OK;
    case MDB_NOTFOUND: return KVD_ERR_NOT_FOUND; /* a normal miss: no log */
    case MDB_MAP_FULL:
    case MDB_TXN_FULL:
    case MDB_DBS_FULL: status = KVD_ERR_NOSPACE; break;
    case MDB_READERS_FULL: status = KVD_ERR_BUSY; break;
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_INVALID:
    case MDB_VERSION_MISMATCH:
    case MDB_INCOMPATIBLE:
    case MDB_BAD_DBI: status = KVD_ERR_CORRUPT; break;
    case MDB_PANIC:
    case MDB_BAD_RSLOT:
    case MDB_BAD_TXN:
    case MDB_BAD_VALSIZE:
    case MDB_MAP_RESIZED:
    case MDB_TLS_FULL:
    case MDB_CURSOR_FULL:
    case MDB_PAGE_FULL:
    case MDB_KEYEXIST: status = KVD_ERR_INTERNAL; break;
    default:
        /* LMDB passes system errors through as positive errno values. */
        status = rc > 0 ? kvd_status_from_errno(rc) : KVD_ERR_INTERNAL;
        break;
    }
    if (status == KVD_ERR_NOSPACE || status == KVD_ERR_BUSY) {
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, INDEX_LOG_INTERVAL_MS,
                            "index: %s: %s (%d) -> %s", what, mdb_strerror(rc),
                            rc, kvd_status_str(status));
    } else {
        KVD_LOG_ERROR("index: %s: %s (%d) -> %s", what, mdb_strerror(rc), rc,
                      kvd_status_str(status));
    }
    return status;
}

/* ------------------------------------------------------------------------ */
/* Record format                                                            */
/* ------------------------------------------------------------------------ */

/* XXH3 over key || record[0..56): the key is part of what is checked, so a
 * valid record stored under the wrong key is caught too. */
static uint64_t record_check(const kvd_store_key_t *key, const uint8_t *rec)
{
    uint8_t buf[KVD_INDEX_KEY_BYTES + KVD_INDEX_RECORD_BYTES - 8];

    memcpy(buf, key, KVD_INDEX_KEY_BYTES);
    memcpy(buf + KVD_INDEX_KEY_BYTES, rec, KVD_INDEX_RECORD_BYTES - 8);
    return kvd_xxh3_64(buf, sizeof(buf));
}

static int entry_is_valid(const kvd_index_entry_t *e)
{
    if (e->tier != KVD_INDEX_TIER_HOST && e->tier != KVD_INDEX_TIER_DISK) {
        return 0;
    }
    if (e->size_bytes == 0) {
        return 0;
    }
    return e->tier != KVD_INDEX_TIER_HOST || e->file_id == 0;
}

kvd_status_t kvd_index_record_pack(const kvd_index_entry_t *entry,
                                   uint8_t record_out[KVD_INDEX_RECORD_BYTES])
{
    uint8_t rec[KVD_INDEX_RECORD_BYTES] = {0};

    if (entry == NULL || record_out == NULL || !entry_is_valid(entry)) {
        return KVD_ERR_INVALID;
    }
    rec[0] = KVD_INDEX_RECORD_VERSION;
    rec[1] = entry->tier;
    rec[2] = entry->codec_k;
    rec[3] = entry->codec_v;
    rec[4] = entry->flags;
    kvd_put_le32(rec + 8, entry->tenant_id);
    kvd_put_le32(rec + 12, entry->file_id);
    kvd_put_le64(rec + 16, entry->offset);
    kvd_put_le64(rec + 24, entry->size_bytes);
    kvd_put_le64(rec + 32, entry->checksum);
    kvd_put_le64(rec + 40, entry->created_unix_ms);
    kvd_put_le64(rec + 48, entry->last_access_unix_ms);
    kvd_put_le64(rec + 56, record_check(&entry->key, rec));
    memcpy(record_out, rec, sizeof(rec));
    return KVD_OK;
}

kvd_status_t kvd_index_record_unpack(const kvd_store_key_t *key,
                                     const void *bytes, size_t len,
                                     kvd_index_entry_t *entry_out)
{
    kvd_index_entry_t e;
    const uint8_t *rec = bytes;

    if (key == NULL || entry_out == NULL || (bytes == NULL && len > 0)) {
        return KVD_ERR_INVALID;
    }
    if (len != KVD_INDEX_RECORD_BYTES || rec[0] != KVD_INDEX_RECORD_VERSION) {
        return KVD_ERR_CORRUPT;
    }
    if (rec[5] != 0 || rec[6] != 0 || rec[7] != 0) {
        return KVD_ERR_CORRUPT;
    }
    if (kvd_get_le64(rec + 56) != record_check(key, rec)) {
        return KVD_ERR_CORRUPT;
    }
    memset(&e, 0, sizeof(e));
    e.key = *key;
    e.tier = rec[1];
    e.codec_k = rec[2];
    e.codec_v = rec[3];
    e.flags = rec[4];
    e.tenant_id = kvd_get_le32(rec + 8);
    e.file_id = kvd_get_le32(rec + 12);
    e.offset = kvd_get_le64(rec + 16);
    e.size_bytes = kvd_get_le64(rec + 24);
    e.checksum = kvd_get_le64(rec + 32);
    e.created_unix_ms = kvd_get_le64(rec + 40);
    e.last_access_unix_ms = kvd_get_le64(rec + 48);
    /* A matching check proves the bytes are what some writer produced, not
     * that the writer was right: validate the fields as well. */
    if (!entry_is_valid(&e)) {
        return KVD_ERR_CORRUPT;
    }
    *entry_out = e;
    return KVD_OK;
}

static void log_bad_record(const kvd_store_key_t *key, const char *what)
{
    KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_ERROR, INDEX_LOG_INTERVAL_MS,
                        "index: %s: undecodable record for key "
                        "%02x%02x%02x%02x/%02x%02x%02x%02x..",
                        what, key->ns.bytes[0], key->ns.bytes[1],
                        key->ns.bytes[2], key->ns.bytes[3], key->hash.bytes[0],
                        key->hash.bytes[1], key->hash.bytes[2],
                        key->hash.bytes[3]);
}

/* ------------------------------------------------------------------------ */
/* Map size                                                                 */
/* ------------------------------------------------------------------------ */

static uint64_t round_map(uint64_t bytes)
{
    if (bytes > UINT64_MAX - INDEX_MAP_ALIGN) {
        return UINT64_MAX & ~(INDEX_MAP_ALIGN - 1);
    }
    return (bytes + INDEX_MAP_ALIGN - 1) & ~(INDEX_MAP_ALIGN - 1);
}

static void map_size_refresh(kvd_index_t *idx)
{
    MDB_envinfo info;

    if (mdb_env_info(idx->env, &info) == 0) {
        __atomic_store_n(&idx->map_size, (uint64_t)info.me_mapsize,
                         __ATOMIC_RELAXED);
    }
}

/*
 * Doubles the map after MDB_MAP_FULL. Called by the writer holding
 * write_mutex and no transaction; returns an MDB code (MDB_MAP_FULL at the
 * cap).
 */
static int index_grow(kvd_index_t *idx)
{
    uint64_t cur, next;
    int rc;

    pthread_rwlock_wrlock(&idx->map_lock);
    cur = __atomic_load_n(&idx->map_size, __ATOMIC_RELAXED);
    if (cur >= idx->map_size_max) {
        rc = MDB_MAP_FULL;
        goto out;
    }
    next = cur > idx->map_size_max / 2 ? idx->map_size_max : cur * 2;
    rc = mdb_env_set_mapsize(idx->env, (size_t)next);
    if (rc == 0) {
        map_size_refresh(idx);
        KVD_LOG_INFO("index: map grown from %llu to %llu bytes",
                     (unsigned long long)cur, (unsigned long long)next);
    }
out:
    pthread_rwlock_unlock(&idx->map_lock);
    return rc;
}

/* Adopts a map grown by another process (MDB_MAP_RESIZED): size 0 tells
 * LMDB to take the size recorded in the file. */
static int index_adopt_map(kvd_index_t *idx)
{
    int rc;

    pthread_rwlock_wrlock(&idx->map_lock);
    rc = mdb_env_set_mapsize(idx->env, 0);
    if (rc == 0) {
        map_size_refresh(idx);
    }
    pthread_rwlock_unlock(&idx->map_lock);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Transaction runners                                                      */
/* ------------------------------------------------------------------------ */

/* Body of a transaction: returns an MDB code or a positive errno. */
typedef int (*index_txn_fn)(MDB_txn *txn, MDB_dbi dbi, void *arg);

/* Caller holds map_lock shared. */
static int reader_acquire(kvd_index_t *idx, MDB_txn **txn_out)
{
    MDB_txn *txn = NULL;
    int rc;

    pthread_mutex_lock(&idx->pool_mutex);
    if (idx->pool_len > 0) {
        txn = idx->pool[--idx->pool_len];
    }
    pthread_mutex_unlock(&idx->pool_mutex);
    if (txn != NULL) {
        rc = mdb_txn_renew(txn);
        if (rc != 0) {
            mdb_txn_abort(txn);
            return rc;
        }
    } else {
        rc = mdb_txn_begin(idx->env, NULL, MDB_RDONLY, &txn);
        if (rc != 0) {
            return rc;
        }
    }
    *txn_out = txn;
    return 0;
}

static void reader_release(kvd_index_t *idx, MDB_txn *txn)
{
    mdb_txn_reset(txn);
    pthread_mutex_lock(&idx->pool_mutex);
    if (idx->pool_len < INDEX_POOL_MAX) {
        idx->pool[idx->pool_len++] = txn;
        txn = NULL;
    }
    pthread_mutex_unlock(&idx->pool_mutex);
    if (txn != NULL) {
        mdb_txn_abort(txn);
    }
}

static kvd_status_t index_read(kvd_index_t *idx, index_txn_fn fn, void *arg,
                               const char *what)
{
    MDB_txn *txn;
    int rc;

    for (int attempt = 0;; attempt++) {
        pthread_rwlock_rdlock(&idx->map_lock);
        rc = reader_acquire(idx, &txn);
        if (rc == 0) {
            rc = fn(txn, idx->dbi, arg);
            reader_release(idx, txn);
        }
        pthread_rwlock_unlock(&idx->map_lock);
        if (rc != MDB_MAP_RESIZED || attempt >= INDEX_RESIZED_RETRIES) {
            break;
        }
        rc = index_adopt_map(idx);
        if (rc != 0) {
            break;
        }
    }
    return rc == 0 ? KVD_OK : index_status(rc, what);
}

/*
 * Runs `fn` in one write transaction and commits it, growing the map and
 * retrying the whole body on MDB_MAP_FULL. `failpoint` fails the transaction
 * just before commit. On any failure the transaction is aborted, so the
 * database is unchanged.
 */
static kvd_status_t index_write(kvd_index_t *idx, index_txn_fn fn, void *arg,
                                const char *failpoint, const char *what)
{
    MDB_txn *txn;
    int rc;
    int resized = 0;

    (void)failpoint; /* unused when failpoints are compiled out */
    pthread_mutex_lock(&idx->write_mutex);
    for (;;) {
        pthread_rwlock_rdlock(&idx->map_lock);
        rc = mdb_txn_begin(idx->env, NULL, 0, &txn);
        if (rc == 0) {
            rc = fn(txn, idx->dbi, arg);
            if (rc == 0) {
                rc = KVD_FAILPOINT(failpoint);
            }
            if (rc == 0) {
                rc = mdb_txn_commit(txn); /* frees txn, even on failure */
            } else {
                mdb_txn_abort(txn);
            }
        }
        pthread_rwlock_unlock(&idx->map_lock);
        if (rc == MDB_MAP_FULL) {
            rc = index_grow(idx);
            if (rc == 0) {
                continue;
            }
        } else if (rc == MDB_MAP_RESIZED && resized++ < INDEX_RESIZED_RETRIES) {
            rc = index_adopt_map(idx);
            if (rc == 0) {
                continue;
            }
        }
        break;
    }
    pthread_mutex_unlock(&idx->write_mutex);
    return rc == 0 ? KVD_OK : index_status(rc, what);
}

/* ------------------------------------------------------------------------ */
/* Open, close, sync                                                        */
/* ------------------------------------------------------------------------ */

static kvd_status_t index_locks_init(kvd_index_t *idx)
{
    pthread_rwlockattr_t attr;
    int err;

    err = pthread_mutex_init(&idx->write_mutex, NULL);
    if (err != 0) {
        goto err_write;
    }
    err = pthread_mutex_init(&idx->pool_mutex, NULL);
    if (err != 0) {
        goto err_pool;
    }
    err = pthread_rwlockattr_init(&attr);
    if (err != 0) {
        goto err_attr;
    }
    pthread_rwlockattr_setkind_np(&attr,
                                  PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    err = pthread_rwlock_init(&idx->map_lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    if (err != 0) {
        goto err_attr;
    }
    return KVD_OK;

err_attr:
    pthread_mutex_destroy(&idx->pool_mutex);
err_pool:
    pthread_mutex_destroy(&idx->write_mutex);
err_write:
    return index_status(err, "lock init");
}

static void index_locks_cleanup(kvd_index_t *idx)
{
    pthread_rwlock_destroy(&idx->map_lock);
    pthread_mutex_destroy(&idx->pool_mutex);
    pthread_mutex_destroy(&idx->write_mutex);
}

static int open_dbi(MDB_env *env, MDB_dbi *dbi_out)
{
    MDB_txn *txn;
    int rc;

    rc = mdb_txn_begin(env, NULL, 0, &txn);
    if (rc != 0) {
        return rc;
    }
    rc = mdb_dbi_open(txn, NULL, 0, dbi_out);
    if (rc != 0) {
        mdb_txn_abort(txn);
        return rc;
    }
    return mdb_txn_commit(txn);
}

kvd_status_t kvd_index_open(const char *dir, const kvd_index_config_t *cfg,
                            kvd_index_t **index_out)
{
    kvd_index_config_t c = {0};
    kvd_index_t *idx;
    kvd_status_t status;
    char *path = NULL;
    unsigned flags = MDB_NOSUBDIR | MDB_NOTLS | MDB_NORDAHEAD;
    int dead = 0;
    int rc;

    if (dir == NULL || index_out == NULL) {
        return KVD_ERR_INVALID;
    }
    if (cfg != NULL) {
        c = *cfg;
    }
    c.map_size_bytes = round_map(
        c.map_size_bytes != 0 ? c.map_size_bytes : KVD_INDEX_MAP_SIZE_DEFAULT);
    c.map_size_max_bytes =
        round_map(c.map_size_max_bytes != 0 ? c.map_size_max_bytes
                                            : KVD_INDEX_MAP_SIZE_MAX_DEFAULT);
    if (c.max_readers == 0) {
        c.max_readers = KVD_INDEX_MAX_READERS_DEFAULT;
    }
    if (c.map_size_bytes > c.map_size_max_bytes ||
        c.map_size_max_bytes > (uint64_t)SIZE_MAX) {
        return KVD_ERR_INVALID;
    }
    /* NOMETASYNC, not NOSYNC: each commit fdatasyncs its pages before its
     * meta page is written, so whatever subset of unsynced writes a power
     * loss keeps, the newest meta on disk points at durable pages. NOSYNC
     * kept that only if the file system wrote in order; under a power-loss
     * model the reopened index read pages past its end (SIGBUS) or pages a
     * later commit overwrote (index.h, durability contract). */
    if (!c.sync_commits) {
        flags |= MDB_NOMETASYNC;
    }

    idx = calloc(1, sizeof(*idx));
    if (idx == NULL) {
        return KVD_ERR_NOMEM;
    }
    idx->map_size_max = c.map_size_max_bytes;
    status = index_locks_init(idx);
    if (status != KVD_OK) {
        goto err_free;
    }
    if (asprintf(&path, "%s/%s", dir, KVD_INDEX_FILE_NAME) < 0) {
        path = NULL;
        status = KVD_ERR_NOMEM;
        goto err_locks;
    }
    rc = mdb_env_create(&idx->env);
    if (rc != 0) {
        status = index_status(rc, "env create");
        goto err_path;
    }
    rc = mdb_env_set_mapsize(idx->env, (size_t)c.map_size_bytes);
    if (rc == 0) {
        rc = mdb_env_set_maxreaders(idx->env, c.max_readers);
    }
    if (rc == 0) {
        rc = mdb_env_open(idx->env, path, flags, 0600);
    }
    if (rc != 0) {
        KVD_LOG_ERROR("index: cannot open %s", path);
        status = index_status(rc, "env open");
        goto err_env;
    }
    /* Slots of readers that were killed (kill -9) stay taken until someone
     * checks their pids; do it now so they cannot exhaust the table. */
    rc = mdb_reader_check(idx->env, &dead);
    if (rc != 0) {
        (void)index_status(rc, "reader check"); /* logged; not fatal */
    } else if (dead > 0) {
        KVD_LOG_INFO("index: reclaimed %d stale reader slots in %s", dead,
                     path);
    }
    rc = open_dbi(idx->env, &idx->dbi);
    if (rc != 0) {
        status = index_status(rc, "dbi open");
        goto err_env;
    }
    map_size_refresh(idx);
    free(path);
    *index_out = idx;
    return KVD_OK;

err_env:
    mdb_env_close(idx->env);
err_path:
    free(path);
err_locks:
    index_locks_cleanup(idx);
err_free:
    free(idx);
    return status;
}

void kvd_index_close(kvd_index_t *index)
{
    if (index == NULL) {
        return;
    }
    for (size_t i = 0; i < index->pool_len; i++) {
        mdb_txn_abort(index->pool[i]);
    }
    mdb_env_close(index->env);
    index_locks_cleanup(index);
    free(index);
}

kvd_status_t kvd_index_sync(kvd_index_t *index)
{
    int rc;

    if (index == NULL) {
        return KVD_ERR_INVALID;
    }
    rc = mdb_env_sync(index->env, 1);
    return rc == 0 ? KVD_OK : index_status(rc, "sync");
}

kvd_status_t kvd_index_query_map_size(kvd_index_t *index,
                                      uint64_t *map_size_out)
{
    if (index == NULL || map_size_out == NULL) {
        return KVD_ERR_INVALID;
    }
    *map_size_out = __atomic_load_n(&index->map_size, __ATOMIC_RELAXED);
    return KVD_OK;
}

/* ------------------------------------------------------------------------ */
/* Writers                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct put_args {
    const kvd_index_entry_t *entries;
    size_t num_entries;
} put_args_t;

static int put_body(MDB_txn *txn, MDB_dbi dbi, void *arg)
{
    const put_args_t *a = arg;
    uint8_t rec[KVD_INDEX_RECORD_BYTES];

    for (size_t i = 0; i < a->num_entries; i++) {
        MDB_val k = {KVD_INDEX_KEY_BYTES, (void *)&a->entries[i].key};
        MDB_val v = {sizeof(rec), rec};
        /* Validated by the caller before the transaction began. */
        (void)kvd_index_record_pack(&a->entries[i], rec);
        int rc = mdb_put(txn, dbi, &k, &v, 0);
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

kvd_status_t kvd_index_put_batch(kvd_index_t *index,
                                 const kvd_index_entry_t *entries,
                                 size_t num_entries)
{
    put_args_t a = {entries, num_entries};

    if (index == NULL || (entries == NULL && num_entries > 0)) {
        return KVD_ERR_INVALID;
    }
    for (size_t i = 0; i < num_entries; i++) {
        if (!entry_is_valid(&entries[i])) {
            return KVD_ERR_INVALID;
        }
    }
    if (num_entries == 0) {
        return KVD_OK;
    }
    return index_write(index, put_body, &a, "index.put", "put batch");
}

typedef struct raw_args {
    const kvd_store_key_t *key;
    const void *bytes;
    size_t len;
} raw_args_t;

static int raw_body(MDB_txn *txn, MDB_dbi dbi, void *arg)
{
    const raw_args_t *a = arg;
    MDB_val k = {KVD_INDEX_KEY_BYTES, (void *)a->key};
    MDB_val v = {a->len, (void *)a->bytes};

    return mdb_put(txn, dbi, &k, &v, 0);
}

kvd_status_t kvd_index_put_raw(kvd_index_t *index, const kvd_store_key_t *key,
                               const void *bytes, size_t len)
{
    raw_args_t a = {key, bytes, len};

    if (index == NULL || key == NULL || (bytes == NULL && len > 0)) {
        return KVD_ERR_INVALID;
    }
    return index_write(index, raw_body, &a, "index.put", "put raw");
}

typedef struct delete_args {
    const kvd_store_key_t *keys;
    size_t num_keys;
    size_t num_deleted;
} delete_args_t;

static int delete_body(MDB_txn *txn, MDB_dbi dbi, void *arg)
{
    delete_args_t *a = arg;

    /* Reset: a retry after map growth runs the body again from scratch. */
    a->num_deleted = 0;
    for (size_t i = 0; i < a->num_keys; i++) {
        MDB_val k = {KVD_INDEX_KEY_BYTES, (void *)&a->keys[i]};
        int rc = mdb_del(txn, dbi, &k, NULL);
        if (rc == MDB_NOTFOUND) {
            continue;
        }
        if (rc != 0) {
            return rc;
        }
        a->num_deleted++;
    }
    return 0;
}

kvd_status_t kvd_index_delete_batch(kvd_index_t *index,
                                    const kvd_store_key_t *keys,
                                    size_t num_keys, size_t *num_deleted_out)
{
    delete_args_t a = {keys, num_keys, 0};
    kvd_status_t status = KVD_OK;

    if (index == NULL || (keys == NULL && num_keys > 0)) {
        return KVD_ERR_INVALID;
    }
    if (num_keys > 0) {
        status =
            index_write(index, delete_body, &a, "index.delete", "delete batch");
    }
    if (status == KVD_OK && num_deleted_out != NULL) {
        *num_deleted_out = a.num_deleted;
    }
    return status;
}

typedef struct drop_args {
    const kvd_namespace_t *ns;
    uint64_t num_deleted;
} drop_args_t;

static int drop_body(MDB_txn *txn, MDB_dbi dbi, void *arg)
{
    drop_args_t *a = arg;
    kvd_store_key_t first;
    MDB_cursor *cur;
    MDB_val k, v;
    int rc;

    a->num_deleted = 0;
    memset(&first, 0, sizeof(first));
    first.ns = *a->ns;
    rc = mdb_cursor_open(txn, dbi, &cur);
    if (rc != 0) {
        return rc;
    }
    /* The namespace is the key prefix, so its records are one run starting
     * at (ns, 0...0). Each round seeks that start again rather than trusting
     * the cursor position after a delete, which LMDB leaves uninitialized
     * when the tree becomes empty. */
    for (;;) {
        k.mv_size = KVD_INDEX_KEY_BYTES;
        k.mv_data = &first;
        rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
        if (rc != 0) {
            break;
        }
        if (k.mv_size < KVD_INDEX_NS_BYTES ||
            memcmp(k.mv_data, a->ns->bytes, KVD_INDEX_NS_BYTES) != 0) {
            break;
        }
        rc = mdb_cursor_del(cur, 0);
        if (rc != 0) {
            break;
        }
        a->num_deleted++;
    }
    mdb_cursor_close(cur);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

kvd_status_t kvd_index_drop_namespace(kvd_index_t *index,
                                      const kvd_namespace_t *ns,
                                      uint64_t *num_deleted_out)
{
    drop_args_t a = {ns, 0};
    kvd_status_t status;

    if (index == NULL || ns == NULL) {
        return KVD_ERR_INVALID;
    }
    status =
        index_write(index, drop_body, &a, "index.delete", "drop namespace");
    if (status == KVD_OK && num_deleted_out != NULL) {
        *num_deleted_out = a.num_deleted;
    }
    return status;
}

/* ------------------------------------------------------------------------ */
/* Readers                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct get_args {
    const kvd_store_key_t *key;
    kvd_index_entry_t entry;
    kvd_status_t decode;
} get_args_t;

static int get_body(MDB_txn *txn, MDB_dbi dbi, void *arg)
{
    get_args_t *a = arg;
    MDB_val k = {KVD_INDEX_KEY_BYTES, (void *)a->key};
    MDB_val v;
    int rc;

    rc = mdb_get(txn, dbi, &k, &v);
    if (rc == 0) {
        /* Decode inside the transaction: v points into the map, valid only
         * while the snapshot is held. */
        a->decode =
            kvd_index_record_unpack(a->key, v.mv_data, v.mv_size, &a->entry);
    }
    return rc;
}

kvd_status_t kvd_index_get(kvd_index_t *index, const kvd_store_key_t *key,
                           kvd_index_entry_t *entry_out)
{
    get_args_t a;
    kvd_status_t status;

    if (index == NULL || key == NULL || entry_out == NULL) {
        return KVD_ERR_INVALID;
    }
    memset(&a, 0, sizeof(a));
    a.key = key;
    status = index_read(index, get_body, &a, "get");
    if (status != KVD_OK) {
        return status;
    }
    if (a.decode != KVD_OK) {
        log_bad_record(key, "get");
        return KVD_ERR_CORRUPT;
    }
    *entry_out = a.entry;
    return KVD_OK;
}

typedef struct prefix_args {
    const kvd_namespace_t *ns;
    const kvd_block_hash_t *hashes;
    size_t num_hashes;
    kvd_index_entry_t *entries;
    size_t matched;
} prefix_args_t;

static int prefix_body(MDB_txn *txn, MDB_dbi dbi, void *arg)
{
    prefix_args_t *a = arg;
    kvd_store_key_t key;
    kvd_index_entry_t e;
    MDB_val k = {KVD_INDEX_KEY_BYTES, &key};
    MDB_val v;
    int rc;

    a->matched = 0;
    key.ns = *a->ns;
    for (size_t i = 0; i < a->num_hashes; i++) {
        key.hash = a->hashes[i];
        rc = mdb_get(txn, dbi, &k, &v);
        if (rc == MDB_NOTFOUND) {
            break;
        }
        if (rc != 0) {
            return rc;
        }
        if (kvd_index_record_unpack(&key, v.mv_data, v.mv_size, &e) != KVD_OK) {
            log_bad_record(&key, "lookup");
            break;
        }
        if (a->entries != NULL) {
            a->entries[i] = e;
        }
        a->matched = i + 1;
    }
    return 0;
}

kvd_status_t
kvd_index_lookup_prefix(kvd_index_t *index, const kvd_namespace_t *ns,
                        const kvd_block_hash_t *hashes, size_t num_hashes,
                        kvd_index_entry_t *entries_out, size_t *matched_out)
{
    prefix_args_t a = {ns, hashes, num_hashes, entries_out, 0};
    kvd_status_t status = KVD_OK;

    if (index == NULL || ns == NULL || matched_out == NULL ||
        (hashes == NULL && num_hashes > 0)) {
        return KVD_ERR_INVALID;
    }
    if (num_hashes > 0) {
        status = index_read(index, prefix_body, &a, "lookup prefix");
    }
    if (status == KVD_OK) {
        *matched_out = a.matched;
    }
    return status;
}

typedef struct scan_args {
    const kvd_store_key_t *after;
    kvd_index_entry_t *entries;
    size_t capacity;
    size_t count;
    uint64_t num_corrupt;
} scan_args_t;

static int scan_body(MDB_txn *txn, MDB_dbi dbi, void *arg)
{
    scan_args_t *a = arg;
    kvd_store_key_t key;
    MDB_cursor *cur;
    MDB_val k, v;
    int rc;

    a->count = 0;
    a->num_corrupt = 0;
    rc = mdb_cursor_open(txn, dbi, &cur);
    if (rc != 0) {
        return rc;
    }
    if (a->after == NULL) {
        rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
    } else {
        k.mv_size = KVD_INDEX_KEY_BYTES;
        k.mv_data = (void *)a->after;
        rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
        /* SET_RANGE lands on `after` itself when it still exists. */
        if (rc == 0 && k.mv_size == KVD_INDEX_KEY_BYTES &&
            memcmp(k.mv_data, a->after, KVD_INDEX_KEY_BYTES) == 0) {
            rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
        }
    }
    while (rc == 0 && a->count < a->capacity) {
        if (k.mv_size == KVD_INDEX_KEY_BYTES) {
            memcpy(&key, k.mv_data, KVD_INDEX_KEY_BYTES);
        }
        if (k.mv_size != KVD_INDEX_KEY_BYTES ||
            kvd_index_record_unpack(&key, v.mv_data, v.mv_size,
                                    &a->entries[a->count]) != KVD_OK) {
            if (k.mv_size == KVD_INDEX_KEY_BYTES) {
                log_bad_record(&key, "scan");
            }
            a->num_corrupt++;
        } else {
            a->count++;
        }
        rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
    }
    mdb_cursor_close(cur);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

kvd_status_t kvd_index_scan(kvd_index_t *index, const kvd_store_key_t *after,
                            kvd_index_entry_t *entries_out, size_t capacity,
                            size_t *count_out, uint64_t *num_corrupt_out)
{
    scan_args_t a = {after, entries_out, capacity, 0, 0};
    kvd_status_t status;

    if (index == NULL || entries_out == NULL || count_out == NULL ||
        capacity == 0) {
        return KVD_ERR_INVALID;
    }
    status = index_read(index, scan_body, &a, "scan");
    if (status != KVD_OK) {
        return status;
    }
    *count_out = a.count;
    if (num_corrupt_out != NULL) {
        *num_corrupt_out = a.num_corrupt;
    }
    return KVD_OK;
}

static int count_body(MDB_txn *txn, MDB_dbi dbi, void *arg)
{
    MDB_stat st;
    int rc = mdb_stat(txn, dbi, &st);

    if (rc == 0) {
        *(uint64_t *)arg = st.ms_entries;
    }
    return rc;
}

kvd_status_t kvd_index_count(kvd_index_t *index, uint64_t *count_out)
{
    uint64_t n = 0;
    kvd_status_t status;

    if (index == NULL || count_out == NULL) {
        return KVD_ERR_INVALID;
    }
    status = index_read(index, count_body, &n, "count");
    if (status == KVD_OK) {
        *count_out = n;
    }
    return status;
}
