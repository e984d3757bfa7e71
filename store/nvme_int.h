/*
 * NVMe tier (L2): preallocated O_DIRECT files, an extent allocator and
 * asynchronous reads and writes (store/README.md).
 *
 * Files: `num_files` files named "kvd-data-NNN.dat" (NNN = 000, 001, ...)
 * in directory cfg.path, each fallocate()d to file_bytes and opened
 * O_RDWR | O_DIRECT | O_CLOEXEC. Existing files are reused as they are
 * (their contents are whatever the index says); a file shorter than
 * file_bytes is extended, a longer one is used up to file_bytes.
 *
 * Extents: the files form one address space of 4 KiB blocks. An extent id
 * is the number of its first block in that space: file = id /
 * blocks_per_file, byte offset in the file = (id % blocks_per_file) * 4096.
 * An extent never spans two files. Ids are uint32, so the tier addresses at
 * most 16 TiB; KVD_NVME_EXTENT_INVALID is never a valid id. The allocator
 * keeps only free space (nothing persistent): at open every block is free,
 * and the store marks the extents its index records (kvd_nvme_extent_mark)
 * before it allocates anything. Allocation finds a contiguous run of
 * blocks; it fails with KVD_ERR_NOSPACE only when no run of the size is
 * free. Freed neighbours coalesce, so equal-sized objects never fragment.
 *
 * I/O: an operation moves `len` bytes (a multiple of 4096, buffer 4096-byte
 * aligned) between memory and an extent. Two engines, chosen at open:
 *   io_uring  one ring of cfg.queue_depth entries; submissions are batched
 *             (one io_uring_submit per kvd_nvme_submit call); buffers
 *             registered with kvd_nvme_buffers_register are used with
 *             READ_FIXED / WRITE_FIXED (no page pinning per I/O); a
 *             dedicated completion thread reaps CQEs.
 *   threads   a pool of cfg.threads threads doing pread/pwrite, used when
 *             cfg.engine is "threads", or when it is "auto" and io_uring
 *             cannot be set up (old kernel, seccomp, failpoint
 *             "nvme.uring_init"); the fallback is logged once at WARN.
 * Short transfers are continued until the whole length moved or an error
 * occurs. Each accepted operation completes exactly once: its `done`
 * callback runs on an internal thread (the completion thread or a pool
 * thread) with the result. Callbacks must be short and must not call
 * kvd_nvme_close; they may call kvd_nvme_submit.
 *
 * Durability: a completed write is in the device (O_DIRECT) but new blocks
 * of a preallocated file may need their metadata flushed to survive power
 * loss; kvd_nvme_sync() (fdatasync on every file) does that. A process
 * crash loses nothing that completed.
 *
 * Failpoints: "nvme.open" (open/mkdir of a file), "nvme.fallocate",
 * "nvme.uring_init" (io_uring setup; "auto" falls back to threads),
 * "nvme.write" and "nvme.read" (evaluated once per operation, before it is
 * issued; the operation completes with the injected errno translated, e.g.
 * EIO -> KVD_ERR_IO, ENOSPC -> KVD_ERR_NOSPACE), "nvme.sync".
 *
 * Threading: kvd_nvme_open / kvd_nvme_close must not run concurrently with
 * any other call on the same tier. Every other call is thread-safe.
 *
 * Internal: not exported from libkvdepot.so.
 */
#ifndef KVD_STORE_NVME_INT_H
#define KVD_STORE_NVME_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "kvdepot/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVD_NVME_BLOCK_BYTES 4096u
#define KVD_NVME_EXTENT_INVALID UINT32_MAX
#define KVD_NVME_FILES_MAX 256u
#define KVD_NVME_QUEUE_DEPTH_DEFAULT 64u
#define KVD_NVME_THREADS_DEFAULT 4u

typedef struct kvd_nvme kvd_nvme_t;

/* I/O engine, also the index of the "store.disk_engine" enum. */
typedef enum kvd_nvme_engine {
    KVD_NVME_ENGINE_AUTO = 0,   /* io_uring, else threads (logged) */
    KVD_NVME_ENGINE_URING = 1,  /* io_uring or fail at open */
    KVD_NVME_ENGINE_THREADS = 2 /* pread/pwrite pool */
} kvd_nvme_engine_t;

/*
 * Settings, filled by kvd_config_apply() from kvd_nvme_config_table() or by
 * hand.
 *   path         directory of the data files (created, mode 0700, when
 *                missing; its parent must exist). Empty: no NVMe tier (the
 *                store does not open one).
 *   size_bytes   total capacity, split evenly over num_files; each file
 *                gets size_bytes / num_files rounded DOWN to 4096.
 *   num_files    1..KVD_NVME_FILES_MAX.
 *   queue_depth  io_uring entries and operations in flight, 1..4096.
 *   engine       a kvd_nvme_engine_t value (int: the enum parser's type).
 *   threads      pool size of the threads engine, 1..64.
 */
typedef struct kvd_nvme_config {
    char path[KVD_CONFIG_STRING_MAX];
    uint64_t size_bytes;
    uint64_t num_files;
    uint64_t queue_depth;
    int engine;
    uint64_t threads;
} kvd_nvme_config_t;

/*
 * The settings table: "store.disk_path" (string, default ""),
 * "store.disk_size" (size, default 16g), "store.disk_files" (int, default
 * 1), "store.disk_queue_depth" (int, default 64), "store.disk_engine"
 * (auto|uring|threads, default auto), "store.disk_threads" (int, default
 * 4). Static storage; writes the number of fields into `*num_fields_out`.
 */
const kvd_config_field_t *kvd_nvme_config_table(size_t *num_fields_out);

/* The table's defaults, without consulting the environment or a file. */
kvd_nvme_config_t kvd_nvme_config_default(void);

/*
 * Opens the tier: directory, files (created and fallocate()d, or reused),
 * the I/O engine and its threads. `cfg` is borrowed.
 *
 * Errors (nothing left open or running; `*nvme_out` untouched):
 *   KVD_ERR_INVALID      NULL argument, empty path, num_files / queue_depth
 *                        / threads out of range, engine not an engine.
 *   KVD_ERR_RANGE        a file would be smaller than one block, or the
 *                        space exceeds 2^32 - 1 blocks.
 *   KVD_ERR_NOSPACE      fallocate failed for lack of space.
 *   KVD_ERR_UNSUPPORTED  engine "uring" and io_uring cannot be set up; or
 *                        the file system refuses O_DIRECT.
 *   KVD_ERR_NOMEM, other translated errno (logged with the file name).
 */
kvd_status_t kvd_nvme_open(const kvd_nvme_config_t *cfg, kvd_nvme_t **nvme_out);

/*
 * Waits for every accepted operation to complete (their callbacks run),
 * stops the threads, unregisters buffers, closes the files and frees the
 * tier. Does not sync. NULL is accepted.
 */
void kvd_nvme_close(kvd_nvme_t *nvme);

/* What the tier is. */
typedef struct kvd_nvme_info {
    kvd_nvme_engine_t engine; /* URING or THREADS: what is in use */
    uint32_t num_files;
    uint64_t file_bytes;   /* usable bytes per file, a multiple of 4096 */
    uint64_t total_bytes;  /* num_files * file_bytes */
    uint64_t free_bytes;   /* not allocated to an extent */
    uint64_t largest_free; /* longest free run, bytes */
    uint32_t queue_depth;  /* operations in flight at most */
    uint32_t buffers;      /* fixed buffers registered (0 for threads) */
} kvd_nvme_info_t;

kvd_status_t kvd_nvme_query(kvd_nvme_t *nvme, kvd_nvme_info_t *info_out);

/*
 * Registers `num` memory ranges (typically the arena's chunks, in chunk
 * order) as io_uring fixed buffers; buffer i is iov[i]. Ranges must be
 * 4096-aligned. Replaces an earlier registration; call only while no
 * operation is in flight. With the threads engine it records nothing and
 * returns KVD_OK (operations then ignore buf_index). Errors:
 * KVD_ERR_INVALID (NULL with num > 0, misaligned range, num above 16384),
 * KVD_ERR_STATE (operations in flight), translated errno
 * (io_uring_register_buffers: ENOMEM when RLIMIT_MEMLOCK is too low; the
 * tier keeps working without fixed buffers and the cause is logged).
 */
kvd_status_t kvd_nvme_buffers_register(kvd_nvme_t *nvme,
                                       const struct iovec *iov, size_t num);

/* Extent allocator. `size_bytes` is rounded up to 4096.
 * alloc: writes the first block's id; KVD_ERR_NOSPACE when no contiguous
 *        run is free; KVD_ERR_INVALID for size 0 or larger than a file.
 * free:  returns [id, id + blocks) to the free space; KVD_ERR_INVALID when
 *        any part of it is not allocated (double free; logged, nothing
 *        changes).
 * mark:  allocates exactly [id, id + blocks) (recovery from the index);
 *        KVD_ERR_INVALID when out of range or spanning files, KVD_ERR_EXISTS
 *        when any block of it is already allocated (nothing changes).
 * All O(log n) or better in the number of free runs; thread-safe. */
kvd_status_t kvd_nvme_extent_alloc(kvd_nvme_t *nvme, uint64_t size_bytes,
                                   uint32_t *extent_out);
kvd_status_t kvd_nvme_extent_free(kvd_nvme_t *nvme, uint32_t extent,
                                  uint64_t size_bytes);
kvd_status_t kvd_nvme_extent_mark(kvd_nvme_t *nvme, uint32_t extent,
                                  uint64_t size_bytes);

/* Extent id <-> (file index, byte offset), as the index records it.
 * locate: KVD_ERR_INVALID for an id outside the space.
 * from_location: KVD_ERR_INVALID for a file or offset outside the space or
 * an offset that is not a multiple of 4096. */
kvd_status_t kvd_nvme_extent_locate(const kvd_nvme_t *nvme, uint32_t extent,
                                    uint32_t *file_id_out,
                                    uint64_t *offset_out);
kvd_status_t kvd_nvme_extent_from_location(const kvd_nvme_t *nvme,
                                           uint32_t file_id, uint64_t offset,
                                           uint32_t *extent_out);

typedef enum kvd_nvme_op {
    KVD_NVME_OP_READ = 0, /* extent -> buf */
    KVD_NVME_OP_WRITE = 1 /* buf -> extent */
} kvd_nvme_op_t;

/* Called exactly once per accepted operation, on an internal thread, with
 * KVD_OK or the error (KVD_ERR_IO, KVD_ERR_NOSPACE, ...). */
typedef void (*kvd_nvme_done_fn)(void *arg, kvd_status_t status);

typedef struct kvd_nvme_io {
    kvd_nvme_op_t op;
    uint32_t extent; /* first block */
    void *buf;       /* 4096-aligned; inside buffer buf_index if >= 0 */
    uint64_t len;    /* bytes, a multiple of 4096, within one file */
    int buf_index;   /* registered buffer holding buf, or -1 */
    kvd_nvme_done_fn done;
    void *arg; /* passed to done */
} kvd_nvme_io_t;

/*
 * Submits up to `num` operations in one batch and writes how many were
 * accepted (a prefix of `ios`) into *accepted_out. Fewer than `num` means
 * the queue is full: retry the rest after some complete. `ios` is borrowed
 * for the call (the descriptors are copied). Errors (nothing accepted):
 * KVD_ERR_INVALID (NULL argument, op unknown, len 0 or not a multiple of
 * 4096, misaligned buf, extent range outside the space or spanning files,
 * buf_index not registered, NULL done), KVD_ERR_BUSY (queue full, nothing
 * accepted), KVD_ERR_STATE (closing).
 */
kvd_status_t kvd_nvme_submit(kvd_nvme_t *nvme, const kvd_nvme_io_t *ios,
                             size_t num, size_t *accepted_out);

/* fdatasync every file (failpoint "nvme.sync"). Errors: translated errno. */
kvd_status_t kvd_nvme_sync(kvd_nvme_t *nvme);

/* Counters since open. */
typedef struct kvd_nvme_stats {
    uint64_t reads, writes; /* completed operations, success */
    uint64_t bytes_read, bytes_written;
    uint64_t read_errors, write_errors;
    uint64_t inflight; /* accepted, not yet completed */
} kvd_nvme_stats_t;

kvd_status_t kvd_nvme_stats(kvd_nvme_t *nvme, kvd_nvme_stats_t *stats_out);

#ifdef __cplusplus
}
#endif

#endif /* KVD_STORE_NVME_INT_H */
