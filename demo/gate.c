/*
 * The recompute-vs-fetch gate on a slow tier (demo/gate_int.h,
 * docs/vllm.md "The gate").
 *
 * A prompt computed cold is stored on NVMe (write-through). Every read of
 * the NVMe tier is then delayed by a failpoint (nvme.read=delay:MS), a
 * tier slower than the model computes. Prompts that share a prefix of P
 * tokens with the stored one (and differ after it) are served, each in a
 * new process on a fresh copy of the store: always loading the prefix (the
 * gate off), always computing it (an empty store), and through the gate;
 * and through the gate on the tier without the delay, where it must load
 * what loading loads. The gate is told the prefill rate of the cold run
 * and the NVMe tier's time per block that one loading run measured (the
 * worker's tier_loads, as a leader learns it; a demo process serves one
 * request, so the harness carries the estimate from one process to the
 * next).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "demo/gate_int.h"
#include "demo/rag_int.h"

/* Prompt P: the stored prompt's first `prefix` tokens, then other ones. */
static void gate_prompt(const uint32_t *stored, uint32_t n, uint32_t prefix,
                        uint32_t *out)
{
    for (uint32_t t = 0; t < n; t++) {
        out[t] = t < prefix ? stored[t] : (stored[t] + 1u) % 256u;
    }
}

/* One request in a new process on a fresh copy of `dir`/populated (or an
 * empty store with copy false), the NVMe reads delayed when `delay_ms`. */
static int gate_serve(const kvd_demo_opts_t *o, const char *dir, bool copy,
                      const kvd_demo_gate_t *x, bool slow,
                      kvd_demo_outcome_t *oc)
{
    char path[700], cmd[1600], fp[64];
    snprintf(path, sizeof path, "%s/run", dir);
    if (copy) {
        snprintf(cmd, sizeof cmd,
                 "rm -rf '%s' && cp -a --sparse=always '%s/populated' '%s' && "
                 "sync",
                 path, dir, path);
    } else {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    }
    if (system(cmd) != 0) {
        fprintf(stderr, "kvdepot-demo: preparing the store failed\n");
        return -1;
    }
    kvd_demo_opts_t run = *o;
    run.store_dir = path;
    if (slow) {
        /* Every read slow (a tier short of bandwidth), or the first one
         * only (a tier slow to start: a cold device, a remote node). */
        snprintf(fp, sizeof fp, "nvme.read=delay:%u%s", x->delay_ms,
                 x->first_only ? "@1" : "");
        setenv("KVDEPOT_FAILPOINTS", fp, 1);
    }
    int rc = kvd_demo_run_child(&run, oc);
    unsetenv("KVDEPOT_FAILPOINTS");
    return rc;
}

/* The gate as the demo configures it: the measured rates of the tier as
 * it is now (slow or not), a 10 % margin. */
static kvd_leader_gate_t gate_of(const kvd_demo_gate_t *x, bool slow)
{
    const kvd_demo_gate_tier_t *t = slow ? &x->slow : &x->fast;
    kvd_leader_gate_t g = {.enabled = true,
                           .margin = 0.1,
                           .prefill_tokens_per_s = x->prefill_tokens_per_s,
                           .host_s_per_block = 1e-5,
                           .disk_s_per_block = t->s_per_block,
                           .host_latency_s = 0.0,
                           .disk_latency_s = t->latency_s,
                           .alpha = 0.2};
    return g;
}

/* The NVMe tier's time for a load of `blocks` blocks of the stored prompt
 * (slow or not), as the worker measured it (tier_loads, folded into the
 * gate's estimate with alpha 1 and no latency: seconds per block). */
static int gate_measure(kvd_demo_opts_t *o, const char *dir,
                        const kvd_demo_gate_t *x, const uint32_t *stored,
                        uint32_t *p, uint32_t blocks, bool slow, double *s_out)
{
    static kvd_demo_outcome_t oc;
    kvd_leader_gate_t learn = {.enabled = true,
                               .prefill_tokens_per_s = 1.0,
                               .host_s_per_block = 1e-9,
                               .disk_s_per_block = 1e-9,
                               .alpha = 1.0};
    gate_prompt(stored, o->prompt_tokens, blocks * KVD_DEMO_BLOCK_SIZE, p);
    o->prompt = p;
    o->gate = &learn;
    int rc = gate_serve(o, dir, true, x, slow, &oc);
    o->gate = NULL;
    *s_out = oc.r.gate_est.disk_s_per_block * blocks;
    return rc;
}

/* Latency and time per block from loads of k1 and k2 blocks:
 * t = latency + k * per_block. */
static int gate_tier(kvd_demo_opts_t *o, const char *dir,
                     const kvd_demo_gate_t *x, const uint32_t *stored,
                     uint32_t *p, bool slow, kvd_demo_gate_tier_t *t)
{
    uint32_t k1 = 4, k2 = (o->prompt_tokens - 1) / KVD_DEMO_BLOCK_SIZE;
    double t1 = 0, t2 = 0;
    int rc = gate_measure(o, dir, x, stored, p, k1, slow, &t1);
    if (rc == 0) {
        rc = gate_measure(o, dir, x, stored, p, k2, slow, &t2);
    }
    double per = (t2 - t1) / (double)(k2 - k1);
    t->s_per_block = per > 1e-6 ? per : 1e-6;
    double lat = t1 - (double)k1 * t->s_per_block;
    t->latency_s = lat > 0 ? lat : 0;
    return rc;
}

/* The cold run that stores the prompt (its rate is what the gate is
 * told), then the tier measured slow and as it is. */
static int gate_calibrate(kvd_demo_opts_t *o, const char *dir,
                          const uint32_t *stored, uint32_t *p,
                          kvd_demo_gate_t *x)
{
    static kvd_demo_outcome_t oc;
    char path[700];
    snprintf(path, sizeof path, "%s/populated", dir);
    kvd_demo_opts_t cold = *o;
    cold.store_dir = path;
    cold.prompt = stored;
    if (kvd_demo_run_child(&cold, &oc) != 0) {
        return -1;
    }
    x->cold_ms = oc.r.ttft_ms;
    x->prefill_tokens_per_s = oc.r.prompt_tokens / (oc.r.ttft_ms * 1e-3);
    int rc = gate_tier(o, dir, x, stored, p, true, &x->slow);
    if (rc == 0) {
        rc = gate_tier(o, dir, x, stored, p, false, &x->fast);
    }
    return rc;
}

/* Every mode of one prefix length, one round. */
static int gate_round(kvd_demo_opts_t *o, const char *dir, kvd_demo_gate_t *x,
                      kvd_demo_gate_row_t *row, uint32_t round)
{
    static kvd_demo_outcome_t oc;
    kvd_leader_gate_t g = gate_of(x, true), f = gate_of(x, false);
    o->gate = NULL;
    int rc = gate_serve(o, dir, true, x, true, &oc);
    row->load_ms[round] = oc.r.ttft_ms;
    row->load_matched = oc.r.matched_tokens;
    if (rc == 0) {
        rc = gate_serve(o, dir, false, x, false, &oc);
        row->compute_ms[round] = oc.r.ttft_ms;
    }
    o->gate = &g;
    if (rc == 0) {
        rc = gate_serve(o, dir, true, x, true, &oc);
        row->gate_ms[round] = oc.r.ttft_ms;
        row->gate_matched = oc.r.matched_tokens;
    }
    o->gate = &f;
    if (rc == 0) {
        rc = gate_serve(o, dir, true, x, false, &oc);
        row->fast_ms[round] = oc.r.ttft_ms;
        row->fast_matched = oc.r.matched_tokens;
    }
    o->gate = NULL;
    return rc;
}

int kvd_demo_gate_run(const kvd_demo_opts_t *base, const char *dir,
                      uint32_t delay_ms, bool first_only, uint32_t rounds,
                      kvd_demo_gate_t *out)
{
    uint32_t n = base->prompt_tokens, bs = KVD_DEMO_BLOCK_SIZE;
    if (rounds == 0 || rounds > KVD_DEMO_GATE_MAX_ROUNDS || n < 4 * bs) {
        fprintf(stderr, "kvdepot-demo: rounds 1..%u, prompt >= %u tokens\n",
                KVD_DEMO_GATE_MAX_ROUNDS, 4 * bs);
        return -1;
    }
    memset(out, 0, sizeof *out);
    out->delay_ms = delay_ms;
    out->first_only = first_only;
    out->rounds = rounds;
    uint32_t *stored = calloc(n, sizeof *stored), *p = calloc(n, sizeof *p);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    int rc = stored == NULL || p == NULL || system(cmd) != 0 ||
                     (mkdir(dir, 0755) != 0 && errno != EEXIST)
                 ? -1
                 : 0;
    kvd_demo_opts_t o = *base;
    if (rc == 0) {
        kvd_demo_prompt(n, o.question, stored);
        rc = gate_calibrate(&o, dir, stored, p, out);
    }
    /* Prefixes from 1/16 of the prompt to all but its last block. */
    uint32_t full = (n - 1) / bs;
    static const uint32_t sixteenths[] = {1, 2, 4, 8, 12, 16};
    for (size_t i = 0; rc == 0 && i < sizeof sixteenths / sizeof *sixteenths;
         i++) {
        uint32_t blocks = full * sixteenths[i] / 16;
        blocks = blocks == 0 ? 1 : blocks;
        if (out->num_rows > 0 &&
            out->rows[out->num_rows - 1].prefix == blocks * bs) {
            continue; /* a short prompt: fewer lengths */
        }
        out->rows[out->num_rows++].prefix = blocks * bs;
    }
    o.prompt = p;
    for (uint32_t r = 0; rc == 0 && r < rounds; r++) {
        for (uint32_t i = 0; rc == 0 && i < out->num_rows; i++) {
            gate_prompt(stored, n, out->rows[i].prefix, p);
            rc = gate_round(&o, dir, out, &out->rows[i], r);
        }
    }
    free(stored);
    free(p);
    return rc;
}

void kvd_demo_gate_print(const kvd_demo_gate_t *x, double *worst_out)
{
    printf("| stored prefix | always load (ms) | always compute (ms) | gate "
           "(ms) | gate loaded | gate / better, paired | no delay: gate "
           "loaded |\n"
           "|---:|---:|---:|---:|---:|---:|---:|\n");
    double worst = 0, lo, hi;
    for (uint32_t i = 0; i < x->num_rows; i++) {
        const kvd_demo_gate_row_t *row = &x->rows[i];
        double l = 0, c = 0, g = 0;
        kvd_demo_rag_stats(row->load_ms, x->rounds, &l, &lo, &hi);
        kvd_demo_rag_stats(row->compute_ms, x->rounds, &c, &lo, &hi);
        kvd_demo_rag_stats(row->gate_ms, x->rounds, &g, &lo, &hi);
        /* The better side by its median, then each round's gate run over
         * that round's run of that side: the pair ran back to back, so a
         * slow spell of the machine touches both. */
        const double *better = l < c ? row->load_ms : row->compute_ms;
        double ratios[KVD_DEMO_GATE_MAX_ROUNDS], ratio = 0, rlo = 0, rhi = 0;
        for (uint32_t r = 0; r < x->rounds; r++) {
            ratios[r] = row->gate_ms[r] / better[r];
        }
        kvd_demo_rag_stats(ratios, x->rounds, &ratio, &rlo, &rhi);
        worst = ratio > worst ? ratio : worst;
        printf("| %13u | %16.1f | %19.1f | %9.1f (%.1f-%.1f) | %11u | %.2f "
               "(%.2f-%.2f) | %21u |\n",
               row->prefix, l, c, g, lo, hi, row->gate_matched, ratio, rlo, rhi,
               row->fast_matched);
    }
    *worst_out = worst;
}
