/*
 * Key events of an embedded store (kvd_store_events_enable /
 * kvd_store_take_events, include/kvdepot/store.h), what a KV-aware router
 * learns from: a commit is one STORED event, a delete or an eviction from
 * the last tier holding an object one REMOVED event, oldest first; a full
 * queue drops the oldest and says how many; recording off costs and
 * returns nothing; bad arguments are refused. A saving thread and a
 * draining thread run at once (the ThreadSanitizer suite runs this too):
 * every commit is seen once, or counted as dropped.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/unit/kvd_testdir_int.h"
#include "kvdepot/store.h"
#include "tests/integration/kvd_teststore_int.h"

#define OBJ (256u * 1024u)

static kvd_namespace_t test_ns(void)
{
    kvd_namespace_t ns;
    memset(ns.bytes, 0x5e, sizeof ns.bytes);
    return ns;
}

static kvd_block_hash_t hash_of(uint32_t i)
{
    kvd_block_hash_t h;
    memset(h.bytes, 0x2b, sizeof h.bytes);
    memcpy(h.bytes, &i, sizeof i);
    return h;
}

static uint32_t index_of(const kvd_store_event_t *e)
{
    uint32_t i;
    memcpy(&i, e->key.hash.bytes, sizeof i);
    return i;
}

static kvd_status_t put_one(kvd_store_t *st, uint32_t i)
{
    kvd_namespace_t ns = test_ns();
    kvd_block_hash_t h = hash_of(i);
    kvd_store_reservation_t r;
    kvd_status_t s = kvd_store_reserve(st, &ns, &h, 1, OBJ, 0, &r);
    if (s != KVD_OK || r.status != KVD_OK) {
        return s != KVD_OK ? s : r.status;
    }
    memset(kvd_store_arena_ptr(st, r.arena_offset, OBJ), (int)i, OBJ);
    kvd_store_key_t key = {ns, h};
    return kvd_store_commit(st, &key, 1, NULL);
}

/* A store of the base settings; disk "" leaves out the disk tier, so an
 * arena eviction removes the object from the store. */
static kvd_store_t *open_store(const kvd_test_dir_t *d, bool disk)
{
    kvd_config_t *cfg = kvd_test_store_config(d->path);
    if (cfg != NULL && !disk) {
        (void)kvd_config_set(cfg, "store.disk_path", "");
    }
    kvd_store_t *st = NULL;
    assert_int_equal(kvd_test_store_open_config(cfg, &st), KVD_OK);
    return st;
}

static void test_commits_and_deletes(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "events");
    kvd_store_t *st = open_store(&d, true);
    kvd_store_event_t ev[16];
    size_t n = 99;
    uint64_t dropped = 99;
    /* Off: nothing recorded, nothing returned. */
    assert_int_equal(put_one(st, 100), KVD_OK);
    assert_int_equal(kvd_store_take_events(st, ev, 16, &n, &dropped), KVD_OK);
    assert_int_equal(n, 0);
    assert_int_equal(dropped, 0);

    assert_int_equal(kvd_store_events_enable(st, 8), KVD_OK);
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(put_one(st, i), KVD_OK);
    }
    kvd_store_key_t gone = {test_ns(), hash_of(1)};
    assert_int_equal(kvd_store_delete(st, &gone, 1, NULL), KVD_OK);
    assert_int_equal(kvd_store_take_events(st, ev, 16, &n, &dropped), KVD_OK);
    assert_int_equal(n, 4);
    assert_int_equal(dropped, 0);
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(ev[i].kind, KVD_STORE_EVENT_STORED);
        assert_int_equal(index_of(&ev[i]), i);
        assert_memory_equal(ev[i].key.ns.bytes, test_ns().bytes, 16);
    }
    assert_int_equal(ev[3].kind, KVD_STORE_EVENT_REMOVED);
    assert_int_equal(index_of(&ev[3]), 1);
    /* Taken events are gone; a full queue keeps the newest. */
    assert_int_equal(kvd_store_take_events(st, ev, 16, &n, NULL), KVD_OK);
    assert_int_equal(n, 0);
    for (uint32_t i = 10; i < 20; i++) {
        assert_int_equal(put_one(st, i), KVD_OK);
    }
    assert_int_equal(kvd_store_take_events(st, ev, 3, &n, &dropped), KVD_OK);
    assert_int_equal(n, 3);
    assert_int_equal(dropped, 2);
    assert_int_equal(index_of(&ev[0]), 12);
    assert_int_equal(kvd_store_take_events(st, ev, 16, &n, &dropped), KVD_OK);
    assert_int_equal(n, 5);
    assert_int_equal(dropped, 0);
    assert_int_equal(index_of(&ev[4]), 19);
    /* Stopped: the queue and later events are gone. */
    assert_int_equal(put_one(st, 30), KVD_OK);
    assert_int_equal(kvd_store_events_enable(st, 0), KVD_OK);
    assert_int_equal(put_one(st, 31), KVD_OK);
    assert_int_equal(kvd_store_take_events(st, ev, 16, &n, &dropped), KVD_OK);
    assert_int_equal(n, 0);
    kvd_store_close(st);
    kvd_test_dir_remove(&d);
}

static void test_eviction_from_the_last_tier(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "events-evict");
    kvd_store_t *st = open_store(&d, false);
    assert_int_equal(kvd_store_events_enable(st, 1024), KVD_OK);
    /* 8 MiB of arena for 64 objects of 256 KiB: half are evicted. */
    for (uint32_t i = 0; i < 64; i++) {
        assert_int_equal(put_one(st, i), KVD_OK);
    }
    kvd_store_event_t ev[256];
    size_t n = 0;
    assert_int_equal(kvd_store_take_events(st, ev, 256, &n, NULL), KVD_OK);
    size_t stored = 0, removed = 0;
    for (size_t i = 0; i < n; i++) {
        if (ev[i].kind == KVD_STORE_EVENT_STORED) {
            stored++;
        } else {
            assert_int_equal(ev[i].kind, KVD_STORE_EVENT_REMOVED);
            /* Each removed key is no longer found. */
            kvd_store_lease_t l;
            size_t m = 9;
            assert_int_equal(
                kvd_store_lookup(st, &ev[i].key.ns, &ev[i].key.hash, 1, &l, &m),
                KVD_OK);
            removed += m == 0;
        }
    }
    assert_int_equal(stored, 64);
    assert_true(removed >= 32);
    assert_int_equal(removed, n - stored);
    kvd_store_close(st);
    kvd_test_dir_remove(&d);
}

typedef struct {
    kvd_store_t *st;
    uint32_t count;
    int failures;
} saver_t;

static void *saver(void *arg)
{
    saver_t *s = arg;
    for (uint32_t i = 0; i < s->count; i++) {
        s->failures += put_one(s->st, 1000 + i) != KVD_OK;
    }
    return NULL;
}

static void test_drained_while_saving(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "events-race");
    kvd_store_t *st = open_store(&d, true);
    assert_int_equal(kvd_store_events_enable(st, 16), KVD_OK);
    /* 100 objects of 256 KiB fit the arena and the disk tier together:
     * nothing leaves the store, so every event is a commit. */
    saver_t s = {st, 100, 0};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, saver, &s), 0);
    uint64_t seen = 0, lost = 0, other = 0;
    kvd_store_event_t ev[8];
    bool done = false;
    while (!done) {
        done = seen + lost + other >= 100;
        size_t n = 0;
        uint64_t dropped = 0;
        assert_int_equal(kvd_store_take_events(st, ev, 8, &n, &dropped),
                         KVD_OK);
        for (size_t i = 0; i < n; i++) {
            bool mine = ev[i].kind == KVD_STORE_EVENT_STORED &&
                        index_of(&ev[i]) >= 1000;
            seen += mine;
            other += !mine;
        }
        lost += dropped;
    }
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(s.failures, 0);
    /* Every event is a commit of the saver's, seen once or counted as
     * dropped. */
    assert_int_equal(other, 0);
    assert_int_equal(seen + lost, 100);
    kvd_store_close(st);
    kvd_test_dir_remove(&d);
}

/* kvd_store_events_watch: only the named namespaces' events come out
 * (the others are dropped as they are taken); none named: all. */
static void test_watch(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "events-watch");
    kvd_store_t *st = open_store(&d, true);
    kvd_store_event_t ev[16];
    size_t n = 0;
    kvd_namespace_t other;
    memset(other.bytes, 0x77, sizeof other.bytes);
    kvd_namespace_t ours = test_ns();
    assert_int_equal(kvd_store_events_enable(st, 16), KVD_OK);
    assert_int_equal(kvd_store_events_watch(st, &other, 1), KVD_OK);
    assert_int_equal(put_one(st, 1), KVD_OK);
    assert_int_equal(kvd_store_take_events(st, ev, 16, &n, NULL), KVD_OK);
    assert_int_equal(n, 0); /* test_ns() is not watched */
    kvd_namespace_t both[2] = {other, ours};
    assert_int_equal(kvd_store_events_watch(st, both, 2), KVD_OK);
    assert_int_equal(put_one(st, 2), KVD_OK);
    assert_int_equal(kvd_store_take_events(st, ev, 16, &n, NULL), KVD_OK);
    assert_int_equal(n, 1);
    assert_int_equal(index_of(&ev[0]), 2);
    assert_int_equal(kvd_store_events_watch(st, NULL, 0), KVD_OK);
    assert_int_equal(put_one(st, 3), KVD_OK);
    assert_int_equal(kvd_store_take_events(st, ev, 16, &n, NULL), KVD_OK);
    assert_int_equal(n, 1);
    assert_int_equal(kvd_store_events_watch(st, NULL, 1), KVD_ERR_INVALID);
    assert_int_equal(
        kvd_store_events_watch(st, both, KVD_STORE_EVENTS_WATCH_MAX + 1),
        KVD_ERR_INVALID);
    kvd_store_close(st);
    kvd_test_dir_remove(&d);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "events-bad");
    kvd_store_t *st = open_store(&d, true);
    kvd_store_event_t ev[1];
    size_t n = 0;
    assert_int_equal(kvd_store_events_enable(NULL, 4), KVD_ERR_INVALID);
    assert_int_equal(kvd_store_events_enable(st, KVD_STORE_EVENTS_MAX + 1u),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_store_take_events(NULL, ev, 1, &n, NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_store_take_events(st, NULL, 1, &n, NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_store_take_events(st, ev, 1, NULL, NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_store_take_events(st, NULL, 0, &n, NULL), KVD_OK);
    kvd_store_close(st);
    kvd_test_dir_remove(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_commits_and_deletes),
        cmocka_unit_test(test_eviction_from_the_last_tier),
        cmocka_unit_test(test_drained_while_saving),
        cmocka_unit_test(test_watch),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
