/*
 * Objects shared by tensor-parallel ranks (worker.h, object_heads;
 * docs/codecs.md, "Head ranges"): every rank of a TP group writes its heads
 * into the one object of a block, which is published when the last rank
 * committed; a reader at any other TP size loads its heads of it.
 *
 * The ranks are workers on one embedded store, each registered on a view of
 * one engine cache holding every head (its heads' base and count, the full
 * cache's strides), as an engine rank holds its slice of the heads. Every
 * check compares bytes: the object written by TP = t equals the one TP = 1
 * writes, and the cache a TP = r group loads equals what the reference
 * kernels give for the whole cache. Through a kvdepotd too (run in this
 * process), each rank with its own client, as engine ranks are processes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/unit/kvd_testworker_int.h"

#include "tests/unit/kvd_testclient_int.h"

#define OBJ_HEADS 8

typedef struct rank {
    kvd_worker_t *w;
    kvd_store_t *own; /* its own daemon client, or NULL */
    void *bases[LAYERS];
    test_cache_t view; /* the rank's heads of the shared cache */
} rank_t;

static kvd_test_cl_t *g_daemon;

static void rank_close(rank_t *rk)
{
    kvd_worker_destroy(rk->w);
    kvd_store_close(rk->own);
}

/* Rank `r` of `tp` over cache `c` (heads split evenly; with fewer heads
 * than ranks, neighbouring ranks hold the same head). `st` NULL: a client
 * of the daemon g_daemon of its own, closed with the rank. */
static void rank_open(rank_t *rk, kvd_store_t *st, const test_cache_t *c,
                      kvd_codec_t codec, uint32_t tp, uint32_t r)
{
    uint32_t n = c->heads >= tp ? c->heads / tp : 1;
    uint32_t h0 = c->heads >= tp ? r * n : r / (tp / c->heads);
    rk->view = *c;
    rk->view.heads = n;
    for (uint32_t l = 0; l < LAYERS; l++) {
        rk->bases[l] = (unsigned char *)c->bases[l] +
                       (size_t)h0 * (size_t)c->layout.stride_head;
    }
    rk->view.layout.layer_base = rk->bases;
    rk->own = NULL;
    if (st == NULL) {
        assert_int_equal(kvd_test_cl_open(g_daemon, &rk->own, NULL), KVD_OK);
        st = rk->own;
    }
    kvd_worker_config_t cfg = {0};
    cfg.store = st;
    cfg.ns = test_ns();
    cfg.format = cache_format(&rk->view, KVD_DTYPE_FP16, codec);
    cfg.worker_rank = r;
    cfg.num_threads = 2;
    cfg.object_heads = c->heads;
    cfg.head_start = h0;
    char err[256] = "";
    kvd_status_t s = kvd_worker_create(&cfg, &rk->w, err, sizeof err);
    if (s != KVD_OK) {
        fail_msg("worker tp %u rank %u: %s (%s)", tp, r, kvd_status_str(s),
                 err);
    }
    worker_register(rk->w, &rk->view);
}

/* Copies the stored object of `key` (*len_out bytes; NULL when absent). */
static unsigned char *object_copy(kvd_store_t *st, uint32_t key,
                                  size_t *len_out)
{
    kvd_namespace_t ns = test_ns();
    kvd_block_hash_t h = key_hash(key);
    kvd_store_lease_t l;
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, &h, 1, &l, &m), KVD_OK);
    if (m == 0) {
        return NULL;
    }
    unsigned char *copy = malloc(l.size_bytes);
    assert_non_null(copy);
    memcpy(copy, kvd_store_lease_ptr(st, &l), l.size_bytes);
    *len_out = l.size_bytes;
    assert_int_equal(kvd_store_release(st, &l, 1), KVD_OK);
    return copy;
}

/* Saves blocks save_blocks as keys4 of cache `src` with `tp` ranks on
 * `ranks_st` (NULL: each its own daemon client), one rank's whole step
 * after the other; nothing is visible in `st` before the last rank's
 * commit. */
static void save_tp(kvd_store_t *st, kvd_store_t *ranks_st,
                    const test_cache_t *src, kvd_codec_t codec, uint32_t tp)
{
    rank_t rk[OBJ_HEADS * 2];
    for (uint32_t r = 0; r < tp; r++) {
        rank_open(&rk[r], ranks_st, src, codec, tp, r);
    }
    for (uint32_t r = 0; r < tp; r++) {
        assert_int_equal(stored(st, keys4, 4), 0);
        save_step(rk[r].w, 1, "writer", save_blocks, keys4, 4);
    }
    assert_int_equal(stored(st, keys4, 4), 4);
    for (uint32_t r = 0; r < tp; r++) {
        rank_close(&rk[r]);
    }
}

/* Loads keys4 with `tp` ranks into a poisoned copy of `like`; the cache
 * must equal `want` (the reference kernels' round trip of every head). */
static void load_tp_equals(kvd_store_t *st, const test_cache_t *like,
                           const test_cache_t *want, kvd_codec_t codec,
                           uint32_t tp)
{
    test_cache_t dst;
    cache_init(&dst, like->kind, 2, LAYERS, BLOCKS, BS, like->heads, like->dim);
    memset(dst.mem, POISON, dst.bytes);
    for (uint32_t r = 0; r < tp; r++) {
        rank_t rk;
        rank_open(&rk, st, &dst, codec, tp, r);
        kvd_status_t failed[4];
        assert_int_equal(load_four(rk.w, 1, failed), 0);
        rank_close(&rk);
    }
    for (uint32_t l = 0; l < LAYERS; l++) {
        for (size_t i = 0; i < 4; i++) {
            if (!layer_block_equal(&dst, want, l, (uint32_t)load_blocks[i])) {
                fail_msg("%s: layer %u block %d differs after a TP %u load",
                         kvd_codec_name(codec), l, load_blocks[i], tp);
            }
        }
    }
    cache_cleanup(&dst);
}

/* Every codec, NHD and HND: objects written at TP 1, 2, 4 and 8 are the
 * same bytes, and each loads at TP 1, 2 and 4 into what the reference
 * kernels give for the whole cache. */
static void test_cross_tp_round_trips(void **state)
{
    (void)state;
    static const kvd_codec_t codecs[] = {KVD_CODEC_RAW, KVD_CODEC_FP8_E4M3,
                                         KVD_CODEC_INT8, KVD_CODEC_KIVI4,
                                         KVD_CODEC_TQ4};
    static const engine_layout_t kinds[] = {LAYOUT_VLLM_NHD, LAYOUT_VLLM_HND};
    static const uint32_t writers[] = {1, 2, 4, 8}, readers[] = {1, 2, 4};
    for (size_t k = 0; k < 2; k++) {
        test_cache_t src, want;
        cache_init(&src, kinds[k], 2, LAYERS, BLOCKS, BS, OBJ_HEADS, DIM);
        cache_fill_random(&src, 77 + k);
        cache_init(&want, kinds[k], 2, LAYERS, BLOCKS, BS, OBJ_HEADS, DIM);
        for (size_t c = 0; c < sizeof codecs / sizeof *codecs; c++) {
            kvd_object_format_t fmt =
                cache_format(&src, KVD_DTYPE_FP16, codecs[c]);
            kvd_codec_tables_t *tables = NULL;
            assert_int_equal(kvd_codec_tables_create(&fmt, &tables), KVD_OK);
            memset(want.mem, POISON, want.bytes);
            expected_cache(&src, &want, &fmt, tables, save_blocks, load_blocks,
                           4);
            kvd_codec_tables_destroy(tables);
            unsigned char *ref = NULL;
            size_t ref_len = 0;
            for (size_t wi = 0; wi < 4; wi++) {
                kvd_store_t *st = store_open(NULL);
                save_tp(st, st, &src, codecs[c], writers[wi]);
                size_t len = 0;
                unsigned char *obj = object_copy(st, keys4[2], &len);
                assert_non_null(obj);
                if (ref == NULL) {
                    ref = obj, ref_len = len;
                } else {
                    assert_int_equal(len, ref_len);
                    if (memcmp(obj, ref, len) != 0) {
                        fail_msg("%s %s: the object TP %u wrote differs from "
                                 "TP 1's",
                                 layout_name(kinds[k]),
                                 kvd_codec_name(codecs[c]), writers[wi]);
                    }
                    free(obj);
                }
                for (size_t ri = 0; ri < 3; ri++) {
                    load_tp_equals(st, &src, &want, codecs[c], readers[ri]);
                }
                kvd_store_close(st);
            }
            free(ref);
        }
        cache_cleanup(&src);
        cache_cleanup(&want);
    }
}

/* A split whose ranges are not 16-byte aligned (int8 K scales of a 2-wide
 * head: 4 bytes a head) goes through each rank's buffer instead of
 * straight into the object; the bytes are the same. */
static void test_unaligned_split(void **state)
{
    (void)state;
    test_cache_t src, want;
    cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, OBJ_HEADS, 2);
    cache_fill_random(&src, 21);
    cache_init(&want, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, OBJ_HEADS, 2);
    memset(want.mem, POISON, want.bytes);
    kvd_object_format_t fmt =
        cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_INT8);
    assert_false(kvd_object_shard_direct(&fmt, 2, 2)); /* TP 4 */
    assert_false(kvd_object_shard_direct(&fmt, 3, 1)); /* TP 8 */
    assert_true(kvd_object_shard_direct(&fmt, 4, 4));  /* TP 2: 16 bytes */
    kvd_object_format_t wide = fmt;
    wide.head_dim = DIM;
    assert_true(kvd_object_shard_direct(&wide, 2, 2));
    expected_cache(&src, &want, &fmt, NULL, save_blocks, load_blocks, 4);
    unsigned char *ref = NULL;
    size_t ref_len = 0;
    static const uint32_t writers[] = {1, 4, 8};
    for (size_t wi = 0; wi < 3; wi++) {
        kvd_store_t *st = store_open(NULL);
        save_tp(st, st, &src, KVD_CODEC_INT8, writers[wi]);
        size_t len = 0;
        unsigned char *obj = object_copy(st, keys4[1], &len);
        assert_non_null(obj);
        if (ref == NULL) {
            ref = obj, ref_len = len;
        } else {
            assert_int_equal(len, ref_len);
            assert_memory_equal(obj, ref, len);
            free(obj);
        }
        load_tp_equals(st, &src, &want, KVD_CODEC_INT8, 4);
        load_tp_equals(st, &src, &want, KVD_CODEC_INT8, 8);
        kvd_store_close(st);
    }
    free(ref);
    cache_cleanup(&src);
    cache_cleanup(&want);
}

/* Through a daemon, every rank its own client: TP 2 writes (the object
 * published with the second rank's commit, checked by the daemon as a
 * whole object never is by a part), TP 4 and TP 1 load. */
static void test_cross_tp_through_daemon(void **state)
{
    (void)state;
    kvd_test_cl_t d;
    kvd_test_cl_start(&d, "shared", false, NULL);
    g_daemon = &d;
    static const kvd_codec_t codecs[] = {KVD_CODEC_RAW, KVD_CODEC_KIVI4};
    for (size_t c = 0; c < 2; c++) {
        test_cache_t src, want;
        cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, OBJ_HEADS,
                   DIM);
        cache_fill_random(&src, 31 + c);
        cache_init(&want, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, OBJ_HEADS,
                   DIM);
        memset(want.mem, POISON, want.bytes);
        kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, codecs[c]);
        expected_cache(&src, &want, &fmt, NULL, save_blocks, load_blocks, 4);
        kvd_store_t *probe = NULL;
        assert_int_equal(kvd_test_cl_open(&d, &probe, NULL), KVD_OK);
        /* Each pass its own keys: the daemon keeps the previous ones. */
        kvd_namespace_t ns = test_ns();
        kvd_store_key_t k[4];
        for (size_t i = 0; i < 4; i++) {
            k[i].ns = ns;
            k[i].hash = key_hash(keys4[i]);
        }
        size_t deleted = 0;
        (void)kvd_store_delete(probe, k, 4, &deleted);
        save_tp(probe, NULL, &src, codecs[c], 2);
        load_tp_equals(NULL, &src, &want, codecs[c], 4);
        load_tp_equals(NULL, &src, &want, codecs[c], 1);
        kvd_store_close(probe);
        cache_cleanup(&src);
        cache_cleanup(&want);
    }
    g_daemon = NULL;
    kvd_test_cl_stop(&d);
}

/* From NVMe: written at TP 2 through to disk, the store reopened (its arena
 * empty), loaded at TP 4 and TP 1 by promotion. */
static void test_cross_tp_from_disk(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "shared-disk");
    test_cache_t src, want;
    cache_init(&src, LAYOUT_VLLM_HND, 2, LAYERS, BLOCKS, BS, OBJ_HEADS, DIM);
    cache_fill_random(&src, 12);
    cache_init(&want, LAYOUT_VLLM_HND, 2, LAYERS, BLOCKS, BS, OBJ_HEADS, DIM);
    memset(want.mem, POISON, want.bytes);
    kvd_object_format_t fmt =
        cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_INT8);
    expected_cache(&src, &want, &fmt, NULL, save_blocks, load_blocks, 4);
    kvd_store_t *st = store_open(d.path);
    save_tp(st, st, &src, KVD_CODEC_INT8, 2);
    assert_int_equal(kvd_store_flush(st, 5000), KVD_OK);
    kvd_store_close(st);
    st = store_open(d.path);
    kvd_store_stats_t ss;
    assert_int_equal(kvd_store_stats(st, &ss), KVD_OK);
    assert_int_equal(ss.host.objects, 0);
    assert_int_equal(ss.disk.objects, 4);
    load_tp_equals(st, &src, &want, KVD_CODEC_INT8, 4);
    load_tp_equals(st, &src, &want, KVD_CODEC_INT8, 1);
    kvd_store_close(st);
    cache_cleanup(&src);
    cache_cleanup(&want);
    kvd_test_dir_remove(&d);
}

/* Two KV heads at TP 4: ranks 0 and 1 hold head 0, ranks 2 and 3 head 1.
 * One of each pair writes its part (the other is told it is being
 * written), and TP 1 loads both heads back. */
static void test_replicated_heads(void **state)
{
    (void)state;
    test_cache_t src, want;
    cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, 2, DIM);
    cache_fill_random(&src, 5);
    cache_init(&want, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, 2, DIM);
    memset(want.mem, POISON, want.bytes);
    kvd_object_format_t fmt = cache_format(&src, KVD_DTYPE_FP16, KVD_CODEC_RAW);
    expected_cache(&src, &want, &fmt, NULL, save_blocks, load_blocks, 4);
    kvd_store_t *st = store_open(NULL);
    rank_t rk[4];
    uint64_t skipped = 0;
    for (uint32_t r = 0; r < 4; r++) {
        rank_open(&rk[r], st, &src, KVD_CODEC_RAW, 4, r);
        save_step(rk[r].w, 1, "writer", save_blocks, keys4, 4);
        kvd_worker_stats_t ws;
        assert_int_equal(kvd_worker_stats(rk[r].w, &ws), KVD_OK);
        skipped += ws.saves_skipped;
        /* Published with part 1's first writer (rank 2). */
        assert_int_equal(stored(st, keys4, 4), r >= 2 ? 4 : 0);
    }
    assert_int_equal(skipped, 8); /* ranks 1 and 3: 4 blocks each */
    for (uint32_t r = 0; r < 4; r++) {
        kvd_worker_destroy(rk[r].w);
    }
    load_tp_equals(st, &src, &want, KVD_CODEC_RAW, 1);
    load_tp_equals(st, &src, &want, KVD_CODEC_RAW, 4);
    kvd_store_close(st);
    cache_cleanup(&src);
    cache_cleanup(&want);
}

/* A rank whose step is aborted abandons the objects: the other rank's
 * committed part is never published, the slots are given back, and the
 * next save of the same blocks by both ranks publishes them. */
static void test_aborted_part_publishes_nothing(void **state)
{
    (void)state;
    test_cache_t src;
    cache_init(&src, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, OBJ_HEADS, DIM);
    cache_fill_random(&src, 9);
    kvd_store_t *st = store_open(NULL);
    rank_t rk[2];
    for (uint32_t r = 0; r < 2; r++) {
        rank_open(&rk[r], st, &src, KVD_CODEC_FP8_E4M3, 2, r);
    }
    save_step(rk[0].w, 1, "writer", save_blocks, keys4, 4);
    treq_t q = {.id = "writer", .layerwise = true, .n_saves = 4};
    memcpy(q.save_ids, save_blocks, sizeof save_blocks);
    memcpy(q.save_keys, keys4, sizeof keys4);
    worker_bind(rk[1].w, 1, &q, 1);
    assert_int_equal(kvd_worker_start_load_kv(rk[1].w, NULL), KVD_OK);
    assert_int_equal(kvd_worker_save_kv_layer(rk[1].w, 0, NULL), KVD_OK);
    assert_int_equal(kvd_worker_abort_step(rk[1].w), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(rk[1].w), KVD_OK);
    kvd_worker_finished_t f; /* the aborted request, reported */
    assert_int_equal(kvd_worker_get_finished(rk[1].w, NULL, 0, &f), KVD_OK);
    assert_int_equal(f.num_finished_saving, 1);
    assert_int_equal(stored(st, keys4, 4), 0);
    kvd_store_stats_t ss;
    assert_int_equal(kvd_store_stats(st, &ss), KVD_OK);
    assert_int_equal(ss.host.objects, 0);
    for (uint32_t r = 0; r < 2; r++) {
        save_step(rk[r].w, 2, "again", save_blocks, keys4, 4);
    }
    assert_int_equal(stored(st, keys4, 4), 4);
    for (uint32_t r = 0; r < 2; r++) {
        kvd_worker_destroy(rk[r].w);
    }
    kvd_store_close(st);
    cache_cleanup(&src);
}

/* Splits that cannot be one object's parts are refused at create. */
static void test_bad_splits_refused(void **state)
{
    (void)state;
    kvd_store_t *st = store_open(NULL);
    test_cache_t c;
    cache_init(&c, LAYOUT_VLLM_NHD, 2, LAYERS, BLOCKS, BS, 2, DIM);
    static const struct {
        uint32_t object_heads, head_start;
        kvd_codec_t k_codec;
        uint32_t bs, dim;
        kvd_status_t want;
    } cases[] = {
        {3, 0, KVD_CODEC_RAW, BS, DIM, KVD_ERR_INVALID},   /* not a multiple */
        {4, 1, KVD_CODEC_RAW, BS, DIM, KVD_ERR_INVALID},   /* unaligned */
        {4, 4, KVD_CODEC_RAW, BS, DIM, KVD_ERR_INVALID},   /* outside */
        {256, 0, KVD_CODEC_RAW, BS, DIM, KVD_ERR_INVALID}, /* 128 parts */
        /* KIVI2 K of one token, 3 channels: 6 bits a head */
        {4, 2, KVD_CODEC_KIVI2, 1, 3, KVD_ERR_UNSUPPORTED},
        {4, 2, KVD_CODEC_KIVI2, 1, 4, KVD_OK}, /* 8 bits */
        {4, 2, KVD_CODEC_KIVI2, 1, DIM, KVD_OK},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kvd_worker_config_t cfg = {0};
        cfg.store = st;
        cfg.ns = test_ns();
        cfg.format = cache_format(&c, KVD_DTYPE_FP16, KVD_CODEC_RAW);
        cfg.format.codec[0] = cases[i].k_codec;
        cfg.format.block_size = cases[i].bs;
        cfg.format.head_dim = cases[i].dim;
        cfg.object_heads = cases[i].object_heads;
        cfg.head_start = cases[i].head_start;
        kvd_worker_t *w = NULL;
        char err[256] = "";
        kvd_status_t s = kvd_worker_create(&cfg, &w, err, sizeof err);
        if (s != cases[i].want) {
            fail_msg("case %zu: %s (%s)", i, kvd_status_str(s), err);
        }
        if (s != KVD_OK) {
            assert_true(strstr(err, "worker:") != NULL);
        }
        kvd_worker_destroy(w);
    }
    cache_cleanup(&c);
    kvd_store_close(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cross_tp_round_trips),
        cmocka_unit_test(test_unaligned_split),
        cmocka_unit_test(test_cross_tp_through_daemon),
        cmocka_unit_test(test_cross_tp_from_disk),
        cmocka_unit_test(test_replicated_heads),
        cmocka_unit_test(test_aborted_part_publishes_nothing),
        cmocka_unit_test(test_bad_splits_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
