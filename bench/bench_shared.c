/*
 * Objects shared by tensor-parallel ranks (worker.h object_heads), host
 * backend: what writing one object per block together costs against each
 * rank writing its own shard, the layout it replaces.
 *
 * A Llama-3-8B model at TP 2 (32 layers, 8 KV heads, 4 per rank, head_dim
 * 128, bf16, 16-token blocks: a whole object is 2 MiB, a rank's shard
 * 1 MiB) in vLLM's FlashAttention NHD layout, each rank's cache a view of
 * its heads of one cache, an embedded store with a 2 GiB arena. Two ranks
 * (two workers, one copy thread each, each step driven by a thread of its
 * own as engine ranks run at once) per side:
 *
 *   shared  each rank saves its heads of BLOCKS blocks into the blocks'
 *           objects (BLOCKS objects of 2 MiB, published with the second
 *           rank's commit), then loads them back into other blocks;
 *   own     each rank saves its shard in a namespace of its own (2 x
 *           BLOCKS objects of 1 MiB), then loads it back.
 *
 * The same bytes are encoded, copied and committed on both sides; the
 * shared side also copies each rank's encoded heads from a buffer of its
 * own into the object (the host backend encodes in the rank's format
 * first), and its reservations go through the store's table of objects in
 * parts. A step's time runs from both ranks' bind to both ranks' end of
 * step; every pass uses new keys. PASSES passes, interleaved side by side;
 * the headlines are the medians of per-pass ratios (own's time over
 * shared's: above 1, shared is faster) with their range, for raw and for
 * int8 (a codec whose encode dominates).
 *
 * MLA: DeepSeek-V3's latent cache (61 layers, one plane 576 wide, bf16,
 * the same on every rank) at TP 4: four ranks save the same BLOCKS blocks
 * at once in the one namespace MLA engines use (no TP size or rank in
 * it); the store's growth in objects and bytes, over what one copy of
 * those blocks takes (1: one copy, not four).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_proc_int.h"
#include "kvdepot/worker.h"
#include "tests/support/kvd_testplan.h"

#define LAYERS 32u
#define HEADS 8u /* the model's; each of the 2 ranks holds HEADS / 2 */
#define DIM 128u
#define BS 16u
#define NB 128u
#define BLOCKS 32u
#define PASSES 7
#define MLA_RANKS 4
#define MLA_LAYERS 61u
#define MLA_DIM 576u

typedef struct rank {
    kvd_worker_t *w;
    kvd_namespace_t ns;
    void *bases[MLA_LAYERS]; /* LAYERS of them but for MLA */
    int32_t save_ids[BLOCKS], load_ids[BLOCKS];
    kvd_block_hash_t hashes[BLOCKS];
    bool load;
    uint64_t step;
    int rc;
} rank_t;

/* One step of rank `rk`: saving its BLOCKS blocks, or loading them into
 * load_ids. */
static void *rank_step(void *arg)
{
    rank_t *rk = arg;
    kvd_testplan_req_t r = {.id = "bench", .layerwise = false};
    if (rk->load) {
        r.n_loads = BLOCKS, r.load_ids = rk->load_ids;
        r.load_hashes = rk->hashes;
    } else {
        r.n_saves = BLOCKS, r.save_ids = rk->save_ids;
        r.save_hashes = rk->hashes;
    }
    size_t len = 0;
    uint8_t *plan = kvd_testplan_pack(++rk->step, BS, &rk->ns, &r, 1, &len);
    char err[256] = "";
    kvd_status_t s = plan == NULL ? KVD_ERR_PROTO
                                  : kvd_worker_bind_metadata(rk->w, plan, len,
                                                             err, sizeof err);
    free(plan);
    if (s == KVD_OK) {
        s = kvd_worker_start_load_kv(rk->w, NULL);
    }
    if (s == KVD_OK) {
        s = kvd_worker_wait_for_save(rk->w, NULL);
    }
    kvd_worker_finished_t f;
    (void)kvd_worker_get_finished(rk->w, NULL, 0, &f);
    (void)kvd_worker_clear_metadata(rk->w);
    rk->rc = s == KVD_OK ? 0 : -1;
    if (s != KVD_OK) {
        fprintf(stderr, "step: %s (%s)\n", kvd_status_str(s), err);
    }
    return NULL;
}

/* The n ranks' step at once; its seconds, or -1. */
static double all_ranks(rank_t *rk, int n, bool load)
{
    pthread_t t[MLA_RANKS];
    double t0 = now_s();
    for (int r = 0; r < n; r++) {
        rk[r].load = load;
        pthread_create(&t[r], NULL, rank_step, &rk[r]);
    }
    for (int r = 0; r < n; r++) {
        pthread_join(t[r], NULL);
    }
    double dt = now_s() - t0;
    int bad = 0;
    for (int r = 0; r < n; r++) {
        bad += rk[r].rc != 0;
    }
    return bad == 0 ? dt : -1;
}

static double both(rank_t *rk, bool load)
{
    return all_ranks(rk, 2, load);
}

/* The two ranks of one side over `cache`: shared objects, or a namespace
 * per rank. */
static int side_open(rank_t *rk, kvd_store_t *st, unsigned char *cache,
                     kvd_codec_t codec, bool shared)
{
    size_t layer_bytes = (size_t)2 * NB * BS * HEADS * DIM * 2;
    int64_t e = 2;
    for (int r = 0; r < 2; r++) {
        memset(&rk[r], 0, sizeof rk[r]);
        for (uint32_t l = 0; l < LAYERS; l++) {
            rk[r].bases[l] =
                cache + l * layer_bytes + (size_t)r * (HEADS / 2) * DIM * 2;
        }
        kvd_kv_layout_t lo = {rk[r].bases,
                              NB,
                              (int64_t)NB * BS * HEADS * DIM * e,
                              (int64_t)BS * HEADS * DIM * e,
                              (int64_t)HEADS * DIM * e,
                              (int64_t)DIM * e};
        memset(rk[r].ns.bytes, shared ? 0x51 : 0x60 + r, sizeof rk[r].ns);
        kvd_worker_config_t wc = {0};
        wc.store = st;
        wc.ns = rk[r].ns;
        wc.format = (kvd_object_format_t){
            KVD_DTYPE_BF16, LAYERS, 2, HEADS / 2, DIM, BS, {codec, codec}, 0};
        wc.num_threads = 1;
        wc.worker_rank = (uint32_t)r;
        if (shared) {
            wc.object_heads = HEADS;
            wc.head_start = (uint32_t)r * (HEADS / 2);
        }
        char err[256] = "";
        if (kvd_worker_create(&wc, &rk[r].w, err, sizeof err) != KVD_OK ||
            kvd_worker_register_kv_caches(rk[r].w, &lo, err, sizeof err) !=
                KVD_OK) {
            fprintf(stderr, "worker: %s\n", err);
            return -1;
        }
        for (uint32_t i = 0; i < BLOCKS; i++) {
            rk[r].save_ids[i] = (int32_t)i;
            rk[r].load_ids[i] = (int32_t)(BLOCKS + i);
        }
    }
    return 0;
}

/* New keys for pass `pass` of a side (the same for both ranks). */
static void keys(rank_t *rk, uint32_t pass, uint8_t side)
{
    for (uint32_t i = 0; i < BLOCKS; i++) {
        kvd_block_hash_t h;
        memset(h.bytes, side, sizeof h.bytes);
        memcpy(h.bytes, &pass, sizeof pass);
        memcpy(h.bytes + 4, &i, sizeof i);
        rk[0].hashes[i] = rk[1].hashes[i] = h;
    }
}

/* PASSES interleaved passes of one codec; the per-pass ratios (own over
 * shared) of saves and loads into `save`, `load`. */
static int codec_passes(kvd_store_t *st, unsigned char *cache,
                        kvd_codec_t codec, double save[3], double load[3])
{
    rank_t sh[2], own[2];
    if (side_open(sh, st, cache, codec, true) != 0 ||
        side_open(own, st, cache, codec, false) != 0) {
        return -1;
    }
    double rs[PASSES], rl[PASSES];
    int rc = 0;
    for (uint32_t p = 0; p < PASSES && rc == 0; p++) {
        keys(sh, p + 100 * (uint32_t)codec, 0xa1);
        keys(own, p + 100 * (uint32_t)codec, 0xb2);
        double s_sh = both(sh, false), s_own = both(own, false);
        double l_sh = both(sh, true), l_own = both(own, true);
        if (s_sh < 0 || s_own < 0 || l_sh < 0 || l_own < 0) {
            rc = -1;
            break;
        }
        rs[p] = s_own / s_sh;
        rl[p] = l_own / l_sh;
        printf("  %s pass %u: save shared %.1f ms, own %.1f ms; load shared "
               "%.1f ms, own %.1f ms\n",
               kvd_codec_name(codec), p, s_sh * 1e3, s_own * 1e3, l_sh * 1e3,
               l_own * 1e3);
    }
    for (int r = 0; r < 2; r++) {
        kvd_worker_destroy(sh[r].w);
        kvd_worker_destroy(own[r].w);
    }
    if (rc == 0) {
        spread(rs, PASSES, save);
        spread(rl, PASSES, load);
    }
    return rc;
}

/* MLA at TP 4 (see the top): the objects and bytes the four ranks' saves
 * added to the store, each over one copy's; 0 or -1. */
static int mla_tp4(kvd_store_t *st, double *objects, double *bytes)
{
    size_t layer_bytes = (size_t)NB * BS * MLA_DIM * 2;
    unsigned char *cache = malloc(layer_bytes * MLA_LAYERS);
    static rank_t rk[MLA_RANKS];
    kvd_object_format_t fmt = {KVD_DTYPE_BF16,
                               MLA_LAYERS,
                               1,
                               1,
                               MLA_DIM,
                               BS,
                               {KVD_CODEC_RAW, KVD_CODEC_RAW},
                               0};
    int rc = cache == NULL ? -1 : 0;
    for (size_t i = 0; rc == 0 && i < layer_bytes * MLA_LAYERS; i++) {
        cache[i] = (unsigned char)(i * 131u + (i >> 11));
    }
    int made = 0;
    for (; rc == 0 && made < MLA_RANKS; made++) {
        rank_t *r = &rk[made];
        memset(r, 0, sizeof *r);
        for (uint32_t l = 0; l < MLA_LAYERS; l++) {
            r->bases[l] = cache + l * layer_bytes;
        }
        kvd_kv_layout_t lo = {
            r->bases, NB, 0, (int64_t)BS * MLA_DIM * 2, (int64_t)MLA_DIM * 2,
            0};
        memset(r->ns.bytes, 0x4d, sizeof r->ns);
        kvd_worker_config_t wc = {.store = st,
                                  .ns = r->ns,
                                  .format = fmt,
                                  .num_threads = 1,
                                  .worker_rank = (uint32_t)made};
        char err[256] = "";
        if (kvd_worker_create(&wc, &r->w, err, sizeof err) != KVD_OK ||
            kvd_worker_register_kv_caches(r->w, &lo, err, sizeof err) !=
                KVD_OK) {
            fprintf(stderr, "mla worker: %s\n", err);
            rc = -1;
        }
        for (uint32_t i = 0; i < BLOCKS; i++) {
            r->save_ids[i] = (int32_t)i;
            memset(r->hashes[i].bytes, 0x4d, sizeof r->hashes[i].bytes);
            memcpy(r->hashes[i].bytes, &i, sizeof i);
        }
    }
    kvd_store_stats_t a = {0}, b = {0};
    if (rc == 0 && (kvd_store_stats(st, &a) != KVD_OK ||
                    all_ranks(rk, MLA_RANKS, false) < 0 ||
                    kvd_store_stats(st, &b) != KVD_OK)) {
        rc = -1;
    }
    for (int r = 0; r < made; r++) {
        kvd_worker_destroy(rk[r].w);
    }
    free(cache);
    double one = (double)BLOCKS * (double)kvd_object_stored_bytes(&fmt);
    *objects = (double)(b.host.objects - a.host.objects) / BLOCKS;
    *bytes = (double)(b.host.bytes - a.host.bytes) / one;
    if (rc == 0) {
        printf("MLA at TP %d: %u blocks saved by every rank: %llu objects, "
               "%llu bytes stored (one copy: %.0f bytes)\n",
               MLA_RANKS, BLOCKS,
               (unsigned long long)(b.host.objects - a.host.objects),
               (unsigned long long)(b.host.bytes - a.host.bytes), one);
    }
    return rc;
}

int main(void)
{
    kvd_config_t *cfg = NULL;
    kvd_store_t *st = NULL;
    char err[256] = "";
    static const char *const kv[] = {
        "store.arena_size",      "2g",  "store.arena_chunk",    "64m",
        "store.arena_hugepages", "off", "store.arena_prefault", "true"};
    if (kvd_config_create(&cfg) != KVD_OK) {
        return 1;
    }
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i += 2) {
        (void)kvd_config_set(cfg, kv[i], kv[i + 1]);
    }
    kvd_status_t s = kvd_store_open(cfg, &st, err, sizeof err);
    kvd_config_destroy(cfg);
    if (s != KVD_OK) {
        fprintf(stderr, "store: %s (%s)\n", kvd_status_str(s), err);
        return 1;
    }
    size_t bytes = (size_t)LAYERS * 2 * NB * BS * HEADS * DIM * 2;
    unsigned char *cache = malloc(bytes);
    if (cache == NULL) {
        return 1;
    }
    uint64_t seed = 42;
    for (size_t i = 0; i < bytes; i += 2) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint16_t v = (uint16_t)(0x3c00 ^ ((seed >> 40) & 0x83ff)); /* bf16 */
        memcpy(cache + i, &v, 2);
    }
    printf("bench shared: TP 2, %u blocks a step, %u layers, %u KV heads "
           "(%u a rank), one copy thread a rank, %d passes\n",
           BLOCKS, LAYERS, HEADS, HEADS / 2, PASSES);
    double r[2][2][3];
    static const kvd_codec_t codecs[2] = {KVD_CODEC_RAW, KVD_CODEC_INT8};
    int rc = 0;
    for (int c = 0; c < 2 && rc == 0; c++) {
        rc = codec_passes(st, cache, codecs[c], r[c][0], r[c][1]);
    }
    free(cache);
    double mla_objects = 0, mla_bytes = 0;
    if (rc == 0) {
        rc = mla_tp4(st, &mla_objects, &mla_bytes);
    }
    kvd_store_close(st);
    if (rc != 0) {
        return 1;
    }
    for (int c = 0; c < 2; c++) {
        const char *n = kvd_codec_name(codecs[c]);
        printf("BENCH shared: %s save, a shard per rank over shared objects "
               "= %.3g (%.3g-%.3g) (target >= 0.9)\n",
               n, r[c][0][0], r[c][0][1], r[c][0][2]);
        printf("BENCH shared: %s load, a shard per rank over shared objects "
               "= %.3g (%.3g-%.3g) (target >= 0.9)\n",
               n, r[c][1][0], r[c][1][1], r[c][1][2]);
    }
    printf("BENCH shared: mla_tp%d_objects_stored_per_block = %.3g (target "
           "<= 1: one copy, not %d)\n",
           MLA_RANKS, mla_objects, MLA_RANKS);
    printf("BENCH shared: mla_tp%d_bytes_stored_over_one_copy = %.3g (target "
           "<= 1)\n",
           MLA_RANKS, mla_bytes);
    return 0;
}
