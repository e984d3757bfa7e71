/*
 * The durability point of an embedded store with a disk tier and the
 * default store.disk_write=back: kvd_store_flush writes every committed
 * object that is only in the arena to NVMe and syncs it, so a store
 * reopened on the same directory (whose arena starts empty) finds every
 * one, byte for byte; kvd_store_close does the same within
 * store.stop_flush_timeout, and 0 there turns it off; flushes that run
 * while another thread saves (evicting) and deletes succeed, leave no
 * lease behind, and lose none of the objects saved before them.
 *
 * The saving thread never calls cmocka asserts; it records failures that
 * the test thread checks.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "tests/unit/kvd_testdir_int.h"
#include "kvdepot/store.h"
#include "tests/integration/kvd_teststore_int.h"

#define OBJ (256u * 1024u)
/* The 8 MiB arena holds 32 objects: N fit without any eviction, so before
 * a flush every one of them is in the arena only. */
#define N 24u

/* Opens a store in `d` (the base of kvd_teststore_int.h) with one more
 * setting `k`=`v` (k may be NULL). */
static kvd_status_t open_store(const kvd_test_dir_t *d, const char *k,
                               const char *v, kvd_store_t **st)
{
    kvd_config_t *cfg = kvd_test_store_config(d->path);
    if (cfg != NULL && k != NULL) {
        (void)kvd_config_set(cfg, k, v);
    }
    return kvd_test_store_open_config(cfg, st);
}

static kvd_namespace_t test_ns(void)
{
    kvd_namespace_t ns;
    memset(ns.bytes, 0x37, sizeof ns.bytes);
    return ns;
}

static kvd_block_hash_t hash_of(uint32_t i)
{
    kvd_block_hash_t h;
    memset(h.bytes, 0x61, sizeof h.bytes);
    memcpy(h.bytes, &i, sizeof i);
    return h;
}

static uint8_t byte_of(uint32_t i, uint32_t k)
{
    return (uint8_t)(i * 151u + k * 13u + (k >> 10));
}

/* Reserve, fill, commit object i. */
static kvd_status_t put_one(kvd_store_t *st, uint32_t i)
{
    kvd_namespace_t ns = test_ns();
    kvd_block_hash_t h = hash_of(i);
    kvd_store_reservation_t r;
    kvd_status_t s = kvd_store_reserve(st, &ns, &h, 1, OBJ, 0, &r);
    if (s != KVD_OK || r.status != KVD_OK) {
        return s != KVD_OK ? s : r.status;
    }
    uint8_t *p = kvd_store_arena_ptr(st, r.arena_offset, OBJ);
    for (uint32_t k = 0; k < OBJ; k++) {
        p[k] = byte_of(i, k);
    }
    kvd_store_key_t key = {ns, h};
    return kvd_store_commit(st, &key, 1, NULL);
}

/* Finds object i on `want_tier`, brings it into the arena when it is on
 * disk, and compares every byte. KVD_ERR_NOT_FOUND on a miss,
 * KVD_ERR_CORRUPT on other bytes or another tier. */
static kvd_status_t check_one(kvd_store_t *st, uint32_t i, uint32_t want_tier)
{
    kvd_namespace_t ns = test_ns();
    kvd_block_hash_t h = hash_of(i);
    kvd_store_lease_t l;
    size_t m = 0;
    if (kvd_store_lookup(st, &ns, &h, 1, &l, &m) != KVD_OK || m == 0) {
        return KVD_ERR_NOT_FOUND;
    }
    kvd_status_t s = l.tier == want_tier ? KVD_OK : KVD_ERR_CORRUPT;
    if (l.tier == KVD_STORE_TIER_DISK) {
        kvd_store_get_t g = {.lease = l, .user_data = i};
        size_t acc = 0;
        kvd_store_completion_t c;
        size_t got = 0;
        kvd_status_t gs = kvd_store_get_submit(st, &g, 1, &acc);
        while (gs == KVD_OK && got == 0) {
            (void)kvd_store_wait(st, 1000);
            got = kvd_store_poll(st, &c, 1);
        }
        if (gs != KVD_OK || c.status != KVD_OK) {
            return gs != KVD_OK ? gs : c.status;
        }
        l = c.lease;
    }
    const uint8_t *p = kvd_store_arena_ptr(st, l.arena_offset, OBJ);
    for (uint32_t k = 0; s == KVD_OK && k < OBJ; k++) {
        s = p != NULL && p[k] == byte_of(i, k) ? KVD_OK : KVD_ERR_CORRUPT;
    }
    (void)kvd_store_release(st, &l, 1);
    return s;
}

static kvd_store_stats_t stats_of(kvd_store_t *st)
{
    kvd_store_stats_t s;
    assert_int_equal(kvd_store_stats(st, &s), KVD_OK);
    return s;
}

/* Reopens the store in `d` and checks that all N objects are on disk. */
static void check_reopened(const kvd_test_dir_t *d, uint32_t first)
{
    kvd_store_t *st = NULL;
    assert_int_equal(open_store(d, NULL, NULL, &st), KVD_OK);
    assert_int_equal(stats_of(st).host.objects, 0);
    for (uint32_t i = first; i < first + N; i++) {
        assert_int_equal(check_one(st, i, KVD_STORE_TIER_DISK), KVD_OK);
    }
    kvd_store_close(st);
}

/* Flush alone (the close's own write-back turned off) makes the arena's
 * objects durable. Before, it waited only for writes already queued: with
 * write-back none were, and the reopened store found nothing. */
static void test_flush_writes_the_arena(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "flush");
    kvd_store_t *st = NULL;
    assert_int_equal(open_store(&d, "store.stop_flush_timeout", "0", &st),
                     KVD_OK);
    for (uint32_t i = 0; i < N; i++) {
        assert_int_equal(put_one(st, i), KVD_OK);
    }
    assert_int_equal(stats_of(st).disk.objects, 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(kvd_store_flush(st, 10000), KVD_OK);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("# flush: %u objects of %u KiB written and synced in %.1f ms\n", N,
           OBJ / 1024u,
           (double)(t1.tv_sec - t0.tv_sec) * 1e3 +
               (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    kvd_store_stats_t a = stats_of(st);
    assert_int_equal(a.disk.objects, N);
    assert_int_equal(a.host.objects, N); /* still served from the arena */
    assert_int_equal(a.leases, 0);
    assert_int_equal(a.writes_pending, 0);
    assert_int_equal(a.dropped_writes, 0);
    /* A second flush has nothing more to write. */
    assert_int_equal(kvd_store_flush(st, 10000), KVD_OK);
    assert_int_equal(stats_of(st).disk.bytes_written, a.disk.bytes_written);
    for (uint32_t i = 0; i < N; i++) {
        assert_int_equal(check_one(st, i, KVD_STORE_TIER_HOST), KVD_OK);
    }
    kvd_store_close(st);
    check_reopened(&d, 0);
    kvd_test_dir_remove(&d);
}

/* A graceful close writes the arena back (store.stop_flush_timeout, 30 s
 * by default); 0 turns that off and the arena's objects are lost. */
static void test_close_writes_the_arena(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "flush_close");
    kvd_store_t *st = NULL;
    assert_int_equal(open_store(&d, NULL, NULL, &st), KVD_OK);
    for (uint32_t i = 0; i < N; i++) {
        assert_int_equal(put_one(st, i), KVD_OK);
    }
    kvd_store_close(st);
    check_reopened(&d, 0);

    assert_int_equal(open_store(&d, "store.stop_flush_timeout", "0", &st),
                     KVD_OK);
    for (uint32_t i = 1000; i < 1000 + N; i++) {
        assert_int_equal(put_one(st, i), KVD_OK);
    }
    kvd_store_close(st);
    assert_int_equal(open_store(&d, "store.stop_flush_timeout", "0", &st),
                     KVD_OK);
    assert_int_equal(check_one(st, 1000, KVD_STORE_TIER_DISK),
                     KVD_ERR_NOT_FOUND);
    assert_int_equal(check_one(st, 0, KVD_STORE_TIER_DISK), KVD_OK);
    kvd_store_close(st);
    kvd_test_dir_remove(&d);
}

/* ---- flush beside saves, evictions and deletes -------------------------- */

typedef struct churn {
    kvd_store_t *st;
    bool stop;    /* atomic */
    int failures; /* saves that failed (atomic) */
} churn_t;

/* Saves new objects (evicting older ones to NVMe) and deletes some of
 * them, until told to stop: CHURN_MAX at most, so that the disk (128
 * objects) never has to evict the first N. */
#define CHURN_MAX 60u
static void *churn_main(void *arg)
{
    churn_t *c = arg;
    kvd_namespace_t ns = test_ns();
    for (uint32_t i = 5000;
         i < 5000 + CHURN_MAX && !__atomic_load_n(&c->stop, __ATOMIC_ACQUIRE);
         i++) {
        if (put_one(c->st, i) != KVD_OK) {
            __atomic_fetch_add(&c->failures, 1, __ATOMIC_RELAXED);
        }
        if (i % 3 == 0) {
            kvd_store_key_t key = {ns, hash_of(i - 1)};
            (void)kvd_store_delete(c->st, &key, 1, NULL);
        }
    }
    return NULL;
}

static void test_flush_beside_saves(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "flush_churn");
    kvd_store_t *st = NULL;
    assert_int_equal(open_store(&d, "store.stop_flush_timeout", "0", &st),
                     KVD_OK);
    for (uint32_t i = 0; i < N; i++) {
        assert_int_equal(put_one(st, i), KVD_OK);
    }
    churn_t c = {.st = st};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, churn_main, &c), 0);
    for (int round = 0; round < 3; round++) {
        assert_int_equal(kvd_store_flush(st, 10000), KVD_OK);
    }
    __atomic_store_n(&c.stop, true, __ATOMIC_RELEASE);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(__atomic_load_n(&c.failures, __ATOMIC_RELAXED), 0);
    assert_int_equal(kvd_store_flush(st, 10000), KVD_OK);
    assert_int_equal(stats_of(st).leases, 0);
    kvd_store_close(st);
    check_reopened(&d, 0);
    kvd_test_dir_remove(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flush_writes_the_arena),
        cmocka_unit_test(test_close_writes_the_arena),
        cmocka_unit_test(test_flush_beside_saves),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
