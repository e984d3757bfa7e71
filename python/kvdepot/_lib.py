"""ctypes bindings to libkvdepot.so: the embedded store, the leader and the
worker (include/kvdepot/{store,leader,worker}.h). Thin wrappers only: each
class owns one C handle, raises KvdepotError on a failed call, and frees the
handle in close(). The structures mirror the C headers field for field.

The library is found through KVDEPOT_LIB (a path), then next to this package
(an installed copy), then the build trees of a source checkout, then the
system linker path. A library is taken only when it matches this package:
the same MAJOR.MINOR version, and every structure mirrored here of the size
the library's kvd_struct_size reports (a library built from other headers
would be passed structs of the wrong shape); one that does not is skipped
with the reason, which the error lists when none fits.

Once loaded, the library's log messages go to Python's logging (logger
"kvdepot.lib", the C level mapped to logging's) instead of straight to
stderr, so an engine's log configuration applies to them;
KVDEPOT_LOG_STDERR=1 keeps the library's own stderr lines. The C level
(KVDEPOT_LOG_LEVEL, default warn) still decides what is formatted at all.
"""

import array
import atexit
import ctypes
import ctypes.util
import logging
import operator
import os
import threading
from pathlib import Path

KVD_OK = 0
KVD_INPROGRESS = 1
KVD_AGAIN = 2
KVD_ERR_NOT_FOUND = -2

_lib = None
_lib_lock = threading.Lock()


class KvdepotError(RuntimeError):
    """A kvdepot call failed; .status is the kvd_status_t."""

    def __init__(self, what, status, reason=""):
        self.status = status
        text = status_str(status)
        super().__init__(f"{what}: {text}" + (f" ({reason})" if reason else ""))


def _candidates():
    env = os.environ.get("KVDEPOT_LIB")
    if env:
        yield Path(env)
    here = Path(__file__).resolve().parent
    yield here / "libkvdepot.so"
    root = here.parent.parent
    for tree in ("dev", "ci", "release", "asan", "gpu"):
        yield root / "build" / tree / "libkvdepot.so"
    found = ctypes.util.find_library("kvdepot")
    if found:
        yield Path(found)


def lib():
    """The loaded library, with argument types declared (once)."""
    global _lib
    with _lib_lock:
        if _lib is None:
            errors = []
            for path in _candidates():
                try:
                    handle = ctypes.CDLL(str(path))
                except OSError as e:
                    errors.append(f"{path}: {e}{_missing_hint(path, e)}")
                    continue
                why = _mismatch(handle)
                if why:
                    errors.append(f"{path}: {why}")
                    continue
                _declare(handle)
                _route_logs(handle)
                _lib = handle
                break
            else:
                raise OSError("libkvdepot.so not found; set KVDEPOT_LIB "
                              "(tried: " + "; ".join(errors or ["nothing"]) + ")")
        return _lib


def _missing_hint(path, err):
    """For the wheel's own library whose shared libraries are missing: the
    Debian packages that hold them (kvdepot/DEBIAN_DEPENDS)."""
    deps = Path(__file__).resolve().parent / "DEBIAN_DEPENDS"
    if Path(path).parent != deps.parent or not deps.is_file() or \
            "cannot open shared object" not in str(err):
        return ""
    names = " ".join(deps.read_text().split())
    return f" (the library needs Debian's: apt install {names})"


def _mismatch(handle):
    """Why `handle` is not the library this package was written for, or
    None: its version (MAJOR.MINOR) and the size of every mirrored
    structure (kvd_struct_size) must match."""
    from kvdepot import __version__
    try:
        handle.kvd_version.restype = ctypes.c_char_p
        version = handle.kvd_version().decode()
        size = handle.kvd_struct_size
    except AttributeError:
        return ("a libkvdepot without kvd_struct_size (older than this "
                "package): rebuild it from this source tree")
    if version.split(".")[:2] != __version__.split(".")[:2]:
        return (f"libkvdepot {version}, this package is {__version__}: use "
                f"the library built with this package")
    size.restype = ctypes.c_size_t
    size.argtypes = [ctypes.c_char_p]
    for cls, name in _MIRRORS:
        want = size(name.encode())
        if want != ctypes.sizeof(cls):
            return (f"{name} is {want} bytes in the library and "
                    f"{ctypes.sizeof(cls)} in this package: the library was "
                    f"built from other headers; rebuild it or reinstall "
                    f"the package")
    return None


# kvd_log_sink_fn(void *arg, kvd_log_level_t level, const char *file,
#                 int line, const char *msg)
_LOG_SINK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int,
                             ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p)
# kvd_log_level_t -> logging's levels.
_LOG_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO,
               3: logging.DEBUG, 4: logging.DEBUG}
_clog = logging.getLogger("kvdepot.lib")
_sink = None  # the installed callback, kept alive while installed


def _log_to_python(_arg, level, file, line, msg):
    """Called by the library on any of its threads (ctypes takes the GIL;
    the library's calls release it, so no lock is held across)."""
    try:
        lvl = _LOG_LEVELS.get(level, logging.INFO)
        if _clog.isEnabledFor(lvl):
            _clog.handle(_clog.makeRecord(
                _clog.name, lvl, (file or b"?").decode(errors="replace"),
                line, "%s", ((msg or b"").decode(errors="replace"),), None))
    except Exception:  # a logging failure must never reach C
        pass


def _route_logs(handle):
    """Sends the library's messages to the "kvdepot.lib" logger, and back
    to the library's own stderr sink when the interpreter exits (a C
    thread may still log while Python shuts down)."""
    global _sink
    if os.environ.get("KVDEPOT_LOG_STDERR") == "1":
        return
    handle.kvd_log_set_sink.restype = None
    handle.kvd_log_set_sink.argtypes = [_LOG_SINK, ctypes.c_void_p]
    _sink = _LOG_SINK(_log_to_python)
    handle.kvd_log_set_sink(_sink, None)
    atexit.register(handle.kvd_log_set_sink, _LOG_SINK(), None)


_libc = ctypes.CDLL(ctypes.util.find_library("c"))
_libc.free.argtypes = [ctypes.c_void_p]


def status_str(status):
    try:
        return lib().kvd_status_str(status).decode()
    except OSError:
        return f"status {status}"


# ---- structures (the C headers' field order) -------------------------------

class Namespace(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint8 * 16)]


class BlockHash(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint8 * 32)]


class StoreKey(ctypes.Structure):
    _fields_ = [("ns", Namespace), ("hash", BlockHash)]


class NamespaceDesc(ctypes.Structure):
    _fields_ = [("model_id", ctypes.c_char_p), ("dtype", ctypes.c_uint32),
                ("k_codec", ctypes.c_uint32), ("v_codec", ctypes.c_uint32),
                ("num_layers", ctypes.c_uint32),
                ("first_layer", ctypes.c_uint32),
                ("num_kv_heads", ctypes.c_uint32),
                ("head_start", ctypes.c_uint32),
                ("total_kv_heads", ctypes.c_uint32),
                ("head_dim", ctypes.c_uint32), ("block_size", ctypes.c_uint32),
                ("tp_size", ctypes.c_uint32), ("tp_rank", ctypes.c_uint32),
                ("kv_combined", ctypes.c_bool),
                ("format_version", ctypes.c_uint32),
                ("tq_seed", ctypes.c_uint64),
                ("model_revision", ctypes.c_char_p),
                ("weight_quant", ctypes.c_char_p),
                ("model_overrides", ctypes.c_char_p),
                ("sliding_window", ctypes.c_uint32),
                ("generation", ctypes.c_uint64)]


# leader.h KVD_LEADER_NO_BLOCK: "the engine holds no block here".
NO_BLOCK = 0xFFFFFFFF


class LeaderConfig(ctypes.Structure):
    _fields_ = [("block_size", ctypes.c_uint32), ("ns", Namespace),
                ("root", BlockHash), ("num_workers", ctypes.c_uint32),
                ("layerwise", ctypes.c_bool),
                ("async_host_loads", ctypes.c_bool),
                ("no_retry", ctypes.c_bool), ("node_id", ctypes.c_char_p),
                ("lookup_timeout_ms", ctypes.c_uint32),
                ("shard_ns", ctypes.POINTER(Namespace)),
                ("num_shard_ns", ctypes.c_uint32)]


class LeaderTransfer(ctypes.Structure):
    _fields_ = [("node_id", ctypes.c_char_p), ("ns", Namespace),
                ("hashes", ctypes.POINTER(BlockHash)),
                ("num_hashes", ctypes.c_size_t),
                ("num_tokens", ctypes.c_uint64)]


class LeaderMmInput(ctypes.Structure):
    _fields_ = [("identifier", ctypes.c_char_p), ("offset", ctypes.c_uint64),
                ("length", ctypes.c_uint64)]


class LeaderRequest(ctypes.Structure):
    _fields_ = [("request_id", ctypes.c_char_p),
                ("tokens", ctypes.POINTER(ctypes.c_uint32)),
                ("num_tokens", ctypes.c_size_t),
                ("hashes", ctypes.POINTER(BlockHash)),
                ("num_hashes", ctypes.c_size_t),
                ("lora_name", ctypes.c_char_p), ("cache_salt", ctypes.c_char_p),
                ("source_node", ctypes.c_char_p),
                ("mm_inputs", ctypes.POINTER(LeaderMmInput)),
                ("num_mm_inputs", ctypes.c_size_t),
                ("prompt_embeds", ctypes.POINTER(ctypes.c_uint8)),
                ("num_prompt_embeds", ctypes.c_size_t)]


class ObjectFormat(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("num_layers", ctypes.c_uint32),
                ("num_planes", ctypes.c_uint32), ("num_heads", ctypes.c_uint32),
                ("head_dim", ctypes.c_uint32), ("block_size", ctypes.c_uint32),
                ("codec", ctypes.c_int * 2), ("tq_seed", ctypes.c_uint64)]


class KvLayout(ctypes.Structure):
    _fields_ = [("layer_base", ctypes.POINTER(ctypes.c_void_p)),
                ("num_blocks", ctypes.c_uint32),
                ("stride_plane", ctypes.c_int64),
                ("stride_block", ctypes.c_int64),
                ("stride_token", ctypes.c_int64),
                ("stride_head", ctypes.c_int64)]


class WorkerConfig(ctypes.Structure):
    _fields_ = [("store", ctypes.c_void_p), ("ns", Namespace),
                ("format", ObjectFormat), ("worker_rank", ctypes.c_uint32),
                ("tenant", ctypes.c_uint32), ("num_threads", ctypes.c_uint32),
                ("device", ctypes.c_int), ("plan_ns", Namespace),
                ("cuda_staging_blocks", ctypes.c_uint32),
                ("layerwise_saves", ctypes.c_bool),
                ("async_saves", ctypes.c_bool),
                ("max_inflight_save_bytes", ctypes.c_uint64),
                ("object_heads", ctypes.c_uint32),
                ("head_start", ctypes.c_uint32),
                ("cuda_copy_mode", ctypes.c_uint8),
                ("cuda_staging_buffers", ctypes.c_uint32)]


class FailedLoad(ctypes.Structure):
    _fields_ = [("request_id", ctypes.c_char_p), ("block_id", ctypes.c_int32),
                ("status", ctypes.c_int)]


class WorkerFinished(ctypes.Structure):
    _fields_ = [("step", ctypes.c_uint64),
                ("finished_saving", ctypes.POINTER(ctypes.c_char_p)),
                ("num_finished_saving", ctypes.c_size_t),
                ("finished_loading", ctypes.POINTER(ctypes.c_char_p)),
                ("loading_async", ctypes.POINTER(ctypes.c_bool)),
                ("num_finished_loading", ctypes.c_size_t),
                ("failed_loads", ctypes.POINTER(FailedLoad)),
                ("num_failed_loads", ctypes.c_size_t),
                ("report", ctypes.POINTER(ctypes.c_uint8)),
                ("report_len", ctypes.c_size_t)]


class WorkerStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "blocks_loaded", "load_errors", "promotions", "blocks_saved",
        "saves_skipped", "saves_dropped", "bytes_loaded", "bytes_saved",
        "async_loads_active", "saves_aborted", "header_errors",
        "saves_shed", "saves_inflight", "copy_ops")]


class LeaderGate(ctypes.Structure):
    _fields_ = [("enabled", ctypes.c_bool)] + [
        (name, ctypes.c_double) for name in (
            "margin", "prefill_tokens_per_s", "host_s_per_block",
            "disk_s_per_block", "host_latency_s", "disk_latency_s",
            "alpha")]


class LeaderStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "requests", "leases", "lookups", "matched_blocks", "planned_loads",
        "planned_saves", "failed_loads", "not_yet", "timeouts",
        "lookup_errors", "content_lookups", "content_blocks", "gate_loaded",
        "gate_skipped")]


class LeaderSavedBlock(ctypes.Structure):
    _fields_ = [("hash", BlockHash), ("parent", BlockHash),
                ("has_parent", ctypes.c_bool),
                ("tokens", ctypes.POINTER(ctypes.c_uint32)),
                ("lora_name", ctypes.c_char_p)]


class StoreEvent(ctypes.Structure):
    _fields_ = [("key", StoreKey), ("kind", ctypes.c_int)]


# The structures above and the C typedef each mirrors (checked at load).
_MIRRORS = (
    (Namespace, "kvd_namespace_t"), (BlockHash, "kvd_block_hash_t"),
    (StoreKey, "kvd_store_key_t"), (NamespaceDesc, "kvd_namespace_desc_t"),
    (LeaderConfig, "kvd_leader_config_t"),
    (LeaderTransfer, "kvd_leader_transfer_t"),
    (LeaderMmInput, "kvd_leader_mm_input_t"),
    (LeaderRequest, "kvd_leader_request_t"),
    (ObjectFormat, "kvd_object_format_t"), (KvLayout, "kvd_kv_layout_t"),
    (WorkerConfig, "kvd_worker_config_t"),
    (FailedLoad, "kvd_worker_failed_load_t"),
    (WorkerFinished, "kvd_worker_finished_t"),
    (WorkerStats, "kvd_worker_stats_t"), (LeaderStats, "kvd_leader_stats_t"),
    (LeaderGate, "kvd_leader_gate_t"),
    (LeaderSavedBlock, "kvd_leader_saved_block_t"),
    (StoreEvent, "kvd_store_event_t"),
)


# store.h kvd_store_event_kind_t.
STORE_EVENT_STORED, STORE_EVENT_REMOVED = 1, 2
KVD_ERR_PROTO, KVD_ERR_UNSUPPORTED = -5, -6


def _declare(h):
    vp, sz, u32, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32, \
        ctypes.c_uint64
    cp, st = ctypes.c_char_p, ctypes.c_int
    P = ctypes.POINTER
    sigs = {
        "kvd_status_str": (cp, [st]),
        "kvd_config_create": (st, [P(vp)]),
        "kvd_config_destroy": (None, [vp]),
        "kvd_config_set": (st, [vp, cp, cp]),
        "kvd_store_open": (st, [vp, P(vp), cp, sz]),
        "kvd_store_close": (None, [vp]),
        "kvd_store_flush": (st, [vp, ctypes.c_int]),
        "kvd_store_delete": (st, [vp, P(StoreKey), sz, P(sz)]),
        "kvd_codec_parse": (st, [cp, P(ctypes.c_int)]),
        "kvd_namespace_digest": (st, [P(NamespaceDesc), P(Namespace)]),
        "kvd_block_hash_seed": (st, [cp, P(BlockHash)]),
        "kvd_leader_create": (st, [P(LeaderConfig), vp, P(vp)]),
        "kvd_leader_destroy": (None, [vp]),
        "kvd_leader_set_namespace": (st, [vp, P(Namespace)]),
        "kvd_leader_set_namespaces": (st, [vp, P(Namespace), P(Namespace),
                                           u32]),
        "kvd_leader_get_num_new_matched_tokens": (
            st, [vp, P(LeaderRequest), u64, P(u64), P(ctypes.c_bool)]),
        "kvd_leader_update_state_after_alloc": (st, [vp, cp, P(u32), sz,
                                                     u64]),
        "kvd_leader_request_scheduled": (
            st, [vp, cp, P(u32), sz, P(u32), sz, P(BlockHash), sz, u64]),
        "kvd_leader_build_connector_meta": (st, [vp, P(vp), P(sz)]),
        "kvd_leader_update_connector_output": (st, [vp, ctypes.c_char_p,
                                                    sz]),
        "kvd_leader_take_failed_blocks": (sz, [vp, P(u32), sz]),
        "kvd_leader_take_finished_loads": (sz, [vp, P(cp), sz]),
        "kvd_leader_request_preempted": (st, [vp, cp]),
        "kvd_leader_request_finished": (st, [vp, cp, P(ctypes.c_bool)]),
        "kvd_leader_request_finished_transfer": (
            st, [vp, cp, P(ctypes.c_bool), P(LeaderTransfer)]),
        "kvd_worker_create": (st, [P(WorkerConfig), P(vp), cp, sz]),
        "kvd_worker_destroy": (None, [vp]),
        "kvd_worker_register_kv_caches": (st, [vp, P(KvLayout), cp, sz]),
        "kvd_worker_bind_metadata": (st, [vp, ctypes.c_char_p, sz, cp, sz]),
        "kvd_worker_start_load_kv": (st, [vp, vp]),
        "kvd_worker_wait_for_layer_load": (st, [vp, u32, vp]),
        "kvd_worker_save_kv_layer": (st, [vp, u32, vp]),
        "kvd_worker_wait_for_save": (st, [vp, vp]),
        "kvd_worker_abort_step": (st, [vp]),
        "kvd_worker_set_namespace": (st, [vp, P(Namespace), P(Namespace)]),
        "kvd_worker_clear_metadata": (st, [vp]),
        "kvd_worker_get_finished": (st, [vp, P(cp), sz, P(WorkerFinished)]),
        "kvd_worker_stats": (st, [vp, P(WorkerStats)]),
        "kvd_worker_flush_saves": (st, [vp]),
        "kvd_worker_blocks_fence": (st, [vp, vp]),
        "kvd_worker_request_saving": (st, [vp, cp, P(ctypes.c_bool)]),
        "kvd_leader_stats": (st, [vp, P(LeaderStats)]),
        "kvd_leader_set_saved_queue": (st, [vp, sz]),
        "kvd_leader_set_gate": (st, [vp, P(LeaderGate)]),
        "kvd_leader_gate_estimates": (st, [vp, P(LeaderGate)]),
        "kvd_leader_report_prefill": (st, [vp, ctypes.c_uint64,
                                           ctypes.c_double]),
        "kvd_leader_take_saved_blocks": (sz, [vp, P(LeaderSavedBlock), sz,
                                              P(u64)]),
        "kvd_store_events_enable": (st, [vp, sz]),
        "kvd_store_events_watch": (st, [vp, P(Namespace), sz]),
        "kvd_store_take_events": (st, [vp, P(StoreEvent), sz, P(sz),
                                       P(u64)]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(h, name)
        fn.restype = res
        fn.argtypes = args


_U32x1 = ctypes.c_uint32 * 1


def _u32_array(xs, what):
    """xs (any iterable of integers) as a ctypes uint32 array over an
    array.array's buffer: a tenth of the time of building the ctypes array
    from the values (1.5 ms for a 16k-token prompt), and a value that is
    not an integer in 0..2^32-1 is refused (ValueError naming `what`)
    instead of wrapped around. Returns (array, count); an empty xs gives a
    one-element array and count 0, so the library never sees NULL from
    here."""
    if isinstance(xs, (bytes, bytearray)):
        # array.array would read their raw bytes as 32-bit values (four
        # bytes one id); a byte string's ids are its bytes.
        xs = list(xs)
    try:
        buf = array.array("I", xs)
    except (OverflowError, TypeError) as e:
        raise ValueError(f"{what}: not an integer in 0..4294967295 ({e})") \
            from None
    if len(buf) == 0:
        return _U32x1(), 0
    # from_buffer keeps `buf` alive as long as the ctypes array.
    return (ctypes.c_uint32 * len(buf)).from_buffer(buf), len(buf)


if array.array("I").itemsize != 4:
    raise ImportError("kvdepot: array 'I' is not 32 bits on this platform")


def _u32s(xs, what="ids"):
    """xs as a uint32 array for one call; None when empty (the library
    takes NULL with a count of 0)."""
    n = len(xs)
    if n == 0:
        return None
    if n == 1:
        try:
            v = operator.index(xs[0])
        except TypeError as e:
            raise ValueError(f"{what}: not an integer ({e})") from None
        if not 0 <= v <= 0xFFFFFFFF:
            raise ValueError(f"{what}: {v} not in 0..4294967295")
        return _U32x1(v)
    return _u32_array(xs, what)[0]


def _check(what, status, reason=b""):
    if status != KVD_OK:
        if isinstance(reason, (bytes, bytearray)):
            reason = bytes(reason).split(b"\0", 1)[0].decode(errors="replace")
        raise KvdepotError(what, status, reason)


def codec_id(name):
    out = ctypes.c_int(0)
    _check(f"codec {name!r}", lib().kvd_codec_parse(name.encode(),
                                                      ctypes.byref(out)))
    return out.value


# The TurboQuant rotation seed the shims give their workers' formats (and
# so their namespaces).
TQ_SEED = 0x6b76646570

# kvd_codec_t values of the TurboQuant codecs (tq4, tq3, tq2): the codecs
# whose seed changes the bytes.
_TQ_CODECS = (5, 6, 7)


def _opt(text):
    return None if not text else str(text).encode()


def namespace(model_id, dtype, codec_k, codec_v, num_layers, num_kv_heads,
              head_dim, block_size, tp_size=1, tp_rank=0, kv_combined=False,
              tq_seed=0, revision=None, weight_quant=None, overrides=None,
              sliding_window=0, generation=0):
    """The namespace digest (common.h); dtype and codecs as kvdepot.v1 enum
    numbers (Codec = kvd_codec_t + 1). Everything else that changes the
    bytes: the TurboQuant seed (counted only when a plane uses TurboQuant),
    the weights' revision and quantization, a canonical text of the config
    overrides (hf_overrides, RoPE), the sliding window and the cache
    generation (bumped by reset_cache)."""
    planes = (codec_k,) if kv_combined else (codec_k, codec_v)
    seed = tq_seed if any(c in _TQ_CODECS for c in planes) else 0
    d = NamespaceDesc(model_id=model_id.encode(), dtype=dtype,
                      k_codec=codec_k + 1,
                      v_codec=0 if kv_combined else codec_v + 1,
                      num_layers=num_layers, first_layer=0,
                      num_kv_heads=num_kv_heads, head_start=0,
                      total_kv_heads=num_kv_heads * tp_size,
                      head_dim=head_dim, block_size=block_size,
                      tp_size=tp_size, tp_rank=tp_rank,
                      kv_combined=kv_combined, tq_seed=seed,
                      model_revision=_opt(revision),
                      weight_quant=_opt(weight_quant),
                      model_overrides=_opt(overrides),
                      sliding_window=int(sliding_window or 0),
                      generation=int(generation))
    ns = Namespace()
    _check("namespace", lib().kvd_namespace_digest(ctypes.byref(d),
                                                    ctypes.byref(ns)))
    return ns


def head_range(total, tp, tp_rank):
    """(heads, head_start) of rank `tp_rank` of `tp` in a model of `total`
    KV heads, as vLLM and TensorRT-LLM split them: evenly, rank r holding
    heads [r*n, (r+1)*n); with fewer heads than ranks, each head replicated
    on TP / total ranks, rank r holding head r * total / TP. ValueError for
    counts no engine splits that way."""
    if total >= tp:
        if total % tp != 0:
            raise ValueError(f"kvdepot: {total} KV heads do not split over "
                             f"{tp} ranks; set shared_objects: false")
        return total // tp, tp_rank * (total // tp)
    if tp % total != 0:
        raise ValueError(f"kvdepot: {total} KV heads are not replicated "
                         f"evenly on {tp} ranks; set shared_objects: false")
    return 1, tp_rank * total // tp


# ---- the store -------------------------------------------------------------

class Store:
    """An embedded store (store.h) opened with `settings` (store.* keys)."""

    def __init__(self, settings):
        L = lib()
        cfg = ctypes.c_void_p()
        _check("config", L.kvd_config_create(ctypes.byref(cfg)))
        try:
            for k, v in settings.items():
                _check(f"setting {k}", L.kvd_config_set(cfg, k.encode(),
                                                        str(v).encode()))
            self.handle = ctypes.c_void_p()
            err = ctypes.create_string_buffer(256)
            _check("store open", L.kvd_store_open(cfg, ctypes.byref(
                self.handle), err, len(err)), err.raw)
        finally:
            L.kvd_config_destroy(cfg)

    def flush(self, timeout_ms=10000):
        _check("store flush", lib().kvd_store_flush(self.handle, timeout_ms))

    def delete(self, ns, hashes):
        """Deletes the objects of `hashes` (hex strings or 32-byte values)
        under Namespace `ns`, in both tiers (store.h kvd_store_delete; in
        daemon mode an operator's call). Returns how many were deleted;
        absent keys are no error, a leased one raises KvdepotError (BUSY)."""
        keys = (StoreKey * len(hashes))()
        for k, h in zip(keys, hashes):
            raw = bytes.fromhex(h) if isinstance(h, str) else bytes(h)
            if len(raw) != 32:
                raise ValueError(f"kvdepot: a block hash has 32 bytes, "
                                 f"not {len(raw)}")
            k.ns = ns
            ctypes.memmove(k.hash.bytes, raw, 32)
        n = ctypes.c_size_t()
        _check("store delete", lib().kvd_store_delete(
            self.handle, keys, len(hashes), ctypes.byref(n)))
        return n.value

    def events_watch(self, namespaces):
        """Only these namespaces' events (16-byte values; store.h
        kvd_store_events_watch): needed in daemon mode, where the daemon
        reports only the namespaces a client names."""
        arr = (Namespace * max(1, len(namespaces)))()
        for i, ns in enumerate(namespaces):
            ctypes.memmove(arr[i].bytes, bytes(ns), 16)
        _check("store events_watch", lib().kvd_store_events_watch(
            self.handle, arr, len(namespaces)))

    def events_enable(self, capacity):
        """Starts (capacity > 0) or stops (0) recording key events
        (store.h kvd_store_events_enable). False when the store cannot
        (a daemon before protocol revision 8)."""
        s = lib().kvd_store_events_enable(self.handle, capacity)
        if s in (KVD_ERR_UNSUPPORTED, KVD_ERR_PROTO):
            return False
        _check("store events", s)
        return True

    def take_events(self, max_events=4096):
        """([(kind, namespace bytes, hash bytes)], dropped): the queued
        key events, oldest first (STORE_EVENT_STORED / _REMOVED), and how
        many were dropped for lack of room since the last call."""
        out, dropped = [], 0
        arr = (StoreEvent * max_events)()
        n, d = ctypes.c_size_t(0), ctypes.c_uint64(0)
        while True:
            _check("store take_events", lib().kvd_store_take_events(
                self.handle, arr, max_events, ctypes.byref(n),
                ctypes.byref(d)))
            dropped += d.value
            out.extend((arr[i].kind, bytes(arr[i].key.ns.bytes),
                        bytes(arr[i].key.hash.bytes))
                       for i in range(n.value))
            if n.value < max_events:
                return out, dropped

    def close(self):
        if self.handle:
            lib().kvd_store_flush(self.handle, 10000)
            lib().kvd_store_close(self.handle)
            self.handle = None


# ---- the leader ------------------------------------------------------------

def _namespaces(nss):
    """A C array of the Namespaces in `nss`, or None (NULL) when empty; the
    leader copies it in the call."""
    nss = list(nss or ())
    return (Namespace * len(nss))(*nss) if nss else None


class Leader:
    """One kvd_leader_t over an embedded store (leader.h)."""

    def __init__(self, store, block_size, ns, num_workers=1, layerwise=True,
                 lookup_timeout_ms=0, no_retry=False, seed=b"kvdepot",
                 node_id="", shard_ns=(), async_host_loads=False):
        """`shard_ns`: the namespaces of the block's other shards (the
        tensor-parallel ranks other than rank 0, whose namespace is `ns`):
        a block counts as stored only when every one holds it.
        `async_host_loads`: loads from the host arena are asynchronous too
        (the engine holds the request until every worker reported them)."""
        L = lib()
        shards = _namespaces(shard_ns)
        cfg = LeaderConfig(block_size=block_size, ns=ns,
                           num_workers=num_workers, layerwise=layerwise,
                           no_retry=no_retry, node_id=node_id.encode(),
                           async_host_loads=async_host_loads,
                           lookup_timeout_ms=lookup_timeout_ms,
                           shard_ns=shards, num_shard_ns=len(shard_ns or ()))
        _check("block hash seed", L.kvd_block_hash_seed(seed,
                                                        ctypes.byref(cfg.root)))
        self._store = store  # the leader borrows it: keep it open
        self.handle = ctypes.c_void_p()
        self._request_scheduled = L.kvd_leader_request_scheduled
        _check("leader create", L.kvd_leader_create(
            ctypes.byref(cfg), store.handle,
            ctypes.byref(self.handle)))

    def match(self, request_id, tokens, num_computed, lora_name=None,
              cache_salt=None, source_node=None, mm_inputs=(),
              prompt_embeds=None):
        """(matched, is_async), or None for "not yet". `source_node`: the
        node that computed the blocks (prefill -> decode), asked first.
        `mm_inputs`: the request's multimodal inputs as (identifier,
        offset, length) sorted by offset (leader.h kvd_leader_mm_input_t);
        they enter the keys of the blocks they overlap. `prompt_embeds`: a
        prompt given as embeddings, the 32-byte SHA-256 of each block's
        slice of it (None: a prompt of tokens)."""
        toks, ntoks = _u32_array(tokens, "tokens")
        emb = None
        if prompt_embeds is not None:
            raw = b"".join(bytes(d) for d in prompt_embeds)
            if any(len(d) != 32 for d in prompt_embeds):
                raise ValueError("prompt_embeds: 32-byte digests")
            emb = (ctypes.c_uint8 * max(1, len(raw))).from_buffer_copy(
                raw or b"\0")
        mm = (LeaderMmInput * len(mm_inputs))(*[
            LeaderMmInput(None if i is None else i.encode(), o, n)
            for i, o, n in mm_inputs])
        q = LeaderRequest(request_id=request_id.encode(), tokens=toks,
                          num_tokens=ntoks,
                          lora_name=lora_name.encode() if lora_name else None,
                          cache_salt=cache_salt.encode() if cache_salt
                          else None,
                          source_node=source_node.encode() if source_node
                          else None,
                          mm_inputs=mm if mm_inputs else None,
                          num_mm_inputs=len(mm_inputs),
                          prompt_embeds=emb,
                          num_prompt_embeds=len(prompt_embeds or ()))
        m, a = ctypes.c_uint64(0), ctypes.c_bool(False)
        s = lib().kvd_leader_get_num_new_matched_tokens(
            self.handle, ctypes.byref(q), num_computed, ctypes.byref(m),
            ctypes.byref(a))
        if s == KVD_AGAIN:
            return None
        _check("get_num_new_matched_tokens", s)
        return m.value, a.value

    def update_state_after_alloc(self, request_id, block_ids, num_external):
        ids, nids = _u32_array(block_ids, "block_ids")
        _check("update_state_after_alloc",
               lib().kvd_leader_update_state_after_alloc(
                   self.handle, request_id.encode(), ids, nids,
                   num_external))

    def request_scheduled(self, request_id, new_block_ids, new_tokens,
                          num_computed):
        # Once per running request per step: the function is bound once
        # and a decode step's one token needs no array type built.
        s = self._request_scheduled(
            self.handle, request_id.encode(), _u32s(new_block_ids, "block_ids"),
            len(new_block_ids), _u32s(new_tokens, "tokens"), len(new_tokens),
            None, 0,
            num_computed)
        if s != KVD_OK:
            _check("request_scheduled", s)

    def build_connector_meta(self):
        buf, n = ctypes.c_void_p(), ctypes.c_size_t(0)
        _check("build_connector_meta", lib().kvd_leader_build_connector_meta(
            self.handle, ctypes.byref(buf), ctypes.byref(n)))
        try:
            return ctypes.string_at(buf, n.value)
        finally:
            _libc.free(buf)

    def update_connector_output(self, report):
        _check("update_connector_output",
               lib().kvd_leader_update_connector_output(self.handle, report,
                                                        len(report)))

    def take_failed_blocks(self):
        out, arr = [], (ctypes.c_uint32 * 256)()
        while True:
            n = lib().kvd_leader_take_failed_blocks(self.handle, arr, 256)
            out.extend(arr[:n])
            if n < 256:
                return out

    def take_finished_loads(self):
        out, arr = [], (ctypes.c_char_p * 256)()
        while True:
            n = lib().kvd_leader_take_finished_loads(self.handle, arr, 256)
            out.extend(arr[i].decode() for i in range(n))
            if n < 256:
                return out

    def request_preempted(self, request_id):
        s = lib().kvd_leader_request_preempted(self.handle,
                                               request_id.encode())
        if s not in (KVD_OK, KVD_ERR_NOT_FOUND):  # never seen: nothing held
            _check("request_preempted", s)

    def request_finished(self, request_id):
        """True when the engine must keep the blocks until the saves are
        reported (vLLM's delay_free)."""
        d = ctypes.c_bool(False)
        s = lib().kvd_leader_request_finished(self.handle,
                                              request_id.encode(),
                                              ctypes.byref(d))
        if s == KVD_ERR_NOT_FOUND:  # the leader never saw it
            return False
        _check("request_finished", s)
        return d.value

    def request_finished_transfer(self, request_id):
        """request_finished for a request a decode node takes over:
        (delay_free, hand-off dict with node, ns, hashes (hex) and
        num_tokens), or (False, None) for a request the leader never saw."""
        d, t = ctypes.c_bool(False), LeaderTransfer()
        s = lib().kvd_leader_request_finished_transfer(
            self.handle, request_id.encode(), ctypes.byref(d),
            ctypes.byref(t))
        if s == KVD_ERR_NOT_FOUND:
            return False, None
        _check("request_finished_transfer", s)
        return d.value, {
            "node": (t.node_id or b"").decode(),
            "ns": bytes(t.ns.bytes).hex(),
            "hashes": [bytes(t.hashes[i].bytes).hex()
                       for i in range(t.num_hashes)],
            "num_tokens": t.num_tokens,
        }

    def stats(self):
        s = LeaderStats()
        _check("leader stats", lib().kvd_leader_stats(self.handle,
                                                      ctypes.byref(s)))
        return {name: getattr(s, name) for name, _ in LeaderStats._fields_}

    def set_gate(self, **gate):
        """Turns the recompute-vs-fetch gate on with these values
        (leader.h kvd_leader_gate_t: margin, prefill_tokens_per_s,
        host_s_per_block, disk_s_per_block, host_latency_s, disk_latency_s,
        alpha), or off with enabled=False."""
        g = LeaderGate(enabled=gate.pop("enabled", True))
        for k, v in gate.items():
            if k not in dict(LeaderGate._fields_):
                raise ValueError(f"kvdepot: unknown gate setting {k!r}")
            setattr(g, k, float(v))
        _check("leader gate", lib().kvd_leader_set_gate(self.handle,
                                                        ctypes.byref(g)))

    def report_prefill(self, tokens, seconds):
        """The engine computed `tokens` prompt tokens in `seconds`: the
        gate's prefill rate moves toward their ratio."""
        _check("leader report prefill", lib().kvd_leader_report_prefill(
            self.handle, int(tokens), float(seconds)))

    def gate_estimates(self):
        """The gate's estimates now, as a dict."""
        g = LeaderGate()
        _check("leader gate estimates", lib().kvd_leader_gate_estimates(
            self.handle, ctypes.byref(g)))
        return {name: getattr(g, name) for name, _ in LeaderGate._fields_}

    def set_saved_queue(self, capacity):
        """Queue (capacity > 0) or not (0) the blocks whose saves every
        worker reported finished (leader.h kvd_leader_set_saved_queue)."""
        _check("leader saved queue", lib().kvd_leader_set_saved_queue(
            self.handle, capacity))

    def take_saved_blocks(self, block_size, max_blocks=1024):
        """([(hash, parent or None, tokens or None, lora_name or None)],
        dropped): the saved blocks queued, oldest first, hashes as bytes."""
        out, dropped = [], 0
        arr = (LeaderSavedBlock * max_blocks)()
        d = ctypes.c_uint64(0)
        while True:
            n = lib().kvd_leader_take_saved_blocks(self.handle, arr,
                                                   max_blocks, ctypes.byref(d))
            dropped += d.value
            for b in arr[:n]:
                out.append((bytes(b.hash.bytes),
                            bytes(b.parent.bytes) if b.has_parent else None,
                            list(b.tokens[:block_size]) if b.tokens
                            else None,
                            b.lora_name.decode(errors="replace")
                            if b.lora_name else None))
            if n < max_blocks:
                return out, dropped

    def set_namespace(self, ns, shard_ns=None):
        """A new namespace generation: nothing saved before is matched.
        `shard_ns` (a list, possibly empty) replaces the shard namespaces
        too; None leaves them as they are."""
        if shard_ns is None:
            _check("leader set_namespace", lib().kvd_leader_set_namespace(
                self.handle, ctypes.byref(ns)))
            return
        _check("leader set_namespaces", lib().kvd_leader_set_namespaces(
            self.handle, ctypes.byref(ns), _namespaces(shard_ns),
            len(shard_ns)))

    def close(self):
        if self.handle:
            lib().kvd_leader_destroy(self.handle)
            self.handle = None


# ---- the worker ------------------------------------------------------------

class Worker:
    """One kvd_worker_t (worker.h): device 0 is the host backend, 1 the CUDA
    backend, whose calls take the engine's cudaStream_t (an int; None is
    the legacy default stream). layerwise_saves: the engine calls
    save_kv_layer for every layer it computes, so a step missing one is
    aborted, not committed (worker.h). async_saves: a step's saves are
    committed after wait_for_save returns, at most
    max_inflight_save_bytes of them at once (0: 1 GiB). object_heads: the
    stored object holds that many KV heads, this worker's fmt.num_heads of
    them from head_start (tensor-parallel ranks writing one object; 0: the
    object is this worker's alone). cuda_staging_blocks,
    cuda_staging_buffers, cuda_copy_mode: the CUDA backend's (worker.h;
    0 = its defaults)."""

    def __init__(self, store, ns, fmt, rank=0, threads=0, plan_ns=None,
                 device=0, layerwise_saves=False, async_saves=False,
                 max_inflight_save_bytes=0, object_heads=0, head_start=0,
                 cuda_staging_blocks=0, cuda_staging_buffers=0,
                 cuda_copy_mode=0):
        cfg = WorkerConfig(store=store.handle, ns=ns, format=fmt,
                           worker_rank=rank, num_threads=threads,
                           device=device, layerwise_saves=layerwise_saves,
                           async_saves=async_saves,
                           max_inflight_save_bytes=max_inflight_save_bytes,
                           object_heads=object_heads, head_start=head_start,
                           cuda_staging_blocks=cuda_staging_blocks,
                           cuda_staging_buffers=cuda_staging_buffers,
                           cuda_copy_mode=cuda_copy_mode)
        if plan_ns is not None:  # plans name blocks in another namespace
            cfg.plan_ns = plan_ns
        self.handle = ctypes.c_void_p()
        err = ctypes.create_string_buffer(256)
        _check("worker create", lib().kvd_worker_create(
            ctypes.byref(cfg), ctypes.byref(self.handle), err, len(err)),
            err.raw)
        self._bases = None

    def register_kv_caches(self, bases, num_blocks, strides):
        """bases: one address per layer; strides: (plane, block, token, head)
        in bytes."""
        self._bases = (ctypes.c_void_p * len(bases))(*bases)
        lo = KvLayout(layer_base=self._bases, num_blocks=num_blocks,
                      stride_plane=strides[0], stride_block=strides[1],
                      stride_token=strides[2], stride_head=strides[3])
        err = ctypes.create_string_buffer(256)
        _check("register_kv_caches", lib().kvd_worker_register_kv_caches(
            self.handle, ctypes.byref(lo), err, len(err)), err.raw)

    def bind_metadata(self, plan):
        err = ctypes.create_string_buffer(256)
        _check("bind_connector_metadata", lib().kvd_worker_bind_metadata(
            self.handle, plan, len(plan), err, len(err)), err.raw)

    def start_load_kv(self, stream=None):
        _check("start_load_kv", lib().kvd_worker_start_load_kv(self.handle,
                                                               stream))

    def wait_for_layer_load(self, layer, stream=None):
        _check("wait_for_layer_load", lib().kvd_worker_wait_for_layer_load(
            self.handle, layer, stream))

    def save_kv_layer(self, layer, stream=None):
        _check("save_kv_layer", lib().kvd_worker_save_kv_layer(
            self.handle, layer, stream))

    def wait_for_save(self, stream=None):
        _check("wait_for_save", lib().kvd_worker_wait_for_save(self.handle,
                                                               stream))

    def abort_step(self):
        """The step failed: none of its saves is committed."""
        _check("abort_step", lib().kvd_worker_abort_step(self.handle))

    def set_namespace(self, ns, plan_ns=None):
        """A new namespace generation (between steps): later saves and
        loads use `ns`, plans name keys in `plan_ns` (None: `ns`)."""
        _check("worker set_namespace", lib().kvd_worker_set_namespace(
            self.handle, ctypes.byref(ns),
            ctypes.byref(plan_ns if plan_ns is not None else Namespace())))

    def clear_metadata(self):
        _check("clear_connector_metadata",
               lib().kvd_worker_clear_metadata(self.handle))

    def get_finished(self, finished_req_ids=()):
        """(saving ids, [(loading id, is_async)], [(id, block, status)],
        report bytes)."""
        ids = [i.encode() for i in finished_req_ids]
        arr = (ctypes.c_char_p * max(1, len(ids)))(*ids)
        f = WorkerFinished()
        _check("get_finished", lib().kvd_worker_get_finished(
            self.handle, arr, len(ids), ctypes.byref(f)))
        saving = [f.finished_saving[i].decode()
                  for i in range(f.num_finished_saving)]
        loading = [(f.finished_loading[i].decode(), bool(f.loading_async[i]))
                   for i in range(f.num_finished_loading)]
        failed = [(f.failed_loads[i].request_id.decode(),
                   f.failed_loads[i].block_id, f.failed_loads[i].status)
                  for i in range(f.num_failed_loads)]
        return saving, loading, failed, ctypes.string_at(f.report,
                                                         f.report_len)

    def flush_saves(self):
        """Waits until no earlier step's save is in flight."""
        _check("flush_saves", lib().kvd_worker_flush_saves(self.handle))

    def blocks_fence(self, stream=None):
        """The engine writes blocks next, before binding its plan: earlier
        steps' copies out of the cache end first (worker.h)."""
        _check("blocks_fence", lib().kvd_worker_blocks_fence(self.handle,
                                                             stream))

    def request_saving(self, request_id):
        """True while a save of the request is in flight."""
        out = ctypes.c_bool()
        _check("request_saving", lib().kvd_worker_request_saving(
            self.handle, request_id.encode(), ctypes.byref(out)))
        return out.value

    def stats(self):
        s = WorkerStats()
        _check("worker stats", lib().kvd_worker_stats(self.handle,
                                                      ctypes.byref(s)))
        return {name: getattr(s, name) for name, _ in WorkerStats._fields_}

    def close(self):
        if self.handle:
            lib().kvd_worker_destroy(self.handle)
            self.handle = None
