/*
 * The store client's save path and deletes (client/data.c) through the
 * store ops, against a kvdepotd run in this process
 * (kvd_testclient_int.h):
 *   - reserve answers slots of the mapped arena; bytes written there are
 *     the daemon's bytes (its own view of the slot sees them), invisible
 *     until commit, then found by lookup at the same offsets;
 *   - refusals: a stored key (KVD_ERR_EXISTS), a size the arena or a chunk
 *     cannot hold (KVD_ERR_INVALID);
 *   - abort gives the slots back; a key neither reserved nor still
 *     reserved reports KVD_ERR_NOT_FOUND on commit and abort;
 *   - commit sends one call per reservation id, statuses in the caller's
 *     order; delete one call per run of one namespace, KVD_ERR_BUSY with
 *     the others deleted when one is leased;
 *   - without a daemon reserve skips the saves, each key saying why.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/unit/kvd_testclient_int.h"

/* A daemon of its own for each test. */
static int setup(void **state)
{
    static kvd_test_cl_t t;
    kvd_test_cl_start(&t, "client_data", false, (const char *)NULL);
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

static size_t found(kvd_store_t *st, const kvd_namespace_t *ns,
                    const kvd_block_hash_t *h, size_t n)
{
    kvd_store_lease_t l[KVD_TEST_CL_MAX];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, ns, h, n, l, &m), KVD_OK);
    assert_int_equal(kvd_store_release(st, l, m), KVD_OK);
    return m;
}

static void test_reserve_write_commit(void **state)
{
    kvd_test_cl_t *t = *state;
    kvd_store_t *st = open_store(t);
    kvd_namespace_t ns;
    kvd_block_hash_t h[3];
    kvd_test_cl_keys(&ns, 1, h, 3, 1);
    kvd_store_reservation_t r[3];
    assert_int_equal(kvd_store_reserve(st, &ns, h, 3, KVD_TEST_CL_OBJ, 0, r),
                     KVD_OK);
    assert_int_equal(kvd_test_cl_svc(t).reservations, 1); /* one id */
    kvd_store_key_t keys[3];
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(r[i].status, KVD_OK);
        assert_int_equal(r[i].reserved, kvd_store_arena_generation(st));
        uint8_t *p = kvd_store_reservation_ptr(st, &r[i], KVD_TEST_CL_OBJ);
        assert_ptr_equal(
            p, kvd_store_arena_ptr(st, r[i].arena_offset, KVD_TEST_CL_OBJ));
        kvd_test_cl_fill(p, &h[i]);
        /* The same memory as the daemon's slot, mapped twice. */
        const uint8_t *mine = kvd_store_arena_ptr(
            t->srv->store, r[i].arena_offset, KVD_TEST_CL_OBJ);
        assert_ptr_not_equal(mine, p);
        assert_true(kvd_test_cl_holds(mine, &h[i]));
        keys[i] = (kvd_store_key_t){.ns = ns, .hash = h[i]};
        for (size_t j = 0; j < i; j++) {
            assert_int_not_equal(r[i].arena_offset, r[j].arena_offset);
        }
    }
    assert_int_equal(found(st, &ns, h, 3), 0); /* not yet committed */
    uint64_t commits = kvd_test_cl_calls(t, KVD_RPC_COMMIT);
    kvd_status_t cs[3] = {-1, -1, -1};
    assert_int_equal(kvd_store_commit(st, keys, 3, cs), KVD_OK);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(cs[i], KVD_OK);
    }
    assert_int_equal(kvd_test_cl_calls(t, KVD_RPC_COMMIT), commits + 1);
    assert_int_equal(kvd_test_cl_svc(t).reservations, 0);
    kvd_store_lease_t l[3];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, h, 3, l, &m), KVD_OK);
    assert_int_equal(m, 3);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(l[i].tier, KVD_STORE_TIER_HOST);
        assert_int_equal(l[i].arena_offset, r[i].arena_offset);
        assert_int_equal(l[i].size_bytes, KVD_TEST_CL_OBJ);
        assert_true(kvd_test_cl_holds(kvd_store_lease_ptr(st, &l[i]), &h[i]));
    }
    assert_int_equal(kvd_store_release(st, l, 3), KVD_OK);
    /* Committed once: the record is gone, a second commit finds nothing. */
    assert_int_equal(kvd_store_commit(st, keys, 1, cs), KVD_ERR_NOT_FOUND);
    assert_int_equal(cs[0], KVD_ERR_NOT_FOUND);
    kvd_store_close(st);
}

static void test_reserve_refusals(void **state)
{
    kvd_test_cl_t *t = *state;
    kvd_store_t *st = open_store(t);
    kvd_namespace_t ns;
    kvd_block_hash_t h[2];
    kvd_test_cl_keys(&ns, 2, h, 2, 2);
    kvd_test_cl_save(st, &ns, h, 1);
    kvd_store_reservation_t r[2];
    assert_int_equal(kvd_store_reserve(st, &ns, h, 2, KVD_TEST_CL_OBJ, 0, r),
                     KVD_OK);
    assert_int_equal(r[0].status, KVD_ERR_EXISTS);
    assert_null(kvd_store_reservation_ptr(st, &r[0], KVD_TEST_CL_OBJ));
    assert_int_equal(r[1].status, KVD_OK);
    kvd_store_key_t k = {.ns = ns, .hash = h[1]};
    assert_int_equal(kvd_store_abort(st, &k, 1, NULL), KVD_OK);
    /* Larger than the arena: refused here; larger than a chunk (2 MiB):
     * refused by the daemon, the call itself is wrong. */
    uint64_t reserves = kvd_test_cl_calls(t, KVD_RPC_RESERVE);
    assert_int_equal(kvd_store_reserve(st, &ns, &h[1], 1, 32u << 20, 0, r),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_test_cl_calls(t, KVD_RPC_RESERVE), reserves);
    assert_int_equal(kvd_store_reserve(st, &ns, &h[1], 1, 4u << 20, 0, r),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_test_cl_calls(t, KVD_RPC_RESERVE), reserves + 1);
    assert_int_equal(kvd_test_cl_svc(t).reservations, 0);
    kvd_store_close(st);
}

static void test_abort_gives_back(void **state)
{
    kvd_test_cl_t *t = *state;
    kvd_store_t *st = open_store(t);
    kvd_namespace_t ns;
    kvd_block_hash_t h[3];
    kvd_test_cl_keys(&ns, 3, h, 3, 3);
    kvd_store_reservation_t r[2];
    assert_int_equal(kvd_store_reserve(st, &ns, h, 2, KVD_TEST_CL_OBJ, 0, r),
                     KVD_OK);
    assert_int_equal(kvd_test_cl_svc(t).reservations, 1);
    /* h[2] was never reserved: NOT_FOUND for it alone. */
    kvd_store_key_t keys[3] = {{ns, h[0]}, {ns, h[1]}, {ns, h[2]}};
    kvd_status_t as[3] = {-1, -1, -1};
    assert_int_equal(kvd_store_abort(st, keys, 3, as), KVD_ERR_NOT_FOUND);
    assert_int_equal(as[0], KVD_OK);
    assert_int_equal(as[1], KVD_OK);
    assert_int_equal(as[2], KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_test_cl_svc(t).reservations, 0);
    assert_int_equal(found(st, &ns, h, 2), 0);
    kvd_status_t cs[2];
    assert_int_equal(kvd_store_commit(st, keys, 2, cs), KVD_ERR_NOT_FOUND);
    assert_int_equal(cs[0], KVD_ERR_NOT_FOUND);
    assert_int_equal(cs[1], KVD_ERR_NOT_FOUND);
    /* The slots are free again: the same keys reserve afresh. */
    kvd_test_cl_save(st, &ns, h, 2);
    assert_int_equal(found(st, &ns, h, 2), 2);
    kvd_store_close(st);
}

static void test_commit_one_call_per_reservation(void **state)
{
    kvd_test_cl_t *t = *state;
    kvd_store_t *st = open_store(t);
    kvd_namespace_t ns;
    kvd_block_hash_t h[4];
    kvd_test_cl_keys(&ns, 4, h, 4, 4);
    kvd_store_reservation_t ra[2], rb[1];
    assert_int_equal(kvd_store_reserve(st, &ns, h, 2, KVD_TEST_CL_OBJ, 0, ra),
                     KVD_OK);
    assert_int_equal(
        kvd_store_reserve(st, &ns, &h[2], 1, KVD_TEST_CL_OBJ, 0, rb), KVD_OK);
    assert_int_equal(kvd_test_cl_svc(t).reservations, 2);
    kvd_test_cl_fill(kvd_store_reservation_ptr(st, &ra[0], KVD_TEST_CL_OBJ),
                     &h[0]);
    kvd_test_cl_fill(kvd_store_reservation_ptr(st, &ra[1], KVD_TEST_CL_OBJ),
                     &h[1]);
    kvd_test_cl_fill(kvd_store_reservation_ptr(st, &rb[0], KVD_TEST_CL_OBJ),
                     &h[2]);
    /* Interleaved ids and a key nobody reserved. */
    kvd_store_key_t keys[4] = {{ns, h[0]}, {ns, h[2]}, {ns, h[3]}, {ns, h[1]}};
    uint64_t commits = kvd_test_cl_calls(t, KVD_RPC_COMMIT);
    kvd_status_t cs[4] = {-1, -1, -1, -1};
    assert_int_equal(kvd_store_commit(st, keys, 4, cs), KVD_ERR_NOT_FOUND);
    assert_int_equal(cs[0], KVD_OK);
    assert_int_equal(cs[1], KVD_OK);
    assert_int_equal(cs[2], KVD_ERR_NOT_FOUND);
    assert_int_equal(cs[3], KVD_OK);
    assert_int_equal(kvd_test_cl_calls(t, KVD_RPC_COMMIT), commits + 2);
    assert_int_equal(kvd_test_cl_svc(t).reservations, 0);
    kvd_store_lease_t l[3];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, h, 3, l, &m), KVD_OK);
    assert_int_equal(m, 3);
    for (size_t i = 0; i < 3; i++) {
        assert_true(kvd_test_cl_holds(kvd_store_lease_ptr(st, &l[i]), &h[i]));
    }
    assert_int_equal(kvd_store_release(st, l, 3), KVD_OK);
    kvd_store_close(st);
}

static void test_delete_per_namespace(void **state)
{
    kvd_test_cl_t *t = *state;
    kvd_store_t *st = open_store(t);
    kvd_namespace_t n1, n2;
    kvd_block_hash_t h1[3], h2[2];
    kvd_test_cl_keys(&n1, 5, h1, 3, 5);
    kvd_test_cl_keys(&n2, 6, h2, 2, 5);
    kvd_test_cl_save(st, &n1, h1, 3);
    kvd_test_cl_save(st, &n2, h2, 2);
    kvd_store_lease_t held;
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &n1, h1, 1, &held, &m), KVD_OK);
    assert_int_equal(m, 1);
    kvd_store_key_t keys[5] = {
        {n1, h1[0]}, {n1, h1[1]}, {n1, h1[2]}, {n2, h2[0]}, {n2, h2[1]}};
    uint64_t deletes = kvd_test_cl_calls(t, KVD_RPC_DELETE);
    size_t deleted = 99;
    assert_int_equal(kvd_store_delete(st, keys, 5, &deleted), KVD_ERR_BUSY);
    assert_int_equal(deleted, 4);
    assert_int_equal(kvd_test_cl_calls(t, KVD_RPC_DELETE), deletes + 2);
    assert_int_equal(found(st, &n2, h2, 2), 0);
    assert_int_equal(found(st, &n1, h1, 1), 1); /* leased: kept */
    assert_true(kvd_test_cl_holds(kvd_store_lease_ptr(st, &held), &h1[0]));
    assert_int_equal(kvd_store_release(st, &held, 1), KVD_OK);
    assert_int_equal(kvd_store_delete(st, keys, 5, &deleted), KVD_OK);
    assert_int_equal(deleted, 1);
    assert_int_equal(found(st, &n1, h1, 3), 0);
    kvd_store_close(st);
}

static void test_reserve_without_daemon(void **state)
{
    kvd_test_cl_t *t = *state;
    kvd_store_t *st = NULL;
    assert_int_equal(
        kvd_test_cl_open(t, &st, "store.timeout", "500ms", (const char *)NULL),
        KVD_OK);
    kvd_server_stop(t->srv);
    t->srv = NULL;
    kvd_namespace_t ns;
    kvd_block_hash_t h[2];
    kvd_test_cl_keys(&ns, 7, h, 2, 7);
    kvd_store_reservation_t r[2];
    uint64_t t0 = kvd_test_cl_now_ms();
    /* The saves are skipped, the caller goes on: each key says why (the
     * daemon is gone, not "no space"). */
    assert_int_equal(kvd_store_reserve(st, &ns, h, 2, KVD_TEST_CL_OBJ, 0, r),
                     KVD_OK);
    assert_true(kvd_test_cl_now_ms() - t0 < 500 + 1000);
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(r[i].status, KVD_ERR_UNREACHABLE);
        assert_null(kvd_store_reservation_ptr(st, &r[i], KVD_TEST_CL_OBJ));
    }
    kvd_store_key_t k = {ns, h[0]};
    assert_int_equal(kvd_store_commit(st, &k, 1, NULL), KVD_ERR_NOT_FOUND);
    kvd_store_close(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_reserve_write_commit, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_reserve_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_gives_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_commit_one_call_per_reservation,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_delete_per_namespace, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_reserve_without_daemon, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
