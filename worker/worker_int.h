/*
 * The worker's state, shared by worker.c (API, plans, reports), exec.c
 * (threads, promotions, the copy tasks), commit.c (the end of a step's
 * saves: commit or abort) and the device backends behind
 * wdevice_ops_t: device_host.c (CPU reference kernels) and device_cuda.c
 * (side streams with the kernels of kernels/cuda).
 *
 * One mutex, `mu`, guards everything below that more than one thread
 * touches: the task queue, the promotion backlog, the step's counters, the
 * asynchronous requests, the finished queues and the stats. Copies run
 * without it. Lock order: mu, then the store's locks (the store never calls
 * back). A block's fields are written by one thread at a time: the engine
 * thread while resolving, the poller when its promotion completes, then
 * tasks (status only, under mu).
 */
#ifndef KVD_WORKER_INT_H
#define KVD_WORKER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvdepot/worker.h"

#define WORKER_ID_BYTES 257 /* KVD_PROTO_MAX_ID_BYTES + NUL */

typedef struct wreq wreq_t;
typedef struct wstep wstep_t;

/* One engine block to load or save. */
typedef struct wblock {
    struct kvd_worker *worker; /* whose block: promotions are routed by it */
    wreq_t *req;
    int32_t block_id;
    kvd_block_hash_t hash;
    kvd_store_lease_t lease; /* load: valid while `leased` */
    bool leased;
    uint64_t arena_offset; /* save: the reservation's slot */
    void *obj;             /* the object's bytes in the arena */
    kvd_status_t status;   /* first error, or KVD_OK */
    bool aborted;          /* save: aborted with its step (saves_aborted) */
    uint64_t position;     /* the block's first token in the request */
    bool content;          /* load: by content key, may need rotating */
    int64_t delta;         /* load: rotate keys by this (header check) */
    bool bad_header;       /* load: refused by its header (header_errors) */
} wblock_t;

typedef enum wtask_kind {
    WTASK_LOAD, /* one layer of a chunk of the step's synchronous loads */
    WTASK_SAVE, /* one layer of a chunk of the step's saves */
    WTASK_ASYNC /* every layer of one asynchronous request */
} wtask_kind_t;

typedef struct wtask wtask_t;
struct wtask {
    wtask_t *next;
    wtask_kind_t kind;
    wstep_t *step; /* WTASK_LOAD, WTASK_SAVE */
    uint32_t layer;
    size_t first, count; /* range of the step's arrays */
    wreq_t *req;         /* WTASK_ASYNC */
};

/* One request's part of a plan. Synchronous requests live as long as their
 * step; asynchronous ones move to the worker's list and live until their
 * loads finish. */
struct wreq {
    wreq_t *next; /* the worker's asynchronous list */
    char id[WORKER_ID_BYTES];
    bool async_load, layerwise;
    wblock_t *loads;
    size_t n_loads;
    wblock_t *saves;
    size_t n_saves;
    /* Asynchronous loads. */
    size_t gets_pending; /* promotions not completed */
    bool canceled;       /* the engine finished the request */
    bool running;        /* the copy task started */
    wtask_t task;
    uint64_t load_start_ns; /* loads_start, for the tier timings */
    bool load_disk;         /* some block was on the NVMe tier */
    int32_t *ids;           /* n_loads: the blocks the copy writes */
    void **objs;
    int64_t *deltas; /* n_loads: their rotations (content loads) */
};

struct wstep {
    uint64_t step;
    wreq_t **reqs;
    size_t n_reqs;
    /* Synchronous loads. */
    wblock_t **sync;
    size_t n_sync;
    bool any_sync_whole; /* some request is not layerwise */
    bool loads_started;
    size_t gets_pending;
    bool loads_issued; /* resolved; tasks queued (or none needed) */
    bool loads_done;   /* every copy done, leases given back */
    int32_t *load_ids;
    void **load_objs;
    int64_t *load_deltas; /* rotations of the loads (content loads) */
    bool any_delta;
    wblock_t **load_blocks;
    size_t n_load_ok;
    uint32_t *layer_left; /* per layer: load tasks not finished */
    size_t load_tasks_left;
    /* Saves: the reserved ones. */
    wblock_t **saves;
    int32_t *save_ids;
    void **save_objs;
    size_t n_saves;
    kvd_store_key_t *save_keys; /* n_saves: for the commit */
    wblock_t **save_order;
    kvd_status_t *save_status;
    bool *save_issued; /* per layer */
    size_t save_tasks_left;
    bool saves_done;     /* committed or aborted (kvd_worker_step_end) */
    kvd_namespace_t ns;  /* cfg.ns at bind: the saves' keys and headers */
    uint64_t save_bytes; /* reserved: n_saves objects (inflight_save_bytes) */
    /* Saves outliving the step (cfg.async_saves): wait_for_save put the
     * step on the drain list, and the committer ends its saves once the
     * copies ran. `released`: the engine is done with the step (cleared,
     * or the next plan bound), so the committer frees it. */
    bool detached, released;
    wstep_t *drain_next;
    /* Task storage: layers * (load chunks + save chunks), used in order. */
    wtask_t *tasks;
    size_t n_tasks, used_tasks;
    /* CUDA backend: the step's block ids (and the loads' rotations) are on
     * the device (its lock). */
    bool dev_load_ids, dev_save_ids, dev_load_deltas;
    void *dev_buf; /* their arrays, the step's until its copies ran */
};

/* Loads finished since the last report, of one tier (WorkerReport
 * tier_loads: the leader's gate learns each tier's cost). */
typedef struct wtier {
    uint64_t loads, blocks, bytes, nanos;
} wtier_t;

typedef struct wfin {
    char id[WORKER_ID_BYTES];
    bool async;
} wfin_t;

typedef struct wfail {
    char id[WORKER_ID_BYTES];
    int32_t block_id;
    kvd_status_t status;
} wfail_t;

/* A queue whose room is reserved before the work that fills it starts, so
 * pushing never allocates (and never loses a report). */
typedef struct wqueue {
    void *items;
    size_t num, cap, reserved, item_bytes;
} wqueue_t;

typedef struct wcuda wcuda_t;
typedef struct wdevice_ops wdevice_ops_t;

struct kvd_worker {
    kvd_worker_config_t cfg;
    kvd_store_t *store;
    kvd_codec_tables_t *tables;
    size_t object_bytes;  /* stored: payload + header */
    size_t payload_bytes; /* kvd_object_bytes(format): the header's offset */
    /* The stored object's format: cfg.format, or with cfg.object_heads the
     * whole object's (every rank's heads); then `shard` is set, this
     * worker's heads are part `part` of `num_parts`, and the copies go
     * through the worker's own format (kvd_object_shard_ranges). */
    kvd_object_format_t store_fmt;
    bool shard;
    bool shard_direct; /* host backend: the heads' ranges are aligned, the
                          kernels write and read them in place */
    uint32_t part, num_parts;
    bool header_logged; /* the first header mismatch was logged in full */
    uint32_t num_threads;

    bool registered;
    kvd_kv_layout_t layout;
    void **bases;

    wstep_t *step; /* bound plan, or NULL */
    uint64_t last_step;
    /* Steps whose saves outlive them (cfg.async_saves), oldest first, and
     * the object bytes reserved by those and by the bound step (mu). */
    wstep_t *drain_head, *drain_tail;
    uint64_t inflight_save_bytes, max_inflight_save_bytes;
    bool async_saves; /* cfg.async_saves */
    /* The bound step's start_load_kv orders the engine's stream after the
     * copies of earlier steps (bind found steps draining). */
    bool order_reads;
    pthread_t committer;
    bool committer_started;

    /* Held around kvd_store_poll/wait: the store's completion queue has one
     * consumer at a time, and the workers on one store (one per vLLM
     * KV-cache group) share it. */
    pthread_mutex_t *poll_mu;
    kvd_namespace_t plan_ns; /* cfg.plan_ns, or cfg.ns when that is zero */

    pthread_mutex_t mu;
    pthread_cond_t task_cv; /* the task queue is not empty */
    pthread_cond_t done_cv; /* a task, promotion or request finished */
    pthread_cond_t poll_cv; /* promotions to submit or to poll */
    wtask_t *q_head, *q_tail;
    wreq_t *async; /* asynchronous requests not finished */
    size_t async_active;
    bool stopping; /* destroy: cancel what has not started */
    bool quit;     /* threads leave once idle */

    /* Promotions: submitted and not polled, and not yet accepted. */
    size_t gets_outstanding;
    kvd_store_get_t *backlog;
    size_t n_backlog, cap_backlog;

    wqueue_t fin_save, fin_load, failed;
    wtier_t tier_acc[2]; /* host, disk (mu) */
    /* What the last get_finished handed out. */
    wfin_t *taken_save, *taken_load;
    wfail_t *taken_failed;
    size_t cap_taken_save, cap_taken_load, cap_taken_failed;
    size_t cap_out_save, cap_out_load, cap_out_async, cap_out_failed;
    const char **out_save, **out_load;
    bool *out_async;
    kvd_worker_failed_load_t *out_failed;
    uint8_t *report;

    int efd;
    kvd_worker_stats_t st;
    /* st.copy_ops, counted by the CUDA backend under its own lock. */
    atomic_uint_fast64_t copy_ops;

    pthread_t *threads;
    uint32_t threads_started;
    pthread_t poller;
    bool poller_started;

    /* The device backend (cfg.device): every place the backends differ
     * calls through it. Set by kvd_worker_create before anything can
     * fail, never changed. */
    const wdevice_ops_t *dev;
    /* kvd_worker_set_rope: rotations of content loads; rope_gen counts the
     * calls (a backend's copy of the rope is remade when it changed). */
    bool has_rope;
    kvd_rope_t rope;
    uint32_t rope_gen;
    /* The CUDA backend's state, device_cuda.c's alone; NULL otherwise. */
    wcuda_t *cuda;
};

/* ---- worker.c ----------------------------------------------------------- */

/* Gives back room reserved and not used (mu held). */
void kvd_worker_queue_unreserve(wqueue_t *q, size_t n);
/* Appends to a queue whose room was reserved (mu held). */
void kvd_worker_queue_push(kvd_worker_t *w, wqueue_t *q, const void *item);
/* Wakes kvd_worker_fd sleepers (mu held or not). */
void kvd_worker_notify(kvd_worker_t *w);
/* Frees a step that no thread uses any more. */
void kvd_worker_step_free(wstep_t *s);
/* Some step not ended yet (the bound one or one draining) saves for
 * request `id` (mu held). */
bool kvd_worker_req_saving(const kvd_worker_t *w, const char *id);

/* ---- commit.c ----------------------------------------------------------- */

/* Commits the step's reserved objects whose copies succeeded and aborts the
 * others, counting each (mu held). */
void kvd_worker_saves_commit(kvd_worker_t *w, wstep_t *s);
/* Ends the step's saves (engine thread, mu not held; loads started, and
 * every layer to copy issued): waits for the step's copies and synchronous
 * loads, finishes them, then commits the saves, or, when `abort_why` is not
 * NULL, aborts every one not failed already (logged with that reason);
 * queues the requests as finished saving and sets saves_done. */
void kvd_worker_step_end(kvd_worker_t *w, wstep_t *s, const char *abort_why);
/* cfg.async_saves: hands the step's saves to the committer (engine thread,
 * mu not held; every layer to copy issued): waits only for the step's
 * synchronous loads, then puts the step on the drain list. */
void kvd_worker_step_detach(kvd_worker_t *w, wstep_t *s);
/* cfg.async_saves, at bind: waits until the copies of the steps still
 * draining ran (host) or are enqueued (CUDA; sets order_reads for the
 * step's start_load_kv), since the engine may reuse their blocks from its
 * next step on (engine thread, mu not held). */
void kvd_worker_earlier_copies_wait(kvd_worker_t *w);
/* When the last earlier_copies_wait found steps draining: makes the
 * engine's `stream` wait for every copy enqueued so far (CUDA; on failure
 * waits for them on the CPU and returns the error). Engine thread. */
kvd_status_t kvd_worker_reads_order(kvd_worker_t *w, void *stream);
/* The committer thread: ends the saves of each drained step, oldest
 * first, once its copies ran; leaves when `quit` is set and nothing is
 * left to drain. */
void *kvd_worker_committer_main(void *arg);

/* ---- exec.c ------------------------------------------------------------- */

kvd_status_t kvd_worker_exec_start(kvd_worker_t *w);
/* Cancels what has not started, drains the rest and stops the threads. */
void kvd_worker_exec_stop(kvd_worker_t *w);

/* Starts the step's loads: resolves every block in the store, queues the
 * synchronous copies and hands asynchronous requests to the background
 * (engine thread, mu not held). */
void kvd_worker_loads_start(kvd_worker_t *w, wstep_t *s);
/* Queues the copies of layer `layer` of the step's saves (mu held). */
void kvd_worker_saves_issue(kvd_worker_t *w, wstep_t *s, uint32_t layer);
/* Frees a request (its blocks must hold no lease). */
void kvd_worker_req_free(wreq_t *r);
/* How many copy tasks share `n` blocks of one layer. */
size_t kvd_worker_chunks(const kvd_worker_t *w, size_t n);
/* Every synchronous load copy of the step is enqueued (host backend: and
 * done), or none was needed (mu held). */
bool kvd_worker_loads_enqueued(const wstep_t *s);
/* Once every copy task of the step ran (mu held, may drop it): a backend
 * whose tasks only enqueue (CUDA) drains its copies, fails the step's
 * blocks on a device error, and then gives the loads' leases back and
 * reports them. The host backend has nothing left to do. */
void kvd_worker_copies_finish(kvd_worker_t *w, wstep_t *s);

/* ---- device backends ----------------------------------------------------
 *
 * The copy step of the shared pipeline and the ordering around it. exec.c
 * and worker.c plan, resolve, promote, lease, report and commit the same
 * way for every backend; they call these at the few points where the
 * backends differ. create / destroy / register_caches and the engine-stream
 * calls (stream_wait, save_order, drain) run on the engine thread; load,
 * save and load_async on pool threads, without mu. Every call returns
 * KVD_OK or the error that fails the blocks concerned. */

/* stream_wait's layer for "every layer". */
#define KVD_WORKER_ALL_LAYERS UINT32_MAX

struct wdevice_ops {
    /* After the codec tables, before the threads start: the backend's
     * state (err gets the reason on failure). */
    kvd_status_t (*create)(kvd_worker_t *w, char *err, size_t err_len);
    /* After the threads stopped; also after a failed or skipped create. */
    void (*destroy)(kvd_worker_t *w);
    /* The layout passed its checks and no plan is bound: the backend's
     * own checks and resources (err gets the reason on failure). */
    kvd_status_t (*register_caches)(kvd_worker_t *w,
                                    const kvd_kv_layout_t *layout, char *err,
                                    size_t err_len);
    /* How many copy tasks share `n` blocks of one layer. */
    size_t (*chunks)(const kvd_worker_t *w, size_t n);
    /* A finished copy task has done its copies (host). False: it only
     * enqueued them, and drain at wait_for_save finishes the step's loads
     * (kvd_worker_copies_finish). */
    bool tasks_complete;
    /* Layer `layer` of the step's loads [first, first + count). */
    kvd_status_t (*load)(kvd_worker_t *w, wstep_t *s, uint32_t layer,
                         size_t first, size_t count);
    /* Layer `layer` of the step's saves [first, first + count). */
    kvd_status_t (*save)(kvd_worker_t *w, wstep_t *s, uint32_t layer,
                         size_t first, size_t count);
    /* Every layer of one asynchronous request's `n` blocks (n > 0), keys
     * rotated by deltas[i] (NULL: none); returns once the copies are done,
     * so the leases may go. */
    kvd_status_t (*load_async)(kvd_worker_t *w, const int32_t *ids,
                               void *const *objs, const int64_t *deltas,
                               size_t n);
    /* Makes the engine's `stream` wait for layer `layer`'s loads (or
     * every layer's) once they are enqueued. */
    kvd_status_t (*stream_wait)(kvd_worker_t *w, uint32_t layer, void *stream);
    /* Orders the next saves after the work on the engine's `stream`. */
    kvd_status_t (*save_order)(kvd_worker_t *w, void *stream);
    /* Orders the engine's `stream` after every copy enqueued so far (the
     * saves of earlier steps read the cache until they ran). */
    kvd_status_t (*reads_order)(kvd_worker_t *w, void *stream);
    /* Blocks until every copy enqueued so far has run. */
    kvd_status_t (*drain)(kvd_worker_t *w);
    /* After drain: the step's copies ran, its per-step device state may
     * be reused (NULL: none). */
    void (*step_done)(kvd_worker_t *w, wstep_t *s);
    /* The backend rotates loaded keys (content loads, kvd_worker_set_rope):
     * `load` by s->load_deltas when s->any_delta, `load_async` by its
     * `deltas` when not NULL, each layer before it is reported loaded.
     * False: such loads fail. */
    bool can_rotate;
};

/* The host backend (device_host.c): the cache in host memory, the CPU
 * reference kernels on the pool threads; the stream calls do nothing. */
extern const wdevice_ops_t kvd_worker_device_host;

/* The CUDA backend (device_cuda.c, built with KVD_HAVE_CUDA); NULL in a
 * build without it. */
#ifdef KVD_HAVE_CUDA
extern const wdevice_ops_t kvd_worker_device_cuda;
#define KVD_WORKER_DEVICE_CUDA_OPS (&kvd_worker_device_cuda)
#else
#define KVD_WORKER_DEVICE_CUDA_OPS ((const wdevice_ops_t *)NULL)
#endif

#endif /* KVD_WORKER_INT_H */
