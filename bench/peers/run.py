"""kvdepot against LMCache, Mooncake and NIXL: same machine, same data, same run.

`make bench-peers` runs this with the peers' virtualenv (scripts/install-peers.sh).
Every workload runs kvdepot and its peer back to back; each peer runs in its own
process (bench/peers/<peer>_peer.py prints one JSON line), so a peer that cannot
run here becomes a row with its exact error instead of ending the run.

  arena store / retrieve   256 objects of 2 MiB into and out of the host tier:
                           kvdepot's arena (`bench_store --peers`) against
                           LMCache's LocalCPUBackend.
  disk store / retrieve    512 objects of 2 MiB written to the disk tier until
                           written, then read back cold: kvdepot's NVMe tier
                           against LMCache's LocalDiskBackend, same directory;
                           fio on that directory gives the disk's own speed.
  remote fetch             128 objects of 2 MiB pulled from another process on
                           127.0.0.1 in batches of 32: kvdepot's cluster fetch
                           between two kvdepotd (`bench_cluster`, UCX over
                           TCP) against Mooncake's transfer engine (TCP) and
                           NIXL (UCX backend, UCX_TLS=tcp, UCX_NET_DEVICES=lo).

"Retrieve" ends with the bytes in the caller's buffer on both sides.
Output: one row per workload (kvdepot, peer, ratio, versions), then one
`BENCH peers: <metric> = <ratio> (target >= 1.0)` line per row that ran.
Environment: KVDEPOT_BENCH_DIR (default /var/tmp) holds the disk files; the
build's programs come from build/dev/bench unless KVDEPOT_BENCH_BIN says.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BIN = Path(os.environ.get("KVDEPOT_BENCH_BIN", ROOT / "build" / "dev" / "bench"))
GB = 1e9
PEER_TIMEOUT_S = 600


def dist_version(*names):
    for name in names:
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            continue
    return "not installed"


def kvdepot_version():
    out = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                         capture_output=True, text=True, check=False)
    return f"kvdepot {out.stdout.strip() or 'unknown'}"


def last_lines(text, n=6):
    return " | ".join(line for line in text.strip().splitlines()[-n:])


def run_program(argv, env=None, timeout=PEER_TIMEOUT_S):
    """Runs argv, echoes its output, returns stdout; raises with its tail."""
    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.run(argv, capture_output=True, text=True, env=full_env,
                          timeout=timeout, check=False)
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} exit {proc.returncode}: "
                           f"{last_lines(proc.stderr or proc.stdout)}")
    return proc.stdout


def run_peer(script, *args):
    """One peer workload in its own process: its JSON line, or its error."""
    argv = [sys.executable, str(HERE / script), *map(str, args)]
    out = run_program(argv, env={"LMCACHE_LOG_LEVEL": "WARNING"})
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"{script}: no result line")


def kvdepot_store():
    out = run_program([str(BIN / "bench_store"), "--peers"])
    line = next(x for x in out.splitlines() if x.startswith("PEERS "))
    return json.loads(line[len("PEERS "):])


def kvdepot_fetch():
    """Median MiB/s of bench_cluster's fetch passes, as bytes per second."""
    out = run_program([str(BIN / "bench_cluster")])
    m = re.search(r"^fetch: kvdepot (\d+) MiB/s", out, re.M)
    if m is None:
        raise RuntimeError("bench_cluster printed no fetch figure")
    return float(m.group(1)) * (1 << 20)


def attempt(fn):
    """(result, None) or (None, the error text): a peer's failure is a row."""
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001  (whatever a peer raises)
        return None, f"{type(e).__name__}: {e}"


class Table:
    def __init__(self):
        self.rows = []

    def add(self, name, metric, ours, peer, peer_run, key):
        result, err = peer_run
        theirs = result.get(key) if result is not None else None
        self.rows.append((name, metric, ours, peer, theirs, err))

    def print(self, notes, versions):
        print("\nkvdepot against its peers (GB/s = 1e9 bytes/s; "
              "ratio = kvdepot / peer)")
        print(f"{'workload':<36} {'kvdepot':>9} {'peer':<9} "
              f"{'peer GB/s':>9} {'ratio':>6}")
        for name, _, ours, peer, theirs, err in self.rows:
            ours_s = f"{ours / GB:9.2f}" if ours else f"{'failed':>9}"
            if ours and theirs:
                print(f"{name:<36} {ours_s} {peer:<9} {theirs / GB:9.2f} "
                      f"{ours / theirs:6.2f}")
                continue
            print(f"{name:<36} {ours_s} {peer:<9} {'-':>9} {'-':>6}")
            if err is not None:
                print(f"    {peer} could not run here: {err}")
        for note in notes:
            print(note)
        print("versions: " + "; ".join(versions))
        print(f"machine: {os.cpu_count()} CPUs, Linux {os.uname().release}")
        print()
        for _, metric, ours, _, theirs, _ in self.rows:
            if ours and theirs:
                print(f"BENCH peers: {metric} = {ours / theirs:.3g} "
                      "(target >= 1.0)")

    def complete(self):
        return all(ours and theirs for _, _, ours, _, theirs, _ in self.rows)


def main():
    table = Table()
    bench_dir = os.environ.get("KVDEPOT_BENCH_DIR", "/var/tmp")
    store = kvdepot_store()
    arena_n, disk_n = store["objects"]
    size = store["size"]
    cpu = attempt(lambda: run_peer("lmcache_peer.py", "cpu", "--objects",
                                   arena_n, "--size", size))
    with tempfile.TemporaryDirectory(prefix="kvd_bench_peers_",
                                     dir=bench_dir) as d:
        disk = attempt(lambda: run_peer("lmcache_peer.py", "disk", "--objects",
                                        disk_n, "--size", size, "--dir", d))
    fetch, fetch_err = attempt(kvdepot_fetch)
    if fetch_err is not None:
        print(f"kvdepot fetch failed: {fetch_err}", file=sys.stderr)
    mooncake = attempt(lambda: run_peer("mooncake_peer.py"))
    nixl = attempt(lambda: run_peer("nixl_peer.py"))

    lm = "LMCache"
    table.add(f"arena store, {arena_n} x 2 MiB", "arena_store_vs_lmcache",
              store["arena_store"], lm, cpu, "store_bytes_per_s")
    table.add(f"arena retrieve, {arena_n} x 2 MiB",
              "arena_retrieve_vs_lmcache", store["arena_retrieve"], lm, cpu,
              "retrieve_bytes_per_s")
    table.add(f"disk store, {disk_n} x 2 MiB", "disk_store_vs_lmcache",
              store["disk_store"], lm, disk, "store_bytes_per_s")
    table.add(f"disk retrieve, {disk_n} x 2 MiB", "disk_retrieve_vs_lmcache",
              store["disk_retrieve"], lm, disk, "retrieve_bytes_per_s")
    table.add("remote fetch, 128 x 2 MiB, TCP", "fetch_vs_mooncake_tcp", fetch,
              "Mooncake", mooncake, "bytes_per_s")
    table.add("remote fetch, 128 x 2 MiB, UCX tcp", "fetch_vs_nixl_ucx", fetch,
              "NIXL", nixl, "bytes_per_s")
    fio = (f"the disk itself (fio, io_uring, O_DIRECT, 2 MiB, QD 32, same "
           f"directory): write {store['fio_write'] / GB:.2f} GB/s, read "
           f"{store['fio_read'] / GB:.2f} GB/s")
    table.print([fio], [kvdepot_version(), dist_version("lmcache"),
                 dist_version("mooncake-transfer-engine",
                              "mooncake-transfer-engine-non-cuda"),
                 dist_version("nixl")])
    return 0 if table.complete() else 1


if __name__ == "__main__":
    sys.exit(main())
