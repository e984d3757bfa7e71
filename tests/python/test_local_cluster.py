"""deploy/local/cluster.sh: etcd, three kvdepotd nodes and the prefill ->
decode proxy started by one command on 127.0.0.1. A block stored through
node1 is read back, byte for byte, through node3 (fetched over the
cluster); a request sent to the proxy goes to a stand-in prefill engine
(max_tokens 1, the hand-off asked for), which stores the prompt's block on
node1 and answers with kvdepot's hand-off, then to a stand-in decode engine
with that hand-off, which loads the block through node3. `down` stops every
process by its pid."""
import hashlib
import http.server
import json
import os
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import KVDEPOTD
from test_cli_remote import cli
from test_daemon_cluster import ETCD, metric

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "local" / "cluster.sh"
NS = "0123456789abcdef0123456789abcdef"

pytestmark = [
    pytest.mark.skipif(not KVDEPOTD or not os.path.exists(KVDEPOTD),
                       reason="KVDEPOTD not set"),
    pytest.mark.skipif(not os.access(ETCD, os.X_OK),
                       reason="no etcd binary (etcd-server)"),
]


def sh(*args, env=None, check=True):
    p = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True,
                       timeout=120, env=env)
    if check:
        assert p.returncode == 0, p.stdout + p.stderr
    return p


def read_env(d):
    out = {}
    for line in (d / "cluster.env").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k] = v
    return out


def block_of(prompt):
    """The stand-in KV block of a prompt: 96 KiB derived from its text."""
    seed = hashlib.sha256(prompt.encode()).digest()
    return b"".join(hashlib.sha256(seed + i.to_bytes(4, "little")).digest()
                    for i in range(96 * 1024 // 32))


class Engine(http.server.ThreadingHTTPServer):
    """An OpenAI-style engine on 127.0.0.1 that records each request body;
    `answer(body)` returns the JSON reply (or raises to answer 500)."""

    def __init__(self, answer):
        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(h):
                body = json.loads(h.rfile.read(
                    int(h.headers["Content-Length"])))
                self.seen.append(body)
                reply = answer(body)
                if body.get("stream"):
                    data = b"".join(b"data: %s\n\n" % json.dumps(
                        {"choices": [{"text": part}]}).encode()
                        for part in (reply["choices"][0]["text"][:8],
                                     reply["choices"][0]["text"][8:]))
                    data += b"data: [DONE]\n\n"
                    ctype = "text/event-stream"
                else:
                    data, ctype = json.dumps(reply).encode(), \
                        "application/json"
                h.send_response(200)
                h.send_header("Content-Type", ctype)
                h.send_header("Content-Length", str(len(data)))
                h.end_headers()
                h.wfile.write(data)

        super().__init__(("127.0.0.1", 0), H)
        self.seen = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


def kv(*args):
    p = subprocess.run([cli(), *args], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return p


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, r.read().decode()


@pytest.fixture
def cluster(tmp_path):
    d = tmp_path / "c"
    handoff = {"on": True}
    node = {}

    def prefill(body):
        assert body["max_tokens"] == 1 and body["stream"] is False
        assert body["kv_transfer_params"] == {"do_remote_decode": True}
        if not handoff["on"]:
            return {"choices": [{"text": "x"}]}
        key = hashlib.sha256(body["prompt"].encode()).hexdigest()
        f = tmp_path / f"prefill-{key}"
        f.write_bytes(block_of(body["prompt"]))
        kv("put", "--address", node["node1"], "-n", NS, "-k", key, str(f))
        return {"choices": [{"text": "x"}], "kv_transfer_params": {
            "do_remote_prefill": True, "do_remote_decode": False,
            "kvdepot_node": "node1", "kvdepot_ns": NS,
            "kvdepot_hashes": [key], "kvdepot_num_tokens": 16}}

    def decode(body):
        p = body.get("kv_transfer_params")
        if not p:
            return {"choices": [{"text": "computed:" + "0" * 55}]}
        assert p["kvdepot_node"] == "node1" and p["kvdepot_ns"] == NS
        f = tmp_path / "decode-block"
        kv("get", "--address", node["node3"], "-n", NS,
           "-k", p["kvdepot_hashes"][0], str(f))
        return {"choices": [{"text": hashlib.sha256(
            f.read_bytes()).hexdigest()}]}

    pe, de = Engine(prefill), Engine(decode)
    env = dict(os.environ, KVDEPOTD=KVDEPOTD, KVDEPOT_CLI=cli(), ETCD=ETCD,
               KVDEPOT_PREFILL_URL=pe.url, KVDEPOT_DECODE_URL=de.url,
               KVDEPOT_LOCAL_ARENA="64m", KVDEPOT_LOCAL_DISK="64m")
    up = sh("up", "--dir", str(d), env=env, check=False)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        e = read_env(d)
        node.update({f"node{i}": e[f"KVDEPOT_NODE{i}_ADDRESS"]
                     for i in (1, 2, 3)})
        yield d, e, up.stdout, pe, de, handoff, env
    finally:
        sh("down", "--dir", str(d), env=env, check=False)
        pe.shutdown()
        de.shutdown()


def test_block_crosses_the_cluster_and_the_proxy(cluster, tmp_path):
    d, e, out, pe, de, handoff, env = cluster
    assert "3 node(s)" in out and out.count("yes") == 3, out
    pids = [int((d / p).read_text()) for p in
            ("etcd.pid", "proxy.pid", "node1/kvdepotd.pid",
             "node2/kvdepotd.pid", "node3/kvdepotd.pid")]
    assert all(Path(f"/proc/{p}").exists() for p in pids)
    assert oct((d / "cluster-token").stat().st_mode & 0o777) == "0o600"

    # Blocks stored through node1 come back through node3, where a part of
    # them were never stored: fetched from node1 or its replicas.
    data = os.urandom(150_000)
    (tmp_path / "b").write_bytes(data)
    keys = [f"{i:064x}" for i in range(1, 9)]
    for k in keys:
        kv("put", "--address", e["KVDEPOT_NODE1_ADDRESS"], "-n", NS,
           "-k", k, str(tmp_path / "b"))
    for k in keys:
        kv("get", "--address", e["KVDEPOT_NODE3_ADDRESS"], "-n", NS,
           "-k", k, str(tmp_path / "back"))
        assert (tmp_path / "back").read_bytes() == data
    m3 = int(e["KVDEPOT_NODE3_METRICS"].rsplit(":", 1)[1])
    assert metric(m3, "kvdepot_cluster_fetched_bytes_total") >= len(data)

    # Through the proxy: prefill saves on node1, decode loads on node3.
    proxy = e["KVDEPOT_LOCAL_PROXY"]
    prompt = "the same documents, another question"
    status, body = post(proxy + "/v1/completions",
                        {"model": "m", "prompt": prompt, "max_tokens": 40})
    want = hashlib.sha256(block_of(prompt)).hexdigest()
    assert status == 200 and json.loads(body)["choices"][0]["text"] == want
    assert de.seen[-1]["max_tokens"] == 40
    assert de.seen[-1]["kv_transfer_params"]["kvdepot_node"] == "node1"

    # Streamed: the decode engine's events are passed through as they are.
    status, body = post(proxy + "/v1/completions",
                        {"model": "m", "prompt": prompt + "!",
                         "max_tokens": 40, "stream": True})
    want = hashlib.sha256(block_of(prompt + "!")).hexdigest()
    texts = [json.loads(x[6:])["choices"][0]["text"]
             for x in body.split("\n\n") if x.startswith("data: {")]
    assert status == 200 and "".join(texts) == want and \
        body.endswith("data: [DONE]\n\n")
    assert pe.seen[-1]["stream"] is False and de.seen[-1]["stream"] is True

    # No hand-off from the prefill engine: the decode engine computes.
    handoff["on"] = False
    status, body = post(proxy + "/v1/completions",
                        {"model": "m", "prompt": "short", "max_tokens": 4})
    assert status == 200 and "computed:" in body
    assert "kv_transfer_params" not in de.seen[-1]

    # Bad requests get an error, not a crash.
    req = urllib.request.Request(proxy + "/v1/completions", data=b"{not json",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 400

    st = sh("status", "--dir", str(d), env=env)
    assert st.stdout.count("not running") == 0

    sh("down", "--dir", str(d), env=env)
    assert not any(Path(f"/proc/{p}").exists() and
                   "zombie" not in Path(f"/proc/{p}/status").read_text()
                   .lower() for p in pids)
    st = sh("status", "--dir", str(d), env=env, check=False)
    assert st.returncode == 1 and st.stdout.count("not running") == 5


def test_dead_prefill_engine_is_a_502(cluster):
    d, e, out, pe, de, handoff, env = cluster
    pe.shutdown()
    pe.server_close()
    with pytest.raises(urllib.error.HTTPError) as err:
        post(e["KVDEPOT_LOCAL_PROXY"] + "/v1/chat/completions",
             {"model": "m", "messages": [], "max_tokens": 3})
    assert err.value.code == 502
    assert "prefill engine" in err.value.read().decode()
