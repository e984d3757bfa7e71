"""kvdepot as a vLLM KV connector (KVConnectorBase_V1, vLLM 0.19).

    --kv-transfer-config '{"kv_connector": "KvdepotConnector",
      "kv_connector_module_path": "kvdepot.vllm", "kv_role": "kv_both",
      "kv_connector_extra_config": {"store_dir": "/nvme/kvdepot"}}'

The scheduler role drives the C leader (which blocks to load and save,
packed into a StepPlan), the worker role the C worker (the copies, layer by
layer). Everything here is translation between vLLM's objects and the C
calls; the decisions are made in C (docs/vllm.md).

Plans travel to the workers inside KvdepotConnectorMetadata (picklable: the
plans' bytes and the ids of requests whose blocks vLLM keeps for us). The
workers' reports travel back inside KvdepotWorkerMetadata
(build_connector_worker_meta, aggregated across workers), and the leader
reads them in update_connector_output.

With vLLM's hybrid allocator (SupportsHMA), a model's layers fall into
several KV-cache groups (full attention, sliding window), each with its own
block table. Each group is then a namespace of its own, with its own C
leader and worker over that group's layers; a request matches what every
group has, and a sliding-window group's null blocks (tokens that left the
window) are neither loaded nor saved (KVD_LEADER_NO_BLOCK).

The embedded store lives in the process: both roles of one vLLM process
(TP 1, the in-process executor) share it. When vLLM is not importable the
module still imports, over minimal stand-ins for its base classes, so the
logic can be tested without it.
"""

import json
import logging
import os
import socket
import sys

from kvdepot import _lib, _spawn, config
from kvdepot._shared import (_DEVICE_HOST, _DTYPES, _KVD_DTYPES, _dtype_name,
                              _layout_of, _store_acquire, _store_release,
                              _stream_of, _worker_device)

log = logging.getLogger("kvdepot.vllm")

try:  # vLLM present: subclass the real thing
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import \
            KVConnectorWorkerMetadata
    except ImportError:  # older vLLM: no worker metadata channel
        KVConnectorWorkerMetadata = object
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import \
            SupportsHMA
    except ImportError:
        SupportsHMA = object
    HAVE_VLLM = True
except ImportError:
    import enum

    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:
        """Stand-in for vLLM's (no fields)."""

    class KVConnectorWorkerMetadata:
        """Stand-in for vLLM's (aggregate across workers)."""

    class SupportsHMA:
        """Stand-in for vLLM's hybrid-allocator marker."""

    class KVConnectorBase_V1:
        """Stand-in for vLLM's base: keeps the bound metadata."""

        def __init__(self, vllm_config, role, kv_cache_config=None):
            self._vllm_config = vllm_config
            self._role = role
            self._connector_metadata = None

        @property
        def role(self):
            return self._role

        def bind_connector_metadata(self, connector_metadata):
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self):
            self._connector_metadata = None

        def _get_connector_metadata(self):
            return self._connector_metadata


class KvdepotConnectorMetadata(KVConnectorMetadata):
    """One step's plan for the workers: a packed kvdepot.v1.StepPlan per
    KV-cache group, the requests whose blocks vLLM keeps until the workers
    say so, and the requests vLLM waits for (asynchronous loads)."""

    def __init__(self, plans=(), delayed=(), async_loads=(), generation=0):
        self.plans = tuple(bytes(p) for p in plans)
        self.delayed = tuple(delayed)
        self.async_loads = tuple(async_loads)
        # The scheduler's namespace generation (reset_cache bumps it): the
        # workers move to it before binding the plans.
        self.generation = generation


class KvdepotWorkerMetadata(KVConnectorWorkerMetadata):
    """The workers' packed kvdepot.v1.WorkerReports for the leader, as
    (KV-cache group, report bytes)."""

    def __init__(self, reports=()):
        self.reports = list(reports)

    def aggregate(self, other):
        return KvdepotWorkerMetadata(self.reports + list(other.reports))


# ---- KV-cache groups ---------------------------------------------------------

# vLLM KVCacheSpec classes whose layers hold attention K/V in paged blocks.
_ATTENTION_SPECS = ("FullAttentionSpec", "SlidingWindowSpec",
                    "ChunkedLocalAttentionSpec", "MLAAttentionSpec",
                    "SinkFullAttentionSpec")

# vLLM's null block (BlockPool.null_block, the pool's first block): what a
# sliding-window group's table holds for tokens that left the window.
_VLLM_NULL_BLOCK = 0


def _kv_groups(kv_cache_config, block_size):
    """[(layer names, spec)] per KV-cache group when there are several (the
    hybrid allocator), or [None]: one group holding every layer."""
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or ())
    if len(groups) <= 1:
        return [None]
    out = []
    for g, grp in enumerate(groups):
        spec = grp.kv_cache_spec
        kind = type(spec).__name__
        if kind not in _ATTENTION_SPECS:
            raise ValueError(f"kvdepot: KV-cache group {g} is {kind}: only "
                             f"attention K/V is stored, and restoring K/V "
                             f"without that group's state would give wrong "
                             f"outputs; use a model without such layers")
        if spec.block_size != block_size:
            raise ValueError(f"kvdepot: KV-cache group {g} has blocks of "
                             f"{spec.block_size} tokens, the others "
                             f"{block_size}: groups must share a block size")
        out.append((list(grp.layer_names), spec))
    return out


def _mm_inputs(request):
    """The request's multimodal inputs as (identifier, offset, length), in
    vLLM's order (request.mm_features, sorted by mm_position.offset): their
    identities enter the keys of the blocks their placeholder tokens fill,
    as in vLLM's own block hashes, so two prompts that differ only in an
    image never share those blocks. A feature without identifier passes
    None, which the leader refuses: the request is computed, not served
    another image's KV."""
    out = []
    for f in getattr(request, "mm_features", None) or ():
        pos = f.mm_position
        ident = getattr(f, "identifier", None)
        out.append((None if ident is None else str(ident), int(pos.offset),
                    int(pos.length)))
    return out


def _model_overrides(mc):
    """A stable text of what overrides the model's attention: hf_overrides
    (a callable by its qualified name) and the RoPE settings of the HF
    config. Part of the namespace: the same model id with another RoPE
    scaling writes other KV bytes."""
    hf = getattr(mc, "hf_config", None)
    out = {"hf_overrides": getattr(mc, "hf_overrides", None) or None,
           "rope_scaling": getattr(hf, "rope_scaling", None),
           "rope_theta": getattr(hf, "rope_theta", None)}
    if all(v is None for v in out.values()):
        return None
    return json.dumps(out, sort_keys=True, default=lambda o: getattr(
        o, "__qualname__", type(o).__name__))


def _sliding_window(mc, spec=None):
    """Tokens of the sliding window (0: none): the group's spec, else the
    model config's."""
    w = getattr(spec, "sliding_window", None) if spec is not None else None
    if w is None:
        get = getattr(mc, "get_sliding_window", None)
        w = get() if callable(get) else getattr(
            getattr(mc, "hf_config", None), "sliding_window", None)
    return int(w) if isinstance(w, int) and w > 0 else 0


def _lora_key(lora):
    """The LoRA identity that enters a request's block keys: its name, and
    when the adapter's path is known, the path and the size and mtime of
    its files, so other weights behind the same name are other keys. None
    without LoRA."""
    if lora is None:
        return None
    name = str(getattr(lora, "lora_name", "") or "")
    path = getattr(lora, "lora_path", None) or getattr(lora, "path", None)
    if not path:
        return name
    ident = [str(path)]
    files = [path] if os.path.isfile(path) else [
        os.path.join(path, f) for f in ("adapter_config.json",
                                        "adapter_model.safetensors",
                                        "adapter_model.bin")]
    for f in files:
        try:
            st = os.stat(f)
        except OSError:
            continue
        ident.append(f"{os.path.basename(f)}:{st.st_size}:{st.st_mtime_ns}")
    return name + "\x1f" + "|".join(ident)


def _tp_rank(pc, tp):
    """This worker's tensor-parallel rank."""
    if tp == 1:
        return 0
    try:
        from vllm.distributed.parallel_state import \
            get_tensor_model_parallel_rank
        return get_tensor_model_parallel_rank()
    except (ImportError, AssertionError):  # no vLLM, or no TP group (tests)
        return getattr(pc, "rank", 0) % tp


# ---- the connector -------------------------------------------------------------

class KvdepotConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM KV connector backed by kvdepot (both roles)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role,
                         kv_cache_config=kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        self.settings = config.parse(
            getattr(ktc, "kv_connector_extra_config", None))
        mc, pc = vllm_config.model_config, vllm_config.parallel_config
        if getattr(pc, "pipeline_parallel_size", 1) != 1:
            raise ValueError("kvdepot: pipeline parallelism is not supported "
                             "(each stage would store its own layers); use "
                             "tensor parallelism")
        self.tp = getattr(pc, "tensor_parallel_size", 1)
        # Several processes share no embedded store: "auto" starts (or
        # joins) the engine's own kvdepotd (_spawn.py).
        store_mode = config.engine_store_mode(
            self.settings, self.tp * getattr(pc, "pipeline_parallel_size", 1))
        self.block_size = vllm_config.cache_config.block_size
        self.num_layers = mc.get_num_layers(pc)
        self.num_kv_heads = mc.get_num_kv_heads(pc)
        self.head_dim = mc.get_head_size()
        self.mla = bool(getattr(mc, "use_mla", False))
        dt = _dtype_name(mc.dtype)
        if dt not in _DTYPES:
            raise ValueError(f"kvdepot: KV dtype {dt} is not supported")
        self.dtype = dt
        ck, cv = (_lib.codec_id(c) for c in self.settings.codecs)
        self.codecs = (ck, cv)
        self.model_id = self.settings.model_id or str(mc.model)
        self._model_config = mc
        self.groups = _kv_groups(kv_cache_config, self.block_size)
        is_scheduler = role == KVConnectorRole.SCHEDULER or \
            getattr(role, "name", "") == "SCHEDULER"
        # With tensor parallelism each rank stores its shard of the heads in
        # its own namespace; the leader plans in rank 0's (plan_ns).
        self.tp_rank = 0 if is_scheduler else _tp_rank(pc, self.tp)
        self.generation = 0  # bumped by reset_cache
        self._set_namespaces()
        self.daemon = None  # the _spawn.DaemonHandle, with "spawn"
        if store_mode == "spawn":
            self.daemon, (self._store_key, self.store) = _spawn.attach(
                self.settings, _spawn.engine_key(
                    getattr(vllm_config, "instance_id", ""), self.settings),
                _store_acquire)
        else:
            self._store_key, self.store = _store_acquire(
                config.store_settings(self.settings))
        self.leaders, self.workers = [], []
        self._device = _DEVICE_HOST  # the caches' (register_kv_caches)
        if is_scheduler:
            for ns in self.group_ns:
                self.leaders.append(_lib.Leader(
                    self.store, self.block_size, ns, num_workers=self.tp,
                    layerwise=self.settings.layerwise,
                    lookup_timeout_ms=self.settings.lookup_timeout_ms,
                    node_id=self.settings.node_id or socket.gethostname()))
            self._requests = {}   # id -> [request, tokens given, async]
            self._delayed = []    # kept blocks, for the next plan
            self._async_loads = []  # vLLM waits for these, for the plan
        else:
            self._layer_index = {}   # layer name -> (group, layer in group)
            self._delayed = set()    # vLLM keeps their blocks for us
            self._finished = set()   # vLLM finished them
            self._invalid = set()
            self._loading = {}       # async load -> groups yet to report
            self._reports = []
            self._exc_at_bind = None  # the exception handled at bind, if any

    def _set_namespaces(self):
        """Each group's namespace for this rank and for rank 0 (the plans'),
        at the current generation: everything vLLM's model config says
        that changes the KV bytes (docs/reliability.md)."""
        mc = self._model_config
        n = len(self.groups)
        self.group_ns, self.plan_ns = [], []
        for g, grp in enumerate(self.groups):
            heads = self.num_kv_heads if grp is None else grp[1].num_kv_heads
            dim = self.head_dim if grp is None else grp[1].head_size

            def ns_of(rank):
                return _lib.namespace(
                    self.model_id if grp is None else
                    f"{self.model_id}#kv-group-{g}-of-{n}",
                    _DTYPES[self.dtype], self.codecs[0], self.codecs[1],
                    self.num_layers if grp is None else len(grp[0]),
                    1 if self.mla else heads, dim, self.block_size,
                    tp_size=self.tp, tp_rank=rank, kv_combined=self.mla,
                    tq_seed=_lib.TQ_SEED,
                    revision=getattr(mc, "revision", None),
                    weight_quant=getattr(mc, "quantization", None),
                    overrides=_model_overrides(mc),
                    sliding_window=_sliding_window(
                        mc, None if grp is None else grp[1]),
                    generation=self.generation)
            self.group_ns.append(ns_of(self.tp_rank))
            self.plan_ns.append(ns_of(0))
        self.ns = self.plan_ns[0]

    # ---- scheduler role ----------------------------------------------------

    def _source_node(self, request):
        """The prefill node named by a decode request's kv_transfer_params
        (see request_finished), or None."""
        p = getattr(request, "kv_transfer_params", None) or {}
        node = p.get("kvdepot_node") if p.get("do_remote_prefill") else None
        if not node:
            return None
        ns = bytes(self.ns.bytes).hex()
        if p.get("kvdepot_ns", ns) != ns:
            log.warning("kvdepot: request %s was prefilled for namespace %s, "
                        "this engine's is %s (another model or codec): "
                        "loading only what matches here", request.request_id,
                        p.get("kvdepot_ns"), ns)
            return None
        return str(node)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        tokens = list(request.prompt_token_ids)
        lora_name = _lora_key(getattr(request, "lora_request", None))
        salt = getattr(request, "cache_salt", None)
        source = self._source_node(request)
        mm = _mm_inputs(request)
        answers = []
        for leader in self.leaders:
            try:
                answers.append(leader.match(
                    request.request_id, tokens, num_computed_tokens,
                    lora_name=lora_name, cache_salt=salt, source_node=source,
                    mm_inputs=mm))
            except _lib.KvdepotError as e:
                log.warning("kvdepot: request %s: %s; computing it",
                            request.request_id, e)
                return 0, False
        if any(r is None for r in answers):
            return None, False  # a leader answers again with the same
        # Every group must hold a token for the engine to skip it.
        matched = min(m for m, _ in answers)
        is_async = matched > 0 and any(a for _, a in answers)
        self._requests[request.request_id] = [request, len(tokens), is_async]
        return matched, is_async

    def _group_ids(self, table, g):
        """Group g's block ids from a per-group tuple (None: none), with
        vLLM's null block as "no block" when there are several groups."""
        ids = list(table[g]) if table is not None and g < len(table) else []
        if len(self.leaders) > 1:
            ids = [_lib.NO_BLOCK if b == _VLLM_NULL_BLOCK else b for b in ids]
        return ids

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        rid = request.request_id
        entry = self._requests.get(rid)
        if entry is None:
            return  # refused by the leaders (logged): computed, not saved
        table = blocks.get_block_ids() if blocks is not None else None
        for g, leader in enumerate(self.leaders):
            leader.update_state_after_alloc(rid, self._group_ids(table, g),
                                            num_external_tokens)
        if num_external_tokens > 0 and entry[2]:
            self._async_loads.append(rid)

    def _scheduled(self, req_id, new_blocks, computed):
        entry = self._requests.get(req_id)
        if entry is None:
            return
        request, given = entry[0], entry[1]
        tokens = list(request.all_token_ids[given:computed]) \
            if computed > given else []
        for g, leader in enumerate(self.leaders):
            leader.request_scheduled(req_id, self._group_ids(new_blocks, g),
                                     tokens, computed)
        entry[1] = max(given, computed)

    def build_connector_meta(self, scheduler_output):
        so = scheduler_output
        for rid in getattr(so, "preempted_req_ids", None) or ():
            for leader in self.leaders:
                leader.request_preempted(rid)
        for new in so.scheduled_new_reqs:
            n = so.num_scheduled_tokens.get(new.req_id, 0)
            self._scheduled(new.req_id, None, new.num_computed_tokens + n)
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(getattr(cached, "req_ids", ())):
            n = so.num_scheduled_tokens.get(rid, 0)
            self._scheduled(rid, cached.new_block_ids[i],
                            cached.num_computed_tokens[i] + n)
        meta = KvdepotConnectorMetadata(
            [leader.build_connector_meta() for leader in self.leaders],
            self._delayed, self._async_loads, self.generation)
        self._delayed, self._async_loads = [], []
        return meta

    def update_connector_output(self, connector_output):
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        for g, report in getattr(meta, "reports", ()):
            try:
                self.leaders[g].update_connector_output(report)
            except (_lib.KvdepotError, IndexError) as e:
                log.warning("kvdepot: worker report refused: %s", e)
        for leader in self.leaders:
            # vLLM learns these from the workers directly; drain our copies.
            leader.take_failed_blocks()
            leader.take_finished_loads()

    def request_finished(self, request, block_ids):
        """(delay_free, kv_transfer_params). A request the proxy marked
        do_remote_decode (prefill -> decode) returns the hand-off for the
        decode engine: do_remote_prefill plus the node that holds the
        blocks, their namespace and hashes; the proxy passes these as the
        decode request's kv_transfer_params, and that engine's connector
        asks this node first (get_num_new_matched_tokens)."""
        self._requests.pop(request.request_id, None)
        p = getattr(request, "kv_transfer_params", None) or {}
        params = None
        rid = request.request_id
        # Every group's leader hears of it (no short-circuit).
        delays = [leader.request_finished(rid) for leader in self.leaders[1:]]
        if p.get("do_remote_decode"):
            delay, t = self.leaders[0].request_finished_transfer(rid)
            if t is not None:
                params = {"do_remote_prefill": True,
                          "do_remote_decode": False,
                          "kvdepot_node": t["node"],
                          "kvdepot_ns": t["ns"],
                          "kvdepot_hashes": t["hashes"],
                          "kvdepot_num_tokens": t["num_tokens"]}
        else:
            delay = self.leaders[0].request_finished(rid)
        delay = delay or any(delays)
        if delay:
            self._delayed.append(rid)
        return delay, params

    def request_finished_all_groups(self, request, block_ids):
        return self.request_finished(request, block_ids[0] if block_ids
                                     else [])

    def take_events(self):
        return ()

    def get_finished_count(self):
        return None

    # ---- worker role -------------------------------------------------------

    def register_kv_caches(self, kv_caches):
        names = list(kv_caches)
        if len(names) != self.num_layers:
            raise ValueError(f"kvdepot: {len(names)} KV tensors for "
                             f"{self.num_layers} layers")
        if self.groups == [None]:
            parts = [(names, self.num_kv_heads, self.head_dim)]
        else:
            parts = [(layers, spec.num_kv_heads, spec.head_size)
                     for layers, spec in self.groups]
        self._layer_index = {}
        for g, (layers, heads, dim) in enumerate(parts):
            missing = [n for n in layers if n not in kv_caches]
            if missing:
                raise ValueError(f"kvdepot: no KV tensor for layer "
                                 f"{missing[0]} of KV-cache group {g}")
            first = kv_caches[layers[0]]
            lay = _layout_of(first, self.settings.kv_layout, heads)
            for n in layers[1:]:
                t = kv_caches[n]
                if tuple(t.shape) != tuple(first.shape) or \
                        t.stride() != first.stride() or \
                        t.dtype != first.dtype or t.device != first.device:
                    raise ValueError(f"kvdepot: layer {n} is shaped unlike "
                                     f"{layers[0]}")
            self._layer_index.update((n, (g, i)) for i, n in
                                     enumerate(layers))
            self._open_worker(first, lay, [kv_caches[n].data_ptr()
                                           for n in layers], g, heads, dim)

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend=None):
        if self.groups != [None]:
            raise ValueError("kvdepot: one cross-layer KV tensor for several "
                             "KV-cache groups")
        per_layer = kv_cache[0]
        lay = _layout_of(per_layer, self.settings.kv_layout,
                         self.num_kv_heads)
        step = kv_cache.stride(0) * kv_cache.element_size()
        self._layer_index = {}
        self._open_worker(per_layer, lay, [kv_cache.data_ptr() + i * step
                                           for i in range(kv_cache.shape[0])],
                          0, self.num_kv_heads, self.head_dim)

    def _open_worker(self, t, lay, bases, g, want_heads, want_dim):
        num_blocks, strides, planes, heads, head_dim = lay
        dt = _dtype_name(t.dtype)
        if dt != self.dtype or head_dim != want_dim or \
                (not self.mla and heads != want_heads):
            raise ValueError(f"kvdepot: KV tensor ({dt}, {heads} heads x "
                             f"{head_dim}) differs from the model config "
                             f"({self.dtype}, {want_heads} x {want_dim})")
        fmt = _lib.ObjectFormat(dtype=_KVD_DTYPES[dt],
                                num_layers=len(bases), num_planes=planes,
                                num_heads=heads, head_dim=head_dim,
                                block_size=self.block_size,
                                tq_seed=_lib.TQ_SEED)
        fmt.codec[0], fmt.codec[1] = self.codecs
        self._device = _worker_device(t)
        # vLLM's attention layers call save_kv_layer for every layer they
        # compute (maybe_transfer_kv_layer): a step that stopped short is
        # aborted by wait_for_save, not committed with stale layers.
        worker = _lib.Worker(
            self.store, self.group_ns[g], fmt, rank=self.tp_rank,
            threads=self.settings.threads,
            plan_ns=self.plan_ns[g] if self.tp > 1 else None,
            device=self._device, layerwise_saves=True)
        self.workers.append(worker)
        worker.register_kv_caches(bases, num_blocks, strides)

    def _layer(self, layer_name):
        gi = self._layer_index.get(layer_name)
        if gi is None:  # cross-layer registration: names in call order
            gi = (0, len(self._layer_index))
            self._layer_index[layer_name] = gi
        return gi

    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        m = connector_metadata
        if len(m.plans) != len(self.workers):
            raise ValueError(f"kvdepot: {len(m.plans)} plans for "
                             f"{len(self.workers)} KV-cache groups")
        gen = getattr(m, "generation", 0)
        if gen != self.generation:  # the scheduler reset its cache
            self.generation = gen
            self._set_namespaces()
            for g, worker in enumerate(self.workers):
                worker.clear_metadata()  # a step left bound ends here
                worker.set_namespace(self.group_ns[g], self.plan_ns[g]
                                     if self.tp > 1 else None)
        self._delayed.update(m.delayed)
        for rid in m.async_loads:
            self._loading[rid] = len(self.workers)
        # An exception being handled around the whole step (not raised by
        # it): wait_for_save must not take it for a failed forward pass.
        self._exc_at_bind = sys.exc_info()[1]
        for worker, plan in zip(self.workers, m.plans):
            worker.bind_metadata(plan)

    def clear_connector_metadata(self):
        self._exc_at_bind = None
        for worker in self.workers:
            worker.clear_metadata()
        super().clear_connector_metadata()

    def handle_preemptions(self, kv_connector_metadata):
        pass  # saves never outlive their step (wait_for_save)

    # With CUDA caches each call is ordered on torch's current stream, the
    # one the forward pass runs on (worker.h: the engine's stream waits for
    # a layer's loads; saves wait for the engine's work on it).
    def start_load_kv(self, forward_context, **kwargs):
        s = _stream_of(self._device)
        for worker in self.workers:
            worker.start_load_kv(s)

    def wait_for_layer_load(self, layer_name):
        g, i = self._layer(layer_name)
        self.workers[g].wait_for_layer_load(i, _stream_of(self._device))

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        g, i = self._layer(layer_name)
        self.workers[g].save_kv_layer(i, _stream_of(self._device))

    def _step_failed(self):
        """The exception in flight, when the step raised one: vLLM calls
        wait_for_save in a `finally` around the forward pass, where
        sys.exc_info() is the exception propagating through it."""
        exc = sys.exc_info()[1]
        return exc if exc is not None and exc is not self._exc_at_bind \
            else None

    def wait_for_save(self):
        failed = self._step_failed()
        if failed is not None:
            # Layers computed before the failure are whole, the rest stale:
            # nothing of the step is committed (the C worker also aborts a
            # step whose layers were not all saved).
            log.warning("kvdepot: the forward pass raised %s: the step's "
                        "saves are aborted", type(failed).__name__)
            for worker in self.workers:
                worker.abort_step()
            return
        s = _stream_of(self._device)
        for worker in self.workers:
            worker.wait_for_save(s)

    def get_finished(self, finished_req_ids):
        self._finished.update(finished_req_ids)
        recving, finished = set(), sorted(finished_req_ids)
        for g, worker in enumerate(self.workers):
            _saving, loading, failed, report = worker.get_finished(finished)
            if report:
                self._reports.append((g, report))
            for _, block, _status in failed:
                self._invalid.add(block)
            # vLLM waits for a load until every group has done its part.
            for rid, _is_async in loading:
                left = self._loading.get(rid)
                if left is None:
                    continue  # a load vLLM does not wait for
                if left > 1:
                    self._loading[rid] = left - 1
                else:
                    del self._loading[rid]
                    recving.add(rid)
        # Saves are complete when wait_for_save returns: a request whose
        # blocks vLLM kept for us can go as soon as vLLM finished it.
        sending = self._delayed & self._finished
        self._delayed -= sending
        # A finished request not kept by now never will be: its metadata
        # was bound before this call.
        self._finished &= self._delayed
        return (sending or None), (recving or None)

    def get_block_ids_with_load_errors(self):
        out, self._invalid = self._invalid, set()
        return out

    def build_connector_worker_meta(self):
        if not self._reports:
            return None
        meta, self._reports = KvdepotWorkerMetadata(self._reports), []
        return meta

    def get_kv_connector_stats(self):
        return None

    def get_kv_connector_kv_cache_events(self):
        return None

    def get_handshake_metadata(self):
        return None  # no out-of-band handshake: keys name the blocks

    def set_host_xfer_buffer_ops(self, copy_operation):
        pass  # the worker copies with its own kernels

    def bind_gpu_block_pool(self, block_pool):
        pass

    def set_xfer_handshake_metadata(self, metadata):
        pass

    def reset_cache(self):
        """vLLM reset its prefix cache (reset_prefix_cache with the
        connector; also what RLHF loops do after updating weights in
        place): a new namespace generation, so nothing saved before is
        matched. The objects stay in the store until evicted or dropped;
        the workers follow with the next plan (its generation)."""
        self.generation += 1
        self._set_namespaces()
        for g, leader in enumerate(self.leaders):
            leader.set_namespace(self.group_ns[g])
        log.info("kvdepot: cache reset: namespace generation %d",
                 self.generation)
        return True

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        return None  # any layout: strides are read from the tensors

    def kvdepot_stats(self):
        """The C workers' counters (blocks loaded/saved, errors, bytes),
        summed over the KV-cache groups."""
        total = {}
        for worker in self.workers:
            for k, v in worker.stats().items():
                total[k] = total.get(k, 0) + v
        return total

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        return True  # the layer hooks do real work

    def shutdown(self):
        for obj in self.workers + self.leaders:
            obj.close()
        self.workers, self.leaders = [], []
        if self._store_key is not None:
            _store_release(self._store_key)
            self._store_key = None
