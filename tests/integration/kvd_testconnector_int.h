/*
 * One engine step of the connector for the tests that drive the leader and
 * the worker together in an engine's call order (test_connector_roundtrip,
 * test_chunk_reuse): the leader's plan through the worker, layer by layer
 * (wait for the layer's load, save the layer), and the worker's report back
 * to the leader. Header-only (static inline); the including test has
 * cmocka.h included first.
 */
#ifndef KVD_TESTS_TESTCONNECTOR_INT_H
#define KVD_TESTS_TESTCONNECTOR_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "kvdepot/leader.h"
#include "kvdepot/worker.h"

/* Returns the loads the worker reported failed; with `strict`, every
 * layer's load wait must succeed too. */
static inline size_t kvd_test_connector_step(kvd_leader_t *ld, kvd_worker_t *w,
                                             uint32_t layers, bool strict)
{
    uint8_t *plan = NULL;
    size_t len = 0;
    assert_int_equal(kvd_leader_build_connector_meta(ld, &plan, &len), KVD_OK);
    char err[256] = "";
    kvd_status_t s = kvd_worker_bind_metadata(w, plan, len, err, sizeof err);
    if (s != KVD_OK) {
        fail_msg("bind: %s", err);
    }
    free(plan);
    assert_int_equal(kvd_worker_start_load_kv(w, NULL), KVD_OK);
    for (uint32_t l = 0; l < layers; l++) {
        s = kvd_worker_wait_for_layer_load(w, l, NULL);
        if (strict) {
            assert_int_equal(s, KVD_OK);
        }
        assert_int_equal(kvd_worker_save_kv_layer(w, l, NULL), KVD_OK);
    }
    assert_int_equal(kvd_worker_wait_for_save(w, NULL), KVD_OK);
    kvd_worker_finished_t f;
    assert_int_equal(kvd_worker_get_finished(w, NULL, 0, &f), KVD_OK);
    assert_int_equal(
        kvd_leader_update_connector_output(ld, f.report, f.report_len), KVD_OK);
    assert_int_equal(kvd_worker_clear_metadata(w), KVD_OK);
    return f.num_failed_loads;
}

#endif /* KVD_TESTS_TESTCONNECTOR_INT_H */
