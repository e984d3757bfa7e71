/*
 * Store benchmark (issue "Store core"): the embedded store against the
 * peers it must keep up with, measured in one run.
 *
 *   arena   put (reserve + copy in + commit) and get (lookup + copy out +
 *           release) of 2 MiB objects, against memcpy of the same bytes
 *           into and out of a plain buffer of the same size, in the same
 *           order (all in, then all out).
 *   NVMe    write-through of 2 MiB objects (commit -> written, indexed,
 *           synced by kvd_store_flush) and promotion of the same objects
 *           after a reopen (lookup -> get -> completions, checksums
 *           verified), against fio with io_uring, O_DIRECT, the same block
 *           size and queue depth, in the same directory; five passes,
 *           each running fio and the store back to back, and the median
 *           of the per-pass ratios.
 *   index   lookups of 512-key chains per second, and records committed per
 *           second in batches of 32 (the index must keep up with the objects
 *           per second the disk writes).
 *
 * Environment: KVDEPOT_BENCH_DIR (default /var/tmp) holds the files; the
 * NVMe part needs about 2.2 GiB there and fio on PATH.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kvdepot/store.h"
#include "store/index.h"

#define MIB (1ull << 20)
#define OBJ_BYTES (2 * MIB)
#define ARENA_OBJECTS 256u
#define DISK_OBJECTS 512u
#define DISK_BATCH 32u /* objects an engine step commits, for --peers */
#define QUEUE_DEPTH "32"
#define INDEX_CHAINS 64u
#define CHAIN_LEN 512u
#define INDEX_BATCH 32u
#define NVME_PASSES 5

static char headlines[8][200];
static size_t num_headlines;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void headline(const char *metric, double value, const char *target)
{
    snprintf(headlines[num_headlines++], sizeof headlines[0],
             "BENCH store: %s = %.3g (%s)", metric, value, target);
}

static kvd_block_hash_t hash_of(uint32_t run, uint32_t i)
{
    kvd_block_hash_t h;
    memset(h.bytes, 0x3c, sizeof h.bytes);
    memcpy(h.bytes, &run, sizeof run);
    memcpy(h.bytes + 4, &i, sizeof i);
    return h;
}

static kvd_store_t *store_open(const char *const *kv, size_t n)
{
    kvd_config_t *cfg = NULL;
    kvd_store_t *st = NULL;
    char err[256] = "";
    if (kvd_config_create(&cfg) != KVD_OK) {
        return NULL;
    }
    for (size_t i = 0; i + 1 < n; i += 2) {
        if (kvd_config_set(cfg, kv[i], kv[i + 1]) != KVD_OK) {
            kvd_config_destroy(cfg);
            return NULL;
        }
    }
    kvd_status_t s = kvd_store_open(cfg, &st, err, sizeof err);
    kvd_config_destroy(cfg);
    if (s != KVD_OK) {
        fprintf(stderr, "bench_store: kvd_store_open: %s (%s)\n",
                kvd_status_str(s), err);
        return NULL;
    }
    return st;
}

/* ---- arena vs memcpy ---------------------------------------------------- */

/* A run of objects: `n` of `size` bytes of `pass`; with `lat` (n
 * entries), each operation's seconds. */
typedef struct arena_run {
    uint32_t pass, n;
    size_t size;
    double *lat;
} arena_run_t;

static int arena_put_run(kvd_store_t *st, const kvd_namespace_t *ns,
                         const arena_run_t *a, const uint8_t *src)
{
    for (uint32_t i = 0; i < a->n; i++) {
        double t0 = a->lat != NULL ? now_s() : 0;
        kvd_block_hash_t h = hash_of(a->pass, i);
        kvd_store_reservation_t r;
        kvd_store_key_t key = {*ns, h};
        if (kvd_store_reserve(st, ns, &h, 1, a->size, 0, &r) != KVD_OK ||
            r.status != KVD_OK) {
            fprintf(stderr, "bench_store: reserve failed\n");
            return 1;
        }
        memcpy(kvd_store_arena_ptr(st, r.arena_offset, a->size),
               src + (size_t)i * a->size, a->size);
        (void)kvd_store_commit(st, &key, 1, NULL);
        if (a->lat != NULL) {
            a->lat[i] = now_s() - t0;
        }
    }
    return 0;
}

/* Gets them back: lookup, copy out to dst + i * stride, release; a byte
 * of each copy goes into *sink, so no copy is optimised away. */
static int arena_get_run(kvd_store_t *st, const kvd_namespace_t *ns,
                         const arena_run_t *a, uint8_t *dst, size_t stride,
                         unsigned *sink)
{
    for (uint32_t i = 0; i < a->n; i++) {
        double t0 = a->lat != NULL ? now_s() : 0;
        kvd_block_hash_t h = hash_of(a->pass, i);
        kvd_store_lease_t l;
        size_t m = 0;
        (void)kvd_store_lookup(st, ns, &h, 1, &l, &m);
        if (m != 1) {
            fprintf(stderr, "bench_store: lookup missed\n");
            return 1;
        }
        uint8_t *out = dst + (size_t)i * stride;
        memcpy(out, kvd_store_arena_ptr(st, l.arena_offset, a->size), a->size);
        *sink += out[i % a->size];
        (void)kvd_store_release(st, &l, 1);
        if (a->lat != NULL) {
            a->lat[i] = now_s() - t0;
        }
    }
    return 0;
}

/* Deletes them, so the next pass finds the arena empty. */
static void arena_delete_run(kvd_store_t *st, const kvd_namespace_t *ns,
                             const arena_run_t *a)
{
    for (uint32_t i = 0; i < a->n; i++) {
        kvd_store_key_t key = {*ns, hash_of(a->pass, i)};
        (void)kvd_store_delete(st, &key, 1, NULL);
    }
}

static int arena_put_all(kvd_store_t *st, const kvd_namespace_t *ns,
                         uint32_t pass, const uint8_t *src)
{
    arena_run_t a = {pass, ARENA_OBJECTS, OBJ_BYTES, NULL};
    return arena_put_run(st, ns, &a, src);
}

static int arena_get_all(kvd_store_t *st, const kvd_namespace_t *ns,
                         uint32_t pass, uint8_t *dst, size_t stride,
                         unsigned *sink)
{
    arena_run_t a = {pass, ARENA_OBJECTS, OBJ_BYTES, NULL};
    return arena_get_run(st, ns, &a, dst, stride, sink);
}

static void arena_delete_all(kvd_store_t *st, const kvd_namespace_t *ns,
                             uint32_t pass)
{
    arena_run_t a = {pass, ARENA_OBJECTS, OBJ_BYTES, NULL};
    arena_delete_run(st, ns, &a);
}

static int cmp_double(const void *a, const void *b);
static double median(double *v, size_t n);

/* The memcpy peer of a run, in the store's order: every object copied
 * into a plain buffer, then every one out again to `dst`, as the store's
 * run puts them all, then gets them all (copying each object back out
 * right after it went in would read it from the cache while the store
 * reads it back from memory). `lat`: each object's two copies' seconds
 * together. Seconds in all. */
static double memcpy_run(const arena_run_t *a, const uint8_t *src,
                         uint8_t *plain, uint8_t *dst, unsigned *sink)
{
    double t0 = now_s();
    for (uint32_t i = 0; i < a->n; i++) {
        double o = a->lat != NULL ? now_s() : 0;
        memcpy(plain + (size_t)i * a->size, src + (size_t)i * a->size, a->size);
        if (a->lat != NULL) {
            a->lat[i] = now_s() - o;
        }
    }
    for (uint32_t i = 0; i < a->n; i++) {
        double o = a->lat != NULL ? now_s() : 0;
        memcpy(dst, plain + (size_t)i * a->size, a->size);
        *sink += dst[i % a->size];
        if (a->lat != NULL) {
            a->lat[i] += now_s() - o;
        }
    }
    return now_s() - t0;
}

/* The p-th percentile (0..100) of n values (sorted in place). */
static double percentile(double *v, size_t n, double p)
{
    qsort(v, n, sizeof *v, cmp_double);
    size_t k = (size_t)(p / 100.0 * (double)(n - 1) + 0.5);
    return v[k < n ? k : n - 1];
}

#define ARENA_PASSES 5

static int bench_arena(void)
{
    static const char *const kv[] = {
        "store.arena_size",      "640m", "store.arena_chunk",    "64m",
        "store.arena_hugepages", "auto", "store.arena_prefault", "true"};
    kvd_store_t *st = store_open(kv, sizeof kv / sizeof kv[0]);
    size_t total = (size_t)ARENA_OBJECTS * OBJ_BYTES;
    uint8_t *src = malloc(total), *plain = malloc(total),
            *dst = malloc(OBJ_BYTES);
    if (st == NULL || src == NULL || plain == NULL || dst == NULL) {
        fprintf(stderr, "bench_store: arena setup failed\n");
        kvd_store_close(st);
        free(dst);
        free(plain);
        free(src);
        return 1;
    }
    memset(src, 0x5a, total);
    memset(plain, 0, total);
    memset(dst, 0, OBJ_BYTES);
    kvd_namespace_t ns;
    memset(ns.bytes, 1, sizeof ns.bytes);
    double store_s[ARENA_PASSES], peer_s[ARENA_PASSES], ratio[ARENA_PASSES];
    unsigned sink = 0;
    int rc = 0;
    for (uint32_t pass = 0; pass < ARENA_PASSES && rc == 0; pass++) {
        arena_run_t a = {pass, ARENA_OBJECTS, OBJ_BYTES, NULL};
        peer_s[pass] = memcpy_run(&a, src, plain, dst, &sink);
        double t1 = now_s();
        rc = arena_put_all(st, &ns, pass, src) != 0 ||
             arena_get_all(st, &ns, pass, dst, 0, &sink) != 0;
        store_s[pass] = now_s() - t1;
        ratio[pass] = peer_s[pass] / store_s[pass];
        arena_delete_all(st, &ns, pass);
    }
    if (rc == 0) {
        double gb = 2.0 * (double)total / 1e9;
        double r = median(ratio, ARENA_PASSES);
        printf("arena, %u x 2 MiB put+get, %d passes (memcpy then the store "
               "in each): store %.2f GB/s, memcpy %.2f GB/s (medians); ratio "
               "%.3g (%.3g-%.3g) (checksum %u)\n",
               ARENA_OBJECTS, ARENA_PASSES, gb / median(store_s, ARENA_PASSES),
               gb / median(peer_s, ARENA_PASSES), r, ratio[0],
               ratio[ARENA_PASSES - 1], sink & 1);
        headline("arena_put_get_vs_memcpy", r, "target >= 0.9");
    }
    kvd_store_close(st);
    free(dst);
    free(plain);
    free(src);
    return rc;
}

/* One object size of the sweep: SWEEP_PASSES passes of the memcpy peer
 * then the store's puts and gets, with every operation timed; one JSON
 * line. */
#define SWEEP_PASSES 3
static int sweep_size(kvd_store_t *st, size_t size, uint8_t *src,
                      uint8_t *plain, uint8_t *dst)
{
    uint32_t n = (uint32_t)((256u << 20) / size);
    n = n < 8 ? 8 : n > 4096 ? 4096 : n;
    double *lat = malloc(sizeof *lat * n * (SWEEP_PASSES * 3));
    if (lat == NULL) {
        return 1;
    }
    double *put = lat, *get = lat + n * SWEEP_PASSES,
           *cpy = lat + 2 * n * SWEEP_PASSES;
    double store_s[SWEEP_PASSES], peer_s[SWEEP_PASSES], ratio[SWEEP_PASSES];
    kvd_namespace_t ns;
    memset(ns.bytes, 3, sizeof ns.bytes);
    unsigned sink = 0;
    int rc = 0;
    for (uint32_t p = 0; p < SWEEP_PASSES && rc == 0; p++) {
        arena_run_t c = {p, n, size, cpy + p * n};
        arena_run_t pu = {p, n, size, put + p * n};
        arena_run_t g = {p, n, size, get + p * n};
        peer_s[p] = memcpy_run(&c, src, plain, dst, &sink);
        double t0 = now_s();
        rc = arena_put_run(st, &ns, &pu, src) != 0 ||
             arena_get_run(st, &ns, &g, dst, 0, &sink) != 0;
        store_s[p] = now_s() - t0;
        ratio[p] = peer_s[p] / store_s[p];
        arena_delete_run(st, &ns, &pu);
    }
    if (rc == 0) {
        size_t all = (size_t)n * SWEEP_PASSES;
        double bytes = 2.0 * (double)n * (double)size;
        double rmed = median(ratio, SWEEP_PASSES);
        printf("SWEEP {\"size\": %zu, \"objects\": %u, \"passes\": %d, "
               "\"store_bytes_per_s\": %.0f, \"memcpy_bytes_per_s\": %.0f, "
               "\"ratio\": %.4f, \"ratio_min\": %.4f, \"ratio_max\": %.4f, "
               "\"put_p50_us\": %.2f, \"put_p99_us\": %.2f, "
               "\"get_p50_us\": %.2f, \"get_p99_us\": %.2f, "
               "\"memcpy_p50_us\": %.2f, \"memcpy_p99_us\": %.2f}\n",
               size, n, SWEEP_PASSES, bytes / median(store_s, SWEEP_PASSES),
               bytes / median(peer_s, SWEEP_PASSES), rmed, ratio[0],
               ratio[SWEEP_PASSES - 1], percentile(put, all, 50) * 1e6,
               percentile(put, all, 99) * 1e6, percentile(get, all, 50) * 1e6,
               percentile(get, all, 99) * 1e6, percentile(cpy, all, 50) * 1e6,
               percentile(cpy, all, 99) * 1e6);
        fflush(stdout);
    }
    free(lat);
    return rc;
}

/* `bench_store --sweep`: arena put+get against memcpy for object sizes
 * 16 KiB .. 32 MiB (bench/curves.py plots it). */
static int bench_arena_sweep(void)
{
    static const char *const kv[] = {
        "store.arena_size",      "640m", "store.arena_chunk",    "64m",
        "store.arena_hugepages", "auto", "store.arena_prefault", "true"};
    kvd_store_t *st = store_open(kv, sizeof kv / sizeof kv[0]);
    size_t total = 256u << 20, big = 32u << 20;
    uint8_t *src = malloc(total + big), *plain = malloc(total + big),
            *dst = malloc(big);
    int rc = st == NULL || src == NULL || plain == NULL || dst == NULL;
    if (rc == 0) {
        memset(src, 0x5a, total + big);
        memset(plain, 0, total + big);
        memset(dst, 0, big);
    }
    for (size_t size = 16u << 10; size <= big && rc == 0; size *= 2) {
        rc = sweep_size(st, size, src, plain, dst);
    }
    kvd_store_close(st);
    free(dst);
    free(plain);
    free(src);
    return rc;
}

/* `bench_store --sweep-pressure`: puts into an arena with room (half of it
 * free) against the same puts into an arena that is full, where every
 * reserve first evicts (no disk tier: an evicted object is gone), for
 * object sizes 64 KiB .. 8 MiB; three interleaved passes, every put
 * timed. */
static int pressure_size(kvd_store_t *st, size_t size, const uint8_t *src)
{
    uint32_t n = (uint32_t)((128u << 20) / size);
    uint32_t fill = (uint32_t)((256u << 20) / size) + 8;
    double *lat = malloc(sizeof *lat * n * 6);
    if (lat == NULL) {
        return 1;
    }
    double *room = lat, *full = lat + 3 * n, room_s[3], full_s[3], ratio[3];
    kvd_namespace_t ns, filler;
    memset(ns.bytes, 7, sizeof ns.bytes);
    memset(filler.bytes, 8, sizeof filler.bytes);
    int rc = 0;
    for (uint32_t p = 0; p < 3 && rc == 0; p++) {
        arena_run_t a = {100 + p, n, size, room + p * n};
        double t0 = now_s();
        rc = arena_put_run(st, &ns, &a, src);
        room_s[p] = now_s() - t0;
        arena_delete_run(st, &ns, &a);
        /* Fill the arena (more than it holds: the oldest go), then the
         * same puts again, each evicting. */
        arena_run_t f = {200 + p, fill, size, NULL};
        a.lat = full + p * n;
        rc = rc != 0 || arena_put_run(st, &filler, &f, src) != 0;
        t0 = now_s();
        rc = rc != 0 || arena_put_run(st, &ns, &a, src) != 0;
        full_s[p] = now_s() - t0;
        ratio[p] = room_s[p] / full_s[p];
        arena_delete_run(st, &ns, &a);
        arena_delete_run(st, &filler, &f);
    }
    if (rc == 0) {
        size_t all = (size_t)n * 3;
        double bytes = (double)n * (double)size;
        double r = median(ratio, 3);
        printf("SWEEP {\"size\": %zu, \"objects\": %u, \"passes\": 3, "
               "\"room_bytes_per_s\": %.0f, \"full_bytes_per_s\": %.0f, "
               "\"ratio\": %.4f, \"ratio_min\": %.4f, \"ratio_max\": %.4f, "
               "\"room_p50_us\": %.2f, \"room_p99_us\": %.2f, "
               "\"full_p50_us\": %.2f, \"full_p99_us\": %.2f}\n",
               size, n, bytes / median(room_s, 3), bytes / median(full_s, 3), r,
               ratio[0], ratio[2], percentile(room, all, 50) * 1e6,
               percentile(room, all, 99) * 1e6, percentile(full, all, 50) * 1e6,
               percentile(full, all, 99) * 1e6);
        fflush(stdout);
    }
    free(lat);
    return rc;
}

static int bench_pressure_sweep(void)
{
    static const char *const kv[] = {
        "store.arena_size",      "256m", "store.arena_chunk",    "64m",
        "store.arena_hugepages", "auto", "store.arena_prefault", "true"};
    kvd_store_t *st = store_open(kv, sizeof kv / sizeof kv[0]);
    size_t total = (size_t)(128u << 20) + (8u << 20);
    uint8_t *src = malloc(total + (256u << 20));
    int rc = st == NULL || src == NULL;
    if (rc == 0) {
        memset(src, 0x3c, total + (256u << 20));
    }
    for (size_t size = 64u << 10; size <= (8u << 20) && rc == 0; size *= 4) {
        rc = pressure_size(st, size, src);
    }
    kvd_store_close(st);
    free(src);
    return rc;
}

/* ---- NVMe vs fio -------------------------------------------------------- */

/* Runs fio and returns bytes per second of `dir` ("read" or "write"). */
static double fio_run(const char *file, const char *rw)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "fio --name=kvd --filename=%s --rw=%s --bs=2m --size=%llu "
             "--ioengine=io_uring --iodepth=" QUEUE_DEPTH
             " --direct=1 --fixedbufs --end_fsync=%d --output-format=json "
             "2>/dev/null",
             file, rw, (unsigned long long)DISK_OBJECTS * OBJ_BYTES,
             strcmp(rw, "write") == 0);
    FILE *p = popen(cmd, "r");
    if (p == NULL) {
        return 0;
    }
    static char out[1 << 16];
    size_t len = fread(out, 1, sizeof out - 1, p);
    out[len] = '\0';
    if (pclose(p) != 0) {
        return 0;
    }
    char key[32];
    snprintf(key, sizeof key, "\"%s\" : {", rw);
    const char *sec = strstr(out, key);
    const char *bw = sec != NULL ? strstr(sec, "\"bw_bytes\"") : NULL;
    if (bw == NULL) {
        return 0;
    }
    return strtod(strchr(bw, ':') + 1, NULL);
}

/* The NVMe part's store: arena and disk each hold every object, writes go
 * through on commit, every get can be queued at once. */
static kvd_store_t *store_open_disk(const char *dir)
{
    const char *kv[] = {"store.arena_size",       "1088m",
                        "store.arena_chunk",      "64m",
                        "store.arena_hugepages",  "auto",
                        "store.disk_path",        dir,
                        "store.disk_size",        "1152m",
                        "store.disk_queue_depth", QUEUE_DEPTH,
                        "store.disk_write",       "through",
                        "store.disk_admission",   "all",
                        "store.sync_interval",    "10s",
                        "store.get_queue",        "1024"};
    return store_open(kv, sizeof kv / sizeof kv[0]);
}

/* Reserves objects [first, first + n) of the disk pass and fills them:
 * copied from src (object i from object i % ARENA_OBJECTS), or a pattern
 * without src. */
static int disk_fill(kvd_store_t *st, const kvd_namespace_t *ns,
                     const kvd_block_hash_t *h, kvd_store_reservation_t *r,
                     uint32_t first, uint32_t n, const uint8_t *src)
{
    (void)kvd_store_reserve(st, ns, h + first, n, OBJ_BYTES, 0, r + first);
    for (uint32_t i = first; i < first + n; i++) {
        if (r[i].status != KVD_OK) {
            fprintf(stderr, "bench_store: disk reserve %u: %s\n", i,
                    kvd_status_str(r[i].status));
            return 1;
        }
        void *p = kvd_store_arena_ptr(st, r[i].arena_offset, OBJ_BYTES);
        if (src != NULL) {
            memcpy(p, src + (size_t)(i % ARENA_OBJECTS) * OBJ_BYTES, OBJ_BYTES);
        } else {
            memset(p, (int)(i * 7 + 1), OBJ_BYTES);
        }
    }
    return 0;
}

/* Write-through of DISK_OBJECTS objects, bytes per second. src NULL: the
 * objects are reserved and filled before the clock starts, as fio's
 * buffers are ready before it writes (the NVMe figure against fio); src
 * given: the clock also covers reserving each object and copying it in
 * from src, as LMCache's side allocates and copies each object it stores
 * (bench/peers), and the objects are committed DISK_BATCH at a time as an
 * engine's steps commit them, so the first writes run while later objects
 * are copied in (LMCache's I/O threads write each object once it is
 * submitted). Either way the clock stops when kvd_store_flush returns:
 * data written and the index synced. */
static int store_disk_write(const char *dir, double *bytes_per_s,
                            const uint8_t *src)
{
    kvd_store_t *st = store_open_disk(dir);
    if (st == NULL) {
        return 1;
    }
    kvd_namespace_t ns;
    memset(ns.bytes, 2, sizeof ns.bytes);
    kvd_block_hash_t *h = calloc(DISK_OBJECTS, sizeof *h);
    kvd_store_reservation_t *r = calloc(DISK_OBJECTS, sizeof *r);
    kvd_store_key_t *keys = calloc(DISK_OBJECTS, sizeof *keys);
    for (uint32_t i = 0; i < DISK_OBJECTS; i++) {
        h[i] = hash_of(7, i);
        keys[i].ns = ns;
        keys[i].hash = h[i];
    }
    double t0 = now_s();
    uint32_t batch = src != NULL ? DISK_BATCH : DISK_OBJECTS;
    int bad = 0;
    for (uint32_t i = 0; bad == 0 && i < DISK_OBJECTS; i += batch) {
        uint32_t n = DISK_OBJECTS - i < batch ? DISK_OBJECTS - i : batch;
        bad = disk_fill(st, &ns, h, r, i, n, src);
        if (bad == 0 && src == NULL) {
            t0 = now_s(); /* filled before the clock, as fio's buffers */
        }
        if (bad == 0) {
            (void)kvd_store_commit(st, keys + i, n, NULL);
        }
    }
    kvd_status_t s = bad != 0 ? KVD_ERR_STATE : kvd_store_flush(st, -1);
    double t1 = now_s();
    kvd_store_stats_t stats;
    (void)kvd_store_stats(st, &stats);
    kvd_store_close(st);
    free(keys);
    free(r);
    free(h);
    if (s != KVD_OK || stats.disk.objects != DISK_OBJECTS) {
        fprintf(stderr, "bench_store: write-through: %s, %llu on disk\n",
                kvd_status_str(s), (unsigned long long)stats.disk.objects);
        return 1;
    }
    *bytes_per_s = (double)DISK_OBJECTS * OBJ_BYTES / (t1 - t0);
    return 0;
}

/* Reads every object back after a reopen; with `copy_out`, each object is
 * also copied there (object i at i * OBJ_BYTES) as its completion arrives,
 * inside the timed part, as a caller that wants the bytes would. `src`:
 * what store_disk_write copied in (NULL: its fill pattern), whose last
 * byte of each object is checked after the clock stops. */
static int store_disk_read(const char *dir, double *bytes_per_s,
                           uint8_t *copy_out, const uint8_t *src)
{
    kvd_store_t *st = store_open_disk(dir);
    if (st == NULL) {
        return 1;
    }
    kvd_namespace_t ns;
    memset(ns.bytes, 2, sizeof ns.bytes);
    kvd_block_hash_t *h = calloc(DISK_OBJECTS, sizeof *h);
    kvd_store_lease_t *l = calloc(DISK_OBJECTS, sizeof *l);
    kvd_store_get_t *g = calloc(DISK_OBJECTS, sizeof *g);
    kvd_store_completion_t *c = calloc(DISK_OBJECTS, sizeof *c);
    for (uint32_t i = 0; i < DISK_OBJECTS; i++) {
        h[i] = hash_of(7, i);
    }
    size_t m = 0, accepted = 0, got = 0, bad = 0;
    double t0 = now_s();
    (void)kvd_store_lookup(st, &ns, h, DISK_OBJECTS, l, &m);
    for (size_t i = 0; i < m; i++) {
        g[i].lease = l[i];
        g[i].user_data = i;
    }
    (void)kvd_store_get_submit(st, g, m, &accepted);
    while (got < accepted) {
        (void)kvd_store_wait(st, 10000);
        size_t n = kvd_store_poll(st, c + got, DISK_OBJECTS - got);
        for (size_t i = got; copy_out != NULL && i < got + n; i++) {
            const void *p =
                kvd_store_arena_ptr(st, c[i].lease.arena_offset, OBJ_BYTES);
            if (c[i].status == KVD_OK && p != NULL) {
                memcpy(copy_out + c[i].user_data * OBJ_BYTES, p, OBJ_BYTES);
            }
        }
        got += n;
    }
    double t1 = now_s();
    for (size_t i = 0; i < got; i++) {
        const uint8_t *p =
            kvd_store_arena_ptr(st, c[i].lease.arena_offset, OBJ_BYTES);
        uint64_t k = c[i].user_data;
        uint8_t want =
            src != NULL
                ? src[(size_t)(k % ARENA_OBJECTS) * OBJ_BYTES + OBJ_BYTES - 1]
                : (uint8_t)(k * 7 + 1);
        bad += c[i].status != KVD_OK || p == NULL || p[OBJ_BYTES - 1] != want;
        l[i] = c[i].lease;
    }
    (void)kvd_store_release(st, l, got);
    kvd_store_close(st);
    free(c);
    free(g);
    free(l);
    free(h);
    if (m != DISK_OBJECTS || accepted != m || bad != 0) {
        fprintf(stderr,
                "bench_store: read back %zu of %u (accepted %zu, bad %zu)\n", m,
                DISK_OBJECTS, accepted, bad);
        return 1;
    }
    *bytes_per_s = (double)DISK_OBJECTS * OBJ_BYTES / (t1 - t0);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void rm_store_dir(const char *dir)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "bench_store: could not remove %s\n", dir);
    }
}

static int bench_nvme(double *fio_write_out)
{
    const char *base = getenv("KVDEPOT_BENCH_DIR");
    char root[512], dir[600], fio_file[600];
    snprintf(root, sizeof root, "%s/kvd_bench_store_XXXXXX",
             base != NULL && base[0] != '\0' ? base : "/var/tmp");
    if (mkdtemp(root) == NULL) {
        fprintf(stderr, "bench_store: mkdtemp %s: %s\n", root, strerror(errno));
        return 1;
    }
    snprintf(fio_file, sizeof fio_file, "%s/fio.dat", root);
    /* The disk's speed drifts (a virtual disk shares its host): each pass
     * runs fio and the store back to back, and the headline is the median
     * of the per-pass ratios. */
    double rw[NVME_PASSES], rr[NVME_PASSES], fw = 0;
    for (int rep = 0; rep < NVME_PASSES; rep++) {
        snprintf(dir, sizeof dir, "%s/store", root);
        double w = 0, r = 0;
        double a = fio_run(fio_file, "write");
        double b = fio_run(fio_file, "read");
        unlink(fio_file);
        if (store_disk_write(dir, &w, NULL) != 0 ||
            store_disk_read(dir, &r, NULL, NULL) != 0 || a <= 0 || b <= 0) {
            fprintf(stderr, "bench_store: NVMe part failed (fio %s)\n",
                    a <= 0 || b <= 0 ? "failed or missing" : "ok");
            rm_store_dir(root);
            return 1;
        }
        rm_store_dir(dir);
        printf("NVMe, %u x 2 MiB, QD " QUEUE_DEPTH
               ", pass %d: store write %.2f GB/s read %.2f GB/s; fio write "
               "%.2f GB/s read %.2f GB/s\n",
               DISK_OBJECTS, rep + 1, w / 1e9, r / 1e9, a / 1e9, b / 1e9);
        rw[rep] = w / a;
        rr[rep] = r / b;
        fw = a > fw ? a : fw;
    }
    double sw = median(rw, NVME_PASSES), sr = median(rr, NVME_PASSES);
    rm_store_dir(root);
    headline("nvme_write_vs_fio", sw, "target >= 0.9");
    headline("nvme_read_vs_fio", sr, "target >= 0.9");
    *fio_write_out = fw;
    return 0;
}

/* ---- the figures bench/peers/run.py sets beside LMCache's --------------- */

/* Arena store (reserve, copy in, commit) and retrieve (lookup, copy out to
 * the caller's buffer, release) of ARENA_OBJECTS distinct objects, timed
 * apart; bytes per second of the pass. */
static int peers_arena_pass(kvd_store_t *st, uint32_t pass, const uint8_t *src,
                            uint8_t *dst, double *store_bps,
                            double *retrieve_bps)
{
    kvd_namespace_t ns;
    memset(ns.bytes, 4, sizeof ns.bytes);
    unsigned sink = 0;
    double t0 = now_s();
    if (arena_put_all(st, &ns, pass, src) != 0) {
        return 1;
    }
    double t1 = now_s();
    if (arena_get_all(st, &ns, pass, dst, OBJ_BYTES, &sink) != 0) {
        return 1;
    }
    double t2 = now_s();
    arena_delete_all(st, &ns, pass);
    double bytes = (double)ARENA_OBJECTS * OBJ_BYTES;
    *store_bps = bytes / (t1 - t0);
    *retrieve_bps = bytes / (t2 - t1);
    return memcmp(src, dst, (size_t)ARENA_OBJECTS * OBJ_BYTES) != 0;
}

/* The disk objects read back as store_disk_write copied them from src. */
static int peers_disk_check(const uint8_t *dst, const uint8_t *src)
{
    for (uint32_t i = 0; i < DISK_OBJECTS; i++) {
        if (memcmp(dst + (size_t)i * OBJ_BYTES,
                   src + (size_t)(i % ARENA_OBJECTS) * OBJ_BYTES,
                   OBJ_BYTES) != 0) {
            return 1;
        }
    }
    return 0;
}

/* `bench_store --peers`: the same objects as LMCache's run in
 * bench/peers/run.py, PEERS_PASSES passes, medians printed as one JSON line
 * (bytes per second), with fio on the same disk as the device's ceiling. */
#define PEERS_PASSES 3
static int bench_peers(void)
{
    static const char *const kv[] = {
        "store.arena_size",      "640m", "store.arena_chunk",    "64m",
        "store.arena_hugepages", "auto", "store.arena_prefault", "true"};
    const char *base = getenv("KVDEPOT_BENCH_DIR");
    char root[512], dir[600];
    snprintf(root, sizeof root, "%s/kvd_bench_peers_XXXXXX",
             base != NULL && base[0] != '\0' ? base : "/var/tmp");
    size_t arena_bytes = (size_t)ARENA_OBJECTS * OBJ_BYTES;
    size_t disk_bytes = (size_t)DISK_OBJECTS * OBJ_BYTES;
    kvd_store_t *st = store_open(kv, sizeof kv / sizeof kv[0]);
    uint8_t *src = malloc(arena_bytes), *dst = malloc(disk_bytes);
    if (st == NULL || src == NULL || dst == NULL || mkdtemp(root) == NULL) {
        fprintf(stderr, "bench_store: peers setup failed\n");
        kvd_store_close(st);
        free(dst);
        free(src);
        return 1;
    }
    snprintf(dir, sizeof dir, "%s/store", root);
    for (size_t i = 0; i < arena_bytes; i++) {
        src[i] = (uint8_t)(i * 2654435761u >> 13) | 1;
    }
    memset(dst, 0, disk_bytes);
    double as[PEERS_PASSES], ar[PEERS_PASSES], dw[PEERS_PASSES],
        dr[PEERS_PASSES], fw[PEERS_PASSES], fr[PEERS_PASSES];
    char fio_file[600];
    snprintf(fio_file, sizeof fio_file, "%s/fio.dat", root);
    /* The arena passes first, after one untimed pass as LMCache's side
     * has (first touches of the pages are not the store's), then the disk
     * passes: on this VM the first memory pass after a disk pass runs
     * at half speed, whoever makes it. */
    double warm_s, warm_r;
    int rc = peers_arena_pass(st, PEERS_PASSES, src, dst, &warm_s, &warm_r);
    for (uint32_t p = 0; p < PEERS_PASSES && rc == 0; p++) {
        rc = peers_arena_pass(st, p, src, dst, &as[p], &ar[p]);
    }
    for (uint32_t p = 0; p < PEERS_PASSES && rc == 0; p++) {
        memset(dst, 0, disk_bytes);
        fw[p] = fio_run(fio_file, "write");
        fr[p] = fio_run(fio_file, "read");
        unlink(fio_file);
        rc = fw[p] <= 0 || fr[p] <= 0 ||
             store_disk_write(dir, &dw[p], src) != 0 ||
             store_disk_read(dir, &dr[p], dst, src) != 0 ||
             peers_disk_check(dst, src) != 0;
        rm_store_dir(dir);
    }
    if (rc != 0) {
        fprintf(stderr, "bench_store: a peers pass failed\n");
    }
    kvd_store_close(st);
    rm_store_dir(root);
    free(dst);
    free(src);
    if (rc != 0) {
        return rc;
    }
    printf("PEERS {\"objects\": [%u, %u], \"size\": %u, \"passes\": %d, "
           "\"arena_store\": %.0f, \"arena_retrieve\": %.0f, "
           "\"disk_store\": %.0f, \"disk_retrieve\": %.0f, "
           "\"fio_write\": %.0f, \"fio_read\": %.0f}\n",
           ARENA_OBJECTS, DISK_OBJECTS, (unsigned)OBJ_BYTES, PEERS_PASSES,
           median(as, PEERS_PASSES), median(ar, PEERS_PASSES),
           median(dw, PEERS_PASSES), median(dr, PEERS_PASSES),
           median(fw, PEERS_PASSES), median(fr, PEERS_PASSES));
    return 0;
}

/* ---- restart time against index size ------------------------------------ */

#define RESTART_OBJ 4096u

static kvd_store_t *store_open_restart(const char *dir, uint32_t n)
{
    char disk[32], maxo[32];
    uint64_t bytes = (uint64_t)n * RESTART_OBJ * 3 / 2;
    snprintf(disk, sizeof disk, "%llum",
             (unsigned long long)(bytes >> 20 > 64 ? (bytes >> 20) + 64 : 128));
    snprintf(maxo, sizeof maxo, "%u", n * 2);
    const char *kv[] = {
        "store.arena_size",     "256m",  "store.arena_chunk",      "4m",
        "store.arena_prefault", "false", "store.disk_path",        dir,
        "store.disk_size",      disk,    "store.disk_max_objects", maxo,
        "store.l1_max_objects", maxo,    "store.disk_write",       "through",
        "store.disk_admission", "all"};
    return store_open(kv, sizeof kv / sizeof kv[0]);
}

/* n objects of RESTART_OBJ bytes written through to disk in runs of 256,
 * then the store closed; 0 on success. */
static int restart_fill(const char *dir, uint32_t n)
{
    kvd_store_t *st = store_open_restart(dir, n);
    if (st == NULL) {
        return 1;
    }
    kvd_namespace_t ns;
    memset(ns.bytes, 6, sizeof ns.bytes);
    kvd_block_hash_t h[256];
    kvd_store_reservation_t r[256];
    kvd_store_key_t keys[256];
    int rc = 0;
    for (uint32_t i = 0; i < n && rc == 0; i += 256) {
        uint32_t k = n - i < 256 ? n - i : 256;
        for (uint32_t j = 0; j < k; j++) {
            h[j] = hash_of(9, i + j);
            keys[j].ns = ns;
            keys[j].hash = h[j];
        }
        (void)kvd_store_reserve(st, &ns, h, k, RESTART_OBJ, 0, r);
        for (uint32_t j = 0; j < k && rc == 0; j++) {
            rc = r[j].status != KVD_OK;
            if (rc == 0) {
                memset(kvd_store_arena_ptr(st, r[j].arena_offset, RESTART_OBJ),
                       (int)(i + j), RESTART_OBJ);
            }
        }
        rc = rc != 0 || kvd_store_commit(st, keys, k, NULL) != KVD_OK;
    }
    rc = rc != 0 || kvd_store_flush(st, -1) != KVD_OK;
    kvd_store_close(st);
    return rc;
}

/* `bench_store --sweep-restart`: how long a store with n objects on its
 * NVMe tier takes to open (the index and the tier's files), and its first
 * lookup of all n keys, for n = 1k .. 64k. */
static int bench_restart_sweep(void)
{
    const char *base = getenv("KVDEPOT_BENCH_DIR");
    char root[512], dir[600];
    snprintf(root, sizeof root, "%s/kvd_bench_restart_XXXXXX",
             base != NULL && base[0] != '\0' ? base : "/var/tmp");
    if (mkdtemp(root) == NULL) {
        return 1;
    }
    int rc = 0;
    for (uint32_t n = 1024; n <= 65536 && rc == 0; n *= 4) {
        snprintf(dir, sizeof dir, "%s/store-%u", root, n);
        double opens[3], looks[3];
        rc = restart_fill(dir, n);
        for (int p = 0; p < 3 && rc == 0; p++) {
            double t0 = now_s();
            kvd_store_t *st = store_open_restart(dir, n);
            double t1 = now_s();
            if (st == NULL) {
                rc = 1;
                break;
            }
            kvd_namespace_t ns;
            memset(ns.bytes, 6, sizeof ns.bytes);
            size_t found = 0;
            for (uint32_t i = 0; i < n; i++) {
                kvd_block_hash_t h = hash_of(9, i);
                kvd_store_lease_t l;
                size_t m = 0;
                if (kvd_store_lookup(st, &ns, &h, 1, &l, &m) == KVD_OK &&
                    m == 1) {
                    found++;
                    (void)kvd_store_release(st, &l, 1);
                }
            }
            double t2 = now_s();
            kvd_store_close(st);
            opens[p] = t1 - t0;
            looks[p] = t2 - t1;
            rc = found != n;
            if (rc != 0) {
                fprintf(stderr, "bench_store: restart: %zu of %u found\n",
                        found, n);
            }
        }
        if (rc == 0) {
            double open_med = median(opens, 3); /* sorts opens */
            printf("SWEEP {\"objects\": %u, \"object_bytes\": %u, "
                   "\"passes\": 3, \"open_s\": %.4f, \"open_min_s\": %.4f, "
                   "\"open_max_s\": %.4f, \"lookup_all_s\": %.4f}\n",
                   n, RESTART_OBJ, open_med, opens[0], opens[2],
                   median(looks, 3));
            fflush(stdout);
        }
        rm_store_dir(dir);
    }
    rm_store_dir(root);
    return rc;
}

/* ---- index -------------------------------------------------------------- */

static int bench_index(double fio_write_bytes_per_s)
{
    char dir[512];
    const char *base = getenv("KVDEPOT_BENCH_DIR");
    snprintf(dir, sizeof dir, "%s/kvd_bench_index_XXXXXX",
             base != NULL && base[0] != '\0' ? base : "/var/tmp");
    kvd_index_t *idx = NULL;
    if (mkdtemp(dir) == NULL || kvd_index_open(dir, NULL, &idx) != KVD_OK) {
        fprintf(stderr, "bench_store: index open failed\n");
        return 1;
    }
    kvd_namespace_t ns;
    memset(ns.bytes, 3, sizeof ns.bytes);
    kvd_index_entry_t batch[INDEX_BATCH];
    memset(batch, 0, sizeof batch);
    double t0 = now_s();
    uint64_t puts = 0;
    for (uint32_t c = 0; c < INDEX_CHAINS; c++) {
        for (uint32_t i = 0; i < CHAIN_LEN; i += INDEX_BATCH) {
            for (uint32_t k = 0; k < INDEX_BATCH; k++) {
                kvd_index_entry_t *e = &batch[k];
                e->key.ns = ns;
                e->key.hash = hash_of(c, i + k);
                e->tier = KVD_INDEX_TIER_DISK;
                e->offset = (uint64_t)(c * CHAIN_LEN + i + k) * OBJ_BYTES;
                e->size_bytes = OBJ_BYTES;
                e->checksum = i + k;
            }
            if (kvd_index_put_batch(idx, batch, INDEX_BATCH) != KVD_OK) {
                fprintf(stderr, "bench_store: index put failed\n");
                return 1;
            }
            puts += INDEX_BATCH;
        }
    }
    double t1 = now_s();
    kvd_block_hash_t chain[CHAIN_LEN];
    uint64_t lookups = 0;
    double t2 = now_s(), t3 = t2;
    while (t3 - t2 < 1.0) {
        uint32_t c = (uint32_t)(lookups % INDEX_CHAINS);
        for (uint32_t i = 0; i < CHAIN_LEN; i++) {
            chain[i] = hash_of(c, i);
        }
        size_t m = 0;
        if (kvd_index_lookup_prefix(idx, &ns, chain, CHAIN_LEN, NULL, &m) !=
                KVD_OK ||
            m != CHAIN_LEN) {
            fprintf(stderr, "bench_store: index lookup failed\n");
            return 1;
        }
        lookups++;
        t3 = now_s();
    }
    kvd_index_close(idx);
    rm_store_dir(dir);
    double commits = (double)puts / (t1 - t0);
    double chains = (double)lookups / (t3 - t2);
    double disk_objects = fio_write_bytes_per_s / (double)OBJ_BYTES;
    printf("index: %.0f records/s committed in batches of %u (%.0f "
           "transactions/s); %.0f lookups/s of %u-key chains (%.2f M keys/s); "
           "the disk writes %.0f 2 MiB objects/s\n",
           commits, INDEX_BATCH, commits / INDEX_BATCH, chains, CHAIN_LEN,
           chains * CHAIN_LEN / 1e6, disk_objects);
    char target[64];
    snprintf(target, sizeof target, "target >= %.0f: fio's objects/s",
             disk_objects);
    headline("index_commits_per_s", commits, target);
    headline("index_lookups_512_chains_per_s", chains,
             "no target: LMDB read rate");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--peers") == 0) {
        return bench_peers();
    }
    if (argc == 2 && strcmp(argv[1], "--sweep") == 0) {
        return bench_arena_sweep();
    }
    if (argc == 2 && strcmp(argv[1], "--sweep-restart") == 0) {
        return bench_restart_sweep();
    }
    if (argc == 2 && strcmp(argv[1], "--sweep-pressure") == 0) {
        return bench_pressure_sweep();
    }
    if (argc != 1) {
        fprintf(stderr,
                "usage: bench_store [--peers | --sweep | --sweep-restart | "
                "--sweep-pressure]\n");
        return 2;
    }
    double fio_write = 0;
    int rc = bench_arena();
    if (rc == 0) {
        rc = bench_nvme(&fio_write);
    }
    if (rc == 0) {
        rc = bench_index(fio_write);
    }
    printf("\n");
    for (size_t i = 0; i < num_headlines; i++) {
        printf("%s\n", headlines[i]);
    }
    return rc;
}
