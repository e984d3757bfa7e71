/*
 * The store client across daemon restarts (client/mapping.c,
 * client/transport.c) against a kvdepotd run in this process
 * (kvd_testclient_int.h), restarted in place (a new instance and arena on
 * the same socket):
 *   - the first call that reaches the new daemon maps its arena (a new
 *     generation) and is answered; the old arena stays mapped while a lease
 *     or reservation of it is held, and lease_ptr / reservation_ptr of
 *     those still resolve there, never to the new object at that offset;
 *   - the old ids are gone: commit and abort of an old reservation, and a
 *     get of an old lease, report KVD_ERR_NOT_FOUND without asking the new
 *     daemon; releasing an old lease sends nothing; once nothing of it is
 *     held the old arena is unmapped;
 *   - at most CL_MAPPINGS_MAX (16) arenas stay mapped: the oldest goes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/unit/kvd_testclient_int.h"

/* Mappings of a kvdepot arena in this process (the daemon's own too). */
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

/* Restarts the daemon and waits until the client has mapped the new
 * arena (any call that names no id does it: Stats here). */
static void restart(kvd_test_cl_t *t, kvd_store_t *st)
{
    uint32_t gen = kvd_store_arena_generation(st);
    kvd_test_cl_restart(t);
    uint64_t deadline = kvd_test_cl_now_ms() + 5000;
    kvd_store_stats_t ss;
    while (kvd_store_stats(st, &ss) != KVD_OK) {
        assert_true(kvd_test_cl_now_ms() < deadline);
        usleep(10000);
    }
    assert_int_equal(kvd_store_arena_generation(st), gen + 1);
}

static void test_old_ids_and_old_arena(void **state)
{
    (void)state;
    kvd_test_cl_t t;
    kvd_test_cl_start(&t, "client_restart", false, (const char *)NULL);
    kvd_store_t *st = NULL;
    assert_int_equal(kvd_test_cl_open(&t, &st, (const char *)NULL), KVD_OK);
    kvd_namespace_t ns;
    kvd_block_hash_t h[4];
    kvd_test_cl_keys(&ns, 1, h, 4, 1);
    /* X saved and leased, Y0 and Y1 reserved, in the first arena. */
    kvd_test_cl_save(st, &ns, h, 1);
    kvd_store_lease_t lx;
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, h, 1, &lx, &m), KVD_OK);
    assert_int_equal(m, 1);
    kvd_store_reservation_t ry[2];
    assert_int_equal(
        kvd_store_reserve(st, &ns, &h[1], 2, KVD_TEST_CL_OBJ, 0, ry), KVD_OK);
    assert_int_equal(ry[0].status, KVD_OK);
    assert_int_equal(ry[1].status, KVD_OK);
    assert_int_equal(kvd_store_arena_generation(st), 1);
    size_t maps_before = arena_mappings();

    /* The first call after the restart names the old instance, is told
     * so, maps the new arena and is sent again: a Lookup answered. */
    kvd_test_cl_restart(&t);
    uint64_t deadline = kvd_test_cl_now_ms() + 5000;
    kvd_store_lease_t lz;
    while (kvd_store_lookup(st, &ns, &h[3], 1, &lz, &m) != KVD_OK) {
        assert_true(kvd_test_cl_now_ms() < deadline);
        usleep(10000);
    }
    assert_int_equal(m, 0);
    assert_int_equal(kvd_store_arena_generation(st), 2);
    /* Both daemon arenas were replaced, the client maps one more. */
    assert_int_equal(arena_mappings(), maps_before + 1);

    /* Z, the new daemon's first object, lands at X's offset. */
    kvd_test_cl_save(st, &ns, &h[3], 1);
    assert_int_equal(kvd_store_lookup(st, &ns, &h[3], 1, &lz, &m), KVD_OK);
    assert_int_equal(m, 1);
    assert_int_equal(lz.arena_offset, lx.arena_offset);
    const uint8_t *px = kvd_store_lease_ptr(st, &lx);
    assert_true(kvd_test_cl_holds(px, &h[0]));
    assert_true(kvd_test_cl_holds(kvd_store_lease_ptr(st, &lz), &h[3]));
    assert_ptr_not_equal(px, kvd_store_lease_ptr(st, &lz));
    assert_true(kvd_test_cl_holds(
        kvd_store_arena_ptr(st, lx.arena_offset, KVD_TEST_CL_OBJ), &h[3]));
    /* An old reservation writes into the old arena, not over Z. */
    uint8_t *py = kvd_store_reservation_ptr(st, &ry[0], KVD_TEST_CL_OBJ);
    assert_non_null(py);
    memset(py, 0xEE, KVD_TEST_CL_OBJ);
    assert_true(kvd_test_cl_holds(kvd_store_lease_ptr(st, &lz), &h[3]));

    /* The old ids are gone, the new daemon is not asked about them. */
    uint64_t commits = kvd_test_cl_calls(&t, KVD_RPC_COMMIT);
    uint64_t aborts = kvd_test_cl_calls(&t, KVD_RPC_ABORT);
    uint64_t releases = kvd_test_cl_calls(&t, KVD_RPC_RELEASE);
    kvd_store_key_t k0 = {ns, h[1]}, k1 = {ns, h[2]};
    kvd_status_t cs = KVD_OK;
    assert_int_equal(kvd_store_commit(st, &k0, 1, &cs), KVD_ERR_NOT_FOUND);
    assert_int_equal(cs, KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_store_abort(st, &k1, 1, &cs), KVD_ERR_NOT_FOUND);
    assert_int_equal(cs, KVD_ERR_NOT_FOUND);
    assert_int_equal(arena_mappings(), maps_before + 1); /* lx holds it */
    assert_int_equal(kvd_store_release(st, &lx, 1), KVD_OK);
    assert_null(kvd_store_lease_ptr(st, &lx));
    assert_null(kvd_store_reservation_ptr(st, &ry[0], KVD_TEST_CL_OBJ));
    assert_int_equal(arena_mappings(), maps_before);
    usleep(20000); /* past the get thread's release delay */
    assert_int_equal(kvd_test_cl_calls(&t, KVD_RPC_COMMIT), commits);
    assert_int_equal(kvd_test_cl_calls(&t, KVD_RPC_ABORT), aborts);
    assert_int_equal(kvd_test_cl_calls(&t, KVD_RPC_RELEASE), releases);
    kvd_service_stats_t svc = kvd_test_cl_svc(&t);
    assert_int_equal(svc.leases, 1); /* lz */
    assert_int_equal(svc.reservations, 0);
    assert_int_equal(kvd_store_release(st, &lz, 1), KVD_OK);
    kvd_test_cl_wait_leases(&t, 0);
    kvd_store_close(st);
    kvd_test_cl_stop(&t);
}

/* Gets of a lease of an earlier daemon fail with NOT_FOUND and give the
 * lease back; the objects on its disk tier are found again. */
static void test_get_of_old_lease(void **state)
{
    (void)state;
    kvd_test_cl_t t;
    kvd_test_cl_start(&t, "client_restart_disk", true, (const char *)NULL);
    kvd_store_t *st = NULL;
    assert_int_equal(kvd_test_cl_open(&t, &st, (const char *)NULL), KVD_OK);
    kvd_namespace_t ns;
    kvd_block_hash_t h[2];
    kvd_test_cl_keys(&ns, 2, h, 2, 2);
    kvd_test_cl_save(st, &ns, h, 2);
    assert_int_equal(kvd_store_flush(st, 10000), KVD_OK);
    restart(&t, st);
    kvd_store_lease_t ld[2];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, h, 2, ld, &m), KVD_OK);
    assert_int_equal(m, 2);
    assert_int_equal(ld[0].tier, KVD_STORE_TIER_DISK);
    restart(&t, st);

    uint64_t gets = kvd_test_cl_calls(&t, KVD_RPC_GET);
    kvd_store_get_t g = {.lease = ld[0], .user_data = 7};
    size_t acc = 0;
    assert_int_equal(kvd_store_get_submit(st, &g, 1, &acc), KVD_OK);
    assert_int_equal(acc, 1);
    assert_int_equal(kvd_store_wait(st, 5000), KVD_OK);
    kvd_store_completion_t c;
    assert_int_equal(kvd_store_poll(st, &c, 1), 1);
    assert_int_equal(c.user_data, 7);
    assert_int_equal(c.status, KVD_ERR_NOT_FOUND);
    /* The new daemon was asked under its own instance and knew nothing of
     * the old lease id; the failed get gave its block back. */
    assert_int_equal(kvd_test_cl_calls(&t, KVD_RPC_GET), gets + 1);
    assert_int_equal(kvd_store_release(st, &ld[1], 1), KVD_OK);
    assert_int_equal(kvd_store_release(st, &ld[0], 1), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_test_cl_svc(&t).leases, 0);

    /* The objects survived both restarts on the disk tier. */
    assert_int_equal(kvd_store_lookup(st, &ns, h, 2, ld, &m), KVD_OK);
    assert_int_equal(m, 2);
    assert_int_equal(ld[0].tier, KVD_STORE_TIER_DISK);
    assert_int_equal(kvd_store_release(st, ld, 2), KVD_OK);
    kvd_store_close(st);
    kvd_test_cl_stop(&t);
}

/* A lease held from each of 17 daemon instances: 16 arenas stay mapped,
 * the oldest is let go (its lease_ptr NULL though the lease is held). */
static void test_mappings_capped(void **state)
{
    (void)state;
    enum { N = 17 };
    kvd_test_cl_t t;
    kvd_test_cl_start(&t, "client_restart_cap", false, (const char *)NULL);
    kvd_store_t *st = NULL;
    assert_int_equal(kvd_test_cl_open(&t, &st, (const char *)NULL), KVD_OK);
    kvd_namespace_t ns;
    kvd_block_hash_t h[N];
    kvd_test_cl_keys(&ns, 3, h, N, 3);
    kvd_store_lease_t l[N];
    size_t base = arena_mappings() - 1; /* the daemon's and others' */
    for (size_t i = 0; i < N; i++) {
        if (i > 0) {
            restart(&t, st);
        }
        kvd_test_cl_save(st, &ns, &h[i], 1);
        size_t m = 0;
        assert_int_equal(kvd_store_lookup(st, &ns, &h[i], 1, &l[i], &m),
                         KVD_OK);
        assert_int_equal(m, 1);
        assert_int_equal(arena_mappings(), base + (i < 16 ? i + 1 : 16));
    }
    assert_null(kvd_store_lease_ptr(st, &l[0]));
    for (size_t i = 1; i < N; i++) {
        assert_true(kvd_test_cl_holds(kvd_store_lease_ptr(st, &l[i]), &h[i]));
    }
    assert_int_equal(kvd_store_release(st, l, N), KVD_OK);
    assert_int_equal(arena_mappings(), base + 1);
    kvd_store_close(st);
    kvd_test_cl_stop(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_old_ids_and_old_arena),
        cmocka_unit_test(test_get_of_old_lease),
        cmocka_unit_test(test_mappings_capped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
