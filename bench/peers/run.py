"""kvdepot against LMCache, Mooncake and NIXL: same machine, same data, same run.

`make bench-peers` runs this with the peers' virtualenv (scripts/install-peers.sh).
Every workload runs kvdepot and its peer back to back (the store workloads in
three rounds, headline = median of the rounds' ratios); each peer runs in its own
process (bench/peers/<peer>_peer.py prints one JSON line), so a peer that cannot
run here becomes a row with its exact error instead of ending the run.

  arena store / retrieve   256 objects of 2 MiB into and out of the host tier:
                           kvdepot's arena (`bench_store --peers`) against
                           LMCache's LocalCPUBackend.
  disk store / retrieve    512 objects of 2 MiB written to the disk tier until
                           written, then read back cold: kvdepot's NVMe tier
                           against LMCache's LocalDiskBackend, same directory;
                           fio on that directory gives the disk's own speed.
  engine store / retrieve  a 4096-token prompt of a Llama-3-8B shard saved from
                           and loaded into a vLLM-shaped paged cache in host
                           memory: kvdepot's leader and worker against
                           LMCacheEngine store/retrieve (256-token chunks,
                           its hashing), five interleaved passes
                           (lmcache_engine_peer.py runs both sides).
  remote fetch             128 objects of 2 MiB pulled from another process on
                           127.0.0.1 in batches of 32: kvdepot's cluster fetch
                           between two kvdepotd (`bench_cluster`, UCX over
                           TCP) against Mooncake's transfer engine (TCP) and
                           NIXL (UCX backend, UCX_TLS=tcp, UCX_NET_DEVICES=lo),
                           and Mooncake Store (mooncake_master and two
                           clients, TCP: a getter pulls what a holder put);
                           three rounds, each kvdepot's fetch then every peer.

"Retrieve" ends with the bytes in the caller's buffer on both sides.
Output: one row per workload (kvdepot, peer, ratio, versions), then one
`BENCH peers: <metric> = <ratio> (target >= 1.0)` line per row that ran.
Environment: KVDEPOT_BENCH_DIR (default /var/tmp) holds the disk files; the
build's programs come from build/dev/bench unless KVDEPOT_BENCH_BIN says.
"""

import json
import os
import re
import statistics
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
STORE_ROUNDS = 3


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
    out = run_program(argv, env={"LMCACHE_LOG_LEVEL": "WARNING",
                                 "KVDEPOT_LIB": str(BIN.parent /
                                                    "libkvdepot.so")})
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"{script}: no result line")


def kvdepot_store():
    out = run_program([str(BIN / "bench_store"), "--peers"])
    line = next(x for x in out.splitlines() if x.startswith("PEERS "))
    return json.loads(line[len("PEERS "):])


def kvdepot_fetch():
    """bench_cluster's fetch: the median of its passes in bytes per second,
    and the objects it moved (count, size, lookup batch), which the peers
    then move too."""
    out = run_program([str(BIN / "bench_cluster")])
    shape = re.search(r"^bench_cluster: (\d+) objects of (\d+) KiB, "
                      r"chains of (\d+)", out, re.M)
    rate = re.search(r"^fetch: kvdepot (\d+) MiB/s", out, re.M)
    if shape is None or rate is None:
        raise RuntimeError("bench_cluster printed no fetch figure")
    return {"bytes_per_s": float(rate.group(1)) * (1 << 20),
            "objects": int(shape.group(1)), "size": int(shape.group(2)) << 10,
            "batch": int(shape.group(3))}


def attempt(fn):
    """(result, None) or (None, the error text): a peer's failure is a row."""
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001  (whatever a peer raises)
        return None, f"{type(e).__name__}: {e}"


class Row:
    """One workload: (kvdepot, peer) bytes per second for each round."""

    def __init__(self, name, metric, peer, key):
        self.name, self.metric, self.peer, self.key = name, metric, peer, key
        self.ours = []
        self.pairs = []
        self.err = None

    def record(self, ours, peer_run):
        result, err = peer_run
        if ours:
            self.ours.append(ours)
        if err is None and self.key not in result:
            err = f"no {self.key} in its result"
        if err is not None:
            self.err = self.err or err
        elif ours:
            self.pairs.append((ours, result[self.key]))

    def ratio(self):
        return statistics.median(o / t for o, t in self.pairs)

    def spread(self):
        rs = [o / t for o, t in self.pairs]
        return f"({min(rs):.3g}-{max(rs):.3g})"

    def line(self):
        if not self.pairs:
            ours = f"{statistics.median(self.ours) / GB:9.2f}" \
                if self.ours else f"{'-':>9}"
            why = f"\n    {self.peer} could not run here: {self.err}" \
                if self.err else ""
            return f"{self.name:<36} {ours} {self.peer:<10} {'-':>9} " \
                   f"{'-':>6}{why}"
        ours = statistics.median(o for o, _ in self.pairs) / GB
        theirs = statistics.median(t for _, t in self.pairs) / GB
        return f"{self.name:<36} {ours:9.2f} {self.peer:<10} {theirs:9.2f} " \
               f"{self.ratio():6.2f}"


def print_table(rows, notes, versions):
    print("\nkvdepot against its peers (GB/s = 1e9 bytes/s, medians over "
          "the rounds; ratio = median of the rounds' kvdepot / peer)")
    print(f"{'workload':<36} {'kvdepot':>9} {'peer':<10} {'peer GB/s':>9} "
          f"{'ratio':>6}")
    for row in rows:
        print(row.line())
    for note in notes:
        print(note)
    print("versions: " + "; ".join(versions))
    print(f"machine: {os.cpu_count()} CPUs, Linux {os.uname().release}")
    print()
    for row in rows:
        if row.pairs:
            print(f"BENCH peers: {row.metric} = {row.ratio():.3g} "
                  f"{row.spread()} (target >= 1.0)")


def store_rounds(rows, bench_dir):
    """STORE_ROUNDS rounds of kvdepot then LMCache: memory and the disk
    drift within a run, so each round's pair is measured back to back."""
    fio = []
    store = {}
    for _ in range(STORE_ROUNDS):
        store = kvdepot_store()
        arena_n, disk_n = store["objects"]
        size = store["size"]
        cpu = attempt(lambda: run_peer("lmcache_peer.py", "cpu", "--objects",
                                       arena_n, "--size", size))
        with tempfile.TemporaryDirectory(prefix="kvd_bench_peers_",
                                         dir=bench_dir) as d:
            disk = attempt(lambda: run_peer(
                "lmcache_peer.py", "disk", "--objects", disk_n, "--size",
                size, "--dir", d))
        rows["arena_store"].record(store["arena_store"], cpu)
        rows["arena_retrieve"].record(store["arena_retrieve"], cpu)
        rows["disk_store"].record(store["disk_store"], disk)
        rows["disk_retrieve"].record(store["disk_retrieve"], disk)
        fio.append((store["fio_write"], store["fio_read"]))
    mib = store["size"] / (1 << 20)
    return [f"objects: arena {store['objects'][0]} x {mib:g} MiB, disk "
            f"{store['objects'][1]} x {mib:g} MiB",
            f"the disk itself (fio, io_uring, O_DIRECT, {mib:g} MiB, QD 32, "
            f"same directory), per round: "
            + ", ".join(f"write {w / GB:.2f} read {r / GB:.2f}"
                        for w, r in fio) + " GB/s"]


def fetch_rounds(rows):
    """STORE_ROUNDS rounds of kvdepot's fetch then each peer's pull of the
    same objects, back to back, so a slow spell of the machine touches
    every side of a round."""
    peers = ((rows["mooncake"], "mooncake_peer.py"),
             (rows["nixl"], "nixl_peer.py"),
             (rows["mooncake_store"], "mooncake_store_peer.py"))
    fetch = None
    for _ in range(STORE_ROUNDS):
        fetch, fetch_err = attempt(kvdepot_fetch)
        if fetch_err is not None:
            for row, _script in peers:
                row.err = row.err or f"kvdepot's side failed: {fetch_err}"
            continue
        shape = ("--objects", fetch["objects"], "--size", fetch["size"],
                 "--batch", fetch["batch"])
        for row, script in peers:
            row.record(fetch["bytes_per_s"],
                       attempt(lambda s=script: run_peer(s, *shape)))
    if fetch is None:
        return []
    return [f"remote fetch: {fetch['objects']} x {fetch['size'] >> 20} MiB "
            f"in batches of {fetch['batch']}, pulled from another process"]


def engine_rows(rows):
    """LMCacheEngine store/retrieve of a 4096-token prompt against kvdepot's
    leader and worker on the same paged cache (lmcache_engine_peer.py runs
    both sides, interleaved pass by pass): one pair per pass."""
    res, err = attempt(lambda: run_peer("lmcache_engine_peer.py"))
    if err is None and res.get("lmcache_error"):
        err = f"LMCache could not run: {res['lmcache_error']}"
    for op in ("store", "retrieve"):
        row = rows[f"engine_{op}"]
        if err is not None:
            row.err = err
            continue
        secs = res["pass_seconds"]
        for k, lm in zip(secs[f"kvdepot_{op}"], secs[f"lmcache_{op}"]):
            row.record(res["bytes"] / k,
                       ({"bytes_per_s": res["bytes"] / lm}, None))
    if err is not None:
        return []
    return [f"engine level: a {res['tokens']}-token prompt of a "
            f"Llama-3-8B shard ({res['bytes'] >> 20} MiB of KV), "
            f"LMCache chunk {res['chunk_size']} tokens, {res['threads']} "
            f"copy threads a side, {res['passes']} interleaved passes; "
            "LMCache's copies run its CPU fallback (no CUDA here)"]


def main():
    bench_dir = os.environ.get("KVDEPOT_BENCH_DIR", "/var/tmp")
    lm = "LMCache"
    rows = {
        "arena_store": Row("arena store",
                           "arena_store_vs_lmcache", lm, "store_bytes_per_s"),
        "arena_retrieve": Row("arena retrieve",
                              "arena_retrieve_vs_lmcache", lm,
                              "retrieve_bytes_per_s"),
        "disk_store": Row("disk store", "disk_store_vs_lmcache",
                          lm, "store_bytes_per_s"),
        "disk_retrieve": Row("disk retrieve",
                             "disk_retrieve_vs_lmcache", lm,
                             "retrieve_bytes_per_s"),
        "mooncake": Row("remote fetch, TCP",
                        "fetch_vs_mooncake_tcp", "Mooncake", "bytes_per_s"),
        "nixl": Row("remote fetch, UCX over TCP",
                    "fetch_vs_nixl_ucx", "NIXL", "bytes_per_s"),
        "engine_store": Row("engine store, 4096 tokens",
                            "engine_store_vs_lmcache_engine", "LMCacheEng",
                            "bytes_per_s"),
        "engine_retrieve": Row("engine retrieve, 4096 tokens",
                               "engine_retrieve_vs_lmcache_engine",
                               "LMCacheEng", "bytes_per_s"),
        "mooncake_store": Row("remote fetch, store with master, TCP",
                              "fetch_vs_mooncake_store_tcp", "MooncakeS",
                              "bytes_per_s"),
    }
    notes = store_rounds(rows, bench_dir)
    notes += engine_rows(rows)
    notes += fetch_rounds(rows)
    print_table(rows.values(), notes, [
        kvdepot_version(), dist_version("lmcache"),
        dist_version("mooncake-transfer-engine",
                     "mooncake-transfer-engine-non-cuda"),
        dist_version("nixl")])
    return 0 if all(r.pairs for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
