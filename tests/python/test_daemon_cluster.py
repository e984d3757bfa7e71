"""kvdepotd in a cluster: two daemons registered in a real etcd (Debian's
etcd-server, started here on 127.0.0.1 ports picked at run time) see each
other in /metrics; with etcd killed they keep serving and report the stale
view in /readyz and /metrics; with etcd back the view is fresh again; a
daemon stopped with SIGTERM leaves the other's view at once."""
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

from conftest import KVDEPOTD, start_daemon, stop_daemon

ETCD = shutil.which("etcd") or "/usr/bin/etcd"

pytestmark = [
    pytest.mark.skipif(not KVDEPOTD or not os.path.exists(KVDEPOTD),
                       reason="KVDEPOTD not set"),
    pytest.mark.skipif(not os.access(ETCD, os.X_OK),
                       reason="no etcd binary (etcd-server)"),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_etcd(d, cport, pport):
    client, peer = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{pport}"
    log = open(d / "etcd.log", "a")
    return subprocess.Popen(
        [ETCD, "--name", "t", "--data-dir", str(d / "etcd"),
         "--listen-client-urls", client, "--advertise-client-urls", client,
         "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
         "--initial-cluster", f"t={peer}", "--log-level", "warn",
         "--logger", "zap"], stdout=log, stderr=subprocess.STDOUT)


def get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}",
                                    timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(port, name):
    for line in get(port, "/metrics")[1].splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def wait_for(fn, secs):
    end = time.monotonic() + secs
    while time.monotonic() < end:
        if fn():
            return True
        time.sleep(0.05)
    return False


def test_two_daemons_one_cluster(tmp_path):
    cport, pport = free_port(), free_port()
    etcd = start_etcd(tmp_path, cport, pport)
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    common = [f"cluster.etcd=127.0.0.1:{cport}", "cluster.name=t",
              "cluster.lease_ttl=2s"]
    a = b = None
    try:
        a, _, am = start_daemon(a_dir, "server.node_id=node-a", *common)
        b, _, bm = start_daemon(b_dir, "server.node_id=node-b", *common)
        assert wait_for(lambda: metric(am, "kvdepot_cluster_nodes") == 2
                        and metric(bm, "kvdepot_cluster_nodes") == 2, 20)
        assert metric(am, "kvdepot_cluster_stale") == 0
        assert get(am, "/readyz") == (200, "ready\n")

        etcd.kill()
        etcd.wait()
        assert wait_for(lambda: metric(am, "kvdepot_cluster_stale") == 1, 10)
        status, body = get(am, "/readyz")
        assert status == 200 and "cluster view stale" in body
        assert metric(am, "kvdepot_cluster_nodes") == 2  # the last view

        etcd = start_etcd(tmp_path, cport, pport)
        assert wait_for(lambda: metric(am, "kvdepot_cluster_stale") == 0
                        and metric(am, "kvdepot_cluster_nodes") == 2, 20)
        assert get(am, "/readyz") == (200, "ready\n")

        stop_daemon(b)
        b = None
        assert wait_for(lambda: metric(am, "kvdepot_cluster_nodes") == 1, 3)
    finally:
        for d in (a, b):
            if d is not None:
                stop_daemon(d)
        etcd.send_signal(signal.SIGKILL)
        etcd.wait()


def test_prefill_decode_over_two_daemons(tmp_path):
    """Disaggregated serving: a prefill engine on node P's kvdepotd, a
    decode engine on node D's; the decode request carries the prefill
    side's kv_transfer_params, D pulls the blocks from P over UCX (loopback
    TCP) at once, and the decode engine's KV equals the prefill engine's
    bit for bit."""
    pytest.importorskip("torch")
    import test_vllm_connector as tv
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    os.environ.setdefault("UCX_TLS", "tcp")
    cport, pport = free_port(), free_port()
    etcd = start_etcd(tmp_path, cport, pport)
    p_dir, d_dir = tmp_path / "p", tmp_path / "d"
    p_dir.mkdir()
    d_dir.mkdir()
    common = [f"cluster.etcd=127.0.0.1:{cport}", "cluster.name=pd",
              "cluster.lease_ttl=2s"]
    p = d = None
    try:
        p, _, pm = start_daemon(p_dir, "server.node_id=node-p", *common)
        d, _, dm = start_daemon(d_dir, "server.node_id=node-d", *common)
        assert wait_for(lambda: metric(pm, "kvdepot_cluster_nodes") == 2
                        and metric(dm, "kvdepot_cluster_nodes") == 2, 20)
        cfg_p = tv.vllm_config("", store_mode="daemon", node_id="node-p",
                               store_address=f"unix:{p_dir}/d.sock")
        cfg_d = tv.vllm_config("", store_mode="daemon", node_id="node-d",
                               store_address=f"unix:{d_dir}/d.sock")
        params = tv.prefill_then_decode(cfg_p, cfg_d)
        assert params["kvdepot_node"] == "node-p"
        assert metric(dm, "kvdepot_cluster_remote_hits_total") >= 1
    finally:
        for x in (p, d):
            if x is not None:
                stop_daemon(x)
        etcd.send_signal(signal.SIGKILL)
        etcd.wait()
