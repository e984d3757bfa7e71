/*
 * The L1 table against a model (store/l1_int.h): random reserve, commit,
 * abort, lookup, release, pin, delete and evict steps under each policy,
 * with one tenant under a quota; every answer and every victim is checked
 * against a plain model of the objects, and every counter against the
 * model's every 16 steps.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvd_testl1_int.h"

/* ---- randomized comparison with a model --------------------------------- */

enum { MD_CAP = 48, MD_KEYS = 160, MD_TENANTS = 3, MD_OPS = 30000 };

typedef struct md_obj {
    bool present;
    bool ready;
    bool pinned;
    uint32_t refs;
    uint32_t slot;
    uint32_t tenant;
    uint64_t size;
} md_obj_t;

typedef struct md {
    kvd_l1_t *l1;
    md_obj_t obj[MD_KEYS];
    uint64_t quota[MD_TENANTS];
    uint32_t next_slot;
} md_t;

static bool md_evictable(const md_obj_t *o)
{
    return o->present && o->ready && o->refs == 0 && !o->pinned;
}

static uint32_t md_index(const kvd_store_key_t *k)
{
    for (uint32_t i = 0; i < MD_KEYS; i++) {
        kvd_store_key_t c = test_key(18, i);
        if (memcmp(&c, k, sizeof(c)) == 0) {
            return i;
        }
    }
    fail_msg("victim key unknown to the model");
    return 0;
}

/* A victim must be an evictable object of the model (of `tenant` when not
 * UINT32_MAX) with the same slot; it leaves the model. */
static void md_take_victim(md_t *m, const kvd_l1_victim_t *v, uint32_t tenant)
{
    uint32_t i = md_index(&v->key);
    md_obj_t *o = &m->obj[i];
    assert_true(md_evictable(o));
    assert_int_equal(v->slot, o->slot);
    assert_int_equal(v->size_bytes, o->size);
    assert_int_equal(v->tenant, o->tenant);
    if (tenant != UINT32_MAX) {
        assert_int_equal(v->tenant, tenant);
    }
    o->present = false;
}

static void md_check(md_t *m)
{
    uint64_t objects = 0, reserved = 0, bytes = 0, leases = 0, leased = 0;
    uint64_t pinned = 0, pinned_bytes = 0;
    uint64_t t_obj[MD_TENANTS] = {0}, t_bytes[MD_TENANTS] = {0};
    uint64_t t_evictable[MD_TENANTS] = {0};
    for (uint32_t i = 0; i < MD_KEYS; i++) {
        const md_obj_t *o = &m->obj[i];
        if (!o->present) {
            continue;
        }
        objects++;
        reserved += !o->ready;
        bytes += o->size;
        leases += o->refs;
        leased += o->refs > 0;
        pinned += o->pinned;
        pinned_bytes += o->pinned ? o->size : 0;
        t_obj[o->tenant]++;
        t_bytes[o->tenant] += o->size;
        t_evictable[o->tenant] += md_evictable(o) ? o->size : 0;
    }
    kvd_l1_stats_t s = test_stats(m->l1);
    assert_int_equal(s.objects, objects);
    assert_int_equal(s.reserved, reserved);
    assert_int_equal(s.bytes, bytes);
    assert_int_equal(s.leases, leases);
    assert_int_equal(s.leased_objects, leased);
    assert_int_equal(s.pinned_objects, pinned);
    assert_int_equal(s.pinned_bytes, pinned_bytes);
    assert_int_equal(s.small_objects + s.main_objects + s.lru_objects,
                     objects - reserved);
    for (uint32_t t = 0; t < MD_TENANTS; t++) {
        kvd_l1_tenant_stats_t ts;
        if (kvd_l1_tenant_stats(m->l1, t, &ts) != KVD_OK) {
            assert_int_equal(t_obj[t], 0);
            continue;
        }
        assert_int_equal(ts.objects, t_obj[t]);
        assert_int_equal(ts.bytes, t_bytes[t]);
        assert_int_equal(ts.evictable_bytes, t_evictable[t]);
    }
}

static void md_reserve(md_t *m, uint32_t i, unsigned r)
{
    md_obj_t *o = &m->obj[i];
    kvd_store_key_t k = test_key(18, i);
    uint32_t tenant = i % MD_TENANTS;
    uint64_t size = 1 + r % 40;
    uint64_t quota = m->quota[tenant];
    uint64_t objects = 0, t_bytes = 0, t_evictable = 0;
    for (uint32_t j = 0; j < MD_KEYS; j++) {
        const md_obj_t *p = &m->obj[j];
        objects += p->present;
        if (p->present && p->tenant == tenant) {
            t_bytes += p->size;
            t_evictable += md_evictable(p) ? p->size : 0;
        }
    }
    kvd_status_t want;
    bool over = quota != 0 && t_bytes + size > quota;
    if (o->present) {
        want = KVD_ERR_EXISTS;
    } else if (over && (size > quota || t_evictable < t_bytes + size - quota)) {
        want = KVD_ERR_QUOTA;
    } else if (!over && objects == MD_CAP) {
        want = KVD_ERR_NOSPACE;
    } else {
        want = KVD_OK;
    }
    kvd_l1_victim_t v[MD_CAP];
    size_t n = 99;
    uint32_t slot = m->next_slot++;
    assert_int_equal(
        kvd_l1_reserve(m->l1, &k, tenant, size, slot, v, MD_CAP, &n), want);
    if (want != KVD_OK) {
        assert_int_equal(n, 0);
        return;
    }
    uint64_t freed = 0;
    for (size_t j = 0; j < n; j++) {
        freed += v[j].size_bytes;
        md_take_victim(m, &v[j], tenant);
    }
    if (over) {
        /* Just enough: without the last victim it would not fit. */
        assert_true(n > 0);
        assert_true(t_bytes - freed + size <= quota);
        assert_true(t_bytes - (freed - v[n - 1].size_bytes) + size > quota);
    } else {
        assert_int_equal(n, 0);
    }
    *o = (md_obj_t){
        .present = true, .slot = slot, .tenant = tenant, .size = size};
}

static void md_step(md_t *m, unsigned r)
{
    uint32_t i = (r >> 4) % MD_KEYS;
    md_obj_t *o = &m->obj[i];
    kvd_store_key_t k = test_key(18, i);
    switch (r % 9) {
    case 0:
    case 1: md_reserve(m, i, r >> 12); break;
    case 2: {
        kvd_status_t want = !o->present ? KVD_ERR_NOT_FOUND
                            : o->ready  ? KVD_ERR_STATE
                                        : KVD_OK;
        uint32_t slot = UINT32_MAX;
        if ((r >> 12) % 5 == 0) {
            assert_int_equal(kvd_l1_abort(m->l1, &k, &slot), want);
            if (want == KVD_OK) {
                assert_int_equal(slot, o->slot);
                o->present = false;
            }
        } else {
            assert_int_equal(kvd_l1_commit(m->l1, &k), want);
            o->ready = o->ready || want == KVD_OK;
        }
        break;
    }
    case 3:
    case 4: {
        kvd_store_key_t keys[4];
        uint32_t slots[4];
        size_t len = 1 + (r >> 12) % 4, matched = 99, want = 0;
        for (size_t j = 0; j < len; j++) {
            keys[j] = test_key(18, (i + (uint32_t)j) % MD_KEYS);
        }
        while (want < len && m->obj[(i + want) % MD_KEYS].present &&
               m->obj[(i + want) % MD_KEYS].ready) {
            want++;
        }
        assert_int_equal(
            kvd_l1_lookup_prefix(m->l1, keys, len, slots, NULL, &matched),
            KVD_OK);
        assert_int_equal(matched, want);
        for (size_t j = 0; j < matched; j++) {
            md_obj_t *p = &m->obj[(i + j) % MD_KEYS];
            assert_int_equal(slots[j], p->slot);
            p->refs++;
            /* Most readers finish at once; the rest keep their lease for
             * a later release step. */
            if ((r >> (20 + j)) % 8 != 0) {
                assert_int_equal(kvd_l1_release(m->l1, &keys[j]), KVD_OK);
                p->refs--;
            }
        }
        break;
    }
    case 5: {
        kvd_status_t want = !o->present                 ? KVD_ERR_NOT_FOUND
                            : !o->ready || o->refs == 0 ? KVD_ERR_STATE
                                                        : KVD_OK;
        assert_int_equal(kvd_l1_release(m->l1, &k), want);
        o->refs -= want == KVD_OK;
        break;
    }
    case 6: {
        bool pin = (r >> 12) % 3 == 0;
        assert_int_equal(kvd_l1_pin(m->l1, &k, pin, 0),
                         o->present ? KVD_OK : KVD_ERR_NOT_FOUND);
        o->pinned = o->present && pin;
        break;
    }
    case 7: {
        kvd_status_t want = !o->present   ? KVD_ERR_NOT_FOUND
                            : !o->ready   ? KVD_ERR_STATE
                            : o->refs > 0 ? KVD_ERR_BUSY
                                          : KVD_OK;
        kvd_l1_victim_t v;
        assert_int_equal(kvd_l1_delete(m->l1, &k, &v), want);
        if (want == KVD_OK) {
            assert_int_equal(v.slot, o->slot);
            o->present = false;
        }
        break;
    }
    default: {
        size_t want = 1 + (r >> 12) % 4, eligible = 0, n = 99;
        for (uint32_t j = 0; j < MD_KEYS; j++) {
            eligible += md_evictable(&m->obj[j]);
        }
        kvd_l1_victim_t v[4];
        assert_int_equal(kvd_l1_evict(m->l1, want, 0, v, 4, &n), KVD_OK);
        assert_int_equal(n, want < eligible ? want : eligible);
        for (size_t j = 0; j < n; j++) {
            md_take_victim(m, &v[j], UINT32_MAX);
        }
        break;
    }
    }
}

static void test_model_policy(kvd_l1_policy_t policy, unsigned seed)
{
    static md_t m;
    memset(&m, 0, sizeof(m));
    m.l1 = test_table(MD_CAP, policy);
    m.quota[1] = 200; /* tenant 1 runs into its quota, the others do not */
    assert_int_equal(kvd_l1_tenant_set_quota(m.l1, 1, m.quota[1]), KVD_OK);
    for (int op = 0; op < MD_OPS; op++) {
        md_step(&m, (unsigned)rand_r(&seed));
        if (op % 16 == 0) {
            md_check(&m);
        }
    }
    md_check(&m);
    kvd_l1_stats_t s = test_stats(m.l1);
    print_message(
        "model %s: %llu hits, %llu evictions, %llu quota "
        "evictions, %llu quota rejects, %llu ghost hits\n",
        policy == KVD_L1_LRU ? "lru" : "s3fifo", (unsigned long long)s.hits,
        (unsigned long long)s.evictions, (unsigned long long)s.quota_evictions,
        (unsigned long long)s.quota_rejects, (unsigned long long)s.ghost_hits);
    /* The run reached every path it is meant to compare. */
    assert_true(s.hits > 0 && s.evictions > 0 && s.quota_evictions > 0 &&
                s.quota_rejects > 0);
    assert_true(policy == KVD_L1_LRU || s.ghost_hits > 0);
    kvd_l1_destroy(m.l1);
}

static void test_model(void **state)
{
    (void)state;
    test_model_policy(KVD_L1_S3FIFO, 1);
    test_model_policy(KVD_L1_LRU, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
