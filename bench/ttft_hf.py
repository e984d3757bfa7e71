"""Time to first token of a transformers model with its prompt's KV restored
by kvdepot.hf, against computing it (cold), and restore bandwidth against
a plain host-to-device copy of the same bytes.

Models: Llama-3.2-1B-shaped ("1b": 16 layers, hidden 2048, 32 heads, 8 KV
heads, head_dim 64) and Llama-3-8B-shaped ("8b": 32 layers, hidden 4096,
head_dim 128), random weights in bf16, built on the device. Per prompt
size and codec: cold = model.generate(max_new_tokens=1) on the whole
prompt; restored = KvdepotHF.generate(save=False) with the prompt stored
in the host arena (same process, "host"), on the NVMe tier read by a new
process ("nvme"), or in a kvdepotd this benchmark starts ("daemon"); and
the host arena through the recompute-vs-fetch gate ("gate": its first
prefill rate the warm-up's, then generate()'s own timings), set against
the better of always loading and always computing.
Cold and host passes are interleaved; figures are medians with their
range. Before them each restoring store serves the prompt once untimed
(printed as "first hit"): a process's first hit of a size also pays for
its first kernel launches and tensor allocations of that size (on an
H200 one of two timed passes of the 8b shape's raw 16k took 0.87 s, the
other 0.11 s), which the restores of a serving process that has had hits
do not. Restore bandwidth: the restored KV's bytes over the time of
KvdepotHF.restore (lookup, load, decode), next to a pinned host tensor of
the same bytes copied with .to('cuda', non_blocking=True) + synchronize
(on a CPU: a torch copy of the same bytes).

Runs with python3, torch, transformers, the built libkvdepot.so
(KVDEPOT_LIB) and PYTHONPATH=python; kvdepotd from KVDEPOTD or the build
trees. --small (the default without CUDA): 2 layers of each shape, 256
and 1024 tokens. Results go to stdout and, with --out, to a file; the
last lines are the headline figures (bench/README.md).
"""

import argparse
import gc
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from kvdepot.hf import KvdepotHF  # noqa: E402

SHAPES = {
    "1b": dict(num_hidden_layers=16, hidden_size=2048, num_attention_heads=32,
               num_key_value_heads=8, head_dim=64, intermediate_size=8192,
               vocab_size=128256),
    "8b": dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, intermediate_size=14336,
               vocab_size=128256),
}
SIZES = {"1k": 1024, "2k": 2048, "4k": 4096, "8k": 8192, "16k": 16384, "32k": 32768,
         "256": 256}
BLOCK = 16


def build_model(name, small, device):
    from transformers import LlamaConfig, LlamaForCausalLM
    kw = dict(SHAPES[name], max_position_embeddings=40960, rope_theta=5e5)
    if small:  # a CPU run: two layers of the shape, a smaller vocabulary
        kw.update(num_hidden_layers=2, vocab_size=32000,
                  intermediate_size=kw["intermediate_size"] // 4)
    cfg = LlamaConfig(**kw)
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):  # random init on the device: fast
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.to(torch.bfloat16).eval()


def prompt(n, vocab, seed, device):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (1, n), generator=g).to(device)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device):
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t, out


def cold_pass(model, ids, device, cache=None):
    kw = dict(max_new_tokens=1, do_sample=False, pad_token_id=0,
              attention_mask=torch.ones_like(ids))
    if cache is not None:
        kw["past_key_values"] = cache
    with torch.no_grad():
        return timed(lambda: model.generate(ids, **kw), device)


def warm_pass(kv, ids, device):
    with torch.no_grad():
        return timed(lambda: kv.generate(ids, save=False, max_new_tokens=1,
                                         do_sample=False, pad_token_id=0),
                     device)


def restore_pass(kv, ids, device):
    """(seconds of restore alone, bytes restored, its phases: host seconds
    of each part and "device", what the copies took after them)."""
    with torch.no_grad():
        t, r = timed(lambda: kv.restore(ids), device)
    kv.finish(r)
    n = 0 if r.staging is None else r.staging[:, :, :, :r.tokens].numel() \
        * r.staging.element_size()
    phases = dict(r.phases)
    phases["device"] = max(0.0, t - sum(phases.values()))
    return t, n, phases


_plain = {}


def plain_copy(nbytes, device, passes):
    """Seconds of the plain copy of `nbytes` (median; measured once per
    size)."""
    if nbytes in _plain:
        return _plain[nbytes]
    src = torch.empty(nbytes, dtype=torch.uint8,
                      pin_memory=device.type == "cuda")
    src.fill_(1)
    ts = []
    for _ in range(passes):
        if device.type == "cuda":
            t, _ = timed(lambda: src.to(device, non_blocking=True), device)
        else:
            dst = torch.empty_like(src)
            t, _ = timed(lambda: dst.copy_(src), device)
        ts.append(t)
    _plain[nbytes] = statistics.median(ts)
    del src
    return _plain[nbytes]


def stat(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs),
            "n": len(xs)}


def fmt(s):
    return (f"{s['median'] * 1e3:9.2f} ms [{s['min'] * 1e3:.2f}.."
            f"{s['max'] * 1e3:.2f}] n={s['n']}")


def passes_for(n, small):
    return 5 if small else (3 if n <= 4096 else 2)


def kv_settings(args, codec, tmp, mode):
    model_id = f"bench-ttft-hf-{mode['model']}-{'small' if args.small else 'full'}"
    if mode["tier"] == "daemon":
        return dict(codec=codec, model_id=model_id, store_mode="daemon",
                    store_address=f"unix:{tmp}/d.sock", store_timeout="30s")
    return dict(codec=codec, model_id=model_id, store_dir=str(tmp / "nvme"),
                arena_size=args.arena, disk_size=args.disk,
                disk_write="through", lookup_timeout_ms=30000)


# ---- the NVMe tier: a new process -------------------------------------------

def child(spec_path):
    """Runs in a new process: restores every listed prompt once (each comes
    from the NVMe tier: this process's arena starts empty)."""
    spec = json.loads(Path(spec_path).read_text())
    device = torch.device(spec["device"])
    model = build_model(spec["model"], spec["small"], device)
    args = argparse.Namespace(**spec["args"])
    out = {}
    # What a serving process has done before its first hit, left out of the
    # timed restores: the model's kernels and the library's first use
    # (a prompt that was never stored: a miss, nothing saved).
    warm_ids = prompt(4 * BLOCK, model.config.vocab_size, 999_999, device)
    cold_pass(model, warm_ids, device)
    for codec, cells in spec["cells"].items():
        kv = KvdepotHF(model, block_size=BLOCK, **kv_settings(
            args, codec, Path(spec["tmp"]),
            {"model": spec["model"], "tier": "nvme"}))
        warm_pass(kv, warm_ids, device)
        for size, seeds in cells.items():
            ts = []
            for seed in seeds:
                ids = prompt(SIZES[size], model.config.vocab_size, seed,
                             device)
                t, _ = warm_pass(kv, ids, device)
                assert kv.last.tokens > 0, "nothing restored from NVMe"
                ts.append(t)
            out[f"{codec}/{size}"] = ts
        kv.close()
    Path(spec["out"]).write_text(json.dumps(out))


def run_nvme(args, name, device, tmp, cells):
    spec = {"model": name, "small": args.small, "device": str(device),
            "tmp": str(tmp), "out": str(tmp / "nvme.json"), "cells": cells,
            "args": vars(args)}
    (tmp / "nvme-spec.json").write_text(json.dumps(spec))
    subprocess.run([sys.executable, __file__, "--child",
                    str(tmp / "nvme-spec.json")], check=True, timeout=900)
    return json.loads((tmp / "nvme.json").read_text())


# ---- the daemon -------------------------------------------------------------

def kvdepotd_path():
    env = os.environ.get("KVDEPOTD")
    if env:
        return env
    for tree in ("gpu", "dev", "ci", "release", "quick"):
        p = ROOT / "build" / tree / "server" / "kvdepotd"
        if p.is_file():
            return str(p)
    return None


def start_daemon(tmp, arena):
    path = kvdepotd_path()
    if path is None:
        return None
    ready = tmp / "ready"
    log = open(tmp / "kvdepotd.log", "w")
    proc = subprocess.Popen(
        [path, "--set", f"server.unix_socket={tmp}/d.sock",
         "--set", f"store.arena_size={arena}",
         "--set", "store.arena_prefault=false", "--set", "log.level=warn",
         "--ready-file", str(ready)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("kvdepotd did not start: " +
                               (tmp / "kvdepotd.log").read_text()[-2000:])
        time.sleep(0.05)
    return proc


def stop_daemon(proc):
    if proc is not None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---- one model --------------------------------------------------------------

def gate_row(res, key, c, xs, kv, say):
    """The host tier through the recompute-vs-fetch gate: its TTFT against
    cold and against the better of always loading (host) and always
    computing (cold), which is what the gate should come within 5 % of;
    and the blocks it loaded and skipped."""
    s = res[f"{key}/gate/{c}"] = stat(xs)
    cold = res[key + "/cold"]["median"]
    host = res.get(f"{key}/host/{c}")
    best = min(cold, host["median"]) if host else cold
    st = kv.leader.stats()
    s.update(best=best, loaded=st["gate_loaded"], skipped=st["gate_skipped"])
    say(f"{key:10s} gate   {c:8s} {fmt(s)}  {s['median'] / cold:.3f} of "
        f"cold, {s['median'] / best:.3f} of the better of load and compute "
        f"(blocks so far: {st['gate_loaded']} loaded, "
        f"{st['gate_skipped']} computed)")


def run_model(args, name, device, res, say):
    model = build_model(name, args.small, device)
    vocab = model.config.vocab_size
    tmp = Path(tempfile.mkdtemp(prefix="ttft-hf-", dir=args.dir))
    daemon = start_daemon(tmp, args.daemon_arena) \
        if "daemon" in args.tiers else None
    if "daemon" in args.tiers and daemon is None:
        say(f"{name}: no kvdepotd (set KVDEPOTD): daemon tier skipped")
    try:
        kvs = {c: KvdepotHF(model, block_size=BLOCK, **kv_settings(
            args, c, tmp, {"model": name, "tier": "host"}))
            for c in args.codecs}
        kvd = {c: KvdepotHF(model, block_size=BLOCK, **kv_settings(
            args, c, tmp, {"model": name, "tier": "daemon"}))
            for c in args.codecs} if daemon else {}
        kvg = {}  # the host tier's store through the gate, made below
        # The host tier's store again, with other CUDA staging sizes:
        # restore bandwidth only (the same objects, another chunking).
        kvz = {(c, z): KvdepotHF(model, block_size=BLOCK,
                                 cuda_staging_blocks=z, **kv_settings(
                                     args, c, tmp, {"model": name,
                                                    "tier": "host"}))
               for c in args.codecs for z in args.staging} \
            if "host" in args.tiers else {}
        nvme_cells = {c: {} for c in args.codecs}
        for size in args.sizes:
            n = SIZES[size]
            ids = prompt(n, vocab, 1000 + n, device)
            passes = passes_for(n, args.small)
            from transformers import DynamicCache
            cache = DynamicCache(config=model.config)
            # warm-up, and the KV
            t_warm = cold_pass(model, ids, device, cache)[0]
            if "gate" in args.tiers and not kvg:
                # First estimate of the prefill rate: the warm-up's (a
                # first pass, slow: it favours loading); generate()'s own
                # timed prefills move it from there.
                kvg = {c: KvdepotHF(model, block_size=BLOCK, gate={
                    "prefill_tokens_per_s": n / t_warm}, **kv_settings(
                        args, c, tmp, {"model": name, "tier": "host"}))
                    for c in args.codecs}
            for kv in list(kvs.values()) + list(kvd.values()):
                r = kv.restore(ids)
                kv.save(r, ids, cache)
            del cache
            # Each store's first hit of this prompt, untimed in the
            # medians (the module docstring says why).
            key = f"{name}/{size}"
            for tier, group in (("host", kvs), ("daemon", kvd),
                                ("gate", kvg)):
                if tier not in args.tiers:
                    continue
                for c, kv in group.items():
                    t1 = warm_pass(kv, ids, device)[0]
                    ph = dict(kv.last.phases) if kv.last else {}
                    res[f"{key}/first/{tier}/{c}"] = {"seconds": t1,
                                                      "phases": ph}
                    say(f"{key:10s} {tier:6s} {c:8s} first hit "
                        f"{t1 * 1e3:8.2f} ms (not in the medians; restore "
                        + ", ".join(f"{p} {v * 1e3:.1f}"
                                    for p, v in ph.items()) + " ms)")
            cold, host = [], {c: [] for c in args.codecs}
            dmn = {c: [] for c in kvd}
            gated = {c: [] for c in kvg}
            for _ in range(passes):
                cold.append(cold_pass(model, ids, device)[0])
                for c, kv in kvs.items():
                    if "host" in args.tiers:
                        host[c].append(warm_pass(kv, ids, device)[0])
                for c, kv in kvd.items():
                    dmn[c].append(warm_pass(kv, ids, device)[0])
                for c, kv in kvg.items():
                    gated[c].append(warm_pass(kv, ids, device)[0])
            res[key + "/cold"] = stat(cold)
            say(f"{key:10s} cold           {fmt(res[key + '/cold'])}")
            for c in args.codecs:
                for tier, xs in (("host", host[c]), ("daemon", dmn.get(c))):
                    if xs:
                        s = res[f"{key}/{tier}/{c}"] = stat(xs)
                        say(f"{key:10s} {tier:6s} {c:8s} {fmt(s)}  "
                            f"{s['median'] / res[key + '/cold']['median']:.3f}"
                            " of cold")
                if gated.get(c):
                    gate_row(res, key, c, gated[c], kvg[c], say)
                # restore bandwidth against the plain copy
                # (the CUDA worker's copies between the arena and the
                # device per restore: one per run of objects at one stride)
                ops0 = kvs[c].stats().get("copy_ops", 0)
                bw = [restore_pass(kvs[c], ids, device) for _ in range(passes)]
                ops = (kvs[c].stats().get("copy_ops", 0) - ops0) / passes
                nbytes = bw[0][1]
                t = statistics.median(x[0] for x in bw)
                tp = plain_copy(nbytes, device, passes)
                res[f"{key}/bw/{c}"] = {"bytes": nbytes, "restore_s": t,
                                        "plain_s": tp, "ratio": tp / t,
                                        "copies": ops}
                say(f"{key:10s} restore {c:8s} {nbytes / t / 1e9:7.2f} GB/s"
                    f"  plain {nbytes / tp / 1e9:7.2f} GB/s  "
                    f"ratio {tp / t:.3f}"
                    + (f"  {ops:.0f} copies" if ops else ""))
                # where a restore's time goes (medians, ms): the host's
                # parts, then the copies still running after them
                ph = {p: statistics.median(x[2].get(p, 0.0) for x in bw)
                      for p in ("match", "register", "bind", "loads",
                                "reports", "cache", "device")}
                res[f"{key}/bw/{c}"]["phases"] = ph
                say(f"{key:10s} restore {c:8s} parts: "
                    + ", ".join(f"{p} {v * 1e3:.1f}" for p, v in ph.items())
                    + " ms")
                for z in args.staging:
                    zkv = kvz[(c, z)]
                    restore_pass(zkv, ids, device)  # its first hit
                    bw = [restore_pass(zkv, ids, device)
                          for _ in range(passes)]
                    t = statistics.median(x[0] for x in bw)
                    ph = {p: statistics.median(x[2].get(p, 0.0) for x in bw)
                          for p in ("bind", "loads", "reports", "device")}
                    res[f"{key}/bw/{c}/staging{z}"] = {
                        "bytes": nbytes, "restore_s": t, "plain_s": tp,
                        "ratio": tp / t, "phases": ph}
                    say(f"{key:10s} restore {c:8s} staging {z:5d} blocks: "
                        f"{nbytes / t / 1e9:7.2f} GB/s  ratio {tp / t:.3f}  "
                        + ", ".join(f"{p} {v * 1e3:.1f}"
                                    for p, v in ph.items()) + " ms")
                nvme_cells[c][size] = [1000 + n]
        for kv in list(kvs.values()) + list(kvd.values()) + \
                list(kvg.values()) + list(kvz.values()):
            kv.close()
        # The new process builds its own model: give this one's GPU memory
        # back first (on an 80 GB H100 the 8b child ran out of memory
        # while this process still held its model, caches and the
        # allocator's reserve).
        kvs.clear()
        kvd.clear()
        kvg.clear()
        kvz.clear()
        model = None
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if "nvme" in args.tiers:
            got = run_nvme(args, name, device, tmp, nvme_cells)
            for cell, ts in got.items():
                c, size = cell.split("/")
                key = f"{name}/{size}"
                s = res[f"{key}/nvme/{c}"] = stat(ts)
                say(f"{key:10s} nvme   {c:8s} {fmt(s)}  "
                    f"{s['median'] / res[key + '/cold']['median']:.3f} of "
                    "cold (new process)")
    finally:
        stop_daemon(daemon)
        shutil.rmtree(tmp, ignore_errors=True)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()


def headlines(args, res, on_gpu):
    """One pair of lines per codec: restored TTFT over cold (host arena)
    and restore bandwidth over the plain copy, at 16k on the 8b shape
    where both were run (else the last size and model); at small sizes
    (a CPU's prompt-length sweep) the TTFT line of every size too."""
    out = []
    model = "8b" if "8b" in args.models else args.models[-1]
    size = "16k" if "16k" in args.sizes else args.sizes[-1]
    if args.small:
        for sz in args.sizes[:-1]:
            c = res.get(f"{model}/{sz}/cold")
            for codec in args.codecs:
                h = res.get(f"{model}/{sz}/host/{codec}")
                if c and h:
                    out.append(f"BENCH ttft_hf: restored_ttft_{sz}_{model}_"
                               f"{codec}_over_cold = "
                               f"{h['median'] / c['median']:.3f} (no target: "
                               "CPU reference)")
    cold = res.get(f"{model}/{size}/cold")
    tgt = "(target <= 0.2)" if on_gpu and (model, size) == ("8b", "16k") \
        else "(no target: CPU reference)" if not on_gpu else \
        "(target <= 0.2 is for 8b at 16k)"
    btgt = "(target >= 0.8)" if on_gpu else "(no target: CPU reference)"
    for codec in args.codecs:
        host = res.get(f"{model}/{size}/host/{codec}")
        if cold and host:
            out.append(f"BENCH ttft_hf: restored_ttft_{size}_{model}_{codec}"
                       f"_over_cold = {host['median'] / cold['median']:.3f} "
                       f"{tgt}")
        bw = res.get(f"{model}/{size}/bw/{codec}")
        if bw:
            out.append(f"BENCH ttft_hf: restore_bw_{size}_{model}_{codec}"
                       f"_over_plain_copy = {bw['ratio']:.3f} {btgt}")
    return out


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        return child(sys.argv[2])
    on_gpu = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", default=None,
                    help="CPU sizes (default without CUDA)")
    ap.add_argument("--full", dest="small", action="store_false",
                    help="full sizes (default with CUDA)")
    ap.add_argument("--models", default=None,
                    help="of 1b,8b (default both; small: 1b)")
    ap.add_argument("--sizes", default=None,
                    help="of 256,1k,2k,4k,8k,16k,32k (default 1k,4k,16k,32k; "
                    "small: 256,1k)")
    ap.add_argument("--codecs", default="raw,fp8_e4m3,tq4")
    ap.add_argument("--tiers", default="host,nvme,daemon,gate")
    ap.add_argument("--staging", default="",
                    help="CUDA staging buffer sizes in blocks (e.g. "
                    "64,256,1024): the host tier's restore bandwidth again "
                    "with each (cuda_staging_blocks), the same store")
    ap.add_argument("--arena", default=None, help="embedded arena size")
    ap.add_argument("--daemon-arena", default=None)
    ap.add_argument("--disk", default=None, help="NVMe tier size")
    ap.add_argument("--dir", default=os.environ.get("KVDEPOT_BENCH_DIR",
                                                    "/var/tmp"))
    ap.add_argument("--out", default=None, help="also write results here")
    args = ap.parse_args()
    if args.small is None:
        args.small = not on_gpu
    args.sizes = (args.sizes or ("256,1k" if args.small else
                                 "1k,4k,16k,32k")).split(",")
    args.models = (args.models or ("1b" if args.small else "1b,8b")).split(",")
    args.codecs = args.codecs.split(",")
    args.tiers = args.tiers.split(",")
    try:
        args.staging = [int(x) for x in args.staging.split(",") if x]
    except ValueError:
        ap.error(f"--staging {args.staging!r}: block counts, e.g. 64,256")
    for what, xs, known in (("size", args.sizes, SIZES),
                            ("model", args.models, SHAPES)):
        bad = [x for x in xs if x not in known]
        if bad:
            ap.error(f"unknown {what} {bad}; known: {sorted(known)}")
    args.arena = args.arena or ("1g" if args.small else "16g")
    args.daemon_arena = args.daemon_arena or args.arena
    args.disk = args.disk or ("2g" if args.small else "40g")
    device = torch.device("cuda" if on_gpu else "cpu")
    lines = []

    def say(line):
        print(line, flush=True)
        lines.append(line)

    say(f"ttft_hf: {'small' if args.small else 'full'} sizes on "
        f"{torch.cuda.get_device_name() if on_gpu else 'CPU'}; torch "
        f"{torch.__version__}; models {args.models} sizes {args.sizes} "
        f"codecs {args.codecs} tiers {args.tiers}")
    res = {}
    t0 = time.monotonic()
    for name in args.models:
        run_model(args, name, device, res, say)
    for key, s in res.items():
        # One line per figure for whoever draws them (bench/all.py):
        # model/size/what[/codec] and its statistics.
        print("SWEEP " + json.dumps(dict(key=key, **s)), flush=True)
    say(f"ttft_hf: {time.monotonic() - t0:.0f} s")
    for line in headlines(args, res, on_gpu):
        say(line)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n\n" +
                                  json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
