"""vLLM's real Scheduler drives kvdepot.vllm in the setups production
deployments use (PyPI vLLM, CPU; `make test-vllm`, once per release of
VLLM_VERSIONS): prompts given as embeddings, an fp8 KV cache, tensor
parallelism with default settings and one rank's shard lost, pipeline
parallelism, and a vLLM release outside the supported range. The worker
role is our connector on CPU tensors, one per rank or stage, each
running the step the model runner would; their outputs are aggregated
as vLLM's executor does. KV bytes are compared after every load.
"""

import tempfile
import time
from pathlib import Path

import pytest
import torch

vllm = pytest.importorskip("vllm")

from test_real_scheduler import Engine as BaseEngine  # noqa: E402
from test_real_scheduler import (BS, DIM, EOS, HEADS, LAYERS, NB,  # noqa: E402
                                 PROMPT, SamplingParams, Scheduler,
                                 StructuredOutputManager, kv_cache_config,
                                 make_config, make_request)
from vllm.config import ParallelConfig, VllmConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import \
    KVConnectorRole  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher  # noqa
from vllm.v1.request import Request, RequestStatus  # noqa: E402

try:
    from vllm.utils.hashing import sha256
except ImportError:  # older layout
    from vllm.utils import sha256

from kvdepot import vllm as kv  # noqa: E402

NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]


def config(root, store, cache_dtype="auto", tp=1, pp=1, rank=0,
           policy="fail"):
    base = make_config(root, store, policy)
    base.cache_config.cache_dtype = cache_dtype
    cfg = VllmConfig(model_config=base.model_config,
                     scheduler_config=base.scheduler_config,
                     cache_config=base.cache_config,
                     kv_transfer_config=base.kv_transfer_config,
                     device_config=base.device_config,
                     parallel_config=ParallelConfig(
                         tensor_parallel_size=tp, pipeline_parallel_size=pp))
    cfg.parallel_config.rank = rank
    return cfg


class Engine(BaseEngine):
    """vLLM's Scheduler plus one worker-role connector per rank (TP) or
    stage (PP), each over its own CPU tensors; the step, the runs and the
    block tables are test_real_scheduler's Engine's."""

    def __init__(self, root, store, seed, cache_dtype="auto", tp=1, pp=1,
                 policy="fail"):
        cfg = config(root, store, cache_dtype, tp, pp, policy=policy)
        cfg.cache_config.num_gpu_blocks = NB
        self.sched = Scheduler(
            vllm_config=cfg, kv_cache_config=kv_cache_config(NB),
            log_stats=True,
            structured_output_manager=StructuredOutputManager(cfg),
            block_size=BS)
        self.workers, self.kvs = [], []
        g = torch.Generator().manual_seed(seed)
        stages = [kv._stage_layers(cfg, r, pp) for r in range(pp)]
        for rank in range(tp * pp):
            wcfg = config(root, store, cache_dtype, tp, pp, rank, policy)
            start, end = stages[rank // tp]
            shape = (2, NB, BS, HEADS // tp, DIM)  # this rank's heads
            if cache_dtype.startswith("fp8"):  # vLLM allocates bytes
                kvs = {n: torch.randint(0, 256, shape, generator=g,
                                        dtype=torch.uint8)
                       for n in NAMES[start:end]}
            else:
                kvs = {n: torch.randn(shape, generator=g).to(torch.float16)
                       for n in NAMES[start:end]}
            w = kv.KvdepotConnector(wcfg, KVConnectorRole.WORKER,
                                    kv_cache_config=kv_cache_config(NB))
            w.register_kv_caches(kvs)
            self.workers.append(w)
            self.kvs.append(kvs)
        self.invalid = set()

    def run_until_loaded(self, rid):
        req = self.sched.requests[rid]
        self.step()
        for _ in range(400):
            if req.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
                break
            time.sleep(0.005)
            self.step()
        assert req.status != RequestStatus.WAITING_FOR_REMOTE_KVS
        return req


def same_blocks(a, a_blocks, b, b_blocks):
    for ka, kb in zip(a.kvs, b.kvs):
        for n in ka:
            for x, y in zip(a_blocks, b_blocks):
                assert torch.equal(ka[n][:, x], kb[n][:, y]), (n, x, y)


def embeds_request(rid, embeds):
    from vllm.v1.core import kv_cache_utils
    if getattr(kv_cache_utils, "NONE_HASH", None) is None:
        kv_cache_utils.init_none_hash(sha256)
    sp = SamplingParams(max_tokens=4)
    sp.update_from_generation_config({}, EOS)
    return Request(request_id=rid, prompt_token_ids=None,
                   prompt_embeds=embeds, sampling_params=sp,
                   pooling_params=None, mm_features=None,
                   block_hasher=get_request_block_hasher(BS, sha256))


def test_prompt_embeds():
    """The same embeddings load the stored blocks, bit for bit; other
    embeddings (from block 3 on) match only the blocks before; before,
    every embedded prompt shared the keys of its placeholder ids."""
    g = torch.Generator().manual_seed(5)
    emb = torch.randn((len(PROMPT), HEADS * DIM), generator=g) \
        .to(torch.float16)
    other = emb.clone()
    other[3 * BS + 1, 0] += 1
    with tempfile.TemporaryDirectory() as root:
        store = str(Path(root) / "store")
        a = Engine(root, store, seed=1)
        a.sched.add_request(embeds_request("a", emb))
        a.step()
        a_blocks = a.blocks_of("a")[:6]
        a.run_until_done("a")
        a.close()
        b = Engine(root, store, seed=2)
        b.sched.add_request(embeds_request("b", emb))
        b.run_until_loaded("b")
        same_blocks(a, a_blocks, b, b.blocks_of("b")[:6])
        b.run_until_done("b")
        c = b.sched.get_kv_connector()
        assert c.get_num_new_matched_tokens(
            embeds_request("c", other), 0)[0] == 3 * BS
        assert c.get_num_new_matched_tokens(
            make_request("t", [0] * len(PROMPT)), 0)[0] == 0
        assert not b.invalid
        b.close()


@pytest.mark.parametrize("cache_dtype", ["fp8", "fp8_e5m2"])
def test_fp8_cache(cache_dtype):
    """--kv-cache-dtype fp8: vLLM's uint8 caches saved and restored byte
    for byte (raw codec)."""
    with tempfile.TemporaryDirectory() as root:
        store = str(Path(root) / "store")
        a = Engine(root, store, seed=3, cache_dtype=cache_dtype)
        a.sched.add_request(make_request("a", PROMPT))
        a.step()
        a_blocks = a.blocks_of("a")[:6]
        a.run_until_done("a")
        a.close()
        b = Engine(root, store, seed=4, cache_dtype=cache_dtype)
        b.sched.add_request(make_request("b", PROMPT))
        b.run_until_loaded("b")
        same_blocks(a, a_blocks, b, b.blocks_of("b")[:6])
        b.run_until_done("b")
        assert not b.invalid
        b.close()


def test_tensor_parallel_default_settings_lost_shard():
    """TP = 2 with the documented one-line config (no daemon started by
    hand: the connector starts the engine's kvdepotd). Rank 1's shard of
    block 3 is then lost: the next engine matches 3 blocks, not 6, and
    under vLLM's default kv_load_failure_policy ("fail") the request
    finishes; before, rank 1 reported a load error and the request
    failed."""
    with tempfile.TemporaryDirectory() as root:
        store = str(Path(root) / "store")
        a = Engine(root, store, seed=6, tp=2)
        assert a.sched.get_kv_connector().store_mode == "spawn"
        a.sched.add_request(make_request("a", PROMPT))
        a.step()
        a_blocks = a.blocks_of("a")[:6]
        a.run_until_done("a")
        for w in a.workers:
            assert w.kvdepot_stats()["blocks_saved"] == 6
        a.close()
        b = Engine(root, store, seed=7, tp=2)
        # Rank 1's copy of block 3 goes (evicted, or its save failed).
        s = b.sched.get_kv_connector()
        assert s.store.delete(b.workers[1].group_ns[0],
                              [kvdepot_keys(PROMPT)[3]]) == 1
        b.sched.add_request(make_request("b", PROMPT))
        req = b.run_until_loaded("b")
        same_blocks(a, a_blocks[:3], b, b.blocks_of("b")[:3])
        b.run_until_done("b")
        assert not b.invalid and req.num_computed_tokens >= len(PROMPT)
        for w in b.workers:
            st = w.kvdepot_stats()
            assert st["blocks_loaded"] == 3 and st["load_errors"] == 0
        b.close()


def kvdepot_keys(tokens):
    """kvdepot's keys of a plain prompt's full blocks: vLLM's sha256_cbor
    chain from kvdepot's root (no extra keys: the same in every vLLM
    release)."""
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core.kv_cache_utils import hash_block_tokens
    h, out = sha256_cbor("kvdepot"), []
    for i in range(len(tokens) // BS):
        h = hash_block_tokens(sha256_cbor, h, tokens[i * BS:(i + 1) * BS])
        out.append(bytes(h))
    return out


def test_pipeline_parallel_round_trip():
    """PP = 2: stage 0 saves and loads layer 0, stage 1 layer 1, each in
    its own namespace; the restarted engine restores both, bit for bit."""
    with tempfile.TemporaryDirectory() as root:
        store = str(Path(root) / "store")
        a = Engine(root, store, seed=8, pp=2)
        assert [list(k) for k in a.kvs] == [NAMES[:1], NAMES[1:]]
        a.sched.add_request(make_request("a", PROMPT))
        a.step()
        a_blocks = a.blocks_of("a")[:6]
        a.run_until_done("a")
        for w in a.workers:
            assert w.kvdepot_stats()["blocks_saved"] == 6
        a.close()
        b = Engine(root, store, seed=9, pp=2)
        b.sched.add_request(make_request("b", PROMPT))
        b.run_until_loaded("b")
        same_blocks(a, a_blocks, b, b.blocks_of("b")[:6])
        b.run_until_done("b")
        assert not b.invalid
        b.close()


@pytest.mark.parametrize("version,allow,message", [
    ("0.18.1", False, "is not supported"),
    ("0.34.0", False, "allow_untested_vllm"),
    ("0.34.0", True, None)])
def test_unsupported_version(monkeypatch, version, allow, message):
    """A vLLM outside the supported range: the engine does not start, and
    the message names the range (or the setting that runs it anyway)."""
    monkeypatch.setattr(vllm, "__version__", version)
    with tempfile.TemporaryDirectory() as root:
        cfg = make_config(root, "")
        cfg.kv_transfer_config.kv_connector_extra_config[
            "allow_untested_vllm"] = allow
        if message is None:
            c = kv.KvdepotConnector(cfg, KVConnectorRole.SCHEDULER,
                                    kv_cache_config=kv_cache_config(NB))
            assert c.vllm_version == version
            c.shutdown()
            return
        with pytest.raises(ValueError, match=message) as e:
            kv.KvdepotConnector(cfg, KVConnectorRole.SCHEDULER,
                                kv_cache_config=kv_cache_config(NB))
        assert f">={kv.VLLM_MIN},<{kv.VLLM_BELOW}" in str(e.value)
