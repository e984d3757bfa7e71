"""kvdepot as a TensorRT-LLM KV-cache connector (PyTorch backend).

    kv_connector_config:
      connector_module: kvdepot.trtllm
      connector_scheduler_class: KvdepotScheduler
      connector_worker_class: KvdepotWorker

TensorRT-LLM's connector config has no free-form options, so the settings
come from the environment: KVDEPOT_CONFIG holds a JSON object (or the path
of a JSON file) with the keys of docs/vllm.md's table plus the model's
shape when llm_args.model is not a directory with a Hugging Face
config.json: num_layers, num_kv_heads, head_dim, dtype ("float16" or
"bfloat16"). The block size is llm_args.kv_cache_config.tokens_per_block
(32 when unset).

Differences from vLLM that shape this module: request ids are ints; there
is no "retry later" (the leader runs with no_retry, so a block another
request is loading is simply not promised); update_state_after_alloc does
not say how many tokens the engine took (the matched count is remembered);
request_finished returns a bool; the layer hooks get a layer index and a
stream; the KV cache is one block-major pool [blocks, layers, kv,
tokens_per_block * heads * head_dim]; and there is no worker-to-leader
channel besides finished ids, so in this single-process (embedded store)
mode the worker hands its reports to the scheduler in the process.
"""

import json
import logging
import os
from pathlib import Path

from kvdepot import _lib, config
from kvdepot._shared import (_DEVICE_HOST, _DTYPES, _KVD_DTYPES,
                             _store_acquire, _store_release, _stream_of,
                             _worker_device)

log = logging.getLogger("kvdepot.trtllm")

try:
    from tensorrt_llm._torch.pyexecutor.kv_cache_connector import (
        KvCacheConnectorScheduler, KvCacheConnectorWorker)
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


SHAPE_KEYS = ("num_layers", "num_kv_heads", "head_dim", "dtype")

# Reports a worker made, for the scheduler of the same process and store.
_reports = {}


class KvdepotTrtMetadata:
    """One iteration's plan (packed StepPlan), broadcast to the ranks."""

    def __init__(self, plan=b""):
        self.plan = bytes(plan)


def _settings(llm_args):
    raw = os.environ.get("KVDEPOT_CONFIG", "").strip()
    extra = {}
    if raw.startswith("{"):
        extra = json.loads(raw)
    elif raw:
        extra = json.loads(Path(raw).read_text())
    shape = {k: extra.pop(k) for k in SHAPE_KEYS if k in extra}
    model = Path(str(getattr(llm_args, "model", "")))
    hf = model / "config.json"
    if hf.is_file():
        c = json.loads(hf.read_text())
        heads = c.get("num_attention_heads")
        shape.setdefault("num_layers", c.get("num_hidden_layers"))
        shape.setdefault("num_kv_heads", c.get("num_key_value_heads", heads))
        shape.setdefault("head_dim", c.get("head_dim") or
                         (c["hidden_size"] // heads if heads else None))
        shape.setdefault("dtype", c.get("torch_dtype", "float16"))
    missing = [k for k in SHAPE_KEYS if not shape.get(k)]
    if missing:
        raise ValueError(f"kvdepot: the model's {missing} are unknown: put "
                         "them in KVDEPOT_CONFIG or point llm_args.model at a "
                         "directory with config.json")
    if shape["dtype"] not in _DTYPES:
        raise ValueError(f"kvdepot: dtype {shape['dtype']!r} not supported")
    kvc = getattr(llm_args, "kv_cache_config", None)
    block = getattr(kvc, "tokens_per_block", None) or \
        getattr(llm_args, "tokens_per_block", None) or 32
    s = config.parse(extra)
    model_id = s.model_id or str(getattr(llm_args, "model", "trtllm"))
    ck, cv = (_lib.codec_id(c) for c in s.codecs)
    ns = _lib.namespace(model_id, _DTYPES[shape["dtype"]], ck, cv,
                        shape["num_layers"], shape["num_kv_heads"],
                        shape["head_dim"], block, tq_seed=_lib.TQ_SEED,
                        revision=getattr(llm_args, "revision", None))
    return s, shape, block, (ck, cv), ns


def _tokens(request):
    get = getattr(request, "get_tokens", None)
    return list(get(0)) if callable(get) else list(request.tokens)


class KvdepotScheduler(KvCacheConnectorScheduler):
    """The leader (rank 0)."""

    def __init__(self, llm_args):
        super().__init__(llm_args)
        self.settings, self.shape, self.block_size, _, ns = \
            _settings(llm_args)
        self._store_key, store = _store_acquire(
            config.store_settings(self.settings))
        self.leader = _lib.Leader(store, self.block_size, ns,
                                  layerwise=self.settings.layerwise,
                                  lookup_timeout_ms=self.settings
                                  .lookup_timeout_ms, no_retry=True)
        self._matched = {}

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        rid = str(request.request_id)
        try:
            r = self.leader.match(rid, _tokens(request), num_computed_tokens,
                                  cache_salt=getattr(request, "cache_salt",
                                                     None))
        except _lib.KvdepotError as e:
            log.warning("kvdepot: request %s: %s; computing it", rid, e)
            r = (0, False)
        matched, is_async = r if r is not None else (0, False)
        self._matched[rid] = matched
        return matched, is_async and matched > 0

    def update_state_after_alloc(self, request, block_ids):
        rid = str(request.request_id)
        self.leader.update_state_after_alloc(rid, list(block_ids),
                                             self._matched.pop(rid, 0))

    def build_connector_meta(self, scheduler_output):
        for report in _reports.pop(self._store_key, []):
            try:
                self.leader.update_connector_output(report)
            except _lib.KvdepotError as e:
                log.warning("kvdepot: worker report refused: %s", e)
        self.leader.take_failed_blocks()
        self.leader.take_finished_loads()
        for rd in scheduler_output.new_requests:
            self.leader.request_scheduled(
                str(rd.request_id), [], [],
                rd.computed_position + rd.num_scheduled_tokens)
        for rd in scheduler_output.cached_requests:
            self.leader.request_scheduled(
                str(rd.request_id), list(rd.new_block_ids or []),
                list(rd.new_tokens or []),
                rd.computed_position + rd.num_scheduled_tokens)
        return KvdepotTrtMetadata(self.leader.build_connector_meta())

    def request_finished(self, request, cache_block_ids):
        return self.leader.request_finished(str(request.request_id))

    def shutdown(self):
        if self.leader is not None:
            self.leader.close()
            self.leader = None
            _store_release(self._store_key)


class KvdepotWorker(KvCacheConnectorWorker):
    """The copies, on every rank (one rank with the embedded store)."""

    def __init__(self, llm_args):
        super().__init__(llm_args)
        self.settings, self.shape, self.block_size, self.codecs, self.ns = \
            _settings(llm_args)
        self._store_key, self.store = _store_acquire(
            config.store_settings(self.settings))
        self.worker = None
        self._device = _DEVICE_HOST  # the pool's (register_kv_caches)
        self._loaded = set()  # asynchronous loads done, not yet reported

    def register_kv_caches(self, kv_cache_tensor):
        """The block-major pool [blocks, layers, kv, block*heads*dim] (or
        its 6-dimensional view [blocks, layers, kv, block, heads, dim])."""
        t = kv_cache_tensor
        device = _worker_device(t, "KV pool")
        e = t.element_size()
        heads, dim = self.shape["num_kv_heads"], self.shape["head_dim"]
        if t.dim() not in (4, 6) or t.shape[1] != self.shape["num_layers"]:
            raise ValueError(f"kvdepot: pool of shape {tuple(t.shape)}, want "
                             f"[blocks, {self.shape['num_layers']}, kv, ...]")
        if t.dim() == 4 and t.shape[3] != self.block_size * heads * dim:
            raise ValueError(f"kvdepot: pool rows of {t.shape[3]} elements, "
                             f"want {self.block_size}*{heads}*{dim}")
        planes = t.shape[2]
        fmt = _lib.ObjectFormat(dtype=_KVD_DTYPES[self.shape["dtype"]],
                                num_layers=t.shape[1], num_planes=planes,
                                num_heads=heads, head_dim=dim,
                                block_size=self.block_size,
                                tq_seed=_lib.TQ_SEED)
        fmt.codec[0], fmt.codec[1] = self.codecs
        # Not layerwise_saves: the layer hooks do not run in a CUDA graph's
        # replay, so wait_for_save copies the layers they did not save.
        self.worker = _lib.Worker(self.store, self.ns, fmt,
                                  threads=self.settings.threads,
                                  device=device)
        self._device = device
        layer = t.stride(1) * e
        bases = [t.data_ptr() + i * layer for i in range(t.shape[1])]
        # Inside a row: [token][head][dim], the per-layer Python view's order.
        strides = (t.stride(2) * e, t.stride(0) * e, heads * dim * e, dim * e)
        self.worker.register_kv_caches(bases, t.shape[0], strides)

    def bind_connector_meta(self, metadata):
        super().bind_connector_meta(metadata)
        # When the forward pass raised, TensorRT-LLM's _forward_step skipped
        # wait_for_save: the step still bound is then aborted here (the C
        # worker commits only at wait_for_save), never committed with the
        # layers the pass did not reach.
        self.worker.bind_metadata(metadata.plan)

    # TensorRT-LLM hands each call the torch.cuda.Stream the forward pass
    # runs on; the CUDA backend orders its copies on it (worker.h).
    def start_load_kv(self, stream):
        self.worker.start_load_kv(_stream_of(self._device, stream))

    def wait_for_layer_load(self, layer_idx, stream):
        self.worker.wait_for_layer_load(layer_idx,
                                        _stream_of(self._device, stream))

    def save_kv_layer(self, layer_idx, stream):
        self.worker.save_kv_layer(layer_idx, _stream_of(self._device, stream))

    def wait_for_save(self, stream):
        self.worker.wait_for_save(_stream_of(self._device, stream))
        self.worker.clear_metadata()

    def get_finished(self, finished_gen_req_ids, started_loading_req_ids):
        _, loading, _, report = self.worker.get_finished(
            [str(i) for i in finished_gen_req_ids])
        if report:
            _reports.setdefault(self._store_key, []).append(report)
        self._loaded.update(rid for rid, is_async in loading if is_async)
        # Saves end in wait_for_save: every request TensorRT-LLM holds for
        # us is done.
        sending = [int(i) for i in finished_gen_req_ids]
        recving = [int(i) for i in started_loading_req_ids
                   if str(i) in self._loaded]
        self._loaded -= {str(i) for i in recving}
        return sending, recving

    def kvdepot_stats(self):
        return self.worker.stats() if self.worker else {}

    def shutdown(self):
        if self.worker is not None:
            self.worker.close()
            self.worker = None
            _store_release(self._store_key)
