/*
 * The recompute-vs-fetch gate's sweep at a small size (demo/gate.c,
 * `kvdepot-demo gate`): a prompt stored on NVMe, each process's first
 * NVMe read delayed by a failpoint, prefixes of five lengths served always
 * loaded, always computed and through the gate, each in a new process on a
 * copy of the store. What does not depend on the machine's speed is
 * checked: the runs complete, the delayed calibration load measured at
 * least the delay, always-load loads each stored prefix, and the gate answers
 * all of a stored prefix or none of it. Its decisions depend on the speeds
 * measured (with this small model, computing a block or two can beat even the
 * fast tier's latency), so they are reported, not asserted:
 * docs/performance.md has the sweep at full size, test_leader_gate the
 * decisions on a scripted cost model.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "demo/gate_int.h"
#include "tests/unit/kvd_testdir_int.h"

static void test_sweep(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "gate");
    static kvd_demo_gate_t x;
    kvd_demo_opts_t o = {0};
    o.codec = KVD_CODEC_RAW;
    o.gen_tokens = 1;
    o.seed = 42;
    o.prompt_tokens = 256;
    o.question = " Question: which blocks load?";
    o.model = (kvd_demo_config_t){64, 128, 2, 2, 2, 256, 1024, 10000.0f};
    assert_int_equal(kvd_demo_gate_run(&o, d.path, 50, true, 1, &x), 0);
    double worst = 0;
    kvd_demo_gate_print(&x, &worst);
    assert_int_equal(x.num_rows, 5); /* 15 blocks: 1, 3, 7, 11, 15 */
    assert_true(x.prefill_tokens_per_s > 0);
    /* The 4-block calibration load took its latency plus four blocks,
     * and at least the 50 ms its first read slept. */
    assert_true(x.slow.latency_s + 4 * x.slow.s_per_block >= 0.049);
    for (uint32_t i = 0; i < x.num_rows; i++) {
        assert_int_equal(x.rows[i].prefix % KVD_DEMO_BLOCK_SIZE, 0);
        assert_int_equal(x.rows[i].load_matched, x.rows[i].prefix);
        /* All or nothing of what is stored, whatever the speeds. */
        assert_true(x.rows[i].gate_matched == 0 ||
                    x.rows[i].gate_matched == x.rows[i].prefix);
        assert_true(x.rows[i].fast_matched == 0 ||
                    x.rows[i].fast_matched == x.rows[i].prefix);
    }
    kvd_test_dir_remove(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
