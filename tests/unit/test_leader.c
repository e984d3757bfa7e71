/*
 * Leader (include/kvdepot/leader.h): scripted engine step sequences against
 * a scripted store (every lease counted) and against the embedded store.
 * Plans are unpacked and checked block by block against hash chains
 * computed independently with kvd_block_hash_chain.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "kvdepot/leader.h"
#include "store/ops.h"
#include "proto/kvd_proto.h"

#define BS 16u

/* ---- a scripted store ---------------------------------------------------- */

typedef struct fake {
    kvd_store_t base; /* first: the fake is a store (store/ops.h) */
    kvd_block_hash_t stored[256];
    uint32_t tier[256];
    size_t num_stored;
    int64_t leases;
    int busy;             /* lookups answer KVD_AGAIN while set */
    char last_source[64]; /* the source node last named to a lookup */
    kvd_status_t fail;    /* lookups answer this error while non-zero */
} fake_t;

static kvd_status_t fake_lookup(kvd_store_t *ctx, const kvd_namespace_t *ns,
                                const kvd_block_hash_t *hashes, size_t n,
                                const char *source, kvd_store_lease_t *out,
                                size_t *matched)
{
    fake_t *f = (fake_t *)ctx;
    if (source != NULL) {
        snprintf(f->last_source, sizeof f->last_source, "%s", source);
    }
    if (f->busy) {
        return KVD_AGAIN;
    }
    if (f->fail != KVD_OK) {
        return f->fail;
    }
    size_t m = 0;
    for (; m < n; m++) {
        size_t k = 0;
        while (k < f->num_stored &&
               memcmp(&f->stored[k], &hashes[m], sizeof hashes[m]) != 0) {
            k++;
        }
        if (k == f->num_stored) {
            break;
        }
        memset(&out[m], 0, sizeof out[m]);
        out[m].key.ns = *ns;
        out[m].key.hash = hashes[m];
        out[m].tier = f->tier[k];
        f->leases++;
    }
    *matched = m;
    return KVD_OK;
}

static kvd_status_t fake_release(kvd_store_t *ctx, const kvd_store_lease_t *l,
                                 size_t n)
{
    (void)l;
    ((fake_t *)ctx)->leases -= (int64_t)n;
    return KVD_OK;
}

/* A store with the two calls the leader makes; the others stay NULL
 * (store/store_api.c answers them KVD_ERR_UNSUPPORTED). */
static const kvd_store_ops_t fake_ops = {
    .name = "fake", .lookup = fake_lookup, .release = fake_release};

static kvd_store_t *fake_as_store(fake_t *f)
{
    f->base.ops = &fake_ops;
    return &f->base;
}

static void fake_store(fake_t *f, const kvd_block_hash_t *h, size_t n,
                       uint32_t tier)
{
    for (size_t i = 0; i < n; i++) {
        f->stored[f->num_stored] = h[i];
        f->tier[f->num_stored++] = tier;
    }
}

/* ---- helpers ------------------------------------------------------------- */

static kvd_leader_config_t config(uint32_t workers)
{
    kvd_leader_config_t c;
    memset(&c, 0, sizeof c);
    c.block_size = BS;
    memset(c.ns.bytes, 0x5e, sizeof c.ns.bytes);
    assert_int_equal(kvd_block_hash_seed(KVD_BLOCK_HASH_DEFAULT_SEED, &c.root),
                     KVD_OK);
    c.num_workers = workers;
    return c;
}

static kvd_leader_t *leader_on(fake_t *f, uint32_t workers)
{
    kvd_leader_config_t c = config(workers);
    kvd_leader_t *ld = NULL;
    assert_int_equal(kvd_leader_create(&c, fake_as_store(f), &ld), KVD_OK);
    return ld;
}

static void prompt(uint32_t *tok, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        tok[i] = seed * 1000 + (uint32_t)i;
    }
}

static size_t chain(const uint32_t *tok, size_t n, const char *salt,
                    kvd_block_hash_t *out)
{
    kvd_leader_config_t c = config(1);
    kvd_block_extras_t first = {.cache_salt = salt};
    size_t m = 0;
    assert_int_equal(
        kvd_block_hash_chain(&c.root, tok, n, BS, &first, NULL, out, 256, &m),
        KVD_OK);
    return m;
}

static kvd_pb_step_plan_t *plan_of(kvd_leader_t *ld)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(kvd_leader_build_connector_meta(ld, &buf, &len), KVD_OK);
    kvd_pb_step_plan_t *p = NULL;
    char reason[256] = "";
    assert_int_equal(
        kvd_proto_step_plan_unpack(buf, len, &p, reason, sizeof reason),
        KVD_OK);
    free(buf);
    return p;
}

static const kvd_pb_step_request_t *plan_req(const kvd_pb_step_plan_t *p,
                                             const char *id)
{
    for (size_t i = 0; i < p->n_requests; i++) {
        if (strcmp(p->requests[i]->request_id, id) == 0) {
            return p->requests[i];
        }
    }
    return NULL;
}

static void report(kvd_leader_t *ld, uint64_t step, const char *saved,
                   const char *loaded, const char *failed_req,
                   uint32_t failed_block)
{
    kvd_pb_worker_report_t r = KVDEPOT__V1__WORKER_REPORT__INIT;
    char *s[1] = {(char *)saved}, *l[1] = {(char *)loaded};
    kvd_pb_failed_load_t fl = KVDEPOT__V1__FAILED_LOAD__INIT;
    kvd_pb_failed_load_t *flp[1] = {&fl};
    r.step = step;
    if (saved != NULL) {
        r.n_finished_saving = 1;
        r.finished_saving = s;
    }
    if (loaded != NULL) {
        r.n_finished_loading = 1;
        r.finished_loading = l;
    }
    if (failed_req != NULL) {
        fl.request_id = (char *)failed_req;
        fl.block_id = failed_block;
        fl.status = KVD_ERR_CHECKSUM;
        r.n_failed_loads = 1;
        r.failed_loads = flp;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(
        kvd_proto_worker_report_pack_alloc(&r, &buf, &len, NULL, 0), KVD_OK);
    assert_int_equal(kvd_leader_update_connector_output(ld, buf, len), KVD_OK);
    free(buf);
}

static kvd_status_t match(kvd_leader_t *ld, const char *id, const uint32_t *tok,
                          size_t n, const char *salt, uint64_t computed,
                          uint64_t *matched, bool *async)
{
    kvd_leader_request_t q = {
        .request_id = id, .tokens = tok, .num_tokens = n, .cache_salt = salt};
    return kvd_leader_get_num_new_matched_tokens(ld, &q, computed, matched,
                                                 async);
}

static void ids(uint32_t *out, size_t n, uint32_t base)
{
    for (size_t i = 0; i < n; i++) {
        out[i] = base + (uint32_t)i;
    }
}

/* A leader over an empty scripted store, and a prompt of `n` tokens with
 * its block hashes in `h`. */
static kvd_leader_t *scene(fake_t *f, uint32_t workers, uint32_t *tok, size_t n,
                           uint32_t seed, kvd_block_hash_t *h)
{
    memset(f, 0, sizeof *f);
    prompt(tok, n, seed);
    assert_int_equal(chain(tok, n, NULL, h), n / BS);
    return leader_on(f, workers);
}

/* ---- sequences ----------------------------------------------------------- */

static void test_no_hit_saves_and_delays_free(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[100], blocks[7];
    kvd_block_hash_t h[8];
    kvd_leader_t *ld = scene(&f, 1, tok, 100, 1, h); /* 6 full blocks */
    uint64_t m = 99;
    bool async = true;
    assert_int_equal(match(ld, "a", tok, 100, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    assert_false(async);
    ids(blocks, 7, 40);
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, "a", blocks, 7, 0),
                     KVD_OK);
    assert_int_equal(
        kvd_leader_request_scheduled(ld, "a", NULL, 0, NULL, 0, NULL, 0, 100),
        KVD_OK);
    kvd_pb_step_plan_t *p = plan_of(ld);
    assert_int_equal(p->step, 1);
    assert_int_equal(p->block_size, BS);
    const kvd_pb_step_request_t *q = plan_req(p, "a");
    assert_non_null(q);
    assert_int_equal(q->n_loads, 0);
    assert_int_equal(q->n_saves, 6);
    for (size_t i = 0; i < 6; i++) {
        assert_int_equal(q->saves[i]->block_id, 40 + i);
        assert_memory_equal(q->saves[i]->key->block_hash.data, h[i].bytes, 32);
    }
    kvd_proto_step_plan_free(p);
    /* Nothing new: an empty plan. */
    p = plan_of(ld);
    assert_int_equal(p->n_requests, 0);
    kvd_proto_step_plan_free(p);

    bool delay = false;
    assert_int_equal(kvd_leader_request_finished(ld, "a", &delay), KVD_OK);
    assert_true(delay);
    report(ld, 1, "a", NULL, NULL, 0);
    kvd_leader_stats_t st;
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.requests, 0);
    assert_int_equal(st.planned_saves, 6);
    assert_int_equal(kvd_leader_request_finished(ld, "a", &delay),
                     KVD_ERR_NOT_FOUND);
    kvd_leader_destroy(ld);
}

static void test_full_hit_never_claims_last_block(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[112], blocks[7];
    kvd_block_hash_t h[8];
    kvd_leader_t *ld = scene(&f, 1, tok, 112, 2, h);
    fake_store(&f, h, 7, KVD_STORE_TIER_HOST);
    uint64_t m = 0;
    bool async = true;
    assert_int_equal(match(ld, "b", tok, 112, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 96); /* 6 of 7 blocks: the last token is computed */
    assert_false(async);
    assert_int_equal(f.leases, 6);
    /* Side-effect free when asked again. */
    assert_int_equal(match(ld, "b", tok, 112, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 96);
    assert_int_equal(f.leases, 6);

    ids(blocks, 7, 10);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "b", blocks, 7, 96), KVD_OK);
    assert_int_equal(
        kvd_leader_request_scheduled(ld, "b", NULL, 0, NULL, 0, NULL, 0, 112),
        KVD_OK);
    kvd_pb_step_plan_t *p = plan_of(ld);
    const kvd_pb_step_request_t *q = plan_req(p, "b");
    assert_non_null(q);
    assert_int_equal(q->n_loads, 6);
    assert_int_equal(q->num_load_tokens, 96);
    assert_false(q->async_load);
    for (size_t i = 0; i < 6; i++) {
        assert_int_equal(q->loads[i]->block_id, 10 + i);
        assert_int_equal(q->loads[i]->source->tier,
                         KVDEPOT__V1__TIER__TIER_HOST);
        assert_memory_equal(q->loads[i]->key->block_hash.data, h[i].bytes, 32);
    }
    /* The stored 7th block is not saved again... it is: the leader only
     * knows the prefix it leased, and the store answers EXISTS. */
    assert_int_equal(q->n_saves, 1);
    assert_int_equal(q->saves[0]->block_id, 16);
    kvd_proto_step_plan_free(p);
    report(ld, 1, "b", "b", NULL, 0);
    assert_int_equal(f.leases, 0);
    const char *done[4];
    assert_int_equal(kvd_leader_take_finished_loads(ld, done, 4), 0);
    bool delay = true;
    assert_int_equal(kvd_leader_request_finished(ld, "b", &delay), KVD_OK);
    assert_false(delay);
    kvd_leader_destroy(ld);
}

static void test_partial_hit_and_fewer_blocks_taken(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[112], blocks[7];
    kvd_block_hash_t h[8];
    kvd_leader_t *ld = scene(&f, 1, tok, 112, 3, h);
    fake_store(&f, h, 3, KVD_STORE_TIER_HOST);
    uint64_t m = 0;
    bool async = true;
    /* The engine has block 0 locally already. */
    assert_int_equal(match(ld, "c", tok, 112, NULL, 16, &m, &async), KVD_OK);
    assert_int_equal(m, 32);
    assert_int_equal(f.leases, 2);
    ids(blocks, 7, 0);
    /* The engine takes one block of the two. */
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "c", blocks, 7, 48),
        KVD_ERR_RANGE);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "c", blocks, 7, 16), KVD_OK);
    assert_int_equal(f.leases, 1);
    kvd_pb_step_plan_t *p = plan_of(ld);
    const kvd_pb_step_request_t *q = plan_req(p, "c");
    assert_int_equal(q->n_loads, 1);
    assert_int_equal(q->loads[0]->block_id, 1);
    kvd_proto_step_plan_free(p);
    bool delay = true;
    assert_int_equal(kvd_leader_request_finished(ld, "c", &delay), KVD_OK);
    assert_false(delay);
    assert_int_equal(f.leases, 0);
    kvd_leader_destroy(ld);
}

static void test_chunked_prefill_and_decode(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[176], blocks[12];
    kvd_block_hash_t h[16];
    kvd_leader_t *ld = scene(&f, 1, tok, 176, 4, h);
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "d", tok, 165, NULL, 0, &m, &async), KVD_OK);
    ids(blocks, 12, 100);
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, "d", blocks, 4, 0),
                     KVD_OK);
    /* Three chunks: 64, 64, 37 tokens of a 165-token prompt. */
    static const uint64_t computed[3] = {64, 128, 165};
    static const size_t want_from[3] = {0, 4, 8}, want_n[3] = {4, 4, 2};
    for (int step = 0; step < 3; step++) {
        size_t add = step == 0 ? 0 : 4;
        assert_int_equal(kvd_leader_request_scheduled(
                             ld, "d", blocks + 4 * step, add ? 4 : 0, NULL, 0,
                             NULL, 0, computed[step]),
                         KVD_OK);
        kvd_pb_step_plan_t *p = plan_of(ld);
        const kvd_pb_step_request_t *q = plan_req(p, "d");
        assert_non_null(q);
        assert_int_equal(q->n_saves, want_n[step]);
        for (size_t i = 0; i < q->n_saves; i++) {
            size_t b = want_from[step] + i;
            assert_int_equal(q->saves[i]->block_id, 100 + b);
            assert_memory_equal(q->saves[i]->key->block_hash.data, h[b].bytes,
                                32);
        }
        kvd_proto_step_plan_free(p);
    }
    /* Decode: tokens 165..175 arrive one per step; block 10 completes at
     * 176 tokens. */
    for (uint32_t t = 165; t < 176; t++) {
        assert_int_equal(kvd_leader_request_scheduled(ld, "d", NULL, 0, &tok[t],
                                                      1, NULL, 0, t + 1),
                         KVD_OK);
        kvd_pb_step_plan_t *p = plan_of(ld);
        const kvd_pb_step_request_t *q = plan_req(p, "d");
        if (t + 1 < 176) {
            assert_null(q);
        } else {
            assert_non_null(q);
            assert_int_equal(q->n_saves, 1);
            assert_int_equal(q->saves[0]->block_id, 110);
            assert_memory_equal(q->saves[0]->key->block_hash.data, h[10].bytes,
                                32);
        }
        kvd_proto_step_plan_free(p);
    }
    kvd_leader_destroy(ld);
}

static void test_preempt_and_abort_release_everything(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[80], blocks[5];
    kvd_block_hash_t h[8];
    kvd_leader_t *ld = scene(&f, 1, tok, 80, 5, h);
    fake_store(&f, h, 5, KVD_STORE_TIER_HOST);
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "e", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 64);
    ids(blocks, 5, 0);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "e", blocks, 5, 64), KVD_OK);
    assert_int_equal(kvd_leader_request_preempted(ld, "e"), KVD_OK);
    assert_int_equal(f.leases, 0);
    kvd_pb_step_plan_t *p = plan_of(ld);
    assert_int_equal(p->n_preempted_request_ids, 1);
    assert_string_equal(p->preempted_request_ids[0], "e");
    assert_null(plan_req(p, "e")); /* its loads were dropped */
    kvd_proto_step_plan_free(p);
    /* Resumed: asked again, looked up again. */
    assert_int_equal(match(ld, "e", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 64);
    assert_int_equal(f.leases, 4);
    /* Aborted before anything ran. */
    bool delay = true;
    assert_int_equal(kvd_leader_request_finished(ld, "e", &delay), KVD_OK);
    assert_false(delay);
    assert_int_equal(f.leases, 0);
    kvd_leader_stats_t st;
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.requests, 0);
    assert_int_equal(st.leases, 0);
    kvd_leader_destroy(ld);
}

static void test_async_load_failure(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[80], blocks[5];
    kvd_block_hash_t h[8];
    kvd_leader_t *ld = scene(&f, 1, tok, 80, 6, h);
    fake_store(&f, h, 2, KVD_STORE_TIER_HOST);
    fake_store(&f, h + 2, 3, KVD_STORE_TIER_DISK);
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "f", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 64);
    assert_true(async);
    ids(blocks, 5, 20);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "f", blocks, 5, 64), KVD_OK);
    kvd_pb_step_plan_t *p = plan_of(ld);
    const kvd_pb_step_request_t *q = plan_req(p, "f");
    assert_true(q->async_load);
    assert_int_equal(q->loads[3]->source->tier, KVDEPOT__V1__TIER__TIER_DISK);
    kvd_proto_step_plan_free(p);
    /* Block 22 fails its checksum. */
    report(ld, 1, NULL, NULL, "f", 22);
    uint32_t bad[4];
    assert_int_equal(kvd_leader_take_failed_blocks(ld, bad, 4), 1);
    assert_int_equal(bad[0], 22);
    assert_int_equal(kvd_leader_take_failed_blocks(ld, bad, 4), 0);
    const char *done[4];
    assert_int_equal(kvd_leader_take_finished_loads(ld, done, 4), 1);
    assert_string_equal(done[0], "f");
    assert_int_equal(f.leases, 0);
    /* vLLM's "recompute" policy puts the request back in its queue and
     * asks again: a fresh lookup, not the answer that failed (the store
     * dropped the bad object). */
    kvd_leader_stats_t st;
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    uint64_t lookups = st.lookups;
    f.num_stored = 2; /* blocks 2..4 are gone */
    assert_int_equal(match(ld, "f", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 32);
    assert_false(async);
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.lookups, lookups + 1);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "f", blocks, 5, 32), KVD_OK);
    p = plan_of(ld);
    q = plan_req(p, "f");
    assert_non_null(q);
    assert_int_equal(q->n_loads, 2);
    kvd_proto_step_plan_free(p);
    report(ld, 2, NULL, "f", NULL, 0);
    assert_int_equal(f.leases, 0);
    bool delay = true;
    assert_int_equal(kvd_leader_request_finished(ld, "f", &delay), KVD_OK);
    kvd_leader_destroy(ld);
}

/* A sliding-window KV-cache group (vLLM's hybrid allocator): positions the
 * engine dropped are KVD_LEADER_NO_BLOCK. Nothing is loaded into or saved
 * from them, and an asynchronous load of only such positions still ends
 * when the worker reports it. */
static void test_no_block_positions(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[80];
    kvd_block_hash_t h[8];
    kvd_leader_t *ld = scene(&f, 1, tok, 80, 12, h);
    fake_store(&f, h, 4, KVD_STORE_TIER_DISK);
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "w", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 64);
    assert_true(async);
    const uint32_t nb = KVD_LEADER_NO_BLOCK;
    uint32_t blocks[5] = {nb, nb, 32, 33, 34};
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "w", blocks, 5, 64), KVD_OK);
    kvd_pb_step_plan_t *p = plan_of(ld);
    const kvd_pb_step_request_t *q = plan_req(p, "w");
    assert_non_null(q);
    assert_true(q->async_load);
    assert_int_equal(q->n_loads, 2);
    assert_int_equal(q->loads[0]->block_id, 32);
    assert_int_equal(q->loads[1]->block_id, 33);
    assert_memory_equal(q->loads[0]->key->block_hash.data, h[2].bytes,
                        KVD_SHA256_BYTES);
    assert_int_equal(q->num_load_tokens, 32);
    kvd_proto_step_plan_free(p);
    report(ld, 1, NULL, "w", NULL, 0);
    assert_int_equal(f.leases, 0);
    /* Prefill of the rest: block 4 is saved; the engine then drops block
     * 2 and 3 from the window before a later save would reach them. */
    uint32_t more[1] = {35};
    assert_int_equal(
        kvd_leader_request_scheduled(ld, "w", more, 0, NULL, 0, NULL, 0, 80),
        KVD_OK);
    p = plan_of(ld);
    q = plan_req(p, "w");
    assert_non_null(q);
    assert_int_equal(q->n_loads, 0);
    assert_int_equal(q->n_saves, 1);
    assert_int_equal(q->saves[0]->block_id, 34);
    kvd_proto_step_plan_free(p);
    report(ld, 2, "w", NULL, NULL, 0);
    bool delay = true;
    assert_int_equal(kvd_leader_request_finished(ld, "w", &delay), KVD_OK);
    assert_false(delay);

    /* Every position to load dropped: the load is asynchronous with nothing
     * to copy and still ends with the worker's report. */
    assert_int_equal(match(ld, "x", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 64);
    uint32_t none[5] = {nb, nb, nb, nb, 40};
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, "x", none, 5, 64),
                     KVD_OK);
    p = plan_of(ld);
    q = plan_req(p, "x");
    assert_non_null(q);
    assert_true(q->async_load);
    assert_int_equal(q->n_loads, 0);
    kvd_proto_step_plan_free(p);
    report(ld, 3, NULL, "x", NULL, 0);
    const char *done[2];
    assert_int_equal(kvd_leader_take_finished_loads(ld, done, 2), 2);
    assert_int_equal(f.leases, 0);

    /* Host-tier (synchronous) blocks, all dropped: planned as an
     * asynchronous load of nothing, so the worker's report ends it. */
    kvd_block_hash_t h2[3];
    uint32_t tok3[48];
    prompt(tok3, 48, 14);
    assert_int_equal(chain(tok3, 48, NULL, h2), 3);
    fake_store(&f, h2, 2, KVD_STORE_TIER_HOST);
    assert_int_equal(match(ld, "z", tok3, 48, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 32);
    assert_false(async);
    uint32_t z[3] = {nb, nb, 60};
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, "z", z, 3, 32),
                     KVD_OK);
    p = plan_of(ld);
    q = plan_req(p, "z");
    assert_non_null(q);
    assert_true(q->async_load);
    assert_int_equal(q->n_loads, 0);
    kvd_proto_step_plan_free(p);
    assert_true(f.leases > 0);
    report(ld, 4, NULL, "z", NULL, 0);
    assert_int_equal(f.leases, 0);
    assert_int_equal(kvd_leader_request_finished(ld, "z", &delay), KVD_OK);

    /* Saves of dropped positions only: no plan entry, nothing in flight. */
    uint32_t tok2[48];
    prompt(tok2, 48, 13);
    assert_int_equal(match(ld, "y", tok2, 48, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    uint32_t y[3] = {nb, nb, 50};
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, "y", y, 3, 0),
                     KVD_OK);
    assert_int_equal(
        kvd_leader_request_scheduled(ld, "y", NULL, 0, NULL, 0, NULL, 0, 32),
        KVD_OK);
    p = plan_of(ld);
    assert_null(plan_req(p, "y"));
    kvd_proto_step_plan_free(p);
    assert_int_equal(kvd_leader_request_finished(ld, "y", &delay), KVD_OK);
    assert_false(delay);
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

static void test_shared_prefix_loaded_once(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[80], blocks[5];
    kvd_block_hash_t h[8];
    kvd_leader_t *ld = scene(&f, 1, tok, 80, 7, h);
    fake_store(&f, h, 5, KVD_STORE_TIER_DISK);
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "g1", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_true(async);
    ids(blocks, 5, 0);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "g1", blocks, 5, 64), KVD_OK);
    /* g2 shares the prefix in the same scheduling pass, before any plan
     * exists (vLLM matches every waiting request, then plans): not yet. */
    assert_int_equal(match(ld, "g2", tok, 80, NULL, 0, &m, &async), KVD_AGAIN);
    kvd_pb_step_plan_t *p = plan_of(ld);
    kvd_proto_step_plan_free(p);
    /* And while g1 is loading it: not yet. */
    assert_int_equal(match(ld, "g2", tok, 80, NULL, 0, &m, &async), KVD_AGAIN);
    report(ld, 1, NULL, "g1", NULL, 0);
    const char *done[2];
    assert_int_equal(kvd_leader_take_finished_loads(ld, done, 2), 1);
    assert_string_equal(done[0], "g1");
    /* Now the engine has the blocks locally: nothing to load. */
    assert_int_equal(match(ld, "g2", tok, 80, NULL, 64, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    kvd_leader_stats_t st;
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.not_yet, 2);
    assert_int_equal(st.planned_loads, 4);
    /* A store that is not ready yet also means not yet. */
    f.busy = 1;
    assert_int_equal(match(ld, "g3", tok, 80, NULL, 0, &m, &async), KVD_AGAIN);
    f.busy = 0;
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

/* Asked again with a different num_computed_tokens (the engine's own
 * prefix grew or shrank before it allocated), the answer is for the new
 * prefix: never past the last token, never a block the engine has. */
static void test_answer_follows_engine_prefix(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[112], blocks[7];
    kvd_block_hash_t h[8];
    kvd_leader_t *ld = scene(&f, 1, tok, 112, 12, h);
    fake_store(&f, h, 7, KVD_STORE_TIER_HOST);
    uint64_t m = 0;
    bool async = true;
    assert_int_equal(match(ld, "p", tok, 112, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 96);
    assert_int_equal(f.leases, 6);
    assert_int_equal(match(ld, "p", tok, 112, NULL, 32, &m, &async), KVD_OK);
    assert_int_equal(m, 64); /* blocks 2..5: 32 + 64 < 112 */
    assert_int_equal(f.leases, 4);
    assert_int_equal(match(ld, "p", tok, 112, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 96);
    assert_int_equal(f.leases, 6);
    ids(blocks, 7, 0);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "p", blocks, 7, 96), KVD_OK);
    /* Once the engine acted on the answer, it cannot change. */
    assert_int_equal(match(ld, "p", tok, 112, NULL, 16, &m, &async),
                     KVD_ERR_STATE);
    assert_int_equal(match(ld, "p", tok, 112, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 96);
    bool delay = false;
    assert_int_equal(kvd_leader_request_finished(ld, "p", &delay), KVD_OK);
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

/* "Not yet" lasts lookup_timeout_ms at most; then the request is matched
 * against what is ready, as for an engine without retries. */
static void test_not_yet_is_bounded(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[80], blocks[5];
    kvd_block_hash_t h[8];
    memset(&f, 0, sizeof f);
    prompt(tok, 80, 8);
    chain(tok, 80, NULL, h);
    fake_store(&f, h, 5, KVD_STORE_TIER_DISK);
    kvd_leader_config_t c = config(1);
    c.lookup_timeout_ms = 20;
    kvd_leader_t *ld = NULL;
    assert_int_equal(kvd_leader_create(&c, fake_as_store(&f), &ld), KVD_OK);
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "t1", tok, 80, NULL, 0, &m, &async), KVD_OK);
    ids(blocks, 5, 0);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "t1", blocks, 5, 64), KVD_OK);
    kvd_proto_step_plan_free(plan_of(ld));
    /* t2 waits for t1's loads, but not forever. */
    assert_int_equal(match(ld, "t2", tok, 80, NULL, 0, &m, &async), KVD_AGAIN);
    assert_int_equal(match(ld, "t2", tok, 80, NULL, 0, &m, &async), KVD_AGAIN);
    struct timespec nap = {0, 30 * 1000000L};
    nanosleep(&nap, NULL);
    assert_int_equal(match(ld, "t2", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0); /* every block it could load is t1's */
    /* A store that never gets ready: a miss after the timeout. */
    uint32_t other[80];
    prompt(other, 80, 9);
    f.busy = 1;
    assert_int_equal(match(ld, "t3", other, 80, NULL, 0, &m, &async),
                     KVD_AGAIN);
    nanosleep(&nap, NULL);
    assert_int_equal(match(ld, "t3", other, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    f.busy = 0;
    kvd_leader_stats_t st;
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.timeouts, 2);
    assert_int_equal(st.not_yet, 3);
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

static void test_tenant_salt_isolates(void **state)
{
    (void)state;
    fake_t f = {0};
    kvd_leader_t *ld = leader_on(&f, 1);
    uint32_t tok[80];
    kvd_block_hash_t ha[8], hb[8];
    prompt(tok, 80, 8);
    chain(tok, 80, "tenant-a", ha);
    chain(tok, 80, "tenant-b", hb);
    for (int i = 0; i < 5; i++) {
        assert_memory_not_equal(ha[i].bytes, hb[i].bytes, 32);
    }
    fake_store(&f, ha, 5, KVD_STORE_TIER_HOST);
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "ta", tok, 80, "tenant-a", 0, &m, &async),
                     KVD_OK);
    assert_int_equal(m, 64);
    assert_int_equal(match(ld, "tb", tok, 80, "tenant-b", 0, &m, &async),
                     KVD_OK);
    assert_int_equal(m, 0);
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

static void test_every_worker_must_report(void **state)
{
    (void)state;
    fake_t f = {0};
    kvd_leader_t *ld = leader_on(&f, 2);
    uint32_t tok[64], blocks[4];
    prompt(tok, 64, 9);
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "w", tok, 64, NULL, 0, &m, &async), KVD_OK);
    ids(blocks, 4, 0);
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, "w", blocks, 4, 0),
                     KVD_OK);
    assert_int_equal(
        kvd_leader_request_scheduled(ld, "w", NULL, 0, NULL, 0, NULL, 0, 32),
        KVD_OK);
    kvd_proto_step_plan_free(plan_of(ld)); /* step 1: blocks 0-1 */
    assert_int_equal(
        kvd_leader_request_scheduled(ld, "w", NULL, 0, NULL, 0, NULL, 0, 64),
        KVD_OK);
    kvd_proto_step_plan_free(plan_of(ld)); /* step 2: blocks 2-3 */
    bool delay = false;
    assert_int_equal(kvd_leader_request_finished(ld, "w", &delay), KVD_OK);
    assert_true(delay);
    /* Reports about step 1 do not finish step 2's saves. */
    report(ld, 1, "w", NULL, NULL, 0);
    report(ld, 1, "w", NULL, NULL, 0);
    kvd_leader_stats_t st;
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.requests, 1);
    report(ld, 2, "w", NULL, NULL, 0);
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.requests, 1);
    report(ld, 2, "w", NULL, NULL, 0);
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.requests, 0);
    kvd_leader_destroy(ld);
}

static void test_engine_hashes(void **state)
{
    (void)state;
    fake_t f = {0};
    kvd_leader_t *ld = leader_on(&f, 1);
    kvd_block_hash_t h[6];
    for (int i = 0; i < 6; i++) {
        memset(h[i].bytes, 0x30 + i, 32);
    }
    fake_store(&f, h, 2, KVD_STORE_TIER_HOST);
    kvd_leader_request_t q = {
        .request_id = "eh", .num_tokens = 70, .hashes = h, .num_hashes = 4};
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(
        kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 32);
    uint32_t blocks[5];
    ids(blocks, 5, 0);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "eh", blocks, 5, 32), KVD_OK);
    assert_int_equal(
        kvd_leader_request_scheduled(ld, "eh", NULL, 0, NULL, 0, h + 4, 1, 80),
        KVD_OK);
    kvd_pb_step_plan_t *p = plan_of(ld);
    const kvd_pb_step_request_t *r = plan_req(p, "eh");
    assert_int_equal(r->n_loads, 2);
    assert_int_equal(r->n_saves, 3);
    assert_memory_equal(r->saves[2]->key->block_hash.data, h[4].bytes, 32);
    kvd_proto_step_plan_free(p);
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

static void test_embedded_store(void **state)
{
    (void)state;
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_size", "16m"), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_chunk", "4m"), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_prefault", "false"),
                     KVD_OK);
    kvd_store_t *st = NULL;
    assert_int_equal(kvd_store_open(cfg, &st, NULL, 0), KVD_OK);
    kvd_config_destroy(cfg);
    kvd_leader_config_t c = config(1);
    kvd_leader_t *ld = NULL;
    assert_int_equal(kvd_leader_create(&c, st, &ld), KVD_OK);

    uint32_t tok[80];
    kvd_block_hash_t h[8];
    prompt(tok, 80, 10);
    chain(tok, 80, NULL, h);
    kvd_store_reservation_t r[3];
    kvd_store_key_t keys[3];
    assert_int_equal(kvd_store_reserve(st, &c.ns, h, 3, 4096, 0, r), KVD_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(r[i].status, KVD_OK);
        keys[i].ns = c.ns;
        keys[i].hash = h[i];
    }
    assert_int_equal(kvd_store_commit(st, keys, 3, NULL), KVD_OK);
    uint64_t m = 0;
    bool async = true;
    assert_int_equal(match(ld, "s", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 48);
    assert_false(async);
    kvd_store_stats_t ss;
    assert_int_equal(kvd_store_stats(st, &ss), KVD_OK);
    assert_int_equal(ss.leases, 3);
    bool delay = true;
    assert_int_equal(kvd_leader_request_finished(ld, "s", &delay), KVD_OK);
    assert_int_equal(kvd_store_stats(st, &ss), KVD_OK);
    assert_int_equal(ss.leases, 0);
    kvd_leader_destroy(ld);
    kvd_store_close(st);
}

static void test_prefill_handoff(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[100], blocks[7];
    kvd_block_hash_t h[8];
    memset(&f, 0, sizeof f);
    prompt(tok, 100, 11);
    chain(tok, 100, NULL, h);
    kvd_leader_config_t c = config(1);
    c.node_id = "prefill-node-a";
    kvd_leader_t *ld = NULL;
    assert_int_equal(kvd_leader_create(&c, fake_as_store(&f), &ld), KVD_OK);
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "p", tok, 100, NULL, 0, &m, &async), KVD_OK);
    ids(blocks, 7, 0);
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, "p", blocks, 7, 0),
                     KVD_OK);
    assert_int_equal(
        kvd_leader_request_scheduled(ld, "p", NULL, 0, NULL, 0, NULL, 0, 100),
        KVD_OK);
    kvd_proto_step_plan_free(plan_of(ld));
    bool delay = false;
    kvd_leader_transfer_t t;
    assert_int_equal(kvd_leader_request_finished_transfer(ld, "p", &delay, &t),
                     KVD_OK);
    assert_true(delay); /* the decode node needs the saves to land */
    assert_string_equal(t.node_id, "prefill-node-a");
    assert_memory_equal(t.ns.bytes, c.ns.bytes, 16);
    assert_int_equal(t.num_hashes, 6);
    assert_int_equal(t.num_tokens, 96);
    assert_memory_equal(t.hashes, h, 6 * sizeof h[0]);
    report(ld, 1, "p", NULL, NULL, 0);
    kvd_leader_stats_t st;
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.requests, 0);
    assert_int_equal(kvd_leader_request_finished_transfer(ld, "p", &delay, &t),
                     KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_leader_request_finished_transfer(ld, "p", NULL, &t),
                     KVD_ERR_INVALID);
    kvd_leader_destroy(ld);

    /* The decode node's leader names the prefill node: its store is asked
     * through lookup_from with that node (the daemon asks it first). */
    fake_store(&f, h, 6, KVD_STORE_TIER_HOST);
    c.node_id = "decode-node-b";
    assert_int_equal(kvd_leader_create(&c, fake_as_store(&f), &ld), KVD_OK);
    kvd_leader_request_t q;
    memset(&q, 0, sizeof q);
    q.request_id = "d";
    q.tokens = tok;
    q.num_tokens = 100;
    q.source_node = "prefill-node-a";
    assert_int_equal(
        kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 96);
    assert_string_equal(f.last_source, "prefill-node-a");
    /* Without a source the plain lookup runs. */
    f.last_source[0] = '\0';
    q.request_id = "e";
    q.source_node = NULL;
    assert_int_equal(
        kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 96);
    assert_string_equal(f.last_source, "");
    kvd_leader_destroy(ld);
}

/* TensorRT-LLM's order and rules: integer request ids, no "retry later"
 * (a block another request is loading is simply not promised), the whole
 * match taken at allocation, request_finished answering only a bool. */
static void test_trtllm_sequence(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[80], blocks[5];
    kvd_block_hash_t h[8];
    memset(&f, 0, sizeof f);
    prompt(tok, 80, 12);
    chain(tok, 80, NULL, h);
    fake_store(&f, h, 2, KVD_STORE_TIER_DISK);
    fake_store(&f, h + 2, 3, KVD_STORE_TIER_HOST);
    kvd_leader_config_t c = config(2); /* every rank must report */
    c.no_retry = true;
    kvd_leader_t *ld = NULL;
    assert_int_equal(kvd_leader_create(&c, fake_as_store(&f), &ld), KVD_OK);

    /* Request 17: async load of 4 blocks (2 on NVMe). */
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "17", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 64);
    assert_true(async);
    ids(blocks, 5, 0);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "17", blocks, 5, m), KVD_OK);
    kvd_pb_step_plan_t *p = plan_of(ld);
    const kvd_pb_step_request_t *q = plan_req(p, "17");
    assert_int_equal(q->n_loads, 4);
    assert_true(q->async_load);
    kvd_proto_step_plan_free(p);

    /* Request 18, same prompt, arrives while 17 loads: never "not yet";
     * the blocks 17 is loading are not promised. */
    assert_int_equal(match(ld, "18", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    assert_false(async);

    /* Both ranks report 17's load; only then is it finished. */
    report(ld, 1, NULL, "17", NULL, 0);
    const char *done[2];
    assert_int_equal(kvd_leader_take_finished_loads(ld, done, 2), 0);
    report(ld, 1, NULL, "17", NULL, 0);
    assert_int_equal(kvd_leader_take_finished_loads(ld, done, 2), 1);
    assert_string_equal(done[0], "17");
    assert_int_equal(f.leases, 0);

    /* The last block is computed, saved, reported by both ranks. */
    assert_int_equal(
        kvd_leader_request_scheduled(ld, "17", NULL, 0, NULL, 0, NULL, 0, 80),
        KVD_OK);
    p = plan_of(ld);
    assert_int_equal(plan_req(p, "17")->n_saves, 1);
    kvd_proto_step_plan_free(p);
    bool delay = false;
    assert_int_equal(kvd_leader_request_finished(ld, "17", &delay), KVD_OK);
    assert_true(delay);
    report(ld, 2, "17", NULL, NULL, 0);
    report(ld, 2, "17", NULL, NULL, 0);
    assert_int_equal(kvd_leader_request_finished(ld, "18", &delay), KVD_OK);
    assert_false(delay);
    kvd_leader_stats_t st;
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.requests, 0);
    assert_int_equal(st.not_yet, 0);
    /* A store that is not ready is a miss, not a wait. */
    f.busy = 1;
    assert_int_equal(match(ld, "19", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    f.busy = 0;
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

static void test_bad_input(void **state)
{
    (void)state;
    fake_t f = {0};
    kvd_leader_t *ld = leader_on(&f, 1);
    kvd_leader_config_t c = config(1);
    kvd_leader_t *x = NULL;
    c.block_size = 0;
    assert_int_equal(kvd_leader_create(&c, fake_as_store(&f), &x),
                     KVD_ERR_INVALID);
    c = config(0);
    assert_int_equal(kvd_leader_create(&c, fake_as_store(&f), &x),
                     KVD_ERR_INVALID);
    c = config(1);
    assert_int_equal(kvd_leader_create(&c, NULL, &x), KVD_ERR_INVALID);
    uint64_t m;
    bool a;
    kvd_leader_request_t q = {.request_id = "", .num_tokens = 0};
    assert_int_equal(kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &a),
                     KVD_ERR_INVALID);
    q.request_id = "x";
    q.num_tokens = 5; /* tokens missing */
    assert_int_equal(kvd_leader_get_num_new_matched_tokens(ld, &q, 0, &m, &a),
                     KVD_ERR_INVALID);
    assert_int_equal(
        kvd_leader_update_state_after_alloc(ld, "nope", NULL, 0, 0),
        KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_leader_request_preempted(ld, "nope"),
                     KVD_ERR_NOT_FOUND);
    static const uint8_t junk[] = {0xff, 0xff, 0xff, 0x0f, 0x01};
    assert_int_equal(kvd_leader_update_connector_output(ld, junk, sizeof junk),
                     KVD_ERR_PROTO);
    assert_int_equal(kvd_leader_update_connector_output(ld, NULL, 3),
                     KVD_ERR_INVALID);
    /* A report about unknown requests changes nothing. */
    report(ld, 5, "ghost", "ghost", NULL, 0);
    assert_int_equal(kvd_leader_build_connector_meta(ld, NULL, NULL),
                     KVD_ERR_INVALID);
    kvd_leader_destroy(ld);
    kvd_leader_destroy(NULL);
}

/* A failing store (a dead daemon, a deadline) is a miss: the engine
 * computes; the request goes on normally and later lookups work again. */
static void test_store_failure_is_a_miss(void **state)
{
    (void)state;
    fake_t f = {0};
    kvd_leader_t *ld = leader_on(&f, 1);
    uint32_t tok[80];
    prompt(tok, 80, 41);
    kvd_block_hash_t h[5];
    assert_int_equal(chain(tok, 80, NULL, h), 5);
    fake_store(&f, h, 5, KVD_STORE_TIER_HOST);
    uint64_t m = 99;
    bool async = true;
    f.fail = KVD_ERR_UNREACHABLE;
    assert_int_equal(match(ld, "down", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    assert_false(async);
    f.fail = KVD_ERR_TIMEOUT;
    assert_int_equal(match(ld, "slow", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    kvd_leader_stats_t st;
    assert_int_equal(kvd_leader_stats(ld, &st), KVD_OK);
    assert_int_equal(st.lookup_errors, 2);
    f.fail = KVD_OK;
    assert_int_equal(match(ld, "up", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 64);
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_hit_saves_and_delays_free),
        cmocka_unit_test(test_full_hit_never_claims_last_block),
        cmocka_unit_test(test_partial_hit_and_fewer_blocks_taken),
        cmocka_unit_test(test_chunked_prefill_and_decode),
        cmocka_unit_test(test_preempt_and_abort_release_everything),
        cmocka_unit_test(test_async_load_failure),
        cmocka_unit_test(test_shared_prefix_loaded_once),
        cmocka_unit_test(test_no_block_positions),
        cmocka_unit_test(test_answer_follows_engine_prefix),
        cmocka_unit_test(test_not_yet_is_bounded),
        cmocka_unit_test(test_tenant_salt_isolates),
        cmocka_unit_test(test_every_worker_must_report),
        cmocka_unit_test(test_engine_hashes),
        cmocka_unit_test(test_embedded_store),
        cmocka_unit_test(test_prefill_handoff),
        cmocka_unit_test(test_trtllm_sequence),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_store_failure_is_a_miss),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
