"""kvdepotd's TLS listener with client certificates, attacked: no
certificate, another CA's, an expired one, a self-signed one bearing a
mapped common name, a valid one whose name no tenant is mapped to, a mapped
one naming another tenant in its requests, plaintext HTTP/2 to the TLS
port, and clients that stall in the middle of the handshake beside an
honest one. Certificates are made here with Debian's openssl command
(make_pki in test_daemon_grpc.py); no key is kept. Figures go to stdout
(pytest -s) for docs/reliability.md."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from conftest import start_daemon, stop_daemon
from test_daemon_grpc import make_pki, stubs  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None,
                                reason="no openssl")

PROBE = r'''
import json, sys, time
import grpc
from kvdepot.v1 import store_pb2 as pb
port, d, who, op = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
read = lambda n: open(f"{d}/{n}", "rb").read()
if who == "plain":
    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
else:
    creds = grpc.ssl_channel_credentials(
        root_certificates=read("ca.pem"),
        private_key=read(f"{who}.key") if who != "none" else None,
        certificate_chain=read(f"{who}.pem") if who != "none" else None)
    ch = grpc.secure_channel(f"127.0.0.1:{port}", creds)

def method(name, req, rsp):
    return ch.unary_unary("/kvdepot.v1.KvStore/" + name,
                          request_serializer=req.SerializeToString,
                          response_deserializer=rsp.FromString)

ns, h = bytes([7]) * 16, bytes([9]) * 32
try:
    if op == "stats":  # n calls on one channel: the first includes the
        n, lat = int(sys.argv[5]), []  # handshake
        stats = method("Stats", pb.StatsRequest, pb.StatsResponse)
        for _ in range(n):
            t0 = time.monotonic()
            stats(pb.StatsRequest(), timeout=5)
            lat.append((time.monotonic() - t0) * 1000)
        rest = sorted(lat[1:]) or [0.0]
        out = {"calls": n, "first_ms": round(lat[0], 1),
               "p50_ms": round(rest[len(rest) // 2], 2),
               "p99_ms": round(rest[len(rest) * 99 // 100], 2)}
    elif op == "drain":  # an operator-only call
        out = method("Admin", pb.AdminRequest, pb.AdminResponse)(
            pb.AdminRequest(drain=pb.Drain(enable=False)),
            timeout=5).drain.draining
    elif op == "save":  # the request names another tenant
        r = method("Reserve", pb.ReserveRequest, pb.ReserveResponse)(
            pb.ReserveRequest(namespace_id=ns, block_hashes=[h],
                              object_size_bytes=4096, tenant=sys.argv[5]),
            timeout=5)
        out = method("Commit", pb.CommitRequest, pb.CommitResponse)(
            pb.CommitRequest(reservation_id=r.reservation_id,
                             entries=[pb.CommitEntry(block_hash=h,
                                                     layer_checksums=[0])]),
            timeout=5).num_committed
    elif op == "lookup":
        r = method("Lookup", pb.LookupRequest, pb.LookupResponse)(
            pb.LookupRequest(namespace_id=ns, block_hashes=[h],
                             lease_ttl_ms=1000), timeout=5)
        out = len(r.locations)
    print(json.dumps({"ok": out}))
except grpc.RpcError as e:
    print(json.dumps({"error": e.code().name}))
'''


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """make_pki's CA, server, client (CN client) and rogue (another CA),
    and: expired (CN client, the CA's, not valid after yesterday),
    selfsigned (CN client, signed by its own key), stranger (the CA's, a
    CN no tenant has), engine-b (the CA's, tenant team-b)."""
    d = tmp_path_factory.mktemp("pki")
    make_pki(d)

    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True,
                       cwd=d, timeout=60)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-keyout", "selfsigned.key", "-out", "selfsigned.pem", "-subj",
        "/CN=client")
    for name, cn, days in (("expired", "client", "-1"),
                           ("stranger", "stranger", "2"),
                           ("engine-b", "engine-b", "2")):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", f"/CN={cn}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey",
            "ca.key", "-CAcreateserial", "-days", days, "-out", f"{name}.pem")
    return d


@pytest.fixture(scope="module")
def probe(stubs, pki):
    (stubs / "tls_probe.py").write_text(PROBE)
    env = dict(os.environ, PYTHONPATH=str(stubs))

    def call(port, who, op, *extra):
        p = subprocess.run([sys.executable, str(stubs / "tls_probe.py"),
                            str(port), str(pki), who, op, *extra], env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)
    return call


def tls_daemon(tmp_path, pki, *sets):
    return start_daemon(
        tmp_path, "server.token=", f"server.tls_cert={pki}/server.pem",
        f"server.tls_key={pki}/server.key",
        f"server.tls_client_ca={pki}/ca.pem",
        "server.tls_tenants=client=team-c,engine-b=team-b", *sets)


def test_tls_certificate_attacks(tmp_path, pki, probe):
    """Only a certificate the CA signed, still valid, gets past the
    handshake; a mapped name is bound to its tenant whatever its requests
    say; a name no tenant has is an operator (documented); plaintext to
    the TLS port gets nothing."""
    pytest.importorskip("grpc")
    proc, port, _ = tls_daemon(tmp_path, pki, "server.verify_commits=false")
    try:
        assert probe(port, "client", "stats", "1")["ok"]["calls"] == 1
        for who in ("none", "rogue", "expired", "selfsigned", "plain"):
            assert probe(port, who, "stats", "1") == \
                {"error": "UNAVAILABLE"}, who
        # Tenants are not operators; a CA-signed name no tenant has is.
        assert probe(port, "client", "drain") == {"error": "UNAUTHENTICATED"}
        assert probe(port, "stranger", "drain") == {"ok": False}
        # engine-b (team-b) saves naming team-c: the object is team-b's.
        assert probe(port, "engine-b", "save", "team-c") == {"ok": 1}
        assert probe(port, "client", "lookup") == {"ok": 0}
        assert probe(port, "engine-b", "lookup") == {"ok": 1}
        assert probe(port, "client", "stats", "1")["ok"]["calls"] == 1
    finally:
        stop_daemon(proc)


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_tls_stalled_handshakes(tmp_path, pki, probe):
    """300 TCP clients stall in the TLS handshake (half send nothing, half
    a ClientHello's first bytes): an honest client's handshake and calls
    are not delayed, and the daemon drops the stalled ones after
    server.handshake_timeout, giving their descriptors back."""
    pytest.importorskip("grpc")
    proc, port, _ = tls_daemon(tmp_path, pki, "server.handshake_timeout=2s")
    stalled = []
    try:
        base = fd_count(proc.pid)
        t0 = time.monotonic()
        for i in range(300):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            if i % 2:
                s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
            stalled.append(s)
        time.sleep(0.3)
        held = fd_count(proc.pid)
        honest = probe(port, "client", "stats", "50")["ok"]
        print(f"300 stalled TLS handshakes: daemon fds {base} -> {held}; "
              f"honest client {honest}")
        assert honest["calls"] == 50 and honest["first_ms"] < 2000
        while fd_count(proc.pid) > base + 10:
            assert time.monotonic() - t0 < 10, fd_count(proc.pid)
            time.sleep(0.1)
        print(f"stalled connections dropped {time.monotonic() - t0:.1f} s "
              f"after they connected (server.handshake_timeout 2 s)")
        assert probe(port, "client", "stats", "1")["ok"]["calls"] == 1
    finally:
        for s in stalled:
            s.close()
        stop_daemon(proc)


def test_plain_tcp_stalled_connections(tmp_path):
    """The same deadline on the token (plaintext) TCP port: 100 clients
    that connect and send nothing or half an HTTP/2 preface are closed
    after server.handshake_timeout."""
    proc, port, _ = start_daemon(tmp_path, "server.handshake_timeout=2s")
    stalled = []
    try:
        base = fd_count(proc.pid)
        t0 = time.monotonic()
        for i in range(100):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            if i % 2:
                s.sendall(b"PRI * HTTP/2.0\r\n")
            stalled.append(s)
        time.sleep(0.3)
        assert fd_count(proc.pid) >= base + 90
        while fd_count(proc.pid) > base + 10:
            assert time.monotonic() - t0 < 10, fd_count(proc.pid)
            time.sleep(0.1)
        print(f"100 stalled plaintext connections dropped "
              f"{time.monotonic() - t0:.1f} s after they connected")
    finally:
        for s in stalled:
            s.close()
        stop_daemon(proc)
