/*
 * What the engine hands the leader (include/kvdepot/leader.h): a cache
 * salt keeps tenants' blocks apart, block hashes the engine computed
 * itself are used as given, and bad arguments, unknown requests and
 * malformed worker reports are refused without changing anything.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvd_testleader_int.h"

static void test_tenant_salt_isolates(void **state)
{
    (void)state;
    fake_t f = {0};
    kvd_leader_t *ld = leader_on(&f, 1);
    uint32_t tok[80];
    kvd_block_hash_t ha[8], hb[8];
    prompt(tok, 80, 8);
    chain(tok, 80, "tenant-a", ha);
    chain(tok, 80, "tenant-b", hb);
    for (int i = 0; i < 5; i++) {
        assert_memory_not_equal(ha[i].bytes, hb[i].bytes, 32);
    }
    fake_store(&f, ha, 5, KVD_STORE_TIER_HOST);
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "ta", tok, 80, "tenant-a", 0, &m, &async),
                     KVD_OK);
    assert_int_equal(m, 64);
    assert_int_equal(match(ld, "tb", tok, 80, "tenant-b", 0, &m, &async),
                     KVD_OK);
    assert_int_equal(m, 0);
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

static void test_engine_hashes(void **state)
{
    (void)state;
    fake_t f = {0};
    kvd_leader_t *ld = leader_on(&f, 1);
    kvd_block_hash_t h[6];
    for (int i = 0; i < 6; i++) {
        memset(h[i].bytes, 0x30 + i, 32);
    }
    fake_store(&f, h, 2, KVD_STORE_TIER_HOST);
    kvd_leader_request_t q = {
        .request_id = "eh", .num_tokens = 70, .hashes = h, .num_hashes = 4};
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(
        kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 32);
    uint32_t blocks[5];
    ids(blocks, 5, 0);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "eh", blocks, 5, 32), KVD_OK);
    assert_int_equal(
        kvd_leader_request_scheduled(ld, "eh", NULL, 0, NULL, 0, h + 4, 1, 80),
        KVD_OK);
    kvd_pb_step_plan_t *p = plan_of(ld);
    const kvd_pb_step_request_t *r = plan_req(p, "eh");
    assert_int_equal(r->n_loads, 2);
    assert_int_equal(r->n_saves, 3);
    assert_memory_equal(r->saves[2]->key->block_hash.data, h[4].bytes, 32);
    kvd_proto_step_plan_free(p);
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

static void test_bad_input(void **state)
{
    (void)state;
    fake_t f = {0};
    kvd_leader_t *ld = leader_on(&f, 1);
    kvd_leader_config_t c = config(1);
    kvd_leader_t *x = NULL;
    c.block_size = 0;
    assert_int_equal(kvd_leader_create(&c, fake_as_store(&f), &x),
                     KVD_ERR_INVALID);
    c = config(0);
    assert_int_equal(kvd_leader_create(&c, fake_as_store(&f), &x),
                     KVD_ERR_INVALID);
    c = config(1);
    assert_int_equal(kvd_leader_create(&c, NULL, &x), KVD_ERR_INVALID);
    uint64_t m;
    bool a;
    kvd_leader_request_t q = {.request_id = "", .num_tokens = 0};
    assert_int_equal(kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &a),
                     KVD_ERR_INVALID);
    q.request_id = "x";
    q.num_tokens = 5; /* tokens missing */
    assert_int_equal(kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &a),
                     KVD_ERR_INVALID);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "nope", NULL, 0, 0),
        KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_leader_request_preempted(ld, "nope"),
                     KVD_ERR_NOT_FOUND);
    static const uint8_t junk[] = {0xff, 0xff, 0xff, 0x0f, 0x01};
    assert_int_equal(kvd_leader_update_connector_output(ld, junk, sizeof junk),
                     KVD_ERR_PROTO);
    assert_int_equal(kvd_leader_update_connector_output(ld, NULL, 3),
                     KVD_ERR_INVALID);
    /* A report about unknown requests changes nothing. */
    report(ld, 5, "ghost", "ghost", NULL, 0);
    assert_int_equal(kvd_leader_build_connector_meta(ld, NULL, NULL),
                     KVD_ERR_INVALID);
    kvd_leader_destroy(ld);
    kvd_leader_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tenant_salt_isolates),
        cmocka_unit_test(test_engine_hashes),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
