/*
 * Step plans for the worker's tests and benchmark: packs a
 * kvdepot.v1.StepPlan from plain arrays, the way the leader does. Header
 * only (static inline); returns NULL with the reason on stderr when the
 * plan is refused by the proto layer, so callers fail their own way.
 */
#ifndef KVD_TESTS_SUPPORT_TESTPLAN_H
#define KVD_TESTS_SUPPORT_TESTPLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvdepot/common.h"
#include "proto/kvd_proto.h"

typedef struct kvd_testplan_req {
    const char *id;
    bool async, layerwise;
    size_t n_loads, n_saves;
    const int32_t *load_ids; /* engine blocks to fill */
    const kvd_block_hash_t *load_hashes;
    const int32_t *save_ids;
    const kvd_block_hash_t *save_hashes;
    /* Optional (NULL: 0): each block's first token in the request; with
     * `content`, the loads are content loads (non-prefix reuse) that the
     * worker rotates from the position their header records. */
    const uint64_t *load_positions;
    const uint64_t *save_positions;
    bool content;
} kvd_testplan_req_t;

static inline uint8_t *kvd_testplan_pack(uint64_t step, uint32_t block_size,
                                         const kvd_namespace_t *ns,
                                         const kvd_testplan_req_t *reqs,
                                         size_t n, size_t *len_out)
{
    size_t nl = 0, ns_ = 0;
    for (size_t i = 0; i < n; i++) {
        nl += reqs[i].n_loads;
        ns_ += reqs[i].n_saves;
    }
    kvd_pb_step_request_t *rq = calloc(n + 1, sizeof *rq);
    kvd_pb_step_request_t **rqp = calloc(n + 1, sizeof *rqp);
    kvd_pb_block_load_t *ld = calloc(nl + 1, sizeof *ld);
    kvd_pb_block_load_t **ldp = calloc(nl + 1, sizeof *ldp);
    kvd_pb_block_source_t *src = calloc(nl + 1, sizeof *src);
    kvd_pb_block_save_t *sv = calloc(ns_ + 1, sizeof *sv);
    kvd_pb_block_save_t **svp = calloc(ns_ + 1, sizeof *svp);
    kvd_pb_object_key_t *keys = calloc(nl + ns_ + 1, sizeof *keys);
    uint8_t *buf = NULL;
    if (rq == NULL || rqp == NULL || ld == NULL || ldp == NULL || src == NULL ||
        sv == NULL || svp == NULL || keys == NULL) {
        goto out;
    }
    size_t li = 0, si = 0, ki = 0;
    for (size_t i = 0; i < n; i++) {
        const kvd_testplan_req_t *r = &reqs[i];
        kvd_pb_step_request_t rinit = KVDEPOT__V1__STEP_REQUEST__INIT;
        rq[i] = rinit;
        rqp[i] = &rq[i];
        rq[i].request_id = (char *)r->id;
        rq[i].async_load = r->async;
        rq[i].layerwise = r->layerwise;
        rq[i].loads = ldp + li;
        rq[i].n_loads = r->n_loads;
        rq[i].num_load_tokens =
            r->content ? 0 : (uint32_t)(r->n_loads * block_size);
        rq[i].saves = svp + si;
        rq[i].n_saves = r->n_saves;
        for (size_t b = 0; b < r->n_loads + r->n_saves; b++, ki++) {
            bool load = b < r->n_loads;
            size_t k = load ? b : b - r->n_loads;
            kvd_pb_object_key_t kinit = KVDEPOT__V1__OBJECT_KEY__INIT;
            keys[ki] = kinit;
            keys[ki].namespace_id.len = KVD_NAMESPACE_BYTES;
            keys[ki].namespace_id.data = (uint8_t *)ns->bytes;
            keys[ki].block_hash.len = KVD_SHA256_BYTES;
            /* Pointers into the caller's arrays, never to a copy. */
            keys[ki].block_hash.data =
                (uint8_t *)(load ? r->load_hashes[k].bytes
                                 : r->save_hashes[k].bytes);
            if (load) {
                kvd_pb_block_load_t linit = KVDEPOT__V1__BLOCK_LOAD__INIT;
                kvd_pb_block_source_t sinit = KVDEPOT__V1__BLOCK_SOURCE__INIT;
                src[li] = sinit;
                src[li].tier = KVDEPOT__V1__TIER__TIER_HOST;
                ld[li] = linit;
                ld[li].block_id = (uint32_t)r->load_ids[k];
                ld[li].key = &keys[ki];
                ld[li].content = r->content;
                ld[li].position =
                    r->load_positions != NULL ? r->load_positions[k] : 0;
                ld[li].source = &src[li];
                ldp[li] = &ld[li];
                li++;
            } else {
                kvd_pb_block_save_t vinit = KVDEPOT__V1__BLOCK_SAVE__INIT;
                sv[si] = vinit;
                sv[si].block_id = (uint32_t)r->save_ids[k];
                sv[si].key = &keys[ki];
                sv[si].position =
                    r->save_positions != NULL ? r->save_positions[k] : 0;
                svp[si] = &sv[si];
                si++;
            }
        }
    }
    kvd_pb_step_plan_t plan = KVDEPOT__V1__STEP_PLAN__INIT;
    plan.step = step;
    plan.block_size = block_size;
    plan.n_requests = n;
    plan.requests = rqp;
    char why[256] = "";
    if (kvd_proto_step_plan_pack_alloc(&plan, &buf, len_out, why, sizeof why) !=
        KVD_OK) {
        fprintf(stderr, "plan not packed: %s\n", why);
        buf = NULL;
    }
out:
    free(rq);
    free(rqp);
    free(ld);
    free(ldp);
    free(src);
    free(sv);
    free(svp);
    free(keys);
    return buf;
}

#endif /* KVD_TESTS_SUPPORT_TESTPLAN_H */
