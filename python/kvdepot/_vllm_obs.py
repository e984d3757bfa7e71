"""What the vLLM connector tells the engine about itself: per-interval
counters (KvdepotConnectorStats, vLLM's KVConnectorStats), the Prometheus
metrics vLLM's /metrics shows for them (KvdepotPromMetrics), and KV cache
events for KV-aware routers (vLLM's BlockStored / BlockRemoved /
AllBlocksCleared). The connector (kvdepot.vllm) fills them; this module
only defines their shapes, so that vLLM's logger process can rebuild the
stats from a plain dict (build_kv_connector_stats).

Without vLLM (or with a release lacking one of these APIs) the classes
subclass small stand-ins, so the logic is the same and testable.
"""

import dataclasses

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import \
        KVConnectorStats
except ImportError:
    @dataclasses.dataclass
    class KVConnectorStats:
        """Stand-in for vLLM's: a dict of observations."""
        data: dict = dataclasses.field(default_factory=dict)

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import \
        KVConnectorPromMetrics
    HAVE_PROM_API = True
except ImportError:
    HAVE_PROM_API = False

    class KVConnectorPromMetrics:
        """Stand-in for vLLM's: keeps the metric classes and labels."""

        def __init__(self, vllm_config, metric_types, labelnames,
                     per_engine_labelvalues):
            import prometheus_client as pc
            self._gauge_cls = metric_types[pc.Gauge]
            self._counter_cls = metric_types[pc.Counter]
            self._histogram_cls = metric_types[pc.Histogram]
            self._labelnames = labelnames
            self.per_engine_labelvalues = per_engine_labelvalues

try:
    from vllm.distributed.kv_events import (AllBlocksCleared, BlockRemoved,
                                            BlockStored)
except ImportError:
    class _Event:
        def __init__(self, **kw):
            self.__dict__.update(kw)

        def __repr__(self):
            return f"{type(self).__name__}({self.__dict__})"

    class BlockStored(_Event):
        """Stand-in for vLLM's."""

    class BlockRemoved(_Event):
        """Stand-in for vLLM's."""

    class AllBlocksCleared(_Event):
        """Stand-in for vLLM's."""


# The counters of one interval, with their Prometheus help text. The
# scheduler side counts the first four, the workers the rest.
COUNTERS = {
    "lookup_tokens": "Prompt tokens looked up in kvdepot",
    "hit_tokens": "Tokens the engine took from kvdepot instead of computing",
    "hit_requests": "Requests that took tokens from kvdepot",
    "lookup_errors": "kvdepot store lookups that failed (computed instead)",
    "gate_loaded": "Stored KV blocks the recompute-vs-fetch gate let load",
    "gate_skipped": "Stored KV blocks the gate had computed instead",
    "blocks_loaded": "KV blocks loaded from kvdepot",
    "blocks_loaded_disk": "KV blocks loaded from kvdepot's disk tier",
    "bytes_loaded": "Bytes of KV loaded from kvdepot",
    "load_errors": "KV block loads that failed (the engine recomputes)",
    "blocks_saved": "KV blocks saved to kvdepot",
    "bytes_saved": "Bytes of KV saved to kvdepot",
    "saves_skipped": "KV block saves skipped: already stored",
    "saves_dropped": "KV block saves the store refused (full, errors)",
    "saves_aborted": "KV block saves aborted with their step",
    "saves_shed": "KV block saves skipped: async saves in flight at their "
                  "bound (max_inflight_save_bytes)",
    "events_dropped": "KV cache events dropped for lack of queue room",
}
# Seconds a step's forward pass waited for kvdepot loads, one sample per
# step that loaded blocks.
SAMPLES = "load_wait_s"
LOAD_WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                     0.5, 1.0, 2.5, 5.0)
# Keep an interval's samples bounded (the newest are kept).
MAX_SAMPLES = 4096


def _checked(data):
    """A copy of a stats dict with every counter (missing ones 0) and the
    samples; ValueError naming the bad entry otherwise. Unknown keys (a
    newer kvdepot's) are dropped."""
    if not isinstance(data, dict):
        raise ValueError(f"kvdepot: connector stats must be a dict, not "
                         f"{type(data).__name__}")
    out = {}
    for k in COUNTERS:
        v = data.get(k, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"kvdepot: connector stat {k!r} must be a "
                             f"count, not {v!r}")
        out[k] = v
    samples = data.get(SAMPLES, [])
    if not isinstance(samples, (list, tuple)) or any(
            isinstance(s, bool) or not isinstance(s, (int, float)) or s < 0
            for s in samples):
        raise ValueError(f"kvdepot: connector stat {SAMPLES!r} must be a "
                         f"list of seconds")
    out[SAMPLES] = [float(s) for s in samples][-MAX_SAMPLES:]
    return out


@dataclasses.dataclass
class KvdepotConnectorStats(KVConnectorStats):
    """One interval's kvdepot counters (COUNTERS) and load-wait samples,
    from one worker or the scheduler, summed by aggregate across them."""

    def __post_init__(self):
        self.data = _checked({} if self.data is None else self.data)

    def reset(self):
        self.data = _checked({})

    def add(self, counts):
        """Adds the counters in `counts` (a dict; other keys ignored)."""
        for k, v in counts.items():
            if k in COUNTERS and v:
                self.data[k] += int(v)

    def sample(self, seconds):
        s = self.data[SAMPLES]
        s.append(float(seconds))
        del s[:-MAX_SAMPLES]

    def aggregate(self, other):
        if not isinstance(other, KvdepotConnectorStats):
            other = KvdepotConnectorStats(data=dict(getattr(other, "data",
                                                            other)))
        self.add(other.data)
        for s in other.data[SAMPLES]:
            self.sample(s)
        return self

    def reduce(self):
        out = {k: self.data[k] for k in COUNTERS}
        s = sorted(self.data[SAMPLES])
        if s:
            out["load_wait_avg_ms"] = round(1000 * sum(s) / len(s), 3)
            out["load_wait_p90_ms"] = round(
                1000 * s[min(len(s) - 1, int(0.9 * len(s)))], 3)
        return out

    def is_empty(self):
        return not self.data[SAMPLES] and not any(self.data[k]
                                                  for k in COUNTERS)


class KvdepotPromMetrics(KVConnectorPromMetrics):
    """kvdepot_* counters (one per COUNTERS entry, exposed with _total)
    and the kvdepot_load_wait_seconds histogram, with vLLM's labels, per
    engine."""

    def __init__(self, vllm_config, metric_types, labelnames,
                 per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames,
                         per_engine_labelvalues)
        self.counters = {}
        for k, doc in COUNTERS.items():
            c = self._counter_cls(name=f"kvdepot_{k}", documentation=doc,
                                  labelnames=labelnames)
            self.counters[k] = self._per_engine(c)
        h = self._histogram_cls(
            name="kvdepot_load_wait_seconds",
            documentation="Seconds a step waited for kvdepot KV loads",
            buckets=list(LOAD_WAIT_BUCKETS), labelnames=labelnames)
        self.load_wait = self._per_engine(h)

    def _per_engine(self, metric):
        return {idx: metric.labels(*values) for idx, values in
                self.per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data, engine_idx=0):
        data = _checked(transfer_stats_data)
        for k, per_engine in self.counters.items():
            if data[k]:
                per_engine[engine_idx].inc(data[k])
        for s in data[SAMPLES]:
            self.load_wait[engine_idx].observe(s)


def make_event(cls, **fields):
    """A vLLM event of `cls`, leaving out the fields this vLLM release's
    class does not have (group_idx is newer than 0.19)."""
    try:
        return cls(**fields)
    except TypeError:
        fields.pop("group_idx", None)
        return cls(**fields)


def stored_events(blocks, block_size, group=None, medium="kvdepot"):
    """BlockStored events for saved blocks [(hash, parent, tokens, lora)]:
    consecutive blocks of one chain (each the parent of the next, same
    LoRA) in one event, as vLLM batches a request's blocks."""
    out, run = [], None
    for h, parent, tokens, lora in blocks:
        name = lora.split("\x1f", 1)[0] if lora else None
        if run is not None and parent == run["block_hashes"][-1] and \
                name == run["lora_name"]:
            run["block_hashes"].append(h)
            run["token_ids"].extend(tokens or ())
            continue
        if run is not None:
            out.append(run)
        run = {"block_hashes": [h], "parent_block_hash": parent,
               "token_ids": list(tokens or ()), "block_size": block_size,
               "lora_id": None, "medium": medium, "lora_name": name}
    if run is not None:
        out.append(run)
    return [make_event(BlockStored, group_idx=group, **e) for e in out]
