/*
 * Power loss under an embedded store with a disk tier (the threads
 * engine, which the model sees; io_uring it would not): SIGKILL alone keeps the
 * page cache, so this test also drops what was not made durable. A writer child
 * (this program with
 * --writer, under the LD_PRELOAD model of tests/support/kvd_powercut.c)
 * saves objects (write-back and write-through, by turns), deletes the
 * oldest (so extents are reused) and flushes at random; the parent kills it at
 * a random moment, rewrites the store's files as a power loss could have left
 * them (kvd_powercut_cut: the last synced image plus a seeded random subset of
 * the later 4 KiB writes; unsynced file names may vanish), reopens the store
 * and checks:
 *   1. it opens;
 *   2. every object a returned flush covered is found, byte for byte;
 *   3. every object found at all has exactly the bytes saved under its key;
 *   4. no two index records share an extent's blocks.
 * KVD_POWERCUT_CUTS cuts (default 8), seeds from KVD_POWERCUT_SEED
 * (default: the time; printed, so a failure replays). Skipped (77) when
 * the model library is not built (KVDEPOT_POWERCUT_LIB).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvdepot/store.h"
#include "store/index.h"
#include "tests/integration/kvd_teststore_int.h"
#include "tests/support/kvd_powercut.h"
#include "tests/unit/kvd_testdir_int.h"

#define OBJ 65536u    /* 64 KiB */
#define WINDOW 160u   /* live objects per writer: more than the arena holds */
#define PER_GEN 4000u /* keys of one writer run, at most */

/* Opens the store on `disk` with store.disk_write=`write` ("back" or
 * "through"): the base of kvd_teststore_int.h with a 96 MiB disk tier, the
 * pread/pwrite engine (io_uring's writes are not seen by the model) and no
 * write-back at close (a cut is a cut). */
static kvd_status_t open_store(const char *disk, const char *write,
                               kvd_store_t **st)
{
    kvd_config_t *cfg = kvd_test_store_config(disk);
    static const char *const more[] = {
        "store.disk_size",  "96m", "store.disk_engine",        "threads",
        "store.disk_write", NULL,  "store.stop_flush_timeout", "0"};
    for (size_t i = 0; cfg != NULL && i < sizeof more / sizeof more[0];
         i += 2) {
        (void)kvd_config_set(cfg, more[i], more[i + 1] ? more[i + 1] : write);
    }
    return kvd_test_store_open_config(cfg, st);
}

static kvd_namespace_t test_ns(void)
{
    kvd_namespace_t ns;
    memset(ns.bytes, 0x5a, sizeof ns.bytes);
    return ns;
}

static kvd_store_key_t key_of(uint32_t i)
{
    kvd_store_key_t k = {.ns = test_ns()};
    memset(k.hash.bytes, 0x71, sizeof k.hash.bytes);
    memcpy(k.hash.bytes, &i, sizeof i);
    return k;
}

/* Object i's bytes: a function of i and the position, so any misplaced
 * 4 KiB page shows. */
static uint64_t word_of(uint32_t i, uint32_t w)
{
    uint64_t x = ((uint64_t)i << 32 | w) * 0x9e3779b97f4a7c15ull;
    return x ^ (x >> 29);
}

static kvd_status_t put_one(kvd_store_t *st, uint32_t i)
{
    kvd_store_key_t k = key_of(i);
    kvd_store_reservation_t r;
    kvd_status_t s = kvd_store_reserve(st, &k.ns, &k.hash, 1, OBJ, 0, &r);
    if (s != KVD_OK || r.status != KVD_OK) {
        return s != KVD_OK ? s : r.status;
    }
    uint64_t *p = kvd_store_arena_ptr(st, r.arena_offset, OBJ);
    for (uint32_t w = 0; w < OBJ / 8u; w++) {
        p[w] = word_of(i, w);
    }
    return kvd_store_commit(st, &k, 1, NULL);
}

/* KVD_OK with the right bytes, KVD_ERR_NOT_FOUND on a miss,
 * KVD_ERR_CORRUPT on other bytes. */
static kvd_status_t check_one(kvd_store_t *st, uint32_t i)
{
    kvd_store_key_t k = key_of(i);
    kvd_store_lease_t l;
    size_t m = 0;
    if (kvd_store_lookup(st, &k.ns, &k.hash, 1, &l, &m) != KVD_OK || m == 0) {
        return KVD_ERR_NOT_FOUND;
    }
    if (l.tier == KVD_STORE_TIER_DISK) {
        kvd_store_get_t g = {.lease = l, .user_data = i};
        size_t acc = 0, got = 0;
        kvd_store_completion_t c;
        kvd_status_t gs = kvd_store_get_submit(st, &g, 1, &acc);
        while (gs == KVD_OK && got == 0) {
            (void)kvd_store_wait(st, 1000);
            got = kvd_store_poll(st, &c, 1);
        }
        if (gs != KVD_OK || c.status != KVD_OK) {
            /* a record whose extent fails its checksum is dropped: a miss */
            return KVD_ERR_NOT_FOUND;
        }
        l = c.lease;
    }
    const uint64_t *p = kvd_store_arena_ptr(st, l.arena_offset, OBJ);
    kvd_status_t s = l.size_bytes == OBJ ? KVD_OK : KVD_ERR_CORRUPT;
    for (uint32_t w = 0; s == KVD_OK && w < OBJ / 8u; w++) {
        s = p != NULL && p[w] == word_of(i, w) ? KVD_OK : KVD_ERR_CORRUPT;
    }
    (void)kvd_store_release(st, &l, 1);
    return s;
}

/* ---- the writer (child, under the model) -------------------------------- */

/* Appends "<tag>[ a[ b]]\n" (tag "D", "I" or "A"). */
static void progress(int fd, char tag, int nums, uint32_t a, uint32_t b)
{
    char line[64];
    int n = nums == 0   ? snprintf(line, sizeof line, "%c\n", tag)
            : nums == 1 ? snprintf(line, sizeof line, "%c %u\n", tag, a)
                        : snprintf(line, sizeof line, "%c %u %u\n", tag, a, b);
    if (write(fd, line, (size_t)n) != n) {
        _exit(3);
    }
}

/* argv: --writer DISK PROGRESS FIRST OLD_LO OLD_HI SEED WRITE (back or
 * through: every other cut writes through, so that many extents and
 * records are in flight, unsynced, when the power goes). Deletes the keys
 * [OLD_LO, OLD_HI] the last writer left, then saves FIRST, FIRST+1, ...
 * deleting key i-WINDOW after saving i and flushing every 1..24 saves;
 * PROGRESS gets "D" once the old keys are being deleted, "I bound" before
 * saving keys up to bound, "X k" before deleting key k and "A lo hi" after
 * every flush that returned OK ([lo, hi] are then durable, until deleted).
 */
static int writer_main(char **argv)
{
    uint32_t first = (uint32_t)strtoul(argv[4], NULL, 10);
    uint32_t old_lo = (uint32_t)strtoul(argv[5], NULL, 10);
    uint32_t old_hi = (uint32_t)strtoul(argv[6], NULL, 10);
    uint64_t rng = strtoull(argv[7], NULL, 10) | 1u;
    int pfd = open(argv[3], O_WRONLY | O_APPEND | O_CREAT, 0600);
    kvd_store_t *st = NULL;
    if (pfd < 0 || open_store(argv[2], argv[8], &st) != KVD_OK) {
        return 2;
    }
    progress(pfd, 'D', 0, 0, 0);
    for (uint32_t i = old_lo; old_hi != 0 && i <= old_hi; i++) {
        kvd_store_key_t k = key_of(i);
        (void)kvd_store_delete(st, &k, 1, NULL);
    }
    uint32_t next_flush = 1 + (uint32_t)(kvd_powercut_rand(&rng) % 24u);
    for (uint32_t i = first; i < first + PER_GEN; i++) {
        if ((i - first) % 64u == 0) {
            progress(pfd, 'I', 1, i + 63u, 0);
        }
        if (put_one(st, i) != KVD_OK) {
            return 4;
        }
        if (i >= first + WINDOW) {
            progress(pfd, 'X', 1, i - WINDOW, 0);
            kvd_store_key_t k = key_of(i - WINDOW);
            (void)kvd_store_delete(st, &k, 1, NULL);
        }
        if (--next_flush == 0) {
            next_flush = 1 + (uint32_t)(kvd_powercut_rand(&rng) % 24u);
            if (kvd_store_flush(st, 10000) == KVD_OK) {
                uint32_t lo = i >= first + WINDOW ? i - WINDOW + 1 : first;
                progress(pfd, 'A', 2, lo, i);
            }
        }
    }
    kvd_store_close(st);
    return 0;
}

/* ---- the parent ---------------------------------------------------------- */

typedef struct cut_totals {
    uint64_t cuts, flushed_checked, lost, wrong, found, overlaps, writes,
        pages_dropped, names_lost, open_failures;
} cut_totals_t;

/* No two disk records overlap (sorted by file, offset). */
static int cmp_extent(const void *a, const void *b)
{
    const kvd_index_entry_t *x = a, *y = b;
    if (x->file_id != y->file_id) {
        return x->file_id < y->file_id ? -1 : 1;
    }
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static uint64_t count_overlaps(const char *disk)
{
    kvd_index_t *idx = NULL;
    assert_int_equal(kvd_index_open(disk, NULL, &idx), KVD_OK);
    size_t cap = 4096, n = 0, got = 0;
    kvd_index_entry_t *all = calloc(cap, sizeof *all);
    assert_non_null(all);
    do {
        if (n + 512 > cap) {
            cap *= 2;
            all = realloc(all, cap * sizeof *all);
            assert_non_null(all);
        }
        assert_int_equal(kvd_index_scan(idx, n > 0 ? &all[n - 1].key : NULL,
                                        all + n, 512, &got, NULL),
                         KVD_OK);
        n += got;
    } while (got == 512);
    kvd_index_close(idx);
    qsort(all, n, sizeof *all, cmp_extent);
    uint64_t bad = 0;
    for (size_t i = 1; i < n; i++) {
        const kvd_index_entry_t *a = &all[i - 1], *b = &all[i];
        if (a->tier == KVD_INDEX_TIER_DISK && b->tier == KVD_INDEX_TIER_DISK &&
            a->file_id == b->file_id && a->offset + a->size_bytes > b->offset) {
            bad++;
        }
    }
    free(all);
    return bad;
}

typedef struct gen_state {
    uint32_t next_first, old_lo, old_hi; /* for the next writer */
    uint32_t need_lo, need_hi;           /* durable by a returned flush */
} gen_state_t;

/* Reads one writer's progress file into `g`: what must be found now, what
 * the next writer deletes first. A writer that never got to its deletes
 * leaves `g` as it was. */
static void read_progress(const char *path, uint32_t first, gen_state_t *g)
{
    FILE *f = fopen(path, "r");
    char line[64];
    bool deleting = false, acked = false;
    uint32_t lo = 0, hi = 0, bound = 0, gone = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        if (line[0] == 'D') {
            deleting = true;
        } else if (sscanf(line, "I %u", &hi) == 1) {
            bound = hi;
        } else if (sscanf(line, "A %u %u", &lo, &hi) == 2) {
            acked = true;
            g->need_lo = lo;
            g->need_hi = hi;
        } else if (sscanf(line, "X %u", &hi) == 1) {
            gone = hi; /* deleted from here down: no longer required */
        }
    }
    if (acked && gone >= g->need_lo) {
        g->need_lo = gone + 1;
        if (g->need_lo > g->need_hi) {
            g->need_lo = g->need_hi = 0;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    (void)unlink(path);
    if (!deleting) {
        return;
    }
    if (!acked) {
        g->need_lo = g->need_hi = 0; /* the old keys may be deleted */
    }
    g->old_lo = first;
    g->old_hi = bound; /* 0: nothing saved */
}

/* Whether the writer has logged a returned flush. */
static bool has_ack(const char *prog)
{
    FILE *f = fopen(prog, "r");
    char line[64];
    bool yes = false;
    while (f != NULL && !yes && fgets(line, sizeof line, f) != NULL) {
        yes = line[0] == 'A';
    }
    if (f != NULL) {
        fclose(f);
    }
    return yes;
}

/* One writer run, killed and cut; then the checks (totals into `t`). */
static void one_cut(const kvd_test_dir_t *d, uint32_t gen, uint64_t seed,
                    bool lose_names, gen_state_t *g, cut_totals_t *t)
{
    char disk[300], shadow[300], prog[300], a[6][32];
    snprintf(disk, sizeof disk, "%s/disk", d->path);
    snprintf(shadow, sizeof shadow, "%s/shadow", d->path);
    snprintf(prog, sizeof prog, "%s/progress", d->path);
    uint32_t first = g->next_first;
    snprintf(a[0], sizeof a[0], "%u", first);
    snprintf(a[1], sizeof a[1], "%u", g->old_lo);
    snprintf(a[2], sizeof a[2], "%u", g->old_hi);
    snprintf(a[3], sizeof a[3], "%llu", (unsigned long long)seed);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        const char *lib = getenv("KVDEPOT_POWERCUT_LIB");
        setenv("LD_PRELOAD", lib != NULL ? lib : "", 1);
        setenv("KVD_POWERCUT_DIR", disk, 1);
        setenv("KVD_POWERCUT_SHADOW", shadow, 1);
        execl("/proc/self/exe", "writer", "--writer", disk, prog, a[0], a[1],
              a[2], a[3], gen % 2 == 0 ? "back" : "through", (char *)NULL);
        _exit(127);
    }
    /* Kill 0-600 ms after the first flush returned (or after 10 s). */
    for (int w = 0; w < 1000 && !has_ack(prog); w++) {
        struct timespec poll = {0, 10000000L};
        nanosleep(&poll, NULL);
    }
    uint64_t rng = seed * 31u + gen;
    struct timespec ts = {0, (long)(kvd_powercut_rand(&rng) % 600) * 1000000L};
    nanosleep(&ts, NULL);
    (void)kill(pid, SIGKILL);
    int wst = 0;
    assert_int_equal(waitpid(pid, &wst, 0), pid);
    kvd_powercut_stats_t cs;
    assert_int_equal(kvd_powercut_cut(disk, shadow, seed, lose_names, &cs), 0);
    read_progress(prog, first, g);
    g->next_first = first + PER_GEN;
    kvd_store_t *st = NULL;
    kvd_status_t os = open_store(disk, "back", &st);
    if (os != KVD_OK) {
        t->open_failures++;
        fprintf(stderr, "cut %u (seed %llu): the store does not open: %s\n",
                gen, (unsigned long long)seed, kvd_status_str(os));
        return;
    }
    for (uint32_t i = g->need_lo; g->need_hi != 0 && i <= g->need_hi; i++) {
        kvd_status_t s = check_one(st, i);
        t->flushed_checked++;
        if (s != KVD_OK) {
            t->lost += s == KVD_ERR_NOT_FOUND;
            t->wrong += s == KVD_ERR_CORRUPT;
            fprintf(stderr, "cut %u (seed %llu): flushed object %u: %s\n", gen,
                    (unsigned long long)seed, i, kvd_status_str(s));
        }
    }
    /* Everything this writer may have saved. */
    for (uint32_t i = first; i < first + PER_GEN; i++) {
        kvd_status_t s = check_one(st, i);
        t->found += s == KVD_OK;
        if (s == KVD_ERR_CORRUPT) {
            t->wrong++;
            fprintf(stderr, "cut %u (seed %llu): object %u: wrong bytes\n", gen,
                    (unsigned long long)seed, i);
        }
    }
    kvd_store_close(st);
    uint64_t ov = count_overlaps(disk);
    if (ov != 0) {
        fprintf(stderr, "cut %u (seed %llu): %llu overlapping extents\n", gen,
                (unsigned long long)seed, (unsigned long long)ov);
    }
    t->overlaps += ov;
    t->cuts++;
    t->writes += cs.writes;
    t->pages_dropped += cs.pages_dropped;
    t->names_lost += cs.names_lost;
    /* The reopened store's own writes are the new durable state. */
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir '%s'", shadow, shadow);
    assert_int_equal(system(cmd), 0);
}

/* Makes <tmp>/disk and <tmp>/shadow; false when the model is not built. */
static bool setup_dirs(kvd_test_dir_t *d)
{
    const char *lib = getenv("KVDEPOT_POWERCUT_LIB");
    if (lib == NULL || access(lib, R_OK) != 0) {
        return false;
    }
    kvd_test_dir_make(d, "powercut");
    char p[300];
    snprintf(p, sizeof p, "%s/disk", d->path);
    assert_int_equal(mkdir(p, 0700), 0);
    snprintf(p, sizeof p, "%s/shadow", d->path);
    assert_int_equal(mkdir(p, 0700), 0);
    return true;
}

static void print_totals(const cut_totals_t *t)
{
    printf(
        "# %llu cuts: %llu unsynced writes, %llu page versions dropped, "
        "%llu file names lost; %llu flushed objects checked, %llu lost, "
        "%llu wrong bytes, %llu found in all, %llu overlapping extents, "
        "%llu failed opens\n",
        (unsigned long long)t->cuts, (unsigned long long)t->writes,
        (unsigned long long)t->pages_dropped, (unsigned long long)t->names_lost,
        (unsigned long long)t->flushed_checked, (unsigned long long)t->lost,
        (unsigned long long)t->wrong, (unsigned long long)t->found,
        (unsigned long long)t->overlaps, (unsigned long long)t->open_failures);
}

static void assert_nothing_lost(const cut_totals_t *t)
{
    assert_int_equal(t->open_failures, 0);
    assert_int_equal(t->lost, 0);
    assert_int_equal(t->wrong, 0);
    assert_int_equal(t->overlaps, 0);
}

/* The first power loss after a store created its files, with every name
 * not made durable lost: the data files and the index must still be
 * there. Before the store fsynced its directory at open, the cut removed
 * them and every flushed object with them. */
static void test_power_cut_keeps_new_files(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    if (!setup_dirs(&d)) {
        skip();
    }
    gen_state_t g = {.next_first = 1};
    cut_totals_t t = {0};
    one_cut(&d, 0, 42, true, &g, &t);
    print_totals(&t);
    assert_int_equal(t.names_lost, 0);
    assert_true(t.flushed_checked > 0);
    assert_nothing_lost(&t);
    kvd_test_dir_remove(&d);
}

/* Random cuts on one directory, each after a writer run (see the top). */
static void test_power_cuts(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    if (!setup_dirs(&d)) {
        skip();
    }
    const char *e = getenv("KVD_POWERCUT_CUTS");
    uint32_t cuts = e != NULL ? (uint32_t)strtoul(e, NULL, 10) : 8u;
    e = getenv("KVD_POWERCUT_SEED");
    uint64_t seed = e != NULL ? strtoull(e, NULL, 10) : (uint64_t)time(NULL);
    printf("# power cuts: %u, seed %llu (KVD_POWERCUT_SEED replays)\n", cuts,
           (unsigned long long)seed);
    gen_state_t g = {.next_first = 1};
    cut_totals_t t = {0};
    for (uint32_t c = 0; c < cuts; c++) {
        one_cut(&d, c, seed + c, false, &g, &t);
    }
    print_totals(&t);
    assert_nothing_lost(&t);
    kvd_test_dir_remove(&d);
}

int main(int argc, char **argv)
{
    if (argc == 9 && strcmp(argv[1], "--writer") == 0) {
        return writer_main(argv);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_power_cut_keeps_new_files),
        cmocka_unit_test(test_power_cuts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
