/*
 * The worker's host device backend (KVD_WORKER_DEVICE_HOST): the engine's
 * KV cache is in host memory and the pool threads copy between it and the
 * arena with the CPU reference kernels (kernels/ref), a chunk of blocks per
 * thread. A finished task has done its copies, so there is nothing to
 * order on a stream and nothing to wait for at the end of a step: the
 * stream calls do nothing. CI, the demo and the Python tests run it.
 */
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

/* Layer `layer` of `n` objects into their blocks; with deltas (content
 * loads), each block's keys rotated to its new position in the same pass
 * (a delta of 0 leaves a block as loaded). */
static kvd_status_t host_scatter(kvd_worker_t *w, uint32_t layer,
                                 const int32_t *ids, void *const *objs,
                                 const int64_t *deltas, size_t n)
{
    const void *const *o = (const void *const *)objs;
    if (deltas != NULL) {
        return kvd_ref_scatter_layer_rope(
            &w->layout, &w->cfg.format, w->tables, layer, ids, n,
            w->cfg.format.block_size, o, &w->rope, deltas);
    }
    return kvd_ref_scatter_layer(&w->layout, &w->cfg.format, w->tables, layer,
                                 ids, n, w->cfg.format.block_size, o);
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
    return kvd_ref_gather_layer(&w->layout, &w->cfg.format, w->tables, layer,
                                s->save_ids + first, count,
                                w->cfg.format.block_size, s->save_objs + first);
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
    .drain = host_drain,
    .can_rotate = true,
};
