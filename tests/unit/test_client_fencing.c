/*
 * Expired leases and reservations are fenced (client/ and server/ against
 * a kvdepotd run in this process, kvd_testclient_int.h), with 300 ms TTLs
 * and a stall injected by sleeping between taking a pointer and using it:
 *   - a reader whose lease expired gets no pointer and a KVD_ERR_TIMEOUT
 *     release, and the bytes under the pointer it took before the stall
 *     are still its object while another client saves enough to evict
 *     everything else (the daemon keeps the expired lease's slot
 *     quarantined until the release);
 *   - a writer whose reservation expired gets no pointer and a
 *     KVD_ERR_TIMEOUT commit; its late write through the old pointer
 *     changes no other key's object (every object the other client
 *     committed meanwhile reads back byte for byte, after the write-back
 *     to NVMe too) and its own key is never published;
 *   - the quarantine ends when the holding client closes its store (its
 *     hand-off session ends with it);
 *   - with the daemon's defaults, a client holding a quarter of the arena
 *     reserved is refused more (KVD_ERR_NOSPACE) while another client's
 *     save goes on (server.max_reserved_bytes, counted per session).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/unit/kvd_testclient_int.h"

#define BATCH 16
#define SEEDS 24 /* BATCH * SEEDS objects: more than the 16 MiB arena holds */
#define RSEEDS 1 /* the reservation test's batches */

static kvd_namespace_t ns;

static int setup(void **state)
{
    static kvd_test_cl_t t;
    kvd_test_cl_start(&t, "client_fencing", true, "server.reservation_ttl",
                      "300ms", (const char *)NULL);
    *state = &t;
    return 0;
}

static int teardown(void **state)
{
    kvd_test_cl_stop(*state);
    return 0;
}

/* Waits (5 s at most) until `pred` of the daemon's counters holds. */
#define WAIT_SVC(t, pred)                                                      \
    do {                                                                       \
        uint64_t until_ = kvd_test_cl_now_ms() + 5000;                         \
        kvd_service_stats_t s_;                                                \
        while (s_ = kvd_test_cl_svc(t), !(pred)) {                             \
            if (kvd_test_cl_now_ms() > until_) {                               \
                fail_msg("timed out waiting for %s", #pred);                   \
            }                                                                  \
            usleep(2000);                                                      \
        }                                                                      \
    } while (0)

/* Saves BATCH objects of `seed` as far as the store takes them; marks
 * which were committed. */
static void save_some(kvd_store_t *st, uint8_t seed, kvd_block_hash_t *h,
                      bool *saved)
{
    kvd_store_reservation_t r[BATCH];
    kvd_store_key_t keys[BATCH];
    kvd_status_t cs[BATCH];
    kvd_test_cl_keys(&ns, 7, h, BATCH, seed);
    assert_int_equal(
        kvd_store_reserve(st, &ns, h, BATCH, KVD_TEST_CL_OBJ, 0, r), KVD_OK);
    size_t n = 0;
    for (size_t i = 0; i < BATCH; i++) {
        saved[i] = false;
        uint8_t *p = r[i].status == KVD_OK
                         ? kvd_store_reservation_ptr(st, &r[i], KVD_TEST_CL_OBJ)
                         : NULL;
        if (p != NULL) {
            kvd_test_cl_fill(p, &h[i]);
            keys[n++] = (kvd_store_key_t){.ns = ns, .hash = h[i]};
        }
    }
    (void)kvd_store_commit(st, keys, n, cs); /* each key's status below */
    for (size_t i = 0, k = 0; i < BATCH && k < n; i++) {
        if (memcmp(&keys[k].hash, &h[i], sizeof h[i]) == 0) {
            saved[i] = cs[k++] == KVD_OK;
        }
    }
}

/* Whether the stored object of `h` (arena or NVMe) is exactly its bytes. */
static bool reads_back(kvd_store_t *st, const kvd_block_hash_t *h)
{
    kvd_store_lease_t l;
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, h, 1, &l, &m), KVD_OK);
    if (m == 0) {
        return true; /* evicted from both tiers: nothing wrong served */
    }
    if (l.tier == KVD_STORE_TIER_DISK) {
        kvd_store_get_t g = {.lease = l, .user_data = 9};
        size_t acc = 0;
        assert_int_equal(kvd_store_get_submit(st, &g, 1, &acc), KVD_OK);
        kvd_store_completion_t c;
        while (kvd_store_poll(st, &c, 1) == 0) {
            assert_int_equal(kvd_store_wait(st, 5000), KVD_OK);
        }
        if (c.status != KVD_OK) {
            return true; /* a load error, not wrong bytes */
        }
        l = c.lease;
    }
    bool ok = kvd_test_cl_holds(kvd_store_lease_ptr(st, &l), h);
    (void)kvd_store_release(st, &l, 1);
    return ok;
}

static void test_expired_lease_is_fenced(void **state)
{
    kvd_test_cl_t *t = *state;
    kvd_store_t *a = NULL, *b = NULL;
    assert_int_equal(
        kvd_test_cl_open(t, &a, "store.lease_ttl", "300ms", (const char *)NULL),
        KVD_OK);
    assert_int_equal(kvd_test_cl_open(t, &b, (const char *)NULL), KVD_OK);
    kvd_block_hash_t mine;
    kvd_test_cl_keys(&ns, 7, &mine, 1, 200);
    kvd_test_cl_save(b, &ns, &mine, 1);

    kvd_store_lease_t l;
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(a, &ns, &mine, 1, &l, &m), KVD_OK);
    assert_int_equal(m, 1);
    const uint8_t *p = kvd_store_lease_ptr(a, &l);
    assert_true(kvd_test_cl_holds(p, &mine));
    uint64_t expired = kvd_test_cl_svc(t).leases_expired;

    usleep(400 * 1000); /* the reader stalls past store.lease_ttl */
    WAIT_SVC(t, s_.leases_expired > expired);
    assert_null(kvd_store_lease_ptr(a, &l));
    assert_int_equal(kvd_test_cl_svc(t).leases_quarantined, 1);

    /* Another engine deletes the key (refused while the slot is pinned)
     * and saves more than the arena holds. */
    kvd_store_key_t k = {.ns = ns, .hash = mine};
    kvd_status_t ds = kvd_store_delete(b, &k, 1, NULL);
    assert_true(ds == KVD_OK || ds == KVD_ERR_BUSY);
    kvd_block_hash_t h[BATCH];
    bool saved[BATCH];
    for (uint8_t seed = 0; seed < SEEDS; seed++) {
        save_some(b, (uint8_t)(10 + seed), h, saved);
    }
    /* The stalled copy still reads its own object, never another's. */
    assert_true(kvd_test_cl_holds(p, &mine));
    assert_int_equal(kvd_store_release(a, &l, 1), KVD_ERR_TIMEOUT);
    /* The release is the acknowledgement: the slot goes back. */
    WAIT_SVC(t, s_.leases_quarantined == 0);
    kvd_store_close(a);
    kvd_store_close(b);
}

static void test_expired_reservation_is_fenced(void **state)
{
    kvd_test_cl_t *t = *state;
    kvd_store_t *a = NULL, *b = NULL;
    assert_int_equal(kvd_test_cl_open(t, &a, (const char *)NULL), KVD_OK);
    assert_int_equal(kvd_test_cl_open(t, &b, (const char *)NULL), KVD_OK);
    kvd_block_hash_t late;
    kvd_test_cl_keys(&ns, 7, &late, 1, 201);
    kvd_store_reservation_t r;
    assert_int_equal(
        kvd_store_reserve(a, &ns, &late, 1, KVD_TEST_CL_OBJ, 0, &r), KVD_OK);
    assert_int_equal(r.status, KVD_OK);
    uint8_t *p = kvd_store_reservation_ptr(a, &r, KVD_TEST_CL_OBJ);
    assert_non_null(p);
    uint64_t expired = kvd_test_cl_svc(t).reservations_expired;

    usleep(400 * 1000); /* the writer stalls past server.reservation_ttl */
    WAIT_SVC(t, s_.reservations_expired > expired);
    assert_null(kvd_store_reservation_ptr(a, &r, KVD_TEST_CL_OBJ));
    assert_int_equal(kvd_test_cl_svc(t).reservations_quarantined, 1);

    /* Another engine saves (its slots taken where the store finds room:
     * the expired reservation's first, were it free)... */
    static kvd_block_hash_t h[SEEDS][BATCH];
    static bool saved[SEEDS][BATCH];
    for (uint8_t seed = 0; seed < RSEEDS; seed++) {
        save_some(b, (uint8_t)(40 + seed), h[seed], saved[seed]);
    }
    /* ...and then the stalled copy finishes through its old pointer. */
    kvd_test_cl_fill(p, &late);
    kvd_store_key_t k = {.ns = ns, .hash = late};
    kvd_status_t cs = KVD_OK;
    assert_int_equal(kvd_store_commit(a, &k, 1, &cs), KVD_ERR_TIMEOUT);
    assert_int_equal(cs, KVD_ERR_TIMEOUT);
    WAIT_SVC(t, s_.reservations_quarantined == 0);

    /* Every object the other engine committed is its own bytes (after
     * its write-back to NVMe); the late key was never published. */
    assert_int_equal(kvd_store_flush(b, 5000), KVD_OK);
    size_t checked = 0;
    for (size_t s = 0; s < RSEEDS; s++) {
        for (size_t i = 0; i < BATCH; i++) {
            if (saved[s][i]) {
                assert_true(reads_back(b, &h[s][i]));
                checked++;
            }
        }
    }
    assert_true(checked > 0);
    kvd_store_lease_t l;
    size_t m = 9;
    assert_int_equal(kvd_store_lookup(b, &ns, &late, 1, &l, &m), KVD_OK);
    assert_int_equal(m, 0);
    kvd_store_close(a);
    kvd_store_close(b);
}

static void test_quarantine_ends_with_the_session(void **state)
{
    kvd_test_cl_t *t = *state;
    uint64_t sessions = kvd_test_cl_svc(t).sessions;
    kvd_store_t *a = NULL, *b = NULL;
    assert_int_equal(
        kvd_test_cl_open(t, &a, "store.lease_ttl", "300ms", (const char *)NULL),
        KVD_OK);
    assert_int_equal(kvd_test_cl_open(t, &b, (const char *)NULL), KVD_OK);
    /* Each client holds its hand-off connection, so a session each. */
    assert_int_equal(kvd_test_cl_svc(t).sessions, sessions + 2);
    kvd_block_hash_t mine;
    kvd_test_cl_keys(&ns, 7, &mine, 1, 202);
    kvd_test_cl_save(b, &ns, &mine, 1);
    kvd_store_lease_t l;
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(a, &ns, &mine, 1, &l, &m), KVD_OK);
    assert_int_equal(m, 1);
    WAIT_SVC(t, s_.leases_quarantined == 1);
    assert_true(kvd_test_cl_svc(t).quarantined_bytes >= KVD_TEST_CL_OBJ);
    /* A's session ends with its store; B's is untouched. */
    kvd_store_close(a);
    WAIT_SVC(t, s_.leases_quarantined == 0 && s_.sessions == sessions + 1);
    assert_int_equal(kvd_test_cl_svc(t).quarantined_bytes, 0);
    kvd_store_close(b);
    WAIT_SVC(t, s_.sessions == sessions);
}

/* ---- reserved bytes per caller ------------------------------------------ */

#define BIG ((uint64_t)1 << 20)

static int setup_defaults(void **state)
{
    static kvd_test_cl_t t;
    kvd_test_cl_start(&t, "client_caps", false, (const char *)NULL);
    *state = &t;
    return 0;
}

/* Reserves `n` objects of BIG under keys of `seed` on `st`; returns how
 * many were granted, the others must be KVD_ERR_NOSPACE. */
static size_t reserve_big(kvd_store_t *st, uint8_t seed, size_t n,
                          kvd_store_key_t *keys)
{
    kvd_block_hash_t h[8];
    kvd_store_reservation_t r[8];
    assert_true(n <= 8);
    kvd_test_cl_keys(&ns, 9, h, n, seed);
    assert_int_equal(kvd_store_reserve(st, &ns, h, n, BIG, 0, r), KVD_OK);
    size_t granted = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].status == KVD_OK) {
            keys[granted++] = (kvd_store_key_t){.ns = ns, .hash = h[i]};
        } else {
            assert_int_equal(r[i].status, KVD_ERR_NOSPACE);
        }
    }
    return granted;
}

/* With the daemon's defaults (a 16 MiB arena: server.max_reserved_bytes is
 * a quarter, 4 MiB) a client holding 4 MiB reserved is refused more with
 * KVD_ERR_NOSPACE while another client's save goes on: callers bound to
 * no tenant are counted by hand-off session. */
static void test_reserved_bytes_capped_per_session(void **state)
{
    kvd_test_cl_t *t = *state;
    kvd_store_t *a = NULL, *b = NULL;
    assert_int_equal(kvd_test_cl_open(t, &a, (const char *)NULL), KVD_OK);
    assert_int_equal(kvd_test_cl_open(t, &b, (const char *)NULL), KVD_OK);
    kvd_store_key_t ka[8], kb[8];
    assert_int_equal(reserve_big(a, 1, 6, ka), 4);
    assert_int_equal(reserve_big(a, 2, 1, ka + 4), 0);

    assert_int_equal(reserve_big(b, 3, 4, kb), 4);
    kvd_status_t cs[8];
    assert_int_equal(kvd_store_commit(b, kb, 4, cs), KVD_OK);
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(cs[i], KVD_OK);
    }
    /* Giving its slots back gives A its room back. */
    assert_int_equal(kvd_store_abort(a, ka, 4, cs), KVD_OK);
    assert_int_equal(reserve_big(a, 2, 1, ka), 1);
    assert_int_equal(kvd_store_abort(a, ka, 1, cs), KVD_OK);
    kvd_store_close(a);
    kvd_store_close(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_expired_lease_is_fenced, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_expired_reservation_is_fenced,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_quarantine_ends_with_the_session,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_reserved_bytes_capped_per_session,
                                        setup_defaults, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
