/*
 * The worker's asynchronous loads on the host backend
 * (include/kvdepot/worker.h): loads from NVMe after a store restart,
 * through promotions, reported packed for the leader; an asynchronous load
 * with nothing to copy still finishes; two workers on one store promote at
 * the same time; destroy with loads in flight leaves no lease.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/unit/kvd_testworker_int.h"
#include "proto/kvd_proto.h"

static void test_async_load_from_disk_after_restart(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "worker_disk");
    test_cache_t src, dst;
    cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&dst, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 99);
    memset(dst.mem, POISON, dst.bytes);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = NULL;
    save_four_then_restart(&d, &src, &fmt, &st);

    kvd_worker_t *w = worker_new(st, &fmt, 2);
    worker_register(w, &dst);
    treq_t r = {.id = "late", .async = true, .n_loads = 4};
    memcpy(r.load_ids, load_blocks, sizeof load_blocks);
    memcpy(r.load_keys, keys4, sizeof keys4);
    worker_bind(w, 5, &r, 1);
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    kvd_worker_finished_t f = wait_loaded(w, "late", NULL);
    assert_true(f.loading_async[0]);
    assert_int_equal(f.num_failed_loads, 0);
    assert_int_equal(f.step, 5);
    for (uint32_t l = 0; l < LAYERS; l++) {
        for (size_t i = 0; i < 4; i++) {
            for (uint32_t t = 0; t < BS; t++) {
                for (uint32_t p = 0; p < 2; p++) {
                    size_t a = flat_index(&src, l, p, (uint32_t)save_blocks[i],
                                          t, 0, 0) *
                               2;
                    size_t b = flat_index(&dst, l, p, (uint32_t)load_blocks[i],
                                          t, 0, 0) *
                               2;
                    assert_memory_equal(src.mem + a, dst.mem + b,
                                        HEADS * DIM * 2);
                }
            }
        }
    }
    /* The packed report says the same. */
    kvd_pb_worker_report_t *rep = NULL;
    assert_int_equal(
        kvd_proto_worker_report_unpack(f.report, f.report_len, &rep, NULL, 0),
        KVD_OK);
    assert_int_equal(rep->step, 5);
    assert_int_equal(rep->worker_rank, 3);
    assert_int_equal(rep->n_finished_loading, 1);
    assert_string_equal(rep->finished_loading[0], "late");
    /* And how long the NVMe tier took, for the leader's gate: one load of
     * four blocks. */
    assert_int_equal(rep->n_tier_loads, 1);
    assert_int_equal(rep->tier_loads[0]->tier, KVDEPOT__V1__TIER__TIER_DISK);
    assert_int_equal(rep->tier_loads[0]->loads, 1);
    assert_int_equal(rep->tier_loads[0]->blocks, 4);
    assert_int_equal(rep->tier_loads[0]->bytes,
                     4 * kvd_object_stored_bytes(&fmt));
    assert_true(rep->tier_loads[0]->nanos > 0);
    kvd_proto_worker_report_free(rep);
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(w, &ws), KVD_OK);
    assert_int_equal(ws.promotions, 4);
    assert_int_equal(ws.blocks_loaded, 4);
    assert_int_equal(ws.async_loads_active, 0);
    worker_store_close(w, st);
    cache_cleanup(&src);
    cache_cleanup(&dst);
    kvd_test_dir_remove(&d);
}

/* An asynchronous load with no block to copy (every position it covers was
 * dropped by the engine: vLLM's sliding-window group) still finishes and
 * is reported, so the engine stops waiting for it. */
static void test_async_load_of_nothing_finishes(void **state)
{
    (void)state;
    test_cache_t dst;
    cache_init(&dst, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    memset(dst.mem, POISON, dst.bytes);
    kvd_object_format_t fmt = cache_format(&dst, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = store_open(NULL);
    kvd_worker_t *w = worker_new(st, &fmt, 2);
    worker_register(w, &dst);
    treq_t r = {.id = "empty", .async = true, .n_loads = 0};
    worker_bind(w, 9, &r, 1);
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    kvd_worker_finished_t f = wait_loaded(w, "empty", NULL);
    assert_true(f.loading_async[0]);
    assert_int_equal(f.num_failed_loads, 0);
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(w, &ws), KVD_OK);
    assert_int_equal(ws.blocks_loaded, 0);
    assert_int_equal(ws.async_loads_active, 0);
    for (size_t i = 0; i < dst.bytes; i++) {
        assert_int_equal(dst.mem[i], POISON);
    }
    worker_store_close(w, st);
    cache_cleanup(&dst);
}

/* Two workers on one store (vLLM's hybrid allocator: one per KV-cache
 * group) promote from disk at the same time; each gets its own blocks,
 * whichever of them drains the store's completions. Before, the second
 * worker was refused. */
static void test_two_workers_share_a_store(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "worker_two");
    test_cache_t src, dst[2];
    cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 41);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = NULL;
    save_four_then_restart(&d, &src, &fmt, &st);
    kvd_worker_t *w[2];
    for (int k = 0; k < 2; k++) {
        cache_init(&dst[k], LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
        memset(dst[k].mem, POISON, dst[k].bytes);
        w[k] = worker_new(st, &fmt, 1);
        worker_register(w[k], &dst[k]);
    }
    for (int round = 0; round < 8; round++) {
        char id[2][16];
        for (int k = 0; k < 2; k++) {
            snprintf(id[k], sizeof id[k], "g%d-%d", k, round);
            treq_t r = {.id = id[k], .async = true, .n_loads = 4};
            memcpy(r.load_ids, load_blocks, sizeof load_blocks);
            memcpy(r.load_keys, keys4, sizeof keys4);
            worker_bind(w[k], (uint64_t)round + 1, &r, 1);
        }
        for (int k = 0; k < 2; k++) {
            assert_int_equal(kvd_worker_start_load_kv(w[k], NULL), KVD_OK);
        }
        for (int k = 0; k < 2; k++) {
            assert_int_equal(kvd_worker_wait_for_save(w[k], NULL), KVD_OK);
            assert_int_equal(kvd_worker_clear_metadata(w[k]), KVD_OK);
        }
        for (int k = 0; k < 2; k++) {
            kvd_worker_finished_t f = wait_loaded(w[k], id[k], NULL);
            assert_int_equal(f.num_failed_loads, 0);
        }
    }
    for (int k = 0; k < 2; k++) {
        assert_four_loaded(&src, &dst[k]);
        kvd_worker_stats_t ws;
        assert_int_equal(kvd_worker_stats(w[k], &ws), KVD_OK);
        assert_int_equal(ws.blocks_loaded, 4 * 8);
        assert_int_equal(ws.async_loads_active, 0);
    }
    kvd_worker_destroy(w[0]);
    worker_store_close(w[1], st);
    cache_cleanup(&src);
    cache_cleanup(&dst[0]);
    cache_cleanup(&dst[1]);
    kvd_test_dir_remove(&d);
}

/* Destroy with asynchronous loads in flight: every lease comes back. */
static void test_destroy_with_loads_in_flight(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "worker_cancel");
    test_cache_t src, dst;
    cache_init(&src, LAYOUT_FLASHINFER, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&dst, LAYOUT_FLASHINFER, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 3);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = NULL;
    save_four_then_restart(&d, &src, &fmt, &st);
    for (int round = 0; round < 20; round++) {
        kvd_worker_t *w = worker_new(st, &fmt, 2);
        worker_register(w, &dst);
        treq_t r = {.id = "gone", .async = true, .n_loads = 4};
        memcpy(r.load_ids, load_blocks, sizeof load_blocks);
        memcpy(r.load_keys, keys4, sizeof keys4);
        worker_bind(w, 1, &r, 1);
        assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
        if (round % 2 == 1) {
            /* The engine finished the request: a copy not started yet is
             * canceled; either way the request is reported once, whole. */
            const char *ids[] = {"gone"};
            kvd_worker_finished_t f;
            assert_int_equal(kvd_worker_get_finished(w, ids, 1, &f), KVD_OK);
            size_t failed = 0;
            bool done = false;
            for (size_t k = 0; k < f.num_finished_loading; k++) {
                done |= strcmp(f.finished_loading[k], "gone") == 0;
            }
            failed = f.num_failed_loads;
            for (size_t k = 0; k < f.num_failed_loads; k++) {
                assert_int_equal(f.failed_loads[k].status, KVD_ERR_CANCELED);
            }
            if (!done) {
                size_t more = 0;
                (void)wait_loaded(w, "gone", &more);
                failed += more;
            }
            assert_true(failed == 0 || failed == 4);
        }
        kvd_worker_destroy(w);
        kvd_store_stats_t ss;
        assert_int_equal(kvd_store_stats(st, &ss), KVD_OK);
        assert_int_equal(ss.leases, 0);
    }
    kvd_store_close(st);
    cache_cleanup(&src);
    cache_cleanup(&dst);
    kvd_test_dir_remove(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_async_load_from_disk_after_restart),
        cmocka_unit_test(test_async_load_of_nothing_finishes),
        cmocka_unit_test(test_two_workers_share_a_store),
        cmocka_unit_test(test_destroy_with_loads_in_flight),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
