/*
 * Embedded store, arena tier only (include/kvdepot/store.h): settings and
 * their errors; reserve -> write -> commit -> lookup -> release round
 * trips; duplicates, aborts and half-written keys; eviction that never
 * touches leased objects; slab pressure with mixed sizes; tenant quotas;
 * gets of host leases; delete; export; argument errors. The NVMe tier is
 * exercised by tests/integration/test_store_tiers.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvdepot/store.h"
#include "store/arena.h"
#include "store/engine.h"
#include "tests/unit/kvd_testdir_int.h"

#define MIB (1ull << 20)

static kvd_store_t *open_store(const char *arena, const char *chunk,
                               const char *extra_key, const char *extra_val)
{
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_size", arena), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_chunk", chunk), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_hugepages", "off"),
                     KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_prefault", "false"),
                     KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.reserve_timeout", "0"), KVD_OK);
    if (extra_key != NULL) {
        assert_int_equal(kvd_config_set(cfg, extra_key, extra_val), KVD_OK);
    }
    kvd_store_t *st = NULL;
    char err[256] = "";
    kvd_status_t s = kvd_store_open(cfg, &st, err, sizeof err);
    if (s != KVD_OK) {
        fprintf(stderr, "kvd_store_open: %s (%s)\n", kvd_status_str(s), err);
    }
    assert_int_equal(s, KVD_OK);
    kvd_config_destroy(cfg);
    return st;
}

static kvd_namespace_t ns_of(uint8_t b)
{
    kvd_namespace_t ns;
    memset(ns.bytes, b, sizeof ns.bytes);
    return ns;
}

static kvd_block_hash_t hash_of(uint32_t i)
{
    kvd_block_hash_t h;
    memset(h.bytes, 0, sizeof h.bytes);
    memcpy(h.bytes, &i, sizeof i);
    h.bytes[31] = 0xa5;
    return h;
}

/* The object's bytes: a function of the key, so any mix-up shows. */
static void fill(uint8_t *p, uint64_t len, uint32_t i)
{
    for (uint64_t k = 0; k < len; k += 8) {
        uint64_t v = ((uint64_t)i << 32) ^ k ^ 0x9e3779b97f4a7c15ull;
        memcpy(p + k, &v, len - k < 8 ? len - k : 8);
    }
}

static int check(const uint8_t *p, uint64_t len, uint32_t i)
{
    uint8_t *want = malloc(len);
    fill(want, len, i);
    int same = memcmp(p, want, len) == 0;
    free(want);
    return same;
}

/* Reserves, fills and commits hashes first..first+n under `ns`. */
static void put_range(kvd_store_t *st, const kvd_namespace_t *ns,
                      uint32_t first, uint32_t n, uint64_t size,
                      uint32_t tenant)
{
    kvd_block_hash_t *h = calloc(n, sizeof *h);
    kvd_store_reservation_t *r = calloc(n, sizeof *r);
    kvd_store_key_t *keys = calloc(n, sizeof *keys);
    for (uint32_t i = 0; i < n; i++) {
        h[i] = hash_of(first + i);
    }
    assert_int_equal(kvd_store_reserve(st, ns, h, n, size, tenant, r), KVD_OK);
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(r[i].status, KVD_OK);
        uint8_t *p = kvd_store_arena_ptr(st, r[i].arena_offset, size);
        assert_non_null(p);
        fill(p, size, first + i);
        keys[i].ns = *ns;
        keys[i].hash = h[i];
    }
    assert_int_equal(kvd_store_commit(st, keys, n, NULL), KVD_OK);
    free(keys);
    free(r);
    free(h);
}

static size_t lookup_range(kvd_store_t *st, const kvd_namespace_t *ns,
                           uint32_t first, uint32_t n,
                           kvd_store_lease_t *leases)
{
    kvd_block_hash_t *h = calloc(n, sizeof *h);
    for (uint32_t i = 0; i < n; i++) {
        h[i] = hash_of(first + i);
    }
    size_t m = SIZE_MAX;
    assert_int_equal(kvd_store_lookup(st, ns, h, n, leases, &m), KVD_OK);
    free(h);
    return m;
}

/* ------------------------------------------------------------------------ */

/* An NVMe tier larger than its file system's free space: the open's
 * error names the setting to change and why, not just the status. */
static void test_disk_beyond_free_space_says_why(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "store_space");
    struct statvfs vb;
    assert_int_equal(statvfs(d.path, &vb), 0);
    char size[32];
    snprintf(size, sizeof size, "%llu",
             (unsigned long long)vb.f_bavail * vb.f_frsize + (1ull << 30));
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_size", "4m"), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_chunk", "1m"), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_prefault", "false"),
                     KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.disk_path", d.path), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.disk_size", size), KVD_OK);
    kvd_store_t *st = NULL;
    char err[256] = "";
    assert_int_equal(kvd_store_open(cfg, &st, err, sizeof err),
                     KVD_ERR_NOSPACE);
    assert_null(st);
    assert_non_null(strstr(err, "store.disk_size"));
    assert_non_null(strstr(err, "free space"));
    kvd_config_destroy(cfg);
    kvd_test_dir_remove(&d);
}

static void test_settings(void **state)
{
    (void)state;
    kvd_config_t *cfg = NULL;
    kvd_store_t *st = NULL;
    char err[256] = "";
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_sise", "1g"), KVD_OK);
    assert_int_equal(kvd_store_open(cfg, &st, err, sizeof err),
                     KVD_ERR_NOT_FOUND);
    assert_non_null(strstr(err, "store.arena_sise"));
    assert_null(st);
    kvd_config_destroy(cfg);

    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.disk_write", "sideways"),
                     KVD_OK);
    assert_int_equal(kvd_store_open(cfg, &st, err, sizeof err),
                     KVD_ERR_INVALID);
    kvd_config_destroy(cfg);

    assert_int_equal(kvd_store_open(NULL, NULL, NULL, 0), KVD_ERR_INVALID);

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_int_equal(kvd_store_print_config(NULL, f), KVD_OK);
    fclose(f);
    static const char *const names[] = {
        "store.arena_size",      "store.disk_path",  "store.disk_engine",
        "store.l1_policy",       "store.disk_write", "store.disk_admission",
        "store.sync_interval",   "store.get_queue",  "store.reserve_timeout",
        "store.disk_max_objects"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        assert_non_null(strstr(text, names[i]));
    }
    free(text);
    assert_int_equal(kvd_store_print_config(NULL, NULL), KVD_ERR_INVALID);
}

static void test_round_trip(void **state)
{
    (void)state;
    kvd_store_t *st = open_store("16m", "4m", NULL, NULL);
    kvd_namespace_t ns = ns_of(1);
    put_range(st, &ns, 0, 6, 300000, 0);

    kvd_store_lease_t leases[8];
    assert_int_equal(lookup_range(st, &ns, 0, 8, leases), 6);
    for (uint32_t i = 0; i < 6; i++) {
        assert_int_equal(leases[i].tier, KVD_STORE_TIER_HOST);
        assert_int_equal(leases[i].size_bytes, 300000);
        kvd_block_hash_t want = hash_of(i);
        assert_memory_equal(&leases[i].key.hash, &want, sizeof want);
        assert_memory_equal(&leases[i].key.ns, &ns, sizeof ns);
        const uint8_t *p =
            kvd_store_arena_ptr(st, leases[i].arena_offset, 300000);
        assert_true(check(p, 300000, i));
    }
    /* Another namespace sees nothing. */
    kvd_namespace_t other = ns_of(2);
    assert_int_equal(lookup_range(st, &other, 0, 6, leases), 0);

    kvd_store_stats_t s;
    assert_int_equal(kvd_store_stats(st, &s), KVD_OK);
    assert_int_equal(s.host.objects, 6);
    assert_int_equal(s.leases, 6);
    assert_int_equal(s.host.hits, 6);
    assert_true(s.host.misses >= 2);
    assert_int_equal(s.disk.capacity_bytes, 0);

    assert_int_equal(lookup_range(st, &ns, 0, 6, leases), 6);
    assert_int_equal(kvd_store_release(st, leases, 6), KVD_OK);
    assert_int_equal(kvd_store_release(st, leases, 6), KVD_OK);
    /* No lease left to give back. */
    assert_int_equal(kvd_store_release(st, leases, 1), KVD_ERR_STATE);
    assert_int_equal(kvd_store_stats(st, &s), KVD_OK);
    assert_int_equal(s.leases, 0);
    kvd_store_close(st);
}

static void test_gaps_duplicates_and_aborts(void **state)
{
    (void)state;
    kvd_store_t *st = open_store("16m", "4m", NULL, NULL);
    kvd_namespace_t ns = ns_of(3);
    put_range(st, &ns, 0, 2, 8192, 0);
    put_range(st, &ns, 3, 1, 8192, 0);
    kvd_store_lease_t leases[4];
    assert_int_equal(lookup_range(st, &ns, 0, 4, leases), 2);
    assert_int_equal(kvd_store_release(st, leases, 2), KVD_OK);

    /* Key 1 exists, key 2 is new and reserved, then reserved again. */
    kvd_block_hash_t h[2] = {hash_of(1), hash_of(2)};
    kvd_store_reservation_t r[2];
    assert_int_equal(kvd_store_reserve(st, &ns, h, 2, 8192, 0, r), KVD_OK);
    assert_int_equal(r[0].status, KVD_ERR_EXISTS);
    assert_int_equal(r[1].status, KVD_OK);
    assert_int_equal(kvd_store_reserve(st, &ns, h + 1, 1, 8192, 0, r), KVD_OK);
    assert_int_equal(r[0].status, KVD_ERR_EXISTS);
    /* Reserved keys are invisible. */
    assert_int_equal(lookup_range(st, &ns, 0, 4, leases), 2);
    assert_int_equal(kvd_store_release(st, leases, 2), KVD_OK);

    kvd_store_key_t keys[2] = {{ns, hash_of(2)}, {ns, hash_of(9)}};
    kvd_status_t statuses[2];
    assert_int_equal(kvd_store_abort(st, keys, 2, statuses), KVD_ERR_NOT_FOUND);
    assert_int_equal(statuses[0], KVD_OK);
    assert_int_equal(statuses[1], KVD_ERR_NOT_FOUND);
    /* Aborted: commit finds nothing; committed twice: state error. */
    assert_int_equal(kvd_store_commit(st, keys, 1, statuses),
                     KVD_ERR_NOT_FOUND);
    kvd_store_key_t done = {ns, hash_of(0)};
    assert_int_equal(kvd_store_commit(st, &done, 1, statuses), KVD_ERR_STATE);

    kvd_store_stats_t s;
    assert_int_equal(kvd_store_stats(st, &s), KVD_OK);
    assert_int_equal(s.host.objects, 3);
    assert_int_equal(s.host.bytes, 3 * 8192);
    kvd_store_close(st);
}

static void test_eviction_spares_leases(void **state)
{
    (void)state;
    /* 16 MiB in 4 MiB chunks: sixteen 1 MiB slots. */
    kvd_store_t *st = open_store("16m", "4m", NULL, NULL);
    kvd_namespace_t ns = ns_of(4);
    put_range(st, &ns, 0, 4, MIB, 0);
    kvd_store_lease_t held[4];
    assert_int_equal(lookup_range(st, &ns, 0, 4, held), 4);

    /* 40 more objects through a 16-slot arena. */
    for (uint32_t i = 0; i < 40; i++) {
        put_range(st, &ns, 100 + i, 1, MIB, 0);
    }
    for (uint32_t i = 0; i < 4; i++) {
        const uint8_t *p = kvd_store_arena_ptr(st, held[i].arena_offset, MIB);
        assert_true(check(p, MIB, i));
    }
    kvd_store_stats_t s;
    assert_int_equal(kvd_store_stats(st, &s), KVD_OK);
    assert_int_equal(s.host.objects, 16);
    assert_int_equal(s.host.evictions, 28);
    /* The newest survive, the oldest unleased are gone. */
    kvd_store_lease_t l[40];
    assert_int_equal(lookup_range(st, &ns, 139, 1, l), 1);
    assert_int_equal(kvd_store_release(st, l, 1), KVD_OK);
    assert_int_equal(lookup_range(st, &ns, 100, 1, l), 0);
    assert_int_equal(kvd_store_release(st, held, 4), KVD_OK);

    /* Everything reserved and unwritten: nothing can be evicted. */
    kvd_block_hash_t h[17];
    kvd_store_reservation_t r[17];
    for (uint32_t i = 0; i < 17; i++) {
        h[i] = hash_of(1000 + i);
    }
    assert_int_equal(kvd_store_reserve(st, &ns, h, 17, MIB, 0, r), KVD_OK);
    for (uint32_t i = 0; i < 16; i++) {
        assert_int_equal(r[i].status, KVD_OK);
    }
    assert_int_equal(r[16].status, KVD_ERR_NOSPACE);
    kvd_store_close(st);
}

/* kvd_store_pin: pinned objects outlive any pressure until unpinned;
 * pins stop at store.pin_max_bytes (default half the arena); keys not in
 * the arena are counted apart. */
static void test_pins(void **state)
{
    (void)state;
    kvd_store_t *st = open_store("16m", "4m", NULL, NULL);
    kvd_namespace_t ns = ns_of(5);
    put_range(st, &ns, 0, 10, MIB, 0);
    kvd_store_key_t k[10];
    for (uint32_t i = 0; i < 10; i++) {
        k[i] = (kvd_store_key_t){ns, hash_of(i)};
    }
    kvd_store_key_t absent = {ns, hash_of(999)};
    size_t done = 0, missing = 0;
    assert_int_equal(kvd_store_pin(st, &absent, 1, true, &done, &missing),
                     KVD_OK);
    assert_int_equal(done, 0);
    assert_int_equal(missing, 1);
    /* Half of 16 MiB: eight 1 MiB objects, the ninth refused. */
    assert_int_equal(kvd_store_pin(st, k, 10, true, &done, &missing),
                     KVD_ERR_QUOTA);
    assert_int_equal(done, 8);
    assert_int_equal(missing, 0);

    /* 40 more objects through the 16-slot arena: the pinned eight stay. */
    for (uint32_t i = 0; i < 40; i++) {
        put_range(st, &ns, 100 + i, 1, MIB, 0);
    }
    kvd_store_lease_t l[10];
    assert_int_equal(lookup_range(st, &ns, 0, 10, l), 8);
    for (uint32_t i = 0; i < 8; i++) {
        const uint8_t *p = kvd_store_arena_ptr(st, l[i].arena_offset, MIB);
        assert_true(check(p, MIB, i));
    }
    assert_int_equal(kvd_store_release(st, l, 8), KVD_OK);

    /* Unpinned, they go like any other. */
    assert_int_equal(kvd_store_pin(st, k, 8, false, &done, NULL), KVD_OK);
    assert_int_equal(done, 8);
    for (uint32_t i = 0; i < 40; i++) {
        put_range(st, &ns, 200 + i, 1, MIB, 0);
    }
    assert_int_equal(lookup_range(st, &ns, 0, 1, l), 0);
    assert_int_equal(kvd_store_pin(NULL, k, 1, true, NULL, NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_store_pin(st, NULL, 1, true, NULL, NULL),
                     KVD_ERR_INVALID);
    kvd_store_close(st);
}

static void test_slab_pressure_mixed_sizes(void **state)
{
    (void)state;
    /* Two object sizes share 8 chunks; each size in turn takes the whole
     * arena, which works only if chunks move between classes. */
    kvd_store_t *st = open_store("16m", "2m", NULL, NULL);
    kvd_namespace_t a = ns_of(5), b = ns_of(6);
    for (int round = 0; round < 3; round++) {
        for (uint32_t i = 0; i < 32; i++) {
            put_range(st, &a, (uint32_t)round * 1000 + i, 1, 512 * 1024, 0);
        }
        for (uint32_t i = 0; i < 48; i++) {
            put_range(st, &b, (uint32_t)round * 1000 + i, 1, 300 * 1024, 0);
        }
    }
    kvd_store_lease_t l[48];
    /* The last 48 b-objects fill (almost) the arena and read back. */
    size_t m = lookup_range(st, &b, 2000 + 8, 40, l);
    assert_int_equal(m, 40);
    for (size_t i = 0; i < m; i++) {
        const uint8_t *p =
            kvd_store_arena_ptr(st, l[i].arena_offset, 300 * 1024);
        assert_true(check(p, 300 * 1024, 2000 + 8 + (uint32_t)i));
    }
    assert_int_equal(kvd_store_release(st, l, m), KVD_OK);
    kvd_store_close(st);
}

static void test_tenant_quota(void **state)
{
    (void)state;
    kvd_store_t *st = open_store("16m", "4m", NULL, NULL);
    kvd_namespace_t ns = ns_of(7);
    assert_int_equal(kvd_store_tenant_set_quota(st, 9, 2 * MIB), KVD_OK);
    put_range(st, &ns, 0, 2, MIB, 9);
    put_range(st, &ns, 10, 4, MIB, 1); /* another tenant, unlimited */
    /* The third object of tenant 9 evicts its own oldest, nobody else's. */
    put_range(st, &ns, 2, 1, MIB, 9);
    kvd_store_lease_t l[4];
    assert_int_equal(lookup_range(st, &ns, 0, 1, l), 0);
    assert_int_equal(lookup_range(st, &ns, 10, 4, l), 4);
    assert_int_equal(kvd_store_release(st, l, 4), KVD_OK);
    /* Bigger than the quota: refused for this key only. */
    kvd_block_hash_t h[2] = {hash_of(50), hash_of(51)};
    kvd_store_reservation_t r[2];
    assert_int_equal(kvd_store_reserve(st, &ns, h, 1, 3 * MIB, 9, r), KVD_OK);
    assert_int_equal(r[0].status, KVD_ERR_QUOTA);
    assert_int_equal(kvd_store_reserve(st, &ns, h + 1, 1, 3 * MIB, 2, r),
                     KVD_OK);
    assert_int_equal(r[0].status, KVD_OK);
    kvd_store_key_t k = {ns, h[1]};
    assert_int_equal(kvd_store_abort(st, &k, 1, NULL), KVD_OK);
    assert_int_equal(kvd_store_tenant_set_quota(NULL, 1, 1), KVD_ERR_INVALID);
    kvd_store_close(st);
}

static void test_get_host_lease_and_poll(void **state)
{
    (void)state;
    kvd_store_t *st = open_store("16m", "4m", "store.get_queue", "2");
    kvd_namespace_t ns = ns_of(8);
    put_range(st, &ns, 0, 3, 4096, 0);
    kvd_store_lease_t l[3];
    assert_int_equal(lookup_range(st, &ns, 0, 3, l), 3);
    kvd_store_get_t g[3];
    for (int i = 0; i < 3; i++) {
        g[i].lease = l[i];
        g[i].user_data = 100 + (uint64_t)i;
    }
    size_t accepted = 0;
    assert_true(kvd_store_fd(st) >= 0);
    assert_int_equal(kvd_store_get_submit(st, g, 3, &accepted), KVD_OK);
    assert_int_equal(accepted, 2); /* the queue holds two */
    assert_int_equal(kvd_store_get_submit(st, g + 2, 1, &accepted),
                     KVD_ERR_BUSY);
    kvd_store_completion_t c[4];
    size_t got = 0;
    while (got < 2) {
        assert_int_equal(kvd_store_wait(st, 5000), KVD_OK);
        got += kvd_store_poll(st, c + got, 4 - got);
    }
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(c[i].status, KVD_OK);
        assert_int_equal(c[i].user_data, 100 + i);
        assert_int_equal(c[i].lease.tier, KVD_STORE_TIER_HOST);
        assert_int_equal(c[i].lease.arena_offset, l[i].arena_offset);
    }
    assert_int_equal(kvd_store_get_submit(st, g + 2, 1, &accepted), KVD_OK);
    assert_int_equal(kvd_store_wait(st, 5000), KVD_OK);
    assert_int_equal(kvd_store_poll(st, c, 4), 1);
    assert_int_equal(kvd_store_wait(st, 0), KVD_ERR_TIMEOUT);

    /* A disk lease without a disk tier is not a lease. */
    g[0].lease.tier = KVD_STORE_TIER_DISK;
    assert_int_equal(kvd_store_get_submit(st, g, 1, &accepted),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_store_release(st, l, 3), KVD_OK);
    kvd_store_close(st);
}

static void test_delete(void **state)
{
    (void)state;
    kvd_store_t *st = open_store("16m", "4m", NULL, NULL);
    kvd_namespace_t ns = ns_of(9);
    put_range(st, &ns, 0, 3, 4096, 0);
    kvd_store_lease_t l[1];
    assert_int_equal(lookup_range(st, &ns, 1, 1, l), 1);
    kvd_store_key_t keys[4] = {
        {ns, hash_of(0)}, {ns, hash_of(1)}, {ns, hash_of(2)}, {ns, hash_of(7)}};
    size_t deleted = 0;
    assert_int_equal(kvd_store_delete(st, keys, 4, &deleted), KVD_ERR_BUSY);
    assert_int_equal(deleted, 2);
    assert_int_equal(kvd_store_release(st, l, 1), KVD_OK);
    assert_int_equal(kvd_store_delete(st, keys, 4, &deleted), KVD_OK);
    assert_int_equal(deleted, 1);
    kvd_store_stats_t s;
    assert_int_equal(kvd_store_stats(st, &s), KVD_OK);
    assert_int_equal(s.host.objects, 0);
    assert_int_equal(kvd_store_flush(st, 1000), KVD_OK);
    kvd_store_close(st);
}

/* Scan lists every committed object once, in chunks, and nothing
 * reserved; a second call after the end writes nothing. */
static void test_scan(void **state)
{
    (void)state;
    kvd_store_t *st = open_store("16m", "4m", NULL, NULL);
    kvd_namespace_t a = ns_of(1), b = ns_of(2);
    put_range(st, &a, 0, 5, 4096, 0);
    put_range(st, &b, 0, 2, 8192, 7);
    kvd_block_hash_t h = hash_of(99);
    kvd_store_reservation_t r;
    assert_int_equal(kvd_store_reserve(st, &a, &h, 1, 4096, 0, &r), KVD_OK);
    assert_int_equal(r.status, KVD_OK);
    kvd_store_object_t out[2];
    uint64_t cursor = 0;
    size_t n = 0, na = 0, nb = 0, calls = 0;
    do {
        assert_int_equal(kvd_store_scan(st, &cursor, out, 2, &n), KVD_OK);
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(out[i].tier, KVD_STORE_TIER_HOST);
            if (out[i].key.ns.bytes[0] == 1) {
                assert_int_equal(out[i].size_bytes, 4096);
                assert_int_equal(out[i].tenant, 0);
                na++;
            } else {
                assert_int_equal(out[i].size_bytes, 8192);
                assert_int_equal(out[i].tenant, 7);
                nb++;
            }
        }
        calls++;
    } while (n == 2);
    assert_int_equal(na, 5);
    assert_int_equal(nb, 2);
    assert_true(calls >= 4);
    assert_int_equal(kvd_store_scan(st, &cursor, out, 2, &n), KVD_OK);
    assert_int_equal(n, 0);
    assert_int_equal(kvd_store_scan(NULL, &cursor, out, 2, &n),
                     KVD_ERR_INVALID);
    kvd_store_key_t k = {a, h};
    assert_int_equal(kvd_store_abort(st, &k, 1, NULL), KVD_OK);
    kvd_store_close(st);
}

static void test_export_maps_same_bytes(void **state)
{
    (void)state;
    kvd_store_t *st = open_store("16m", "4m", NULL, NULL);
    kvd_namespace_t ns = ns_of(10);
    put_range(st, &ns, 0, 1, 65536, 0);
    kvd_store_lease_t l[1];
    assert_int_equal(lookup_range(st, &ns, 0, 1, l), 1);
    kvd_store_arena_export_t exp;
    assert_int_equal(kvd_store_arena_export(st, &exp), KVD_OK);
    assert_true(exp.fd >= 0);
    assert_true(exp.size_bytes >= 16 * MIB);
    void *map = mmap(NULL, exp.map_bytes, PROT_READ, MAP_SHARED, exp.fd, 0);
    assert_true(map != MAP_FAILED);
    assert_true(check((const uint8_t *)map + l[0].arena_offset, 65536, 0));
    munmap(map, exp.map_bytes);
    close(exp.fd);
    assert_null(kvd_store_arena_ptr(st, exp.size_bytes, 1));
    assert_null(kvd_store_arena_ptr(st, 0, 0));
    assert_int_equal(kvd_store_release(st, l, 1), KVD_OK);
    kvd_store_close(st);
}

/* Tenant arenas: tenant 7's objects live in a partition of their own,
 * evict only each other, and its export maps that partition alone; the
 * main arena's tenants never evict tenant 7's objects either. */
/* Partitions of 0 bytes share store.arena_size equally with the main
 * arena: 7 chunks and two of them give 2 + 2 and leave 3 to the main one
 * (the memory stays 7 chunks); 2 chunks cannot give two tenants one
 * each besides the main arena (KVD_ERR_RANGE, the setting named). */
static void test_tenant_arenas_shared_out(void **state)
{
    (void)state;
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_size", "7m"), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_chunk", "1m"), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_hugepages", "off"),
                     KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_prefault", "false"),
                     KVD_OK);
    const kvd_store_tenant_arena_t arenas[] = {{.tenant = 5, .bytes = 0},
                                               {.tenant = 6, .bytes = MIB},
                                               {.tenant = 9, .bytes = 0}};
    kvd_store_t *st = NULL;
    char err[256] = "";
    assert_int_equal(
        kvd_store_open_partitioned(cfg, arenas, 3, &st, err, sizeof err),
        KVD_OK);
    kvd_arena_part_stats_t parts[4];
    size_t n = 0;
    assert_int_equal(kvd_store_arena_partitions(st, parts, 4, &n), KVD_OK);
    assert_int_equal(n, 4);
    assert_int_equal(parts[0].bytes_total, 3 * MIB); /* main */
    assert_int_equal(parts[1].bytes_total, 2 * MIB); /* tenant 5: a share */
    assert_int_equal(parts[2].bytes_total, MIB);     /* tenant 6: its size */
    assert_int_equal(parts[3].bytes_total, 2 * MIB); /* tenant 9: a share */
    kvd_store_close(st);
    st = NULL;
    assert_int_equal(kvd_config_set(cfg, "store.arena_size", "2m"), KVD_OK);
    assert_int_equal(
        kvd_store_open_partitioned(cfg, arenas, 3, &st, err, sizeof err),
        KVD_ERR_RANGE);
    assert_null(st);
    assert_non_null(strstr(err, "store.arena_size"));
    kvd_config_destroy(cfg);
}

static void test_tenant_arenas(void **state)
{
    (void)state;
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_size", "4m"), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_chunk", "1m"), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_hugepages", "off"),
                     KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_prefault", "false"),
                     KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.reserve_timeout", "0"), KVD_OK);
    const kvd_store_tenant_arena_t arenas[] = {{.tenant = 7, .bytes = 2 * MIB}};
    kvd_store_t *st = NULL;
    char err[256] = "";
    /* Tenant 0, a tenant twice and too many partitions are refused. */
    const kvd_store_tenant_arena_t zero[] = {{.tenant = 0, .bytes = MIB}};
    assert_int_equal(
        kvd_store_open_partitioned(cfg, zero, 1, &st, err, sizeof err),
        KVD_ERR_INVALID);
    assert_non_null(strstr(err, "server.tenant_arenas"));
    const kvd_store_tenant_arena_t twice[] = {{.tenant = 3, .bytes = MIB},
                                              {.tenant = 3, .bytes = MIB}};
    assert_int_equal(
        kvd_store_open_partitioned(cfg, twice, 2, &st, err, sizeof err),
        KVD_ERR_INVALID);
    kvd_store_tenant_arena_t many[KVD_ARENA_PARTS_MAX + 1];
    for (uint32_t i = 0; i <= KVD_ARENA_PARTS_MAX; i++) {
        many[i] = (kvd_store_tenant_arena_t){.tenant = i + 1, .bytes = MIB};
    }
    assert_int_equal(kvd_store_open_partitioned(cfg, many,
                                                KVD_ARENA_PARTS_MAX + 1, &st,
                                                err, sizeof err),
                     KVD_ERR_INVALID);
    assert_null(st);
    assert_int_equal(
        kvd_store_open_partitioned(cfg, arenas, 1, &st, err, sizeof err),
        KVD_OK);
    kvd_config_destroy(cfg);

    /* 256 KiB objects: 4 per chunk, 8 in tenant 7's arena, 16 in the main
     * one. Tenant 0 saves 12, tenant 7 saves 8. */
    const uint64_t size = 256 << 10;
    kvd_namespace_t ns0 = ns_of(40), ns7 = ns_of(47);
    put_range(st, &ns0, 0, 12, size, 0);
    put_range(st, &ns7, 100, 8, size, 7);
    kvd_store_lease_t l[16];
    assert_int_equal(lookup_range(st, &ns7, 100, 8, l), 8);
    for (size_t i = 0; i < 8; i++) {
        assert_true(l[i].arena_offset >= 4 * MIB &&
                    l[i].arena_offset < 6 * MIB);
    }
    assert_int_equal(kvd_store_release(st, l, 8), KVD_OK);
    assert_int_equal(lookup_range(st, &ns0, 0, 12, l), 12);
    for (size_t i = 0; i < 12; i++) {
        assert_true(l[i].arena_offset < 4 * MIB);
    }
    assert_int_equal(kvd_store_release(st, l, 12), KVD_OK);

    /* Tenant 7 saves 4 more: its arena is full, so 4 of its own go; all
     * 12 of tenant 0 stay although the main arena has room for 4 more. */
    put_range(st, &ns7, 108, 4, size, 7);
    assert_int_equal(lookup_range(st, &ns0, 0, 12, l), 12);
    assert_int_equal(kvd_store_release(st, l, 12), KVD_OK);
    kvd_store_stats_t stats;
    assert_int_equal(kvd_store_stats(st, &stats), KVD_OK);
    assert_int_equal(stats.host.evictions, 4);
    size_t left = 0;
    for (uint32_t i = 100; i < 112; i++) {
        if (lookup_range(st, &ns7, i, 1, l) == 1) {
            left++;
            assert_true(check(kvd_store_lease_ptr(st, &l[0]), size, i));
            assert_int_equal(kvd_store_release(st, l, 1), KVD_OK);
        }
    }
    assert_int_equal(left, 8);

    /* Tenant 0 fills the main arena and more: only its own objects go. */
    put_range(st, &ns0, 12, 8, size, 0);
    assert_int_equal(kvd_store_stats(st, &stats), KVD_OK);
    assert_int_equal(stats.host.evictions, 8);
    left = 0;
    for (uint32_t i = 100; i < 112; i++) {
        if (lookup_range(st, &ns7, i, 1, l) == 1) {
            left++;
            assert_int_equal(kvd_store_release(st, l, 1), KVD_OK);
        }
    }
    assert_int_equal(left, 8);

    /* The exports: tenant 7's partition alone, or the main arena. */
    kvd_store_arena_export_t exp;
    struct stat sb;
    assert_int_equal(kvd_store_arena_export_tenant(st, 7, &exp), KVD_OK);
    assert_int_equal(exp.offset, 4 * MIB);
    assert_int_equal(exp.size_bytes, 2 * MIB);
    assert_int_equal(fstat(exp.fd, &sb), 0);
    assert_int_equal((uint64_t)sb.st_size, 2 * MIB);
    close(exp.fd);
    assert_int_equal(kvd_store_arena_export_tenant(st, 9, &exp), KVD_OK);
    assert_int_equal(exp.offset, 0);
    assert_int_equal(exp.size_bytes, 4 * MIB);
    close(exp.fd);
    assert_int_equal(kvd_store_arena_export(st, &exp), KVD_OK);
    assert_int_equal(exp.offset, 0);
    assert_int_equal(fstat(exp.fd, &sb), 0);
    assert_int_equal((uint64_t)sb.st_size, 4 * MIB);
    close(exp.fd);
    kvd_store_close(st);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    kvd_store_t *st = open_store("16m", "4m", NULL, NULL);
    kvd_namespace_t ns = ns_of(11);
    kvd_block_hash_t h = hash_of(0);
    kvd_store_reservation_t r;
    size_t m = 0;
    kvd_store_lease_t l;
    kvd_store_stats_t s;
    assert_int_equal(kvd_store_reserve(NULL, &ns, &h, 1, 4096, 0, &r),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_store_reserve(st, &ns, &h, 1, 0, 0, &r),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_store_reserve(st, &ns, &h, 1, 5 * MIB, 0, &r),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_store_reserve(st, &ns, NULL, 1, 4096, 0, &r),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_store_lookup(st, NULL, &h, 1, &l, &m),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_store_lookup(st, &ns, &h, 1, NULL, &m),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_store_lookup(st, &ns, NULL, 0, NULL, &m), KVD_OK);
    assert_int_equal(m, 0);
    assert_int_equal(kvd_store_commit(st, NULL, 1, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_store_abort(st, NULL, 1, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_store_release(st, NULL, 1), KVD_ERR_INVALID);
    l.tier = 7;
    assert_int_equal(kvd_store_release(st, &l, 1), KVD_ERR_INVALID);
    assert_int_equal(kvd_store_delete(st, NULL, 1, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_store_get_submit(st, NULL, 1, &m), KVD_ERR_INVALID);
    assert_int_equal(kvd_store_stats(st, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_store_stats(NULL, &s), KVD_ERR_INVALID);
    assert_int_equal(kvd_store_flush(NULL, 0), KVD_ERR_INVALID);
    assert_int_equal(kvd_store_wait(NULL, 0), KVD_ERR_INVALID);
    assert_int_equal(kvd_store_poll(NULL, NULL, 1), 0);
    assert_int_equal(kvd_store_fd(NULL), -1);
    assert_int_equal(kvd_store_arena_export(st, NULL), KVD_ERR_INVALID);
    kvd_store_close(st);
    kvd_store_close(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_settings),
        cmocka_unit_test(test_disk_beyond_free_space_says_why),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_scan),
        cmocka_unit_test(test_gaps_duplicates_and_aborts),
        cmocka_unit_test(test_eviction_spares_leases),
        cmocka_unit_test(test_pins),
        cmocka_unit_test(test_slab_pressure_mixed_sizes),
        cmocka_unit_test(test_tenant_quota),
        cmocka_unit_test(test_get_host_lease_and_poll),
        cmocka_unit_test(test_delete),
        cmocka_unit_test(test_export_maps_same_bytes),
        cmocka_unit_test(test_tenant_arenas),
        cmocka_unit_test(test_tenant_arenas_shared_out),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
