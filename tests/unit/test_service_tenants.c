/*
 * Tenant accounting in kvdepotd's service (server/service_tenant.c and
 * the handlers that use it), driven in-process with callers bound to a
 * tenant the way rpc.c binds them: each tenant has its own copy of every
 * namespace; lease and reservation ids work only for the tenant that made
 * them; saves count under the caller's tenant, whatever the request says;
 * server.tenant_max_leased trims a Lookup to the prefix that fits and
 * fails a Get's new block with KVD_ERR_QUOTA.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/unit/kvd_testservice_int.h"

#define NS 0x33
#define TA "team-a"
#define TB "team-b"

static int setup(void **state)
{
    static kvd_test_svc_t t;
    kvd_test_svc_open(&t, NULL);
    *state = &t;
    return 0;
}

/* At most 2 objects' bytes leased per tenant. */
static int setup_capped(void **state)
{
    static kvd_test_svc_t t;
    kvd_test_svc_opts_t o = {.tenant_max_leased_bytes = 2 * KVD_TEST_SVC_OBJ};
    kvd_test_svc_open(&t, &o);
    *state = &t;
    return 0;
}

static int teardown(void **state)
{
    kvd_test_svc_close(*state);
    return 0;
}

/* Tenant ids: 0 for none, stable and non-zero for a name. */
static void test_tenant_id(void **state)
{
    (void)state;
    assert_int_equal(kvd_service_tenant_id(NULL), 0);
    assert_int_equal(kvd_service_tenant_id(""), 0);
    uint32_t a = kvd_service_tenant_id(TA);
    assert_int_not_equal(a, 0);
    assert_int_equal(kvd_service_tenant_id(TA), a);
    assert_int_not_equal(kvd_service_tenant_id(TB), a);
}

/* A tenant's namespace is its own: the same namespace id and hashes name
 * other objects for another tenant and for an unbound caller. */
static void test_namespace_isolation(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_test_svc_save(t, NS, 0, 3, TA);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 3, TA), 3);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 3, TB), 0);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 3, NULL), 0);

    /* Tenant B saves the same keys without an EXISTS: no collision. */
    kvd_pb_reserve_response_t *res = kvd_test_svc_reserve(t, NS, 0, 3, 0, TB);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(
            res->blocks[i]->outcome,
            KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_RESERVED);
    }
    kvd_pb_commit_response_t *c = kvd_test_svc_commit(t, res, false, TB);
    assert_int_equal(c->num_committed, 3);
    kvd_proto_commit_response_free(c);
    kvd_proto_reserve_response_free(res);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 3, TB), 3);
}

/* A lease id made by one tenant is unknown to another; an operator (no
 * tenant) may end it. */
static void test_lease_ownership(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_test_svc_save(t, NS, 0, 2, TA);
    kvd_pb_lookup_response_t *r = kvd_test_svc_lookup(t, NS, 0, 2, 5000, TA);
    uint64_t id = r->lease_id;
    kvd_proto_lookup_response_free(r);
    assert_int_not_equal(id, 0);
    assert_int_equal(kvd_test_svc_release(t, id, TB), 0);
    kvd_service_stats_t st;
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.leases, 1);
    assert_int_equal(kvd_test_svc_release(t, id, TA), 1);

    r = kvd_test_svc_lookup(t, NS, 0, 2, 5000, TA);
    id = r->lease_id;
    kvd_proto_lookup_response_free(r);
    assert_int_equal(kvd_test_svc_release(t, id, NULL), 1);
}

/* A reservation made by one tenant cannot be committed or aborted by
 * another; its maker still can. */
static void test_reservation_ownership(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_pb_reserve_response_t *res = kvd_test_svc_reserve(t, NS, 0, 1, 0, TA);
    kvd_pb_abort_request_t rq = KVDEPOT__V1__ABORT_REQUEST__INIT;
    rq.reservation_id = res->reservation_id;
    assert_int_equal(kvd_test_svc_call(t, KVD_RPC_ABORT, &rq.base, TB, NULL),
                     KVD_ERR_NOT_FOUND);
    kvd_pb_commit_response_t *c = kvd_test_svc_commit(t, res, false, TA);
    assert_int_equal(c->num_committed, 1);
    kvd_proto_commit_response_free(c);
    kvd_proto_reserve_response_free(res);
}

/* Objects the store holds under `tenant` (scan of the whole store). */
static size_t objects_of(kvd_test_svc_t *t, const char *tenant)
{
    kvd_store_object_t objs[64];
    uint64_t cursor = 0;
    size_t got = 0, n = 0;
    assert_int_equal(kvd_store_scan(t->store, &cursor, objs, 64, &got), KVD_OK);
    assert_true(got < 64);
    for (size_t i = 0; i < got; i++) {
        n += objs[i].tenant == kvd_service_tenant_id(tenant);
    }
    return n;
}

/* A bound caller's saves count under its tenant even when the request
 * names another; an unbound caller's under the request's. */
static void test_saves_count_under_caller(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_block_hash_t h[1];
    ProtobufCBinaryData f[1];
    kvd_namespace_t ns;
    kvd_test_svc_hash_fields(9, 1, h, f);
    kvd_pb_reserve_request_t rq = KVDEPOT__V1__RESERVE_REQUEST__INIT;
    rq.namespace_id = kvd_test_svc_ns_field(&ns, NS);
    rq.n_block_hashes = 1;
    rq.block_hashes = f;
    rq.object_size_bytes = KVD_TEST_SVC_OBJ;
    rq.tenant = (char *)TB;
    ProtobufCMessage *msg = NULL;
    assert_int_equal(kvd_test_svc_call(t, KVD_RPC_RESERVE, &rq.base, TA, &msg),
                     KVD_OK);
    kvd_pb_reserve_response_t *res = (kvd_pb_reserve_response_t *)(void *)msg;
    kvd_pb_commit_response_t *c = kvd_test_svc_commit(t, res, false, TA);
    assert_int_equal(c->num_committed, 1);
    kvd_proto_commit_response_free(c);
    kvd_proto_reserve_response_free(res);

    assert_int_equal(objects_of(t, TA), 1);
    assert_int_equal(objects_of(t, TB), 0);

    /* Unbound: the request's tenant. */
    kvd_test_svc_hash_fields(10, 1, h, f);
    msg = NULL;
    assert_int_equal(
        kvd_test_svc_call(t, KVD_RPC_RESERVE, &rq.base, NULL, &msg), KVD_OK);
    res = (kvd_pb_reserve_response_t *)(void *)msg;
    c = kvd_test_svc_commit(t, res, false, NULL);
    assert_int_equal(c->num_committed, 1);
    kvd_proto_commit_response_free(c);
    kvd_proto_reserve_response_free(res);
    assert_int_equal(objects_of(t, TB), 1);
    assert_int_equal(objects_of(t, TA), 1);
}

/* Under server.tenant_max_leased a Lookup leases the prefix that fits and
 * counts the rest refused; releasing makes room again. Probes are not
 * capped, and each tenant has its own room. */
static void test_leased_cap_lookup(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_test_svc_save(t, NS, 0, 4, TA);
    kvd_test_svc_save(t, NS, 0, 4, TB);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 4, TA), 4);

    kvd_pb_lookup_response_t *r = kvd_test_svc_lookup(t, NS, 0, 4, 5000, TA);
    assert_int_equal(r->n_locations, 2);
    uint64_t id = r->lease_id;
    kvd_proto_lookup_response_free(r);
    kvd_service_stats_t st;
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.leases_refused, 2);
    assert_int_equal(st.leased_blocks, 2);

    /* At its cap: nothing more for A, B has its own room. */
    r = kvd_test_svc_lookup(t, NS, 0, 4, 5000, TA);
    assert_int_equal(r->n_locations, 0);
    assert_int_equal(r->lease_id, 0);
    kvd_proto_lookup_response_free(r);
    r = kvd_test_svc_lookup(t, NS, 0, 4, 5000, TB);
    assert_int_equal(r->n_locations, 2);
    uint64_t id_b = r->lease_id;
    kvd_proto_lookup_response_free(r);

    assert_int_equal(kvd_test_svc_release(t, id, TA), 1);
    r = kvd_test_svc_lookup(t, NS, 0, 4, 5000, TA);
    assert_int_equal(r->n_locations, 2);
    assert_int_equal(kvd_test_svc_release(t, r->lease_id, TA), 1);
    kvd_proto_lookup_response_free(r);
    assert_int_equal(kvd_test_svc_release(t, id_b, TB), 1);
}

static kvd_pb_get_response_t *get_as(kvd_test_svc_t *t, uint32_t first,
                                     size_t n, uint64_t lease_id,
                                     const char *tenant)
{
    kvd_block_hash_t h[KVD_TEST_SVC_MAX];
    ProtobufCBinaryData f[KVD_TEST_SVC_MAX];
    kvd_namespace_t ns;
    kvd_test_svc_hash_fields(first, n, h, f);
    kvd_pb_get_request_t g = KVDEPOT__V1__GET_REQUEST__INIT;
    g.namespace_id = kvd_test_svc_ns_field(&ns, NS);
    g.n_block_hashes = n;
    g.block_hashes = f;
    g.lease_id = lease_id;
    ProtobufCMessage *msg = NULL;
    assert_int_equal(kvd_test_svc_call(t, KVD_RPC_GET, &g.base, tenant, &msg),
                     KVD_OK);
    return (kvd_pb_get_response_t *)(void *)msg;
}

/* With the tenant at its cap (its leases in the table), a Get's new block
 * fails with KVD_ERR_QUOTA, on its lease or on a new one; releasing makes
 * room again. */
static void test_leased_cap_get(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_test_svc_save(t, NS, 0, 3, TA);
    kvd_pb_get_response_t *r = get_as(t, 0, 2, 0, TA);
    assert_int_equal(r->entries[0]->state,
                     KVDEPOT__V1__GET_STATE__GET_STATE_READY);
    assert_int_equal(r->entries[1]->state,
                     KVDEPOT__V1__GET_STATE__GET_STATE_READY);
    uint64_t id = r->lease_id;
    assert_int_not_equal(id, 0);
    kvd_proto_get_response_free(r);

    r = get_as(t, 2, 1, id, TA);
    assert_int_equal(r->entries[0]->state,
                     KVDEPOT__V1__GET_STATE__GET_STATE_FAILED);
    assert_int_equal(r->entries[0]->status, KVD_ERR_QUOTA);
    /* The lease is not part of an answer whose every block failed. */
    assert_int_equal(r->lease_id, 0);
    kvd_proto_get_response_free(r);
    r = get_as(t, 2, 1, 0, TA);
    assert_int_equal(r->entries[0]->status, KVD_ERR_QUOTA);
    kvd_proto_get_response_free(r);
    kvd_service_stats_t st;
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.leases_refused, 2);
    assert_int_equal(st.leases, 1);
    assert_int_equal(st.leased_blocks, 2);

    /* Another tenant is not held back by A's leases. */
    kvd_test_svc_save(t, NS, 2, 1, TB);
    r = get_as(t, 2, 1, 0, TB);
    assert_int_equal(r->entries[0]->state,
                     KVDEPOT__V1__GET_STATE__GET_STATE_READY);
    assert_int_equal(kvd_test_svc_release(t, r->lease_id, TB), 1);
    kvd_proto_get_response_free(r);

    assert_int_equal(kvd_test_svc_release(t, id, TA), 1);
    r = get_as(t, 2, 1, 0, TA);
    assert_int_equal(r->entries[0]->state,
                     KVDEPOT__V1__GET_STATE__GET_STATE_READY);
    assert_int_equal(kvd_test_svc_release(t, r->lease_id, TA), 1);
    kvd_proto_get_response_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tenant_id),
        cmocka_unit_test_setup_teardown(test_namespace_isolation, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_lease_ownership, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reservation_ownership, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_saves_count_under_caller, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_leased_cap_lookup, setup_capped,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_leased_cap_get, setup_capped,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
