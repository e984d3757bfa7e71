"""What the engine connectors share: the in-process embedded store (one per
set of store settings, reference-counted), KV tensor layouts read from
shapes and strides, and dtype numbers."""

import threading

from kvdepot import _lib

# kvdepot.v1.Dtype numbers for the namespace.
_DTYPES = {"float16": 1, "bfloat16": 2, "float8_e4m3fn": 4}
# kernels.h kvd_dtype_t for the object format.
_KVD_DTYPES = {"float16": 1, "bfloat16": 2, "float8_e4m3fn": 3}


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

def _host_tensor(t, what="KV tensor"):
    """Refuses a tensor the worker cannot address: the worker in this
    build copies with the CPU kernels (host backend), so a GPU tensor's
    data_ptr() is a device address it must never dereference."""
    device = getattr(t, "device", None)
    kind = getattr(device, "type", "cpu")
    if kind != "cpu":
        raise ValueError(f"kvdepot: {what} on {device}: this build's worker "
                         f"copies host memory only (no GPU backend), so it "
                         f"cannot address it; run the engine's KV cache on "
                         f"the CPU or use a build with the GPU backend")


def _layout_of(t, kind, num_heads):
    """(num_blocks, (plane, block, token, head) byte strides, planes, heads,
    head_dim) of one layer's KV tensor."""
    _host_tensor(t)
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
