/*
 * The retrieval scenario of chunk reuse at a small size (demo/rag.c,
 * docs/chunk-reuse.md): four documents shuffled behind another question,
 * every run in a new process on a copy of the store the first prompt
 * filled. Prefix matching must give the cold run exactly (same tokens,
 * same distributions: its KV is exact); content matches must reuse every
 * document block, each repair must recompute what it promises, and the
 * runs without a full recompute must differ from the cold run a little
 * (KL > 0: the reused KV really was used), never wildly.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "demo/rag_int.h"
#include "tests/unit/kvd_testdir_int.h"

#define DOC 32

static void test_shuffled_documents(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "rag");
    static kvd_demo_rag_t x;
    kvd_demo_opts_t o = {0};
    o.codec = KVD_CODEC_RAW;
    o.gen_tokens = 16;
    o.seed = 42;
    o.model = (kvd_demo_config_t){64, 128, 3, 2, 2, 256, 1024, 10000.0f};
    assert_int_equal(kvd_demo_rag_run(&o, d.path, DOC, 1, &x), 0);
    kvd_demo_rag_print(&x);

    const kvd_demo_result_t *cold = &x.cold.r;
    assert_int_equal(cold->matched_tokens, 0);
    assert_int_equal(cold->computed_tokens, cold->prompt_tokens);

    const kvd_demo_rag_row_t *pre = &x.rows[KVD_DEMO_REUSE_PREFIX];
    assert_int_equal(pre->run.r.matched_tokens, 48); /* the system line */
    assert_int_equal(pre->run.r.reused_tokens, 0);
    assert_int_equal(pre->agree, pre->run.r.num_tokens);
    assert_true(pre->run.r.kl_mean == 0.0);

    for (int m = KVD_DEMO_REUSE_CHUNKS; m <= KVD_DEMO_REUSE_CACHEBLEND; m++) {
        const kvd_demo_result_t *r = &x.rows[m].run.r;
        assert_int_equal(r->matched_tokens, 48);
        assert_int_equal(r->reused_tokens, KVD_DEMO_RAG_DOCS * DOC);
        assert_int_equal(r->computed_tokens,
                         r->prompt_tokens - 48 - KVD_DEMO_RAG_DOCS * DOC);
        assert_int_equal(r->failed_blocks, 0);
        assert_true(r->kl_mean > 0.0 && r->kl_mean < 0.5);
        assert_true(kvd_demo_rag_kept(r) > 0.6);
    }
    /* One run of eight reused blocks: its first 16 tokens. */
    assert_int_equal(x.rows[KVD_DEMO_REUSE_CHUNKS].run.r.recomputed_tokens, 0);
    assert_int_equal(x.rows[KVD_DEMO_REUSE_SELECTIVE].run.r.recomputed_tokens,
                     16);
    /* ceil(0.15 * 128) */
    assert_int_equal(x.rows[KVD_DEMO_REUSE_CACHEBLEND].run.r.recomputed_tokens,
                     20);
    kvd_test_dir_remove(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shuffled_documents),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
