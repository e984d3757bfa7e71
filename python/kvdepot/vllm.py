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

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import sys
import time
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Set, Tuple

from kvdepot import _lib, _spawn, _vllm_obs, config
from kvdepot._shared import (_DEVICE_HOST, _DTYPES, _FP8_DTYPES, _KVD_DTYPES,
                              _dtype_name, _layout_of, _store_acquire,
                              _store_release, _stream_of, _worker_device)
# The supported releases and the setup checks; VLLM_* and
# check_vllm_version stay importable from here.
from kvdepot._vllm_setup import (VLLM_BELOW, VLLM_MIN, VLLM_TESTED,  # noqa: F401
                                 _check_engine, _kv_dtype, _pp_rank,
                                 _stage_layers, _tp_rank, check_vllm_version)

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

    def __init__(self, plans=(), delayed=(), async_loads=(), generation=0,
                 preempted=(), answered=()):
        self.plans = tuple(bytes(p) for p in plans)
        self.delayed = tuple(delayed)
        self.async_loads = tuple(async_loads)
        # Requests this step answers whose KV another engine loads next
        # (_answered_by): their saves are committed before the step ends.
        self.answered = tuple(answered)
        # Requests vLLM preempted this step (their blocks go to others; the
        # copies of every earlier save end first, handle_preemptions).
        self.preempted = tuple(preempted)
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
    for g, grp in enumerate(groups):
        # Later vLLM releases mark groups that are not plain prefix KV:
        # draft-model layers, sparse-attention pools, replicas rebuilt
        # after a load. Storing or skipping them silently could restore a
        # request without state it needs, so they are refused.
        role = getattr(getattr(grp, "role", None), "value", "default")
        if getattr(grp, "is_eagle_group", False) or role != "default" or \
                getattr(grp, "enable_kv_transfer", True) is False:
            raise ValueError(f"kvdepot: KV-cache group {g} holds draft-model, "
                             f"sparse-attention or rebuilt KV (role "
                             f"{role!r}); kvdepot stores plain attention K/V "
                             f"only")
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


def _tensor_digest(t):
    """SHA-256 of a tensor's raw bytes, as vLLM's tensor_data feeds its
    prompt-embeds hash."""
    import torch
    return hashlib.sha256(t.flatten().cpu().contiguous().view(torch.uint8)
                          .numpy().tobytes()).digest()


def _prompt_embeds(request, block_size):
    """For a prompt given as embeddings, the digest of each block's slice
    of them (the last may be short), else None."""
    pe = getattr(request, "prompt_embeds", None)
    if pe is None:
        return None
    return [_tensor_digest(pe[i:i + block_size])
            for i in range(0, int(pe.shape[0]), block_size)]


def _prompt_tokens(request):
    """The prompt's token ids as vLLM hashes them: all_token_ids, whose
    positions given as embeddings hold 0 (prompt_token_ids is None for a
    prompt of embeddings only)."""
    n = getattr(request, "num_prompt_tokens", None)
    all_ids = getattr(request, "all_token_ids", None)
    if n is not None and all_ids is not None:
        return list(all_ids[:n])
    return list(request.prompt_token_ids)


def _answered_by(request, computed):
    """True when the step computing up to `computed` tokens answers the
    request and another engine loads its KV right after: a prefill
    engine's hand-off (kv_transfer_params do_remote_decode), or a request
    of one token (max_tokens 1, as a router sends the prompt to a prefill
    engine before the decode engine), in the step that completes its
    prompt. With async_saves the answer would otherwise leave before the
    objects are committed, and the decode engine would compute them."""
    p = getattr(request, "kv_transfer_params", None) or {}
    if not (p.get("do_remote_decode") or
            getattr(request, "max_tokens", None) == 1):
        return False
    n = getattr(request, "num_prompt_tokens", None)
    if n is None:
        n = len(request.prompt_token_ids or ())
    return computed >= n


# ---- the connector -------------------------------------------------------------

# Saved blocks and store events queued for take_events between two steps
# (the oldest are dropped beyond it, counted in events_dropped).
_EVENTS_QUEUE = 65536

class KvdepotConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM KV connector backed by kvdepot (both roles)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role,
                         kv_cache_config=kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        self.settings = config.parse(
            getattr(ktc, "kv_connector_extra_config", None))
        self.vllm_version = None
        if HAVE_VLLM:
            import vllm as _vllm
            self.vllm_version = check_vllm_version(
                getattr(_vllm, "__version__", "0"),
                self.settings.allow_untested_vllm)
        _check_engine(vllm_config)
        mc, pc = vllm_config.model_config, vllm_config.parallel_config
        self.tp = getattr(pc, "tensor_parallel_size", 1)
        self.pp = getattr(pc, "pipeline_parallel_size", 1)
        # Several processes share no embedded store: "auto" starts (or
        # joins) the engine's own kvdepotd (_spawn.py).
        store_mode = config.engine_store_mode(self.settings, self.tp * self.pp)
        is_scheduler = role == KVConnectorRole.SCHEDULER or \
            getattr(role, "name", "") == "SCHEDULER"
        # With tensor parallelism each rank stores its shard of the heads,
        # with pipeline parallelism each stage its layers, in a namespace
        # of its own; the leader plans in rank 0's of stage 0 (plan_ns)
        # and a block matches only when every shard holds it.
        self.tp_rank = 0 if is_scheduler else _tp_rank(pc, self.tp)
        self.pp_rank = 0 if is_scheduler else _pp_rank(pc, self.tp, self.pp)
        self.stages = [_stage_layers(vllm_config, r, self.pp)
                       for r in range(self.pp)]
        self.block_size = vllm_config.cache_config.block_size
        if self.pp > 1:
            start, end = self.stages[self.pp_rank]
            self.num_layers = end - start
        else:
            self.num_layers = mc.get_num_layers(pc)
        self.num_kv_heads = mc.get_num_kv_heads(pc)
        total = getattr(mc, "get_total_num_kv_heads", None)
        self.total_kv_heads = total() if callable(total) else \
            self.num_kv_heads * self.tp
        self.head_dim = mc.get_head_size()
        self.mla = bool(getattr(mc, "use_mla", False))
        self.dtype = _kv_dtype(vllm_config, self.settings.codecs)
        ck, cv = (_lib.codec_id(c) for c in self.settings.codecs)
        self.codecs = (ck, cv)
        self.model_id = self.settings.model_id or str(mc.model)
        self._model_config = mc
        self.groups = _kv_groups(kv_cache_config, self.block_size)
        if self.pp > 1 and self.groups != [None]:
            raise ValueError("kvdepot: pipeline parallelism with several "
                             "KV-cache groups (the hybrid allocator) is not "
                             "supported; run it with one group "
                             "(--disable-hybrid-kv-cache-manager)")
        self.generation = 0  # bumped by reset_cache
        self._set_namespaces()
        self.store_mode = store_mode  # "auto" resolved
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
            for g, ns in enumerate(self.group_ns):
                self.leaders.append(_lib.Leader(
                    self.store, self.block_size, ns,
                    num_workers=self.tp * self.pp,
                    shard_ns=self.shard_ns[g],
                    layerwise=self.settings.layerwise,
                    lookup_timeout_ms=self.settings.lookup_timeout_ms,
                    node_id=self.settings.node_id or socket.gethostname()))
            gate = config.gate_settings(self.settings)
            for leader in self.leaders:
                if gate is not None:
                    leader.set_gate(**gate)
            self._log_start(vllm_config)
            self._requests = {}   # id -> [request, tokens given, async]
            self._embeds = {}     # id -> prompt-embeds digests, until answered
            self._refused = set()  # reasons a request was not cached, logged
            self._delayed = []    # kept blocks, for the next plan
            self._async_loads = []  # vLLM waits for these, for the plan
            self._answered = []   # answered by the step planned (meta)
            self._init_events(vllm_config)
        else:
            self._layer_index = {}   # layer name -> (group, layer in group)
            self._delayed = set()    # vLLM keeps their blocks for us
            self._finished = set()   # vLLM finished them
            self._invalid = set()
            self._loading = {}       # async load -> groups yet to report
            self._reports = []
            self._exc_at_bind = None  # the exception handled at bind, if any
            self._registered = {}    # layer -> (tensor, address registered)
            self._asleep = False     # sleep mode released the KV cache
            self._answered = ()      # the bound step answers these
            self._stats_seen = {}    # kvdepot_stats() at the last interval
            self._load_wait = 0.0    # seconds waited on loads, this step
        # This interval's counters (get_kv_connector_stats), and the
        # scheduler's since start (kvdepot_stats).
        self._stats = _vllm_obs.KvdepotConnectorStats()
        self._sched_totals = dict.fromkeys(
            ("lookup_tokens", "hit_tokens", "hit_requests"), 0)
        self._leader_seen = {}  # leader counters at the last interval

    def _set_namespaces(self):
        """Each group's namespace for this rank and stage, for rank 0 of
        stage 0 (the plans'), and those of every other rank and stage
        (shard_ns: the leader matches a block only when every rank holds
        its shard of every stage's layers), at the current generation:
        everything vLLM's model config says that changes the KV bytes
        (docs/reliability.md). A pipeline stage's namespace names its
        layers. MLA: the latent is the same on every tensor-parallel rank
        (vLLM replicates it), so the namespace names no TP size or rank:
        the ranks share one copy of each block, and an engine of any TP
        size loads it. With shared_objects (the default) the same holds for
        attention with several KV heads: the namespace names every head and
        no rank, and each rank writes and reads its heads of the one object
        of a block (_head_range)."""
        mc = self._model_config
        n = len(self.groups)
        self.group_ns, self.plan_ns, self.shard_ns = [], [], []
        shared = self.mla or self._shared()
        for g, grp in enumerate(self.groups):
            heads = self.num_kv_heads if grp is None else grp[1].num_kv_heads
            dim = self.head_dim if grp is None else grp[1].head_size
            if self.mla:
                heads = 1
            elif shared:
                heads = self._object_heads(heads)

            def ns_of(rank, stage=0):
                model = self.model_id if grp is None else \
                    f"{self.model_id}#kv-group-{g}-of-{n}"
                layers = self.num_layers if grp is None else len(grp[0])
                if self.pp > 1:
                    start, end = self.stages[stage]
                    model = f"{model}#pp-layers-{start}-{end}"
                    layers = end - start
                return _lib.namespace(
                    model,
                    _DTYPES[self.dtype], self.codecs[0], self.codecs[1],
                    layers,
                    heads, dim, self.block_size,
                    tp_size=1 if shared else self.tp,
                    tp_rank=0 if shared else rank, kv_combined=self.mla,
                    tq_seed=_lib.TQ_SEED,
                    revision=getattr(mc, "revision", None),
                    weight_quant=getattr(mc, "quantization", None),
                    overrides=_model_overrides(mc),
                    sliding_window=_sliding_window(
                        mc, None if grp is None else grp[1]),
                    generation=self.generation)
            self.group_ns.append(ns_of(self.tp_rank, self.pp_rank))
            self.plan_ns.append(ns_of(0, 0))
            # The namespaces a block must be stored in on every rank and
            # stage for the leader to match it (one per stage when shared).
            ranks = 1 if shared else self.tp
            self.shard_ns.append([ns_of(r, p) for p in range(self.pp)
                                  for r in range(ranks)
                                  if (r, p) != (0, 0)])
        self.ns = self.plan_ns[0]

    def _shared(self):
        """Whether the ranks write one object per block (shared_objects,
        tensor parallelism over several KV heads)."""
        return self.tp > 1 and self.settings.shared_objects

    def _object_heads(self, heads):
        """The KV heads of the whole model for a rank holding `heads`: the
        model's, or heads x TP size for a group whose spec has another
        count."""
        if heads == self.num_kv_heads:
            return self.total_kv_heads
        return heads * self.tp

    def _head_range(self, heads):
        """(object_heads, head_start) of this rank's `heads` in the shared
        object, (0, 0) when objects are not shared (_lib.head_range: vLLM's
        split; a replicated head is written by one of its replicas)."""
        if self.mla or not self._shared():
            return 0, 0
        total = self._object_heads(heads)
        n, start = _lib.head_range(total, self.tp, self.tp_rank)
        if n != heads:
            raise ValueError(f"kvdepot: {heads} KV heads on each of "
                             f"{self.tp} ranks is not vLLM's split of the "
                             f"model's {total}; set shared_objects: false")
        return total, start

    def _log_start(self, vllm_config):
        """One INFO line with what this engine's cache is, and a WARNING
        when vLLM would fail requests the cache cannot serve."""
        ktc = vllm_config.kv_transfer_config
        policy = getattr(ktc, "kv_load_failure_policy", None)
        if policy == "fail":
            log.warning(
                "kvdepot: kv_load_failure_policy is \"fail\": a block the "
                "cache cannot deliver (a dead daemon, a checksum error, an "
                "evicted copy) fails the user's request instead of being "
                "recomputed; set \"kv_load_failure_policy\": \"recompute\"")
        s = self.settings
        store = (self.daemon.address if self.daemon is not None else
                 s.store_address if s.store_mode == "daemon" else
                 f"arena {s.arena_size}" + (f", disk {s.store_dir}"
                                             if s.store_dir else ""))
        log.info("kvdepot: vLLM %s, mode %s, namespace %s, codec K %s V %s, "
                 "KV %s, TP %d, PP %d, store %s",
                 self.vllm_version or "stand-in", self.store_mode,
                 bytes(self.ns.bytes).hex(), s.codecs[0], s.codecs[1],
                 self.dtype, self.tp, self.pp, store)

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

    def _embeds_of(self, request):
        """The request's prompt-embeddings digests, hashed once per
        request (a "not yet" answer brings it back)."""
        rid = request.request_id
        if rid not in self._embeds:
            self._embeds[rid] = _prompt_embeds(request, self.block_size)
        return self._embeds[rid]

    def _not_cached(self, request, why):
        """A request whose inputs cannot be keyed safely is computed and
        not saved; each reason is logged once."""
        if why not in self._refused:
            self._refused.add(why)
            log.warning("kvdepot: request %s is not cached: %s (later "
                        "requests refused for the same reason are not "
                        "logged)", request.request_id, why)
        self._embeds.pop(request.request_id, None)
        return 0, False

    def get_num_new_matched_tokens(
            self, request: Any,
            num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        tokens = _prompt_tokens(request)
        lora_name = _lora_key(getattr(request, "lora_request", None))
        salt = getattr(request, "cache_salt", None)
        source = self._source_node(request)
        mm = _mm_inputs(request)
        embeds = self._embeds_of(request)
        answers = []
        for leader in self.leaders:
            try:
                answers.append(leader.match(
                    request.request_id, tokens, num_computed_tokens,
                    lora_name=lora_name, cache_salt=salt, source_node=source,
                    mm_inputs=mm, prompt_embeds=embeds))
            except _lib.KvdepotError as e:
                return self._not_cached(request, str(e))
        if any(r is None for r in answers):
            return None, False  # a leader answers again with the same
        # Every group must hold a token for the engine to skip it.
        matched = min(m for m, _ in answers)
        is_async = matched > 0 and any(a for _, a in answers)
        self._count({"lookup_tokens": len(tokens)})
        self._requests[request.request_id] = [request, len(tokens), is_async]
        self._embeds.pop(request.request_id, None)
        return matched, is_async

    def _group_ids(self, table, g):
        """Group g's block ids from a per-group tuple (None: none), with
        vLLM's null block as "no block" when there are several groups."""
        ids = list(table[g]) if table is not None and g < len(table) else []
        if len(self.leaders) > 1:
            ids = [_lib.NO_BLOCK if b == _VLLM_NULL_BLOCK else b for b in ids]
        return ids

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        rid = request.request_id
        entry = self._requests.get(rid)
        if entry is None:
            return  # refused by the leaders (logged): computed, not saved
        table = blocks.get_block_ids() if blocks is not None else None
        for g, leader in enumerate(self.leaders):
            leader.update_state_after_alloc(rid, self._group_ids(table, g),
                                            num_external_tokens)
        if num_external_tokens > 0:
            self._count({"hit_tokens": num_external_tokens,
                         "hit_requests": 1})
        if num_external_tokens > 0 and entry[2]:
            self._async_loads.append(rid)

    def _scheduled(self, req_id, new_blocks, computed):
        entry = self._requests.get(req_id)
        if entry is None:
            return
        request, given = entry[0], entry[1]
        # The tokens after the ones the leaders have, up to what this step
        # computes: all_token_ids holds only accepted tokens, while with
        # speculative decoding `computed` also counts the drafts scheduled
        # (whose KV may be rejected), so the leaders are given exactly the
        # tokens known, never a count that skips some.
        tokens = list(request.all_token_ids[given:computed]) \
            if computed > given else []
        if new_blocks is None:  # a decode step's usual case: no new block
            for leader in self.leaders:
                leader.request_scheduled(req_id, (), tokens, computed)
        else:
            for g, leader in enumerate(self.leaders):
                leader.request_scheduled(
                    req_id, self._group_ids(new_blocks, g), tokens, computed)
        entry[1] = given + len(tokens)
        if _answered_by(request, computed):
            self._answered.append(req_id)

    def build_connector_meta(self, scheduler_output: Any
                             ) -> KvdepotConnectorMetadata:
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
            self._delayed, self._async_loads, self.generation,
            getattr(so, "preempted_req_ids", None) or (), self._answered)
        self._delayed, self._async_loads, self._answered = [], [], []
        return meta

    def update_connector_output(self, connector_output: Any) -> None:
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

    def request_finished(self, request: Any, block_ids: List[int]
                         ) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """(delay_free, kv_transfer_params). A request the proxy marked
        do_remote_decode (prefill -> decode) returns the hand-off for the
        decode engine: do_remote_prefill plus the node that holds the
        blocks, their namespace and hashes; the proxy passes these as the
        decode request's kv_transfer_params, and that engine's connector
        asks this node first (get_num_new_matched_tokens)."""
        self._requests.pop(request.request_id, None)
        self._embeds.pop(request.request_id, None)
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

    def _init_events(self, vllm_config):
        """KV events are collected when vLLM publishes them
        (kv_events_config.enable_kv_cache_events) or the kv_events setting
        asks: the leaders queue the blocks whose saves finished, and an
        embedded store or the daemon its store's commits and removals of
        this engine's namespaces (a daemon before protocol revision 8
        sends none: then no BlockRemoved, and a BlockStored for every
        save the workers finished, docs/vllm.md)."""
        kec = getattr(vllm_config, "kv_events_config", None)
        self._events_on = bool(self.settings.kv_events or getattr(
            kec, "enable_kv_cache_events", False))
        self._events = []
        self._committed = OrderedDict()  # hash -> None: committed, unsaid
        self._store_events = False
        if not self._events_on:
            return
        for leader in self.leaders:
            leader.set_saved_queue(_EVENTS_QUEUE)
        self._event_ns = {bytes(ns.bytes) for ns in self.group_ns}
        self.store.events_watch(sorted(self._event_ns))
        self._store_events = self.store.events_enable(_EVENTS_QUEUE)

    def _collect_events(self):
        """Turns what the store and the leaders queued into vLLM events."""
        dropped = 0
        if self._store_events:
            evs, dropped = self.store.take_events()
            for kind, ns, h in evs:
                if ns not in self._event_ns:
                    continue  # another engine's (or another generation's)
                if kind == _lib.STORE_EVENT_STORED:
                    self._committed[h] = None
                    while len(self._committed) > _EVENTS_QUEUE:
                        self._committed.popitem(last=False)
                elif kind == _lib.STORE_EVENT_REMOVED:
                    self._committed.pop(h, None)
                    self._events.append(_vllm_obs.make_event(
                        _vllm_obs.BlockRemoved, block_hashes=[h],
                        medium="kvdepot"))
        for g, leader in enumerate(self.leaders):
            blocks, d = leader.take_saved_blocks(self.block_size)
            dropped += d
            if self._store_events:
                # Only what this save committed: not a block the store
                # refused, nor one stored (and announced) before.
                blocks = [b for b in blocks if b[0] in self._committed]
                for b in blocks:
                    del self._committed[b[0]]
            self._events.extend(_vllm_obs.stored_events(
                blocks, self.block_size,
                group=g if len(self.leaders) > 1 else None))
        if dropped:
            self._count({"events_dropped": dropped})

    def take_events(self):
        if not self._events_on:
            return ()
        self._collect_events()
        out, self._events = self._events, []
        return out

    def get_finished_count(self):
        return None

    # ---- worker role -------------------------------------------------------

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        self._registered = {n: (t, t.data_ptr())
                            for n, t in kv_caches.items()}
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
        self._registered = {"cross-layer": (kv_cache, kv_cache.data_ptr())}
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
        if dt == "uint8" and self.dtype in _FP8_DTYPES:
            dt = self.dtype  # vLLM allocates fp8 caches as bytes
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
        object_heads, head_start = self._head_range(heads)
        worker = _lib.Worker(
            self.store, self.group_ns[g], fmt,
            rank=self.pp_rank * self.tp + self.tp_rank,
            threads=self.settings.threads,
            plan_ns=self.plan_ns[g] if self.tp * self.pp > 1 else None,
            device=self._device, layerwise_saves=True,
            async_saves=self.settings.async_saves,
            max_inflight_save_bytes=self.settings.max_inflight_save_bytes,
            object_heads=object_heads, head_start=head_start,
            **config.worker_cuda(self.settings))
        self.workers.append(worker)
        worker.register_kv_caches(bases, num_blocks, strides)

    def _layer(self, layer_name):
        gi = self._layer_index.get(layer_name)
        if gi is None:  # cross-layer registration: names in call order
            gi = (0, len(self._layer_index))
            self._layer_index[layer_name] = gi
        return gi

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        if self._asleep:
            raise RuntimeError("kvdepot: a step while the KV cache is "
                               "released (sleep mode)")
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
                                     if self.tp * self.pp > 1 else None)
        self._delayed.update(m.delayed)
        for rid in m.async_loads:
            self._loading[rid] = len(self.workers)
        self._answered = getattr(m, "answered", ())
        # An exception being handled around the whole step (not raised by
        # it): wait_for_save must not take it for a failed forward pass.
        self._exc_at_bind = sys.exc_info()[1]
        for worker, plan in zip(self.workers, m.plans):
            worker.bind_metadata(plan)

    def clear_connector_metadata(self) -> None:
        self._exc_at_bind = None
        self._answered = ()
        for worker in self.workers:
            worker.clear_metadata()
        super().clear_connector_metadata()

    def handle_preemptions(self, kv_connector_metadata):
        """vLLM's first call of a step, before its model runner writes any
        block (it zeroes newly allocated blocks and copies blocks before
        binding the plan). With async_saves the copies of earlier steps'
        saves end first, since vLLM may have given their blocks to other
        requests: a preempted request's, a sliding window's (freed while
        the request runs). Their commits go on: they read the arena only.
        Binding the plan does the same, for engines without this hook."""
        s = _stream_of(self._device)
        for worker in self.workers:
            worker.blocks_fence(s)

    def unregister_kv_caches(self):
        """vLLM's sleep mode is about to release the KV cache memory (its
        transfers are drained): a step still bound is aborted, saves still
        reading the cache (async_saves) end first, and the registered
        addresses are remembered for restore_kv_caches."""
        for worker in self.workers:
            worker.clear_metadata()
            worker.flush_saves()
        self._asleep = True

    def restore_kv_caches(self):
        """After wake-up the KV tensors must be where they were registered
        (vLLM's sleep allocator maps them back at the same addresses);
        anything else would make the workers copy into freed memory, so it
        is refused."""
        moved = [n for n, (t, ptr) in self._registered.items()
                 if t.data_ptr() != ptr]
        if moved:
            raise RuntimeError(f"kvdepot: after wake-up the KV cache of "
                               f"layer {moved[0]} is at another address; "
                               f"the connector cannot follow a moved cache")
        self._asleep = False

    # With CUDA caches each call is ordered on torch's current stream, the
    # one the forward pass runs on (worker.h: the engine's stream waits for
    # a layer's loads; saves wait for the engine's work on it).
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        t0 = time.perf_counter()
        s = _stream_of(self._device)
        for worker in self.workers:
            worker.start_load_kv(s)
        self._load_wait += time.perf_counter() - t0

    def wait_for_layer_load(self, layer_name: str) -> None:
        t0 = time.perf_counter()
        g, i = self._layer(layer_name)
        self.workers[g].wait_for_layer_load(i, _stream_of(self._device))
        self._load_wait += time.perf_counter() - t0

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        g, i = self._layer(layer_name)
        self.workers[g].save_kv_layer(i, _stream_of(self._device))

    def _step_failed(self):
        """The exception in flight, when the step raised one: vLLM calls
        wait_for_save in a `finally` around the forward pass, where
        sys.exc_info() is the exception propagating through it."""
        exc = sys.exc_info()[1]
        return exc if exc is not None and exc is not self._exc_at_bind \
            else None

    def wait_for_save(self) -> None:
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
        # A request this step answers is loaded by another engine next:
        # with async_saves its objects are committed before the answer
        # leaves (vLLM returns the step's output after this call, from
        # every rank).
        if any(w.request_saving(rid) for rid in self._answered
               for w in self.workers):
            for worker in self.workers:
                worker.flush_saves()

    def get_finished(self, finished_req_ids: Set[str]
                     ) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
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
        # A request whose blocks vLLM kept for us goes once vLLM finished
        # it and no worker has a save of it in flight (async_saves: the
        # copies read the blocks until their step is committed).
        sending = {rid for rid in self._delayed & self._finished
                   if not any(w.request_saving(rid) for w in self.workers)}
        self._delayed -= sending
        # A finished request not kept by now never will be: its metadata
        # was bound before this call.
        self._finished &= self._delayed
        return (sending or None), (recving or None)

    def get_block_ids_with_load_errors(self) -> Set[int]:
        out, self._invalid = self._invalid, set()
        return out

    def build_connector_worker_meta(self):
        if not self._reports:
            return None
        meta, self._reports = KvdepotWorkerMetadata(self._reports), []
        return meta

    def _count(self, counts):
        """Counts scheduler-side events, for this interval and in total."""
        self._stats.add(counts)
        for k, v in counts.items():
            if k in self._sched_totals:
                self._sched_totals[k] += v

    def get_kv_connector_stats(self):
        """This interval's counters (reset by the call), or None when
        nothing happened. Workers: the C workers' counters since the last
        call, and how long the step waited for loads when it loaded
        blocks; the scheduler: lookups, hits and failed store lookups."""
        if self.leaders:
            now = {k: 0 for k in ("lookup_errors", "gate_loaded",
                                  "gate_skipped")}
            for ld in self.leaders:
                st = ld.stats()
                for k in now:
                    now[k] += st[k]
            self._stats.add({k: v - self._leader_seen.get(k, 0)
                             for k, v in now.items()})
            self._leader_seen = now
        elif self.workers:
            now = self.kvdepot_stats()
            delta = {k: v - self._stats_seen.get(k, 0)
                     for k, v in now.items()}
            self._stats_seen = now
            delta["blocks_loaded_disk"] = delta.get("promotions", 0)
            self._stats.add(delta)
            if delta.get("blocks_loaded", 0) > 0 and self._load_wait > 0:
                self._stats.sample(self._load_wait)
            self._load_wait = 0.0
        if self._stats.is_empty():
            return None
        out = self._stats
        self._stats = _vllm_obs.KvdepotConnectorStats()
        return out

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        """vLLM's logger rebuilds the workers' stats from their dict."""
        return _vllm_obs.KvdepotConnectorStats(
            data={} if data is None else data)

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames,
                           per_engine_labelvalues):
        """kvdepot_* counters and the load-wait histogram on vLLM's
        /metrics (docs/vllm.md, "Metrics and KV events")."""
        return _vllm_obs.KvdepotPromMetrics(vllm_config, metric_types,
                                            labelnames,
                                            per_engine_labelvalues)

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
            leader.set_namespace(self.group_ns[g], self.shard_ns[g])
        if getattr(self, "_events_on", False):  # nothing before matches
            self._collect_events()
            self._committed.clear()
            self._event_ns = {bytes(ns.bytes) for ns in self.group_ns}
            self.store.events_watch(sorted(self._event_ns))
            self._events.append(_vllm_obs.make_event(
                _vllm_obs.AllBlocksCleared))
        log.info("kvdepot: cache reset: namespace generation %d",
                 self.generation)
        return True

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        return None  # any layout: strides are read from the tensors

    def kvdepot_stats(self) -> Dict[str, int]:
        """Counters since start: on a worker the C workers' (blocks
        loaded/saved, errors, bytes), summed over the KV-cache groups; on
        the scheduler the prompt tokens looked up, the tokens and requests
        that hit, and the C leaders' counters (summed over the groups)."""
        total = {}
        if self.leaders:
            total.update(self._sched_totals)
            for leader in self.leaders:
                for k, v in leader.stats().items():
                    total[k] = total.get(k, 0) + v
        for worker in self.workers:
            for k, v in worker.stats().items():
                total[k] = total.get(k, 0) + v
        return total

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        return True  # the layer hooks do real work

    def shutdown(self) -> None:
        for obj in self.workers + self.leaders:
            obj.close()
        self.workers, self.leaders = [], []
        if self._store_key is not None:
            _store_release(self._store_key)
            self._store_key = None
