/*
 * Objects describe themselves (kernels.h, "Object header"; worker.h): a
 * load whose object does not say it is the object asked for is a load
 * error, never bytes in the cache, on every tier a worker reads from.
 *
 * - TurboQuant seeds 1 and 2 name different namespaces: a worker with seed
 *   2 misses what seed 1 saved; one given seed 1's namespace anyway (what
 *   namespace digest v1 did: it had no seed) is refused by the header.
 * - Header bytes flipped in the arena: those blocks fail, the rest load.
 * - Bytes of one key committed under another (an index or file mix-up the
 *   store's checksums cannot see: they cover what was written) on the NVMe
 *   tier after a restart, and through kvdepotd: refused.
 * - A new namespace generation (reset_cache, weights updated in place):
 *   neither the leader nor the workers match anything saved before.
 * Each failed block leaves the engine's block untouched (POISON) and is
 * counted in header_errors and load_errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvdepot/leader.h"
#include "tests/unit/kvd_testclient_int.h"
#include "tests/unit/kvd_testworker_int.h"

/* A worker storing in `ns` (plans name blocks in test_ns()). */
static kvd_worker_t *worker_in(kvd_store_t *st, const kvd_object_format_t *fmt,
                               const kvd_namespace_t *ns)
{
    kvd_worker_config_t cfg = {0};
    cfg.store = st;
    cfg.ns = *ns;
    cfg.plan_ns = test_ns();
    cfg.format = *fmt;
    cfg.num_threads = 2;
    kvd_worker_t *w = NULL;
    char err[256] = "";
    kvd_status_t s = kvd_worker_create(&cfg, &w, err, sizeof err);
    if (s != KVD_OK) {
        fail_msg("worker: %s (%s)", kvd_status_str(s), err);
    }
    return w;
}

/* The namespace an engine with this format computes (generation 0). */
static kvd_namespace_t ns_gen(const kvd_object_format_t *fmt, uint64_t gen)
{
    kvd_namespace_desc_t d = {
        .model_id = "test/model",
        .dtype = 1,
        .k_codec = (uint32_t)fmt->codec[0] + 1,
        .v_codec = (uint32_t)fmt->codec[1] + 1,
        .num_layers = fmt->num_layers,
        .num_kv_heads = fmt->num_heads,
        .total_kv_heads = fmt->num_heads,
        .head_dim = fmt->head_dim,
        .block_size = fmt->block_size,
        .tp_size = 1,
        .tq_seed = fmt->tq_seed,
        .generation = gen,
    };
    kvd_namespace_t ns;
    assert_int_equal(kvd_namespace_digest(&d, &ns), KVD_OK);
    return ns;
}

static kvd_namespace_t ns_of(const kvd_object_format_t *fmt)
{
    return ns_gen(fmt, 0);
}

/* Block load_blocks[i] of `dst` still holds POISON in every layer. */
static bool block_poisoned(const test_cache_t *dst, size_t i)
{
    for (uint32_t l = 0; l < LAYERS; l++) {
        for (uint32_t p = 0; p < 2; p++) {
            size_t at =
                flat_index(dst, l, p, (uint32_t)load_blocks[i], 0, 0, 0) * 2;
            for (size_t k = 0; k < (size_t)BS * HEADS * DIM * 2; k++) {
                if (dst->mem[at + k] != POISON) {
                    return false;
                }
            }
        }
    }
    return true;
}

static kvd_worker_stats_t stats_of(kvd_worker_t *w)
{
    kvd_worker_stats_t s;
    assert_int_equal(kvd_worker_stats(w, &s), KVD_OK);
    return s;
}

static void test_seed_changes_namespace_and_header(void **state)
{
    (void)state;
    test_cache_t src, dst;
    cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&dst, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 5);
    memset(dst.mem, POISON, dst.bytes);
    kvd_object_format_t f1 = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_TQ4);
    f1.tq_seed = 1;
    kvd_object_format_t f2 = f1;
    f2.tq_seed = 2;
    kvd_namespace_t ns1 = ns_of(&f1), ns2 = ns_of(&f2);
    assert_memory_not_equal(ns1.bytes, ns2.bytes, KVD_NAMESPACE_BYTES);

    kvd_store_t *st = store_open(NULL);
    kvd_worker_t *w1 = worker_in(st, &f1, &ns1);
    worker_register(w1, &src);
    save_step(w1, 1, "writer", save_blocks, keys4, 4);
    kvd_worker_destroy(w1);

    kvd_status_t why[4];
    kvd_worker_t *w2 = worker_in(st, &f2, &ns2);
    worker_register(w2, &dst);
    assert_int_equal(load_four(w2, 2, why), 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(why[i], KVD_ERR_NOT_FOUND);
        assert_true(block_poisoned(&dst, (size_t)i));
    }
    kvd_worker_destroy(w2);

    /* Seed 2's reader in seed 1's namespace: the header refuses. */
    w2 = worker_in(st, &f2, &ns1);
    worker_register(w2, &dst);
    assert_int_equal(load_four(w2, 3, why), 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(why[i], KVD_ERR_CORRUPT);
        assert_true(block_poisoned(&dst, (size_t)i));
    }
    kvd_worker_stats_t s = stats_of(w2);
    assert_int_equal(s.header_errors, 4);
    assert_int_equal(s.load_errors, 4);
    assert_int_equal(s.blocks_loaded, 0);
    worker_store_close(w2, st);
    cache_cleanup(&src);
    cache_cleanup(&dst);
}

/* Flips one byte of the header of keys4[i]'s object in the arena. */
static void header_flip(kvd_store_t *st, const kvd_namespace_t *ns,
                        const kvd_object_format_t *fmt, size_t i, size_t at)
{
    kvd_block_hash_t h = key_hash(keys4[i]);
    kvd_store_lease_t lease;
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, ns, &h, 1, &lease, &m), KVD_OK);
    assert_int_equal(m, 1);
    assert_int_equal(lease.tier, KVD_STORE_TIER_HOST);
    assert_int_equal(lease.size_bytes, kvd_object_stored_bytes(fmt));
    uint8_t *p = kvd_store_lease_ptr(st, &lease);
    assert_non_null(p);
    p[kvd_object_bytes(fmt) + at] ^= 0x01;
    assert_int_equal(kvd_store_release(st, &lease, 1), KVD_OK);
}

static void test_arena_header_corrupt(void **state)
{
    (void)state;
    test_cache_t src, dst;
    cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&dst, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 6);
    memset(dst.mem, POISON, dst.bytes);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_namespace_t ns = test_ns();
    kvd_store_t *st = store_open(NULL);
    kvd_worker_t *w = worker_new(st, &fmt, 2);
    worker_register(w, &src);
    save_step(w, 1, "writer", save_blocks, keys4, 4);
    kvd_worker_destroy(w);
    header_flip(st, &ns, &fmt, 1, 50);  /* inside the namespace */
    header_flip(st, &ns, &fmt, 3, 121); /* inside the header's checksum */

    w = worker_new(st, &fmt, 2);
    worker_register(w, &dst);
    kvd_status_t why[4];
    assert_int_equal(load_four(w, 2, why), 2);
    assert_int_equal(why[0], KVD_ERR_CORRUPT);
    assert_int_equal(why[1], KVD_ERR_CORRUPT);
    assert_true(block_poisoned(&dst, 1));
    assert_true(block_poisoned(&dst, 3));
    assert_false(block_poisoned(&dst, 0));
    assert_false(block_poisoned(&dst, 2));
    kvd_worker_stats_t s = stats_of(w);
    assert_int_equal(s.header_errors, 2);
    assert_int_equal(s.blocks_loaded, 2);
    worker_store_close(w, st);
    cache_cleanup(&src);
    cache_cleanup(&dst);
}

/* Commits the bytes of keys4[from]'s object under keys4[to]'s key (whose
 * object is deleted first), through whatever store `st` is. */
static void commit_under_other_key(kvd_store_t *st,
                                   const kvd_object_format_t *fmt, size_t from,
                                   size_t to)
{
    kvd_namespace_t ns = test_ns();
    size_t bytes = kvd_object_stored_bytes(fmt);
    kvd_block_hash_t hf = key_hash(keys4[from]), ht = key_hash(keys4[to]);
    kvd_store_key_t kt = {ns, ht};
    size_t deleted = 0;
    /* A key still being written to NVMe is not deleted (KVD_ERR_BUSY). */
    assert_int_equal(kvd_store_flush(st, 5000), KVD_OK);
    assert_int_equal(kvd_store_delete(st, &kt, 1, &deleted), KVD_OK);
    assert_int_equal(deleted, 1);
    kvd_store_lease_t lease;
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, &hf, 1, &lease, &m), KVD_OK);
    assert_int_equal(m, 1);
    const uint8_t *p = kvd_store_lease_ptr(st, &lease);
    assert_non_null(p);
    kvd_store_reservation_t r;
    assert_int_equal(kvd_store_reserve(st, &ns, &ht, 1, bytes, 0, &r), KVD_OK);
    assert_int_equal(r.status, KVD_OK);
    uint8_t *q = kvd_store_reservation_ptr(st, &r, bytes);
    assert_non_null(q);
    memcpy(q, p, bytes);
    kvd_status_t cs;
    assert_int_equal(kvd_store_commit(st, &kt, 1, &cs), KVD_OK);
    assert_int_equal(cs, KVD_OK);
    assert_int_equal(kvd_store_release(st, &lease, 1), KVD_OK);
}

static void test_disk_object_under_other_key(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "worker-header-disk");
    test_cache_t src, dst;
    cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&dst, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 7);
    memset(dst.mem, POISON, dst.bytes);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_store_t *st = store_open(d.path);
    kvd_worker_t *w = worker_new(st, &fmt, 2);
    worker_register(w, &src);
    save_step(w, 1, "writer", save_blocks, keys4, 4);
    kvd_worker_destroy(w);
    commit_under_other_key(st, &fmt, 0, 2);
    assert_int_equal(kvd_store_flush(st, 5000), KVD_OK);
    kvd_store_close(st);
    st = store_open(d.path); /* arena empty: every object on DISK */

    w = worker_new(st, &fmt, 2);
    worker_register(w, &dst);
    kvd_status_t why[4];
    assert_int_equal(load_four(w, 2, why), 1);
    assert_int_equal(why[0], KVD_ERR_CORRUPT);
    assert_true(block_poisoned(&dst, 2));
    assert_false(block_poisoned(&dst, 0));
    kvd_worker_stats_t s = stats_of(w);
    assert_int_equal(s.header_errors, 1);
    assert_int_equal(s.promotions, 4);
    worker_store_close(w, st);
    cache_cleanup(&src);
    cache_cleanup(&dst);
    kvd_test_dir_remove(&d);
}

static void test_daemon_object_under_other_key(void **state)
{
    (void)state;
    kvd_test_cl_t t;
    kvd_test_cl_start(&t, "worker-header-daemon", false, NULL);
    kvd_store_t *st = NULL;
    assert_int_equal(kvd_test_cl_open(&t, &st, NULL), KVD_OK);
    test_cache_t src, dst;
    cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&dst, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 8);
    memset(dst.mem, POISON, dst.bytes);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_worker_t *w = worker_new(st, &fmt, 2);
    worker_register(w, &src);
    save_step(w, 1, "writer", save_blocks, keys4, 4);
    commit_under_other_key(st, &fmt, 1, 3);
    kvd_worker_destroy(w);

    w = worker_new(st, &fmt, 2);
    worker_register(w, &dst);
    kvd_status_t why[4];
    assert_int_equal(load_four(w, 2, why), 1);
    assert_int_equal(why[0], KVD_ERR_CORRUPT);
    assert_true(block_poisoned(&dst, 3));
    assert_false(block_poisoned(&dst, 1));
    assert_int_equal(stats_of(w).header_errors, 1);
    kvd_worker_destroy(w);
    kvd_store_close(st);
    cache_cleanup(&src);
    cache_cleanup(&dst);
    kvd_test_cl_stop(&t);
}

/* Tokens the leader matches for keys4 (given as the engine's hashes). */
static uint64_t leader_match(kvd_leader_t *ld, const char *id)
{
    kvd_block_hash_t hs[4];
    for (size_t i = 0; i < 4; i++) {
        hs[i] = key_hash(keys4[i]);
    }
    kvd_leader_request_t rq = {.request_id = id,
                               .hashes = hs,
                               .num_hashes = 4,
                               .num_tokens = 4 * BS + 1};
    uint64_t matched = 0;
    bool async = false;
    assert_int_equal(
        kvd_leader_get_num_new_matched_tokens(ld, &rq, 0, &matched, &async),
        KVD_OK);
    bool delay = false;
    assert_int_equal(kvd_leader_request_finished(ld, id, &delay), KVD_OK);
    return matched;
}

static void test_generation_bump_misses(void **state)
{
    (void)state;
    test_cache_t src, dst;
    cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_init(&dst, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, HEADS, DIM);
    cache_fill_random(&src, 9);
    memset(dst.mem, POISON, dst.bytes);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    kvd_namespace_t ns0 = ns_gen(&fmt, 0), ns1 = ns_gen(&fmt, 1);
    kvd_namespace_t plan = test_ns(), zero;
    memset(&zero, 0, sizeof zero);
    kvd_store_t *st = store_open(NULL);
    kvd_worker_t *w = worker_in(st, &fmt, &ns0);
    worker_register(w, &src);
    save_step(w, 1, "writer", save_blocks, keys4, 4);

    kvd_leader_config_t c = {.block_size = BS, .ns = ns0, .num_workers = 1};
    assert_int_equal(kvd_block_hash_seed(KVD_BLOCK_HASH_DEFAULT_SEED, &c.root),
                     KVD_OK);
    kvd_leader_t *ld = NULL;
    assert_int_equal(kvd_leader_create(&c, st, &ld), KVD_OK);
    assert_int_equal(leader_match(ld, "before"), 4 * BS);
    assert_int_equal(kvd_leader_set_namespace(ld, &ns1), KVD_OK);
    assert_int_equal(leader_match(ld, "after"), 0);
    assert_int_equal(kvd_leader_set_namespace(ld, NULL), KVD_ERR_INVALID);
    kvd_leader_destroy(ld);
    kvd_worker_destroy(w);

    /* The workers move too: only between steps. */
    w = worker_in(st, &fmt, &ns0);
    worker_register(w, &dst);
    treq_t r = {.id = "bound", .n_loads = 1};
    r.load_ids[0] = 0;
    r.load_keys[0] = keys4[0];
    worker_bind(w, 2, &r, 1);
    assert_int_equal(kvd_worker_set_namespace(w, &ns1, &plan), KVD_ERR_STATE);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    kvd_worker_finished_t f; /* the abandoned step's load, reported */
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    assert_int_equal(kvd_worker_set_namespace(w, &ns1, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_worker_set_namespace(w, &ns1, &plan), KVD_OK);
    memset(dst.mem, POISON, dst.bytes);
    kvd_status_t why[4];
    assert_int_equal(load_four(w, 3, why), 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(why[i], KVD_ERR_NOT_FOUND);
        assert_true(block_poisoned(&dst, (size_t)i));
    }
    /* Plans in the worker's own namespace (plan_ns all zero): test_ns()
     * keys are now refused, so nothing is bound. */
    assert_int_equal(kvd_worker_set_namespace(w, &ns1, &zero), KVD_OK);
    size_t len = 0;
    uint8_t *bytes = plan_pack(4, BS, &plan, &r, 1, &len);
    char err[256] = "";
    assert_int_equal(kvd_worker_bind_metadata(w, bytes, len, err, sizeof err),
                     KVD_ERR_PROTO);
    free(bytes);
    worker_store_close(w, st);
    cache_cleanup(&src);
    cache_cleanup(&dst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_changes_namespace_and_header),
        cmocka_unit_test(test_arena_header_corrupt),
        cmocka_unit_test(test_disk_object_under_other_key),
        cmocka_unit_test(test_daemon_object_under_other_key),
        cmocka_unit_test(test_generation_bump_misses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
