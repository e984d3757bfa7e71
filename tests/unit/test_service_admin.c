/*
 * kvdepotd's operator methods (server/service_admin.c and the dispatch in
 * service.c), driven in-process: Admin ping, config_dump, drain,
 * list_namespaces, drop_namespace and drop_tenant, Delete and Stats, each
 * as an operator and as a caller bound to a tenant (who sees and drops
 * its own objects only, gets its own tenant's Stats, and is refused the
 * daemon-wide operations); bad calls are refused and counted by status;
 * cluster_nodes alone and with a (stale) membership view; the key events
 * a caller reads (Admin events).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/time_int.h"
#include "tests/unit/kvd_testservice_int.h"

#define NS 0x44
#define NS2 0x45
#define TA "team-a"
#define TB "team-b"

static const kvd_service_config_entry_t g_config[] = {
    {"store.arena_size", "8m", "call"},
    {"server.token", "<redacted>", "env"},
};

static int setup(void **state)
{
    static kvd_test_svc_t t;
    kvd_test_svc_opts_t o = {.config_entries = g_config, .n_config_entries = 2};
    kvd_test_svc_open(&t, &o);
    *state = &t;
    return 0;
}

static int teardown(void **state)
{
    kvd_test_svc_close(*state);
    return 0;
}

/* Calls Admin with `rq` as `tenant`; on KVD_OK the response is returned
 * (kvd_proto_free), else NULL and the status in *status. */
static kvd_pb_admin_response_t *admin(kvd_test_svc_t *t,
                                      kvd_pb_admin_request_t *rq,
                                      const char *tenant, kvd_status_t *status)
{
    ProtobufCMessage *msg = NULL;
    *status = kvd_test_svc_call(t, KVD_RPC_ADMIN, &rq->base, tenant, &msg);
    return (kvd_pb_admin_response_t *)(void *)msg;
}

static void test_ping(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_pb_ping_t p = KVDEPOT__V1__PING__INIT;
    kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_PING;
    rq.ping = &p;
    kvd_status_t s;
    kvd_pb_admin_response_t *r = admin(t, &rq, TA, &s);
    assert_int_equal(s, KVD_OK);
    assert_int_equal(r->result_case, KVDEPOT__V1__ADMIN_RESPONSE__RESULT_PING);
    assert_string_equal(r->ping->node_id, "test-node");
    assert_string_equal(r->ping->version, kvd_version());
    assert_int_equal(r->ping->protocol_major, KVD_PROTO_MAJOR);
    assert_int_equal(r->ping->protocol_revision, KVD_PROTO_REVISION);
    kvd_proto_admin_response_free(r);
}

/* config_dump answers the entries the daemon gave, to operators only. */
static void test_config_dump(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_pb_config_dump_t d = KVDEPOT__V1__CONFIG_DUMP__INIT;
    kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_CONFIG_DUMP;
    rq.config_dump = &d;
    kvd_status_t s;
    kvd_pb_admin_response_t *r = admin(t, &rq, NULL, &s);
    assert_int_equal(s, KVD_OK);
    assert_int_equal(r->config_dump->n_entries, 2);
    for (size_t i = 0; i < 2; i++) {
        assert_string_equal(r->config_dump->entries[i]->key, g_config[i].key);
        assert_string_equal(r->config_dump->entries[i]->value,
                            g_config[i].value);
        assert_string_equal(r->config_dump->entries[i]->source,
                            g_config[i].source);
    }
    kvd_proto_admin_response_free(r);
    assert_null(admin(t, &rq, TA, &s));
    assert_int_equal(s, KVD_ERR_AUTH);
}

/* drain switches the mode and answers what is still open; a tenant may
 * not. */
static void test_drain(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_test_svc_save(t, NS, 0, 2, NULL);
    kvd_pb_lookup_response_t *l = kvd_test_svc_lookup(t, NS, 0, 2, 5000, NULL);
    kvd_pb_reserve_response_t *res = kvd_test_svc_reserve(t, NS, 7, 1, 0, NULL);

    kvd_pb_drain_t d = KVDEPOT__V1__DRAIN__INIT;
    d.enable = true;
    kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_DRAIN;
    rq.drain = &d;
    kvd_status_t s;
    assert_null(admin(t, &rq, TA, &s));
    assert_int_equal(s, KVD_ERR_AUTH);
    assert_false(kvd_service_draining(t->svc));

    kvd_pb_admin_response_t *r = admin(t, &rq, NULL, &s);
    assert_int_equal(s, KVD_OK);
    assert_true(r->drain->draining);
    assert_int_equal(r->drain->active_leases, 1);
    assert_int_equal(r->drain->active_reservations, 1);
    assert_true(kvd_service_draining(t->svc));
    kvd_proto_admin_response_free(r);

    d.enable = false;
    r = admin(t, &rq, NULL, &s);
    assert_int_equal(s, KVD_OK);
    assert_false(r->drain->draining);
    assert_false(kvd_service_draining(t->svc));
    kvd_proto_admin_response_free(r);
    assert_int_equal(kvd_test_svc_release(t, l->lease_id, NULL), 1);
    kvd_proto_lookup_response_free(l);
    kvd_proto_reserve_response_free(res);
}

static kvd_pb_admin_response_t *list(kvd_test_svc_t *t, const char *tenant)
{
    kvd_pb_list_namespaces_t ln = KVDEPOT__V1__LIST_NAMESPACES__INIT;
    kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_LIST_NAMESPACES;
    rq.list_namespaces = &ln;
    kvd_status_t s;
    kvd_pb_admin_response_t *r = admin(t, &rq, tenant, &s);
    assert_int_equal(s, KVD_OK);
    return r;
}

/* list_namespaces: objects and bytes per namespace and per tenant; a
 * tenant sees its own only. */
static void test_list_namespaces(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_test_svc_save(t, NS, 0, 3, NULL);
    kvd_test_svc_save(t, NS2, 0, 1, NULL);
    kvd_test_svc_save(t, NS, 0, 2, TA);

    kvd_pb_admin_response_t *r = list(t, NULL);
    const kvd_pb_list_namespaces_reply_t *ls = r->list_namespaces;
    assert_false(ls->truncated);
    /* NS and NS2 of the operator, and team-a's own copy of NS. */
    assert_int_equal(ls->n_namespaces, 3);
    size_t objects = 0;
    for (size_t i = 0; i < ls->n_namespaces; i++) {
        const kvd_pb_namespace_usage_t *u = ls->namespaces[i];
        assert_int_equal(u->bytes, (u->host_objects + u->disk_objects) *
                                       KVD_TEST_SVC_OBJ);
        objects += u->host_objects;
        if (u->namespace_id.data[0] == NS && u->namespace_id.data[1] == NS) {
            assert_int_equal(u->host_objects, 3);
        }
    }
    assert_int_equal(objects, 6);
    assert_int_equal(ls->n_tenants, 2);
    kvd_proto_admin_response_free(r);

    r = list(t, TA);
    ls = r->list_namespaces;
    assert_int_equal(ls->n_namespaces, 1);
    assert_int_equal(ls->namespaces[0]->host_objects, 2);
    assert_int_equal(ls->n_tenants, 1);
    assert_int_equal(ls->tenants[0]->tenant_id, kvd_service_tenant_id(TA));
    assert_int_equal(ls->tenants[0]->objects, 2);
    kvd_proto_admin_response_free(r);

    r = list(t, TB);
    assert_int_equal(r->list_namespaces->n_namespaces, 0);
    kvd_proto_admin_response_free(r);
}

static uint64_t drop_namespace(kvd_test_svc_t *t, uint8_t nsb,
                               const char *tenant)
{
    kvd_namespace_t ns;
    kvd_pb_drop_namespace_t dn = KVDEPOT__V1__DROP_NAMESPACE__INIT;
    dn.namespace_id = kvd_test_svc_ns_field(&ns, nsb);
    kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_DROP_NAMESPACE;
    rq.drop_namespace = &dn;
    kvd_status_t s;
    kvd_pb_admin_response_t *r = admin(t, &rq, tenant, &s);
    assert_int_equal(s, KVD_OK);
    uint64_t n = r->drop_namespace->num_objects_dropped;
    kvd_proto_admin_response_free(r);
    return n;
}

/* drop_namespace deletes a namespace's objects but not leased ones, and
 * a tenant drops only its own copy. */
static void test_drop_namespace(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_test_svc_save(t, NS, 0, 3, NULL);
    kvd_test_svc_save(t, NS2, 0, 2, NULL);
    kvd_test_svc_save(t, NS, 0, 2, TA);
    kvd_test_svc_save(t, NS, 0, 2, TB);

    /* Object 0 of the operator's NS is leased: it stays. */
    kvd_pb_lookup_response_t *l = kvd_test_svc_lookup(t, NS, 0, 1, 5000, NULL);
    assert_int_equal(drop_namespace(t, NS, NULL), 2);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 3, NULL), 1);
    assert_int_equal(kvd_test_svc_found(t, NS2, 0, 2, NULL), 2);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 2, TA), 2);
    assert_int_equal(kvd_test_svc_release(t, l->lease_id, NULL), 1);
    kvd_proto_lookup_response_free(l);

    assert_int_equal(drop_namespace(t, NS, TA), 2);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 2, TA), 0);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 2, TB), 2);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 1, NULL), 1);
}

static kvd_pb_admin_response_t *drop_tenant(kvd_test_svc_t *t, const char *name,
                                            const char *tenant, kvd_status_t *s)
{
    kvd_pb_drop_tenant_t dt = KVDEPOT__V1__DROP_TENANT__INIT;
    dt.tenant = (char *)name;
    kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_DROP_TENANT;
    rq.drop_tenant = &dt;
    return admin(t, &rq, tenant, s);
}

/* drop_tenant deletes every object a tenant saved; a tenant may name only
 * itself (or nobody, meaning itself). */
static void test_drop_tenant(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_test_svc_save(t, NS, 0, 2, TA);
    kvd_test_svc_save(t, NS2, 0, 1, TA);
    kvd_test_svc_save(t, NS, 0, 3, TB);
    kvd_test_svc_save(t, NS, 0, 1, NULL);

    kvd_status_t s;
    assert_null(drop_tenant(t, TA, TB, &s));
    assert_int_equal(s, KVD_ERR_AUTH);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 2, TA), 2);

    kvd_pb_admin_response_t *r = drop_tenant(t, TA, NULL, &s);
    assert_int_equal(s, KVD_OK);
    assert_int_equal(r->drop_tenant->num_objects_dropped, 3);
    kvd_proto_admin_response_free(r);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 2, TA), 0);
    assert_int_equal(kvd_test_svc_found(t, NS2, 0, 1, TA), 0);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 3, TB), 3);

    r = drop_tenant(t, "", TB, &s);
    assert_int_equal(s, KVD_OK);
    assert_int_equal(r->drop_tenant->num_objects_dropped, 3);
    kvd_proto_admin_response_free(r);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 3, TB), 0);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 1, NULL), 1);
}

static kvd_status_t delete_keys(kvd_test_svc_t *t, uint8_t nsb, uint32_t first,
                                size_t n, const char *tenant,
                                kvd_pb_delete_response_t **out)
{
    kvd_block_hash_t h[KVD_TEST_SVC_MAX];
    ProtobufCBinaryData f[KVD_TEST_SVC_MAX];
    kvd_namespace_t ns;
    kvd_test_svc_hash_fields(first, n, h, f);
    kvd_pb_delete_request_t rq = KVDEPOT__V1__DELETE_REQUEST__INIT;
    rq.namespace_id = kvd_test_svc_ns_field(&ns, nsb);
    rq.n_block_hashes = n;
    rq.block_hashes = f;
    ProtobufCMessage *msg = NULL;
    kvd_status_t s =
        kvd_test_svc_call(t, KVD_RPC_DELETE, &rq.base, tenant, &msg);
    *out = (kvd_pb_delete_response_t *)(void *)msg;
    return s;
}

/* Delete by key is for operators; a leased key stays and makes the
 * answer say busy. */
static void test_delete(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_test_svc_save(t, NS, 0, 3, NULL);
    kvd_pb_delete_response_t *r = NULL;
    assert_int_equal(delete_keys(t, NS, 0, 1, TA, &r), KVD_ERR_AUTH);
    assert_null(r);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 3, NULL), 3);

    kvd_pb_lookup_response_t *l = kvd_test_svc_lookup(t, NS, 2, 1, 5000, NULL);
    assert_int_equal(delete_keys(t, NS, 1, 2, NULL, &r), KVD_OK);
    assert_int_equal(r->num_deleted, 1);
    assert_true(r->busy);
    kvd_proto_delete_response_free(r);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 3, NULL), 1);
    assert_int_equal(kvd_test_svc_release(t, l->lease_id, NULL), 1);
    kvd_proto_lookup_response_free(l);

    assert_int_equal(delete_keys(t, NS, 0, 3, NULL, &r), KVD_OK);
    assert_int_equal(r->num_deleted, 2);
    assert_false(r->busy);
    kvd_proto_delete_response_free(r);
    assert_int_equal(kvd_test_svc_found(t, NS, 0, 1, NULL), 0);
}

static kvd_pb_stats_response_t *stats_as(kvd_test_svc_t *t, const char *tenant)
{
    kvd_pb_stats_request_t rq = KVDEPOT__V1__STATS_REQUEST__INIT;
    ProtobufCMessage *msg = NULL;
    assert_int_equal(
        kvd_test_svc_call(t, KVD_RPC_STATS, &rq.base, tenant, &msg), KVD_OK);
    return (kvd_pb_stats_response_t *)(void *)msg;
}

static kvd_pb_stats_response_t *stats(kvd_test_svc_t *t)
{
    return stats_as(t, NULL);
}

/* Stats: the host tier's objects, and the leases and reservations open. */
static void test_stats(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_test_svc_save(t, NS, 0, 3, NULL);
    kvd_pb_lookup_response_t *l = kvd_test_svc_lookup(t, NS, 0, 2, 5000, NULL);
    kvd_pb_stats_response_t *r = stats(t);
    assert_int_equal(r->n_tiers, 1); /* no disk tier configured */
    assert_int_equal(r->tiers[0]->tier, KVDEPOT__V1__TIER__TIER_HOST);
    assert_int_equal(r->tiers[0]->capacity_bytes, 8u << 20);
    assert_int_equal(r->tiers[0]->num_objects, 3);
    assert_int_equal(r->active_leases, 1);
    assert_int_equal(r->active_reservations, 0);
    kvd_proto_stats_response_free(r);

    kvd_pb_reserve_response_t *res = kvd_test_svc_reserve(t, NS, 9, 1, 0, NULL);
    assert_int_equal(kvd_test_svc_release(t, l->lease_id, NULL), 1);
    r = stats(t);
    assert_int_equal(r->active_leases, 0);
    assert_int_equal(r->active_reservations, 1);
    kvd_proto_stats_response_free(r);
    kvd_proto_lookup_response_free(l);
    kvd_proto_reserve_response_free(res);
}

#define STATS_CALLS 1000

/* Stats for a caller bound to a tenant: its own tenant's figures only.
 * Team A saves and reads; team B sees none of it (no objects, bytes,
 * hits, misses or leases), team A sees exactly its own, the operator
 * sees everyone's. */
static void test_stats_per_tenant(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_test_svc_save(t, NS, 0, 3, TA);
    kvd_test_svc_save(t, NS, 10, 1, NULL);
    /* 3 of 5 found: 3 hits and one miss, one lease open. */
    kvd_pb_lookup_response_t *l = kvd_test_svc_lookup(t, NS, 0, 5, 5000, TA);
    kvd_pb_reserve_response_t *res = kvd_test_svc_reserve(t, NS, 20, 1, 0, TA);

    kvd_pb_stats_response_t *r = stats_as(t, TB);
    assert_int_equal(r->n_tiers, 1);
    const kvd_pb_tier_stats_t *h = r->tiers[0];
    assert_int_equal(h->num_objects, 0);
    assert_string_equal(r->tenant, TB);
    assert_int_equal(h->used_bytes, 0);
    assert_int_equal(h->hits, 0);
    assert_int_equal(h->misses, 0);
    assert_int_equal(h->capacity_bytes, 8u << 20); /* what it may fill */
    assert_int_equal(r->active_leases, 0);
    assert_int_equal(r->active_reservations, 0);
    kvd_proto_stats_response_free(r);

    r = stats_as(t, TA);
    assert_string_equal(r->tenant, TA);
    h = r->tiers[0];
    assert_int_equal(h->num_objects, 4); /* 3 saved, 1 reserved */
    assert_int_equal(h->used_bytes, 4 * KVD_TEST_SVC_OBJ);
    assert_int_equal(h->hits, 3);
    assert_int_equal(h->misses, 1);
    assert_int_equal(r->active_leases, 1);
    assert_int_equal(r->active_reservations, 1);
    kvd_proto_stats_response_free(r);

    r = stats(t);
    assert_string_equal(r->tenant, "");
    assert_int_equal(r->tiers[0]->num_objects, 5);
    assert_int_equal(r->tiers[0]->hits, 3);
    assert_int_equal(r->active_leases, 1);
    kvd_proto_stats_response_free(r);

    /* What a tenant's Stats costs (it walks the lease and reservation
     * tables under the service's lock): a figure for docs/reliability.md. */
    uint64_t t0 = kvd_time_now_ns();
    for (int i = 0; i < STATS_CALLS; i++) {
        kvd_proto_stats_response_free(stats_as(t, TB));
    }
    fprintf(stderr, "tenant Stats: %llu ns per call\n",
            (unsigned long long)((kvd_time_now_ns() - t0) / STATS_CALLS));
    kvd_proto_lookup_response_free(l);
    kvd_proto_reserve_response_free(res);
}

/* Refused calls: a bad method, bytes that are no request, an admin
 * request without an op; each counted under its status and method. */
/* A view of three nodes, stale, for cluster_nodes. */
static size_t fake_members(void *ctx, kvd_member_t *out, size_t max,
                           kvd_membership_stats_t *stats_out)
{
    (void)ctx;
    static const char *const ids[] = {"node-a", "node-b", "test-node"};
    for (size_t i = 0; i < 3 && i < max; i++) {
        memset(&out[i], 0, sizeof out[i]);
        snprintf(out[i].node_id, sizeof out[i].node_id, "%s", ids[i]);
        snprintf(out[i].grpc_address, sizeof out[i].grpc_address,
                 "10.0.0.%zu:7000", i + 1);
        snprintf(out[i].version, sizeof out[i].version, "0.1.0");
        out[i].capacity_bytes = (uint64_t)(i + 1) << 30;
        out[i].protocol_revision = 7;
        out[i].ucx_address_len = i == 1 ? 0 : 16;
    }
    if (stats_out != NULL) { /* may be NULL (kvd_membership_view) */
        stats_out->stale = true;
        stats_out->registered = true;
        stats_out->generation = 9;
        stats_out->num_nodes = 3;
    }
    return 3;
}

static kvd_pb_admin_response_t *
cluster_call(kvd_test_svc_t *t, const char *tenant, kvd_status_t *s)
{
    kvd_pb_cluster_nodes_t op = KVDEPOT__V1__CLUSTER_NODES__INIT;
    kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_CLUSTER_NODES;
    rq.cluster_nodes = &op;
    return admin(t, &rq, tenant, s);
}

static void test_cluster_nodes(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_status_t s;
    kvd_pb_admin_response_t *r = cluster_call(t, NULL, &s);
    assert_int_equal(s, KVD_OK);
    assert_false(r->cluster_nodes->clustered);
    assert_int_equal(r->cluster_nodes->n_nodes, 0);
    kvd_proto_admin_response_free(r);
    assert_null(cluster_call(t, TA, &s));
    assert_int_equal(s, KVD_ERR_AUTH);

    kvd_test_svc_t c;
    kvd_test_svc_opts_t o = {.members = fake_members};
    kvd_test_svc_open(&c, &o);
    r = cluster_call(&c, NULL, &s);
    assert_int_equal(s, KVD_OK);
    const kvd_pb_cluster_nodes_reply_t *v = r->cluster_nodes;
    assert_true(v->clustered && v->stale && v->registered);
    assert_false(v->truncated);
    assert_int_equal(v->generation, 9);
    assert_string_equal(v->self_node_id, "test-node");
    assert_int_equal(v->n_nodes, 3);
    assert_string_equal(v->nodes[1]->node_id, "node-b");
    assert_string_equal(v->nodes[1]->grpc_address, "10.0.0.2:7000");
    assert_false(v->nodes[1]->ucx);
    assert_true(v->nodes[2]->ucx);
    assert_int_equal(v->nodes[2]->capacity_bytes, UINT64_C(3) << 30);
    assert_int_equal(v->nodes[0]->protocol_revision, 7);
    kvd_proto_admin_response_free(r);
    kvd_test_svc_close(&c);
}

/* pin: an operator pins stored objects (absent ones counted apart); a
 * caller bound to a tenant may not. */
static void test_pin(void **state)
{
    kvd_test_svc_t *t = *state;
    kvd_test_svc_save(t, NS, 0, 1, NULL); /* hash 0 stored, hash 1 not */
    kvd_namespace_t ns;
    kvd_block_hash_t h[2];
    ProtobufCBinaryData hashes[2];
    kvd_test_svc_hash_fields(0, 2, h, hashes);
    kvd_pb_pin_t op = KVDEPOT__V1__PIN__INIT;
    op.namespace_id = kvd_test_svc_ns_field(&ns, NS);
    op.n_block_hashes = 2;
    op.block_hashes = hashes;
    op.pinned = true;
    kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_PIN;
    rq.pin = &op;
    kvd_status_t s;
    kvd_pb_admin_response_t *r = admin(t, &rq, NULL, &s);
    assert_int_equal(s, KVD_OK);
    assert_int_equal(r->pin->num_done, 1);
    assert_int_equal(r->pin->num_missing, 1);
    assert_false(r->pin->quota_reached);
    kvd_proto_admin_response_free(r);
    assert_null(admin(t, &rq, TA, &s));
    assert_int_equal(s, KVD_ERR_AUTH);
}

/* Admin events as `tenant` for namespaces nsb[0..n_ns) after `after`. */
static kvd_pb_admin_response_t *events(kvd_test_svc_t *t, const uint8_t *nsb,
                                       size_t n_ns, uint64_t after,
                                       uint32_t max, const char *tenant)
{
    kvd_namespace_t ns[4];
    ProtobufCBinaryData ids[4];
    for (size_t i = 0; i < n_ns; i++) {
        ids[i] = kvd_test_svc_ns_field(&ns[i], nsb[i]);
    }
    kvd_pb_events_t op = KVDEPOT__V1__EVENTS__INIT;
    op.n_namespace_ids = n_ns;
    op.namespace_ids = ids;
    op.after_seq = after;
    op.max_events = max;
    kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_EVENTS;
    rq.events = &op;
    kvd_status_t s;
    kvd_pb_admin_response_t *r = admin(t, &rq, tenant, &s);
    assert_int_equal(s, KVD_OK);
    return r;
}

/* Event i of r is a store (or removal) of hash `idx` of namespace
 * index `nsi`. */
static void assert_event(const kvd_pb_admin_response_t *r, size_t i,
                         uint32_t nsi, uint32_t idx, bool removed)
{
    kvd_block_hash_t h[1];
    ProtobufCBinaryData f[1];
    kvd_test_svc_hash_fields(idx, 1, h, f);
    assert_true(i < r->events->n_events);
    const kvd_pb_store_event_t *e = r->events->events[i];
    assert_int_equal(e->namespace_index, nsi);
    assert_int_equal(e->removed, removed);
    assert_memory_equal(e->block_hash.data, h[0].bytes, KVD_SHA256_BYTES);
}

/* events: from the first call on, commits and removals of the namespaces
 * a caller names, numbered, read on from the last number seen, in pages
 * of max_events; a tenant names its own namespaces and sees its copies
 * only. */
static void test_events(void **state)
{
    kvd_test_svc_t *t = *state;
    const uint8_t ns1[] = {NS}, both[] = {NS2, NS};
    kvd_test_svc_save(t, NS, 10, 1, NULL); /* before the first call */
    kvd_pb_admin_response_t *r = events(t, ns1, 1, UINT64_MAX, 0, NULL);
    assert_int_equal(r->events->n_events, 0);
    uint64_t start = r->events->next_seq;
    kvd_proto_admin_response_free(r);

    kvd_test_svc_save(t, NS, 0, 3, NULL);
    kvd_test_svc_save(t, NS2, 0, 2, NULL);
    kvd_test_svc_save(t, NS, 0, 2, TA);
    r = events(t, ns1, 1, start, 0, NULL);
    assert_int_equal(r->events->n_events, 3);
    for (uint32_t i = 0; i < 3; i++) {
        assert_event(r, i, 0, i, false);
    }
    assert_int_equal(r->events->missed, 0);
    assert_int_equal(r->events->next_seq, start + 7);
    kvd_proto_admin_response_free(r);

    /* Two namespaces: each event names its index in the request. */
    r = events(t, both, 2, start, 0, NULL);
    assert_int_equal(r->events->n_events, 5);
    assert_event(r, 3, 0, 0, false);
    assert_event(r, 4, 0, 1, false);
    kvd_proto_admin_response_free(r);

    /* team-a names NS and gets its own two. */
    r = events(t, ns1, 1, start, 0, TA);
    assert_int_equal(r->events->n_events, 2);
    assert_event(r, 1, 0, 1, false);
    kvd_proto_admin_response_free(r);

    /* Pages of one: next_seq is the last event returned. */
    r = events(t, ns1, 1, start, 1, NULL);
    assert_int_equal(r->events->n_events, 1);
    assert_event(r, 0, 0, 0, false);
    uint64_t next = r->events->next_seq;
    kvd_proto_admin_response_free(r);
    r = events(t, ns1, 1, next, 1, NULL);
    assert_event(r, 0, 0, 1, false);
    kvd_proto_admin_response_free(r);

    /* A delete is a removal; the reader who saw everything gets only it. */
    kvd_pb_delete_response_t *d = NULL;
    assert_int_equal(delete_keys(t, NS, 0, 1, NULL, &d), KVD_OK);
    kvd_proto_delete_response_free(d);
    r = events(t, ns1, 1, start + 7, 0, NULL);
    assert_int_equal(r->events->n_events, 1);
    assert_event(r, 0, 0, 0, true);
    assert_int_equal(r->events->next_seq, start + 8);
    kvd_proto_admin_response_free(r);

    /* No namespace: no events, only the newest number. */
    r = events(t, ns1, 0, start, 0, NULL);
    assert_int_equal(r->events->n_events, 0);
    assert_int_equal(r->events->next_seq, start + 8);
    kvd_proto_admin_response_free(r);
}

static void test_refused_calls(void **state)
{
    kvd_test_svc_t *t = *state;
    uint8_t *out = NULL;
    size_t out_len = 0;
    char why[KVD_PROTO_REASON_MAX];
    assert_int_equal(kvd_service_call(t->svc, KVD_RPC_COUNT, NULL, 0, NULL,
                                      &out, &out_len, why, sizeof why),
                     KVD_ERR_INVALID);
    static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff};
    assert_int_equal(kvd_service_call(t->svc, KVD_RPC_LOOKUP, junk, sizeof junk,
                                      NULL, &out, &out_len, why, sizeof why),
                     KVD_ERR_PROTO);
    assert_true(why[0] != '\0');
    assert_null(out);
    kvd_service_count_refused(t->svc, KVD_ERR_AUTH);

    kvd_service_stats_t st;
    kvd_service_stats(t->svc, &st);
    assert_int_equal(st.methods[KVD_RPC_LOOKUP].calls, 1);
    assert_int_equal(st.methods[KVD_RPC_LOOKUP].errors, 1);
    assert_int_equal(st.errors_by_status[-KVD_ERR_PROTO], 1);
    assert_int_equal(st.errors_by_status[-KVD_ERR_AUTH], 1);
    /* Every call lands in the +Inf bucket. */
    assert_int_equal(st.methods[KVD_RPC_LOOKUP]
                         .latency_buckets[KVD_SERVICE_LATENCY_BUCKETS - 1],
                     1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_dump, setup, teardown),
        cmocka_unit_test_setup_teardown(test_drain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_namespaces, setup, teardown),
        cmocka_unit_test_setup_teardown(test_drop_namespace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_drop_tenant, setup, teardown),
        cmocka_unit_test_setup_teardown(test_delete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stats, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stats_per_tenant, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_calls, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cluster_nodes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_events, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
