/*
 * The store client (client/client.h) against a kvdepotd run in this
 * process (server/server_int.h: kvd_server_open, the same library the
 * binary is built from): the daemon's socket in a temporary directory, a
 * 16 MiB arena, optionally an NVMe tier in the same directory. A restart
 * stops the daemon and opens a new one on the same socket and disk (a new
 * instance, a new arena), which is what a client sees of a kvdepotd
 * restart. The daemon's own counters are read directly
 * (kvd_server_collect), never through the client, so reading them sends
 * none of the client's deferred releases. Header-only (static inline);
 * the including test has cmocka.h included first and links kvd_server.
 */
#ifndef KVD_TESTS_TESTCLIENT_INT_H
#define KVD_TESTS_TESTCLIENT_INT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client/client.h"
#include "common/log_int.h"
#include "kvdepot/store.h"
#include "server/server_int.h"
#include "server/srv_int.h" /* the daemon's own store, for its view */
#include "store/ops.h"
#include "tests/unit/kvd_testdir_int.h"

/* Object size of the helpers' saves, and most keys one helper call takes. */
#define KVD_TEST_CL_OBJ ((uint64_t)64 << 10)
#define KVD_TEST_CL_MAX 16
#define KVD_TEST_CL_SETS 8

typedef struct kvd_test_cl {
    kvd_test_dir_t dir;
    char address[256];                      /* unix:<dir>/d.sock */
    char disk[256];                         /* store.disk_path, or "" */
    const char *sets[2 * KVD_TEST_CL_SETS]; /* the daemon's extra settings */
    size_t n_sets;
    kvd_server_t *srv;
} kvd_test_cl_t;

static inline uint64_t kvd_test_cl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline uint64_t kvd_test_cl_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static inline void kvd_test_cl_set(kvd_config_t *cfg, const char *k,
                                   const char *v)
{
    if (kvd_config_set(cfg, k, v) != KVD_OK) {
        fail_msg("setting %s=%s refused", k, v);
    }
}

/* Opens a daemon with the settings kept in `t` (the same on a restart). */
static inline void kvd_test_cl_daemon_open(kvd_test_cl_t *t)
{
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    kvd_test_cl_set(cfg, "server.unix_socket", t->address + 5);
    kvd_test_cl_set(cfg, "server.node_id", "client-test-node");
    kvd_test_cl_set(cfg, "server.tick", "10ms");
    kvd_test_cl_set(cfg, "server.shutdown_grace", "1s");
    kvd_test_cl_set(cfg, "store.arena_size", "16m");
    kvd_test_cl_set(cfg, "store.arena_chunk", "2m");
    kvd_test_cl_set(cfg, "store.arena_hugepages", "off");
    kvd_test_cl_set(cfg, "store.arena_prefault", "false");
    kvd_test_cl_set(cfg, "store.reserve_timeout", "0");
    if (t->disk[0] != '\0') {
        kvd_test_cl_set(cfg, "store.disk_path", t->disk);
        kvd_test_cl_set(cfg, "store.disk_size", "32m");
        kvd_test_cl_set(cfg, "store.disk_write", "through");
        kvd_test_cl_set(cfg, "store.sync_interval", "0");
    }
    for (size_t i = 0; i < t->n_sets; i++) {
        kvd_test_cl_set(cfg, t->sets[2 * i], t->sets[2 * i + 1]);
    }
    char err[512] = "";
    kvd_status_t s = kvd_server_open(cfg, &t->srv, err, sizeof err);
    if (s != KVD_OK) {
        fail_msg("kvd_server_open: %s (%s)", kvd_status_str(s), err);
    }
    kvd_config_destroy(cfg);
}

/* A daemon in a fresh directory named after `tag`, with an NVMe tier when
 * `disk`, and extra settings as key, value, ..., NULL (kept, not copied:
 * string literals). */
static inline void kvd_test_cl_start(kvd_test_cl_t *t, const char *tag,
                                     bool disk, ...)
{
    memset(t, 0, sizeof *t);
    kvd_log_set_level(KVD_LOG_LEVEL_ERROR);
    kvd_test_dir_make(&t->dir, tag);
    snprintf(t->address, sizeof t->address, "unix:%s/d.sock", t->dir.path);
    if (disk) {
        snprintf(t->disk, sizeof t->disk, "%s/nvme", t->dir.path);
        assert_int_equal(mkdir(t->disk, 0700), 0);
    }
    va_list ap;
    va_start(ap, disk);
    for (const char *k; (k = va_arg(ap, const char *)) != NULL;) {
        assert_true(t->n_sets < KVD_TEST_CL_SETS);
        t->sets[2 * t->n_sets] = k;
        t->sets[2 * t->n_sets + 1] = va_arg(ap, const char *);
        t->n_sets++;
    }
    va_end(ap);
    kvd_test_cl_daemon_open(t);
}

/* The daemon stops (gracefully: NVMe writes and index flushed) and a new
 * one starts on the same socket and disk. */
static inline void kvd_test_cl_restart(kvd_test_cl_t *t)
{
    kvd_server_stop(t->srv);
    t->srv = NULL;
    kvd_test_cl_daemon_open(t);
}

static inline void kvd_test_cl_stop(kvd_test_cl_t *t)
{
    kvd_server_stop(t->srv);
    t->srv = NULL;
    kvd_test_dir_remove(&t->dir);
}

/* Opens a store in daemon mode on `t`'s daemon with extra store.* settings
 * as key, value, ..., NULL (store.timeout 2s unless given). */
static inline kvd_status_t kvd_test_cl_open(const kvd_test_cl_t *t,
                                            kvd_store_t **st, ...)
{
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    kvd_test_cl_set(cfg, "store.mode", "daemon");
    kvd_test_cl_set(cfg, "store.address", t->address);
    kvd_test_cl_set(cfg, "store.timeout", "2s");
    va_list ap;
    va_start(ap, st);
    for (const char *k; (k = va_arg(ap, const char *)) != NULL;) {
        kvd_test_cl_set(cfg, k, va_arg(ap, const char *));
    }
    va_end(ap);
    char err[512] = "";
    kvd_status_t s = kvd_store_open(cfg, st, err, sizeof err);
    kvd_config_destroy(cfg);
    return s;
}

/* The daemon's service counters, read in-process. */
static inline kvd_service_stats_t kvd_test_cl_svc(kvd_test_cl_t *t)
{
    kvd_store_stats_t st;
    kvd_service_stats_t svc;
    kvd_server_collect(t->srv, &st, &svc);
    return svc;
}

/* Calls of `m` the daemon has served. */
static inline uint64_t kvd_test_cl_calls(kvd_test_cl_t *t, kvd_rpc_method_t m)
{
    return kvd_test_cl_svc(t).methods[m].calls;
}

/* Waits (5 s at most) until the daemon holds `want` lease ids. */
static inline void kvd_test_cl_wait_leases(kvd_test_cl_t *t, uint64_t want)
{
    uint64_t deadline = kvd_test_cl_now_ms() + 5000;
    uint64_t have;
    while ((have = kvd_test_cl_svc(t).leases) != want) {
        if (kvd_test_cl_now_ms() > deadline) {
            fail_msg("the daemon holds %llu leases, want %llu",
                     (unsigned long long)have, (unsigned long long)want);
        }
        usleep(2000);
    }
}

/* Waits (5 s at most) until the daemon has counted `want` calls of `m`,
 * then asserts no more came. A call is counted after its handler ran, so
 * a change the handler made may be seen a moment before the count. */
static inline void kvd_test_cl_wait_calls(kvd_test_cl_t *t, kvd_rpc_method_t m,
                                          uint64_t want)
{
    uint64_t deadline = kvd_test_cl_now_ms() + 5000;
    while (kvd_test_cl_calls(t, m) < want && kvd_test_cl_now_ms() < deadline) {
        usleep(1000);
    }
    assert_int_equal(kvd_test_cl_calls(t, m), want);
}

/* Namespace `nsb` and n hashes whose first byte is `seed`. */
static inline void kvd_test_cl_keys(kvd_namespace_t *ns, uint8_t nsb,
                                    kvd_block_hash_t *h, size_t n, uint8_t seed)
{
    memset(ns->bytes, nsb, sizeof ns->bytes);
    for (size_t i = 0; i < n; i++) {
        memset(h[i].bytes, 0x5A, sizeof h[i].bytes);
        h[i].bytes[0] = seed;
        h[i].bytes[1] = (uint8_t)i;
    }
}

/* Byte b of the object of hash `h`. */
static inline uint8_t kvd_test_cl_byte(const kvd_block_hash_t *h, size_t b)
{
    return (uint8_t)(h->bytes[0] * 31u + h->bytes[1] * 131u + b * 7u +
                     (b >> 12));
}

static inline void kvd_test_cl_fill(uint8_t *p, const kvd_block_hash_t *h)
{
    for (size_t b = 0; b < KVD_TEST_CL_OBJ; b++) {
        p[b] = kvd_test_cl_byte(h, b);
    }
}

/* Whether p holds the object of hash `h` (NULL: no). */
static inline bool kvd_test_cl_holds(const uint8_t *p,
                                     const kvd_block_hash_t *h)
{
    for (size_t b = 0; p != NULL && b < KVD_TEST_CL_OBJ; b++) {
        if (p[b] != kvd_test_cl_byte(h, b)) {
            return false;
        }
    }
    return p != NULL;
}

/* Reserves, fills and commits n objects; asserts each one made it. */
static inline void kvd_test_cl_save(kvd_store_t *st, const kvd_namespace_t *ns,
                                    const kvd_block_hash_t *h, size_t n)
{
    kvd_store_reservation_t r[KVD_TEST_CL_MAX];
    kvd_store_key_t keys[KVD_TEST_CL_MAX];
    kvd_status_t cs[KVD_TEST_CL_MAX];
    assert_true(n <= KVD_TEST_CL_MAX);
    assert_int_equal(kvd_store_reserve(st, ns, h, n, KVD_TEST_CL_OBJ, 0, r),
                     KVD_OK);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(r[i].status, KVD_OK);
        uint8_t *p = kvd_store_reservation_ptr(st, &r[i], KVD_TEST_CL_OBJ);
        assert_non_null(p);
        kvd_test_cl_fill(p, &h[i]);
        keys[i] = (kvd_store_key_t){.ns = *ns, .hash = h[i]};
    }
    assert_int_equal(kvd_store_commit(st, keys, n, cs), KVD_OK);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(cs[i], KVD_OK);
    }
}

#endif /* KVD_TESTS_TESTCLIENT_INT_H */
