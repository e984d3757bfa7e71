"""kvdepot.vllm driven in vLLM 0.19's call order (KVConnectorBase_V1 in
vllm/distributed/kv_transfer/kv_connector/v1/base.py) with real torch CPU
tensors, on the host backend and the embedded store.

An engine computes a prompt (its KV: random tensors), the connector saves
it; the connector pair is shut down and a new pair created on the same
store directory, as after an engine restart; the same prompt is matched
(asynchronously, from NVMe), loaded, and the blocks compared bit for bit
with the first engine's, in every layout vLLM hands to register_kv_caches
(FlashAttention NHD and HND views, FlashInfer, the CPU backend, MLA, the
cross-layer tensor). Also: the class defines every method of vLLM 0.19's
KVConnectorBase_V1 with compatible parameters, the metadata pickles, load
errors surface through get_block_ids_with_load_errors, and bad settings are
refused with a clear message.

Runs under /usr/bin/python3 (Debian's python3-torch); skipped without
torch or without a built libkvdepot.so.
"""

import contextlib
import inspect
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

torch = pytest.importorskip("torch")

from conftest import KVDEPOTD, require_lib, start_daemon, stop_daemon  # noqa: E402,E501
from kvdepot import _lib, vllm as kv  # noqa: E402

require_lib()

BS, LAYERS, HEADS, DIM, NB = 16, 3, 2, 64, 24
PROMPT = 100  # 6 full blocks, the 7th holds the last token


class ModelConfig:
    """total_heads: the model's KV heads, split over the TP ranks as vLLM
    does (max(1, total / TP) each); None: HEADS on every rank."""

    def __init__(self, mla=False, total_heads=None):
        self.model = "test/tiny-llama"
        self.dtype = torch.float16
        self.use_mla = mla
        self.total_heads = total_heads
        if total_heads is not None:
            self.get_total_num_kv_heads = lambda: total_heads

    def get_num_layers(self, pc):
        return LAYERS

    def get_num_kv_heads(self, pc):
        if self.use_mla:
            return 1
        if self.total_heads is None:
            return HEADS
        return max(1, self.total_heads // pc.tensor_parallel_size)

    def get_head_size(self):
        return DIM



class CudaLike:
    """A CPU tensor that says it is on a CUDA device: what the connectors
    read to choose the worker's backend (torch here has no CUDA)."""

    def __init__(self, t):
        self._t = t
        self.device = torch.device("cuda", 0)

    def __getattr__(self, name):
        return getattr(self._t, name)

def vllm_config(store_dir, mla=False, **extra):
    """A VllmConfig stand-in. Saves end at wait_for_save unless a test asks
    for async_saves (the default): these tests look at a step's objects when
    it ends; saves across steps have their own tests."""
    extra = {"store_dir": store_dir, "arena_size": "64m",
             "disk_size": "64m", "disk_write": "through",
             "async_saves": False, **extra}
    return NS(model_config=ModelConfig(mla),
              parallel_config=NS(tensor_parallel_size=1,
                                 pipeline_parallel_size=1),
              cache_config=NS(block_size=BS),
              kv_transfer_config=NS(kv_connector_extra_config=extra))


class Request:
    def __init__(self, rid, tokens):
        self.request_id = rid
        self.prompt_token_ids = list(tokens)
        self.all_token_ids = list(tokens)
        self.lora_request = None
        self.cache_salt = None
        self.mm_features = []  # vLLM's MultiModalFeatureSpec list


class Blocks:
    def __init__(self, ids):
        self.ids = list(ids)

    def get_block_ids(self):
        return (self.ids,)


def sched_output(new=(), cached=(), tokens=None, finished=()):
    """new: [(request, num_computed)], cached: [(id, new_blocks, computed)]."""
    tokens = tokens or {}
    return NS(
        scheduled_new_reqs=[NS(req_id=r.request_id, num_computed_tokens=c)
                            for r, c in new],
        scheduled_cached_reqs=NS(
            req_ids=[c[0] for c in cached],
            new_block_ids=[(c[1],) if c[1] else None for c in cached],
            num_computed_tokens=[c[2] for c in cached]),
        num_scheduled_tokens=tokens, finished_req_ids=set(finished),
        preempted_req_ids=set())


def caches(kind, fill):
    """Per-layer tensors (or the cross-layer one) as vLLM builds them."""
    g = torch.Generator().manual_seed(1234)

    def make(shape, order=None):
        phys = [shape[i] for i in order] if order else list(shape)
        t = torch.empty(phys, dtype=torch.float16)
        if fill:
            t.copy_(torch.randn(phys, generator=g).to(torch.float16))
        else:
            t.fill_(-1.0)
        if order:  # the logical shape, with the physical strides
            t = t.permute([order.index(i) for i in range(len(order))])
        return t

    if kind == "cross":
        t = make((NB, LAYERS, 2, BS, HEADS, DIM))
        return t.permute(1, 2, 0, 3, 4, 5)  # (L, 2, NB, BS, H, D)
    shapes = {"flash": ((2, NB, BS, HEADS, DIM), None),
              "hnd": ((2, NB, BS, HEADS, DIM), [0, 1, 3, 2, 4]),
              "flashinfer": ((NB, 2, BS, HEADS, DIM), None),
              "cpu": ((2, NB, HEADS, BS, DIM), None),
              "mla": ((NB, BS, DIM), None)}
    shape, order = shapes[kind]
    return {f"model.layers.{i}.self_attn": make(shape, order)
            for i in range(LAYERS)}


def block_of(kind, kv, layer, block):
    """One block's K and V (or latent) of one layer, as a tensor."""
    if kind == "cross":
        return kv[layer][:, block]
    t = list(kv.values())[layer]
    if kind == "flashinfer":
        return t[block]
    if kind == "mla":
        return t[block]
    return t[:, block]


def worker_step(w, meta, kvs, names, finished=()):
    """The worker's side of one step, as the model runner calls it."""
    meta = pickle.loads(pickle.dumps(meta))  # crosses a process in vLLM
    w.bind_connector_metadata(meta)
    w.start_load_kv(None)
    for name in names:
        w.wait_for_layer_load(name)
        w.save_kv_layer(name, None, None)
    w.wait_for_save()
    sending, recving = w.get_finished(set(finished))
    invalid = w.get_block_ids_with_load_errors()
    wmeta = w.build_connector_worker_meta()
    w.clear_connector_metadata()
    return NS(finished_sending=sending, finished_recving=recving,
              invalid_block_ids=invalid, kv_connector_worker_meta=wmeta)


def connector_pair(cfg, kvs):
    s = kv.KvdepotConnector(cfg, kv.KVConnectorRole.SCHEDULER)
    w = kv.KvdepotConnector(cfg, kv.KVConnectorRole.WORKER)
    if isinstance(kvs, dict):
        w.register_kv_caches(kvs)
        names = list(kvs)
    else:
        w.register_cross_layers_kv_cache(kvs, None)
        names = [f"model.layers.{i}.self_attn" for i in range(LAYERS)]
    return s, w, names


@pytest.mark.parametrize("kind", ["flash", "hnd", "flashinfer", "cpu", "mla",
                                  "cross"])
def test_save_restart_load(kind):
    with tempfile.TemporaryDirectory() as d:
        save_restart_load(kind, vllm_config(d, mla=kind == "mla"))


@pytest.mark.skipif(not KVDEPOTD, reason="KVDEPOTD not set")
def test_save_restart_load_through_daemon(tmp_path):
    """Daemon mode: engine A saves into kvdepotd, the daemon restarts (the
    NVMe tier survives it), engine B loads through the new daemon."""
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    sets = (f"store.disk_path={nvme}", "store.disk_size=64m",
            "store.disk_write=through", "store.sync_interval=0")
    proc = [start_daemon(tmp_path, *sets)[0]]

    def restart():
        stop_daemon(proc[0])
        proc[0] = start_daemon(tmp_path, *sets)[0]

    cfg = vllm_config("", store_mode="daemon",
                      store_address=f"unix:{tmp_path}/d.sock")
    try:
        save_restart_load("flash", cfg, between=restart)
    finally:
        stop_daemon(proc[0])


def tp_config(tmp_path, rank, tp=2, mla=False, shared=True, **extra):
    """Rank `rank` of a TP engine over the test daemon in tmp_path."""
    cfg = vllm_config("", mla=mla, store_mode="daemon",
                      store_address=f"unix:{tmp_path}/d.sock",
                      shared_objects=shared, **extra)
    cfg.parallel_config.tensor_parallel_size = tp
    cfg.parallel_config.rank = rank
    return cfg


def tp_engine(tmp_path, fill, seed, shared=True):
    """A TP=2 engine: the scheduler-role connector and one worker-role
    connector per rank over its own tensors (a different shard per rank
    when filled)."""
    s = kv.KvdepotConnector(tp_config(tmp_path, 0, shared=shared),
                            kv.KVConnectorRole.SCHEDULER)
    ranks = []
    for rank in range(2):
        torch.manual_seed(seed + rank)
        kvs = caches("flash", fill=fill)
        if fill:
            for t in kvs.values():
                t.copy_(torch.randn(t.shape).to(torch.float16))
        w = kv.KvdepotConnector(tp_config(tmp_path, rank, shared=shared),
                                kv.KVConnectorRole.WORKER)
        w.register_kv_caches(kvs)
        ranks.append((w, kvs))
    return s, ranks


def parallel_step(s, workers, meta, finished=()):
    """Every worker (rank or stage) runs the step; their outputs are
    aggregated as vLLM's executor does (a load is done when every worker
    says so; the worker metadata of all reaches the leader). Returns the
    requests done loading and the invalid block ids."""
    outs = [worker_step(w, meta, kvs, list(kvs), finished=finished)
            for w, kvs in workers]
    agg = None
    for o in outs:
        m = o.kv_connector_worker_meta
        if m is not None:
            agg = m if agg is None else agg.aggregate(m)
    s.update_connector_output(NS(kv_connector_worker_meta=agg))
    done = set.intersection(*(set(o.finished_recving or ()) for o in outs))
    return done, set().union(*(o.invalid_block_ids for o in outs))


def shutdown_all(s, workers):
    for obj in [s] + [w for w, _ in workers]:
        obj.shutdown()


@pytest.mark.skipif(not KVDEPOTD, reason="KVDEPOTD not set")
@pytest.mark.parametrize("shared", [True, False])
def test_tensor_parallel_through_daemon(tmp_path, shared):
    """TP=2 over kvdepotd: one scheduler-role connector (its leader waits
    for both ranks' reports), two worker-role connectors (ranks 0 and 1),
    each holding different KV for the same blocks. vLLM aggregates the
    workers' outputs: a request is finished only when every rank says so,
    and the worker metadata of both ranks reaches the leader. After a
    restart each rank loads its own heads back, bit for bit: from the one
    object per block both wrote (shared_objects), or from its own shard's
    namespace."""
    proc = start_daemon(tmp_path)[0]
    tokens = [(i * 29 + 1) % 32000 for i in range(PROMPT)]
    a_blocks, b_blocks = [3, 9, 1, 12, 5, 20, 7], [11, 13, 15, 17, 19, 21, 23]
    try:
        s, ranks = tp_engine(tmp_path, True, 500, shared)
        same = ranks[0][0].group_ns[0].bytes[:] == \
            ranks[1][0].group_ns[0].bytes[:]
        assert same == shared
        assert [w.tp_rank for w, _ in ranks] == [0, 1]
        req = Request("tp-a", tokens)
        assert s.get_num_new_matched_tokens(req, 0) == (0, False)
        s.update_state_after_alloc(req, Blocks(a_blocks), 0)
        parallel_step(s, ranks, s.build_connector_meta(
            sched_output(new=[(req, 0)], tokens={"tp-a": PROMPT})))
        assert s.request_finished(req, a_blocks) == (False, None)
        for w, _ in ranks:
            assert w.kvdepot_stats()["blocks_saved"] == 6
        saved = [[t[:, b].clone() for t in kvs.values() for b in a_blocks[:6]]
                 for _, kvs in ranks]
        assert not torch.equal(saved[0][0], saved[1][0])
        shutdown_all(s, ranks)

        s, ranks = tp_engine(tmp_path, False, 0, shared)
        req = Request("tp-b", tokens)
        # In the daemon's RAM: loaded in the step that runs the request.
        assert s.get_num_new_matched_tokens(req, 0) == (96, False)
        s.update_state_after_alloc(req, Blocks(b_blocks), 96)
        done, invalid = parallel_step(s, ranks, s.build_connector_meta(sched_output(
            new=[(req, 96)], tokens={"tp-b": PROMPT - 96})))
        assert invalid == set() and done == set()
        for w, _ in ranks:
            assert w.kvdepot_stats()["blocks_loaded"] == 6
        for r, (_, kvs) in enumerate(ranks):
            got = [t[:, b] for t in kvs.values() for b in b_blocks[:6]]
            assert all(torch.equal(x, y) for x, y in zip(saved[r], got))
        shutdown_all(s, ranks)
    finally:
        stop_daemon(proc)


def mla_engine(tmp_path, tp, fill):
    """An MLA engine at tensor parallel size `tp`: every rank holds the same
    latents (vLLM replicates them)."""
    s = kv.KvdepotConnector(tp_config(tmp_path, 0, tp, mla=True),
                            kv.KVConnectorRole.SCHEDULER)
    ranks = []
    for rank in range(tp):
        w = kv.KvdepotConnector(tp_config(tmp_path, rank, tp, mla=True),
                                kv.KVConnectorRole.WORKER)
        kvs = caches("mla", fill=fill)  # the same seed: the same latents
        w.register_kv_caches(kvs)
        ranks.append((w, kvs))
    return s, ranks


@pytest.mark.skipif(not KVDEPOTD, reason="KVDEPOTD not set")
def test_mla_stored_once_loaded_at_any_tp(tmp_path):
    """MLA at TP=4: the four ranks' latents are one copy in the store, not
    four, and an engine of another TP size (1, then 2) loads them back bit
    for bit."""
    proc = start_daemon(tmp_path)[0]
    tokens = [(i * 41 + 5) % 32000 for i in range(PROMPT)]
    a_blocks = [3, 9, 1, 12, 5, 20, 7]
    try:
        s, ranks = mla_engine(tmp_path, 4, True)
        assert len({bytes(w.group_ns[0].bytes) for w, _ in ranks}) == 1
        req = Request("mla-a", tokens)
        assert s.get_num_new_matched_tokens(req, 0) == (0, False)
        s.update_state_after_alloc(req, Blocks(a_blocks), 0)
        parallel_step(s, ranks, s.build_connector_meta(
            sched_output(new=[(req, 0)], tokens={"mla-a": PROMPT})))
        st = [w.kvdepot_stats() for w, _ in ranks]
        assert sum(x["blocks_saved"] for x in st) == 6, st
        assert sum(x["saves_skipped"] for x in st) == 18, st
        saved = [t[b].clone() for t in ranks[0][1].values()
                 for b in a_blocks[:6]]
        shutdown_all(s, ranks)

        for tp, b_blocks in ((1, [11, 13, 15, 17, 19, 21, 23]),
                             (2, [2, 4, 6, 8, 10, 14, 16])):
            s, ranks = mla_engine(tmp_path, tp, False)
            req = Request(f"mla-tp{tp}", tokens)
            assert s.get_num_new_matched_tokens(req, 0) == (96, False)
            s.update_state_after_alloc(req, Blocks(b_blocks), 96)
            done, invalid = parallel_step(s, ranks, s.build_connector_meta(
                sched_output(new=[(req, 96)],
                             tokens={f"mla-tp{tp}": PROMPT - 96})))
            assert invalid == set()
            for w, kvs in ranks:
                assert w.kvdepot_stats()["blocks_loaded"] == 6
                got = [t[b] for t in kvs.values() for b in b_blocks[:6]]
                assert all(torch.equal(x, y) for x, y in zip(saved, got))
            shutdown_all(s, ranks)
    finally:
        stop_daemon(proc)


def heads_engine(tmp_path, tp, total, whole, **extra):
    """An engine at TP size `tp` of a model with `total` KV heads (the
    flash layout): rank r's tensors are its heads of `whole` (per layer,
    [2, NB, BS, total, DIM]) as vLLM splits them, a replicated head when
    there are fewer heads than ranks. Returns (scheduler, ranks, heads of
    each rank)."""
    def cfg(rank):
        c = tp_config(tmp_path, rank, tp, **extra)
        c.model_config = ModelConfig(total_heads=total)
        return c
    s = kv.KvdepotConnector(cfg(0), kv.KVConnectorRole.SCHEDULER)
    ranks, spans = [], []
    n = max(1, total // tp)
    for rank in range(tp):
        h0 = rank * n if total >= tp else rank * total // tp
        kvs = {name: t[:, :, :, h0:h0 + n].clone()
               for name, t in whole.items()}
        w = kv.KvdepotConnector(cfg(rank), kv.KVConnectorRole.WORKER)
        w.register_kv_caches(kvs)
        ranks.append((w, kvs))
        spans.append((h0, n))
    return s, ranks, spans


@pytest.mark.skipif(not KVDEPOTD, reason="KVDEPOTD not set")
@pytest.mark.parametrize("tp_p,tp_d,total", [(4, 2, 4), (2, 4, 4),
                                             (2, 1, 4), (4, 1, 2)])
def test_hand_off_between_tp_sizes(tmp_path, tp_p, tp_d, total):
    """Prefill at one TP size, decode at another (TP 4 -> 2, 2 -> 4, 2 ->
    1, and 4 -> 1 with 2 KV heads, each replicated on two prefill ranks):
    the prefill ranks write their heads into one object per block, the
    decode engine's request carries the prefill side's kv_transfer_params
    and each decode rank loads its heads, the bytes of the prefill
    engine's KV."""
    proc = start_daemon(tmp_path)[0]
    tokens = [(i * 53 + 7) % 32000 for i in range(PROMPT)]
    p_blocks, d_blocks = [2, 4, 6, 8, 10, 12, 14], [1, 3, 5, 7, 9, 11, 13]
    g = torch.Generator().manual_seed(tp_p * 10 + tp_d)
    whole = {f"model.layers.{i}.self_attn":
             torch.randn((2, NB, BS, total, DIM), generator=g).to(
                 torch.float16) for i in range(LAYERS)}
    try:
        s, ranks, _ = heads_engine(tmp_path, tp_p, total, whole)
        assert len({bytes(w.group_ns[0].bytes) for w, _ in ranks}) == 1
        req = Request("pre", tokens)
        req.kv_transfer_params = {"do_remote_decode": True}
        assert s.get_num_new_matched_tokens(req, 0) == (0, False)
        s.update_state_after_alloc(req, Blocks(p_blocks), 0)
        parallel_step(s, ranks, s.build_connector_meta(
            sched_output(new=[(req, 0)], tokens={"pre": PROMPT})))
        delay, params = s.request_finished(req, p_blocks)
        if delay:
            parallel_step(s, ranks, s.build_connector_meta(sched_output()),
                          finished={"pre"})
        assert len(params["kvdepot_hashes"]) == 6
        st = [w.kvdepot_stats() for w, _ in ranks]
        # One writer per head: replicas are told it is being written.
        writers = min(tp_p, total)
        assert sum(x["blocks_saved"] for x in st) == 6 * writers, st
        assert sum(x["saves_skipped"] for x in st) == 6 * (tp_p - writers)
        shutdown_all(s, ranks)

        empty = {k: torch.full_like(t, -1.0) for k, t in whole.items()}
        s, ranks, spans = heads_engine(tmp_path, tp_d, total, empty)
        req = Request("dec", tokens)
        req.kv_transfer_params = dict(params)
        assert s.get_num_new_matched_tokens(req, 0) == (96, False)
        s.update_state_after_alloc(req, Blocks(d_blocks), 96)
        _, invalid = parallel_step(s, ranks, s.build_connector_meta(
            sched_output(new=[(req, 96)], tokens={"dec": PROMPT - 96})))
        assert invalid == set()
        for (w, kvs), (h0, n) in zip(ranks, spans):
            assert w.kvdepot_stats()["blocks_loaded"] == 6
            for name, t in kvs.items():
                for p, d in zip(p_blocks[:6], d_blocks[:6]):
                    assert torch.equal(t[:, d],
                                       whole[name][:, p, :, h0:h0 + n])
        shutdown_all(s, ranks)
    finally:
        stop_daemon(proc)


@pytest.mark.skipif(not KVDEPOTD, reason="KVDEPOTD not set")
def test_tensor_parallel_lost_shard(tmp_path):
    """TP=2 over kvdepotd with a namespace per rank (shared_objects off),
    and rank 1's shard of block 3 is gone (evicted,
    or its disk was full when it saved): the scheduler matches only the
    blocks both ranks hold, so no rank reports a load error (vLLM's default
    kv_load_failure_policy would fail the request), and each rank loads
    exactly the bytes it saved for those blocks."""
    proc = start_daemon(tmp_path)[0]
    tokens = [(i * 37 + 5) % 32000 for i in range(PROMPT)]
    a_blocks, b_blocks = [2, 8, 4, 14, 6, 16, 10], [1, 3, 5, 7, 9, 11, 13]
    try:
        s, ranks = tp_engine(tmp_path, True, 700, shared=False)
        req = Request("lost-a", tokens)
        req.kv_transfer_params = {"do_remote_decode": True}  # keys, below
        assert s.get_num_new_matched_tokens(req, 0) == (0, False)
        s.update_state_after_alloc(req, Blocks(a_blocks), 0)
        parallel_step(s, ranks, s.build_connector_meta(
            sched_output(new=[(req, 0)], tokens={"lost-a": PROMPT})))
        delay, params = s.request_finished(req, a_blocks)
        if delay:
            parallel_step(s, ranks, s.build_connector_meta(sched_output()),
                          finished={"lost-a"})
        keys = params["kvdepot_hashes"]
        assert len(keys) == 6
        for w, _ in ranks:
            assert w.kvdepot_stats()["blocks_saved"] == 6
        saved = [[t[:, b].clone() for t in kvs.values() for b in a_blocks[:3]]
                 for _, kvs in ranks]
        rank1_ns = ranks[1][0].group_ns[0]
        assert s.shard_ns[0][0].bytes[:] == rank1_ns.bytes[:]
        # Rank 1's shard of block 3, through the daemon (a client call).
        assert s.store.delete(rank1_ns, [keys[3]]) == 1
        shutdown_all(s, ranks)

        s, ranks = tp_engine(tmp_path, False, 0, shared=False)
        req = Request("lost-b", tokens)
        # Blocks 0..2 only: block 3 has no shard on rank 1.
        assert s.get_num_new_matched_tokens(req, 0) == (48, False)
        s.update_state_after_alloc(req, Blocks(b_blocks), 48)
        _, invalid = parallel_step(s, ranks, s.build_connector_meta(
            sched_output(new=[(req, 48)], tokens={"lost-b": PROMPT - 48})))
        assert invalid == set()
        for r, (w, kvs) in enumerate(ranks):
            st = w.kvdepot_stats()
            assert st["blocks_loaded"] == 3 and st["load_errors"] == 0
            got = [t[:, b] for t in kvs.values() for b in b_blocks[:3]]
            assert all(torch.equal(x, y) for x, y in zip(saved[r], got))
        shutdown_all(s, ranks)
    finally:
        stop_daemon(proc)


@pytest.mark.skipif(not KVDEPOTD, reason="KVDEPOTD not set")
def test_dead_daemon_means_recompute(tmp_path):
    """The daemon dies under a running engine: lookups answer 0 tokens
    within store_timeout, saves are skipped, nothing raises; when a daemon
    is back the same connectors use it again."""
    proc = start_daemon(tmp_path)[0]
    cfg = vllm_config("", store_mode="daemon",
                      store_address=f"unix:{tmp_path}/d.sock",
                      store_timeout="500ms")
    tokens = [(i * 17 + 3) % 32000 for i in range(PROMPT)]
    blocks = [3, 9, 1, 12, 5, 20, 7]
    kvs = caches("flash", fill=True)
    s, w, names = connector_pair(cfg, kvs)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        req = Request("req-dead", tokens)
        t0 = time.monotonic()
        assert s.get_num_new_matched_tokens(req, 0) == (0, False)
        assert time.monotonic() - t0 < 5
        s.update_state_after_alloc(req, Blocks(blocks), 0)
        meta = s.build_connector_meta(
            sched_output(new=[(req, 0)], tokens={"req-dead": PROMPT}))
        out = worker_step(w, meta, kvs, names)
        s.update_connector_output(out)
        assert out.invalid_block_ids == set()
        assert s.request_finished(req, blocks) == (False, None)
        assert w.kvdepot_stats()["blocks_saved"] == 0

        # A daemon again: requests are saved, and then one is found.
        proc = start_daemon(tmp_path)[0]
        deadline = time.monotonic() + 10
        for k in range(1000):  # the channel reconnects after a back-off
            req = Request(f"req-back-{k}", tokens)
            if s.get_num_new_matched_tokens(req, 0)[0] == 96:
                break
            s.update_state_after_alloc(req, Blocks(blocks), 0)
            meta = s.build_connector_meta(sched_output(
                new=[(req, 0)], tokens={req.request_id: PROMPT}))
            s.update_connector_output(worker_step(w, meta, kvs, names))
            s.request_finished(req, blocks)
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert w.kvdepot_stats()["blocks_saved"] == 6
    finally:
        s.shutdown()
        w.shutdown()
        stop_daemon(proc)


def save_restart_load(kind, cfg, between=None):
    if True:
        tokens = [(i * 31 + 7) % 32000 for i in range(PROMPT)]
        a_blocks = [3, 9, 1, 12, 5, 20, 7]

        # Engine A: computes the prompt; every full block is saved.
        kv_a = caches(kind, fill=True)
        s, w, names = connector_pair(cfg, kv_a)
        req = Request("req-a", tokens)
        assert s.get_num_new_matched_tokens(req, 0) == (0, False)
        s.update_state_after_alloc(req, Blocks(a_blocks), 0)
        meta = s.build_connector_meta(
            sched_output(new=[(req, 0)], tokens={"req-a": PROMPT}))
        out = worker_step(w, meta, kv_a, names)
        s.update_connector_output(out)
        assert s.request_finished(req, a_blocks) == (False, None)
        assert w.kvdepot_stats()["blocks_saved"] == 6
        s.shutdown()
        w.shutdown()
        if between is not None:
            between()

        # Engine B, restarted: same prompt, the blocks come from NVMe.
        kv_b = caches(kind, fill=False)
        s, w, names = connector_pair(cfg, kv_b)
        req = Request("req-b", tokens)
        n, is_async = s.get_num_new_matched_tokens(req, 0)
        assert (n, is_async) == (96, True)
        b_blocks = [11, 13, 15, 17, 19, 21, 23]
        s.update_state_after_alloc(req, Blocks(b_blocks), 96)
        recving = None
        deadline = time.monotonic() + 20  # the load runs on other threads
        while time.monotonic() < deadline:
            time.sleep(0.001)
            meta = s.build_connector_meta(sched_output())
            out = worker_step(w, meta, kv_b, names)
            s.update_connector_output(out)
            recving = out.finished_recving
            if recving:
                break
        assert recving == {"req-b"}
        assert out.invalid_block_ids == set()
        for layer in range(LAYERS):
            for i in range(6):
                assert torch.equal(block_of(kind, kv_a, layer, a_blocks[i]),
                                   block_of(kind, kv_b, layer, b_blocks[i]))
            # The block of the last token was not loaded: B computes it.
            assert torch.all(block_of(kind, kv_b, layer, b_blocks[6]) == -1)
        # Then the request runs: its prompt's last token, then one decode
        # step that fills nothing new.
        meta = s.build_connector_meta(sched_output(
            new=[(req, 96)], tokens={"req-b": PROMPT - 96}))
        s.update_connector_output(worker_step(w, meta, kv_b, names))
        assert s.request_finished(req, b_blocks)[0] is False
        s.shutdown()
        w.shutdown()


def test_async_saves_hold_the_blocks(tmp_path):
    """async_saves: the step's saves are committed after it. vLLM frees a
    finished request's blocks only once the worker reports it sending; the
    connector reports it only when no save of it is in flight, and the
    objects are whole in the store by then."""
    cfg = vllm_config(str(tmp_path), async_saves=True)
    tokens = [(i * 17 + 3) % 32000 for i in range(PROMPT)]
    blocks = [3, 9, 1, 12, 5, 20, 7]
    kv_a = caches("flash", fill=True)
    s, w, names = connector_pair(cfg, kv_a)
    req = Request("req-a", tokens)
    assert s.get_num_new_matched_tokens(req, 0) == (0, False)
    s.update_state_after_alloc(req, Blocks(blocks), 0)
    meta = s.build_connector_meta(
        sched_output(new=[(req, 0)], tokens={"req-a": PROMPT}))
    out = worker_step(w, meta, kv_a, names)
    s.update_connector_output(out)
    delay, _ = s.request_finished(req, blocks)
    sending = out.finished_sending or set()
    finished = {"req-a"}
    deadline = time.monotonic() + 20  # the commit runs on another thread
    while delay and "req-a" not in sending and time.monotonic() < deadline:
        time.sleep(0.001)
        meta = s.build_connector_meta(sched_output(finished=finished))
        out = worker_step(w, meta, kv_a, names, finished=finished)
        s.update_connector_output(out)
        finished = ()
        sending = out.finished_sending or set()
        if "req-a" in sending:  # reported: everything is committed
            assert w.kvdepot_stats()["blocks_saved"] == 6
    assert not delay or "req-a" in sending
    st = w.kvdepot_stats()
    assert (st["blocks_saved"], st["saves_inflight"]) == (6, 0), repr(st)
    # A second request finds the six blocks.
    assert s.get_num_new_matched_tokens(Request("req-b", tokens), 0)[0] == 96
    s.shutdown()
    w.shutdown()


_SLEEP_WHILE_SAVING = """
import tempfile, test_vllm_connector as t
with tempfile.TemporaryDirectory() as d:
    kvs = t.caches("flash", fill=True)
    s, w, names = t.connector_pair(t.vllm_config(d, async_saves=True), kvs)
    tokens = list(range(1, t.PROMPT + 1))
    req = t.Request("r", tokens)
    s.get_num_new_matched_tokens(req, 0)
    s.update_state_after_alloc(req, t.Blocks([3, 9, 1, 12, 5, 20, 7]), 0)
    t.worker_step(w, s.build_connector_meta(t.sched_output(
        new=[(req, 0)], tokens={"r": t.PROMPT})), kvs, names)
    w.unregister_kv_caches()  # vLLM frees the cache memory after this
    st = w.kvdepot_stats()
    print(st["saves_inflight"], st["blocks_saved"])
    s.shutdown()
    w.shutdown()
"""


def test_sleep_waits_for_saves_in_flight():
    """Sleep mode releases the KV cache memory after unregister_kv_caches:
    with async_saves the saves still reading it end there first. The
    copies are slowed (failpoint worker.save, in a process of its own), so
    without the wait they would still be in flight."""
    env = dict(os.environ, KVDEPOT_FAILPOINTS="worker.save=delay:100")
    out = subprocess.run([sys.executable, "-c", _SLEEP_WHILE_SAVING],
                         cwd=os.path.dirname(os.path.abspath(__file__)),
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "6"], out.stdout


_ANSWER_AFTER_COMMIT = """
import sys, tempfile, test_vllm_connector as t
with tempfile.TemporaryDirectory() as d:
    kvs = t.caches("flash", fill=True)
    s, w, names = t.connector_pair(t.vllm_config(d, async_saves=True), kvs)
    for i, params in enumerate(({}, {"do_remote_decode": True}, None)):
        tokens = [(j * 7 + 11 * i) % 32000 for j in range(t.PROMPT)]
        req = t.Request(f"r{i}", tokens)
        req.kv_transfer_params = params
        if params is None:
            req.max_tokens = 1  # a router's prefill request
        s.get_num_new_matched_tokens(req, 0)
        s.update_state_after_alloc(req, t.Blocks(range(7 * i, 7 * i + 7)), 0)
        t.worker_step(w, s.build_connector_meta(t.sched_output(
            new=[(req, 0)], tokens={req.request_id: t.PROMPT})), kvs, names)
        # What the step's answer finds committed when it leaves.
        print(w.kvdepot_stats()["saves_inflight"] > 0, flush=True)
        w.workers[0].flush_saves()
        s.request_finished(req, [])
    s.shutdown()
    w.shutdown()
"""


_FENCE_BEFORE_WRITES = """
import tempfile, time, test_vllm_connector as t
with tempfile.TemporaryDirectory() as d:
    kvs = t.caches("flash", fill=True)
    orig = {n: x.clone() for n, x in kvs.items()}
    s, w, names = t.connector_pair(t.vllm_config(d, async_saves=True), kvs)
    tokens = [(i * 13 + 5) % 32000 for i in range(t.PROMPT)]
    a = [3, 9, 1, 12, 5, 20, 7]
    req = t.Request("a", tokens)
    s.get_num_new_matched_tokens(req, 0)
    s.update_state_after_alloc(req, t.Blocks(a), 0)
    s.update_connector_output(t.worker_step(w, s.build_connector_meta(
        t.sched_output(new=[(req, 0)], tokens={"a": t.PROMPT})), kvs, names))
    # The next step: vLLM's first connector call, then its model runner
    # zeroes the blocks it allocated (here: all of them) before the bind.
    w.handle_preemptions(s.build_connector_meta(t.sched_output()))
    for x in kvs.values():
        x.zero_()
    for x in w.workers:
        x.flush_saves()
    b = [11, 13, 15, 17, 19, 21, 23]
    req = t.Request("b", tokens)
    n, is_async = s.get_num_new_matched_tokens(req, 0)
    s.update_state_after_alloc(req, t.Blocks(b), n)
    deadline = time.monotonic() + 20
    done = not is_async
    while not done and time.monotonic() < deadline:
        out = t.worker_step(w, s.build_connector_meta(t.sched_output()),
                            kvs, names)
        s.update_connector_output(out)
        done = bool(out.finished_recving)
    s.update_connector_output(t.worker_step(w, s.build_connector_meta(
        t.sched_output(new=[(req, n)], tokens={"b": t.PROMPT - n})), kvs,
        names))
    same = all(torch_equal(t.block_of("flash", orig, l, a[i]),
                           t.block_of("flash", kvs, l, b[i]))
               for l in range(t.LAYERS) for i in range(6))
    print(n, same)
    s.shutdown()
    w.shutdown()
"""


def test_copies_end_before_vllm_writes_blocks():
    """async_saves: vLLM's model runner writes blocks (zeroing those it
    allocated, copying blocks) after handle_preemptions and before the
    plan's bind, and a block an earlier step's save still copies may be
    among them (vLLM frees a sliding window's blocks while the request
    runs). handle_preemptions ends those copies first: what was stored is
    what the step computed. The copies are slowed (failpoint worker.save,
    in a process of its own)."""
    env = dict(os.environ, KVDEPOT_FAILPOINTS="worker.save=delay:150")
    script = "from torch import equal as torch_equal\n" + _FENCE_BEFORE_WRITES
    out = subprocess.run([sys.executable, "-c", script],
                         cwd=os.path.dirname(os.path.abspath(__file__)),
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.split() == ["96", "True"], out.stdout


def test_answer_leaves_after_its_commits():
    """async_saves on a prefill engine: the step that answers a hand-off
    request (do_remote_decode) or a one-token request commits its saves
    before it ends, since the decode engine loads them next; another
    request's step ends with its saves in flight. The commits are slowed
    (failpoint worker.commit, in a process of its own)."""
    env = dict(os.environ, KVDEPOT_FAILPOINTS="worker.commit=delay:300")
    out = subprocess.run([sys.executable, "-c", _ANSWER_AFTER_COMMIT],
                         cwd=os.path.dirname(os.path.abspath(__file__)),
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False", "False"], out.stdout


# ---- vLLM's hybrid allocator: several KV-cache groups --------------------

class FullAttentionSpec:
    """Stand-ins named as vLLM's KVCacheSpec classes (the connector reads
    the class name and the attention fields)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


class SlidingWindowSpec(FullAttentionSpec):
    pass


class MambaSpec(FullAttentionSpec):
    pass


HYBRID_FULL = [f"model.layers.{i}.self_attn" for i in (1, 3)]
HYBRID_LOCAL = [f"model.layers.{i}.self_attn" for i in (0, 2)]


def hybrid_config(store_dir, local_spec=SlidingWindowSpec):
    cfg = vllm_config(store_dir)
    cfg.model_config.get_num_layers = lambda pc: 4
    spec = dict(block_size=BS, num_kv_heads=HEADS, head_size=DIM)
    kvc = NS(kv_cache_groups=[
        NS(layer_names=HYBRID_FULL, kv_cache_spec=FullAttentionSpec(**spec)),
        NS(layer_names=HYBRID_LOCAL,
           kv_cache_spec=local_spec(sliding_window=32, **spec))])
    return cfg, kvc


class GroupBlocks:
    def __init__(self, *groups):
        self.groups = tuple(list(g) for g in groups)

    def get_block_ids(self):
        return self.groups


def test_hybrid_groups_save_and_load_their_own_tables():
    """Two KV-cache groups (full attention, sliding window) sharing tensors
    and one block pool, as vLLM's hybrid allocator lays them out: each is
    saved from and loaded into its own block table, and the sliding-window
    group's null blocks (block 0: tokens out of the window) are left alone."""
    with tempfile.TemporaryDirectory() as d:
        cfg, kvc = hybrid_config(d)
        g = torch.Generator().manual_seed(77)

        def tensors(fill):
            ts = [torch.randn((2, NB, BS, HEADS, DIM), generator=g)
                  .to(torch.float16) if fill else
                  torch.full((2, NB, BS, HEADS, DIM), -1.0,
                             dtype=torch.float16) for _ in range(2)]
            return {f"model.layers.{i}.self_attn": ts[i // 2]
                    for i in range(4)}

        def pair(kvs):
            s = kv.KvdepotConnector(cfg, kv.KVConnectorRole.SCHEDULER, kvc)
            w = kv.KvdepotConnector(cfg, kv.KVConnectorRole.WORKER, kvc)
            w.register_kv_caches(kvs)
            return s, w, list(kvs)

        tokens = [(i * 13 + 5) % 32000 for i in range(PROMPT)]
        full_a, local_a = [3, 9, 1, 12, 5, 20, 7], [2, 4, 6, 8, 10, 11, 13]
        kv_a = tensors(True)
        s, w, names = pair(kv_a)
        assert len(s.leaders) == 2 and len(w.workers) == 2
        req = Request("req-a", tokens)
        assert s.get_num_new_matched_tokens(req, 0) == (0, False)
        s.update_state_after_alloc(req, GroupBlocks(full_a, local_a), 0)
        meta = s.build_connector_meta(
            sched_output(new=[(req, 0)], tokens={"req-a": PROMPT}))
        s.update_connector_output(worker_step(w, meta, kv_a, names))
        assert s.request_finished_all_groups(req, (full_a, local_a)) == \
            (False, None)
        assert w.kvdepot_stats()["blocks_saved"] == 12
        s.shutdown()
        w.shutdown()

        kv_b = tensors(False)
        s, w, names = pair(kv_b)
        req = Request("req-b", tokens)
        assert s.get_num_new_matched_tokens(req, 0) == (96, True)
        full_b, local_b = [14, 15, 16, 17, 18, 19, 21], [0, 0, 0, 0, 22, 23, 1]
        s.update_state_after_alloc(req, GroupBlocks(full_b, local_b), 96)
        recving, deadline = None, time.monotonic() + 20
        while not recving and time.monotonic() < deadline:
            time.sleep(0.001)
            meta = s.build_connector_meta(sched_output())
            out = worker_step(w, meta, kv_b, names)
            s.update_connector_output(out)
            recving = out.finished_recving
        assert recving == {"req-b"}  # once, when both groups are done
        assert out.invalid_block_ids == set()
        for n in HYBRID_FULL:
            for i in range(6):
                assert torch.equal(kv_a[n][:, full_a[i]], kv_b[n][:, full_b[i]])
        for n in HYBRID_LOCAL:
            for i in (4, 5):
                assert torch.equal(kv_a[n][:, local_a[i]],
                                   kv_b[n][:, local_b[i]])
        for n in names:  # the null block was not written
            assert torch.all(kv_b[n][:, 0] == -1)
        assert w.kvdepot_stats()["blocks_loaded"] == 6 + 2
        s.request_finished_all_groups(req, (full_b, local_b))
        s.shutdown()
        w.shutdown()

        # A group of Mamba state is not K/V: refused, not half-restored.
        cfg, kvc = hybrid_config(d, local_spec=MambaSpec)
        with pytest.raises(ValueError, match="only attention K/V"):
            kv.KvdepotConnector(cfg, kv.KVConnectorRole.SCHEDULER, kvc)


def test_decode_saves_and_delayed_free():
    with tempfile.TemporaryDirectory() as d:
        cfg = vllm_config(d)
        kvs = caches("flash", fill=True)
        s, w, names = connector_pair(cfg, kvs)
        tokens = list(range(40, 40 + 30))  # 1 full block + 14
        req = Request("r", tokens)
        assert s.get_num_new_matched_tokens(req, 0) == (0, False)
        s.update_state_after_alloc(req, Blocks([4, 6]), 0)
        meta = s.build_connector_meta(sched_output(new=[(req, 0)],
                                                   tokens={"r": 30}))
        out = worker_step(w, meta, kvs, names)
        # Decode two tokens: the second block fills at 32 tokens.
        for pos in (30, 31):
            req.all_token_ids.append(1000 + pos)
            meta = s.build_connector_meta(sched_output(
                cached=[("r", None, pos)], tokens={"r": 1}))
            s.update_connector_output(out)
            out = worker_step(w, meta, kvs, names)
        # The request finishes before the last step's report arrives: vLLM
        # keeps its blocks until the workers say so.
        delay, params = s.request_finished(req, [4, 6])
        assert params is None
        s.update_connector_output(out)
        meta = s.build_connector_meta(sched_output())
        out = worker_step(w, meta, kvs, names, finished={"r"})
        if delay:
            assert out.finished_sending == {"r"}
        else:
            assert out.finished_sending is None
        s.update_connector_output(out)
        assert w.kvdepot_stats()["blocks_saved"] == 2
        s.shutdown()
        w.shutdown()


def decode_started(d):
    """Request "r" of 30 tokens in blocks 4, 6, 8, 10, prefilled: (s, w,
    names, kvs, req, the prefill step's output)."""
    kvs = caches("flash", fill=True)
    s, w, names = connector_pair(vllm_config(d), kvs)
    req = Request("r", list(range(40, 70)))
    assert s.get_num_new_matched_tokens(req, 0) == (0, False)
    s.update_state_after_alloc(req, Blocks([4, 6, 8, 10]), 0)
    out = worker_step(w, s.build_connector_meta(sched_output(
        new=[(req, 0)], tokens={"r": 30})), kvs, names)
    return s, w, names, kvs, req, out


def decode_finished(s, w, out, req, kvs, names):
    """Ends request "r" after its last step (`out`); a prompt of its first
    48 tokens must find the three blocks they fill."""
    s.update_connector_output(out)
    s.request_finished(req, [4, 6, 8, 10])
    s.update_connector_output(worker_step(
        w, s.build_connector_meta(sched_output()), kvs, names,
        finished={"r"}))
    again = Request("again", req.all_token_ids[:48] + [7])
    assert s.get_num_new_matched_tokens(again, 0)[0] == 48
    s.shutdown()
    w.shutdown()


def test_speculative_decoding_saves_accepted_tokens():
    """n-gram speculative decoding: each decode step schedules the last
    token and three drafts, and vLLM keeps only the accepted ones (its
    all_token_ids), rewinding num_computed_tokens past the rejected. The
    blocks saved are keyed by the accepted tokens: a prompt of those tokens
    finds every full block, and one block's key never covers another
    sequence's tokens."""
    with tempfile.TemporaryDirectory() as d:
        s, w, names, kvs, req, out = decode_started(d)
        req.all_token_ids.append(500)  # sampled by the prefill step
        accepted = iter([0, 2, 0, 1, 3, 0, 3, 3, 3, 0])
        while True:  # until a step starts with 48 tokens known
            n = len(req.all_token_ids)
            meta = s.build_connector_meta(sched_output(
                cached=[("r", None, n - 1)], tokens={"r": 4}))
            s.update_connector_output(out)
            out = worker_step(w, meta, kvs, names)
            if n >= 48:
                break
            req.all_token_ids += [600 + n + i
                                  for i in range(next(accepted) + 1)]
        decode_finished(s, w, out, req, kvs, names)


def test_async_scheduling_tokens_arrive_late():
    """vLLM's asynchronous scheduling plans step k+1 before step k's token
    is known: num_computed_tokens counts it, all_token_ids does not yet.
    The leader is given each token once it is known, so the blocks saved
    carry the keys of the tokens they hold."""
    with tempfile.TemporaryDirectory() as d:
        s, w, names, kvs, req, out = decode_started(d)
        for pos in range(30, 52):  # step k+1 planned, then k's token
            meta = s.build_connector_meta(sched_output(
                cached=[("r", None, pos)], tokens={"r": 1}))
            req.all_token_ids.append(700 + pos)
            s.update_connector_output(out)
            out = worker_step(w, meta, kvs, names)
        decode_finished(s, w, out, req, kvs, names)


def test_load_errors_surface():
    with tempfile.TemporaryDirectory() as d:
        cfg = vllm_config(d)
        tokens = [(i * 7) % 500 for i in range(PROMPT)]
        kvs = caches("flash", fill=True)
        s, w, names = connector_pair(cfg, kvs)
        req = Request("a", tokens)
        s.get_num_new_matched_tokens(req, 0)
        s.update_state_after_alloc(req, Blocks(range(7)), 0)
        meta = s.build_connector_meta(sched_output(new=[(req, 0)],
                                                   tokens={"a": PROMPT}))
        s.update_connector_output(worker_step(w, meta, kvs, names))
        s.request_finished(req, list(range(7)))
        s.shutdown()
        w.shutdown()
        # Corrupt the stored objects on disk: their checksums fail.
        with open(Path(d) / "kvd-data-000.dat", "r+b") as f:
            f.write(b"\x5a" * (1 << 16))
        s, w, names = connector_pair(cfg, caches("flash", fill=False))
        req = Request("b", tokens)
        n, is_async = s.get_num_new_matched_tokens(req, 0)
        assert n == 96 and is_async
        s.update_state_after_alloc(req, Blocks(range(10, 17)), 96)
        invalid, recving = set(), None
        deadline = time.monotonic() + 20  # the load runs on other threads
        while time.monotonic() < deadline:
            time.sleep(0.001)
            meta = s.build_connector_meta(sched_output())
            out = worker_step(w, meta, None, names)
            invalid |= out.invalid_block_ids
            s.update_connector_output(out)
            if out.finished_recving:
                recving = out.finished_recving
                break
        assert recving == {"b"}
        assert invalid and invalid <= set(range(10, 16))
        s.request_finished(req, list(range(10, 17)))
        s.shutdown()
        w.shutdown()


@contextlib.contextmanager
def kv_connector_output(w, meta):
    """vLLM 0.19's KVConnectorModelRunnerMixin._get_kv_connector_output
    around the forward pass: wait_for_save runs in its `finally`, also when
    the forward pass raised."""
    w.bind_connector_metadata(pickle.loads(pickle.dumps(meta)))
    w.start_load_kv(None)
    out = NS()
    try:
        yield out
    finally:
        w.wait_for_save()
        out.finished_sending, out.finished_recving = w.get_finished(set())
        out.invalid_block_ids = w.get_block_ids_with_load_errors()
        out.kv_connector_worker_meta = w.build_connector_worker_meta()
        w.clear_connector_metadata()


class ForwardFailed(RuntimeError):
    pass


@pytest.mark.parametrize("layers_done,raises", [(1, True), (LAYERS, True),
                                                (1, False)])
def test_failed_forward_commits_nothing(layers_done, raises):
    """A forward pass that stops after `layers_done` layers, raising or
    not: none of the step's blocks is stored (a later prompt misses). With
    a layer missing the C worker sees it (layerwise_saves); with every
    layer saved and an exception in flight, the connector does. The same
    step run whole inside an unrelated `except` (an exception handled
    around the step, not raised by it) saves."""
    with tempfile.TemporaryDirectory() as d:
        kvs = caches("flash", fill=True)
        s, w, names = connector_pair(vllm_config(d), kvs)
        tokens = [(i * 11 + 2) % 32000 for i in range(PROMPT)]
        req = Request("boom", tokens)
        assert s.get_num_new_matched_tokens(req, 0) == (0, False)
        s.update_state_after_alloc(req, Blocks(range(7)), 0)
        meta = s.build_connector_meta(sched_output(new=[(req, 0)],
                                                   tokens={"boom": PROMPT}))
        with pytest.raises(ForwardFailed) if raises else \
                contextlib.nullcontext():
            with kv_connector_output(w, meta) as out:
                for name in names[:layers_done]:
                    w.wait_for_layer_load(name)
                    w.save_kv_layer(name, None, None)
                if raises:
                    raise ForwardFailed("CUDA out of memory")
        s.update_connector_output(out)
        stats = w.kvdepot_stats()
        assert stats["blocks_saved"] == 0
        assert stats["saves_aborted"] == 6
        s.request_finished(req, list(range(7)))
        again = Request("again", tokens)
        assert s.get_num_new_matched_tokens(again, 0) == (0, False)

        try:
            raise KeyError("handled around the step")
        except KeyError:
            s.update_state_after_alloc(again, Blocks(range(7, 14)), 0)
            meta = s.build_connector_meta(sched_output(
                new=[(again, 0)], tokens={"again": PROMPT}))
            with kv_connector_output(w, meta) as out:
                for name in names:
                    w.wait_for_layer_load(name)
                    w.save_kv_layer(name, None, None)
        s.update_connector_output(out)
        assert w.kvdepot_stats()["blocks_saved"] == 6
        s.request_finished(again, list(range(7, 14)))
        third = Request("third", tokens)
        assert s.get_num_new_matched_tokens(third, 0) == (96, False)
        s.shutdown()
        w.shutdown()


def test_metadata_pickles_and_aggregates():
    m = kv.KvdepotConnectorMetadata([b"\x08\x01"], ["x"], ["y"])
    back = pickle.loads(pickle.dumps(m))
    assert back.plans == (b"\x08\x01",) and back.delayed == ("x",)
    assert back.async_loads == ("y",)
    a = kv.KvdepotWorkerMetadata([(0, b"1")])
    b = kv.KvdepotWorkerMetadata([(1, b"2")])
    assert pickle.loads(pickle.dumps(a.aggregate(b))).reports == \
        [(0, b"1"), (1, b"2")]


def test_cuda_settings_reach_the_worker(monkeypatch):
    """cuda_staging_blocks, cuda_staging_buffers and cuda_copy_mode are the
    worker's (kvd_worker_config_t), in the C enum's order."""
    made = []
    real = _lib.Worker

    def spy(*a, **kw):
        made.append(kw)
        return real(*a, **kw)
    monkeypatch.setattr(_lib, "Worker", spy)
    with tempfile.TemporaryDirectory() as d:
        w = kv.KvdepotConnector(
            vllm_config(d, cuda_staging_blocks=256, cuda_staging_buffers=3,
                        cuda_copy_mode="per_object"),
            kv.KVConnectorRole.WORKER)
        w.register_kv_caches(caches("flash", False))
        w.shutdown()
    assert made and all(
        (m["cuda_staging_blocks"], m["cuda_staging_buffers"],
         m["cuda_copy_mode"]) == (256, 3, 2) for m in made)


def test_bad_settings_are_refused():
    with tempfile.TemporaryDirectory() as d:
        with pytest.raises(ValueError, match="unknown.*'codek'"):
            kv.KvdepotConnector(vllm_config(d, codek="fp8_e4m3"),
                                kv.KVConnectorRole.SCHEDULER)
        with pytest.raises(ValueError, match="layerwise must be true"):
            kv.KvdepotConnector(vllm_config(d, layerwise="yes"),
                                kv.KVConnectorRole.SCHEDULER)
        with pytest.raises(ValueError, match="'embedded', 'daemon' or"):
            kv.KvdepotConnector(vllm_config(d, store_mode="demon"),
                                kv.KVConnectorRole.SCHEDULER)
        # Daemon mode with no daemon: a clear error at start, not a hang.
        with pytest.raises(_lib.KvdepotError, match="UNREACHABLE"):
            kv.KvdepotConnector(
                vllm_config(d, store_mode="daemon",
                            store_address=f"unix:{d}/none.sock"),
                kv.KVConnectorRole.SCHEDULER)
        with pytest.raises(_lib.KvdepotError, match="codec"):
            kv.KvdepotConnector(vllm_config(d, codec="fp7"),
                                kv.KVConnectorRole.SCHEDULER)
        for k, v, msg in (("cuda_copy_mode", "fast", "one of"),
                          ("cuda_staging_blocks", 65537, "to 65536"),
                          ("cuda_staging_buffers", 5, "to 4"),
                          ("cuda_staging_buffers", -1, "to 4")):
            with pytest.raises(ValueError, match=f"{k} .*{msg}"):
                kv.KvdepotConnector(vllm_config(d, **{k: v}),
                                    kv.KVConnectorRole.SCHEDULER)
        # An embedded store with several engine processes: the error names
        # the fix ("auto", the default, or "daemon").
        cfg = vllm_config(d, store_mode="embedded")
        cfg.parallel_config.tensor_parallel_size = 2
        with pytest.raises(ValueError, match="store_mode \"auto\""):
            kv.KvdepotConnector(cfg, kv.KVConnectorRole.WORKER)
        # KV on a device neither worker backend can address (torch's
        # "meta" device): refused before any copy.
        w = kv.KvdepotConnector(vllm_config(d), kv.KVConnectorRole.WORKER)
        meta = {f"model.layers.{i}.self_attn":
                torch.empty((2, NB, BS, HEADS, DIM), dtype=torch.float16,
                            device="meta") for i in range(LAYERS)}
        with pytest.raises(ValueError, match="cannot address a meta"):
            w.register_kv_caches(meta)
        w.shutdown()
        # CUDA caches go to the worker's CUDA backend, which on this
        # machine (no GPU) or in a build without CUDA says so.
        w = kv.KvdepotConnector(vllm_config(d), kv.KVConnectorRole.WORKER)
        cuda = {f"model.layers.{i}.self_attn":
                CudaLike(torch.zeros((2, NB, BS, HEADS, DIM),
                                     dtype=torch.float16))
                for i in range(LAYERS)}
        with pytest.raises(_lib.KvdepotError,
                           match="no CUDA device|no CUDA support"):
            w.register_kv_caches(cuda)
        assert w.workers == []
        w.shutdown()
        cfg = vllm_config(d)
        cfg.parallel_config.pipeline_parallel_size = 2
        with pytest.raises(ValueError, match="pipeline parallelism"):
            kv.KvdepotConnector(cfg, kv.KVConnectorRole.WORKER)


# vLLM 0.19 KVConnectorBase_V1 (in
# vllm/distributed/kv_transfer/kv_connector/v1/base.py): method -> the
# parameter names after self.
VLLM_019 = {
    "start_load_kv": ["forward_context", "kwargs"],
    "wait_for_layer_load": ["layer_name"],
    "save_kv_layer": ["layer_name", "kv_layer", "attn_metadata", "kwargs"],
    "wait_for_save": [],
    "get_num_new_matched_tokens": ["request", "num_computed_tokens"],
    "update_state_after_alloc": ["request", "blocks", "num_external_tokens"],
    "build_connector_meta": ["scheduler_output"],
    "register_kv_caches": ["kv_caches"],
    "register_cross_layers_kv_cache": ["kv_cache", "attn_backend"],
    "set_host_xfer_buffer_ops": ["copy_operation"],
    "handle_preemptions": ["kv_connector_metadata"],
    "get_finished": ["finished_req_ids"],
    "get_block_ids_with_load_errors": [],
    "get_handshake_metadata": [],
    "build_connector_worker_meta": [],
    "get_kv_connector_stats": [],
    "get_kv_connector_kv_cache_events": [],
    "shutdown": [],
    "update_connector_output": ["connector_output"],
    "request_finished": ["request", "block_ids"],
    "request_finished_all_groups": ["request", "block_ids"],
    "take_events": [],
    "bind_gpu_block_pool": ["block_pool"],
    "set_xfer_handshake_metadata": ["metadata"],
    "reset_cache": [],
    "get_finished_count": [],
    "bind_connector_metadata": ["connector_metadata"],
    "clear_connector_metadata": [],
}
VLLM_019_CLASS = {"requires_piecewise_for_cudagraph": ["extra_config"],
                  "get_required_kvcache_layout": ["vllm_config"]}


def test_every_vllm_method_is_there():
    cls = kv.KvdepotConnector
    init = list(inspect.signature(cls.__init__).parameters)[1:]
    assert init == ["vllm_config", "role", "kv_cache_config"]
    for name, params in {**VLLM_019, **VLLM_019_CLASS}.items():
        fn = getattr(cls, name, None)
        assert fn is not None, name
        sig = inspect.signature(fn)
        got = [p for p in sig.parameters if p != "self"]
        if name in VLLM_019_CLASS:
            assert isinstance(inspect.getattr_static(cls, name),
                              classmethod), name
        assert got == params, (name, got, params)


def prefill_then_decode(cfg_p, cfg_d, kind="flash", ns_override=None,
                        seed=5):
    """A prefill engine (connectors on cfg_p) computes a prompt the proxy
    marked do_remote_decode; its request_finished returns the hand-off; a
    decode engine (cfg_d) gets it as the request's kv_transfer_params and
    loads the blocks. Returns (params, the two engines' caches, blocks)."""
    tokens = [(i * 13 + seed) % 32000 for i in range(PROMPT)]
    p_blocks = [2, 4, 6, 8, 10, 12, 14]
    kv_p = caches(kind, fill=True)
    s, w, names = connector_pair(cfg_p, kv_p)
    req = Request("pre", tokens)
    req.kv_transfer_params = {"do_remote_decode": True}
    assert s.get_num_new_matched_tokens(req, 0) == (0, False)
    s.update_state_after_alloc(req, Blocks(p_blocks), 0)
    meta = s.build_connector_meta(sched_output(new=[(req, 0)],
                                               tokens={"pre": PROMPT}))
    out = worker_step(w, meta, kv_p, names)
    delay, params = s.request_finished(req, p_blocks)
    s.update_connector_output(out)
    if delay:  # the saves' report comes with the next step
        meta = s.build_connector_meta(sched_output())
        s.update_connector_output(worker_step(w, meta, kv_p, names,
                                              finished={"pre"}))
    s.shutdown()
    w.shutdown()
    assert params["do_remote_prefill"] is True
    assert params["do_remote_decode"] is False
    assert len(params["kvdepot_hashes"]) == 6
    assert params["kvdepot_num_tokens"] == 96

    kv_d = caches(kind, fill=False)
    s, w, names = connector_pair(cfg_d, kv_d)
    req = Request("dec", tokens)
    req.kv_transfer_params = dict(params)
    if ns_override is not None:
        req.kv_transfer_params["kvdepot_ns"] = ns_override
    n, is_async = s.get_num_new_matched_tokens(req, 0)
    assert n == 96
    d_blocks = [1, 3, 5, 7, 9, 11, 13]
    s.update_state_after_alloc(req, Blocks(d_blocks), 96)
    if is_async:  # from NVMe or another node: loaded before it runs
        recving, deadline = None, time.monotonic() + 20
        while not recving and time.monotonic() < deadline:
            time.sleep(0.001)
            meta = s.build_connector_meta(sched_output())
            out = worker_step(w, meta, kv_d, names)
            s.update_connector_output(out)
            recving = out.finished_recving
        assert recving == {"dec"}
    else:  # in this node's arena: loaded by the step that runs it
        meta = s.build_connector_meta(sched_output(
            new=[(req, 96)], tokens={"dec": PROMPT - 96}))
        out = worker_step(w, meta, kv_d, names)
        s.update_connector_output(out)
    assert out.invalid_block_ids == set()
    for layer in range(LAYERS):
        for i in range(6):
            assert torch.equal(block_of(kind, kv_p, layer, p_blocks[i]),
                               block_of(kind, kv_d, layer, d_blocks[i]))
    s.request_finished(req, d_blocks)
    s.shutdown()
    w.shutdown()
    return params


def test_prefill_decode_transfer_params():
    """Engine-free part of the hand-off, on one embedded store: the prefill
    side names its node (node_id), the namespace and the block hashes; the
    decode side accepts them (and, with a foreign namespace, only warns)."""
    with tempfile.TemporaryDirectory() as d:
        cfg = vllm_config(d, node_id="prefill-a")
        params = prefill_then_decode(cfg, cfg)
        assert params["kvdepot_node"] == "prefill-a"
        assert len(params["kvdepot_ns"]) == 32
        prefill_then_decode(cfg, cfg, ns_override="00" * 16, seed=6)


def mm_feature(identifier, offset, length):
    """A stand-in for vLLM 0.19's MultiModalFeatureSpec (the fields the
    block hashes read: identifier, mm_position.offset / .length)."""
    return NS(data=None, modality="image", identifier=identifier,
              mm_position=NS(offset=offset, length=length), mm_hash=None)


def vllm_block_hashes(tokens, features, salt=None):
    """vLLM 0.19's request_block_hasher on a new request (sha256_cbor,
    PYTHONHASHSEED=kvdepot: the connector's root), written out: each full
    block is sha256(cbor([parent, tokens, extra keys or None])) with one
    (identifier, offset - block start) per image overlapping the block and
    the salt on block 0 (kv_cache_utils.generate_block_hash_extra_keys)."""
    cbor2 = pytest.importorskip("cbor2")
    import hashlib

    def sha256_cbor(x):
        return hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()

    parent, out = sha256_cbor("kvdepot"), []
    for start in range(0, len(tokens) - BS + 1, BS):
        end = start + BS
        keys = [(f.identifier, f.mm_position.offset - start)
                for f in features if f.mm_position.offset < end and
                start < f.mm_position.offset + f.mm_position.length]
        if salt and start == 0:
            keys.append(salt)
        parent = sha256_cbor((parent, tuple(tokens[start:end]),
                              tuple(keys) or None))
        out.append(parent.hex())
    return out


def prefill_keys(s, w, kvs, names, req, blocks):
    """Runs one prompt (marked do_remote_decode, so request_finished hands
    off its blocks' keys) through the scheduler and a worker: (tokens
    matched, the keys of its full blocks)."""
    rid = req.request_id
    req.kv_transfer_params = {"do_remote_decode": True}
    n, is_async = s.get_num_new_matched_tokens(req, 0)
    assert not is_async  # the first prompt's blocks are in the arena
    s.update_state_after_alloc(req, Blocks(blocks), n)
    meta = s.build_connector_meta(sched_output(new=[(req, n)],
                                               tokens={rid: PROMPT - n}))
    out = worker_step(w, meta, kvs, names)
    delay, params = s.request_finished(req, blocks)
    s.update_connector_output(out)
    if delay:
        meta = s.build_connector_meta(sched_output())
        s.update_connector_output(worker_step(w, meta, kvs, names,
                                              finished={rid}))
    return n, params["kvdepot_hashes"]


def test_images_get_their_own_keys():
    """Two prompts with the same tokens (an image's placeholders look alike)
    and different images: the second is not served the first one's KV.
    Blocks before the first image are shared; from the image on each
    prompt has its own keys, and the keys are vLLM's block hashes."""
    tokens = [(i * 11 + 3) % 32000 for i in range(PROMPT)]
    icon = mm_feature("icon-7", 70, 5)
    with tempfile.TemporaryDirectory() as d:
        kvs = caches("flash", fill=True)
        s, w, names = connector_pair(vllm_config(d), kvs)
        a = Request("img-a", tokens)
        a.mm_features = [mm_feature("image-a", 20, 30), icon]
        b = Request("img-b", tokens)
        b.mm_features = [mm_feature("image-b", 20, 30), icon]
        text = Request("text", tokens)

        n, keys_a = prefill_keys(s, w, kvs, names, a, [2, 4, 6, 8, 10, 12,
                                                       14])
        assert n == 0
        assert keys_a == vllm_block_hashes(tokens, a.mm_features)
        n, keys_b = prefill_keys(s, w, kvs, names, b, [1, 3, 5, 7, 9, 11,
                                                       13])
        assert n == BS  # block 0 only: the image starts in block 1
        assert keys_b == vllm_block_hashes(tokens, b.mm_features)
        assert keys_b[0] == keys_a[0]
        assert not set(keys_b[1:]) & set(keys_a)
        # Without images: the text-only chain, again sharing block 0 only.
        n, keys_t = prefill_keys(s, w, kvs, names, text, [15, 16, 17, 18,
                                                          19, 20, 21])
        assert n == BS
        assert keys_t == vllm_block_hashes(tokens, [])
        assert not set(keys_t[1:]) & (set(keys_a) | set(keys_b))
        # A feature without identifier cannot be keyed: computed, neither
        # served nor saved under another image's keys.
        anon = Request("anon", tokens)
        anon.mm_features = [mm_feature(None, 20, 30)]
        assert s.get_num_new_matched_tokens(anon, 0) == (0, False)
        s.update_state_after_alloc(anon, Blocks(range(7)), 0)
        meta = s.build_connector_meta(sched_output(new=[(anon, 0)],
                                                   tokens={"anon": PROMPT}))
        out = worker_step(w, meta, kvs, names)
        assert s.request_finished(anon, list(range(7))) == (False, None)
        s.update_connector_output(out)
        assert w.kvdepot_stats()["blocks_saved"] == 3 * 6 - 2
        s.shutdown()
        w.shutdown()


def test_namespace_covers_what_changes_the_bytes():
    """Revision, weight quantization, hf_overrides/RoPE, the sliding window
    and the cache generation each give another namespace."""
    def ns_with(**attrs):
        cfg = vllm_config("")
        for k, v in attrs.items():
            setattr(cfg.model_config, k, v)
        s = kv.KvdepotConnector(cfg, kv.KVConnectorRole.SCHEDULER)
        try:
            return bytes(s.ns.bytes)
        finally:
            s.shutdown()

    seen = [ns_with(), ns_with(revision="abc123"),
            ns_with(quantization="awq"),
            ns_with(hf_overrides={"rope_theta": 1000000}),
            ns_with(hf_config=NS(rope_scaling={"type": "yarn",
                                               "factor": 4.0})),
            ns_with(hf_config=NS(sliding_window=4096))]
    assert len(set(seen)) == len(seen)
    assert ns_with() == seen[0]  # and stable


def test_lora_identity_beyond_its_name(tmp_path):
    """Two adapters behind one name, or one name whose weights changed on
    disk, are other keys."""
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "adapter_model.safetensors").write_bytes(b"w" * 16)
    key = kv._lora_key
    assert key(None) is None
    assert key(NS(lora_name="sql")) == "sql"
    ka = key(NS(lora_name="sql", lora_int_id=1, lora_path=str(a)))
    assert ka != key(NS(lora_name="sql", lora_int_id=1, lora_path=str(b)))
    assert ka == key(NS(lora_name="sql", lora_int_id=7, lora_path=str(a)))
    (a / "adapter_model.safetensors").write_bytes(b"w" * 17)
    assert ka != key(NS(lora_name="sql", lora_int_id=1, lora_path=str(a)))


def test_reset_cache_starts_a_new_generation():
    """After reset_cache nothing saved before is matched; the worker moves
    to the new generation with the next plan, and what it saves there is
    matched again."""
    cfg = vllm_config("")
    tokens = [(i * 11 + 7) % 32000 for i in range(PROMPT)]
    blocks = [3, 9, 1, 12, 5, 20, 7]
    kvs = caches("flash", fill=True)
    s, w, names = connector_pair(cfg, kvs)

    def compute(rid):
        req = Request(rid, tokens)
        assert s.get_num_new_matched_tokens(req, 0) == (0, False)
        s.update_state_after_alloc(req, Blocks(blocks), 0)
        meta = s.build_connector_meta(sched_output(new=[(req, 0)],
                                                   tokens={rid: PROMPT}))
        s.update_connector_output(worker_step(w, meta, kvs, names))
        s.request_finished(req, blocks)
        return meta

    def matched(rid):
        req = Request(rid, tokens)
        n = s.get_num_new_matched_tokens(req, 0)[0]
        s.request_finished(req, [])
        return n

    try:
        assert compute("a").generation == 0
        assert w.kvdepot_stats()["blocks_saved"] == 6
        assert matched("b") == 96
        assert s.reset_cache() is True
        assert matched("c") == 0
        assert compute("d").generation == 1
        assert w.generation == 1
        assert w.kvdepot_stats()["blocks_saved"] == 12
        assert matched("e") == 96
    finally:
        s.shutdown()
        w.shutdown()


def test_head_range_is_the_engines_split():
    """The heads of each rank in a shared object: an even split, one head
    replicated on TP / total ranks, and counts no engine splits refused."""
    from kvdepot._lib import head_range
    assert [head_range(8, 4, r) for r in range(4)] == \
        [(2, 0), (2, 2), (2, 4), (2, 6)]
    assert [head_range(2, 4, r) for r in range(4)] == \
        [(1, 0), (1, 0), (1, 1), (1, 1)]
    assert head_range(4, 1, 0) == (4, 0)
    for total, tp in ((6, 4), (3, 4)):
        with pytest.raises(ValueError, match="shared_objects: false"):
            head_range(total, tp, 0)
