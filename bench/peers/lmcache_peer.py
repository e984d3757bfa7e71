"""LMCache's own storage tiers on the objects kvdepot's store benchmark uses.

N objects of SIZE bytes (uint8, non-zero random source bytes), distinct
CacheEngineKeys. One untimed warm-up pass (LMCache's CPU arena is plain
lazily-faulted memory on a host without a GPU, where cudaHostAlloc would
have made it resident), then three timed passes with fresh keys; the median
pass is reported for store and retrieve separately. Every retrieved byte is
compared with the source outside the timed regions. The copies in and out
stand in for the engine's and run on one thread (torch.set_num_threads(1)),
as kvdepot's side copies with one memcpy per object: the figure is the
store's, not the harness's thread count.

CPU tier (LocalCPUBackend with its own MixedMemoryAllocator arena):
  store    = allocate a MemoryObj from the backend + copy the source bytes
             into it + submit_put_task + contains (visible) + drop our ref;
  retrieve = get_blocking + copy the bytes out into a destination tensor +
             drop the ref.

Disk tier (LocalDiskBackend under a directory, with a LocalCPUBackend that
keeps no hot copy and only serves as its staging allocator, as LMCache wires
it):
  store    = allocate + copy in + submit_put_task, timed until every write
             has completed (LMCache's completion callback, which fires after
             its write and index insert); LMCache's O_DIRECT option is on,
             since kvdepot writes with O_DIRECT; LMCache itself never fsyncs;
  retrieve = after an fsync + POSIX_FADV_DONTNEED of every file it wrote
             (untimed), batched_get_blocking of all keys (LMCache's concurrent
             read path) + copy out + drop the refs.

Runnable as `python lmcache_peer.py cpu|disk [--objects N] [--size BYTES]
[--dir D] [--buffered]`; prints one JSON line.
"""

import argparse
import asyncio
import json
import math
import os
import shutil
import statistics
import sys
import threading
import time

os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")

import torch  # noqa: E402

import lmcache  # noqa: E402
from lmcache.utils import (  # noqa: E402
    CacheEngineKey,
    start_loop_in_thread_with_exceptions,
)
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.memory_management import MemoryObj  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.storage_backend.local_cpu_backend import (  # noqa: E402
    LocalCPUBackend,
)
from lmcache.v1.storage_backend.local_disk_backend import (  # noqa: E402
    LocalDiskBackend,
)

PASSES = 3
WARMUP = 1
TOKENS = 256
MODEL = "kvdepot-bench"
WRITE_TIMEOUT_S = 600.0
GIB = 1024**3


torch.set_num_threads(1)


def version() -> str:
    return lmcache.__version__


def _kv_shape(size: int) -> torch.Size:
    for layers in (32, 16, 8, 4, 2, 1):
        if size % (2 * layers * TOKENS) == 0:
            hidden = size // (2 * layers * TOKENS)
            return torch.Size([2, layers, TOKENS, hidden])
    raise ValueError(f"size {size} is not a multiple of {2 * TOKENS} bytes")


def _metadata(shape: torch.Size) -> LMCacheMetadata:
    kv, layers, tokens, hidden = shape
    return LMCacheMetadata(
        model_name=MODEL, world_size=1, local_world_size=1, worker_id=0,
        local_worker_id=0, kv_dtype=torch.uint8,
        kv_shape=(layers, kv, tokens, 1, hidden), chunk_size=tokens,
    )


def _arena_gib(objects: int, size: int) -> int:
    return math.ceil(objects * size / GIB) + 1


def _keys(objects: int, pass_no: int) -> list[CacheEngineKey]:
    first = pass_no * objects
    return [CacheEngineKey(MODEL, 1, 0, first + i, torch.uint8)
            for i in range(objects)]


def _buffers(objects: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.randint(1, 256, (objects, size), dtype=torch.uint8)
    return src, torch.zeros_like(src)


def _allocate(backend: LocalCPUBackend, shape: torch.Size) -> MemoryObj:
    obj = backend.allocate(shape, torch.uint8, eviction=False)
    if obj is None:
        raise RuntimeError("LMCache's CPU allocator is out of memory")
    return obj


def _copy_out(objs: list[MemoryObj | None], dst: torch.Tensor,
              shape: torch.Size) -> None:
    for obj, d in zip(objs, dst, strict=True):
        if obj is None:
            raise RuntimeError("LMCache returned no object for a stored key")
        d.view(shape).copy_(obj.tensor)
        obj.ref_count_down()


def _verify(src: torch.Tensor, dst: torch.Tensor) -> None:
    if not torch.equal(src, dst):
        raise RuntimeError("retrieved bytes differ from the stored bytes")
    dst.zero_()


def _result(objects: int, size: int, passes: list[tuple[float, float]],
            detail: str) -> dict:
    total = objects * size
    store, retrieve = zip(*passes)
    return {
        "store_bytes_per_s": total / statistics.median(store),
        "retrieve_bytes_per_s": total / statistics.median(retrieve),
        "passes": len(passes),
        "detail": detail,
    }


def _cpu_pass(backend: LocalCPUBackend, keys: list[CacheEngineKey],
              shape: torch.Size, src: torch.Tensor,
              dst: torch.Tensor) -> tuple[float, float]:
    t0 = time.perf_counter()
    for key, s in zip(keys, src, strict=True):
        obj = _allocate(backend, shape)
        obj.tensor.copy_(s.view(shape))
        backend.submit_put_task(key, obj)
        obj.ref_count_down()
        if not backend.contains(key):
            raise RuntimeError("LocalCPUBackend did not keep a stored object")
    t1 = time.perf_counter()
    _copy_out([backend.get_blocking(k) for k in keys], dst, shape)
    t2 = time.perf_counter()
    _verify(src, dst)
    backend.clear()
    return t1 - t0, t2 - t1


def cpu(objects: int, size: int) -> dict:
    shape = _kv_shape(size)
    arena = _arena_gib(objects, size)
    config = LMCacheEngineConfig.from_defaults(
        local_cpu=True, max_local_cpu_size=arena)
    src, dst = _buffers(objects, size)
    backend = LocalCPUBackend(config, _metadata(shape))
    try:
        passes = [_cpu_pass(backend, _keys(objects, p), shape, src, dst)
                  for p in range(WARMUP + PASSES)][WARMUP:]
    finally:
        backend.close()
    detail = (
        f"LocalCPUBackend, local_cpu=True, max_local_cpu_size={arena} GB "
        f"(MixedMemoryAllocator arena); MemoryObj uint8 KV_2LTD "
        f"{list(shape)}; store = allocate + tensor.copy_ + submit_put_task "
        f"+ contains; retrieve = get_blocking + copy_ out + ref_count_down; "
        f"{WARMUP} untimed warm-up pass, median of {PASSES} passes, fresh "
        f"keys, clear() between passes, all bytes verified"
    )
    return _result(objects, size, passes, detail)


class _Writes:
    """Counts LMCache's per-key write completions."""

    def __init__(self, expected: int):
        self.left = expected
        self.lock = threading.Lock()
        self.done = threading.Event()

    def completed(self, key: CacheEngineKey) -> None:
        with self.lock:
            self.left -= 1
            if self.left == 0:
                self.done.set()

    def wait(self) -> None:
        if not self.done.wait(WRITE_TIMEOUT_S):
            raise TimeoutError(
                f"LocalDiskBackend left {self.left} writes unfinished "
                f"after {WRITE_TIMEOUT_S:.0f} s")


def _drop_page_cache(directory: str) -> None:
    for root, _, files in os.walk(directory):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _store_disk(disk: LocalDiskBackend, staging: LocalCPUBackend,
                keys: list[CacheEngineKey], shape: torch.Size,
                src: torch.Tensor) -> None:
    writes = _Writes(len(keys))
    for key, s in zip(keys, src, strict=True):
        obj = _allocate(staging, shape)
        obj.tensor.copy_(s.view(shape))
        admitted = disk.current_cache_size
        disk.submit_put_task(key, obj, on_complete_callback=writes.completed)
        obj.ref_count_down()
        if disk.current_cache_size == admitted:
            raise RuntimeError("LocalDiskBackend refused a put")
    writes.wait()


def _disk_pass(disk: LocalDiskBackend, staging: LocalCPUBackend,
               directory: str, keys: list[CacheEngineKey], shape: torch.Size,
               src: torch.Tensor, dst: torch.Tensor) -> tuple[float, float]:
    t0 = time.perf_counter()
    _store_disk(disk, staging, keys, shape, src)
    t1 = time.perf_counter()
    _drop_page_cache(directory)
    t2 = time.perf_counter()
    _copy_out(disk.batched_get_blocking(keys), dst, shape)
    t3 = time.perf_counter()
    _verify(src, dst)
    for key in keys:
        disk.remove(key)
    return t1 - t0, t3 - t2


def _start_loop() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=start_loop_in_thread_with_exceptions,
                              args=(loop,), daemon=True)
    thread.start()
    return loop, thread


def _stop_loop(loop: asyncio.AbstractEventLoop,
               thread: threading.Thread) -> None:
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


def _remove_new_entries(directory: str, before: set[str]) -> None:
    for name in set(os.listdir(directory)) - before:
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def _disk_config(objects: int, size: int, directory: str,
                 odirect: bool) -> LMCacheEngineConfig:
    return LMCacheEngineConfig.from_defaults(
        local_cpu=False, max_local_cpu_size=_arena_gib(objects, size),
        local_disk=directory,
        max_local_disk_size=_arena_gib((WARMUP + PASSES) * objects, size),
        extra_config={"use_odirect": odirect})


def _run_disk(config: LMCacheEngineConfig, shape: torch.Size, objects: int,
              size: int, directory: str) -> list[tuple[float, float]]:
    src, dst = _buffers(objects, size)
    staging = LocalCPUBackend(config, _metadata(shape))
    loop, thread = _start_loop()
    try:
        disk = LocalDiskBackend(config, loop, staging,
                                metadata=_metadata(shape))
        try:
            return [_disk_pass(disk, staging, directory, _keys(objects, p),
                               shape, src, dst)
                    for p in range(WARMUP + PASSES)][WARMUP:]
        finally:
            disk.close()
    finally:
        _stop_loop(loop, thread)
        staging.close()


def disk(objects: int, size: int, directory: str,
         odirect: bool = True) -> dict:
    shape = _kv_shape(size)
    os.makedirs(directory, exist_ok=True)
    before = set(os.listdir(directory))
    config = _disk_config(objects, size, directory, odirect)
    try:
        passes = _run_disk(config, shape, objects, size, directory)
    finally:
        _remove_new_entries(directory, before)
    io = "O_DIRECT (extra_config use_odirect=True)" if odirect else "buffered"
    detail = (
        f"LocalDiskBackend in {directory}, {io} writes and reads, no fsync "
        f"by LMCache, default disk_io_threads; staging LocalCPUBackend with "
        f"local_cpu=False (no hot copy); MemoryObj uint8 KV_2LTD "
        f"{list(shape)}; store timed until LMCache's per-key write "
        f"completion callback fired for every object; untimed fsync + "
        f"POSIX_FADV_DONTNEED of its files before retrieve; retrieve = "
        f"batched_get_blocking + copy_ out; {WARMUP} untimed warm-up pass, "
        f"median of {PASSES} passes, fresh keys, files removed between "
        f"passes (max_local_disk_size covers every pass: remove() does not "
        f"give back LMCache's capacity accounting), all bytes verified"
    )
    return _result(objects, size, passes, detail)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=("cpu", "disk"))
    parser.add_argument("--objects", type=int)
    parser.add_argument("--size", type=int, default=2 * 1024 * 1024)
    parser.add_argument("--dir", default="/var/tmp/lmcache-peer")
    parser.add_argument("--buffered", action="store_true",
                        help="disk: LMCache's default page-cache I/O")
    args = parser.parse_args(argv)
    if args.workload == "cpu":
        result = cpu(args.objects or 256, args.size)
    else:
        result = disk(args.objects or 512, args.size, args.dir,
                      odirect=not args.buffered)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
