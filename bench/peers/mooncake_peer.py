"""Peer benchmark: a TCP pull through the Mooncake Transfer Engine.

What is measured, like-for-like with kvdepot's TCP pull: an initiator
process pulls OBJECTS distinct objects of SIZE bytes from a target process
on 127.0.0.1, asking for them BATCH objects at a time, into its own
memory. Bytes per second over the whole pull, PASSES passes, the median
is reported.

Mooncake's side: the target registers one buffer of objects*size
non-zero random bytes with a TransferEngine initialised for the "tcp"
protocol in P2PHANDSHAKE metadata mode (no metadata server) and prints
its session name ("127.0.0.1:<rpc port>"), the buffer address and a
SHA-256 of the buffer on stdout. The initiator registers a destination
buffer of the same size and, per batch, calls batch_transfer_sync_read
with one request of SIZE bytes per object at distinct addresses on both
sides. The destination is zeroed (untimed) before every pass; after the
last pass its SHA-256 must equal the target's or the run raises.

Loopback only: in P2PHANDSHAKE mode Mooncake binds its RPC and TCP data
listeners to the wildcard address (INADDR_ANY / [::], hard-coded, no
setting; MC_TCP_BIND_ADDRESS only applies with a metadata server). So
both processes run inside a fresh network namespace (`unshare --net
--map-root-user`) whose only interface is lo; nothing they open can be
reached from, or reach, any other interface.

Run with build/peers-venv/bin/python (mooncake-transfer-engine-non-cuda
from PyPI). As a script it prints one JSON line:
    python mooncake_peer.py [--objects N] [--size B] [--batch K] [--passes P]
"""

import argparse
import fcntl
import hashlib
import importlib.metadata
import json
import os
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HOST = "127.0.0.1"
PROTOCOL = "tcp"
METADATA = "P2PHANDSHAKE"
RUN_TIMEOUT_S = 600
TARGET_READY_TIMEOUT_S = 120
EXIT_TIMEOUT_S = 30
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def version() -> str:
    """The distribution providing the `mooncake` package, and its version."""
    dist = importlib.metadata.packages_distributions()["mooncake"][0]
    return f"{dist} {importlib.metadata.version(dist)}"


def tcp_pull(objects: int = 128, size: int = 2 << 20, batch: int = 32,
             passes: int = 5) -> dict:
    """Run the initiator (which spawns the target) in a loopback-only netns."""
    cmd = ["unshare", "--net", "--map-root-user", "--",
           sys.executable, os.path.abspath(__file__), "--role", "initiator",
           "--objects", str(objects), "--size", str(size),
           "--batch", str(batch), "--passes", str(passes)]
    with tempfile.TemporaryFile() as err:
        rc, out = _run_group(cmd, err)
        err.seek(0)
        log = err.read().decode(errors="replace")[-4000:]
    if rc != 0 or not out.strip():
        raise RuntimeError(f"mooncake initiator exited {rc}:\n{log}")
    return json.loads(out)


def _run_group(cmd: list[str], err) -> tuple[int, str]:
    """Run cmd in its own process group; kill what is left of the group
    (children it started and left behind, or all of it if it hangs)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if proc.poll() is None:
            proc.wait(timeout=EXIT_TIMEOUT_S)
    return proc.returncode, out.decode()


def _loopback_up() -> None:
    """Bring up lo in the fresh network namespace (it starts down)."""
    ifreq = "16sH22x"  # struct ifreq: name, flags, padding to 40 bytes
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        got = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack(ifreq, b"lo", 0))
        flags = struct.unpack(ifreq, got)[1] | IFF_UP
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(ifreq, b"lo", flags))


def _engine():
    """A TransferEngine on 127.0.0.1, TCP transport, P2P handshake."""
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    rc = engine.initialize(HOST, METADATA, PROTOCOL, "")
    if rc != 0:
        raise RuntimeError(f"TransferEngine.initialize({HOST!r}, "
                           f"{METADATA!r}, {PROTOCOL!r}) returned {rc}")
    return engine


def _register(engine, nbytes: int):
    """A page-backed numpy buffer of nbytes registered with the engine."""
    import numpy as np

    buf = np.zeros(nbytes, dtype=np.uint8)
    buf.fill(0)  # fault the pages in now, not inside a timed pass
    rc = engine.register_memory(buf.ctypes.data, nbytes)
    if rc != 0:
        raise RuntimeError(f"register_memory({nbytes}) returned {rc}")
    return buf


def _target(nbytes: int) -> None:
    """Serve a buffer of random non-zero bytes until stdin closes."""
    import numpy as np

    engine = _engine()
    buf = _register(engine, nbytes)
    buf[:] = np.random.default_rng().integers(1, 256, nbytes, dtype=np.uint8)
    hello = {"session": f"{HOST}:{engine.get_rpc_port()}",
             "addr": buf.ctypes.data,
             "sha256": hashlib.sha256(buf).hexdigest()}
    print(json.dumps(hello), flush=True)
    sys.stdin.read()
    engine.unregister_memory(buf.ctypes.data)


def _read_hello(proc) -> dict:
    """The target's one-line JSON hello, or an error if it dies or stalls."""
    ready, _, _ = select.select([proc.stdout], [], [], TARGET_READY_TIMEOUT_S)
    if not ready:
        raise TimeoutError("mooncake target: no hello in "
                           f"{TARGET_READY_TIMEOUT_S} s")
    line = proc.stdout.readline()
    if not line:
        rc = proc.wait(timeout=EXIT_TIMEOUT_S)
        raise RuntimeError(f"mooncake target exited {rc} before its hello")
    return json.loads(line)


def _pull_pass(engine, session: str, local: int, remote: int, objects: int,
               size: int, batch: int) -> float:
    """One timed pull of all objects, batch by batch; returns seconds."""
    start = time.perf_counter()
    for first in range(0, objects, batch):
        idx = range(first, min(first + batch, objects))
        rc = engine.batch_transfer_sync_read(
            session, [local + i * size for i in idx],
            [remote + i * size for i in idx], [size] * len(idx))
        if rc != 0:
            raise RuntimeError(f"batch_transfer_sync_read returned {rc} "
                               f"(objects {first}..{idx[-1]})")
    return time.perf_counter() - start


def _measure(hello: dict, objects: int, size: int, batch: int,
             passes: int) -> dict:
    """Timed passes against the target described by hello, then verify."""
    engine = _engine()
    dst = _register(engine, objects * size)
    rates = []
    for _ in range(passes):
        dst.fill(0)
        secs = _pull_pass(engine, hello["session"], dst.ctypes.data,
                          hello["addr"], objects, size, batch)
        rates.append(objects * size / secs)
    if hashlib.sha256(dst).hexdigest() != hello["sha256"]:
        raise RuntimeError("pulled bytes differ from the target's buffer")
    engine.unregister_memory(dst.ctypes.data)
    return {"bytes_per_s": statistics.median(rates),
            "passes_bytes_per_s": rates,
            "detail": (f"{version()}; protocol={PROTOCOL}, "
                       f"metadata={METADATA}, initialize/register_memory/"
                       f"batch_transfer_sync_read, "
                       f"{objects}x{size} B in batches of {batch}, "
                       f"netns with lo only")}


def _initiator(objects: int, size: int, batch: int, passes: int) -> None:
    """Spawn the target, pull from it, print the result as one JSON line."""
    _loopback_up()
    cmd = [sys.executable, os.path.abspath(__file__), "--role", "target",
           "--objects", str(objects), "--size", str(size)]
    target = subprocess.Popen(cmd, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        result = _measure(_read_hello(target), objects, size, batch, passes)
        target.stdin.close()
        target.wait(timeout=EXIT_TIMEOUT_S)
    finally:
        if target.poll() is None:
            target.kill()
            target.wait(timeout=EXIT_TIMEOUT_S)
    print(json.dumps(result), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=128)
    ap.add_argument("--size", type=int, default=2 << 20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--role", choices=["bench", "initiator", "target"],
                    default="bench", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role == "target":
        _target(a.objects * a.size)
    elif a.role == "initiator":
        _initiator(a.objects, a.size, a.batch, a.passes)
    else:
        print(json.dumps(tcp_pull(a.objects, a.size, a.batch, a.passes)))


if __name__ == "__main__":
    main()
