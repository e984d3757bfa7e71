/*
 * The store over both tiers (include/kvdepot/store.h), with real files:
 * objects written back past the arena's capacity read back byte-exact
 * through NVMe with both I/O engines; write-through survives a reopen; a
 * child killed with SIGKILL while writing leaves only whole, checksummed
 * objects and keeps every flushed one; bytes damaged on disk fail their
 * checksum and are dropped; arena bytes overwritten after a verified
 * commit are never persisted; injected EIO/ENOSPC lose the object, never
 * the index or an arena slot; a full disk evicts its oldest objects; the
 * admission filter keeps objects seen once off the disk; writers and
 * readers run concurrently (TSan build).
 *
 * Threads and the forked child never call cmocka asserts; they record
 * failures that the test thread checks.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/failpoint_int.h"
#include "common/hash_int.h"
#include "tests/unit/kvd_testdir_int.h"
#include "kvdepot/store.h"
#include "store/engine.h"
#include "tests/integration/kvd_teststore_int.h"

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define TEST_SANITIZED 1
#endif
#endif
#ifdef TEST_SANITIZED
#define SCALE 1
#else
#define SCALE 2
#endif

#define KIB 1024ull
#define OBJ (256 * KIB)

/* Opens a store in `dir` (the base of kvd_teststore_int.h, syncing at
 * once) with the given extra settings (pairs of strings, NULL-terminated). */
static kvd_status_t store_open_kv(const kvd_test_dir_t *d, kvd_store_t **st,
                                  ...)
{
    kvd_config_t *cfg = kvd_test_store_config(d->path);
    if (cfg != NULL) {
        (void)kvd_config_set(cfg, "store.sync_interval", "0");
    }
    va_list ap;
    va_start(ap, st);
    for (;;) {
        const char *k = va_arg(ap, const char *);
        if (k == NULL) {
            break;
        }
        const char *v = va_arg(ap, const char *);
        if (cfg != NULL) {
            (void)kvd_config_set(cfg, k, v);
        }
    }
    va_end(ap);
    return kvd_test_store_open_config(cfg, st);
}

static kvd_namespace_t test_ns(void)
{
    kvd_namespace_t ns;
    memset(ns.bytes, 0x42, sizeof ns.bytes);
    return ns;
}

static kvd_block_hash_t hash_of(uint32_t i)
{
    kvd_block_hash_t h;
    memset(h.bytes, 0x17, sizeof h.bytes);
    memcpy(h.bytes, &i, sizeof i);
    return h;
}

static void fill(uint8_t *p, uint64_t len, uint32_t i)
{
    for (uint64_t k = 0; k < len; k += 8) {
        uint64_t v = ((uint64_t)i * 0x9e3779b97f4a7c15ull) ^ k;
        memcpy(p + k, &v, 8);
    }
}

static bool same(const uint8_t *p, uint64_t len, uint32_t i)
{
    for (uint64_t k = 0; k < len; k += 8) {
        uint64_t v = ((uint64_t)i * 0x9e3779b97f4a7c15ull) ^ k, got;
        memcpy(&got, p + k, 8);
        if (got != v) {
            return false;
        }
    }
    return true;
}

/* Reserve, fill, commit object i. Returns the reservation status. */
static kvd_status_t put_one(kvd_store_t *st, uint32_t i)
{
    kvd_namespace_t ns = test_ns();
    kvd_block_hash_t h = hash_of(i);
    kvd_store_reservation_t r;
    kvd_status_t s = kvd_store_reserve(st, &ns, &h, 1, OBJ, 0, &r);
    if (s != KVD_OK || r.status != KVD_OK) {
        return s != KVD_OK ? s : r.status;
    }
    fill(kvd_store_arena_ptr(st, r.arena_offset, OBJ), OBJ, i);
    kvd_store_key_t key = {ns, h};
    return kvd_store_commit(st, &key, 1, NULL);
}

/* Looks object i up, brings it into the arena if needed, checks its bytes
 * and releases it. KVD_ERR_NOT_FOUND on a miss, the get's status on a
 * failed get, KVD_ERR_CORRUPT on wrong bytes. `mu` serialises polling when
 * several threads call this. */
static kvd_status_t get_one(kvd_store_t *st, uint32_t i, pthread_mutex_t *mu,
                            uint32_t *tier_out)
{
    kvd_namespace_t ns = test_ns();
    kvd_block_hash_t h = hash_of(i);
    kvd_store_lease_t l;
    size_t m = 0;
    if (kvd_store_lookup(st, &ns, &h, 1, &l, &m) != KVD_OK) {
        return KVD_ERR_INTERNAL;
    }
    if (m == 0) {
        return KVD_ERR_NOT_FOUND;
    }
    if (tier_out != NULL) {
        *tier_out = l.tier;
    }
    if (l.tier == KVD_STORE_TIER_DISK) {
        kvd_store_get_t g = {.lease = l, .user_data = i};
        size_t acc = 0;
        if (mu != NULL) {
            pthread_mutex_lock(mu);
        }
        kvd_status_t s = kvd_store_get_submit(st, &g, 1, &acc);
        kvd_store_completion_t c;
        size_t got = 0;
        while (s == KVD_OK && got == 0) {
            (void)kvd_store_wait(st, 1000);
            got = kvd_store_poll(st, &c, 1);
        }
        if (mu != NULL) {
            pthread_mutex_unlock(mu);
        }
        if (s != KVD_OK || c.user_data != i) {
            return KVD_ERR_INTERNAL;
        }
        if (c.status != KVD_OK) {
            return c.status;
        }
        l = c.lease;
    }
    const uint8_t *p = kvd_store_arena_ptr(st, l.arena_offset, OBJ);
    kvd_status_t s = p != NULL && same(p, OBJ, i) ? KVD_OK : KVD_ERR_CORRUPT;
    if (kvd_store_release(st, &l, 1) != KVD_OK) {
        s = KVD_ERR_INTERNAL;
    }
    return s;
}

static kvd_store_stats_t stats_of(kvd_store_t *st)
{
    kvd_store_stats_t s;
    assert_int_equal(kvd_store_stats(st, &s), KVD_OK);
    return s;
}

/* Waits until the NVMe writes already queued have finished, without the
 * write-back of the arena's other objects that a flush adds. */
static void drain(kvd_store_t *st)
{
    for (int i = 0; i < 10000 && stats_of(st).writes_pending > 0; i++) {
        usleep(1000);
    }
    assert_int_equal(stats_of(st).writes_pending, 0);
}

/* ---- write-back past the arena, both engines ---------------------------- */

static void run_fill_beyond_arena(const char *engine)
{
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "tiers");
    kvd_store_t *st = NULL;
    kvd_status_t s = store_open_kv(&d, &st, "store.disk_engine", engine, NULL);
    if (s == KVD_ERR_UNSUPPORTED) {
        printf("# io_uring unavailable here: %s engine skipped\n", engine);
        kvd_test_dir_remove(&d);
        return;
    }
    assert_int_equal(s, KVD_OK);
    /* 8 MiB arena = 32 objects; write 96 (three arenas' worth). */
    const uint32_t n = 96;
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(put_one(st, i), KVD_OK);
    }
    assert_int_equal(kvd_store_flush(st, 10000), KVD_OK);
    kvd_store_stats_t a = stats_of(st);
    assert_true(a.host.evictions >= n - 32);
    assert_true(a.disk.objects >= n - 32);
    assert_int_equal(a.dropped_writes, 0);
    uint32_t disk_reads = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t tier = 0;
        assert_int_equal(get_one(st, i, NULL, &tier), KVD_OK);
        disk_reads += tier == KVD_STORE_TIER_DISK;
    }
    kvd_store_stats_t b = stats_of(st);
    assert_true(disk_reads >= n - 32);
    assert_true(b.disk.hits >= disk_reads);
    assert_true(b.disk.bytes_read >= (uint64_t)disk_reads * OBJ);
    assert_true(b.disk.bytes_written >= (uint64_t)(n - 32) * OBJ);
    assert_int_equal(b.leases, 0);
    assert_int_equal(b.checksum_errors, 0);
    kvd_store_close(st);
    kvd_test_dir_remove(&d);
}

static void test_fill_beyond_arena_uring(void **state)
{
    (void)state;
    run_fill_beyond_arena("uring");
}

static void test_fill_beyond_arena_threads(void **state)
{
    (void)state;
    run_fill_beyond_arena("threads");
}

/* ---- write-through and reopen ------------------------------------------- */

static void test_write_through_reopen(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "tiers");
    kvd_store_t *st = NULL;
    assert_int_equal(
        store_open_kv(&d, &st, "store.disk_write", "through", NULL), KVD_OK);
    for (uint32_t i = 0; i < 20; i++) {
        assert_int_equal(put_one(st, i), KVD_OK);
    }
    assert_int_equal(kvd_store_flush(st, 10000), KVD_OK);
    kvd_store_stats_t a = stats_of(st);
    assert_int_equal(a.disk.objects, 20);
    assert_int_equal(a.host.objects, 20);
    /* Already on disk: the same key is not reserved again. */
    kvd_namespace_t ns = test_ns();
    kvd_block_hash_t h = hash_of(3);
    kvd_store_reservation_t r;
    assert_int_equal(kvd_store_reserve(st, &ns, &h, 1, OBJ, 0, &r), KVD_OK);
    assert_int_equal(r.status, KVD_ERR_EXISTS);
    kvd_store_close(st);

    assert_int_equal(store_open_kv(&d, &st, NULL), KVD_OK);
    kvd_store_stats_t b = stats_of(st);
    assert_int_equal(b.disk.objects, 20);
    assert_int_equal(b.host.objects, 0);
    for (uint32_t i = 0; i < 20; i++) {
        uint32_t tier = 0;
        assert_int_equal(get_one(st, i, NULL, &tier), KVD_OK);
        assert_int_equal(tier, KVD_STORE_TIER_DISK);
    }
    /* Promoted: now served from the arena. */
    uint32_t tier = 0;
    assert_int_equal(get_one(st, 0, NULL, &tier), KVD_OK);
    assert_int_equal(tier, KVD_STORE_TIER_HOST);

    /* Delete reaches the index: gone after another reopen. */
    kvd_store_key_t keys[2] = {{ns, hash_of(0)}, {ns, hash_of(1)}};
    size_t deleted = 0;
    assert_int_equal(kvd_store_delete(st, keys, 2, &deleted), KVD_OK);
    assert_int_equal(deleted, 2);
    kvd_store_close(st);
    assert_int_equal(store_open_kv(&d, &st, NULL), KVD_OK);
    assert_int_equal(stats_of(st).disk.objects, 18);
    assert_int_equal(get_one(st, 0, NULL, NULL), KVD_ERR_NOT_FOUND);
    assert_int_equal(get_one(st, 2, NULL, NULL), KVD_OK);
    kvd_store_close(st);
    kvd_test_dir_remove(&d);
}

/* ---- bytes changed after a verified commit never reach NVMe ------------ */

/* Reserves, fills and commits objects 0 and 1 with the checksum their
 * writer checked (kvd_store_commit_checksum: the daemon's verified
 * Commit), then overwrites object 0's slot as a co-tenant holding a
 * read-write mapping of the arena would. */
static void commit_two_damage_first(kvd_store_t *st)
{
    kvd_namespace_t ns = test_ns();
    for (uint32_t i = 0; i < 2; i++) {
        kvd_block_hash_t h = hash_of(i);
        kvd_store_reservation_t r;
        assert_int_equal(kvd_store_reserve(st, &ns, &h, 1, OBJ, 0, &r), KVD_OK);
        assert_int_equal(r.status, KVD_OK);
        uint8_t *p = kvd_store_arena_ptr(st, r.arena_offset, OBJ);
        fill(p, OBJ, i);
        kvd_store_key_t key = {ns, h};
        assert_int_equal(
            kvd_store_commit_checksum(st, &key, kvd_xxh3_64(p, OBJ)), KVD_OK);
        if (i == 0) {
            memset(p, 0xee, OBJ); /* overwritten after the checked commit */
        }
    }
}

/* Write-back checks the slot against the checksum verified at commit: the
 * overwritten object is dropped (not written to NVMe, not indexed), so
 * after a restart it is a miss, never the co-tenant's bytes; its neighbour
 * is on disk. */
static void test_write_back_drops_bytes_changed_after_commit(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "tiers");
    kvd_store_t *st = NULL;
    assert_int_equal(store_open_kv(&d, &st, NULL), KVD_OK);
    commit_two_damage_first(st);
    /* Twice the arena's objects: both are written back and evicted. */
    for (uint32_t i = 2; i < 66; i++) {
        assert_int_equal(put_one(st, i), KVD_OK);
    }
    assert_int_equal(kvd_store_flush(st, 10000), KVD_OK);
    kvd_store_stats_t a = stats_of(st);
    assert_int_equal(a.checksum_errors, 1);
    assert_int_equal(a.dropped_writes, 0);
    assert_int_equal(get_one(st, 0, NULL, NULL), KVD_ERR_NOT_FOUND);
    kvd_store_close(st);

    assert_int_equal(store_open_kv(&d, &st, NULL), KVD_OK);
    assert_int_equal(stats_of(st).disk.objects, a.disk.objects);
    assert_int_equal(get_one(st, 0, NULL, NULL), KVD_ERR_NOT_FOUND);
    uint32_t tier = 0;
    assert_int_equal(get_one(st, 1, NULL, &tier), KVD_OK);
    assert_int_equal(tier, KVD_STORE_TIER_DISK);
    assert_int_equal(stats_of(st).checksum_errors, 0);
    kvd_store_close(st);
    kvd_test_dir_remove(&d);
}

/* ---- sleeping on the completion fd --------------------------------------- */

/* A caller that sleeps on kvd_store_fd instead of kvd_store_wait is woken
 * by the completion of a disk-tier get: a drained poll arms the fd. */
static void test_fd_wakes_a_sleeper(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "tiers");
    kvd_store_t *st = NULL;
    assert_int_equal(
        store_open_kv(&d, &st, "store.disk_write", "through", NULL), KVD_OK);
    assert_int_equal(put_one(st, 7), KVD_OK);
    assert_int_equal(kvd_store_flush(st, 10000), KVD_OK);
    kvd_store_close(st);
    assert_int_equal(store_open_kv(&d, &st, NULL), KVD_OK);
    kvd_namespace_t ns = test_ns();
    kvd_block_hash_t h = hash_of(7);
    kvd_store_lease_t l;
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, &h, 1, &l, &m), KVD_OK);
    assert_int_equal(m, 1);
    assert_int_equal(l.tier, KVD_STORE_TIER_DISK);
    int fd = kvd_store_fd(st);
    assert_true(fd >= 0);
    kvd_store_completion_t c;
    assert_int_equal(kvd_store_poll(st, &c, 1), 0); /* drained: armed */
    kvd_store_get_t g = {.lease = l, .user_data = 7};
    size_t acc = 0;
    assert_int_equal(kvd_store_get_submit(st, &g, 1, &acc), KVD_OK);
    assert_int_equal(acc, 1);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 5000), 1);
    assert_int_equal(kvd_store_poll(st, &c, 1), 1);
    assert_int_equal(c.status, KVD_OK);
    assert_int_equal(kvd_store_release(st, &c.lease, 1), KVD_OK);
    kvd_store_close(st);
    kvd_test_dir_remove(&d);
}

/* ---- crash -------------------------------------------------------------- */

/* Child: writes objects through to disk forever, reporting after each
 * flush how many are durable. */
static void crash_child(const kvd_test_dir_t *d, int fd, uint32_t first)
{
    kvd_store_t *st = NULL;
    if (store_open_kv(d, &st, "store.disk_write", "through", "store.disk_size",
                      "64m", NULL) != KVD_OK) {
        _exit(2);
    }
    for (uint32_t i = first;; i++) {
        if (put_one(st, i) != KVD_OK) {
            _exit(3);
        }
        if (i % 8 == 7) {
            if (kvd_store_flush(st, 10000) != KVD_OK) {
                _exit(4);
            }
            uint32_t done = i + 1;
            if (write(fd, &done, sizeof done) != sizeof done) {
                _exit(5);
            }
        }
    }
}

static void test_crash_keeps_whole_objects(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "tiers");
    /* Objects [lo[r], hi[r]) were flushed by round r's child. */
    uint32_t lo[3], hi[3];
    uint32_t first = 0;
    for (int round = 0; round < 3; round++) {
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(fds[0]);
            crash_child(&d, fds[1], first);
        }
        close(fds[1]);
        /* Let it flush a few batches, then kill it mid-write. */
        uint32_t durable = first, v;
        int batches = 2 + round * 2;
        for (int k = 0; k < batches; k++) {
            assert_int_equal(read(fds[0], &v, sizeof v), (ssize_t)sizeof v);
            durable = v;
        }
        usleep((useconds_t)(1000 * (round + 1)));
        assert_int_equal(kill(pid, SIGKILL), 0);
        int wst = 0;
        assert_int_equal(waitpid(pid, &wst, 0), pid);
        assert_true(WIFSIGNALED(wst));
        close(fds[0]);
        lo[round] = first;
        hi[round] = durable;

        kvd_store_t *st = NULL;
        assert_int_equal(store_open_kv(&d, &st, "store.disk_size", "64m", NULL),
                         KVD_OK);
        /* Everything flushed in any round is there and reads back whole;
         * of what was in flight, each object is whole or absent. */
        for (int r = 0; r <= round; r++) {
            for (uint32_t i = lo[r]; i < hi[r]; i++) {
                assert_int_equal(get_one(st, i, NULL, NULL), KVD_OK);
            }
        }
        uint32_t extra = 0;
        for (uint32_t i = durable; i < durable + 64; i++) {
            kvd_status_t g = get_one(st, i, NULL, NULL);
            assert_true(g == KVD_OK || g == KVD_ERR_NOT_FOUND);
            extra += g == KVD_OK;
        }
        assert_int_equal(stats_of(st).checksum_errors, 0);
        printf("# crash round %d: %u flushed, %u more survived whole\n", round,
               durable - first, extra);
        kvd_store_close(st);
        first = durable + 64;
    }
    kvd_test_dir_remove(&d);
}

/* ---- damaged bytes ------------------------------------------------------ */

/* Flips one byte inside each of the first `n` objects' extents in the
 * first data file (objects are written from its start, OBJ apart). */
static void flip_bytes(const kvd_test_dir_t *d, unsigned n)
{
    char file[300];
    snprintf(file, sizeof file, "%s/kvd-data-000.dat", d->path);
    int fd = open(file, O_RDWR);
    assert_true(fd >= 0);
    for (uint64_t off = 100; off < (uint64_t)n * OBJ; off += OBJ) {
        uint8_t b = 0;
        assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
        b ^= 0xff;
        assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
    }
    assert_int_equal(fsync(fd), 0);
    close(fd);
}

static void test_checksum_mismatch_drops_object(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "tiers");
    kvd_store_t *st = NULL;
    assert_int_equal(
        store_open_kv(&d, &st, "store.disk_write", "through", NULL), KVD_OK);
    for (uint32_t i = 0; i < 4; i++) {
        assert_int_equal(put_one(st, i), KVD_OK);
    }
    assert_int_equal(kvd_store_flush(st, 10000), KVD_OK);
    kvd_store_close(st);

    /* Flip one byte in each of the first objects' extents. */
    flip_bytes(&d, 4);

    assert_int_equal(store_open_kv(&d, &st, NULL), KVD_OK);
    assert_int_equal(stats_of(st).disk.objects, 4);
    for (uint32_t i = 0; i < 4; i++) {
        assert_int_equal(get_one(st, i, NULL, NULL), KVD_ERR_CHECKSUM);
        assert_int_equal(get_one(st, i, NULL, NULL), KVD_ERR_NOT_FOUND);
    }
    kvd_store_stats_t s = stats_of(st);
    assert_int_equal(s.checksum_errors, 4);
    assert_int_equal(s.disk.objects, 0);
    assert_int_equal(s.host.objects, 0);
    kvd_store_close(st);
    /* The drop reached the index. */
    assert_int_equal(store_open_kv(&d, &st, NULL), KVD_OK);
    assert_int_equal(stats_of(st).disk.objects, 0);
    kvd_store_close(st);
    kvd_test_dir_remove(&d);
}

/* ---- injected failures -------------------------------------------------- */

/* A corrupt object that another reader still holds (an engine's leader
 * leased it when it matched the prefix): it must not be matched again, or
 * the engine would load it, fail, recompute and match it forever; the
 * other reader's release removes it, and the key can be saved again. */
static void test_corrupt_object_held_by_another_reader(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "tiers");
    kvd_store_t *st = NULL;
    assert_int_equal(
        store_open_kv(&d, &st, "store.disk_write", "through", NULL), KVD_OK);
    assert_int_equal(put_one(st, 0), KVD_OK);
    assert_int_equal(kvd_store_flush(st, 10000), KVD_OK);
    kvd_store_close(st);
    flip_bytes(&d, 1);

    assert_int_equal(store_open_kv(&d, &st, NULL), KVD_OK);
    kvd_namespace_t ns = test_ns();
    kvd_block_hash_t h = hash_of(0);
    kvd_store_lease_t held;
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, &h, 1, &held, &m), KVD_OK);
    assert_int_equal(m, 1); /* the other reader's lease */
    assert_int_equal(get_one(st, 0, NULL, NULL), KVD_ERR_CHECKSUM);
    kvd_store_lease_t l;
    assert_int_equal(kvd_store_lookup(st, &ns, &h, 1, &l, &m), KVD_OK);
    assert_int_equal(m, 0);
    assert_int_equal(get_one(st, 0, NULL, NULL), KVD_ERR_NOT_FOUND);
    assert_int_equal(stats_of(st).disk.objects, 1); /* still held */
    assert_int_equal(kvd_store_release(st, &held, 1), KVD_OK);
    kvd_store_stats_t s = stats_of(st);
    assert_int_equal(s.disk.objects, 0);
    assert_int_equal(s.leases, 0);
    assert_int_equal(put_one(st, 0), KVD_OK);
    assert_int_equal(get_one(st, 0, NULL, NULL), KVD_OK);
    kvd_store_close(st);
    kvd_test_dir_remove(&d);
}

/* Writes failing with `spec`: the objects stay in the arena only, and the
 * flush after them says so with `want` (before, it answered KVD_OK: a
 * caller could not tell the writes were not durable). */
static void run_injected_write_error(const char *spec, kvd_status_t want)
{
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "tiers");
    kvd_store_t *st = NULL;
    assert_int_equal(store_open_kv(&d, &st, "store.disk_write", "through",
                                   "store.stop_flush_timeout", "0", NULL),
                     KVD_OK);
    assert_int_equal(put_one(st, 0), KVD_OK);
    assert_int_equal(kvd_store_flush(st, 10000), KVD_OK);
    char err[128];
    assert_int_equal(kvd_failpoint_set(spec, err, sizeof err), KVD_OK);
    for (uint32_t i = 1; i < 6; i++) {
        assert_int_equal(put_one(st, i), KVD_OK);
    }
    /* The flush tries the arena-only objects again, and fails again. */
    kvd_status_t fs = kvd_store_flush(st, 10000);
    kvd_failpoint_clear();
    assert_int_equal(fs, want);
    kvd_store_stats_t s = stats_of(st);
    assert_true(s.dropped_writes >= 5 && s.dropped_writes <= 10);
    assert_int_equal(s.disk.objects, 1);
    assert_true(s.disk.errors >= 5);
    assert_int_equal(s.host.objects, 6); /* the arena copies are intact */
    assert_int_equal(s.leases, 0);
    for (uint32_t i = 0; i < 6; i++) {
        assert_int_equal(get_one(st, i, NULL, NULL), KVD_OK);
    }
    assert_int_equal(s.host.bytes, 6 * OBJ);
    kvd_store_close(st); /* store.stop_flush_timeout=0: nothing written */
    /* The index holds what was written before the failures, nothing more. */
    assert_int_equal(store_open_kv(&d, &st, NULL), KVD_OK);
    assert_int_equal(get_one(st, 0, NULL, NULL), KVD_OK);
    for (uint32_t i = 1; i < 6; i++) {
        assert_int_equal(get_one(st, i, NULL, NULL), KVD_ERR_NOT_FOUND);
    }
    /* The tier keeps working: fill the arena twice over through it. */
    for (uint32_t i = 100; i < 160; i++) {
        assert_int_equal(put_one(st, i), KVD_OK);
    }
    assert_int_equal(kvd_store_flush(st, 10000), KVD_OK);
    assert_int_equal(stats_of(st).dropped_writes, 0);
    assert_int_equal(get_one(st, 100, NULL, NULL), KVD_OK);
    kvd_store_close(st);
    kvd_test_dir_remove(&d);
}

static void test_write_eio(void **state)
{
    (void)state;
    run_injected_write_error("nvme.write=EIO", KVD_ERR_IO);
}

static void test_write_enospc(void **state)
{
    (void)state;
    run_injected_write_error("nvme.write=ENOSPC", KVD_ERR_NOSPACE);
}

static void test_read_eio(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "tiers");
    kvd_store_t *st = NULL;
    assert_int_equal(
        store_open_kv(&d, &st, "store.disk_write", "through", NULL), KVD_OK);
    assert_int_equal(put_one(st, 0), KVD_OK);
    assert_int_equal(kvd_store_flush(st, 10000), KVD_OK);
    kvd_store_close(st);
    assert_int_equal(store_open_kv(&d, &st, NULL), KVD_OK);
    char err[128];
    assert_int_equal(kvd_failpoint_set("nvme.read=EIO@1", err, sizeof err),
                     KVD_OK);
    assert_int_equal(get_one(st, 0, NULL, NULL), KVD_ERR_IO);
    kvd_failpoint_clear();
    kvd_store_stats_t s = stats_of(st);
    assert_int_equal(s.leases, 0);
    assert_int_equal(s.host.objects, 0);
    assert_int_equal(get_one(st, 0, NULL, NULL), KVD_OK);
    kvd_store_close(st);
    kvd_test_dir_remove(&d);
}

/* ---- full disk, admission ----------------------------------------------- */

static void test_full_disk_evicts_oldest(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "tiers");
    kvd_store_t *st = NULL;
    /* 2 MiB of disk = 8 objects, fewer than the arena holds: a flush or a
     * close would write the arena's objects evicted from the disk back
     * over the newer ones, so neither is used before the check. */
    assert_int_equal(store_open_kv(&d, &st, "store.disk_write", "through",
                                   "store.disk_size", "2m",
                                   "store.stop_flush_timeout", "0", NULL),
                     KVD_OK);
    for (uint32_t i = 0; i < 20; i++) {
        assert_int_equal(put_one(st, i), KVD_OK);
        drain(st);
    }
    kvd_store_stats_t s = stats_of(st);
    assert_int_equal(s.disk.objects, 8);
    assert_int_equal(s.disk.evictions, 12);
    assert_int_equal(s.dropped_writes, 0);
    kvd_store_close(st);
    assert_int_equal(store_open_kv(&d, &st, "store.disk_size", "2m", NULL),
                     KVD_OK);
    assert_int_equal(stats_of(st).disk.objects, 8);
    for (uint32_t i = 12; i < 20; i++) {
        assert_int_equal(get_one(st, i, NULL, NULL), KVD_OK);
    }
    assert_int_equal(get_one(st, 0, NULL, NULL), KVD_ERR_NOT_FOUND);
    kvd_store_close(st);
    kvd_test_dir_remove(&d);
}

static void test_admission_second_sighting(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "tiers");
    kvd_store_t *st = NULL;
    assert_int_equal(
        store_open_kv(&d, &st, "store.disk_admission", "second", NULL), KVD_OK);
    /* Objects 0..15 are looked up once (a second sighting); 16..31 never. */
    for (uint32_t i = 0; i < 32; i++) {
        assert_int_equal(put_one(st, i), KVD_OK);
        if (i < 16) {
            assert_int_equal(get_one(st, i, NULL, NULL), KVD_OK);
        }
    }
    /* Push all 32 out of the arena. */
    for (uint32_t i = 1000; i < 1032; i++) {
        assert_int_equal(put_one(st, i), KVD_OK);
    }
    drain(st);
    kvd_store_stats_t s = stats_of(st);
    assert_int_equal(s.disk.objects, 16);
    assert_true(s.admission_rejects >= 16);
    for (uint32_t i = 0; i < 16; i++) {
        assert_int_equal(get_one(st, i, NULL, NULL), KVD_OK);
    }
    assert_int_equal(get_one(st, 20, NULL, NULL), KVD_ERR_NOT_FOUND);
    /* A flush writes what is in the arena whatever the filter said (the 16
     * objects of 1000..1031 that the reads of 0..15 left there), but
     * cannot bring back what it rejected. */
    assert_int_equal(kvd_store_flush(st, 10000), KVD_OK);
    assert_int_equal(stats_of(st).disk.objects, 32);
    assert_int_equal(get_one(st, 20, NULL, NULL), KVD_ERR_NOT_FOUND);
    kvd_store_close(st);
    kvd_test_dir_remove(&d);
}

/* ---- concurrency -------------------------------------------------------- */

typedef struct cc {
    kvd_store_t *st;
    pthread_mutex_t poll_mu;
    uint32_t id;
    uint32_t per_writer;
    int failures;
} cc_t;

typedef struct cc_arg {
    cc_t *cc;
    uint32_t id;
} cc_arg_t;

static void *cc_writer(void *arg)
{
    cc_arg_t *a = arg;
    for (uint32_t k = 0; k < a->cc->per_writer; k++) {
        uint32_t i = a->id * 100000 + k;
        kvd_status_t s = put_one(a->cc->st, i);
        if (s != KVD_OK && s != KVD_ERR_NOSPACE) {
            __atomic_fetch_add(&a->cc->failures, 1, __ATOMIC_RELAXED);
        }
    }
    return NULL;
}

static void *cc_reader(void *arg)
{
    cc_arg_t *a = arg;
    for (uint32_t k = 0; k < a->cc->per_writer * 2; k++) {
        uint32_t w = k % 2, i = w * 100000 + (k / 2) % a->cc->per_writer;
        kvd_status_t s = get_one(a->cc->st, i, &a->cc->poll_mu, NULL);
        /* A miss is a correct answer for a cache (not written yet, or
         * evicted and not admitted); wrong bytes never are. */
        if (s != KVD_OK && s != KVD_ERR_NOT_FOUND && s != KVD_ERR_NOSPACE) {
            fprintf(stderr, "reader: object %u: %s\n", i, kvd_status_str(s));
            __atomic_fetch_add(&a->cc->failures, 1, __ATOMIC_RELAXED);
        }
    }
    return NULL;
}

static void test_concurrent_writers_and_readers(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "tiers");
    cc_t cc = {.per_writer = 60 * SCALE};
    pthread_mutex_init(&cc.poll_mu, NULL);
    assert_int_equal(store_open_kv(&d, &cc.st, NULL), KVD_OK);
    pthread_t th[4];
    cc_arg_t args[4] = {{&cc, 0}, {&cc, 1}, {&cc, 0}, {&cc, 1}};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pthread_create(&th[i], NULL,
                                        i < 2 ? cc_writer : cc_reader,
                                        &args[i]),
                         0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
    }
    assert_int_equal(cc.failures, 0);
    assert_int_equal(kvd_store_flush(cc.st, 10000), KVD_OK);
    kvd_store_stats_t s = stats_of(cc.st);
    assert_int_equal(s.leases, 0);
    assert_int_equal(s.checksum_errors, 0);
    kvd_store_close(cc.st);
    pthread_mutex_destroy(&cc.poll_mu);
    kvd_test_dir_remove(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fill_beyond_arena_uring),
        cmocka_unit_test(test_fill_beyond_arena_threads),
        cmocka_unit_test(test_write_through_reopen),
        cmocka_unit_test(test_write_back_drops_bytes_changed_after_commit),
        cmocka_unit_test(test_fd_wakes_a_sleeper),
        cmocka_unit_test(test_crash_keeps_whole_objects),
        cmocka_unit_test(test_checksum_mismatch_drops_object),
        cmocka_unit_test(test_corrupt_object_held_by_another_reader),
        cmocka_unit_test(test_write_eio),
        cmocka_unit_test(test_write_enospc),
        cmocka_unit_test(test_read_eio),
        cmocka_unit_test(test_full_disk_evicts_oldest),
        cmocka_unit_test(test_admission_second_sighting),
        cmocka_unit_test(test_concurrent_writers_and_readers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
