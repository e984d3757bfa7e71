/*
 * kvdepotd under injected faults: a real daemon (the binary in $KVDEPOTD)
 * started with KVDEPOT_FAILPOINTS armed, driven by a daemon-mode client
 * (store.mode=daemon) through the store.h calls an engine makes.
 *   - EIO / ENOSPC on every NVMe write (write-through): saves land in the
 *     arena, nothing reaches the disk tier, no lease or write is left over;
 *   - EIO on an NVMe read after a restart: the get of that disk-only object
 *     completes with KVD_ERR_IO, never with wrong bytes, and the other
 *     objects (and the same one, once the fault is gone) still load;
 *   - ENOSPC in every LMDB put transaction: writes to disk are dropped
 *     cleanly, the arena keeps serving; batch after batch, each flush
 *     says KVD_ERR_NOSPACE and the log gets at most a line a second per
 *     call site; the client's kvd_store_stats shows the drops and errors;
 *   - ENOMEM growing the tenant table: exactly that reserve is refused, the
 *     next one succeeds; ENOMEM in the allocations made at start-up stops
 *     the start with exit code 1 and the reason, without hanging.
 * Each failing call must come back within store.timeout (plus slack for a
 * loaded, sanitized machine), and afterwards the same daemon still serves:
 * a fresh save, lookup and read of another object, Stats, a graceful stop.
 * The figures (time to error, statuses) go to stderr for
 * docs/reliability.md. Skipped (77) without $KVDEPOTD or when failpoints are
 * compiled out (the release preset).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvdepot/store.h"
#include "tests/unit/kvd_testdir_int.h"
#include "tests/integration/kvd_testdaemon_int.h"

#define OBJ_BYTES (64u << 10)
#define NKEYS 8
/* store.timeout of every client here, and the slack allowed on top of it
 * (sanitizer builds on 2 cores). */
#define TIMEOUT_MS 1000u
#define TIMEOUT_STR "1s"
#define SLACK_MS 2000u
/* /metrics on a loopback port the daemon picks (in its ready file). */
#define METRICS "server.metrics_address=127.0.0.1:0"

static const char *daemon_bin(void)
{
    return kvd_test_daemon_bin();
}

static uint64_t now_ms(void)
{
    return kvd_test_now_ms();
}

static pid_t daemon_spawn(const kvd_test_dir_t *d, const char *failpoints,
                          va_list ap)
{
    return kvd_test_daemon_spawn(d, failpoints, ap);
}

/* Starts kvdepotd and waits for its ready file. Returns the pid. */
static pid_t daemon_start(const kvd_test_dir_t *d, const char *failpoints, ...)
{
    va_list ap;
    va_start(ap, failpoints);
    pid_t pid = daemon_spawn(d, failpoints, ap);
    va_end(ap);
    kvd_test_daemon_wait_ready(d, pid);
    return pid;
}

/* Starts kvdepotd expecting it not to start: waits (up to timeout_ms) for
 * it to exit and returns its exit code. */
static int daemon_run_to_exit(const kvd_test_dir_t *d, const char *failpoints,
                              ...)
{
    va_list ap;
    va_start(ap, failpoints);
    pid_t pid = daemon_spawn(d, failpoints, ap);
    va_end(ap);
    uint64_t deadline = now_ms() + 20000;
    int st = 0;
    pid_t w;
    while ((w = waitpid(pid, &st, WNOHANG)) == 0) {
        if (now_ms() > deadline) {
            (void)kill(pid, SIGKILL);
            (void)waitpid(pid, &st, 0);
            fail_msg("kvdepotd with %s neither started nor exited", failpoints);
        }
        usleep(5000);
    }
    assert_int_equal(w, pid);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static void daemon_assert_alive(pid_t pid)
{
    int st;
    assert_int_equal(waitpid(pid, &st, WNOHANG), 0);
    assert_int_equal(kill(pid, 0), 0);
}

/* SIGTERM and wait: a graceful stop exits 0, failpoints armed or not. */
static void daemon_stop(pid_t pid)
{
    daemon_assert_alive(pid);
    kvd_test_daemon_stop(pid);
}

/* Whether d/daemon.log contains `what`. */
static bool daemon_log_has(const kvd_test_dir_t *d, const char *what)
{
    char path[300], buf[16384];
    snprintf(path, sizeof path, "%s/daemon.log", d->path);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return false;
    }
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, what) != NULL;
}

/* How many lines of the daemon's log contain `what`. */
static unsigned daemon_log_count(const kvd_test_dir_t *d, const char *what)
{
    char path[300], line[1024];
    snprintf(path, sizeof path, "%s/daemon.log", d->path);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    unsigned n = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        n += strstr(line, what) != NULL;
    }
    fclose(f);
    return n;
}

/* The metrics port the daemon wrote into its ready file. */
static int metrics_port(const kvd_test_dir_t *d)
{
    char path[300];
    snprintf(path, sizeof path, "%s/ready", d->path);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[128];
    int port = -1;
    while (fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "metrics_port=%d", &port) == 1) {
            break;
        }
    }
    fclose(f);
    assert_true(port > 0);
    return port;
}

/* Reads one sample of the daemon's /metrics (over loopback HTTP): the
 * value of the line that starts with `name` and a space. The store's error
 * and dropped-write counters are there, not in the Stats RPC. */
static uint64_t metric_get(int port, const char *name)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    static const char rq[] = "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
    assert_int_equal(write(fd, rq, sizeof rq - 1), (ssize_t)(sizeof rq - 1));
    size_t cap = 1u << 18, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (ssize_t n; (n = read(fd, buf + len, cap - 1 - len)) > 0;) {
        len += (size_t)n;
        assert_true(len < cap - 1);
    }
    close(fd);
    buf[len] = '\0';
    char key[160];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(buf, key);
    if (p == NULL) {
        free(buf);
        fail_msg("metric %s not in /metrics", name);
    }
    uint64_t v = strtoull(p + strlen(key), NULL, 10);
    free(buf);
    return v;
}

static kvd_store_t *client_open(const kvd_test_dir_t *d)
{
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    char addr[300];
    snprintf(addr, sizeof addr, "unix:%s/d.sock", d->path);
    assert_int_equal(kvd_config_set(cfg, "store.mode", "daemon"), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.address", addr), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.timeout", TIMEOUT_STR), KVD_OK);
    char err[256] = "";
    kvd_store_t *st = NULL;
    kvd_status_t s = kvd_store_open(cfg, &st, err, sizeof err);
    if (s != KVD_OK) {
        fail_msg("client open: %s (%s)", kvd_status_str(s), err);
    }
    kvd_config_destroy(cfg);
    return st;
}

static void keys_make(kvd_namespace_t *ns, kvd_block_hash_t *h, size_t n,
                      uint8_t seed)
{
    memset(ns->bytes, 0x3C, sizeof ns->bytes);
    for (size_t i = 0; i < n; i++) {
        memset(h[i].bytes, 0, sizeof h[i].bytes);
        h[i].bytes[0] = seed;
        h[i].bytes[1] = (uint8_t)i;
        h[i].bytes[31] = 0xC3;
    }
}

static uint8_t pattern(const kvd_block_hash_t *h, size_t i)
{
    return (uint8_t)(h->bytes[0] * 29u + h->bytes[1] * 131u + i * 7u +
                     (i >> 12));
}

/* Reserves, writes and commits n objects for `tenant`; returns how many
 * committed. */
static size_t save_objects(kvd_store_t *st, const kvd_namespace_t *ns,
                           const kvd_block_hash_t *h, size_t n, uint32_t tenant)
{
    kvd_store_reservation_t r[NKEYS];
    assert_true(n <= NKEYS);
    assert_int_equal(kvd_store_reserve(st, ns, h, n, OBJ_BYTES, tenant, r),
                     KVD_OK);
    kvd_store_key_t keys[NKEYS];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].status != KVD_OK) {
            continue;
        }
        uint8_t *p = kvd_store_arena_ptr(st, r[i].arena_offset, OBJ_BYTES);
        assert_non_null(p);
        for (size_t b = 0; b < OBJ_BYTES; b++) {
            p[b] = pattern(&h[i], b);
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
        if (p[b] != pattern(&l->key.hash, b)) {
            fail_msg("key %u/%u byte %zu: %u, want %u", l->key.hash.bytes[0],
                     l->key.hash.bytes[1], b, p[b], pattern(&l->key.hash, b));
        }
    }
}

/* Looks up n keys, expects all of them in the arena with their bytes, and
 * releases them. */
static void lookup_host_check(kvd_store_t *st, const kvd_namespace_t *ns,
                              const kvd_block_hash_t *h, size_t n)
{
    kvd_store_lease_t l[NKEYS];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, ns, h, n, l, &m), KVD_OK);
    assert_int_equal(m, n);
    for (size_t i = 0; i < m; i++) {
        check_bytes(st, &l[i]);
    }
    assert_int_equal(kvd_store_release(st, l, m), KVD_OK);
}

/* The daemon still serves after a fault: a fresh object saves, looks up and
 * reads back, Stats answers and the process lives. */
static void assert_serving(pid_t dpid, kvd_store_t *st, uint8_t seed)
{
    kvd_namespace_t ns;
    kvd_block_hash_t h[1];
    keys_make(&ns, h, 1, seed);
    assert_int_equal(save_objects(st, &ns, h, 1, 0), 1);
    lookup_host_check(st, &ns, h, 1);
    kvd_store_stats_t s;
    assert_int_equal(kvd_store_stats(st, &s), KVD_OK);
    daemon_assert_alive(dpid);
}

static void assert_within_deadline(uint64_t t0, const char *what)
{
    uint64_t took = now_ms() - t0;
    fprintf(stderr, "  %s: %llu ms\n", what, (unsigned long long)took);
    assert_true(took <= TIMEOUT_MS + SLACK_MS);
}

/* After a flush of n saves written through to a failing disk tier: none
 * reached it, the daemon counted each as a disk error and a dropped write
 * (once for the write-through, and again when the flush tried the object
 * before the write-through had failed: n to 2n), holds no store lease for
 * them, and all n are in the arena. */
static void assert_writes_dropped(const kvd_test_dir_t *d, kvd_store_t *st,
                                  uint64_t n)
{
    kvd_store_stats_t s;
    assert_int_equal(kvd_store_stats(st, &s), KVD_OK);
    int port = metrics_port(d);
    uint64_t errors =
        metric_get(port, "kvdepot_tier_errors_total{tier=\"disk\"}");
    uint64_t dropped = metric_get(port, "kvdepot_dropped_writes_total");
    uint64_t leases = metric_get(port, "kvdepot_store_leases");
    fprintf(stderr,
            "  disk objects %llu, disk errors %llu, dropped writes %llu, "
            "store leases %llu\n",
            (unsigned long long)s.disk.objects, (unsigned long long)errors,
            (unsigned long long)dropped, (unsigned long long)leases);
    assert_int_equal(s.disk.objects, 0);
    assert_int_equal(s.disk.bytes_written, 0);
    assert_int_equal(s.host.objects, n);
    assert_true(errors >= n && errors <= 2 * n);
    assert_true(dropped >= n && dropped <= 2 * n);
    assert_int_equal(leases, 0);
    /* The client's kvd_store_stats carries the same figures (Stats,
     * protocol revision 5), not zeros. */
    fprintf(stderr,
            "  kvd_store_stats: disk errors %llu, dropped writes %llu\n",
            (unsigned long long)s.disk.errors,
            (unsigned long long)s.dropped_writes);
    assert_true(s.disk.errors >= n && s.disk.errors <= 2 * n);
    assert_true(s.dropped_writes >= n && s.dropped_writes <= 2 * n);
    assert_int_equal(s.writes_pending, 0);
}

/* Completes one get per key in g[0..n) and writes each status into
 * status_out[user_data] and lease into got[user_data]. */
static void gets_run(kvd_store_t *st, const kvd_store_get_t *g, size_t n,
                     kvd_status_t *status_out, kvd_store_lease_t *got)
{
    size_t acc = 0;
    assert_int_equal(kvd_store_get_submit(st, g, n, &acc), KVD_OK);
    assert_int_equal(acc, n);
    size_t done = 0;
    uint64_t deadline = now_ms() + TIMEOUT_MS + SLACK_MS;
    while (done < n) {
        assert_true(now_ms() < deadline);
        (void)kvd_store_wait(st, 50);
        kvd_store_completion_t c[NKEYS];
        size_t k = kvd_store_poll(st, c, NKEYS);
        for (size_t i = 0; i < k; i++) {
            status_out[c[i].user_data] = c[i].status;
            got[c[i].user_data] = c[i].lease;
            done++;
        }
    }
}

static void disk_settings(const kvd_test_dir_t *d, char *disk, size_t len)
{
    snprintf(disk, len, "store.disk_path=%s/nvme", d->path);
    char nvme[300];
    snprintf(nvme, sizeof nvme, "%s/nvme", d->path);
    assert_true(mkdir(nvme, 0700) == 0 || errno == EEXIST);
}

/* Cases 1 and 2: every NVMe write fails with `spec`'s errno. */
static void nvme_write_fault(const char *tag, const char *spec)
{
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, tag);
    char disk[300];
    disk_settings(&d, disk, sizeof disk);
    pid_t dpid = daemon_start(
        &d, spec, disk, "store.disk_size=32m", "store.disk_write=through",
        "store.sync_interval=0", METRICS, (const char *)NULL);
    kvd_store_t *st = client_open(&d);
    kvd_namespace_t ns;
    kvd_block_hash_t h[4];
    keys_make(&ns, h, 4, 1);

    fprintf(stderr, "%s:\n", spec);
    uint64_t t0 = now_ms();
    assert_int_equal(save_objects(st, &ns, h, 4, 0), 4);
    assert_within_deadline(t0, "save of 4 objects (commit)");
    t0 = now_ms();
    kvd_status_t fs = kvd_store_flush(st, (int)TIMEOUT_MS);
    assert_within_deadline(t0, "flush");
    fprintf(stderr, "  flush: %s\n", kvd_status_str(fs));
    assert_true(fs < 0); /* the dropped writes are reported */

    /* Nothing reached the disk tier; every write is counted as failed and
     * dropped; the store's write-through leases are all given back. */
    assert_writes_dropped(&d, st, 4);

    /* The saves are served from the arena, bytes intact. */
    lookup_host_check(st, &ns, h, 4);
    assert_serving(dpid, st, 2);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

static void test_nvme_write_eio(void **state)
{
    (void)state;
    nvme_write_fault("faults_weio", "nvme.write=EIO@1+");
}

static void test_nvme_write_enospc(void **state)
{
    (void)state;
    nvme_write_fault("faults_wnospc", "nvme.write=ENOSPC@1+");
}

/* Case 3: objects flushed to NVMe by one daemon; a second one on the same
 * files fails its first NVMe read with EIO. */
static void test_nvme_read_eio(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "faults_reio");
    char disk[300];
    disk_settings(&d, disk, sizeof disk);
    kvd_namespace_t ns;
    kvd_block_hash_t h[3];
    keys_make(&ns, h, 3, 3);
    pid_t dpid = daemon_start(&d, NULL, disk, "store.disk_size=32m",
                              "store.disk_write=through",
                              "store.sync_interval=0", (const char *)NULL);
    kvd_store_t *st = client_open(&d);
    assert_int_equal(save_objects(st, &ns, h, 3, 0), 3);
    assert_int_equal(kvd_store_flush(st, 10000), KVD_OK);
    kvd_store_stats_t s;
    assert_int_equal(kvd_store_stats(st, &s), KVD_OK);
    assert_int_equal(s.disk.objects, 3);
    kvd_store_close(st);
    daemon_stop(dpid);

    /* The new daemon's arena is empty: the objects are on disk only. */
    dpid = daemon_start(&d, "nvme.read=EIO@1", disk, "store.disk_size=32m",
                        "store.disk_write=through", "store.sync_interval=0",
                        METRICS, (const char *)NULL);
    st = client_open(&d);
    kvd_store_lease_t l[3];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, h, 3, l, &m), KVD_OK);
    assert_int_equal(m, 3);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(l[i].tier, KVD_STORE_TIER_DISK);
    }

    /* The first read fails: that object, and only it, fails to load. */
    fprintf(stderr, "nvme.read=EIO@1:\n");
    kvd_store_get_t g = {.lease = l[0], .user_data = 0};
    kvd_status_t gs[3];
    kvd_store_lease_t got[3];
    uint64_t t0 = now_ms();
    gets_run(st, &g, 1, gs, got);
    assert_within_deadline(t0, "get of the failing object");
    fprintf(stderr, "  get status: %s\n", kvd_status_str(gs[0]));
    assert_int_equal(gs[0], KVD_ERR_IO);

    /* The others load with their bytes. */
    kvd_store_get_t g2[2] = {{.lease = l[1], .user_data = 1},
                             {.lease = l[2], .user_data = 2}};
    t0 = now_ms();
    gets_run(st, g2, 2, gs, got);
    assert_within_deadline(t0, "gets of 2 other objects");
    for (size_t i = 1; i < 3; i++) {
        assert_int_equal(gs[i], KVD_OK);
        check_bytes(st, &got[i]);
    }
    assert_int_equal(kvd_store_release(st, got + 1, 2), KVD_OK);

    /* A read error is not corruption: the object stays indexed and loads
     * once the device answers again. */
    assert_int_equal(kvd_store_stats(st, &s), KVD_OK);
    assert_int_equal(s.disk.objects, 3);
    assert_int_equal(s.checksum_errors, 0);
    assert_int_equal(metric_get(metrics_port(&d),
                                "kvdepot_tier_errors_total{tier=\"disk\"}"),
                     1);
    assert_int_equal(kvd_store_lookup(st, &ns, h, 1, l, &m), KVD_OK);
    assert_int_equal(m, 1);
    assert_int_equal(l[0].tier, KVD_STORE_TIER_DISK);
    g = (kvd_store_get_t){.lease = l[0], .user_data = 0};
    gets_run(st, &g, 1, gs, got);
    assert_int_equal(gs[0], KVD_OK);
    check_bytes(st, &got[0]);
    assert_int_equal(kvd_store_release(st, got, 1), KVD_OK);

    assert_serving(dpid, st, 4);
    assert_int_equal(kvd_store_stats(st, &s), KVD_OK);
    assert_int_equal(s.leases, 0);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

/* Case 4: every LMDB put transaction fails (ENOSPC, as a full file system
 * under the map would). */
static void test_index_put_enospc(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "faults_index");
    char disk[300];
    disk_settings(&d, disk, sizeof disk);
    pid_t dpid =
        daemon_start(&d, "index.put=ENOSPC@1+", disk, "store.disk_size=32m",
                     "store.disk_write=through", "store.sync_interval=0",
                     METRICS, (const char *)NULL);
    kvd_store_t *st = client_open(&d);
    kvd_namespace_t ns;
    kvd_block_hash_t h[4];
    keys_make(&ns, h, 4, 5);

    fprintf(stderr, "index.put=ENOSPC@1+:\n");
    uint64_t t0 = now_ms();
    assert_int_equal(save_objects(st, &ns, h, 4, 0), 4);
    assert_within_deadline(t0, "save of 4 objects (commit)");
    t0 = now_ms();
    kvd_status_t fs = kvd_store_flush(st, (int)TIMEOUT_MS);
    assert_within_deadline(t0, "flush");
    fprintf(stderr, "  flush: %s\n", kvd_status_str(fs));
    assert_true(fs < 0); /* the dropped writes are reported */

    /* Written but never indexed: not on the disk tier, extents given back
     * (a restart finds nothing half-recorded). */
    assert_writes_dropped(&d, st, 4);
    assert_true(daemon_log_has(&d, "index: put batch"));

    lookup_host_check(st, &ns, h, 4);
    assert_serving(dpid, st, 6);
    kvd_store_close(st);
    daemon_stop(dpid);

    /* Restarted without the fault: the disk tier holds none of them. */
    dpid =
        daemon_start(&d, NULL, disk, "store.disk_size=32m", (const char *)NULL);
    st = client_open(&d);
    kvd_store_lease_t l[4];
    size_t m = 99;
    assert_int_equal(kvd_store_lookup(st, &ns, h, 4, l, &m), KVD_OK);
    assert_int_equal(m, 0);
    kvd_store_stats_t s;
    assert_int_equal(kvd_store_stats(st, &s), KVD_OK);
    assert_int_equal(s.disk.objects, 0);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

/* A full file system under the index, batch after batch: each of
 * FULL_BATCHES saves is flushed alone, so each is one failed LMDB put.
 * Every flush says KVD_ERR_NOSPACE (not KVD_ERR_IO), and the log stays
 * quiet: each call site that reports the failure writes at most one line
 * a second (plus the first), with the count of those suppressed. */
#define FULL_BATCHES 24
static void test_index_full_log_throttled(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "faults_full");
    char disk[300];
    disk_settings(&d, disk, sizeof disk);
    pid_t dpid = daemon_start(&d, "index.put=ENOSPC@1+", disk,
                              "store.disk_size=32m", "store.disk_write=through",
                              "store.sync_interval=0", (const char *)NULL);
    kvd_store_t *st = client_open(&d);
    kvd_namespace_t ns;
    kvd_block_hash_t h[1];
    uint64_t t0 = now_ms();
    for (unsigned i = 0; i < FULL_BATCHES; i++) {
        keys_make(&ns, h, 1, (uint8_t)(0x80 + i));
        assert_int_equal(save_objects(st, &ns, h, 1, 0), 1);
        assert_int_equal(kvd_store_flush(st, (int)TIMEOUT_MS), KVD_ERR_NOSPACE);
    }
    uint64_t took = now_ms() - t0;
    kvd_store_stats_t s;
    assert_int_equal(kvd_store_stats(st, &s), KVD_OK);
    assert_true(s.dropped_writes >= FULL_BATCHES);
    kvd_store_close(st);
    daemon_stop(dpid);
    unsigned store_lines = daemon_log_count(&d, "store: index put");
    unsigned index_lines = daemon_log_count(&d, "index: put batch");
    unsigned allowed = 2u + (unsigned)(took / 1000u);
    fprintf(stderr,
            "%u failed batches in %llu ms: %u + %u log lines (at most %u "
            "each), %llu dropped writes\n",
            FULL_BATCHES, (unsigned long long)took, store_lines, index_lines,
            allowed, (unsigned long long)s.dropped_writes);
    assert_true(store_lines >= 1 && store_lines <= allowed);
    assert_true(index_lines >= 1 && index_lines <= allowed);
    kvd_test_dir_remove(&d);
}

/* index.delete failing (the LMDB transaction that removes NVMe objects'
 * records): a Delete of flushed objects says so (KVD_ERR_IO) instead of
 * reporting them deleted, since their records survive and a restart finds
 * them again (with their right bytes); the daemon keeps serving. */
static void test_index_delete_eio(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "faults_idel");
    char disk[300];
    disk_settings(&d, disk, sizeof disk);
    pid_t dpid = daemon_start(&d, "index.delete=EIO@1+", disk,
                              "store.disk_size=32m", "store.disk_write=through",
                              "store.sync_interval=0", (const char *)NULL);
    kvd_store_t *st = client_open(&d);
    kvd_namespace_t ns;
    kvd_block_hash_t h[4];
    keys_make(&ns, h, 4, 9);
    assert_int_equal(save_objects(st, &ns, h, 4, 0), 4);
    assert_int_equal(kvd_store_flush(st, (int)TIMEOUT_MS), KVD_OK);
    kvd_store_key_t keys[4];
    for (int i = 0; i < 4; i++) {
        keys[i].ns = ns;
        keys[i].hash = h[i];
    }
    size_t deleted = 99;
    uint64_t t0 = now_ms();
    kvd_status_t s = kvd_store_delete(st, keys, 4, &deleted);
    assert_within_deadline(t0, "delete");
    fprintf(stderr, "index.delete=EIO@1+: delete -> %s\n", kvd_status_str(s));
    assert_int_equal(s, KVD_ERR_IO);
    assert_true(daemon_log_has(&d, "cannot remove"));
    assert_serving(dpid, st, 10);
    kvd_store_close(st);
    daemon_stop(dpid);

    /* Their records survived: a restart serves them, bytes intact. */
    dpid =
        daemon_start(&d, NULL, disk, "store.disk_size=32m", (const char *)NULL);
    st = client_open(&d);
    kvd_store_lease_t l[4];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, h, 4, l, &m), KVD_OK);
    assert_int_equal(m, 4);
    assert_int_equal(kvd_store_release(st, l, m), KVD_OK);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

/* Case 5a: the tenant table cannot grow (ENOMEM) when the ninth tenant
 * saves; that reserve is refused, the next one (same tenant) succeeds. */
static void test_tenant_alloc_nomem(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "faults_tenant");
    pid_t dpid =
        daemon_start(&d, "l1.tenant_alloc=ENOMEM@1", (const char *)NULL);
    kvd_store_t *st = client_open(&d);
    kvd_namespace_t ns;
    kvd_block_hash_t h[1];
    fprintf(stderr, "l1.tenant_alloc=ENOMEM@1:\n");
    uint32_t failed_tenant = 0;
    for (uint32_t t = 1; t <= 20 && failed_tenant == 0; t++) {
        keys_make(&ns, h, 1, (uint8_t)(0x40 + t));
        kvd_store_reservation_t r;
        uint64_t t0 = now_ms();
        assert_int_equal(kvd_store_reserve(st, &ns, h, 1, OBJ_BYTES, t, &r),
                         KVD_OK);
        if (r.status == KVD_OK) {
            kvd_store_key_t k = {.ns = ns, .hash = h[0]};
            kvd_status_t as;
            assert_int_equal(kvd_store_abort(st, &k, 1, &as), KVD_OK);
            continue;
        }
        assert_within_deadline(t0, "refused reserve");
        fprintf(stderr, "  tenant %u: reserve status %s\n", t,
                kvd_status_str(r.status));
        /* REJECTED ("skip this save") with its cause (BlockReservation
         * .status, revision 3): out of memory, not "no space". */
        assert_int_equal(r.status, KVD_ERR_NOMEM);
        failed_tenant = t;
    }
    /* The table starts with 16 places at most half full: 8 tenants. */
    assert_int_equal(failed_tenant, 9);
    assert_true(daemon_log_has(&d, "cannot grow the tenant map"));

    /* The next reserve of the same tenant grows the table and succeeds. */
    keys_make(&ns, h, 1, (uint8_t)(0x40 + failed_tenant));
    assert_int_equal(save_objects(st, &ns, h, 1, failed_tenant), 1);
    lookup_host_check(st, &ns, h, 1);
    assert_serving(dpid, st, 7);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

/* A tenant-bound caller's namespace is SHA-256 of the tenant and the
 * namespace; with libcrypto failing (failpoint hash.sha256, every call) its
 * lookups and reserves fail with a clear status within the deadline, nothing
 * is stored under an unscoped namespace, and the daemon keeps running. */
static void test_tenant_namespace_sha256_fails(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "faults_sha");
    char tenants[64];
    snprintf(tenants, sizeof tenants, "server.tenants=%u=team-a",
             (unsigned)getuid());
    pid_t dpid =
        daemon_start(&d, "hash.sha256=EIO@1+", tenants, (const char *)NULL);
    kvd_store_t *st = client_open(&d);
    kvd_namespace_t ns;
    kvd_block_hash_t h[2];
    keys_make(&ns, h, 2, 0x71);
    kvd_store_lease_t l[2];
    size_t m = 9;
    uint64_t t0 = now_ms();
    kvd_status_t s = kvd_store_lookup(st, &ns, h, 2, l, &m);
    assert_within_deadline(t0, "lookup");
    fprintf(stderr, "hash.sha256=EIO@1+: tenant lookup -> %s, matched %zu\n",
            kvd_status_str(s), s == KVD_OK ? m : 0);
    assert_true(s != KVD_OK || m == 0);
    kvd_store_reservation_t r[2];
    t0 = now_ms();
    s = kvd_store_reserve(st, &ns, h, 2, OBJ_BYTES, 0, r);
    assert_within_deadline(t0, "reserve");
    fprintf(stderr, "  tenant reserve -> %s (%s)\n", kvd_status_str(s),
            s == KVD_OK ? kvd_status_str(r[0].status) : "-");
    /* The cause, not "no space" (the client said NOSPACE before). */
    assert_true(s != KVD_OK || (r[0].status == KVD_ERR_INTERNAL &&
                                r[1].status == KVD_ERR_INTERNAL));
    daemon_assert_alive(dpid);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

/* Case 5b: arena.alloc and l1.alloc are evaluated only while the store is
 * created (nothing allocates through them once the daemon serves), so an
 * injected ENOMEM there stops the start: exit code 1, the reason in the
 * log, no ready file, no hang. */
static void test_alloc_nomem_at_start(void **state)
{
    (void)state;
    const char *const specs[] = {
        "arena.alloc=ENOMEM@1",
        "arena.alloc=ENOMEM@2",
        "l1.alloc=ENOMEM@1",
        "l1.alloc=ENOMEM@4",
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kvd_test_dir_t d;
        kvd_test_dir_make(&d, "faults_alloc");
        uint64_t t0 = now_ms();
        int st = daemon_run_to_exit(&d, specs[i], (const char *)NULL);
        uint64_t took = now_ms() - t0;
        fprintf(stderr, "%s: exit code %d after %llu ms\n", specs[i], st,
                (unsigned long long)took);
        assert_int_equal(st, 1);
        assert_true(daemon_log_has(&d, "KVD_ERR_NOMEM"));
        char ready[300];
        snprintf(ready, sizeof ready, "%s/ready", d.path);
        assert_int_not_equal(access(ready, F_OK), 0);
        kvd_test_dir_remove(&d);
    }
}

static int setup_group(void **state)
{
    (void)state;
    if (daemon_bin() == NULL) {
        fprintf(stderr, "KVDEPOTD not set: skipped\n");
        exit(77);
    }
#ifndef KVD_FAILPOINTS_ENABLED
    fprintf(stderr, "failpoints compiled out: skipped\n");
    exit(77);
#endif
    return 0;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nvme_write_eio),
        cmocka_unit_test(test_nvme_write_enospc),
        cmocka_unit_test(test_nvme_read_eio),
        cmocka_unit_test(test_index_put_enospc),
        cmocka_unit_test(test_index_full_log_throttled),
        cmocka_unit_test(test_index_delete_eio),
        cmocka_unit_test(test_tenant_alloc_nomem),
        cmocka_unit_test(test_tenant_namespace_sha256_fails),
        cmocka_unit_test(test_alloc_nomem_at_start),
    };
    return cmocka_run_group_tests(tests, setup_group, NULL);
}
