"""What the engine connectors share: the in-process embedded store (one per
set of store settings, reference-counted), KV tensor layouts read from
shapes and strides, and dtype numbers."""

import threading

from kvdepot import _lib

# kvdepot.v1.Dtype numbers for the namespace.
_DTYPES = {"float16": 1, "bfloat16": 2, "float8_e4m3fn": 4,
           "float8_e5m2": 5}
# kernels.h kvd_dtype_t for the object format.
_KVD_DTYPES = {"float16": 1, "bfloat16": 2, "float8_e4m3fn": 3,
               "float8_e5m2": 4}
_FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


# ---- the in-process store ---------------------------------------------------

_stores = {}
_stores_lock = threading.Lock()


def _store_acquire(settings):
    key = tuple(sorted(settings.items()))
    with _stores_lock:
        entry = _stores.get(key)
        if entry is None:
            entry = [_lib.Store(settings), 0]
            _stores[key] = entry
        entry[1] += 1
        return key, entry[0]


def _store_release(key):
    with _stores_lock:
        entry = _stores.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            entry[0].close()
            del _stores[key]


# ---- layouts ----------------------------------------------------------------

# kvd_worker_device_t (worker.h).
_DEVICE_HOST, _DEVICE_CUDA = 0, 1


def _worker_device(t, what="KV tensor"):
    """The worker backend that can address `t`: the host backend for a CPU
    tensor, the CUDA backend for a CUDA tensor (a build without CUDA, or a
    machine without a GPU, says so when the worker is created). Anything
    else (torch's meta device, other accelerators) is refused: its
    data_ptr() is an address neither backend may dereference."""
    device = getattr(t, "device", None)
    kind = getattr(device, "type", "cpu")
    if kind == "cpu":
        return _DEVICE_HOST
    if kind == "cuda":
        return _DEVICE_CUDA
    raise ValueError(f"kvdepot: {what} on {device}: the worker copies host "
                     f"memory (CPU tensors) or CUDA device memory, and "
                     f"cannot address a {kind} tensor")


def _stream_of(device, stream=None):
    """The cudaStream_t (as an int) for a worker call: `stream` (a
    torch.cuda.Stream, or None for torch's current stream) with the CUDA
    backend, None with the host backend, which has no stream."""
    if device != _DEVICE_CUDA:
        return None
    if stream is None:
        import torch
        stream = torch.cuda.current_stream()
    return getattr(stream, "cuda_stream", stream)


def _layout_of(t, kind, num_heads):
    """(num_blocks, (plane, block, token, head) byte strides, planes, heads,
    head_dim) of one layer's KV tensor."""
    _worker_device(t)
    shape, st, e = tuple(t.shape), t.stride(), t.element_size()
    if kind == "auto":
        if len(shape) == 3:
            kind = "mla"
        elif len(shape) == 5 and shape[0] == 2 and shape[1] != 2:
            kind = "cpu" if shape[2] == num_heads and shape[3] != num_heads \
                else "flash"
        elif len(shape) == 5 and shape[1] == 2:
            kind = "flashinfer"
        else:
            raise ValueError(f"kvdepot: cannot tell the layout of a KV "
                             f"tensor of shape {shape}; set kv_layout")
    if kind == "mla":
        if len(shape) != 3:
            raise ValueError(f"kvdepot: MLA tensor of shape {shape}")
        return shape[0], (0, st[0] * e, st[1] * e, 0), 1, 1, shape[2]
    if len(shape) != 5:
        raise ValueError(f"kvdepot: {kind} tensor of shape {shape}")
    dims = {"flash": (0, 1, 2, 3), "flashinfer": (1, 0, 2, 3),
            "cpu": (0, 1, 3, 2)}[kind]
    p, b, tk, h = dims
    return (shape[b], (st[p] * e, st[b] * e, st[tk] * e, st[h] * e), 2,
            shape[h], shape[4])
