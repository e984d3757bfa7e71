"""LMCacheEngine store/retrieve against kvdepot's leader and worker on one
vLLM-shaped paged KV cache in host memory, interleaved pass by pass.

Cache: Llama-3-8B's shard shape, per layer (32) one bfloat16 tensor
[2, num_blocks, 16, 8, 128] (vLLM's FlashAttention layout, NHD), shared by
both sides. A prompt's T tokens (default 4096, a multiple of LMCache's
256-token chunk) sit in blocks 0..T/16-1 (random bits); each side's
retrieve writes them into the next T/16 blocks, which are then compared
bit for bit with the source and zeroed (untimed). Bytes = T x 128 KiB. Per
pass, on fresh random tokens (nothing hits an earlier pass): kvdepot store
+ retrieve, then LMCache store + retrieve. One untimed warm-up pass, then
PASSES timed; per side the median (min, max) bytes/s, and the per-pass
ratios kvdepot / LMCache (LMCache seconds over kvdepot seconds).

LMCache 0.5.6, built as its vLLM service factory builds it
(LMCacheEngineBuilder.get_or_create + post_init; from_defaults with
local_cpu=True only; chunk_size and pre_caching_hash_algorithm "builtin" at
their defaults: Python's hash(), vLLM is not installed), timed as vLLM's
LMCache connector calls it, token ids as a list:
  store    = engine.lookup(tokens, lookup_id, pin=True) (the scheduler's
             miss) + lookup_unpin + slot mapping + engine.store(tokens,
             mask, kvcaches, slot_mapping, offset=0): chunking, hashing,
             MemoryObj allocation, gather out of the paged cache, put into
             LocalCPUBackend;
  retrieve = engine.lookup(pin=True) (must find all T) + slot mapping +
             engine.retrieve(tokens, mask, kvcaches, slot_mapping) +
             lookup_unpin. engine.clear() after each pass (untimed), so the
             arena's pages, first touched by the warm-up, are reused.
LMCache ships no vLLM connector for a CPU-only host: CreateGPUConnector
raises "No supported cpu connector found." and VLLMPagedMemGPUConnectorV2's
constructor calls torch.cuda.Stream() (both errors are in the notes).
_HostPagedConnector subclasses VLLMPagedMemGPUConnectorV2 and replaces only
those CUDA pieces: LMCache's CPU StubStream (torch_dev.Stream()) for the
streams, and _initialize_pointers without the CUDA check and pointer
upload. Its to_gpu / from_gpu / batched calls are LMCache's own, and
device_ops.multi_layer_kv_transfer resolves on CPU to LMCache's torch
fallback (torch_ops: index_select / index_copy_ per layer and chunk);
with a GPU LMCache would run its CUDA kernel instead. No intermediate
buffer (use_gpu=False: one host copy fewer than its default). The layout
hint {"kv_layout": "NHD"} is what vLLM passes; without it LMCache reads
[2, NB, 16, 8, 128] as HND with 8-token blocks.

kvdepot (python/kvdepot/_lib.py, embedded store in this process, host
worker backend, raw codec, SHA-256 block hash chain), timed as its vLLM
connector drives it:
  store    = Leader.match (a miss) + update_state_after_alloc +
             request_scheduled + build_connector_meta + Worker.bind_metadata
             + start_load_kv + per layer wait_for_layer_load and
             save_kv_layer + wait_for_save (saves committed on return) +
             get_finished + update_connector_output + clear_metadata +
             request_finished;
  retrieve = the same for a second request with the same tokens into
             other blocks: the match finds T tokens, the worker loads them
             layer by layer.
Its prompt has T + 1 tokens (the leader never matches the block holding the
last prompt token: vLLM computes at least one); both sides move the same T
tokens. Its arena, sized for every pass, is prefaulted at open (untimed).

Threads: kvdepot's worker copies on --threads threads (default 2, the
library's default); LMCache's copies are torch ops under
torch.set_num_threads(--threads). On a shared VM single passes can stall:
read the medians with min/max. `python lmcache_engine_peer.py [--tokens T]
[--passes P] [--threads N]` (the peers' virtualenv) prints one JSON line.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

import torch  # noqa: E402

from kvdepot import _lib  # noqa: E402
from kvdepot._shared import _DTYPES, _KVD_DTYPES, _layout_of  # noqa: E402

LMCACHE_IMPORT_ERROR = None
try:
    import lmcache
    from lmcache import torch_dev
    from lmcache.utils import EngineType
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.gpu_connector import CreateGPUConnector
    from lmcache.v1.gpu_connector.gpu_connectors import VLLMPagedMemGPUConnectorV2
    from lmcache.v1.gpu_connector.utils import (
        get_block_size, get_head_size, get_num_blocks,
        normalize_kv_and_discover_format, resolve_block_stride_and_log_layout)
    from lmcache.v1.metadata import LMCacheMetadata
except Exception as e:  # reported as lmcache_error, kvdepot still runs
    LMCACHE_IMPORT_ERROR = f"import: {type(e).__name__}: {e}"
    VLLMPagedMemGPUConnectorV2 = object

LAYERS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16
DTYPE = torch.bfloat16
TOKEN_BYTES = LAYERS * 2 * KV_HEADS * HEAD_DIM * torch.finfo(DTYPE).bits // 8
TOKENS, PASSES, WARMUP, THREADS = 4096, 5, 1, 2
VOCAB = 128256
MODEL = "kvdepot-bench/llama-3-8b-shard"
ENGINE_ID = "kvdepot-lmcache-engine-peer"
GIB, MIB = 1024**3, 1024**2


# ---- the paged KV cache ------------------------------------------------------

def _caches(nb: int) -> list[torch.Tensor]:
    """Per layer [2, 2 * (nb + 1), 16, 8, 128]: blocks 0..nb-1 random bits
    (the source), the rest zero (destinations, partial last blocks)."""
    out = [torch.zeros((2, 2 * (nb + 1), BLOCK, KV_HEADS, HEAD_DIM),
                       dtype=DTYPE) for _ in range(LAYERS)]
    for t in out:
        t.view(torch.int16)[:, :nb] = torch.randint(
            -32768, 32768, (2, nb, BLOCK, KV_HEADS, HEAD_DIM), dtype=torch.int16)
    return out


def _verify(caches: list[torch.Tensor], nb: int, side: str) -> None:
    """The T tokens' blocks at nb+1.. equal the source blocks 0..nb-1;
    then the destinations are zeroed for the next retrieve."""
    dst = slice(nb + 1, 2 * nb + 1)
    for layer, t in enumerate(caches):
        bits = t.view(torch.int16)
        if not torch.equal(bits[:, :nb], bits[:, dst]):
            raise RuntimeError(f"{side}: layer {layer}: retrieved bytes "
                               f"differ from the stored bytes")
        t[:, dst].zero_()


def _slots(first_block: int, tokens: int) -> torch.Tensor:
    """vLLM's slot mapping of `tokens` tokens in consecutive blocks."""
    return torch.arange(tokens, dtype=torch.long) + first_block * BLOCK


# ---- LMCache -----------------------------------------------------------------

class _HostPagedConnector(VLLMPagedMemGPUConnectorV2):
    """VLLMPagedMemGPUConnectorV2 on host tensors: its constructor without
    torch.cuda.Stream() and _initialize_pointers without the CUDA check and
    the pointer upload; to_gpu, from_gpu and the batched calls are its own."""

    def __init__(self, metadata: "LMCacheMetadata"):
        layers, _, _, heads, head_size = metadata.kv_shape
        self.hidden_dim_size = heads * head_size
        self.num_layers = layers
        self.kv_cache_pointers = torch.empty(layers, dtype=torch.int64)
        self.kv_cache_pointers_on_gpu = {}
        self.kvcaches = None
        self.gpu_buffer = None
        self.use_mla = metadata.use_mla
        self.layout_hints = {"kv_layout": "NHD"}
        self.store_stream = torch_dev.Stream()
        self.load_stream = torch_dev.Stream()

    def _initialize_pointers(self, kv_caches):
        self.device = kv_caches[0].device
        if "host" in self.kv_cache_pointers_on_gpu:
            return self.kv_cache_pointers_on_gpu["host"]
        fmt, kv_caches = normalize_kv_and_discover_format(
            kv_caches, EngineType.VLLM, layout_hints=self.layout_hints)
        self.engine_kv_format = fmt
        self.kv_cache_pointers.numpy()[:] = [t.data_ptr() for t in kv_caches]
        self.num_blocks = get_num_blocks(kv_caches, fmt)
        self.block_size = get_block_size(kv_caches, fmt)
        self.page_buffer_size = self.num_blocks * self.block_size
        self.head_size = get_head_size(kv_caches, fmt)
        self.block_stride_elems = resolve_block_stride_and_log_layout(
            kv_caches, fmt, layer_idx=0, group_idx=0) or 0
        self.kv_cache_pointers_on_gpu["host"] = self.kv_cache_pointers
        return self.kv_cache_pointers


def _stock_connector_errors(config, metadata) -> list[str]:
    """What LMCache's own vLLM connectors say on this host."""
    out = []
    for name, make in (
            ("CreateGPUConnector(EngineType.VLLM)",
             lambda: CreateGPUConnector(config, metadata, EngineType.VLLM)),
            ("VLLMPagedMemGPUConnectorV2.from_metadata",
             lambda: VLLMPagedMemGPUConnectorV2.from_metadata(
                 metadata, layout_hints={"kv_layout": "NHD"}))):
        try:
            make()
            out.append(f"{name}: constructed")
        except Exception as e:
            out.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0]}")
    return out


class LMCacheSide:
    def __init__(self, tokens: int, caches: list[torch.Tensor]):
        self.config = LMCacheEngineConfig.from_defaults(
            local_cpu=True,
            max_local_cpu_size=math.ceil(tokens * TOKEN_BYTES / GIB) + 1)
        self.chunk_size = self.config.chunk_size
        if tokens % self.chunk_size:
            raise ValueError(f"--tokens {tokens}: not a multiple of "
                             f"LMCache's chunk size {self.chunk_size}")
        self.metadata = LMCacheMetadata(
            model_name=MODEL, world_size=1, local_world_size=1, worker_id=0,
            local_worker_id=0, kv_dtype=DTYPE,
            kv_shape=(LAYERS, 2, self.chunk_size, KV_HEADS, HEAD_DIM),
            use_mla=False, role="worker", chunk_size=self.chunk_size)
        self.stock_errors = _stock_connector_errors(self.config, self.metadata)
        self.engine = LMCacheEngineBuilder.get_or_create(
            ENGINE_ID, self.config, self.metadata,
            _HostPagedConnector(self.metadata),
            lambda tensor, src: tensor, lambda obj, src: obj)
        self.engine.post_init()
        self.caches = caches
        self.nb = tokens // BLOCK

    def store(self, rid: str, tokens: list[int]) -> float:
        t0 = time.perf_counter()
        hit = self.engine.lookup(tokens, lookup_id=rid, pin=True)
        self.engine.lookup_unpin(rid)
        self.engine.store(tokens, mask=torch.ones(len(tokens), dtype=torch.bool),
                          kvcaches=self.caches, slot_mapping=_slots(0, len(tokens)),
                          offset=0, req_id=rid)
        t1 = time.perf_counter()
        if hit != 0:
            raise RuntimeError(f"LMCache: fresh tokens hit {hit} tokens")
        return t1 - t0

    def retrieve(self, rid: str, tokens: list[int]) -> float:
        t0 = time.perf_counter()
        hit = self.engine.lookup(tokens, lookup_id=rid, pin=True)
        got = self.engine.retrieve(
            tokens, torch.ones(len(tokens), dtype=torch.bool),
            kvcaches=self.caches, slot_mapping=_slots(self.nb + 1, len(tokens)),
            vllm_cached_tokens=0, req_id=rid)
        self.engine.lookup_unpin(rid)
        t1 = time.perf_counter()
        if hit != len(tokens) or int(got.sum()) != len(tokens):
            raise RuntimeError(f"LMCache: looked up {hit}, retrieved "
                               f"{int(got.sum())} of {len(tokens)} tokens")
        _verify(self.caches, self.nb, "LMCache")
        self.engine.clear()
        return t1 - t0

    def close(self) -> None:
        LMCacheEngineBuilder.destroy(ENGINE_ID)


# ---- kvdepot -----------------------------------------------------------------

class KvdepotSide:
    def __init__(self, tokens: int, caches: list[torch.Tensor], threads: int,
                 passes: int):
        self.nb = tokens // BLOCK
        arena = math.ceil(passes * tokens * TOKEN_BYTES * 1.1 / (64 * MIB))
        self.arena_mib = (arena + 4) * 64
        raw = _lib.codec_id("raw")
        self.ns = _lib.namespace(MODEL, _DTYPES["bfloat16"], raw, raw, LAYERS,
                                 KV_HEADS, HEAD_DIM, BLOCK, tq_seed=_lib.TQ_SEED)
        self.store = _lib.Store({"store.arena_size": f"{self.arena_mib}m"})
        self.leader = _lib.Leader(self.store, BLOCK, self.ns, num_workers=1,
                                  layerwise=True, lookup_timeout_ms=2000)
        fmt = _lib.ObjectFormat(dtype=_KVD_DTYPES["bfloat16"], num_layers=LAYERS,
                                num_planes=2, num_heads=KV_HEADS, head_dim=HEAD_DIM,
                                block_size=BLOCK, tq_seed=_lib.TQ_SEED)
        fmt.codec[0], fmt.codec[1] = raw, raw
        self.worker = _lib.Worker(self.store, self.ns, fmt, threads=threads,
                                  device=0, layerwise_saves=True)
        num_blocks, strides, _, _, _ = _layout_of(caches[0], "flash", KV_HEADS)
        self.worker.register_kv_caches([t.data_ptr() for t in caches],
                                       num_blocks, strides)
        self.caches = caches

    def _match(self, rid: str, prompt: list[int]) -> int:
        deadline = time.monotonic() + 5.0
        while True:
            r = self.leader.match(rid, prompt, 0)
            if r is not None:
                return r[0]
            if time.monotonic() > deadline:
                raise RuntimeError(f"kvdepot: {rid}: no answer from the leader")
            time.sleep(0.0001)

    def _step(self, rid: str) -> None:
        """One engine step of the request, as vLLM's worker runs it."""
        w, leader = self.worker, self.leader
        w.bind_metadata(leader.build_connector_meta())
        try:
            w.start_load_kv()
            for layer in range(LAYERS):
                w.wait_for_layer_load(layer)
                w.save_kv_layer(layer)
            w.wait_for_save()
            _, _, failed, report = w.get_finished()
            if report:
                leader.update_connector_output(report)
        finally:
            w.clear_metadata()
        failed += leader.take_failed_blocks()
        leader.take_finished_loads()
        if failed:
            raise RuntimeError(f"kvdepot: {rid}: failed loads {failed}")

    def _request(self, rid: str, prompt: list[int], first_block: int) -> int:
        matched = self._match(rid, prompt)
        blocks = list(range(first_block, first_block + self.nb + 1))
        self.leader.update_state_after_alloc(rid, blocks, matched)
        self.leader.request_scheduled(rid, [], [], len(prompt))
        self._step(rid)
        if self.leader.request_finished(rid):
            raise RuntimeError(f"kvdepot: {rid}: saves still in flight")
        return matched

    def store_kv(self, rid: str, prompt: list[int]) -> float:
        before = self.worker.stats()["blocks_saved"]
        t0 = time.perf_counter()
        matched = self._request(rid, prompt, 0)
        t1 = time.perf_counter()
        saved = self.worker.stats()["blocks_saved"] - before
        if matched != 0 or saved != self.nb:
            raise RuntimeError(f"kvdepot: store matched {matched} tokens, "
                               f"saved {saved} of {self.nb} blocks")
        return t1 - t0

    def retrieve(self, rid: str, prompt: list[int]) -> float:
        before = self.worker.stats()["blocks_loaded"]
        t0 = time.perf_counter()
        matched = self._request(rid, prompt, self.nb + 1)
        t1 = time.perf_counter()
        loaded = self.worker.stats()["blocks_loaded"] - before
        if matched != self.nb * BLOCK or loaded != self.nb:
            raise RuntimeError(f"kvdepot: retrieve matched {matched} tokens, "
                               f"loaded {loaded} of {self.nb} blocks")
        _verify(self.caches, self.nb, "kvdepot")
        return t1 - t0

    def close(self) -> None:
        self.worker.close()
        self.leader.close()
        self.store.close()


# ---- the run -----------------------------------------------------------------

def _spread(values: list[float], prefix: str) -> dict:
    return {prefix: statistics.median(values), f"{prefix}_min": min(values),
            f"{prefix}_max": max(values)}


def _run_passes(kv: KvdepotSide, lmc: LMCacheSide | None, tokens: int,
                passes: int) -> tuple[dict, str | None]:
    """Interleaved passes; per side and operation, the timed seconds."""
    gen = torch.Generator().manual_seed(20261127)
    times = {k: [] for k in ("ks", "kr", "ls", "lr")}
    error = None
    for p in range(WARMUP + passes):
        prompt = torch.randint(0, VOCAB, (tokens + 1,), generator=gen).tolist()
        got = {"ks": kv.store_kv(f"kvd-store-{p}", prompt),
               "kr": kv.retrieve(f"kvd-load-{p}", prompt)}
        if lmc is not None and error is None:
            try:
                got["ls"] = lmc.store(f"lmc-store-{p}", prompt[:tokens])
                got["lr"] = lmc.retrieve(f"lmc-load-{p}", prompt[:tokens])
            except Exception as e:
                error = f"pass {p}: {type(e).__name__}: {e}"
        if p >= WARMUP:
            for k, v in got.items():
                times[k].append(v)
    return times, error


def _result(tokens: int, threads: int, times: dict, lmc: LMCacheSide | None,
            kv: KvdepotSide, error: str | None) -> dict:
    total = tokens * TOKEN_BYTES
    out = {"peer": "lmcache-engine",
           "version": f"lmcache {lmcache.__version__}"
           if LMCACHE_IMPORT_ERROR is None else "lmcache (not importable)",
           "tokens": tokens, "bytes": total,
           "chunk_size": lmc.chunk_size if lmc else None, "threads": threads,
           "kvdepot_worker_threads": threads,
           "torch_threads": torch.get_num_threads(), "passes": len(times["ks"])}
    sides = [("ks", "kvdepot_store"), ("kr", "kvdepot_retrieve")]
    if error is None and times["ls"]:
        sides += [("ls", "lmcache_store"), ("lr", "lmcache_retrieve")]
        for op in ("store", "retrieve"):
            k, m = times["k" + op[0]], times["l" + op[0]]
            out.update(_spread([lt / kt for kt, lt in zip(k, m)], f"{op}_ratio"))
    else:
        out["lmcache_error"] = error
    for key, name in sides:
        out.update(_spread([total / t for t in times[key]],
                           f"{name}_bytes_per_s"))
    out["pass_seconds"] = {name: times[key] for key, name in sides}
    out["layout"] = (f"vLLM FlashAttention NHD: per layer one bfloat16 tensor "
                     f"[2, num_blocks, {BLOCK}, {KV_HEADS}, {HEAD_DIM}], "
                     f"{LAYERS} layers, host memory; LMCache MemoryObj KV_2LTD "
                     f"[2, {LAYERS}, chunk, {KV_HEADS * HEAD_DIM}] per chunk")
    out["notes"] = " | ".join([
        "timed regions, connector shim and caveats: module docstring",
        "ratio = kvdepot bytes/s / LMCache bytes/s per pass (LMCache s / "
        f"kvdepot s); {WARMUP} untimed warm-up pass; fresh tokens per pass; "
        "all retrieved bytes verified, untimed",
        "LMCache: lookup(pin)+store and lookup(pin)+retrieve+lookup_unpin "
        "through VLLMPagedMemGPUConnectorV2 with CPU stub streams and host "
        "pointers; copies on LMCache's torch fallback "
        "(torch_ops.multi_layer_kv_transfer), not its CUDA kernel",
        "kvdepot: leader match..request_finished + worker bind..wait_for_save "
        f"+ report; prompt T+1 tokens, T moved; {kv.arena_mib} MiB arena, "
        "prefaulted",
        "stock LMCache connectors here: " + "; ".join(
            lmc.stock_errors if lmc else ["not tried"])])
    return out


def run(tokens: int, passes: int, threads: int) -> dict:
    if tokens <= 0 or tokens % BLOCK:
        raise ValueError(f"--tokens {tokens}: a positive multiple of {BLOCK}")
    torch.set_num_threads(threads)
    caches = _caches(tokens // BLOCK)
    kv = KvdepotSide(tokens, caches, threads, WARMUP + passes)
    lmc, error = None, LMCACHE_IMPORT_ERROR
    try:
        if error is None:
            try:
                lmc = LMCacheSide(tokens, caches)
            except Exception as e:
                error = f"engine setup: {type(e).__name__}: {e}"
        times, pass_error = _run_passes(kv, lmc, tokens, passes)
        return _result(tokens, threads, times, lmc, kv, error or pass_error)
    finally:
        kv.close()
        if lmc is not None:
            lmc.close()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=TOKENS)
    parser.add_argument("--passes", type=int, default=PASSES)
    parser.add_argument("--threads", type=int, default=THREADS)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.tokens, args.passes, args.threads)))


if __name__ == "__main__":
    main(sys.argv[1:])
