"""deploy/monitoring/ against a running kvdepotd: every metric the Grafana
dashboard and the Prometheus alert rules name, and every label value they
match on, exists in a fresh daemon's /metrics (so no panel stays empty and
no alert is silently dead because of a typo or a series that appears only
later); the rules file is well formed (and passes `promtool check rules`
where the prometheus package is installed); the ServiceMonitor selects the
metrics Service of deploy/k8s by its labels and port name."""

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from conftest import KVDEPOTD, start_daemon, stop_daemon

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
MON = ROOT / "deploy" / "monitoring"
DASHBOARD = MON / "kvdepot-dashboard.json"
RULES = MON / "kvdepot-alerts.yaml"
SERVICEMONITOR = MON / "servicemonitor.yaml"

# Series Prometheus itself adds to every scrape target.
SYNTHETIC = {"up"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right",
            "and", "or", "unless", "bool", "offset", "inf", "nan"}
IDENT = r"[a-zA-Z_:][a-zA-Z0-9_:]*"


def selectors(expr):
    """(metric name, {label: value} of its equality matchers) for every
    series selector in a PromQL expression. Grafana's $variables are only
    used inside matchers and ranges, which are read here, not named."""
    found = []
    # name{matchers}
    for m in re.finditer(rf"({IDENT})\s*\{{([^}}]*)\}}", expr):
        labels = dict(re.findall(rf'({IDENT})\s*=\s*"([^"]*)"', m.group(2)))
        found.append((m.group(1), labels))
    # Bare names: drop those selectors, ranges, strings, grouping clauses,
    # numbers and durations, then every identifier not called as a function.
    rest = re.sub(rf"{IDENT}\s*\{{[^}}]*\}}", " ", expr)
    rest = re.sub(r"\[[^\]]*\]", " ", rest)
    rest = re.sub(r'"(?:[^"\\]|\\.)*"', " ", rest)
    rest = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*"
                  r"\([^)]*\)", " ", rest)
    rest = re.sub(r"\b\d+(\.\d+)?([eE][-+]?\d+)?([smhdwy]|ms)?\b", " ", rest)
    for m in re.finditer(rf"({IDENT})(\s*\()?", rest):
        if m.group(2) or m.group(1).lower() in KEYWORDS:
            continue
        found.append((m.group(1), {}))
    return found


def dashboard_exprs(dash):
    exprs = []

    def walk(panels):
        for p in panels:
            exprs.extend(t["expr"] for t in p.get("targets", []))
            walk(p.get("panels", []))
    walk(dash["panels"])
    for v in dash["templating"]["list"]:
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.match(r"label_values\((.*),\s*\w+\)$", q or "")
        if m:
            exprs.append(m.group(1))
    return exprs


def rule_exprs(rules):
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def load_rules():
    return yaml.safe_load(RULES.read_text())


def series_of(text):
    """{sample name: [label dicts]} of a scrape."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(rf"({IDENT})(?:\{{(.*)\}})? ", line)
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        out.setdefault(m.group(1), []).append(labels)
    return out


@pytest.fixture(scope="module")
def scrape(tmp_path_factory):
    if not KVDEPOTD:
        pytest.skip("KVDEPOTD not set (ctest sets it)")
    tmp = tmp_path_factory.mktemp("monitoring")
    proc, _, mport = start_daemon(tmp, "server.tenant_quotas=team-q=16m")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics",
                                    timeout=5) as r:
            return series_of(r.read().decode())
    finally:
        stop_daemon(proc)


def missing_in(scrape, exprs):
    """What the expressions name that a fresh daemon does not have."""
    missing = set()
    for expr in exprs:
        sel = selectors(expr)
        assert sel, f"no metric found in {expr!r}"
        for name, labels in sel:
            if name in SYNTHETIC:
                continue
            if name not in scrape:
                missing.add(name)
                continue
            fixed = {k: v for k, v in labels.items() if "$" not in v}
            if not any(all(s.get(k) == v for k, v in fixed.items())
                       for s in scrape[name]):
                missing.add(f"{name}{fixed}")
    return sorted(missing)


def test_selectors_read_promql():
    """The extraction the checks below rely on."""
    got = selectors('sum by (tier) (rate(kvdepot_tier_hits_total'
                    '{instance=~"$instance"}[$__rate_interval])) / '
                    'clamp_min(kvdepot_x{tier="disk"} + on (instance) '
                    'kvdepot_y, 1e-9) and up{job="kvdepotd"} == 0')
    assert sorted(n for n, _ in got) == ["kvdepot_tier_hits_total",
                                        "kvdepot_x", "kvdepot_y", "up"]
    assert ("kvdepot_x", {"tier": "disk"}) in got
    assert selectors("histogram_quantile(0.99, sum by (le) (rate("
                     "kvdepot_rpc_latency_seconds_bucket[5m])))") == [
        ("kvdepot_rpc_latency_seconds_bucket", {})]


def test_dashboard_names_only_live_metrics(scrape):
    dash = json.loads(DASHBOARD.read_text())
    exprs = dashboard_exprs(dash)
    assert len(exprs) >= 20
    assert missing_in(scrape, exprs) == []
    # What the dashboard is for: each of these is on it.
    text = "\n".join(exprs)
    for name in ("kvdepot_tier_hits_total", "kvdepot_tier_bytes",
                 "kvdepot_errors_total", "kvdepot_tier_evictions_total",
                 "kvdepot_arena_free_bytes", "kvdepot_cluster_nodes",
                 "kvdepot_rpc_latency_seconds_bucket", "kvdepot_tenant_bytes"):
        assert name in text, name


def test_dashboard_is_importable():
    """What Grafana needs to import it anywhere: a data source variable
    every query uses, unique panel ids, a grid position per panel."""
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 30
    names = [v["name"] for v in dash["templating"]["list"]]
    assert "datasource" in names
    ids, panels = [], list(dash["panels"])
    for p in panels:
        panels.extend(p.get("panels", []))
        ids.append(p["id"])
        assert set(p["gridPos"]) == {"x", "y", "w", "h"}, p["title"]
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
    assert len(ids) == len(set(ids))


def test_rules_name_only_live_metrics(scrape):
    assert missing_in(scrape, rule_exprs(load_rules())) == []


def test_rules_are_well_formed():
    rules = load_rules()
    alerts = [r for g in rules["groups"] for r in g["rules"]]
    names = [r["alert"] for r in alerts]
    assert len(names) == len(set(names))
    for want in ("KvdepotDown", "KvdepotErrorRate", "KvdepotArenaFull",
                 "KvdepotNodeCountDrop", "KvdepotEvictionStorm"):
        assert want in names
    for r in alerts:
        assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}, r
        assert re.fullmatch(r"\d+[smh]", r.get("for", "0s")), r["alert"]
        assert r["labels"]["severity"] in ("critical", "warning", "info")
        assert r["annotations"]["summary"] and \
            r["annotations"]["description"], r["alert"]
        assert r["expr"].count("(") == r["expr"].count(")"), r["alert"]
    promtool = shutil.which("promtool")
    if promtool is None:
        return  # the checks above; promtool is in the prometheus package
    p = subprocess.run([promtool, "check", "rules", str(RULES)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"SUCCESS: {len(alerts)} rules found" in p.stdout


def test_servicemonitor_selects_the_metrics_service():
    sm = yaml.safe_load(SERVICEMONITOR.read_text())
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["kind"] == "ServiceMonitor"
    k8s = ROOT / "deploy" / "k8s"
    kust = yaml.safe_load((k8s / "kustomization.yaml").read_text())
    assert sm["metadata"]["namespace"] == kust["namespace"]
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [kust["namespace"]]
    want = sm["spec"]["selector"]["matchLabels"]
    services = [d for f in kust["resources"]
                for d in yaml.safe_load_all((k8s / f).read_text())
                if d and d["kind"] == "Service"
                and want.items() <= d["metadata"].get("labels", {}).items()]
    assert [s["metadata"]["name"] for s in services] == ["kvdepotd-metrics"]
    ports = {p["name"]: p for p in services[0]["spec"]["ports"]}
    for ep in sm["spec"]["endpoints"]:
        assert ep["port"] in ports and ep["path"] == "/metrics"
    # The alerts' job="kvdepotd" is the Service label jobLabel names.
    job = services[0]["metadata"]["labels"][sm["spec"]["jobLabel"]]
    assert 'up{job="%s"}' % job in RULES.read_text()
