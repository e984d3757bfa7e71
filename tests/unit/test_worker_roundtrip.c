/*
 * The worker's round trips on the host backend (include/kvdepot/worker.h):
 * a plan saves blocks of a random cache, a second plan loads them into
 * other blocks of a poisoned cache of the same layout; every engine layout
 * and codec. The expected cache is computed with the reference kernels
 * directly (gather, then scatter), so the test checks the worker's
 * plumbing bit for bit, raw and lossy alike, and that no byte outside the
 * listed blocks changes. Layer pipelining: right after
 * wait_for_layer_load(l) returns, layer l of every loaded block must be in
 * place. The CUDA backend's round trips are tests/gpu/test_cuda_worker.c.
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

static void round_trip(engine_layout_t kind, kvd_codec_t ck, kvd_codec_t cv,
                       uint32_t threads)
{
    test_cache_t src, dst, exp;
    cache_init(&src, kind, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&dst, kind, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&exp, kind, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 0x1234u + (uint64_t)kind * 77u + ck * 7u + cv);
    memset(dst.mem, POISON, dst.bytes);
    memset(exp.mem, POISON, exp.bytes);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, ck);
    fmt.codec[1] = cv;
    kvd_codec_tables_t *tables = NULL;
    assert_int_equal(kvd_codec_tables_create(&fmt, &tables), KVD_OK);
    expected_cache(&src, &exp, &fmt, tables, save_blocks, load_blocks, 4);

    kvd_store_t *st = store_open(NULL);
    kvd_worker_t *w = worker_new(st, &fmt, threads);
    worker_register(w, &src);
    save_step(w, 1, "writer", save_blocks, keys4, 4);

    worker_register(w, &dst);
    treq_t r = {.id = "reader", .layerwise = true, .n_loads = 4};
    memcpy(r.load_ids, load_blocks, sizeof load_blocks);
    memcpy(r.load_keys, keys4, sizeof keys4);
    worker_bind(w, 2, &r, 1);
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    for (uint32_t l = 0; l < LAYERS; l++) {
        assert_int_equal(kvd_worker_wait_for_layer_load(w, l, NULL), KVD_OK);
        /* Pipelining: layer l is complete as soon as its wait returns. */
        for (size_t i = 0; i < 4; i++) {
            if (!layer_block_equal(&dst, &exp, l, (uint32_t)load_blocks[i])) {
                fail_msg("%s %s/%s: layer %u of block %d not in place after "
                         "its wait",
                         layout_name(kind), kvd_codec_name(ck),
                         kvd_codec_name(cv), l, load_blocks[i]);
            }
        }
    }
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_finished_loading, 1);
    assert_string_equal(f.finished_loading[0], "reader");
    assert_false(f.loading_async[0]);
    assert_int_equal(f.num_failed_loads, 0);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    /* Every byte: the loaded blocks, and poison everywhere else. */
    if (memcmp(dst.mem, exp.mem, dst.bytes) != 0) {
        fail_msg("%s %s/%s: cache differs from the expected one",
                 layout_name(kind), kvd_codec_name(ck), kvd_codec_name(cv));
    }
    if (ck == KVD_CODEC_RAW && (cv == KVD_CODEC_RAW || src.planes == 1)) {
        for (uint32_t l = 0; l < LAYERS; l++) {
            for (size_t i = 0; i < 4; i++) {
                /* Raw is lossless: the source block itself came back. */
                for (uint32_t p = 0; p < src.planes; p++) {
                    for (uint32_t t = 0; t < BS; t++) {
                        for (uint32_t h = 0; h < src.heads; h++) {
                            size_t a =
                                flat_index(&src, l, p, (uint32_t)save_blocks[i],
                                           t, h, 0) *
                                2;
                            size_t b =
                                flat_index(&dst, l, p, (uint32_t)load_blocks[i],
                                           t, h, 0) *
                                2;
                            assert_memory_equal(src.mem + a, dst.mem + b,
                                                DIM * 2);
                        }
                    }
                }
            }
        }
    }
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(w, &ws), KVD_OK);
    assert_int_equal(ws.blocks_saved, 4);
    assert_int_equal(ws.blocks_loaded, 4);
    assert_int_equal(ws.load_errors, 0);
    worker_store_close(w, st);
    kvd_codec_tables_destroy(tables);
    cache_cleanup(&src);
    cache_cleanup(&dst);
    cache_cleanup(&exp);
}

static void test_round_trip_every_layout_and_codec(void **state)
{
    (void)state;
    static const kvd_codec_t pairs[][2] = {
        {KVD_CODEC_RAW, KVD_CODEC_RAW},
        {KVD_CODEC_FP8_E4M3, KVD_CODEC_FP8_E4M3},
        {KVD_CODEC_INT8, KVD_CODEC_INT8},
        {KVD_CODEC_KIVI4, KVD_CODEC_KIVI2},
        {KVD_CODEC_TQ4, KVD_CODEC_TQ3},
        {KVD_CODEC_RAW, KVD_CODEC_TQ2},
    };
    for (int k = 0; k < LAYOUT_COUNT; k++) {
        for (size_t c = 0; c < sizeof pairs / sizeof *pairs; c++) {
            round_trip((engine_layout_t)k, pairs[c][0], pairs[c][1],
                       1 + (uint32_t)(c % 3));
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_every_layout_and_codec),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
