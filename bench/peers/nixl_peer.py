"""NIXL peer for kvdepot's remote-pull benchmark.

What is measured, like-for-like with kvdepot's cluster fetch: a requester
pulls OBJECTS distinct objects of SIZE bytes (default 128 x 2 MiB = 256 MiB)
from another process over UCX on 127.0.0.1, asked for in batches of BATCH
objects, into its own memory; bytes per second over the whole pull, PASSES
passes, median reported.

NIXL side (nixl 1.5.1, UCX backend, the UCX it bundles):

* target: a child process (this file run with ``--target``) holding one
  agent that registers OBJECTS*SIZE bytes of DRAM (a numpy buffer of
  non-zero random bytes), then writes one JSON line to its stdout pipe: its
  agent metadata (``get_agent_metadata``), the address of each object and
  the SHA-256 of each object. It stays alive until the initiator writes a
  line to its stdin. NIXL's default progress thread is on: over TCP a READ
  needs the target's UCX worker to answer.
* initiator: this process. One agent without a progress thread (as
  nixlbench runs by default, ``--enable_pt=false``), so ``check_xfer_state``
  drives UCX progress; on a 2-CPU machine a progress thread beside the
  polling loop halved the rate. DRAM destination of the same size
  registered once; ``add_remote_agent`` with the target's metadata,
  ``make_connection``, and ``prep_xfer_dlist`` of the local and the remote
  object lists, all before the timed region (NIXL's prepared-list usage, as
  vLLM's NixlConnector does at handshake). Objects land in a shuffled order
  of destination slots, so no two objects of a request are adjacent on both
  sides and NIXL cannot merge a batch into one large transfer.
* timed region of a pass: for each batch, ``make_prepped_xfer("READ", ...)``
  with BATCH descriptors and ``transfer``; once all OBJECTS/BATCH requests
  are posted, poll ``check_xfer_state`` until all are DONE, then release
  them. The destination is zeroed before each pass and every object's
  SHA-256 is checked against the target's after it (outside the timing).

Both agents run with UCX_TLS=tcp and UCX_NET_DEVICES=lo (kvdepot's cluster
runs UCX over TCP; left alone, UCX would move the bytes between two local
processes by shared memory or CMA, which is not a network transfer), and
UCX_MODULES=^ib: with the wheel's bundled libnl and the system's both
loaded by UCX's InfiniBand modules, the process crashes at exit (SIGSEGV in
rtnl_tc_unregister); there is no RDMA device here to lose.
Metadata exchange: the target's stdout pipe (not NIXL's socket exchange).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import glob
import hashlib
import importlib.metadata
import json
import logging
import os
import select
import statistics
import subprocess
import sys
import time

import numpy as np
from nixl._api import nixl_agent, nixl_agent_config

UCX_ENV = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_MODULES": "^ib"}
SETUP_TIMEOUT_S = 120.0
PASS_TIMEOUT_S = 120.0
TARGET_LIFETIME_S = 1800.0

# NIXL's Python logger writes INFO lines to stdout; keep stdout for results.
for _handler in logging.getLogger("nixl").handlers:
    if isinstance(_handler, logging.StreamHandler):
        _handler.setStream(sys.stderr)


@contextlib.contextmanager
def _ucx_env():
    """Set UCX_ENV while UCX reads its configuration, then restore."""
    saved = {k: os.environ.get(k) for k in UCX_ENV}
    os.environ.update(UCX_ENV)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _make_agent(name: str, progress_thread: bool) -> nixl_agent:
    conf = nixl_agent_config(enable_prog_thread=progress_thread, backends=["UCX"])
    with _ucx_env():
        return nixl_agent(name, conf)


def _ucx_version() -> str:
    """Version of the libucp bundled next to the loaded NIXL wheel."""
    pkg = os.path.dirname(sys.modules[nixl_agent.__module__].__file__)
    libs = glob.glob(f"{pkg}.libs/libucp-*.so*")
    if not libs:
        return "unknown"
    with _ucx_env():  # UCX reads UCX_MODULES once, when libucs is loaded
        fn = ctypes.CDLL(libs[0]).ucp_get_version_string
    fn.restype = ctypes.c_char_p
    return fn().decode()


def version() -> str:
    return f"nixl {importlib.metadata.version('nixl')} (UCX {_ucx_version()})"


def _register(agent: nixl_agent, buf: np.ndarray):
    return agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")


def _object_descs(buf: np.ndarray, size: int, slots) -> list[tuple[int, int, int]]:
    base = buf.ctypes.data
    return [(base + slot * size, size, 0) for slot in slots]


def _object_hashes(buf: np.ndarray, size: int, slots) -> list[str]:
    return [hashlib.sha256(buf[s * size:(s + 1) * size]).hexdigest() for s in slots]


# ---------------------------------------------------------------- target side


def _serve(objects: int, size: int) -> None:
    """Target process: register random objects, publish them, wait."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything NIXL or UCX prints goes to stderr
    buf = np.random.default_rng().integers(1, 256, objects * size, dtype=np.uint8)
    agent = _make_agent("nixl-peer-target", progress_thread=True)
    reg = _register(agent, buf)
    slots = range(objects)
    out.write(json.dumps({
        "md": base64.b64encode(agent.get_agent_metadata()).decode(),
        "descs": _object_descs(buf, size, slots),
        "sha256": _object_hashes(buf, size, slots),
    }) + "\n")
    out.flush()
    select.select([sys.stdin], [], [], TARGET_LIFETIME_S)
    agent.deregister_memory(reg)


# ------------------------------------------------------------- initiator side


def _spawn_target(objects: int, size: int) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), "--target",
           "--objects", str(objects), "--size", str(size)]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def _read_line(proc: subprocess.Popen, timeout: float) -> bytes:
    """One line from the target's stdout, or raise after timeout seconds."""
    fd, data = proc.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"nixl target sent no metadata in {timeout:.0f} s")
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise RuntimeError(f"nixl target exited (rc={proc.wait(10)}) "
                                   "before sending its metadata")
            data += chunk
    return data


def _stop_target(proc: subprocess.Popen) -> None:
    with contextlib.suppress(BrokenPipeError, OSError):
        proc.stdin.write(b"done\n")
        proc.stdin.close()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _pull_once(agent, local, remote, batches, timeout: float) -> float:
    """One timed pull: post every batch as a READ request, wait for all."""
    start = time.perf_counter()
    handles = []
    for idx in batches:
        handle = agent.make_prepped_xfer("READ", local, idx, remote, idx)
        if agent.transfer(handle) == "ERR":
            raise RuntimeError("nixl transfer() returned ERR")
        handles.append(handle)
    deadline = start + timeout
    pending = list(handles)
    while pending:
        states = [agent.check_xfer_state(h) for h in pending]
        if "ERR" in states:
            raise RuntimeError("nixl check_xfer_state() returned ERR")
        pending = [h for h, s in zip(pending, states) if s != "DONE"]
        if pending and time.perf_counter() > deadline:
            raise TimeoutError(f"nixl pull not done after {timeout:.0f} s")
    elapsed = time.perf_counter() - start
    for handle in handles:
        handle.release()
    return elapsed


def _verify(dst: np.ndarray, size: int, slots, want: list[str]) -> None:
    got = _object_hashes(dst, size, slots)
    bad = sum(g != w for g, w in zip(got, want))
    if bad:
        raise RuntimeError(f"nixl pull: {bad}/{len(want)} objects differ from the target's")


def _pull_passes(proc, objects: int, size: int, batch: int, passes: int) -> list[float]:
    info = json.loads(_read_line(proc, SETUP_TIMEOUT_S))
    agent = _make_agent("nixl-peer-initiator", progress_thread=False)
    dst = np.zeros(objects * size, dtype=np.uint8)
    reg = _register(agent, dst)
    peer = agent.add_remote_agent(base64.b64decode(info["md"]))
    agent.make_connection(peer)
    slots = np.random.default_rng().permutation(objects)
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", _object_descs(dst, size, slots), "DRAM")
    remote = agent.prep_xfer_dlist(peer, [tuple(d) for d in info["descs"]], "DRAM")
    batches = [np.arange(i, min(i + batch, objects), dtype=np.int32)
               for i in range(0, objects, batch)]
    rates = []
    for _ in range(passes):
        dst.fill(0)
        secs = _pull_once(agent, local, remote, batches, PASS_TIMEOUT_S)
        _verify(dst, size, slots, info["sha256"])
        rates.append(objects * size / secs)
    local.release()
    remote.release()
    agent.remove_remote_agent(peer)
    agent.deregister_memory(reg)
    return rates


def ucx_pull(objects: int = 128, size: int = 2 << 20, batch: int = 32,
             passes: int = 5) -> dict:
    """Pull objects x size bytes from a NIXL target process; bytes/s per pass."""
    proc = _spawn_target(objects, size)
    try:
        rates = _pull_passes(proc, objects, size, batch, passes)
    finally:
        _stop_target(proc)
    return {
        "bytes_per_s": statistics.median(rates),
        "passes_bytes_per_s": rates,
        "detail": (f"NIXL UCX backend (UCX {_ucx_version()}), "
                   + " ".join(f"{k}={v}" for k, v in UCX_ENV.items())
                   + ", DRAM->DRAM READ, prep_xfer_dlist once + per batch "
                   "make_prepped_xfer/transfer, all posted then check_xfer_state "
                   "polled (initiator without progress thread); "
                   f"{objects} objects x {size} B, batches of {batch}"),
    }


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=128)
    parser.add_argument("--size", type=int, default=2 << 20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--target", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.target:
        _serve(args.objects, args.size)
        return
    result = ucx_pull(args.objects, args.size, args.batch, args.passes)
    print(json.dumps({"version": version(), **result}))


if __name__ == "__main__":
    _main()
