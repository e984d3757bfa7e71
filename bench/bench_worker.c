/*
 * Worker benchmark (issue "Worker"), host backend: a 32-layer model shard
 * (Llama-3-8B at TP 1: 8 KV heads, head_dim 128, bf16, 16-token blocks, so
 * one object is 2 MiB) in vLLM's FlashAttention NHD layout, one tensor per
 * layer.
 *
 *   save     one step saving 64 blocks (bind with reservations, every
 *            save_kv_layer, wait_for_save with the commits) against memcpy
 *            of the same 128 MiB from one buffer to another, same run;
 *   load     one step loading the 64 objects into 64 other blocks
 *            (synchronous, not layerwise: bind, start_load_kv, clear);
 *   overlap  the same loads layer by layer with a simulated per-layer
 *            compute equal to the measured per-layer load time, the
 *            hardest case: wall time over max(total load, total compute).
 *            Two stand-ins, interleaved pass by pass: a sleep (a GPU
 *            kernel leaves the CPU free) and busy work on the engine
 *            thread shaped like a forward pass on a CPU (busy_s: a 64 MiB
 *            weight buffer streamed in tiles, each worked on 16 times in
 *            cache), which takes a core and some memory bandwidth from the
 *            worker's copies.
 *
 * The worker copies with its threads (2 by default), so each pass also
 * times memcpy of the same bytes split over that many threads: on a host
 * where one core cannot saturate memory the one-thread memcpy flatters the
 * worker, and the second pair of headlines says so.
 *
 * Each step's plan is packed before its clock starts (the leader builds
 * it, in the scheduler's process); the worker's bind of it is timed.
 *
 * Seven passes; the headlines are medians of per-pass ratios. The
 * overlap runs on a worker with one thread fewer than the machine's cores
 * (the engine thread keeps one). KVDEPOT_BENCH_THREADS sets the worker's
 * threads for both parts (default: the worker's own, 2).
 *
 * CUDA backend, when built with CUDA and a device is present (else one
 * "skipped" line): the same shard with the cache in device memory and the
 * arena page-locked by the worker,
 *
 *   cuda save  one step saving 64 blocks (bind, save_kv_layer of every
 *              layer on a stream, wait_for_save) against one
 *              cudaMemcpyAsync device -> pinned host of the same 128 MiB,
 *   cuda load  one step loading them back (whole-step, start_load_kv on
 *              the stream, then the step's end) against one
 *              cudaMemcpyAsync pinned host -> device,
 *
 * both timed on the host until the copies are done, seven passes, medians
 * of per-pass ratios (raw; target 0.85). For fp8 and tq4 the same steps
 * report effective bandwidth: bf16 cache bytes moved per second.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "kvdepot/worker.h"
#include "tests/support/kvd_testplan.h"
#ifdef KVD_HAVE_CUDA
#include "kvdepot/kernels_cuda.h"
#endif

#define LAYERS 32u
#define HEADS 8u
#define DIM 128u
#define BS 16u
#define NB 128u
#define N_IO 64u
#define PASSES 7

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* The busy compute stand-in, shaped like a forward pass on a CPU: it
 * streams through a weight buffer larger than the caches (BUSY_BYTES) in
 * 64 KiB tiles and works on each tile BUSY_REUSE times while it is in
 * cache, writing it back once: a core kept busy and DRAM read and written
 * at about a sixteenth of the rate a plain copy would, for `s` seconds. */
#define BUSY_BYTES (64u << 20)
#define BUSY_TILE (64u << 10)
#define BUSY_REUSE 16
static float *busy_buf;

static void busy_s(double s)
{
    double end = now_s() + s;
    size_t tile = BUSY_TILE / sizeof *busy_buf;
    size_t tiles = BUSY_BYTES / BUSY_TILE;
    static size_t at;
    while (now_s() < end) {
        float *x = busy_buf + (at++ % tiles) * tile;
        float acc = 0.f;
        for (int r = 0; r < BUSY_REUSE; r++) {
            for (size_t i = 0; i < tile; i++) {
                acc = acc * 0.999f + x[i];
            }
        }
        for (size_t i = 0; i < tile; i++) {
            x[i] = x[i] * 0.5f + acc * 1e-9f;
        }
    }
}

static kvd_block_hash_t hash_of(uint32_t pass, uint32_t i)
{
    kvd_block_hash_t h;
    memset(h.bytes, 0x3c, sizeof h.bytes);
    memcpy(h.bytes, &pass, sizeof pass);
    memcpy(h.bytes + 4, &i, sizeof i);
    return h;
}

/* One thread's share of a split memcpy. */
typedef struct copy_part {
    unsigned char *dst;
    const unsigned char *src;
    size_t len;
} copy_part_t;

static void *copy_part_main(void *arg)
{
    copy_part_t *p = arg;
    memcpy(p->dst, p->src, p->len);
    return NULL;
}

/* Seconds memcpy of `len` bytes takes split over `threads` threads (at
 * most 64); -1 if a thread could not be started. */
static double copy_threads(void *dst, const void *src, size_t len,
                           uint32_t threads)
{
    copy_part_t part[64];
    pthread_t tid[64];
    uint32_t n = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    size_t share = (len / n + 4095) & ~(size_t)4095, off = 0;
    uint32_t started = 0;
    bool ok = true;
    double t0 = now_s();
    for (uint32_t i = 0; i < n && off < len; i++) {
        part[i].dst = (unsigned char *)dst + off;
        part[i].src = (const unsigned char *)src + off;
        part[i].len = len - off < share ? len - off : share;
        off += part[i].len;
        if (pthread_create(&tid[i], NULL, copy_part_main, &part[i]) != 0) {
            ok = false;
            break;
        }
        started++;
    }
    for (uint32_t i = 0; i < started; i++) {
        pthread_join(tid[i], NULL);
    }
    return ok ? now_s() - t0 : -1.0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct bench {
    kvd_store_t *store;
    kvd_worker_t *w;
    kvd_namespace_t ns;
    int32_t save_ids[N_IO], load_ids[N_IO];
    kvd_block_hash_t hashes[N_IO];
    uint64_t step;
    /* The last pass's phases, seconds: bind; the layers (save_kv_layer x
     * LAYERS, or start_load_kv); the end (wait_for_save, or clear and the
     * engine stream's wait). */
    double ph_bind, ph_layers, ph_end;
} bench_t;

/* The step's plan, packed before the clock starts: the leader builds it
 * in the scheduler's process, not the worker. NULL on failure. */
static uint8_t *plan_of(bench_t *b, const kvd_testplan_req_t *r, size_t *len)
{
    uint8_t *plan = kvd_testplan_pack(++b->step, BS, &b->ns, r, 1, len);
    if (plan == NULL) {
        fprintf(stderr, "plan: could not pack step %llu\n",
                (unsigned long long)b->step);
    }
    return plan;
}

/* The worker's bind of `plan` (freed). */
static int bind(bench_t *b, uint8_t *plan, size_t len)
{
    char err[256] = "";
    kvd_status_t s = kvd_worker_bind_metadata(b->w, plan, len, err, sizeof err);
    free(plan);
    if (s != KVD_OK) {
        fprintf(stderr, "bind: %s (%s)\n", kvd_status_str(s), err);
        return -1;
    }
    return 0;
}

/* Sets `b` up for one run: its namespace byte, the block ids saves and
 * loads use, and an embedded store with a 1 GiB prefaulted arena. */
static int bench_open(bench_t *b, uint8_t ns_byte)
{
    memset(b, 0, sizeof *b);
    memset(b->ns.bytes, ns_byte, sizeof b->ns.bytes);
    for (uint32_t i = 0; i < N_IO; i++) {
        b->save_ids[i] = (int32_t)(2 * i);
        b->load_ids[i] = (int32_t)(2 * i + 1);
    }
    kvd_config_t *cfg = NULL;
    char err[256] = "";
    kvd_status_t s = kvd_config_create(&cfg);
    if (s == KVD_OK) {
        /* A stored object is the 2 MiB payload plus its header: 64 MiB
         * chunks (the default) hold 31 of them, 496 in the arena, more
         * than the 448 the passes save. */
        if (kvd_config_set(cfg, "store.arena_size", "1g") != KVD_OK ||
            kvd_config_set(cfg, "store.arena_chunk", "64m") != KVD_OK ||
            kvd_config_set(cfg, "store.arena_prefault", "true") != KVD_OK) {
            s = KVD_ERR_INVALID;
        } else {
            s = kvd_store_open(cfg, &b->store, err, sizeof err);
        }
        kvd_config_destroy(cfg);
    }
    if (s != KVD_OK) {
        fprintf(stderr, "store: %s %s\n", kvd_status_str(s), err);
        return -1;
    }
    return 0;
}

/* One save step of N_IO blocks under keys of `pass`, layer by layer on
 * `stream` (NULL: the host backend); seconds until the copies are in the
 * arena and committed. -1 when a save was dropped. */
static double save_pass(bench_t *b, uint32_t pass, void *stream)
{
    for (uint32_t i = 0; i < N_IO; i++) {
        b->hashes[i] = hash_of(pass, i);
    }
    kvd_testplan_req_t r = {.id = "save",
                            .layerwise = true,
                            .n_saves = N_IO,
                            .save_ids = b->save_ids,
                            .save_hashes = b->hashes};
    kvd_worker_stats_t before, after;
    (void)kvd_worker_stats(b->w, &before);
    size_t len = 0;
    uint8_t *plan = plan_of(b, &r, &len);
    if (plan == NULL) {
        return -1;
    }
    double t0 = now_s();
    if (bind(b, plan, len) != 0) {
        return -1;
    }
    double t1 = now_s();
    for (uint32_t l = 0; l < LAYERS; l++) {
        (void)kvd_worker_save_kv_layer(b->w, l, stream);
    }
    double t2 = now_s();
    (void)kvd_worker_wait_for_save(b->w, stream);
    double t3 = now_s(), t = t3 - t0;
    b->ph_bind = t1 - t0;
    b->ph_layers = t2 - t1;
    b->ph_end = t3 - t2;
    kvd_worker_finished_t f;
    (void)kvd_worker_get_finished(b->w, NULL, 0, &f);
    (void)kvd_worker_clear_metadata(b->w);
    (void)kvd_worker_stats(b->w, &after);
    return f.num_finished_saving == 1 &&
                   after.saves_dropped == before.saves_dropped
               ? t
               : -1;
}

/* One load step of the objects of `pass` into other blocks; with
 * compute_s > 0 layer by layer with that much simulated compute per layer
 * (`compute`: sleep_s or busy_s). `stream`: the CUDA backend's engine
 * stream (NULL: the host backend). Seconds until the copies are in the
 * cache. */
static double load_pass(bench_t *b, uint32_t pass, double compute_s,
                        void (*compute)(double), void *stream)
{
    for (uint32_t i = 0; i < N_IO; i++) {
        b->hashes[i] = hash_of(pass, i);
    }
    kvd_testplan_req_t r = {.id = "load",
                            .layerwise = compute_s > 0,
                            .n_loads = N_IO,
                            .load_ids = b->load_ids,
                            .load_hashes = b->hashes};
    size_t len = 0;
    uint8_t *plan = plan_of(b, &r, &len);
    if (plan == NULL) {
        return -1;
    }
    double t0 = now_s();
    if (bind(b, plan, len) != 0) {
        return -1;
    }
    double t1 = now_s();
    (void)kvd_worker_start_load_kv(b->w, stream);
    for (uint32_t l = 0; l < LAYERS && compute_s > 0; l++) {
        (void)kvd_worker_wait_for_layer_load(b->w, l, stream);
        compute(compute_s);
    }
    double t2 = now_s();
    (void)kvd_worker_clear_metadata(b->w); /* CUDA: waits for the side */
#ifdef KVD_HAVE_CUDA
    if (stream != NULL) {
        (void)kvd_cuda_stream_wait(stream); /* ... and the engine's */
    }
#endif
    double t3 = now_s(), t = t3 - t0;
    b->ph_bind = t1 - t0;
    b->ph_layers = t2 - t1;
    b->ph_end = t3 - t2;
    kvd_worker_finished_t f;
    (void)kvd_worker_get_finished(b->w, NULL, 0, &f);
    return f.num_finished_loading == 1 && f.num_failed_loads == 0 ? t : -1;
}

/* ---- CUDA backend ------------------------------------------------------ */

#ifdef KVD_HAVE_CUDA
typedef struct cuda_bench {
    void *cache;        /* device: LAYERS layers of the NHD cache */
    void *stream;       /* the engine's */
    void *pinned, *dev; /* the peer: io_bytes each */
    kvd_kv_layout_t layout;
    void *bases[LAYERS];
} cuda_bench_t;

/* Times the peer copies: one cudaMemcpyAsync each way of `bytes`. */
static void cuda_peer(const cuda_bench_t *cb, size_t bytes, double *h2d,
                      double *d2h)
{
    double t0 = now_s();
    (void)kvd_cuda_copy_async(cb->dev, cb->pinned, bytes, cb->stream);
    (void)kvd_cuda_stream_wait(cb->stream);
    *h2d = now_s() - t0;
    t0 = now_s();
    (void)kvd_cuda_copy_async(cb->pinned, cb->dev, bytes, cb->stream);
    (void)kvd_cuda_stream_wait(cb->stream);
    *d2h = now_s() - t0;
}

/* The CUDA worker's settings a row changes (0 / false: the defaults). */
typedef struct cuda_opts {
    uint32_t staging; /* cuda_staging_blocks */
    uint8_t mode;     /* cuda_copy_mode (kvd_worker_copy_mode_t) */
    uint32_t buffers; /* cuda_staging_buffers */
} cuda_opts_t;

/* Save and load passes of one codec on a fresh store and worker; writes
 * the medians of the per-pass ratios to the peer and the best times. */
static int cuda_codec(cuda_bench_t *cb, kvd_codec_t codec, cuda_opts_t o,
                      size_t io_bytes, double *save_ratio, double *load_ratio,
                      double *best_save, double *best_load)
{
    bench_t b;
    if (bench_open(&b, (uint8_t)(0x78 + (int)codec)) != 0) {
        return -1;
    }
    char err[256] = "";
    kvd_worker_config_t wc = {0};
    wc.store = b.store;
    wc.ns = b.ns;
    wc.device = KVD_WORKER_DEVICE_CUDA;
    wc.cuda_staging_blocks = o.staging;
    wc.cuda_copy_mode = o.mode;
    wc.cuda_staging_buffers = o.buffers;
    wc.format = (kvd_object_format_t){KVD_DTYPE_BF16, LAYERS, 2, HEADS, DIM, BS,
                                      {codec, codec}, 0};
    kvd_status_t s = kvd_worker_create(&wc, &b.w, err, sizeof err);
    if (s == KVD_OK) {
        s = kvd_worker_register_kv_caches(b.w, &cb->layout, err, sizeof err);
    }
    double save[PASSES], load[PASSES], save_ph[3] = {0}, load_ph[3] = {0};
    *best_save = *best_load = 1e9;
    for (int p = 0; p < PASSES && s == KVD_OK; p++) {
        double h2d = 0, d2h = 0;
        cuda_peer(cb, io_bytes, &h2d, &d2h);
        double sv = save_pass(&b, (uint32_t)p, cb->stream);
        double sph[3] = {b.ph_bind, b.ph_layers, b.ph_end};
        double ld = load_pass(&b, (uint32_t)p, 0, NULL, cb->stream);
        if (sv < 0 || ld < 0) {
            snprintf(err, sizeof err, "pass %d failed", p);
            s = KVD_ERR_INTERNAL;
            break;
        }
        if (sv < *best_save) {
            memcpy(save_ph, sph, sizeof save_ph);
        }
        if (ld < *best_load) {
            load_ph[0] = b.ph_bind;
            load_ph[1] = b.ph_layers;
            load_ph[2] = b.ph_end;
        }
        *best_save = sv < *best_save ? sv : *best_save;
        *best_load = ld < *best_load ? ld : *best_load;
        save[p] = d2h / sv;
        load[p] = h2d / ld;
    }
    kvd_worker_stats_t ws = {0};
    if (b.w != NULL) {
        (void)kvd_worker_stats(b.w, &ws);
    }
    kvd_worker_destroy(b.w);
    kvd_store_close(b.store);
    if (s != KVD_OK) {
        fprintf(stderr, "cuda %s: %s (%s)\n", kvd_codec_name(codec),
                kvd_status_str(s), err);
        return -1;
    }
    /* Where the best passes' time went, on the host clock; the copies
     * between the arena and the device per step (save and load alike). */
    printf("cuda     %-8s staging %u%s%s: best save %.2f ms = bind %.2f + "
           "save_kv_layer x %u %.2f + wait_for_save %.2f; best load %.2f ms "
           "= bind %.2f + start_load_kv %.2f + clear and sync %.2f; %.0f "
           "copies per step\n",
           kvd_codec_name(codec), o.staging,
           o.mode == KVD_WORKER_COPY_RUNS         ? ", 2D runs"
           : o.mode == KVD_WORKER_COPY_PER_OBJECT ? ", per object"
                                                  : "",
           o.buffers == 1 ? ", one buffer" : "", *best_save * 1e3,
           save_ph[0] * 1e3, LAYERS, save_ph[1] * 1e3, save_ph[2] * 1e3,
           *best_load * 1e3, load_ph[0] * 1e3, load_ph[1] * 1e3,
           load_ph[2] * 1e3, (double)ws.copy_ops / (2.0 * PASSES));
    qsort(save, PASSES, sizeof *save, cmp_double);
    qsort(load, PASSES, sizeof *load, cmp_double);
    *save_ratio = save[PASSES / 2];
    *load_ratio = load[PASSES / 2];
    return 0;
}

/* KVDEPOT_BENCH_CUDA_STAGING="16,64,...": the raw rows again with each
 * cuda_staging_blocks, to see what the staging buffer's size costs. */
static int cuda_staging_rows(cuda_bench_t *cb, size_t io_bytes)
{
    const char *list = getenv("KVDEPOT_BENCH_CUDA_STAGING");
    double gb = (double)io_bytes / 1e9;
    while (list != NULL && *list != '\0') {
        char *end = NULL;
        unsigned long n = strtoul(list, &end, 10);
        if (end == list || n == 0 || n > 65536) {
            fprintf(stderr, "KVDEPOT_BENCH_CUDA_STAGING: bad entry at '%s'\n",
                    list);
            return -1;
        }
        double sr = 0, lr = 0, bs = 0, bl = 0;
        cuda_opts_t o = {.staging = (uint32_t)n};
        if (cuda_codec(cb, KVD_CODEC_RAW, o, io_bytes, &sr, &lr, &bs, &bl) !=
            0) {
            return -1;
        }
        printf("cuda     raw staging %5lu blocks: save %.2f GB/s, load %.2f "
               "GB/s (%.2f / %.2f of the copy)\n",
               n, gb / bs, gb / bl, sr, lr);
        list = *end == ',' ? end + 1 : end;
    }
    return 0;
}

static int cuda_rows(void)
{
    int count = 0;
    if (kvd_cuda_device_count(&count) != KVD_OK || count == 0) {
        printf("cuda     skipped: no CUDA device\n");
        return 0;
    }
    size_t layer_bytes = (size_t)2 * NB * BS * HEADS * DIM * 2;
    size_t io_bytes = (size_t)N_IO * LAYERS * 2 * BS * HEADS * DIM * 2;
    cuda_bench_t cb = {0};
    int rc = -1;
    if (kvd_cuda_mem_create(layer_bytes * LAYERS, &cb.cache) != KVD_OK ||
        kvd_cuda_mem_set(cb.cache, 0x3c, layer_bytes * LAYERS) != KVD_OK ||
        kvd_cuda_stream_create(&cb.stream) != KVD_OK ||
        kvd_cuda_host_alloc(io_bytes, &cb.pinned) != KVD_OK ||
        kvd_cuda_mem_create(io_bytes, &cb.dev) != KVD_OK) {
        fprintf(stderr, "cuda: device set-up failed\n");
        goto out;
    }
    memset(cb.pinned, 1, io_bytes);
    for (uint32_t l = 0; l < LAYERS; l++) {
        cb.bases[l] = (unsigned char *)cb.cache + l * layer_bytes;
    }
    int64_t e = 2;
    cb.layout = (kvd_kv_layout_t){cb.bases,
                                  NB,
                                  (int64_t)NB * BS * HEADS * DIM * e,
                                  (int64_t)BS * HEADS * DIM * e,
                                  (int64_t)HEADS * DIM * e,
                                  (int64_t)DIM * e};
    double h2d = 1e9, d2h = 1e9;
    for (int p = 0; p < PASSES; p++) {
        double a = 0, b = 0;
        cuda_peer(&cb, io_bytes, &a, &b);
        h2d = a < h2d ? a : h2d;
        d2h = b < d2h ? b : d2h;
    }
    double gb = (double)io_bytes / 1e9;
    printf("cuda     cudaMemcpyAsync %.2f GB/s H2D, %.2f GB/s D2H (pinned, "
           "one %zu-byte copy)\n",
           gb / h2d, gb / d2h, io_bytes);
    static const kvd_codec_t codecs[] = {KVD_CODEC_RAW, KVD_CODEC_FP8_E4M3,
                                         KVD_CODEC_TQ4};
    double raw_save = 0, raw_load = 0;
    for (size_t c = 0; c < sizeof codecs / sizeof *codecs; c++) {
        double sr = 0, lr = 0, bs = 0, bl = 0;
        if (cuda_codec(&cb, codecs[c], (cuda_opts_t){0}, io_bytes, &sr, &lr,
                       &bs, &bl) != 0) {
            goto out;
        }
        /* Effective: the bf16 cache bytes the step moved, whatever the
         * codec made of them. */
        printf("cuda     %-8s save %.2f GB/s, load %.2f GB/s effective "
               "(%.1f / %.1f ms per step; %.2f / %.2f of the copy)\n",
               kvd_codec_name(codecs[c]), gb / bs, gb / bl, bs * 1e3, bl * 1e3,
               sr, lr);
        if (codecs[c] == KVD_CODEC_RAW) {
            raw_save = sr;
            raw_load = lr;
        }
        /* The same steps with each copy mode forced: the default picks
         * per object or runs by the layer region's size. */
        static const uint8_t modes[] = {KVD_WORKER_COPY_RUNS,
                                        KVD_WORKER_COPY_PER_OBJECT};
        static const char *const names[] = {"2D copies of runs",
                                            "one copy per object"};
        for (size_t m = 0; m < 2; m++) {
            double mr = 0, ml = 0, mbs = 0, mbl = 0;
            if (cuda_codec(&cb, codecs[c], (cuda_opts_t){.mode = modes[m]},
                           io_bytes, &mr, &ml, &mbs, &mbl) != 0) {
                goto out;
            }
            printf("cuda     %-8s %s: save %.2f GB/s, load %.2f GB/s "
                   "(%.2f / %.2f of the copy; the default: %.2f / %.2f)\n",
                   kvd_codec_name(codecs[c]), names[m], gb / mbs, gb / mbl, mr,
                   ml, sr, lr);
        }
    }
    /* And with one staging buffer: each chunk's copies and kernel wait for
     * the previous chunk's, as before the buffers were used in turn. */
    double ob_save = 0, ob_load = 0, ob_bs = 0, ob_bl = 0;
    if (cuda_codec(&cb, KVD_CODEC_RAW, (cuda_opts_t){.buffers = 1}, io_bytes,
                   &ob_save, &ob_load, &ob_bs, &ob_bl) != 0) {
        goto out;
    }
    printf("cuda     raw      one staging buffer: save %.2f GB/s, load %.2f "
           "GB/s (%.2f / %.2f of the copy; the default: %.2f / %.2f)\n",
           gb / ob_bs, gb / ob_bl, ob_save, ob_load, raw_save, raw_load);
    if (cuda_staging_rows(&cb, io_bytes) != 0) {
        goto out;
    }
    printf("BENCH worker: cuda save (D2H) vs cudaMemcpyAsync = %.3g "
           "(target >= 0.85)\n",
           raw_save);
    printf("BENCH worker: cuda load (H2D) vs cudaMemcpyAsync = %.3g "
           "(target >= 0.85)\n",
           raw_load);
    rc = 0;
out:
    kvd_cuda_mem_destroy(cb.dev);
    kvd_cuda_host_free(cb.pinned);
    kvd_cuda_stream_destroy(cb.stream);
    kvd_cuda_mem_destroy(cb.cache);
    return rc;
}
#else
static int cuda_rows(void)
{
    printf("cuda     skipped: no CUDA device (built without CUDA)\n");
    return 0;
}
#endif

/* Medians of the per-pass ratios of the host backend's steps to memcpy
 * (on one thread, and _n: on the worker's threads). */
typedef struct host_ratios {
    double save, load, save_n, load_n;
} host_ratios_t;

/* The save and load passes against memcpy of the same io_bytes from a to
 * c; prints the best of each, fills out. -1 when a pass fails. */
static int host_passes(bench_t *b, unsigned char *a, unsigned char *c,
                       size_t io_bytes, uint32_t threads, host_ratios_t *out)
{
    /* Each pass times memcpy, a save step and a load step back to back;
     * the headlines are the medians of the per-pass ratios, so a noisy
     * moment of the machine weighs on both sides of one ratio. */
    double best_copy = 1e9, best_copy_n = 1e9, best_save = 1e9, best_load = 1e9;
    double save_ratio[PASSES], load_ratio[PASSES];
    double save_ratio_n[PASSES], load_ratio_n[PASSES];
    for (int p = 0; p < PASSES; p++) {
        double t0 = now_s();
        memcpy(c, a, io_bytes);
        double t = now_s() - t0;
        best_copy = t < best_copy ? t : best_copy;
        double tn = copy_threads(c, a, io_bytes, threads);
        if (tn < 0) {
            fprintf(stderr, "pass %d: no copy threads\n", p);
            return -1;
        }
        best_copy_n = tn < best_copy_n ? tn : best_copy_n;
        double s = save_pass(b, (uint32_t)p, NULL);
        double l = load_pass(b, (uint32_t)p, 0, NULL, NULL);
        if (s < 0 || l < 0) {
            fprintf(stderr, "pass %d failed\n", p);
            return -1;
        }
        best_save = s < best_save ? s : best_save;
        best_load = l < best_load ? l : best_load;
        save_ratio[p] = t / s;
        load_ratio[p] = t / l;
        save_ratio_n[p] = tn / s;
        load_ratio_n[p] = tn / l;
    }
    qsort(save_ratio, PASSES, sizeof *save_ratio, cmp_double);
    qsort(load_ratio, PASSES, sizeof *load_ratio, cmp_double);
    qsort(save_ratio_n, PASSES, sizeof *save_ratio_n, cmp_double);
    qsort(load_ratio_n, PASSES, sizeof *load_ratio_n, cmp_double);
    double gb = (double)io_bytes / 1e9;
    printf("worker host backend: %u layers, %u blocks of %zu bytes per step, "
           "%u threads\n",
           LAYERS, N_IO, io_bytes / N_IO, threads);
    printf("memcpy   %.2f GB/s (1 thread), %.2f GB/s (%u threads)\n",
           gb / best_copy, gb / best_copy_n, threads);
    printf("save     %.2f GB/s (%.1f ms per step)\n", gb / best_save,
           best_save * 1e3);
    printf("load     %.2f GB/s (%.1f ms per step)\n", gb / best_load,
           best_load * 1e3);
    out->save = save_ratio[PASSES / 2];
    out->load = load_ratio[PASSES / 2];
    out->save_n = save_ratio_n[PASSES / 2];
    out->load_n = load_ratio_n[PASSES / 2];
    return 0;
}

/* One overlap pass with `compute` as the stand-in: the time over
 * max(load, compute), or -1. */
static double overlap_one(bench_t *b, double ov_load, double compute_s,
                          void (*compute)(double), const char *name, int p)
{
    double t0 = now_s();
    for (uint32_t l = 0; l < LAYERS; l++) {
        compute(compute_s);
    }
    double alone = now_s() - t0;
    double t = load_pass(b, (uint32_t)(PASSES - 1), compute_s, compute, NULL);
    if (t < 0) {
        fprintf(stderr, "overlap pass %d (%s) failed\n", p, name);
        return -1;
    }
    double bound = ov_load > alone ? ov_load : alone;
    printf("overlap  pass %d, %s: %.1f ms for %.1f ms load and %.1f ms "
           "compute\n",
           p, name, t * 1e3, ov_load * 1e3, alone * 1e3);
    return t / bound;
}

/* Loads layer by layer against a simulated per-layer compute, on a new
 * worker (wc, lo: the first one's settings; th: KVDEPOT_BENCH_THREADS).
 * The medians of the passes' time over max(load, compute) in ratio_out:
 * [0] with a sleep, [1] with the busy loop; -1 on failure. */
static int overlap_passes(bench_t *b, kvd_worker_config_t *wc,
                          const kvd_kv_layout_t *lo, const char *th,
                          double ratio_out[2])
{
    char err[256] = "";
    /* The simulated compute alone, timed the same way (a sleep lasts a
     * little longer than asked; the bound must use what it really takes).
     * Timer slack 1 ns keeps that overshoot small, so compute stays close
     * to the load: the case where overlap matters most. */
    (void)prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    /* The engine's forward thread needs a core of its own (on a GPU
     * machine it has one): the overlap worker gets one thread fewer than
     * the machine has cores, and its load alone is measured again. */
    kvd_worker_stats_t ws;
    (void)kvd_worker_stats(b->w, &ws);
    printf("stats    %llu blocks saved, %llu loaded, %llu errors\n",
           (unsigned long long)ws.blocks_saved,
           (unsigned long long)ws.blocks_loaded,
           (unsigned long long)ws.load_errors);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    kvd_worker_destroy(b->w);
    wc->num_threads = ncpu > 2 ? (uint32_t)(ncpu - 1) : 1;
    if (th != NULL) {
        wc->num_threads = (uint32_t)atoi(th);
    }
    if (kvd_worker_create(wc, &b->w, err, sizeof err) != KVD_OK ||
        kvd_worker_register_kv_caches(b->w, lo, err, sizeof err) != KVD_OK) {
        fprintf(stderr, "overlap worker: %s\n", err);
        return -1;
    }
    double ov_load = 1e9;
    for (int p = 0; p < PASSES; p++) {
        double l = load_pass(b, (uint32_t)(PASSES - 1), 0, NULL, NULL);
        ov_load = l > 0 && l < ov_load ? l : ov_load;
    }
    printf("overlap  worker with %u threads, load alone %.1f ms\n",
           wc->num_threads, ov_load * 1e3);
    double compute = ov_load / LAYERS, ratios[2][PASSES];
    busy_buf = malloc(BUSY_BYTES);
    if (busy_buf == NULL) {
        return -1;
    }
    for (size_t i = 0; i < BUSY_BYTES / sizeof *busy_buf; i++) {
        busy_buf[i] = (float)(i % 97) * 0.01f;
    }
    for (int p = 0; p < PASSES; p++) {
        ratios[0][p] = overlap_one(b, ov_load, compute, sleep_s, "sleep", p);
        ratios[1][p] = overlap_one(b, ov_load, compute, busy_s, "busy", p);
        if (ratios[0][p] < 0 || ratios[1][p] < 0) {
            free(busy_buf);
            return -1;
        }
    }
    free(busy_buf);
    for (int k = 0; k < 2; k++) {
        qsort(ratios[k], PASSES, sizeof ratios[k][0], cmp_double);
        ratio_out[k] = ratios[k][PASSES / 2];
        printf("overlap  %s: median %.3f (%.3f-%.3f)\n",
               k == 0 ? "sleep" : "busy", ratio_out[k], ratios[k][0],
               ratios[k][PASSES - 1]);
    }
    return 0;
}

int main(void)
{
    size_t layer_bytes = (size_t)2 * NB * BS * HEADS * DIM * 2;
    size_t io_bytes = (size_t)N_IO * LAYERS * 2 * BS * HEADS * DIM * 2;
    unsigned char *cache = aligned_alloc(4096, layer_bytes * LAYERS);
    unsigned char *a = aligned_alloc(4096, io_bytes);
    unsigned char *c = aligned_alloc(4096, io_bytes);
    if (cache == NULL || a == NULL || c == NULL) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < layer_bytes * LAYERS; i++) {
        cache[i] = (unsigned char)(i * 131u >> 3);
    }
    memset(a, 1, io_bytes);
    memset(c, 2, io_bytes);

    bench_t b;
    if (bench_open(&b, 0x77) != 0) {
        return 1;
    }
    char err[256] = "";
    kvd_worker_config_t wc = {0};
    wc.store = b.store;
    wc.ns = b.ns;
    wc.format = (kvd_object_format_t){KVD_DTYPE_BF16,
                                      LAYERS,
                                      2,
                                      HEADS,
                                      DIM,
                                      BS,
                                      {KVD_CODEC_RAW, KVD_CODEC_RAW},
                                      0};
    const char *th = getenv("KVDEPOT_BENCH_THREADS");
    wc.num_threads = th != NULL ? (uint32_t)atoi(th) : 0;
    if (kvd_worker_create(&wc, &b.w, err, sizeof err) != KVD_OK) {
        fprintf(stderr, "worker: %s\n", err);
        return 1;
    }
    void *bases[LAYERS];
    for (uint32_t l = 0; l < LAYERS; l++) {
        bases[l] = cache + l * layer_bytes;
    }
    int64_t e = 2;
    kvd_kv_layout_t lo = {bases,
                          NB,
                          (int64_t)NB * BS * HEADS * DIM * e,
                          (int64_t)BS * HEADS * DIM * e,
                          (int64_t)HEADS * DIM * e,
                          (int64_t)DIM * e};
    if (kvd_worker_register_kv_caches(b.w, &lo, err, sizeof err) != KVD_OK) {
        fprintf(stderr, "register: %s\n", err);
        return 1;
    }

    uint32_t threads = wc.num_threads ? wc.num_threads : 2;
    host_ratios_t hr;
    double overlap[2] = {0, 0};
    if (host_passes(&b, a, c, io_bytes, threads, &hr) != 0 ||
        overlap_passes(&b, &wc, &lo, th, overlap) != 0) {
        return 1;
    }
    kvd_worker_destroy(b.w);
    kvd_store_close(b.store);
    free(cache);
    free(a);
    free(c);
    printf("BENCH worker: host save vs memcpy = %.3g (target >= 0.8)\n",
           hr.save);
    printf("BENCH worker: host load vs memcpy = %.3g (target >= 0.8)\n",
           hr.load);
    printf("BENCH worker: host save vs memcpy on %u threads = %.3g (target "
           ">= 0.8)\n",
           threads, hr.save_n);
    printf("BENCH worker: host load vs memcpy on %u threads = %.3g (target "
           ">= 0.8)\n",
           threads, hr.load_n);
    printf("BENCH worker: load+compute over max(load, compute), compute a "
           "sleep = %.3g (target <= 1.15)\n",
           overlap[0]);
    printf("BENCH worker: load+compute over max(load, compute), compute "
           "busy on CPU and memory = %.3g (target <= 1.15)\n",
           overlap[1]);
    return cuda_rows() == 0 ? 0 : 1;
}
