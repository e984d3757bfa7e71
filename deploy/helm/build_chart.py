#!/usr/bin/env python3
"""Builds the kvdepot Helm chart from the Kustomize manifests of deploy/k8s,
so that the two cannot drift apart: the chart's templates are those files
with the settings below turned into values (deploy/helm/values.yaml), the
release's namespace on every object, and the optional parts behind `if`s.
Each replacement must match the manifest's YAML lines (not its comments)
exactly as often as listed, so a manifest edited out from under it stops
the build instead of leaving a setting behind. Chart.yaml's version is the project's (CMakeLists.txt).

Usage: build_chart.py OUT_DIR      writes OUT_DIR/kvdepot/ (the chart) and
                                   OUT_DIR/kvdepot-<version>.tgz (helm
                                   package's layout: `helm install NAME FILE`)
Standard library only; `make chart` runs it.
"""
import io
import re
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
K8S = ROOT / "deploy" / "k8s"

# file of deploy/k8s -> the value that switches it on ("" : always)
FILES = {
    "etcd.yaml": ".Values.etcd.enabled",
    "kvdepotd-config.yaml": "",
    "kvdepotd-secret.yaml": ".Values.clusterToken.create",
    "kvdepotd.yaml": "",
    "vllm-disagg.yaml": ".Values.vllm.enabled",
}

# (file, text in the manifest, template text, times it occurs)
SETTINGS = [
    ("etcd.yaml", "image: quay.io/coreos/etcd:v3.5.17",
     "image: {{ .Values.etcd.image | quote }}", 1),
    ("etcd.yaml", "storage: 1Gi", "storage: {{ .Values.etcd.storage | quote }}",
     1),
    ("kvdepotd-config.yaml", 'etcd: "kvdepot-etcd:2379"',
     "etcd: {{ .Values.config.etcd | quote }}", 1),
    ("kvdepotd-config.yaml", "replicas: 2",
     "replicas: {{ .Values.config.replicas }}", 1),
    ("kvdepotd-config.yaml", "arena_size: 64g",
     "arena_size: {{ .Values.config.arenaSize }}", 1),
    ("kvdepotd-config.yaml", "disk_size: 512g",
     "disk_size: {{ .Values.config.diskSize }}", 1),
    ("kvdepotd-secret.yaml", 'token: "REPLACE-ME"',
     "token: {{ .Values.clusterToken.token | quote }}", 1),
    ("kvdepotd.yaml", "image: kvdepotd:latest",
     "image: {{ .Values.kvdepotd.image | quote }}", 2),
    ("kvdepotd.yaml", "kvdepot/node: \"true\"",
     "{{ .Values.nodeLabel }}: \"true\"", 1),
    ("kvdepotd.yaml", "- name: UCX_NET_DEVICES\n              value: eth0",
     "- name: UCX_NET_DEVICES\n"
     "              value: {{ .Values.kvdepotd.ucxNetDevices | quote }}", 1),
    ("kvdepotd.yaml", "- name: UCX_TLS\n              value: tcp",
     "- name: UCX_TLS\n"
     "              value: {{ .Values.kvdepotd.ucxTls | quote }}", 1),
    ("kvdepotd.yaml", 'cpu: "2"', "cpu: {{ .Values.kvdepotd.cpu | quote }}",
     1),
    ("kvdepotd.yaml", "memory: 70Gi",
     "memory: {{ .Values.kvdepotd.memory | quote }}", 2),
    ("kvdepotd.yaml", "path: /mnt/nvme0/kvdepot",
     "path: {{ .Values.kvdepotd.nvmeHostPath | quote }}", 1),
    ("vllm-disagg.yaml", "image: kvdepot-vllm:latest",
     "image: {{ .Values.vllm.image | quote }}", 2),
    ("vllm-disagg.yaml", "kvdepot/node: \"true\"",
     "{{ .Values.nodeLabel }}: \"true\"", 2),
    ("vllm-disagg.yaml", "- meta-llama/Llama-3.1-8B-Instruct",
     "- {{ .Values.vllm.model | quote }}", 2),
]

TOP_METADATA = re.compile(r"^metadata:\n  name: ([^\n]+)\n", re.M)


def project_version():
    m = re.search(r"^project\(kvdepot VERSION ([0-9.]+)",
                  (ROOT / "CMakeLists.txt").read_text(), re.M)
    if not m:
        raise SystemExit("build_chart: no project VERSION in CMakeLists.txt")
    return m.group(1)


def template(name):
    """The chart template made from deploy/k8s/<name>."""
    text = (K8S / name).read_text()
    for f, old, new, times in SETTINGS:
        if f != name:
            continue
        # At the start of a YAML line (after its indentation), never in a
        # comment.
        text, found = re.subn(r"(?m)^([ \t]*)" + re.escape(old),
                              lambda m: m.group(1) + new, text)
        if found != times:
            raise SystemExit(f"build_chart: deploy/k8s/{name}: {old!r} "
                             f"occurs {found} times, expected {times}")
    text, n = TOP_METADATA.subn(
        lambda m: f"metadata:\n  name: {m.group(1)}\n"
                  "  namespace: {{ .Release.Namespace }}\n", text)
    if n != text.count("\n---\n") + 1:
        raise SystemExit(f"build_chart: deploy/k8s/{name}: {n} top-level "
                         "metadata blocks for its documents")
    header = (f"# From deploy/k8s/{name} by deploy/helm/build_chart.py: the "
              "comments\n# below are the manifest's.\n")
    if FILES[name]:
        return f"{header}{{{{- if {FILES[name]} }}}}\n{text}{{{{- end }}}}\n"
    return header + text


def build(out):
    version = project_version()
    chart = out / "kvdepot"
    (chart / "templates").mkdir(parents=True, exist_ok=True)
    files = {
        "Chart.yaml": (HERE / "Chart.yaml").read_text().replace(
            "@VERSION@", version),
        "values.yaml": (HERE / "values.yaml").read_text(),
        "templates/NOTES.txt": (HERE / "NOTES.txt").read_text(),
    }
    for name in FILES:
        files[f"templates/{name}"] = template(name)
    for rel, text in files.items():
        (chart / rel).write_text(text)
    tgz = out / f"kvdepot-{version}.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        for rel, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"kvdepot/{rel}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return chart, tgz


def main(argv):
    if len(argv) != 2:
        raise SystemExit(__doc__)
    chart, tgz = build(Path(argv[1]))
    print(f"chart: {chart} and {tgz}")


if __name__ == "__main__":
    main(sys.argv)
