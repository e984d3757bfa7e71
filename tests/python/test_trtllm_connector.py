"""kvdepot.trtllm driven in TensorRT-LLM's call order (its
kv_cache_connector.py: KvCacheConnectorScheduler/Worker, and the stand-in
of KvCacheConnectorManager in trtllm_standin.py) with a real torch
block-major pool [blocks, layers, 2, heads*tokens*dim] on the host backend.

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
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

torch = pytest.importorskip("torch")

from conftest import require_lib  # noqa: E402
from kvdepot import trtllm as kt  # noqa: E402
from trtllm_standin import (LlmRequest, Manager, SoloComm, rd,  # noqa: E402
                            sched_out)

require_lib()

BS, LAYERS, HEADS, DIM, NB = 32, 4, 2, 64, 16
PROMPT = 150  # 4 full blocks, the 5th holds the last token


def llm_args(model_dir, **kw):
    kvc = NS(tokens_per_block=BS, dtype=kw.pop("kv_dtype", "auto"))
    return NS(model=str(model_dir), kv_cache_config=kvc, **kw)


def write_model(d, heads=HEADS):
    model = Path(d) / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({
        "num_hidden_layers": LAYERS, "num_attention_heads": 4,
        "num_key_value_heads": heads, "hidden_size": 4 * DIM,
        "torch_dtype": "float16"}))
    return model


def set_config(monkeypatch, d, **extra):
    """Saves end at wait_for_save unless a test asks for async_saves (the
    default): these tests look at a step's objects when it ends."""
    cfg = {"store_dir": str(Path(d) / "store"), "arena_size": "64m",
           "disk_size": "64m", "disk_write": "through", "async_saves": False}
    cfg.update(extra)
    monkeypatch.setenv("KVDEPOT_CONFIG", json.dumps(cfg))


@pytest.fixture
def env(monkeypatch):
    with tempfile.TemporaryDirectory() as d:
        model = write_model(d)
        set_config(monkeypatch, d)
        yield llm_args(model)


def pool(fill, heads=HEADS, dtype=torch.float16, seed=99):
    t = torch.empty((NB, LAYERS, 2, BS * heads * DIM), dtype=dtype)
    if fill:
        g = torch.Generator().manual_seed(seed)
        t.copy_(torch.randn(t.shape, generator=g).to(dtype))
    else:
        t.view(torch.uint8).fill_(0xEE)
    return t


def engine(args, kv):
    s, w = kt.KvdepotScheduler(args), kt.KvdepotWorker(args)
    w.register_kv_caches(kv)
    return s, w, Manager(w, s, SoloComm())


def close(s, w):
    s.shutdown()
    w.shutdown()


def run_prefill(m, req, blocks, tokens):
    """A context request computed whole and saved; request_finished."""
    n, is_async = m.get_num_new_matched_tokens(req, 0)
    m.update_state_after_alloc(req, blocks)
    assert m.step(sched_out([rd(req.request_id, blocks, tokens, n,
                                len(tokens) - n)]), LAYERS) is None
    m.request_finished(req, blocks)
    m.step(sched_out(), LAYERS)
    return n, is_async


def wait_loaded(m, rid):
    deadline = time.monotonic() + 20  # the load runs on other threads
    while rid not in m.loaded:
        assert time.monotonic() < deadline
        time.sleep(0.001)
        assert m.step(sched_out(), LAYERS) is None


def test_save_restart_load(env):
    tokens = [(i * 13 + 5) % 32000 for i in range(PROMPT)]
    kv_a = pool(fill=True)
    s, w, m = engine(env, kv_a)
    a_blocks = [5, 2, 9, 0, 11]
    assert run_prefill(m, LlmRequest(7, tokens), a_blocks, tokens) == \
        (0, False)
    assert w.kvdepot_stats()["blocks_saved"] == 4
    close(s, w)

    kv_b = pool(fill=False)
    s, w, m = engine(env, kv_b)
    req = LlmRequest(8, tokens)
    # Every load is asynchronous: TensorRT-LLM holds the request meanwhile.
    assert m.get_num_new_matched_tokens(req, 0) == (4 * BS, True)
    b_blocks = [15, 14, 13, 12, 1]
    m.update_state_after_alloc(req, b_blocks)
    wait_loaded(m, 8)
    for i in range(4):
        assert torch.equal(kv_a[a_blocks[i]], kv_b[b_blocks[i]])
    assert torch.all(kv_b[b_blocks[4]].view(torch.uint8) == 0xEE)
    # The tail runs, then a decode step.
    assert m.step(sched_out([rd(8, b_blocks, tokens, 4 * BS,
                                PROMPT - 4 * BS)]), LAYERS) is None
    assert m.step(sched_out(cached=[rd(8, [], [42], PROMPT, 1)]),
                  LAYERS) is None
    m.request_finished(req, b_blocks)
    m.step(sched_out(), LAYERS)
    close(s, w)


def test_sending_is_what_request_finished_kept(env):
    """get_finished names a request as saved only when request_finished
    said True and TensorRT-LLM passed its id: an id it never passed would
    be a KeyError in its manager (extract_by_id)."""
    tokens = [(i * 3 + 1) % 32000 for i in range(PROMPT)]
    s, w, m = engine(env, pool(fill=True))
    req = LlmRequest(21, tokens)
    m.get_num_new_matched_tokens(req, 0)
    m.update_state_after_alloc(req, [1, 2, 3, 4, 5])
    s.leader.request_finished = lambda rid: True  # saves still in flight
    m.step(sched_out([rd(21, [1, 2, 3, 4, 5], tokens, 0, PROMPT)]), LAYERS)
    assert m.request_finished(req, [1, 2, 3, 4, 5]) is True
    other = LlmRequest(22, tokens[:40])
    m.get_num_new_matched_tokens(other, 0)
    m.update_state_after_alloc(other, [6, 7])
    m.step(sched_out([rd(22, [6, 7], tokens[:40], 0, 40)]), LAYERS)
    s.leader.request_finished = lambda rid: False
    assert m.request_finished(other, [6, 7]) is False
    for _ in range(3):
        m.step(sched_out(), LAYERS)
    assert m.saved == {21}
    close(s, w)


def test_corrupt_block_is_never_served(env):
    """TensorRT-LLM has no channel for a failed load. The request is held
    while its blocks load; a block that fails (here: its bytes on NVMe
    corrupted, so the checksum fails) stops the step that would compute on
    it before layer 0, with KvdepotLoadError, on every rank. The bad object
    is gone: the request sent again is not promised it and computes it."""
    tokens = [(i * 7 + 3) % 32000 for i in range(PROMPT)]
    s, w, m = engine(env, pool(fill=True))
    run_prefill(m, LlmRequest(1, tokens), [1, 2, 3, 4, 5], tokens)
    close(s, w)
    store = Path(json.loads(os.environ["KVDEPOT_CONFIG"])["store_dir"])
    data = sorted(store.glob("kvd-data-*.dat"))
    with open(data[0], "r+b") as f:
        f.write(b"\x5a" * (1 << 16))

    kv = pool(fill=False)
    s, w, m = engine(env, kv)
    req = LlmRequest(2, tokens)
    n, is_async = m.get_num_new_matched_tokens(req, 0)
    assert n == 4 * BS and is_async
    blocks = [10, 11, 12, 13, 14]
    m.update_state_after_alloc(req, blocks)
    wait_loaded(m, 2)
    assert w.kvdepot_stats()["load_errors"] >= 1
    err = m.step(sched_out([rd(2, blocks, tokens, n, PROMPT - n)]), LAYERS)
    assert isinstance(err, kt.KvdepotLoadError), err
    assert "request 2" in str(err)
    # The executor answered request 2 with the error and ended it.
    m.request_finished(req, blocks)
    m.step(sched_out(), LAYERS)
    again = LlmRequest(3, tokens)
    n2, _ = m.get_num_new_matched_tokens(again, 0)
    assert n2 < n
    m.update_state_after_alloc(again, [6, 7, 8, 9, 15])
    if n2:
        wait_loaded(m, 3)
    assert m.step(sched_out([rd(3, [6, 7, 8, 9, 15], tokens, n2,
                                PROMPT - n2)]), LAYERS) is None
    close(s, w)


def test_failed_forward_commits_nothing(env):
    """TensorRT-LLM's _forward_step catches an exception of the forward
    pass and skips wait_for_save: the step stays bound until the next
    iteration binds its plan, which aborts it. Nothing of it is stored (a
    later prompt misses), and the next steps save as usual."""
    tokens = [(i * 7 + 1) % 32000 for i in range(PROMPT)]
    s, w, m = engine(env, pool(fill=True))
    req = LlmRequest(3, tokens)
    assert m.get_num_new_matched_tokens(req, 0) == (0, False)
    blocks = [1, 2, 3, 4, 5]
    m.update_state_after_alloc(req, blocks)
    err = m.step(sched_out([rd(3, blocks, tokens, 0, PROMPT)]), LAYERS,
                 raise_in_forward=2)
    assert err is not None
    m.request_finished(req, blocks)  # _handle_errors ends the request
    m.step(sched_out(), LAYERS)
    stats = w.kvdepot_stats()
    assert stats["blocks_saved"] == 0 and stats["saves_aborted"] == 4
    again = LlmRequest(4, tokens)
    assert m.get_num_new_matched_tokens(again, 0) == (0, False)
    m.update_state_after_alloc(again, [6, 7, 8, 9, 10])
    m.step(sched_out([rd(4, [6, 7, 8, 9, 10], tokens, 0, PROMPT)]), LAYERS)
    assert w.kvdepot_stats()["blocks_saved"] == 4
    close(s, w)


def roundtrip(monkeypatch, d, kv_a, heads, **cfg):
    """kv_a saved by one engine, loaded by a new one: the new pool."""
    set_config(monkeypatch, d, **cfg)
    args = llm_args(write_model(d, heads),
                    kv_dtype="fp8" if kv_a.element_size() == 1 else "auto")
    tokens = [(i * 11 + 2) % 32000 for i in range(PROMPT)]
    s, w, m = engine(args, kv_a)
    run_prefill(m, LlmRequest(1, tokens), [0, 1, 2, 3, 4], tokens)
    close(s, w)
    kv_b = torch.zeros_like(kv_a)
    s, w, m = engine(args, kv_b)
    req = LlmRequest(2, tokens)
    assert m.get_num_new_matched_tokens(req, 0) == (4 * BS, True)
    m.update_state_after_alloc(req, [0, 1, 2, 3, 4])
    wait_loaded(m, 2)
    close(s, w)
    return kv_b


def heads_view(t, heads):
    return t.view(NB, LAYERS, 2, heads, BS, DIM)


def test_pool_rows_are_head_major(monkeypatch):
    """A row of TensorRT-LLM's pool is [head][token][dim]
    (KVBlockArray::getKVLocalIdx). KIVI quantizes K per channel over a
    group of tokens: read head-major, each head's groups hold that head
    only, so with heads of very different magnitude every head loads back
    exactly as it does when it is the only head."""
    kv = pool(fill=True)
    hv = heads_view(kv, HEADS)
    hv[:, :, :, 1] *= 1000.0
    with tempfile.TemporaryDirectory() as d:
        both = heads_view(roundtrip(monkeypatch, d, kv, HEADS,
                                    codec="kivi4"), HEADS)
    assert not torch.equal(both[:4], hv[:4])  # lossy
    for h in range(HEADS):
        alone = torch.zeros((NB, LAYERS, 2, BS * DIM), dtype=torch.float16)
        heads_view(alone, 1)[:, :, :, 0] = hv[:, :, :, h]
        with tempfile.TemporaryDirectory() as d:
            one = heads_view(roundtrip(monkeypatch, d, alone, 1,
                                       codec="kivi4"), 1)
        assert torch.equal(both[:4, :, :, h], one[:4, :, :, 0]), h


def test_fp8_cache_moves_as_bytes(monkeypatch):
    """kv_cache_config.dtype "fp8": the pool's bytes come back as they were
    (a uint8 view stands for torch.float8_e4m3fn where torch lacks it)."""
    fp8 = getattr(torch, "float8_e4m3fn", torch.uint8)
    g = torch.Generator().manual_seed(5)
    kv = torch.randint(0, 256, (NB, LAYERS, 2, BS * HEADS * DIM),
                       generator=g, dtype=torch.uint8).view(fp8)
    with tempfile.TemporaryDirectory() as d:
        got = roundtrip(monkeypatch, d, kv, HEADS)
    assert torch.equal(got[:4].view(torch.uint8), kv[:4].view(torch.uint8))
    with tempfile.TemporaryDirectory() as d:
        set_config(monkeypatch, d, codec="int8")
        with pytest.raises(ValueError, match="codecs must be raw"):
            kt.KvdepotScheduler(llm_args(write_model(d), kv_dtype="fp8"))


def test_settings_from_a_yaml_file(monkeypatch):
    yaml = pytest.importorskip("yaml")
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "kvdepot.yaml"
        f.write_text(yaml.safe_dump({"arena_size": "64m", "codec": "int8",
                                     "store_mode": "embedded"}))
        monkeypatch.setenv("KVDEPOT_CONFIG", str(f))
        s = kt.KvdepotScheduler(llm_args(write_model(d)))
        assert s.settings.codecs == ("int8", "int8")
        s.shutdown()
        f.write_text("- not\n- a mapping\n")
        with pytest.raises(ValueError, match="mapping"):
            kt.KvdepotScheduler(llm_args(write_model(d)))


def test_async_saves_refused_where_blocks_can_move(monkeypatch):
    """async_saves (the default) needs TensorRT-LLM to keep a finished
    request's blocks until its commits: asked for, it is refused with the
    reason under a capacity scheduler policy that pauses requests and with
    TensorRT-LLM's cache transceiver; by default saves then end at
    wait_for_save. Accepted under GUARANTEED_NO_EVICT (the only policy
    TensorRT-LLM runs a connector with)."""
    with tempfile.TemporaryDirectory() as d:
        model = write_model(d)
        monkeypatch.setenv("KVDEPOT_CONFIG", json.dumps({
            "arena_size": "64m"}))
        s = kt.KvdepotScheduler(llm_args(model))
        assert s.settings.async_saves is True  # the default
        s.shutdown()
        s = kt.KvdepotScheduler(llm_args(model, scheduler_config=NS(
            capacity_scheduler_policy="MAX_UTILIZATION")))
        assert s.settings.async_saves is False
        s.shutdown()
        set_config(monkeypatch, d, async_saves=True)
        with pytest.raises(ValueError, match="GUARANTEED_NO_EVICT"):
            kt.KvdepotScheduler(llm_args(model, scheduler_config=NS(
                capacity_scheduler_policy="MAX_UTILIZATION")))
        with pytest.raises(ValueError, match="cache transceiver"):
            kt.KvdepotScheduler(llm_args(
                model, cache_transceiver_config=NS(backend="UCX")))
        policy = NS(name="GUARANTEED_NO_EVICT")  # as its enum prints it
        s = kt.KvdepotScheduler(llm_args(model, scheduler_config=NS(
            capacity_scheduler_policy=policy)))
        s.shutdown()


_ASYNC_SAVES = """
import json, os, tempfile, time
import test_trtllm_connector as t
from trtllm_standin import LlmRequest, rd, sched_out
with tempfile.TemporaryDirectory() as d:
    os.environ["KVDEPOT_CONFIG"] = json.dumps({
        "store_dir": d + "/store", "arena_size": "64m", "disk_size": "64m",
        "disk_write": "through", "async_saves": True})
    s, w, m = t.engine(t.llm_args(t.write_model(d)), t.pool(fill=True))
    for rid, max_new in ((1, 4), (2, 1)):
        tokens = [(i * 5 + rid) % 32000 for i in range(t.PROMPT)]
        blocks = list(range(5 * rid - 5, 5 * rid))
        req = LlmRequest(rid, tokens, max_new_tokens=max_new,
                         prompt_len=t.PROMPT)
        m.get_num_new_matched_tokens(req, 0)
        m.update_state_after_alloc(req, blocks)
        m.step(sched_out([rd(rid, blocks, tokens, 0, t.PROMPT)]), t.LAYERS)
        # The context phase ended: is a save of it still in flight?
        print(w.kvdepot_stats()["saves_inflight"] > 0, flush=True)
        if m.request_finished(req, blocks):
            deadline = time.monotonic() + 20
            while rid not in m.saved:
                assert time.monotonic() < deadline
                m.step(sched_out(), t.LAYERS)
                # Named saved only once its objects are committed.
                st = w.kvdepot_stats()
                assert rid not in m.saved or st["saves_inflight"] == 0, st
        assert w.kvdepot_stats()["blocks_saved"] == 4 * rid
    again = LlmRequest(3, [(i * 5 + 1) % 32000 for i in range(t.PROMPT)])
    print(m.get_num_new_matched_tokens(again, 0)[0] == 4 * t.BS)
    t.close(s, w)
"""


def test_async_saves_hold_the_blocks():
    """async_saves: a context request's saves outlive its step;
    request_finished keeps its blocks and get_finished names it only once
    its objects are committed. A request of max_new_tokens 1 (a context
    engine's, whose KV the generation engine loads next) ends its step with
    them committed. Commits are slowed (failpoint worker.commit, in a
    process of its own)."""
    env = dict(os.environ, KVDEPOT_FAILPOINTS="worker.commit=delay:300")
    out = subprocess.run([sys.executable, "-c", _ASYNC_SAVES],
                         cwd=os.path.dirname(os.path.abspath(__file__)),
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.split() == ["True", "False", "True"], out.stdout


def test_mla_one_namespace_for_every_rank(monkeypatch):
    """MLA latents are whole on every rank: every rank and every TP size
    names the same namespace (one copy of each block), and the leader
    checks no other rank's shard."""
    with tempfile.TemporaryDirectory() as d:
        model = Path(d) / "mla"
        model.mkdir()
        (model / "config.json").write_text(json.dumps({
            "num_hidden_layers": LAYERS, "num_attention_heads": 4,
            "num_key_value_heads": 4, "hidden_size": 4 * DIM,
            "kv_lora_rank": DIM - 16, "qk_rope_head_dim": 16,
            "torch_dtype": "float16"}))
        set_config(monkeypatch, d, store_mode="daemon")
        seen = set()
        for tp in (1, 2, 4):
            for rank in range(tp):
                m = kt._Model(llm_args(model, tensor_parallel_size=tp), rank)
                assert m.mla and len(m.ns_all) == tp
                seen.add(bytes(m.ns.bytes))
        assert len(seen) == 1


def test_cache_salt_separates(env):
    tokens = [(i * 5 + 9) % 32000 for i in range(PROMPT)]
    s, w, m = engine(env, pool(fill=True))
    run_prefill(m, LlmRequest(1, tokens, cache_salt="tenant-a"),
                [1, 2, 3, 4, 5], tokens)
    assert m.get_num_new_matched_tokens(
        LlmRequest(2, tokens, cache_salt="tenant-b"), 0) == (0, False)
    assert m.get_num_new_matched_tokens(
        LlmRequest(3, tokens, cache_salt="tenant-a"), 0) == (4 * BS, True)
    close(s, w)


def test_salt_id_and_images_enter_the_keys(env):
    """TensorRT-LLM's C++ request carries the salt as cache_salt_id and
    images as multimodal hashes with their positions: a different salt or
    a different image in a block misses from that block on."""
    tokens = [(i * 5 + 9) % 32000 for i in range(PROMPT)]
    img = dict(multimodal_hashes=[[7] * 8], multimodal_positions=[40],
               multimodal_lengths=[20])
    s, w, m = engine(env, pool(fill=True))
    run_prefill(m, LlmRequest(1, tokens, cache_salt_id=11, **img),
                [1, 2, 3, 4, 5], tokens)
    assert m.get_num_new_matched_tokens(
        LlmRequest(2, tokens, cache_salt_id=12, **img), 0) == (0, False)
    other = dict(img, multimodal_hashes=[[8] * 8])
    # Blocks 0 (tokens 0-31) holds no image; block 1 (32-63) does.
    assert m.get_num_new_matched_tokens(
        LlmRequest(3, tokens, cache_salt_id=11, **other), 0) == (BS, True)
    assert m.get_num_new_matched_tokens(
        LlmRequest(4, tokens, cache_salt_id=11, **img), 0) == (4 * BS, True)
    close(s, w)


def test_layer_first_pool(monkeypatch):
    """pool_layout "layer_first": [layers, blocks, kv, row]. Its objects
    are the block-first pool's: one saves, the other loads."""
    tokens = [(i * 11 + 2) % 32000 for i in range(PROMPT)]
    with tempfile.TemporaryDirectory() as d:
        set_config(monkeypatch, d, pool_layout="layer_first")
        args = llm_args(write_model(d))
        lf = pool(fill=True).transpose(0, 1).contiguous()
        s, w, m = engine(args, lf)
        run_prefill(m, LlmRequest(1, tokens), [4, 0, 6, 2, 8], tokens)
        with pytest.raises(ValueError, match="layer_first"):
            w.register_kv_caches(pool(fill=True))
        close(s, w)
        set_config(monkeypatch, d)
        bf = pool(fill=False)
        s, w, m = engine(args, bf)
        req = LlmRequest(2, tokens)
        assert m.get_num_new_matched_tokens(req, 0) == (4 * BS, True)
        m.update_state_after_alloc(req, [9, 10, 11, 12, 13])
        wait_loaded(m, 2)
        for a, b in zip([4, 0, 6, 2], [9, 10, 11, 12]):
            assert torch.equal(lf[:, a], bf[b])
        close(s, w)


@pytest.mark.parametrize("kw,match", [
    ({"pipeline_parallel_size": 2}, "pipeline parallelism"),
    ({"context_parallel_size": 2}, "context parallelism"),
    ({"enable_attention_dp": True}, "attention data parallelism"),
    ({"kv_dtype": "nvfp4"}, "not supported"),
])
def test_setups_it_cannot_serve_are_refused(env, kw, match):
    args = llm_args(env.model, **kw)
    with pytest.raises(ValueError, match=match):
        kt.KvdepotScheduler(args)


def test_embedded_store_with_tensor_parallelism_is_refused(monkeypatch):
    with tempfile.TemporaryDirectory() as d:
        set_config(monkeypatch, d, store_mode="embedded")
        with pytest.raises(ValueError, match="embedded"):
            kt.KvdepotScheduler(llm_args(write_model(d),
                                         tensor_parallel_size=2))


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


def test_base_classes_are_what_the_run_says():
    """make test-trtllm sets KVDEPOT_NEED_TRTLLM: there the connector must
    derive from TensorRT-LLM's own classes, not the stand-ins."""
    if os.environ.get("KVDEPOT_NEED_TRTLLM"):
        assert kt.HAVE_TRTLLM, "tensorrt_llm did not import"
    base = kt.KvdepotWorker.__mro__[1]
    assert base.__module__.startswith(
        "tensorrt_llm" if kt.HAVE_TRTLLM else "kvdepot"), base
