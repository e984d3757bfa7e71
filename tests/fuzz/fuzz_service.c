/*
 * Fuzz target for kvdepotd's request handlers, driven in-process without
 * gRPC (server/service_int.h): the first byte picks the method, the
 * rest is the request body exactly as a client sends it. One embedded store
 * and one service live for the whole run, so requests act on the state
 * earlier ones left (leases, reservations, stored objects). Any crash,
 * sanitizer report or invalid response is a finding; responses must
 * unpack as their type.
 */
#include <stdint.h>
#include <stdlib.h>

#include "kvdepot/store.h"
#include "proto/kvd_proto.h"
#include "server/service_int.h"

/* libFuzzer's fixed entry point name. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); // NOLINT

static kvd_store_t *g_store;
static kvd_service_t *g_svc;

static const kvd_proto_msg_t rsp_type[KVD_RPC_COUNT] = {
    KVD_PROTO_MSG_LOOKUP_RESPONSE,  KVD_PROTO_MSG_RESERVE_RESPONSE,
    KVD_PROTO_MSG_COMMIT_RESPONSE,  KVD_PROTO_MSG_ABORT_RESPONSE,
    KVD_PROTO_MSG_RELEASE_RESPONSE, KVD_PROTO_MSG_GET_RESPONSE,
    KVD_PROTO_MSG_PROMOTE_RESPONSE, KVD_PROTO_MSG_STATS_RESPONSE,
    KVD_PROTO_MSG_ADMIN_RESPONSE,   KVD_PROTO_MSG_DELETE_RESPONSE,
};

/* What Admin config_dump answers with (the daemon fills it from its
 * settings). */
static const kvd_service_config_entry_t g_config[] = {
    {"store.arena_size", "8m", "call"},
    {"server.token", "<redacted>", "env"},
    {"server.node_id", "", "default"},
};

static void fuzz_setup(void)
{
    kvd_config_t *cfg = NULL;
    if (kvd_config_create(&cfg) != KVD_OK) {
        abort();
    }
    (void)kvd_config_set(cfg, "store.arena_size", "8m");
    (void)kvd_config_set(cfg, "store.arena_chunk", "1m");
    (void)kvd_config_set(cfg, "store.arena_hugepages", "off");
    (void)kvd_config_set(cfg, "store.arena_prefault", "false");
    (void)kvd_config_set(cfg, "store.reserve_timeout", "0");
    if (kvd_store_open(cfg, &g_store, NULL, 0) != KVD_OK) {
        abort();
    }
    kvd_config_destroy(cfg);
    kvd_service_config_t sc = {.store = g_store,
                               .node_id = "fuzz",
                               .lease_ttl_ms = 1000,
                               .reservation_ttl_ms = 1000,
                               .flush_timeout_ms = 100,
                               .verify_commits = true,
                               .tick_ms = 10,
                               .config_entries = g_config,
                               .n_config_entries = 3};
    if (kvd_service_create(&sc, &g_svc) != KVD_OK) {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (g_svc == NULL) {
        fuzz_setup();
    }
    if (size == 0) {
        return 0;
    }
    kvd_rpc_method_t m = (kvd_rpc_method_t)(data[0] % KVD_RPC_COUNT);
    /* The high bit: a caller bound to a tenant by its credentials. */
    const char *tenant = (data[0] & 0x80) != 0 ? "fuzz-tenant" : NULL;
    uint8_t *rsp = NULL;
    size_t len = 0;
    char reason[KVD_PROTO_REASON_MAX];
    kvd_status_t s =
        kvd_service_call(g_svc, m, size > 1 ? data + 1 : NULL, size - 1, tenant,
                         &rsp, &len, reason, sizeof reason);
    if (s == KVD_ERR_INTERNAL) {
        abort(); /* the service built an invalid response */
    }
    if (s == KVD_OK) {
        ProtobufCMessage *msg = NULL;
        if (kvd_proto_unpack(rsp_type[m], rsp, len, &msg, reason,
                             sizeof reason) != KVD_OK) {
            abort();
        }
        kvd_proto_free(msg);
        free(rsp);
    }
    return 0;
}
