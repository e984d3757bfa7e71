"""kvdepot.vllm in the setups production deployments use, in vLLM's call
order with real torch CPU tensors (the stand-ins of test_vllm_connector.py):
the supported vLLM range, fp8 KV caches, prompts given as embeddings,
pipeline parallelism, speculative decoding, the start-up log lines and
sleep mode. Each test would have served wrong KV, or failed a request,
before the connector handled its setup.

Runs under /usr/bin/python3 (Debian's python3-torch); skipped without
torch or without a built libkvdepot.so.
"""

import logging
import re
import tempfile
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

torch = pytest.importorskip("torch")

from conftest import KVDEPOTD, require_lib, start_daemon, stop_daemon  # noqa: E402,E501
from test_vllm_connector import (BS, DIM, HEADS, LAYERS, NB, PROMPT,  # noqa: E402,E501
                                 Blocks, ModelConfig, Request, caches,
                                 connector_pair, parallel_step, sched_output,
                                 shutdown_all, vllm_config, worker_step)
from kvdepot import vllm as kv  # noqa: E402

require_lib()

ROOT = Path(__file__).resolve().parents[2]


def run_prompt(s, w, kvs, names, req, blocks):
    """Engine computes `req` on `blocks`: every full block is saved."""
    assert s.get_num_new_matched_tokens(req, 0) == (0, False)
    s.update_state_after_alloc(req, Blocks(blocks), 0)
    meta = s.build_connector_meta(sched_output(
        new=[(req, 0)], tokens={req.request_id: PROMPT}))
    s.update_connector_output(worker_step(w, meta, kvs, names))
    s.request_finished(req, blocks)


def load_prompt(s, w, kvs, names, req, blocks, want):
    """Matches `req` (want tokens), loads them, returns the invalid ids."""
    n, _ = s.get_num_new_matched_tokens(req, 0)
    assert n == want
    s.update_state_after_alloc(req, Blocks(blocks), n)
    invalid = set()
    for _ in range(2000):  # asynchronous loads finish on other threads
        meta = s.build_connector_meta(sched_output())
        out = worker_step(w, meta, kvs, names)
        s.update_connector_output(out)
        invalid |= out.invalid_block_ids
        if out.finished_recving or n == 0:
            break
    return invalid


# ---- vLLM versions -------------------------------------------------------

def test_vllm_version_range():
    """Older than the oldest supported release: refused, naming the range;
    newer than tested: refused unless allow_untested_vllm; the range is the
    one the package declares and the tested versions are the ones
    `make test-vllm` installs."""
    for ok in ("0.19.1", "0.19.1+cpu", "0.25.0", "0.33.0", "0.33.2rc1"):
        assert kv.check_vllm_version(ok) == ok
    with pytest.raises(ValueError, match=r"0\.19\.0 is not supported.*"
                       r">=0\.19\.1,<0\.34"):
        kv.check_vllm_version("0.19.0")
    with pytest.raises(ValueError, match="allow_untested_vllm"):
        kv.check_vllm_version("0.34.0")
    assert kv.check_vllm_version("0.34.0", allow_untested=True) == "0.34.0"
    with pytest.raises(ValueError, match="cannot read"):
        kv.check_vllm_version("dev")
    meta = (ROOT / "python" / "pyproject.toml").read_text()
    assert f'"vllm>={kv.VLLM_MIN},<{kv.VLLM_BELOW}"' in meta
    make = (ROOT / "Makefile").read_text()
    listed = re.search(r"^VLLM_VERSIONS\s*\?=\s*(.*)$", make, re.M).group(1)
    assert tuple(listed.split()) == kv.VLLM_TESTED
    for v in kv.VLLM_TESTED:
        assert kv.check_vllm_version(v) == v


# ---- fp8 KV caches ---------------------------------------------------------

@pytest.mark.parametrize("cache_dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_fp8_cache_round_trip(cache_dtype):
    """vLLM hands fp8 caches over as uint8 tensors: saved and loaded byte
    for byte with the raw codec, in a namespace of their own (fp8 bytes are
    never served to a bf16 engine, e4m3 never to e5m2)."""
    tokens = [(i * 13 + 5) % 32000 for i in range(PROMPT)]
    with tempfile.TemporaryDirectory() as d:
        cfg = vllm_config(d)
        cfg.cache_config.cache_dtype = cache_dtype
        g = torch.Generator().manual_seed(9)
        kv_a = {n: torch.randint(0, 256, t.shape, generator=g,
                                 dtype=torch.uint8)
                for n, t in caches("flash", fill=False).items()}
        s, w, names = connector_pair(cfg, kv_a)
        want = "float8_e5m2" if cache_dtype == "fp8_e5m2" else \
            "float8_e4m3fn"
        assert s.dtype == want
        run_prompt(s, w, kv_a, names, Request("f8-a", tokens),
                   [3, 9, 1, 12, 5, 20, 7])
        fp8_ns = bytes(s.ns.bytes)
        s.shutdown()
        w.shutdown()

        plain, pw, pnames = connector_pair(vllm_config(d),
                                           caches("flash", fill=False))
        assert bytes(plain.ns.bytes) != fp8_ns
        assert plain.get_num_new_matched_tokens(Request("bf", tokens), 0) \
            == (0, False)
        plain.shutdown()
        pw.shutdown()

        kv_b = {n: torch.zeros_like(t) for n, t in kv_a.items()}
        s, w, names = connector_pair(cfg, kv_b)
        b_blocks = [11, 13, 15, 17, 19, 21, 23]
        assert load_prompt(s, w, kv_b, names, Request("f8-b", tokens),
                           b_blocks, 96) == set()
        for name in names:
            for a, b in zip([3, 9, 1, 12, 5, 20], b_blocks[:6]):
                assert torch.equal(kv_a[name][:, a], kv_b[name][:, b])
        s.shutdown()
        w.shutdown()


def test_fp8_cache_refusals():
    cfg = vllm_config("", codec="int8")
    cfg.cache_config.cache_dtype = "fp8"
    with pytest.raises(ValueError, match='codec int8 .* use codec "raw"'):
        kv.KvdepotConnector(cfg, kv.KVConnectorRole.SCHEDULER)
    cfg = vllm_config("")
    cfg.cache_config.cache_dtype = "fp8"
    cfg.cache_config.calculate_kv_scales = True
    with pytest.raises(ValueError, match="calculate_kv_scales"):
        kv.KvdepotConnector(cfg, kv.KVConnectorRole.SCHEDULER)
    cfg = vllm_config("")
    cfg.cache_config.cache_dtype = "fp8_inc"
    with pytest.raises(ValueError, match="fp8_inc is not supported"):
        kv.KvdepotConnector(cfg, kv.KVConnectorRole.SCHEDULER)


# ---- prompts given as embeddings ---------------------------------------------

class EmbedsRequest(Request):
    """A vLLM request whose prompt is embeddings: prompt_token_ids None,
    all_token_ids zeros for the prompt (vLLM's Request)."""

    def __init__(self, rid, embeds):
        super().__init__(rid, [0] * embeds.shape[0])
        self.prompt_token_ids = None
        self.prompt_embeds = embeds
        self.num_prompt_tokens = embeds.shape[0]


def test_prompt_embeds_key_their_blocks():
    """The same embeddings hit; embeddings that differ from block 3 on hit
    the first 3 blocks only; a text prompt of the placeholder ids hits
    nothing. Before, all three shared every key (the placeholder ids)."""
    g = torch.Generator().manual_seed(3)
    emb = torch.randn((PROMPT, 32), generator=g).to(torch.bfloat16)
    other = emb.clone()
    other[3 * BS + 2, 5] += 1
    with tempfile.TemporaryDirectory() as d:
        kvs = caches("flash", fill=True)
        s, w, names = connector_pair(vllm_config(d), kvs)
        run_prompt(s, w, kvs, names, EmbedsRequest("e-a", emb),
                   [3, 9, 1, 12, 5, 20, 7])
        assert w.kvdepot_stats()["blocks_saved"] == 6
        kv_b = caches("flash", fill=False)
        w.shutdown()
        w = kv.KvdepotConnector(vllm_config(d), kv.KVConnectorRole.WORKER)
        w.register_kv_caches(kv_b)
        b_blocks = [11, 13, 15, 17, 19, 21, 23]
        assert load_prompt(s, w, kv_b, names, EmbedsRequest("e-b", emb),
                           b_blocks, 96) == set()
        for name in names:
            for a, b in zip([3, 9, 1, 12, 5, 20], b_blocks[:6]):
                assert torch.equal(kvs[name][:, a], kv_b[name][:, b])
        assert s.get_num_new_matched_tokens(
            EmbedsRequest("e-c", other), 0)[0] == 48
        assert s.get_num_new_matched_tokens(
            Request("t", [0] * PROMPT), 0) == (0, False)
        s.shutdown()
        w.shutdown()


def test_unkeyable_request_is_computed_and_logged_once(caplog):
    """An image without an identifier cannot be keyed: the request is
    computed and not saved, and the reason is logged once, not per
    request."""
    s = kv.KvdepotConnector(vllm_config(""), kv.KVConnectorRole.SCHEDULER)
    tokens = [(i * 7 + 1) % 32000 for i in range(PROMPT)]
    with caplog.at_level(logging.WARNING, logger="kvdepot.vllm"):
        for i in range(3):
            req = Request(f"img-{i}", tokens)
            req.mm_features = [NS(identifier=None,
                                  mm_position=NS(offset=10, length=20))]
            assert s.get_num_new_matched_tokens(req, 0) == (0, False)
            s.update_state_after_alloc(req, Blocks(range(7)), 0)
    assert sum("is not cached" in r.message for r in caplog.records) == 1
    assert not s._requests  # nothing of them is saved
    s.shutdown()


# ---- pipeline parallelism ----------------------------------------------------

class PPModelConfig(ModelConfig):
    def get_total_num_hidden_layers(self):
        return LAYERS


def pp_config(tmp_path, rank):
    cfg = vllm_config("", store_mode="daemon",
                      store_address=f"unix:{tmp_path}/d.sock")
    cfg.model_config = PPModelConfig()
    cfg.parallel_config.pipeline_parallel_size = 2
    cfg.parallel_config.rank = rank
    return cfg


@pytest.mark.skipif(not KVDEPOTD, reason="KVDEPOTD not set")
def test_pipeline_parallel_round_trip(tmp_path):
    """PP = 2 over kvdepotd: stage 0 runs layers 0-1, stage 1 layer 2 (vLLM's
    split of 3 layers); each stage saves and loads its own layers in its
    own namespace; the scheduler waits for both stages' reports. Then stage
    1's copy of block 4 is dropped: the match stops before it, and no stage
    reports a load error."""
    proc = start_daemon(tmp_path)[0]
    stage_layers = [[0, 1], [2]]

    def engine(fill, seed):
        s = kv.KvdepotConnector(pp_config(tmp_path, 0),
                                kv.KVConnectorRole.SCHEDULER)
        stages = []
        for rank in range(2):
            torch.manual_seed(seed + rank)
            kvs = {f"model.layers.{i}.self_attn":
                   (torch.randn((2, NB, BS, HEADS, DIM)).to(torch.float16)
                    if fill else torch.full((2, NB, BS, HEADS, DIM), -1.0,
                                            dtype=torch.float16))
                   for i in stage_layers[rank]}
            w = kv.KvdepotConnector(pp_config(tmp_path, rank),
                                    kv.KVConnectorRole.WORKER)
            w.register_kv_caches(kvs)
            stages.append((w, kvs))
        return s, stages

    tokens = [(i * 41 + 9) % 32000 for i in range(PROMPT)]
    a_blocks, b_blocks = [2, 8, 4, 14, 6, 16, 10], [1, 3, 5, 7, 9, 11, 13]
    try:
        s, stages = engine(True, 900)
        assert s.stages == [(0, 2), (2, 3)]
        assert [w.num_layers for w, _ in stages] == [2, 1]
        assert bytes(stages[0][0].group_ns[0].bytes) != \
            bytes(stages[1][0].group_ns[0].bytes)
        req = Request("pp-a", tokens)
        req.kv_transfer_params = {"do_remote_decode": True}  # keys, below
        assert s.get_num_new_matched_tokens(req, 0) == (0, False)
        s.update_state_after_alloc(req, Blocks(a_blocks), 0)
        parallel_step(s, stages, s.build_connector_meta(
            sched_output(new=[(req, 0)], tokens={"pp-a": PROMPT})))
        delay, params = s.request_finished(req, a_blocks)
        if delay:
            parallel_step(s, stages, s.build_connector_meta(sched_output()),
                          finished={"pp-a"})
        keys = params["kvdepot_hashes"]
        for w, _ in stages:
            assert w.kvdepot_stats()["blocks_saved"] == 6
        saved = [{n: t.clone() for n, t in kvs.items()} for _, kvs in stages]
        shutdown_all(s, stages)

        s, stages = engine(False, 0)
        req = Request("pp-b", tokens)
        assert s.get_num_new_matched_tokens(req, 0) == (96, False)
        s.update_state_after_alloc(req, Blocks(b_blocks), 96)
        _, invalid = parallel_step(s, stages, s.build_connector_meta(
            sched_output(new=[(req, 96)], tokens={"pp-b": PROMPT - 96})))
        assert not invalid
        for r, (w, kvs) in enumerate(stages):
            assert w.kvdepot_stats()["blocks_loaded"] == 6
            for n, t in kvs.items():
                for a, b in zip(a_blocks[:6], b_blocks[:6]):
                    assert torch.equal(saved[r][n][:, a], t[:, b])
        stage1_ns = stages[1][0].group_ns[0]
        assert s.store.delete(stage1_ns, [keys[4]]) == 1
        shutdown_all(s, stages)

        s, stages = engine(False, 0)
        req = Request("pp-c", tokens)
        assert s.get_num_new_matched_tokens(req, 0) == (64, False)
        s.update_state_after_alloc(req, Blocks(b_blocks), 64)
        _, invalid = parallel_step(s, stages, s.build_connector_meta(
            sched_output(new=[(req, 64)], tokens={"pp-c": PROMPT - 64})))
        assert not invalid
        for w, _ in stages:
            st = w.kvdepot_stats()
            assert st["blocks_loaded"] == 4 and st["load_errors"] == 0
        shutdown_all(s, stages)
    finally:
        stop_daemon(proc)


# ---- what the connector refuses ---------------------------------------------

@pytest.mark.parametrize("method,ok", [("eagle", False), ("mtp", False),
                                       ("draft_model", False),
                                       ("ngram", True), ("suffix", True)])
def test_speculative_decoding(method, ok):
    """Draft layers in the KV cache are refused with the reason; n-gram
    and suffix speculation add no KV and run."""
    cfg = vllm_config("")
    cfg.speculative_config = NS(method=method)
    if ok:
        kv.KvdepotConnector(cfg, kv.KVConnectorRole.SCHEDULER).shutdown()
    else:
        with pytest.raises(ValueError, match="speculative decoding"):
            kv.KvdepotConnector(cfg, kv.KVConnectorRole.SCHEDULER)


@pytest.mark.parametrize("field,value,message", [
    ("enable_dbo", True, "micro-batching"),
    ("ubatch_size", 2, "micro-batching"),
    ("decode_context_parallel_size", 2, "splits each block"),
    ("prefill_context_parallel_size", 2, "splits each block")])
def test_split_steps_refused(field, value, message):
    """Micro-batching saves a layer once per micro-batch (the first copy
    would hold a half-written layer); context parallelism splits a block's
    tokens across ranks. Both refused with the reason."""
    cfg = vllm_config("")
    setattr(cfg.parallel_config, field, value)
    with pytest.raises(ValueError, match=message):
        kv.KvdepotConnector(cfg, kv.KVConnectorRole.SCHEDULER)


def test_encoder_decoder_refused():
    cfg = vllm_config("")
    cfg.model_config.is_encoder_decoder = True
    with pytest.raises(ValueError, match="encoder-decoder"):
        kv.KvdepotConnector(cfg, kv.KVConnectorRole.SCHEDULER)


def test_start_up_lines(caplog):
    """One INFO line with mode, namespace, codec and store; a WARNING when
    vLLM would fail requests the cache cannot serve, none with
    "recompute"."""
    for policy, warned in (("fail", 1), ("recompute", 0)):
        caplog.clear()
        cfg = vllm_config("", codec="int8")
        cfg.kv_transfer_config.kv_load_failure_policy = policy
        with caplog.at_level(logging.INFO, logger="kvdepot.vllm"):
            s = kv.KvdepotConnector(cfg, kv.KVConnectorRole.SCHEDULER)
        infos = [r.message for r in caplog.records
                 if r.levelno == logging.INFO]
        assert len(infos) == 1
        assert "mode embedded" in infos[0] and "codec K int8" in infos[0]
        assert bytes(s.ns.bytes).hex() in infos[0]
        assert sum('"fail"' in r.message for r in caplog.records
                   if r.levelno == logging.WARNING) == warned
        s.shutdown()


def test_sleep_mode():
    """vLLM's sleep mode: a bound step is aborted when the cache is
    released, no step runs while it is, and a cache that came back at
    another address is refused instead of being written through stale
    pointers."""
    kvs = caches("flash", fill=True)
    s, w, names = connector_pair(vllm_config(""), kvs)
    w.unregister_kv_caches()
    with pytest.raises(RuntimeError, match="sleep mode"):
        w.bind_connector_metadata(s.build_connector_meta(sched_output()))
    w.restore_kv_caches()
    worker_step(w, s.build_connector_meta(sched_output()), kvs, names)
    w.unregister_kv_caches()
    moved = next(iter(kvs))
    w._registered[moved] = (torch.zeros(1), w._registered[moved][1])
    with pytest.raises(RuntimeError, match="another address"):
        w.restore_kv_caches()
    s.shutdown()
    w.shutdown()
