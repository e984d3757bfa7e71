/*
 * The worker's refusals (include/kvdepot/worker.h): every argument error
 * of create and register, per-step calls with nothing bound, plans that
 * are malformed or do not fit the worker (nothing is reserved, bound or
 * reported), and the CUDA backend where it cannot run (a build without
 * CUDA, a machine without a GPU) refused with a reason.
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
#ifdef KVD_HAVE_CUDA
#include "kvdepot/kernels_cuda.h"
#endif

static void test_create_and_register_errors(void **state)
{
    (void)state;
    test_cache_t c;
    cache_init(&c, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    kvd_object_format_t fmt = cache_format(&c, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = store_open(NULL);
    kvd_worker_config_t cfg = {0};
    cfg.store = st;
    cfg.ns = test_ns();
    cfg.format = fmt;
    kvd_worker_t *w = NULL;
    char err[256] = "";
    assert_int_equal(kvd_worker_create(NULL, &w, err, sizeof err),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_worker_create(&cfg, NULL, err, sizeof err),
                     KVD_ERR_INVALID);
    kvd_worker_config_t bad = cfg;
    bad.store = NULL;
    assert_int_equal(kvd_worker_create(&bad, &w, err, sizeof err),
                     KVD_ERR_INVALID);
    bad = cfg;
    bad.format.head_dim = 0;
    assert_int_equal(kvd_worker_create(&bad, &w, err, sizeof err),
                     KVD_ERR_INVALID);
    assert_non_null(strstr(err, "format"));
    bad = cfg;
    bad.num_threads = KVD_WORKER_MAX_THREADS + 1;
    assert_int_equal(kvd_worker_create(&bad, &w, err, sizeof err),
                     KVD_ERR_INVALID);
    bad = cfg;
    bad.device = (kvd_worker_device_t)7;
    assert_int_equal(kvd_worker_create(&bad, &w, err, sizeof err),
                     KVD_ERR_UNSUPPORTED);
    assert_null(w);

    assert_int_equal(kvd_worker_create(&cfg, &w, err, sizeof err), KVD_OK);

    /* No cache yet. */
    uint8_t junk[4] = {0};
    assert_int_equal(kvd_worker_bind_metadata(w, junk, 0, err, sizeof err),
                     KVD_ERR_STATE);
    /* Overlapping strides: heads on top of each other. */
    kvd_kv_layout_t lo = c.layout;
    lo.stride_head = 2;
    assert_int_equal(kvd_worker_register_kv_caches(w, &lo, err, sizeof err),
                     KVD_ERR_INVALID);
    assert_non_null(strstr(err, "layout"));
    assert_int_equal(kvd_worker_register_kv_caches(w, NULL, err, sizeof err),
                     KVD_ERR_INVALID);
    worker_register(w, &c);
    assert_int_equal(kvd_worker_wait_for_layer_load(w, LAYERS, NULL),
                     KVD_ERR_RANGE);
    assert_int_equal(kvd_worker_save_kv_layer(w, LAYERS, NULL), KVD_ERR_RANGE);
    /* Nothing bound: every per-step call is a no-op. */
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_wait_for_layer_load(w, 0, NULL), KVD_OK);
    assert_int_equal(kvd_worker_save_kv_layer(w, 0, NULL), KVD_OK);
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(w, NULL, 1, &f), KVD_ERR_INVALID);
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    assert_int_equal(
        f.num_finished_loading + f.num_finished_saving + f.num_failed_loads, 0);
    assert_true(kvd_worker_fd(w) >= 0);
    assert_int_equal(kvd_worker_fd(NULL), -1);
    assert_int_equal(kvd_worker_stats(w, NULL), KVD_ERR_INVALID);
    kvd_worker_destroy(w);
    kvd_worker_destroy(NULL);
    /* The store is free for a new worker. */
    assert_int_equal(kvd_worker_create(&cfg, &w, err, sizeof err), KVD_OK);
    kvd_worker_destroy(w);
    kvd_store_close(st);
    cache_cleanup(&c);
}

/* KVD_WORKER_DEVICE_CUDA: a build without CUDA says so (UNSUPPORTED), a
 * machine without a GPU says so (NO_DEVICE); no worker is made and the
 * store stays free. On a GPU machine the worker is made, and refuses a
 * cache in host memory. */
static void test_cuda_device_unavailable(void **state)
{
    (void)state;
    test_cache_t c;
    cache_init(&c, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    kvd_store_t *st = store_open(NULL);
    kvd_worker_config_t cfg = {0};
    cfg.store = st;
    cfg.ns = test_ns();
    cfg.format = cache_format(&c, KVD_DTYPE_FP16, KVD_CODEC_TQ4);
    cfg.device = KVD_WORKER_DEVICE_CUDA;
    kvd_worker_t *w = NULL;
    char err[256] = "";
    kvd_status_t s = kvd_worker_create(&cfg, &w, err, sizeof err);
#ifndef KVD_HAVE_CUDA
    assert_int_equal(s, KVD_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "no CUDA support"));
    assert_null(w);
#else
    int count = 0;
    assert_int_equal(kvd_cuda_device_count(&count), KVD_OK);
    if (count == 0) {
        assert_int_equal(s, KVD_ERR_NO_DEVICE);
        assert_non_null(strstr(err, "no CUDA device"));
        assert_null(w);
    } else {
        assert_int_equal(s, KVD_OK);
        err[0] = '\0';
        assert_int_equal(
            kvd_worker_register_kv_caches(w, &c.layout, err, sizeof err),
            KVD_ERR_INVALID);
        assert_non_null(strstr(err, "not device memory"));
        kvd_worker_destroy(w);
        w = NULL;
    }
#endif
    /* Nothing of it is left: a host worker takes the store. */
    cfg.device = KVD_WORKER_DEVICE_HOST;
    assert_int_equal(kvd_worker_create(&cfg, &w, err, sizeof err), KVD_OK);
    worker_register(w, &c);
    worker_store_close(w, st);
    cache_cleanup(&c);
}

static kvd_status_t bind_bytes(kvd_worker_t *w, const uint8_t *plan, size_t len,
                               char *err, size_t err_len)
{
    return kvd_worker_bind_metadata(w, plan, len, err, err_len);
}

static void test_bad_plans_do_nothing(void **state)
{
    (void)state;
    test_cache_t c;
    cache_init(&c, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    kvd_object_format_t fmt = cache_format(&c, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = store_open(NULL);
    kvd_worker_t *w = worker_new(st, &fmt, 2);
    worker_register(w, &c);
    char err[256] = "";
    const uint8_t garbage[] = {0x0a, 0xff, 0xff, 0xff};
    assert_int_equal(bind_bytes(w, garbage, sizeof garbage, err, sizeof err),
                     KVD_ERR_PROTO);
    assert_non_null(strstr(err, "plan"));
    assert_int_equal(bind_bytes(w, NULL, 4, err, sizeof err), KVD_ERR_INVALID);

    treq_t r = {.id = "x", .n_saves = 1, .save_ids = {1}, .save_keys = {1}};
    kvd_namespace_t ns = test_ns();
    size_t len = 0;
    uint8_t *p = plan_pack(1, BS * 2, &ns, &r, 1, &len);
    assert_int_equal(bind_bytes(w, p, len, err, sizeof err), KVD_ERR_PROTO);
    assert_non_null(strstr(err, "block_size"));
    free(p);
    kvd_namespace_t other = ns;
    other.bytes[0] ^= 1;
    p = plan_pack(1, BS, &other, &r, 1, &len);
    assert_int_equal(bind_bytes(w, p, len, err, sizeof err), KVD_ERR_PROTO);
    assert_non_null(strstr(err, "namespace"));
    free(p);
    /* Block id outside the cache, after a valid first request. */
    treq_t two[2] = {
        {.id = "ok", .n_saves = 1, .save_ids = {1}, .save_keys = {1}},
        {.id = "far", .n_saves = 1, .save_ids = {BLOCKS}, .save_keys = {2}},
    };
    p = plan_pack(1, BS, &ns, two, 2, &len);
    assert_int_equal(bind_bytes(w, p, len, err, sizeof err), KVD_ERR_RANGE);
    assert_non_null(strstr(err, "outside"));
    free(p);
    /* Nothing was reserved, bound or reported. */
    kvd_store_stats_t ss;
    assert_int_equal(kvd_store_stats(st, &ss), KVD_OK);
    assert_int_equal(ss.host.bytes, 0);
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_finished_saving, 0);
    kvd_worker_destroy(w);
    kvd_store_close(st);
    cache_cleanup(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_and_register_errors),
        cmocka_unit_test(test_cuda_device_unavailable),
        cmocka_unit_test(test_bad_plans_do_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
