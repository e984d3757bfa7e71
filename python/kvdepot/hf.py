"""kvdepot for Hugging Face transformers: a prompt's KV saved to and
restored from kvdepot around transformers' own DynamicCache.

    from kvdepot.hf import KvdepotHF
    kv = KvdepotHF(model, codec="raw", store_dir="/var/lib/kvdepot")
    out = kv.generate(input_ids, max_new_tokens=32, do_sample=False)
    kv.close()

generate() asks the leader which prefix of the prompt the store holds
(blocks recognised by their hash chain over the tokens), has the worker
load those blocks layer by layer into one staging tensor on the model's
device, hands them to a DynamicCache with cache.update(k, v, layer), and
calls the model's own generate() with that cache: transformers then
computes only the tokens after the cached prefix, as with any cache hit.
Right after the prefill (a forward hook on the model) the prompt's full
blocks are copied into a staging tensor and saved by the worker, layer by
layer, with the codec of the settings. restore() and save() are the two
halves for callers that drive generate() themselves.

Staging layout, per request: [layers][2 (K, V)][kv_heads][tokens][head_dim]
with tokens a whole number of blocks, so layer l's K is
staging[l, 0].unsqueeze(0), transformers' own [batch, heads, seq, dim]
order; block b of the worker's layout is tokens [b*block, (b+1)*block).
CPU tensors use the worker's host backend, CUDA tensors its CUDA backend.

Only the translation lives here; the leader and worker (C) decide what
matches, what loads and what is saved. A block that fails to load (gone,
bad checksum) ends the usable prefix there: the rest is computed.
"""

import hashlib
import json
import os
import threading
import time

from kvdepot import _lib, config
from kvdepot._shared import (_DTYPES, _KVD_DTYPES, _dtype_name,
                             _store_acquire, _store_release, _stream_of,
                             _worker_device)

# Model families whose attention caches plain per-layer K and V of shape
# [batch, kv_heads, seq, head_dim] (config.model_type values).
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2",
             "gemma3_text")

_TQ_SEED = 0x6b76646570
_ids = 0
_ids_lock = threading.Lock()


def _next_id():
    global _ids
    with _ids_lock:
        _ids += 1
        return f"hf-{os.getpid()}-{_ids}"


def _text_config(model):
    cfg = model.config
    get = getattr(cfg, "get_text_config", None)
    return get(decoder=True) if callable(get) else cfg


def model_shape(model):
    """(model_type, layers, kv_heads, head_dim) of a supported model;
    ValueError naming the supported families otherwise."""
    cfg = _text_config(model)
    kind = getattr(cfg, "model_type", None)
    if kind not in SUPPORTED:
        raise ValueError(f"kvdepot.hf: model family {kind!r} is not "
                         f"supported; supported: {', '.join(SUPPORTED)}")
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return kind, cfg.num_hidden_layers, kv_heads, head_dim


def model_identity(model):
    """The namespace's model id: name and revision, a digest of the config
    and a fingerprint of the weights (the first elements of every
    parameter), so two models that would compute different KV never share
    blocks, random-initialised ones included."""
    import torch
    cfg = model.config
    d = cfg.to_dict()
    for k in ("transformers_version", "_name_or_path", "_commit_hash",
              "torch_dtype", "dtype"):
        d.pop(k, None)
    cdig = hashlib.sha256(json.dumps(d, sort_keys=True, default=str)
                          .encode()).hexdigest()[:16]
    with torch.no_grad():
        parts = [p.detach().reshape(-1)[:8].float()
                 for p in model.parameters()]
        w = torch.cat(parts).cpu().numpy().tobytes() if parts else b""
    wdig = hashlib.sha256(w).hexdigest()[:16]
    name = (getattr(cfg, "_name_or_path", "") or "unnamed")[-96:]
    rev = getattr(cfg, "_commit_hash", None) or "-"
    return f"hf:{name}@{rev}:cfg={cdig}:w={wdig}"


class Restored:
    """What restore() found: `cache` (a DynamicCache holding `tokens`
    tokens of the prompt, None when nothing was restored), `matched` (what
    the leader promised), `failed` (engine blocks whose load failed) and
    `staging` (the tensor the worker wrote, [layers, 2, heads, tokens,
    dim]; None without a hit) and `phases`: host seconds of the restore's
    parts, "match" (the leader's lookup), "register" (the staging tensor
    and the worker's registration of it), the worker's step in three:
    "bind" (the plan built and bound: the store's lookups and leases),
    "loads" (every layer's loads done, or on a GPU enqueued) and "reports"
    (the wait for the step's end, the reports to the leader), then "cache"
    (the DynamicCache over the staging tensor); on a GPU the copies may
    still run after "loads"."""

    def __init__(self, rid, cache, tokens, matched, failed, staging,
                 phases=None):
        self.request_id, self.cache, self.tokens = rid, cache, tokens
        self.matched, self.failed, self.staging = matched, failed, staging
        self.phases = phases or {}


class KvdepotHF:
    """Save and restore prompts' KV for one transformers model.

    `model`: a loaded causal LM of a SUPPORTED family, in float16 or
    bfloat16, on CPU or one CUDA device. `block_size`: tokens per stored
    block. `settings`: the keys of kvdepot.config.Settings (codec,
    store_mode, store_address, store_dir, arena_size, model_id, threads,
    lookup_timeout_ms, ...), checked the same way (an unknown key is an
    error). Not thread-safe: one thread drives one KvdepotHF.
    Sliding-window layers (Gemma 2/3, Mistral with a window) keep only
    the window, so a prompt as long as the smallest window is refused.
    """

    def __init__(self, model, block_size=16, **settings):
        kind, layers, heads, dim = model_shape(model)
        dt = _dtype_name(model.dtype)
        if dt not in ("float16", "bfloat16"):
            raise ValueError(f"kvdepot.hf: model dtype {dt}: kvdepot stores "
                             "float16 or bfloat16 KV; load the model in one "
                             "of them (torch_dtype=torch.bfloat16)")
        if not 1 <= block_size <= 4096:
            raise ValueError(f"kvdepot.hf: block_size {block_size}: 1..4096")
        self.model, self.family = model, kind
        self.num_layers, self.num_heads, self.head_dim = layers, heads, dim
        self.block_size, self.dtype = block_size, model.dtype
        self.settings = config.parse(settings)
        self.codecs = tuple(_lib.codec_id(c) for c in self.settings.codecs)
        self.model_id = self.settings.model_id or model_identity(model)
        self.ns = _lib.namespace(self.model_id, _DTYPES[dt], *self.codecs,
                                 layers, heads, dim, block_size)
        self.window = self._window()
        self._key, self.store = _store_acquire(
            config.store_settings(self.settings))
        self.leader = None
        try:
            self.leader = _lib.Leader(
                self.store, block_size, self.ns, layerwise=True,
                lookup_timeout_ms=self.settings.lookup_timeout_ms)
        except Exception:
            _store_release(self._key)
            raise
        # The recompute-vs-fetch gate (settings `gate`, as for vLLM): the
        # leader then matches only the part of a stored prefix that loads
        # faster than the model computes it; generate() reports its timed
        # prefills, so the rate it predicts with is this model's.
        self.gate = config.gate_settings(self.settings)
        if self.gate is not None:
            self.leader.set_gate(**self.gate)
        self._workers = {}  # device backend -> Worker
        self._registered = {}  # device backend -> staging data_ptr/shape
        self.last = None  # the Restored of the last generate()
        try:  # a format the codecs cannot serve is refused here
            device = _model_device(model)
            self._worker(self._staging(0, device))
            if device.type == "cuda":
                # The CUDA worker makes its stream, staging and block-id
                # buffers and page-locks the store's arena (4 GiB by
                # default: about half a second) when caches are first
                # registered: here, once, as an engine does at start-up,
                # not inside the first request's TTFT.
                # Kept: the worker holds its address until a restore or
                # save registers its own staging.
                self._setup_staging = self._staging(1, device)
                self._register(self._setup_staging)
        except Exception:
            self.close()
            raise

    # ---- set-up -----------------------------------------------------------

    def _window(self):
        """The smallest sliding window of the model's cache layers (None:
        every layer keeps the whole sequence)."""
        from transformers import DynamicCache
        cache = DynamicCache(config=self.model.config)
        wins = [getattr(layer, "sliding_window", None)
                for layer in getattr(cache, "layers", [])]
        wins = [int(w) for w in wins if w]
        return min(wins) if wins else None

    def _check_length(self, n):
        if self.window is not None and n >= self.window:
            raise ValueError(
                f"kvdepot.hf: a prompt of {n} tokens is not shorter than the "
                f"model's sliding window ({self.window}): its sliding layers "
                "no longer hold the whole prompt, so it is refused")

    def _worker(self, t):
        device = _worker_device(t, "KV staging tensor")
        w = self._workers.get(device)
        if w is None:
            fmt = _lib.ObjectFormat(dtype=_KVD_DTYPES[_dtype_name(t.dtype)],
                                    num_layers=self.num_layers, num_planes=2,
                                    num_heads=self.num_heads,
                                    head_dim=self.head_dim,
                                    block_size=self.block_size,
                                    tq_seed=_TQ_SEED)
            fmt.codec[0], fmt.codec[1] = self.codecs
            w = _lib.Worker(self.store, self.ns, fmt,
                            threads=self.settings.threads, device=device,
                            **config.worker_cuda(self.settings))
            self._workers[device] = w
        return device, w

    def _staging(self, num_blocks, device):
        import torch
        return torch.empty((self.num_layers, 2, self.num_heads,
                            num_blocks * self.block_size, self.head_dim),
                           dtype=self.dtype, device=device)

    def _register(self, staging):
        """Points the worker at `staging` ([layers, 2, heads, tokens,
        dim]); returns (backend, worker)."""
        device, w = self._worker(staging)
        sig = (staging.data_ptr(), tuple(staging.shape))
        if self._registered.get(device) != sig:
            e, st = staging.element_size(), staging.stride()
            bases = [staging.data_ptr() + i * st[0] * e
                     for i in range(self.num_layers)]
            w.register_kv_caches(
                bases, staging.shape[3] // self.block_size,
                (st[1] * e, self.block_size * st[3] * e, st[3] * e,
                 st[2] * e))
            self._registered[device] = sig
        return device, w

    # ---- one step with the worker -----------------------------------------

    def _run_step(self, w, device, rid, saves=False, wait_async=False,
                  timeout=60.0, times=None):
        """Binds the leader's next plan, runs its loads (layer by layer)
        and, with `saves`, its saves (every layer), and feeds the worker's
        reports back to the leader. Synchronous loads and the saves are
        done when wait_for_save returns; an asynchronous load (a block on
        the NVMe tier, promoted first) is waited for (`wait_async`) until
        the worker reports `rid` loaded. Returns the failed engine block
        ids. `times`, a dict, gets the host seconds of its parts: "bind"
        (the plan built and bound: the store's lookups and leases),
        "loads" (every layer's loads done, or enqueued on a GPU) and
        "reports" (the saves, the wait for the step, the reports)."""
        t0 = time.perf_counter()
        plan = self.leader.build_connector_meta()
        stream = _stream_of(device)
        w.bind_metadata(plan)
        failed = set()
        t1 = t2 = time.perf_counter()
        try:
            w.start_load_kv(stream)
            for layer in range(self.num_layers):
                w.wait_for_layer_load(layer, stream)
            t2 = time.perf_counter()
            if saves:
                for layer in range(self.num_layers):
                    w.save_kv_layer(layer, stream)
            w.wait_for_save(stream)
            deadline = time.monotonic() + timeout
            while True:
                _, loading, bad, report = w.get_finished()
                if report:
                    self.leader.update_connector_output(report)
                failed.update(b for r, b, _ in bad if r == rid)
                if any(r == rid for r, _ in loading):
                    wait_async = False
                if not wait_async:
                    break
                if time.monotonic() > deadline:
                    raise _lib.KvdepotError(
                        f"request {rid}: its load did not finish in "
                        f"{timeout:.0f}s", -1)
                time.sleep(0.0002)
        finally:
            w.clear_metadata()
        failed.update(self.leader.take_failed_blocks())
        self.leader.take_finished_loads()
        if times is not None:
            times.update(bind=t1 - t0, loads=t2 - t1,
                         reports=time.perf_counter() - t2)
        return failed

    # ---- the two halves ---------------------------------------------------

    def restore(self, input_ids, device=None):
        """Looks the prompt (a [1, n] tensor or a list of ids) up and loads
        its stored prefix. Returns a Restored whose .cache is the
        DynamicCache to pass to generate() (None on a miss); the request
        stays open for save() (or finish())."""
        tokens = _token_list(input_ids)
        self._check_length(len(tokens))
        device = device or _model_device(self.model)
        rid = _next_id()
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.settings.lookup_timeout_ms / 1e3 \
            + 5.0
        while True:
            r = self.leader.match(rid, tokens, 0)
            if r is not None or time.monotonic() > deadline:
                break
            time.sleep(0.001)
        matched, is_async = r if r else (0, False)
        nb = -(-len(tokens) // self.block_size)
        self.leader.update_state_after_alloc(rid, list(range(nb)), matched)
        t1 = time.perf_counter()
        phases = {"match": t1 - t0}
        if matched == 0:
            return Restored(rid, None, 0, 0, [], None, phases)
        staging = self._staging(matched // self.block_size, device)
        dev, w = self._register(staging)
        t2 = time.perf_counter()
        phases["register"] = t2 - t1
        failed = self._run_step(w, dev, rid, wait_async=is_async,
                                times=phases)
        t3 = time.perf_counter()
        good = min(failed) * self.block_size if failed else matched
        if good == 0:
            return Restored(rid, None, 0, matched, sorted(failed), staging,
                            phases)
        cache = _cache_over(self.model.config, staging, good)
        phases["cache"] = time.perf_counter() - t3
        return Restored(rid, cache, good, matched, sorted(failed), staging,
                        phases)

    def save(self, restored, input_ids, cache):
        """Saves the prompt's full blocks from `cache` (holding at least the
        prompt's tokens at positions 0..n-1) for the request restore()
        opened, then ends it. Returns the worker's blocks saved so far."""
        import torch
        tokens = _token_list(input_ids)
        nfull = len(tokens) // self.block_size
        rid = restored.request_id
        try:
            self.leader.request_scheduled(rid, [], [], len(tokens))
            if nfull == 0:
                self.leader.build_connector_meta()
                return
            device = cache.layers[0].keys.device
            staging = self._staging(nfull, device)
            n = nfull * self.block_size
            with torch.no_grad():
                for layer in range(self.num_layers):
                    lay = cache.layers[layer]
                    if lay.keys.shape[-2] < n:
                        raise ValueError(
                            f"kvdepot.hf: cache layer {layer} holds "
                            f"{lay.keys.shape[-2]} tokens, fewer than the "
                            f"prompt's {n} in full blocks")
                    staging[layer, 0].copy_(lay.keys[0, :, :n])
                    staging[layer, 1].copy_(lay.values[0, :, :n])
            dev, w = self._register(staging)
            self._run_step(w, dev, rid, saves=True)
        finally:
            self.finish(restored)

    def finish(self, restored):
        """Ends the request restore() opened (no save)."""
        if restored.request_id:
            self.leader.request_finished(restored.request_id)
            restored.request_id = None

    # ---- generate ---------------------------------------------------------

    def generate(self, input_ids, save=True, **kwargs):
        """The model's generate() on a batch of one prompt, with its stored
        prefix restored first and, with `save`, its full blocks saved right
        after the prefill. Returns what model.generate returns; the
        Restored of the last call is in self.last, without its cache (the
        DynamicCache generate grew is released with the call, as
        model.generate releases its own) but with its staging tensor (the
        restored bytes) until the next call, which drops it before it
        restores."""
        import torch
        ids = input_ids if torch.is_tensor(input_ids) else \
            torch.tensor([list(input_ids)])
        if ids.dim() != 2 or ids.shape[0] != 1:
            raise ValueError("kvdepot.hf: generate takes one prompt "
                             f"([1, n] ids), not shape {tuple(ids.shape)}")
        ids = ids.to(_model_device(self.model))
        # The previous call's staging goes before this one allocates its
        # own: a long prompt's KV is gigabytes of device memory.
        self.last = None
        restored = self.restore(ids)
        self.last = restored
        cache = restored.cache
        if cache is None:
            from transformers import DynamicCache
            cache = DynamicCache(config=self.model.config)
        hooks = []
        if self.gate is not None:
            hooks += self._prefill_timer(ids.shape[1] - restored.tokens)
        if save:
            state = {"done": False, "error": None}

            def after_prefill(module, args, output):
                if state["done"]:
                    return
                state["done"] = True
                try:
                    self.save(restored, ids, cache)
                except Exception as e:  # raised after generate returns
                    state["error"] = e

            hooks.append(self.model.register_forward_hook(after_prefill))
        try:
            kwargs.setdefault("attention_mask", torch.ones_like(ids))
            out = self.model.generate(ids, past_key_values=cache, **kwargs)
        finally:
            for hook in hooks:
                hook.remove()
            self.finish(restored)
            restored.cache = None
        if save and state["error"] is not None:
            raise state["error"]
        return out

    def _prefill_timer(self, computed):
        """Hooks that time generate()'s prefill (its first forward: the
        `computed` tokens the restore did not cover) and report it to the
        gate. The device is synchronized on both sides, as a step timer
        must: the work is asynchronous."""
        import torch
        device = _model_device(self.model)
        t = {}

        def sync():
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        def before(module, args):
            if "start" not in t:
                sync()
                t["start"] = time.perf_counter()

        def after(module, args, output):
            if "end" in t:
                return
            sync()
            t["end"] = time.perf_counter()
            seconds = t["end"] - t["start"]
            if computed > 0 and seconds > 0:
                self.leader.report_prefill(computed, seconds)

        return [self.model.register_forward_pre_hook(before),
                self.model.register_forward_hook(after)]

    def stats(self):
        """The workers' counters, summed."""
        out = {}
        for w in self._workers.values():
            for k, v in w.stats().items():
                out[k] = out.get(k, 0) + v
        return out

    def close(self):
        for w in self._workers.values():
            w.close()
        self._workers.clear()
        if self.leader is not None:
            self.leader.close()
            self.leader = None
            _store_release(self._key)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _cache_over(config, staging, good):
    """A DynamicCache holding the first `good` tokens of `staging`
    ([layers, 2, heads, tokens, dim]) as its layers' K and V. The layers
    of transformers' own DynamicCache (full and sliding-window) are given
    views of the staging tensor, not copies: cache.update would
    concatenate each layer onto an empty tensor, a second copy of every
    restored byte (as much device memory again, and its time) that the
    first forward's own concatenation replaces anyway. Layers of another
    kind take cache.update."""
    import torch
    from transformers import DynamicCache
    try:
        from transformers.cache_utils import (DynamicLayer,
                                              DynamicSlidingWindowLayer)
        views = (DynamicLayer, DynamicSlidingWindowLayer)
    except ImportError:
        views = ()
    cache = DynamicCache(config=config)
    layers = getattr(cache, "layers", None)
    with torch.no_grad():
        for layer in range(staging.shape[0]):
            k = staging[layer, 0, :, :good].unsqueeze(0)
            v = staging[layer, 1, :, :good].unsqueeze(0)
            lay = layers[layer] if layers is not None and \
                layer < len(layers) else None
            if type(lay) not in views:
                cache.update(k, v, layer)
                continue
            # Initialised on an empty slice (no bytes move), then pointed
            # at the views; a sliding layer also counts the tokens it saw
            # (a prompt is shorter than its window: refused otherwise).
            cache.update(k[:, :, :0], v[:, :, :0], layer)
            lay.keys, lay.values = k, v
            if type(lay) is DynamicSlidingWindowLayer:
                lay.cumulative_length = good
            if cache.get_seq_length(layer) != good:
                raise RuntimeError(
                    f"kvdepot.hf: cache layer {layer} reports "
                    f"{cache.get_seq_length(layer)} tokens after holding "
                    f"{good}: this transformers' cache layout is not the "
                    "one kvdepot.hf knows")
    return cache


def _token_list(input_ids):
    if hasattr(input_ids, "tolist"):
        ids = input_ids.tolist()
        if ids and isinstance(ids[0], list):
            if len(ids) != 1:
                raise ValueError("kvdepot.hf: one prompt at a time")
            ids = ids[0]
        if ids and not isinstance(ids[0], int):
            # A float tensor: its values as ints (the leader refuses what
            # is not an id in 0..2^32-1).
            return [int(t) for t in ids]
        return ids  # an integer tensor's tolist() gives ints already
    return [int(t) for t in input_ids]


def _model_device(model):
    return next(model.parameters()).device
