"""kvdepotd's /metrics read the way Prometheus reads it: a fresh daemon's
scrape is parsed with the Prometheus client library's own text parser
(python3-prometheus-client) and checked against the exposition format's
rules (one HELP and one TYPE per family, each family's samples together
and once, counters ending in _total, base units), by promtool as well
when the prometheus package is installed. The series dashboards and
alerts rely on exist on a fresh daemon (errors at 0, the cluster's at 0
on a daemon that is alone, per tenant usage), the build and start time
are reported, the latency buckets reach the longest call deadline, and
docs/daemon.md lists every family with its HELP text."""

import math
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import KVDEPOTD, start_daemon, stop_daemon

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
# Units other than the base ones Prometheus asks for.
NOT_BASE_UNITS = re.compile(
    r"_(ms|us|ns|millis|milliseconds|microseconds|minutes|hours|kb|kib|mb|"
    r"mib|gb|gib|percent)(_|$)")


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                timeout=5) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return r.read().decode()


def family_of(sample, types):
    """The family a sample name belongs to (histograms: its _bucket, _sum
    and _count series)."""
    if sample in types:
        return sample
    for suffix in ("_bucket", "_sum", "_count"):
        base = sample[:-len(suffix)]
        if sample.endswith(suffix) and types.get(base) == "histogram":
            return base
    return None


def exposition_problems(text):
    """Every way `text` breaks the text format's rules, as sentences."""
    problems = []
    helps, types, done, seen = {}, {}, set(), set()
    current = None
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            kind, name, rest = line[2:6], *line[7:].split(" ", 1)
            table = helps if kind == "HELP" else types
            if name in table:
                problems.append(f"line {n}: second {kind} for {name}")
            table[name] = rest
            if name in done or (current is not None and name != current
                                and name in seen):
                problems.append(f"line {n}: {name} is not contiguous")
            if current is not None and current != name:
                done.add(current)
            current = name
            seen.add(name)
            continue
        if not line or line.startswith("#"):
            continue
        sample = re.match(r"[^{ ]+", line).group(0)
        fam = family_of(sample, types)
        if fam is None:
            problems.append(f"line {n}: {sample} has no TYPE before it")
            continue
        if fam not in helps:
            problems.append(f"line {n}: {fam} has no HELP")
        if fam != current:
            problems.append(f"line {n}: {fam}'s samples are not together "
                            f"(after {current})")
            done.add(current)
            current = fam
    for name, typ in types.items():
        if not NAME.match(name):
            problems.append(f"{name}: not a valid metric name")
        if typ == "counter" and not name.endswith("_total"):
            problems.append(f"{name}: a counter without _total")
        if typ != "counter" and name.endswith("_total"):
            problems.append(f"{name}: _total on a {typ}")
        if NOT_BASE_UNITS.search(name):
            problems.append(f"{name}: not in base units")
        if name not in helps:
            problems.append(f"{name}: no HELP")
    for name in helps:
        if name not in types:
            problems.append(f"{name}: HELP without TYPE")
    return problems


def parse(text):
    """{family name: Metric} with the Prometheus client's parser, which
    raises on anything it cannot read."""
    parser = pytest.importorskip(
        "prometheus_client.parser",
        reason="python3-prometheus-client is not installed "
               "(scripts/install-deps.sh)")
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def value(fams, name, **labels):
    for f in fams.values():
        for s in f.samples:
            if s.name == name and all(s.labels.get(k) == v
                                      for k, v in labels.items()):
                return s.value
    return None


def statuses():
    """Every error status of include/kvdepot/common.h."""
    text = (ROOT / "include/kvdepot/common.h").read_text()
    return re.findall(r"\b(KVD_ERR_[A-Z_]+) = -\d+", text)


def library_version():
    text = (ROOT / "include/kvdepot/common.h").read_text()
    parts = [re.search(rf"#define KVD_VERSION_{p} (\d+)", text).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


@pytest.fixture
def daemon(tmp_path):
    if not KVDEPOTD:
        pytest.skip("KVDEPOTD not set (ctest sets it)")
    before = time.time()
    proc, _, mport = start_daemon(tmp_path, "server.tenant_quotas=team-q=16m")
    try:
        yield proc, mport, before, time.time()
    finally:
        stop_daemon(proc)


def test_exposition_is_well_formed(daemon):
    _, mport, _, _ = daemon
    text = scrape(mport)
    assert exposition_problems(text) == []
    fams = parse(text)
    # The parser saw every family the text declares, and nothing twice.
    declared = re.findall(r"^# TYPE (\S+) ", text, re.M)
    assert len(declared) == len(set(declared))
    parsed = {f.name + ("_total" if f.type == "counter" else "")
              for f in fams.values()}
    assert parsed == set(declared)
    keys = [(s.name, tuple(sorted(s.labels.items())))
            for f in fams.values() for s in f.samples]
    assert len(keys) == len(set(keys)), "a series appears twice"


def test_promtool_accepts_the_scrape(daemon):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    _, mport, _, _ = daemon
    p = subprocess.run([promtool, "check", "metrics"], input=scrape(mport),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip() == "" and p.stderr.strip() == "", \
        p.stdout + p.stderr


def test_build_and_start_time(daemon):
    proc, mport, before, after = daemon
    fams = parse(scrape(mport))
    (info,) = fams["kvdepot_build_info"].samples
    assert info.name == "kvdepot_build_info" and info.value == 1
    assert info.labels["version"] == library_version()
    assert re.fullmatch(r"[0-9a-f]{7,40}|unknown", info.labels["commit"])
    start = value(fams, "process_start_time_seconds")
    # The clock ticks of /proc are 10 ms; the daemon started in between.
    assert before - 1 <= start <= after + 1
    assert fams["process_start_time_seconds"].type == "gauge"
    assert value(fams, "kvdepot_up") == 1


def test_every_series_exists_from_the_start(daemon):
    _, mport, _, _ = daemon
    fams = parse(scrape(mport))
    for status in statuses():
        assert value(fams, "kvdepot_errors_total", status=status) == 0, status
    methods = {s.labels["method"] for s in fams["kvdepot_rpc_errors"].samples}
    assert {"Lookup", "Reserve", "Commit", "Get", "Admin"} <= methods
    assert all(s.value == 0 for s in fams["kvdepot_rpc_errors"].samples)
    # Alone, the daemon still has the cluster's series, at 0.
    assert value(fams, "kvdepot_cluster_nodes") == 0
    assert value(fams, "kvdepot_cluster_stale") == 0
    assert value(fams, "kvdepot_cluster_queue_dropped_total") == 0
    for tier in ("host", "disk"):
        assert value(fams, "kvdepot_tier_evictions_total", tier=tier) == 0
        assert value(fams, "kvdepot_tier_errors_total", tier=tier) == 0
    # Per tenant: every tenant the settings name, and "(none)".
    for tenant in ("(none)", "team-q"):
        assert value(fams, "kvdepot_tenant_objects", tenant=tenant,
                     tier="host") == 0
        assert value(fams, "kvdepot_tenant_bytes", tenant=tenant,
                     tier="disk") == 0
    assert value(fams, "kvdepot_tenant_capacity_bytes",
                 tenant="team-q") == 16 << 20
    assert value(fams, "kvdepot_tenant_hits_total", tenant="team-q",
                 tier="host") == 0
    assert value(fams, "kvdepot_tenant_hits_total", tenant="(none)",
                 tier="host") is None


def test_latency_buckets_reach_the_deadlines(daemon):
    """A call that takes as long as a client waits (store.timeout, 2 s) or
    the service itself may wait (Admin flush, leases: 30 s) lands in a
    bucket, not only in +Inf."""
    _, mport, _, _ = daemon
    fams = parse(scrape(mport))
    bounds = {}
    for s in fams["kvdepot_rpc_latency_seconds"].samples:
        if s.name.endswith("_bucket"):
            bounds.setdefault(s.labels["method"], []).append(
                float(s.labels["le"]))
    assert len(bounds) >= 10
    for method, les in bounds.items():
        assert les == sorted(les) and math.isinf(les[-1]), method
        assert les[-2] >= 30, method
        assert 1 in les and 10 in les, method


def doc_rows(text):
    """The docs/daemon.md table rows for the families of scrape `text`:
    name, type, label names, HELP text."""
    rows = {}
    for name, help_text in re.findall(r"^# HELP (\S+) (.*)$", text, re.M):
        typ = re.search(rf"^# TYPE {name} (\S+)$", text, re.M).group(1)
        labels = []
        for m in re.finditer(rf"^{name}(?:_bucket|_sum|_count)?\{{([^}}]*)\}}",
                             text, re.M):
            for k in re.findall(r'(\w+)="', m.group(1)):
                if k != "le" and k not in labels:
                    labels.append(k)
        names = ", ".join(f"`{k}`" for k in labels) or "-"
        rows[name] = f"| `{name}` | {typ} | {names} | {help_text} |"
    return rows


def put(tmp_path, ns, key, size):
    """One object of `size` bytes stored through the CLI."""
    from test_cli_remote import run
    f = tmp_path / f"obj-{ns}-{key}"
    f.write_bytes(bytes([key % 251]) * size)
    rc, _, err = run("put", "--address", f"unix:{tmp_path}/d.sock", "-n", ns,
                     "-k", f"{key:064x}", str(f))
    assert rc == 0, err


NS_A, NS_B = "a0" * 16, "b0" * 16


def test_namespace_usage(daemon, tmp_path):
    """The namespaces holding the most bytes, each with its objects and
    bytes, from a scan of the store (cached: a later scrape within 30 s
    shows the same figures and an older age)."""
    _, mport, _, _ = daemon
    for k in range(3):
        put(tmp_path, NS_A, k, 100_000)
    put(tmp_path, NS_B, 9, 50_000)
    fams = parse(scrape(mport))
    assert value(fams, "kvdepot_namespaces") == 2
    assert value(fams, "kvdepot_namespace_bytes", namespace=NS_A,
                 tenant="(none)") == 300_000
    assert value(fams, "kvdepot_namespace_bytes", namespace=NS_B) == 50_000
    assert value(fams, "kvdepot_namespace_objects", namespace=NS_A,
                 tier="host") == 3
    assert value(fams, "kvdepot_namespace_objects", namespace=NS_A,
                 tier="disk") == 0
    order = [s.labels["namespace"]
             for s in fams["kvdepot_namespace_bytes"].samples]
    assert order == [NS_A, NS_B]  # most bytes first
    put(tmp_path, NS_B, 10, 50_000)
    time.sleep(0.05)
    again = parse(scrape(mport))
    assert value(again, "kvdepot_namespace_bytes", namespace=NS_B) == 50_000
    assert value(again, "kvdepot_namespace_scan_age_seconds") > 0


def test_docs_list_every_family(daemon, tmp_path):
    """docs/daemon.md's metrics table has one row per family, with its type,
    labels and the HELP text the daemon gives it (a failure prints the rows
    to write). One object stored first, so that the per-namespace families
    have their labels."""
    _, mport, _, _ = daemon
    put(tmp_path, NS_A, 1, 1000)
    want = doc_rows(scrape(mport))
    doc = (ROOT / "docs/daemon.md").read_text()
    section = doc.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    have = set(re.findall(r"^\| `[a-z_:]+` \|.*\|$", section, re.M))
    missing = [row for row in want.values() if row not in have]
    assert missing == [], "docs/daemon.md lacks or differs:\n" + \
        "\n".join(missing)
    named = set(re.findall(r"^\| `([a-z_:]+)` \|", section, re.M))
    assert named <= set(want), named - set(want)
