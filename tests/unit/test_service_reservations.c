/*
 * kvdepotd's reservation ids (server/service_resv.c,
 * service_housekeeping.c), driven in-process: Reserve gives each new
 * block a slot under one id and answers EXISTS for stored ones; Commit
 * publishes a block whose bytes match its checksum and refuses one that
 * does not (counted); Abort gives slots back, wholly or by hash; the id
 * ends when nothing is left open; the deadline aborts what a client left;
 * while draining, Reserve refuses every block; a TTL beyond
 * server.reservation_ttl_max is cut to it, and a caller past its
 * server.max_reserved_bytes is refused while others still save.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "tests/unit/kvd_testservice_int.h"

#define NS 0x22

static int setup(void **state)
{
    static kvd_test_svc_t t;
    kvd_test_svc_open(&t, NULL);
    *state = &t;
    return 0;
}

static int teardown(void **state)
{
    kvd_test_svc_close(*state);
    return 0;
}

/* A Commit of block 0 under reservation `id`, for its status. */
static kvd_status_t commit_id(kvd_test_svc_t *t, uint64_t id)
{
    kvd_block_hash_t h = kvd_test_svc_hash(0);
    uint64_t sum = 0;
    kvd_pb_commit_entry_t e = KVDEPOT__V1__COMMIT_ENTRY__INIT;
    e.block_hash.data = h.bytes;
    e.block_hash.len = sizeof h.bytes;
    e.n_layer_checksums = 1;
    e.layer_checksums = &sum;
    kvd_pb_commit_entry_t *ep = &e;
    kvd_pb_commit_request_t rq = KVDEPOT__V1__COMMIT_REQUEST__INIT;
    rq.reservation_id = id;
    rq.n_entries = 1;
    rq.entries = &ep;
    return kvd_test_svc_call(t, KVD_RPC_COMMIT, &rq.base, NULL, NULL);
}

/* Reserve -> write -> Commit makes the blocks visible; the id is gone
 * once every block is committed. */
static void test_reserve_commit(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_pb_reserve_response_t *res = kvd_test_svc_reserve(t, NS, 0, 3, 0, NULL);
    assert_int_not_equal(res->reservation_id, 0);
    assert_int_equal(res->ttl_ms, 30000);
    assert_int_equal(res->n_blocks, 3);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(
            res->blocks[i]->outcome,
            KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_RESERVED);
    }
    kvd_service_stats_t st;
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.reservations, 1);
    /* Reserved is not stored: invisible until committed. */
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 3, NULL), 0);

    kvd_pb_commit_response_t *c = kvd_test_svc_commit(t, res, false, NULL);
    assert_int_equal(c->num_committed, 3);
    assert_int_equal(c->n_statuses, 3);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(c->statuses[i], KVD_OK);
    }
    kvd_proto_commit_response_free(c);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 3, NULL), 3);
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.reservations, 0);
    assert_int_equal(commit_id(t, res->reservation_id), KVD_ERR_NOT_FOUND);
    kvd_proto_reserve_response_free(res);
}

/* Stored blocks answer EXISTS; only the new ones get slots, and a batch
 * with nothing new gets no id. */
static void test_reserve_exists(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_test_svc_save(t, NS, 0, 2, NULL);
    kvd_pb_reserve_response_t *res = kvd_test_svc_reserve(t, NS, 0, 3, 0, NULL);
    assert_int_equal(res->blocks[0]->outcome,
                     KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_EXISTS);
    assert_int_equal(res->blocks[1]->outcome,
                     KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_EXISTS);
    assert_int_equal(res->blocks[2]->outcome,
                     KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_RESERVED);
    assert_int_not_equal(res->reservation_id, 0);
    kvd_pb_commit_response_t *c = kvd_test_svc_commit(t, res, false, NULL);
    assert_int_equal(c->num_committed, 1);
    kvd_proto_commit_response_free(c);
    kvd_proto_reserve_response_free(res);

    res = kvd_test_svc_reserve(t, NS, 0, 3, 0, NULL);
    assert_int_equal(res->reservation_id, 0);
    kvd_proto_reserve_response_free(res);
    kvd_service_stats_t st;
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.reservations, 0);
}

/* Bytes that do not match the client's checksum are not published. */
static void test_commit_checksum(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_pb_reserve_response_t *res = kvd_test_svc_reserve(t, NS, 0, 2, 0, NULL);
    kvd_pb_commit_response_t *c = kvd_test_svc_commit(t, res, true, NULL);
    assert_int_equal(c->num_committed, 0);
    assert_int_equal(c->statuses[0], KVD_ERR_CHECKSUM);
    assert_int_equal(c->statuses[1], KVD_ERR_CHECKSUM);
    kvd_proto_commit_response_free(c);
    kvd_service_stats_t st;
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.commit_checksum_errors, 2);
    assert_int_equal(st.reservations, 0);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 2, NULL), 0);
    kvd_proto_reserve_response_free(res);

    /* The slots went back: the same blocks can be saved again. */
    kvd_test_svc_save(t, NS, 0, 2, NULL);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 2, NULL), 2);
}

/* A commit entry for a block the reservation does not hold is
 * NOT_FOUND; the others commit. */
static void test_commit_unknown_block(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_pb_reserve_response_t *res = kvd_test_svc_reserve(t, NS, 0, 1, 0, NULL);
    kvd_block_hash_t other = kvd_test_svc_hash(77);
    uint64_t sum = 0;
    kvd_pb_commit_entry_t e = KVDEPOT__V1__COMMIT_ENTRY__INIT;
    e.block_hash.data = other.bytes;
    e.block_hash.len = sizeof other.bytes;
    e.n_layer_checksums = 1;
    e.layer_checksums = &sum;
    kvd_pb_commit_entry_t *ep = &e;
    kvd_pb_commit_request_t rq = KVDEPOT__V1__COMMIT_REQUEST__INIT;
    rq.reservation_id = res->reservation_id;
    rq.n_entries = 1;
    rq.entries = &ep;
    ProtobufCMessage *msg = NULL;
    assert_int_equal(kvd_test_svc_call(t, KVD_RPC_COMMIT, &rq.base, NULL, &msg),
                     KVD_OK);
    kvd_pb_commit_response_t *c = (kvd_pb_commit_response_t *)(void *)msg;
    assert_int_equal(c->num_committed, 0);
    assert_int_equal(c->statuses[0], KVD_ERR_NOT_FOUND);
    kvd_proto_commit_response_free(c);
    /* The reservation is still open for its own block. */
    kvd_service_stats_t st;
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.reservations, 1);
    c = kvd_test_svc_commit(t, res, false, NULL);
    assert_int_equal(c->num_committed, 1);
    kvd_proto_commit_response_free(c);
    kvd_proto_reserve_response_free(res);
}

/* Unknown reservation ids: Commit and Abort answer NOT_FOUND. */
static void test_unknown_reservation(void **state)
{
    kvd_test_svc_t *t = *state;
    assert_int_equal(commit_id(t, 424242), KVD_ERR_NOT_FOUND);
    kvd_pb_abort_request_t rq = KVDEPOT__V1__ABORT_REQUEST__INIT;
    rq.reservation_id = 424242;
    char why[KVD_PROTO_REASON_MAX];
    assert_int_equal(kvd_test_svc_call_why(t, KVD_RPC_ABORT, &rq.base, NULL,
                                           NULL, why, sizeof why),
                     KVD_ERR_NOT_FOUND);
    assert_non_null(strstr(why, "424242"));
}

static uint32_t abort_blocks(kvd_test_svc_t *t, uint64_t id, uint32_t first,
                             size_t n)
{
    kvd_block_hash_t h[KVD_TEST_SVC_MAX];
    ProtobufCBinaryData f[KVD_TEST_SVC_MAX];
    kvd_test_svc_hash_fields(first, n, h, f);
    kvd_pb_abort_request_t rq = KVDEPOT__V1__ABORT_REQUEST__INIT;
    rq.reservation_id = id;
    rq.n_block_hashes = n;
    rq.block_hashes = n > 0 ? f : NULL;
    ProtobufCMessage *msg = NULL;
    assert_int_equal(kvd_test_svc_call(t, KVD_RPC_ABORT, &rq.base, NULL, &msg),
                     KVD_OK);
    uint32_t aborted = ((kvd_pb_abort_response_t *)(void *)msg)->num_aborted;
    kvd_proto_free(msg);
    return aborted;
}

/* Abort by hash gives those slots back, a second abort of them counts
 * nothing, and an abort without hashes ends the rest and the id. */
static void test_abort(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_pb_reserve_response_t *res = kvd_test_svc_reserve(t, NS, 0, 4, 0, NULL);
    uint64_t id = res->reservation_id;
    kvd_proto_reserve_response_free(res);
    assert_int_equal(abort_blocks(t, id, 0, 2), 2);
    assert_int_equal(abort_blocks(t, id, 0, 2), 0);
    kvd_service_stats_t st;
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.reservations, 1);
    assert_int_equal(abort_blocks(t, id, 0, 0), 2);
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.reservations, 0);
    assert_int_equal(commit_id(t, id), KVD_ERR_NOT_FOUND);

    /* Nothing was published, and every block can be reserved anew. */
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 4, NULL), 0);
    kvd_test_svc_save(t, NS, 0, 4, NULL);
}

/* A reservation left open is aborted at its deadline and counted. */
static void test_reservation_expires(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_pb_reserve_response_t *res =
        kvd_test_svc_reserve(t, NS, 0, 2, 30, NULL);
    assert_int_equal(res->ttl_ms, 30);
    uint64_t id = res->reservation_id;
    kvd_proto_reserve_response_free(res);
    kvd_service_stats_t st;
    /* The counters are read without the service's lock: the reservation
     * leaves the table a moment before the expiry is counted. */
    KVD_TEST_SVC_WAIT(t, st,
                      st.reservations == 0 && st.reservations_expired == 1);
    assert_int_equal(st.reservations, 0);
    assert_int_equal(st.reservations_expired, 1);
    assert_int_equal(commit_id(t, id), KVD_ERR_NOT_FOUND);
    /* Its slots went back: the blocks are new again. */
    res = kvd_test_svc_reserve(t, NS, 0, 2, 0, NULL);
    assert_int_equal(res->blocks[0]->outcome,
                     KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_RESERVED);
    assert_int_equal(res->blocks[1]->outcome,
                     KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_RESERVED);
    kvd_proto_reserve_response_free(res);
}

static void drain(kvd_test_svc_t *t, bool enable)
{
    kvd_pb_drain_t d = KVDEPOT__V1__DRAIN__INIT;
    d.enable = enable;
    kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_DRAIN;
    rq.drain = &d;
    assert_int_equal(kvd_test_svc_call(t, KVD_RPC_ADMIN, &rq.base, NULL, NULL),
                     KVD_OK);
}

/* Draining refuses new saves (REJECTED, KVD_ERR_BUSY) but lets an open
 * reservation commit; drain off takes saves again. */
static void test_drain_refuses_reserve(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_pb_reserve_response_t *open =
        kvd_test_svc_reserve(t, NS, 0, 1, 0, NULL);
    drain(t, true);
    assert_true(kvd_service_draining(t->svc));
    kvd_pb_reserve_response_t *res = kvd_test_svc_reserve(t, NS, 5, 2, 0, NULL);
    assert_int_equal(res->reservation_id, 0);
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(
            res->blocks[i]->outcome,
            KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_REJECTED);
        assert_int_equal(res->blocks[i]->status, KVD_ERR_BUSY);
    }
    kvd_proto_reserve_response_free(res);
    kvd_pb_commit_response_t *c = kvd_test_svc_commit(t, open, false, NULL);
    assert_int_equal(c->num_committed, 1);
    kvd_proto_commit_response_free(c);
    kvd_proto_reserve_response_free(open);

    drain(t, false);
    assert_false(kvd_service_draining(t->svc));
    kvd_test_svc_save(t, NS, 5, 2, NULL);
}

/* ---- caps: TTL and reserved bytes per caller ---------------------------- */

#define CAP_BLOCKS 4u

static int setup_caps(void **state)
{
    static kvd_test_svc_t t;
    kvd_test_svc_opts_t o;
    memset(&o, 0, sizeof o);
    o.reservation_ttl_max_ms = 60000;
    o.max_reserved_bytes = CAP_BLOCKS * KVD_TEST_SVC_OBJ;
    kvd_test_svc_open(&t, &o);
    *state = &t;
    return 0;
}

/* A Reserve asking for an hour gets server.reservation_ttl_max, and the
 * reply says so (the client's deadline is the reply's TTL); a shorter
 * request gets what it asked for. */
static void test_reservation_ttl_capped(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_pb_reserve_response_t *res =
        kvd_test_svc_reserve(t, NS, 0, 1, 3600000, NULL);
    assert_int_not_equal(res->reservation_id, 0);
    assert_int_equal(res->ttl_ms, 60000);
    kvd_proto_reserve_response_free(res);
    res = kvd_test_svc_reserve(t, NS, 1, 1, 1000, NULL);
    assert_int_equal(res->ttl_ms, 1000);
    kvd_proto_reserve_response_free(res);
}

/* How many blocks of `res` were RESERVED; every other one must be
 * REJECTED with KVD_ERR_NOSPACE. */
static size_t reserved_else_nospace(const kvd_pb_reserve_response_t *res)
{
    size_t reserved = 0;
    for (size_t i = 0; i < res->n_blocks; i++) {
        if (res->blocks[i]->outcome ==
            KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_RESERVED) {
            reserved++;
            continue;
        }
        assert_int_equal(
            res->blocks[i]->outcome,
            KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_REJECTED);
        assert_int_equal(res->blocks[i]->status, KVD_ERR_NOSPACE);
    }
    return reserved;
}

/* One tenant holding its server.max_reserved_bytes is refused more
 * (KVD_ERR_NOSPACE, the rest of its batch too) while another tenant's
 * save succeeds; committing gives the tenant its room back. */
static void test_reserved_bytes_capped_per_caller(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_pb_reserve_response_t *a =
        kvd_test_svc_reserve(t, NS, 0, CAP_BLOCKS + 2, 0, "a");
    assert_int_equal(reserved_else_nospace(a), CAP_BLOCKS);
    kvd_pb_reserve_response_t *more =
        kvd_test_svc_reserve(t, NS, 100, 1, 0, "a");
    assert_int_equal(more->reservation_id, 0);
    assert_int_equal(reserved_else_nospace(more), 0);
    kvd_proto_reserve_response_free(more);

    kvd_test_svc_save(t, NS, 0, CAP_BLOCKS, "b");
    kvd_test_svc_save(t, NS, 50, 2, NULL);

    kvd_pb_commit_response_t *c = kvd_test_svc_commit(t, a, false, "a");
    assert_int_equal(c->num_committed, CAP_BLOCKS);
    kvd_proto_commit_response_free(c);
    kvd_proto_reserve_response_free(a);
    kvd_test_svc_save(t, NS, 100, CAP_BLOCKS, "a");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_reserve_commit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reservation_ttl_capped, setup_caps,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_reserved_bytes_capped_per_caller,
                                        setup_caps, teardown),
        cmocka_unit_test_setup_teardown(test_reserve_exists, setup, teardown),
        cmocka_unit_test_setup_teardown(test_commit_checksum, setup, teardown),
        cmocka_unit_test_setup_teardown(test_commit_unknown_block, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_unknown_reservation, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_abort, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reservation_expires, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_drain_refuses_reserve, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
