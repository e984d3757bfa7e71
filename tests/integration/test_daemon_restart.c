/*
 * kvdepotd end to end, a daemon that goes away under its clients: a
 * restart keeps the NVMe tier, and a graceful stop writes the arena's
 * objects there first, and a client that outlives the daemon maps
 * the new arena by itself and loads from disk; the offsets a client holds
 * (a lease, a reservation, a hold) stay in the arena they were given in;
 * a dead daemon: calls fail within store.timeout (lookups find nothing,
 * saves are skipped), and the client recovers when the daemon is back.
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
#include "tests/unit/kvd_testdir_int.h"
#include "tests/integration/kvd_testdaemon_int.h"
#include "tests/integration/kvd_testdaemonclient_int.h"

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

/*
 * With the default store.disk_write=back, objects saved to a daemon live in
 * its arena only until a graceful stop (SIGTERM) writes them to NVMe
 * (store.stop_flush_timeout): a daemon restarted on the same directory
 * finds every one on its disk tier, byte for byte. Before, the stop wrote
 * nothing back and the restarted daemon found none.
 */
static void test_sigterm_keeps_host_tier(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_stop_flush");
    char disk[300];
    snprintf(disk, sizeof disk, "store.disk_path=%s/nvme", d.path);
    char nvme[300];
    snprintf(nvme, sizeof nvme, "%s/nvme", d.path);
    assert_int_equal(mkdir(nvme, 0700), 0);
    pid_t dpid =
        daemon_start(&d, disk, "store.disk_size=32m", (const char *)NULL);
    kvd_namespace_t ns;
    kvd_block_hash_t h[NKEYS];
    keys_make(&ns, h, NKEYS, 6);
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    assert_int_equal(save_objects(st, &ns, h, NKEYS), NKEYS);
    kvd_store_stats_t stats;
    assert_int_equal(kvd_store_stats(st, &stats), KVD_OK);
    assert_int_equal(stats.disk.objects, 0); /* the arena only, so far */
    kvd_store_close(st);
    uint64_t t0 = now_ms();
    daemon_stop(dpid);
    printf("# SIGTERM with %u objects in the arena only: stopped in %llu ms\n",
           NKEYS, (unsigned long long)(now_ms() - t0));

    dpid = daemon_start(&d, disk, "store.disk_size=32m", (const char *)NULL);
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    kvd_store_lease_t l[NKEYS];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, h, NKEYS, l, &m), KVD_OK);
    assert_int_equal(m, NKEYS);
    kvd_store_lease_t got[NKEYS];
    get_from_disk(st, l, NKEYS, got);
    for (size_t i = 0; i < NKEYS; i++) {
        check_bytes(st, &got[i]);
    }
    assert_int_equal(kvd_store_release(st, got, NKEYS), KVD_OK);
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

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restart_keeps_disk_tier),
        cmocka_unit_test(test_sigterm_keeps_host_tier),
        cmocka_unit_test(test_restart_keeps_offsets_in_their_arena),
        cmocka_unit_test(test_dead_daemon_no_hang),
    };
    return cmocka_run_group_tests(tests, skip_without_daemon, NULL);
}
