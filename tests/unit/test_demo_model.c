/*
 * The demo's model (demo/model_int.h): the llama2.c checkpoint loader on a
 * file the test writes (same weights back, same tokens out, shared and
 * separate classifiers, truncated and malformed files refused), and the
 * paged cache: a forward pass over a block table in any order gives the
 * same tokens as one over blocks in order, and a prompt computed in two
 * steps gives the same tokens as in one; CacheBlend's choice of the reused
 * tokens to recompute, on crafted deviations.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/kvd_testdir_int.h"

#include "demo/model_int.h"

static const kvd_demo_config_t small = {64, 96, 2, 4, 2, 256, 128, 10000.0f};

static void prompt(uint32_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        t[i] = (uint32_t)((i * 37u + 11u) % 256u);
    }
}

/* Greedy tokens after `n` prompt tokens: the prompt in `chunks` steps,
 * then `gen` - 1 decode steps, blocks in `table`. */
static void generate(const kvd_demo_model_t *m, const uint32_t *table, size_t n,
                     size_t chunks, uint32_t *out, size_t gen)
{
    kvd_demo_cache_t c;
    assert_int_equal(kvd_demo_cache_init(m, 8, 16, &c), KVD_OK);
    uint32_t tok[64];
    prompt(tok, n);
    uint32_t next = 0;
    size_t done = 0;
    for (size_t k = 0; k < chunks; k++) {
        size_t upto = n * (k + 1) / chunks;
        assert_int_equal(kvd_demo_forward(m, &c, table, tok + done, upto - done,
                                          (uint32_t)done, NULL, &next),
                         KVD_OK);
        done = upto;
    }
    out[0] = next;
    for (size_t i = 1; i < gen; i++) {
        assert_int_equal(kvd_demo_forward(m, &c, table, &next, 1,
                                          (uint32_t)(n + i - 1), NULL, &next),
                         KVD_OK);
        out[i] = next;
    }
    kvd_demo_cache_free(&c);
}

static void test_paged_cache_and_steps(void **state)
{
    (void)state;
    kvd_demo_model_t m;
    assert_int_equal(kvd_demo_model_init(&small, 7, &m), KVD_OK);
    uint32_t in_order[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    uint32_t shuffled[8] = {5, 2, 7, 0, 3, 6, 1, 4};
    uint32_t a[8], b[8], c[8];
    generate(&m, in_order, 50, 1, a, 8);
    generate(&m, shuffled, 50, 1, b, 8);
    generate(&m, shuffled, 50, 3, c, 8);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_equal(a, c, sizeof a);
    /* A different seed is a different model. */
    kvd_demo_model_t m2;
    assert_int_equal(kvd_demo_model_init(&small, 8, &m2), KVD_OK);
    generate(&m2, in_order, 50, 1, b, 8);
    assert_memory_not_equal(a, b, sizeof a);
    /* Out of range. */
    kvd_demo_cache_t cache;
    assert_int_equal(kvd_demo_cache_init(&m, 2, 16, &cache), KVD_OK);
    uint32_t tok = 300, next;
    assert_int_equal(
        kvd_demo_forward(&m, &cache, in_order, &tok, 1, 0, NULL, &next),
        KVD_ERR_RANGE);
    tok = 1;
    assert_int_equal(
        kvd_demo_forward(&m, &cache, in_order, &tok, 1, 32, NULL, &next),
        KVD_ERR_RANGE);
    kvd_demo_cache_free(&cache);
    kvd_demo_model_free(&m2);
    kvd_demo_config_t bad = small;
    bad.num_kv_heads = 3;
    assert_int_equal(kvd_demo_model_init(&bad, 1, &m2), KVD_ERR_INVALID);
    kvd_demo_model_free(&m);
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* Row of (layer, plane, position) in a cache whose blocks are in order. */
static uint16_t *row_at(const kvd_demo_cache_t *c, uint32_t l, uint32_t p,
                        uint32_t pos, size_t kv)
{
    size_t slot =
        ((size_t)p * c->num_blocks + pos / c->block_size) * c->block_size +
        pos % c->block_size;
    return c->layer[l] + slot * kv;
}

/* CacheBlend's choice on crafted inputs: a prompt computed exactly, then
 * every reused position's rows in layers 2-3 overwritten with a marker and
 * two positions' rows in the check layer (1) zeroed. The forward pass over
 * the prompt with budget 2 must pick exactly those two (their fresh K/V
 * deviate, the others' match): their later-layer rows come back computed,
 * every other reused position keeps the marker. Positions over the set
 * (not reused) are computed at every layer. */
static void test_blend_picks_the_most_deviated(void **state)
{
    (void)state;
    kvd_demo_config_t cfg = small;
    cfg.num_layers = 4;
    kvd_demo_model_t m;
    assert_int_equal(kvd_demo_model_init(&cfg, 7, &m), KVD_OK);
    kvd_demo_cache_t c;
    assert_int_equal(kvd_demo_cache_init(&m, 8, 16, &c), KVD_OK);
    uint32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7}, tok[40], pos[40], next = 0;
    size_t n = 40, kv = (size_t)m.head_dim * cfg.num_kv_heads;
    prompt(tok, n);
    assert_int_equal(kvd_demo_forward(&m, &c, table, tok, n, 0, NULL, &next),
                     KVD_OK);
    uint8_t reused[40] = {0};
    for (uint32_t p = 8; p < 32; p++) {
        reused[p] = 1;
    }
    const uint16_t marker = 0x3c00; /* 1.0 */
    for (uint32_t l = 2; l < 4; l++) {
        for (uint32_t p = 8; p < 32; p++) {
            for (size_t i = 0; i < kv; i++) {
                row_at(&c, l, 0, p, kv)[i] = marker;
            }
        }
    }
    for (uint32_t pl = 0; pl < 2; pl++) {
        memset(row_at(&c, 1, pl, 11, kv), 0, kv * 2);
        memset(row_at(&c, 1, pl, 27, kv), 0, kv * 2);
    }
    for (uint32_t p = 0; p < n; p++) {
        pos[p] = p;
    }
    kvd_demo_blend_t b = {reused, 1, 2};
    /* Positions 8.. of the prompt: 0..7 are the exact prefix. */
    assert_int_equal(kvd_demo_forward_at(&m, &c, table, tok + 8, pos + 8, n - 8,
                                         &b, NULL, &next, NULL),
                     KVD_OK);
    for (uint32_t p = 8; p < 32; p++) {
        bool picked = p == 11 || p == 27;
        for (uint32_t l = 2; l < 4; l++) {
            bool kept = row_at(&c, l, 0, p, kv)[0] == marker &&
                        row_at(&c, l, 0, p, kv)[1] == marker;
            if (kept == picked) {
                fail_msg("position %u layer %u: %s", p, l,
                         picked ? "not recomputed" : "recomputed");
            }
        }
    }
    /* A reused last token, or a check layer past the model, is refused. */
    reused[39] = 1;
    assert_int_equal(kvd_demo_forward_at(&m, &c, table, tok + 8, pos + 8, n - 8,
                                         &b, NULL, &next, NULL),
                     KVD_ERR_INVALID);
    kvd_demo_cache_free(&c);
    kvd_demo_model_free(&m);
}

static void test_checkpoint_loader(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "demo_ckpt");
    char path[300];
    snprintf(path, sizeof path, "%s/model.bin", d.path);
    kvd_demo_model_t m, back;
    assert_int_equal(kvd_demo_model_init(&small, 3, &m), KVD_OK);
    assert_int_equal(kvd_demo_model_save(&m, path), KVD_OK);
    char err[256] = "";
    assert_int_equal(kvd_demo_model_load(path, &back, err, sizeof err), KVD_OK);
    assert_int_equal(back.cfg.dim, small.dim);
    assert_int_equal(back.cfg.num_kv_heads, small.num_kv_heads);
    assert_int_equal(back.cfg.vocab_size, small.vocab_size);
    assert_memory_equal(back.embed, m.embed,
                        (size_t)small.vocab_size * small.dim * sizeof(float));
    assert_memory_equal(back.wcls, m.wcls,
                        (size_t)small.vocab_size * small.dim * sizeof(float));
    assert_memory_equal(back.layers[1].w2, m.layers[1].w2,
                        (size_t)small.dim * small.hidden_dim * sizeof(float));
    uint32_t order[8] = {0, 1, 2, 3, 4, 5, 6, 7}, a[6], b[6];
    generate(&m, order, 40, 2, a, 6);
    generate(&back, order, 40, 2, b, 6);
    assert_memory_equal(a, b, sizeof a);
    kvd_demo_model_free(&back);

    /* Shared classifier (positive vocab_size): wcls is the embedding. */
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    int32_t v = (int32_t)small.vocab_size;
    assert_int_equal(fseek(f, 5 * sizeof(int32_t), SEEK_SET), 0);
    assert_int_equal(fwrite(&v, sizeof v, 1, f), 1);
    fclose(f);
    assert_int_equal(kvd_demo_model_load(path, &back, err, sizeof err), KVD_OK);
    assert_memory_equal(back.wcls, m.embed,
                        (size_t)small.vocab_size * small.dim * sizeof(float));
    kvd_demo_model_free(&back);

    /* Truncated, malformed header, missing file. */
    assert_int_equal(truncate(path, 1000), 0);
    assert_int_equal(kvd_demo_model_load(path, &back, err, sizeof err),
                     KVD_ERR_CORRUPT);
    assert_non_null(strstr(err, "shorter"));
    int32_t hdr[7] = {64, 96, 2, 4, 3, 256, 128}; /* 3 kv heads for 4 */
    write_bytes(path, hdr, sizeof hdr);
    assert_int_equal(kvd_demo_model_load(path, &back, err, sizeof err),
                     KVD_ERR_INVALID);
    hdr[4] = -2;
    write_bytes(path, hdr, sizeof hdr);
    assert_int_equal(kvd_demo_model_load(path, &back, err, sizeof err),
                     KVD_ERR_CORRUPT);
    write_bytes(path, hdr, 10);
    assert_int_equal(kvd_demo_model_load(path, &back, err, sizeof err),
                     KVD_ERR_CORRUPT);
    snprintf(path, sizeof path, "%s/none.bin", d.path);
    assert_int_equal(kvd_demo_model_load(path, &back, err, sizeof err),
                     KVD_ERR_NOT_FOUND);
    kvd_demo_model_free(&m);
    kvd_test_dir_remove(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paged_cache_and_steps),
        cmocka_unit_test(test_checkpoint_loader),
        cmocka_unit_test(test_blend_picks_the_most_deviated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
