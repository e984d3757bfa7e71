"""deploy/k8s/: the Kubernetes manifests of a kvdepot cluster.

No cluster is needed. Every manifest must parse and name itself; the
kustomization must list every file; the kvdepotd.yaml inside the ConfigMap
is checked by the real daemon ($KVDEPOTD --print-config, as an operator
would) together with the KVDEPOT_* environment the DaemonSet adds, and every
key it sets must be one the daemon lists (--print-config passes top-level
sections it does not own, so a misspelt section would otherwise go
unnoticed); the paths, ports and sizes the config names must match the
DaemonSet's mounts, probes and limits; and the vLLM pods'
kv_connector_extra_config must pass the connector's own validation
(kvdepot.config.parse, importable without vLLM)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import KVDEPOTD

try:
    import yaml
except ImportError:  # pragma: no cover
    pytest.skip("python3-yaml is not installed", allow_module_level=True)

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
SIZE_SUFFIX = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
QUANTITY_SUFFIX = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def manifests():
    """{file name: [documents]} of every deploy/k8s/*.yaml."""
    out = {}
    for path in sorted(K8S.glob("*.yaml")):
        out[path.name] = [d for d in yaml.safe_load_all(path.read_text())
                          if d is not None]
    return out


def find(kind, name):
    for docs in manifests().values():
        for d in docs:
            if d["kind"] == kind and d["metadata"]["name"] == name:
                return d
    raise AssertionError(f"no {kind} {name} in deploy/k8s")


def flatten(tree, prefix=""):
    """Nested YAML mappings as kvdepot's dotted keys."""
    out = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_text():
    return find("ConfigMap", "kvdepotd-config")["data"]["kvdepotd.yaml"]


def daemon_pod():
    return find("DaemonSet", "kvdepotd")["spec"]["template"]["spec"]


def daemon_container():
    (c,) = [c for c in daemon_pod()["containers"] if c["name"] == "kvdepotd"]
    return c


def private_file(path, text):
    path.write_text(text)
    path.chmod(0o600)
    return path


def print_config(tmp_path, text, token, env=None):
    """Runs kvdepotd --config FILE --print-config with the cluster token at
    a file of this test (the pod's path does not exist here). Returns the
    process and {key: (value, source)} of what it printed."""
    if not KVDEPOTD:
        pytest.skip("KVDEPOTD (the kvdepotd binary) is not set")
    conf = tmp_path / "kvdepotd.yaml"
    conf.write_text(text)
    tok = private_file(tmp_path / "cluster-token", token + "\n")
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("KVDEPOT_")}
    clean.update(env or {})
    r = subprocess.run([KVDEPOTD, "--config", str(conf),
                        "--set", f"cluster.token_file={tok}",
                        "--print-config"],
                       capture_output=True, text=True, env=clean, timeout=30)
    printed = {}
    for line in r.stdout.splitlines():
        key, _, rest = line.partition(" = ")
        value, _, doc = rest.partition("  # ")
        printed[key] = (value, doc.rsplit("from: ", 1)[-1].rstrip(")"))
    return r, printed


def daemon_env():
    """The DaemonSet's KVDEPOT_* variables, a node name for the field
    references."""
    env = {}
    for e in daemon_container().get("env", []):
        if e["name"].startswith("KVDEPOT_"):
            ref = e.get("valueFrom", {}).get("fieldRef", {})
            env[e["name"]] = e.get("value", "node-a" if ref else "")
    return env


def bytes_of(size):
    """A kvdepot size ("64g") or a Kubernetes quantity ("70Gi") in bytes."""
    s = str(size)
    for suffix, mult in list(QUANTITY_SUFFIX.items()) + \
            list(SIZE_SUFFIX.items()):
        if s.endswith(suffix):
            return int(s[:-len(suffix)]) * mult
    return int(s)


def mounted_path(container, path, pod):
    """The pod volume whose mount in `container` holds `path`."""
    best = None
    for m in container.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/")
        if (path == mp or path.startswith(mp + "/")) and \
                (best is None or len(mp) > len(best["mountPath"])):
            best = m
    assert best is not None, f"{path} is on no volume of {container['name']}"
    (vol,) = [v for v in pod["volumes"] if v["name"] == best["name"]]
    return best, vol


# ---- every manifest --------------------------------------------------------

def test_every_document_names_itself():
    found = manifests()
    assert "kustomization.yaml" in found and len(found) >= 7
    for name, docs in found.items():
        assert docs, f"{name} is empty"
        for d in docs:
            assert isinstance(d.get("apiVersion"), str) and d["apiVersion"], \
                name
            assert isinstance(d.get("kind"), str) and d["kind"], name
            assert isinstance(d.get("metadata", {}).get("name"), str) and \
                d["metadata"]["name"], f"{name}: a {d['kind']} without a name"


def test_kustomization_lists_every_file():
    (k,) = manifests()["kustomization.yaml"]
    assert k["kind"] == "Kustomization"
    others = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(k["resources"]) == sorted(others)
    assert k["namespace"] == find("Namespace", "kvdepot")["metadata"]["name"]


# ---- kvdepotd's configuration ----------------------------------------------

def test_config_uses_only_keys_kvdepotd_knows(tmp_path):
    text = config_text()
    env = daemon_env()
    assert env["KVDEPOT_SERVER_NODE_ID"] == "node-a"
    r, printed = print_config(tmp_path, text, "0123456789abcdef" * 4, env)
    assert r.returncode == 0, r.stderr
    ours = flatten(yaml.safe_load(text))
    assert ours, "the ConfigMap's kvdepotd.yaml sets nothing"
    for key, value in ours.items():
        assert key in printed, f"kvdepotd does not know {key}"
        if key != "cluster.token_file":  # overridden by this test
            assert printed[key] == (str(value), "file"), key
    for name in env:
        key = name[len("KVDEPOT_"):].lower().replace("_", ".", 1)
        assert printed[key] == (env[name], "env"), name


def test_a_misspelt_key_is_refused(tmp_path):
    """The check above can fail: a wrong key in the file is exit 2."""
    bad = yaml.safe_load(config_text())
    bad["store"]["arena_sise"] = "1g"
    r, _ = print_config(tmp_path, yaml.safe_dump(bad), "0123456789abcdef")
    assert r.returncode == 2
    assert "store.arena_sise" in r.stderr


def test_placeholder_token_is_refused(tmp_path):
    """The Secret's placeholder keeps kvdepotd from starting until it is
    replaced (tokens are 16 to 256 characters)."""
    token = find("Secret", "kvdepot-cluster-token")["stringData"]["token"]
    r, _ = print_config(tmp_path, config_text(), token)
    assert r.returncode == 2
    assert "cluster.token_file" in r.stderr


# ---- the DaemonSet against its configuration -------------------------------

def test_daemonset_matches_config():
    cfg = flatten(yaml.safe_load(config_text()))
    pod, c = daemon_pod(), daemon_container()
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["terminationGracePeriodSeconds"] >= 60
    assert "fsGroup" not in pod.get("securityContext", {})
    names = {e["name"] for e in c["env"]}
    assert {"UCX_NET_DEVICES", "UCX_TLS"} <= names
    (node_id,) = [e for e in c["env"] if e["name"] == "KVDEPOT_SERVER_NODE_ID"]
    assert node_id["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"

    # The entrypoint reads /etc/kvdepot/kvdepotd.yaml: the ConfigMap's key.
    m, vol = mounted_path(c, "/etc/kvdepot/kvdepotd.yaml", pod)
    assert m["mountPath"] == "/etc/kvdepot"
    assert vol["configMap"]["name"] == "kvdepotd-config"

    # Sockets (the default path) and the NVMe tier on the host's paths.
    _, run = mounted_path(c, "/run/kvdepot/kvdepotd.sock", pod)
    assert run["hostPath"]["path"] == "/run/kvdepot"
    _, nvme = mounted_path(c, cfg["store.disk_path"], pod)
    assert nvme["hostPath"]["path"] == "/mnt/nvme0/kvdepot"

    # The token: a Secret (0400) copied into the volume token_file is on.
    _, tok = mounted_path(c, cfg["cluster.token_file"], pod)
    assert "emptyDir" in tok
    (secret,) = [v for v in pod["volumes"] if "secret" in v]
    assert secret["secret"]["secretName"] == "kvdepot-cluster-token"
    assert secret["secret"]["defaultMode"] == 0o400

    # Probes on the metrics port the config listens on.
    port = int(cfg["server.metrics_address"].rsplit(":", 1)[1])
    (metrics,) = [p for p in c["ports"] if p["name"] == "metrics"]
    assert metrics["containerPort"] == port
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["port"] in ("metrics", port), probe
    ann = find("DaemonSet", "kvdepotd")["spec"]["template"]["metadata"][
        "annotations"]
    assert ann["prometheus.io/port"] == str(port)
    svc = find("Service", "kvdepotd-metrics")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["ports"][0]["port"] == port

    # The arena is charged to this pod: the limit must hold it.
    limit = bytes_of(c["resources"]["limits"]["memory"])
    assert limit > bytes_of(cfg["store.arena_size"])

    # cluster.etcd is the etcd client Service.
    host, port = cfg["cluster.etcd"].rsplit(":", 1)
    etcd = find("Service", host)
    assert int(port) in [p["port"] for p in etcd["spec"]["ports"]]
    sts = find("StatefulSet", "kvdepot-etcd")
    assert sts["spec"]["replicas"] == 3
    image = sts["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.startswith("quay.io/coreos/etcd:v3.5.")


def test_prestop_waits_for_the_drain():
    """preStop is `kvdepot drain on --wait` (its exit status, not its
    English output, says when the daemon is drained), bounded well inside
    the grace period so the graceful stop keeps its time."""
    pod, c = daemon_pod(), daemon_container()
    cmd = [str(a) for a in c["lifecycle"]["preStop"]["exec"]["command"]]
    # "on" unquoted would be YAML's true.
    assert cmd[:4] == ["kvdepot", "drain", "on", "--wait"], cmd
    wait = cmd[cmd.index("--wait-timeout") + 1]
    assert wait.endswith("s") and int(wait[:-1]) + 30 <= \
        pod["terminationGracePeriodSeconds"], cmd


# ---- the vLLM engines --------------------------------------------------------

def transfer_configs():
    """(deployment, container, kv_transfer_config) of every vLLM pod."""
    out = []
    for d in manifests()["vllm-disagg.yaml"]:
        if d["kind"] != "Deployment":
            continue
        for c in d["spec"]["template"]["spec"]["containers"]:
            args = [str(a) for a in c.get("command", []) + c.get("args", [])]
            for i, a in enumerate(args):
                if a == "--kv-transfer-config":
                    out.append((d, c, json.loads(args[i + 1])))
                elif a.startswith("--kv-transfer-config="):
                    out.append((d, c, json.loads(a.split("=", 1)[1])))
    return out


def test_vllm_extra_config_is_accepted_by_the_connector():
    from kvdepot import config
    found = transfer_configs()
    roles = {d["metadata"]["name"]: ktc["kv_role"] for d, _, ktc in found}
    assert roles["vllm-prefill"] == "kv_producer"
    assert roles["vllm-decode"] in ("kv_consumer", "kv_both")
    socket = "/run/kvdepot/kvdepotd.sock"  # server.unix_socket's default
    for d, c, ktc in found:
        assert ktc["kv_connector"] == "KvdepotConnector"
        assert ktc["kv_connector_module_path"] == "kvdepot.vllm"
        s = config.parse(ktc["kv_connector_extra_config"])
        assert s.store_mode == "daemon"
        assert s.store_address == f"unix:{socket}"
        # node_id is the node's name, as kvdepotd's server.node_id.
        assert s.node_id == "$(NODE_NAME)"
        (node,) = [e for e in c["env"] if e["name"] == "NODE_NAME"]
        assert node["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
        pod = d["spec"]["template"]["spec"]
        _, vol = mounted_path(c, socket, pod)
        assert vol["hostPath"]["path"] == "/run/kvdepot"
