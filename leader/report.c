/*
 * Worker reports to the leader: each worker's kvdepot.v1.WorkerReport names
 * the requests whose loads and saves it finished for a step, and the loads
 * that failed. A request's loads (saves) end once num_workers reports name
 * it; failed blocks and finished asynchronous loads wait here until the
 * engine takes them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grow_int.h"
#include "common/log_int.h"
#include "leader/leader_int.h"
#include "proto/kvd_proto.h"

/* ---- reports ------------------------------------------------------------ */

static bool done_push(kvd_leader_t *ld, const char *id)
{
    if (!kvd_grow((void **)&ld->done_ids, &ld->cap_done, ld->num_done + 1,
                  sizeof *ld->done_ids)) {
        return false;
    }
    snprintf(ld->done_ids[ld->num_done++], LEADER_ID_MAX + 1, "%s", id);
    return true;
}

static void failed_push(kvd_leader_t *ld, uint32_t block_id)
{
    if (kvd_grow((void **)&ld->failed, &ld->cap_failed, ld->num_failed + 1,
                 sizeof *ld->failed)) {
        ld->failed[ld->num_failed++] = block_id;
    } else {
        KVD_LOG_ERROR("leader: no memory to report failed block %u", block_id);
    }
}

KVD_API kvd_status_t kvd_leader_update_connector_output(kvd_leader_t *leader,
                                                        const void *report,
                                                        size_t len)
{
    if (leader == NULL || (report == NULL && len > 0)) {
        return KVD_ERR_INVALID;
    }
    kvd_leader_t *ld = leader;
    kvd_pb_worker_report_t *rep = NULL;
    char reason[256] = "";
    kvd_status_t s = kvd_proto_worker_report_unpack(report, len, &rep, reason,
                                                    sizeof reason);
    if (s != KVD_OK) {
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                            "leader: worker report rejected: %s", reason);
        return s;
    }
    kvd_gate_observe(ld, rep);
    for (size_t i = 0; i < rep->n_failed_loads; i++) {
        lreq_t *r = kvd_lreq_find(ld, rep->failed_loads[i]->request_id);
        failed_push(ld, rep->failed_loads[i]->block_id);
        ld->st.failed_loads++;
        if (r != NULL && r->loads_inflight) {
            /* The engine recomputes from the first bad block: nothing of
             * this load is needed any more. vLLM may put the request back
             * in its queue and ask again: that is a new lookup (the bad
             * objects are gone from the store), and the blocks it computes
             * again are saved again (stored ones answer EXISTS). */
            bool was_async = r->async;
            kvd_lreq_forget_answer(ld, r);
            if (r->save_from == r->saved_upto &&
                r->saved_upto > r->first_block) {
                r->saved_upto = r->save_from = r->first_block;
            }
            if (was_async) {
                (void)done_push(ld, r->id);
            }
            kvd_lreq_maybe_drop(ld, r);
        }
    }
    for (size_t i = 0; i < rep->n_finished_loading; i++) {
        lreq_t *r = kvd_lreq_find(ld, rep->finished_loading[i]);
        if (r == NULL || !r->loads_inflight || rep->step < r->load_step) {
            continue;
        }
        if (++r->load_reports >= ld->cfg.num_workers) {
            bool was_async = r->async;
            kvd_lreq_end_loads(ld, r);
            if (was_async) {
                (void)done_push(ld, r->id);
            }
            kvd_lreq_maybe_drop(ld, r);
        }
    }
    for (size_t i = 0; i < rep->n_finished_saving; i++) {
        lreq_t *r = kvd_lreq_find(ld, rep->finished_saving[i]);
        if (r == NULL || !r->saves_inflight || rep->step < r->save_step) {
            continue;
        }
        if (++r->save_reports >= ld->cfg.num_workers) {
            r->saves_inflight = false;
            kvd_leader_saved_push(ld, r);
            kvd_lreq_maybe_drop(ld, r);
        }
    }
    kvd_proto_worker_report_free(rep);
    return KVD_OK;
}

KVD_API size_t kvd_leader_take_failed_blocks(kvd_leader_t *leader,
                                             uint32_t *block_ids, size_t max)
{
    if (leader == NULL || block_ids == NULL) {
        return 0;
    }
    size_t n = leader->num_failed < max ? leader->num_failed : max;
    if (n == 0) {
        return 0;
    }
    memcpy(block_ids, leader->failed, n * sizeof *block_ids);
    memmove(leader->failed, leader->failed + n,
            (leader->num_failed - n) * sizeof *leader->failed);
    leader->num_failed -= n;
    return n;
}

KVD_API size_t kvd_leader_take_finished_loads(kvd_leader_t *leader,
                                              const char **out, size_t max)
{
    if (leader == NULL || out == NULL) {
        return 0;
    }
    size_t n = leader->num_done < max ? leader->num_done : max;
    if (n == 0 || !kvd_grow((void **)&leader->taken, &leader->cap_taken, n,
                            sizeof *leader->taken)) {
        return 0;
    }
    memcpy(leader->taken, leader->done_ids, n * sizeof *leader->taken);
    memmove(leader->done_ids, leader->done_ids + n,
            (leader->num_done - n) * sizeof *leader->done_ids);
    leader->num_done -= n;
    for (size_t i = 0; i < n; i++) {
        out[i] = leader->taken[i];
    }
    return n;
}
