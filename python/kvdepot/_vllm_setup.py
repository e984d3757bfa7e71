"""What the vLLM setup says before the connector starts: the supported
vLLM releases, the engine settings the connector refuses (with the
reason), the KV cache's element type, and this worker's place in tensor
and pipeline parallelism. kvdepot.vllm re-exports the public names."""

from __future__ import annotations

import logging
import re

from kvdepot._shared import _DTYPES, _dtype_name

# The connector's logger: a refusal or warning reads as the connector's.
log = logging.getLogger("kvdepot.vllm")


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


def _pp_rank(pc, tp, pp):
    """This worker's pipeline stage."""
    if pp == 1:
        return 0
    try:
        from vllm.distributed.parallel_state import get_pp_group
        return get_pp_group().rank_in_group
    except (ImportError, AssertionError):  # no vLLM, or no PP group (tests)
        return (getattr(pc, "rank", 0) // tp) % pp


# ---- vLLM versions --------------------------------------------------------------

# The vLLM releases `make test-vllm` runs the connector against (docs/vllm.md),
# and the range the package declares (pyproject.toml, the `vllm` extra):
# from the oldest tested release up to, not including, the next minor
# release after the newest. The connector API is experimental and changes
# between releases; a release past the range is refused unless the operator
# says otherwise (allow_untested_vllm), since a changed call order could
# serve wrong KV.
VLLM_TESTED = ("0.19.1", "0.33.0")
VLLM_MIN = "0.19.1"
VLLM_BELOW = "0.34"


def _version_tuple(v):
    """(major, minor, patch) of a version string ("0.33.0", "0.19.1+cpu",
    "0.34.0rc1", "0.20.0.dev12+g1234"): its leading numbers."""
    m = re.match(r"\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(v))
    if m is None:
        raise ValueError(f"kvdepot: cannot read vLLM version {v!r}")
    return tuple(int(x or 0) for x in m.groups())


def check_vllm_version(version, allow_untested=False):
    """Refuses a vLLM release outside the supported range with a message
    that names the range; a newer one is run only with allow_untested (and
    a WARNING). Returns the version."""
    v = _version_tuple(version)
    supported = (f"vLLM >={VLLM_MIN},<{VLLM_BELOW} (tested: "
                 f"{', '.join(VLLM_TESTED)})")
    if v < _version_tuple(VLLM_MIN):
        raise ValueError(f"kvdepot: vLLM {version} is not supported: the "
                         f"connector needs {supported}; upgrade vLLM")
    if v >= _version_tuple(VLLM_BELOW):
        if not allow_untested:
            raise ValueError(
                f"kvdepot: vLLM {version} is newer than this kvdepot is "
                f"tested with ({supported}); its connector API may have "
                f"changed in ways that serve wrong KV. Upgrade kvdepot, or "
                f"set \"allow_untested_vllm\": true in "
                f"kv_connector_extra_config to run it anyway")
        log.warning("kvdepot: vLLM %s is untested (supported: %s); running "
                    "it because allow_untested_vllm is set", version,
                    supported)
    return version


# ---- what else makes KV differ -------------------------------------------------

# --kv-cache-dtype values whose caches hold fp8 bytes (vLLM allocates them
# as uint8): the raw codec moves them as they are.
_FP8_CACHE_DTYPES = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn",
                     "fp8_e5m2": "float8_e5m2"}

# Speculative decoding methods that add no layers to the KV cache.
_SPEC_WITHOUT_KV = ("ngram", "suffix")


def _kv_dtype(vllm_config, codecs):
    """The KV cache's element type: the model's dtype, or an fp8 type for
    --kv-cache-dtype fp8*, which only the raw codec can carry (the bytes
    are already quantized with the engine's scales)."""
    mc, cc = vllm_config.model_config, vllm_config.cache_config
    cd = str(getattr(cc, "cache_dtype", "auto") or "auto")
    if cd == "auto":
        dt = _dtype_name(mc.dtype)
    elif cd in _FP8_CACHE_DTYPES:
        dt = _FP8_CACHE_DTYPES[cd]
        bad = [c for c in codecs if c != "raw"]
        if bad:
            raise ValueError(
                f"kvdepot: codec {bad[0]} needs K/V in the model's dtype, "
                f"but --kv-cache-dtype {cd} caches already hold fp8 bytes; "
                f"use codec \"raw\" (the fp8 bytes are stored as they are)")
        if getattr(cc, "calculate_kv_scales", False):
            raise ValueError(
                "kvdepot: calculate_kv_scales derives the fp8 KV scales from "
                "the first batch, so the same tokens give other bytes in "
                "another run and stored KV would be read with the wrong "
                "scales; use the checkpoint's scales (the default)")
    elif cd in _DTYPES:
        dt = cd
    else:
        raise ValueError(f"kvdepot: --kv-cache-dtype {cd} is not supported "
                         f"(auto, fp8, fp8_e4m3, fp8_e5m2, or the model's "
                         f"float16 / bfloat16)")
    if dt not in _DTYPES:
        raise ValueError(f"kvdepot: KV dtype {dt} is not supported")
    return dt


def _check_engine(vllm_config):
    """Refuses settings whose KV the connector cannot key or restore
    whole, with the reason: speculative decoding with draft layers in the
    KV cache, encoder-decoder models (cross-attention KV comes from the
    encoder's input, not from the prompt's tokens)."""
    sc = getattr(vllm_config, "speculative_config", None)
    method = getattr(sc, "method", None) if sc is not None else None
    if sc is not None and method not in _SPEC_WITHOUT_KV:
        raise ValueError(
            f"kvdepot: speculative decoding with method {method!r} keeps "
            f"the draft model's layers in the KV cache, and their KV depends "
            f"on tokens after each block (vLLM hashes those in too); kvdepot "
            f"stores the target model's KV only. Use ngram or suffix "
            f"speculation, or none")
    pc = vllm_config.parallel_config
    if getattr(pc, "enable_dbo", False) or \
            getattr(pc, "ubatch_size", 1) > 1:
        raise ValueError("kvdepot: micro-batching (--enable-dbo, "
                         "ubatch_size) calls save_kv_layer once per "
                         "micro-batch, and a layer would be copied before "
                         "the later micro-batches wrote it; run without it")
    for name in ("decode_context_parallel_size",
                 "prefill_context_parallel_size"):
        if getattr(pc, name, 1) > 1:
            raise ValueError(f"kvdepot: {name} > 1 splits each block's "
                             f"tokens across ranks, which kvdepot's blocks "
                             f"do not describe yet; run without it")
    if getattr(vllm_config.model_config, "is_encoder_decoder", False):
        raise ValueError("kvdepot: encoder-decoder models are not supported: "
                         "their cross-attention KV comes from the encoder's "
                         "input, which the block keys do not cover")


def _stage_layers(vllm_config, pp_rank, pp_size):
    """[start, end) of the model layers pipeline stage pp_rank runs:
    vLLM's own partition (get_pp_indices, VLLM_PP_LAYER_PARTITION
    included), or its default split when vLLM is not importable."""
    mc = vllm_config.model_config
    get_total = getattr(mc, "get_total_num_hidden_layers", None)
    total = get_total() if callable(get_total) else getattr(
        getattr(mc, "hf_config", None), "num_hidden_layers", None)
    if total is None:
        if pp_size == 1:
            return 0, mc.get_num_layers(vllm_config.parallel_config)
        raise ValueError("kvdepot: pipeline parallelism: the model config "
                         "does not say how many layers the model has")
    try:
        from vllm.distributed.utils import get_pp_indices
        return tuple(get_pp_indices(total, pp_rank, pp_size))
    except ImportError:
        parts = [total // pp_size] * pp_size
        for i in range(2, total % pp_size + 2):
            parts[-i] += 1
        start = sum(parts[:pp_rank])
        return start, start + parts[pp_rank]
