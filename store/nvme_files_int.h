/*
 * The NVMe tier's files, its address space of blocks and its settings,
 * shared by nvme.c (the tier and its I/O engines, the one file that uses
 * liburing) and nvme_files.c (the settings table, the data files and the
 * extent allocator). Nothing outside store/ includes it; the store uses
 * store/nvme_int.h.
 */
#ifndef KVD_STORE_NVME_FILES_INT_H
#define KVD_STORE_NVME_FILES_INT_H

#include <pthread.h>
#include <stdint.h>

#include "store/nvme_int.h"

#define NVME_QUEUE_DEPTH_MAX 4096
#define NVME_THREADS_MAX 64

/*
 * Checks the settings kvd_nvme_open takes and writes the usable bytes per
 * file (size_bytes / num_files rounded down to a block). KVD_ERR_INVALID
 * or KVD_ERR_RANGE as kvd_nvme_open documents them; nothing is logged.
 */
kvd_status_t kvd_nvme_config_check(const kvd_nvme_config_t *cfg,
                                   uint64_t *file_bytes_out);

/*
 * Whether the file system of directory `path` has room for `num_files`
 * data files of `file_bytes` each: the bytes the files shorter than that
 * do not hold yet (their allocated blocks count as held; a file already
 * that long is opened as it is) against the space an
 * unprivileged user may still take (statvfs f_bavail, so the root reserve
 * is left alone). KVD_ERR_NOSPACE, logged with both figures and the
 * setting to change, when they do not fit; nothing is created. Other
 * errors: the translated errno of statvfs. Failpoint "nvme.statvfs".
 */
kvd_status_t kvd_nvme_space_check(const char *path, uint32_t num_files,
                                  uint64_t file_bytes);

/*
 * Opens (creating it, mode 0600) data file `i` ("kvd-data-NNN.dat") in
 * directory `path`, O_RDWR | O_DIRECT | O_CLOEXEC, and makes it at least
 * file_bytes long (fallocate, or ftruncate where the file system has no
 * fallocate: a sparse file, logged at WARN). Writes the fd on success.
 * Errors, logged with the file name: KVD_ERR_UNSUPPORTED (no O_DIRECT),
 * KVD_ERR_NOSPACE, other translated errno; nothing is left open. A failed
 * fallocate (the file system filled up part-way: it keeps what it
 * allocated and may have grown the file) is undone: the file is cut back
 * to the length it had, so a refused tier does not leave the disk full.
 * Failpoints "nvme.open", "nvme.fallocate" (evaluated after the real
 * fallocate, which then counts as failed part-way).
 */
kvd_status_t kvd_nvme_file_open(const char *path, uint32_t i,
                                uint64_t file_bytes, int *fd_out);

typedef struct nvme_run nvme_run_t;

/*
 * The extent allocator: each file's free runs of blocks. The geometry is
 * fixed by kvd_nvme_space_init; `mu` guards the rest. The caller's storage
 * (embedded in the tier); every call below but init / add_file / cleanup
 * is thread-safe.
 */
typedef struct kvd_nvme_space {
    uint32_t num_files;
    uint32_t blocks_per_file;
    uint64_t file_bytes; /* blocks_per_file * KVD_NVME_BLOCK_BYTES */

    pthread_mutex_t mu;
    nvme_run_t *runs[KVD_NVME_FILES_MAX]; /* free runs per file */
    uint64_t free_blocks;
    uint32_t next_file;
    uint64_t rng;
} kvd_nvme_space_t;

/* Sets the geometry of an allocator with no file yet (no free block).
 * Cannot fail. */
void kvd_nvme_space_init(kvd_nvme_space_t *sp, uint32_t num_files,
                         uint64_t file_bytes);
/* Makes every block of file `file` free (once per file, at open).
 * KVD_ERR_NOMEM. */
kvd_status_t kvd_nvme_space_add_file(kvd_nvme_space_t *sp, uint32_t file);
/* Frees the runs and the lock; the storage stays the caller's. */
void kvd_nvme_space_cleanup(kvd_nvme_space_t *sp);
/* Free bytes and the longest free run in bytes. */
void kvd_nvme_space_query(kvd_nvme_space_t *sp, uint64_t *free_bytes_out,
                          uint64_t *largest_free_out);

/* The file, first block in it and block count of the extent of size_bytes
 * at `extent`; KVD_ERR_INVALID for a size of 0 or above a file, an id
 * outside the space, or a range spanning files. No lock: the geometry is
 * fixed. */
kvd_status_t kvd_nvme_space_range(const kvd_nvme_space_t *sp, uint32_t extent,
                                  uint64_t size_bytes, uint32_t *file_out,
                                  uint32_t *start_out, uint32_t *blocks_out);

/* kvd_nvme_extent_alloc / free / mark / locate / from_location on the
 * tier's allocator, with the same contracts (store/nvme_int.h); NULL `sp`
 * is KVD_ERR_INVALID. */
kvd_status_t kvd_nvme_space_alloc(kvd_nvme_space_t *sp, uint64_t size_bytes,
                                  uint32_t *extent_out);
kvd_status_t kvd_nvme_space_free(kvd_nvme_space_t *sp, uint32_t extent,
                                 uint64_t size_bytes);
kvd_status_t kvd_nvme_space_mark(kvd_nvme_space_t *sp, uint32_t extent,
                                 uint64_t size_bytes);
kvd_status_t kvd_nvme_space_locate(const kvd_nvme_space_t *sp, uint32_t extent,
                                   uint32_t *file_id_out, uint64_t *offset_out);
kvd_status_t kvd_nvme_space_from_location(const kvd_nvme_space_t *sp,
                                          uint32_t file_id, uint64_t offset,
                                          uint32_t *extent_out);

#endif /* KVD_STORE_NVME_FILES_INT_H */
