/*
 * A step's saves are all or nothing (include/kvdepot/worker.h, worker/
 * commit.c): an object is committed only by wait_for_save, and only with
 * every layer the engine computed. A step that stopped short is never
 * committed: with layerwise_saves a layer save_kv_layer was not called for
 * aborts the step at wait_for_save; clear_metadata, binding the next plan
 * and destroy without wait_for_save abort it; kvd_worker_abort_step aborts
 * it on the engine's word. Aborted saves give their reservations back
 * (the same keys save whole later), are counted in saves_aborted, their
 * requests are still reported as finished saving, and a lookup misses.
 * Loads of an aborted step still land. An engine that saves only at the
 * end (no layerwise_saves, no save_kv_layer) still commits at
 * wait_for_save.
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

static const uint32_t keys_b[] = {20, 21, 22, 23};

static kvd_worker_t *worker_with(kvd_store_t *st,
                                 const kvd_object_format_t *fmt,
                                 bool layerwise_saves)
{
    kvd_worker_config_t cfg = {0};
    cfg.store = st;
    cfg.ns = test_ns();
    cfg.format = *fmt;
    cfg.num_threads = 2;
    cfg.layerwise_saves = layerwise_saves;
    kvd_worker_t *w = NULL;
    char err[256] = "";
    kvd_status_t s = kvd_worker_create(&cfg, &w, err, sizeof err);
    if (s != KVD_OK) {
        fail_msg("worker: %s (%s)", kvd_status_str(s), err);
    }
    return w;
}

/* Binds a plan of request `id` saving save_blocks as `keys`. */
static void bind_saves(kvd_worker_t *w, uint64_t step, const char *id,
                       const uint32_t *keys)
{
    treq_t r = {.id = id, .layerwise = true, .n_saves = 4};
    memcpy(r.save_ids, save_blocks, sizeof save_blocks);
    memcpy(r.save_keys, keys, 4 * sizeof *keys);
    worker_bind(w, step, &r, 1);
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
}

/* The saves reported finished since the last call: exactly `id`. */
static void assert_finished_saving(kvd_worker_t *w, const char *id)
{
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_finished_saving, 1);
    assert_string_equal(f.finished_saving[0], id);
}

static void assert_stats(kvd_worker_t *w, uint64_t saved, uint64_t aborted)
{
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(w, &ws), KVD_OK);
    assert_int_equal(ws.blocks_saved, saved);
    assert_int_equal(ws.saves_aborted, aborted);
    assert_int_equal(ws.saves_dropped, 0);
}

static void fixture_close(wfixture_t *fx, kvd_worker_t *w)
{
    worker_store_close(w, fx->st);
    cache_cleanup(&fx->c);
}

/* vLLM's forward pass raised after layer 0; its `finally` still calls
 * wait_for_save. */
static void test_layer_missing_aborts_the_step(void **state)
{
    (void)state;
    wfixture_t fx;
    wfixture_open(&fx, 77);
    kvd_worker_t *w = worker_with(fx.st, &fx.fmt, true);
    worker_register(w, &fx.c);
    bind_saves(w, 1, "half", keys4);
    assert_int_equal(kvd_worker_wait_for_layer_load(w, 0, NULL), KVD_OK);
    assert_int_equal(kvd_worker_save_kv_layer(w, 0, NULL), KVD_OK);
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    assert_finished_saving(w, "half");
    assert_stats(w, 0, 4);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    assert_int_equal(stored(fx.st, keys4, 4), 0);
    /* The reservations were given back: the whole step saves them. */
    save_step(w, 2, "whole", save_blocks, keys4, 4);
    assert_stats(w, 4, 4);
    assert_int_equal(stored(fx.st, keys4, 4), 4);
    fixture_close(&fx, w);
}

/* Every layer but the last: still not whole. */
static void test_last_layer_missing_aborts_the_step(void **state)
{
    (void)state;
    wfixture_t fx;
    wfixture_open(&fx, 77);
    kvd_worker_t *w = worker_with(fx.st, &fx.fmt, true);
    worker_register(w, &fx.c);
    bind_saves(w, 1, "short", keys4);
    for (uint32_t l = 0; l + 1 < LAYERS; l++) {
        assert_int_equal(kvd_worker_save_kv_layer(w, l, NULL), KVD_OK);
    }
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    assert_finished_saving(w, "short");
    assert_stats(w, 0, 4);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    assert_int_equal(stored(fx.st, keys4, 4), 0);
    fixture_close(&fx, w);
}

/* An engine that saves at the end only (no layerwise_saves): wait_for_save
 * copies every layer itself and commits. */
static void test_end_only_engine_commits(void **state)
{
    (void)state;
    wfixture_t fx;
    wfixture_open(&fx, 77);
    kvd_worker_t *w = worker_with(fx.st, &fx.fmt, false);
    worker_register(w, &fx.c);
    bind_saves(w, 1, "end", keys4);
    assert_int_equal(kvd_worker_save_kv_layer(w, 1, NULL), KVD_OK);
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    assert_finished_saving(w, "end");
    assert_stats(w, 4, 0);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    assert_int_equal(stored(fx.st, keys4, 4), 4);
    /* ... and what it committed loads back whole. */
    treq_t r = {.id = "back", .layerwise = true, .n_loads = 4};
    memcpy(r.load_ids, load_blocks, sizeof load_blocks);
    memcpy(r.load_keys, keys4, sizeof keys4);
    worker_bind(w, 2, &r, 1);
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    assert_four_loaded(&fx.c, &fx.c);
    fixture_close(&fx, w);
}

/* clear_metadata without wait_for_save, every layer saved: the engine did
 * not finish the step. */
static void test_clear_without_wait_aborts(void **state)
{
    (void)state;
    wfixture_t fx;
    wfixture_open(&fx, 77);
    kvd_worker_t *w = worker_with(fx.st, &fx.fmt, false);
    worker_register(w, &fx.c);
    bind_saves(w, 1, "cleared", keys4);
    for (uint32_t l = 0; l < LAYERS; l++) {
        assert_int_equal(kvd_worker_save_kv_layer(w, l, NULL), KVD_OK);
    }
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    assert_finished_saving(w, "cleared");
    assert_stats(w, 0, 4);
    assert_int_equal(stored(fx.st, keys4, 4), 0);
    fixture_close(&fx, w);
}

/* The next plan bound mid-step (TensorRT-LLM skips wait_for_save when the
 * forward pass raised): the old step is aborted, the new one runs. */
static void test_rebind_mid_step_aborts(void **state)
{
    (void)state;
    wfixture_t fx;
    wfixture_open(&fx, 77);
    kvd_worker_t *w = worker_with(fx.st, &fx.fmt, false);
    worker_register(w, &fx.c);
    bind_saves(w, 1, "broken", keys4);
    assert_int_equal(kvd_worker_save_kv_layer(w, 0, NULL), KVD_OK);
    bind_saves(w, 2, "next", keys_b);
    assert_finished_saving(w, "broken");
    assert_stats(w, 0, 4);
    for (uint32_t l = 0; l < LAYERS; l++) {
        assert_int_equal(kvd_worker_save_kv_layer(w, l, NULL), KVD_OK);
    }
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    assert_finished_saving(w, "next");
    assert_stats(w, 4, 4);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    assert_int_equal(stored(fx.st, keys4, 4), 0);
    assert_int_equal(stored(fx.st, keys_b, 4), 4);
    fixture_close(&fx, w);
}

/* destroy with a step bound and no wait_for_save: its saves are aborted
 * (worker_store_close checks that no lease is left). */
static void test_destroy_without_wait_aborts(void **state)
{
    (void)state;
    wfixture_t fx;
    wfixture_open(&fx, 77);
    kvd_worker_t *w = worker_with(fx.st, &fx.fmt, false);
    worker_register(w, &fx.c);
    bind_saves(w, 1, "dying", keys4);
    for (uint32_t l = 0; l < LAYERS; l++) {
        assert_int_equal(kvd_worker_save_kv_layer(w, l, NULL), KVD_OK);
    }
    kvd_worker_destroy(w);
    assert_int_equal(stored(fx.st, keys4, 4), 0);
    /* The slots are free again: another worker saves the keys whole. */
    w = worker_with(fx.st, &fx.fmt, true);
    worker_register(w, &fx.c);
    save_step(w, 2, "again", save_blocks, keys4, 4);
    assert_stats(w, 4, 0);
    assert_int_equal(stored(fx.st, keys4, 4), 4);
    fixture_close(&fx, w);
}

/* kvd_worker_abort_step: every layer saved, the engine says the step
 * failed. Its loads still land; later calls of the step do nothing. */
static void test_abort_step(void **state)
{
    (void)state;
    wfixture_t fx;
    wfixture_open(&fx, 77);
    kvd_worker_t *w = worker_with(fx.st, &fx.fmt, true);
    worker_register(w, &fx.c);
    assert_int_equal(kvd_worker_abort_step(NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_worker_abort_step(w), KVD_OK); /* nothing bound */
    save_step(w, 1, "writer", save_blocks, keys4, 4);
    assert_int_equal(kvd_worker_abort_step(w), KVD_OK); /* unbound again */

    treq_t r = {.id = "mixed", .layerwise = true, .n_loads = 4, .n_saves = 2};
    memcpy(r.load_ids, load_blocks, sizeof load_blocks);
    memcpy(r.load_keys, keys4, sizeof keys4);
    memcpy(r.save_ids, save_blocks, 2 * sizeof *save_blocks);
    memcpy(r.save_keys, keys_b, 2 * sizeof *keys_b);
    worker_bind(w, 2, &r, 1);
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    for (uint32_t l = 0; l < LAYERS; l++) {
        assert_int_equal(kvd_worker_wait_for_layer_load(w, l, NULL), KVD_OK);
        assert_int_equal(kvd_worker_save_kv_layer(w, l, NULL), KVD_OK);
    }
    assert_int_equal(kvd_worker_abort_step(w), KVD_OK);
    assert_int_equal(kvd_worker_abort_step(w), KVD_OK);
    assert_int_equal(kvd_worker_save_kv_layer(w, 0, NULL), KVD_OK);
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_finished_saving, 1);
    assert_string_equal(f.finished_saving[0], "mixed");
    assert_int_equal(f.num_finished_loading, 1);
    assert_int_equal(f.num_failed_loads, 0);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_finished_saving, 0);
    assert_stats(w, 4, 2);
    assert_int_equal(stored(fx.st, keys_b, 2), 0);
    assert_four_loaded(&fx.c, &fx.c);
    fixture_close(&fx, w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_missing_aborts_the_step),
        cmocka_unit_test(test_last_layer_missing_aborts_the_step),
        cmocka_unit_test(test_end_only_engine_commits),
        cmocka_unit_test(test_clear_without_wait_aborts),
        cmocka_unit_test(test_rebind_mid_step_aborts),
        cmocka_unit_test(test_destroy_without_wait_aborts),
        cmocka_unit_test(test_abort_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
