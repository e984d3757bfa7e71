/*
 * Persistent object index (store/README.md): key -> where an object lives
 * (tier, arena slot or NVMe extent), its size, checksum, codecs, tenant and
 * timestamps, kept in LMDB. It is the store's persistent truth: at startup
 * the store rebuilds its in-memory tables from kvd_index_scan(), and an NVMe
 * object exists only if its record does.
 *
 * This file is the only place in kvdepot that includes lmdb.h (in index.c).
 *
 * Key: 48 raw bytes, the 16-byte namespace digest then the 32-byte block
 * hash. LMDB orders keys with memcmp, so a namespace is one contiguous key
 * range (kvd_index_drop_namespace walks it with one cursor).
 *
 * Value: one fixed-size record, little-endian, version byte first
 * (KVD_INDEX_RECORD_BYTES = 64):
 *
 *   off size field
 *     0    1 version              KVD_INDEX_RECORD_VERSION (1)
 *     1    1 tier                 1 = host arena, 2 = NVMe
 *     2    1 codec_k              codec id of the K planes (opaque here)
 *     3    1 codec_v              codec id of the V planes (opaque here)
 *     4    1 flags                store-defined bits (opaque here)
 *     5    3 reserved             zero
 *     8    4 tenant_id
 *    12    4 file_id              NVMe file index; 0 for the host tier
 *    16    8 offset               NVMe byte offset, or arena slot index
 *    24    8 size_bytes           object size, > 0
 *    32    8 checksum             XXH3-64 of the whole stored object
 *    40    8 created_unix_ms
 *    48    8 last_access_unix_ms
 *    56    8 record_check         XXH3-64 of (48-byte key || bytes 0..55)
 *
 * record_check binds the record to its key, so a torn, overwritten or
 * misplaced record decodes as KVD_ERR_CORRUPT instead of pointing the store
 * at the wrong extent. A later format bumps the version byte; this version
 * rejects every other version.
 *
 * Durability contract. The environment is opened with MDB_NOMETASYNC
 * (without MDB_WRITEMAP): each commit writes its pages with pwrite() and
 * fdatasyncs them, then writes its meta page without a sync, before the
 * put/delete call returns (one fdatasync per batch: 8-10 k records/s in
 * batches of 32 on the 2-core development VM, against 83-88 k with the
 * MDB_NOSYNC used before, which a power loss could corrupt: a meta page
 * could reach the disk before the pages it points at;
 * tests/integration/test_store_powercut.c):
 *   - After kvd_index_put_batch / kvd_index_delete_batch /
 *     kvd_index_drop_namespace returns KVD_OK, the whole batch is visible to
 *     every later reader and survives a crash of this process (kill -9,
 *     abort): its pages are in the kernel page cache.
 *   - It survives a kernel crash or power loss only once kvd_index_sync()
 *     has returned KVD_OK after it, or the next commit has returned (which
 *     syncs the file, this meta page included), or at once when
 *     cfg.sync_commits is set. Before that, such a failure may lose the
 *     most recent batch; whatever subset of unsynced writes the disk keeps,
 *     the newest meta page on it points at synced pages, so the database
 *     opens consistent.
 *   - A batch is one LMDB transaction: after any crash it is present whole
 *     or absent whole, never torn.
 * The store must therefore (1) make an NVMe extent's data durable, (2) put
 * its record, (3) call kvd_index_sync() before it reports the object as
 * committed to anything that outlives a power loss. Deletes should be
 * synced before an extent is reused, so a reopened index never points at
 * bytes that were overwritten.
 *
 * Threading: every function is thread-safe on one kvd_index_t, except
 * kvd_index_close. Writers (put, delete, drop) are serialized inside the
 * index; readers (get, lookup_prefix, scan, count) never wait for a writer:
 * each runs in its own MDB_RDONLY snapshot. A reader or writer waits only
 * while the map is being grown (rare, milliseconds). Read transactions are
 * pooled (mdb_txn_reset/renew, MDB_NOTLS), so a lookup allocates nothing;
 * each pooled or running reader holds one LMDB reader slot, at most
 * cfg.max_readers in all, including other processes that open the same
 * file. A process must open a given directory at most once at a time
 * (LMDB's rule), and must not use an index across fork().
 *
 * Map size: LMDB needs a fixed mapping; it starts at cfg.map_size_bytes
 * (address space, not disk: the file grows only as pages are used). When a
 * write transaction finds the map full, the index aborts it, doubles the map
 * (waiting for this process's readers to leave: mdb_env_set_mapsize needs
 * no live transaction here) and retries the batch, up to
 * cfg.map_size_max_bytes, beyond which the batch fails with
 * KVD_ERR_NOSPACE and leaves the index unchanged. A map grown by another
 * process (MDB_MAP_RESIZED) is adopted the same way.
 *
 * Errors: every LMDB and errno code is translated, and logged with the LMDB
 * message, in one function of index.c. Failpoints: "index.put" (put
 * batches), "index.delete" (delete batches and namespace drops) fail the
 * transaction before commit, so the index is unchanged.
 *
 * Internal: not exported from libkvdepot.so.
 */
#ifndef KVD_STORE_INDEX_H
#define KVD_STORE_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "kvdepot/common.h"
#include "kvdepot/store.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVD_INDEX_NS_BYTES 16
#define KVD_INDEX_KEY_BYTES (KVD_INDEX_NS_BYTES + KVD_SHA256_BYTES)
#define KVD_INDEX_RECORD_BYTES 64
#define KVD_INDEX_RECORD_VERSION 1

#define KVD_INDEX_MAP_SIZE_DEFAULT (64ull << 20)
#define KVD_INDEX_MAP_SIZE_MAX_DEFAULT (64ull << 30)
#define KVD_INDEX_MAX_READERS_DEFAULT 126u

/* Name of the LMDB data file inside the index directory; LMDB keeps its
 * reader table beside it as "index.mdb-lock". */
#define KVD_INDEX_FILE_NAME "index.mdb"

/* The index key is kvd_store_key_t (include/kvdepot/store.h): byte arrays
 * only, so the struct is exactly 48 bytes and is used as the LMDB key as it
 * is. */

typedef enum kvd_index_tier {
    KVD_INDEX_TIER_HOST = 1, /* location.offset = arena slot index */
    KVD_INDEX_TIER_DISK = 2  /* location = (file_id, byte offset) */
} kvd_index_tier_t;

/* One object's record, decoded. */
typedef struct kvd_index_entry {
    kvd_store_key_t key;
    uint8_t tier;    /* kvd_index_tier_t */
    uint8_t codec_k; /* codec ids, stored verbatim */
    uint8_t codec_v;
    uint8_t flags; /* store-defined, stored verbatim */
    uint32_t tenant_id;
    uint32_t file_id; /* NVMe file index; must be 0 for the host tier */
    uint64_t offset;  /* NVMe byte offset or arena slot index */
    uint64_t size_bytes;
    uint64_t checksum; /* XXH3-64 of the whole object */
    uint64_t created_unix_ms;
    uint64_t last_access_unix_ms;
} kvd_index_entry_t;

typedef struct kvd_index_config {
    uint64_t map_size_bytes;     /* initial map; 0: 64 MiB */
    uint64_t map_size_max_bytes; /* growth cap; 0: 64 GiB */
    unsigned max_readers;        /* LMDB reader slots; 0: 126 */
    int sync_commits;            /* nonzero: fsync every commit (~0.3 ms) */
} kvd_index_config_t;

typedef struct kvd_index kvd_index_t;

/*
 * Opens (creating when absent) the index in directory `dir`, which must
 * exist; the files are dir/index.mdb and dir/index.mdb-lock. `cfg` may be
 * NULL for the defaults; map sizes are rounded up to 1 MiB, and an existing
 * file larger than cfg.map_size_bytes keeps its size. Reader slots left by
 * processes that died are reclaimed. Both arguments are borrowed for the
 * call. Errors: KVD_ERR_INVALID (NULL argument, map_size_bytes >
 * map_size_max_bytes), KVD_ERR_NOT_FOUND (no such directory), KVD_ERR_CORRUPT
 * (not an LMDB file, or a different LMDB version), KVD_ERR_NOMEM, KVD_ERR_IO.
 * Thread: any; the index is then shared by any number of threads.
 */
kvd_status_t kvd_index_open(const char *dir, const kvd_index_config_t *cfg,
                            kvd_index_t **index_out);

/*
 * Closes the index and frees it; NULL is accepted. Does not sync: committed
 * batches stay as durable as the contract above says (call kvd_index_sync
 * first for power-loss durability). No other call on `index` may be running
 * or follow.
 */
void kvd_index_close(kvd_index_t *index);

/*
 * Forces every batch committed so far by this process to stable storage
 * (mdb_env_sync, fsync). Blocks for the disk (about 0.3 ms to tens of ms).
 * Errors: KVD_ERR_IO, KVD_ERR_NOSPACE. Thread: any; runs concurrently with
 * readers and writers (batches committed during the call may or may not be
 * covered).
 */
kvd_status_t kvd_index_sync(kvd_index_t *index);

/*
 * Inserts or replaces `num_entries` records in ONE write transaction: all of
 * them or none. `entries` is borrowed for the call; a key given twice keeps
 * the last record. num_entries 0 is a no-op. Every entry is validated before
 * the transaction begins. Errors: KVD_ERR_INVALID (NULL pointer with
 * num_entries > 0, tier not host/disk, size_bytes 0, host entry with
 * file_id != 0), KVD_ERR_NOSPACE (map_size_max reached, or the disk is
 * full), KVD_ERR_IO, KVD_ERR_CORRUPT; on any error the index is unchanged.
 * Thread: any; writers run one at a time.
 */
kvd_status_t kvd_index_put_batch(kvd_index_t *index,
                                 const kvd_index_entry_t *entries,
                                 size_t num_entries);

/*
 * Deletes `num_keys` keys in ONE write transaction; absent keys are not an
 * error. Writes how many records were deleted into *num_deleted_out (may be
 * NULL). Errors and thread: as kvd_index_put_batch.
 */
kvd_status_t kvd_index_delete_batch(kvd_index_t *index,
                                    const kvd_store_key_t *keys,
                                    size_t num_keys, size_t *num_deleted_out);

/*
 * Deletes every record of namespace `ns` in one write transaction, and
 * writes how many into *num_deleted_out (may be NULL). Other namespaces are
 * untouched. Errors and thread: as kvd_index_delete_batch. Deleting also
 * needs free pages (LMDB copies each page it changes, and pages freed in a
 * transaction are reusable only after it commits), so at the map cap a
 * large drop can fail with KVD_ERR_NOSPACE; smaller delete batches then
 * still succeed.
 */
kvd_status_t kvd_index_drop_namespace(kvd_index_t *index,
                                      const kvd_namespace_t *ns,
                                      uint64_t *num_deleted_out);

/*
 * Reads the record of `key` into *entry_out. Errors: KVD_ERR_INVALID (NULL
 * argument), KVD_ERR_NOT_FOUND, KVD_ERR_CORRUPT (the stored bytes fail
 * validation; logged), KVD_ERR_BUSY (no free reader slot), KVD_ERR_IO.
 * Thread: any; never waits for a writer.
 */
kvd_status_t kvd_index_get(kvd_index_t *index, const kvd_store_key_t *key,
                           kvd_index_entry_t *entry_out);

/*
 * Finds the longest prefix of `hashes[0..num_hashes)` stored under namespace
 * `ns`, in one read snapshot: the first absent hash ends the prefix (a
 * record that fails validation also ends it, and is logged, rate-limited,
 * so that a bad record is never served). Writes the records of the prefix
 * into entries_out[0..matched) when `entries_out` is not NULL (it must hold
 * num_hashes entries; on error its contents are unspecified) and the prefix
 * length into *matched_out. Errors: KVD_ERR_INVALID (NULL ns, matched_out,
 * or hashes with num_hashes > 0), KVD_ERR_BUSY, KVD_ERR_IO. Thread: as
 * kvd_index_get.
 */
kvd_status_t
kvd_index_lookup_prefix(kvd_index_t *index, const kvd_namespace_t *ns,
                        const kvd_block_hash_t *hashes, size_t num_hashes,
                        kvd_index_entry_t *entries_out, size_t *matched_out);

/*
 * Pages through every record in key order, for rebuilding in-memory state.
 * Each call is one read snapshot: it fills entries_out[0..capacity) with
 * the records whose key is strictly greater than *after (from the first key
 * when `after` is NULL) and writes their number into *count_out; fewer than
 * `capacity` means the end was reached. Continue with `after` = the key of
 * the last entry returned (`after` may point into entries_out: it is read
 * before anything is written). Records that fail validation are skipped, logged
 * (rate-limited) and counted into *num_corrupt_out (may be NULL). Batches
 * committed between calls may or may not be seen. Errors: KVD_ERR_INVALID
 * (NULL entries_out or count_out, capacity 0), KVD_ERR_BUSY, KVD_ERR_IO.
 * Thread: as kvd_index_get.
 */
kvd_status_t kvd_index_scan(kvd_index_t *index, const kvd_store_key_t *after,
                            kvd_index_entry_t *entries_out, size_t capacity,
                            size_t *count_out, uint64_t *num_corrupt_out);

/* Writes the number of records (valid or not) into *count_out. Errors and
 * thread: as kvd_index_get. */
kvd_status_t kvd_index_count(kvd_index_t *index, uint64_t *count_out);

/* Writes the current map size in bytes into *map_size_out (tests, stats).
 * Thread: any. */
kvd_status_t kvd_index_query_map_size(kvd_index_t *index,
                                      uint64_t *map_size_out);

/*
 * Encodes `entry` into the 64-byte record format above. KVD_ERR_INVALID for
 * the entries kvd_index_put_batch rejects. Pure function; thread-safe.
 */
kvd_status_t kvd_index_record_pack(const kvd_index_entry_t *entry,
                                   uint8_t record_out[KVD_INDEX_RECORD_BYTES]);

/*
 * Decodes `len` untrusted bytes stored under `key`: checks the length,
 * version, tier, reserved bytes, size, host/file_id rule and record_check.
 * KVD_ERR_CORRUPT for anything else (not logged here), KVD_ERR_INVALID for
 * NULL arguments. Pure function; thread-safe; the fuzz target's entry point.
 */
kvd_status_t kvd_index_record_unpack(const kvd_store_key_t *key,
                                     const void *bytes, size_t len,
                                     kvd_index_entry_t *entry_out);

/*
 * Stores `len` bytes verbatim as the value of `key`, bypassing encoding, in
 * its own transaction. For tests that need a damaged record on disk; the
 * store never calls it. Errors: as kvd_index_put_batch.
 */
kvd_status_t kvd_index_put_raw(kvd_index_t *index, const kvd_store_key_t *key,
                               const void *bytes, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* KVD_STORE_INDEX_H */
