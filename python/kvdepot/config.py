"""The connector's settings, from vLLM's kv_connector_extra_config (a dict).

Every key is listed here with its default and meaning; an unknown key is an
error naming the keys that exist, so a typo never silently turns a feature
off. Store sizes take the C library's suffixes ("64g", "512m")."""

from dataclasses import dataclass, field, fields

KV_LAYOUTS = ("auto", "flash", "flashinfer", "cpu", "mla")
STORE_MODES = ("auto", "embedded", "daemon", "spawn")
# worker.h kvd_worker_copy_mode_t, in its order.
CUDA_COPY_MODES = ("auto", "runs", "per_object")


@dataclass
class Settings:
    store_mode: str = "auto"       # "auto", "embedded", "daemon", "spawn"
    #   auto: embedded when the engine is one process, else spawn;
    #   embedded: in this process; daemon: the kvdepotd at store_address;
    #   spawn: a kvdepotd the engine's processes start (see _spawn.py)
    store_address: str = "unix:/run/kvdepot/kvdepotd.sock"  # daemon mode
    store_timeout: str = "2s"      # daemon mode: deadline of every call
    store_dir: str = ""            # NVMe tier directory; "" = host arena only
    arena_size: str = "4g"         # host arena
    disk_size: str = "64g"         # NVMe tier, when store_dir is set
    disk_write: str = "back"       # "back" (on eviction) or "through"
    codec: str = "raw"             # K and V codec, unless codec_k/codec_v
    codec_k: str = ""
    codec_v: str = ""
    model_id: str = ""             # namespace model id; "" = vLLM's model
    kv_layout: str = "auto"        # how to read register_kv_caches tensors
    layerwise: bool = True         # per-layer loads and saves
    lookup_timeout_ms: int = 2000  # longest "not yet" for one request
    threads: int = 0               # worker threads, 0 = library default
    node_id: str = ""              # this node's kvdepotd server.node_id
    #   ("" = the host name, kvdepotd's default): the node a prefill
    #   engine's kv_transfer_params name for the decode side
    store_settings: dict = field(default_factory=dict)  # raw store.* keys
    allow_untested_vllm: bool = False  # run on a vLLM newer than tested
    kv_events: bool = False        # publish KV cache events (BlockStored,
    #   BlockRemoved) even when vLLM's kv_events_config does not enable them
    spawn_idle_exit: str = "10s"   # spawn: the started kvdepotd stops once
    #   no engine process has had its store open for this long
    shared_objects: bool = True    # tensor parallelism: the ranks write
    #   their heads into one object per block, which an engine of any TP
    #   size loads (docs/vllm.md, "Any tensor-parallel size"); false: each
    #   rank stores its shard in a namespace naming its TP size and rank
    async_saves: bool = True       # a step's saves are committed after the
    #   step (its copies out of the cache end before the next step; the
    #   engine keeps a finished request's blocks until the commit)
    max_inflight_save_bytes: int = 0  # async saves reserved and not yet
    #   committed, at most (0 = 1 GiB): saves beyond are skipped, not waited
    cuda_staging_blocks: int = 0   # CUDA worker: blocks a staging
    #   buffer holds (a layer's copies go in chunks of that many; 0 = the
    #   library's 64, at most 65536)
    cuda_staging_buffers: int = 0  # CUDA worker: staging buffers used in
    #   turn (0 = 2, at most 4)
    cuda_copy_mode: str = "auto"   # CUDA worker: "auto", "runs" or
    #   "per_object" (worker.h cuda_copy_mode)
    gate: dict = field(default_factory=dict)  # recompute-vs-fetch gate:
    #   {} off; else GATE_DEFAULTS' keys, prefill_tokens_per_s required
    #   (the engine's prefill rate; docs/vllm.md, "The gate")

    @property
    def codecs(self):
        return (self.codec_k or self.codec, self.codec_v or self.codec)


# The gate's settings and their defaults (leader.h kvd_leader_gate_t):
# the per-block times and latencies are the first estimates, which the
# workers' measurements then move.
GATE_DEFAULTS = {"prefill_tokens_per_s": 0.0, "margin": 0.1,
                 "host_s_per_block": 1e-5, "disk_s_per_block": 5e-4,
                 "host_latency_s": 0.0, "disk_latency_s": 2e-4,
                 "alpha": 0.2}


def gate_settings(s):
    """The gate's values (GATE_DEFAULTS filled in), or None when off."""
    if not s.gate:
        return None
    out = dict(GATE_DEFAULTS)
    out.update(s.gate)
    return out


def _check_gate(g):
    unknown = sorted(set(g) - set(GATE_DEFAULTS))
    if unknown:
        raise ValueError(f"kvdepot: unknown gate key(s) {unknown}; known "
                         f"keys: {sorted(GATE_DEFAULTS)}")
    for k, v in g.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ValueError(f"kvdepot: gate {k} must be a number >= 0, "
                             f"not {v!r}")
    if g and not g.get("prefill_tokens_per_s"):
        raise ValueError("kvdepot: gate needs prefill_tokens_per_s (the "
                         "engine's prefill rate, tokens per second)")


def parse(extra):
    """Settings from kv_connector_extra_config; ValueError on a bad key or
    value."""
    extra = dict(extra or {})
    known = {f.name: f for f in fields(Settings)}
    unknown = sorted(set(extra) - set(known))
    if unknown:
        raise ValueError(
            f"kvdepot: unknown kv_connector_extra_config key(s) {unknown}; "
            f"known keys: {sorted(known)}")
    s = Settings()
    for k, v in extra.items():
        want = type(getattr(s, k))
        if want is bool and not isinstance(v, bool):
            raise ValueError(f"kvdepot: {k} must be true or false, not {v!r}")
        if want is int and (isinstance(v, bool) or not isinstance(v, int)):
            raise ValueError(f"kvdepot: {k} must be an integer, not {v!r}")
        if want is dict and not isinstance(v, dict):
            raise ValueError(f"kvdepot: {k} must be a mapping, not {v!r}")
        if want is str and not isinstance(v, str):
            raise ValueError(f"kvdepot: {k} must be a string, not {v!r}")
        setattr(s, k, v)
    if s.store_mode not in STORE_MODES:
        raise ValueError(f"kvdepot: store_mode {s.store_mode!r}: "
                         "'auto', 'embedded', 'daemon' or 'spawn'")
    if s.kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kvdepot: kv_layout {s.kv_layout!r}, one of "
                         f"{KV_LAYOUTS}")
    if s.disk_write not in ("back", "through"):
        raise ValueError(f"kvdepot: disk_write {s.disk_write!r}: 'back' or "
                         "'through'")
    _check_gate(s.gate)
    if s.cuda_copy_mode not in CUDA_COPY_MODES:
        raise ValueError(f"kvdepot: cuda_copy_mode {s.cuda_copy_mode!r}, "
                         f"one of {CUDA_COPY_MODES}")
    for k, hi in (("cuda_staging_blocks", 65536), ("cuda_staging_buffers",
                                                   4)):
        if not 0 <= getattr(s, k) <= hi:
            raise ValueError(f"kvdepot: {k} {getattr(s, k)}: 0 (the "
                             f"library's default) to {hi}")
    if s.max_inflight_save_bytes < 0:
        raise ValueError("kvdepot: max_inflight_save_bytes must be >= 0")
    for k in s.store_settings:
        if not str(k).startswith("store."):
            raise ValueError(f"kvdepot: store_settings key {k!r} must start "
                             "with 'store.'")
    return s


def worker_cuda(s):
    """The CUDA worker's settings as kvdepot._lib.Worker's arguments (the
    host backend ignores them)."""
    return {"cuda_staging_blocks": s.cuda_staging_blocks,
            "cuda_staging_buffers": s.cuda_staging_buffers,
            "cuda_copy_mode": CUDA_COPY_MODES.index(s.cuda_copy_mode)}


def engine_store_mode(s, processes):
    """What store_mode means for an engine of `processes` processes (tensor
    x pipeline parallel ranks): "embedded", "daemon" or "spawn". "auto" is
    embedded for one process, else spawn; embedded with several is a
    ValueError naming the fix (an embedded store lives in one process)."""
    if s.store_mode == "auto":
        return "embedded" if processes == 1 else "spawn"
    if s.store_mode == "embedded" and processes != 1:
        raise ValueError(
            f"kvdepot: store_mode \"embedded\" with {processes} engine "
            f"processes (tensor / pipeline parallel ranks): an embedded "
            f"store lives in one process; use store_mode \"auto\" (the "
            f"default: the engine starts its own kvdepotd) or \"daemon\" "
            f"(a kvdepotd you run, at store_address)")
    return s.store_mode


def store_settings(s):
    """The store.* settings: an embedded store's sizes and tiers ("auto"
    means embedded here: an engine of several processes resolves it first,
    engine_store_mode), or the daemon to use (whose own config sets its
    sizes and tiers). "spawn" must be resolved into a daemon first
    (kvdepot._spawn): ValueError."""
    if s.store_mode == "spawn":
        raise ValueError("kvdepot: store_mode \"spawn\" is resolved by the "
                         "vLLM connector (kvdepot._spawn); this engine "
                         "takes \"embedded\" or \"daemon\"")
    if s.store_mode == "daemon":
        out = {"store.mode": "daemon", "store.address": s.store_address,
               "store.timeout": s.store_timeout}
        out.update({str(k): v for k, v in s.store_settings.items()})
        return out
    out = {"store.arena_size": s.arena_size}
    if s.store_dir:
        out.update({"store.disk_path": s.store_dir,
                    "store.disk_size": s.disk_size,
                    "store.disk_write": s.disk_write})
    out.update({str(k): v for k, v in s.store_settings.items()})
    return out
