/*
 * The leader with shard namespaces (include/kvdepot/leader.h,
 * cfg.shard_ns): with tensor parallelism each rank stores its shard of a
 * block under its own namespace, and a block counts as stored only when
 * every shard holds it. Over the embedded store: a shard that lost a block
 * shortens the match (or makes it a miss), and every shard's copy stays
 * leased until the load is reported, the request is preempted, the engine
 * takes fewer blocks, or the leader is destroyed. Over a scripted store
 * that knows namespaces: a shard on disk makes the load asynchronous, a
 * shard not ready is "not yet", a shard whose lookup fails is a miss.
 * Also the config's and kvd_leader_set_namespaces' checks, and a new
 * namespace generation moving every shard.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvd_testleader_int.h"

#define NSHARDS 2u

/* Namespace `tag` (the plan's namespace is config()'s, 0x5e...). */
static kvd_namespace_t ns_of(uint8_t tag)
{
    kvd_namespace_t ns;
    memset(ns.bytes, tag, sizeof ns.bytes);
    return ns;
}

/* ---- over the embedded store -------------------------------------------- */

static kvd_store_t *embedded(void)
{
    kvd_config_t *cfg = NULL;
    assert_int_equal(kvd_config_create(&cfg), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_size", "16m"), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_chunk", "4m"), KVD_OK);
    assert_int_equal(kvd_config_set(cfg, "store.arena_prefault", "false"),
                     KVD_OK);
    kvd_store_t *st = NULL;
    assert_int_equal(kvd_store_open(cfg, &st, NULL, 0), KVD_OK);
    kvd_config_destroy(cfg);
    return st;
}

/* Saves blocks h[0..n) under ns (what a worker of that rank does). */
static void put(kvd_store_t *st, const kvd_namespace_t *ns,
                const kvd_block_hash_t *h, size_t n)
{
    kvd_store_reservation_t r[8];
    kvd_store_key_t keys[8];
    assert_true(n <= 8);
    assert_int_equal(kvd_store_reserve(st, ns, h, n, 4096, 0, r), KVD_OK);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(r[i].status, KVD_OK);
        keys[i].ns = *ns;
        keys[i].hash = h[i];
    }
    assert_int_equal(kvd_store_commit(st, keys, n, NULL), KVD_OK);
}

static void drop(kvd_store_t *st, const kvd_namespace_t *ns,
                 const kvd_block_hash_t *h)
{
    kvd_store_key_t key = {.ns = *ns, .hash = *h};
    size_t n = 0;
    assert_int_equal(kvd_store_delete(st, &key, 1, &n), KVD_OK);
    assert_int_equal(n, 1);
}

static uint64_t store_leases(kvd_store_t *st)
{
    kvd_store_stats_t ss;
    assert_int_equal(kvd_store_stats(st, &ss), KVD_OK);
    return ss.leases;
}

static uint64_t leader_leases(kvd_leader_t *ld)
{
    kvd_leader_stats_t s;
    assert_int_equal(kvd_leader_stats(ld, &s), KVD_OK);
    return s.leases;
}

/* A leader over `st` whose shards are namespaces 0xa1 and 0xa2. */
static kvd_leader_t *sharded_leader(kvd_store_t *st, kvd_namespace_t *shards)
{
    shards[0] = ns_of(0xa1);
    shards[1] = ns_of(0xa2);
    kvd_leader_config_t c = config(1);
    c.shard_ns = shards;
    c.num_shard_ns = NSHARDS;
    kvd_leader_t *ld = NULL;
    assert_int_equal(kvd_leader_create(&c, st, &ld), KVD_OK);
    memset(shards, 0, NSHARDS * sizeof *shards); /* the leader copied them */
    return ld;
}

static void test_match_stops_at_a_lost_shard(void **state)
{
    (void)state;
    kvd_store_t *st = embedded();
    kvd_namespace_t shards[NSHARDS];
    kvd_leader_t *ld = sharded_leader(st, shards);
    kvd_namespace_t ns0 = config(1).ns, s1 = ns_of(0xa1), s2 = ns_of(0xa2);
    uint32_t tok[96], blocks[6];
    kvd_block_hash_t h[8];
    prompt(tok, 96, 31);
    assert_int_equal(chain(tok, 96, NULL, h), 6);
    put(st, &ns0, h, 5);
    put(st, &s1, h, 5);
    put(st, &s2, h, 5);
    drop(st, &s2, &h[3]); /* rank 2 lost its shard of block 3 */

    uint64_t m = 0;
    bool async = true;
    assert_int_equal(match(ld, "a", tok, 96, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 3 * BS); /* blocks 0..2: held by every shard */
    assert_false(async);
    assert_int_equal(store_leases(st), 3 * 3); /* every shard's copy */
    assert_int_equal(leader_leases(ld), 3 * 3);

    /* Loaded and reported: every lease goes back. */
    ids(blocks, 6, 40);
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, "a", blocks, 6,
                                                         (uint64_t)3 * BS),
                     KVD_OK);
    kvd_pb_step_plan_t *p = plan_of(ld);
    const kvd_pb_step_request_t *q = plan_req(p, "a");
    assert_non_null(q);
    assert_int_equal(q->n_loads, 3);
    uint64_t step = p->step;
    kvd_proto_step_plan_free(p);
    assert_int_equal(store_leases(st), 9);
    report(ld, step, NULL, "a", NULL, 0);
    assert_int_equal(store_leases(st), 0);
    assert_int_equal(leader_leases(ld), 0);
    bool delay = true;
    assert_int_equal(kvd_leader_request_finished(ld, "a", &delay), KVD_OK);

    /* A shard missing block 0 is a miss, and nothing stays leased. */
    drop(st, &s1, &h[0]);
    assert_int_equal(match(ld, "b", tok, 96, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    assert_int_equal(store_leases(st), 0);
    assert_int_equal(leader_leases(ld), 0);
    assert_int_equal(kvd_leader_request_finished(ld, "b", &delay), KVD_OK);
    kvd_leader_destroy(ld);
    kvd_store_close(st);
}

static void test_every_shard_lease_goes_back(void **state)
{
    (void)state;
    kvd_store_t *st = embedded();
    kvd_namespace_t shards[NSHARDS];
    kvd_leader_t *ld = sharded_leader(st, shards);
    kvd_namespace_t ns0 = config(1).ns, s1 = ns_of(0xa1), s2 = ns_of(0xa2);
    uint32_t tok[80], blocks[5];
    kvd_block_hash_t h[8];
    prompt(tok, 80, 32);
    assert_int_equal(chain(tok, 80, NULL, h), 5);
    put(st, &ns0, h, 4);
    put(st, &s1, h, 4);
    put(st, &s2, h, 4);
    uint64_t m = 0;
    bool async = true, delay = true;

    /* Preemption. */
    assert_int_equal(match(ld, "p", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 4 * BS);
    assert_int_equal(store_leases(st), 12);
    assert_int_equal(kvd_leader_request_preempted(ld, "p"), KVD_OK);
    assert_int_equal(store_leases(st), 0);
    assert_int_equal(leader_leases(ld), 0);
    assert_int_equal(kvd_leader_request_finished(ld, "p", &delay), KVD_OK);

    /* The engine takes fewer blocks: the rest go back in every shard. */
    assert_int_equal(match(ld, "f", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(store_leases(st), 12);
    ids(blocks, 5, 10);
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, "f", blocks, 5,
                                                         (uint64_t)2 * BS),
                     KVD_OK);
    assert_int_equal(store_leases(st), 2 * 3);
    assert_int_equal(leader_leases(ld), 2 * 3);
    assert_int_equal(kvd_leader_request_finished(ld, "f", &delay), KVD_OK);
    assert_int_equal(store_leases(st), 0);

    /* Asked again with another num_computed_tokens: leased afresh. */
    assert_int_equal(match(ld, "g", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(match(ld, "g", tok, 80, NULL, BS, &m, &async), KVD_OK);
    assert_int_equal(m, 3 * BS);
    assert_int_equal(store_leases(st), 3 * 3);

    /* Destroy with leases held. */
    kvd_leader_destroy(ld);
    assert_int_equal(store_leases(st), 0);
    kvd_store_close(st);
}

/* ---- over a scripted store that knows namespaces ------------------------ */

typedef struct nsfake {
    kvd_store_t base; /* first: the fake is a store (store/ops.h) */
    kvd_namespace_t ns[64];
    kvd_block_hash_t hash[64];
    uint32_t tier[64];
    size_t num;
    kvd_namespace_t busy_ns; /* lookups of it answer `answer` */
    kvd_status_t answer;
    int64_t leases;
} nsfake_t;

static kvd_status_t nsfake_lookup(kvd_store_t *ctx, const kvd_namespace_t *ns,
                                  const kvd_block_hash_t *hashes, size_t n,
                                  const char *source, kvd_store_lease_t *out,
                                  size_t *matched)
{
    nsfake_t *f = (nsfake_t *)ctx;
    (void)source;
    if (f->answer != KVD_OK && memcmp(ns, &f->busy_ns, sizeof *ns) == 0) {
        return f->answer;
    }
    size_t m = 0;
    for (; m < n; m++) {
        size_t k = 0;
        while (k < f->num &&
               (memcmp(&f->ns[k], ns, sizeof *ns) != 0 ||
                memcmp(&f->hash[k], &hashes[m], sizeof hashes[m]) != 0)) {
            k++;
        }
        if (k == f->num) {
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

static kvd_status_t nsfake_release(kvd_store_t *ctx, const kvd_store_lease_t *l,
                                   size_t n)
{
    (void)l;
    ((nsfake_t *)ctx)->leases -= (int64_t)n;
    return KVD_OK;
}

static const kvd_store_ops_t nsfake_ops = {
    .name = "nsfake", .lookup = nsfake_lookup, .release = nsfake_release};

static void nsfake_put(nsfake_t *f, const kvd_namespace_t *ns,
                       const kvd_block_hash_t *h, size_t n, uint32_t tier)
{
    for (size_t i = 0; i < n; i++) {
        assert_true(f->num < 64);
        f->ns[f->num] = *ns;
        f->hash[f->num] = h[i];
        f->tier[f->num++] = tier;
    }
}

/* A scripted store, a leader with one shard (0xb1) over it, and a prompt
 * of 80 tokens (5 blocks) with its hashes in h. */
static kvd_leader_t *nsfake_scene(nsfake_t *f, uint32_t *tok,
                                  kvd_block_hash_t *h)
{
    memset(f, 0, sizeof *f);
    f->base.ops = &nsfake_ops;
    prompt(tok, 80, 33);
    assert_int_equal(chain(tok, 80, NULL, h), 5);
    kvd_namespace_t shard = ns_of(0xb1);
    kvd_leader_config_t c = config(1);
    c.shard_ns = &shard;
    c.num_shard_ns = 1;
    kvd_leader_t *ld = NULL;
    assert_int_equal(kvd_leader_create(&c, &f->base, &ld), KVD_OK);
    return ld;
}

static void test_shard_on_disk_is_async(void **state)
{
    (void)state;
    nsfake_t f;
    uint32_t tok[80];
    kvd_block_hash_t h[8];
    kvd_leader_t *ld = nsfake_scene(&f, tok, h);
    kvd_namespace_t ns0 = config(1).ns, s1 = ns_of(0xb1);
    nsfake_put(&f, &ns0, h, 4, KVD_STORE_TIER_HOST);
    nsfake_put(&f, &s1, h, 1, KVD_STORE_TIER_HOST);
    nsfake_put(&f, &s1, h + 1, 3, KVD_STORE_TIER_DISK);
    uint64_t m = 0;
    bool async = false, delay = true;
    assert_int_equal(match(ld, "d", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 4 * BS);
    assert_true(async); /* rank 1 must promote its shard from disk */
    assert_int_equal(f.leases, 8);

    /* The plan's sources are the plan namespace's (HOST here). */
    uint32_t blocks[5];
    ids(blocks, 5, 60);
    assert_int_equal(kvd_leader_update_state_after_alloc(ld, "d", blocks, 5,
                                                         (uint64_t)4 * BS),
                     KVD_OK);
    kvd_pb_step_plan_t *p = plan_of(ld);
    const kvd_pb_step_request_t *q = plan_req(p, "d");
    assert_non_null(q);
    assert_true(q->async_load);
    assert_int_equal(q->n_loads, 4);
    assert_int_equal(q->loads[1]->source->tier, KVDEPOT__V1__TIER__TIER_HOST);
    kvd_proto_step_plan_free(p);
    assert_int_equal(kvd_leader_request_finished(ld, "d", &delay), KVD_OK);
    assert_int_equal(f.leases, 0);
    kvd_leader_destroy(ld);
}

static void test_shard_not_ready_or_failing(void **state)
{
    (void)state;
    nsfake_t f;
    uint32_t tok[80];
    kvd_block_hash_t h[8];
    kvd_leader_t *ld = nsfake_scene(&f, tok, h);
    kvd_namespace_t ns0 = config(1).ns, s1 = ns_of(0xb1);
    nsfake_put(&f, &ns0, h, 4, KVD_STORE_TIER_HOST);
    nsfake_put(&f, &s1, h, 4, KVD_STORE_TIER_HOST);
    uint64_t m = 0;
    bool async = false, delay = true;

    /* The shard's store is not ready: "not yet", nothing leased. */
    f.busy_ns = s1;
    f.answer = KVD_AGAIN;
    assert_int_equal(match(ld, "n", tok, 80, NULL, 0, &m, &async), KVD_AGAIN);
    assert_int_equal(f.leases, 0);
    f.answer = KVD_OK;
    assert_int_equal(match(ld, "n", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 4 * BS);
    assert_int_equal(f.leases, 8);
    assert_int_equal(kvd_leader_request_finished(ld, "n", &delay), KVD_OK);
    assert_int_equal(f.leases, 0);

    /* The shard's lookup fails: a miss, counted, nothing leased. */
    f.answer = KVD_ERR_UNREACHABLE;
    assert_int_equal(match(ld, "e", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    assert_false(async);
    assert_int_equal(f.leases, 0);
    kvd_leader_stats_t s;
    assert_int_equal(kvd_leader_stats(ld, &s), KVD_OK);
    assert_int_equal(s.lookup_errors, 1);
    assert_int_equal(s.leases, 0);
    assert_int_equal(kvd_leader_request_finished(ld, "e", &delay), KVD_OK);
    kvd_leader_destroy(ld);
}

static void test_set_namespaces_moves_every_shard(void **state)
{
    (void)state;
    nsfake_t f;
    uint32_t tok[80];
    kvd_block_hash_t h[8];
    kvd_leader_t *ld = nsfake_scene(&f, tok, h);
    /* Generation 1: the plan's namespace and the shard's both move; the
     * blocks are stored under the new plan namespace, and under the shard's
     * old generation only. */
    kvd_namespace_t ns1 = ns_of(0xc0), s1old = ns_of(0xb1), s1new = ns_of(0xc1);
    nsfake_put(&f, &ns1, h, 4, KVD_STORE_TIER_HOST);
    nsfake_put(&f, &s1old, h, 4, KVD_STORE_TIER_HOST);
    assert_int_equal(kvd_leader_set_namespaces(ld, &ns1, &s1new, 1), KVD_OK);
    uint64_t m = 0;
    bool async = false, delay = true;
    assert_int_equal(match(ld, "o", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0); /* the old shard's copy no longer counts */
    assert_int_equal(f.leases, 0);
    assert_int_equal(kvd_leader_request_finished(ld, "o", &delay), KVD_OK);
    nsfake_put(&f, &s1new, h, 2, KVD_STORE_TIER_HOST);
    assert_int_equal(match(ld, "w", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 2 * BS);
    assert_int_equal(f.leases, 4);
    assert_int_equal(kvd_leader_request_finished(ld, "w", &delay), KVD_OK);

    /* kvd_leader_set_namespace keeps the shards where they are. */
    kvd_namespace_t ns2 = ns_of(0xd0);
    nsfake_put(&f, &ns2, h, 4, KVD_STORE_TIER_HOST);
    assert_int_equal(kvd_leader_set_namespace(ld, &ns2), KVD_OK);
    assert_int_equal(match(ld, "k", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 2 * BS); /* as far as shard 0xc1 holds */
    assert_int_equal(kvd_leader_request_finished(ld, "k", &delay), KVD_OK);

    /* No shards any more: the plan's namespace alone. */
    assert_int_equal(kvd_leader_set_namespaces(ld, &ns2, NULL, 0), KVD_OK);
    assert_int_equal(match(ld, "z", tok, 80, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 4 * BS);
    assert_int_equal(f.leases, 4);
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

static void test_invalid_shards(void **state)
{
    (void)state;
    nsfake_t f;
    memset(&f, 0, sizeof f);
    f.base.ops = &nsfake_ops;
    kvd_leader_config_t c = config(1);
    kvd_leader_t *ld = (kvd_leader_t *)&f; /* must stay untouched */
    c.num_shard_ns = 1;                    /* with a NULL array */
    assert_int_equal(kvd_leader_create(&c, &f.base, &ld), KVD_ERR_INVALID);
    assert_ptr_equal(ld, (kvd_leader_t *)&f);
    kvd_namespace_t *many = calloc(KVD_LEADER_MAX_SHARD_NS + 1, sizeof *many);
    assert_non_null(many);
    c.shard_ns = many;
    c.num_shard_ns = KVD_LEADER_MAX_SHARD_NS + 1;
    assert_int_equal(kvd_leader_create(&c, &f.base, &ld), KVD_ERR_INVALID);
    c.num_shard_ns = KVD_LEADER_MAX_SHARD_NS; /* the most: accepted */
    assert_int_equal(kvd_leader_create(&c, &f.base, &ld), KVD_OK);

    kvd_namespace_t ns = ns_of(0xe0);
    assert_int_equal(kvd_leader_set_namespaces(NULL, &ns, NULL, 0),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_leader_set_namespaces(ld, NULL, NULL, 0),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_leader_set_namespaces(ld, &ns, NULL, 1),
                     KVD_ERR_INVALID);
    assert_int_equal(
        kvd_leader_set_namespaces(ld, &ns, many, KVD_LEADER_MAX_SHARD_NS + 1),
        KVD_ERR_INVALID);
    /* Nothing changed by those: still 256 shards, none holding anything,
     * so a block stored under the plan's namespace alone is no match. */
    uint32_t tok[48];
    kvd_block_hash_t h[4];
    prompt(tok, 48, 34);
    assert_int_equal(chain(tok, 48, NULL, h), 3);
    kvd_namespace_t ns0 = config(1).ns;
    nsfake_put(&f, &ns0, h, 2, KVD_STORE_TIER_HOST);
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "i", tok, 48, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    assert_int_equal(f.leases, 0);
    kvd_leader_destroy(ld);
    free(many);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_match_stops_at_a_lost_shard),
        cmocka_unit_test(test_every_shard_lease_goes_back),
        cmocka_unit_test(test_shard_on_disk_is_async),
        cmocka_unit_test(test_shard_not_ready_or_failing),
        cmocka_unit_test(test_set_namespaces_moves_every_shard),
        cmocka_unit_test(test_invalid_shards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
