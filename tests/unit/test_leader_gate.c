/*
 * The leader's recompute-vs-fetch gate (include/kvdepot/leader.h,
 * leader/gate.c) on a scripted cost model: a prefix in the host arena loads
 * whatever its length; one on a slow NVMe tier is computed; a mixed one
 * loads its fast part; a per-load latency makes a short prefix computed and
 * a long one loaded; a margin tips a close call; the workers' tier timings
 * and the engine's prefill timings move the estimates; off, the gate
 * changes nothing. Every decision is counted, and no lease is left.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/unit/kvd_testleader_int.h"

#define NTOK (BS * 13 + 5) /* 13 full blocks, the last one partial */

/* 10,000 tokens/s: a 16-token block computes in 1.6 ms. */
static kvd_leader_gate_t gate(double host_s, double disk_s, double disk_lat)
{
    kvd_leader_gate_t g = {.enabled = true,
                           .margin = 0.0,
                           .prefill_tokens_per_s = 10000.0,
                           .host_s_per_block = host_s,
                           .disk_s_per_block = disk_s,
                           .host_latency_s = 0.0,
                           .disk_latency_s = disk_lat,
                           .alpha = 1.0};
    return g;
}

/* Stores the prompt's first `host` blocks in the arena and the next
 * `disk` on NVMe, then matches it with `g` (NULL: the gate off); returns
 * the matched tokens. */
static uint64_t matched_with(const kvd_leader_gate_t *g, size_t host,
                             size_t disk, kvd_leader_stats_t *st)
{
    fake_t f;
    uint32_t tok[NTOK];
    kvd_block_hash_t h[NTOK / BS];
    kvd_leader_t *ld = scene(&f, 1, tok, NTOK, 7, h);
    fake_store(&f, h, host, KVD_STORE_TIER_HOST);
    fake_store(&f, h + host, disk, KVD_STORE_TIER_DISK);
    if (g != NULL) {
        assert_int_equal(kvd_leader_set_gate(ld, g), KVD_OK);
    }
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "r", tok, NTOK, NULL, 0, &m, &async), KVD_OK);
    /* Whatever was not promised went back at once. */
    assert_int_equal(f.leases, (int64_t)(m / BS));
    assert_int_equal(kvd_leader_stats(ld, st), KVD_OK);
    bool delay = false;
    assert_int_equal(kvd_leader_request_finished(ld, "r", &delay), KVD_OK);
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
    return m;
}

static void test_decisions(void **state)
{
    (void)state;
    kvd_leader_stats_t st;
    /* Off: everything stored is promised, nothing counted. */
    assert_int_equal(matched_with(NULL, 2, 11, &st), 13 * BS);
    assert_int_equal(st.gate_loaded + st.gate_skipped, 0);
    /* Host arena at 0.1 ms a block: all of it. */
    kvd_leader_gate_t g = gate(1e-4, 1e-4, 0.0);
    assert_int_equal(matched_with(&g, 13, 0, &st), 13 * BS);
    assert_int_equal(st.gate_loaded, 13);
    assert_int_equal(st.gate_skipped, 0);
    /* NVMe at 10 ms a block, slower than computing it: none. */
    g = gate(1e-4, 1e-2, 0.0);
    assert_int_equal(matched_with(&g, 0, 13, &st), 0);
    assert_int_equal(st.gate_loaded, 0);
    assert_int_equal(st.gate_skipped, 13);
    /* Four in the arena, the rest on that NVMe: the four. */
    assert_int_equal(matched_with(&g, 4, 9, &st), 4 * BS);
    assert_int_equal(st.gate_skipped, 9);
    /* NVMe at 0.1 ms a block behind a 10 ms latency: four blocks (6.4 ms
     * of compute against 10.4 ms) are computed, but a prompt's 13 (20.8 ms
     * against 11.3 ms) load. */
    g = gate(1e-4, 1e-4, 1e-2);
    assert_int_equal(matched_with(&g, 0, 4, &st), 0);
    assert_int_equal(matched_with(&g, 0, 13, &st), 13 * BS);
    /* A margin of 1 asks loading to take at most half the compute time:
     * 13 blocks (11.3 ms * 2 > 20.8 ms) are then computed. */
    g.margin = 1.0;
    assert_int_equal(matched_with(&g, 0, 13, &st), 0);
}

/* A report whose tier timings say the NVMe tier took `s` for `blocks`. */
static void report_disk(kvd_leader_t *ld, uint32_t blocks, double s)
{
    kvd_pb_worker_report_t r = KVDEPOT__V1__WORKER_REPORT__INIT;
    kvd_pb_tier_load_t tl = KVDEPOT__V1__TIER_LOAD__INIT;
    kvd_pb_tier_load_t *tlp[1] = {&tl};
    tl.tier = KVDEPOT__V1__TIER__TIER_DISK;
    tl.loads = 1;
    tl.blocks = blocks;
    tl.bytes = blocks * 4096u;
    tl.nanos = (uint64_t)(s * 1e9);
    r.n_tier_loads = 1;
    r.tier_loads = tlp;
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(
        kvd_proto_worker_report_pack_alloc(&r, &buf, &len, NULL, 0), KVD_OK);
    assert_int_equal(kvd_leader_update_connector_output(ld, buf, len), KVD_OK);
    free(buf);
}

static void test_learning(void **state)
{
    (void)state;
    fake_t f;
    uint32_t tok[NTOK];
    kvd_block_hash_t h[NTOK / BS];
    kvd_leader_t *ld = scene(&f, 1, tok, NTOK, 9, h);
    fake_store(&f, h, 13, KVD_STORE_TIER_DISK);
    kvd_leader_gate_t g = gate(1e-4, 1e-4, 1e-3);
    g.alpha = 0.5;
    assert_int_equal(kvd_leader_set_gate(ld, &g), KVD_OK);
    /* The tier turned slow: 10 blocks in 1.001 s, 0.1 s a block past the
     * latency; half of it goes into the estimate. */
    report_disk(ld, 10, 1.001);
    kvd_leader_gate_t e;
    assert_int_equal(kvd_leader_gate_estimates(ld, &e), KVD_OK);
    assert_true(e.disk_s_per_block > 0.049 && e.disk_s_per_block < 0.051);
    assert_true(e.host_s_per_block == 1e-4); /* no host sample */
    uint64_t m = 0;
    bool async = false;
    assert_int_equal(match(ld, "a", tok, NTOK, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 0);
    /* The engine prefills at 100 tokens/s: its estimate halves the way
     * there at each report, until that NVMe wins. */
    assert_int_equal(kvd_leader_report_prefill(ld, 100, 1.0), KVD_OK);
    assert_int_equal(kvd_leader_gate_estimates(ld, &e), KVD_OK);
    assert_true(e.prefill_tokens_per_s > 5049.0 &&
                e.prefill_tokens_per_s < 5051.0);
    /* Five more: 100 + 9900 / 64 = 254.7 tokens/s, 63 ms a block against
     * 50 ms to load it. */
    for (int i = 0; i < 5; i++) {
        assert_int_equal(kvd_leader_report_prefill(ld, 100, 1.0), KVD_OK);
    }
    assert_int_equal(match(ld, "b", tok, NTOK, NULL, 0, &m, &async), KVD_OK);
    assert_int_equal(m, 13 * BS);
    bool delay = false;
    assert_int_equal(kvd_leader_request_finished(ld, "a", &delay), KVD_OK);
    assert_int_equal(kvd_leader_request_finished(ld, "b", &delay), KVD_OK);
    kvd_leader_destroy(ld);
    assert_int_equal(f.leases, 0);
}

static void test_refused(void **state)
{
    (void)state;
    fake_t f;
    memset(&f, 0, sizeof f);
    kvd_leader_t *ld = leader_on(&f, 1);
    kvd_leader_gate_t good = gate(1e-4, 1e-3, 0.0), g;
    double *fields[] = {&g.prefill_tokens_per_s, &g.host_s_per_block,
                        &g.disk_s_per_block, &g.alpha};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        g = good;
        *fields[i] = 0.0;
        assert_int_equal(kvd_leader_set_gate(ld, &g), KVD_ERR_INVALID);
    }
    g = good;
    g.margin = -0.5;
    assert_int_equal(kvd_leader_set_gate(ld, &g), KVD_ERR_INVALID);
    g = good;
    g.alpha = 1.5;
    assert_int_equal(kvd_leader_set_gate(ld, &g), KVD_ERR_INVALID);
    g.enabled = false; /* off: the values do not matter */
    assert_int_equal(kvd_leader_set_gate(ld, &g), KVD_OK);
    assert_int_equal(kvd_leader_set_gate(NULL, &good), KVD_ERR_INVALID);
    assert_int_equal(kvd_leader_report_prefill(ld, 0, 1.0), KVD_ERR_INVALID);
    assert_int_equal(kvd_leader_report_prefill(ld, 10, 0.0), KVD_ERR_INVALID);
    kvd_leader_destroy(ld);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decisions),
        cmocka_unit_test(test_learning),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
