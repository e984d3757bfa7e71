/*
 * A CPU model of kernels/cuda's C entry points (kvdepot/kernels_cuda.h), so the
 * worker's CUDA backend (worker/device_cuda.c) and its GPU test suite
 * (tests/gpu/test_cuda_worker.c) run in CI, where there is no GPU
 * (tests/README.md: every build runs the CUDA backend's code paths).
 *
 * What it models is the part that is the worker's to get right: stream
 * order and the host's view of it. "Device memory" is host memory this
 * file allocated (pointer queries say which is which); every enqueued
 * operation (copy, gather, scatter, RoPE shift, a wait on another stream's
 * event) is queued on its stream and runs only when something waits for
 * it: a synchronize of that stream, a wait on an event recorded after it,
 * or a stream that must wait for that event and is itself run. So a worker
 * that reads, commits or releases before waiting sees stale bytes, as it
 * would on a GPU, and block ids are read from the "device" array when the
 * kernel runs, as on a GPU. Gather, scatter and the RoPE shift run the C
 * reference kernels (bit-exact with the CUDA ones for every codec but
 * TurboQuant, which is specified within a tolerance). Argument checks
 * happen at enqueue, as in gather.cu and rope.cu (element alignment is
 * checked for the RoPE shift only).
 *
 * tests/gpu/fake_cuda_int.h lets a test make one side of an ordering run
 * ahead of the other instead (the device racing ahead).
 *
 * Not modelled: concurrency between streams (everything runs on the thread
 * that waits, under one recursive lock), device faults, and the copy
 * engine. One device, ordinal 0.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvdepot/kernels_cuda.h"
#include "kernels/ref/ref.h"
#include "tests/gpu/fake_cuda_int.h"
#include "kernels/ref/rope_int.h"

typedef enum fop_kind {
    FOP_COPY,
    FOP_GATHER,
    FOP_SCATTER,
    FOP_ROPE,
    FOP_WAIT
} fop_kind_t;

typedef struct fstream fstream_t;

/* One queued operation. */
typedef struct fop {
    fop_kind_t kind;
    /* FOP_COPY */
    void *dst;
    const void *src;
    size_t len;
    /* FOP_GATHER / FOP_SCATTER */
    kvd_kv_layout_t layout; /* layer_base NULL: the call's arrays are gone */
    void *layer_ptr;        /* layout->layer_base[layer], read at enqueue */
    kvd_object_format_t fmt;
    const kvd_codec_tables_t *tables;
    unsigned layer;
    const int32_t *ids_dev;
    size_t n;
    uint32_t valid_last;
    unsigned char *base;
    size_t stride;
    /* FOP_ROPE (with layout, layer_ptr, fmt, layer, ids_dev, n, valid_last) */
    const kvd_rope_t *rope;
    const int64_t *deltas_dev;
    /* FOP_WAIT: run `on` up to operation `seq` first */
    fstream_t *on;
    uint64_t seq;
} fop_t;

/* Operations [done, queued) are pending; ops[i - first] is number i. */
struct fstream {
    fop_t *ops;
    size_t cap;
    uint64_t first, done, queued;
    fstream_t *next; /* every stream, for device-wide waits */
};

typedef struct fevent {
    fstream_t *on; /* NULL: never recorded */
    uint64_t seq;
} fevent_t;

struct kvd_cuda_tables {
    kvd_codec_tables_t host;
};

struct kvd_cuda_rope {
    kvd_rope_t host;
};

typedef struct frange {
    unsigned char *p;
    size_t len;
    struct frange *next;
} frange_t;

static pthread_mutex_t g_mu;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static fstream_t g_default; /* the legacy default stream (NULL) */
static fstream_t *g_streams = &g_default;
static frange_t *g_device;     /* "device" allocations */
static frange_t *g_registered; /* cudaHostRegister'ed ranges */
static _Thread_local int g_current;
/* 0 every stream lazy; 1 g_ahead runs ahead (kvd_fake_cuda_engine_ahead);
 * 2 every stream but g_ahead does (kvd_fake_cuda_others_ahead). */
static int g_ahead_mode;
static fstream_t *g_ahead;

static void fake_init(void)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&g_mu, &a);
    pthread_mutexattr_destroy(&a);
}

static void lock(void)
{
    pthread_once(&g_once, fake_init);
    pthread_mutex_lock(&g_mu);
}

static void unlock(void)
{
    pthread_mutex_unlock(&g_mu);
}

static fstream_t *stream_of(void *stream)
{
    return stream == NULL ? &g_default : stream;
}

static void run_until(fstream_t *s, uint64_t seq);

/* A RoPE shift as the kernel runs it: ids and deltas as they are in
 * "device" memory now, the layer's base captured at launch. */
static void op_rope_run(fop_t *op)
{
    void **bases = malloc(op->fmt.num_layers * sizeof *bases);
    if (bases == NULL) {
        abort();
    }
    for (unsigned l = 0; l < op->fmt.num_layers; l++) {
        bases[l] = op->layer_ptr;
    }
    op->layout.layer_base = bases;
    if (kvd_ref_rope_shift_layer(&op->layout, &op->fmt, op->rope, op->layer,
                                 op->ids_dev, op->deltas_dev, op->n,
                                 op->valid_last) != KVD_OK) {
        abort(); /* checked at enqueue, as gather and scatter */
    }
    free(bases);
}

static void op_run(fop_t *op)
{
    void *objs[256];
    void **bases = NULL;
    switch (op->kind) {
    case FOP_COPY: memcpy(op->dst, op->src, op->len); break;
    case FOP_WAIT: run_until(op->on, op->seq); break;
    case FOP_GATHER:
    case FOP_SCATTER:
        /* A kernel's arguments are captured at launch: the layer's base
         * comes from the op, not from the caller's array. */
        bases = malloc(op->fmt.num_layers * sizeof *bases);
        if (bases == NULL) {
            abort();
        }
        for (unsigned l = 0; l < op->fmt.num_layers; l++) {
            bases[l] = op->layer_ptr;
        }
        op->layout.layer_base = bases;
        /* The ids as they are in "device" memory now, like a kernel. */
        for (size_t k = 0; k < op->n; k += 256) {
            size_t m = op->n - k < 256 ? op->n - k : 256;
            for (size_t i = 0; i < m; i++) {
                objs[i] = op->base + (k + i) * op->stride;
            }
            kvd_status_t st =
                op->kind == FOP_GATHER
                    ? kvd_ref_gather_layer(&op->layout, &op->fmt, op->tables,
                                           op->layer, op->ids_dev + k, m,
                                           k + m == op->n ? op->valid_last
                                                          : op->fmt.block_size,
                                           objs)
                    : kvd_ref_scatter_layer(&op->layout, &op->fmt, op->tables,
                                            op->layer, op->ids_dev + k, m,
                                            k + m == op->n ? op->valid_last
                                                           : op->fmt.block_size,
                                            (const void *const *)objs);
            /* Arguments were checked at enqueue; ids changed since then
             * would be a fault on a GPU. */
            if (st != KVD_OK) {
                abort();
            }
        }
        free(bases);
        break;
    case FOP_ROPE: op_rope_run(op); break;
    }
}

/* Runs `s`'s operations up to number `seq` (lock held). */
static void run_until(fstream_t *s, uint64_t seq)
{
    while (s->done < seq) {
        fop_t op = s->ops[s->done - s->first];
        s->done++;
        op_run(&op);
    }
    if (s->done == s->queued) {
        s->first = s->done; /* the array restarts empty */
    }
}

/* Runs `s`'s operations until one waits for an event its stream has not
 * reached (lock held): what can run without making another stream run. */
static void run_ready(fstream_t *s)
{
    while (s->done < s->queued) {
        const fop_t *op = &s->ops[s->done - s->first];
        if (op->kind == FOP_WAIT && op->on->done < op->seq) {
            return;
        }
        run_until(s, s->done + 1);
    }
}

static void run_all(void)
{
    for (fstream_t *s = g_streams; s != NULL; s = s->next) {
        run_until(s, s->queued);
    }
}

static kvd_status_t enqueue(void *stream, const fop_t *op)
{
    lock();
    fstream_t *s = stream_of(stream);
    size_t used = (size_t)(s->queued - s->first);
    if (used == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        fop_t *ops = realloc(s->ops, cap * sizeof *ops);
        if (ops == NULL) {
            unlock();
            return KVD_ERR_NOMEM;
        }
        s->ops = ops;
        s->cap = cap;
    }
    s->ops[used] = *op;
    s->queued++;
    if (g_ahead_mode == 1 && s == g_ahead) {
        run_until(s, s->queued);
    } else if (g_ahead_mode == 2 && s != g_ahead) {
        run_ready(s);
    }
    unlock();
    return KVD_OK;
}

void kvd_fake_cuda_engine_ahead(void *stream)
{
    lock();
    g_ahead = stream_of(stream);
    g_ahead_mode = 1;
    unlock();
}

void kvd_fake_cuda_others_ahead(void *stream)
{
    lock();
    g_ahead = stream_of(stream);
    g_ahead_mode = 2;
    unlock();
}

void kvd_fake_cuda_lazy(void)
{
    lock();
    g_ahead_mode = 0;
    g_ahead = NULL;
    unlock();
}

static bool in_ranges(const frange_t *r, const void *p)
{
    for (; r != NULL; r = r->next) {
        if ((const unsigned char *)p >= r->p &&
            (const unsigned char *)p < r->p + r->len) {
            return true;
        }
    }
    return false;
}

static kvd_status_t range_add(frange_t **list, void *p, size_t len)
{
    frange_t *r = malloc(sizeof *r);
    if (r == NULL) {
        return KVD_ERR_NOMEM;
    }
    r->p = p;
    r->len = len;
    r->next = *list;
    *list = r;
    return KVD_OK;
}

static void range_remove(frange_t **list, const void *p)
{
    for (frange_t **pp = list; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->p == p) {
            frange_t *r = *pp;
            *pp = r->next;
            free(r);
            return;
        }
    }
}

/* ---- device discovery ---------------------------------------------------- */

kvd_status_t kvd_cuda_device_count(int *count_out)
{
    *count_out = 1;
    return KVD_OK;
}

kvd_status_t kvd_cuda_status(int cuda_err, const char *what)
{
    (void)what;
    return cuda_err == 0 ? KVD_OK : KVD_ERR_DEVICE;
}

kvd_status_t kvd_cuda_device_get(int *device_out)
{
    if (device_out == NULL) {
        return KVD_ERR_INVALID;
    }
    *device_out = g_current;
    return KVD_OK;
}

kvd_status_t kvd_cuda_device_set(int device)
{
    if (device != 0) {
        return device < 0 ? KVD_ERR_INVALID : KVD_ERR_DEVICE;
    }
    g_current = device;
    return KVD_OK;
}

kvd_status_t kvd_cuda_pointer_query(const void *ptr, int *device_out)
{
    if (ptr == NULL || device_out == NULL) {
        return KVD_ERR_INVALID;
    }
    lock();
    *device_out = in_ranges(g_device, ptr) ? 0 : -1;
    unlock();
    return KVD_OK;
}

/* ---- memory -------------------------------------------------------------- */

kvd_status_t kvd_cuda_mem_create(size_t len, void **dev_out)
{
    if (len == 0 || dev_out == NULL) {
        return KVD_ERR_INVALID;
    }
    void *p = aligned_alloc(256, (len + 255) & ~(size_t)255);
    if (p == NULL) {
        return KVD_ERR_NOMEM;
    }
    lock();
    kvd_status_t st = range_add(&g_device, p, len);
    unlock();
    if (st != KVD_OK) {
        free(p);
        return st;
    }
    *dev_out = p;
    return KVD_OK;
}

void kvd_cuda_mem_destroy(void *dev)
{
    if (dev == NULL) {
        return;
    }
    lock();
    run_all(); /* cudaFree waits for the device */
    range_remove(&g_device, dev);
    unlock();
    free(dev);
}

kvd_status_t kvd_cuda_mem_copy(void *dst, const void *src, size_t len)
{
    lock();
    run_all();
    memcpy(dst, src, len);
    unlock();
    return KVD_OK;
}

kvd_status_t kvd_cuda_mem_set(void *dev, int byte, size_t len)
{
    lock();
    run_all();
    memset(dev, byte, len);
    unlock();
    return KVD_OK;
}

kvd_status_t kvd_cuda_device_wait(void)
{
    lock();
    run_all();
    unlock();
    return KVD_OK;
}

kvd_status_t kvd_cuda_host_register(void *ptr, size_t len)
{
    if (ptr == NULL || len == 0) {
        return KVD_ERR_INVALID;
    }
    lock();
    kvd_status_t st = in_ranges(g_registered, ptr)
                          ? KVD_ERR_STATE
                          : range_add(&g_registered, ptr, len);
    unlock();
    return st;
}

void kvd_cuda_host_unregister(void *ptr)
{
    lock();
    range_remove(&g_registered, ptr);
    unlock();
}

kvd_status_t kvd_cuda_host_alloc(size_t len, void **host_out)
{
    if (len == 0 || host_out == NULL) {
        return KVD_ERR_INVALID;
    }
    void *p = malloc(len);
    if (p == NULL) {
        return KVD_ERR_NOMEM;
    }
    *host_out = p;
    return KVD_OK;
}

void kvd_cuda_host_free(void *host)
{
    free(host);
}

/* ---- streams and events ---------------------------------------------------
 */

kvd_status_t kvd_cuda_stream_create(void **stream_out)
{
    fstream_t *s = calloc(1, sizeof *s);
    if (s == NULL) {
        return KVD_ERR_NOMEM;
    }
    lock();
    s->next = g_streams;
    g_streams = s;
    unlock();
    *stream_out = s;
    return KVD_OK;
}

void kvd_cuda_stream_destroy(void *stream)
{
    if (stream == NULL) {
        return;
    }
    fstream_t *s = stream;
    lock();
    run_until(s, s->queued);
    for (fstream_t **pp = &g_streams; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    }
    unlock();
    free(s->ops);
    free(s);
}

kvd_status_t kvd_cuda_stream_wait(void *stream)
{
    lock();
    fstream_t *s = stream_of(stream);
    run_until(s, s->queued);
    unlock();
    return KVD_OK;
}

kvd_status_t kvd_cuda_event_create(void **event_out)
{
    fevent_t *e = calloc(1, sizeof *e);
    if (e == NULL) {
        return KVD_ERR_NOMEM;
    }
    *event_out = e;
    return KVD_OK;
}

void kvd_cuda_event_destroy(void *event)
{
    free(event);
}

kvd_status_t kvd_cuda_event_record(void *event, void *stream)
{
    fevent_t *e = event;
    lock();
    e->on = stream_of(stream);
    e->seq = e->on->queued;
    unlock();
    return KVD_OK;
}

kvd_status_t kvd_cuda_event_wait(void *event)
{
    fevent_t *e = event;
    lock();
    if (e->on != NULL) {
        run_until(e->on, e->seq);
    }
    unlock();
    return KVD_OK;
}

kvd_status_t kvd_cuda_stream_wait_event(void *stream, void *event)
{
    fevent_t *e = event;
    lock();
    fop_t op = {.kind = FOP_WAIT, .on = e->on, .seq = e->seq};
    bool any = e->on != NULL && e->on != stream_of(stream);
    unlock();
    return any ? enqueue(stream, &op) : KVD_OK;
}

/* ---- copies ----------------------------------------------------------------
 */

kvd_status_t kvd_cuda_copy_async(void *dst, const void *src, size_t len,
                                 void *stream)
{
    if (len == 0) {
        return KVD_OK;
    }
    if (dst == NULL || src == NULL) {
        return KVD_ERR_INVALID;
    }
    fop_t op = {.kind = FOP_COPY, .dst = dst, .src = src, .len = len};
    return enqueue(stream, &op);
}

kvd_status_t kvd_cuda_copy_batch_async(void *const *dsts,
                                       const void *const *srcs,
                                       const size_t *sizes, size_t n,
                                       bool to_device, int device, void *stream)
{
    if (device != 0) {
        return KVD_ERR_INVALID;
    }
    for (size_t i = 0; i < n; i++) {
        /* The device side must be device memory, the other side not. */
        const void *dev = to_device ? dsts[i] : srcs[i];
        const void *host = to_device ? srcs[i] : dsts[i];
        lock();
        bool ok = in_ranges(g_device, dev) && !in_ranges(g_device, host);
        unlock();
        if (!ok) {
            return KVD_ERR_INVALID;
        }
        kvd_status_t st =
            kvd_cuda_copy_async(dsts[i], srcs[i], sizes[i], stream);
        if (st != KVD_OK) {
            return st;
        }
    }
    return KVD_OK;
}

/* The worker forms 2D copies only inside a registered (pinned) mapping:
 * the host side's first and last byte must be registered, the device
 * side's device memory. The rows are queued as copies of their own. */
kvd_status_t kvd_cuda_copy_2d_async(void *dst, size_t dpitch, const void *src,
                                    size_t spitch, size_t width, size_t height,
                                    void *stream)
{
    if (width == 0 || height == 0) {
        return KVD_OK;
    }
    if (dst == NULL || src == NULL || dpitch < width || spitch < width) {
        return KVD_ERR_INVALID;
    }
    const unsigned char *d0 = dst, *s0 = src;
    const unsigned char *d1 = d0 + (height - 1) * dpitch + width - 1;
    const unsigned char *s1 = s0 + (height - 1) * spitch + width - 1;
    lock();
    bool to_device = in_ranges(g_device, d0);
    const unsigned char *h0 = to_device ? s0 : d0, *h1 = to_device ? s1 : d1;
    const unsigned char *v1 = to_device ? d1 : s1;
    bool ok = in_ranges(g_device, v1) && in_ranges(g_registered, h0) &&
              in_ranges(g_registered, h1) && !in_ranges(g_device, h0);
    unlock();
    if (!ok) {
        return KVD_ERR_INVALID;
    }
    for (size_t r = 0; r < height; r++) {
        kvd_status_t st = kvd_cuda_copy_async((unsigned char *)dst + r * dpitch,
                                              s0 + r * spitch, width, stream);
        if (st != KVD_OK) {
            return st;
        }
    }
    return KVD_OK;
}

/* ---- codec tables, gather and scatter
 * ---------------------------------------- */

kvd_status_t kvd_cuda_tables_create(const kvd_codec_tables_t *tables,
                                    kvd_cuda_tables_t **tables_out)
{
    if (tables == NULL || tables_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_cuda_tables_t *t = malloc(sizeof *t);
    if (t == NULL) {
        return KVD_ERR_NOMEM;
    }
    t->host = *tables;
    *tables_out = t;
    return KVD_OK;
}

void kvd_cuda_tables_destroy(kvd_cuda_tables_t *tables)
{
    free(tables);
}

/* The checks gather.cu makes before it enqueues anything. */
static kvd_status_t gs_check(const kvd_kv_layout_t *layout,
                             const kvd_object_format_t *fmt, unsigned layer,
                             const int32_t *ids, const int32_t *ids_dev,
                             size_t n, uint32_t valid_last, const void *base,
                             size_t stride)
{
    kvd_status_t st = kvd_kv_layout_check(layout, fmt, NULL, 0);
    if (st != KVD_OK) {
        return st;
    }
    if (layer >= fmt->num_layers) {
        return KVD_ERR_INVALID;
    }
    if (n == 0) {
        return KVD_OK;
    }
    if (ids == NULL || ids_dev == NULL || base == NULL || valid_last < 1 ||
        valid_last > fmt->block_size || ((uintptr_t)base & 15u) != 0 ||
        stride % 16 != 0 || stride < kvd_object_bytes(fmt)) {
        return KVD_ERR_INVALID;
    }
    lock();
    bool device = in_ranges(g_device, ids_dev) && in_ranges(g_device, base) &&
                  in_ranges(g_device, layout->layer_base[layer]);
    unlock();
    if (!device) {
        return KVD_ERR_INVALID;
    }
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= layout->num_blocks) {
            return KVD_ERR_RANGE;
        }
    }
    return KVD_OK;
}

static kvd_status_t gs_enqueue(fop_kind_t kind, const kvd_kv_layout_t *layout,
                               const kvd_object_format_t *fmt,
                               const kvd_cuda_tables_t *tables, unsigned layer,
                               const int32_t *ids, const int32_t *ids_dev,
                               size_t n, uint32_t valid_last, const void *base,
                               size_t stride, void *stream)
{
    kvd_status_t st =
        gs_check(layout, fmt, layer, ids, ids_dev, n, valid_last, base, stride);
    if (st != KVD_OK || n == 0) {
        return st;
    }
    fop_t op = {.kind = kind,
                .layout = *layout,
                .layer_ptr = layout->layer_base[layer],
                .fmt = *fmt,
                .tables = tables != NULL ? &tables->host : NULL,
                .layer = layer,
                .ids_dev = ids_dev,
                .n = n,
                .valid_last = valid_last,
                .base = (unsigned char *)base,
                .stride = stride};
    op.layout.layer_base = NULL;
    return enqueue(stream, &op);
}

kvd_status_t kvd_cuda_gather_layer(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
    const kvd_cuda_tables_t *tables, unsigned layer, const int32_t *block_ids,
    const int32_t *block_ids_dev, size_t num_blocks,
    uint32_t num_valid_tokens_last, void *objects_dev_base,
    size_t object_stride_bytes, void *stream)
{
    return gs_enqueue(FOP_GATHER, layout, fmt, tables, layer, block_ids,
                      block_ids_dev, num_blocks, num_valid_tokens_last,
                      objects_dev_base, object_stride_bytes, stream);
}

kvd_status_t kvd_cuda_scatter_layer(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
    const kvd_cuda_tables_t *tables, unsigned layer, const int32_t *block_ids,
    const int32_t *block_ids_dev, size_t num_blocks,
    uint32_t num_valid_tokens_last, const void *objects_dev_base,
    size_t object_stride_bytes, void *stream)
{
    return gs_enqueue(FOP_SCATTER, layout, fmt, tables, layer, block_ids,
                      block_ids_dev, num_blocks, num_valid_tokens_last,
                      objects_dev_base, object_stride_bytes, stream);
}

/* ---- RoPE re-rotation (rope.cu) ----------------------------------------- */

kvd_status_t kvd_cuda_rope_create(const kvd_rope_t *rope,
                                  kvd_cuda_rope_t **rope_out)
{
    if (rope == NULL || rope_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t st = kvd_rope_check(rope, NULL, 0);
    if (st != KVD_OK) {
        return st;
    }
    kvd_cuda_rope_t *r = malloc(sizeof *r);
    if (r == NULL) {
        return KVD_ERR_NOMEM;
    }
    r->host = *rope;
    *rope_out = r;
    return KVD_OK;
}

void kvd_cuda_rope_destroy(kvd_cuda_rope_t *rope)
{
    free(rope);
}

kvd_status_t kvd_cuda_rope_shift_layer(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
    const kvd_cuda_rope_t *rope, unsigned layer, const int32_t *block_ids,
    const int32_t *block_ids_dev, const int64_t *deltas_dev, size_t num_blocks,
    uint32_t num_valid_tokens_last, void *stream)
{
    if (rope == NULL) {
        return KVD_ERR_INVALID;
    }
    /* rope.cu's checks: the reference's, then the device arrays. */
    kvd_status_t st =
        kvd_rope_args_check(layout, fmt, &rope->host, layer, block_ids,
                            deltas_dev, num_blocks, num_valid_tokens_last);
    if (st != KVD_OK || num_blocks == 0) {
        return st;
    }
    lock();
    bool device = in_ranges(g_device, block_ids_dev) &&
                  in_ranges(g_device, deltas_dev) &&
                  in_ranges(g_device, layout->layer_base[layer]);
    unlock();
    if (!device) {
        return KVD_ERR_INVALID;
    }
    /* rope.cu reads 2-byte elements: an odd base or stride is refused. */
    uint64_t bits = (uint64_t)(uintptr_t)layout->layer_base[layer];
    if (layout->num_blocks > 1) {
        bits |= (uint64_t)layout->stride_block;
    }
    if (fmt->block_size > 1) {
        bits |= (uint64_t)layout->stride_token;
    }
    if (fmt->num_heads > 1) {
        bits |= (uint64_t)layout->stride_head;
    }
    if (bits % 2 != 0) {
        return KVD_ERR_UNSUPPORTED;
    }
    fop_t op = {.kind = FOP_ROPE,
                .layout = *layout,
                .layer_ptr = layout->layer_base[layer],
                .fmt = *fmt,
                .layer = layer,
                .ids_dev = block_ids_dev,
                .n = num_blocks,
                .valid_last = num_valid_tokens_last,
                .rope = &rope->host,
                .deltas_dev = deltas_dev};
    op.layout.layer_base = NULL;
    return enqueue(stream, &op);
}

/* gather.cu's fused scatter + rotation: the same bytes as the two
 * operations one after the other, which is what the model runs. */
kvd_status_t kvd_cuda_scatter_layer_rope(
    const kvd_kv_layout_t *layout, const kvd_object_format_t *fmt,
    const kvd_cuda_tables_t *tables, const kvd_cuda_rope_t *rope,
    unsigned layer, const int32_t *block_ids, const int32_t *block_ids_dev,
    const int64_t *deltas_dev, size_t num_blocks,
    uint32_t num_valid_tokens_last, const void *objects_dev_base,
    size_t object_stride_bytes, void *stream)
{
    if (rope == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t st =
        kvd_rope_args_check(layout, fmt, &rope->host, layer, block_ids,
                            deltas_dev, num_blocks, num_valid_tokens_last);
    if (st == KVD_OK) {
        st = gs_check(layout, fmt, layer, block_ids, block_ids_dev, num_blocks,
                      num_valid_tokens_last, objects_dev_base,
                      object_stride_bytes);
    }
    if (st != KVD_OK || num_blocks == 0) {
        return st;
    }
    lock();
    bool device = in_ranges(g_device, deltas_dev);
    unlock();
    if (!device) {
        return KVD_ERR_INVALID;
    }
    st = gs_enqueue(FOP_SCATTER, layout, fmt, tables, layer, block_ids,
                    block_ids_dev, num_blocks, num_valid_tokens_last,
                    objects_dev_base, object_stride_bytes, stream);
    if (st != KVD_OK) {
        return st;
    }
    return kvd_cuda_rope_shift_layer(layout, fmt, rope, layer, block_ids,
                                     block_ids_dev, deltas_dev, num_blocks,
                                     num_valid_tokens_last, stream);
}
