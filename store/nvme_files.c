/*
 * The NVMe tier's files, extents and settings (store/nvme_int.h): the
 * settings table, the preallocated O_DIRECT data files, and the extent
 * allocator over their blocks. The tier itself and its I/O engines are
 * nvme.c's.
 *
 * Allocator. Each file keeps its free space as runs [start, start + len) of
 * 4 KiB blocks in a treap ordered by start, every node also carrying the
 * longest run in its subtree. First fit descends to the leftmost run long
 * enough (O(log n) expected, n = free runs of the file); free finds the
 * neighbours by splitting the treap at the freed range and merges with them
 * (so equal-sized objects never fragment); a range overlapping free space
 * is a double free and changes nothing. Allocation starts at the file after
 * the one that served the previous allocation, which spreads consecutive
 * writes over the files (and their disks, when they sit on several).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/failpoint_int.h"
#include "common/log_int.h"
#include "store/nvme_files_int.h"

/* ---- settings ----------------------------------------------------------- */

static const char *const nvme_engine_choices[] = {"auto", "uring", "threads",
                                                  NULL};

static const kvd_config_field_t nvme_config_fields[] = {
    {"store.disk_path", "",
     "directory of the NVMe tier's files and index (empty: no NVMe tier)",
     kvd_config_parse_string, offsetof(kvd_nvme_config_t, path), 0, 0, NULL},
    {"store.disk_size", "16g", "NVMe tier capacity, split over the files",
     kvd_config_parse_size, offsetof(kvd_nvme_config_t, size_bytes),
     KVD_NVME_BLOCK_BYTES, 0, NULL},
    {"store.disk_files", "1", "number of preallocated data files",
     kvd_config_parse_int, offsetof(kvd_nvme_config_t, num_files), 1,
     KVD_NVME_FILES_MAX, NULL},
    {"store.disk_queue_depth", "64", "NVMe operations in flight at most",
     kvd_config_parse_int, offsetof(kvd_nvme_config_t, queue_depth), 1,
     NVME_QUEUE_DEPTH_MAX, NULL},
    {"store.disk_engine", "auto",
     "NVMe I/O engine: auto (io_uring, else threads), uring, threads",
     kvd_config_parse_enum, offsetof(kvd_nvme_config_t, engine), 0, 0,
     nvme_engine_choices},
    {"store.disk_threads", "4", "pread/pwrite threads of the threads engine",
     kvd_config_parse_int, offsetof(kvd_nvme_config_t, threads), 1,
     NVME_THREADS_MAX, NULL},
};

const kvd_config_field_t *kvd_nvme_config_table(size_t *num_fields_out)
{
    *num_fields_out = sizeof nvme_config_fields / sizeof nvme_config_fields[0];
    return nvme_config_fields;
}

kvd_nvme_config_t kvd_nvme_config_default(void)
{
    /* Must match the default strings above (checked by the unit test). */
    kvd_nvme_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.size_bytes = 16ull << 30;
    cfg.num_files = 1;
    cfg.queue_depth = KVD_NVME_QUEUE_DEPTH_DEFAULT;
    cfg.engine = KVD_NVME_ENGINE_AUTO;
    cfg.threads = KVD_NVME_THREADS_DEFAULT;
    return cfg;
}

kvd_status_t kvd_nvme_config_check(const kvd_nvme_config_t *cfg,
                                   uint64_t *file_bytes_out)
{
    if (cfg->path[0] == '\0' || cfg->num_files < 1 ||
        cfg->num_files > KVD_NVME_FILES_MAX || cfg->queue_depth < 1 ||
        cfg->queue_depth > NVME_QUEUE_DEPTH_MAX || cfg->threads < 1 ||
        cfg->threads > NVME_THREADS_MAX || cfg->engine < KVD_NVME_ENGINE_AUTO ||
        cfg->engine > KVD_NVME_ENGINE_THREADS) {
        return KVD_ERR_INVALID;
    }
    uint64_t file_bytes = cfg->size_bytes / cfg->num_files /
                          KVD_NVME_BLOCK_BYTES * KVD_NVME_BLOCK_BYTES;
    /* Ids are uint32 and UINT32_MAX is KVD_NVME_EXTENT_INVALID, so at most
     * 2^32 - 1 blocks (ids 0 .. 2^32 - 2). */
    if (file_bytes < KVD_NVME_BLOCK_BYTES ||
        file_bytes / KVD_NVME_BLOCK_BYTES * cfg->num_files > UINT32_MAX) {
        return KVD_ERR_RANGE;
    }
    *file_bytes_out = file_bytes;
    return KVD_OK;
}

/* ---- the data files ----------------------------------------------------- */

/* The name of data file `i` of the tier in `path`. */
static void data_file_name(char *name, size_t len, const char *path, uint32_t i)
{
    snprintf(name, len, "%s/kvd-data-%03u.dat", path, i);
}

kvd_status_t kvd_nvme_space_check(const char *path, uint32_t num_files,
                                  uint64_t file_bytes)
{
    uint64_t want = 0;
    for (uint32_t i = 0; i < num_files; i++) {
        char name[KVD_CONFIG_STRING_MAX + 32];
        data_file_name(name, sizeof name, path, i);
        struct stat sb;
        if (stat(name, &sb) != 0) {
            want += file_bytes;
            continue;
        }
        /* A file already this long is opened as it is (kvd_nvme_file_open
         * allocates nothing, a sparse one included); a shorter one is
         * grown over what it does not hold yet. */
        uint64_t held = (uint64_t)sb.st_blocks * 512;
        if ((uint64_t)sb.st_size < file_bytes && held < file_bytes) {
            want += file_bytes - held;
        }
    }
    struct statvfs vb;
    int inject = KVD_FAILPOINT("nvme.statvfs");
    if (inject != 0 || statvfs(path, &vb) != 0) {
        int e = inject != 0 ? inject : errno;
        KVD_LOG_ERROR("nvme: statvfs %s: %s", path, strerror(e));
        return kvd_status_from_errno(e);
    }
    uint64_t avail = (uint64_t)vb.f_bavail * vb.f_frsize;
    if (want > avail) {
        KVD_LOG_ERROR("nvme: %s: the tier's files need %llu MiB more and "
                      "the file system has %llu MiB free; set a smaller "
                      "store.disk_size or free space",
                      path, (unsigned long long)(want >> 20),
                      (unsigned long long)(avail >> 20));
        return KVD_ERR_NOSPACE;
    }
    return KVD_OK;
}

kvd_status_t kvd_nvme_file_open(const char *path, uint32_t i,
                                uint64_t file_bytes, int *fd_out)
{
    char name[KVD_CONFIG_STRING_MAX + 32];
    data_file_name(name, sizeof name, path, i);
    int inject = KVD_FAILPOINT("nvme.open");
    int fd = inject != 0
                 ? -1
                 : open(name, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = inject != 0 ? inject : errno;
        KVD_LOG_ERROR("nvme: open %s: %s", name, strerror(e));
        return e == EINVAL ? KVD_ERR_UNSUPPORTED : kvd_status_from_errno(e);
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return kvd_status_from_errno(e);
    }
    if ((uint64_t)sb.st_size < file_bytes) {
        int rc = fallocate(fd, 0, 0, (off_t)file_bytes);
        int e = errno;
        int fail = KVD_FAILPOINT("nvme.fallocate");
        if (fail != 0) {
            rc = -1;
            e = fail;
        }
        if (rc != 0 && (e == EOPNOTSUPP || e == ENOSYS) &&
            ftruncate(fd, (off_t)file_bytes) == 0) {
            KVD_LOG_WARN("nvme: %s: no fallocate on this file system; the "
                         "file is sparse",
                         name);
            rc = 0;
        }
        if (rc != 0) {
            /* What the file system allocated before it gave up stays
             * allocated (and the file may be longer): give it back. */
            if (ftruncate(fd, sb.st_size) != 0) {
                KVD_LOG_ERROR("nvme: %s: cutting back to %lld bytes after "
                              "the failed fallocate: %s",
                              name, (long long)sb.st_size, strerror(errno));
            }
            KVD_LOG_ERROR("nvme: fallocate %s to %llu bytes: %s", name,
                          (unsigned long long)file_bytes, strerror(e));
            close(fd);
            return kvd_status_from_errno(e);
        }
    }
    *fd_out = fd;
    return KVD_OK;
}

struct nvme_run {
    uint32_t start, len; /* blocks, file-relative */
    uint32_t max;        /* longest len in this subtree */
    uint32_t prio;
    nvme_run_t *left, *right;
};

/* ---- allocator: a treap of free runs ------------------------------------ */

static uint32_t run_max(const nvme_run_t *r)
{
    return r != NULL ? r->max : 0;
}

static void run_fix(nvme_run_t *r)
{
    uint32_t m = r->len;
    if (run_max(r->left) > m) {
        m = run_max(r->left);
    }
    if (run_max(r->right) > m) {
        m = run_max(r->right);
    }
    r->max = m;
}

/* Splits `t` into runs starting before `key` and the rest. */
static void run_split(nvme_run_t *t, uint32_t key, nvme_run_t **lo,
                      nvme_run_t **hi)
{
    if (t == NULL) {
        *lo = *hi = NULL;
    } else if (t->start < key) {
        run_split(t->right, key, &t->right, hi);
        run_fix(t);
        *lo = t;
    } else {
        run_split(t->left, key, lo, &t->left);
        run_fix(t);
        *hi = t;
    }
}

/* Joins two treaps, every start of `a` below every start of `b`. */
static nvme_run_t *run_merge(nvme_run_t *a, nvme_run_t *b)
{
    if (a == NULL) {
        return b;
    }
    if (b == NULL) {
        return a;
    }
    if (a->prio > b->prio) {
        a->right = run_merge(a->right, b);
        run_fix(a);
        return a;
    }
    b->left = run_merge(a, b->left);
    run_fix(b);
    return b;
}

/* Detaches the last (highest start) run of `*t` when `last`, else the
 * first (lowest start) one; NULL when `*t` is empty. */
static nvme_run_t *run_pop_end(nvme_run_t **t, bool last)
{
    if (*t == NULL) {
        return NULL;
    }
    nvme_run_t **outer = last ? &(*t)->right : &(*t)->left;
    nvme_run_t *r;
    if (*outer == NULL) {
        r = *t;
        *t = last ? r->left : r->right;
        r->left = r->right = NULL;
    } else {
        r = run_pop_end(outer, last);
    }
    run_fix(r);
    if (*t != NULL) {
        run_fix(*t);
    }
    return r;
}

static nvme_run_t *run_new(kvd_nvme_space_t *sp, uint32_t start, uint32_t len)
{
    nvme_run_t *r = calloc(1, sizeof *r);
    if (r == NULL) {
        return NULL;
    }
    /* xorshift: priorities only need to look random to the treap. */
    sp->rng ^= sp->rng << 13;
    sp->rng ^= sp->rng >> 7;
    sp->rng ^= sp->rng << 17;
    r->start = start;
    r->len = len;
    r->max = len;
    r->prio = (uint32_t)(sp->rng >> 16);
    return r;
}

static void run_free_all(nvme_run_t *t)
{
    if (t != NULL) {
        run_free_all(t->left);
        run_free_all(t->right);
        free(t);
    }
}

/* First fit: carves `len` blocks from the leftmost run long enough. Returns
 * the start, or UINT32_MAX when no run is long enough. The run keeps its
 * place in the order (its start only moves within its own gap). */
static uint32_t run_take(nvme_run_t **t, uint32_t len)
{
    nvme_run_t *r = *t;
    if (r == NULL || r->max < len) {
        return UINT32_MAX;
    }
    uint32_t start;
    if (run_max(r->left) >= len) {
        start = run_take(&r->left, len);
    } else if (r->len >= len) {
        start = r->start;
        r->start += len;
        r->len -= len;
        if (r->len == 0) {
            *t = run_merge(r->left, r->right);
            free(r);
            return start;
        }
    } else {
        start = run_take(&r->right, len);
    }
    run_fix(r);
    return start;
}

/* Returns [start, start + len) to the free runs of `file`, merging with its
 * neighbours. KVD_ERR_INVALID when any of it is free already. */
static kvd_status_t run_give(kvd_nvme_space_t *sp, uint32_t file,
                             uint32_t start, uint32_t len)
{
    nvme_run_t *lo, *hi;
    run_split(sp->runs[file], start, &lo, &hi);
    nvme_run_t *pred = run_pop_end(&lo, true);
    nvme_run_t *succ = run_pop_end(&hi, false);
    kvd_status_t status = KVD_OK;
    nvme_run_t *node = NULL;
    if ((pred != NULL && pred->start + pred->len > start) ||
        (succ != NULL && succ->start < start + len)) {
        status = KVD_ERR_INVALID;
    } else {
        if (pred != NULL && pred->start + pred->len == start) {
            node = pred;
            node->len += len;
            pred = NULL;
        }
        if (succ != NULL && succ->start == start + len) {
            if (node != NULL) {
                node->len += succ->len;
                free(succ);
            } else {
                node = succ;
                node->start = start;
                node->len += len;
            }
            succ = NULL;
        }
        if (node == NULL) {
            node = run_new(sp, start, len);
            status = node == NULL ? KVD_ERR_NOMEM : KVD_OK;
        }
    }
    /* Every start in lo < pred < node < succ < every start in hi. */
    if (pred != NULL) {
        lo = run_merge(lo, pred);
    }
    if (node != NULL) {
        run_fix(node);
        lo = run_merge(lo, node);
    }
    if (succ != NULL) {
        hi = run_merge(succ, hi);
    }
    sp->runs[file] = run_merge(lo, hi);
    return status;
}

/* Removes [start, start + len) from the free runs of `file`; it must lie
 * inside one run (KVD_ERR_EXISTS otherwise, nothing changed). */
static kvd_status_t run_claim(kvd_nvme_space_t *sp, uint32_t file,
                              uint32_t start, uint32_t len)
{
    nvme_run_t *lo, *hi;
    run_split(sp->runs[file], start + 1, &lo, &hi);
    nvme_run_t *r = run_pop_end(&lo, true);
    kvd_status_t status = KVD_OK;
    if (r == NULL || r->start + r->len < start + len) {
        status = KVD_ERR_EXISTS;
        if (r != NULL) {
            lo = run_merge(lo, r);
        }
        sp->runs[file] = run_merge(lo, hi);
        return status;
    }
    uint32_t end = r->start + r->len;
    nvme_run_t *tail = NULL;
    if (end > start + len) {
        tail = run_new(sp, start + len, end - start - len);
        if (tail == NULL) {
            lo = run_merge(lo, r);
            sp->runs[file] = run_merge(lo, hi);
            return KVD_ERR_NOMEM;
        }
    }
    if (r->start < start) {
        r->len = start - r->start;
        run_fix(r);
        lo = run_merge(lo, r);
    } else {
        free(r);
    }
    if (tail != NULL) {
        hi = run_merge(tail, hi);
    }
    sp->runs[file] = run_merge(lo, hi);
    return KVD_OK;
}

kvd_status_t kvd_nvme_space_range(const kvd_nvme_space_t *sp, uint32_t extent,
                                  uint64_t size_bytes, uint32_t *file_out,
                                  uint32_t *start_out, uint32_t *blocks_out)
{
    /* The size bound comes first: it keeps the rounding below from
     * wrapping around for sizes near 2^64. */
    if (size_bytes == 0 || size_bytes > sp->file_bytes ||
        extent == KVD_NVME_EXTENT_INVALID) {
        return KVD_ERR_INVALID;
    }
    uint64_t blocks =
        (size_bytes + KVD_NVME_BLOCK_BYTES - 1) / KVD_NVME_BLOCK_BYTES;
    uint32_t file = extent / sp->blocks_per_file;
    uint32_t start = extent % sp->blocks_per_file;
    if (file >= sp->num_files ||
        blocks > (uint64_t)sp->blocks_per_file - start) {
        return KVD_ERR_INVALID;
    }
    *file_out = file;
    *start_out = start;
    *blocks_out = (uint32_t)blocks;
    return KVD_OK;
}

kvd_status_t kvd_nvme_space_alloc(kvd_nvme_space_t *sp, uint64_t size_bytes,
                                  uint32_t *extent_out)
{
    if (sp == NULL || extent_out == NULL || size_bytes == 0 ||
        size_bytes > sp->file_bytes) {
        return KVD_ERR_INVALID;
    }
    uint32_t blocks = (uint32_t)((size_bytes + KVD_NVME_BLOCK_BYTES - 1) /
                                 KVD_NVME_BLOCK_BYTES);
    kvd_status_t status = KVD_ERR_NOSPACE;
    pthread_mutex_lock(&sp->mu);
    for (uint32_t k = 0; k < sp->num_files; k++) {
        uint32_t f = (sp->next_file + k) % sp->num_files;
        uint32_t start = run_take(&sp->runs[f], blocks);
        if (start != UINT32_MAX) {
            *extent_out = f * sp->blocks_per_file + start;
            sp->free_blocks -= blocks;
            sp->next_file = (f + 1) % sp->num_files;
            status = KVD_OK;
            break;
        }
    }
    pthread_mutex_unlock(&sp->mu);
    return status;
}

/* Frees (`claim` false) or claims (`claim` true) an extent's blocks. */
static kvd_status_t space_change(kvd_nvme_space_t *sp, uint32_t extent,
                                 uint64_t size_bytes, bool claim)
{
    uint32_t file, start, blocks;
    if (sp == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t status =
        kvd_nvme_space_range(sp, extent, size_bytes, &file, &start, &blocks);
    if (status != KVD_OK) {
        return status;
    }
    pthread_mutex_lock(&sp->mu);
    status = claim ? run_claim(sp, file, start, blocks)
                   : run_give(sp, file, start, blocks);
    if (status == KVD_OK) {
        sp->free_blocks =
            claim ? sp->free_blocks - blocks : sp->free_blocks + blocks;
    }
    pthread_mutex_unlock(&sp->mu);
    if (!claim && status == KVD_ERR_INVALID) {
        KVD_LOG_ERROR("nvme: free of extent %u (%u blocks) that is not "
                      "allocated",
                      extent, blocks);
    }
    return status;
}

kvd_status_t kvd_nvme_space_free(kvd_nvme_space_t *sp, uint32_t extent,
                                 uint64_t size_bytes)
{
    return space_change(sp, extent, size_bytes, false);
}

kvd_status_t kvd_nvme_space_mark(kvd_nvme_space_t *sp, uint32_t extent,
                                 uint64_t size_bytes)
{
    return space_change(sp, extent, size_bytes, true);
}

kvd_status_t kvd_nvme_space_locate(const kvd_nvme_space_t *sp, uint32_t extent,
                                   uint32_t *file_id_out, uint64_t *offset_out)
{
    if (sp == NULL || file_id_out == NULL || offset_out == NULL ||
        extent == KVD_NVME_EXTENT_INVALID ||
        extent / sp->blocks_per_file >= sp->num_files) {
        return KVD_ERR_INVALID;
    }
    *file_id_out = extent / sp->blocks_per_file;
    *offset_out =
        (uint64_t)(extent % sp->blocks_per_file) * KVD_NVME_BLOCK_BYTES;
    return KVD_OK;
}

kvd_status_t kvd_nvme_space_from_location(const kvd_nvme_space_t *sp,
                                          uint32_t file_id, uint64_t offset,
                                          uint32_t *extent_out)
{
    if (sp == NULL || extent_out == NULL || file_id >= sp->num_files ||
        offset % KVD_NVME_BLOCK_BYTES != 0 || offset >= sp->file_bytes) {
        return KVD_ERR_INVALID;
    }
    *extent_out = file_id * sp->blocks_per_file +
                  (uint32_t)(offset / KVD_NVME_BLOCK_BYTES);
    return KVD_OK;
}

/* ---- the allocator's life ----------------------------------------------- */

void kvd_nvme_space_init(kvd_nvme_space_t *sp, uint32_t num_files,
                         uint64_t file_bytes)
{
    memset(sp, 0, sizeof *sp);
    sp->num_files = num_files;
    sp->file_bytes = file_bytes;
    sp->blocks_per_file = (uint32_t)(file_bytes / KVD_NVME_BLOCK_BYTES);
    sp->rng = 0x9e3779b97f4a7c15ull;
    pthread_mutex_init(&sp->mu, NULL);
}

kvd_status_t kvd_nvme_space_add_file(kvd_nvme_space_t *sp, uint32_t file)
{
    sp->runs[file] = run_new(sp, 0, sp->blocks_per_file);
    if (sp->runs[file] == NULL) {
        return KVD_ERR_NOMEM;
    }
    sp->free_blocks += sp->blocks_per_file;
    return KVD_OK;
}

void kvd_nvme_space_cleanup(kvd_nvme_space_t *sp)
{
    for (uint32_t i = 0; i < KVD_NVME_FILES_MAX; i++) {
        run_free_all(sp->runs[i]);
        sp->runs[i] = NULL;
    }
    pthread_mutex_destroy(&sp->mu);
}

void kvd_nvme_space_query(kvd_nvme_space_t *sp, uint64_t *free_bytes_out,
                          uint64_t *largest_free_out)
{
    pthread_mutex_lock(&sp->mu);
    *free_bytes_out = sp->free_blocks * KVD_NVME_BLOCK_BYTES;
    uint32_t largest = 0;
    for (uint32_t f = 0; f < sp->num_files; f++) {
        if (run_max(sp->runs[f]) > largest) {
            largest = run_max(sp->runs[f]);
        }
    }
    pthread_mutex_unlock(&sp->mu);
    *largest_free_out = (uint64_t)largest * KVD_NVME_BLOCK_BYTES;
}
