/*
 * kvdepot never hands out bytes it cannot prove are the object asked for:
 * a randomized check. One kvdepotd runs in this process
 * (tests/unit/kvd_testclient_int.h) with 300 ms lease and reservation TTLs,
 * a 4 MiB arena over an 8 MiB NVMe tier (write-through), so objects are
 * evicted from both tiers all the time. Three engines, each a daemon-mode
 * store, a worker (host backend, layerwise_saves) and its own paged KV
 * cache in host memory, and two slow clients of the store run on their own
 * threads, each driven by a PRNG seeded from KVDEPOT_TEST_SEED (printed; a
 * fixed default) and its index. Each round an engine runs a step that
 * saves and/or loads blocks: saves end whole (wait_for_save) or stop short
 * (abort_step, clear_metadata, a layer not saved, the next plan bound over
 * it) with the layers not computed holding stale bytes; loads are
 * synchronous, layerwise or asynchronous (sometimes canceled by finishing
 * the request at once); some steps stall past the TTLs between binding and
 * a layer. A slow client alternates
 *   - a slow reader: a lookup, the leased bytes checked, a stall (past the
 *     lease TTL one time in 3), the same bytes checked again through the
 *     old pointer (an expired slot must still hold its object), a release;
 *   - a slow writer: a reservation, a stall, the object written through
 *     the old pointer (after a stall past the TTL: another key's payload
 *     under this key's header), a commit that must not publish an expired
 *     reservation.
 * Meanwhile the main thread restarts the daemon every 1 to 3 s (the
 * clients reconnect and map the new arena; the NVMe tier survives). The
 * seed fixes what each thread does, not how the threads interleave.
 *
 * Block content is a pure function of (namespace, block hash, layer,
 * plane), so every load checks every byte: a block the worker reports
 * loaded must hold exactly its pattern in every layer (0 wrong bytes); a
 * block it cannot prove must be reported in failed_loads (a load error the
 * engine recomputes); a request never reported is an error. The engines'
 * own counts must equal their workers' blocks_loaded and load_errors. Ends
 * with a summary; KVDEPOT_TEST_SECONDS sets the duration (12 s, 8 s in
 * sanitizer builds).
 */
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvdepot/kernels.h"
#include "kvdepot/worker.h"
#include "tests/support/kvd_testplan.h"
#include "tests/unit/kvd_testcache_int.h"
#include "tests/unit/kvd_testclient_int.h"

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define TEST_SANITIZED 1
#endif
#endif
#ifdef TEST_SANITIZED
#define DEFAULT_SECONDS 8
#else
#define DEFAULT_SECONDS 12
#endif
#define DEFAULT_SEED 20261128ull

#define ENGINES 3 /* engines: a worker each */
#define SLOW 2    /* slow clients of the store, one per namespace */
#define THREADS (ENGINES + SLOW)
#define LAYERS 3
#define HEADS 2
#define DIM 32
#define BS 16
#define MAXB 6      /* blocks a request saves or loads */
#define LOAD_BASE 8 /* cache blocks 0..7 save, 8..15 load */
#define SCRATCH 16  /* the block an expected object is gathered from */
#define NBLOCKS 17
#define KEYS 768     /* block hashes per namespace */
#define RECENT 64    /* hashes an engine saved lately */
#define TTL_MS 300   /* lease and reservation TTLs */
#define STALL_MS 450 /* a stall past them */
#define POISON 0xA5
#define STALE 0x80000000u /* key bit: bytes of a layer not computed */
#define COLLECT_MS 30000  /* a request not reported by then is an error */

enum step_end { END_COMMIT, END_ABORT, END_CLEAR, END_SKIP, END_REBIND };

typedef struct step_spec {
    size_t n_load, n_save;
    uint32_t load_keys[MAXB], save_keys[MAXB];
    bool async, layerwise, cancel;
    enum step_end end;
    uint32_t cut;    /* END_ABORT/CLEAR/REBIND: layers saved; SKIP: skipped */
    int stall_layer; /* -1: none */
    uint32_t stall_ms;
} step_spec_t;

typedef struct engine_counts {
    uint64_t rounds, steps, stalls, bind_errors, call_errors;
    uint64_t saves_whole, saves_short; /* steps with saves, by their end */
    uint64_t loads_ok, load_misses, cancels, canceled_blocks;
    uint64_t wrong_bytes, unreported, stray_reports;
    uint64_t slow_reads, slow_read_blocks, slow_writes, slow_commits;
    uint64_t expired_releases, expired_commits, late_commits;
} engine_counts_t;

typedef struct engine {
    int idx;
    uint32_t nsid;
    kvd_namespace_t ns;
    uint64_t rng;
    kvd_store_t *st;
    kvd_worker_t *w;
    test_cache_t cache;
    kvd_object_format_t fmt;
    size_t obj_bytes, stored_bytes, region_bytes;
    uint8_t *expect; /* stored_bytes: the object of one hash */
    uint8_t *pat;    /* region_bytes: one (layer, plane) of one block */
    uint64_t step;
    bool bound; /* a plan left bound (END_REBIND) */
    engine_counts_t c;
    char first_error[256];
    pthread_t thread;
} engine_t;

static atomic_bool g_stop;
/* Keys committed lately, per namespace (1, 2), by any thread. */
static _Atomic uint32_t g_recent[3][RECENT];
static atomic_uint g_n_recent[3];

/* ---- randomness and content --------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t rnd(engine_t *e)
{
    e->rng = mix64(e->rng);
    return e->rng;
}

static uint32_t rnd_below(engine_t *e, uint32_t n)
{
    return (uint32_t)(rnd(e) % n);
}

static kvd_block_hash_t key_hash(uint32_t key)
{
    kvd_block_hash_t h;
    memset(h.bytes, 0x33, sizeof h.bytes);
    memcpy(h.bytes, &key, sizeof key);
    return h;
}

/* The bytes of (layer, plane) of block `key` in namespace `nsid`. */
static void pattern(uint8_t *dst, size_t len, uint32_t nsid, uint32_t key,
                    uint32_t layer, uint32_t plane)
{
    uint64_t s = mix64(((uint64_t)nsid << 48) ^ ((uint64_t)key << 8) ^
                       ((uint64_t)layer << 1) ^ plane);
    for (size_t b = 0; b < len; b += 8) {
        uint64_t v = mix64(s + b);
        memcpy(dst + b, &v, len - b < 8 ? len - b : 8);
    }
}

static uint8_t *region(engine_t *e, uint32_t blk, uint32_t l, uint32_t p)
{
    return e->cache.mem + flat_index(&e->cache, l, p, blk, 0, 0, 0) * 2;
}

/* Writes block `key`'s content into cache block `blk`; the layers in
 * `stale` (a bit mask) hold another key's bytes, as the layers a forward
 * pass did not compute do. */
static void block_fill(engine_t *e, uint32_t blk, uint32_t key, uint32_t stale)
{
    for (uint32_t l = 0; l < LAYERS; l++) {
        uint32_t k = (stale >> l) & 1u ? key ^ STALE : key;
        for (uint32_t p = 0; p < 2; p++) {
            pattern(region(e, blk, l, p), e->region_bytes, e->nsid, k, l, p);
        }
    }
}

/* Bytes of cache block `blk` that differ from block `key`'s content. */
static uint64_t block_wrong(engine_t *e, uint32_t blk, uint32_t key)
{
    uint64_t wrong = 0;
    for (uint32_t l = 0; l < LAYERS; l++) {
        for (uint32_t p = 0; p < 2; p++) {
            const uint8_t *got = region(e, blk, l, p);
            pattern(e->pat, e->region_bytes, e->nsid, key, l, p);
            if (memcmp(got, e->pat, e->region_bytes) == 0) {
                continue;
            }
            for (size_t b = 0; b < e->region_bytes; b++) {
                wrong += got[b] != e->pat[b];
            }
        }
    }
    return wrong;
}

/* e->expect becomes the stored object of `key` (payload and header), as
 * a worker saving it writes it. */
static bool object_build(engine_t *e, uint32_t key)
{
    int32_t blk = SCRATCH;
    void *obj = e->expect;
    block_fill(e, SCRATCH, key, 0);
    for (uint32_t l = 0; l < LAYERS; l++) {
        if (kvd_ref_gather_layer(&e->cache.layout, &e->fmt, NULL, l, &blk, 1,
                                 BS, &obj) != KVD_OK) {
            return false;
        }
    }
    kvd_block_hash_t h = key_hash(key);
    return kvd_object_header_pack(&e->fmt, &e->ns, &h,
                                  e->expect + e->obj_bytes) == KVD_OK;
}

/* Bytes of a stored object at `p` that differ from e->expect. */
static uint64_t object_wrong(engine_t *e, const uint8_t *p, uint64_t size)
{
    if (size != e->stored_bytes) {
        return size > e->stored_bytes ? size : e->stored_bytes;
    }
    uint64_t wrong = 0;
    for (size_t b = 0; b < e->stored_bytes; b++) {
        wrong += p[b] != e->expect[b];
    }
    return wrong;
}

static void note(engine_t *e, const char *fmt, ...)
{
    if (e->first_error[0] != '\0') {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    int n =
        snprintf(e->first_error, sizeof e->first_error,
                 "engine %d step %llu: ", e->idx, (unsigned long long)e->step);
    vsnprintf(e->first_error + n, sizeof e->first_error - (size_t)n, fmt, ap);
    va_end(ap);
}

/* A key: often one committed lately in this namespace, else any. */
static uint32_t key_pick(engine_t *e)
{
    unsigned n = atomic_load(&g_n_recent[e->nsid]);
    if (n > 0 && rnd_below(e, 2) == 0) {
        n = n < RECENT ? n : RECENT;
        return atomic_load(&g_recent[e->nsid][rnd_below(e, n)]);
    }
    return rnd_below(e, KEYS);
}

static void key_committed(engine_t *e, uint32_t key)
{
    unsigned i = atomic_fetch_add(&g_n_recent[e->nsid], 1u);
    atomic_store(&g_recent[e->nsid][i % RECENT], key);
}

/* n distinct keys into `keys`, none of `avoid` (m of them). */
static void keys_pick(engine_t *e, uint32_t *keys, size_t n,
                      const uint32_t *avoid, size_t m)
{
    for (size_t i = 0; i < n;) {
        uint32_t k = key_pick(e);
        bool dup = false;
        for (size_t j = 0; j < i; j++) {
            dup = dup || keys[j] == k;
        }
        for (size_t j = 0; j < m; j++) {
            dup = dup || avoid[j] == k;
        }
        if (!dup) {
            keys[i++] = k;
        }
    }
}

static void stall(engine_t *e, uint32_t ms)
{
    if (ms >= TTL_MS) {
        e->c.stalls++;
    }
    usleep(ms * 1000u);
}

/* A short pause most of the time, past the TTLs one time in `odds`. */
static uint32_t stall_pick(engine_t *e, uint32_t odds)
{
    return rnd_below(e, odds) == 0 ? STALL_MS : rnd_below(e, 3);
}

/* ---- one engine step ---------------------------------------------------- */

/* Drains reports until request `id` (n blocks loading keys into LOAD_BASE +
 * i) finished loading, then checks every block: a failed one is a reported
 * miss, any other must hold exactly its content. `cancel`: the engine
 * finishes the request at once (its async loads not started are
 * canceled). */
static void loads_collect(engine_t *e, const char *id, const uint32_t *keys,
                          size_t n, bool cancel)
{
    bool failed[MAXB] = {false}, done = false;
    uint64_t deadline = kvd_test_cl_now_ms() + COLLECT_MS;
    const char *ids[1] = {id};
    for (bool first = true; !done; first = false) {
        kvd_worker_finished_t f;
        bool fin = cancel && first;
        if (kvd_worker_get_finished(e->w, fin ? ids : NULL, fin ? 1 : 0, &f) !=
            KVD_OK) {
            note(e, "get_finished failed");
            e->c.call_errors++;
        } else {
            for (size_t i = 0; i < f.num_failed_loads; i++) {
                const kvd_worker_failed_load_t *fl = &f.failed_loads[i];
                int32_t b = fl->block_id - LOAD_BASE;
                if (strcmp(fl->request_id, id) != 0 || b < 0 ||
                    (size_t)b >= n || failed[b] || fl->status == KVD_OK) {
                    note(e, "stray failed load %s/%d", fl->request_id,
                         fl->block_id);
                    e->c.stray_reports++;
                    continue;
                }
                failed[b] = true;
                e->c.canceled_blocks += fl->status == KVD_ERR_CANCELED;
            }
            for (size_t i = 0; i < f.num_finished_loading; i++) {
                done = done || strcmp(f.finished_loading[i], id) == 0;
            }
        }
        if (!done && kvd_test_cl_now_ms() > deadline) {
            note(e, "request %s never reported", id);
            e->c.unreported += n;
            return;
        }
        if (!done) {
            struct pollfd pfd = {kvd_worker_fd(e->w), POLLIN, 0};
            (void)poll(&pfd, 1, 10);
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (failed[i]) {
            e->c.load_misses++;
            continue;
        }
        uint64_t wrong = block_wrong(e, (uint32_t)(LOAD_BASE + i), keys[i]);
        if (wrong > 0) {
            note(e, "block %u (key %u) loaded with %llu wrong bytes",
                 (unsigned)(LOAD_BASE + i), keys[i], (unsigned long long)wrong);
        }
        e->c.wrong_bytes += wrong;
        e->c.loads_ok++;
    }
}

/* Binds the step's plan; false (counted) when the worker refuses it. */
static bool step_bind(engine_t *e, const step_spec_t *sp, const char *lid,
                      const char *sid)
{
    kvd_block_hash_t lh[MAXB], sh[MAXB];
    int32_t lids[MAXB], sids[MAXB];
    for (size_t i = 0; i < sp->n_load; i++) {
        lh[i] = key_hash(sp->load_keys[i]);
        lids[i] = (int32_t)(LOAD_BASE + i);
    }
    for (size_t i = 0; i < sp->n_save; i++) {
        sh[i] = key_hash(sp->save_keys[i]);
        sids[i] = (int32_t)i;
    }
    kvd_testplan_req_t rq[2];
    size_t n = 0;
    if (sp->n_load > 0) {
        rq[n++] = (kvd_testplan_req_t){.id = lid,
                                       .async = sp->async,
                                       .layerwise = sp->layerwise,
                                       .n_loads = sp->n_load,
                                       .load_ids = lids,
                                       .load_hashes = lh};
    }
    if (sp->n_save > 0) {
        rq[n++] = (kvd_testplan_req_t){.id = sid,
                                       .layerwise = true,
                                       .n_saves = sp->n_save,
                                       .save_ids = sids,
                                       .save_hashes = sh};
    }
    size_t len = 0;
    uint8_t *plan = kvd_testplan_pack(e->step, BS, &e->ns, rq, n, &len);
    if (plan == NULL) {
        note(e, "plan not packed");
        e->c.call_errors++;
        return false;
    }
    char err[256] = "";
    kvd_status_t s = kvd_worker_bind_metadata(e->w, plan, len, err, sizeof err);
    free(plan);
    e->bound = false;
    if (s != KVD_OK) {
        e->c.bind_errors++; /* nothing of the plan was done */
        (void)kvd_worker_clear_metadata(e->w);
        return false;
    }
    return true;
}

/* Whether the step saves layer `l` before its end. */
static bool step_saves_layer(const step_spec_t *sp, uint32_t l)
{
    switch (sp->end) {
    case END_COMMIT: return true;
    case END_SKIP: return l != sp->cut;
    default: return l < sp->cut;
    }
}

/* Runs one step: fills the saved blocks (stale layers where the step stops
 * short), poisons the loaded ones, binds, goes through the layers (a stall
 * at one, maybe), ends the step as `sp->end` says, checks the loads. */
static void step_run(engine_t *e, const step_spec_t *sp)
{
    char lid[48], sid[48];
    e->step++;
    snprintf(lid, sizeof lid, "e%d-%llu-load", e->idx,
             (unsigned long long)e->step);
    snprintf(sid, sizeof sid, "e%d-%llu-save", e->idx,
             (unsigned long long)e->step);
    uint32_t stale = 0; /* layers the step does not save */
    for (uint32_t l = 0; l < LAYERS; l++) {
        stale |= step_saves_layer(sp, l) ? 0u : 1u << l;
    }
    for (size_t i = 0; i < sp->n_save; i++) {
        block_fill(e, (uint32_t)i, sp->save_keys[i], stale);
    }
    for (size_t i = 0; i < sp->n_load; i++) {
        for (uint32_t l = 0; l < LAYERS; l++) {
            for (uint32_t p = 0; p < 2; p++) {
                memset(region(e, (uint32_t)(LOAD_BASE + i), l, p), POISON,
                       e->region_bytes);
            }
        }
    }
    e->c.steps++;
    if (!step_bind(e, sp, lid, sid)) {
        return;
    }
    (void)kvd_worker_start_load_kv(e->w, NULL);
    for (uint32_t l = 0; l < LAYERS; l++) {
        if ((int)l == sp->stall_layer) {
            stall(e, sp->stall_ms);
        }
        (void)kvd_worker_wait_for_layer_load(e->w, l, NULL);
        if (sp->n_save > 0 && step_saves_layer(sp, l)) {
            (void)kvd_worker_save_kv_layer(e->w, l, NULL);
        }
    }
    if (sp->n_save > 0) {
        bool whole = sp->end == END_COMMIT;
        e->c.saves_whole += whole;
        e->c.saves_short += !whole;
    }
    switch (sp->end) {
    case END_COMMIT:
    case END_SKIP: (void)kvd_worker_wait_for_save(e->w, NULL); break;
    case END_ABORT: (void)kvd_worker_abort_step(e->w); break;
    case END_CLEAR: break;
    case END_REBIND: e->bound = true; return; /* the next bind ends it */
    }
    (void)kvd_worker_clear_metadata(e->w);
    if (sp->n_load > 0) {
        e->c.cancels += sp->cancel;
        loads_collect(e, lid, sp->load_keys, sp->n_load, sp->cancel);
    } else {
        kvd_worker_finished_t f;
        (void)kvd_worker_get_finished(e->w, NULL, 0, &f);
    }
    if (sp->end == END_COMMIT) {
        for (size_t i = 0; i < sp->n_save; i++) {
            key_committed(e, sp->save_keys[i]);
        }
    }
}

/* A random step: saves, loads or both, ending as drawn. */
static void step_random(engine_t *e)
{
    step_spec_t sp;
    memset(&sp, 0, sizeof sp);
    sp.stall_layer = -1;
    uint32_t kind = rnd_below(e, 10);
    if (kind < 6) {
        sp.n_save = 1 + rnd_below(e, MAXB);
        keys_pick(e, sp.save_keys, sp.n_save, NULL, 0);
        uint32_t r = rnd_below(e, 20);
        sp.end = r < 11   ? END_COMMIT
                 : r < 13 ? END_ABORT
                 : r < 15 ? END_CLEAR
                 : r < 17 ? END_SKIP
                          : END_REBIND;
        sp.cut = rnd_below(e, LAYERS);
    }
    if (kind >= 3 && sp.end != END_REBIND) {
        sp.n_load = 1 + rnd_below(e, MAXB);
        keys_pick(e, sp.load_keys, sp.n_load, sp.save_keys, sp.n_save);
        uint32_t mode = rnd_below(e, 4);
        sp.layerwise = mode == 1 || mode == 2;
        sp.async = mode == 3;
        sp.cancel = sp.async && rnd_below(e, 3) == 0;
    }
    if (rnd_below(e, 4) == 0) {
        sp.stall_layer = (int)rnd_below(e, LAYERS);
        sp.stall_ms = stall_pick(e, 25);
    }
    step_run(e, &sp);
    if (sp.end == END_REBIND) {
        /* The next plan is bound over the unfinished one: loads only, so
         * nothing overwrites the blocks its copies read. */
        step_spec_t nx;
        memset(&nx, 0, sizeof nx);
        nx.stall_layer = -1;
        nx.n_load = 1 + rnd_below(e, MAXB);
        keys_pick(e, nx.load_keys, nx.n_load, sp.save_keys, sp.n_save);
        nx.layerwise = rnd_below(e, 2) == 0;
        step_run(e, &nx);
    }
}

/* ---- slow clients of the store ------------------------------------------ */

/* Checks the object of `key` at `p` (a leased slot) byte for byte. */
static void object_check(engine_t *e, const uint8_t *p, uint64_t size,
                         uint32_t key, const char *when)
{
    if (!object_build(e, key)) {
        note(e, "expected object of key %u not built", key);
        e->c.call_errors++;
        return;
    }
    uint64_t wrong = object_wrong(e, p, size);
    if (wrong > 0) {
        note(e, "slow reader: key %u has %llu wrong bytes %s", key,
             (unsigned long long)wrong, when);
    }
    e->c.wrong_bytes += wrong;
}

/* Looks up to 3 keys, checks the leased bytes, stalls (past the lease TTL
 * one time in 3), checks the same bytes through the same pointers, and
 * releases: an expired lease answers KVD_ERR_TIMEOUT. */
static void slow_read(engine_t *e)
{
    uint32_t keys[3];
    kvd_block_hash_t h[3];
    kvd_store_lease_t l[3];
    const uint8_t *p[3] = {NULL, NULL, NULL};
    size_t n = 1 + rnd_below(e, 3), m = 0;
    keys_pick(e, keys, n, NULL, 0);
    for (size_t i = 0; i < n; i++) {
        h[i] = key_hash(keys[i]);
    }
    e->c.slow_reads++;
    kvd_status_t s = kvd_store_lookup(e->st, &e->ns, h, n, l, &m);
    if (s != KVD_OK) {
        usleep(1000); /* the daemon restarting: a clean error */
    }
    if (s != KVD_OK || m == 0) {
        return; /* nothing leased */
    }
    for (size_t i = 0; i < m; i++) {
        if (l[i].tier == KVD_STORE_TIER_HOST) {
            p[i] = kvd_store_lease_ptr(e->st, &l[i]);
        }
        if (p[i] != NULL) {
            object_check(e, p[i], l[i].size_bytes, keys[i], "when leased");
            e->c.slow_read_blocks++;
        }
    }
    stall(e, stall_pick(e, 3));
    for (size_t i = 0; i < m; i++) {
        if (p[i] != NULL) { /* expired or not, the slot is still its own */
            object_check(e, p[i], l[i].size_bytes, keys[i], "after a stall");
        }
    }
    if (m > 0 && kvd_store_release(e->st, l, m) == KVD_ERR_TIMEOUT) {
        e->c.expired_releases++;
    }
}

/* Reserves one key, stalls (past the reservation TTL one time in 3),
 * writes through the pointer taken before the stall, commits. A writer
 * that stalled past the TTL writes another key's payload under this key's
 * header: its commit must fail, or loads would find wrong bytes. */
static void slow_write(engine_t *e)
{
    uint32_t key = rnd_below(e, KEYS);
    kvd_block_hash_t h = key_hash(key);
    kvd_store_key_t k = {.ns = e->ns, .hash = h};
    kvd_store_reservation_t r;
    kvd_status_t cs = KVD_OK;
    e->c.slow_writes++;
    if (kvd_store_reserve(e->st, &e->ns, &h, 1, e->stored_bytes, 0, &r) !=
            KVD_OK ||
        r.status != KVD_OK) {
        usleep(1000); /* stored already, no room, or the daemon restarting */
        return;
    }
    uint8_t *p = kvd_store_reservation_ptr(e->st, &r, e->stored_bytes);
    if (p == NULL) {
        (void)kvd_store_abort(e->st, &k, 1, &cs);
        return;
    }
    uint32_t ms = stall_pick(e, 3);
    bool late = ms >= TTL_MS;
    stall(e, ms);
    if (!object_build(e, late ? key ^ STALE : key) ||
        kvd_object_header_pack(&e->fmt, &e->ns, &h, e->expect + e->obj_bytes) !=
            KVD_OK) {
        note(e, "object of key %u not built", key);
        e->c.call_errors++;
        (void)kvd_store_abort(e->st, &k, 1, &cs);
        return;
    }
    memcpy(p, e->expect, e->stored_bytes);
    (void)kvd_store_commit(e->st, &k, 1, &cs);
    if (cs == KVD_OK && late) {
        note(e, "a reservation %u ms old was committed", ms);
        e->c.late_commits++;
    } else if (cs == KVD_OK) {
        e->c.slow_commits++;
        key_committed(e, key);
    } else if (cs == KVD_ERR_TIMEOUT) {
        e->c.expired_commits++;
    }
}

/* ---- engines ------------------------------------------------------------ */

static void *engine_main(void *arg)
{
    engine_t *e = arg;
    while (!atomic_load(&g_stop)) {
        if (e->w != NULL) {
            step_random(e);
            e->c.rounds++;
        } else if (rnd_below(e, 2) == 0) {
            slow_read(e);
        } else {
            slow_write(e);
        }
    }
    return NULL;
}

/* Thread `idx`: engines 0 and 1 share a namespace, engine 2 has its own
 * (the same block hashes, other bytes); the slow clients after them, one
 * in each namespace, have a store and a cache (to build the objects they
 * expect) but no worker. */
static void engine_open(engine_t *e, const kvd_test_cl_t *t, int idx,
                        uint64_t seed)
{
    memset(e, 0, sizeof *e);
    e->idx = idx;
    e->nsid = idx < 2 || idx == ENGINES ? 1 : 2;
    memset(e->ns.bytes, 0x4E, sizeof e->ns.bytes);
    e->ns.bytes[0] = (uint8_t)e->nsid;
    e->rng = mix64(seed + (uint64_t)idx);
    assert_int_equal(kvd_test_cl_open(t, &e->st, "store.lease_ttl", "300ms",
                                      (const char *)NULL),
                     KVD_OK);
    cache_init(&e->cache, LAYOUT_VLLM_NHD, 2, LAYERS, NBLOCKS, BS, HEADS, DIM);
    memset(e->cache.mem, POISON, e->cache.bytes);
    e->fmt = cache_format(&e->cache, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    e->obj_bytes = kvd_object_bytes(&e->fmt);
    e->stored_bytes = kvd_object_stored_bytes(&e->fmt);
    e->region_bytes = (size_t)BS * HEADS * DIM * 2;
    e->expect = aligned_alloc(64, (e->stored_bytes + 63) / 64 * 64);
    e->pat = malloc(e->region_bytes);
    assert_non_null(e->expect);
    assert_non_null(e->pat);
    if (idx >= ENGINES) {
        return;
    }
    kvd_worker_config_t cfg = {0};
    cfg.store = e->st;
    cfg.ns = e->ns;
    cfg.format = e->fmt;
    cfg.worker_rank = (uint32_t)idx;
    cfg.num_threads = 2;
    cfg.layerwise_saves = true;
    char err[256] = "";
    kvd_status_t s = kvd_worker_create(&cfg, &e->w, err, sizeof err);
    if (s != KVD_OK) {
        fail_msg("worker: %s (%s)", kvd_status_str(s), err);
    }
    s = kvd_worker_register_kv_caches(e->w, &e->cache.layout, err, sizeof err);
    if (s != KVD_OK) {
        fail_msg("register: %s (%s)", kvd_status_str(s), err);
    }
}

static void engine_close(engine_t *e)
{
    kvd_worker_destroy(e->w);
    kvd_store_close(e->st);
    cache_cleanup(&e->cache);
    free(e->expect);
    free(e->pat);
}

/* ---- the run ------------------------------------------------------------- */

/* What the daemon counted; added up over its instances. */
typedef struct daemon_counts {
    uint64_t leases_expired, reservations_expired;
    uint64_t evictions_host, evictions_disk, checksum_errors, restarts;
    uint64_t restart_ms; /* the daemon down, all restarts */
} daemon_counts_t;

static void daemon_tally(kvd_test_cl_t *t, daemon_counts_t *d)
{
    kvd_store_stats_t st;
    kvd_service_stats_t svc;
    kvd_server_collect(t->srv, &st, &svc);
    d->leases_expired += svc.leases_expired;
    d->reservations_expired += svc.reservations_expired;
    d->evictions_host += st.host.evictions;
    d->evictions_disk += st.disk.evictions;
    d->checksum_errors += st.checksum_errors;
}

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? strtoull(v, NULL, 0) : dflt;
}

/* Runs the engines for `seconds`, restarting the daemon every 1 to 3 s. */
static void run_engines(kvd_test_cl_t *t, engine_t *eng, uint64_t seed,
                        uint64_t seconds, daemon_counts_t *d)
{
    uint64_t rng = mix64(seed ^ 0xD1CEull);
    atomic_store(&g_stop, false);
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(
            pthread_create(&eng[i].thread, NULL, engine_main, &eng[i]), 0);
    }
    uint64_t now = kvd_test_cl_now_ms(), end = now + seconds * 1000u;
    uint64_t next = now + 1000u + (rng = mix64(rng)) % 2000u;
    while ((now = kvd_test_cl_now_ms()) < end) {
        usleep(20000);
        if (now >= next && now + 500u < end) {
            daemon_tally(t, d);
            uint64_t t0 = kvd_test_cl_now_ms();
            kvd_test_cl_restart(t);
            d->restart_ms += kvd_test_cl_now_ms() - t0;
            d->restarts++;
            next = kvd_test_cl_now_ms() + 1000u + (rng = mix64(rng)) % 2000u;
        }
    }
    atomic_store(&g_stop, true);
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(eng[i].thread, NULL), 0);
        if (eng[i].bound) {
            (void)kvd_worker_clear_metadata(eng[i].w);
        }
    }
    daemon_tally(t, d);
}

static void counts_add(engine_counts_t *sum, const engine_counts_t *c)
{
    const uint64_t *a = (const uint64_t *)(const void *)c;
    uint64_t *s = (uint64_t *)(void *)sum;
    for (size_t i = 0; i < sizeof *c / sizeof(uint64_t); i++) {
        s[i] += a[i];
    }
}

#define U(x) ((unsigned long long)(x))

/* The run's figures (docs/reliability.md, "The randomized check"). */
static void summary_print(const engine_counts_t *c, const kvd_worker_stats_t *w,
                          const daemon_counts_t *d)
{
    printf("test_never_wrong_kv: %llu engine rounds, %llu steps (%llu saving "
           "whole, %llu stopped short); objects: %llu committed by workers + "
           "%llu by slow writers, %llu aborted, %llu dropped, %llu skipped\n",
           U(c->rounds), U(c->steps), U(c->saves_whole), U(c->saves_short),
           U(w->blocks_saved), U(c->slow_commits), U(w->saves_aborted),
           U(w->saves_dropped), U(w->saves_skipped));
    printf("test_never_wrong_kv: loads: %llu ok (%llu promoted from NVMe), "
           "%llu load errors reported (%llu header, %llu blocks of %llu "
           "canceled requests); slow clients: %llu reads (%llu blocks "
           "checked twice), %llu writes\n",
           U(c->loads_ok), U(w->promotions), U(c->load_misses),
           U(w->header_errors), U(c->canceled_blocks), U(c->cancels),
           U(c->slow_reads), U(c->slow_read_blocks), U(c->slow_writes));
    printf("test_never_wrong_kv: %llu stalls past the TTL; expiries: daemon "
           "%llu leases + %llu reservations, clients %llu releases + %llu "
           "commits KVD_ERR_TIMEOUT; evictions %llu arena + %llu NVMe; %llu "
           "daemon restarts (down %llu ms in all); %llu plans refused\n",
           U(c->stalls), U(d->leases_expired), U(d->reservations_expired),
           U(c->expired_releases), U(c->expired_commits), U(d->evictions_host),
           U(d->evictions_disk), U(d->restarts), U(d->restart_ms),
           U(c->bind_errors));
    printf("test_never_wrong_kv: wrong bytes %llu, unreported blocks %llu, "
           "stray reports %llu, late commits %llu\n",
           U(c->wrong_bytes), U(c->unreported), U(c->stray_reports),
           U(c->late_commits));
}

static void test_never_wrong_kv(void **state)
{
    (void)state;
    uint64_t seed = env_u64("KVDEPOT_TEST_SEED", DEFAULT_SEED);
    uint64_t seconds = env_u64("KVDEPOT_TEST_SECONDS", DEFAULT_SECONDS);
    printf("test_never_wrong_kv: seed %llu, %llu s (KVDEPOT_TEST_SEED, "
           "KVDEPOT_TEST_SECONDS to replay)\n",
           U(seed), U(seconds));
    kvd_test_cl_t t;
    kvd_test_cl_start(&t, "never_wrong", true, "server.lease_ttl", "300ms",
                      "server.reservation_ttl", "300ms", "store.arena_size",
                      "4m", "store.arena_chunk", "1m", "store.disk_size", "8m",
                      (const char *)NULL);
    static engine_t eng[THREADS];
    for (int i = 0; i < THREADS; i++) {
        engine_open(&eng[i], &t, i, seed);
    }
    daemon_counts_t d;
    memset(&d, 0, sizeof d);
    run_engines(&t, eng, seed, seconds, &d);

    engine_counts_t c;
    kvd_worker_stats_t ws, w;
    memset(&c, 0, sizeof c);
    memset(&ws, 0, sizeof ws);
    for (int i = 0; i < THREADS; i++) {
        if (eng[i].first_error[0] != '\0') {
            printf("  %s\n", eng[i].first_error);
        }
        counts_add(&c, &eng[i].c);
        if (eng[i].w == NULL) {
            continue;
        }
        assert_int_equal(kvd_worker_stats(eng[i].w, &w), KVD_OK);
        /* Every block the engine checked is one the worker counted. */
        assert_int_equal(w.blocks_loaded, eng[i].c.loads_ok);
        assert_int_equal(w.load_errors, eng[i].c.load_misses);
        ws.blocks_saved += w.blocks_saved;
        ws.saves_aborted += w.saves_aborted;
        ws.saves_dropped += w.saves_dropped;
        ws.saves_skipped += w.saves_skipped;
        ws.header_errors += w.header_errors;
        ws.promotions += w.promotions;
    }
    summary_print(&c, &ws, &d);
    assert_int_equal(c.wrong_bytes, 0);
    assert_int_equal(c.unreported, 0);
    assert_int_equal(c.stray_reports, 0);
    assert_int_equal(c.late_commits, 0);
    assert_int_equal(c.call_errors, 0);
    /* The run did what it is for. */
    assert_true(c.loads_ok > 0 && c.load_misses > 0);
    assert_true(ws.blocks_saved > 0 && ws.saves_aborted > 0);
    for (int i = 0; i < THREADS; i++) {
        engine_close(&eng[i]);
    }
    kvd_test_cl_stop(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_never_wrong_kv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
