"""`kvdepot` over TCP (--address tcp:HOST:PORT): the operator calls that
need no arena (ping, stats, ls, lookup, drain, evict) against a kvdepotd's
server.tcp_address, with the bearer token from a file (--auth-file) or over
TLS with a client certificate (--tls-ca, --tls-cert, --tls-key; made here
with Debian's openssl). Refused clearly: no token, a wrong one, a token
file others can read, a client certificate of another CA, and the data
calls (put), which need the daemon's unix socket."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import DAEMON_TOKEN, KVDEPOTD, start_daemon, stop_daemon
from test_daemon_grpc import make_pki

pytestmark = pytest.mark.skipif(not KVDEPOTD, reason="KVDEPOTD not set")

NS = "00112233445566778899aabbccddeeff"


def cli():
    path = Path(KVDEPOTD).resolve().parents[1] / "cli" / "kvdepot"
    if not path.exists():
        pytest.skip(f"no kvdepot CLI at {path}")
    return str(path)


def run(*args):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KVDEPOT_STORE_")}
    p = subprocess.run([cli(), *args], capture_output=True, text=True,
                       timeout=60, env=env)
    return p.returncode, p.stdout, p.stderr


def secret(path, text, mode=0o600):
    path.write_text(text + "\n")
    path.chmod(mode)
    return str(path)


def test_operator_calls_over_tcp_with_a_token(tmp_path):
    proc, port, _ = start_daemon(tmp_path)
    addr = f"tcp:127.0.0.1:{port}"
    tok = secret(tmp_path / "token", DAEMON_TOKEN)
    try:
        rc, out, err = run("ping", "--address", addr, "--auth-file", tok)
        assert rc == 0 and out.startswith("ok ") and addr in out, err
        rc, out, err = run("ls", "--json", "--address", addr,
                           "--auth-file", tok)
        assert rc == 0, err
        assert json.loads(out)["address"] == addr
        rc, out, err = run("stats", "--address", addr, "--auth-file", tok)
        assert rc == 0 and "capacity" in out, err
        rc, out, err = run("lookup", "--address", addr, "--auth-file", tok,
                           "--namespace", NS, "--tokens", "1,2,3,4,5,6,7,8",
                           "--block-size", "4")
        assert rc == 0 and "hit: 0 of 2 blocks" in out, err
        rc, out, err = run("evict", "--namespace", NS, "--address", addr,
                           "--auth-file", tok)
        assert rc == 0 and out.startswith("evicted 0 objects"), (out, err)
        rc, out, err = run("drain", "on", "--address", addr,
                           "--auth-file", tok)
        assert rc == 0 and out.startswith("draining"), err
        rc, out, err = run("drain", "off", "--address", addr,
                           "--auth-file", tok)
        assert rc == 0 and out.startswith("drain off"), err

        rc, out, err = run("ping", "--address", addr)
        assert rc == 1 and "wants a bearer token" in err, err
        bad = secret(tmp_path / "bad", "not-the-token-at-all")
        rc, out, err = run("ping", "--address", addr, "--auth-file", bad)
        assert rc == 1 and "token was refused" in err, err
        loose = secret(tmp_path / "loose", DAEMON_TOKEN, 0o644)
        rc, out, err = run("ping", "--address", addr, "--auth-file", loose)
        assert rc == 1 and "readable by others" in err, err
        data = tmp_path / "obj.bin"
        data.write_bytes(b"x" * 4096)
        rc, out, err = run("put", "--address", addr, "--auth-file", tok,
                           "--namespace", NS, "--hash", "ab" * 32, str(data))
        assert rc == 1 and "KVD_ERR_UNSUPPORTED" in err, err
        rc, out, err = run("ping", "--address", "tcp:127.0.0.1")
        assert rc == 2 and "tcp:HOST:PORT" in err, err
    finally:
        stop_daemon(proc)


def test_cluster_nodes_of_a_daemon_alone(tmp_path):
    proc = start_daemon(tmp_path)[0]
    try:
        rc, out, err = run("cluster", "nodes", "--address",
                           f"unix:{tmp_path}/d.sock")
        assert rc == 0 and "runs alone (no cluster.etcd)" in out, err
        rc, out, err = run("cluster", "nodes", "--json", "--address",
                           f"unix:{tmp_path}/d.sock")
        assert rc == 0 and json.loads(out)["clustered"] is False, err
        rc, out, err = run("cluster", "members")
        assert rc == 2 and "want a subcommand: nodes" in err, err
    finally:
        stop_daemon(proc)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")
def test_operator_calls_over_tls(tmp_path):
    pki = tmp_path / "pki"
    pki.mkdir()
    make_pki(pki)
    for name in ("client", "rogue"):
        (pki / f"{name}.key").chmod(0o600)
    proc, port, _ = start_daemon(
        tmp_path, "server.token=", f"server.tls_cert={pki}/server.pem",
        f"server.tls_key={pki}/server.key",
        f"server.tls_client_ca={pki}/ca.pem")
    addr = f"tcp:127.0.0.1:{port}"
    tls = ["--tls-ca", f"{pki}/ca.pem"]
    try:
        rc, out, err = run("ping", "--address", addr, *tls, "--tls-cert",
                           f"{pki}/client.pem", "--tls-key",
                           f"{pki}/client.key")
        assert rc == 0 and out.startswith("ok "), err
        rc, out, err = run("drain", "off", "--address", addr, *tls,
                           "--tls-cert", f"{pki}/client.pem", "--tls-key",
                           f"{pki}/client.key")
        assert rc == 0, err
        rc, out, err = run("ping", "--address", addr, *tls, "--tls-cert",
                           f"{pki}/rogue.pem", "--tls-key",
                           f"{pki}/rogue.key", "--timeout", "2s")
        assert rc == 1, out
        rc, out, err = run("ping", "--address", addr, *tls, "--timeout",
                           "2s")
        assert rc == 1, out
        rc, out, err = run("ping", "--address", addr, "--tls-cert",
                           f"{pki}/client.pem", "--tls-key",
                           f"{pki}/client.key")
        assert rc == 1 and "go together" in err, err
        notpem = secret(tmp_path / "ca.txt", "not a certificate")
        rc, out, err = run("ping", "--address", addr, "--tls-ca", notpem)
        assert rc == 1 and "store.tls_ca" in err and "not PEM" in err, err
    finally:
        stop_daemon(proc)
