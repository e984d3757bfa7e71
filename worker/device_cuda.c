/*
 * The worker's CUDA device backend (KVD_WORKER_DEVICE_CUDA): the copy step
 * of the shared pipeline (exec.c) done on side streams with the kernels of
 * kernels/cuda, and the engine-stream ordering around it, behind the
 * worker's device ops table (kvd_worker_device_cuda, worker_int.h).
 * Planning, resolution, promotions, leases, reports and commits stay in
 * worker.c and exec.c; only the bodies of the copy tasks, the per-layer
 * waits and the end of a step's copies come here. Built only with
 * KVD_HAVE_CUDA.
 *
 * Resources, allocated once by register_kv_caches on the caches' device
 * and never in the per-step path: two non-blocking side streams, one for
 * the copies between staging and the arena (the copy stream), one for the
 * kernels and the block-id uploads (the kernel stream); one event per
 * layer, recorded on the kernel stream after that layer's loads of the
 * step are enqueued; one event the engine's stream records for the saves;
 * one event per pool thread for asynchronous requests; device staging
 * buffers (`cuda_staging_buffers`, default 2) of `cuda_staging_blocks`
 * slots of one layer each, with two events each (filled, read); pinned host
 * and device arrays for block ids (one region per pool thread for
 * asynchronous requests; each step's from a free list of arrays, grown
 * when a step needs more); the codec tables on
 * the device; and
 * the store's arena registered with cudaHostRegister (once per process and
 * arena, counted, so several workers on one store share it; when it cannot
 * be pinned, copies go through pageable memory, slower but the same).
 *
 * Ordering. `mu` makes each sequence that uses a staging buffer (copies
 * into staging, then scatter; or gather, then copies out of staging) reach
 * the streams whole, whichever pool thread enqueues it. Consecutive
 * sequences use the buffers in turn, so the copy engine moves one while a
 * kernel fills or drains another; within a sequence the stream
 * that filled the buffer records its "filled" event and the other waits
 * on it, and the reader records "read", which the next filler of that
 * buffer waits on (layer_copy). Only the kernel stream touches the
 * engine's cache, and the id arrays are uploaded in its order. A load of
 * layer l copies the layer's byte range of each object from its arena
 * slot into a staging slot, then scatters it; the layer's event is
 * recorded on the kernel stream after it, and wait_for_layer_load(l)
 * makes the engine's stream wait on that event (the host only waits until
 * it is recorded). save_kv_layer(l) records the save event on the
 * engine's stream and makes the kernel stream wait on it before the
 * gather of layer l into staging; the copies of its bytes into the
 * reserved arena slots follow on the copy stream.
 *
 * Completion. A task finishing on the host only means its work is
 * enqueued. The step's leases are given back and its loads reported at
 * wait_for_save (exec.c, kvd_worker_copies_finish), after both side
 * streams have been synchronized; the saves are committed after that same
 * synchronization. With async_saves that happens on the worker's
 * committer thread after the step, while the engine's next steps enqueue
 * theirs: each step's block ids therefore live in arrays of its own
 * (cids_t, from a free list), given back only once its copies ran. An
 * asynchronous request records its thread's event
 * after its last layer and waits for it on the pool thread before it is
 * reported and its leases given back.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "kvdepot/kernels_cuda.h"
#include "proto/kvd_proto.h"
#include "worker/worker_int.h"

/* Blocks per staging chunk. The buffer holds one layer of each block (the
 * one being copied), so 64 blocks of a Llama-3-8B shard are 4 MiB; on an
 * H100 a step of 64 blocks ran at 0.56 of cudaMemcpyAsync with 16, 0.69
 * with 32, 0.77 with 64 and 0.78 with 128 (docs/performance.md). */
#define CUDA_DEFAULT_STAGING_BLOCKS 64u
/* Staging buffers used in turn (cuda_staging_buffers): the kernels fill
 * or drain one while the copy engine moves another. */
#define CUDA_DEFAULT_STAGING_BUFS 2u
#define STAGING_BUFS KVD_WORKER_MAX_STAGING_BUFFERS
/* Arena mappings one worker keeps pinned (daemon restarts). */
#define MAX_WORKER_PINS 4u
#define CUDA_STAGING_ALIGN 256u
/* Regions of the shared id arrays, in entries: one per pool thread for
 * asynchronous requests. A step's ids have arrays of their own (cids_t). */
#define IDS_STEP_CAP ((size_t)KVD_PROTO_MAX_BLOCKS_PER_PLAN)
#define IDS_ASYNC_CAP ((size_t)KVD_PROTO_MAX_BLOCKS_PER_REQUEST)
#define IDS_ASYNC(slot) ((size_t)(slot)*IDS_ASYNC_CAP)
/* Smallest step id arrays allocated, in entries. */
#define CIDS_MIN 256u

/* One step's block ids on the device: its synchronous loads at 0, its
 * saves at n_sync, and the loads' rotations (made at the first content
 * load). Pinned host and device arrays of `cap` entries, the step's until
 * its copies ran (kvd_worker_copies_finish), then back on the free list:
 * with async_saves a step's saves may still be on the stream while the
 * next step uploads its ids. */
typedef struct cids {
    struct cids *next;
    size_t cap;
    int32_t *host, *dev;
    int64_t *dhost, *ddev;
} cids_t;

/* What register_kv_caches allocates on one device. */
typedef struct cres {
    int device;
    void *stream;    /* the copies between staging and the arena */
    void *kstream;   /* the kernels and the id uploads */
    void **layer_ev; /* num_layers */
    void *save_ev;
    void *reads_ev; /* the kernel stream's tail, for the engine's stream */
    void **slot_ev; /* n_slots */
    /* n_bufs buffers of staging_blocks slots; per buffer, the event
     * recorded after what filled it and after what last read it. */
    void *staging;
    void *full_ev[STAGING_BUFS], *free_ev[STAGING_BUFS];
    int32_t *ids_host; /* pinned; the asynchronous slots' */
    int32_t *ids_dev;
    cids_t *free_ids; /* steps' id arrays not in use */
    kvd_cuda_tables_t *tables;
    /* Content loads (kvd_worker_set_rope), made at the first that moves:
     * one rotation per id, same regions as the ids, and the rope. */
    int64_t *deltas_host; /* pinned */
    int64_t *deltas_dev;
    kvd_cuda_rope_t *rope;
    uint32_t rope_gen; /* w->rope_gen it was made from */
} cres_t;

struct wcuda {
    pthread_mutex_t mu; /* one staging sequence on the stream at a time */
    cres_t *res;        /* NULL until the first register */
    size_t staging_blocks, ids_cap;
    /* Staging holds one layer per block: the kernels see a one-layer
     * format (layer 0 at slot_off in each stride-byte slot). */
    kvd_object_format_t fmt1;
    size_t stride, slot_off;
    uint32_t n_slots;
    uint32_t n_bufs;    /* staging buffers (cuda_staging_buffers) */
    uint32_t next_buf;  /* the staging buffer the next chunk uses */
    uint64_t slot_busy; /* bit j: slot j's event and ids are in use */
    bool pinned;        /* the arena mapped now (pin_gen) is page-locked */
    uint8_t copy_mode;  /* cfg.cuda_copy_mode */
    uint32_t pin_gen;
    struct {
        void *base;
        uint64_t size;
        uint32_t gen;
    } pins[MAX_WORKER_PINS]; /* mappings registered and held, oldest first */
    size_t n_pins;
    /* One batch of copies (mu held). */
    void **cp_dst;
    const void **cp_src;
    size_t *cp_len;
};

/* Waits until both side streams ran what was enqueued on them. */
static kvd_status_t streams_wait(const cres_t *r)
{
    kvd_status_t st = KVD_OK, k = KVD_OK;
    if (r->stream != NULL) {
        st = kvd_cuda_stream_wait(r->stream);
    }
    if (r->kstream != NULL) {
        k = kvd_cuda_stream_wait(r->kstream);
    }
    return st != KVD_OK ? st : k;
}

/* ---- the arena's registration, shared by the process's workers --------- */

typedef struct pin {
    void *base;
    unsigned refs;
    bool owned; /* we registered it (else it was registered before us) */
} pin_t;

#define MAX_PINS 64
static pthread_mutex_t g_pin_mu = PTHREAD_MUTEX_INITIALIZER;
static pin_t g_pins[MAX_PINS];

/* Page-locks `base` (the store's arena as this process maps it), or takes
 * one more reference on its registration; false when it cannot be pinned
 * (copies then stage through pageable memory). */
static bool arena_register(void *base, uint64_t size)
{
    pthread_mutex_lock(&g_pin_mu);
    pin_t *e = NULL, *free_e = NULL;
    for (size_t i = 0; i < MAX_PINS && e == NULL; i++) {
        if (g_pins[i].refs > 0 && g_pins[i].base == base) {
            e = &g_pins[i];
        } else if (g_pins[i].refs == 0 && free_e == NULL) {
            free_e = &g_pins[i];
        }
    }
    if (e == NULL && free_e != NULL) {
        kvd_status_t st = kvd_cuda_host_register(base, size);
        if (st == KVD_OK || st == KVD_ERR_STATE) {
            e = free_e;
            e->base = base;
            e->refs = 0;
            e->owned = st == KVD_OK;
        } else {
            KVD_LOG_WARN("worker: cuda: cudaHostRegister of the %llu-byte "
                         "arena failed (%s): copies stay pageable",
                         (unsigned long long)size, kvd_status_str(st));
        }
    }
    if (e != NULL) {
        e->refs++;
    } else if (free_e == NULL) {
        KVD_LOG_WARN("worker: cuda: %d arenas pinned already: copies stay "
                     "pageable",
                     MAX_PINS);
    }
    pthread_mutex_unlock(&g_pin_mu);
    return e != NULL;
}

static void arena_unregister(void *base)
{
    pthread_mutex_lock(&g_pin_mu);
    for (size_t i = 0; i < MAX_PINS; i++) {
        pin_t *e = &g_pins[i];
        if (e->refs > 0 && e->base == base && --e->refs == 0 && e->owned) {
            kvd_cuda_host_unregister(base);
        }
    }
    pthread_mutex_unlock(&g_pin_mu);
}

/* Gives back the worker's pin `i`: its registration, then its hold on the
 * mapping (which may unmap it). No copy from or to it may be pending. */
static void arena_pin_drop(kvd_worker_t *w, size_t i)
{
    wcuda_t *c = w->cuda;
    arena_unregister(c->pins[i].base);
    kvd_store_arena_unhold(w->store, c->pins[i].gen);
    memmove(c->pins + i, c->pins + i + 1,
            (c->n_pins - i - 1) * sizeof c->pins[0]);
    c->n_pins--;
}

/*
 * Pins the arena the store maps now, once per mapping. The mapping is held
 * (kvd_store_arena_hold) for as long as it is registered: unmapping
 * registered memory would leave the device a stale translation that a
 * later mapping at the same address would silently inherit. A daemon
 * restart gives the client a new mapping, pinned here at the next copy;
 * the old one stays pinned while the worker has room (MAX_WORKER_PINS),
 * since leases taken before the restart may still point into it.
 */
static void arena_pin(kvd_worker_t *w)
{
    wcuda_t *c = w->cuda;
    void *base = NULL;
    uint64_t size = 0;
    uint32_t gen = 0;
    kvd_status_t st = kvd_store_arena_hold(w->store, &base, &size, &gen);
    if (st != KVD_OK) {
        KVD_LOG_WARN("worker: cuda: no mapping of the arena (%s): copies "
                     "stay pageable",
                     kvd_status_str(st));
        c->pinned = false;
        return;
    }
    c->pin_gen = gen;
    for (size_t i = 0; i < c->n_pins; i++) {
        if (c->pins[i].gen == gen) {
            kvd_store_arena_unhold(w->store, gen);
            c->pinned = true;
            return;
        }
    }
    if (!arena_register(base, size)) {
        kvd_store_arena_unhold(w->store, gen);
        c->pinned = false;
        return;
    }
    if (c->n_pins == MAX_WORKER_PINS) {
        /* Nothing of the oldest may be in flight: wait for the stream. */
        if (c->res != NULL) {
            (void)streams_wait(c->res);
        }
        arena_pin_drop(w, 0);
    }
    c->pins[c->n_pins].base = base;
    c->pins[c->n_pins].size = size;
    c->pins[c->n_pins].gen = gen;
    c->n_pins++;
    c->pinned = true;
}

/* Before a copy (mu held): pins the store's arena again if the client has
 * mapped a new one since (a daemon restart). */
static void arena_pin_check(kvd_worker_t *w)
{
    if (kvd_store_arena_generation(w->store) != w->cuda->pin_gen) {
        arena_pin(w);
    }
}

/* ---- device resources --------------------------------------------------- */

static void cids_destroy(cids_t *b)
{
    if (b == NULL) {
        return;
    }
    kvd_cuda_mem_destroy(b->ddev);
    kvd_cuda_host_free(b->dhost);
    kvd_cuda_mem_destroy(b->dev);
    kvd_cuda_host_free(b->host);
    free(b);
}

/* Frees what res_create made; the stream is synchronized first, so no work
 * that uses the rest is pending. The device must be current. */
static void res_destroy(kvd_worker_t *w, cres_t *r)
{
    if (r == NULL) {
        return;
    }
    (void)streams_wait(r);
    while (r->free_ids != NULL) {
        cids_t *b = r->free_ids;
        r->free_ids = b->next;
        cids_destroy(b);
    }
    kvd_cuda_tables_destroy(r->tables);
    kvd_cuda_rope_destroy(r->rope);
    kvd_cuda_mem_destroy(r->deltas_dev);
    kvd_cuda_host_free(r->deltas_host);
    kvd_cuda_mem_destroy(r->ids_dev);
    kvd_cuda_host_free(r->ids_host);
    kvd_cuda_mem_destroy(r->staging);
    for (uint32_t j = 0; r->slot_ev != NULL && j < w->cuda->n_slots; j++) {
        kvd_cuda_event_destroy(r->slot_ev[j]);
    }
    free(r->slot_ev);
    kvd_cuda_event_destroy(r->save_ev);
    kvd_cuda_event_destroy(r->reads_ev);
    for (uint32_t b = 0; b < STAGING_BUFS; b++) {
        kvd_cuda_event_destroy(r->full_ev[b]);
        kvd_cuda_event_destroy(r->free_ev[b]);
    }
    for (uint32_t l = 0; r->layer_ev != NULL && l < w->cfg.format.num_layers;
         l++) {
        kvd_cuda_event_destroy(r->layer_ev[l]);
    }
    free(r->layer_ev);
    kvd_cuda_stream_destroy(r->stream);
    kvd_cuda_stream_destroy(r->kstream);
    free(r);
}

/* Allocates the resources on `device` (made current by the caller). */
static kvd_status_t res_create(kvd_worker_t *w, int device, cres_t **out,
                               char *err, size_t err_len)
{
    wcuda_t *c = w->cuda;
    uint32_t layers = w->cfg.format.num_layers;
    cres_t *r = calloc(1, sizeof *r);
    if (r == NULL) {
        return KVD_ERR_NOMEM;
    }
    r->device = device;
    const char *what = "side streams";
    kvd_status_t st = kvd_cuda_stream_create(&r->stream);
    if (st == KVD_OK) {
        st = kvd_cuda_stream_create(&r->kstream);
    }
    if (st == KVD_OK) {
        what = "events";
        r->layer_ev = calloc(layers, sizeof *r->layer_ev);
        r->slot_ev = calloc(c->n_slots, sizeof *r->slot_ev);
        st = r->layer_ev == NULL || r->slot_ev == NULL ? KVD_ERR_NOMEM : KVD_OK;
    }
    for (uint32_t l = 0; st == KVD_OK && l < layers; l++) {
        st = kvd_cuda_event_create(&r->layer_ev[l]);
    }
    for (uint32_t j = 0; st == KVD_OK && j < c->n_slots; j++) {
        st = kvd_cuda_event_create(&r->slot_ev[j]);
    }
    if (st == KVD_OK) {
        st = kvd_cuda_event_create(&r->save_ev);
    }
    if (st == KVD_OK) {
        st = kvd_cuda_event_create(&r->reads_ev);
    }
    for (uint32_t b = 0; st == KVD_OK && b < c->n_bufs; b++) {
        st = kvd_cuda_event_create(&r->full_ev[b]);
        if (st == KVD_OK) {
            st = kvd_cuda_event_create(&r->free_ev[b]);
        }
    }
    if (st == KVD_OK) {
        what = "staging buffers";
        st = kvd_cuda_mem_create(c->n_bufs * c->staging_blocks * c->stride,
                                 &r->staging);
    }
    if (st == KVD_OK) {
        what = "block id arrays";
        st = kvd_cuda_host_alloc(c->ids_cap * sizeof(int32_t),
                                 (void **)&r->ids_host);
    }
    if (st == KVD_OK) {
        st = kvd_cuda_mem_create(c->ids_cap * sizeof(int32_t),
                                 (void **)&r->ids_dev);
    }
    if (st == KVD_OK && w->tables != NULL) {
        what = "codec tables";
        st = kvd_cuda_tables_create(w->tables, &r->tables);
    }
    if (st != KVD_OK) {
        kvd_config_err(err, err_len, "worker: cuda: %s on device %d: %s", what,
                       device, kvd_status_str(st));
        goto err_res;
    }
    arena_pin(w);
    *out = r;
    return KVD_OK;

err_res:
    res_destroy(w, r);
    return st;
}

/* ---- life cycle --------------------------------------------------------- */

static kvd_status_t cuda_create(kvd_worker_t *w, char *err, size_t err_len)
{
    int count = 0;
    kvd_status_t st = kvd_cuda_device_count(&count);
    if (st != KVD_OK) {
        kvd_config_err(err, err_len,
                       "worker: device cuda: the CUDA runtime: %s",
                       kvd_status_str(st));
        return st;
    }
    if (count == 0) {
        kvd_config_err(
            err, err_len,
            "worker: device cuda: no CUDA device on this machine (no "
            "GPU or no driver); use KVD_WORKER_DEVICE_HOST");
        return KVD_ERR_NO_DEVICE;
    }
    if (w->cfg.cuda_staging_blocks > IDS_ASYNC_CAP) {
        kvd_config_err(err, err_len, "worker: cuda_staging_blocks %u > %zu",
                       w->cfg.cuda_staging_blocks, IDS_ASYNC_CAP);
        return KVD_ERR_INVALID;
    }
    if (w->cfg.cuda_copy_mode > KVD_WORKER_COPY_PER_OBJECT) {
        kvd_config_err(err, err_len,
                       "worker: cuda_copy_mode %u is not one of 0 (auto), 1 "
                       "(runs), 2 (per object)",
                       (unsigned)w->cfg.cuda_copy_mode);
        return KVD_ERR_INVALID;
    }
    if (w->cfg.cuda_staging_buffers > STAGING_BUFS) {
        kvd_config_err(err, err_len, "worker: cuda_staging_buffers %u > %u",
                       w->cfg.cuda_staging_buffers, STAGING_BUFS);
        return KVD_ERR_INVALID;
    }
    wcuda_t *c = calloc(1, sizeof *c);
    if (c == NULL) {
        return KVD_ERR_NOMEM;
    }
    c->staging_blocks = w->cfg.cuda_staging_blocks != 0
                            ? w->cfg.cuda_staging_blocks
                            : CUDA_DEFAULT_STAGING_BLOCKS;
    c->copy_mode = w->cfg.cuda_copy_mode;
    c->n_bufs = w->cfg.cuda_staging_buffers != 0 ? w->cfg.cuda_staging_buffers
                                                 : CUDA_DEFAULT_STAGING_BUFS;
    c->fmt1 = w->cfg.format;
    c->fmt1.num_layers = 1;
    c->stride = (kvd_object_bytes(&c->fmt1) + CUDA_STAGING_ALIGN - 1) /
                CUDA_STAGING_ALIGN * CUDA_STAGING_ALIGN;
    c->slot_off = kvd_object_layer_offset(&c->fmt1, 0);
    c->n_slots = w->num_threads;
    c->ids_cap = IDS_ASYNC(c->n_slots);
    /* A shared object's layer is up to KVD_OBJECT_MAX_RANGES copies. */
    size_t cps = c->staging_blocks * KVD_OBJECT_MAX_RANGES;
    c->cp_dst = calloc(cps, sizeof *c->cp_dst);
    c->cp_src = calloc(cps, sizeof *c->cp_src);
    c->cp_len = calloc(cps, sizeof *c->cp_len);
    if (c->cp_dst == NULL || c->cp_src == NULL || c->cp_len == NULL) {
        free(c->cp_dst);
        free(c->cp_src);
        free(c->cp_len);
        free(c);
        return KVD_ERR_NOMEM;
    }
    pthread_mutex_init(&c->mu, NULL);
    w->cuda = c;
    return KVD_OK;
}

static void cuda_destroy(kvd_worker_t *w)
{
    wcuda_t *c = w->cuda;
    if (c == NULL) {
        return;
    }
    if (c->res != NULL) {
        int cur = -1;
        bool restore = kvd_cuda_device_get(&cur) == KVD_OK;
        (void)kvd_cuda_device_set(c->res->device);
        res_destroy(w, c->res);
        if (restore) {
            (void)kvd_cuda_device_set(cur);
        }
    }
    /* The stream is idle (res_destroy waited for it): no copy uses them. */
    while (c->n_pins > 0) {
        arena_pin_drop(w, c->n_pins - 1);
    }
    pthread_mutex_destroy(&c->mu);
    free(c->cp_dst);
    free(c->cp_src);
    free(c->cp_len);
    free(c);
    w->cuda = NULL;
}

static kvd_status_t cuda_register_caches(kvd_worker_t *w,
                                         const kvd_kv_layout_t *layout,
                                         char *err, size_t err_len)
{
    wcuda_t *c = w->cuda;
    int device = -1;
    for (uint32_t l = 0; l < w->cfg.format.num_layers; l++) {
        int d = -1;
        kvd_status_t st = kvd_cuda_pointer_query(layout->layer_base[l], &d);
        if (st != KVD_OK) {
            kvd_config_err(err, err_len, "worker: cuda: layer %u base: %s", l,
                           kvd_status_str(st));
            return st;
        }
        if (d < 0) {
            kvd_config_err(
                err, err_len,
                "worker: cuda: layer %u base %p is not device memory "
                "(the CUDA backend takes caches allocated on a GPU)",
                l, layout->layer_base[l]);
            return KVD_ERR_INVALID;
        }
        if (device >= 0 && d != device) {
            kvd_config_err(err, err_len,
                           "worker: cuda: layer %u is on device %d, layer 0 on "
                           "device %d (one worker serves one device)",
                           l, d, device);
            return KVD_ERR_INVALID;
        }
        device = d;
    }
    if (c->res != NULL && c->res->device == device) {
        return KVD_OK; /* same device: keep everything */
    }
    /* The engine thread's current device is the engine's: allocate on the
     * caches' device, then put it back. */
    int cur = -1;
    kvd_status_t st = kvd_cuda_device_get(&cur);
    if (st == KVD_OK) {
        st = kvd_cuda_device_set(device);
    }
    if (st != KVD_OK) {
        kvd_config_err(err, err_len, "worker: cuda: device %d not usable: %s",
                       device, kvd_status_str(st));
        return st;
    }
    cres_t *r = NULL;
    st = res_create(w, device, &r, err, err_len);
    if (st == KVD_OK && c->res != NULL) {
        /* Another device than before: its resources go. */
        (void)kvd_cuda_device_set(c->res->device);
        res_destroy(w, c->res);
    }
    if (st == KVD_OK) {
        c->res = r;
    }
    (void)kvd_cuda_device_set(cur);
    return st;
}

/* ---- copies (pool threads) ---------------------------------------------- */

/* Copies `n` ids from pinned `host` to `dev`, in stream order (mu held).
 * The pinned memory is free: what read it before has executed (a slot is
 * used by one request at a time; a step's arrays are its own). */
static kvd_status_t ids_upload(wcuda_t *c, int32_t *host, int32_t *dev,
                               const int32_t *ids, size_t n)
{
    memcpy(host, ids, n * sizeof *ids);
    return kvd_cuda_copy_async(dev, host, n * sizeof *ids, c->res->kstream);
}

/* The step's id arrays, taken from the free list (or made) at its first
 * copy task (mu held). */
static kvd_status_t step_ids(wcuda_t *c, wstep_t *s, cids_t **out)
{
    if (s->dev_buf != NULL) {
        *out = s->dev_buf;
        return KVD_OK;
    }
    size_t need = s->n_sync + s->n_saves;
    cids_t **pp = &c->res->free_ids;
    while (*pp != NULL && (*pp)->cap < need) {
        pp = &(*pp)->next;
    }
    cids_t *b = *pp;
    if (b != NULL) {
        *pp = b->next;
    } else {
        b = calloc(1, sizeof *b);
        if (b == NULL) {
            return KVD_ERR_NOMEM;
        }
        b->cap = need > CIDS_MIN ? need : CIDS_MIN;
        kvd_status_t st =
            kvd_cuda_host_alloc(b->cap * sizeof(int32_t), (void **)&b->host);
        if (st == KVD_OK) {
            st =
                kvd_cuda_mem_create(b->cap * sizeof(int32_t), (void **)&b->dev);
        }
        if (st != KVD_OK) {
            cids_destroy(b);
            return st;
        }
    }
    b->next = NULL;
    s->dev_buf = b;
    *out = b;
    return KVD_OK;
}

/* The step's rotations' arrays, made at its first content load that moves
 * a block (mu held). */
static kvd_status_t step_deltas(cids_t *b)
{
    kvd_status_t st = KVD_OK;
    if (b->dhost == NULL) {
        st = kvd_cuda_host_alloc(b->cap * sizeof(int64_t), (void **)&b->dhost);
    }
    if (st == KVD_OK && b->ddev == NULL) {
        st = kvd_cuda_mem_create(b->cap * sizeof(int64_t), (void **)&b->ddev);
    }
    return st;
}

/* The rotation's device state, made at the first content load that moves
 * a block (mu held, the device current): the rope's frequencies and room
 * for one rotation per id. After kvd_worker_set_rope changed the rope, the
 * old copy goes once the stream has run what may still read it. */
static kvd_status_t rope_ready(kvd_worker_t *w)
{
    wcuda_t *c = w->cuda;
    cres_t *r = c->res;
    kvd_status_t st = KVD_OK;
    if (r->deltas_host == NULL) {
        st = kvd_cuda_host_alloc(c->ids_cap * sizeof(int64_t),
                                 (void **)&r->deltas_host);
    }
    if (st == KVD_OK && r->deltas_dev == NULL) {
        st = kvd_cuda_mem_create(c->ids_cap * sizeof(int64_t),
                                 (void **)&r->deltas_dev);
    }
    uint32_t gen = __atomic_load_n(&w->rope_gen, __ATOMIC_ACQUIRE);
    if (st == KVD_OK && r->rope != NULL && r->rope_gen != gen) {
        st = streams_wait(r);
        if (st == KVD_OK) {
            kvd_cuda_rope_destroy(r->rope);
            r->rope = NULL;
        }
    }
    if (st == KVD_OK && r->rope == NULL) {
        st = kvd_cuda_rope_create(&w->rope, &r->rope);
        r->rope_gen = gen;
    }
    return st;
}

/* Copies `n` rotations from pinned `host` to `dev`, in stream order (mu
 * held). */
static kvd_status_t deltas_upload(wcuda_t *c, int64_t *host, int64_t *dev,
                                  const int64_t *d, size_t n)
{
    memcpy(host, d, n * sizeof *d);
    return kvd_cuda_copy_async(dev, host, n * sizeof *d, c->res->kstream);
}

/* [lo, hi) lies inside one of the worker's registered mappings (mu held). */
static bool in_one_pin(const wcuda_t *c, uintptr_t lo, uintptr_t hi)
{
    for (size_t i = 0; i < c->n_pins; i++) {
        uintptr_t base = (uintptr_t)c->pins[i].base;
        if (lo >= base && hi <= base + c->pins[i].size) {
            return true;
        }
    }
    return false;
}

/* Whether range `r` of each object moves in runs (cuda_copy_mode). */
static bool runs_for(const wcuda_t *c, const kvd_object_range_t *r)
{
    switch (c->copy_mode) {
    case KVD_WORKER_COPY_RUNS: return true;
    case KVD_WORKER_COPY_PER_OBJECT: return false;
    default: return r->bytes < KVD_WORKER_COPY_RUN_BELOW;
    }
}

/* How many of objects i.. hold range `r` at one ascending stride (*pitch)
 * inside one registered mapping: slots handed out one after another, as a
 * step's saves are, so the copy engine can move them as one 2D copy (the
 * staging slots are at c->stride). 1: no run (mu held). */
static size_t run_at(const wcuda_t *c, void *const *objs, size_t i, size_t n,
                     const kvd_object_range_t *r, size_t *pitch)
{
    if (!runs_for(c, r) || !c->pinned || i + 1 >= n) {
        return 1;
    }
    uintptr_t a = (uintptr_t)objs[i], b = (uintptr_t)objs[i + 1];
    if (b <= a || b - a < r->bytes) {
        return 1;
    }
    uintptr_t p = b - a;
    size_t h = 2;
    while (i + h < n &&
           (uintptr_t)objs[i + h] - (uintptr_t)objs[i + h - 1] == p) {
        h++;
    }
    uintptr_t lo = a + r->object_offset;
    if (!in_one_pin(c, lo, lo + (h - 1) * p + r->bytes)) {
        return 1;
    }
    *pitch = p;
    return h;
}

/* The copies of each of `n` objects' ranges `r` (a layer: one range, or a
 * shared object's heads of it): arena -> the staging buffer `staging`
 * (to_device) or back, on the copy stream. Runs of objects at one stride
 * go as one 2D copy each, the others in one batch (mu held). */
static kvd_status_t staging_copies(kvd_worker_t *w, unsigned char *staging,
                                   void *const *objs, size_t n,
                                   const kvd_object_range_t *r, size_t nr,
                                   bool to_device)
{
    wcuda_t *c = w->cuda;
    void *stream = c->res->stream;
    kvd_status_t st = KVD_OK;
    size_t k = 0, ops = 0;
    for (size_t j = 0; j < nr && st == KVD_OK; j++) {
        for (size_t i = 0, h = 1; i < n && st == KVD_OK; i += h) {
            unsigned char *slot =
                staging + i * c->stride + c->slot_off + r[j].shard_offset;
            unsigned char *obj = (unsigned char *)objs[i] + r[j].object_offset;
            size_t pitch = 0;
            h = run_at(c, objs, i, n, &r[j], &pitch);
            if (h > 1) {
                st = to_device
                         ? kvd_cuda_copy_2d_async(slot, c->stride, obj, pitch,
                                                  r[j].bytes, h, stream)
                         : kvd_cuda_copy_2d_async(obj, pitch, slot, c->stride,
                                                  r[j].bytes, h, stream);
                ops++;
                continue;
            }
            c->cp_dst[k] = to_device ? (void *)slot : (void *)obj;
            c->cp_src[k] = to_device ? (const void *)obj : (const void *)slot;
            c->cp_len[k] = r[j].bytes;
            k++;
        }
    }
    if (st == KVD_OK && c->pinned) {
        st = kvd_cuda_copy_batch_async(c->cp_dst, c->cp_src, c->cp_len, k,
                                       to_device, c->res->device, stream);
    } else if (st == KVD_OK) {
        /* Pageable: the runtime stages each copy itself; batching would
         * not make it a DMA. */
        for (size_t i = 0; i < k && st == KVD_OK; i++) {
            st = kvd_cuda_copy_async(c->cp_dst[i], c->cp_src[i], c->cp_len[i],
                                     stream);
        }
    }
    atomic_fetch_add(&w->copy_ops, ops + k);
    return st;
}

/* `from` records `ev`, then `to` waits for it (mu held). */
static kvd_status_t hand_over(void *from, void *ev, void *to)
{
    kvd_status_t st = kvd_cuda_event_record(ev, from);
    return st == KVD_OK ? kvd_cuda_stream_wait_event(to, ev) : st;
}

/* Enqueues layer `layer` of `n` blocks `ids` (the same ids are at
 * `ids_dev` on the device), in chunks of a staging buffer's size: a load
 * copies each object's layer bytes into staging, then scatters them into
 * the blocks; a save gathers the blocks into staging, then copies the
 * bytes into the objects (mu held). A load with `deltas_dev` (the
 * rotations on the device, uploaded in stream order) rotates each block's
 * keys as the scatter decodes them. The kernels run on a one-layer view
 * (the layer's base, the one-layer format): a layer's region of an object
 * does not depend on the other layers, so the bytes are the same.
 *
 * The copies go on the copy stream, the kernels on the kernel stream, and
 * consecutive chunks (of this layer or the next call's) use the staging
 * buffers in turn: the copy engine moves one buffer while a kernel fills or
 * drains the other, instead of each waiting for the other. A chunk's
 * buffer is handed from the stream that fills it to the one that reads it
 * (full_ev), and back once read (free_ev) before it is filled again. */
static kvd_status_t layer_copy(kvd_worker_t *w, uint32_t layer,
                               const int32_t *ids, const int32_t *ids_dev,
                               const int64_t *deltas_dev, void *const *objs,
                               size_t n, bool load)
{
    wcuda_t *c = w->cuda;
    cres_t *res = c->res;
    const kvd_object_format_t *f = &w->cfg.format;
    /* The layer's bytes of each object, or this worker's heads of them. */
    kvd_object_range_t r[KVD_OBJECT_MAX_RANGES] = {
        {kvd_object_layer_offset(f, layer), 0, kvd_object_layer_bytes(f)}};
    size_t nr = w->shard
                    ? kvd_object_shard_ranges(&w->store_fmt, w->cfg.head_start,
                                              f->num_heads, layer, r)
                    : 1;
    void *base[1] = {w->layout.layer_base[layer]};
    kvd_kv_layout_t one = w->layout;
    one.layer_base = base;
    kvd_status_t st = KVD_OK;
    for (size_t k = 0; k < n && st == KVD_OK; k += c->staging_blocks) {
        size_t m = n - k < c->staging_blocks ? n - k : c->staging_blocks;
        uint32_t b = c->next_buf;
        c->next_buf = (b + 1) % c->n_bufs;
        unsigned char *stg =
            (unsigned char *)res->staging + b * c->staging_blocks * c->stride;
        /* The stream that fills the buffer waits until its last reader
         * is done with it. */
        void *fill = load ? res->stream : res->kstream;
        void *drain = load ? res->kstream : res->stream;
        st = kvd_cuda_stream_wait_event(fill, res->free_ev[b]);
        if (load) {
            if (st == KVD_OK) {
                st = staging_copies(w, stg, objs + k, m, r, nr, true);
            }
            if (st == KVD_OK) {
                st = hand_over(fill, res->full_ev[b], drain);
            }
            if (st == KVD_OK && deltas_dev != NULL) {
                st = kvd_cuda_scatter_layer_rope(
                    &one, &c->fmt1, res->tables, res->rope, 0, ids + k,
                    ids_dev + k, deltas_dev + k, m, f->block_size, stg,
                    c->stride, drain);
            } else if (st == KVD_OK) {
                st = kvd_cuda_scatter_layer(
                    &one, &c->fmt1, res->tables, 0, ids + k, ids_dev + k, m,
                    f->block_size, stg, c->stride, drain);
            }
        } else {
            if (st == KVD_OK) {
                st = kvd_cuda_gather_layer(&one, &c->fmt1, res->tables, 0,
                                           ids + k, ids_dev + k, m,
                                           f->block_size, stg, c->stride, fill);
            }
            if (st == KVD_OK) {
                st = hand_over(fill, res->full_ev[b], drain);
            }
            if (st == KVD_OK) {
                st = staging_copies(w, stg, objs + k, m, r, nr, false);
            }
        }
        if (st == KVD_OK) {
            st = kvd_cuda_event_record(res->free_ev[b], drain);
        }
    }
    if (st != KVD_OK) {
        /* A chunk stopped half-way left its buffer's free_ev behind what
         * may still write it: wait until both streams are idle. */
        (void)streams_wait(res);
    }
    return st;
}

static kvd_status_t cuda_load(kvd_worker_t *w, wstep_t *s, uint32_t layer,
                              size_t first, size_t count)
{
    wcuda_t *c = w->cuda;
    kvd_status_t st = kvd_cuda_device_set(c->res->device);
    if (st != KVD_OK) {
        return st;
    }
    if (s->n_load_ok > IDS_STEP_CAP) {
        return KVD_ERR_RANGE; /* the plan's validation bounds it */
    }
    pthread_mutex_lock(&c->mu);
    arena_pin_check(w);
    cids_t *b = NULL;
    st = step_ids(c, s, &b);
    if (st == KVD_OK && !s->dev_load_ids) {
        st = ids_upload(c, b->host, b->dev, s->load_ids, s->n_load_ok);
        s->dev_load_ids = st == KVD_OK;
    }
    if (st == KVD_OK && s->any_delta && !s->dev_load_deltas) {
        st = rope_ready(w);
        if (st == KVD_OK) {
            st = step_deltas(b);
        }
        if (st == KVD_OK) {
            st = deltas_upload(c, b->dhost, b->ddev, s->load_deltas,
                               s->n_load_ok);
        }
        s->dev_load_deltas = st == KVD_OK;
    }
    if (st == KVD_OK) {
        st = layer_copy(w, layer, s->load_ids + first, b->dev + first,
                        s->any_delta ? b->ddev + first : NULL,
                        s->load_objs + first, count, true);
    }
    /* On the kernel stream, after the layer's scatters (which waited for
     * their copies). Recorded even after an error: the engine's stream
     * then waits for what was enqueued, and the failed blocks are
     * reported. */
    kvd_status_t rec =
        kvd_cuda_event_record(c->res->layer_ev[layer], c->res->kstream);
    pthread_mutex_unlock(&c->mu);
    return st != KVD_OK ? st : rec;
}

static kvd_status_t cuda_save(kvd_worker_t *w, wstep_t *s, uint32_t layer,
                              size_t first, size_t count)
{
    wcuda_t *c = w->cuda;
    kvd_status_t st = kvd_cuda_device_set(c->res->device);
    if (st != KVD_OK) {
        return st;
    }
    if (s->n_saves > IDS_STEP_CAP) {
        return KVD_ERR_RANGE;
    }
    pthread_mutex_lock(&c->mu);
    arena_pin_check(w);
    cids_t *b = NULL;
    st = step_ids(c, s, &b);
    int32_t *at_host = b != NULL ? b->host + s->n_sync : NULL;
    int32_t *at_dev = b != NULL ? b->dev + s->n_sync : NULL;
    if (st == KVD_OK && !s->dev_save_ids) {
        st = ids_upload(c, at_host, at_dev, s->save_ids, s->n_saves);
        s->dev_save_ids = st == KVD_OK;
    }
    if (st == KVD_OK) {
        st = layer_copy(w, layer, s->save_ids + first, at_dev + first, NULL,
                        s->save_objs + first, count, false);
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

static kvd_status_t cuda_load_async(kvd_worker_t *w, const int32_t *ids,
                                    void *const *objs, const int64_t *deltas,
                                    size_t n)
{
    wcuda_t *c = w->cuda;
    kvd_status_t st = kvd_cuda_device_set(c->res->device);
    if (st != KVD_OK) {
        return st;
    }
    if (n > IDS_ASYNC_CAP) {
        return KVD_ERR_RANGE;
    }
    /* At most one asynchronous request per pool thread runs: a slot is
     * free. */
    pthread_mutex_lock(&c->mu);
    arena_pin_check(w);
    uint32_t slot = 0;
    while (slot < c->n_slots && (c->slot_busy >> slot & 1u) != 0) {
        slot++;
    }
    if (slot == c->n_slots) {
        pthread_mutex_unlock(&c->mu);
        KVD_LOG_ERROR("worker: cuda: no free slot for an asynchronous load");
        return KVD_ERR_INTERNAL;
    }
    c->slot_busy |= (uint64_t)1 << slot;
    size_t at = IDS_ASYNC(slot);
    const int32_t *ids_dev = c->res->ids_dev + at;
    st = ids_upload(c, c->res->ids_host + at, c->res->ids_dev + at, ids, n);
    if (st == KVD_OK && deltas != NULL) {
        st = rope_ready(w);
        if (st == KVD_OK) {
            st = deltas_upload(c, c->res->deltas_host + at,
                               c->res->deltas_dev + at, deltas, n);
        }
    }
    pthread_mutex_unlock(&c->mu);
    /* One layer per lock: a step's loads and saves get the stream between
     * them. */
    for (uint32_t l = 0; l < w->cfg.format.num_layers && st == KVD_OK; l++) {
        pthread_mutex_lock(&c->mu);
        st = layer_copy(w, l, ids, ids_dev,
                        deltas != NULL ? c->res->deltas_dev + at : NULL, objs,
                        n, true);
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_lock(&c->mu);
    /* After the last scatter, which waited for its copies. */
    kvd_status_t rec =
        kvd_cuda_event_record(c->res->slot_ev[slot], c->res->kstream);
    pthread_mutex_unlock(&c->mu);
    /* Whatever was enqueued must have run before the caller gives the
     * leases back, error or not. */
    kvd_status_t done = kvd_cuda_event_wait(c->res->slot_ev[slot]);
    pthread_mutex_lock(&c->mu);
    c->slot_busy &= ~((uint64_t)1 << slot);
    pthread_mutex_unlock(&c->mu);
    if (rec != KVD_OK && done == KVD_OK) {
        /* Not recorded: nothing tells when the copies ran. */
        done = streams_wait(c->res);
    }
    return st != KVD_OK ? st : done;
}

/* ---- the engine's stream (engine thread) -------------------------------- */

static kvd_status_t cuda_stream_wait(kvd_worker_t *w, uint32_t layer,
                                     void *stream)
{
    wcuda_t *c = w->cuda;
    uint32_t from = layer, to = layer + 1;
    if (layer == KVD_WORKER_ALL_LAYERS) {
        from = 0;
        to = w->cfg.format.num_layers;
    }
    kvd_status_t st = KVD_OK;
    for (uint32_t l = from; l < to && st == KVD_OK; l++) {
        st = kvd_cuda_stream_wait_event(stream, c->res->layer_ev[l]);
    }
    return st;
}

static kvd_status_t cuda_save_order(kvd_worker_t *w, void *stream)
{
    wcuda_t *c = w->cuda;
    /* The gathers (kernel stream) read the engine's cache; the copies
     * only staging and the arena. Under mu: the wait lands between two
     * staging sequences, and the event is not recorded again before the
     * kernel stream captured it. */
    pthread_mutex_lock(&c->mu);
    kvd_status_t st = kvd_cuda_event_record(c->res->save_ev, stream);
    if (st == KVD_OK) {
        st = kvd_cuda_stream_wait_event(c->res->kstream, c->res->save_ev);
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

static kvd_status_t cuda_reads_order(kvd_worker_t *w, void *stream)
{
    wcuda_t *c = w->cuda;
    /* Only the kernel stream touches the engine's cache (gathers read it,
     * scatters write it). Under mu, as save_order: recorded after a whole
     * staging sequence. */
    pthread_mutex_lock(&c->mu);
    kvd_status_t st = kvd_cuda_event_record(c->res->reads_ev, c->res->kstream);
    if (st == KVD_OK) {
        st = kvd_cuda_stream_wait_event(stream, c->res->reads_ev);
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

static kvd_status_t cuda_drain(kvd_worker_t *w)
{
    return streams_wait(w->cuda->res);
}

/* The step's copies ran: its id arrays go back to the free list. */
static void cuda_step_done(kvd_worker_t *w, wstep_t *s)
{
    wcuda_t *c = w->cuda;
    cids_t *b = s->dev_buf;
    if (b == NULL) {
        return;
    }
    s->dev_buf = NULL;
    pthread_mutex_lock(&c->mu);
    b->next = c->res->free_ids;
    c->res->free_ids = b;
    pthread_mutex_unlock(&c->mu);
}

/* ---- the ops table ------------------------------------------------------ */

/* One chunk per layer: a layer's copies share the stream and the staging
 * buffer, so splitting it over threads gains nothing. */
static size_t cuda_chunks(const kvd_worker_t *w, size_t n)
{
    (void)w;
    return n > 0 ? 1 : 0;
}

const wdevice_ops_t kvd_worker_device_cuda = {
    .create = cuda_create,
    .destroy = cuda_destroy,
    .register_caches = cuda_register_caches,
    .chunks = cuda_chunks,
    .tasks_complete = false,
    .load = cuda_load,
    .save = cuda_save,
    .load_async = cuda_load_async,
    .stream_wait = cuda_stream_wait,
    .save_order = cuda_save_order,
    .reads_order = cuda_reads_order,
    .drain = cuda_drain,
    .step_done = cuda_step_done,
    .can_rotate = true,
};
