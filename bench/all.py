#!/usr/bin/env python3
"""`make bench-all`: every benchmark, demo, curve and peer in one sitting,
and the tables of docs/performance.md regenerated from what it printed.

Each step runs on its own, one after the other, on an otherwise idle
machine (nothing here runs two steps at once: they would share the cores
they measure). Its whole output goes to OUT/<step>.txt, headed by the
date, commit and machine of the sitting, the command and its wall time
and exit status. Its headline lines (`BENCH <name>: <metric> = <value>
[(<lo>-<hi>)] (<target>)`, bench/README.md) become the table between the
step's two markers in docs/performance.md:

    <!-- bench-all:STEP begin -->
    ... (written by bench/all.py)
    <!-- bench-all:STEP end -->

A step that fails keeps its output file and gets a row saying how it
ended; the sitting goes on and the script exits 1 at the end. A step
whose environment is missing (the peers' or transformers' virtualenv,
which `make bench-all` installs) is a row saying so.

Usage: bench/all.py [--only a,b] [--skip a,b] [--out DIR] [--doc FILE]
                    [--no-doc] [--list]
"""
import argparse
import csv
import datetime
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("KVDEPOT_BENCH_BUILD", ROOT / "build" / "dev"))
PEERS_PY = ROOT / "build" / "peers-venv" / "bin" / "python"
HF_PY = ROOT / "build" / "hf-venv" / "bin" / "python"
SYS_PY = "/usr/bin/python3"
STEP_TIMEOUT_S = 3600

HEADLINE = re.compile(
    r"^BENCH (?P<bench>[\w-]+): (?P<metric>.+?) = (?P<value>-?[0-9.]+(?:e[-+]?\d+)?)"
    r"(?: \((?P<lo>-?[0-9.]+(?:e[-+]?\d+)?)-(?P<hi>-?[0-9.]+(?:e[-+]?\d+)?)\))?"
    r"(?P<at> at [^(]+?)? \((?P<note>.*)\)\s*$")
TARGET = re.compile(r"target (?P<op>>=|<=) (?P<bound>-?[0-9.]+(?:e[-+]?\d+)?)")


def git(*args):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                          text=True).stdout.strip()


def machine():
    model, mem = "unknown CPU", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            kib = int(f.readline().split()[1])
            mem = f", {kib / (1 << 20):.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    gpu = "no GPU"
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=name",
                              "--format=csv,noheader"], capture_output=True,
                             text=True)
        if out.returncode == 0 and out.stdout.strip():
            gpu = out.stdout.strip().splitlines()[0]
    return (f"{os.cpu_count()} CPUs ({model}){mem}, {gpu}, "
            f"{platform.system()} {platform.release()}")


class Sitting:
    """Date, commit and machine, the same for every step of the run."""

    def __init__(self):
        self.date = datetime.date.today().isoformat()
        self.commit = git("rev-parse", "--short", "HEAD") or "unknown"
        self.dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
        self.machine = machine()

    def line(self):
        local = " (with local changes)" if self.dirty else ""
        return (f"{self.date}, commit {self.commit}{local}, "
                f"{self.machine}")


def py_env():
    return {"PYTHONPATH": str(ROOT / "python"),
            "KVDEPOT_LIB": str(BUILD / "libkvdepot.so"),
            "KVDEPOTD": str(BUILD / "server" / "kvdepotd"),
            "KVDEPOT_PROTO_DIR": str(ROOT / "proto")}


def steps(tmp):
    """(name, argv, extra env, what must exist first) in sitting order:
    the C benchmarks, the Python shim, the demos, the curves, the peers and
    the transformers sweep."""
    b = BUILD / "bench"
    demo = str(BUILD / "demo" / "kvdepot-demo")
    # bench_leader --long: also the steps in which requests outgrow their
    # arrays (about a second more).
    out = [(n, [str(b / f"bench_{n}")] + (["--long"] if n == "leader" else []),
            {}, b / f"bench_{n}")
           for n in ("kernels", "store", "leader", "worker", "daemon",
                     "cluster", "saves", "shared")]
    out += [
        ("python_shim", [SYS_PY, str(ROOT / "bench" / "python_shim.py")],
         py_env(), BUILD / "libkvdepot.so"),
        ("demo", [demo, "--dir", str(tmp / "demo")], {}, Path(demo)),
        ("demo_rag", [demo, "rag", "--dir", str(tmp / "rag")], {},
         Path(demo)),
        # Nine rounds (the most): identical prefills vary 0.8-1.3 between
        # processes on a small VM, and the headline is the worst row.
        ("demo_gate", [demo, "gate", "--dir", str(tmp / "gate"), "--rounds",
                       "9"], {}, Path(demo)),
        ("curves", [SYS_PY, str(ROOT / "bench" / "curves.py"), "--build",
                    str(BUILD), "--out", str(ROOT / "docs" / "perf")], {},
         b / "bench_store"),
        ("peers", [str(PEERS_PY), str(ROOT / "bench" / "peers" / "run.py")],
         {"KVDEPOT_BENCH_BIN": str(b)}, PEERS_PY),
        ("ttft_hf", [str(HF_PY), str(ROOT / "bench" / "ttft_hf.py"),
                     "--small", "--models", "1b", "--sizes",
                     os.environ.get("KVDEPOT_BENCH_HF_SIZES",
                                    "1k,2k,4k,8k"),
                     "--codecs", "raw,fp8_e4m3", "--tiers", "host,nvme"],
         py_env(), HF_PY),
    ]
    return out


def parse(text):
    """The headline lines of a step's output, as dicts."""
    rows = []
    for line in text.splitlines():
        m = HEADLINE.match(line.strip())
        if m:
            rows.append(m.groupdict())
    return rows


def met(row):
    t = TARGET.search(row["note"])
    if t is None:
        return "-"
    v, bound = float(row["value"]), float(t.group("bound"))
    ok = v >= bound if t.group("op") == ">=" else v <= bound
    return "yes" if ok else "**no**"


def table(name, result, sitting, out_rel):
    """The markdown that goes between the step's markers."""
    lines = [f"Sitting: {sitting.line()}; `make bench-all` "
             f"(output: [{out_rel}]({out_rel}), {result['wall_s']:.0f} s)."]
    if result.get("missing"):
        lines.append(f"\nNot run: {result['missing']}.")
        return "\n".join(lines)
    if result["rc"] != 0:
        lines.append(f"\nThe step exited {result['rc']}: see its output.")
    # Only the step's own lines: a step may echo the programs it drives
    # (the peers run bench_store and bench_cluster, whose lines are theirs).
    rows = [r for r in parse(result["text"]) if r["bench"] == name]
    if not rows:
        lines.append("\nNo headline lines printed.")
        return "\n".join(lines)
    lines += ["", "| headline | value | range | target or note | met |",
              "|---|---:|---:|---|---|"]
    for r in rows:
        rng = f"{r['lo']}-{r['hi']}" if r["lo"] is not None else ""
        metric = (r["metric"] + (r["at"] or "")).replace("|", "/")
        note = r["note"].replace("|", "/")
        lines.append(f"| {metric} | {r['value']} | {rng} | {note} | "
                     f"{met(r)} |")
    return "\n".join(lines)


def run_step(name, argv, env, needs, out_dir, sitting):
    """Runs one step; its output in OUT/<name>.txt; a result dict."""
    path = out_dir / f"{name}.txt"
    if not Path(needs).exists():
        why = (f"{needs} is missing (make bench-all installs the "
               "virtualenvs and builds the tree)")
        path.write_text(f"# {sitting.line()}\n# not run: {why}\n")
        return {"rc": 1, "wall_s": 0.0, "text": "", "missing": why}
    print(f"bench-all: {name}: {' '.join(argv)}", flush=True)
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, capture_output=True, text=True,
                           env=dict(os.environ, **env), cwd=ROOT,
                           timeout=STEP_TIMEOUT_S)
        rc, text = p.returncode, p.stdout + (
            f"\n--- stderr ---\n{p.stderr}" if p.stderr.strip() else "")
    except subprocess.TimeoutExpired as e:
        rc, text = 124, (e.stdout or b"").decode(errors="replace") + \
            f"\n--- killed after {STEP_TIMEOUT_S} s ---\n"
    wall = time.monotonic() - t0
    path.write_text(f"# {sitting.line()}\n# $ {' '.join(argv)}\n"
                    f"# exit {rc} after {wall:.0f} s\n\n{text}")
    heads = parse(text)
    print(f"bench-all: {name}: exit {rc}, {wall:.0f} s, {len(heads)} "
          "headline lines", flush=True)
    for r in heads:
        print(f"  {r['metric']} = {r['value']} ({r['note']})", flush=True)
    return {"rc": rc, "wall_s": wall, "text": text}


def curves_module():
    spec = importlib.util.spec_from_file_location(
        "kvd_curves", ROOT / "bench" / "curves.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ttft_rows(text):
    """ttft_hf's SWEEP lines as rows: model, prompt tokens, what (cold, or
    tier/codec), median/min/max seconds; restore bandwidth lines left
    out."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("SWEEP "):
            continue
        d = json.loads(line[len("SWEEP "):])
        parts = d["key"].split("/")
        if len(parts) < 3 or parts[2] == "bw" or "median" not in d:
            continue
        size = parts[1]
        tokens = int(size[:-1]) * 1024 if size.endswith("k") else int(size)
        rows.append({"model": parts[0], "tokens": tokens,
                     "what": "/".join(parts[2:]), "median_s": d["median"],
                     "min_s": d["min"], "max_s": d["max"], "n": d["n"]})
    return rows


def draw_ttft(text, out, when):
    """The prompt-length curve of ttft_hf's sweep: CSV and PNG in `out`;
    the PNG's path, or None when the output holds no sweep."""
    rows = ttft_rows(text)
    if not rows:
        return None
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "ttft_prompt_length.csv", "w", newline="") as f:
        f.write(f"# {when}\n")
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    cv = curves_module()
    plt, fig, a, b = cv.figure()
    tokens = sorted({r["tokens"] for r in rows})
    labels = [f"{t // 1024}k" if t >= 1024 else str(t) for t in tokens]
    cold = {r["tokens"]: r["median_s"] for r in rows if r["what"] == "cold"}
    for what in sorted({r["what"] for r in rows}):
        pts = sorted((r["tokens"], r["median_s"]) for r in rows
                     if r["what"] == what)
        style = "k^--" if what == "cold" else "o-"
        a.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts], style,
               label=what + (" (computed)" if what == "cold" else ""))
        if what != "cold":
            b.plot([p[0] for p in pts if p[0] in cold],
                   [p[1] / cold[p[0]] for p in pts if p[0] in cold], "o-",
                   label=what)
    cv.log2_axis(a, tokens, labels, "prompt tokens", "TTFT, ms (median)",
                 log_y=True)
    a.legend(fontsize=8)
    a.set_title("time to first token")
    cv.log2_axis(b, tokens, labels, "prompt tokens",
                 "restored TTFT / cold TTFT", log_y=True)
    b.legend(fontsize=8)
    b.set_title("restored over computed")
    path = out / "ttft_prompt_length.png"
    cv.finish(plt, fig, "kvdepot.hf on the CPU by prompt length "
              "(Llama-3.2-1B shape, 2 layers)", when, path)
    return path


def rewrite_doc(doc, tables):
    """Replaces each step's block in doc; every step run must have one."""
    text = doc.read_text()
    for name, body in tables.items():
        begin = f"<!-- bench-all:{name} begin -->"
        end = f"<!-- bench-all:{name} end -->"
        i, j = text.find(begin), text.find(end)
        if i < 0 or j < i:
            raise SystemExit(f"bench-all: {doc} has no '{begin}' ... "
                             f"'{end}' block for step {name}")
        text = text[:i + len(begin)] + "\n" + body + "\n" + text[j:]
    doc.write_text(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="")
    ap.add_argument("--skip", default="")
    ap.add_argument("--out", default=str(ROOT / "docs" / "perf" / "sitting"))
    ap.add_argument("--doc", default=str(ROOT / "docs" / "performance.md"))
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    out_dir = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="kvd_bench_all_",
                                     dir=os.environ.get("KVDEPOT_BENCH_DIR",
                                                        "/var/tmp")) as t:
        plan = steps(Path(t))
        names = [s[0] for s in plan]
        only = [x for x in args.only.split(",") if x]
        skip = [x for x in args.skip.split(",") if x]
        unknown = [x for x in only + skip if x not in names]
        if unknown:
            ap.error(f"unknown steps {unknown}; known: {names}")
        if args.list:
            print("\n".join(names))
            return 0
        plan = [s for s in plan
                if (not only or s[0] in only) and s[0] not in skip]
        out_dir.mkdir(parents=True, exist_ok=True)
        sitting = Sitting()
        print(f"bench-all: {sitting.line()}; {len(plan)} steps", flush=True)
        t0 = time.monotonic()
        tables, failed = {}, []
        doc = Path(args.doc)
        for name, cmd, env, needs in plan:
            res = run_step(name, cmd, env, needs, out_dir, sitting)
            if name == "ttft_hf" and res["rc"] == 0:
                png = draw_ttft(res["text"], ROOT / "docs" / "perf",
                                sitting.line())
                print(f"bench-all: ttft_hf: curve {png}", flush=True)
            rel = os.path.relpath(out_dir / f"{name}.txt", doc.parent)
            tables[name] = table(name, res, sitting, rel)
            if res["rc"] != 0:
                failed.append(name)
        if not args.no_doc:
            rewrite_doc(doc, tables)
        print(f"bench-all: {len(plan)} steps in "
              f"{(time.monotonic() - t0) / 60:.1f} min; "
              + (f"failed or not run: {', '.join(failed)}" if failed
                 else "every step ran"), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
