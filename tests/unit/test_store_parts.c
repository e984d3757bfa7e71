/*
 * Objects written in parts on the embedded store (store.h,
 * kvd_store_reserve_part): joining, publication with the last part, what
 * abandons an object (an abort, the deadline), and that no slot is given
 * back while a part that joined may still write it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "kvdepot/store.h"

#define OBJ 4096u

static kvd_store_t *open_store(const char *part_timeout)
{
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    static const char *const base[] = {
        "store.arena_size",      "4m",  "store.arena_chunk",    "1m",
        "store.arena_hugepages", "off", "store.arena_prefault", "false",
        "store.reserve_timeout", "0"};
    for (size_t i = 0; i < sizeof base / sizeof *base; i += 2) {
        assert_int_equal(kvd_config_set(cfg, base[i], base[i + 1]), KVD_OK);
    }
    assert_int_equal(kvd_config_set(cfg, "store.part_timeout", part_timeout),
                     KVD_OK);
    kvd_store_t *st = NULL;
    assert_int_equal(kvd_store_open(cfg, &st, NULL, 0), KVD_OK);
    kvd_config_destroy(cfg);
    return st;
}

static kvd_store_key_t key_of(uint8_t k)
{
    kvd_store_key_t key;
    memset(&key, 0, sizeof key);
    memset(key.ns.bytes, 0x42, sizeof key.ns.bytes);
    key.hash.bytes[0] = k;
    return key;
}

/* Reserves part `part` of `parts` of key `k`; returns the outcome. */
static kvd_store_reservation_t reserve(kvd_store_t *st, uint8_t k,
                                       uint32_t part, uint32_t parts,
                                       uint64_t bytes)
{
    kvd_store_key_t key = key_of(k);
    kvd_store_reservation_t r;
    memset(&r, 0xff, sizeof r);
    assert_int_equal(kvd_store_reserve_part(st, &key.ns, &key.hash, 1, bytes, 0,
                                            part, parts, &r),
                     KVD_OK);
    return r;
}

static bool visible(kvd_store_t *st, uint8_t k);

/* Commits or aborts a part; a commit that says it published the object
 * left it visible. */
static kvd_status_t end(kvd_store_t *st, uint8_t k, uint32_t part, bool commit)
{
    kvd_store_key_t key = key_of(k);
    kvd_status_t s = KVD_ERR_INTERNAL;
    bool published = false;
    kvd_status_t ret =
        commit ? kvd_store_commit_part(st, &key, 1, part, &s, &published)
               : kvd_store_abort_part(st, &key, 1, part, &s);
    assert_int_equal(ret, s);
    assert_true(!published || (commit && s == KVD_OK));
    if (published) {
        assert_true(visible(st, k));
    }
    return s;
}

static bool visible(kvd_store_t *st, uint8_t k)
{
    kvd_store_key_t key = key_of(k);
    kvd_store_lease_t l;
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &key.ns, &key.hash, 1, &l, &m),
                     KVD_OK);
    if (m > 0) {
        assert_int_equal(kvd_store_release(st, &l, 1), KVD_OK);
    }
    return m == 1;
}

static uint64_t host_objects(kvd_store_t *st)
{
    kvd_store_stats_t ss;
    assert_int_equal(kvd_store_stats(st, &ss), KVD_OK);
    return ss.host.objects;
}

/* Three parts join one slot; it is published with the third commit. */
static void test_parts_join_and_publish(void **state)
{
    (void)state;
    kvd_store_t *st = open_store("30s");
    kvd_store_reservation_t a = reserve(st, 1, 0, 3, OBJ);
    assert_int_equal(a.status, KVD_OK);
    assert_true(a.first);
    kvd_store_reservation_t b = reserve(st, 1, 2, 3, OBJ);
    assert_int_equal(b.status, KVD_OK);
    assert_false(b.first);
    assert_int_equal(b.arena_offset, a.arena_offset);
    /* Another writer of part 2, another split, another size, a plain
     * writer: all told it is being written. */
    assert_int_equal(reserve(st, 1, 2, 3, OBJ).status, KVD_ERR_EXISTS);
    assert_int_equal(reserve(st, 1, 0, 2, OBJ).status, KVD_ERR_EXISTS);
    assert_int_equal(reserve(st, 1, 1, 3, 2 * OBJ).status, KVD_ERR_EXISTS);
    kvd_store_key_t key = key_of(1);
    kvd_store_reservation_t plain;
    assert_int_equal(
        kvd_store_reserve(st, &key.ns, &key.hash, 1, OBJ, 0, &plain), KVD_OK);
    assert_int_equal(plain.status, KVD_ERR_EXISTS);
    /* The plain calls cannot end an object in parts. */
    kvd_status_t s;
    assert_int_equal(kvd_store_commit(st, &key, 1, &s), KVD_ERR_STATE);
    assert_int_equal(kvd_store_abort(st, &key, 1, &s), KVD_ERR_STATE);

    kvd_store_reservation_t c = reserve(st, 1, 1, 3, OBJ);
    assert_int_equal(c.status, KVD_OK);
    assert_int_equal(c.arena_offset, a.arena_offset);
    assert_int_equal(end(st, 1, 0, true), KVD_OK);
    assert_int_equal(end(st, 1, 0, true), KVD_ERR_STATE);
    assert_int_equal(end(st, 1, 2, true), KVD_OK);
    assert_false(visible(st, 1));
    assert_int_equal(end(st, 1, 1, true), KVD_OK);
    assert_true(visible(st, 1));
    assert_int_equal(end(st, 1, 1, true), KVD_ERR_NOT_FOUND);
    assert_int_equal(reserve(st, 1, 0, 3, OBJ).status, KVD_ERR_EXISTS);
    kvd_store_close(st);
}

/* An abort abandons the object; its slot stays reserved while a part that
 * joined has not ended, and goes back when the last one does. */
static void test_abort_waits_for_joined_parts(void **state)
{
    (void)state;
    kvd_store_t *st = open_store("30s");
    assert_int_equal(reserve(st, 2, 0, 4, OBJ).status, KVD_OK);
    assert_int_equal(reserve(st, 2, 1, 4, OBJ).status, KVD_OK);
    assert_int_equal(reserve(st, 2, 2, 4, OBJ).status, KVD_OK);
    assert_int_equal(end(st, 2, 0, true), KVD_OK);
    assert_int_equal(end(st, 2, 1, false), KVD_OK);
    assert_int_equal(host_objects(st), 1); /* part 2 may still write */
    assert_int_equal(reserve(st, 2, 3, 4, OBJ).status, KVD_ERR_EXISTS);
    assert_int_equal(end(st, 2, 2, true), KVD_ERR_TIMEOUT);
    assert_int_equal(host_objects(st), 0);
    assert_false(visible(st, 2));
    /* A new attempt starts from scratch. */
    kvd_store_reservation_t r = reserve(st, 2, 3, 4, OBJ);
    assert_int_equal(r.status, KVD_OK);
    assert_true(r.first);
    assert_int_equal(end(st, 2, 3, false), KVD_OK);
    assert_int_equal(host_objects(st), 0);
    kvd_store_close(st);
}

/* Parts missing at store.part_timeout: the object is abandoned, the part
 * still writing learns it at commit, and the slot goes back then. */
static void test_deadline_abandons(void **state)
{
    (void)state;
    kvd_store_t *st = open_store("1ms");
    assert_int_equal(reserve(st, 3, 0, 2, OBJ).status, KVD_OK);
    /* Past the deadline and the interval between looks for one. */
    struct timespec ts = {0, 150 * 1000 * 1000};
    nanosleep(&ts, NULL);
    assert_int_equal(reserve(st, 3, 1, 2, OBJ).status, KVD_ERR_EXISTS);
    assert_int_equal(host_objects(st), 1);
    assert_int_equal(end(st, 3, 0, true), KVD_ERR_TIMEOUT);
    assert_int_equal(host_objects(st), 0);
    assert_false(visible(st, 3));
    /* Every joined part committed, one never came, and nobody reserves in
     * parts again: a plain reserve gives the slot back. */
    assert_int_equal(reserve(st, 5, 0, 2, OBJ).status, KVD_OK);
    assert_int_equal(end(st, 5, 0, true), KVD_OK);
    nanosleep(&ts, NULL);
    kvd_store_key_t other = key_of(6);
    kvd_store_reservation_t r;
    assert_int_equal(
        kvd_store_reserve(st, &other.ns, &other.hash, 1, OBJ, 0, &r), KVD_OK);
    assert_int_equal(r.status, KVD_OK);
    assert_int_equal(host_objects(st), 1); /* key 6 alone */
    kvd_status_t s;
    assert_int_equal(kvd_store_abort(st, &other, 1, &s), KVD_OK);
    kvd_store_close(st);
}

/* Argument checks; one part is a plain reservation. */
static void test_part_arguments(void **state)
{
    (void)state;
    kvd_store_t *st = open_store("30s");
    kvd_store_key_t key = key_of(4);
    kvd_store_reservation_t r;
    assert_int_equal(
        kvd_store_reserve_part(st, &key.ns, &key.hash, 1, OBJ, 0, 2, 2, &r),
        KVD_ERR_INVALID);
    assert_int_equal(
        kvd_store_reserve_part(st, &key.ns, &key.hash, 1, OBJ, 0, 0, 0, &r),
        KVD_ERR_INVALID);
    assert_int_equal(kvd_store_reserve_part(st, &key.ns, &key.hash, 1, OBJ, 0,
                                            0, KVD_STORE_MAX_PARTS + 1, &r),
                     KVD_ERR_INVALID);
    assert_int_equal(
        kvd_store_reserve_part(st, &key.ns, &key.hash, 1, 0, 0, 0, 2, &r),
        KVD_ERR_INVALID);
    assert_int_equal(
        kvd_store_commit_part(st, &key, 1, KVD_STORE_MAX_PARTS, NULL, NULL),
        KVD_ERR_INVALID);
    assert_int_equal(kvd_store_commit_part(st, &key, 1, 1, NULL, NULL),
                     KVD_ERR_NOT_FOUND);
    kvd_store_reservation_t one = reserve(st, 4, 0, 1, OBJ);
    assert_int_equal(one.status, KVD_OK);
    assert_true(one.first);
    kvd_status_t s;
    assert_int_equal(kvd_store_commit(st, &key, 1, &s), KVD_OK);
    assert_true(visible(st, 4));
    kvd_store_close(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parts_join_and_publish),
        cmocka_unit_test(test_abort_waits_for_joined_parts),
        cmocka_unit_test(test_deadline_abandons),
        cmocka_unit_test(test_part_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
