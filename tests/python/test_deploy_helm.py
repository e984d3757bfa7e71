"""deploy/helm: the Helm chart built from deploy/k8s (build_chart.py).

Helm is not in Debian's archive or on PyPI, so the chart is rendered here by
a renderer of the few template actions build_chart.py writes (a value, a
value piped to `quote`, `if` / `end` with Go's whitespace trimming); any
other action in a template fails the test, so the chart cannot grow a
construct this check does not understand. With the default values the
rendered objects must equal those `kubectl apply -k deploy/k8s` creates
(kustomize's namespace applied, the Namespace object aside: Helm's
--create-namespace makes it); with other values each setting must land
where it belongs and the switched-off parts must vanish. Where a `helm`
binary is on PATH, `helm template` must render the same objects."""
import copy
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

try:
    import yaml
except ImportError:  # pragma: no cover
    pytest.skip("python3-yaml is not installed", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
HELM_DIR = ROOT / "deploy" / "helm"
K8S = ROOT / "deploy" / "k8s"
sys.path.insert(0, str(HELM_DIR))
import build_chart  # noqa: E402

ACTION = re.compile(r"\{\{(-?) *(.*?) *(-?)\}\}", re.S)
VALUE = re.compile(r"^(\.(?:Values|Release|Chart)(?:\.[A-Za-z0-9_]+)+)"
                   r"( *\| *quote)?$")
IF = re.compile(r"^if (\.Values(?:\.[A-Za-z0-9_]+)+)$")


def lookup(scope, path):
    node = scope
    for part in path.lstrip(".").split("."):
        if not isinstance(node, dict) or part not in node:
            raise AssertionError(f"template names {path}, which is not set")
        node = node[part]
    return node


def go_string(v):
    """A value as Go's text/template prints it (YAML scalars only)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)) or v is None:
        raise AssertionError(f"non-scalar value {v!r} printed")
    return str(v)


def render(text, scope):
    """Renders the subset of Helm's template language build_chart.py uses."""
    out, stack, pos = [], [True], 0
    for m in ACTION.finditer(text):
        chunk = text[pos:m.start()]
        if m.group(1):
            chunk = chunk.rstrip(" \t\r\n")
        if all(stack):
            out.append(chunk)
        pos = m.end()
        if m.group(3):
            rest = text[pos:]
            pos += len(rest) - len(rest.lstrip(" \t\r\n"))
        body = m.group(2)
        if (v := VALUE.match(body)):
            if all(stack):
                s = go_string(lookup(scope, v.group(1)))
                out.append(json.dumps(s) if v.group(2) else s)
        elif (c := IF.match(body)):
            stack.append(bool(lookup(scope, c.group(1))))
        elif body == "end":
            assert len(stack) > 1, "end without if"
            stack.pop()
        else:
            raise AssertionError(f"template action {{{{{body}}}}} is not one "
                                 "this test renders")
    assert len(stack) == 1, "if without end"
    if all(stack):
        out.append(text[pos:])
    return "".join(out)


def merge(base, over):
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


@pytest.fixture(scope="module")
def chart(tmp_path_factory):
    return build_chart.build(tmp_path_factory.mktemp("chart"))


def objects(chart_dir, namespace="kvdepot", values=None):
    """{(kind, name): object} the chart renders."""
    vals = merge(yaml.safe_load((chart_dir / "values.yaml").read_text()),
                 values or {})
    meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    scope = {"Values": vals, "Release": {"Namespace": namespace,
                                          "Name": "kvdepot"},
             "Chart": {"AppVersion": meta["appVersion"],
                       "Version": meta["version"]}}
    out = {}
    for t in sorted((chart_dir / "templates").glob("*.yaml")):
        for d in yaml.safe_load_all(render(t.read_text(), scope)):
            if d is not None:
                key = (d["kind"], d["metadata"]["name"])
                assert key not in out, f"{key} twice"
                out[key] = d
    render((chart_dir / "templates" / "NOTES.txt").read_text(), scope)
    return out


def kustomize_objects():
    """What `kubectl apply -k deploy/k8s` creates, Namespace aside."""
    k = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    out = {}
    for res in k["resources"]:
        for d in yaml.safe_load_all((K8S / res).read_text()):
            if d is None or d["kind"] == "Namespace":
                continue
            d["metadata"]["namespace"] = k["namespace"]
            out[(d["kind"], d["metadata"]["name"])] = d
    return out


def test_chart_package_and_metadata(chart):
    chart_dir, tgz = chart
    meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    version = build_chart.project_version()
    assert meta["apiVersion"] == "v2" and meta["name"] == "kvdepot"
    assert meta["version"] == meta["appVersion"] == version
    assert tgz.name == f"kvdepot-{version}.tgz"
    with tarfile.open(tgz) as t:
        names = set(t.getnames())
    assert {"kvdepot/Chart.yaml", "kvdepot/values.yaml",
            "kvdepot/templates/kvdepotd.yaml"} <= names
    assert all(n.startswith("kvdepot/") for n in names)
    # Every manifest of the kustomization but the Namespace is a template.
    k = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(build_chart.FILES) == sorted(
        r for r in k["resources"] if r != "namespace.yaml")


def test_defaults_render_the_kustomize_objects(chart):
    got, want = objects(chart[0]), kustomize_objects()
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key] == want[key], key


def test_values_land_where_they_belong(chart):
    got = objects(chart[0], namespace="infer", values={
        "nodeLabel": "example.com/kv",
        "kvdepotd": {"image": "reg.example.com/kvdepotd:0.1.0",
                     "ucxNetDevices": "mlx5_0:1", "ucxTls": "rc,tcp",
                     "memory": "40Gi", "nvmeHostPath": "/nvme/kv"},
        "config": {"etcd": "etcd.example.com:2379", "arenaSize": "32g",
                   "diskSize": "1t", "replicas": 3},
        "clusterToken": {"create": False},
        "etcd": {"enabled": False},
        "vllm": {"enabled": False}})
    assert sorted(got) == [("ConfigMap", "kvdepotd-config"),
                           ("DaemonSet", "kvdepotd"),
                           ("Service", "kvdepotd-metrics")]
    assert all(o["metadata"]["namespace"] == "infer" for o in got.values())
    spec = got[("DaemonSet", "kvdepotd")]["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"example.com/kv": "true"}
    pods = spec["initContainers"] + spec["containers"]
    assert {c["image"] for c in pods} == {"reg.example.com/kvdepotd:0.1.0"}
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1" and env["UCX_TLS"] == "rc,tcp"
    res = spec["containers"][0]["resources"]
    assert res["limits"]["memory"] == res["requests"]["memory"] == "40Gi"
    nvme = [v for v in spec["volumes"] if v["name"] == "nvme"][0]
    assert nvme["hostPath"]["path"] == "/nvme/kv"
    conf = yaml.safe_load(
        got[("ConfigMap", "kvdepotd-config")]["data"]["kvdepotd.yaml"])
    assert conf["cluster"]["etcd"] == "etcd.example.com:2379"
    assert conf["cluster"]["replicas"] == 3
    assert conf["store"]["arena_size"] == "32g"
    assert conf["store"]["disk_size"] == "1t"


def test_engines_and_token_values(chart):
    got = objects(chart[0], values={
        "vllm": {"image": "reg.example.com/kvdepot-vllm:0.1.0",
                 "model": "Qwen/Qwen3-8B"},
        "clusterToken": {"token": "0123456789abcdef0123456789abcdef"}})
    for name in ("vllm-prefill", "vllm-decode"):
        c = got[("Deployment", name)]["spec"]["template"]["spec"][
            "containers"][0]
        assert c["image"] == "reg.example.com/kvdepot-vllm:0.1.0"
        assert c["args"][0] == "Qwen/Qwen3-8B"
    assert got[("Secret", "kvdepot-cluster-token")]["stringData"][
        "token"] == "0123456789abcdef0123456789abcdef"


def test_renderer_refuses_what_it_does_not_know():
    with pytest.raises(AssertionError, match="not one this test renders"):
        render("a: {{ .Values.x | default 3 }}\n", {"Values": {"x": 1}})
    with pytest.raises(AssertionError, match="not set"):
        render("a: {{ .Values.y }}\n", {"Values": {}})
    assert render("a:\n{{- if .Values.x }}\n  b: {{ .Values.s | quote }}\n"
                  "{{- end }}\n", {"Values": {"x": True, "s": "q\""}}) == \
        'a:\n  b: "q\\""\n'


def test_build_stops_when_a_manifest_drifts(monkeypatch, tmp_path):
    monkeypatch.setattr(build_chart, "SETTINGS", build_chart.SETTINGS + [
        ("kvdepotd.yaml", "image: gone:1", "image: x", 1)])
    with pytest.raises(SystemExit, match="occurs 0 times"):
        build_chart.build(tmp_path)


@pytest.mark.skipif(not shutil.which("helm"), reason="no helm binary")
def test_helm_template_agrees(chart):  # pragma: no cover - no helm here
    out = subprocess.run(["helm", "template", "kvdepot", str(chart[1]),
                          "--namespace", "kvdepot"], capture_output=True,
                         text=True, check=True).stdout
    got = {(d["kind"], d["metadata"]["name"]): d
           for d in yaml.safe_load_all(out) if d}
    assert got == objects(chart[0])
