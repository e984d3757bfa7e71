/*
 * Saves that outlive their step (kvd_worker_config_t.async_saves,
 * worker/commit.c): wait_for_save returns while the copies still run, the
 * committer commits the step's objects (all or nothing) afterwards, and a
 * request is reported as finished saving only once none of its saves is in
 * flight. The engine's blocks stay safe: the next step (a plan naming a
 * preempted request too) is bound only after the earlier copies ran, destroy
 * commits what is in flight, the keys keep the namespace of their bind, and the
 * bytes in flight are bounded.
 *
 * The copies are held with the failpoint worker.save=block (the test
 * decides when they run), so nothing here depends on timing (but for
 * the slowed copies of test_next_step_waits_for_the_copies). With saves
 * that end at wait_for_save the first test would hang at wait_for_save
 * (and fail by the test's timeout).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "common/failpoint_int.h"
#include "tests/unit/kvd_testworker_int.h"

static const uint32_t keys_b[] = {20, 21, 22, 23};
static const int32_t blocks_b[] = {0, 2, 5, 7};

static kvd_worker_t *worker_async(const wfixture_t *fx, uint64_t max_bytes)
{
    kvd_worker_config_t cfg = {0};
    cfg.store = fx->st;
    cfg.ns = test_ns();
    cfg.format = fx->fmt;
    cfg.num_threads = 2;
    cfg.layerwise_saves = true;
    cfg.async_saves = true;
    cfg.max_inflight_save_bytes = max_bytes;
    kvd_worker_t *w = NULL;
    char err[256] = "";
    kvd_status_t s = kvd_worker_create(&cfg, &w, err, sizeof err);
    if (s != KVD_OK) {
        fail_msg("worker: %s (%s)", kvd_status_str(s), err);
    }
    worker_register(w, &fx->c);
    return w;
}

/* Binds a step of request `id` saving `ids` as `keys`, saves every layer
 * and calls wait_for_save. */
static void saving_step(kvd_worker_t *w, uint64_t step, const char *id,
                        const int32_t *ids, const uint32_t *keys)
{
    treq_t r = {.id = id, .layerwise = true, .n_saves = 4};
    memcpy(r.save_ids, ids, 4 * sizeof *ids);
    memcpy(r.save_keys, keys, 4 * sizeof *keys);
    worker_bind(w, step, &r, 1);
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    for (uint32_t l = 0; l < LAYERS; l++) {
        assert_int_equal(kvd_worker_save_kv_layer(w, l, NULL), KVD_OK);
    }
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
}

/* The requests reported finished saving since the last call. */
static size_t finished_saving(kvd_worker_t *w, const char **first)
{
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    *first = f.num_finished_saving > 0 ? f.finished_saving[0] : NULL;
    return f.num_finished_saving;
}

static bool saving(kvd_worker_t *w, const char *id)
{
    bool out = false;
    assert_int_equal(kvd_worker_request_saving(w, id, &out), KVD_OK);
    return out;
}

static kvd_worker_stats_t stats(kvd_worker_t *w)
{
    kvd_worker_stats_t ws;
    assert_int_equal(kvd_worker_stats(w, &ws), KVD_OK);
    return ws;
}

static void hold_copies(void)
{
    assert_int_equal(kvd_failpoint_set("worker.save=block", NULL, 0), KVD_OK);
}

/* The objects of keys4 load back equal to the blocks they were saved
 * from (a load step into blocks_b). */
static void assert_bytes_back(kvd_worker_t *w, wfixture_t *fx, uint64_t step,
                              const int32_t *saved_from)
{
    treq_t r = {.id = "reader", .layerwise = true, .n_loads = 4};
    memcpy(r.load_ids, blocks_b, sizeof blocks_b);
    memcpy(r.load_keys, keys4, sizeof keys4);
    test_cache_t want;
    cache_init(&want, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    memcpy(want.mem, fx->c.mem, fx->c.bytes);
    worker_bind(w, step, &r, 1);
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    for (uint32_t l = 0; l < LAYERS; l++) {
        assert_int_equal(kvd_worker_wait_for_layer_load(w, l, NULL), KVD_OK);
    }
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    /* Block blocks_b[i] of the cache now holds what saved_from[i] held. */
    for (size_t i = 0; i < 4; i++) {
        for (uint32_t l = 0; l < LAYERS; l++) {
            for (uint32_t p = 0; p < want.planes; p++) {
                for (uint32_t t = 0; t < BS; t++) {
                    for (uint32_t h = 0; h < HEADS; h++) {
                        size_t a = flat_index(&want, l, p,
                                              (uint32_t)saved_from[i], t, h, 0);
                        size_t b = flat_index(&fx->c, l, p,
                                              (uint32_t)blocks_b[i], t, h, 0);
                        assert_memory_equal(want.mem + a * want.elt,
                                            fx->c.mem + b * fx->c.elt,
                                            DIM * want.elt);
                    }
                }
            }
        }
    }
    cache_cleanup(&want);
}

/* The cache's bytes now: what the objects of keys4 must hold later. */
static unsigned char *cache_snapshot(const wfixture_t *fx)
{
    unsigned char *b = malloc(fx->c.bytes);
    assert_non_null(b);
    memcpy(b, fx->c.mem, fx->c.bytes);
    return b;
}

/* The saves of keys4 (from save_blocks) are committed with the bytes of
 * `before`, whatever the cache held since: the cache is set back to
 * `before` (freed) and the objects load into blocks_b at step `step`. */
static void assert_saved_as(kvd_worker_t *w, wfixture_t *fx, uint64_t step,
                            unsigned char *before)
{
    assert_int_equal(kvd_worker_flush_saves(w), KVD_OK);
    assert_int_equal(stored(fx->st, keys4, 4), 4);
    memcpy(fx->c.mem, before, fx->c.bytes);
    free(before);
    assert_bytes_back(w, fx, step, save_blocks);
}

/* wait_for_save returns with every copy held; the objects appear, and
 * the request is reported, only once the copies ran. */
static void test_wait_for_save_does_not_wait(void **state)
{
    (void)state;
    wfixture_t fx;
    wfixture_open(&fx, 91);
    kvd_worker_t *w = worker_async(&fx, 0);
    hold_copies();
    saving_step(w, 1, "writer", save_blocks, keys4);
    const char *id = NULL;
    assert_int_equal(finished_saving(w, &id), 0);
    assert_true(saving(w, "writer"));
    assert_false(saving(w, "other"));
    assert_int_equal(stored(fx.st, keys4, 4), 0);
    assert_int_equal(stats(w).saves_inflight, 4);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    /* The copies still read this cache: it cannot be swapped. */
    char err[256] = "";
    assert_int_equal(
        kvd_worker_register_kv_caches(w, &fx.c.layout, err, sizeof err),
        KVD_ERR_STATE);
    kvd_failpoint_clear();
    assert_int_equal(kvd_worker_flush_saves(w), KVD_OK);
    assert_int_equal(stored(fx.st, keys4, 4), 4);
    assert_false(saving(w, "writer"));
    assert_int_equal(finished_saving(w, &id), 1);
    assert_string_equal(id, "writer");
    kvd_worker_stats_t ws = stats(w);
    assert_int_equal(ws.blocks_saved, 4);
    assert_int_equal(ws.saves_inflight, 0);
    assert_int_equal(ws.saves_aborted + ws.saves_dropped + ws.saves_shed, 0);
    assert_bytes_back(w, &fx, 2, save_blocks);
    worker_store_close(w, fx.st);
    cache_cleanup(&fx.c);
}

/* A request saving in two steps is reported when the later one ended,
 * not when the first did. */
static void test_report_waits_for_the_last_step(void **state)
{
    (void)state;
    wfixture_t fx;
    wfixture_open(&fx, 91);
    kvd_worker_t *w = worker_async(&fx, 0);
    saving_step(w, 1, "long", save_blocks, keys4);
    assert_int_equal(kvd_worker_flush_saves(w), KVD_OK); /* step 1 queued */
    hold_copies();
    saving_step(w, 2, "long", blocks_b, keys_b); /* in flight */
    const char *id = NULL;
    assert_int_equal(finished_saving(w, &id), 0);
    assert_true(saving(w, "long"));
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    kvd_failpoint_clear();
    assert_int_equal(kvd_worker_flush_saves(w), KVD_OK);
    assert_int_equal(finished_saving(w, &id), 1);
    assert_string_equal(id, "long");
    assert_int_equal(finished_saving(w, &id), 0);
    assert_int_equal(stored(fx.st, keys4, 4), 4);
    assert_int_equal(stored(fx.st, keys_b, 4), 4);
    worker_store_close(w, fx.st);
    cache_cleanup(&fx.c);
}

static void *release_later(void *arg)
{
    (void)arg;
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
    kvd_failpoint_clear();
    return NULL;
}

/* A plan naming a preempted request (its blocks go to others next) is
 * bound only after that request's copies ran (its commit may still be
 * pending): the cache overwritten right after the bind leaves the
 * objects as the step saved them. */
static void test_preempted_request_copies_end(void **state)
{
    (void)state;
    wfixture_t fx;
    wfixture_open(&fx, 91);
    kvd_worker_t *w = worker_async(&fx, 0);
    unsigned char *before = cache_snapshot(&fx);
    hold_copies();
    saving_step(w, 1, "victim", save_blocks, keys4);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    kvd_pb_step_plan_t plan = KVDEPOT__V1__STEP_PLAN__INIT;
    char *pre[] = {"victim"};
    plan.step = 2;
    plan.block_size = BS;
    plan.n_preempted_request_ids = 1;
    plan.preempted_request_ids = pre;
    uint8_t *buf = NULL;
    size_t len = 0;
    char why[200] = "";
    assert_int_equal(
        kvd_proto_step_plan_pack_alloc(&plan, &buf, &len, why, sizeof why),
        KVD_OK);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, release_later, NULL), 0);
    assert_int_equal(kvd_worker_bind_metadata(w, buf, len, why, sizeof why),
                     KVD_OK);
    memset(fx.c.mem, 0x5a, fx.c.bytes); /* the blocks' next owner */
    pthread_join(t, NULL);
    free(buf);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    assert_saved_as(w, &fx, 3, before);
    worker_store_close(w, fx.st);
    cache_cleanup(&fx.c);
}

/* destroy with saves in flight commits them (the engine asked for them)
 * and leaves no lease. */
static void test_destroy_commits_in_flight(void **state)
{
    (void)state;
    wfixture_t fx;
    wfixture_open(&fx, 91);
    kvd_worker_t *w = worker_async(&fx, 0);
    hold_copies();
    saving_step(w, 1, "late", save_blocks, keys4);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, release_later, NULL), 0);
    kvd_worker_destroy(w);
    pthread_join(t, NULL);
    assert_int_equal(stored(fx.st, keys4, 4), 4);
    kvd_store_close(fx.st);
    cache_cleanup(&fx.c);
}

/* The keys keep the namespace of their bind: a namespace change while a
 * step drains does not move its objects. */
static void test_namespace_of_the_bind(void **state)
{
    (void)state;
    wfixture_t fx;
    wfixture_open(&fx, 91);
    kvd_worker_t *w = worker_async(&fx, 0);
    hold_copies();
    saving_step(w, 1, "old", save_blocks, keys4);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    kvd_namespace_t other = test_ns(), zero = {{0}};
    other.bytes[0] ^= 0xff;
    assert_int_equal(kvd_worker_set_namespace(w, &other, &zero), KVD_OK);
    kvd_failpoint_clear();
    assert_int_equal(kvd_worker_flush_saves(w), KVD_OK);
    assert_int_equal(stored(fx.st, keys4, 4), 4);
    assert_int_equal(stored_in(fx.st, &other, keys4, 4), 0);
    worker_store_close(w, fx.st);
    cache_cleanup(&fx.c);
}

/* Saves beyond max_inflight_save_bytes are shed, never waited for; the
 * step with nothing reserved ends at once. */
static void test_inflight_bound_sheds(void **state)
{
    (void)state;
    wfixture_t fx;
    wfixture_open(&fx, 91);
    size_t obj = kvd_object_stored_bytes(&fx.fmt);
    kvd_worker_t *w = worker_async(&fx, 5 * obj);
    /* The commits are held: the copies ran, the bytes are still reserved. */
    assert_int_equal(kvd_failpoint_set("worker.commit=block", NULL, 0), KVD_OK);
    saving_step(w, 1, "first", save_blocks, keys4); /* 4 of 5 in flight */
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    saving_step(w, 2, "second", blocks_b, keys_b); /* room for one */
    kvd_worker_stats_t ws = stats(w);
    assert_int_equal(ws.saves_shed, 3);
    assert_int_equal(ws.saves_inflight, 5);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    kvd_failpoint_clear();
    assert_int_equal(kvd_worker_flush_saves(w), KVD_OK);
    assert_int_equal(stored(fx.st, keys4, 4), 4);
    assert_int_equal(stored(fx.st, keys_b, 4), 1);
    ws = stats(w);
    assert_int_equal(ws.blocks_saved, 5);
    assert_int_equal(ws.saves_inflight, 0);
    worker_store_close(w, fx.st);
    cache_cleanup(&fx.c);
}

/* The engine may give a block to another request from its next step on
 * (vLLM frees the blocks that left a sliding window while the request
 * runs): a step is bound only once the earlier steps' copies out of the
 * cache ran, so what they store is what the cache held at their step. The
 * copies are slowed; the cache is overwritten as soon as the next step is
 * bound, and the objects must still hold the bytes of the step that saved
 * them. */
static void test_next_step_waits_for_the_copies(void **state)
{
    (void)state;
    wfixture_t fx;
    wfixture_open(&fx, 94);
    kvd_worker_t *w = worker_async(&fx, 0);
    unsigned char *before = cache_snapshot(&fx);
    assert_int_equal(kvd_failpoint_set("worker.save=delay:150", NULL, 0),
                     KVD_OK);
    saving_step(w, 1, "writer", save_blocks, keys4);
    assert_true(saving(w, "writer")); /* the copies are still running */
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    treq_t next = {.id = "next", .layerwise = true};
    worker_bind(w, 2, &next, 1);
    memset(fx.c.mem, 0x5a, fx.c.bytes); /* the next step's forward pass */
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    kvd_failpoint_clear();
    assert_saved_as(w, &fx, 3, before);
    worker_store_close(w, fx.st);
    cache_cleanup(&fx.c);
}

/* vLLM writes blocks of its next step (zeroing new ones) before binding
 * the plan: kvd_worker_blocks_fence, called first, ends the earlier
 * steps' copies out of the cache, so the objects hold what their step
 * saved. The copies are slowed; the cache is overwritten right after the
 * fence. */
static void test_fence_before_the_engine_writes(void **state)
{
    (void)state;
    wfixture_t fx;
    wfixture_open(&fx, 95);
    kvd_worker_t *w = worker_async(&fx, 0);
    unsigned char *before = cache_snapshot(&fx);
    assert_int_equal(kvd_failpoint_set("worker.save=delay:150", NULL, 0),
                     KVD_OK);
    saving_step(w, 1, "writer", save_blocks, keys4);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    assert_int_equal(kvd_worker_blocks_fence(w, NULL), KVD_OK);
    memset(fx.c.mem, 0, fx.c.bytes); /* the engine zeroes its new blocks */
    kvd_failpoint_clear();
    assert_saved_as(w, &fx, 2, before);
    /* Nothing in flight: returns at once. */
    assert_int_equal(kvd_worker_blocks_fence(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_blocks_fence(NULL, NULL), KVD_ERR_INVALID);
    worker_store_close(w, fx.st);
    cache_cleanup(&fx.c);
}

/* A bound below one object would shed every save: refused at create. */
static void test_bound_below_one_object_refused(void **state)
{
    (void)state;
    wfixture_t fx;
    wfixture_open(&fx, 93);
    kvd_worker_config_t cfg = {0};
    cfg.store = fx.st;
    cfg.ns = test_ns();
    cfg.format = fx.fmt;
    cfg.async_saves = true;
    cfg.max_inflight_save_bytes = kvd_object_stored_bytes(&fx.fmt) - 1;
    kvd_worker_t *w = NULL;
    char err[256] = "";
    assert_int_equal(kvd_worker_create(&cfg, &w, err, sizeof err),
                     KVD_ERR_INVALID);
    assert_null(w);
    assert_non_null(strstr(err, "less than one object"));
    cfg.max_inflight_save_bytes += 1;
    assert_int_equal(kvd_worker_create(&cfg, &w, err, sizeof err), KVD_OK);
    worker_store_close(w, fx.st);
    cache_cleanup(&fx.c);
}

/* A forward pass that stopped short is still aborted at wait_for_save,
 * and reported, with nothing left in flight. */
static void test_short_step_still_aborted(void **state)
{
    (void)state;
    wfixture_t fx;
    wfixture_open(&fx, 91);
    kvd_worker_t *w = worker_async(&fx, 0);
    treq_t r = {.id = "short", .layerwise = true, .n_saves = 4};
    memcpy(r.save_ids, save_blocks, sizeof save_blocks);
    memcpy(r.save_keys, keys4, sizeof keys4);
    worker_bind(w, 1, &r, 1);
    assert_int_equal(kvd_worker_save_kv_layer(w, 0, NULL), KVD_OK);
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    assert_false(saving(w, "short"));
    const char *id = NULL;
    assert_int_equal(finished_saving(w, &id), 1);
    assert_int_equal(stats(w).saves_aborted, 4);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    assert_int_equal(stored(fx.st, keys4, 4), 0);
    worker_store_close(w, fx.st);
    cache_cleanup(&fx.c);
}

int main(void)
{
#ifndef KVD_FAILPOINTS_ENABLED
    fprintf(stderr, "failpoints compiled out: the copies cannot be held\n");
    return 77;
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wait_for_save_does_not_wait),
        cmocka_unit_test(test_report_waits_for_the_last_step),
        cmocka_unit_test(test_preempted_request_copies_end),
        cmocka_unit_test(test_destroy_commits_in_flight),
        cmocka_unit_test(test_namespace_of_the_bind),
        cmocka_unit_test(test_inflight_bound_sheds),
        cmocka_unit_test(test_next_step_waits_for_the_copies),
        cmocka_unit_test(test_fence_before_the_engine_writes),
        cmocka_unit_test(test_short_step_still_aborted),
        cmocka_unit_test(test_bound_below_one_object_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
