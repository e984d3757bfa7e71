/*
 * kvdepot worker: the engine-process side of the connector
 * (worker/README.md, docs/architecture.md §6).
 *
 * A worker executes the leader's step plans (packed kvdepot.v1.StepPlan)
 * against the engine's paged KV cache, layer by layer, without blocking the
 * forward pass longer than the data it needs. It mirrors the worker role of
 * vLLM's KVConnectorBase_V1 and TensorRT-LLM's KvCacheConnectorWorker; one
 * engine step, in the engine's order:
 *
 *   bind_metadata        (the step's plan)
 *   start_load_kv        (starts every load of the plan)
 *   per layer l:  wait_for_layer_load(l) ... attention ... save_kv_layer(l)
 *   wait_for_save        (saves copied out of the cache and committed;
 *                         abort_step instead when the step failed)
 *   get_finished         (what finished since the last call -> the report
 *                         for the leader's update_connector_output)
 *   clear_metadata
 *
 * Loads. Each block to load is resolved in the store by its key: the worker
 * takes its own lease (the leader's lease only kept the block until now),
 * brings a DISK-tier object into the host arena (kvd_store_get_submit), then
 * decodes it layer by layer into the listed engine block (CPU reference
 * kernels, kernels.h). A request whose plan says `async_load` loads in the
 * background, across steps, and is reported in finished_loading when all its
 * blocks are in place; the engine runs it only after that. A synchronous
 * load must be in place before the layer that reads it: with `layerwise`,
 * wait_for_layer_load(l) returns once layer l of every synchronous load of
 * the step is written; without it, start_load_kv returns once all are.
 * A block that cannot be loaded (not stored any more, bad checksum, I/O
 * error) is reported in failed_loads with its status, and its engine block
 * is left as it was; the request's other blocks still load.
 *
 * Saves. bind_metadata reserves an arena slot for every block to save
 * (a key stored already is skipped; a full arena or tenant quota drops the
 * save and counts it). save_kv_layer(l) copies layer l of every saved block
 * out of the cache, encoding it with the format's codecs, in the
 * background. wait_for_save copies the layers not copied yet, waits until
 * every copy of the step is done (after it returns the engine may reuse the
 * blocks), commits the objects and queues the requests as finished_saving.
 *
 * A step's saves are all or nothing: an object is committed only by
 * wait_for_save, and only with every layer the engine computed in the step.
 * With `layerwise_saves` (the engine calls save_kv_layer for every layer it
 * computed, as vLLM does) a layer save_kv_layer was not called for means
 * the forward pass stopped short: wait_for_save then commits nothing of the
 * step. Without it (an engine that saves at the end only) wait_for_save
 * copies the layers itself. A step that ends without wait_for_save
 * (clear_metadata, the next bind_metadata, destroy) or that the engine
 * says failed (kvd_worker_abort_step) commits nothing either. Aborted saves
 * give their reservations back, are counted in stats (saves_aborted), and
 * their requests are still reported as finished_saving (nothing of them is
 * in flight); a later lookup of their keys misses.
 *
 * Device backends. KVD_WORKER_DEVICE_HOST: the cache is in host memory and
 * a pool of threads runs the CPU reference kernels (what CI, the demo and
 * the Python tests use). `stream` arguments are the engine's device stream
 * for a device backend and are ignored by the host backend.
 *
 * KVD_WORKER_DEVICE_CUDA: the cache is in GPU memory (every layer base on
 * one device) and the copies run on the device with kernels/cuda, on a
 * side stream the worker owns; `stream` is the engine's cudaStream_t
 * (NULL: the legacy default stream). register_kv_caches allocates, once:
 * the side stream, one event per layer, a device staging buffer of
 * cuda_staging_blocks slots of one layer each, device block-id arrays, the
 * codec tables on the device, and page-locks the store's arena
 * (cudaHostRegister, shared by the process's workers; when that fails copies
 * stay pageable, slower, with a warning). The mapping stays held
 * (kvd_store_arena_hold) while it is registered; after a daemon restart the
 * client's new mapping is registered before the next copy. The per-step calls
 * then allocate nothing (but for that re-registration) and block the host only
 * where said:
 *   - start_load_kv / wait_for_layer_load(l) return once layer l's copies
 *     are *enqueued* on the side stream (the object's layer bytes from the
 *     arena into staging, then the decode-and-scatter kernel) and make
 *     `stream` wait for them (cudaStreamWaitEvent): work the engine
 *     enqueues on `stream` afterwards sees the layer; the host does not
 *     wait for the GPU.
 *   - save_kv_layer(l) orders the side stream after the work already on
 *     `stream`, then (from a worker thread) enqueues the gather-and-encode
 *     of layer l into staging and the copies into the reserved arena
 *     slots; the engine must not overwrite the saved blocks before
 *     wait_for_save returns.
 *   - wait_for_save synchronizes the side stream (the host waits for the
 *     step's copies, loads included), then gives the loads' leases back,
 *     reports them, and commits the saves. Layers save_kv_layer was not
 *     called for are ordered after wait_for_save's `stream`.
 *   - asynchronous loads are enqueued and waited for by a worker thread;
 *     they are reported only once in the cache.
 * A CUDA error fails the blocks it touched (reported and counted like any
 * failed load or save); a fault that poisons the context fails every copy
 * after it. Worker threads make the caches' device current for
 * themselves; the engine thread's current device is never changed.
 *
 * The store. Any kvd_store_t (store.h), embedded or daemon mode; the
 * worker uses only the store.h calls. Several workers on one store (one
 * per KV-cache group of a hybrid model, each with its own layers and
 * namespace) take turns draining its completions and hand each to the
 * worker it belongs to. An embedded store serves one process; engines with
 * several worker processes use the daemon (each process opens its own
 * daemon-mode store).
 *
 * Completion model (docs/architecture.md §9): submitting says "accepted";
 * what finished is
 * drained with kvd_worker_get_finished (non-blocking); kvd_worker_fd is
 * readable when something may be ready. Every accepted load and save
 * finishes exactly once: done, failed, aborted with its step (saves), or
 * canceled by kvd_worker_destroy (loads).
 *
 * Threading: one engine thread calls a worker at a time (the engine's
 * forward thread); kvd_worker_fd and kvd_worker_stats may also be called
 * from any other thread. The worker's own threads never call user code.
 * Distinct workers are independent.
 */
#ifndef KVDEPOT_WORKER_H
#define KVDEPOT_WORKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvdepot/common.h"
#include "kvdepot/kernels.h"
#include "kvdepot/store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvd_worker kvd_worker_t;

typedef enum kvd_worker_device {
    KVD_WORKER_DEVICE_HOST = 0, /* host memory, CPU reference kernels */
    KVD_WORKER_DEVICE_CUDA = 1  /* GPU memory, kernels/cuda, a side stream */
} kvd_worker_device_t;

/* Most threads of the host backend. */
#define KVD_WORKER_MAX_THREADS 64u

typedef struct kvd_worker_config {
    kvd_store_t *store; /* either mode, borrowed: open until destroy */
    kvd_namespace_t ns; /* where this worker's objects are stored */
    /* How this worker's share of one block is stored: dtype, layers,
     * planes, heads, head_dim, block_size, codecs (kernels.h). */
    kvd_object_format_t format;
    uint32_t worker_rank; /* written into reports */
    uint32_t tenant;      /* quota domain of the saves (store.h) */
    uint32_t num_threads; /* copy threads, 0 = 2 (CUDA: they enqueue) */
    kvd_worker_device_t device;
    /* The namespace the leader's plans name blocks in, when it is not `ns`:
     * with tensor parallelism the leader plans in rank 0's namespace and
     * each rank loads and saves the same block hashes in its own (its shard
     * of the heads). All zero: `ns`. Every key of a plan must be in it. */
    kvd_namespace_t plan_ns;
    /* CUDA backend: blocks the device staging buffer holds, one layer
     * each (a layer's copies go in chunks of that many blocks); 0 = 64,
     * at most 65536.
     * Ignored by the host backend. */
    uint32_t cuda_staging_blocks;
    /* The engine calls kvd_worker_save_kv_layer for every layer it computes
     * in a step (vLLM's attention layers do). Then wait_for_save commits a
     * step's objects only when save_kv_layer was called for every layer,
     * and aborts them all otherwise (a forward pass that stopped after
     * some layers left the others stale). false: the engine may save only
     * at the end, and wait_for_save copies the layers not saved yet. */
    bool layerwise_saves;
    /* Saves outlive their step: wait_for_save returns once the step's
     * copies are queued, without waiting for them or for the commit; the
     * worker's committer thread commits each step's objects (all or
     * nothing, as always) when its copies ran, and reports its requests as
     * finishing saving then (vLLM finished_sending). The engine must not
     * give a finished request's blocks away before that report: vLLM
     * keeps them while request_finished said delay_free. The copies out
     * of the cache end before the next step (engines also reuse blocks
     * of running requests: vLLM a preempted request's, those that left a
     * sliding window): bind_metadata waits for the earlier steps' copies
     * (CUDA: their enqueueing, and start_load_kv orders the engine's
     * stream after them; kvd_worker_blocks_fence for writes before the
     * bind), so only the commits outlive the step.
     * kvd_worker_flush_saves waits for all of them. Both backends; CUDA:
     * the committer waits for the side stream, and a step's block-id
     * arrays stay its own until then. */
    bool async_saves;
    /* With async_saves: the most object bytes reserved for saves not yet
     * committed, the bound step's and the draining steps' together; a
     * plan's saves beyond it are not reserved (saves_shed), so a slow
     * store costs saves, never a stalled step. 0 = 1 GiB; at least one
     * object (kvd_object_stored_bytes). */
    uint64_t max_inflight_save_bytes;
    /* Objects shared by tensor-parallel ranks (docs/codecs.md, "Head
     * ranges"): the stored object holds `object_heads` KV heads, of which
     * this worker holds heads [head_start, head_start + format.num_heads).
     * Each rank encodes its heads in its own format and writes them into
     * the one object of the block (kvd_store_reserve_part: part
     * head_start / format.num_heads of object_heads / format.num_heads),
     * which is published when every part has committed; a load reads the
     * worker's heads of the object, whichever split wrote it. So `ns` must
     * name the whole object (every head, no TP rank): workers at any TP
     * size share it. Ranks holding the same heads (fewer KV heads than
     * ranks) write one part between them: the first to reserve it. 0: the
     * object holds this worker's heads only (object_heads =
     * format.num_heads, head_start 0). Needs object_heads a multiple of
     * format.num_heads, head_start a multiple of it, at most
     * KVD_STORE_MAX_PARTS parts, a format whose heads are byte ranges
     * (kvd_object_shard_format), and a store that writes objects in parts
     * (embedded, or a kvdepotd of protocol revision 9 or later; an older
     * one's saves are dropped, each KVD_ERR_UNSUPPORTED). The host backend
     * encodes straight into the object's ranges when they are 16-byte
     * aligned (kvd_object_shard_direct), else through a buffer. */
    uint32_t object_heads;
    uint32_t head_start;
    /* CUDA backend: how objects' layer regions move between the arena and
     * staging (kvd_worker_copy_mode_t). Runs: objects whose regions lie at
     * one stride in the pinned arena (slots handed out one after another,
     * as a step's saves are) move as one 2D copy per run
     * (cudaMemcpy2DAsync). Per object: one copy each, a chunk's copies
     * handed to the driver as one batch (cudaMemcpyBatchAsync where the
     * runtime has it), which costs the host about 0.75 us a copy on an
     * H200. KVD_WORKER_COPY_AUTO (0, the default): per object for regions
     * of at least KVD_WORKER_COPY_RUN_BELOW bytes, which take the copy
     * engine longer than they take to enqueue, runs below (measured in
     * docs/performance.md); the other two force one way, for comparison
     * (bench_worker). Another value: KVD_ERR_INVALID at create. */
    uint8_t cuda_copy_mode;
    /* CUDA backend: staging buffers used in turn, so the copy engine moves
     * one while a kernel fills or drains another. 0: the default, 2; 1: a
     * chunk's copies and kernel wait for the previous chunk's (for
     * comparison, bench_worker); at most KVD_WORKER_MAX_STAGING_BUFFERS,
     * else kvd_worker_create answers KVD_ERR_INVALID. */
    uint32_t cuda_staging_buffers;
} kvd_worker_config_t;

#define KVD_WORKER_MAX_STAGING_BUFFERS 4u

/* kvd_worker_config_t.cuda_copy_mode. */
typedef enum kvd_worker_copy_mode {
    KVD_WORKER_COPY_AUTO = 0,
    KVD_WORKER_COPY_RUNS = 1,
    KVD_WORKER_COPY_PER_OBJECT = 2,
} kvd_worker_copy_mode_t;

/* KVD_WORKER_COPY_AUTO: a layer region this long or longer is copied on
 * its own (about 0.9 us of an H200's copy engine, more than the 0.75 us its
 * enqueue costs); shorter ones move in runs. */
#define KVD_WORKER_COPY_RUN_BELOW 49152u

/*
 * Creates a worker and starts its threads (the copy pool and the store
 * poller). `cfg` is copied; cfg->store is borrowed and must stay open
 * until kvd_worker_destroy. The format is checked (kvd_object_format_check)
 * and its codec tables built. On success *worker_out is the worker, valid
 * until kvd_worker_destroy. Errors (nothing is left running; *worker_out
 * untouched), with a reason in `err` (at most err_len bytes; may be NULL
 * when err_len is 0): KVD_ERR_INVALID (NULL cfg, store or out, bad format,
 * num_threads > KVD_WORKER_MAX_THREADS, cuda_staging_blocks > 65536, or
 * async_saves with a max_inflight_save_bytes below one object's bytes),
 * KVD_ERR_UNSUPPORTED (not a device backend, a format a codec cannot
 * serve, or KVD_WORKER_DEVICE_CUDA in a build without CUDA),
 * KVD_ERR_NO_DEVICE (KVD_WORKER_DEVICE_CUDA on a machine without a usable
 * GPU or driver), KVD_ERR_DEVICE (the CUDA runtime failed to count them),
 * KVD_ERR_STATE (workers of this process already use 64 other stores: the
 * table of stores whose completions workers share is full),
 * KVD_ERR_NOMEM (memory, or a thread that could not be started), or the
 * translated errno of the worker's eventfd. Device memory is allocated
 * later, by kvd_worker_register_kv_caches, on the caches' device.
 */
KVD_API kvd_status_t kvd_worker_create(const kvd_worker_config_t *cfg,
                                       kvd_worker_t **worker_out, char *err,
                                       size_t err_len);

/*
 * Shuts the worker down: a plan still bound is ended first as
 * kvd_worker_clear_metadata does (its saves not committed by wait_for_save
 * are aborted, never committed), loads not started yet are canceled (their
 * blocks are not written), running copies finish, promotions in flight are
 * drained, reservations not committed are aborted and every lease is given
 * back; then the threads stop and everything is freed, including what
 * kvd_worker_get_finished returned and kvd_worker_fd. The engine's cache
 * is not touched after it returns; the store stays open (the caller's).
 * NULL is accepted. The engine thread, no other call running.
 */
KVD_API void kvd_worker_destroy(kvd_worker_t *worker);

/*
 * Registers the engine's cache: per-layer base pointers and byte strides
 * (kvd_kv_layout_t; the array of bases is copied). Checked against the
 * format with kvd_kv_layout_check: overlapping or out-of-range strides are
 * refused with the reason in `err`. May be called again to replace the
 * layout when no plan is bound and no asynchronous load is in flight
 * (else KVD_ERR_STATE). Errors: KVD_ERR_INVALID (NULL worker, layout or
 * layer_base; a layout kvd_kv_layout_check refuses), or the format's own
 * error from that check; nothing changes on error. The memory the bases
 * point at is borrowed until the layout is replaced or the worker is
 * destroyed.
 *
 * CUDA backend: every base must be device memory of one device, else
 * KVD_ERR_INVALID saying which layer; the first call (and a call with
 * caches on another device) allocates the backend's device resources
 * there, and may then also fail with KVD_ERR_NOMEM, KVD_ERR_DEVICE or
 * KVD_ERR_NO_DEVICE (the previous registration then stays).
 */
KVD_API kvd_status_t kvd_worker_register_kv_caches(
    kvd_worker_t *worker, const kvd_kv_layout_t *layout, char *err,
    size_t err_len);

/*
 * Binds the plan of the next step (packed StepPlan bytes, untrusted: they
 * are unpacked and validated, and every key must be in the worker's
 * namespace, the block size the format's, every block id inside the
 * registered cache). A plan still bound is ended first as
 * kvd_worker_clear_metadata does: its saves not committed by wait_for_save
 * are aborted (the engine did not finish that step). Reserves the arena
 * slots of the plan's
 * saves; a save the store refuses per key (stored already: skipped; no
 * slot, quota, or in daemon mode a daemon that cannot be reached: dropped
 * and counted) is not an error. `plan` is borrowed for the call. Errors
 * (nothing of the plan is done; the reason in `err`):
 * KVD_ERR_INVALID (NULL, or the store refused the reservation call: an
 * object larger than an arena chunk), KVD_ERR_STATE (no cache
 * registered), KVD_ERR_PROTO (malformed plan, another block size, a key
 * of another namespace; daemon mode: the daemon found the reserve
 * malformed), KVD_ERR_RANGE (a block id outside the cache), KVD_ERR_NOMEM.
 */
KVD_API kvd_status_t kvd_worker_bind_metadata(kvd_worker_t *worker,
                                              const void *plan, size_t len,
                                              char *err, size_t err_len);

/*
 * Starts every load of the bound plan. Returns at once when every request
 * with synchronous loads is `layerwise`; otherwise when the synchronous
 * loads are in place (CUDA: enqueued, with `stream` made to wait for
 * them). No plan bound: nothing to do, KVD_OK. A load that fails is not
 * an error here: it is reported per block by kvd_worker_get_finished.
 * Errors: KVD_ERR_INVALID (NULL worker); CUDA: KVD_ERR_DEVICE when
 * `stream` could not be made to wait.
 */
KVD_API kvd_status_t kvd_worker_start_load_kv(kvd_worker_t *worker,
                                              void *stream);

/*
 * Returns once layer `layer` of every synchronous load of the step is in
 * the cache (or failed); CUDA: once it is enqueued, with `stream` made to
 * wait for it (work enqueued on `stream` afterwards sees it). Starts the
 * loads if start_load_kv was not called. No plan bound: KVD_OK. Errors:
 * KVD_ERR_INVALID (NULL worker), KVD_ERR_RANGE (layer >= num_layers);
 * CUDA: KVD_ERR_DEVICE (`stream` could not be made to wait).
 */
KVD_API kvd_status_t kvd_worker_wait_for_layer_load(kvd_worker_t *worker,
                                                    uint32_t layer,
                                                    void *stream);

/*
 * Starts copying layer `layer` of every block the step saves out of the
 * cache (the engine has computed that layer; CUDA: the copy runs after the
 * work enqueued on `stream` so far). Returns at once. Calling it twice for
 * a layer copies once. No plan bound, or the step's saves finished
 * already (committed or aborted): KVD_OK, nothing copied. With
 * `layerwise_saves` the call also says the layer is complete: the step's
 * objects are committed only if it came for every layer. Errors:
 * KVD_ERR_INVALID (NULL worker),
 * KVD_ERR_RANGE (layer >= num_layers); CUDA: KVD_ERR_DEVICE (the side
 * stream could not be ordered after `stream`: the step's saves are
 * dropped, not committed).
 */
KVD_API kvd_status_t kvd_worker_save_kv_layer(kvd_worker_t *worker,
                                              uint32_t layer, void *stream);

/*
 * Copies the layers save_kv_layer was not called for, waits until every
 * copy and synchronous load of the step is done, and commits the saved
 * objects. After it returns the worker reads no block of this step's saves
 * again (CUDA: the host waits for the side stream here; the layers not
 * saved yet are ordered after `stream`). With `layerwise_saves`, a layer
 * save_kv_layer was not called for is not copied: the copies already
 * started are waited for and every save of the step is aborted instead
 * (counted in saves_aborted, logged). KVD_OK also when some saves failed
 * or were aborted (they are counted in stats and logged; the request is
 * still reported as finished saving, since nothing of it is in flight),
 * and when no plan is bound or its saves finished already. With
 * `async_saves` it waits for the step's synchronous loads to be enqueued
 * only: the copies and the commit go on in the background, and the
 * request is reported as finished saving once they are done (the
 * layerwise_saves rule still aborts the step here). Errors:
 * KVD_ERR_INVALID (NULL worker).
 */
KVD_API kvd_status_t kvd_worker_wait_for_save(kvd_worker_t *worker,
                                              void *stream);

/*
 * The engine's step failed (an exception in the forward pass, a step it
 * gives up): aborts every save of the bound step that wait_for_save has
 * not committed. Waits for the step's copies already started and its
 * synchronous loads (started here if they were not; they finish and are
 * reported as with wait_for_save), then gives the saves' reservations back
 * (counted in saves_aborted) and reports their requests as finished
 * saving; nothing of the step is committed, and the worker reads no block
 * of its saves again. The plan stays bound (clear_metadata unbinds it);
 * save_kv_layer and wait_for_save then do nothing for its saves. No plan
 * bound, or its saves already committed or aborted: KVD_OK, nothing done.
 * Errors: KVD_ERR_INVALID (NULL worker).
 */
KVD_API kvd_status_t kvd_worker_abort_step(kvd_worker_t *worker);

/*
 * Moves the worker to another namespace (a new namespace generation: the
 * engine reset its cache or changed its weights in place, so nothing saved
 * before may be matched). Later plans must name keys in `plan_ns` (all
 * zero: in `ns`), later saves are stored in `ns` and later loads looked up
 * and their headers checked there. Asynchronous loads of earlier steps
 * still promoting from NVMe are checked against `ns` too, so they fail
 * (load errors, recomputed by the engine): nothing of the old namespace
 * reaches the cache after this call. Errors: KVD_ERR_INVALID (NULL
 * argument), KVD_ERR_STATE (a plan is bound: call it between
 * clear_metadata and the next bind_metadata). Thread: the engine thread,
 * like bind_metadata.
 */
KVD_API kvd_status_t kvd_worker_set_namespace(kvd_worker_t *worker,
                                              const kvd_namespace_t *ns,
                                              const kvd_namespace_t *plan_ns);

/*
 * The model's rotary embedding, for loads by content (non-prefix reuse,
 * docs/chunk-reuse.md): a plan's load marked `content` may bring a block
 * computed at another position; once its header is checked, its keys
 * (plane 0) are rotated by the difference between the plan's position and
 * the position the header records, layer by layer, before the layer is
 * reported loaded (the host backend with the reference kernel, the CUDA
 * backend on its side stream before the layer's event). Without it such a
 * block fails as a load error (KVD_ERR_UNSUPPORTED) and the engine
 * computes it; a content block at its own position needs no rotation.
 * `rope` is copied; NULL turns it off. Errors: KVD_ERR_INVALID (NULL
 * worker, a rope kvd_rope_check refuses, or one whose head_dim is not the
 * format's), KVD_ERR_UNSUPPORTED (a format the rotation cannot serve: fp8
 * caches, one plane), KVD_ERR_STATE (a plan is bound, or an asynchronous
 * load is in flight). Thread: the engine thread, like bind_metadata.
 */
KVD_API kvd_status_t kvd_worker_set_rope(kvd_worker_t *worker,
                                         const kvd_rope_t *rope);

/* Ends the bound step and unbinds the plan. Saves wait_for_save has not
 * committed are aborted as kvd_worker_abort_step does: a step cleared
 * without wait_for_save did not finish, and its layers not saved hold
 * stale bytes. Synchronous loads are finished (started first if they were
 * not) as wait_for_save finishes them; asynchronous loads go on. No plan
 * bound: KVD_OK. Errors: KVD_ERR_INVALID (NULL worker). */
KVD_API kvd_status_t kvd_worker_clear_metadata(kvd_worker_t *worker);

/* One block whose load failed. */
typedef struct kvd_worker_failed_load {
    const char *request_id;
    int32_t block_id;
    kvd_status_t status; /* why: KVD_ERR_NOT_FOUND, KVD_ERR_CHECKSUM, ... */
} kvd_worker_failed_load_t;

/* What finished since the previous kvd_worker_get_finished. Every pointer
 * stays valid until the next kvd_worker_get_finished or destroy. */
typedef struct kvd_worker_finished {
    uint64_t step; /* step of the plan bound last (the report's step) */
    /* Requests whose saves of a step all completed. */
    const char *const *finished_saving;
    size_t num_finished_saving;
    /* Requests whose loads of a step all completed, synchronous or not;
     * loading_async[i] says which (the engine waits only for those). */
    const char *const *finished_loading;
    const bool *loading_async;
    size_t num_finished_loading;
    /* Blocks whose load failed; reported no later than their request's
     * finished_loading. */
    const kvd_worker_failed_load_t *failed_loads;
    size_t num_failed_loads;
    /* The same as a packed kvdepot.v1.WorkerReport for the leader's
     * kvd_leader_update_connector_output. */
    const uint8_t *report;
    size_t report_len;
} kvd_worker_finished_t;

/*
 * Drains what finished (non-blocking) into `*out`. `finished_req_ids`
 * (may be NULL when num is 0) names the requests the engine has finished
 * since the last call: asynchronous loads of theirs that have not started
 * copying are canceled (reported with KVD_ERR_CANCELED). Errors:
 * KVD_ERR_INVALID; KVD_ERR_NOMEM: nothing drained, except when packing the
 * report itself runs out of memory after the draining (then this call's
 * entries are lost and logged; the leader's lookup timeout and the
 * engine's own timeouts cover what they would have reported).
 */
KVD_API kvd_status_t kvd_worker_get_finished(
    kvd_worker_t *worker, const char *const *finished_req_ids,
    size_t num_finished_req_ids, kvd_worker_finished_t *out);

/* An eventfd readable when kvd_worker_get_finished may have something new;
 * get_finished clears it. Owned by the worker (do not close or read it),
 * valid until kvd_worker_destroy; -1 for a NULL worker. Thread: any. */
KVD_API int kvd_worker_fd(kvd_worker_t *worker);

typedef struct kvd_worker_stats {
    uint64_t blocks_loaded;      /* blocks written into the cache */
    uint64_t load_errors;        /* blocks reported in failed_loads */
    uint64_t promotions;         /* DISK-tier objects brought into the arena */
    uint64_t blocks_saved;       /* objects committed */
    uint64_t saves_skipped;      /* stored already */
    uint64_t saves_dropped;      /* no slot, quota, or copy error */
    uint64_t bytes_loaded;       /* object bytes decoded */
    uint64_t bytes_saved;        /* object bytes written */
    uint64_t async_loads_active; /* requests loading in the background */
    uint64_t saves_aborted;      /* reserved, then aborted with their step: a
                                  * layer not saved (layerwise_saves), no
                                  * wait_for_save, or kvd_worker_abort_step */
    uint64_t header_errors;      /* loads refused because the object's
                                  * header did not describe the object asked
                                  * for (also in load_errors) */
    uint64_t saves_shed;         /* not reserved: async saves over
                                  * max_inflight_save_bytes */
    uint64_t saves_inflight;     /* objects reserved, not yet committed or
                                  * aborted (gauge) */
    uint64_t copy_ops;           /* CUDA backend: copies enqueued between
                                  * the arena and the device, a run of
                                  * objects at one stride counting one (0
                                  * on the host backend) */
} kvd_worker_stats_t;

/* Copies the worker's counters into *out: one consistent snapshot, taken
 * under the worker's lock. Errors: KVD_ERR_INVALID (NULL argument). Thread:
 * any, also while the engine thread is in another call. */
KVD_API kvd_status_t kvd_worker_stats(kvd_worker_t *worker,
                                      kvd_worker_stats_t *out);

/*
 * Waits until no save of an earlier step is in flight (async_saves): every
 * step whose wait_for_save returned has its objects committed (or
 * aborted) and its requests queued as finished saving. Returns at once
 * without async_saves. Engine thread; errors: KVD_ERR_INVALID (NULL).
 */
KVD_API kvd_status_t kvd_worker_flush_saves(kvd_worker_t *worker);

/*
 * The engine is about to write blocks of its next step before binding its
 * plan (vLLM zeroes newly allocated blocks and copies blocks in its model
 * runner first): with async_saves, waits until the copies of earlier
 * steps' saves ran (host) or are enqueued (CUDA), and makes the engine's
 * `stream` wait for them, so a block they read that the engine gave to
 * another request is written only after. bind_metadata and start_load_kv
 * do the same; this call is for writes that come before them. Returns at
 * once without async_saves. When the engine's stream cannot be ordered
 * (a CUDA error), the copies are waited for on the CPU instead and the
 * call still succeeds. Engine thread; errors: KVD_ERR_INVALID (NULL
 * worker), a CUDA error from that wait (the fence did not hold).
 */
KVD_API kvd_status_t kvd_worker_blocks_fence(kvd_worker_t *worker,
                                             void *stream);

/*
 * *saving_out: a save of request `request_id` is in flight (the bound
 * step's, or an earlier step's with async_saves), so the engine must keep
 * its blocks. Errors: KVD_ERR_INVALID (NULL argument). Thread: any.
 */
KVD_API kvd_status_t kvd_worker_request_saving(kvd_worker_t *worker,
                                               const char *request_id,
                                               bool *saving_out);

#ifdef __cplusplus
}
#endif

#endif /* KVDEPOT_WORKER_H */
