/*
 * Fuzz target for the worker's plan intake (kvd_worker_bind_metadata): a
 * StepPlan's bytes, untrusted. One embedded store (arena only) and one
 * worker on a small host cache live for the whole run; each input is bound
 * and, when accepted, run as one engine step (loads, every layer saved,
 * reports drained). Whatever the bytes: nothing crashes, a refused plan
 * changes nothing, and once the step and its background loads are done no
 * lease is held and no reservation is left in the store.
 *
 * The worker's namespace is 16 bytes of 0x42, block size 4, 8 blocks, so
 * seeds that get past the semantic checks must use them; the seeds in
 * corpus/worker_plan/ were packed with tests/support/kvd_testplan.h
 * (saves of blocks, synchronous and asynchronous loads of keys saved by
 * an earlier seed or never stored, block ids out of range, another
 * namespace).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvdepot/worker.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define LAYERS 2u
#define BLOCKS 8u
#define BS 4u
#define HEADS 1u
#define DIM 16u

static kvd_store_t *g_store;
static kvd_worker_t *g_worker;
static uint16_t g_cache[LAYERS][2][BLOCKS][BS][HEADS][DIM];

static void setup(void)
{
    kvd_config_t *cfg = NULL;
    if (kvd_config_create(&cfg) != KVD_OK ||
        kvd_config_set(cfg, "store.arena_size", "4m") != KVD_OK ||
        kvd_config_set(cfg, "store.arena_chunk", "64k") != KVD_OK ||
        kvd_config_set(cfg, "store.arena_hugepages", "off") != KVD_OK ||
        kvd_config_set(cfg, "store.arena_prefault", "false") != KVD_OK ||
        kvd_config_set(cfg, "store.reserve_timeout", "0") != KVD_OK ||
        kvd_store_open(cfg, &g_store, NULL, 0) != KVD_OK) {
        abort();
    }
    kvd_config_destroy(cfg);
    kvd_worker_config_t wc;
    memset(&wc, 0, sizeof wc);
    wc.store = g_store;
    memset(wc.ns.bytes, 0x42, sizeof wc.ns.bytes);
    wc.format = (kvd_object_format_t){KVD_DTYPE_FP16,
                                      LAYERS,
                                      2,
                                      HEADS,
                                      DIM,
                                      BS,
                                      {KVD_CODEC_RAW, KVD_CODEC_INT8},
                                      0};
    wc.num_threads = 2;
    if (kvd_worker_create(&wc, &g_worker, NULL, 0) != KVD_OK) {
        abort();
    }
    static void *bases[LAYERS];
    for (unsigned l = 0; l < LAYERS; l++) {
        bases[l] = g_cache[l];
        for (size_t i = 0; i < sizeof g_cache[l] / 2; i++) {
            ((uint16_t *)bases[l])[i] = (uint16_t)(0x3c00 + (i & 0xff));
        }
    }
    int64_t e = 2;
    kvd_kv_layout_t lo = {bases,
                          BLOCKS,
                          (int64_t)BLOCKS * BS * HEADS * DIM * e,
                          (int64_t)BS * HEADS * DIM * e,
                          (int64_t)HEADS * DIM * e,
                          (int64_t)DIM * e};
    if (kvd_worker_register_kv_caches(g_worker, &lo, NULL, 0) != KVD_OK) {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (g_worker == NULL) {
        setup();
    }
    kvd_store_stats_t before;
    if (kvd_store_stats(g_store, &before) != KVD_OK) {
        abort();
    }
    char err[256];
    kvd_status_t s =
        kvd_worker_bind_metadata(g_worker, data, size, err, sizeof err);
    if (s != KVD_OK) {
        kvd_store_stats_t after;
        if (kvd_store_stats(g_store, &after) != KVD_OK ||
            after.host.bytes != before.host.bytes ||
            after.leases != before.leases || err[0] == '\0') {
            abort(); /* refused, yet something changed (or no reason) */
        }
        return 0;
    }
    if (kvd_worker_start_load_kv(g_worker, NULL) != KVD_OK) {
        abort();
    }
    for (uint32_t l = 0; l < LAYERS; l++) {
        if (kvd_worker_wait_for_layer_load(g_worker, l, NULL) != KVD_OK ||
            kvd_worker_save_kv_layer(g_worker, l, NULL) != KVD_OK) {
            abort();
        }
    }
    if (kvd_worker_wait_for_save(g_worker, NULL) != KVD_OK ||
        kvd_worker_clear_metadata(g_worker) != KVD_OK) {
        abort();
    }
    /* Background loads end on their own (everything is in the arena). */
    kvd_worker_stats_t ws;
    for (int i = 0; i < 10000; i++) {
        kvd_worker_finished_t f;
        if (kvd_worker_get_finished(g_worker, NULL, 0, &f) != KVD_OK ||
            kvd_worker_stats(g_worker, &ws) != KVD_OK) {
            abort();
        }
        if (ws.async_loads_active == 0) {
            break;
        }
        usleep(100);
    }
    kvd_worker_finished_t f;
    kvd_store_stats_t after;
    if (ws.async_loads_active != 0 ||
        kvd_worker_get_finished(g_worker, NULL, 0, &f) != KVD_OK ||
        kvd_store_stats(g_store, &after) != KVD_OK || after.leases != 0) {
        abort(); /* a load never ended, or a lease leaked */
    }
    return 0;
}
