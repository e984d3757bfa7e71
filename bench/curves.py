#!/usr/bin/env python3
"""`make bench-curves`: benchmarks swept over a parameter instead of measured
at one point, each written as a CSV and drawn as a PNG in docs/perf/, with
kvdepot and its peer on the same axes.

  arena_object_size   bench_store --sweep: the host arena's put and get
                      (reserve, copy in, commit / lookup, copy out,
                      release) of objects of 16 KiB .. 32 MiB, against
                      memcpy of the same bytes into and out of a plain
                      buffer; bytes per second (medians of three
                      interleaved passes, with their range) and the p50 and
                      p99 of every operation.
  store_restart       bench_store --sweep-restart: how long a store whose
                      NVMe tier holds 1k .. 64k objects (4 KiB each) takes
                      to open again (index and files), and to look every
                      object up once after (three passes each; no peer).
  arena_pressure      bench_store --sweep-pressure: puts into an arena with
                      room against the same puts into a full one, where
                      every reserve first evicts, 64 KiB .. 8 MiB objects.
  daemon_clients      bench_daemon --sweep: lookup + release of a stored
                      512-key chain by 1, 2, 4 .. 64 client processes
                      against redis MGET of the same keys over its unix
                      socket (the same transport); keys per second and the
                      per-call p50 and p99 (three interleaved passes).
  daemon_chain        bench_daemon --sweep-chain: one client's lookup +
                      release of the first 16 .. 4096 keys of a stored
                      chain against redis MGET of the same keys (unix
                      socket); keys per second, p50 and p99 per call.

Usage: bench/curves.py [--out DIR] [--build DIR]
  --build  the tree whose bench/ programs run (default build/dev)
  --out    where the CSV and PNG files go (default docs/perf)
Each curve's header line names the machine, the date and the commit.
"""
import argparse
import csv
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sitting():
    """The date, commit and machine of this run, for every figure."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short",
                             "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain",
                            "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    cpus = os.cpu_count()
    model = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{datetime.date.today().isoformat()}, commit {commit}"
            f"{' (with local changes)' if dirty else ''}, {cpus} CPUs "
            f"({model}), {platform.system()} {platform.release()}")


def sweep_lines(cmd, tag):
    """Runs cmd and returns the JSON of its `TAG {...}` lines."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit(f"curves: {' '.join(cmd)} exited {p.returncode}")
    return [json.loads(line[len(tag) + 1:]) for line in p.stdout.splitlines()
            if line.startswith(tag + " ")]


def sweep(build, program, out, name, when, flag="--sweep"):
    """Runs `program FLAG`, writes its rows to OUT/NAME.csv (the sitting on
    the first line) and returns them."""
    rows = sweep_lines([str(build / "bench" / program), flag], "SWEEP")
    if not rows:
        raise SystemExit(f"curves: {program} {flag} printed no SWEEP line")
    with open(out / f"{name}.csv", "w", newline="") as f:
        f.write(f"# {program} {flag}, {when}\n")
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return rows


def figure():
    """A figure of two panels side by side (matplotlib, no display)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.6))
    return plt, fig, a, b


def log2_axis(ax, xs, labels, xlabel, ylabel, log_y=False):
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, rotation=45 if len(labels[0]) > 3 else 0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if log_y:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3, which="both" if log_y else "major")


def finish(plt, fig, title, when, path):
    fig.suptitle(title + "\n" + when, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def size_label(n):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n // k} {unit}"
    return f"{n} B"


def arena_object_size(build, out, when):
    rows = sweep(build, "bench_store", out, "arena_object_size", when)
    plt, fig, a, b = figure()
    sizes = [r["size"] for r in rows]
    labels = [size_label(x) for x in sizes]
    a.plot(sizes, [r["store_bytes_per_s"] / 1e9 for r in rows], "o-",
           label="kvdepot arena: put + get")
    a.plot(sizes, [r["memcpy_bytes_per_s"] / 1e9 for r in rows], "s--",
           label="memcpy in + out (peer)")
    log2_axis(a, sizes, labels, "object size",
              "GB/s moved (median of passes)")
    a.legend()
    a.set_title("throughput")
    for key, style, label in (("put", "o-", "kvdepot put"),
                              ("get", "^-", "kvdepot get"),
                              ("memcpy", "s--", "memcpy in + out")):
        b.plot(sizes, [r[f"{key}_p50_us"] for r in rows], style,
               label=f"{label} p50")
        b.plot(sizes, [r[f"{key}_p99_us"] for r in rows], style, alpha=0.4,
               label=f"{label} p99")
    log2_axis(b, sizes, labels, "object size", "microseconds per operation",
              log_y=True)
    b.legend(fontsize=8)
    b.set_title("latency")
    finish(plt, fig, "Host arena against memcpy, by object size", when,
           out / "arena_object_size.png")
    return rows


def store_restart(build, out, when):
    rows = sweep(build, "bench_store", out, "store_restart", when,
                 "--sweep-restart")
    plt, fig, a, b = figure()
    n = [r["objects"] for r in rows]
    labels = [f"{x // 1024}k" for x in n]
    a.errorbar(n, [r["open_s"] * 1e3 for r in rows],
               yerr=[[(r["open_s"] - r["open_min_s"]) * 1e3 for r in rows],
                     [(r["open_max_s"] - r["open_s"]) * 1e3 for r in rows]],
               fmt="o-", capsize=3, label="open (median, min-max)")
    log2_axis(a, n, labels, "objects on the NVMe tier", "ms")
    a.legend()
    a.set_title("restart: kvd_store_open")
    b.plot(n, [r["objects"] / r["lookup_all_s"] / 1e3 for r in rows], "o-",
           label="lookups of every object after the restart")
    log2_axis(b, n, labels, "objects on the NVMe tier", "k lookups/s")
    b.legend()
    b.set_title("first lookups after the restart")
    finish(plt, fig, "Store restart against index size (4 KiB objects)",
           when, out / "store_restart.png")
    return rows


def arena_pressure(build, out, when):
    rows = sweep(build, "bench_store", out, "arena_pressure", when,
                 "--sweep-pressure")
    plt, fig, a, b = figure()
    sizes = [r["size"] for r in rows]
    labels = [size_label(x) for x in sizes]
    a.plot(sizes, [r["room_bytes_per_s"] / 1e9 for r in rows], "o-",
           label="arena with room")
    a.plot(sizes, [r["full_bytes_per_s"] / 1e9 for r in rows], "s--",
           label="arena full: every put evicts")
    log2_axis(a, sizes, labels, "object size", "GB/s put (median of passes)")
    a.legend()
    a.set_title("put throughput")
    for key, style, label in (("room", "o-", "with room"),
                              ("full", "s--", "full")):
        b.plot(sizes, [r[f"{key}_p50_us"] for r in rows], style,
               label=f"{label} p50")
        b.plot(sizes, [r[f"{key}_p99_us"] for r in rows], style, alpha=0.4,
               label=f"{label} p99")
    log2_axis(b, sizes, labels, "object size", "microseconds per put",
              log_y=True)
    b.legend(fontsize=8)
    b.set_title("put latency")
    finish(plt, fig, "Host arena puts under eviction pressure", when,
           out / "arena_pressure.png")
    return rows


def daemon_lookups(rows, x, xlabel, us_per_unit, unit, titles, path, when):
    """The two panels of a daemon lookup sweep over `x` (a row key): keys
    per second of kvdepotd and redis, and their p50 and p99 per call in
    `unit` (us_per_unit microseconds each)."""
    plt, fig, a, b = figure()
    n = [r[x] for r in rows]
    labels = [str(v) for v in n]
    a.plot(n, [r["kvd_keys_per_s"] / 1e6 for r in rows], "o-",
           label="kvdepotd: lookup + release")
    a.plot(n, [r["redis_keys_per_s"] / 1e6 for r in rows], "s--",
           label="redis MGET, unix socket (peer)")
    log2_axis(a, n, labels, xlabel, "M keys/s (median of passes)")
    a.legend()
    a.set_title(titles[0])
    for key, style, label in (("kvd", "o-", "kvdepotd"),
                              ("redis", "s--", "redis")):
        b.plot(n, [r[f"{key}_p50_us"] / us_per_unit for r in rows], style,
               label=f"{label} p50")
        b.plot(n, [r[f"{key}_p99_us"] / us_per_unit for r in rows], style,
               alpha=0.4, label=f"{label} p99")
    log2_axis(b, n, labels, xlabel, f"{unit} per call", log_y=True)
    b.legend(fontsize=8)
    b.set_title(titles[1])
    finish(plt, fig, titles[2], when, path)
    return rows


def daemon_clients(build, out, when):
    rows = sweep(build, "bench_daemon", out, "daemon_clients", when)
    return daemon_lookups(
        rows, "clients", "client processes", 1e3, "ms",
        ("throughput, 512-key chains",
         "latency per call (p50: median client, p99: worst client)",
         "kvdepotd lookups against redis, by client count"),
        out / "daemon_clients.png", when)


def daemon_chain(build, out, when):
    rows = sweep(build, "bench_daemon", out, "daemon_chain", when,
                 flag="--sweep-chain")
    return daemon_lookups(
        rows, "chain", "keys per call (chain length)", 1.0, "us",
        ("throughput, one client", "latency per call",
         "kvdepotd lookups against redis, by chain length"),
        out / "daemon_chain.png", when)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "perf"))
    ap.add_argument("--build", default=str(ROOT / "build" / "dev"))
    a = ap.parse_args(argv)
    out, build = Path(a.out), Path(a.build)
    out.mkdir(parents=True, exist_ok=True)
    when = sitting()
    rows = arena_object_size(build, out, when)
    worst = min(rows, key=lambda r: r["ratio"])
    print(f"arena_object_size: {len(rows)} sizes -> "
          f"{out / 'arena_object_size.png'}")
    prows = arena_pressure(build, out, when)
    print(f"arena_pressure: {len(prows)} sizes -> {out / 'arena_pressure.png'}")
    rrows = store_restart(build, out, when)
    print(f"store_restart: {len(rrows)} sizes -> {out / 'store_restart.png'}")
    drows = daemon_clients(build, out, when)
    dworst = min(drows, key=lambda r: r["ratio"])
    print(f"daemon_clients: {len(drows)} client counts -> "
          f"{out / 'daemon_clients.png'}")
    crows = daemon_chain(build, out, when)
    cworst = min(crows, key=lambda r: r["ratio"])
    print(f"daemon_chain: {len(crows)} chain lengths -> "
          f"{out / 'daemon_chain.png'}")
    print(f"BENCH curves: arena_put_get_vs_memcpy_worst_size = "
          f"{worst['ratio']:.3g} at {size_label(worst['size'])} "
          f"(target >= 0.9)")
    print(f"BENCH curves: lookup_keys_per_s_vs_redis_mget_unix_worst_clients "
          f"= {dworst['ratio']:.3g} at {dworst['clients']} clients "
          f"(target >= 1.0)")
    print(f"BENCH curves: lookup_keys_per_s_vs_redis_mget_unix_worst_chain "
          f"= {cworst['ratio']:.3g} at {cworst['chain']} keys "
          f"(target >= 1.0)")


if __name__ == "__main__":
    main()
