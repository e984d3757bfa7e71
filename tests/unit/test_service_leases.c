/*
 * kvdepotd's lease ids (server/service_lookup.c, service_get.c,
 * service_lease.c, service_housekeeping.c), driven in-process: a Lookup
 * with a TTL leases its prefix under one id, a probe leases nothing,
 * Release and a Lookup's release list end a lease once, the deadline
 * reclaims a forgotten one, Get leases block by block (READY / MISSING)
 * and refuses an unknown, expired or other-namespace lease id.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/unit/kvd_testservice_int.h"

#define NS 0x11

static int setup(void **state)
{
    static kvd_test_svc_t t;
    kvd_test_svc_open(&t, NULL);
    kvd_test_svc_save(&t, NS, 0, 4, NULL);
    *state = &t;
    return 0;
}

static int setup_short_ttl(void **state)
{
    static kvd_test_svc_t t;
    kvd_test_svc_opts_t o = {.lease_ttl_ms = 50, .tick_ms = 5};
    kvd_test_svc_open(&t, &o);
    kvd_test_svc_save(&t, NS, 0, 4, NULL);
    *state = &t;
    return 0;
}

static int teardown(void **state)
{
    kvd_test_svc_close(*state);
    return 0;
}

/* A probe answers the stored prefix and holds nothing. */
static void test_probe_leases_nothing(void **state)
{
    kvd_test_svc_t *t = *state;
    /* Objects 0..3 stored, 4 not: the prefix stops at 4 even though 5 is
     * asked after it. */
    kvd_pb_lookup_response_t *r = kvd_test_svc_lookup(t, NS, 0, 6, 0, NULL);
    assert_int_equal(r->n_locations, 4);
    assert_int_equal(r->lease_id, 0);
    for (size_t i = 0; i < r->n_locations; i++) {
        assert_int_equal(r->locations[i]->tier, KVDEPOT__V1__TIER__TIER_HOST);
        assert_int_equal(r->locations[i]->size_bytes, KVD_TEST_SVC_OBJ);
    }
    kvd_proto_lookup_response_free(r);
    kvd_service_stats_t st;
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.leases, 0);
    assert_int_equal(st.leased_blocks, 0);
}

/* A Lookup with a TTL holds its prefix under one id until Release, which
 * ends it exactly once. */
static void test_lookup_lease_release(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_pb_lookup_response_t *r = kvd_test_svc_lookup(t, NS, 0, 3, 5000, NULL);
    assert_int_equal(r->n_locations, 3);
    assert_int_not_equal(r->lease_id, 0);
    assert_int_equal(r->lease_ttl_ms, 5000);
    uint64_t id = r->lease_id;
    kvd_proto_lookup_response_free(r);

    kvd_service_stats_t st;
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.leases, 1);
    assert_int_equal(st.leased_blocks, 3);

    assert_int_equal(kvd_test_svc_release(t, id, NULL), 1);
    assert_int_equal(kvd_test_svc_release(t, id, NULL), 0);
    assert_int_equal(kvd_test_svc_release(t, id + 12345, NULL), 0);
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.leases, 0);
    assert_int_equal(st.leased_blocks, 0);
}

/* Two leased lookups get two ids; a Lookup's release list ends the first. */
static void test_lookup_release_list(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_pb_lookup_response_t *a = kvd_test_svc_lookup(t, NS, 0, 2, 5000, NULL);
    uint64_t first = a->lease_id;
    kvd_proto_lookup_response_free(a);
    assert_int_not_equal(first, 0);

    kvd_block_hash_t hashes[2];
    ProtobufCBinaryData fields[2];
    kvd_namespace_t ns;
    kvd_test_svc_hash_fields(0, 2, hashes, fields);
    kvd_pb_lookup_request_t rq = KVDEPOT__V1__LOOKUP_REQUEST__INIT;
    rq.namespace_id = kvd_test_svc_ns_field(&ns, NS);
    rq.n_block_hashes = 2;
    rq.block_hashes = fields;
    rq.lease_ttl_ms = 5000;
    rq.n_release_lease_ids = 1;
    rq.release_lease_ids = &first;
    ProtobufCMessage *msg = NULL;
    assert_int_equal(kvd_test_svc_call(t, KVD_RPC_LOOKUP, &rq.base, NULL, &msg),
                     KVD_OK);
    kvd_pb_lookup_response_t *b = (kvd_pb_lookup_response_t *)(void *)msg;
    uint64_t second = b->lease_id;
    assert_int_not_equal(second, 0);
    assert_int_not_equal(second, first);
    kvd_proto_lookup_response_free(b);

    kvd_service_stats_t st;
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.leases, 1);
    assert_int_equal(kvd_test_svc_release(t, first, NULL), 0);
    assert_int_equal(kvd_test_svc_release(t, second, NULL), 1);
}

/* The packed form answers the same facts as the sub-messages. */
static void test_lookup_packed(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_pb_lookup_response_t *plain = kvd_test_svc_lookup(t, NS, 0, 4, 0, NULL);
    kvd_block_hash_t hashes[4];
    kvd_namespace_t ns;
    for (uint32_t i = 0; i < 4; i++) {
        hashes[i] = kvd_test_svc_hash(i);
    }
    kvd_pb_lookup_request_t rq = KVDEPOT__V1__LOOKUP_REQUEST__INIT;
    rq.namespace_id = kvd_test_svc_ns_field(&ns, NS);
    rq.packed_hashes.data = (uint8_t *)hashes;
    rq.packed_hashes.len = sizeof hashes;
    rq.packed_locations = true;
    ProtobufCMessage *msg = NULL;
    assert_int_equal(kvd_test_svc_call(t, KVD_RPC_LOOKUP, &rq.base, NULL, &msg),
                     KVD_OK);
    kvd_pb_lookup_response_t *packed = (kvd_pb_lookup_response_t *)(void *)msg;
    assert_int_equal(packed->n_locations, 0);
    assert_int_equal(packed->n_tiers, 4);
    assert_int_equal(packed->n_arena_offsets, 4);
    assert_int_equal(packed->n_sizes, 4);
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(packed->tiers[i], plain->locations[i]->tier);
        assert_int_equal(packed->arena_offsets[i],
                         plain->locations[i]->arena_offset);
        assert_int_equal(packed->sizes[i], plain->locations[i]->size_bytes);
    }
    kvd_proto_lookup_response_free(packed);
    kvd_proto_lookup_response_free(plain);
}

/* A forgotten lease is reclaimed at its deadline and counted; its id is
 * unknown afterwards. */
static void test_lease_expires(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_pb_lookup_response_t *r = kvd_test_svc_lookup(t, NS, 0, 2, 30, NULL);
    uint64_t id = r->lease_id;
    kvd_proto_lookup_response_free(r);
    assert_int_not_equal(id, 0);
    kvd_service_stats_t st;
    /* The counters are read without the service's lock: the lease leaves
     * the table a moment before the expiry is counted. */
    KVD_TEST_SVC_WAIT(t, st, st.leases == 0 && st.leases_expired == 1);
    assert_int_equal(st.leases, 0);
    assert_int_equal(st.leased_blocks, 0);
    assert_int_equal(st.leases_expired, 1);

    kvd_block_hash_t h[1];
    ProtobufCBinaryData f[1];
    kvd_namespace_t ns;
    kvd_test_svc_hash_fields(0, 1, h, f);
    kvd_pb_get_request_t g = KVDEPOT__V1__GET_REQUEST__INIT;
    g.namespace_id = kvd_test_svc_ns_field(&ns, NS);
    g.n_block_hashes = 1;
    g.block_hashes = f;
    g.lease_id = id;
    assert_int_equal(kvd_test_svc_call(t, KVD_RPC_GET, &g.base, NULL, NULL),
                     KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_test_svc_release(t, id, NULL), 0);
}

static kvd_pb_get_response_t *get(kvd_test_svc_t *t, uint8_t nsb,
                                  uint32_t first, size_t n, uint64_t lease_id,
                                  kvd_status_t want)
{
    kvd_block_hash_t h[KVD_TEST_SVC_MAX];
    ProtobufCBinaryData f[KVD_TEST_SVC_MAX];
    kvd_namespace_t ns;
    kvd_test_svc_hash_fields(first, n, h, f);
    kvd_pb_get_request_t g = KVDEPOT__V1__GET_REQUEST__INIT;
    g.namespace_id = kvd_test_svc_ns_field(&ns, nsb);
    g.n_block_hashes = n;
    g.block_hashes = f;
    g.lease_id = lease_id;
    ProtobufCMessage *msg = NULL;
    assert_int_equal(kvd_test_svc_call(t, KVD_RPC_GET, &g.base, NULL, &msg),
                     want);
    return (kvd_pb_get_response_t *)(void *)msg;
}

/* A Get on lease `id` of object 0 answers `want`. */
static void kvd_test_svc_get_expect(kvd_test_svc_t *t, uint64_t id,
                                    kvd_status_t want)
{
    kvd_pb_get_response_t *r = get(t, NS, 0, 1, id, want);
    kvd_proto_free(r != NULL ? &r->base : NULL);
}

/* A Lookup of objects 0..n-1 leased for `ttl_ms` by a caller of hand-off
 * session `session`; returns the lease id. */
static uint64_t session_lookup(kvd_test_svc_t *t, uint64_t session, size_t n,
                               uint32_t ttl_ms)
{
    kvd_block_hash_t h[KVD_TEST_SVC_MAX];
    ProtobufCBinaryData f[KVD_TEST_SVC_MAX];
    kvd_namespace_t ns;
    kvd_test_svc_hash_fields(0, n, h, f);
    kvd_pb_lookup_request_t rq = KVDEPOT__V1__LOOKUP_REQUEST__INIT;
    rq.namespace_id = kvd_test_svc_ns_field(&ns, NS);
    rq.n_block_hashes = n;
    rq.block_hashes = f;
    rq.lease_ttl_ms = ttl_ms;
    uint8_t *in = NULL, *out = NULL;
    size_t in_len = 0, out_len = 0;
    char why[KVD_PROTO_REASON_MAX] = "";
    assert_int_equal(kvd_proto_pack_alloc(KVD_PROTO_MSG_LOOKUP_REQUEST,
                                          &rq.base, &in, &in_len, why,
                                          sizeof why),
                     KVD_OK);
    assert_int_equal(kvd_service_call_session(t->svc, KVD_RPC_LOOKUP, in,
                                              in_len, NULL, session, &out,
                                              &out_len, why, sizeof why),
                     KVD_OK);
    ProtobufCMessage *msg = NULL;
    assert_int_equal(kvd_proto_unpack(KVD_PROTO_MSG_LOOKUP_RESPONSE, out,
                                      out_len, &msg, why, sizeof why),
                     KVD_OK);
    uint64_t id = ((kvd_pb_lookup_response_t *)(void *)msg)->lease_id;
    kvd_proto_free(msg);
    free(out);
    free(in);
    return id;
}

/* A lease of an open hand-off session that expires is quarantined (out of
 * the table, Get cannot revive it, its bytes still counted); it is given
 * back when the session closes, and one of a session never opened is
 * given back at once. */
static void test_lease_quarantined_until_session_ends(void **state)
{
    kvd_test_svc_t *t = *state;
    assert_int_equal(kvd_service_session_open(t->svc, 7), KVD_OK);
    uint64_t id = session_lookup(t, 7, 2, 30);
    assert_int_not_equal(id, 0);
    kvd_service_stats_t st;
    KVD_TEST_SVC_WAIT(t, st, st.leases == 0 && st.leases_quarantined == 1);
    assert_true(st.quarantined_bytes > 0);
    /* Another caller (no session) cannot acknowledge it. */
    assert_int_equal(kvd_test_svc_release(t, id, NULL), 0);
    kvd_test_svc_get_expect(t, id, KVD_ERR_NOT_FOUND);
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.leases_quarantined, 1);
    kvd_service_session_close(t->svc, 7);
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.leases_quarantined, 0);
    assert_int_equal(st.quarantined_bytes, 0);
    assert_int_equal(st.sessions, 0);

    /* Session 8 was never opened (its client is gone): no quarantine. */
    (void)session_lookup(t, 8, 1, 30);
    KVD_TEST_SVC_WAIT(t, st, st.leases == 0 && st.leases_expired == 2);
    assert_int_equal(st.leases_quarantined, 0);
}

/* Get without a lease id makes one over the blocks it finds: READY with
 * the offsets Lookup answers and the saved bytes there, MISSING for the
 * rest; the lease's TTL is the service's default. */
static void test_get_new_lease(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_pb_lookup_response_t *l = kvd_test_svc_lookup(t, NS, 0, 4, 0, NULL);
    /* Objects 2..5: two stored, two not. */
    kvd_pb_get_response_t *r = get(t, NS, 2, 4, 0, KVD_OK);
    assert_int_equal(r->n_entries, 4);
    for (size_t i = 0; i < 2; i++) {
        const kvd_pb_get_entry_t *e = r->entries[i];
        assert_int_equal(e->state, KVDEPOT__V1__GET_STATE__GET_STATE_READY);
        assert_int_equal(e->arena_offset, l->locations[2 + i]->arena_offset);
        assert_int_equal(e->size_bytes, KVD_TEST_SVC_OBJ);
        uint8_t want[KVD_TEST_SVC_OBJ];
        kvd_test_svc_fill(want, sizeof want, (uint32_t)(2 + i));
        const void *p =
            kvd_store_arena_ptr(t->store, e->arena_offset, KVD_TEST_SVC_OBJ);
        assert_non_null(p);
        assert_memory_equal(p, want, sizeof want);
    }
    for (size_t i = 2; i < 4; i++) {
        assert_int_equal(r->entries[i]->state,
                         KVDEPOT__V1__GET_STATE__GET_STATE_MISSING);
    }
    assert_int_not_equal(r->lease_id, 0);
    assert_int_equal(r->lease_ttl_ms, 30000);
    uint64_t id = r->lease_id;
    kvd_proto_get_response_free(r);
    kvd_proto_lookup_response_free(l);

    kvd_service_stats_t st;
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.leases, 1);
    assert_int_equal(st.leased_blocks, 2);

    /* The same lease grows with the next Get; a block it holds already
     * is not leased twice. */
    r = get(t, NS, 0, 3, id, KVD_OK);
    assert_int_equal(r->lease_id, id);
    kvd_proto_get_response_free(r);
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.leases, 1);
    assert_int_equal(st.leased_blocks, 4);
    assert_int_equal(kvd_test_svc_release(t, id, NULL), 1);
}

/* A Get whose every block is missing leaves no lease behind. */
static void test_get_all_missing(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_pb_get_response_t *r = get(t, NS, 100, 2, 0, KVD_OK);
    assert_int_equal(r->lease_id, 0);
    assert_int_equal(r->entries[0]->state,
                     KVDEPOT__V1__GET_STATE__GET_STATE_MISSING);
    kvd_proto_get_response_free(r);
    kvd_service_stats_t st;
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.leases, 0);
}

/* A lease id is refused for another namespace and when unknown. */
static void test_get_wrong_lease(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_pb_lookup_response_t *l = kvd_test_svc_lookup(t, NS, 0, 1, 5000, NULL);
    uint64_t id = l->lease_id;
    kvd_proto_lookup_response_free(l);
    assert_null(get(t, NS + 1, 0, 1, id, KVD_ERR_NOT_FOUND));
    assert_null(get(t, NS, 0, 1, id + 999, KVD_ERR_NOT_FOUND));
    assert_int_equal(kvd_test_svc_release(t, id, NULL), 1);
}

/* Get's lease TTL: the request's, else the service's default; a short one
 * expires like a Lookup's. */
static void test_get_lease_expires(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_pb_get_response_t *r = get(t, NS, 0, 2, 0, KVD_OK);
    assert_int_equal(r->lease_ttl_ms, 50);
    kvd_proto_get_response_free(r);
    kvd_service_stats_t st;
    /* The counters are read without the service's lock: the lease leaves
     * the table a moment before the expiry is counted. */
    KVD_TEST_SVC_WAIT(t, st, st.leases == 0 && st.leases_expired == 1);
    assert_int_equal(st.leases, 0);
    assert_int_equal(st.leases_expired, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_probe_leases_nothing, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_lookup_lease_release, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_lookup_release_list, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_lookup_packed, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_lease_quarantined_until_session_ends, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lease_expires, setup_short_ttl,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_get_new_lease, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_all_missing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_wrong_lease, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_lease_expires, setup_short_ttl,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
