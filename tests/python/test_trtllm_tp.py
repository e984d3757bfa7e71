"""kvdepot.trtllm with tensor parallelism 2: two rank processes over one
kvdepotd, joined by the stand-ins of TensorRT-LLM's MPI collectives
(trtllm_standin.PipeComm). Rank 0 runs the leader and a worker, rank 1 a
worker; every rank holds different KV (its shard of the heads). The
workers' reports reach the leader through the allgather in get_finished.
After a restart each rank loads its own heads back bit for bit, and an
engine at TP 1 loads every head (the ranks wrote one object per block); a
block whose part one rank lost is promised to no rank (all or nothing)."""

import json
import multiprocessing
import os
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from conftest import (KVDEPOTD, require_lib, start_daemon,  # noqa: E402
                      stop_daemon)

require_lib()

BS, LAYERS, HEADS, DIM, NB = 16, 2, 4, 32, 12   # 4 KV heads: 2 per rank
PROMPT = 70  # 4 full blocks


def _rank_main(rank, conn, model, sock, phase, out, tp=2, extra=None):
    os.environ["KVDEPOT_CONFIG"] = json.dumps({
        "store_mode": "daemon", "store_address": f"unix:{sock}",
        **(extra or {})})
    import time
    from kvdepot import trtllm as kt
    from trtllm_standin import LlmRequest, Manager, PipeComm, rd, sched_out
    comm = PipeComm(rank, conn)
    kt._rank = lambda: rank
    kt._allgather = comm.allgather
    args = NS(model=model, tensor_parallel_size=tp,
              kv_cache_config=NS(tokens_per_block=BS, dtype="auto"))
    s = kt.KvdepotScheduler(args) if rank == 0 else None
    w = kt.KvdepotWorker(args)
    kv = torch.zeros((NB, LAYERS, 2, BS * (HEADS // tp) * DIM),
                     dtype=torch.float16)
    if phase.startswith("save"):
        g = torch.Generator().manual_seed(1000 + rank)
        kv.copy_(torch.randn(kv.shape, generator=g).to(torch.float16))
    w.register_kv_caches(kv)
    m = Manager(w, s, comm)
    tokens = [(i * 17 + 4) % 32000 for i in range(PROMPT)]
    blocks = [3, 7, 1, 9, 5] if phase.startswith("save") else \
        [10, 11, 2, 4, 6]
    req = LlmRequest(1, tokens)
    n, is_async = m.get_num_new_matched_tokens(req, 0)
    m.update_state_after_alloc(req, blocks)
    if is_async:
        deadline = time.monotonic() + 20
        while 1 not in m.loaded:
            assert time.monotonic() < deadline
            time.sleep(0.002)
            assert m.step(sched_out(), LAYERS) is None
    if phase == "save-partial":
        # Chunked prefill; rank 1's forward pass fails in the second chunk,
        # so it stores blocks 0-1 and not 2-3 (rank 0 stores all four).
        assert m.step(sched_out([rd(1, blocks, tokens, 0, 2 * BS)]),
                      LAYERS) is None
        err = m.step(sched_out(cached=[rd(1, [], [], 2 * BS,
                                          PROMPT - 2 * BS)]), LAYERS,
                     raise_in_forward=1 if rank == 1 else None)
        assert (err is not None) == (rank == 1)
    else:
        assert m.step(sched_out([rd(1, blocks, tokens, n, PROMPT - n)]),
                      LAYERS) is None
    # Kept (async_saves: saves in flight): every rank steps until all of
    # them named it saved (the same answer on each, as in TensorRT-LLM).
    keep = m.request_finished(req, blocks)
    deadline = time.monotonic() + 20
    while keep and 1 not in m.saved:
        assert time.monotonic() < deadline
        time.sleep(0.002)
        m.step(sched_out(), LAYERS)
    for _ in range(2):
        m.step(sched_out(), LAYERS)
    out.put((rank, n, is_async, w.kvdepot_stats(),
             [kv[b].numpy().tobytes() for b in blocks[:4]]))
    w.shutdown()
    if s is not None:
        s.shutdown()


def run_engine(model, sock, phase, tp=2, extra=None):
    ctx = multiprocessing.get_context("spawn")
    a, b = ctx.Pipe() if tp == 2 else (None, None)
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank_main,
                         args=(r, c, model, sock, phase, out, tp, extra))
             for r, c in ((0, a), (1, b))[:tp]]
    for p in procs:
        p.start()
    got = {}
    for _ in procs:
        r = out.get(timeout=120)
        got[r[0]] = r[1:]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return got


def model_and_daemon(tmp_path):
    """The model's config.json (a directory name) and a kvdepotd: (model,
    daemon process, its socket)."""
    model = Path(tmp_path) / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "num_hidden_layers": LAYERS, "num_attention_heads": 8,
        "num_key_value_heads": HEADS, "hidden_size": 8 * DIM,
        "torch_dtype": "float16"}))
    return str(model), start_daemon(tmp_path)[0], f"{tmp_path}/d.sock"


@pytest.mark.skipif(not KVDEPOTD, reason="KVDEPOTD not set")
@pytest.mark.parametrize("extra", [{"async_saves": False}, None],
                         ids=["sync_saves", "async_saves_default"])
def test_two_ranks_in_two_processes_through_a_daemon(tmp_path, extra):
    model, proc, sock = model_and_daemon(tmp_path)
    try:
        saved = run_engine(model, sock, "save", extra=extra)
        for r in (0, 1):
            n, is_async, stats, _ = saved[r]
            assert (n, is_async) == (0, False)
            assert stats["blocks_saved"] == 4
        assert saved[0][3][3] != saved[1][3][3]
        loaded = run_engine(model, sock, "load")
        for r in (0, 1):
            n, is_async, stats, got = loaded[r]
            assert (n, is_async) == (4 * BS, True)
            assert stats["blocks_loaded"] == 4 and stats["load_errors"] == 0
            assert got == saved[r][3], r
        # One engine at TP 1: a pool row is [head][token][dim], so its
        # blocks are rank 0's heads followed by rank 1's.
        n, is_async, stats, got = run_engine(model, sock, "load", tp=1)[0]
        assert (n, is_async) == (4 * BS, True)
        assert stats["blocks_loaded"] == 4
        for i in range(4):
            halves = [np.frombuffer(saved[r][3][i], dtype=np.float16)
                      .reshape(LAYERS, 2, -1) for r in (0, 1)]
            assert got[i] == np.concatenate(halves, axis=2).tobytes(), i
    finally:
        stop_daemon(proc)


@pytest.mark.skipif(not KVDEPOTD, reason="KVDEPOTD not set")
def test_a_block_one_rank_lost_is_promised_to_none(tmp_path):
    """All or nothing across ranks: blocks whose shard rank 1 never stored
    are matched for no rank; the blocks both hold load on both."""
    model, proc, sock = model_and_daemon(tmp_path)
    try:
        saved = run_engine(model, sock, "save-partial")
        assert saved[0][2]["blocks_saved"] == 4
        assert saved[1][2]["blocks_saved"] == 2
        loaded = run_engine(model, sock, "load")
        for r in (0, 1):
            n, is_async, stats, got = loaded[r]
            assert (n, is_async) == (2 * BS, True)
            assert stats["blocks_loaded"] == 2 and stats["load_errors"] == 0
            assert got[:2] == saved[r][3][:2], r
    finally:
        stop_daemon(proc)
