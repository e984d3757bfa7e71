/*
 * The store client's gets (client/get.c) against a kvdepotd run in this
 * process (kvd_testclient_int.h) with an NVMe tier. Each test's daemon is
 * restarted after the save, so its objects are on the disk tier only:
 *   - disk-tier gets go through the get thread: a waiter is woken, each
 *     get completes exactly once with its user_data, as a HOST lease whose
 *     bytes are the object's, then nothing more comes;
 *   - host-tier gets complete at once, without a call;
 *   - store.get_queue bounds the gets accepted and not yet polled
 *     (KVD_ERR_BUSY beyond, a partial count when some fit);
 *   - a get of a lease not held is refused; a get the daemon fails
 *     completes with its status and gives the block back.
 */
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/unit/kvd_testclient_int.h"

#define NOBJ 4

typedef struct fixture {
    kvd_test_cl_t t;
    kvd_store_t *st;
    kvd_namespace_t ns;
    kvd_block_hash_t h[NOBJ];
} fixture_t;

/* A daemon with NOBJ objects on its disk tier only, and a client. */
static int setup(void **state)
{
    static fixture_t f;
    kvd_test_cl_start(&f.t, "client_gets", true, (const char *)NULL);
    assert_int_equal(kvd_test_cl_open(&f.t, &f.st, (const char *)NULL), KVD_OK);
    kvd_test_cl_keys(&f.ns, 1, f.h, NOBJ, 1);
    kvd_test_cl_save(f.st, &f.ns, f.h, NOBJ);
    assert_int_equal(kvd_store_flush(f.st, 10000), KVD_OK);
    kvd_test_cl_restart(&f.t);
    uint64_t deadline = kvd_test_cl_now_ms() + 5000;
    kvd_store_stats_t ss;
    while (kvd_store_stats(f.st, &ss) != KVD_OK) {
        assert_true(kvd_test_cl_now_ms() < deadline);
        usleep(10000);
    }
    assert_int_equal(ss.host.objects, 0);
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    kvd_store_close(f->st);
    kvd_test_cl_stop(&f->t);
    return 0;
}

static void lookup(fixture_t *f, kvd_store_t *st, kvd_store_lease_t *l,
                   size_t n, kvd_store_tier_t tier)
{
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &f->ns, f->h, n, l, &m), KVD_OK);
    assert_int_equal(m, n);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(l[i].tier, tier);
    }
}

static void test_disk_gets_complete_once(void **state)
{
    fixture_t *f = *state;
    kvd_store_lease_t l[NOBJ];
    lookup(f, f->st, l, NOBJ, KVD_STORE_TIER_DISK);
    assert_null(kvd_store_lease_ptr(f->st, &l[0])); /* not in the arena */
    kvd_store_get_t g[NOBJ];
    for (size_t i = 0; i < NOBJ; i++) {
        g[i] = (kvd_store_get_t){.lease = l[i], .user_data = 100 + i};
    }
    size_t acc = 0;
    assert_int_equal(kvd_store_get_submit(f->st, g, NOBJ, &acc), KVD_OK);
    assert_int_equal(acc, NOBJ);
    /* The first wait sleeps until the get thread delivers (the get
     * needs a disk read and at least one Get call). */
    assert_true(kvd_store_fd(f->st) >= 0);
    assert_int_equal(kvd_store_wait(f->st, 5000), KVD_OK);
    unsigned seen[NOBJ] = {0};
    size_t done = 0;
    uint64_t deadline = kvd_test_cl_now_ms() + 5000;
    while (done < NOBJ) {
        assert_true(kvd_test_cl_now_ms() < deadline);
        (void)kvd_store_wait(f->st, 100);
        kvd_store_completion_t c[NOBJ + 1];
        size_t k = kvd_store_poll(f->st, c, NOBJ + 1);
        for (size_t i = 0; i < k; i++) {
            assert_int_equal(c[i].status, KVD_OK);
            assert_true(c[i].user_data >= 100 && c[i].user_data < 100 + NOBJ);
            size_t j = (size_t)c[i].user_data - 100;
            seen[j]++;
            assert_int_equal(c[i].lease.tier, KVD_STORE_TIER_HOST);
            assert_int_equal(c[i].lease.reserved, l[j].reserved);
            assert_memory_equal(&c[i].lease.key, &l[j].key, sizeof l[j].key);
            assert_true(kvd_test_cl_holds(
                kvd_store_lease_ptr(f->st, &c[i].lease), &f->h[j]));
            l[j] = c[i].lease;
        }
        done += k;
    }
    for (size_t j = 0; j < NOBJ; j++) {
        assert_int_equal(seen[j], 1);
    }
    /* Exactly once: nothing more arrives. */
    assert_int_equal(kvd_store_wait(f->st, 100), KVD_ERR_TIMEOUT);
    kvd_store_completion_t extra;
    assert_int_equal(kvd_store_poll(f->st, &extra, 1), 0);
    assert_true(kvd_test_cl_calls(&f->t, KVD_RPC_GET) >= 1);
    assert_int_equal(kvd_store_release(f->st, l, NOBJ), KVD_OK);
    kvd_test_cl_wait_leases(&f->t, 0);
    /* Promoted: the next lookup finds them in the arena. */
    lookup(f, f->st, l, NOBJ, KVD_STORE_TIER_HOST);
    assert_int_equal(kvd_store_release(f->st, l, NOBJ), KVD_OK);
}

static void test_host_gets_and_get_queue(void **state)
{
    fixture_t *f = *state;
    kvd_store_t *st = NULL;
    assert_int_equal(kvd_test_cl_open(&f->t, &st, "store.get_queue", "2",
                                      (const char *)NULL),
                     KVD_OK);
    kvd_namespace_t ns;
    kvd_block_hash_t h[3];
    kvd_test_cl_keys(&ns, 2, h, 3, 2);
    kvd_test_cl_save(st, &ns, h, 3);
    kvd_store_lease_t l[3];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, h, 3, l, &m), KVD_OK);
    assert_int_equal(m, 3);
    kvd_store_get_t g[3];
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(l[i].tier, KVD_STORE_TIER_HOST);
        g[i] = (kvd_store_get_t){.lease = l[i], .user_data = i};
    }
    uint64_t gets = kvd_test_cl_calls(&f->t, KVD_RPC_GET);
    /* Two fit, the third waits for a poll; done ones count until then. */
    size_t acc = 99;
    assert_int_equal(kvd_store_get_submit(st, g, 3, &acc), KVD_OK);
    assert_int_equal(acc, 2);
    acc = 99;
    assert_int_equal(kvd_store_get_submit(st, &g[2], 1, &acc), KVD_ERR_BUSY);
    assert_int_equal(acc, 99);
    kvd_store_completion_t c[3];
    assert_int_equal(kvd_store_poll(st, c, 1), 1); /* at once: no wait */
    assert_int_equal(c[0].status, KVD_OK);
    assert_int_equal(kvd_store_get_submit(st, &g[2], 1, &acc), KVD_OK);
    assert_int_equal(acc, 1);
    assert_int_equal(kvd_store_poll(st, c + 1, 2), 2);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(c[i].status, KVD_OK);
        assert_int_equal(c[i].user_data, i);
        assert_memory_equal(&c[i].lease, &l[i], sizeof l[i]);
    }
    assert_int_equal(kvd_test_cl_calls(&f->t, KVD_RPC_GET), gets);
    assert_int_equal(kvd_store_release(st, l, 3), KVD_OK);

    /* Disk gets count the same way. */
    kvd_store_lease_t d[3];
    lookup(f, st, d, 3, KVD_STORE_TIER_DISK);
    for (size_t i = 0; i < 3; i++) {
        g[i] = (kvd_store_get_t){.lease = d[i], .user_data = 10 + i};
    }
    assert_int_equal(kvd_store_get_submit(st, g, 3, &acc), KVD_OK);
    assert_int_equal(acc, 2);
    assert_int_equal(kvd_store_get_submit(st, &g[2], 1, &acc), KVD_ERR_BUSY);
    size_t done = 0;
    uint64_t deadline = kvd_test_cl_now_ms() + 5000;
    while (done < 2) {
        assert_true(kvd_test_cl_now_ms() < deadline);
        (void)kvd_store_wait(st, 100);
        done += kvd_store_poll(st, c + done, 2 - done);
    }
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(c[i].status, KVD_OK);
        d[c[i].user_data - 10] = c[i].lease;
    }
    assert_int_equal(kvd_store_release(st, d, 3), KVD_OK);
    kvd_store_close(st);
}

static void test_get_errors(void **state)
{
    fixture_t *f = *state;
    kvd_store_t *st = NULL;
    assert_int_equal(kvd_test_cl_open(&f->t, &st, "store.lease_ttl", "100ms",
                                      (const char *)NULL),
                     KVD_OK);
    kvd_store_lease_t l[2];
    lookup(f, st, l, 2, KVD_STORE_TIER_DISK);
    /* Not held (never handed out, or released): refused, or cut short. */
    kvd_store_get_t bad = {.lease = l[0]};
    bad.lease.reserved = 0;
    size_t acc = 99;
    assert_int_equal(kvd_store_get_submit(st, &bad, 1, &acc), KVD_ERR_INVALID);
    assert_int_equal(acc, 99);
    /* The daemon reclaims the lease at its TTL: the get fails with the
     * daemon's NOT_FOUND and gives the block back. */
    kvd_test_cl_wait_leases(&f->t, 0);
    kvd_store_get_t g[2] = {{.lease = l[0], .user_data = 1}, bad};
    assert_int_equal(kvd_store_get_submit(st, g, 2, &acc), KVD_OK);
    assert_int_equal(acc, 1);
    assert_int_equal(kvd_store_wait(st, 5000), KVD_OK);
    kvd_store_completion_t c;
    assert_int_equal(kvd_store_poll(st, &c, 1), 1);
    assert_int_equal(c.user_data, 1);
    assert_int_equal(c.status, KVD_ERR_NOT_FOUND);
    /* Expired: released all the same, with the expiry reported. */
    assert_int_equal(kvd_store_release(st, &l[1], 1), KVD_ERR_TIMEOUT);
    assert_int_equal(kvd_store_release(st, &l[0], 1), KVD_ERR_NOT_FOUND);
    acc = 99;
    assert_int_equal(kvd_store_get_submit(st, g, 1, &acc), KVD_ERR_INVALID);
    assert_int_equal(acc, 99);
    kvd_store_close(st);
}

/* A caller that sleeps on kvd_store_fd instead of kvd_store_wait is woken
 * by a completion: a drained poll arms the fd (store.h). */
static void test_fd_wakes_a_sleeper(void **state)
{
    fixture_t *f = *state;
    kvd_store_lease_t l[1];
    lookup(f, f->st, l, 1, KVD_STORE_TIER_DISK);
    int fd = kvd_store_fd(f->st);
    assert_true(fd >= 0);
    kvd_store_completion_t c;
    assert_int_equal(kvd_store_poll(f->st, &c, 1), 0); /* drained: armed */
    kvd_store_get_t g = {.lease = l[0], .user_data = 1};
    size_t acc = 0;
    assert_int_equal(kvd_store_get_submit(f->st, &g, 1, &acc), KVD_OK);
    assert_int_equal(acc, 1);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 5000), 1);
    assert_int_equal(kvd_store_poll(f->st, &c, 1), 1);
    assert_int_equal(c.status, KVD_OK);
    assert_int_equal(kvd_store_release(f->st, &c.lease, 1), KVD_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_disk_gets_complete_once, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_host_gets_and_get_queue, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_get_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fd_wakes_a_sleeper, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
