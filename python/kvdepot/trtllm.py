"""kvdepot as a TensorRT-LLM KV-cache connector (PyTorch backend).

    kv_connector_config:
      connector_module: kvdepot.trtllm
      connector_scheduler_class: KvdepotScheduler
      connector_worker_class: KvdepotWorker

Written against TensorRT-LLM's classic connector API
(tensorrt_llm/_torch/pyexecutor/kv_cache_connector.py, the 1.1 and 1.2
releases); docs/trtllm.md says what was run against TensorRT-LLM's own code.

TensorRT-LLM's KvCacheConnectorConfig is a strict model (module and class
names only), so kvdepot's settings come from KVDEPOT_CONFIG: a JSON object,
or the path of a JSON or YAML file, with the keys of docs/vllm.md's table
plus the model's shape when llm_args.model is not a directory with a Hugging
Face config.json: num_layers, num_kv_heads (all of the model's), head_dim,
dtype. The block size is llm_args.kv_cache_config.tokens_per_block (32 when
unset), the KV dtype kv_cache_config.dtype ("fp8": float8_e4m3fn, moved as
bytes).

How TensorRT-LLM's API shapes this module:
- Request ids are ints; there is no "retry later" (the leader runs with
  no_retry); update_state_after_alloc does not say how many tokens the
  engine took (the matched count is remembered); request_finished answers a
  bool; the layer hooks get a layer index and a stream.
- The KV pool is one block-major tensor [blocks, layers, kv, block bytes]
  whose rows are [head][token][dim] (KVBlockArray::getKVLocalIdx).
- There is no channel for a failed load (vLLM's invalid_block_ids). Every
  load is therefore asynchronous: TensorRT-LLM holds the request until all
  ranks report its blocks in place, and runs nothing on them before. A block
  that could not be loaded is known to every rank by then (the ranks'
  reports are gathered over TensorRT-LLM's MPI session in get_finished); the
  leader names the request in the plan of the step that would first compute
  it, and every rank raises KvdepotLoadError before layer 0, so the step ends
  with that error (TensorRT-LLM's _forward_step answers its requests with
  it) and nothing is computed on stale blocks. The failed objects are gone
  from the store, so the request sent again recomputes them.
- Tensor parallelism: the leader runs on rank 0, a worker on every rank;
  with shared_objects (the default) the ranks write their heads into one
  object per block, published when every rank's part is in, under a
  namespace that names no TP size (an engine of any TP size loads it);
  without, each rank stores its shard of the heads under its own namespace,
  and a block matches only when every rank's shard is stored (all or
  nothing either way).
  Several ranks share no embedded store: store_mode "auto" starts (or joins)
  the engine's own kvdepotd, as with vLLM.
- async_saves: TensorRT-LLM runs a connector only under the capacity
  scheduler policy GUARANTEED_NO_EVICT (py_executor_creator refuses any
  other), so a request's blocks are freed only when it ends, and
  request_finished answering True keeps them until every rank's get_finished
  names it. A request is named only once no save of it is in flight.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Dict, List, Tuple

from kvdepot import _lib, _spawn, config
from kvdepot._shared import (_DEVICE_HOST, _DTYPES, _FP8_DTYPES, _KVD_DTYPES,
                             _dtype_name, _store_acquire, _store_release,
                             _stream_of, _worker_device)

log = logging.getLogger("kvdepot.trtllm")

try:
    from tensorrt_llm._torch.pyexecutor.kv_cache_connector import (
        KvCacheConnectorScheduler, KvCacheConnectorWorker)
    from tensorrt_llm._utils import mpi_allgather, mpi_rank
    HAVE_TRTLLM = True
except ImportError:
    HAVE_TRTLLM = False

    class KvCacheConnectorScheduler:
        """Stand-in for TensorRT-LLM's leader base class."""

        def __init__(self, llm_args):
            self._llm_args = llm_args

    class KvCacheConnectorWorker:
        """Stand-in for TensorRT-LLM's worker base class."""

        def __init__(self, llm_args):
            self._llm_args = llm_args
            self._metadata = None

        def bind_connector_meta(self, metadata):
            self._metadata = metadata

        def get_connector_meta(self):
            return self._metadata

        def register_forward_pass_callable(self):
            return None

    def mpi_rank():
        return 0

    def mpi_allgather(obj):
        return [obj]


SHAPE_KEYS = ("num_layers", "num_kv_heads", "head_dim", "dtype")
# TensorRT-LLM's kv_cache_config.dtype -> the KV cache's dtype.
_KV_CACHE_DTYPES = {"fp8": "float8_e4m3fn"}
# KVCacheManager's BAD_PAGE_INDEX: no page at this position (sliding window).
_BAD_PAGE = -1


class KvdepotLoadError(RuntimeError):
    """Blocks promised to a request could not be loaded: the step that
    would compute on them stops before its first layer."""


class KvdepotTrtMetadata:
    """One iteration's plan (packed StepPlan), broadcast to the ranks, with
    the requests whose blocks the engine kept for saves (`kept`) and those
    whose promised blocks failed to load (`failed`: id -> reason)."""

    def __init__(self, plan=b"", kept=(), failed=None, answered=()):
        self.plan = bytes(plan)
        self.kept = sorted(kept)
        self.failed = dict(failed or {})
        # Requests this iteration answers whose KV another engine loads
        # next (_answers_once): their saves are committed before it ends.
        self.answered = sorted(answered)


# What rank 0's worker gathered from every rank, for the scheduler of the
# same process (the leader runs on rank 0 only): engine key -> [reports,
# failed loads].
_inbox = {}


def _rank():
    """This process's rank in TensorRT-LLM's MPI session."""
    return mpi_rank()


def _allgather(obj):
    """obj from every rank, in rank order (TensorRT-LLM's mpi_allgather; a
    collective: every rank calls it at the same point)."""
    return mpi_allgather(obj)


def _read_settings():
    raw = os.environ.get("KVDEPOT_CONFIG", "").strip()
    if raw.startswith("{"):
        return json.loads(raw)
    if not raw:
        return {}
    path = Path(raw)
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml  # TensorRT-LLM depends on PyYAML
        out = yaml.safe_load(text) or {}
    else:
        out = json.loads(text)
    if not isinstance(out, dict):
        raise ValueError(f"kvdepot: {raw}: a mapping of settings, not "
                         f"{type(out).__name__}")
    return out


def _parallel(llm_args):
    """(tp, pp): refuses what TensorRT-LLM's connector does not run."""
    pc = getattr(llm_args, "parallel_config", None)

    def size(name, alt):
        v = getattr(llm_args, name, None)
        if v is None and pc is not None:
            v = getattr(pc, alt, None)
        return int(v or 1)

    tp = size("tensor_parallel_size", "tp_size")
    pp = size("pipeline_parallel_size", "pp_size")
    cp = size("context_parallel_size", "cp_size")
    if pp > 1:
        raise ValueError("kvdepot: pipeline parallelism: TensorRT-LLM's KV "
                         "cache connector does not support it")
    if cp > 1:
        raise ValueError("kvdepot: context parallelism splits a request's "
                         "tokens over ranks; not supported")
    if getattr(llm_args, "enable_attention_dp", False):
        raise ValueError("kvdepot: attention data parallelism "
                         "(enable_attention_dp) is not supported")
    return tp, pp


def _async_saves_refused(llm_args):
    """Why saves cannot outlive their step in this engine, or None. A
    finished request's blocks must stay until its commits: TensorRT-LLM
    keeps them while request_finished says so, but not under a capacity
    scheduler policy other than GUARANTEED_NO_EVICT (it pauses requests),
    nor with its own cache transceiver (some releases then free them
    whatever request_finished answered)."""
    sc = getattr(llm_args, "scheduler_config", None)
    policy = getattr(sc, "capacity_scheduler_policy", None)
    name = getattr(policy, "name", None) or (str(policy) if policy else "")
    if name and "GUARANTEED_NO_EVICT" not in name.upper():
        return (f"needs the capacity scheduler policy GUARANTEED_NO_EVICT "
                f"(this engine's is {name}): a paused request's blocks "
                f"would go to another request before its commit")
    ctc = getattr(llm_args, "cache_transceiver_config", None)
    if ctc is not None and getattr(ctc, "backend", None) is not None:
        return ("is not used with TensorRT-LLM's cache transceiver "
                "(cache_transceiver_config.backend): the engine may free a "
                "finished request's blocks before its commit")
    return None


def _answers_once(request):
    """True for a request that ends with its context phase, whose KV another
    engine loads next: a context-only request of TensorRT-LLM's own
    disaggregated mode, or one of max_new_tokens 1 (the router's request to
    a context engine, docs/trtllm.md)."""
    return bool(getattr(request, "is_context_only_request", False)) or \
        getattr(request, "max_new_tokens", None) == 1


def _kv_dtype(llm_args, model_dtype):
    kvc = getattr(llm_args, "kv_cache_config", None)
    want = str(getattr(kvc, "dtype", None) or "auto")
    if want == "auto":
        return model_dtype
    if want in _KV_CACHE_DTYPES:
        return _KV_CACHE_DTYPES[want]
    if want in _DTYPES:
        return want
    raise ValueError(f"kvdepot: KV cache dtype {want!r} not supported "
                     f"(auto, fp8, {', '.join(_DTYPES)})")


class _Model:
    """What the settings and llm_args say about the model and the rank."""

    def __init__(self, llm_args, rank):
        extra = _read_settings()
        shape = {k: extra.pop(k) for k in SHAPE_KEYS if k in extra}
        self.mla = bool(extra.pop("mla", False))
        self.pool_layout = extra.pop("pool_layout", "block_first")
        if self.pool_layout not in ("block_first", "layer_first"):
            raise ValueError(f"kvdepot: pool_layout {self.pool_layout!r}: "
                             "block_first or layer_first")
        model = Path(str(getattr(llm_args, "model", "")))
        hf = model / "config.json"
        if hf.is_file():
            c = json.loads(hf.read_text())
            heads = c.get("num_attention_heads")
            if c.get("kv_lora_rank"):  # MLA: one latent per token
                self.mla = True
                shape.setdefault("num_kv_heads", 1)
                shape.setdefault("head_dim", c["kv_lora_rank"] +
                                 c.get("qk_rope_head_dim", 0))
            shape.setdefault("num_layers", c.get("num_hidden_layers"))
            shape.setdefault("num_kv_heads",
                             c.get("num_key_value_heads", heads))
            shape.setdefault("head_dim", c.get("head_dim") or
                             (c["hidden_size"] // heads if heads else None))
            shape.setdefault("dtype", c.get("torch_dtype", "float16"))
        missing = [k for k in SHAPE_KEYS if not shape.get(k)]
        if missing:
            raise ValueError(f"kvdepot: the model's {missing} are unknown: "
                             "put them in KVDEPOT_CONFIG or point "
                             "llm_args.model at a directory with config.json")
        if shape["dtype"] not in _DTYPES:
            raise ValueError(f"kvdepot: dtype {shape['dtype']!r} not "
                             "supported")
        self.settings = config.parse(extra)
        why = _async_saves_refused(llm_args)
        if why and self.settings.async_saves:
            if "async_saves" in extra:
                raise ValueError(f"kvdepot: async_saves {why}")
            log.info("kvdepot: saves end at wait_for_save (async_saves "
                     "%s)", why)
            self.settings.async_saves = False
        self.tp, _ = _parallel(llm_args)
        self.rank = rank
        self.tp_rank = rank % self.tp
        self.dtype = _kv_dtype(llm_args, shape["dtype"])
        ck, cv = (_lib.codec_id(c) for c in self.settings.codecs)
        if self.dtype in _FP8_DTYPES and self.settings.codecs != ("raw",
                                                                  "raw"):
            raise ValueError(f"kvdepot: an {self.dtype} KV cache is moved "
                             "as bytes: codecs must be raw")
        self.codecs = (ck, cv)
        total = int(shape["num_kv_heads"])
        # TensorRT-LLM splits the KV heads over the ranks (each rank holds
        # one when there are fewer heads than ranks); MLA latents are whole
        # on every rank.
        self.num_kv_heads = 1 if self.mla else max(1, total // self.tp)
        self.total_kv_heads = total
        # shared_objects: the ranks write their heads into one object per
        # block (a namespace naming every head and no rank), which an engine
        # of any TP size loads; MLA is shared anyway (one part).
        self.shared = self.mla or (self.tp > 1 and
                                   self.settings.shared_objects)
        self.num_layers = int(shape["num_layers"])
        self.head_dim = int(shape["head_dim"])
        kvc = getattr(llm_args, "kv_cache_config", None)
        self.block_size = getattr(kvc, "tokens_per_block", None) or \
            getattr(llm_args, "tokens_per_block", None) or 32
        self.model_id = self.settings.model_id or \
            str(getattr(llm_args, "model", "trtllm"))
        self.revision = getattr(llm_args, "revision", None)
        # MLA latents are the same on every rank, and shared objects hold
        # every rank's heads: one namespace, one object per block, loadable
        # at any TP size.
        self.ns_all = [self._ns(r) for r in range(1 if self.shared else
                                                  self.tp)]
        if self.shared:
            self.ns_all *= self.tp
        self.ns = self.ns_all[self.tp_rank]
        self.store_mode = config.engine_store_mode(self.settings, self.tp)

    def _ns(self, tp_rank):
        ck, cv = self.codecs
        heads = self.num_kv_heads
        if self.shared and not self.mla:
            heads = self.total_kv_heads
        return _lib.namespace(self.model_id, _DTYPES[self.dtype], ck, cv,
                              self.num_layers, heads,
                              self.head_dim, self.block_size,
                              tp_size=1 if self.shared else self.tp,
                              tp_rank=0 if self.shared else tp_rank,
                              kv_combined=self.mla, tq_seed=_lib.TQ_SEED,
                              revision=self.revision)

    def head_range(self):
        """(object_heads, head_start) of this rank in a shared object, (0,
        0) when objects are not shared or hold one part (MLA); the split is
        _lib.head_range's."""
        if self.mla or not self.shared:
            return 0, 0
        return (self.total_kv_heads,
                _lib.head_range(self.total_kv_heads, self.tp, self.tp_rank)[1])

    def open_store(self):
        """(store key, store, daemon handle or None)."""
        if self.store_mode == "spawn":
            key = _spawn.engine_key("", self.settings)
            handle, (skey, store) = _spawn.attach(self.settings, key,
                                                  _store_acquire)
            return skey, store, handle
        skey, store = _store_acquire(config.store_settings(self.settings))
        return skey, store, None


def _tokens(request):
    get = getattr(request, "get_tokens", None)
    return list(get(0)) if callable(get) else list(request.tokens)


def _blocks(ids):
    return [_lib.NO_BLOCK if int(b) == _BAD_PAGE else int(b)
            for b in ids or ()]


def _salt(request):
    """The request's cache salt: LlmRequest.cache_salt_id (TensorRT-LLM's
    C++ request carries the salt as a 64-bit id), or a cache_salt string."""
    salt = getattr(request, "cache_salt", None)
    if salt:
        return str(salt)
    sid = getattr(request, "cache_salt_id", None)
    return None if sid is None else f"trtllm-salt-id:{int(sid)}"


def _mm_inputs(request):
    """(identifier, offset, length) of the request's multimodal items, as
    vLLM's connector gives them (None when the request has none)."""
    hashes = getattr(request, "multimodal_hashes", None)
    pos = getattr(request, "multimodal_positions", None)
    lens = getattr(request, "multimodal_lengths", None)
    if not hashes:
        return ()
    if pos is None or lens is None or len(pos) != len(hashes) or \
            len(lens) != len(hashes):
        raise ValueError("multimodal inputs without positions and lengths")
    items = []
    for h, o, n in zip(hashes, pos, lens):
        ident = h if isinstance(h, str) else \
            "".join(f"{int(x) & 0xffffffff:08x}" for x in h)
        items.append((ident, int(o), int(n)))
    return sorted(items, key=lambda t: t[1])


class KvdepotScheduler(KvCacheConnectorScheduler):
    """The leader (rank 0)."""

    def __init__(self, llm_args):
        super().__init__(llm_args)
        m = _Model(llm_args, 0)
        self.model, self.settings = m, m.settings
        self.block_size = m.block_size
        self._store_key, store, self.daemon = m.open_store()
        self._inbox_key = self._store_key
        self.leader = _lib.Leader(
            store, m.block_size, m.ns, num_workers=m.tp,
            shard_ns=[] if m.shared else m.ns_all[1:],
            layerwise=self.settings.layerwise,
            lookup_timeout_ms=self.settings.lookup_timeout_ms, no_retry=True,
            async_host_loads=True)
        self._matched = {}
        self._kept = set()      # request_finished said True: for the plan
        self._failed = {}       # request id -> why its load failed
        self._answers = {}      # id -> prompt length (_answers_once)
        log.info("kvdepot: TensorRT-LLM connector, %s store, TP %d",
                 m.store_mode, m.tp)

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int
                                   ) -> Tuple[int, bool]:
        rid = str(request.request_id)
        try:
            r = self.leader.match(rid, _tokens(request), num_computed_tokens,
                                  cache_salt=_salt(request),
                                  mm_inputs=_mm_inputs(request))
        except (_lib.KvdepotError, ValueError) as e:
            log.warning("kvdepot: request %s: %s; computing it", rid, e)
            r = (0, False)
        matched, _ = r if r is not None else (0, False)
        self._matched[rid] = matched
        if _answers_once(request):
            n = getattr(request, "prompt_len", None)
            self._answers[rid] = n if n is not None else \
                len(_tokens(request))
        # Every load is asynchronous (the module's docstring says why).
        return matched, matched > 0

    def update_state_after_alloc(self, request: Any,
                                 block_ids: List[int]) -> None:
        rid = str(request.request_id)
        self.leader.update_state_after_alloc(rid, _blocks(block_ids),
                                             self._matched.pop(rid, 0))

    def _take_inbox(self):
        reports, failed = _inbox.pop(self._inbox_key, ([], []))
        for report in reports:
            try:
                self.leader.update_connector_output(report)
            except _lib.KvdepotError as e:
                log.warning("kvdepot: worker report refused: %s", e)
        for rid, block, status in failed:
            self._failed.setdefault(
                rid, f"block {block} could not be loaded ({status})")
        self.leader.take_failed_blocks()
        self.leader.take_finished_loads()

    def build_connector_meta(self, scheduler_output: Any
                             ) -> KvdepotTrtMetadata:
        self._take_inbox()
        failed, answered = {}, []
        for rd in scheduler_output.new_requests:
            rid = str(rd.request_id)
            if rid in self._failed:
                failed[rid] = self._failed.pop(rid)
            computed = rd.computed_position + rd.num_scheduled_tokens
            self.leader.request_scheduled(rid, [], [], computed)
            if computed >= self._answers.get(rid, computed + 1):
                answered.append(rid)
        for rd in scheduler_output.cached_requests:
            rid = str(rd.request_id)
            if rid in self._failed:
                failed[rid] = self._failed.pop(rid)
            computed = rd.computed_position + rd.num_scheduled_tokens
            self.leader.request_scheduled(
                rid, _blocks(rd.new_block_ids), list(rd.new_tokens or []),
                computed)
            if computed >= self._answers.get(rid, computed + 1):
                answered.append(rid)
        kept, self._kept = self._kept, set()
        return KvdepotTrtMetadata(self.leader.build_connector_meta(), kept,
                                  failed, answered)

    def request_finished(self, request: Any,
                         cache_block_ids: List[int]) -> bool:
        rid = str(request.request_id)
        self._matched.pop(rid, None)
        self._failed.pop(rid, None)
        self._answers.pop(rid, None)
        keep = self.leader.request_finished(rid)
        if keep:
            self._kept.add(rid)
        return keep

    def shutdown(self) -> None:
        if self.leader is not None:
            self.leader.close()
            self.leader = None
            _store_release(self._store_key)
            _inbox.pop(self._inbox_key, None)


class KvdepotWorker(KvCacheConnectorWorker):
    """The copies, on every rank."""

    def __init__(self, llm_args):
        super().__init__(llm_args)
        m = _Model(llm_args, _rank())
        self.model, self.settings = m, m.settings
        self.shape = {"num_layers": m.num_layers,
                      "num_kv_heads": m.num_kv_heads,
                      "head_dim": m.head_dim, "dtype": m.dtype}
        self.block_size, self.codecs, self.ns = m.block_size, m.codecs, m.ns
        self.rank = m.rank
        self._store_key, self.store, self.daemon = m.open_store()
        self.worker = None
        self._pool = None
        self._device = _DEVICE_HOST  # the pool's (register_kv_caches)
        self._loaded = set()  # asynchronous loads done, not yet reported
        self._loading = set()  # passed as started loading, not reported
        self._kept = set()    # kept for saves, by a plan bound here
        self._finished = set()  # finished by the engine, not yet reported
        self._failed = {}     # this step's requests whose loads failed
        self._answered = ()   # this step answers them (the plan's)

    def register_kv_caches(self, kv_cache_tensor: Any) -> None:
        """The block-first pool [blocks, layers, kv, heads*block*dim]
        (TensorRT-LLM's get_unique_primary_pool), or its 6-dimensional view
        [blocks, layers, kv, heads, block, dim]; with the setting
        pool_layout "layer_first", the same with blocks and layers swapped
        ([layers, blocks, ...]). kv is 2 (K and V), or 1 for MLA's
        latents."""
        t = kv_cache_tensor
        device = _worker_device(t, "KV pool")
        e = t.element_size()
        heads, dim, bs = (self.shape["num_kv_heads"], self.shape["head_dim"],
                          self.block_size)
        layers = self.shape["num_layers"]
        planes = 1 if self.model.mla else 2
        lf = self.model.pool_layout == "layer_first"
        dl, db = (0, 1) if lf else (1, 0)
        if t.dim() not in (4, 6) or t.shape[dl] != layers or \
                t.shape[2] != planes:
            want = f"[{layers}, blocks, {planes}, ...]" if lf else \
                f"[blocks, {layers}, {planes}, ...]"
            raise ValueError(f"kvdepot: pool of shape {tuple(t.shape)}, want "
                             f"{want} (pool_layout "
                             f"{self.model.pool_layout})")
        want = self.shape["dtype"]
        got = _dtype_name(t.dtype)
        if got != want and not (want in _FP8_DTYPES and e == 1):
            raise ValueError(f"kvdepot: pool of {got}, the model's KV cache "
                             f"is {want}")
        if t.dim() == 4:
            if t.shape[3] != bs * heads * dim:
                raise ValueError(f"kvdepot: pool rows of {t.shape[3]} "
                                 f"elements, want {heads}*{bs}*{dim}")
            # A row is [head][token][dim] (KVBlockArray::getKVLocalIdx).
            if t.stride(3) != 1:
                raise ValueError("kvdepot: pool rows must be contiguous")
            token, head = dim * e, bs * dim * e
        else:
            if tuple(t.shape[3:]) != (heads, bs, dim) or t.stride(5) != 1:
                raise ValueError(f"kvdepot: pool of shape {tuple(t.shape)}, "
                                 f"want [..., {heads}, {bs}, {dim}] with "
                                 "contiguous heads")
            token, head = t.stride(4) * e, t.stride(3) * e
        fmt = _lib.ObjectFormat(dtype=_KVD_DTYPES[want],
                                num_layers=layers, num_planes=planes,
                                num_heads=heads, head_dim=dim,
                                block_size=bs, tq_seed=_lib.TQ_SEED)
        fmt.codec[0], fmt.codec[1] = self.codecs
        # Not layerwise_saves: the layer hooks do not run in a CUDA graph's
        # replay, so wait_for_save copies the layers they did not save.
        # The leader names blocks in rank 0's namespace; each rank stores
        # and loads its heads of the one object (shared_objects), or its
        # shard in a namespace of its own.
        object_heads, head_start = self.model.head_range()
        self.worker = _lib.Worker(
            self.store, self.ns, fmt, rank=self.rank,
            threads=self.settings.threads, device=device,
            plan_ns=self.model.ns_all[0] if self.model.tp > 1 else None,
            object_heads=object_heads, head_start=head_start,
            async_saves=self.settings.async_saves,
            max_inflight_save_bytes=self.settings.max_inflight_save_bytes,
            **config.worker_cuda(self.settings))
        self._device = device
        # The worker copies to and from the pool's memory: keep it alive.
        self._pool = t
        layer = t.stride(dl) * e
        bases = [t.data_ptr() + i * layer for i in range(layers)]
        strides = (t.stride(2) * e, t.stride(db) * e, token, head)
        self.worker.register_kv_caches(bases, t.shape[db], strides)

    def bind_connector_meta(self, metadata: KvdepotTrtMetadata) -> None:
        super().bind_connector_meta(metadata)
        # When the forward pass raised, TensorRT-LLM's _forward_step skipped
        # wait_for_save: the step still bound is then aborted here (the C
        # worker commits only at wait_for_save), never committed with the
        # layers the pass did not reach.
        self.worker.bind_metadata(metadata.plan)
        self._kept.update(getattr(metadata, "kept", ()))
        self._failed = dict(getattr(metadata, "failed", {}) or {})
        self._answered = tuple(getattr(metadata, "answered", ()))

    # TensorRT-LLM hands each call the torch.cuda.Stream the forward pass
    # runs on; the CUDA backend orders its copies on it (worker.h).
    def start_load_kv(self, stream: Any) -> None:
        self.worker.start_load_kv(_stream_of(self._device, stream))

    def wait_for_layer_load(self, layer_idx: int, stream: Any) -> None:
        if self._failed:
            # Every rank raises here, before the first layer's work (and its
            # collectives): the step ends with this error on all of them.
            why = "; ".join(f"request {r}: {w}"
                            for r, w in sorted(self._failed.items()))
            raise KvdepotLoadError(f"kvdepot: KV promised to the step could "
                                   f"not be loaded ({why}); sent again, the "
                                   f"request computes it")
        self.worker.wait_for_layer_load(layer_idx,
                                        _stream_of(self._device, stream))

    def save_kv_layer(self, layer_idx: int, stream: Any) -> None:
        self.worker.save_kv_layer(layer_idx, _stream_of(self._device, stream))

    def wait_for_save(self, stream: Any) -> None:
        self.worker.wait_for_save(_stream_of(self._device, stream))
        self.worker.clear_metadata()
        # With async_saves: a request this step answers is loaded by another
        # engine next, so its objects are committed before the answer
        # leaves (this rank's part; docs/trtllm.md says what TP > 1 adds).
        if any(self.worker.request_saving(r) for r in self._answered):
            self.worker.flush_saves()
        self._answered = ()

    def get_finished(self, finished_gen_req_ids: List[int],
                     started_loading_req_ids: List[int]
                     ) -> Tuple[List[int], List[int]]:
        """(saved, loaded) among the ids TensorRT-LLM passed, now or
        before. Called by every rank at the same point of each iteration:
        the ranks' reports and failed loads are gathered here for the
        leader (rank 0)."""
        finished = [str(i) for i in finished_gen_req_ids]
        self._finished.update(finished)
        _, loading, failed, report = self.worker.get_finished(finished)
        gathered = _allgather((report, failed))
        if self.rank == 0:
            box = _inbox.setdefault(self._store_key, ([], []))
            for r, f in gathered:
                if r:
                    box[0].append(r)
                box[1].extend(f)
        self._loaded.update(rid for rid, is_async in loading if is_async)
        # A request whose blocks TensorRT-LLM kept for us is saved once a
        # plan naming it was bound here (its step's wait_for_save has run by
        # now) and no save of it is in flight (async_saves: the committer
        # commits after the step). TensorRT-LLM accepts only ids it passed.
        sending = {r for r in self._kept & self._finished
                   if not self.worker.request_saving(r)}
        self._kept -= sending
        self._finished -= sending
        # TensorRT-LLM passes a load's id once, when it starts.
        self._loading.update(str(i) for i in started_loading_req_ids)
        recving = self._loading & self._loaded
        self._loading -= recving
        self._loaded -= recving
        return ([int(i) for i in sorted(sending)],
                [int(i) for i in sorted(recving)])

    def kvdepot_stats(self) -> Dict[str, int]:
        return self.worker.stats() if self.worker else {}

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        self._pool = None
        if self.store is not None:
            _store_release(self._store_key)
            self.store = None
