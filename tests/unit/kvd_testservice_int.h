/*
 * kvdepotd's KvStore service driven in-process (server/service_int.h), the
 * way tests/fuzz/fuzz_service.c does: one embedded store on a small arena,
 * one service over it, requests built as protobuf-c messages, packed,
 * handed to kvd_service_call as a caller bound to `tenant` (NULL: an
 * operator) and the response unpacked as its type. Header-only (static
 * inline); the including test has cmocka.h included first and links
 * kvd_server.
 */
#ifndef KVD_TESTS_TESTSERVICE_INT_H
#define KVD_TESTS_TESTSERVICE_INT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvdepot/store.h"
#include "proto/kvd_proto.h"
#include "server/service_int.h"

/* Blocks one helper call handles at most. */
#define KVD_TEST_SVC_MAX 32
/* Object size of the helpers' saves. */
#define KVD_TEST_SVC_OBJ (64u << 10)

typedef struct kvd_test_svc {
    kvd_store_t *store;
    kvd_service_t *svc;
} kvd_test_svc_t;

/* What the service is created with; zeros take the helpers' defaults
 * (TTLs 30 s, tick 10 ms, no tenant or reservation caps, no config
 * entries). */
typedef struct kvd_test_svc_opts {
    uint32_t lease_ttl_ms;
    uint32_t reservation_ttl_ms;
    uint32_t tick_ms;
    uint64_t tenant_max_leased_bytes;
    uint32_t reservation_ttl_max_ms; /* 0: no cap */
    uint64_t max_reserved_bytes;     /* 0: no cap */
    const kvd_service_config_entry_t *config_entries;
    size_t n_config_entries;
    /* A cluster's membership view (Admin cluster_nodes); NULL: alone. */
    size_t (*members)(void *ctx, kvd_member_t *out, size_t max,
                      kvd_membership_stats_t *stats_out);
} kvd_test_svc_opts_t;

/* An 8 MiB arena in 1 MiB chunks, no hugepages, reserve never waits. */
static inline void kvd_test_svc_open(kvd_test_svc_t *t,
                                     const kvd_test_svc_opts_t *o)
{
    kvd_test_svc_opts_t none;
    memset(&none, 0, sizeof none);
    if (o == NULL) {
        o = &none;
    }
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_size", "8m"), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_chunk", "1m"), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_hugepages", "off"),
                     KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_prefault", "false"),
                     KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.reserve_timeout", "0"), KVD_OK);
    char err[256] = "";
    kvd_status_t s = kvd_store_open(cfg, &t->store, err, sizeof err);
    if (s != KVD_OK) {
        fprintf(stderr, "kvd_store_open: %s (%s)\n", kvd_status_str(s), err);
    }
    assert_int_equal(s, KVD_OK);
    kvd_config_destroy(cfg);
    kvd_service_config_t sc = {
        .store = t->store,
        .node_id = "test-node",
        .lease_ttl_ms = o->lease_ttl_ms ? o->lease_ttl_ms : 30000,
        .reservation_ttl_ms =
            o->reservation_ttl_ms ? o->reservation_ttl_ms : 30000,
        .flush_timeout_ms = 1000,
        .verify_commits = true,
        .tenant_max_leased_bytes = o->tenant_max_leased_bytes,
        .reservation_ttl_max_ms = o->reservation_ttl_max_ms,
        .max_reserved_bytes = o->max_reserved_bytes,
        .tick_ms = o->tick_ms ? o->tick_ms : 10,
        .config_entries = o->config_entries,
        .n_config_entries = o->n_config_entries,
        .members = o->members,
    };
    t->svc = NULL;
    assert_int_equal(kvd_service_create(&sc, &t->svc), KVD_OK);
    assert_non_null(t->svc);
}

static inline void kvd_test_svc_close(kvd_test_svc_t *t)
{
    kvd_service_destroy(t->svc);
    kvd_store_close(t->store);
    t->svc = NULL;
    t->store = NULL;
}

static inline kvd_proto_msg_t kvd_test_svc_rsp_type(kvd_rpc_method_t m)
{
    static const kvd_proto_msg_t types[KVD_RPC_COUNT] = {
        KVD_PROTO_MSG_LOOKUP_RESPONSE,  KVD_PROTO_MSG_RESERVE_RESPONSE,
        KVD_PROTO_MSG_COMMIT_RESPONSE,  KVD_PROTO_MSG_ABORT_RESPONSE,
        KVD_PROTO_MSG_RELEASE_RESPONSE, KVD_PROTO_MSG_GET_RESPONSE,
        KVD_PROTO_MSG_PROMOTE_RESPONSE, KVD_PROTO_MSG_STATS_RESPONSE,
        KVD_PROTO_MSG_ADMIN_RESPONSE,   KVD_PROTO_MSG_DELETE_RESPONSE,
    };
    return types[m];
}

static inline kvd_proto_msg_t kvd_test_svc_req_type(kvd_rpc_method_t m)
{
    static const kvd_proto_msg_t types[KVD_RPC_COUNT] = {
        KVD_PROTO_MSG_LOOKUP_REQUEST,  KVD_PROTO_MSG_RESERVE_REQUEST,
        KVD_PROTO_MSG_COMMIT_REQUEST,  KVD_PROTO_MSG_ABORT_REQUEST,
        KVD_PROTO_MSG_RELEASE_REQUEST, KVD_PROTO_MSG_GET_REQUEST,
        KVD_PROTO_MSG_PROMOTE_REQUEST, KVD_PROTO_MSG_STATS_REQUEST,
        KVD_PROTO_MSG_ADMIN_REQUEST,   KVD_PROTO_MSG_DELETE_REQUEST,
    };
    return types[m];
}

/* Calls `method` with `req` (its request type) as `tenant`. On KVD_OK
 * *rsp (may be NULL: dropped) is the unpacked response, for
 * kvd_proto_free; otherwise the service's reason goes to `reason` (may be
 * NULL). */
static inline kvd_status_t
kvd_test_svc_call_why(kvd_test_svc_t *t, kvd_rpc_method_t method,
                      const ProtobufCMessage *req, const char *tenant,
                      ProtobufCMessage **rsp, char *reason, size_t reason_len)
{
    uint8_t *in = NULL, *out = NULL;
    size_t in_len = 0, out_len = 0;
    char why[KVD_PROTO_REASON_MAX] = "";
    kvd_status_t ps = kvd_proto_pack_alloc(kvd_test_svc_req_type(method), req,
                                           &in, &in_len, why, sizeof why);
    if (ps != KVD_OK) {
        fprintf(stderr, "request of %s: %s\n", kvd_rpc_method_name(method),
                why);
    }
    assert_int_equal(ps, KVD_OK);
    kvd_status_t s = kvd_service_call(t->svc, method, in, in_len, tenant, &out,
                                      &out_len, why, sizeof why);
    free(in);
    if (reason != NULL && reason_len > 0) {
        snprintf(reason, reason_len, "%s", why);
    }
    if (s != KVD_OK) {
        return s;
    }
    ProtobufCMessage *msg = NULL;
    assert_int_equal(kvd_proto_unpack(kvd_test_svc_rsp_type(method), out,
                                      out_len, &msg, why, sizeof why),
                     KVD_OK);
    free(out);
    if (rsp != NULL) {
        *rsp = msg;
    } else {
        kvd_proto_free(msg);
    }
    return KVD_OK;
}

static inline kvd_status_t kvd_test_svc_call(kvd_test_svc_t *t,
                                             kvd_rpc_method_t method,
                                             const ProtobufCMessage *req,
                                             const char *tenant,
                                             ProtobufCMessage **rsp)
{
    return kvd_test_svc_call_why(t, method, req, tenant, rsp, NULL, 0);
}

/* Block hash i: 32 bytes derived from i, never all zero. */
static inline kvd_block_hash_t kvd_test_svc_hash(uint32_t i)
{
    kvd_block_hash_t h;
    for (size_t k = 0; k < sizeof h.bytes; k++) {
        h.bytes[k] = (uint8_t)(i * 31u + k * 7u + 1u);
    }
    memcpy(h.bytes, &i, sizeof i);
    return h;
}

/* Request fields for hashes first..first+n-1 (`hashes` and `fields` hold
 * n; the fields point into `hashes`). */
static inline void kvd_test_svc_hash_fields(uint32_t first, size_t n,
                                            kvd_block_hash_t *hashes,
                                            ProtobufCBinaryData *fields)
{
    assert_true(n <= KVD_TEST_SVC_MAX);
    for (size_t i = 0; i < n; i++) {
        hashes[i] = kvd_test_svc_hash(first + (uint32_t)i);
        fields[i].data = hashes[i].bytes;
        fields[i].len = sizeof hashes[i].bytes;
    }
}

static inline ProtobufCBinaryData kvd_test_svc_ns_field(kvd_namespace_t *ns,
                                                        uint8_t b)
{
    memset(ns->bytes, b, sizeof ns->bytes);
    ProtobufCBinaryData f = {.len = sizeof ns->bytes, .data = ns->bytes};
    return f;
}

/* The bytes the helpers save as object i. */
static inline void kvd_test_svc_fill(uint8_t *p, size_t len, uint32_t i)
{
    for (size_t k = 0; k < len; k++) {
        p[k] = (uint8_t)(i * 13u + k);
    }
}

/* Reserves objects first..first+n-1 of KVD_TEST_SVC_OBJ bytes in
 * namespace `nsb` as `tenant`: returns the response (for
 * kvd_proto_free) after asserting the call succeeded. */
static inline kvd_pb_reserve_response_t *
kvd_test_svc_reserve(kvd_test_svc_t *t, uint8_t nsb, uint32_t first, size_t n,
                     uint32_t ttl_ms, const char *tenant)
{
    kvd_block_hash_t hashes[KVD_TEST_SVC_MAX];
    ProtobufCBinaryData fields[KVD_TEST_SVC_MAX];
    kvd_namespace_t ns;
    kvd_test_svc_hash_fields(first, n, hashes, fields);
    kvd_pb_reserve_request_t rq = KVDEPOT__V1__RESERVE_REQUEST__INIT;
    rq.namespace_id = kvd_test_svc_ns_field(&ns, nsb);
    rq.n_block_hashes = n;
    rq.block_hashes = fields;
    rq.object_size_bytes = KVD_TEST_SVC_OBJ;
    rq.ttl_ms = ttl_ms;
    ProtobufCMessage *rsp = NULL;
    assert_int_equal(
        kvd_test_svc_call(t, KVD_RPC_RESERVE, &rq.base, tenant, &rsp), KVD_OK);
    return (kvd_pb_reserve_response_t *)(void *)rsp;
}

/* Commits the RESERVED blocks of `res` after writing their bytes (object
 * i gets kvd_test_svc_fill's bytes), each with its checksum, or a wrong
 * one when `bad_checksum`. Returns the response (kvd_proto_free). */
static inline kvd_pb_commit_response_t *
kvd_test_svc_commit(kvd_test_svc_t *t, const kvd_pb_reserve_response_t *res,
                    bool bad_checksum, const char *tenant)
{
    kvd_pb_commit_entry_t ents[KVD_TEST_SVC_MAX];
    kvd_pb_commit_entry_t *ep[KVD_TEST_SVC_MAX];
    uint64_t sums[KVD_TEST_SVC_MAX];
    size_t n = 0;
    for (size_t i = 0; i < res->n_blocks && n < KVD_TEST_SVC_MAX; i++) {
        const kvd_pb_block_reservation_t *b = res->blocks[i];
        if (b->outcome !=
            KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_RESERVED) {
            continue;
        }
        uint32_t id = 0;
        memcpy(&id, b->block_hash.data, sizeof id);
        uint8_t *p =
            kvd_store_arena_ptr(t->store, b->arena_offset, KVD_TEST_SVC_OBJ);
        assert_non_null(p);
        kvd_test_svc_fill(p, KVD_TEST_SVC_OBJ, id);
        sums[n] = kvd_xxh3_64(p, KVD_TEST_SVC_OBJ) ^ (bad_checksum ? 1u : 0u);
        kvdepot__v1__commit_entry__init(&ents[n]);
        ents[n].block_hash = b->block_hash;
        ents[n].n_layer_checksums = 1;
        ents[n].layer_checksums = &sums[n];
        ep[n] = &ents[n];
        n++;
    }
    kvd_pb_commit_request_t rq = KVDEPOT__V1__COMMIT_REQUEST__INIT;
    rq.reservation_id = res->reservation_id;
    rq.n_entries = n;
    rq.entries = ep;
    ProtobufCMessage *rsp = NULL;
    assert_int_equal(
        kvd_test_svc_call(t, KVD_RPC_COMMIT, &rq.base, tenant, &rsp), KVD_OK);
    return (kvd_pb_commit_response_t *)(void *)rsp;
}

/* Saves objects first..first+n-1 in namespace `nsb` as `tenant`; asserts
 * every one was reserved and committed. */
static inline void kvd_test_svc_save(kvd_test_svc_t *t, uint8_t nsb,
                                     uint32_t first, size_t n,
                                     const char *tenant)
{
    kvd_pb_reserve_response_t *res =
        kvd_test_svc_reserve(t, nsb, first, n, 0, tenant);
    assert_int_equal(res->n_blocks, n);
    kvd_pb_commit_response_t *c = kvd_test_svc_commit(t, res, false, tenant);
    assert_int_equal(c->num_committed, n);
    kvd_proto_commit_response_free(c);
    kvd_proto_reserve_response_free(res);
}

/* Looks up objects first..first+n-1 in namespace `nsb` as `tenant` with
 * lease TTL `ttl_ms` (0: a probe). Returns the response (kvd_proto_free). */
static inline kvd_pb_lookup_response_t *
kvd_test_svc_lookup(kvd_test_svc_t *t, uint8_t nsb, uint32_t first, size_t n,
                    uint32_t ttl_ms, const char *tenant)
{
    kvd_block_hash_t hashes[KVD_TEST_SVC_MAX];
    ProtobufCBinaryData fields[KVD_TEST_SVC_MAX];
    kvd_namespace_t ns;
    kvd_test_svc_hash_fields(first, n, hashes, fields);
    kvd_pb_lookup_request_t rq = KVDEPOT__V1__LOOKUP_REQUEST__INIT;
    rq.namespace_id = kvd_test_svc_ns_field(&ns, nsb);
    rq.n_block_hashes = n;
    rq.block_hashes = fields;
    rq.lease_ttl_ms = ttl_ms;
    ProtobufCMessage *rsp = NULL;
    assert_int_equal(
        kvd_test_svc_call(t, KVD_RPC_LOOKUP, &rq.base, tenant, &rsp), KVD_OK);
    return (kvd_pb_lookup_response_t *)(void *)rsp;
}

/* How many of objects first..first+n-1 a probe finds (nothing leased). */
static inline size_t kvd_test_svc_found(kvd_test_svc_t *t, uint8_t nsb,
                                        uint32_t first, size_t n,
                                        const char *tenant)
{
    kvd_pb_lookup_response_t *r =
        kvd_test_svc_lookup(t, nsb, first, n, 0, tenant);
    size_t m = r->n_locations;
    assert_int_equal(r->lease_id, 0);
    kvd_proto_lookup_response_free(r);
    return m;
}

/* Release of one lease id as `tenant`: how many were released. */
static inline uint32_t kvd_test_svc_release(kvd_test_svc_t *t, uint64_t id,
                                            const char *tenant)
{
    kvd_pb_release_request_t rq = KVDEPOT__V1__RELEASE_REQUEST__INIT;
    rq.n_lease_ids = 1;
    rq.lease_ids = &id;
    ProtobufCMessage *rsp = NULL;
    assert_int_equal(
        kvd_test_svc_call(t, KVD_RPC_RELEASE, &rq.base, tenant, &rsp), KVD_OK);
    uint32_t n = ((kvd_pb_release_response_t *)(void *)rsp)->num_released;
    kvd_proto_free(rsp);
    return n;
}

/* Polls the service's stats until `cond` holds or ~5 s pass (the
 * housekeeping thread acts on its own tick). */
#define KVD_TEST_SVC_WAIT(t, st, cond)                                         \
    do {                                                                       \
        for (int wait_i_ = 0; wait_i_ < 500; wait_i_++) {                      \
            kvd_service_stats((t)->svc, &(st));                                \
            if (cond) {                                                        \
                break;                                                         \
            }                                                                  \
            struct timespec ts_ = {.tv_sec = 0, .tv_nsec = 10 * 1000 * 1000};  \
            nanosleep(&ts_, NULL);                                             \
        }                                                                      \
    } while (0)

#endif /* KVD_TESTS_TESTSERVICE_INT_H */
