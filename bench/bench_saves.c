/*
 * Saves that never stall a step (kvd_worker_config_t.async_saves), host
 * backend: a 32-layer model shard (Llama-3-8B at TP 1: 8 KV heads,
 * head_dim 128, bf16, 16-token blocks, so one object is 2 MiB) in vLLM's
 * FlashAttention NHD layout, an embedded store with a 1 GiB arena.
 *
 * One engine step: bind the plan, start_load_kv, then per layer a
 * simulated compute (a sleep: a GPU kernel leaves the CPU free) and
 * save_kv_layer, then wait_for_save, get_finished and clear. A decode
 * step's compute is COMPUTE_MS over all layers. Each pass runs STEPS such
 * steps three ways, interleaved pass by pass:
 *
 *   none   the plans save nothing (the step time the engine has without a
 *          cache);
 *   sync   each step saves SAVES blocks (a prefill chunk finishing in the
 *          batch), on a worker whose saves end at wait_for_save;
 *   async  the same saves on a worker with async_saves: wait_for_save
 *          returns once the copies are queued.
 *
 * The store is made slow with the failpoint worker.commit=delay:MS (every
 * commit of a step's objects takes MS longer: a busy daemon, a remote
 * store), and the same passes run again with the store at full speed.
 * Every step's wall time from bind to clear counts; each pass's ratio is
 * the median step time of sync or async over that of none, and the
 * headlines are the medians of the per-pass ratios with their range.
 * Between the ways, untimed, the async worker's saves still in flight are
 * flushed, so one way's background work never lands in another's steps.
 * Saves beyond the async worker's bound (max_inflight_save_bytes,
 * INFLIGHT objects) would be shed: their count is printed, and a ratio
 * bought by shedding is reported as such.
 *
 * CUDA backend, when built with CUDA and a device is present (else one
 * "skipped" line): the same passes with the cache in device memory and
 * the worker's copies on its side stream; each step ends by synchronizing
 * the engine's stream, as an engine does when it reads the sampled
 * tokens. The compute is still a sleep of the host: the GPU has nothing
 * else to do, so the figure is the save path's own cost to a step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "bench/bench_proc_int.h"
#include "common/failpoint_int.h"
#include "kvdepot/worker.h"
#include "tests/support/kvd_testplan.h"
#ifdef KVD_HAVE_CUDA
#include "kvdepot/kernels_cuda.h"
#endif

#define LAYERS 32u
#define HEADS 8u
#define DIM 128u
#define BS 16u
#define NB 256u
#define SAVES 8u  /* blocks saved per step: 128 tokens of prefill */
#define STEPS 24u /* steps per way and pass */
#define PASSES 7
#define COMPUTE_MS 16.0 /* one decode step's compute */
#define SLOW_COMMIT "worker.commit=delay:10"
#define INFLIGHT 64u /* objects: the async worker's bound */

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* The shard's layout over `cache` (LAYERS layers of the NHD cache, one
 * after the other); `bases` gets the layers' addresses. */
static kvd_kv_layout_t shard_layout(unsigned char *cache, void **bases)
{
    size_t layer_bytes = (size_t)2 * NB * BS * HEADS * DIM * 2;
    for (uint32_t l = 0; l < LAYERS; l++) {
        bases[l] = cache + l * layer_bytes;
    }
    int64_t e = 2;
    return (kvd_kv_layout_t){bases,
                             NB,
                             (int64_t)NB * BS * HEADS * DIM * e,
                             (int64_t)BS * HEADS * DIM * e,
                             (int64_t)HEADS * DIM * e,
                             (int64_t)DIM * e};
}

typedef struct bench {
    kvd_store_t *store;
    kvd_namespace_t ns;
    kvd_worker_t *sync_w, *async_w;
    void *stream; /* the engine's (CUDA), or NULL */
    uint64_t step, key;
} bench_t;

/* One engine step on `w`, saving SAVES new blocks when `saves`; seconds
 * from bind to clear, or -1. */
static double step(bench_t *b, kvd_worker_t *w, bool saves)
{
    int32_t ids[SAVES];
    kvd_block_hash_t hashes[SAVES];
    for (uint32_t i = 0; i < SAVES; i++) {
        uint64_t k = ++b->key;
        /* The engine's blocks cycle through the cache: a block comes back
         * NB / SAVES steps later, after INFLIGHT / SAVES steps of saves
         * in flight at most. */
        ids[i] = (int32_t)(k % NB);
        memset(hashes[i].bytes, 0, sizeof hashes[i].bytes);
        memcpy(hashes[i].bytes, &k, sizeof k);
        hashes[i].bytes[31] = 0x5a;
    }
    kvd_testplan_req_t r = {.id = saves ? "prefill" : "decode",
                            .layerwise = true,
                            .n_saves = saves ? SAVES : 0,
                            .save_ids = ids,
                            .save_hashes = hashes};
    double t0 = now_s();
    size_t len = 0;
    uint8_t *plan = kvd_testplan_pack(++b->step, BS, &b->ns, &r, 1, &len);
    char err[256] = "";
    kvd_status_t s =
        plan == NULL ? KVD_ERR_PROTO
                     : kvd_worker_bind_metadata(w, plan, len, err, sizeof err);
    free(plan);
    if (s != KVD_OK) {
        fprintf(stderr, "bind: %s (%s)\n", kvd_status_str(s), err);
        return -1;
    }
    (void)kvd_worker_start_load_kv(w, b->stream);
    for (uint32_t l = 0; l < LAYERS; l++) {
        sleep_s(COMPUTE_MS * 1e-3 / LAYERS);
        (void)kvd_worker_save_kv_layer(w, l, b->stream);
    }
    (void)kvd_worker_wait_for_save(w, b->stream);
    kvd_worker_finished_t f;
    (void)kvd_worker_get_finished(w, NULL, 0, &f);
    (void)kvd_worker_clear_metadata(w);
#ifdef KVD_HAVE_CUDA
    if (b->stream != NULL) {
        (void)kvd_cuda_stream_wait(b->stream); /* the step's end */
    }
#endif
    return now_s() - t0;
}

/* STEPS steps of one way; their median step time, or -1. */
static double way(bench_t *b, kvd_worker_t *w, bool saves)
{
    double t[STEPS];
    for (uint32_t i = 0; i < STEPS; i++) {
        t[i] = step(b, w, saves);
        if (t[i] < 0) {
            return -1;
        }
    }
    (void)kvd_worker_flush_saves(w); /* untimed */
    return median(t, STEPS);
}

static kvd_worker_t *worker(bench_t *b, const kvd_kv_layout_t *lo,
                            bool async_saves, kvd_worker_device_t device)
{
    kvd_worker_config_t wc = {0};
    wc.store = b->store;
    wc.ns = b->ns;
    wc.format = (kvd_object_format_t){KVD_DTYPE_BF16,
                                      LAYERS,
                                      2,
                                      HEADS,
                                      DIM,
                                      BS,
                                      {KVD_CODEC_RAW, KVD_CODEC_RAW},
                                      0};
    wc.layerwise_saves = true;
    wc.async_saves = async_saves;
    wc.device = device;
    wc.max_inflight_save_bytes =
        (uint64_t)INFLIGHT * kvd_object_stored_bytes(&wc.format);
    kvd_worker_t *w = NULL;
    char err[256] = "";
    if (kvd_worker_create(&wc, &w, err, sizeof err) != KVD_OK ||
        kvd_worker_register_kv_caches(w, lo, err, sizeof err) != KVD_OK) {
        fprintf(stderr, "worker: %s\n", err);
        kvd_worker_destroy(w);
        return NULL;
    }
    return w;
}

/* PASSES interleaved passes of the three ways under `failpoints` ("" for
 * none): the medians of the per-pass ratios (sync, async over none) with
 * their ranges in r[0..5]: median, min, max each. */
static int passes(bench_t *b, const char *label, const char *failpoints,
                  double r[6])
{
    double rs[PASSES], ra[PASSES];
    kvd_worker_stats_t before, after;
    (void)kvd_worker_stats(b->async_w, &before);
    if (kvd_failpoint_set(failpoints, NULL, 0) != KVD_OK) {
        return -1;
    }
    for (int p = 0; p < PASSES; p++) {
        double none = way(b, b->sync_w, false);
        double sync = way(b, b->sync_w, true);
        double async = way(b, b->async_w, true);
        if (none <= 0 || sync <= 0 || async <= 0) {
            return -1;
        }
        rs[p] = sync / none;
        ra[p] = async / none;
        printf("%-5s pass %d: step %.2f ms without saves, %.2f sync, %.2f "
               "async\n",
               label, p, none * 1e3, sync * 1e3, async * 1e3);
    }
    kvd_failpoint_clear();
    (void)kvd_worker_stats(b->async_w, &after);
    printf("%-5s async worker: %llu saved, %llu shed, %llu dropped\n", label,
           (unsigned long long)(after.blocks_saved - before.blocks_saved),
           (unsigned long long)(after.saves_shed - before.saves_shed),
           (unsigned long long)(after.saves_dropped - before.saves_dropped));
    spread(rs, PASSES, r);
    spread(ra, PASSES, r + 3);
    return after.saves_shed == before.saves_shed ? 0 : 1;
}

/* The same passes on the CUDA backend; 0 also when skipped (then
 * cuda_out[0] stays negative), else the async ratios slow and fast in
 * cuda_out[0..1]. */
#ifdef KVD_HAVE_CUDA
static int cuda_rows(bench_t *b, double cuda_out[2])
{
    int count = 0;
    if (kvd_cuda_device_count(&count) != KVD_OK || count == 0) {
        printf("cuda     skipped: no CUDA device\n");
        return 0;
    }
    size_t layer_bytes = (size_t)2 * NB * BS * HEADS * DIM * 2;
    void *cache = NULL;
    int rc = 1;
    if (kvd_cuda_mem_create(layer_bytes * LAYERS, &cache) != KVD_OK ||
        kvd_cuda_mem_set(cache, 0x3c, layer_bytes * LAYERS) != KVD_OK ||
        kvd_cuda_stream_create(&b->stream) != KVD_OK) {
        fprintf(stderr, "cuda: device set-up failed\n");
        goto out;
    }
    void *bases[LAYERS];
    kvd_kv_layout_t lo = shard_layout(cache, bases);
    b->sync_w = worker(b, &lo, false, KVD_WORKER_DEVICE_CUDA);
    b->async_w = worker(b, &lo, true, KVD_WORKER_DEVICE_CUDA);
    if (b->sync_w == NULL || b->async_w == NULL) {
        goto out;
    }
    double slow[6], fast[6];
    int shed_slow = passes(b, "cuda slow", SLOW_COMMIT, slow);
    int shed_fast = passes(b, "cuda fast", "", fast);
    if (shed_slow < 0 || shed_fast < 0) {
        goto out;
    }
    printf("cuda slow store: sync %.3f (%.3f-%.3f), async %.3f (%.3f-%.3f)%s\n",
           slow[0], slow[1], slow[2], slow[3], slow[4], slow[5],
           shed_slow ? "; some async saves were shed" : "");
    printf("cuda fast store: sync %.3f (%.3f-%.3f), async %.3f (%.3f-%.3f)%s\n",
           fast[0], fast[1], fast[2], fast[3], fast[4], fast[5],
           shed_fast ? "; some async saves were shed" : "");
    cuda_out[0] = slow[3];
    cuda_out[1] = fast[3];
    rc = 0;
out:
    kvd_worker_destroy(b->sync_w);
    kvd_worker_destroy(b->async_w);
    b->sync_w = b->async_w = NULL;
    kvd_cuda_stream_destroy(b->stream);
    b->stream = NULL;
    kvd_cuda_mem_destroy(cache);
    return rc;
}
#else
static int cuda_rows(bench_t *b, double cuda_out[2])
{
    (void)b;
    (void)cuda_out;
    printf("cuda     skipped: no CUDA device (built without CUDA)\n");
    return 0;
}
#endif

int main(void)
{
#ifndef KVD_FAILPOINTS_ENABLED
    fprintf(stderr, "bench_saves: failpoints compiled out (the slow store "
                    "is the failpoint worker.commit): configure with "
                    "-DKVD_FAILPOINTS=ON\n");
    return 1;
#endif
    (void)prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    size_t layer_bytes = (size_t)2 * NB * BS * HEADS * DIM * 2;
    unsigned char *cache = aligned_alloc(4096, layer_bytes * LAYERS);
    if (cache == NULL) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < layer_bytes * LAYERS; i++) {
        cache[i] = (unsigned char)(i * 131u >> 3);
    }
    bench_t b;
    memset(&b, 0, sizeof b);
    memset(b.ns.bytes, 0x5a, sizeof b.ns.bytes);
    kvd_config_t *cfg = NULL;
    char err[256] = "";
    kvd_status_t s = kvd_config_create(&cfg);
    if (s == KVD_OK) {
        if (kvd_config_set(cfg, "store.arena_size", "1g") != KVD_OK ||
            kvd_config_set(cfg, "store.arena_chunk", "64m") != KVD_OK ||
            kvd_config_set(cfg, "store.arena_prefault", "true") != KVD_OK) {
            s = KVD_ERR_INVALID;
        } else {
            s = kvd_store_open(cfg, &b.store, err, sizeof err);
        }
        kvd_config_destroy(cfg);
    }
    if (s != KVD_OK) {
        fprintf(stderr, "store: %s %s\n", kvd_status_str(s), err);
        return 1;
    }
    void *bases[LAYERS];
    kvd_kv_layout_t lo = shard_layout(cache, bases);
    b.sync_w = worker(&b, &lo, false, KVD_WORKER_DEVICE_HOST);
    b.async_w = worker(&b, &lo, true, KVD_WORKER_DEVICE_HOST);
    if (b.sync_w == NULL || b.async_w == NULL) {
        return 1;
    }
    printf("shard    %u layers, %u x %u MiB saved per step, decode compute "
           "%.0f ms per step (a sleep), %u steps per way, %d passes\n",
           LAYERS, SAVES, (unsigned)(2 * LAYERS * BS * HEADS * DIM * 2 >> 20),
           COMPUTE_MS, STEPS, PASSES);
    double slow[6], fast[6];
    int shed_slow = passes(&b, "slow", SLOW_COMMIT, slow);
    int shed_fast = passes(&b, "fast", "", fast);
    kvd_worker_destroy(b.sync_w);
    kvd_worker_destroy(b.async_w);
    free(cache);
    if (shed_slow < 0 || shed_fast < 0) {
        kvd_store_close(b.store);
        return 1;
    }
    printf("slow store (%s): sync %.3f (%.3f-%.3f), async %.3f "
           "(%.3f-%.3f)%s\n",
           SLOW_COMMIT, slow[0], slow[1], slow[2], slow[3], slow[4], slow[5],
           shed_slow ? "; some async saves were shed" : "");
    printf("fast store: sync %.3f (%.3f-%.3f), async %.3f (%.3f-%.3f)%s\n",
           fast[0], fast[1], fast[2], fast[3], fast[4], fast[5],
           shed_fast ? "; some async saves were shed" : "");
    double cuda[2] = {-1, -1};
    int rc = cuda_rows(&b, cuda);
    kvd_store_close(b.store);
    printf("BENCH saves: decode step with saves in flight over a slow store "
           "vs without saves, sync saves = %.3g (for contrast)\n",
           slow[0]);
    printf("BENCH saves: decode step with saves in flight over a slow store "
           "vs without saves, async saves = %.3g (target <= 1.05)\n",
           slow[3]);
    printf("BENCH saves: the same at full store speed, async saves = %.3g "
           "(target <= 1.05)\n",
           fast[3]);
    if (cuda[0] >= 0) {
        printf("BENCH saves: cuda decode step with saves in flight over a "
               "slow store vs without saves, async saves = %.3g (target <= "
               "1.05)\n",
               cuda[0]);
        printf("BENCH saves: cuda, the same at full store speed, async saves "
               "= %.3g (target <= 1.05)\n",
               cuda[1]);
    }
    return rc;
}
