/*
 * Weighted rendezvous placement (cluster/placement.c): the same homes for
 * the same view, R distinct homes, balance by capacity, and the minimal
 * movement that makes rendezvous hashing the choice: a node leaving moves
 * only its own keys, a node joining takes keys only for itself.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/placement.h"

#define KEYS 40000

static kvd_member_t nodes[8];

static void node_set(size_t i, const char *id, uint64_t capacity)
{
    memset(&nodes[i], 0, sizeof nodes[i]);
    snprintf(nodes[i].node_id, sizeof nodes[i].node_id, "%s", id);
    nodes[i].capacity_bytes = capacity;
}

static kvd_store_key_t key_of(uint32_t i)
{
    kvd_store_key_t k;
    memset(&k, 0, sizeof k);
    memset(k.ns.bytes, 0x5a, sizeof k.ns.bytes);
    memcpy(k.hash.bytes, &i, sizeof i);
    k.hash.bytes[31] = (uint8_t)(i * 131u);
    return k;
}

static size_t home_of(uint32_t i, size_t n)
{
    kvd_store_key_t k = key_of(i);
    size_t h = 99;
    assert_int_equal(kvd_placement_homes(&k, nodes, n, 1, &h), 1);
    return h;
}

static void test_homes_are_distinct_and_stable(void **state)
{
    (void)state;
    for (size_t i = 0; i < 5; i++) {
        char id[16];
        snprintf(id, sizeof id, "node-%zu", i);
        node_set(i, id, UINT64_C(1) << 30);
    }
    for (uint32_t i = 0; i < 1000; i++) {
        kvd_store_key_t k = key_of(i);
        size_t a[3], b[3];
        assert_int_equal(kvd_placement_homes(&k, nodes, 5, 3, a), 3);
        assert_int_equal(kvd_placement_homes(&k, nodes, 5, 3, b), 3);
        assert_memory_equal(a, b, sizeof a);
        assert_true(a[0] != a[1] && a[1] != a[2] && a[0] != a[2]);
        /* Best first: the scores decrease. */
        assert_true(kvd_placement_score(&k, &nodes[a[0]]) >=
                    kvd_placement_score(&k, &nodes[a[1]]));
        /* The first home alone is the first of three. */
        assert_int_equal(home_of(i, 5), a[0]);
    }
    /* More homes asked for than nodes: every node once. */
    kvd_store_key_t k = key_of(7);
    size_t all[8];
    assert_int_equal(kvd_placement_homes(&k, nodes, 2, 8, all), 2);
    assert_true(all[0] != all[1]);
    assert_int_equal(kvd_placement_homes(&k, nodes, 0, 3, all), 0);
    assert_int_equal(kvd_placement_homes(&k, nodes, 5, 0, all), 0);
    assert_int_equal(kvd_placement_homes(NULL, nodes, 5, 1, all), 0);
}

static void test_balance_follows_capacity(void **state)
{
    (void)state;
    size_t count[4] = {0};
    for (size_t i = 0; i < 4; i++) {
        char id[16];
        snprintf(id, sizeof id, "n%zu", i);
        node_set(i, id, UINT64_C(64) << 30);
    }
    for (uint32_t i = 0; i < KEYS; i++) {
        count[home_of(i, 4)]++;
    }
    for (size_t i = 0; i < 4; i++) {
        /* 10,000 expected; a binomial's sd is ~87: 5% is > 5 sd. */
        assert_in_range(count[i], KEYS / 4 * 95 / 100, KEYS / 4 * 105 / 100);
    }
    /* One node with three times the capacity of the other. */
    node_set(0, "small", UINT64_C(16) << 30);
    node_set(1, "large", UINT64_C(48) << 30);
    size_t large = 0;
    for (uint32_t i = 0; i < KEYS; i++) {
        large += home_of(i, 2) == 1;
    }
    assert_in_range(large, KEYS * 72 / 100, KEYS * 78 / 100);
}

static void test_minimal_movement(void **state)
{
    (void)state;
    static size_t before[KEYS];
    for (size_t i = 0; i < 5; i++) {
        char id[16];
        snprintf(id, sizeof id, "m%zu", i);
        node_set(i, id, UINT64_C(1) << 30);
    }
    for (uint32_t i = 0; i < KEYS; i++) {
        before[i] = home_of(i, 5);
    }
    /* m4 leaves (the last slot, so indexes of the others stay): only its
     * keys move. */
    size_t moved = 0;
    for (uint32_t i = 0; i < KEYS; i++) {
        size_t h = home_of(i, 4);
        if (before[i] != 4) {
            assert_int_equal(h, before[i]);
        } else {
            moved++;
        }
    }
    assert_in_range(moved, KEYS / 5 * 90 / 100, KEYS / 5 * 110 / 100);
    /* m5 joins a 5-node view: keys move only to m5, about a sixth. */
    node_set(5, "m5", UINT64_C(1) << 30);
    size_t taken = 0;
    for (uint32_t i = 0; i < KEYS; i++) {
        size_t h = home_of(i, 6);
        if (h != before[i]) {
            assert_int_equal(h, 5);
            taken++;
        }
    }
    assert_in_range(taken, KEYS / 6 * 90 / 100, KEYS / 6 * 110 / 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_homes_are_distinct_and_stable),
        cmocka_unit_test(test_balance_follows_capacity),
        cmocka_unit_test(test_minimal_movement),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
