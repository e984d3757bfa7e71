/*
 * Helpers shared by the leader tests (test_leader_*.c,
 * include/kvdepot/leader.h): a scripted store (a kvd_store_ops_t with the
 * lookup and release the leader calls; every lease counted, "not ready"
 * and errors on demand), prompts and their block hash chains computed
 * independently with kvd_block_hash_chain, and the engine's calls in the
 * shape the tests use (match, a plan unpacked, a worker report packed).
 * Header-only (static inline): each test is one executable built from one
 * source file; the including test has cmocka.h included first.
 */
#ifndef KVD_TESTS_TESTLEADER_INT_H
#define KVD_TESTS_TESTLEADER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static inline kvd_status_t fake_lookup(kvd_store_t *ctx,
                                       const kvd_namespace_t *ns,
                                       const kvd_block_hash_t *hashes, size_t n,
                                       const char *source,
                                       kvd_store_lease_t *out, size_t *matched)
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

static inline kvd_status_t fake_release(kvd_store_t *ctx,
                                        const kvd_store_lease_t *l, size_t n)
{
    (void)l;
    ((fake_t *)ctx)->leases -= (int64_t)n;
    return KVD_OK;
}

/* A store with the two calls the leader makes; the others stay NULL
 * (store/store_api.c answers them KVD_ERR_UNSUPPORTED). */
static const kvd_store_ops_t fake_ops = {
    .name = "fake", .lookup = fake_lookup, .release = fake_release};

static inline kvd_store_t *fake_as_store(fake_t *f)
{
    f->base.ops = &fake_ops;
    return &f->base;
}

static inline void fake_store(fake_t *f, const kvd_block_hash_t *h, size_t n,
                              uint32_t tier)
{
    for (size_t i = 0; i < n; i++) {
        f->stored[f->num_stored] = h[i];
        f->tier[f->num_stored++] = tier;
    }
}

/* ---- helpers ------------------------------------------------------------- */

static inline kvd_leader_config_t config(uint32_t workers)
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

static inline kvd_leader_t *leader_on(fake_t *f, uint32_t workers)
{
    kvd_leader_config_t c = config(workers);
    kvd_leader_t *ld = NULL;
    assert_int_equal(kvd_leader_create(&c, fake_as_store(f), &ld), KVD_OK);
    return ld;
}

static inline void prompt(uint32_t *tok, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        tok[i] = seed * 1000 + (uint32_t)i;
    }
}

static inline size_t chain(const uint32_t *tok, size_t n, const char *salt,
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

static inline kvd_pb_step_plan_t *plan_of(kvd_leader_t *ld)
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

static inline const kvd_pb_step_request_t *plan_req(const kvd_pb_step_plan_t *p,
                                                    const char *id)
{
    for (size_t i = 0; i < p->n_requests; i++) {
        if (strcmp(p->requests[i]->request_id, id) == 0) {
            return p->requests[i];
        }
    }
    return NULL;
}

static inline void report(kvd_leader_t *ld, uint64_t step, const char *saved,
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

static inline kvd_status_t match(kvd_leader_t *ld, const char *id,
                                 const uint32_t *tok, size_t n,
                                 const char *salt, uint64_t computed,
                                 uint64_t *matched, bool *async)
{
    kvd_leader_request_t q = {
        .request_id = id, .tokens = tok, .num_tokens = n, .cache_salt = salt};
    return kvd_leader_get_num_new_matched_tokens(ld, &q, computed, matched,
                                                 async);
}

static inline void ids(uint32_t *out, size_t n, uint32_t base)
{
    for (size_t i = 0; i < n; i++) {
        out[i] = base + (uint32_t)i;
    }
}

/* A leader over an empty scripted store, and a prompt of `n` tokens with
 * its block hashes in `h`. */
static inline kvd_leader_t *scene(fake_t *f, uint32_t workers, uint32_t *tok,
                                  size_t n, uint32_t seed, kvd_block_hash_t *h)
{
    memset(f, 0, sizeof *f);
    prompt(tok, n, seed);
    assert_int_equal(chain(tok, n, NULL, h), n / BS);
    return leader_on(f, workers);
}

#endif /* KVD_TESTS_TESTLEADER_INT_H */
