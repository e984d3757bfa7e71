"""vLLM's real Scheduler drives kvdepot.vllm.KvdepotConnector (PyPI vLLM,
CPU; `make test-vllm`).

A VllmConfig is built from a tiny local Llama config (no weights, no
tokenizer, nothing downloaded) with KVTransferConfig naming our connector by
module path; vLLM's Scheduler constructs the scheduler-role connector
itself. The worker role is our connector on the host backend with CPU
tensors in vLLM's FlashAttention layout; each step runs the worker cycle the
model runner would, and the ModelRunnerOutput/KVConnectorOutput it returns
goes to scheduler.update_from_output.

Scenarios: a request computed and saved; a new Scheduler and connector pair
on the same store directory (an engine restart) admits the same prompt with
the external tokens our connector reports, through WAITING_FOR_REMOTE_KVS
(asynchronous load from NVMe) and back, and its blocks equal the first
engine's; a load whose objects were corrupted comes back as invalid block
ids and, with kv_load_failure_policy="recompute", the request still
finishes; two requests sharing the stored prefix load it once; two requests
that outgrow the blocks are preempted and still finish; the connector vLLM's
factory builds from the module path is our class over vLLM's real base
classes; and a hybrid model (Gemma 2: sliding-window and full-attention
layers) under vLLM's hybrid allocator, whose two KV-cache groups are saved,
restored and left alone where the window has dropped their blocks; and
requests with images (vLLM's own Request and MultiModalFeatureSpec; the
connector alone, no encoder runs) whose block keys are vLLM's own block
hashes, different for different images.
"""

import json
import os
import tempfile
import time
from pathlib import Path

import pytest
import torch

vllm = pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig,  # noqa
                         ModelConfig, SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.v1.base import \
    KVConnectorRole  # noqa: E402
from vllm.v1.core.kv_cache_utils import (get_request_block_hasher,  # noqa
                                         init_none_hash)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec,  # noqa: E402
                                        KVCacheConfig, KVCacheGroupSpec,
                                        KVCacheTensor, SlidingWindowSpec)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

try:
    from vllm.utils.hashing import sha256
except ImportError:  # older layout
    from vllm.utils import sha256

from kvdepot import vllm as kv  # noqa: E402

BS, LAYERS, HEADS, DIM, NB = 16, 2, 2, 64, 64
EOS = 999


# The hybrid model: Gemma 2's layers alternate sliding-window (even) and
# full attention (odd); vLLM's hybrid allocator gives each kind its own
# KV-cache group and block table.
HLAYERS, WINDOW = 4, 32
FULL = [f"model.layers.{i}.self_attn.attn" for i in range(1, HLAYERS, 2)]
LOCAL = [f"model.layers.{i}.self_attn.attn" for i in range(0, HLAYERS, 2)]


def model_dir(root, hybrid=False):
    d = Path(root) / ("tiny-gemma2" if hybrid else "tiny-llama")
    d.mkdir(exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HEADS * DIM, "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS, "num_hidden_layers": LAYERS,
        "intermediate_size": 256, "vocab_size": 1000,
        "max_position_embeddings": 4096, "torch_dtype": "float16",
        "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": EOS}
    if hybrid:
        cfg.update({"architectures": ["Gemma2ForCausalLM"],
                    "model_type": "gemma2", "head_dim": DIM,
                    "num_hidden_layers": HLAYERS, "sliding_window": WINDOW,
                    "query_pre_attn_scalar": DIM,
                    "torch_dtype": "bfloat16"})  # vLLM refuses fp16 here
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def make_config(root, store_dir, policy="fail", hma=False, extra=None):
    mc = ModelConfig(model=model_dir(root, hma), skip_tokenizer_init=True,
                     dtype="bfloat16" if hma else "float16", seed=0)
    cfg = VllmConfig(
        model_config=mc,
        scheduler_config=SchedulerConfig(
            max_num_seqs=8, max_num_batched_tokens=256, max_model_len=4096,
            enable_chunked_prefill=True,
            is_encoder_decoder=mc.is_encoder_decoder,
            disable_hybrid_kv_cache_manager=None if hma else True),
        cache_config=CacheConfig(block_size=BS, gpu_memory_utilization=0.9,
                                 cache_dtype="auto",
                                 enable_prefix_caching=True),
        kv_transfer_config=KVTransferConfig(
            kv_connector="KvdepotConnector",
            kv_connector_module_path="kvdepot.vllm", kv_role="kv_both",
            kv_load_failure_policy=policy,
            kv_connector_extra_config={
                "store_dir": store_dir, "arena_size": "64m",
                "disk_size": "64m", "disk_write": "through",
                **(extra or {})}),
        device_config=DeviceConfig("cpu"))
    if hma:
        # vLLM 0.19.1 refuses --no-disable-hybrid-kv-cache-manager on a
        # platform without a GPU (VllmConfig, "not supported in this
        # configuration"); this is the value it has on a GPU with that flag.
        cfg.scheduler_config.disable_hybrid_kv_cache_manager = False
    return cfg


def kv_cache_config(num_blocks, hma=False):
    full = FullAttentionSpec(block_size=BS, num_kv_heads=HEADS,
                             head_size=DIM, dtype=torch.float16)
    if not hma:
        return KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(
                [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)],
                full)])
    full = FullAttentionSpec(block_size=BS, num_kv_heads=HEADS,
                             head_size=DIM, dtype=torch.bfloat16)
    local = SlidingWindowSpec(block_size=BS, num_kv_heads=HEADS,
                              head_size=DIM, dtype=torch.bfloat16,
                              sliding_window=WINDOW)
    # As vLLM lays a hybrid model out: one block pool, one tensor shared by
    # a layer of each group (vLLM 0.19: shared_by; later releases describe
    # each layer's place in the allocation, and overlapping ranges alias).
    size = 2 * num_blocks * BS * HEADS * DIM * 2
    page = size // num_blocks

    def tensor(f, l):
        try:
            return KVCacheTensor(size=size, shared_by=[f, l])
        except TypeError:
            return KVCacheTensor(size=size, layers=[f, l], layer_stride=0,
                                 block_stride=page)
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[tensor(f, l) for f, l in zip(FULL, LOCAL)],
        kv_cache_groups=[KVCacheGroupSpec(FULL, full),
                         KVCacheGroupSpec(LOCAL, local)])


def make_scheduler(cfg, num_blocks=NB, hma=False):
    cfg.cache_config.num_gpu_blocks = num_blocks
    kvc = kv_cache_config(num_blocks, hma)
    return Scheduler(vllm_config=cfg, kv_cache_config=kvc, log_stats=True,
                     structured_output_manager=StructuredOutputManager(cfg),
                     block_size=BS), kvc


_hash_ready = False


def make_request(rid, tokens, max_tokens=4):
    global _hash_ready
    if not _hash_ready:
        init_none_hash(sha256)
        _hash_ready = True
    sp = SamplingParams(max_tokens=max_tokens)
    sp.update_from_generation_config({}, EOS)
    return Request(request_id=rid, prompt_token_ids=list(tokens),
                   sampling_params=sp, pooling_params=None,
                   mm_features=None,
                   block_hasher=get_request_block_hasher(BS, sha256))


class Engine:
    """vLLM's Scheduler plus our worker-role connector on CPU tensors."""

    def __init__(self, root, store_dir, seed, policy="fail", hma=False,
                 num_blocks=NB, extra=None):
        self.cfg = make_config(root, store_dir, policy, hma, extra)
        self.sched, kvc = make_scheduler(self.cfg, num_blocks, hma)
        self.worker = kv.KvdepotConnector(self.cfg, KVConnectorRole.WORKER,
                                          kv_cache_config=kvc)
        g = torch.Generator().manual_seed(seed)
        if hma:  # a full and a sliding-window layer share each tensor
            shared = [torch.randn((2, NB, BS, HEADS, DIM), generator=g)
                      .to(torch.bfloat16) for _ in FULL]
            self.kv = {}
            for i in range(HLAYERS):
                self.kv[f"model.layers.{i}.self_attn.attn"] = shared[i // 2]
        else:
            self.kv = {f"model.layers.{i}.self_attn.attn":
                       torch.randn((2, NB, BS, HEADS, DIM), generator=g)
                       .to(torch.float16) for i in range(LAYERS)}
        self.worker.register_kv_caches(self.kv)
        self.workers, self.kvs = [self.worker], [self.kv]
        self.invalid = set()

    def step(self, token=7):
        """One engine step: every worker (one, or one per rank and stage)
        runs the model runner's connector cycle; their outputs are
        aggregated as vLLM's executor does (done when every worker says
        so, the worker metadata of all), and go to the scheduler."""
        so = self.sched.schedule()
        self.sched.update_from_output(so, self.run_workers(so, token))
        return so

    def run_workers(self, so, token=7):
        """The workers' side of the step `so`: its ModelRunnerOutput."""
        finished, wmeta, invalid = ([], []), None, set()
        for w, kvs in zip(self.workers, self.kvs):
            w.bind_connector_metadata(so.kv_connector_metadata)
            w.start_load_kv(None)
            for name in kvs:
                w.wait_for_layer_load(name)
                w.save_kv_layer(name, kvs[name], None)
            w.wait_for_save()
            for out, ids in zip(finished, w.get_finished(so.finished_req_ids)):
                out.append(set(ids or ()))
            invalid |= w.get_block_ids_with_load_errors()
            m = w.build_connector_worker_meta()
            if m is not None:
                wmeta = m if wmeta is None else wmeta.aggregate(m)
            w.clear_connector_metadata()
        sending, recving = (set.intersection(*f) or None for f in finished)
        self.invalid |= invalid
        ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = self.sched.requests[rid]
            done = req.num_computed_tokens + so.num_scheduled_tokens[rid]
            sampled.append([token] if done >= req.num_prompt_tokens else [])
        out = ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled, logprobs=None,
            prompt_logprobs_dict={}, pooler_output=None,
            kv_connector_output=KVConnectorOutput(
                finished_sending=sending, finished_recving=recving,
                invalid_block_ids=invalid, kv_connector_worker_meta=wmeta))
        return out

    def run_until_done(self, *rids, steps=400):
        for _ in range(steps):
            if not any(r in self.sched.requests for r in rids):
                return
            time.sleep(0.002)
            self.step()
        raise AssertionError(f"{rids} did not finish")

    def blocks_of(self, rid, group=0):
        mgr = self.sched.kv_cache_manager
        return [b.block_id for b in mgr.get_blocks(rid).blocks[group]]

    def close(self):
        self.sched.get_kv_connector().shutdown()
        for w in self.workers:
            w.shutdown()


PROMPT = [(i * 37 + 11) % 900 + 2 for i in range(100)]  # 6 full blocks


def block(kvd, layer, b):
    return list(kvd.values())[layer][:, b]


# async_saves (the default): the saves are committed after their step; vLLM
# keeps a finished request's blocks until the connector reports it sending.
ASYNC = pytest.mark.parametrize("extra", [{"async_saves": False}, None],
                                ids=["sync_saves", "async_saves_default"])


@ASYNC
def test_save_restart_load(extra):
    with tempfile.TemporaryDirectory() as root:
        store = str(Path(root) / "store")
        a = Engine(root, store, seed=1, extra=extra)
        a.sched.add_request(make_request("a", PROMPT))
        a.step()  # prefill: the full blocks are saved
        a_blocks = a.blocks_of("a")[:6]
        saved = {b: [block(a.kv, l, b).clone() for l in range(LAYERS)]
                 for b in a_blocks}
        a.run_until_done("a")
        assert a.worker.kvdepot_stats()["blocks_saved"] >= 6
        a.close()

        b = Engine(root, store, seed=2, extra=extra)
        b.sched.add_request(make_request("b", PROMPT))
        so = b.step()
        req = b.sched.requests["b"]
        assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        assert so.num_scheduled_tokens.get("b", 0) == 0
        for _ in range(400):  # engine steps take time; the load runs
            if req.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
                break
            time.sleep(0.005)
            b.step()
        assert req.status != RequestStatus.WAITING_FOR_REMOTE_KVS
        b_blocks = b.blocks_of("b")[:6]
        for ab, bb in zip(a_blocks, b_blocks):
            for l in range(LAYERS):
                assert torch.equal(saved[ab][l], block(b.kv, l, bb))
        b.step()
        assert req.num_computed_tokens >= 96
        b.run_until_done("b")
        assert not b.invalid
        b.close()


def test_corrupt_load_is_recomputed():
    with tempfile.TemporaryDirectory() as root:
        store = str(Path(root) / "store")
        a = Engine(root, store, seed=3)
        a.sched.add_request(make_request("a", PROMPT))
        a.run_until_done("a")
        a.close()
        with open(Path(store) / "kvd-data-000.dat", "r+b") as f:
            f.write(b"\x5a" * (1 << 16))
        b = Engine(root, store, seed=4, policy="recompute")
        b.sched.add_request(make_request("b", PROMPT))
        b.run_until_done("b")
        assert b.invalid
        b.close()


def test_real_base_class_and_factory():
    with tempfile.TemporaryDirectory() as root:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import (
            KVConnectorBase_V1, SupportsHMA)
        e = Engine(root, str(Path(root) / "store"), seed=5)
        c = e.sched.get_kv_connector()
        assert kv.HAVE_VLLM
        assert type(c) is kv.KvdepotConnector  # built by vLLM's factory
        assert isinstance(c, KVConnectorBase_V1)
        assert isinstance(c, SupportsHMA)
        e.close()


@ASYNC
def test_shared_prefix_loaded_once(extra):
    with tempfile.TemporaryDirectory() as root:
        store = str(Path(root) / "store")
        a = Engine(root, store, seed=6, extra=extra)
        a.sched.add_request(make_request("a", PROMPT))
        a.run_until_done("a")
        a.close()
        b = Engine(root, store, seed=7)
        b.sched.add_request(make_request("x", PROMPT))
        b.sched.add_request(make_request("y", PROMPT))
        b.run_until_done("x", "y")
        assert not b.invalid
        st = b.worker.kvdepot_stats()
        assert st["blocks_loaded"] == 6, st  # once, not once per request
        b.close()


@ASYNC
def test_preemption(extra):
    with tempfile.TemporaryDirectory() as root:
        # 10 blocks for two requests that grow to 6 blocks each.
        e = Engine(root, str(Path(root) / "store"), seed=8, num_blocks=10,
                   extra=extra)
        e.sched.add_request(make_request("p", PROMPT[:60], max_tokens=30))
        e.sched.add_request(make_request("q", PROMPT[20:80], max_tokens=30))
        preempted = 0
        for _ in range(400):
            if "p" not in e.sched.requests and "q" not in e.sched.requests:
                break
            so = e.step()
            preempted += len(so.preempted_req_ids or ())
        assert "p" not in e.sched.requests and "q" not in e.sched.requests
        assert preempted > 0
        assert not e.invalid
        e.close()


_HAND_OFF = """
import sys, tempfile
from pathlib import Path
import test_real_scheduler as t
with tempfile.TemporaryDirectory() as root:
    a = t.Engine(root, str(Path(root) / "store"), seed=12)  # async saves
    for i, rid, params in ((1, "d", {}), (2, "p", {"do_remote_decode": True})):
        req = t.make_request(rid, [x + i for x in t.PROMPT],
                             max_tokens=1 if params else 4)
        req.kv_transfer_params = params
        a.sched.add_request(req)
        a.step()  # the whole prompt: a prefill engine answers "p" here
        st = a.worker.kvdepot_stats()
        print("saves-in-flight:", st["saves_inflight"] > 0, flush=True)
        a.run_until_done(rid)
    a.close()
"""


def test_hand_off_answered_after_its_commits():
    """A prefill engine with async_saves: the step that answers a hand-off
    request (do_remote_decode, max_tokens 1) ends with its blocks committed,
    as the decode engine loads them next; a request decoding here leaves its
    saves in flight. Commits are slowed by a failpoint (a process of its
    own: the library reads KVDEPOT_FAILPOINTS when it loads)."""
    import subprocess
    import sys
    env = dict(os.environ, KVDEPOT_FAILPOINTS="worker.commit=delay:300")
    out = subprocess.run([sys.executable, "-c", _HAND_OFF],
                         cwd=os.path.dirname(os.path.abspath(__file__)),
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    # vLLM's log lines share stdout: only the marked lines are the script's.
    said = [ln.split()[-1] for ln in out.stdout.splitlines()
            if ln.startswith("saves-in-flight: ")]
    assert said == ["True", "False"], out.stdout



def test_async_scheduling_keys_decode_blocks():
    """vLLM's AsyncScheduler (asynchronous scheduling, the default in recent
    releases) plans step k+1 before step k's sampled token is known. The
    blocks a request's decode fills are saved under the keys of the tokens
    they hold: a new engine given the prompt plus the generated tokens
    finds every full block, the decode-filled ones included."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    with tempfile.TemporaryDirectory() as root:
        store = str(Path(root) / "store")
        a = Engine(root, store, seed=13)
        kvc = kv_cache_config(NB)
        a.sched = AsyncScheduler(
            vllm_config=a.cfg, kv_cache_config=kvc, log_stats=True,
            structured_output_manager=StructuredOutputManager(a.cfg),
            block_size=BS)
        req = make_request("g", PROMPT, max_tokens=40)
        a.sched.add_request(req)
        pending, n = None, 0
        while "g" in a.sched.requests or pending is not None:
            n += 1
            assert n < 200, "g did not finish"
            so = a.sched.schedule()  # before the last step's output
            out = a.run_workers(so, token=300 + n)
            if pending is not None:
                a.sched.update_from_output(*pending)
            pending = (so, out) if so.total_num_scheduled_tokens or \
                "g" in a.sched.requests else None
        tokens = list(req.all_token_ids)
        assert len(tokens) >= 8 * BS + 1
        assert a.worker.kvdepot_stats()["blocks_saved"] >= 8
        a.close()

        b = Engine(root, store, seed=14)
        c = b.sched.get_kv_connector()
        again = make_request("h", tokens[:8 * BS] + [5])
        assert c.get_num_new_matched_tokens(again, 0)[0] == 8 * BS
        b.close()


def test_hybrid_allocator_groups():
    """Gemma 2 under the hybrid allocator: two KV-cache groups, each saved
    and restored in its own block table; the sliding-window group's blocks
    that left the window (vLLM's null block) are neither loaded nor saved."""
    def layer(kvd, name, b):
        return kvd[name][:, b]

    with tempfile.TemporaryDirectory() as root:
        store = str(Path(root) / "store")
        a = Engine(root, store, seed=9, hma=True)
        assert not a.cfg.scheduler_config.disable_hybrid_kv_cache_manager
        c = a.sched.get_kv_connector()
        assert len(c.leaders) == 2 and len(a.worker.workers) == 2
        a.sched.add_request(make_request("h", PROMPT))
        a.step()  # the whole prompt in one step: every block is real
        full_a, local_a = a.blocks_of("h", 0)[:6], a.blocks_of("h", 1)[:6]
        assert 0 not in full_a and 0 not in local_a
        saved = {(n, i): layer(a.kv, n, b).clone()
                 for names, blocks in ((FULL, full_a), (LOCAL, local_a))
                 for n in names for i, b in enumerate(blocks)}
        a.run_until_done("h")
        assert a.worker.kvdepot_stats()["blocks_saved"] == 12  # 6 per group
        a.close()

        b = Engine(root, store, seed=10, hma=True)
        null_before = {n: layer(b.kv, n, 0).clone() for n in b.kv}
        b.sched.add_request(make_request("h2", PROMPT))
        req = b.sched.requests["h2"]
        b.step()
        assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        for _ in range(400):
            if req.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
                break
            time.sleep(0.005)
            b.step()
        assert req.status != RequestStatus.WAITING_FOR_REMOTE_KVS
        full_b, local_b = b.blocks_of("h2", 0)[:6], b.blocks_of("h2", 1)[:6]
        # 96 tokens restored: the window (32 tokens) keeps the last two of
        # the sliding-window group's six blocks; vLLM holds null for the rest.
        assert local_b[:4] == [0, 0, 0, 0] and 0 not in local_b[4:]
        for n in FULL:
            for i, bb in enumerate(full_b):
                assert torch.equal(saved[(n, i)], layer(b.kv, n, bb))
        for n in LOCAL:
            for i in (4, 5):
                assert torch.equal(saved[(n, i)], layer(b.kv, n, local_b[i]))
        for n in b.kv:  # the null block was never written
            assert torch.equal(null_before[n], layer(b.kv, n, 0))
        assert b.worker.kvdepot_stats()["blocks_loaded"] == 6 + 2
        b.step()
        assert req.num_computed_tokens >= 96
        b.run_until_done("h2")
        assert not b.invalid
        b.close()


def mm_request(rid, image, tokens):
    """A vLLM Request whose prompt holds `image` at tokens [20, 50) and an
    icon at [70, 75) (identifiers only: no data, no encoder), with vLLM's
    request_block_hasher on sha256_cbor from the connector's root (the
    CBOR of "kvdepot", what PYTHONHASHSEED would seed), so its
    block_hashes are what kvdepot's keys must equal."""
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core import kv_cache_utils

    feats = [MultiModalFeatureSpec(
        data=None, modality="image", identifier=ident,
        mm_position=PlaceholderRange(offset=offset, length=length))
        for ident, offset, length in ((image, 20, 30), ("icon", 70, 5))]
    sp = SamplingParams(max_tokens=4)
    sp.update_from_generation_config({}, EOS)
    saved = getattr(kv_cache_utils, "NONE_HASH", None)  # the other tests'
    kv_cache_utils.NONE_HASH = sha256_cbor("kvdepot")
    try:
        req = Request(request_id=rid, prompt_token_ids=list(tokens),
                      sampling_params=sp, pooling_params=None,
                      mm_features=feats,
                      block_hasher=get_request_block_hasher(BS, sha256_cbor))
    finally:
        if saved is None:
            del kv_cache_utils.NONE_HASH  # unset until init_none_hash
        else:
            kv_cache_utils.NONE_HASH = saved
    req.kv_transfer_params = {"do_remote_decode": True}  # hand off the keys
    return req


class _Blocks:
    def __init__(self, ids):
        self.ids = list(ids)

    def get_block_ids(self):
        return (self.ids,)


def test_multimodal_keys_are_vllms_block_hashes():
    from types import SimpleNamespace as NS

    with tempfile.TemporaryDirectory() as root:
        e = Engine(root, str(Path(root) / "store"), seed=11)
        c = e.sched.get_kv_connector()
        from vllm.v1.core import kv_cache_utils
        tagged = hasattr(kv_cache_utils, "to_event_extra_keys")
        keys, theirs = {}, {}
        for rid, image, first in (("a", "image-a", 0), ("b", "image-b", 7)):
            req = mm_request(rid, image, PROMPT)
            ids = list(range(first, first + 7))
            assert c.get_num_new_matched_tokens(req, 0) == (0, False)
            c.update_state_after_alloc(req, _Blocks(ids), 0)
            c.build_connector_meta(NS(
                scheduled_new_reqs=[NS(req_id=rid, num_computed_tokens=0)],
                scheduled_cached_reqs=NS(req_ids=[], new_block_ids=[],
                                         num_computed_tokens=[]),
                num_scheduled_tokens={rid: len(PROMPT)},
                finished_req_ids=set(), preempted_req_ids=set()))
            _, params = c.request_finished(req, ids)
            keys[rid] = params["kvdepot_hashes"]
            theirs[rid] = [bytes(h).hex() for h in req.block_hashes]
            if not tagged:  # vLLM 0.19's recipe is kvdepot's, byte for byte
                assert keys[rid] == theirs[rid]
        # Later releases tag their extra keys ("mm", "lora", ...), so their
        # hashes are not kvdepot's; the blocks they tell apart must be the
        # ones kvdepot tells apart, and the first block (no extras) is the
        # same hash.
        assert keys["a"][0] == theirs["a"][0]
        for x in ("a", "b"):
            for y in ("a", "b"):
                for i in range(6):
                    for j in range(6):
                        assert (keys[x][i] == keys[y][j]) == \
                            (theirs[x][i] == theirs[y][j])
        assert len(keys["a"]) == 6
        assert keys["a"][0] == keys["b"][0]  # before the image
        assert not set(keys["a"][1:]) & set(keys["b"][1:])
        e.close()
