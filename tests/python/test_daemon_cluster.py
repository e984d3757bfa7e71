"""kvdepotd in a cluster: two daemons registered in a real etcd (Debian's
etcd-server, started here on 127.0.0.1 ports picked at run time) see each
other in /metrics; with etcd killed they keep serving and report the stale
view in /readyz and /metrics; with etcd back the view is fresh again; a
daemon stopped with SIGTERM leaves the other's view at once. Prefill and
decode (vLLM) and context and generation (TensorRT-LLM) engines on two
daemons get the same KV bit for bit."""
import json
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


class TwoNodes:
    """An etcd and two daemons of one cluster (ids `names`), started in
    tmp_path/<name>; `procs` and `metrics` hold each daemon's process and
    metrics port once it sees the other. Stopped by close()."""

    def __init__(self, tmp_path, cluster, names):
        self.tmp_path, self.cport, self.pport = tmp_path, free_port(), \
            free_port()
        self.etcd = start_etcd(tmp_path, self.cport, self.pport)
        self.dirs = [tmp_path / n for n in names]
        self.procs, self.metrics = [None, None], [None, None]
        common = [f"cluster.etcd=127.0.0.1:{self.cport}",
                  f"cluster.name={cluster}", "cluster.lease_ttl=2s"]
        try:
            for i, n in enumerate(names):
                self.dirs[i].mkdir()
                self.procs[i], _, self.metrics[i] = start_daemon(
                    self.dirs[i], f"server.node_id=node-{n}", *common)
            assert wait_for(lambda: all(
                metric(m, "kvdepot_cluster_nodes") == 2
                for m in self.metrics), 20)
        except BaseException:
            self.close()
            raise

    def close(self):
        for x in self.procs:
            if x is not None:
                stop_daemon(x)
        self.procs = [None, None]
        self.etcd.send_signal(signal.SIGKILL)
        self.etcd.wait()


def cluster_nodes(d, *extra):
    """`kvdepot cluster nodes` against the daemon of directory d."""
    from test_cli_remote import run
    return run("cluster", "nodes", "--address", f"unix:{d}/d.sock", *extra)


def test_two_daemons_one_cluster(tmp_path):
    c = TwoNodes(tmp_path, "t", ["a", "b"])
    etcd, cport, pport = c.etcd, c.cport, c.pport
    am = c.metrics[0]
    try:
        assert metric(am, "kvdepot_cluster_stale") == 0
        assert get(am, "/readyz") == (200, "ready\n")
        rc, out, err = cluster_nodes(c.dirs[0], "--json")
        assert rc == 0, err
        view = json.loads(out)
        assert view["clustered"] and view["self"] == "node-a"
        assert not view["stale"] and view["registered"], view
        assert [n["node_id"] for n in view["nodes"]] == ["node-a", "node-b"]
        assert all(n["grpc_address"] and n["protocol_revision"] >= 7
                   for n in view["nodes"]), view
        rc, out, err = cluster_nodes(c.dirs[1])
        assert rc == 0 and "node-b" in out and "(this one)" in out, err
        assert "STALE" not in out and err == "", (out, err)

        etcd.kill()
        etcd.wait()
        assert wait_for(lambda: metric(am, "kvdepot_cluster_stale") == 1, 10)
        status, body = get(am, "/readyz")
        assert status == 200 and "cluster view stale" in body
        assert metric(am, "kvdepot_cluster_nodes") == 2  # the last view
        rc, out, err = cluster_nodes(c.dirs[0])
        assert rc == 0 and "STALE" in out and "view is stale" in err, \
            (out, err)
        assert out.count("node-") >= 3  # header's node + both rows

        etcd = c.etcd = start_etcd(tmp_path, cport, pport)
        assert wait_for(lambda: metric(am, "kvdepot_cluster_stale") == 0
                        and metric(am, "kvdepot_cluster_nodes") == 2, 20)
        assert get(am, "/readyz") == (200, "ready\n")

        stop_daemon(c.procs[1])
        c.procs[1] = None
        assert wait_for(lambda: metric(am, "kvdepot_cluster_nodes") == 1, 3)
    finally:
        c.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")
def test_two_daemons_over_tls_etcd(tmp_path):
    """kvdepotd's cluster.etcd_tls_ca/_cert/_key against an etcd that
    serves TLS and wants client certificates (--client-cert-auth), with
    certificates made by openssl: two daemons register and see each other;
    a daemon without the settings never registers."""
    from test_daemon_grpc import make_pki
    pki = tmp_path / "pki"
    pki.mkdir()
    make_pki(pki)
    (pki / "client.key").chmod(0o600)
    cport, pport = free_port(), free_port()
    client = f"https://127.0.0.1:{cport}"
    peer = f"http://127.0.0.1:{pport}"
    log = open(tmp_path / "etcd.log", "a")
    etcd = subprocess.Popen(
        [ETCD, "--name", "t", "--data-dir", str(tmp_path / "etcd"),
         "--listen-client-urls", client, "--advertise-client-urls", client,
         "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
         "--initial-cluster", f"t={peer}", "--log-level", "warn",
         "--logger", "zap", "--cert-file", str(pki / "server.pem"),
         "--key-file", str(pki / "server.key"),
         "--trusted-ca-file", str(pki / "ca.pem"), "--client-cert-auth"],
        stdout=log, stderr=subprocess.STDOUT)
    common = [f"cluster.etcd=127.0.0.1:{cport}", "cluster.name=tls",
              "cluster.lease_ttl=2s"]
    tls = [f"cluster.etcd_tls_ca={pki}/ca.pem",
           f"cluster.etcd_tls_cert={pki}/client.pem",
           f"cluster.etcd_tls_key={pki}/client.key"]
    procs = []
    try:
        metrics = []
        for n in ("a", "b"):
            d = tmp_path / n
            d.mkdir()
            p, _, m = start_daemon(d, f"server.node_id=node-{n}", *common,
                                   *tls)
            procs.append(p)
            metrics.append(m)
        assert wait_for(lambda: all(
            metric(m, "kvdepot_cluster_nodes") == 2 for m in metrics), 30), \
            (tmp_path / "etcd.log").read_text()[-2000:]
        rc, out, err = cluster_nodes(tmp_path / "a", "--json")
        assert rc == 0, err
        assert [n["node_id"] for n in json.loads(out)["nodes"]] == \
            ["node-a", "node-b"]
        d = tmp_path / "plain"
        d.mkdir()
        p, _, m = start_daemon(d, "server.node_id=node-plain", *common)
        procs.append(p)
        time.sleep(3)
        assert metric(m, "kvdepot_cluster_registered") == 0
        assert metric(metrics[0], "kvdepot_cluster_nodes") == 2
    finally:
        for p in procs:
            stop_daemon(p)
        etcd.kill()
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
    c = TwoNodes(tmp_path, "pd", ["p", "d"])
    try:
        cfg_p = tv.vllm_config("", store_mode="daemon", node_id="node-p",
                               store_address=f"unix:{c.dirs[0]}/d.sock")
        cfg_d = tv.vllm_config("", store_mode="daemon", node_id="node-d",
                               store_address=f"unix:{c.dirs[1]}/d.sock")
        params = tv.prefill_then_decode(cfg_p, cfg_d)
        assert params["kvdepot_node"] == "node-p"
        assert metric(c.metrics[1], "kvdepot_cluster_remote_hits_total") >= 1
    finally:
        c.close()


def test_prefill_tp2_decode_tp1_over_two_daemons(tmp_path):
    """Disaggregated serving between TP sizes and nodes: a TP 2 prefill
    engine on node P writes its ranks' heads into one object per block, a
    TP 1 decode engine on node D gets the objects over UCX (pushed to their
    home node or pulled from P) and loads every head, the prefill ranks' KV
    bit for bit."""
    torch = pytest.importorskip("torch")
    import test_vllm_connector as tv
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    os.environ.setdefault("UCX_TLS", "tcp")
    c = TwoNodes(tmp_path, "tp", ["p", "d"])
    heads, n = 4, tv.PROMPT
    tokens = [(i * 31 + 2) % 32000 for i in range(n)]
    p_blocks, d_blocks = [2, 4, 6, 8, 10, 12, 14], [1, 3, 5, 7, 9, 11, 13]
    g = torch.Generator().manual_seed(8)
    whole = {f"model.layers.{i}.self_attn":
             torch.randn((2, tv.NB, tv.BS, heads, tv.DIM), generator=g).to(
                 torch.float16) for i in range(tv.LAYERS)}
    try:
        s, ranks, _ = tv.heads_engine(c.dirs[0], 2, heads, whole,
                                      node_id="node-p")
        req = tv.Request("pre", tokens)
        req.kv_transfer_params = {"do_remote_decode": True}
        assert s.get_num_new_matched_tokens(req, 0) == (0, False)
        s.update_state_after_alloc(req, tv.Blocks(p_blocks), 0)
        tv.parallel_step(s, ranks, s.build_connector_meta(
            tv.sched_output(new=[(req, 0)], tokens={"pre": n})))
        delay, params = s.request_finished(req, p_blocks)
        if delay:
            tv.parallel_step(s, ranks, s.build_connector_meta(
                tv.sched_output()), finished={"pre"})
        assert params["kvdepot_node"] == "node-p"
        tv.shutdown_all(s, ranks)

        empty = {k: torch.full_like(t, -1.0) for k, t in whole.items()}
        s, ranks, _ = tv.heads_engine(c.dirs[1], 1, heads, empty,
                                      node_id="node-d")
        req = tv.Request("dec", tokens)
        req.kv_transfer_params = dict(params)
        got, is_async = s.get_num_new_matched_tokens(req, 0)
        assert got == 96
        s.update_state_after_alloc(req, tv.Blocks(d_blocks), 96)
        if is_async:  # pulled from P: loaded before it runs
            done, deadline = set(), time.monotonic() + 20
            while "dec" not in done:
                assert time.monotonic() < deadline, "never loaded"
                time.sleep(0.002)
                done, invalid = tv.parallel_step(
                    s, ranks, s.build_connector_meta(tv.sched_output()))
                assert invalid == set()
        else:  # pushed to D, its home node, already
            _, invalid = tv.parallel_step(s, ranks, s.build_connector_meta(
                tv.sched_output(new=[(req, 96)], tokens={"dec": n - 96})))
            assert invalid == set()
        (w, kvs), = ranks
        assert w.kvdepot_stats()["blocks_loaded"] == 6
        for name, t in kvs.items():
            for p, d in zip(p_blocks[:6], d_blocks[:6]):
                assert torch.equal(t[:, d], whole[name][:, p])
        # Through the cluster: pushed to D as their home, or pulled from P.
        assert metric(c.metrics[0], "kvdepot_cluster_pushes_total") + \
            metric(c.metrics[1], "kvdepot_cluster_remote_hits_total") >= 1
        tv.shutdown_all(s, ranks)
    finally:
        c.close()


def test_trtllm_context_generation_over_two_daemons(tmp_path, monkeypatch):
    """TensorRT-LLM disaggregated serving: the context engine's connector on
    node C's kvdepotd saves a prompt's blocks; C pushes them to their home
    nodes; the generation engine's connector on node G matches the same
    prompt (G's daemon asks the home node on a local miss and pulls over
    UCX) and loads blocks equal to the context engine's bit for bit."""
    pytest.importorskip("torch")
    import json
    import torch
    import test_trtllm_connector as tt
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    os.environ.setdefault("UCX_TLS", "tcp")
    c = TwoNodes(tmp_path, "tr", ["c", "g"])
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "num_hidden_layers": tt.LAYERS, "num_attention_heads": 4,
        "num_key_value_heads": tt.HEADS, "hidden_size": 4 * tt.DIM,
        "torch_dtype": "float16"}))

    def engine(i, name, pool):
        monkeypatch.setenv("KVDEPOT_CONFIG", json.dumps({
            "store_mode": "daemon", "node_id": f"node-{name}",
            "store_address": f"unix:{c.dirs[i]}/d.sock"}))
        return tt.engine(tt.llm_args(model), pool)

    tokens = [(i * 7 + 3) % 32000 for i in range(tt.PROMPT)]
    full = 4 * tt.BS
    try:
        kv_c = tt.pool(fill=True)
        s, w, m = engine(0, "c", kv_c)
        c_blocks = [5, 2, 9, 0, 11]
        # The router's context request (max_new_tokens 1): its saves are
        # committed when its step ends, async_saves or not.
        assert tt.run_prefill(m, tt.LlmRequest(7, tokens, max_new_tokens=1),
                              c_blocks, tokens) == (0, False)
        assert w.kvdepot_stats()["blocks_saved"] == 4
        tt.close(s, w)

        kv_g = tt.pool(fill=False)
        s, w, m = engine(1, "g", kv_g)
        g_blocks = [15, 14, 13, 12, 1]
        deadline = time.monotonic() + 10
        for rid in range(100, 1000):  # the pushes run in the background
            req = tt.LlmRequest(rid, tokens)
            n, is_async = m.get_num_new_matched_tokens(req, 0)
            m.update_state_after_alloc(req, g_blocks)
            if n == full:
                break
            m.request_finished(req, g_blocks)
            assert time.monotonic() < deadline, "never matched on node G"
            time.sleep(0.05)
        assert is_async
        tt.wait_loaded(m, rid)
        assert m.step(tt.sched_out([tt.rd(rid, g_blocks, tokens, full,
                                          tt.PROMPT - full)]),
                      tt.LAYERS) is None
        for i in range(4):
            assert torch.equal(kv_c[c_blocks[i]], kv_g[g_blocks[i]])
        assert w.kvdepot_stats()["load_errors"] == 0
        # Through the cluster: pushed to G as their home, or pulled from C.
        assert metric(c.metrics[0], "kvdepot_cluster_pushes_total") + \
            metric(c.metrics[1], "kvdepot_cluster_remote_hits_total") >= 1
        m.request_finished(req, g_blocks)
        tt.close(s, w)
    finally:
        c.close()
