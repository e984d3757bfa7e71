/*
 * The persistence round trip at a small size (demo/engine_int.h): each
 * kvd_demo_run opens the store, the leader and the worker from nothing and
 * closes them, as a new process would.
 *
 * Raw: a warm run loads every full prompt block but the last token's from
 * NVMe, computes only the tail, and generates exactly the cold run's
 * tokens; a partial hit loads the shared prefix only and matches the cold
 * run of its own prompt. fp8 gives the same tokens at this size; tq4's
 * agreement is printed and bounded. A block deleted from the store makes
 * the warm run stop matching there and compute the rest; corrupted NVMe
 * data makes the loads fail their checksums, and the run computes those
 * blocks again: the same tokens either way.
 *
 * The same file builds test_demo_cuda_fake (KVD_TEST_DEMO_ON_CUDA): the
 * cache in "GPU memory" of tests/gpu/fake_cuda.c and the worker's CUDA
 * backend, so every round trip above also runs the demo's GPU path in CI;
 * on a GPU machine the plain test takes the real GPU (device auto).
 */
#include <fcntl.h>
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

#include "demo/engine_int.h"
#include "kvdepot/store.h"

#define PROMPT 200u
#define GEN 8u

static kvd_demo_opts_t opts(const char *dir, kvd_codec_t codec)
{
    kvd_demo_opts_t o;
    memset(&o, 0, sizeof o);
    o.store_dir = dir;
    o.codec = codec;
    o.prompt_tokens = PROMPT;
    o.question = " Why?";
    o.gen_tokens = GEN;
    o.model = (kvd_demo_config_t){128, 256, 2, 2, 2, 256, 512, 10000.0f};
    o.seed = 5;
    return o;
}

static kvd_demo_result_t run(const kvd_demo_opts_t *o)
{
    kvd_demo_result_t r;
    char err[256] = "";
    kvd_status_t st = kvd_demo_run(o, &r, err, sizeof err);
    if (st != KVD_OK) {
        fail_msg("demo run: %s (%s)", kvd_status_str(st), err);
    }
#ifdef KVD_TEST_DEMO_ON_CUDA
    assert_true(r.on_cuda);
#endif
    return r;
}

static uint32_t agree(const kvd_demo_result_t *a, const kvd_demo_result_t *b)
{
    uint32_t n = 0;
    while (n < a->num_tokens && n < b->num_tokens &&
           a->tokens[n] == b->tokens[n]) {
        n++;
    }
    return n;
}

/* Full prompt blocks the leader may promise: never the last token's. */
#define HIT (((PROMPT - 1) / KVD_DEMO_BLOCK_SIZE) * KVD_DEMO_BLOCK_SIZE)

static void test_round_trips(void **state)
{
    (void)state;
    kvd_test_dir_t d, ref;
    kvd_test_dir_make(&d, "demo_rt");
    kvd_test_dir_make(&ref, "demo_ref");
    kvd_demo_opts_t o = opts(d.path, KVD_CODEC_RAW);
    kvd_demo_result_t a = run(&o), b = run(&o);
    assert_int_equal(a.matched_tokens, 0);
    assert_int_equal(a.computed_tokens, PROMPT);
    assert_true(a.bytes_stored > 0);
    assert_int_equal(b.matched_tokens, HIT);
    assert_int_equal(b.computed_tokens, PROMPT - HIT);
    assert_int_equal(
        b.bytes_loaded,
        HIT / KVD_DEMO_BLOCK_SIZE *
            (a.bytes_stored / ((PROMPT + GEN - 1) / KVD_DEMO_BLOCK_SIZE)));
    assert_int_equal(b.num_tokens, GEN);
    assert_memory_equal(a.tokens, b.tokens, GEN * sizeof a.tokens[0]);
    /* The same KV bytes, loaded or computed: a small seeded model can
     * give the same greedy tokens with wrong KV; the bytes cannot. */
    assert_int_equal(a.kv_digest, b.kv_digest);

    /* Another question: the shared text loads, the rest is computed. */
    o.question = " And how much?";
    kvd_demo_result_t c = run(&o);
    kvd_demo_opts_t oref = o;
    oref.store_dir = ref.path;
    kvd_demo_result_t cref = run(&oref);
    assert_true(c.matched_tokens > 0 && c.matched_tokens < HIT);
    assert_int_equal(cref.matched_tokens, 0);
    assert_memory_equal(c.tokens, cref.tokens, GEN * sizeof c.tokens[0]);
    assert_int_equal(c.kv_digest, cref.kv_digest);

    /* Lossy codecs: fp8 is exact at this size, tq4 close. */
    o.question = " Why?";
    o.codec = KVD_CODEC_FP8_E4M3;
    (void)run(&o);
    kvd_demo_result_t f = run(&o);
    assert_int_equal(f.matched_tokens, HIT);
    assert_memory_equal(a.tokens, f.tokens, GEN * sizeof a.tokens[0]);
    assert_true(f.bytes_loaded < b.bytes_loaded);
    o.codec = KVD_CODEC_TQ4;
    (void)run(&o);
    kvd_demo_result_t t = run(&o);
    assert_int_equal(t.matched_tokens, HIT);
    print_message("tq4: %u of %u tokens as raw, %llu bytes loaded against "
                  "%llu raw\n",
                  agree(&a, &t), GEN, (unsigned long long)t.bytes_loaded,
                  (unsigned long long)b.bytes_loaded);
    assert_true(agree(&a, &t) >= GEN / 2);
    assert_true(t.bytes_loaded * 3 < b.bytes_loaded);
    kvd_test_dir_remove(&d);
    kvd_test_dir_remove(&ref);
}

/* The store as the demo's runs open it, for surgery between runs. */
static kvd_store_t *store_open(const char *dir)
{
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.disk_path", dir), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.disk_size", "256m"), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_size", "64m"), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_chunk", "1m"), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_prefault", "false"),
                     KVD_OK);
    kvd_store_t *st = NULL;
    assert_int_equal(kvd_store_open(cfg, &st, NULL, 0), KVD_OK);
    kvd_config_destroy(cfg);
    return st;
}

static void test_deleted_block_is_recomputed(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "demo_del");
    kvd_demo_opts_t o = opts(d.path, KVD_CODEC_RAW);
    kvd_demo_result_t a = run(&o);

    /* Delete the prompt's 5th block. */
    kvd_demo_model_t m;
    assert_int_equal(kvd_demo_model_init(&o.model, o.seed, &m), KVD_OK);
    kvd_store_key_t key;
    assert_int_equal(kvd_demo_namespace(&o, &m, &key.ns), KVD_OK);
    kvd_demo_model_free(&m);
    uint32_t tok[PROMPT];
    kvd_demo_prompt(PROMPT, o.question, tok);
    kvd_block_hash_t root, h[PROMPT / KVD_DEMO_BLOCK_SIZE];
    size_t n = 0;
    assert_int_equal(kvd_block_hash_seed(KVD_BLOCK_HASH_DEFAULT_SEED, &root),
                     KVD_OK);
    assert_int_equal(kvd_block_hash_chain(&root, tok, PROMPT,
                                          KVD_DEMO_BLOCK_SIZE, NULL, NULL, h,
                                          PROMPT / KVD_DEMO_BLOCK_SIZE, &n),
                     KVD_OK);
    key.hash = h[4];
    kvd_store_t *st = store_open(d.path);
    size_t deleted = 0;
    assert_int_equal(kvd_store_delete(st, &key, 1, &deleted), KVD_OK);
    assert_int_equal(deleted, 1);
    kvd_store_close(st);

    kvd_demo_result_t b = run(&o);
    assert_int_equal(b.matched_tokens, 4 * KVD_DEMO_BLOCK_SIZE);
    assert_int_equal(b.computed_tokens, PROMPT - 4 * KVD_DEMO_BLOCK_SIZE);
    assert_memory_equal(a.tokens, b.tokens, GEN * sizeof a.tokens[0]);
    /* B saved the block again: a third run matches everything. */
    kvd_demo_result_t c = run(&o);
    assert_int_equal(c.matched_tokens, HIT);
    assert_memory_equal(a.tokens, c.tokens, GEN * sizeof a.tokens[0]);
    kvd_test_dir_remove(&d);
}

static void test_corrupt_blocks_are_recomputed(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "demo_bad");
    kvd_demo_opts_t o = opts(d.path, KVD_CODEC_RAW);
    kvd_demo_result_t a = run(&o);
    /* Scribble over the start of the NVMe data file, where the objects
     * are: their checksums no longer match. */
    char path[300];
    snprintf(path, sizeof path, "%s/kvd-data-000.dat", d.path);
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    static unsigned char junk[1 << 16];
    memset(junk, 0x5a, sizeof junk);
    assert_int_equal(pwrite(fd, junk, sizeof junk, 0), (ssize_t)sizeof junk);
    assert_int_equal(fsync(fd), 0);
    close(fd);

    kvd_demo_result_t b = run(&o);
    assert_int_equal(b.matched_tokens, HIT);
    assert_true(b.failed_blocks > 0);
    assert_true(b.computed_tokens > PROMPT - HIT);
    assert_memory_equal(a.tokens, b.tokens, GEN * sizeof a.tokens[0]);
    kvd_test_dir_remove(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_deleted_block_is_recomputed),
        cmocka_unit_test(test_corrupt_blocks_are_recomputed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
