/*
 * The worker's host device backend (KVD_WORKER_DEVICE_HOST): the engine's
 * KV cache is in host memory and the pool threads copy between it and the
 * arena with the CPU reference kernels (kernels/ref), a chunk of blocks per
 * thread. A finished task has done its copies, so there is nothing to
 * order on a stream and nothing to wait for at the end of a step: the
 * stream calls do nothing. CI, the demo and the Python tests run it.
 * A worker whose heads are part of a shared object (cfg.object_heads)
 * encodes them straight into their ranges of the objects and decodes them
 * from there (kvd_ref_gather_layer_heads) when the ranges are 16-byte
 * aligned, as at every usual block and head size; otherwise it encodes
 * and decodes them in its own format in a buffer of the thread and copies
 * them between it and the objects by their byte ranges.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "worker/worker_int.h"

static kvd_status_t host_create(kvd_worker_t *w, char *err, size_t err_len)
{
    (void)w, (void)err, (void)err_len;
    return KVD_OK;
}

static void host_destroy(kvd_worker_t *w)
{
    (void)w;
}

static kvd_status_t host_register_caches(kvd_worker_t *w,
                                         const kvd_kv_layout_t *layout,
                                         char *err, size_t err_len)
{
    (void)w, (void)layout, (void)err, (void)err_len;
    return KVD_OK;
}

/* One chunk per pool thread: the layer's copies run in parallel. */
static size_t host_chunks(const kvd_worker_t *w, size_t n)
{
    return n < w->num_threads ? n : w->num_threads;
}

/* A layer of `n` objects in this worker's own format, one layer each, for
 * a shared object's copies (docs/codecs.md, "Head ranges"): the kernels
 * run on the one-layer view `one` of the cache (base `base`), and the
 * worker's heads move between `buf` (the thread's scratch) and the objects
 * by their ranges. */
typedef struct shard_layer {
    kvd_object_format_t fmt;
    void *base[1];
    kvd_kv_layout_t one;
    unsigned char *buf;
    void **objs;
    size_t stride;
    kvd_object_range_t r[KVD_OBJECT_MAX_RANGES];
    size_t nr;
} shard_layer_t;

/* The calling thread's buffer for a shared object's copies, kept and grown
 * between tasks (fresh memory of that size would be mapped and faulted in
 * for every layer), freed when the thread exits. */
typedef struct scratch {
    unsigned char *buf;
    size_t cap;
    void **objs;
    size_t objs_cap;
} scratch_t;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *p)
{
    scratch_t *s = p;
    free(s->buf);
    free(s->objs);
    free(s);
}

static void scratch_init(void)
{
    (void)pthread_key_create(&scratch_key, scratch_free);
}

/* At least `bytes` of buffer (64-byte aligned) and `n` object pointers. */
static scratch_t *scratch_get(size_t bytes, size_t n)
{
    (void)pthread_once(&scratch_once, scratch_init);
    scratch_t *s = pthread_getspecific(scratch_key);
    if (s == NULL) {
        s = calloc(1, sizeof *s);
        if (s == NULL || pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->cap < bytes) {
        free(s->buf);
        s->buf = NULL;
        s->cap = 0;
        if (posix_memalign((void **)&s->buf, 64, bytes) != 0) {
            s->buf = NULL;
            return NULL;
        }
        s->cap = bytes;
    }
    if (s->objs_cap < n) {
        void **o = realloc(s->objs, n * sizeof *o);
        if (o == NULL) {
            return NULL;
        }
        s->objs = o;
        s->objs_cap = n;
    }
    return s;
}

static kvd_status_t shard_open(kvd_worker_t *w, uint32_t layer, size_t n,
                               shard_layer_t *sl)
{
    sl->fmt = w->cfg.format;
    sl->fmt.num_layers = 1;
    sl->base[0] = w->layout.layer_base[layer];
    sl->one = w->layout;
    sl->one.layer_base = sl->base;
    sl->stride = kvd_object_bytes(&sl->fmt);
    sl->nr = kvd_object_shard_ranges(&w->store_fmt, w->cfg.head_start,
                                     w->cfg.format.num_heads, layer, sl->r);
    scratch_t *s = scratch_get(n * sl->stride, n);
    if (s == NULL) {
        return KVD_ERR_NOMEM;
    }
    sl->buf = s->buf;
    sl->objs = s->objs;
    for (size_t i = 0; i < n; i++) {
        sl->objs[i] = sl->buf + i * sl->stride;
    }
    return KVD_OK;
}

/* Copies the worker's heads of each object in or out of `sl`. */
static void shard_move(shard_layer_t *sl, void *const *objs, size_t n,
                       bool to_objects)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char *obj = objs[i];
        unsigned char *mine = sl->objs[i];
        for (size_t k = 0; k < sl->nr; k++) {
            const kvd_object_range_t *r = &sl->r[k];
            if (to_objects) {
                memcpy(obj + r->object_offset, mine + r->shard_offset,
                       r->bytes);
            } else {
                memcpy(mine + r->shard_offset, obj + r->object_offset,
                       r->bytes);
            }
        }
    }
}

/* Layer `layer` of `n` objects into their blocks; with deltas (content
 * loads), each block's keys rotated to its new position in the same pass
 * (a delta of 0 leaves a block as loaded). */
static kvd_status_t host_scatter(kvd_worker_t *w, uint32_t layer,
                                 const int32_t *ids, void *const *objs,
                                 const int64_t *deltas, size_t n)
{
    const void *const *o = (const void *const *)objs;
    if (w->shard_direct) {
        return kvd_ref_scatter_layer_heads(
            &w->layout, &w->store_fmt, w->tables, layer, w->cfg.head_start,
            w->cfg.format.num_heads, ids, n, w->cfg.format.block_size, o,
            deltas != NULL ? &w->rope : NULL, deltas);
    }
    const kvd_kv_layout_t *layout = &w->layout;
    const kvd_object_format_t *fmt = &w->cfg.format;
    shard_layer_t sl;
    if (w->shard && n > 0) {
        kvd_status_t st = shard_open(w, layer, n, &sl);
        if (st != KVD_OK) {
            return st;
        }
        shard_move(&sl, objs, n, false);
        o = (const void *const *)sl.objs;
        layout = &sl.one;
        fmt = &sl.fmt;
        layer = 0;
    }
    kvd_status_t st;
    if (deltas != NULL) {
        st = kvd_ref_scatter_layer_rope(layout, fmt, w->tables, layer, ids, n,
                                        fmt->block_size, o, &w->rope, deltas);
    } else {
        st = kvd_ref_scatter_layer(layout, fmt, w->tables, layer, ids, n,
                                   fmt->block_size, o);
    }
    return st;
}

/* Layer `layer` of `n` blocks into their objects. */
static kvd_status_t host_gather(kvd_worker_t *w, uint32_t layer,
                                const int32_t *ids, void *const *objs, size_t n)
{
    if (w->shard_direct) {
        return kvd_ref_gather_layer_heads(
            &w->layout, &w->store_fmt, w->tables, layer, w->cfg.head_start,
            w->cfg.format.num_heads, ids, n, w->cfg.format.block_size, objs);
    }
    if (!w->shard || n == 0) {
        return kvd_ref_gather_layer(&w->layout, &w->cfg.format, w->tables,
                                    layer, ids, n, w->cfg.format.block_size,
                                    objs);
    }
    shard_layer_t sl;
    kvd_status_t st = shard_open(w, layer, n, &sl);
    if (st != KVD_OK) {
        return st;
    }
    st = kvd_ref_gather_layer(&sl.one, &sl.fmt, w->tables, 0, ids, n,
                              sl.fmt.block_size, sl.objs);
    if (st == KVD_OK) {
        shard_move(&sl, objs, n, true);
    }
    return st;
}

static kvd_status_t host_load(kvd_worker_t *w, wstep_t *s, uint32_t layer,
                              size_t first, size_t count)
{
    return host_scatter(w, layer, s->load_ids + first, s->load_objs + first,
                        s->any_delta ? s->load_deltas + first : NULL, count);
}

static kvd_status_t host_save(kvd_worker_t *w, wstep_t *s, uint32_t layer,
                              size_t first, size_t count)
{
    return host_gather(w, layer, s->save_ids + first, s->save_objs + first,
                       count);
}

/* Every layer in turn, stopping at the first error. */
static kvd_status_t host_load_async(kvd_worker_t *w, const int32_t *ids,
                                    void *const *objs, const int64_t *deltas,
                                    size_t n)
{
    kvd_status_t st = KVD_OK;
    for (uint32_t l = 0; l < w->cfg.format.num_layers && st == KVD_OK; l++) {
        st = host_scatter(w, l, ids, objs, deltas, n);
    }
    return st;
}

static kvd_status_t host_stream_wait(kvd_worker_t *w, uint32_t layer,
                                     void *stream)
{
    (void)w, (void)layer, (void)stream;
    return KVD_OK;
}

static kvd_status_t host_save_order(kvd_worker_t *w, void *stream)
{
    (void)w, (void)stream;
    return KVD_OK;
}

static kvd_status_t host_reads_order(kvd_worker_t *w, void *stream)
{
    (void)w, (void)stream; /* bind waited for the copies themselves */
    return KVD_OK;
}

static kvd_status_t host_drain(kvd_worker_t *w)
{
    (void)w;
    return KVD_OK;
}

const wdevice_ops_t kvd_worker_device_host = {
    .create = host_create,
    .destroy = host_destroy,
    .register_caches = host_register_caches,
    .chunks = host_chunks,
    .tasks_complete = true,
    .load = host_load,
    .save = host_save,
    .load_async = host_load_async,
    .stream_wait = host_stream_wait,
    .save_order = host_save_order,
    .reads_order = host_reads_order,
    .drain = host_drain,
    .can_rotate = true,
};
