"""Per-step cost of the Python shim (kvdepot.vllm) on top of the C library.

Scheduler role: 64 running requests of 512-token prompts decode one token
per step; one step is build_connector_meta (64 cached requests, new tokens
read from each request) plus update_connector_output with one worker
report. The same leader calls made straight through ctypes, in the same
run, are the peer: the difference is what Python adds.

Worker role: one step of a 32-layer model with nothing to load or save:
bind, start_load_kv, wait_for_layer_load + save_kv_layer per layer,
wait_for_save, get_finished, worker metadata, clear. Reported per layer.

Run with `make bench NAME=python_shim` (Debian's /usr/bin/python3 and
python3-torch; the dev tree's libkvdepot.so).
"""

import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace as NS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests" / "python"))

import torch  # noqa: E402

from kvdepot import vllm as kv  # noqa: E402
from test_vllm_connector import Blocks, Request, sched_output  # noqa: E402

REQS, PROMPT, STEPS, LAYERS = 64, 512, 200, 32


def config(d):
    mc = NS(model="bench/llama", dtype=torch.float16, use_mla=False,
            get_num_layers=lambda pc: LAYERS,
            get_num_kv_heads=lambda pc: 8, get_head_size=lambda: 128)
    return NS(model_config=mc,
              parallel_config=NS(tensor_parallel_size=1,
                                 pipeline_parallel_size=1),
              cache_config=NS(block_size=16),
              kv_transfer_config=NS(kv_connector_extra_config={
                  "store_dir": d, "arena_size": "256m", "disk_size": "64m"}))


def best(fn, reps=STEPS):
    times = []
    for i in range(reps):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e6  # median, us


def main():
    with tempfile.TemporaryDirectory() as d:
        cfg = config(d)
        s = kv.KvdepotConnector(cfg, kv.KVConnectorRole.SCHEDULER)
        reqs = []
        for r in range(REQS):
            req = Request(f"r{r}", [(r * 1000 + i) % 32000
                                    for i in range(PROMPT)])
            s.get_num_new_matched_tokens(req, 0)
            blocks = list(range(r * 40, r * 40 + 40))
            s.update_state_after_alloc(req, Blocks(blocks), 0)
            reqs.append((req, blocks))
        s.build_connector_meta(sched_output(
            new=[(q, 0) for q, _ in reqs],
            tokens={q.request_id: PROMPT for q, _ in reqs}))
        pos = [PROMPT]

        def shim_step(i):
            p = pos[0]
            for q, _ in reqs:
                q.all_token_ids.append(7)
            out = sched_output(
                cached=[(q.request_id, None, p) for q, _ in reqs],
                tokens={q.request_id: 1 for q, _ in reqs})
            s.build_connector_meta(out)
            s.update_connector_output(NS(kv_connector_worker_meta=None))
            pos[0] = p + 1

        shim_us = best(shim_step)

        # The same leader work through ctypes alone.
        leader = s.leaders[0]

        def c_step(i):
            p = pos[0]
            for q, _ in reqs:
                leader.request_scheduled(q.request_id, [], [7], p + 1)
            leader.build_connector_meta()
            leader.take_failed_blocks()
            leader.take_finished_loads()
            pos[0] = p + 1

        c_us = best(c_step)
        s.shutdown()

        w = kv.KvdepotConnector(cfg, kv.KVConnectorRole.WORKER)
        caches = {f"layers.{i}": torch.zeros((2, 8, 16, 8, 128),
                                             dtype=torch.float16)
                  for i in range(LAYERS)}
        w.register_kv_caches(caches)
        names = list(caches)
        s2 = kv.KvdepotConnector(cfg, kv.KVConnectorRole.SCHEDULER)
        meta = s2.build_connector_meta(sched_output())

        def worker_step(i):
            w.bind_connector_metadata(meta)
            w.start_load_kv(None)
            for n in names:
                w.wait_for_layer_load(n)
                w.save_kv_layer(n, None, None)
            w.wait_for_save()
            w.get_finished(set())
            w.get_block_ids_with_load_errors()
            w.build_connector_worker_meta()
            w.clear_connector_metadata()

        step_us = best(worker_step)
        w.shutdown()
        s2.shutdown()

    print(f"scheduler step, {REQS} decoding requests: shim {shim_us:.0f} us, "
          f"the same leader calls through ctypes {c_us:.0f} us")
    print(f"worker step, {LAYERS} layers, nothing to move: {step_us:.0f} us "
          f"({step_us / LAYERS:.1f} us per layer)")
    print(f"BENCH python_shim: scheduler_step_us = {shim_us:.0f} "
          f"(target <= 300: 1% of a 30 ms step)")
    print(f"BENCH python_shim: shim_over_ctypes_us = {shim_us - c_us:.0f} "
          f"(no target: what Python adds per step)")
    print(f"BENCH python_shim: worker_us_per_layer = {step_us / LAYERS:.1f} "
          f"(target <= 10: 1% of a 1 ms layer)")


if __name__ == "__main__":
    main()
