"""Peer benchmark: a TCP pull through Mooncake Store (master + two clients).

What is measured, like-for-like with kvdepot's TCP pull and with
mooncake_peer.py (Mooncake's raw transfer engine): a getter process pulls
OBJECTS distinct objects of SIZE bytes kept in a holder process's Mooncake
Store segment, over 127.0.0.1, BATCH objects per call, into memory it
registered beforehand. Bytes per second over the whole pull, PASSES passes;
median, min and max are reported.

  master  mooncake_master --rpc_address=127.0.0.1 --rpc_port=<free>
          --metrics_host=127.0.0.1 --metrics_port=<free>; HTTP metadata
          server off, dynamic replication off, eviction watermark 0.95.
  holder  MooncakeDistributedStore.setup("127.0.0.1", "P2PHANDSHAKE",
          global_segment_size=2*N*S + 64 MiB, local_buffer_size=16 MiB,
          "tcp", "", master); register_buffer(N*S random non-zero bytes);
          batch_put_from(keys, addrs, sizes, ReplicateConfig(replica_num=1,
          preferred_segment=<its own>, with_hard_pin=True)), BATCH keys a
          call; prints its segment, transport endpoint and SHA-256; waits.
  getter  setup(..., global_segment_size=0, local_buffer_size=0, ...): it
          mounts no segment; register_buffer(N*S); per batch
          batch_get_into(keys, addrs, sizes) at distinct addresses, each
          returned size must be SIZE.

Timed: the batch_get_into calls of a pass (perf_counter around the pass).
Not timed: starting master and clients, the puts, registering, zeroing the
destination before each pass, the checks. After the last pass the
destination's SHA-256 must equal the holder's or the run raises.

Bytes cross TCP from the holder: the holder puts everything before the
getter exists and the getter mounts no segment, so the master has one
segment to place replicas in (replica_num=1, no dynamic replication).
Before timing the getter asks the master (batch_get_replica_desc) and
requires exactly one memory replica per key, at the holder's transport
endpoint. Both clients run with MC_STORE_MEMCPY=0 (this build otherwise
auto-enables its local-memcpy path when only TCP is present) and without
MC_STORE_LOCAL_HOT_CACHE_SIZE (no client read cache). And lo's received
bytes (/proc/net/dev, private to the namespace) must grow by at least
PASSES*N*S over the timed passes, or the run raises.

Objects stay: the KV lease (default 10 s) only guards against removal;
objects go only by eviction, above the high watermark; the segment is
under half full, the watermark 0.95, the objects hard-pinned.

Loopback only: the clients' transfer engines bind their TCP data
listeners to the wildcard address (0.0.0.0 and [::], seen with ss), so
master, holder and getter all run in one fresh network namespace
(`unshare --net --map-root-user`) whose only interface is lo; ports are
picked at run time by binding port 0 on 127.0.0.1 there. Master and holder
are the getter's children (its process group, PR_SET_PDEATHSIG); the
getter stops them by pid, the caller kills the whole group at the end or
on timeout.

Caveats: three processes share the CPUs (the master reports
rpc_thread_num=2 on 2 cores; each client adds transfer-engine TCP and RPC
threads). batch_get_into blocks until its transfers finish; the getter
used ~0.7 s of CPU per second of pull on 2 cores (TCP receive copies
included): no busy spin seen, but its CPU is part of the figure. Run with
build/peers-venv/bin/python (mooncake-transfer-engine-non-cuda, PyPI);
as a script it prints one JSON line:
    python mooncake_store_peer.py [--objects N] [--size B] [--batch K]
                                  [--passes P]
"""

import argparse
import ctypes
import hashlib
import importlib.util
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The transfer-engine peer's process-group runner, lo bring-up and version.
from mooncake_peer import _loopback_up, _run_group, version  # noqa: E402

PEER = "mooncake-store"
HOST = "127.0.0.1"
PROTOCOL = "tcp"
METADATA = "P2PHANDSHAKE"
RUN_TIMEOUT_S = 600
READY_TIMEOUT_S = 120
EXIT_TIMEOUT_S = 30
HEADROOM = 64 << 20
HOLDER_STAGING = 16 << 20
PR_SET_PDEATHSIG = 1


def store_pull(objects: int = 128, size: int = 2 << 20, batch: int = 32,
               passes: int = 5) -> dict:
    """Run the getter (which spawns master and holder) in a loopback netns."""
    cmd = ["unshare", "--net", "--map-root-user", "--",
           sys.executable, os.path.abspath(__file__), "--role", "getter",
           "--objects", str(objects), "--size", str(size),
           "--batch", str(batch), "--passes", str(passes)]
    with tempfile.TemporaryFile() as err:
        rc, out = _run_group(cmd, err)
        err.seek(0)
        log = err.read().decode(errors="replace")[-6000:]
    lines = [x for x in out.splitlines() if x.startswith("{")]
    if rc != 0 or not lines:
        raise RuntimeError(f"mooncake store getter exited {rc}:\n{log}")
    return json.loads(lines[-1])


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing holds now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _lo_rx_bytes() -> int:
    """Bytes received on lo in this namespace (/proc/net/dev)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                return int(counters.split()[0])
    raise RuntimeError("no lo in /proc/net/dev")


def _die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when the getter goes away."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _start_master(log) -> tuple[subprocess.Popen, str]:
    """mooncake_master on 127.0.0.1 at free ports; returns (proc, address)."""
    pkg = importlib.util.find_spec("mooncake").submodule_search_locations[0]
    rpc_port = _free_port()
    cmd = [os.path.join(pkg, "mooncake_master"),
           f"--rpc_address={HOST}", f"--rpc_port={rpc_port}",
           f"--metrics_host={HOST}", f"--metrics_port={_free_port()}",
           "--enable_http_metadata_server=false",
           "--enable_metric_reporting=false",
           "--dynamic_replication_mode=off",
           "--eviction_high_watermark_ratio=0.95",
           "--logtostderr"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=log, preexec_fn=_die_with_parent)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection((HOST, rpc_port), timeout=1).close()
            return proc, f"{HOST}:{rpc_port}"
        except OSError:
            time.sleep(0.05)
    why = (f"exited {proc.returncode}" if proc.poll() is not None
           else f"not listening after {READY_TIMEOUT_S} s")
    _stop(proc)
    log.seek(0)
    tail = log.read().decode(errors="replace")[-3000:]
    raise RuntimeError(f"mooncake_master {why}; its log ends:\n{tail}")


def _store(master: str, segment: int, staging: int):
    """A store client on 127.0.0.1, TCP, P2P handshake metadata."""
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup(HOST, METADATA, segment, staging, PROTOCOL, "", master)
    if rc != 0:
        raise RuntimeError(f"MooncakeDistributedStore.setup({HOST!r}, "
                           f"{METADATA!r}, segment={segment}, "
                           f"{PROTOCOL!r}, master={master}) returned {rc}")
    return store


def _register(store, nbytes: int):
    """A page-backed numpy buffer of nbytes registered with the client."""
    import numpy as np

    buf = np.zeros(nbytes, dtype=np.uint8)
    buf.fill(0)  # fault the pages in now, not inside a timed pass
    rc = store.register_buffer(buf.ctypes.data, nbytes)
    if rc != 0:
        raise RuntimeError(f"register_buffer({nbytes}) returned {rc}")
    return buf


def _keys(objects: int) -> list[str]:
    return [f"kvdepot-peer-{i}" for i in range(objects)]


def _holder(master: str, objects: int, size: int, batch: int) -> None:
    """Put objects of random non-zero bytes; serve them until stdin closes."""
    import numpy as np
    from mooncake.store import ReplicateConfig

    nbytes = objects * size
    store = _store(master, 2 * nbytes + HEADROOM, HOLDER_STAGING)
    buf = _register(store, nbytes)
    buf[:] = np.random.default_rng().integers(1, 256, nbytes, dtype=np.uint8)
    config = ReplicateConfig()
    config.replica_num = 1
    config.preferred_segment = store.get_hostname()
    config.with_hard_pin = True
    keys = _keys(objects)
    for first in range(0, objects, batch):
        idx = range(first, min(first + batch, objects))
        rcs = store.batch_put_from([keys[i] for i in idx],
                                   [buf.ctypes.data + i * size for i in idx],
                                   [size] * len(idx), config)
        if any(rc != 0 for rc in rcs):
            raise RuntimeError(f"batch_put_from returned {rcs} "
                               f"(objects {first}..{idx[-1]})")
    ends = {r.get_memory_descriptor().buffer_descriptor.transport_endpoint
            for r in store.get_replica_desc(keys[0])}
    if len(ends) != 1:
        raise RuntimeError(f"holder's first object has replicas at {ends}")
    hello = {"segment": store.get_hostname(), "endpoint": ends.pop(),
             "sha256": hashlib.sha256(buf).hexdigest()}
    print(json.dumps(hello), flush=True)
    sys.stdin.read()
    store.close()


def _read_hello(proc) -> dict:
    """The holder's one-line JSON hello, or an error if it dies or stalls."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([proc.stdout], [], [], max(left, 0))
        if not ready:
            raise TimeoutError("mooncake store holder: no hello in "
                               f"{READY_TIMEOUT_S} s")
        line = proc.stdout.readline()
        if not line:
            rc = proc.wait(timeout=EXIT_TIMEOUT_S)
            raise RuntimeError(f"mooncake store holder exited {rc} "
                               "before its hello")
        if line.startswith(b"{"):
            return json.loads(line)


def _check_placement(store, keys: list[str], hello: dict) -> None:
    """Every key: exactly one replica, in memory, at the holder's endpoint."""
    descs = store.batch_get_replica_desc(keys)
    for key in keys:
        reps = descs.get(key, [])
        ends = [r.get_memory_descriptor().buffer_descriptor.transport_endpoint
                for r in reps if r.is_memory_replica()]
        if len(reps) != 1 or ends != [hello["endpoint"]]:
            raise RuntimeError(f"{key}: replicas at {ends} ({len(reps)} in "
                               f"all), want one at {hello['endpoint']} "
                               f"(holder segment {hello['segment']})")


def _pull_pass(store, keys: list[str], dst: int, size: int,
               batch: int) -> float:
    """One timed pull of all objects, batch by batch; returns seconds."""
    start = time.perf_counter()
    for first in range(0, len(keys), batch):
        idx = range(first, min(first + batch, len(keys)))
        got = store.batch_get_into([keys[i] for i in idx],
                                   [dst + i * size for i in idx],
                                   [size] * len(idx))
        if any(n != size for n in got):
            raise RuntimeError(f"batch_get_into returned {got} "
                               f"(objects {first}..{idx[-1]})")
    return time.perf_counter() - start


def _measure(hello: dict, master: str, objects: int, size: int,
             batch: int, passes: int) -> dict:
    """Timed passes from the holder described by hello, then verify."""
    store = _store(master, 0, 0)
    keys = _keys(objects)
    try:
        dst = _register(store, objects * size)
        _check_placement(store, keys, hello)
        rates, lo_bytes = [], 0
        for _ in range(passes):
            dst.fill(0)
            lo_before = _lo_rx_bytes()
            secs = _pull_pass(store, keys, dst.ctypes.data, size, batch)
            lo_bytes += _lo_rx_bytes() - lo_before
            rates.append(objects * size / secs)
        if hashlib.sha256(dst).hexdigest() != hello["sha256"]:
            raise RuntimeError("pulled bytes differ from the holder's buffer")
        if lo_bytes < passes * objects * size:
            raise RuntimeError(f"lo carried {lo_bytes} B in {passes} passes "
                               f"of {objects * size} B: bytes did not cross "
                               "TCP")
        store.unregister_buffer(dst.ctypes.data)
    finally:
        store.close()
    return {"peer": PEER, "version": version(),
            "bytes_per_s": statistics.median(rates),
            "min_bytes_per_s": min(rates), "max_bytes_per_s": max(rates),
            "objects": objects, "size": size, "batch": batch,
            "passes": passes, "protocol": PROTOCOL, "metadata": METADATA}


def _stop(proc) -> None:
    """Stop a child by pid: the holder exits when its stdin closes; then
    SIGTERM, then SIGKILL."""
    steps = [signal.SIGTERM, signal.SIGKILL]
    if proc.stdin is not None:
        proc.stdin.close()
        steps.insert(0, 0)
    for sig in steps:
        if sig and proc.poll() is None:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=EXIT_TIMEOUT_S / 3)
            return
        except subprocess.TimeoutExpired:
            continue


def _getter(objects: int, size: int, batch: int, passes: int) -> None:
    """Start master and holder, pull from the holder, print one JSON line."""
    _loopback_up()
    os.environ["MC_STORE_MEMCPY"] = "0"  # inherited by master and holder
    os.environ.pop("MC_STORE_LOCAL_HOT_CACHE_SIZE", None)
    with tempfile.TemporaryFile() as log:
        master, addr = _start_master(log)
        holder = None
        try:
            cmd = [sys.executable, os.path.abspath(__file__),
                   "--role", "holder", "--master", addr,
                   "--objects", str(objects), "--size", str(size),
                   "--batch", str(batch)]
            holder = subprocess.Popen(cmd, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE,
                                      preexec_fn=_die_with_parent)
            hello = _read_hello(holder)
            result = _measure(hello, addr, objects, size, batch, passes)
        finally:
            if holder is not None:
                _stop(holder)
            _stop(master)
    print(json.dumps(result), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=128)
    ap.add_argument("--size", type=int, default=2 << 20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--role", choices=["bench", "getter", "holder"],
                    default="bench", help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if min(a.objects, a.size, a.batch, a.passes) < 1:
        ap.error("--objects, --size, --batch and --passes must be >= 1")
    if a.role == "holder":
        _holder(a.master, a.objects, a.size, a.batch)
    elif a.role == "getter":
        _getter(a.objects, a.size, a.batch, a.passes)
    else:
        print(json.dumps(store_pull(a.objects, a.size, a.batch, a.passes)))


if __name__ == "__main__":
    main()
