/*
 * The recompute-vs-fetch gate on a slow tier (demo/gate.c,
 * `kvdepot-demo gate`): a prompt stored on NVMe, read back through a
 * failpoint that delays every read, served with prefixes of several
 * lengths always loaded, always computed, and through the leader's gate.
 */
#ifndef KVD_DEMO_GATE_INT_H
#define KVD_DEMO_GATE_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "demo/engine_int.h"

#define KVD_DEMO_GATE_MAX_ROWS 8
#define KVD_DEMO_GATE_MAX_ROUNDS 9

typedef struct kvd_demo_gate_row {
    uint32_t prefix; /* tokens of the prompt the store holds */
    /* TTFT per round: always load (gate off), always compute (an empty
     * store), the gate on the slow tier, the gate on the tier as it is. */
    double load_ms[KVD_DEMO_GATE_MAX_ROUNDS];
    double compute_ms[KVD_DEMO_GATE_MAX_ROUNDS];
    double gate_ms[KVD_DEMO_GATE_MAX_ROUNDS];
    double fast_ms[KVD_DEMO_GATE_MAX_ROUNDS];
    uint32_t gate_matched, fast_matched, load_matched; /* first round's */
} kvd_demo_gate_row_t;

/* The NVMe tier as two loads measured it: t = latency + blocks * per. */
typedef struct kvd_demo_gate_tier {
    double s_per_block, latency_s;
} kvd_demo_gate_tier_t;

typedef struct kvd_demo_gate {
    uint32_t delay_ms, rounds, num_rows;
    bool first_only;             /* only each process's first read delayed */
    double cold_ms;              /* the populating run */
    double prefill_tokens_per_s; /* what the gate is told */
    kvd_demo_gate_tier_t slow, fast; /* the tier with and without delay */
    kvd_demo_gate_row_t rows[KVD_DEMO_GATE_MAX_ROWS];
} kvd_demo_gate_t;

/* Runs the sweep in `dir` (removed first) with `base`'s model and prompt
 * length: reads of the NVMe tier delayed `delay_ms` (failpoint nvme.read;
 * every read, or with first_only each process's first), `rounds`
 * interleaved rounds. 0, or -1 with the reason on stderr. */
int kvd_demo_gate_run(const kvd_demo_opts_t *base, const char *dir,
                      uint32_t delay_ms, bool first_only, uint32_t rounds,
                      kvd_demo_gate_t *out);

/* The table (medians and ranges), and the worst ratio of the gate's TTFT
 * to the better of always-load and always-compute into *worst_out. */
void kvd_demo_gate_print(const kvd_demo_gate_t *x, double *worst_out);

#endif /* KVD_DEMO_GATE_INT_H */
