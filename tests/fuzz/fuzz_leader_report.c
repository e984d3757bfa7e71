/*
 * Fuzz target for the leader's report intake
 * (kvd_leader_update_connector_output): a worker's WorkerReport bytes,
 * untrusted. The leader holds one request with an asynchronous load (block
 * leases taken) and planned saves, named "r" as the seeds name it; the
 * input is applied as a report, then the request ends. Whatever the bytes,
 * nothing may crash and every lease the store handed out must come back.
 *
 * Seeds in corpus/leader_report/ are WorkerReports packed with
 * kvd_proto_worker_report_pack_alloc (finished saves, finished loads,
 * failed loads for "r") and copies of corpus/worker_report/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvdepot/leader.h"
#include "store/ops.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static long fuzz_leases;

static kvd_status_t fuzz_lookup(kvd_store_t *ctx, const kvd_namespace_t *ns,
                                const kvd_block_hash_t *hashes, size_t n,
                                const char *source, kvd_store_lease_t *out,
                                size_t *matched)
{
    (void)ctx;
    (void)source;
    for (size_t i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        out[i].key.ns = *ns;
        out[i].key.hash = hashes[i];
        out[i].tier = KVD_STORE_TIER_DISK;
    }
    fuzz_leases += (long)n;
    *matched = n;
    return KVD_OK;
}

static kvd_status_t fuzz_release(kvd_store_t *ctx, const kvd_store_lease_t *l,
                                 size_t n)
{
    (void)ctx;
    (void)l;
    fuzz_leases -= (long)n;
    return KVD_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvd_leader_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.block_size = 4;
    cfg.num_workers = 1;
    static const kvd_store_ops_t ops = {
        .name = "fuzz", .lookup = fuzz_lookup, .release = fuzz_release};
    static kvd_store_t store = {.ops = &ops};
    kvd_leader_t *ld = NULL;
    if (kvd_leader_create(&cfg, &store, &ld) != KVD_OK) {
        abort();
    }
    uint32_t tok[20], blocks[5] = {0, 1, 2, 3, 4};
    for (uint32_t i = 0; i < 20; i++) {
        tok[i] = i;
    }
    kvd_leader_request_t q = {
        .request_id = "r", .tokens = tok, .num_tokens = 20};
    uint64_t m = 0;
    bool async = false;
    uint8_t *plan = NULL;
    size_t len = 0;
    if (kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &async) !=
            KVD_OK ||
        kvd_leader_update_state_after_alloc(ld, "r", blocks, 5, m) != KVD_OK ||
        kvd_leader_request_scheduled(ld, "r", NULL, 0, NULL, 0, NULL, 0, 20) !=
            KVD_OK ||
        kvd_leader_build_connector_meta(ld, &plan, &len) != KVD_OK) {
        abort();
    }
    free(plan);
    (void)kvd_leader_update_connector_output(ld, data, size);
    uint32_t failed[8];
    const char *done[8];
    (void)kvd_leader_take_failed_blocks(ld, failed, 8);
    (void)kvd_leader_take_finished_loads(ld, done, 8);
    bool delay = false;
    kvd_status_t s = kvd_leader_request_finished(ld, "r", &delay);
    if (s != KVD_OK && s != KVD_ERR_NOT_FOUND) {
        abort();
    }
    kvd_leader_destroy(ld);
    if (fuzz_leases != 0) {
        abort(); /* a lease leaked or was given back twice */
    }
    return 0;
}
