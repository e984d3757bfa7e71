#!/usr/bin/env python3
"""Draws kvdepot-dashboard.json as it looks on a live cluster, without
Grafana (not in Debian's archive): deploy/local/cluster.sh starts three
daemons, a real Prometheus (Debian's `prometheus`) scrapes them every
second, `kvdepot bench` loads node1 and lookups of node1's objects go
through node3 (cluster fetches) for LOAD_SECONDS, then every panel's
queries are run through Prometheus's HTTP API, exactly as the dashboard
writes them ($instance = every daemon, $__rate_interval = 15s), and drawn
in the dashboard's order, one subplot a panel, into a PNG.

Usage: render_dashboard.py OUT.png [--seconds N]
Needs: prometheus, etcd, a built tree (KVDEPOTD, KVDEPOT_CLI or build/dev),
python3-matplotlib. `make dashboard-png` runs it into
docs/perf/dashboard.png.
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CLUSTER = ROOT / "deploy" / "local" / "cluster.sh"
NS = "00112233445566778899aabbccddeeff"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_file(path):
    out = {}
    for line in Path(path).read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k] = v
    return out


def cli():
    c = os.environ.get("KVDEPOT_CLI") or str(ROOT / "build/dev/cli/kvdepot")
    if not os.access(c, os.X_OK):
        raise SystemExit(f"render_dashboard: no kvdepot CLI at {c}")
    return c


def query_range(port, expr, start, end, step):
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end,
                                "step": step})
    with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/api/v1/query_range?{q}",
            timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise SystemExit(f"render_dashboard: {expr}: {body}")
    return body["data"]["result"]


def load(env, seconds, tmp):
    """bench on node1, and lookups through node3 of what node1 holds."""
    c = cli()
    bench = subprocess.Popen(
        [c, "bench", "--address", env["KVDEPOT_NODE1_ADDRESS"], "--clients",
         "2", "--seconds", str(seconds), "--size", "256k"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    blob = Path(tmp) / "blk"
    blob.write_bytes(os.urandom(1 << 20))
    end, k = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        key = f"{k:064x}"
        subprocess.run([c, "put", "--address", env["KVDEPOT_NODE1_ADDRESS"],
                        "-n", NS, "-k", key, str(blob)],
                       capture_output=True)
        subprocess.run([c, "get", "--address", env["KVDEPOT_NODE3_ADDRESS"],
                        "-n", NS, "-k", key, str(Path(tmp) / "back")],
                       capture_output=True)
        subprocess.run([c, "get", "--address", env["KVDEPOT_NODE2_ADDRESS"],
                        "-n", NS, "-k", f"{k + 10**6:064x}",
                        str(Path(tmp) / "miss")], capture_output=True)
        k += 1
        time.sleep(0.2)
    bench.wait()


def draw(dashboard, prom_port, start, end, out, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [p for p in dashboard["panels"] if p.get("type") != "row"]
    cols = 4
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.1 * rows))
    step = 2
    for ax, p in zip(axes.flat, panels):
        for t in p.get("targets", []):
            expr = (t["expr"].replace('instance=~"$instance"', 'instance=~".*"')
                    .replace("$__rate_interval", "15s"))
            for series in query_range(prom_port, expr, start, end, step):
                xs = [float(v[0]) - start for v in series["values"]]
                ys = [float(v[1]) for v in series["values"]]
                label = t.get("legendFormat") or ""
                for k, v in series["metric"].items():
                    label = label.replace("{{" + k + "}}", v)
                ax.plot(xs, ys, label=label or None)
        ax.set_title(p.get("title", ""), fontsize=10)
        ax.grid(True, alpha=0.3)
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        if unit:
            ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=7)
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=6, loc="best")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--seconds", type=int, default=60)
    a = ap.parse_args(argv)
    dashboard = json.loads((HERE / "kvdepot-dashboard.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        cdir = Path(tmp) / "cluster"
        subprocess.run([str(CLUSTER), "up", "--dir", str(cdir)], check=True,
                       stdout=subprocess.DEVNULL)
        prom = None
        try:
            env = env_file(cdir / "cluster.env")
            targets = [env[f"KVDEPOT_NODE{i}_METRICS"].split("//")[1]
                       for i in (1, 2, 3)]
            port = free_port()
            cfg = Path(tmp) / "prometheus.yml"
            cfg.write_text(
                "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                "scrape_configs:\n  - job_name: kvdepotd\n"
                f"    static_configs: [{{targets: {json.dumps(targets)}}}]\n")
            prom = subprocess.Popen(
                ["prometheus", f"--config.file={cfg}",
                 f"--storage.tsdb.path={tmp}/tsdb",
                 f"--web.listen-address=127.0.0.1:{port}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            start = time.time()
            time.sleep(3)
            load(env, a.seconds, tmp)
            time.sleep(3)
            end = time.time()
            commit = subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                capture_output=True, text=True).stdout.strip()
            draw(dashboard, port, start, end, a.out,
                 f"{dashboard.get('title', 'kvdepot')}: three daemons of "
                 f"deploy/local, {a.seconds} s of load (kvdepot bench on "
                 f"node1, fetches through node3), seconds on the x axis; "
                 f"{time.strftime('%Y-%m-%d')}, commit {commit}")
        finally:
            if prom is not None:
                prom.send_signal(signal.SIGTERM)
                prom.wait(timeout=30)
            subprocess.run([str(CLUSTER), "down", "--dir", str(cdir)],
                           stdout=subprocess.DEVNULL)
    print(f"dashboard: {a.out}")


if __name__ == "__main__":
    sys.exit(main())
