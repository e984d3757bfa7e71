"""kvdepot.trtllm driven in TensorRT-LLM's call order (its
kv_cache_connector.py: KvCacheConnectorScheduler/Worker,
KvCacheConnectorManager) with a real torch block-major pool [blocks,
layers, 2, tokens*heads*dim] on the host backend.

A first leader/worker pair saves a context request's blocks; a new pair on
the same store directory (an engine restart) matches the same prompt,
loads it asynchronously and the pool's blocks must equal the first one's
bit for bit. Integer request ids, no "retry later", request_finished as a
bool, layer hooks with an index and a stream, and the method set of the
classic KvCacheConnectorScheduler / KvCacheConnectorWorker are checked.
"""

import inspect
import json
import os
import pickle
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

torch = pytest.importorskip("torch")

from conftest import require_lib  # noqa: E402
from kvdepot import _lib, trtllm as kt  # noqa: E402

require_lib()

BS, LAYERS, HEADS, DIM, NB = 32, 4, 2, 64, 16
PROMPT = 150  # 4 full blocks, the 5th holds the last token


class LlmRequest:
    def __init__(self, rid, tokens):
        self.request_id = rid
        self._tokens = list(tokens)

    def get_tokens(self, beam):
        return self._tokens


def llm_args(model_dir):
    return NS(model=str(model_dir), kv_cache_config=NS(tokens_per_block=BS))


@pytest.fixture
def env(monkeypatch):
    with tempfile.TemporaryDirectory() as d:
        model = Path(d) / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps({
            "num_hidden_layers": LAYERS, "num_attention_heads": 4,
            "num_key_value_heads": HEADS, "hidden_size": 4 * DIM,
            "torch_dtype": "float16"}))
        monkeypatch.setenv("KVDEPOT_CONFIG", json.dumps({
            "store_dir": str(Path(d) / "store"), "arena_size": "64m",
            "disk_size": "64m", "disk_write": "through"}))
        yield llm_args(model)


def pool(fill):
    t = torch.empty((NB, LAYERS, 2, BS * HEADS * DIM), dtype=torch.float16)
    if fill:
        g = torch.Generator().manual_seed(99)
        t.copy_(torch.randn(t.shape, generator=g).to(torch.float16))
    else:
        t.fill_(-1.0)
    return t


def rd(rid, blocks, tokens, pos, n):
    return NS(request_id=rid, new_block_ids=blocks, new_tokens=tokens,
              computed_position=pos, num_scheduled_tokens=n)


def iteration(sched, worker, out, finished=(), loading=()):
    """One executor iteration: plan, broadcast, forward with hooks."""
    meta = pickle.loads(pickle.dumps(sched.build_connector_meta(out)))
    worker.bind_connector_meta(meta)
    worker.start_load_kv(None)
    for layer in range(LAYERS):
        worker.wait_for_layer_load(layer, None)
        worker.save_kv_layer(layer, None)
    worker.wait_for_save(None)
    return worker.get_finished(list(finished), list(loading))


def test_save_restart_load(env):
    tokens = [(i * 13 + 5) % 32000 for i in range(PROMPT)]
    kv_a = pool(fill=True)
    s, w = kt.KvdepotScheduler(env), kt.KvdepotWorker(env)
    w.register_kv_caches(kv_a)
    req = LlmRequest(7, tokens)
    assert s.get_num_new_matched_tokens(req, 0) == (0, False)
    a_blocks = [5, 2, 9, 0, 11]
    s.update_state_after_alloc(req, a_blocks)
    out = NS(new_requests=[rd(7, a_blocks, tokens, 0, PROMPT)],
             cached_requests=[])
    iteration(s, w, out)
    assert w.kvdepot_stats()["blocks_saved"] == 4
    delay = s.request_finished(req, a_blocks)
    assert isinstance(delay, bool)
    sending, _ = iteration(s, w, NS(new_requests=[], cached_requests=[]),
                           finished=[7] if delay else [])
    assert sending == ([7] if delay else [])
    s.shutdown()
    w.shutdown()

    kv_b = pool(fill=False)
    s, w = kt.KvdepotScheduler(env), kt.KvdepotWorker(env)
    w.register_kv_caches(kv_b)
    req = LlmRequest(8, tokens)
    n, is_async = s.get_num_new_matched_tokens(req, 0)
    assert (n, is_async) == (4 * BS, True)
    b_blocks = [15, 14, 13, 12, 1]
    s.update_state_after_alloc(req, b_blocks)
    recving = []
    deadline = time.monotonic() + 20  # the load runs on other threads
    while time.monotonic() < deadline:
        time.sleep(0.001)
        _, recving = iteration(s, w, NS(new_requests=[], cached_requests=[]),
                               loading=[8])
        if recving:
            break
    assert recving == [8]
    for i in range(4):
        assert torch.equal(kv_a[a_blocks[i]], kv_b[b_blocks[i]])
    assert torch.all(kv_b[b_blocks[4]] == -1)
    # The tail runs, then a decode step.
    iteration(s, w, NS(new_requests=[rd(8, b_blocks, tokens, 4 * BS,
                                        PROMPT - 4 * BS)],
                       cached_requests=[]))
    iteration(s, w, NS(new_requests=[],
                       cached_requests=[rd(8, [], [42], PROMPT, 1)]))
    s.request_finished(req, b_blocks)
    s.shutdown()
    w.shutdown()


def test_failed_forward_commits_nothing(env):
    """TensorRT-LLM's _forward_step catches an exception of the forward
    pass and skips wait_for_save: the step stays bound until the next
    iteration binds its plan, which aborts it. Nothing of it is stored (a
    later prompt misses), and the next steps save as usual."""
    tokens = [(i * 7 + 1) % 32000 for i in range(PROMPT)]
    kv = pool(fill=True)
    s, w = kt.KvdepotScheduler(env), kt.KvdepotWorker(env)
    w.register_kv_caches(kv)
    req = LlmRequest(3, tokens)
    assert s.get_num_new_matched_tokens(req, 0) == (0, False)
    blocks = [1, 2, 3, 4, 5]
    s.update_state_after_alloc(req, blocks)
    out = NS(new_requests=[rd(3, blocks, tokens, 0, PROMPT)],
             cached_requests=[])
    meta = pickle.loads(pickle.dumps(s.build_connector_meta(out)))
    w.bind_connector_meta(meta)
    w.start_load_kv(None)
    for layer in range(2):  # then the forward pass raised
        w.wait_for_layer_load(layer, None)
        w.save_kv_layer(layer, None)
    w.get_finished([], [])
    s.request_finished(req, blocks)  # _handle_errors ends the request
    iteration(s, w, NS(new_requests=[], cached_requests=[]), finished=[3])
    stats = w.kvdepot_stats()
    assert stats["blocks_saved"] == 0 and stats["saves_aborted"] == 4
    again = LlmRequest(4, tokens)
    assert s.get_num_new_matched_tokens(again, 0) == (0, False)
    s.update_state_after_alloc(again, [6, 7, 8, 9, 10])
    iteration(s, w, NS(new_requests=[rd(4, [6, 7, 8, 9, 10], tokens, 0,
                                        PROMPT)], cached_requests=[]))
    assert w.kvdepot_stats()["blocks_saved"] == 4
    s.request_finished(again, [6, 7, 8, 9, 10])
    s.shutdown()
    w.shutdown()


def test_device_pool_is_refused(env):
    """A pool neither worker backend can address (torch's "meta" device) is
    refused before any copy; a CUDA pool goes to the CUDA backend, which on
    a machine without a GPU (or in a build without CUDA) says so."""
    w = kt.KvdepotWorker(env)
    t = torch.empty((NB, LAYERS, 2, BS * HEADS * DIM), dtype=torch.float16,
                    device="meta")
    with pytest.raises(ValueError, match="cannot address a meta"):
        w.register_kv_caches(t)
    cuda = torch.zeros((NB, LAYERS, 2, BS * HEADS * DIM), dtype=torch.float16)

    class CudaLike:
        device = torch.device("cuda", 0)

        def __getattr__(self, name):
            return getattr(cuda, name)

    with pytest.raises(kt._lib.KvdepotError,
                       match="no CUDA device|no CUDA support"):
        w.register_kv_caches(CudaLike())
    assert w.worker is None
    w.shutdown()


def test_missing_shape_is_refused(monkeypatch):
    monkeypatch.setenv("KVDEPOT_CONFIG", json.dumps({"arena_size": "16m"}))
    with pytest.raises(ValueError, match="unknown"):
        kt.KvdepotScheduler(NS(model="/nonexistent", kv_cache_config=None))
    monkeypatch.setenv("KVDEPOT_CONFIG", json.dumps({
        "arena_size": "16m", "num_layers": 2, "num_kv_heads": 1,
        "head_dim": 64, "dtype": "float16", "colour": "blue"}))
    with pytest.raises(ValueError, match="colour"):
        kt.KvdepotScheduler(NS(model="/nonexistent", kv_cache_config=None))


# TensorRT-LLM's classic connector API (kv_cache_connector.py:
# KvCacheConnectorScheduler and KvCacheConnectorWorker).
SCHEDULER = {"build_connector_meta": ["scheduler_output"],
             "get_num_new_matched_tokens": ["request", "num_computed_tokens"],
             "request_finished": ["request", "cache_block_ids"],
             "update_state_after_alloc": ["request", "block_ids"]}
WORKER = {"register_kv_caches": ["kv_cache_tensor"],
          "start_load_kv": ["stream"],
          "wait_for_layer_load": ["layer_idx", "stream"],
          "save_kv_layer": ["layer_idx", "stream"],
          "wait_for_save": ["stream"],
          "get_finished": ["finished_gen_req_ids", "started_loading_req_ids"],
          "bind_connector_meta": ["metadata"],
          "get_connector_meta": [],
          "register_forward_pass_callable": []}


@pytest.mark.parametrize("cls,methods", [(kt.KvdepotScheduler, SCHEDULER),
                                         (kt.KvdepotWorker, WORKER)])
def test_every_trtllm_method_is_there(cls, methods):
    assert list(inspect.signature(cls.__init__).parameters)[1:] == \
        ["llm_args"]
    for name, params in methods.items():
        fn = getattr(cls, name, None)
        assert fn is not None, name
        got = [p for p in inspect.signature(fn).parameters if p != "self"]
        assert got == params, (name, got)
