/*
 * The store client's leases (client/lease.c) against a kvdepotd run in
 * this process (kvd_testclient_int.h), whose lease counters are read
 * directly (reading them sends nothing):
 *   - a Lookup's blocks form one lease group: the daemon's lease id is
 *     released when the last block is, not before; a released block's
 *     lease_ptr is NULL and releasing it again is KVD_ERR_NOT_FOUND, even
 *     while the rest of its group is held;
 *   - two lookups of the same blocks are two groups, released apart;
 *   - a release is deferred: the next Lookup carries it, else the get
 *     thread sends it on its own; Stats, Admin and Delete send the
 *     deferred ones first, and close gives back what is still held;
 *   - store.lease_ttl is what the daemon keeps an unreleased lease for;
 *     past it lease_ptr is NULL and the release answers KVD_ERR_TIMEOUT.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/unit/kvd_testclient_int.h"

#define NOBJ 4

static kvd_namespace_t ns;
static kvd_block_hash_t h[NOBJ];

/* A daemon of its own for each test, with the NOBJ objects saved. */
static int setup(void **state)
{
    static kvd_test_cl_t t;
    kvd_test_cl_start(&t, "client_leases", false, (const char *)NULL);
    kvd_store_t *st = NULL;
    assert_int_equal(kvd_test_cl_open(&t, &st, (const char *)NULL), KVD_OK);
    kvd_test_cl_keys(&ns, 1, h, NOBJ, 1);
    kvd_test_cl_save(st, &ns, h, NOBJ);
    kvd_store_close(st);
    *state = &t;
    return 0;
}

static int teardown(void **state)
{
    kvd_test_cl_stop(*state);
    return 0;
}

static kvd_store_t *open_store(kvd_test_cl_t *t)
{
    kvd_store_t *st = NULL;
    assert_int_equal(kvd_test_cl_open(t, &st, (const char *)NULL), KVD_OK);
    return st;
}

static void lookup(kvd_store_t *st, size_t first, size_t n,
                   kvd_store_lease_t *l)
{
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, &h[first], n, l, &m), KVD_OK);
    assert_int_equal(m, n);
}

static void test_group_released_with_last_block(void **state)
{
    kvd_test_cl_t *t = *state;
    kvd_store_t *st = open_store(t);
    kvd_store_lease_t l[NOBJ];
    lookup(st, 0, NOBJ, l);
    for (size_t i = 0; i < NOBJ; i++) {
        assert_int_not_equal(l[i].reserved, 0);
        assert_true(i == 0 || l[i].reserved != l[i - 1].reserved);
        assert_true(kvd_test_cl_holds(kvd_store_lease_ptr(st, &l[i]), &h[i]));
    }
    kvd_service_stats_t svc = kvd_test_cl_svc(t);
    assert_int_equal(svc.leases, 1);
    assert_int_equal(svc.leased_blocks, NOBJ);
    uint64_t releases = svc.methods[KVD_RPC_RELEASE].calls;

    assert_int_equal(kvd_store_release(st, l, NOBJ - 1), KVD_OK);
    /* Each block is released on its own: a released block of a group
     * still held has no pointer, and releasing it again is refused. */
    assert_null(kvd_store_lease_ptr(st, &l[0]));
    assert_int_equal(kvd_store_release(st, &l[0], 1), KVD_ERR_NOT_FOUND);
    assert_true(
        kvd_test_cl_holds(kvd_store_lease_ptr(st, &l[NOBJ - 1]), &h[NOBJ - 1]));
    /* Well past the get thread's delay: still nothing to send. */
    usleep(30000);
    svc = kvd_test_cl_svc(t);
    assert_int_equal(svc.leases, 1);
    assert_int_equal(svc.methods[KVD_RPC_RELEASE].calls, releases);

    /* The last block: the id goes, sent by the get thread on its own. */
    assert_int_equal(kvd_store_release(st, &l[NOBJ - 1], 1), KVD_OK);
    for (size_t i = 0; i < NOBJ; i++) {
        assert_null(kvd_store_lease_ptr(st, &l[i]));
    }
    kvd_test_cl_wait_leases(t, 0);
    kvd_test_cl_wait_calls(t, KVD_RPC_RELEASE, releases + 1);
    assert_int_equal(kvd_store_release(st, &l[0], 1), KVD_ERR_NOT_FOUND);
    kvd_store_close(st);
}

static void test_two_lookups_two_groups(void **state)
{
    kvd_test_cl_t *t = *state;
    kvd_store_t *st = open_store(t);
    kvd_store_lease_t a[2], b[2];
    lookup(st, 0, 2, a);
    lookup(st, 0, 2, b);
    assert_int_not_equal(a[0].reserved, b[0].reserved);
    assert_int_equal(kvd_test_cl_svc(t).leases, 2);
    assert_int_equal(kvd_store_release(st, a, 2), KVD_OK);
    kvd_test_cl_wait_leases(t, 1);
    assert_null(kvd_store_lease_ptr(st, &a[0]));
    assert_true(kvd_test_cl_holds(kvd_store_lease_ptr(st, &b[0]), &h[0]));
    assert_true(kvd_test_cl_holds(kvd_store_lease_ptr(st, &b[1]), &h[1]));
    /* Leases this client never handed out are refused; the good one in
     * the same call is still released. */
    kvd_store_lease_t mixed[3] = {b[0], b[1], b[1]};
    mixed[0].reserved = 0;
    mixed[2].reserved = 9999;
    assert_int_equal(kvd_store_release(st, mixed, 3), KVD_ERR_NOT_FOUND);
    assert_non_null(kvd_store_lease_ptr(st, &b[0])); /* one block left */
    usleep(10000);
    assert_int_equal(kvd_test_cl_svc(t).leases, 1);
    assert_int_equal(kvd_store_release(st, b, 1), KVD_OK);
    kvd_test_cl_wait_leases(t, 0);
    assert_null(kvd_store_lease_ptr(st, &b[0]));
    assert_null(kvd_store_lease_ptr(st, &b[1]));
    kvd_store_close(st);
}

/*
 * A release waits for the next Lookup to carry it (CL_RELEASE_DELAY_MS,
 * 2 ms, before the get thread sends it instead). Each round releases a
 * lease and looks up at once; the old lease is gone after that Lookup, and
 * the daemon counts a Release call only when the get thread was first. A
 * round preempted for longer than the delay may fairly go either way, so
 * the test asks that most rounds were carried.
 */
static void test_release_carried_by_next_lookup(void **state)
{
    kvd_test_cl_t *t = *state;
    kvd_store_t *st = open_store(t);
    enum { ROUNDS = 20 };
    kvd_store_lease_t l[2];
    lookup(st, 0, 1, &l[0]);
    uint64_t releases = kvd_test_cl_calls(t, KVD_RPC_RELEASE);
    for (size_t r = 0; r < ROUNDS; r++) {
        kvd_store_lease_t *old = &l[r % 2], *next = &l[(r + 1) % 2];
        assert_int_equal(kvd_store_release(st, old, 1), KVD_OK);
        lookup(st, (r + 1) % NOBJ, 1, next);
        kvd_test_cl_wait_leases(t, 1); /* the old one gone either way */
    }
    uint64_t sent = kvd_test_cl_calls(t, KVD_RPC_RELEASE) - releases;
    print_message("of %d releases %llu were sent alone\n", ROUNDS,
                  (unsigned long long)sent);
    assert_true(sent <= ROUNDS / 2);
    assert_int_equal(kvd_store_release(st, &l[ROUNDS % 2], 1), KVD_OK);
    kvd_test_cl_wait_leases(t, 0);
    kvd_store_close(st);
}

static void test_calls_send_deferred_releases_first(void **state)
{
    kvd_test_cl_t *t = *state;
    kvd_store_t *st = open_store(t);
    kvd_store_lease_t l[2];
    /* Stats counts the lease just released. */
    lookup(st, 0, 1, l);
    assert_int_equal(kvd_store_release(st, l, 1), KVD_OK);
    kvd_store_stats_t ss;
    assert_int_equal(kvd_store_stats(st, &ss), KVD_OK);
    assert_int_equal(ss.leases, 0);
    /* Admin (drain) does too. */
    lookup(st, 0, 1, l);
    assert_int_equal(kvd_store_release(st, l, 1), KVD_OK);
    uint64_t leases = 99, resv = 99;
    assert_int_equal(kvd_client_drain(kvd_client_of(st), false, &leases, &resv),
                     KVD_OK);
    assert_int_equal(leases, 0);
    /* Delete of a block just released is not refused as leased. */
    lookup(st, NOBJ - 1, 1, l);
    assert_int_equal(kvd_store_release(st, l, 1), KVD_OK);
    kvd_store_key_t k = {ns, h[NOBJ - 1]};
    size_t deleted = 0;
    assert_int_equal(kvd_store_delete(st, &k, 1, &deleted), KVD_OK);
    assert_int_equal(deleted, 1);
    kvd_test_cl_save(st, &ns, &h[NOBJ - 1], 1);
    /* Close gives back what is held and what was deferred. */
    lookup(st, 0, 2, l);
    kvd_store_t *st2 = open_store(t);
    kvd_store_lease_t l2[2];
    lookup(st2, 0, 2, l2);
    assert_int_equal(kvd_store_release(st2, l2, 1), KVD_OK);
    assert_int_equal(kvd_test_cl_svc(t).leases, 2);
    kvd_store_close(st2);
    assert_int_equal(kvd_test_cl_svc(t).leases, 1);
    assert_int_equal(kvd_store_release(st, l, 2), KVD_OK);
    kvd_store_close(st);
    assert_int_equal(kvd_test_cl_svc(t).leases, 0);
}

static void test_lookup_edges_and_ttl(void **state)
{
    kvd_test_cl_t *t = *state;
    kvd_store_t *st = open_store(t);
    kvd_store_lease_t l[3];
    size_t m = 99;
    uint64_t lookups = kvd_test_cl_calls(t, KVD_RPC_LOOKUP);
    assert_int_equal(kvd_store_lookup(st, &ns, h, 0, l, &m), KVD_OK);
    assert_int_equal(m, 0);
    assert_int_equal(kvd_test_cl_calls(t, KVD_RPC_LOOKUP), lookups);
    /* A prefix: it stops at the first miss; a miss leases nothing. */
    kvd_block_hash_t mixed[3] = {h[0], h[1], h[2]};
    mixed[1].bytes[9] ^= 0xFF;
    assert_int_equal(kvd_store_lookup(st, &ns, mixed, 3, l, &m), KVD_OK);
    assert_int_equal(m, 1);
    assert_int_equal(kvd_store_release(st, l, 1), KVD_OK);
    kvd_test_cl_wait_leases(t, 0);
    assert_int_equal(kvd_store_lookup(st, &ns, &mixed[1], 2, l, &m), KVD_OK);
    assert_int_equal(m, 0);
    assert_int_equal(kvd_test_cl_svc(t).leases, 0);
    kvd_store_close(st);

    /* store.lease_ttl is asked of the daemon: an unreleased lease is
     * reclaimed after it. */
    assert_int_equal(kvd_test_cl_open(t, &st, "store.lease_ttl", "100ms",
                                      (const char *)NULL),
                     KVD_OK);
    uint64_t expired = kvd_test_cl_svc(t).leases_expired;
    uint64_t t0 = kvd_test_cl_now_ms();
    lookup(st, 0, 2, l);
    kvd_test_cl_wait_leases(t, 0);
    assert_true(kvd_test_cl_now_ms() - t0 >= 100);
    assert_int_equal(kvd_test_cl_svc(t).leases_expired, expired + 1);
    /* Past its deadline: no pointer, and the release says the lease had
     * expired (a copy that ended now is not to be trusted). */
    assert_null(kvd_store_lease_ptr(st, &l[0]));
    assert_int_equal(kvd_store_release(st, l, 2), KVD_ERR_TIMEOUT);
    kvd_store_close(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_group_released_with_last_block,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_lookups_two_groups, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_release_carried_by_next_lookup,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_calls_send_deferred_releases_first,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_lookup_edges_and_ttl, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
