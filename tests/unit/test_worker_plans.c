/*
 * How the worker carries out a step's plan over the store's objects
 * (include/kvdepot/worker.h, host backend): a plan in the leader's
 * namespace loads the worker's own objects (tensor parallelism); blocks
 * that fail (missing, I/O error) while the request's other blocks load;
 * two requests of one step loading the same keys; saves of keys stored
 * already, or saved twice in one plan.
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

#include "common/failpoint_int.h"

/* Tensor parallelism: the leader plans in rank 0's namespace, a rank's
 * worker stores and loads the same hashes in its own (plan_ns). Plans keyed
 * in the worker's storage namespace are then refused, and loads read the
 * worker's own objects. */
static void test_plan_namespace_differs(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "worker_planns");
    test_cache_t src, dst;
    cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&dst, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 43);
    memset(dst.mem, POISON, dst.bytes);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = NULL;
    save_four_then_restart(&d, &src, &fmt, &st); /* stored in test_ns() */

    kvd_worker_config_t cfg = {0};
    cfg.store = st;
    cfg.ns = test_ns();
    memset(cfg.plan_ns.bytes, 0x77, sizeof cfg.plan_ns.bytes);
    cfg.format = fmt;
    cfg.num_threads = 2;
    kvd_worker_t *w = NULL;
    char err[256] = "";
    assert_int_equal(kvd_worker_create(&cfg, &w, err, sizeof err), KVD_OK);
    worker_register(w, &dst);
    treq_t r = {.id = "rank1", .async = true, .n_loads = 4};
    memcpy(r.load_ids, load_blocks, sizeof load_blocks);
    memcpy(r.load_keys, keys4, sizeof keys4);
    size_t len = 0;
    kvd_namespace_t own = test_ns();
    uint8_t *plan = plan_pack(1, BS, &own, &r, 1, &len);
    assert_int_equal(kvd_worker_bind_metadata(w, plan, len, err, sizeof err),
                     KVD_ERR_PROTO);
    assert_non_null(strstr(err, "namespace"));
    free(plan);
    plan = plan_pack(2, BS, &cfg.plan_ns, &r, 1, &len);
    assert_int_equal(kvd_worker_bind_metadata(w, plan, len, err, sizeof err),
                     KVD_OK);
    free(plan);
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    kvd_worker_finished_t f = wait_loaded(w, "rank1", NULL);
    assert_int_equal(f.num_failed_loads, 0);
    assert_four_loaded(&src, &dst);
    worker_store_close(w, st);
    cache_cleanup(&src);
    cache_cleanup(&dst);
    kvd_test_dir_remove(&d);
}

/* Every byte of block `blk` (all layers) is still poison. */
static bool block_is_poison(const test_cache_t *c, uint32_t blk)
{
    for (uint32_t l = 0; l < c->layers; l++) {
        for (uint32_t p = 0; p < c->planes; p++) {
            for (uint32_t t = 0; t < c->bs; t++) {
                for (uint32_t h = 0; h < c->heads; h++) {
                    size_t i = flat_index(c, l, p, blk, t, h, 0) * c->elt;
                    for (size_t k = 0; k < c->dim * c->elt; k++) {
                        if (c->mem[i + k] != POISON) {
                            return false;
                        }
                    }
                }
            }
        }
    }
    return true;
}

/* A missing object and an I/O error fail exactly their blocks. */
static void test_failed_blocks_only(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "worker_fail");
    test_cache_t src, dst, exp;
    cache_init(&src, LAYOUT_VLLM_HND, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&dst, LAYOUT_VLLM_HND, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&exp, LAYOUT_VLLM_HND, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 7);
    memset(dst.mem, POISON, dst.bytes);
    memset(exp.mem, POISON, exp.bytes);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = NULL;
    save_four_then_restart(&d, &src, &fmt, &st);

    /* Keys 10, 99 (never stored), 12 (its read fails), 13. */
    char err[128];
    assert_int_equal(kvd_failpoint_set("nvme.read=EIO@2", err, sizeof err),
                     KVD_OK);
    kvd_worker_t *w = worker_new(st, &fmt, 2);
    worker_register(w, &dst);
    treq_t r = {.id = "holes",
                .layerwise = false,
                .n_loads = 4,
                .load_ids = {7, 0, 5, 2},
                .load_keys = {10, 99, 12, 13}};
    worker_bind(w, 9, &r, 1);
    /* Not layerwise: the loads are in place when start_load_kv returns. */
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    kvd_failpoint_clear();
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_finished_loading, 1);
    assert_int_equal(f.num_failed_loads, 2);
    bool saw_missing = false, saw_io = false;
    for (size_t i = 0; i < 2; i++) {
        assert_string_equal(f.failed_loads[i].request_id, "holes");
        if (f.failed_loads[i].block_id == 0) {
            assert_int_equal(f.failed_loads[i].status, KVD_ERR_NOT_FOUND);
            saw_missing = true;
        } else {
            /* The second promotion read is the one that failed: which
             * block that is depends on the order of completion. */
            assert_int_equal(f.failed_loads[i].status, KVD_ERR_IO);
            saw_io = true;
        }
    }
    assert_true(saw_missing && saw_io);
    /* Failed blocks are untouched, the others loaded. */
    for (int i = 0; i < 4; i++) {
        int32_t b = r.load_ids[i];
        if (b == f.failed_loads[0].block_id ||
            b == f.failed_loads[1].block_id) {
            assert_true(block_is_poison(&dst, (uint32_t)b));
            continue;
        }
        expected_cache(&src, &exp, &fmt, NULL, &save_blocks[i], &b, 1);
        for (uint32_t l = 0; l < LAYERS; l++) {
            assert_true(layer_block_equal(&dst, &exp, l, (uint32_t)b));
        }
    }
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(w, &ws), KVD_OK);
    assert_int_equal(ws.blocks_loaded, 2);
    assert_int_equal(ws.load_errors, 2);
    worker_store_close(w, st);
    cache_cleanup(&src);
    cache_cleanup(&dst);
    cache_cleanup(&exp);
    kvd_test_dir_remove(&d);
}

/* Two requests of one step load the same stored blocks (a shared prefix):
 * the worker looks blocks up in batches, and a store batch names each key
 * once, so the shared keys go in separate batches; every block loads. */
static void test_shared_blocks_in_one_step(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "worker_shared");
    test_cache_t src, dst, exp;
    cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&dst, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&exp, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 31);
    memset(dst.mem, POISON, dst.bytes);
    memset(exp.mem, POISON, exp.bytes);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = NULL;
    save_four_then_restart(&d, &src, &fmt, &st);
    kvd_worker_t *w = worker_new(st, &fmt, 2);
    worker_register(w, &dst);
    treq_t r[2] = {{.id = "first",
                    .n_loads = 2,
                    .load_ids = {0, 2},
                    .load_keys = {keys4[0], keys4[1]}},
                   {.id = "second",
                    .n_loads = 3,
                    .load_ids = {5, 7, 1},
                    .load_keys = {keys4[0], keys4[1], keys4[2]}}};
    worker_bind(w, 3, r, 2);
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_failed_loads, 0);
    for (size_t q = 0; q < 2; q++) {
        for (size_t i = 0; i < r[q].n_loads; i++) {
            int32_t b = r[q].load_ids[i];
            expected_cache(&src, &exp, &fmt, NULL, &save_blocks[i], &b, 1);
            for (uint32_t l = 0; l < LAYERS; l++) {
                assert_true(layer_block_equal(&dst, &exp, l, (uint32_t)b));
            }
        }
    }
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(w, &ws), KVD_OK);
    assert_int_equal(ws.blocks_loaded, 5);
    worker_store_close(w, st);
    cache_cleanup(&src);
    cache_cleanup(&dst);
    cache_cleanup(&exp);
    kvd_test_dir_remove(&d);
}

/* Two requests save the same key in one plan, and a key stored already:
 * one object each, the others skipped, every request reported. */
static void test_saves_skip_stored_keys(void **state)
{
    (void)state;
    test_cache_t src;
    cache_init(&src, LAYOUT_TRTLLM_POOL, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 5);
    kvd_object_format_t fmt =
        cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_FP8_E4M3);
    kvd_store_t *st = store_open(NULL);
    kvd_worker_t *w = worker_new(st, &fmt, 2);
    worker_register(w, &src);
    save_step(w, 1, "first", save_blocks, keys4, 2); /* keys 10, 11 */
    treq_t r[2] = {
        {.id = "a", .n_saves = 2, .save_ids = {1, 2}, .save_keys = {11, 20}},
        {.id = "b", .n_saves = 2, .save_ids = {3, 4}, .save_keys = {20, 21}},
    };
    worker_bind(w, 2, r, 2);
    /* No save_kv_layer: wait_for_save copies every layer itself. */
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_finished_saving, 2);
    assert_string_equal(f.finished_saving[0], "a");
    assert_string_equal(f.finished_saving[1], "b");
    assert_int_equal(f.num_finished_loading, 0);
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(w, &ws), KVD_OK);
    assert_int_equal(ws.blocks_saved, 4); /* 10, 11, 20, 21 */
    assert_int_equal(ws.saves_skipped, 2);
    assert_int_equal(ws.saves_dropped, 0);
    /* Each stored object is the gathered block. */
    kvd_namespace_t ns = test_ns();
    kvd_block_hash_t h[4] = {key_hash(10), key_hash(11), key_hash(20),
                             key_hash(21)};
    const int32_t from[4] = {1, 3, 3, 4}; /* key 20: b's block 3 or a's 2 */
    kvd_store_lease_t leases[4];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, h, 4, leases, &m), KVD_OK);
    assert_int_equal(m, 4);
    size_t bytes = kvd_object_bytes(&fmt);
    void *obj = aligned_alloc(64, (bytes + 63) / 64 * 64);
    assert_non_null(obj);
    for (int i = 0; i < 4; i++) {
        const void *got =
            kvd_store_arena_ptr(st, leases[i].arena_offset, bytes);
        assert_non_null(got);
        bool any = false;
        int32_t cands[2] = {from[i], i == 2 ? 2 : from[i]};
        for (int c = 0; c < 2 && !any; c++) {
            for (uint32_t l = 0; l < LAYERS; l++) {
                assert_int_equal(kvd_ref_gather_layer(&src.layout, &fmt, NULL,
                                                      l, &cands[c], 1, BS,
                                                      &obj),
                                 KVD_OK);
            }
            any = memcmp(got, obj, bytes) == 0;
        }
        assert_true(any);
    }
    free(obj);
    assert_int_equal(kvd_store_release(st, leases, 4), KVD_OK);
    kvd_worker_destroy(w);
    kvd_store_close(st);
    cache_cleanup(&src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_namespace_differs),
        cmocka_unit_test(test_failed_blocks_only),
        cmocka_unit_test(test_shared_blocks_in_one_step),
        cmocka_unit_test(test_saves_skip_stored_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
