/*
 * Helpers shared by the kvdepotd end-to-end tests (test_daemon_*.c): a real
 * daemon process (the binary in $KVDEPOTD, started through
 * kvd_testdaemon_int.h) on a unix socket in a temp directory, and clients
 * that open the store with store.mode=daemon — the same store.h calls the
 * leader and worker make. Objects are OBJ_BYTES of a pattern that names
 * their key, so a reader checks every byte it got. Header-only (static
 * inline): each test is one executable built from one source file; the
 * including test has cmocka.h included first.
 */
#ifndef KVD_TESTS_TESTDAEMONCLIENT_INT_H
#define KVD_TESTS_TESTDAEMONCLIENT_INT_H

#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvdepot/store.h"
#include "tests/unit/kvd_testdir_int.h"
#include "tests/integration/kvd_testdaemon_int.h"

#define OBJ_BYTES (64u << 10)
#define NKEYS 8

static inline const char *daemon_bin(void)
{
    return kvd_test_daemon_bin();
}

static inline uint64_t now_ms(void)
{
    return kvd_test_now_ms();
}

/* Starts kvdepotd in `d` with extra --set values (NULL-terminated) and
 * waits for its ready file. Returns the pid. */
static inline pid_t daemon_start(const kvd_test_dir_t *d, ...)
{
    va_list ap;
    va_start(ap, d);
    pid_t pid = kvd_test_daemon_spawn(d, NULL, ap);
    va_end(ap);
    kvd_test_daemon_wait_ready(d, pid);
    return pid;
}

/* SIGTERM and wait: a graceful stop exits 0. */
static inline void daemon_stop(pid_t pid)
{
    kvd_test_daemon_stop(pid);
}

static inline void daemon_kill9(pid_t pid)
{
    assert_int_equal(kill(pid, SIGKILL), 0);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
}

/* Runs fn(arg) in a child process (its return value is the child's exit
 * code) and waits for it: the exit code, which the child must give by
 * returning. The caller has no gRPC client open (one does not survive a
 * fork). */
static inline int run_in_child(int (*fn)(void *), void *arg)
{
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        _exit(fn(arg));
    }
    int cst = 0;
    assert_int_equal(waitpid(child, &cst, 0), child);
    assert_true(WIFEXITED(cst));
    return WEXITSTATUS(cst);
}

static inline kvd_status_t client_open(const kvd_test_dir_t *d, const char *ttl,
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

static inline void keys_make(kvd_namespace_t *ns, kvd_block_hash_t *h, size_t n,
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

static inline uint8_t pattern(size_t key, size_t i)
{
    return (uint8_t)(key * 131u + i * 7u + (i >> 12));
}

/* Reserves, writes and commits n objects; returns how many committed. */
static inline size_t save_objects(kvd_store_t *st, const kvd_namespace_t *ns,
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

static inline void check_bytes(kvd_store_t *st, const kvd_store_lease_t *l)
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

static inline uint64_t daemon_leases(kvd_store_t *st)
{
    kvd_store_stats_t s;
    assert_int_equal(kvd_store_stats(st, &s), KVD_OK);
    return s.leases;
}

/* Waits (by deadline) until the daemon holds `want` lease ids. */
static inline void wait_leases(kvd_store_t *st, uint64_t want, int timeout_ms)
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

static inline int skip_without_daemon(void **state)
{
    (void)state;
    if (daemon_bin() == NULL) {
        fprintf(stderr, "KVDEPOTD not set: skipped\n");
        exit(77);
    }
    return 0;
}

/* Gets n disk-tier leases into the arena (promotion); the host leases in
 * got[i], in the order of l. */
static inline void get_from_disk(kvd_store_t *st, const kvd_store_lease_t *l,
                                 size_t n, kvd_store_lease_t *got)
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

#endif /* KVD_TESTS_TESTDAEMONCLIENT_INT_H */
