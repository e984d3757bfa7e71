/*
 * NVMe tier (store/nvme_int.h): asynchronous reads and writes through
 * io_uring or, where io_uring is unavailable, a pread/pwrite thread pool,
 * and the tier's open / close. The settings, the data files and the extent
 * allocator are nvme_files.c's; this is the one file that uses liburing.
 *
 * Descriptors. An accepted operation holds one of queue_depth descriptors
 * allocated at open, so submission never allocates and at most queue_depth
 * operations are in flight whatever the engine.
 *
 * io_uring engine. One ring of queue_depth entries. Every SQE belongs to a
 * held descriptor and every holder of `sq_mu` leaves the SQ empty, so an
 * SQE is always free and the CQ (twice the SQ) never overflows. Submitters
 * fill their batch's SQEs under `sq_mu` and call io_uring_submit once. The
 * completion thread waits on the CQ, continues short transfers (and those
 * longer than one SQE may carry) with a new SQE, and finishes an operation
 * when it has moved all its bytes or failed. An injected failure is
 * submitted as a NOP, so it completes on the completion thread like a real
 * error.
 *
 * Thread engine. Accepted descriptors wait in a FIFO (bounded by the
 * descriptors) for cfg.threads workers doing pread/pwrite.
 *
 * Completion. An operation gives its descriptor back just before its
 * callback runs, so the callback may submit the next operation even into a
 * queue of one; it stays counted in `pending` (the stats' inflight) until
 * the callback returns. close() refuses new submissions, waits for
 * `pending` to reach zero -- every callback has returned -- and only then
 * stops the workers or posts the NOP whose sentinel ends the completion
 * thread, so no internal thread touches the tier after it is freed.
 */
#include <assert.h>
#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/failpoint_int.h"
#include "common/log_int.h"
#include "store/nvme_files_int.h"
#include "store/nvme_int.h"

#define NVME_BUFFERS_MAX 16384u
/* Longest transfer one SQE carries (its length field is 32 bits); longer
 * operations continue like short transfers. */
#define NVME_SQE_BYTES_MAX (1u << 30)
/* EAGAIN / EINTR results retried per operation before it fails. */
#define NVME_RETRIES_MAX 16u
/* io_uring_submit attempts while the kernel answers EAGAIN / EBUSY. */
#define NVME_SUBMIT_TRIES 1000

/* ---- structures --------------------------------------------------------- */

/* An operation's descriptor: on the free list, or held by an accepted
 * operation until just before its callback runs. */
typedef struct nvme_op nvme_op_t;
struct nvme_op {
    kvd_nvme_io_t io;
    int fd;
    bool fixed;           /* READ_FIXED / WRITE_FIXED */
    int inject;           /* errno injected by a failpoint, or 0 */
    unsigned retries;     /* EAGAIN / EINTR results so far */
    uint64_t file_offset; /* where the next byte goes or comes from */
    uint64_t done_bytes;
    /* Written with release before the SQE is submitted and read with
     * acquire when its CQE arrives: the kernel carries the op from one
     * thread to the other, and this pair is what makes the hand-over
     * visible to the memory model (and to ThreadSanitizer). */
    int published;
    nvme_op_t *next; /* free list, a batch, or the thread engine's FIFO */
};

struct kvd_nvme {
    kvd_nvme_config_t cfg;
    kvd_nvme_engine_t engine;
    uint32_t num_files;
    uint64_t file_bytes;
    uint32_t blocks_per_file;
    int fds[KVD_NVME_FILES_MAX];

    kvd_nvme_space_t space; /* the extent allocator, its own lock */

    /* `mu` guards the fields below down to q_tail. It is never held
     * together with `sq_mu`. */
    pthread_mutex_t mu;
    pthread_cond_t idle_cv; /* pending reached 0 */
    pthread_cond_t work_cv; /* FIFO not empty, or stop */
    nvme_op_t *op_pool;     /* queue_depth descriptors */
    nvme_op_t *free_ops;
    uint64_t held;      /* descriptors held, <= queue_depth */
    uint64_t pending;   /* accepted, callback not yet returned */
    bool closing;       /* submissions refused */
    bool stop;          /* workers leave: nothing is pending */
    struct iovec *bufs; /* registered fixed buffers */
    uint32_t num_bufs;
    nvme_op_t *q_head, *q_tail; /* thread engine's FIFO */

    /* io_uring */
    struct io_uring ring;
    bool ring_up;
    pthread_mutex_t sq_mu; /* the SQ */
    pthread_t cq_thread;
    bool cq_thread_up;

    /* threads */
    pthread_t workers[NVME_THREADS_MAX];
    uint32_t num_workers;

    kvd_nvme_stats_t st; /* relaxed atomics; inflight unused (= pending) */
};

/* Sentinel user_data that stops the completion thread. */
static char nvme_stop_token;

/* ---- extents (the allocator is nvme_files.c's) ------------------------ */

kvd_status_t kvd_nvme_extent_alloc(kvd_nvme_t *nvme, uint64_t size_bytes,
                                   uint32_t *extent_out)
{
    return kvd_nvme_space_alloc(nvme != NULL ? &nvme->space : NULL, size_bytes,
                                extent_out);
}

kvd_status_t kvd_nvme_extent_free(kvd_nvme_t *nvme, uint32_t extent,
                                  uint64_t size_bytes)
{
    return kvd_nvme_space_free(nvme != NULL ? &nvme->space : NULL, extent,
                               size_bytes);
}

kvd_status_t kvd_nvme_extent_mark(kvd_nvme_t *nvme, uint32_t extent,
                                  uint64_t size_bytes)
{
    return kvd_nvme_space_mark(nvme != NULL ? &nvme->space : NULL, extent,
                               size_bytes);
}

kvd_status_t kvd_nvme_extent_locate(const kvd_nvme_t *nvme, uint32_t extent,
                                    uint32_t *file_id_out, uint64_t *offset_out)
{
    return kvd_nvme_space_locate(nvme != NULL ? &nvme->space : NULL, extent,
                                 file_id_out, offset_out);
}

kvd_status_t kvd_nvme_extent_from_location(const kvd_nvme_t *nvme,
                                           uint32_t file_id, uint64_t offset,
                                           uint32_t *extent_out)
{
    return kvd_nvme_space_from_location(nvme != NULL ? &nvme->space : NULL,
                                        file_id, offset, extent_out);
}

/* ---- operations --------------------------------------------------------- */

/* Counts the result, gives the descriptor back, runs the callback and then
 * retires the operation (the order is explained at the top). */
static void nvme_op_finish(kvd_nvme_t *nvme, nvme_op_t *op, kvd_status_t status)
{
    kvd_nvme_io_t io = op->io;
    bool write = io.op == KVD_NVME_OP_WRITE;
    if (status == KVD_OK) {
        __atomic_fetch_add(write ? &nvme->st.writes : &nvme->st.reads, 1,
                           __ATOMIC_RELAXED);
        __atomic_fetch_add(write ? &nvme->st.bytes_written
                                 : &nvme->st.bytes_read,
                           io.len, __ATOMIC_RELAXED);
    } else {
        __atomic_fetch_add(write ? &nvme->st.write_errors
                                 : &nvme->st.read_errors,
                           1, __ATOMIC_RELAXED);
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                            "nvme: %s of extent %u (%llu bytes) failed: %s",
                            write ? "write" : "read", io.extent,
                            (unsigned long long)io.len, kvd_status_str(status));
    }
    pthread_mutex_lock(&nvme->mu);
    op->next = nvme->free_ops;
    nvme->free_ops = op;
    nvme->held--;
    pthread_mutex_unlock(&nvme->mu);
    io.done(io.arg, status);
    pthread_mutex_lock(&nvme->mu);
    if (--nvme->pending == 0) {
        pthread_cond_broadcast(&nvme->idle_cv);
    }
    pthread_mutex_unlock(&nvme->mu);
}

/* Accounts `res` (bytes moved or -errno) of `op`; returns true when the
 * operation is over and `*status_out` holds its result, false when the
 * rest must be issued again. */
static bool nvme_progress(nvme_op_t *op, long res, kvd_status_t *status_out)
{
    if (op->inject != 0) {
        *status_out = kvd_status_from_errno(op->inject);
        return true;
    }
    if ((res == -EAGAIN || res == -EINTR) && op->retries < NVME_RETRIES_MAX) {
        op->retries++;
        return false;
    }
    if (res < 0) {
        *status_out = kvd_status_from_errno((int)-res);
        return true;
    }
    if (res == 0) {
        /* Reading past the end of the file, or a write the device refused
         * to advance: never loop on it. */
        *status_out = KVD_ERR_IO;
        return true;
    }
    op->done_bytes += (uint64_t)res;
    op->file_offset += (uint64_t)res;
    if (op->done_bytes >= op->io.len) {
        *status_out = KVD_OK;
        return true;
    }
    return false;
}

/* Fills an SQE for the rest of `op`, at most NVME_SQE_BYTES_MAX (sq_mu
 * held). */
static void nvme_sqe_fill(struct io_uring_sqe *sqe, nvme_op_t *op)
{
    uint8_t *buf = (uint8_t *)op->io.buf + op->done_bytes;
    uint64_t rest = op->io.len - op->done_bytes;
    unsigned len =
        rest < NVME_SQE_BYTES_MAX ? (unsigned)rest : NVME_SQE_BYTES_MAX;
    off_t off = (off_t)op->file_offset;
    if (op->inject != 0) {
        io_uring_prep_nop(sqe);
    } else if (op->io.op == KVD_NVME_OP_WRITE) {
        if (op->fixed) {
            io_uring_prep_write_fixed(sqe, op->fd, buf, len, off,
                                      op->io.buf_index);
        } else {
            io_uring_prep_write(sqe, op->fd, buf, len, off);
        }
    } else if (op->fixed) {
        io_uring_prep_read_fixed(sqe, op->fd, buf, len, off, op->io.buf_index);
    } else {
        io_uring_prep_read(sqe, op->fd, buf, len, off);
    }
    io_uring_sqe_set_data(sqe, op);
    __atomic_store_n(&op->published, 1, __ATOMIC_RELEASE);
}

/* A free SQE (sq_mu held). Never NULL: the SQ has at least queue_depth
 * entries, each queued SQE belongs to a different held descriptor (or is
 * the stop NOP, posted when none is held), and every holder of sq_mu
 * hands its SQEs to the kernel before letting go. */
static struct io_uring_sqe *nvme_sqe_get(kvd_nvme_t *nvme)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&nvme->ring);
    assert(sqe != NULL);
    return sqe;
}

/* Hands every queued SQE to the kernel (sq_mu held): one io_uring_submit,
 * more only when the kernel refuses for the moment or takes part of the
 * batch. What a hard error leaves queued goes with the next submission. */
static void nvme_sq_flush(kvd_nvme_t *nvme)
{
    int rc = 0;
    for (int tries = 0;
         io_uring_sq_ready(&nvme->ring) > 0 && tries < NVME_SUBMIT_TRIES;
         tries++) {
        rc = io_uring_submit(&nvme->ring);
        if (rc == -EAGAIN || rc == -EBUSY) {
            usleep(50);
        } else if (rc < 0 && rc != -EINTR) {
            break;
        }
    }
    if (io_uring_sq_ready(&nvme->ring) > 0) {
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_ERROR, 1000,
                            "nvme: io_uring_submit: %s; %u SQEs wait for "
                            "the next submission",
                            strerror(rc < 0 ? -rc : EAGAIN),
                            io_uring_sq_ready(&nvme->ring));
    }
}

/* Issues a batch chained through `next` (io_uring engine). */
static void nvme_uring_issue(kvd_nvme_t *nvme, nvme_op_t *batch)
{
    pthread_mutex_lock(&nvme->sq_mu);
    for (nvme_op_t *op = batch, *next; op != NULL; op = next) {
        /* `next` is read before the SQE publishes the op: from then on
         * the op belongs to the completion thread (a queued SQE may go to
         * the kernel with an earlier batch's retry). */
        next = op->next;
        nvme_sqe_fill(nvme_sqe_get(nvme), op);
    }
    nvme_sq_flush(nvme);
    pthread_mutex_unlock(&nvme->sq_mu);
}

static void *nvme_cq_main(void *arg)
{
    kvd_nvme_t *nvme = arg;
    for (;;) {
        struct io_uring_cqe *cqe = NULL;
        int rc = io_uring_wait_cqe(&nvme->ring, &cqe);
        if (rc < 0) {
            if (rc != -EINTR) {
                KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_ERROR, 1000,
                                    "nvme: io_uring_wait_cqe: %s",
                                    strerror(-rc));
            }
            continue;
        }
        void *data = io_uring_cqe_get_data(cqe);
        long res = cqe->res;
        io_uring_cqe_seen(&nvme->ring, cqe);
        if (data == &nvme_stop_token) {
            return NULL;
        }
        nvme_op_t *op = data;
        (void)__atomic_load_n(&op->published, __ATOMIC_ACQUIRE);
        kvd_status_t status = KVD_OK;
        if (!nvme_progress(op, res, &status)) {
            /* The op still holds its descriptor, so an SQE is free. */
            op->next = NULL;
            nvme_uring_issue(nvme, op);
            continue;
        }
        nvme_op_finish(nvme, op, status);
    }
}

/* Queues a batch chained through `next`, ending at `last` (threads). */
static void nvme_threads_issue(kvd_nvme_t *nvme, nvme_op_t *batch,
                               nvme_op_t *last)
{
    pthread_mutex_lock(&nvme->mu);
    if (nvme->q_tail != NULL) {
        nvme->q_tail->next = batch;
    } else {
        nvme->q_head = batch;
    }
    nvme->q_tail = last;
    pthread_cond_broadcast(&nvme->work_cv);
    pthread_mutex_unlock(&nvme->mu);
}

/* Next queued op; NULL when the worker is to leave. */
static nvme_op_t *nvme_worker_next(kvd_nvme_t *nvme)
{
    pthread_mutex_lock(&nvme->mu);
    while (nvme->q_head == NULL && !nvme->stop) {
        pthread_cond_wait(&nvme->work_cv, &nvme->mu);
    }
    nvme_op_t *op = nvme->q_head;
    if (op != NULL) {
        nvme->q_head = op->next;
        if (nvme->q_head == NULL) {
            nvme->q_tail = NULL;
        }
    }
    pthread_mutex_unlock(&nvme->mu);
    return op;
}

static void *nvme_worker_main(void *arg)
{
    kvd_nvme_t *nvme = arg;
    nvme_op_t *op;
    while ((op = nvme_worker_next(nvme)) != NULL) {
        kvd_status_t status = KVD_OK;
        long res;
        do {
            res = 0;
            if (op->inject == 0) {
                void *buf = (uint8_t *)op->io.buf + op->done_bytes;
                size_t len = (size_t)(op->io.len - op->done_bytes);
                ssize_t n =
                    op->io.op == KVD_NVME_OP_WRITE
                        ? pwrite(op->fd, buf, len, (off_t)op->file_offset)
                        : pread(op->fd, buf, len, (off_t)op->file_offset);
                res = n < 0 ? -(long)errno : (long)n;
            }
        } while (!nvme_progress(op, res, &status));
        nvme_op_finish(nvme, op, status);
    }
    return NULL;
}

/* What can be checked without the lock. */
static kvd_status_t nvme_io_check(const kvd_nvme_t *nvme,
                                  const kvd_nvme_io_t *io)
{
    uint32_t file, start, blocks;
    if ((io->op != KVD_NVME_OP_READ && io->op != KVD_NVME_OP_WRITE) ||
        io->len == 0 || io->len % KVD_NVME_BLOCK_BYTES != 0 ||
        io->buf == NULL || (uintptr_t)io->buf % KVD_NVME_BLOCK_BYTES != 0 ||
        io->done == NULL ||
        kvd_nvme_space_range(&nvme->space, io->extent, io->len, &file, &start,
                             &blocks) != KVD_OK) {
        return KVD_ERR_INVALID;
    }
    return KVD_OK;
}

/* buf_index against the registered buffers (mu held). The threads engine
 * ignores buf_index. */
static bool nvme_io_buffer_ok(const kvd_nvme_t *nvme, const kvd_nvme_io_t *io)
{
    if (io->buf_index < 0 || nvme->engine != KVD_NVME_ENGINE_URING) {
        return true;
    }
    if ((uint32_t)io->buf_index >= nvme->num_bufs) {
        return false;
    }
    const struct iovec *b = &nvme->bufs[io->buf_index];
    uintptr_t lo = (uintptr_t)b->iov_base;
    uintptr_t p = (uintptr_t)io->buf;
    return p >= lo && io->len <= b->iov_len && p - lo <= b->iov_len - io->len;
}

/* Takes descriptors for as many of `ios` as the queue has room for and
 * chains them (in order) into `*batch_out`; `*take_out` says how many. */
static kvd_status_t nvme_ops_reserve(kvd_nvme_t *nvme, const kvd_nvme_io_t *ios,
                                     size_t num, nvme_op_t **batch_out,
                                     size_t *take_out)
{
    kvd_status_t status = KVD_OK;
    pthread_mutex_lock(&nvme->mu);
    if (nvme->closing) {
        status = KVD_ERR_STATE;
    }
    for (size_t i = 0; status == KVD_OK && i < num; i++) {
        if (!nvme_io_buffer_ok(nvme, &ios[i])) {
            status = KVD_ERR_INVALID;
        }
    }
    size_t take = 0;
    nvme_op_t **tail = batch_out;
    if (status == KVD_OK) {
        uint64_t room = nvme->cfg.queue_depth - nvme->held;
        take = num < room ? num : (size_t)room;
        for (size_t i = 0; i < take; i++) {
            nvme_op_t *op = nvme->free_ops;
            nvme->free_ops = op->next;
            *tail = op;
            tail = &op->next;
        }
        nvme->held += take;
        nvme->pending += take;
    }
    *tail = NULL;
    pthread_mutex_unlock(&nvme->mu);
    *take_out = take;
    return status;
}

kvd_status_t kvd_nvme_submit(kvd_nvme_t *nvme, const kvd_nvme_io_t *ios,
                             size_t num, size_t *accepted_out)
{
    if (nvme == NULL || accepted_out == NULL || (num > 0 && ios == NULL)) {
        return KVD_ERR_INVALID;
    }
    for (size_t i = 0; i < num; i++) {
        if (nvme_io_check(nvme, &ios[i]) != KVD_OK) {
            return KVD_ERR_INVALID;
        }
    }
    nvme_op_t *batch = NULL;
    size_t take = 0;
    kvd_status_t status = nvme_ops_reserve(nvme, ios, num, &batch, &take);
    if (status != KVD_OK) {
        return status;
    }
    if (take == 0 && num > 0) {
        return KVD_ERR_BUSY;
    }
    nvme_op_t *last = NULL;
    size_t i = 0;
    for (nvme_op_t *op = batch; op != NULL; op = op->next, i++) {
        const kvd_nvme_io_t *io = &ios[i];
        op->io = *io;
        op->fd = nvme->fds[io->extent / nvme->blocks_per_file];
        op->fixed = nvme->engine == KVD_NVME_ENGINE_URING && io->buf_index >= 0;
        op->retries = 0;
        op->done_bytes = 0;
        op->file_offset = (uint64_t)(io->extent % nvme->blocks_per_file) *
                          KVD_NVME_BLOCK_BYTES;
        op->inject = KVD_FAILPOINT(io->op == KVD_NVME_OP_WRITE ? "nvme.write"
                                                               : "nvme.read");
        last = op;
    }
    if (batch != NULL) {
        if (nvme->engine == KVD_NVME_ENGINE_URING) {
            nvme_uring_issue(nvme, batch);
        } else {
            nvme_threads_issue(nvme, batch, last);
        }
    }
    *accepted_out = take;
    return KVD_OK;
}

/* Replaces the registration (mu held, nothing pending). */
static kvd_status_t nvme_buffers_swap(kvd_nvme_t *nvme, const struct iovec *iov,
                                      size_t num)
{
    if (nvme->num_bufs > 0) {
        (void)io_uring_unregister_buffers(&nvme->ring);
        free(nvme->bufs);
        nvme->bufs = NULL;
        nvme->num_bufs = 0;
    }
    if (num == 0) {
        return KVD_OK;
    }
    struct iovec *copy = calloc(num, sizeof *copy);
    if (copy == NULL) {
        return KVD_ERR_NOMEM;
    }
    memcpy(copy, iov, num * sizeof *copy);
    int rc = io_uring_register_buffers(&nvme->ring, copy, (unsigned)num);
    if (rc < 0) {
        KVD_LOG_WARN("nvme: io_uring_register_buffers (%zu buffers): %s; "
                     "reads and writes go without fixed buffers",
                     num, strerror(-rc));
        free(copy);
        return kvd_status_from_errno(-rc);
    }
    nvme->bufs = copy;
    nvme->num_bufs = (uint32_t)num;
    return KVD_OK;
}

kvd_status_t kvd_nvme_buffers_register(kvd_nvme_t *nvme,
                                       const struct iovec *iov, size_t num)
{
    if (nvme == NULL || (num > 0 && iov == NULL) || num > NVME_BUFFERS_MAX) {
        return KVD_ERR_INVALID;
    }
    for (size_t i = 0; i < num; i++) {
        if ((uintptr_t)iov[i].iov_base % KVD_NVME_BLOCK_BYTES != 0 ||
            iov[i].iov_len % KVD_NVME_BLOCK_BYTES != 0 || iov[i].iov_len == 0) {
            return KVD_ERR_INVALID;
        }
    }
    if (nvme->engine != KVD_NVME_ENGINE_URING) {
        return KVD_OK;
    }
    /* Under `mu` so that no submission checks buf_index against a
     * registration being replaced. */
    pthread_mutex_lock(&nvme->mu);
    kvd_status_t status =
        nvme->pending > 0 ? KVD_ERR_STATE : nvme_buffers_swap(nvme, iov, num);
    pthread_mutex_unlock(&nvme->mu);
    return status;
}

kvd_status_t kvd_nvme_sync(kvd_nvme_t *nvme)
{
    if (nvme == NULL) {
        return KVD_ERR_INVALID;
    }
    int inject = KVD_FAILPOINT("nvme.sync");
    if (inject != 0) {
        return kvd_status_from_errno(inject);
    }
    for (uint32_t i = 0; i < nvme->num_files; i++) {
        if (fdatasync(nvme->fds[i]) != 0) {
            int e = errno;
            KVD_LOG_ERROR("nvme: fdatasync of file %u: %s", i, strerror(e));
            return kvd_status_from_errno(e);
        }
    }
    return KVD_OK;
}

kvd_status_t kvd_nvme_query(kvd_nvme_t *nvme, kvd_nvme_info_t *info_out)
{
    if (nvme == NULL || info_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_nvme_info_t info;
    memset(&info, 0, sizeof info);
    info.engine = nvme->engine;
    info.num_files = nvme->num_files;
    info.file_bytes = nvme->file_bytes;
    info.total_bytes = nvme->file_bytes * nvme->num_files;
    info.queue_depth = (uint32_t)nvme->cfg.queue_depth;
    pthread_mutex_lock(&nvme->mu);
    info.buffers = nvme->num_bufs;
    pthread_mutex_unlock(&nvme->mu);
    kvd_nvme_space_query(&nvme->space, &info.free_bytes, &info.largest_free);
    *info_out = info;
    return KVD_OK;
}

kvd_status_t kvd_nvme_stats(kvd_nvme_t *nvme, kvd_nvme_stats_t *stats_out)
{
    if (nvme == NULL || stats_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_nvme_stats_t st;
    st.reads = __atomic_load_n(&nvme->st.reads, __ATOMIC_RELAXED);
    st.writes = __atomic_load_n(&nvme->st.writes, __ATOMIC_RELAXED);
    st.bytes_read = __atomic_load_n(&nvme->st.bytes_read, __ATOMIC_RELAXED);
    st.bytes_written =
        __atomic_load_n(&nvme->st.bytes_written, __ATOMIC_RELAXED);
    st.read_errors = __atomic_load_n(&nvme->st.read_errors, __ATOMIC_RELAXED);
    st.write_errors = __atomic_load_n(&nvme->st.write_errors, __ATOMIC_RELAXED);
    pthread_mutex_lock(&nvme->mu);
    st.inflight = nvme->pending;
    pthread_mutex_unlock(&nvme->mu);
    *stats_out = st;
    return KVD_OK;
}

/* ---- open / close ------------------------------------------------------- */

/* Sets up the ring and its completion thread; -errno when io_uring cannot
 * be had (nothing to undo), else 0 or a positive errno of pthread_create. */
static int nvme_uring_start(kvd_nvme_t *nvme)
{
    int inject = KVD_FAILPOINT("nvme.uring_init");
    if (inject != 0) {
        return -inject;
    }
    unsigned entries = (unsigned)nvme->cfg.queue_depth;
    /* SUBMIT_ALL (5.18) keeps one bad SQE from holding back the rest of a
     * batch; older kernels refuse the flag. */
    int rc = io_uring_queue_init(entries, &nvme->ring, IORING_SETUP_SUBMIT_ALL);
    if (rc == -EINVAL) {
        rc = io_uring_queue_init(entries, &nvme->ring, 0);
    }
    if (rc < 0) {
        return rc;
    }
    nvme->ring_up = true;
    nvme->engine = KVD_NVME_ENGINE_URING;
    rc = pthread_create(&nvme->cq_thread, NULL, nvme_cq_main, nvme);
    if (rc != 0) {
        return rc;
    }
    nvme->cq_thread_up = true;
    return 0;
}

static kvd_status_t nvme_engine_start(kvd_nvme_t *nvme)
{
    kvd_nvme_engine_t want = (kvd_nvme_engine_t)nvme->cfg.engine;
    if (want != KVD_NVME_ENGINE_THREADS) {
        int rc = nvme_uring_start(nvme);
        if (rc > 0) {
            KVD_LOG_ERROR("nvme: completion thread: %s", strerror(rc));
            return kvd_status_from_errno(rc);
        }
        if (rc == 0) {
            return KVD_OK;
        }
        if (want == KVD_NVME_ENGINE_URING) {
            KVD_LOG_ERROR("nvme: io_uring unavailable: %s", strerror(-rc));
            return KVD_ERR_UNSUPPORTED;
        }
        KVD_LOG_WARN("nvme: io_uring unavailable (%s); using %llu "
                     "pread/pwrite threads",
                     strerror(-rc), (unsigned long long)nvme->cfg.threads);
    }
    nvme->engine = KVD_NVME_ENGINE_THREADS;
    for (uint32_t i = 0; i < nvme->cfg.threads; i++) {
        int rc =
            pthread_create(&nvme->workers[i], NULL, nvme_worker_main, nvme);
        if (rc != 0) {
            KVD_LOG_ERROR("nvme: worker thread: %s", strerror(rc));
            return kvd_status_from_errno(rc);
        }
        nvme->num_workers++;
    }
    return KVD_OK;
}

/* The parts of the tier that cannot fail, and its descriptors. */
static kvd_nvme_t *nvme_new(const kvd_nvme_config_t *cfg, uint64_t file_bytes)
{
    kvd_nvme_t *nvme = calloc(1, sizeof *nvme);
    if (nvme == NULL) {
        return NULL;
    }
    nvme->op_pool = calloc(cfg->queue_depth, sizeof *nvme->op_pool);
    if (nvme->op_pool == NULL) {
        free(nvme);
        return NULL;
    }
    for (uint64_t i = cfg->queue_depth; i-- > 0;) {
        nvme->op_pool[i].next = nvme->free_ops;
        nvme->free_ops = &nvme->op_pool[i];
    }
    nvme->cfg = *cfg;
    nvme->num_files = (uint32_t)cfg->num_files;
    nvme->file_bytes = file_bytes;
    nvme->blocks_per_file = (uint32_t)(file_bytes / KVD_NVME_BLOCK_BYTES);
    for (uint32_t i = 0; i < KVD_NVME_FILES_MAX; i++) {
        nvme->fds[i] = -1;
    }
    kvd_nvme_space_init(&nvme->space, nvme->num_files, file_bytes);
    pthread_mutex_init(&nvme->mu, NULL);
    pthread_mutex_init(&nvme->sq_mu, NULL);
    pthread_cond_init(&nvme->idle_cv, NULL);
    pthread_cond_init(&nvme->work_cv, NULL);
    return nvme;
}

kvd_status_t kvd_nvme_open(const kvd_nvme_config_t *cfg, kvd_nvme_t **nvme_out)
{
    uint64_t file_bytes = 0;
    if (cfg == NULL || nvme_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t status = kvd_nvme_config_check(cfg, &file_bytes);
    if (status != KVD_OK) {
        return status;
    }
    kvd_nvme_t *nvme = nvme_new(cfg, file_bytes);
    if (nvme == NULL) {
        return KVD_ERR_NOMEM;
    }
    int inject = KVD_FAILPOINT("nvme.open");
    if (inject != 0 || (mkdir(cfg->path, 0700) != 0 && errno != EEXIST)) {
        int e = inject != 0 ? inject : errno;
        KVD_LOG_ERROR("nvme: mkdir %s: %s", cfg->path, strerror(e));
        status = kvd_status_from_errno(e);
        goto err_close;
    }
    /* Room for every file first: a fallocate asking for more than the
     * file system has takes it to full before it fails. */
    status = kvd_nvme_space_check(cfg->path, nvme->num_files, file_bytes);
    if (status != KVD_OK) {
        goto err_close;
    }
    for (uint32_t i = 0; i < nvme->num_files; i++) {
        status = kvd_nvme_file_open(cfg->path, i, file_bytes, &nvme->fds[i]);
        if (status == KVD_OK) {
            status = kvd_nvme_space_add_file(&nvme->space, i);
        }
        if (status != KVD_OK) {
            goto err_close;
        }
    }
    status = nvme_engine_start(nvme);
    if (status != KVD_OK) {
        goto err_close;
    }
    KVD_LOG_INFO(
        "nvme: %u file(s) of %llu MiB in %s, %s, queue depth %llu",
        nvme->num_files, (unsigned long long)(file_bytes >> 20), cfg->path,
        nvme->engine == KVD_NVME_ENGINE_URING ? "io_uring" : "thread pool",
        (unsigned long long)cfg->queue_depth);
    *nvme_out = nvme;
    return KVD_OK;
err_close:
    /* close() undoes whatever part of the tier exists. */
    kvd_nvme_close(nvme);
    return status;
}

/* Waits until every accepted operation's callback has returned, then lets
 * the internal threads go. */
static void nvme_drain(kvd_nvme_t *nvme)
{
    pthread_mutex_lock(&nvme->mu);
    nvme->closing = true;
    pthread_mutex_unlock(&nvme->mu);
    if (nvme->ring_up) {
        /* SQEs a failed io_uring_submit left queued must reach the kernel
         * for the wait below to end. */
        pthread_mutex_lock(&nvme->sq_mu);
        nvme_sq_flush(nvme);
        pthread_mutex_unlock(&nvme->sq_mu);
    }
    pthread_mutex_lock(&nvme->mu);
    while (nvme->pending > 0) {
        pthread_cond_wait(&nvme->idle_cv, &nvme->mu);
    }
    nvme->stop = true;
    pthread_cond_broadcast(&nvme->work_cv);
    pthread_mutex_unlock(&nvme->mu);
    for (uint32_t i = 0; i < nvme->num_workers; i++) {
        pthread_join(nvme->workers[i], NULL);
    }
    if (nvme->cq_thread_up) {
        pthread_mutex_lock(&nvme->sq_mu);
        struct io_uring_sqe *sqe = nvme_sqe_get(nvme);
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data(sqe, &nvme_stop_token);
        nvme_sq_flush(nvme);
        pthread_mutex_unlock(&nvme->sq_mu);
        pthread_join(nvme->cq_thread, NULL);
    }
}

void kvd_nvme_close(kvd_nvme_t *nvme)
{
    if (nvme == NULL) {
        return;
    }
    nvme_drain(nvme);
    if (nvme->ring_up) {
        if (nvme->num_bufs > 0) {
            (void)io_uring_unregister_buffers(&nvme->ring);
        }
        io_uring_queue_exit(&nvme->ring);
    }
    for (uint32_t i = 0; i < KVD_NVME_FILES_MAX; i++) {
        if (nvme->fds[i] >= 0) {
            close(nvme->fds[i]);
        }
    }
    free(nvme->bufs);
    free(nvme->op_pool);
    pthread_cond_destroy(&nvme->work_cv);
    pthread_cond_destroy(&nvme->idle_cv);
    pthread_mutex_destroy(&nvme->sq_mu);
    pthread_mutex_destroy(&nvme->mu);
    kvd_nvme_space_cleanup(&nvme->space);
    free(nvme);
}
