/*
 * The recompute-vs-fetch gate (include/kvdepot/leader.h): a stored prefix is
 * matched only where loading it is predicted to beat computing it.
 *
 * Why: a short prefix on a cold NVMe tier behind a busy queue, or on a
 * remote node, can take longer to load than a GPU takes to prefill it; the
 * engine then waits for the cache instead of being sped up by it. The cost
 * model is deliberately small: per tier a time per block and a latency
 * paid once per load, learned from what the workers measured; the engine's
 * prefill rate, configured and learned from the steps it timed. The leader
 * decides per request, on the tiers the lookup returned.
 */
#include <math.h>
#include <string.h>

#include "leader/leader_int.h"

/* The gate's tier of a lease: REMOTE blocks travel like DISK ones (a copy
 * into the arena first). */
static unsigned gate_tier(uint32_t tier)
{
    return tier == KVD_STORE_TIER_HOST ? 0u : 1u;
}

static bool gate_ok(const kvd_leader_gate_t *g)
{
    return g->margin >= 0.0 && isfinite(g->margin) &&
           g->prefill_tokens_per_s > 0.0 && isfinite(g->prefill_tokens_per_s) &&
           g->host_s_per_block > 0.0 && isfinite(g->host_s_per_block) &&
           g->disk_s_per_block > 0.0 && isfinite(g->disk_s_per_block) &&
           g->host_latency_s >= 0.0 && isfinite(g->host_latency_s) &&
           g->disk_latency_s >= 0.0 && isfinite(g->disk_latency_s) &&
           g->alpha > 0.0 && g->alpha <= 1.0;
}

KVD_API kvd_status_t kvd_leader_set_gate(kvd_leader_t *leader,
                                         const kvd_leader_gate_t *gate)
{
    if (leader == NULL || gate == NULL || (gate->enabled && !gate_ok(gate))) {
        return KVD_ERR_INVALID;
    }
    leader->gate = *gate;
    return KVD_OK;
}

KVD_API kvd_status_t kvd_leader_gate_estimates(kvd_leader_t *leader,
                                               kvd_leader_gate_t *out)
{
    if (leader == NULL || out == NULL) {
        return KVD_ERR_INVALID;
    }
    *out = leader->gate;
    return KVD_OK;
}

KVD_API kvd_status_t kvd_leader_report_prefill(kvd_leader_t *leader,
                                               uint64_t tokens, double seconds)
{
    if (leader == NULL || tokens == 0 || !(seconds > 0.0) ||
        !isfinite(seconds)) {
        return KVD_ERR_INVALID;
    }
    kvd_leader_gate_t *g = &leader->gate;
    double rate = (double)tokens / seconds;
    if (g->prefill_tokens_per_s > 0.0 && g->alpha > 0.0) {
        rate = g->alpha * rate + (1.0 - g->alpha) * g->prefill_tokens_per_s;
    }
    g->prefill_tokens_per_s = rate;
    return KVD_OK;
}

size_t kvd_gate_cut(kvd_leader_t *ld, const kvd_store_lease_t *leases,
                    size_t first, size_t m)
{
    const kvd_leader_gate_t *g = &ld->gate;
    if (!g->enabled || m <= first) {
        return m;
    }
    const double per_block[2] = {g->host_s_per_block, g->disk_s_per_block};
    const double latency[2] = {g->host_latency_s, g->disk_latency_s};
    double block_compute = (double)ld->cfg.block_size / g->prefill_tokens_per_s;
    double load = 0.0, best_saving = 0.0;
    bool used[2] = {false, false};
    size_t best = first;
    for (size_t b = first; b < m; b++) {
        unsigned t = gate_tier(leases[b].tier);
        load += per_block[t] + (used[t] ? 0.0 : latency[t]);
        used[t] = true;
        double compute = (double)(b + 1 - first) * block_compute;
        double saving = compute - load * (1.0 + g->margin);
        if (saving > best_saving) {
            best_saving = saving;
            best = b + 1;
        }
    }
    ld->st.gate_loaded += best - first;
    ld->st.gate_skipped += m - best;
    return best;
}

void kvd_gate_observe(kvd_leader_t *ld, const kvd_pb_worker_report_t *rep)
{
    kvd_leader_gate_t *g = &ld->gate;
    if (!g->enabled) {
        return;
    }
    for (size_t i = 0; i < rep->n_tier_loads; i++) {
        const kvd_pb_tier_load_t *tl = rep->tier_loads[i];
        unsigned t = tl->tier == KVDEPOT__V1__TIER__TIER_HOST ? 0u : 1u;
        double lat = t == 0 ? g->host_latency_s : g->disk_latency_s;
        double *est = t == 0 ? &g->host_s_per_block : &g->disk_s_per_block;
        /* What the loads took beyond their latency, per block; a sample
         * at or under the latency says the blocks cost next to nothing. */
        double per = ((double)tl->nanos * 1e-9 - lat * (double)tl->loads) /
                     (double)tl->blocks;
        per = per > 1e-9 ? per : 1e-9;
        *est = g->alpha * per + (1.0 - g->alpha) * *est;
    }
}
