/*
 * The L1 table under concurrency (store/l1_int.h): four threads insert,
 * abort, look up, release, evict and delete on one S3-FIFO table over a
 * pool of slots that stands in for the arena, checking that no slot the
 * table hands back is still read or owned twice; afterwards every counter
 * agrees and every slot is accounted for.
 *
 * Worker threads never call cmocka asserts (they are not thread-safe); they
 * count failures that the test thread checks after joining.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvd_testl1_int.h"

#if defined(__SANITIZE_THREAD__)
#define TEST_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TEST_UNDER_TSAN 1
#endif
#endif
#ifdef TEST_UNDER_TSAN
#define STRESS_OPS 100000
#else
#define STRESS_OPS 200000
#endif

/* ---- concurrency -------------------------------------------------------- */

enum { CC_THREADS = 4, CC_CAP = 128, CC_KEYS = 512, CC_SLOTS = CC_CAP };

/* The test's stand-in for the arena: a slot pool, and per slot whether it
 * is owned by the table and how many readers the test believes hold it. */
typedef struct cc_shared {
    kvd_l1_t *l1;
    pthread_mutex_t pool_lock;
    uint32_t free_slots[CC_SLOTS];
    size_t free_count;
    atomic_int in_use[CC_SLOTS];
    atomic_int readers[CC_SLOTS];
    atomic_int failures;
} cc_shared_t;

typedef struct cc_thread {
    cc_shared_t *sh;
    unsigned seed;
} cc_thread_t;

static bool cc_slot_alloc(cc_shared_t *sh, uint32_t *slot)
{
    pthread_mutex_lock(&sh->pool_lock);
    bool ok = sh->free_count > 0;
    if (ok) {
        *slot = sh->free_slots[--sh->free_count];
    }
    pthread_mutex_unlock(&sh->pool_lock);
    if (ok && atomic_exchange(&sh->in_use[*slot], 1) != 0) {
        atomic_fetch_add(&sh->failures, 1);
    }
    return ok;
}

/* A slot handed back by the table: nobody may be reading it. */
static void cc_slot_free(cc_shared_t *sh, uint32_t slot)
{
    if (slot >= CC_SLOTS || atomic_load(&sh->readers[slot]) != 0 ||
        atomic_exchange(&sh->in_use[slot], 0) != 1) {
        atomic_fetch_add(&sh->failures, 1);
        return;
    }
    pthread_mutex_lock(&sh->pool_lock);
    sh->free_slots[sh->free_count++] = slot;
    pthread_mutex_unlock(&sh->pool_lock);
}

static void cc_evict(cc_shared_t *sh, size_t want)
{
    kvd_l1_victim_t v[4];
    size_t n = 0;
    if (kvd_l1_evict(sh->l1, want, 0, v, 4, &n) != KVD_OK) {
        atomic_fetch_add(&sh->failures, 1);
    }
    for (size_t i = 0; i < n; i++) {
        cc_slot_free(sh, v[i].slot);
    }
}

static void cc_lookup(cc_shared_t *sh, uint32_t first)
{
    kvd_store_key_t keys[4];
    uint32_t slots[4];
    size_t m = 0;
    for (uint32_t i = 0; i < 4; i++) {
        keys[i] = test_key(16, (first + i) % CC_KEYS);
    }
    if (kvd_l1_lookup_prefix(sh->l1, keys, 4, slots, NULL, &m) != KVD_OK) {
        atomic_fetch_add(&sh->failures, 1);
        return;
    }
    for (size_t i = 0; i < m; i++) {
        atomic_fetch_add(&sh->readers[slots[i]], 1);
        if (atomic_load(&sh->in_use[slots[i]]) != 1) {
            atomic_fetch_add(&sh->failures, 1);
        }
    }
    for (size_t i = 0; i < m; i++) {
        atomic_fetch_sub(&sh->readers[slots[i]], 1);
        if (kvd_l1_release(sh->l1, &keys[i]) != KVD_OK) {
            atomic_fetch_add(&sh->failures, 1);
        }
    }
}

static void cc_insert(cc_shared_t *sh, uint32_t key, bool abort_it)
{
    uint32_t slot;
    if (!cc_slot_alloc(sh, &slot)) {
        cc_evict(sh, 1);
        return;
    }
    kvd_store_key_t k = test_key(16, key);
    size_t n;
    kvd_status_t st =
        kvd_l1_reserve(sh->l1, &k, key % 3, 64, slot, NULL, 0, &n);
    if (st != KVD_OK) {
        if (st != KVD_ERR_EXISTS && st != KVD_ERR_NOSPACE) {
            atomic_fetch_add(&sh->failures, 1);
        }
        cc_slot_free(sh, slot);
        return;
    }
    if (abort_it) {
        uint32_t back = UINT32_MAX;
        if (kvd_l1_abort(sh->l1, &k, &back) != KVD_OK || back != slot) {
            atomic_fetch_add(&sh->failures, 1);
        }
        cc_slot_free(sh, slot);
    } else if (kvd_l1_commit(sh->l1, &k) != KVD_OK) {
        atomic_fetch_add(&sh->failures, 1);
    }
}

static void *cc_worker(void *arg)
{
    cc_thread_t *t = arg;
    cc_shared_t *sh = t->sh;
    for (int i = 0; i < STRESS_OPS; i++) {
        unsigned r = (unsigned)rand_r(&t->seed);
        uint32_t key = (r >> 4) % CC_KEYS;
        switch (r % 8) {
        case 0:
        case 1:
        case 2: cc_lookup(sh, key); break;
        case 3:
        case 4: cc_insert(sh, key, false); break;
        case 5: cc_insert(sh, key, (r >> 20) % 4 == 0); break;
        case 6: cc_evict(sh, 1 + (r >> 20) % 3); break;
        default: {
            kvd_store_key_t k = test_key(16, key);
            kvd_l1_victim_t v;
            kvd_status_t st = kvd_l1_delete(sh->l1, &k, &v);
            if (st == KVD_OK) {
                cc_slot_free(sh, v.slot);
            } else if (st != KVD_ERR_NOT_FOUND && st != KVD_ERR_BUSY &&
                       st != KVD_ERR_STATE) {
                atomic_fetch_add(&sh->failures, 1);
            }
            break;
        }
        }
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    (void)state;
    static cc_shared_t sh;
    memset(&sh, 0, sizeof(sh));
    sh.l1 = test_table(CC_CAP, KVD_L1_S3FIFO);
    assert_int_equal(pthread_mutex_init(&sh.pool_lock, NULL), 0);
    for (uint32_t i = 0; i < CC_SLOTS; i++) {
        sh.free_slots[sh.free_count++] = CC_SLOTS - 1 - i;
    }
    pthread_t th[CC_THREADS];
    cc_thread_t args[CC_THREADS];
    for (int i = 0; i < CC_THREADS; i++) {
        args[i] = (cc_thread_t){.sh = &sh, .seed = 0x5eed + (unsigned)i};
        assert_int_equal(pthread_create(&th[i], NULL, cc_worker, &args[i]), 0);
    }
    for (int i = 0; i < CC_THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
    }
    assert_int_equal(atomic_load(&sh.failures), 0);

    /* Every slot is either free or owned by exactly one entry. */
    kvd_l1_stats_t s = test_stats(sh.l1);
    assert_int_equal(s.leases, 0);
    assert_int_equal(s.leased_objects, 0);
    assert_int_equal(s.reserved, 0);
    assert_int_equal(s.objects, CC_SLOTS - sh.free_count);
    assert_int_equal(s.bytes, 64 * s.objects);
    print_message("concurrent: %llu hits, %llu misses, %llu commits, "
                  "%llu aborts, %llu evictions, %llu deletes\n",
                  (unsigned long long)s.hits, (unsigned long long)s.misses,
                  (unsigned long long)s.commits, (unsigned long long)s.aborts,
                  (unsigned long long)s.evictions,
                  (unsigned long long)s.deletes);
    assert_true(s.hits > 0 && s.evictions > 0 && s.commits > 0);
    assert_int_equal(s.small_objects + s.main_objects, s.objects);
    uint64_t tenant_bytes = 0;
    for (uint32_t t = 0; t < 3; t++) {
        kvd_l1_tenant_stats_t ts;
        assert_int_equal(kvd_l1_tenant_stats(sh.l1, t, &ts), KVD_OK);
        assert_int_equal(ts.evictable_bytes, ts.bytes);
        tenant_bytes += ts.bytes;
    }
    assert_int_equal(tenant_bytes, s.bytes);
    /* Nothing is busy now: everything can be evicted, each slot once. */
    kvd_l1_victim_t v[CC_CAP];
    size_t n;
    assert_int_equal(kvd_l1_evict(sh.l1, CC_CAP, 0, v, CC_CAP, &n), KVD_OK);
    assert_int_equal(n, s.objects);
    for (size_t i = 0; i < n; i++) {
        cc_slot_free(&sh, v[i].slot);
    }
    assert_int_equal(atomic_load(&sh.failures), 0);
    assert_int_equal(sh.free_count, CC_SLOTS);
    assert_int_equal(test_stats(sh.l1).objects, 0);
    pthread_mutex_destroy(&sh.pool_lock);
    kvd_l1_destroy(sh.l1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
