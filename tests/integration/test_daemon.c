/*
 * kvdepotd end to end: a real daemon process (the binary in $KVDEPOTD) on a
 * unix socket in a temp directory, and clients that open the store with
 * store.mode=daemon — the same store.h calls the leader and worker make.
 *   - two client processes share objects (one saves, the other loads the
 *     same bytes through its own mapping of the arena);
 *   - a daemon restart keeps the NVMe tier, and a client that outlives the
 *     daemon maps the new arena by itself and loads from disk;
 *   - a client killed with SIGKILL holding leases: the daemon reclaims them
 *     after the lease TTL;
 *   - a dead daemon: calls fail within store.timeout (lookups find nothing,
 *     saves are skipped), and the client recovers when the daemon is back.
 * Malformed/oversized requests, the token on TCP and the metrics endpoint
 * are tested from Python (tests/python/test_daemon_grpc.py).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvdepot/store.h"
#include "client/client.h"
#include "tests/unit/kvd_testdir_int.h"
#include "tests/integration/kvd_testdaemon_int.h"

#define OBJ_BYTES (64u << 10)
#define NKEYS 8

static const char *daemon_bin(void)
{
    return kvd_test_daemon_bin();
}

static uint64_t now_ms(void)
{
    return kvd_test_now_ms();
}

/* Starts kvdepotd in `d` with extra --set values (NULL-terminated) and
 * waits for its ready file. Returns the pid. */
static pid_t daemon_start(const kvd_test_dir_t *d, ...)
{
    va_list ap;
    va_start(ap, d);
    pid_t pid = kvd_test_daemon_spawn(d, NULL, ap);
    va_end(ap);
    kvd_test_daemon_wait_ready(d, pid);
    return pid;
}

/* SIGTERM and wait: a graceful stop exits 0. */
static void daemon_stop(pid_t pid)
{
    kvd_test_daemon_stop(pid);
}

static void daemon_kill9(pid_t pid)
{
    assert_int_equal(kill(pid, SIGKILL), 0);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
}

static kvd_status_t client_open(const kvd_test_dir_t *d, const char *ttl,
                                const char *timeout, kvd_store_t **st)
{
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    char addr[300];
    snprintf(addr, sizeof addr, "unix:%s/d.sock", d->path);
    (void)kvd_config_set(cfg, "store.mode", "daemon");
    (void)kvd_config_set(cfg, "store.address", addr);
    (void)kvd_config_set(cfg, "store.lease_ttl", ttl);
    (void)kvd_config_set(cfg, "store.timeout", timeout);
    char err[256] = "";
    kvd_status_t s = kvd_store_open(cfg, st, err, sizeof err);
    if (s != KVD_OK) {
        fprintf(stderr, "client open: %s (%s)\n", kvd_status_str(s), err);
    }
    kvd_config_destroy(cfg);
    return s;
}

static void keys_make(kvd_namespace_t *ns, kvd_block_hash_t *h, size_t n,
                      uint8_t seed)
{
    memset(ns->bytes, 0xA5, sizeof ns->bytes);
    for (size_t i = 0; i < n; i++) {
        memset(h[i].bytes, 0, sizeof h[i].bytes);
        h[i].bytes[0] = seed;
        h[i].bytes[1] = (uint8_t)i;
        h[i].bytes[31] = 0x5A;
    }
}

static uint8_t pattern(size_t key, size_t i)
{
    return (uint8_t)(key * 131u + i * 7u + (i >> 12));
}

/* Reserves, writes and commits n objects; returns how many committed. */
static size_t save_objects(kvd_store_t *st, const kvd_namespace_t *ns,
                           const kvd_block_hash_t *h, size_t n)
{
    kvd_store_reservation_t r[NKEYS];
    assert_true(n <= NKEYS);
    assert_int_equal(kvd_store_reserve(st, ns, h, n, OBJ_BYTES, 0, r), KVD_OK);
    kvd_store_key_t keys[NKEYS];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].status != KVD_OK) {
            continue;
        }
        uint8_t *p = kvd_store_arena_ptr(st, r[i].arena_offset, OBJ_BYTES);
        assert_non_null(p);
        for (size_t b = 0; b < OBJ_BYTES; b++) {
            p[b] = pattern(h[i].bytes[1], b);
        }
        keys[k].ns = *ns;
        keys[k++].hash = h[i];
    }
    kvd_status_t cs[NKEYS];
    if (k > 0) {
        assert_int_equal(kvd_store_commit(st, keys, k, cs), KVD_OK);
    }
    return k;
}

static void check_bytes(kvd_store_t *st, const kvd_store_lease_t *l)
{
    assert_int_equal(l->tier, KVD_STORE_TIER_HOST);
    assert_int_equal(l->size_bytes, OBJ_BYTES);
    const uint8_t *p = kvd_store_arena_ptr(st, l->arena_offset, OBJ_BYTES);
    assert_non_null(p);
    for (size_t b = 0; b < OBJ_BYTES; b++) {
        if (p[b] != pattern(l->key.hash.bytes[1], b)) {
            fail_msg("key %u byte %zu: %u, want %u", l->key.hash.bytes[1], b,
                     p[b], pattern(l->key.hash.bytes[1], b));
        }
    }
}

static uint64_t daemon_leases(kvd_store_t *st)
{
    kvd_store_stats_t s;
    assert_int_equal(kvd_store_stats(st, &s), KVD_OK);
    return s.leases;
}

/* Waits (by deadline) until the daemon holds `want` lease ids. */
static void wait_leases(kvd_store_t *st, uint64_t want, int timeout_ms)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    while (daemon_leases(st) != want) {
        if (now_ms() > deadline) {
            fail_msg("daemon holds %llu leases, want %llu",
                     (unsigned long long)daemon_leases(st),
                     (unsigned long long)want);
        }
        usleep(20000);
    }
}

static int skip_without_daemon(void **state)
{
    (void)state;
    if (daemon_bin() == NULL) {
        fprintf(stderr, "KVDEPOTD not set: skipped\n");
        exit(77);
    }
    return 0;
}

static void test_two_processes_share(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_share");
    pid_t dpid = daemon_start(&d, (const char *)NULL);
    kvd_namespace_t ns;
    kvd_block_hash_t h[NKEYS];
    keys_make(&ns, h, NKEYS, 1);

    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        kvd_store_t *st = NULL;
        int rc = client_open(&d, "30s", "2s", &st) == KVD_OK &&
                         save_objects(st, &ns, h, NKEYS) == NKEYS
                     ? 0
                     : 1;
        kvd_store_close(st);
        _exit(rc);
    }
    int cst = 0;
    assert_int_equal(waitpid(child, &cst, 0), child);
    assert_true(WIFEXITED(cst) && WEXITSTATUS(cst) == 0);

    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    kvd_store_lease_t l[NKEYS];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, h, NKEYS, l, &m), KVD_OK);
    assert_int_equal(m, NKEYS);
    for (size_t i = 0; i < m; i++) {
        check_bytes(st, &l[i]);
    }
    assert_int_equal(daemon_leases(st), 1);
    /* Saving what is stored is refused as EXISTS, not duplicated. */
    kvd_store_reservation_t r[NKEYS];
    assert_int_equal(kvd_store_reserve(st, &ns, h, NKEYS, OBJ_BYTES, 0, r),
                     KVD_OK);
    for (size_t i = 0; i < NKEYS; i++) {
        assert_int_equal(r[i].status, KVD_ERR_EXISTS);
    }
    /* Half released: the daemon keeps the lease; all: it is gone. */
    assert_int_equal(kvd_store_release(st, l, NKEYS / 2), KVD_OK);
    assert_int_equal(daemon_leases(st), 1);
    assert_int_equal(kvd_store_release(st, l + NKEYS / 2, NKEYS / 2), KVD_OK);
    assert_int_equal(daemon_leases(st), 0);
    /* A lease released twice is an error, not a double release. */
    assert_int_equal(kvd_store_release(st, l, 1), KVD_ERR_NOT_FOUND);
    /* A prefix stops at the first missing block. */
    kvd_block_hash_t mixed[3] = {h[0], h[1], h[2]};
    mixed[1].bytes[5] = 0xEE;
    assert_int_equal(kvd_store_lookup(st, &ns, mixed, 3, l, &m), KVD_OK);
    assert_int_equal(m, 1);
    assert_int_equal(kvd_store_release(st, l, 1), KVD_OK);
    /* Abort gives a reservation back: the key stays absent. */
    kvd_block_hash_t fresh[1];
    keys_make(&ns, fresh, 1, 9);
    assert_int_equal(kvd_store_reserve(st, &ns, fresh, 1, OBJ_BYTES, 0, r),
                     KVD_OK);
    assert_int_equal(r[0].status, KVD_OK);
    kvd_store_key_t fk = {.ns = ns, .hash = fresh[0]};
    kvd_status_t as;
    assert_int_equal(kvd_store_abort(st, &fk, 1, &as), KVD_OK);
    assert_int_equal(as, KVD_OK);
    assert_int_equal(kvd_store_lookup(st, &ns, fresh, 1, l, &m), KVD_OK);
    assert_int_equal(m, 0);
    assert_int_equal(kvd_store_commit(st, &fk, 1, &as), KVD_ERR_NOT_FOUND);
    /* Delete: a leased object is kept (BUSY), the others go. */
    assert_int_equal(kvd_store_lookup(st, &ns, h, 1, l, &m), KVD_OK);
    assert_int_equal(m, 1);
    kvd_store_key_t dk[NKEYS];
    for (size_t i = 0; i < NKEYS; i++) {
        dk[i] = (kvd_store_key_t){.ns = ns, .hash = h[i]};
    }
    size_t deleted = 0;
    assert_int_equal(kvd_store_delete(st, dk, NKEYS, &deleted), KVD_ERR_BUSY);
    assert_int_equal(deleted, NKEYS - 1);
    assert_int_equal(kvd_store_release(st, l, 1), KVD_OK);
    assert_int_equal(kvd_store_delete(st, dk, NKEYS, &deleted), KVD_OK);
    assert_int_equal(deleted, 1);
    assert_int_equal(kvd_store_lookup(st, &ns, h, NKEYS, l, &m), KVD_OK);
    assert_int_equal(m, 0);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

/* Gets n disk-tier leases into the arena (promotion); the host leases in
 * got[i], in the order of l. */
static void get_from_disk(kvd_store_t *st, const kvd_store_lease_t *l, size_t n,
                          kvd_store_lease_t *got)
{
    kvd_store_get_t g[NKEYS];
    assert_true(n <= NKEYS);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(l[i].tier, KVD_STORE_TIER_DISK);
        g[i] = (kvd_store_get_t){.lease = l[i], .user_data = i};
    }
    size_t acc = 0;
    assert_int_equal(kvd_store_get_submit(st, g, n, &acc), KVD_OK);
    assert_int_equal(acc, n);
    size_t done = 0;
    uint64_t deadline = now_ms() + 10000;
    while (done < n) {
        assert_true(now_ms() < deadline);
        (void)kvd_store_wait(st, 100);
        kvd_store_completion_t c[NKEYS];
        size_t k = kvd_store_poll(st, c, NKEYS);
        for (size_t i = 0; i < k; i++) {
            assert_int_equal(c[i].status, KVD_OK);
            got[c[i].user_data] = c[i].lease;
            done++;
        }
    }
}

static void test_restart_keeps_disk_tier(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_restart");
    char disk[300];
    snprintf(disk, sizeof disk, "store.disk_path=%s/nvme", d.path);
    char nvme[300];
    snprintf(nvme, sizeof nvme, "%s/nvme", d.path);
    assert_int_equal(mkdir(nvme, 0700), 0);
    pid_t dpid = daemon_start(&d, disk, "store.disk_size=32m",
                              "store.disk_write=through",
                              "store.sync_interval=0", (const char *)NULL);
    kvd_namespace_t ns;
    kvd_block_hash_t h[4];
    keys_make(&ns, h, 4, 2);
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    assert_int_equal(save_objects(st, &ns, h, 4), 4);
    assert_int_equal(kvd_store_flush(st, 10000), KVD_OK);
    daemon_stop(dpid);

    /* While it is down: errors within the deadline, no hang. */
    kvd_store_lease_t l[4];
    size_t m = 99;
    assert_int_not_equal(kvd_store_lookup(st, &ns, h, 4, l, &m), KVD_OK);

    dpid = daemon_start(&d, disk, "store.disk_size=32m",
                        "store.disk_write=through", "store.sync_interval=0",
                        (const char *)NULL);
    /* Same client: it notices the new daemon, maps its arena, and finds the
     * objects on the disk tier. The channel may need a reconnect first. */
    uint64_t deadline = now_ms() + 10000;
    kvd_status_t s;
    while ((s = kvd_store_lookup(st, &ns, h, 4, l, &m)) != KVD_OK) {
        assert_true(now_ms() < deadline);
        usleep(50000);
    }
    assert_int_equal(m, 4);
    kvd_store_lease_t got[4];
    get_from_disk(st, l, 4, got);
    for (size_t i = 0; i < 4; i++) {
        check_bytes(st, &got[i]);
    }
    assert_int_equal(kvd_store_release(st, got, 4), KVD_OK);
    assert_int_equal(daemon_leases(st), 0);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

/* Mappings of a kvdepotd arena in this process (/proc/self/maps lines). */
static size_t arena_mappings(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    size_t n = 0;
    assert_non_null(f);
    while (fgets(line, sizeof line, f) != NULL) {
        n += strstr(line, "kvdepot-arena") != NULL;
    }
    fclose(f);
    return n;
}

static void check_pattern(const uint8_t *p, size_t key)
{
    assert_non_null(p);
    for (size_t b = 0; b < OBJ_BYTES; b++) {
        if (p[b] != pattern(key, b)) {
            fail_msg("key %zu byte %zu: %u, want %u", key, b, p[b],
                     pattern(key, b));
        }
    }
}

/*
 * A daemon restart must not redirect what a client holds: the offsets of a
 * lease and of a reservation name slots of the arena they were given in.
 * After the restart the new daemon puts an object at the same offset (a
 * fresh arena hands out its first slot again). Through kvd_store_lease_ptr
 * the old lease still reads its own object, writing through
 * kvd_store_reservation_ptr leaves the new object intact (before, both went
 * through the new arena: the write corrupted the new daemon's object), the
 * stale reservation cannot be committed, and once the lease, the
 * reservation and a hold (kvd_store_arena_hold, what a CUDA worker takes
 * while the arena is registered) are given back the old arena is unmapped
 * (before, every client kept each restarted daemon's whole arena mapped
 * until it closed).
 */
static void test_restart_keeps_offsets_in_their_arena(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_offsets");
    pid_t dpid = daemon_start(&d, (const char *)NULL);
    kvd_namespace_t ns;
    kvd_block_hash_t h[3];
    keys_make(&ns, h, 3, 9);
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    size_t maps_at_start = arena_mappings();
    assert_true(maps_at_start >= 1);

    /* X saved and leased; Y reserved; both in the first daemon's arena. */
    assert_int_equal(save_objects(st, &ns, h, 1), 1);
    kvd_store_lease_t lx;
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, h, 1, &lx, &m), KVD_OK);
    assert_int_equal(m, 1);
    check_pattern(kvd_store_lease_ptr(st, &lx), 0);
    kvd_store_reservation_t ry;
    assert_int_equal(kvd_store_reserve(st, &ns, &h[1], 1, OBJ_BYTES, 0, &ry),
                     KVD_OK);
    assert_int_equal(ry.status, KVD_OK);
    /* A hold (a device registration) keeps the arena mapped on its own. */
    void *held_base = NULL;
    uint64_t held_size = 0;
    uint32_t gen = 0;
    assert_int_equal(kvd_store_arena_hold(st, &held_base, &held_size, &gen),
                     KVD_OK);
    assert_ptr_equal(held_base, kvd_store_arena_ptr(st, 0, 1));
    assert_true(held_size >= OBJ_BYTES);
    assert_int_equal(kvd_store_arena_generation(st), gen);

    daemon_stop(dpid);
    dpid = daemon_start(&d, (const char *)NULL);
    /* The client notices the new instance and maps its arena. */
    uint64_t deadline = now_ms() + 10000;
    kvd_store_lease_t lz;
    while (kvd_store_lookup(st, &ns, &h[2], 1, &lz, &m) != KVD_OK) {
        assert_true(now_ms() < deadline);
        usleep(50000);
    }
    assert_true(arena_mappings() > maps_at_start);
    assert_int_not_equal(kvd_store_arena_generation(st), gen);
    /* Z in the new arena, at X's offset. */
    assert_int_equal(save_objects(st, &ns, &h[2], 1), 1);
    assert_int_equal(kvd_store_lookup(st, &ns, &h[2], 1, &lz, &m), KVD_OK);
    assert_int_equal(m, 1);
    assert_int_equal(lz.arena_offset, lx.arena_offset);

    /* The old lease reads X, not Z. */
    const uint8_t *px = kvd_store_lease_ptr(st, &lx);
    check_pattern(px, 0);
    assert_ptr_not_equal(px, kvd_store_lease_ptr(st, &lz));
    /* Writing the stale reservation cannot reach the new arena. */
    uint8_t *py = kvd_store_reservation_ptr(st, &ry, OBJ_BYTES);
    assert_non_null(py);
    memset(py, 0xEE, OBJ_BYTES);
    check_pattern(kvd_store_lease_ptr(st, &lz), 2);
    kvd_store_key_t ky = {ns, h[1]};
    kvd_status_t cs = KVD_OK;
    assert_int_not_equal(kvd_store_commit(st, &ky, 1, &cs), KVD_OK);
    assert_int_not_equal(cs, KVD_OK);

    /* Given back: the old arena goes once the hold goes too. */
    assert_int_equal(kvd_store_release(st, &lx, 1), KVD_OK);
    assert_true(arena_mappings() > maps_at_start);
    check_pattern(held_base, 0); /* X's slot, through the held mapping */
    kvd_store_arena_unhold(st, gen);
    assert_int_equal(arena_mappings(), maps_at_start);
    assert_null(kvd_store_lease_ptr(st, &lx));
    assert_null(kvd_store_reservation_ptr(st, &ry, OBJ_BYTES));
    check_pattern(kvd_store_lease_ptr(st, &lz), 2);
    assert_int_equal(kvd_store_release(st, &lz, 1), KVD_OK);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

/*
 * server.tenant_max_leased caps what one tenant holds leased (issue
 * "Reliability and security": request limits so one client cannot pin the
 * whole cache). With room for two objects, a lookup of four matches a
 * prefix of two, a second one matches nothing while those are held, and
 * once they are given back four are matched in two again; refusals are
 * counted.
 */
static void test_tenant_lease_cap(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_lease_cap");
    char cap[64];
    snprintf(cap, sizeof cap, "server.tenant_max_leased=%u", 2 * OBJ_BYTES);
    pid_t dpid = daemon_start(&d, cap, "server.metrics_address=127.0.0.1:0",
                              (const char *)NULL);
    kvd_namespace_t ns;
    kvd_block_hash_t h[4];
    keys_make(&ns, h, 4, 11);
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    assert_int_equal(save_objects(st, &ns, h, 4), 4);

    kvd_store_lease_t l[4], l2[4];
    size_t m = 99;
    assert_int_equal(kvd_store_lookup(st, &ns, h, 4, l, &m), KVD_OK);
    assert_int_equal(m, 2);
    for (size_t i = 0; i < m; i++) {
        check_bytes(st, &l[i]);
    }
    size_t m2 = 99;
    assert_int_equal(kvd_store_lookup(st, &ns, h, 4, l2, &m2), KVD_OK);
    assert_int_equal(m2, 0);
    assert_true(kvd_test_daemon_metric(&d, "kvdepot_leases_refused_total") >=
                6);
    assert_int_equal(kvd_store_release(st, l, m), KVD_OK);
    /* The release reaches the daemon with the next call (or 2 ms later). */
    uint64_t deadline = now_ms() + 5000;
    for (;;) {
        assert_int_equal(kvd_store_lookup(st, &ns, h, 4, l2, &m2), KVD_OK);
        if (m2 > 0) {
            break;
        }
        assert_true(now_ms() < deadline);
        usleep(20000);
    }
    assert_int_equal(m2, 2);
    assert_int_equal(kvd_store_release(st, l2, m2), KVD_OK);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

static void test_killed_client_leases_reclaimed(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_kill");
    pid_t dpid = daemon_start(&d, (const char *)NULL);
    kvd_namespace_t ns;
    kvd_block_hash_t h[4];
    keys_make(&ns, h, 4, 3);
    /* gRPC does not survive fork(): every process here forks before it
     * opens its own client. */
    pid_t saver = fork();
    assert_true(saver >= 0);
    if (saver == 0) {
        kvd_store_t *ss = NULL;
        int rc = client_open(&d, "30s", "2s", &ss) == KVD_OK &&
                         save_objects(ss, &ns, h, 4) == 4
                     ? 0
                     : 1;
        kvd_store_close(ss);
        _exit(rc);
    }
    int sst = 0;
    assert_int_equal(waitpid(saver, &sst, 0), saver);
    assert_true(WIFEXITED(sst) && WEXITSTATUS(sst) == 0);

    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        kvd_store_t *cs = NULL;
        kvd_store_lease_t l[4];
        size_t m = 0;
        char ok = client_open(&d, "400ms", "2s", &cs) == KVD_OK &&
                          kvd_store_lookup(cs, &ns, h, 4, l, &m) == KVD_OK &&
                          m == 4
                      ? 'y'
                      : 'n';
        (void)!write(pipefd[1], &ok, 1);
        for (;;) {
            pause(); /* holds the lease until killed */
        }
    }
    char ok = 0;
    assert_int_equal(read(pipefd[0], &ok, 1), 1);
    assert_int_equal(ok, 'y');
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    assert_int_equal(daemon_leases(st), 1);
    daemon_kill9(child);
    /* Leased objects cannot be evicted or deleted meanwhile; the daemon
     * reclaims the lease after its TTL (400 ms) plus a tick. */
    wait_leases(st, 0, 5000);
    close(pipefd[0]);
    close(pipefd[1]);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

static void test_dead_daemon_no_hang(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_dead");
    pid_t dpid = daemon_start(&d, (const char *)NULL);
    kvd_namespace_t ns;
    kvd_block_hash_t h[4];
    keys_make(&ns, h, 4, 4);
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "500ms", &st), KVD_OK);
    assert_int_equal(save_objects(st, &ns, h, 2), 2);
    daemon_kill9(dpid);

    uint64_t t0 = now_ms();
    kvd_store_lease_t l[4];
    size_t m = 99;
    assert_int_not_equal(kvd_store_lookup(st, &ns, h, 4, l, &m), KVD_OK);
    /* Saves are skipped, not failed: the engine carries on. */
    kvd_store_reservation_t r[4];
    assert_int_equal(kvd_store_reserve(st, &ns, h + 2, 2, OBJ_BYTES, 0, r),
                     KVD_OK);
    assert_int_not_equal(r[0].status, KVD_OK);
    assert_int_not_equal(r[1].status, KVD_OK);
    kvd_store_stats_t stats;
    assert_int_not_equal(kvd_store_stats(st, &stats), KVD_OK);
    /* Three calls, each bounded by store.timeout (500 ms), with slack for
     * a loaded machine. */
    assert_true(now_ms() - t0 < 3 * 500 + 3000);

    /* A new daemon (empty arena: the old one's died with it). */
    dpid = daemon_start(&d, (const char *)NULL);
    uint64_t deadline = now_ms() + 10000;
    while (kvd_store_lookup(st, &ns, h, 4, l, &m) != KVD_OK) {
        assert_true(now_ms() < deadline);
        usleep(50000);
    }
    assert_int_equal(m, 0);
    assert_int_equal(save_objects(st, &ns, h, 4), 4);
    assert_int_equal(kvd_store_lookup(st, &ns, h, 4, l, &m), KVD_OK);
    assert_int_equal(m, 4);
    for (size_t i = 0; i < 4; i++) {
        check_bytes(st, &l[i]);
    }
    assert_int_equal(kvd_store_release(st, l, 4), KVD_OK);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

static void test_open_without_daemon(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_none");
    kvd_store_t *st = NULL;
    uint64_t t0 = now_ms();
    assert_int_equal(client_open(&d, "30s", "500ms", &st), KVD_ERR_UNREACHABLE);
    assert_null(st);
    assert_true(now_ms() - t0 < 5000);
    /* A TCP address is refused: the data path needs the unix socket. */
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    (void)kvd_config_set(cfg, "store.mode", "daemon");
    (void)kvd_config_set(cfg, "store.address", "127.0.0.1:1");
    char err[256] = "";
    assert_int_equal(kvd_store_open(cfg, &st, err, sizeof err),
                     KVD_ERR_INVALID);
    assert_non_null(strstr(err, "store.address"));
    kvd_config_destroy(cfg);
    kvd_test_dir_remove(&d);
}

static void test_admin_list_drop_drain(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_admin");
    pid_t dpid = daemon_start(&d, (const char *)NULL);
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    kvd_client_t *c = kvd_client_of(st);
    assert_non_null(c);
    kvd_namespace_t ns1, ns2;
    kvd_block_hash_t h[NKEYS];
    keys_make(&ns1, h, NKEYS, 5);
    ns2 = ns1;
    ns2.bytes[0] ^= 0xFF;
    assert_int_equal(save_objects(st, &ns1, h, 5), 5);
    assert_int_equal(save_objects(st, &ns2, h, 3), 3);

    kvd_client_ns_usage_t *nu = NULL;
    kvd_client_tenant_usage_t *tu = NULL;
    size_t nn = 0, nt = 0;
    bool trunc = true;
    assert_int_equal(kvd_client_list(c, &nu, &nn, &tu, &nt, &trunc), KVD_OK);
    assert_int_equal(nn, 2);
    assert_false(trunc);
    uint64_t total = 0;
    for (size_t i = 0; i < nn; i++) {
        bool first = memcmp(&nu[i].ns, &ns1, sizeof ns1) == 0;
        assert_int_equal(nu[i].host_objects, first ? 5 : 3);
        assert_int_equal(nu[i].bytes, (first ? 5u : 3u) * OBJ_BYTES);
        total += nu[i].host_objects;
    }
    assert_int_equal(total, 8);
    assert_int_equal(nt, 1);
    assert_int_equal(tu[0].objects, 8);
    free(nu);
    free(tu);

    /* Drop ns1, with one of its objects leased: that one stays. */
    kvd_store_lease_t l[NKEYS];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns1, h, 1, l, &m), KVD_OK);
    assert_int_equal(m, 1);
    uint64_t dropped = 0;
    assert_int_equal(kvd_client_drop_namespace(c, &ns1, &dropped), KVD_OK);
    assert_int_equal(dropped, 4);
    assert_int_equal(kvd_store_release(st, l, 1), KVD_OK);
    assert_int_equal(kvd_client_drop_namespace(c, &ns1, &dropped), KVD_OK);
    assert_int_equal(dropped, 1);
    assert_int_equal(kvd_store_lookup(st, &ns1, h, NKEYS, l, &m), KVD_OK);
    assert_int_equal(m, 0);
    assert_int_equal(kvd_store_lookup(st, &ns2, h, 3, l, &m), KVD_OK);
    assert_int_equal(m, 3);
    assert_int_equal(kvd_store_release(st, l, 3), KVD_OK);

    /* Draining: saves are refused, loads still served; then back. */
    uint64_t leases = 9, resv = 9;
    assert_int_equal(kvd_client_drain(c, true, &leases, &resv), KVD_OK);
    assert_int_equal(leases, 0);
    assert_int_equal(resv, 0);
    assert_int_equal(save_objects(st, &ns1, h, 2), 0);
    assert_int_equal(kvd_store_lookup(st, &ns2, h, 3, l, &m), KVD_OK);
    assert_int_equal(m, 3);
    assert_int_equal(kvd_store_release(st, l, 3), KVD_OK);
    assert_int_equal(kvd_client_drain(c, false, &leases, &resv), KVD_OK);
    assert_int_equal(save_objects(st, &ns1, h, 2), 2);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

/* server.tenants: a client's saves count against the tenant of its user,
 * whatever its requests say. Needs root (a child switches to uid 65534). */
static void test_tenant_of_user(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        fprintf(stderr, "not root: tenant mapping by uid not tested\n");
        return;
    }
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_tenant");
    assert_int_equal(chmod(d.path, 0755), 0);
    pid_t dpid = daemon_start(&d, "server.tenants=65534=team-nobody",
                              "server.unix_mode=0666", (const char *)NULL);
    kvd_namespace_t ns;
    kvd_block_hash_t h[NKEYS];
    keys_make(&ns, h, NKEYS, 6);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        kvd_store_t *cs = NULL;
        int rc = setgid(65534) == 0 && setuid(65534) == 0 &&
                         client_open(&d, "30s", "2s", &cs) == KVD_OK &&
                         save_objects(cs, &ns, h, 2) == 2
                     ? 0
                     : 1;
        kvd_store_close(cs);
        _exit(rc);
    }
    int cst = 0;
    assert_int_equal(waitpid(child, &cst, 0), child);
    assert_true(WIFEXITED(cst) && WEXITSTATUS(cst) == 0);
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    assert_int_equal(save_objects(st, &ns, h + 2, 3), 3);
    kvd_client_ns_usage_t *nu = NULL;
    kvd_client_tenant_usage_t *tu = NULL;
    size_t nn = 0, nt = 0;
    bool trunc = false;
    assert_int_equal(
        kvd_client_list(kvd_client_of(st), &nu, &nn, &tu, &nt, &trunc), KVD_OK);
    uint32_t team = (uint32_t)kvd_xxh3_64("team-nobody", 11);
    team = team == 0 ? 1 : team;
    assert_int_equal(nt, 2);
    for (size_t i = 0; i < nt; i++) {
        if (tu[i].tenant == team) {
            assert_int_equal(tu[i].objects, 2);
        } else {
            assert_int_equal(tu[i].tenant, 0);
            assert_int_equal(tu[i].objects, 3);
        }
    }
    free(nu);
    free(tu);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

/* Reserves, fills with `byte` and commits keys h[0..n) as tenant 0 (the
 * daemon binds the caller's own); returns how many committed. */
static size_t save_filled(kvd_store_t *st, const kvd_namespace_t *ns,
                          const kvd_block_hash_t *h, size_t n, uint8_t byte)
{
    kvd_store_reservation_t r[NKEYS];
    kvd_store_key_t keys[NKEYS];
    assert_true(n <= NKEYS);
    if (kvd_store_reserve(st, ns, h, n, OBJ_BYTES, 0, r) != KVD_OK) {
        return 0;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t *p = r[i].status == KVD_OK
                         ? kvd_store_reservation_ptr(st, &r[i], OBJ_BYTES)
                         : NULL;
        if (p == NULL) {
            continue;
        }
        memset(p, byte, OBJ_BYTES);
        keys[k].ns = *ns;
        keys[k++].hash = h[i];
    }
    kvd_status_t cs[NKEYS];
    if (k > 0 && kvd_store_commit(st, keys, k, cs) != KVD_OK) {
        return 0;
    }
    return k;
}

/* Whether the caller's whole mapping holds a page-aligned 4 KiB run of
 * `byte` (objects are page-aligned slots filled with one byte). */
static bool mapping_has_run(kvd_store_t *st, uint8_t byte)
{
    kvd_store_arena_export_t exp;
    assert_int_equal(kvd_store_arena_export(st, &exp), KVD_OK);
    close(exp.fd);
    for (uint64_t off = 0; off < exp.size_bytes; off += 4096) {
        const uint8_t *p = kvd_store_arena_ptr(st, exp.offset + off, 4096);
        assert_non_null(p);
        size_t i = 0;
        while (i < 4096 && p[i] == byte) {
            i++;
        }
        if (i == 4096) {
            return true;
        }
    }
    return false;
}

/* In a child as uid 65534 (tenant team-b, the main arena): saves its
 * keys (`save`) or checks they are all there; either way its mapping must
 * hold none of team-a's bytes. Exit code 0 when all holds. */
static int team_b_child(const kvd_test_dir_t *d, const kvd_namespace_t *ns,
                        const kvd_block_hash_t *h, bool save)
{
    kvd_store_t *cs = NULL;
    if (setgid(65534) != 0 || setuid(65534) != 0 ||
        client_open(d, "30s", "2s", &cs) != KVD_OK) {
        return 1;
    }
    int rc = 0;
    kvd_store_arena_export_t exp;
    if (kvd_store_arena_export(cs, &exp) != KVD_OK || exp.offset != 0 ||
        exp.size_bytes != 16u << 20) {
        rc = 2;
    } else {
        close(exp.fd);
    }
    if (rc == 0 && save && save_filled(cs, ns, h, 4, 0xB7) != 4) {
        rc = 3;
    }
    kvd_store_lease_t l[4];
    size_t m = 0;
    if (rc == 0 && !save &&
        (kvd_store_lookup(cs, ns, h, 4, l, &m) != KVD_OK || m != 4)) {
        rc = 4;
    }
    for (size_t i = 0; rc == 0 && !save && i < m; i++) {
        const uint8_t *p = kvd_store_lease_ptr(cs, &l[i]);
        if (p == NULL || p[0] != 0xB7 || p[OBJ_BYTES - 1] != 0xB7) {
            rc = 5;
        }
    }
    if (rc == 0 && mapping_has_run(cs, 0xA7)) {
        rc = 6; /* team-a's bytes readable from team-b's process */
    }
    kvd_store_close(cs);
    return rc;
}

static void team_b_run(const kvd_test_dir_t *d, const kvd_namespace_t *ns,
                       const kvd_block_hash_t *h, bool save)
{
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        _exit(team_b_child(d, ns, h, save));
    }
    int cst = 0;
    assert_int_equal(waitpid(child, &cst, 0), child);
    assert_true(WIFEXITED(cst));
    assert_int_equal(WEXITSTATUS(cst), 0);
}

/* /metrics says what backs the arena: 4 KiB pages and nothing else with
 * store.arena_hugepages=off; exactly one backing with the default (auto),
 * whatever this host offers. */
static void test_arena_pages_metric(void **state)
{
    (void)state;
    static const char *const names[] = {
        "kvdepot_arena_pages{backing=\"plain\"}",
        "kvdepot_arena_pages{backing=\"thp\"}",
        "kvdepot_arena_pages{backing=\"hugetlb\"}"};
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_arena_pages");
    pid_t dpid =
        daemon_start(&d, "store.arena_hugepages=off",
                     "server.metrics_address=127.0.0.1:0", (const char *)NULL);
    assert_true(kvd_test_daemon_metric(&d, names[0]) == 1);
    assert_true(kvd_test_daemon_metric(&d, names[1]) == 0);
    assert_true(kvd_test_daemon_metric(&d, names[2]) == 0);
    daemon_stop(dpid);
    dpid = daemon_start(&d, "server.metrics_address=127.0.0.1:0",
                        (const char *)NULL);
    double sum = 0;
    for (size_t i = 0; i < 3; i++) {
        double v = kvd_test_daemon_metric(&d, names[i]);
        assert_true(v == 0 || v == 1);
        sum += v;
    }
    assert_true(sum == 1);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

/* server.tenant_arenas: a tenant with an arena of its own receives that
 * arena's memfd only at the hand-off. Its process cannot reach another
 * tenant's bytes, nor another tenant its bytes, and its saves evict only
 * its own objects. The other tenant (a child as uid 65534) needs root. */
static void test_tenant_arenas(void **state)
{
    (void)state;
    bool root = geteuid() == 0;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_tenant_arenas");
    assert_int_equal(chmod(d.path, 0755), 0);
    char tenants[96];
    snprintf(tenants, sizeof tenants, "server.tenants=%u=team-a%s",
             (unsigned)getuid(), root ? ",65534=team-b" : "");
    /* 4 MiB: 2 chunks of 2 MiB, 64 objects of 64 KiB. */
    pid_t dpid = daemon_start(
        &d, tenants, "server.tenant_arenas=team-a=4m", "server.unix_mode=0666",
        "server.metrics_address=127.0.0.1:0", (const char *)NULL);
    assert_int_equal(
        kvd_test_daemon_metric(&d, "kvdepot_arena_bytes{arena=\"main\"}"),
        16u << 20);
    assert_int_equal(
        kvd_test_daemon_metric(&d, "kvdepot_arena_bytes{arena=\"team-a\"}"),
        4u << 20);
    assert_int_equal(kvd_test_daemon_metric(
                         &d, "kvdepot_arena_free_bytes{arena=\"team-a\"}"),
                     4u << 20);
    /* The children fork while this process has no client open (a gRPC
     * client does not survive a fork). */
    kvd_namespace_t nsb;
    kvd_block_hash_t hb[4];
    keys_make(&nsb, hb, 4, 0xB0);
    if (root) {
        team_b_run(&d, &nsb, hb, true);
    }
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    kvd_store_arena_export_t exp;
    assert_int_equal(kvd_store_arena_export(st, &exp), KVD_OK);
    assert_int_equal(exp.offset, 16u << 20); /* after store.arena_size */
    assert_int_equal(exp.size_bytes, 4u << 20);
    struct stat sb;
    assert_int_equal(fstat(exp.fd, &sb), 0);
    assert_int_equal((uint64_t)sb.st_size, 4u << 20);
    close(exp.fd);
    assert_null(kvd_store_arena_ptr(st, 0, 1));
    assert_null(kvd_store_arena_ptr(st, (16u << 20) - 1, 2));
    assert_null(kvd_store_arena_ptr(st, 20u << 20, 1));

    /* team-a saves 10 batches of 8 into its 64 slots: the first ones are
     * evicted, the last ones are there, with its bytes. */
    kvd_namespace_t nsa;
    kvd_block_hash_t ha[10][NKEYS];
    for (uint8_t b = 0; b < 10; b++) {
        keys_make(&nsa, ha[b], NKEYS, (uint8_t)(0xA0 + b));
        assert_int_equal(save_filled(st, &nsa, ha[b], NKEYS, 0xA7), NKEYS);
    }
    kvd_store_lease_t l[NKEYS];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &nsa, ha[9], NKEYS, l, &m), KVD_OK);
    assert_int_equal(m, NKEYS);
    for (size_t i = 0; i < m; i++) {
        assert_true(l[i].arena_offset >= 16u << 20);
        const uint8_t *p = kvd_store_lease_ptr(st, &l[i]);
        assert_non_null(p);
        assert_int_equal(p[0], 0xA7);
        assert_int_equal(p[OBJ_BYTES - 1], 0xA7);
    }
    assert_int_equal(kvd_store_release(st, l, m), KVD_OK);
    assert_int_equal(kvd_store_lookup(st, &nsa, ha[0], NKEYS, l, &m), KVD_OK);
    assert_int_equal(m, 0);
    assert_false(mapping_has_run(st, 0xB7));
    /* team-a's arena is full; the main one holds team-b's one chunk. */
    assert_int_equal(kvd_test_daemon_metric(
                         &d, "kvdepot_arena_free_bytes{arena=\"team-a\"}"),
                     0);
    assert_int_equal(
        kvd_test_daemon_metric(&d, "kvdepot_arena_free_bytes{arena=\"main\"}"),
        root ? 14u << 20 : 16u << 20);
    kvd_store_close(st);

    if (root) {
        /* team-b's objects outlived team-a's pressure, and team-b's
         * process still sees none of team-a's bytes. */
        team_b_run(&d, &nsb, hb, false);
    }
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

/* A tenant arena's objects come back from NVMe after a restart into the
 * same tenant's arena (the index keeps each object's tenant). */
static void test_tenant_arena_after_restart(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_tenant_restart");
    char disk[300], nvme[300], tenants[64];
    snprintf(disk, sizeof disk, "store.disk_path=%s/nvme", d.path);
    snprintf(nvme, sizeof nvme, "%s/nvme", d.path);
    assert_int_equal(mkdir(nvme, 0700), 0);
    snprintf(tenants, sizeof tenants, "server.tenants=%u=team-a",
             (unsigned)getuid());
    pid_t dpid =
        daemon_start(&d, tenants, "server.tenant_arenas=team-a=4m", disk,
                     "store.disk_size=32m", "store.disk_write=through",
                     "store.sync_interval=0", (const char *)NULL);
    kvd_namespace_t ns;
    kvd_block_hash_t h[4];
    keys_make(&ns, h, 4, 21);
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    assert_int_equal(save_objects(st, &ns, h, 4), 4);
    assert_int_equal(kvd_store_flush(st, 10000), KVD_OK);
    kvd_store_close(st);
    daemon_stop(dpid);

    dpid = daemon_start(&d, tenants, "server.tenant_arenas=team-a=4m", disk,
                        "store.disk_size=32m", "store.disk_write=through",
                        "store.sync_interval=0", (const char *)NULL);
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    kvd_store_lease_t l[4], got[4];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, h, 4, l, &m), KVD_OK);
    assert_int_equal(m, 4);
    get_from_disk(st, l, 4, got);
    for (size_t i = 0; i < 4; i++) {
        assert_true(got[i].arena_offset >= 16u << 20); /* team-a's arena */
        check_bytes(st, &got[i]);
    }
    assert_int_equal(kvd_store_release(st, got, 4), KVD_OK);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_without_daemon),
        cmocka_unit_test(test_two_processes_share),
        cmocka_unit_test(test_restart_keeps_disk_tier),
        cmocka_unit_test(test_restart_keeps_offsets_in_their_arena),
        cmocka_unit_test(test_tenant_lease_cap),
        cmocka_unit_test(test_killed_client_leases_reclaimed),
        cmocka_unit_test(test_dead_daemon_no_hang),
        cmocka_unit_test(test_admin_list_drop_drain),
        cmocka_unit_test(test_tenant_of_user),
        cmocka_unit_test(test_arena_pages_metric),
        cmocka_unit_test(test_tenant_arenas),
        cmocka_unit_test(test_tenant_arena_after_restart),
    };
    return cmocka_run_group_tests(tests, skip_without_daemon, NULL);
}
