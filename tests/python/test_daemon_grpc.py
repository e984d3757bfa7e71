"""kvdepotd from the outside: a Python gRPC client (Debian's python3-grpcio)
built from proto/kvdepot/v1/*.proto calls the daemon over TCP, the way a
peer or an operator tool in another language would; plus the metrics
endpoint and the command line's configuration errors.

The generated modules are named `kvdepot.v1.*_pb2`, which would clash with
the connector package `kvdepot` imported by the other tests, so the client
runs in its own interpreter (CLIENT below) with only the generated code on
its path.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import DAEMON_TOKEN as TOKEN
from conftest import KVDEPOTD, start_daemon, stop_daemon

PROTO_DIR = os.environ.get("KVDEPOT_PROTO_DIR", "")

pytestmark = [
    pytest.mark.skipif(not KVDEPOTD or not os.path.exists(KVDEPOTD),
                       reason="KVDEPOTD not set"),
    pytest.mark.skipif(shutil.which("protoc") is None,
                       reason="protoc (protobuf-compiler) missing"),
]


CLIENT = r'''
import json, sys
import grpc
from kvdepot.v1 import store_pb2 as pb, metadata_pb2 as md

port, token = int(sys.argv[1]), sys.argv[2]
ch = grpc.insecure_channel(f"127.0.0.1:{port}")
auth = [("authorization", "Bearer " + token)]
out = {}

if len(sys.argv) > 3:  # drain on|off, then stop
    admin = ch.unary_unary("/kvdepot.v1.KvStore/Admin",
                           request_serializer=pb.AdminRequest.SerializeToString,
                           response_deserializer=pb.AdminResponse.FromString)
    r = admin(pb.AdminRequest(drain=pb.Drain(enable=sys.argv[3] == "on")),
              timeout=5, metadata=auth)
    print(json.dumps({"draining": r.drain.draining}))
    sys.exit(0)

def method(name, req, rsp):
    return ch.unary_unary("/kvdepot.v1.KvStore/" + name,
                          request_serializer=req.SerializeToString,
                          response_deserializer=rsp.FromString)

def raw(name):
    return ch.unary_unary("/kvdepot.v1.KvStore/" + name,
                          request_serializer=lambda b: b,
                          response_deserializer=lambda b: b)

def code_of(fn, *a, **kw):
    try:
        fn(*a, timeout=5, **kw)
        return "OK", None
    except grpc.RpcError as e:
        trailer = dict(e.trailing_metadata() or ())
        return e.code().name, trailer.get("kvdepot-status")

stats = method("Stats", pb.StatsRequest, pb.StatsResponse)
lookup = method("Lookup", pb.LookupRequest, pb.LookupResponse)

s = stats(pb.StatsRequest(), timeout=5, metadata=auth)
out["tiers"] = [(md.Tier.Name(t.tier), t.capacity_bytes) for t in s.tiers]
req = pb.LookupRequest(namespace_id=bytes(16),
                       block_hashes=[bytes([i]) * 32 for i in range(3)],
                       lease_ttl_ms=1000)
r = lookup(req, timeout=5, metadata=auth)
out["lookup_hits"] = len(r.locations)
out["lookup_lease"] = r.lease_id

out["no_token"] = code_of(stats, pb.StatsRequest())
out["wrong_token"] = code_of(stats, pb.StatsRequest(),
                             metadata=[("authorization", "Bearer nope")])
# namespace_id of 3 bytes: decodes, fails validation.
out["malformed"] = code_of(raw("Lookup"), b"\x0a\x03abc", metadata=auth)
# Not protobuf at all.
out["garbage"] = code_of(raw("Reserve"), b"\xff\xff\xff\xff", metadata=auth)
# 1 MiB to a call whose messages are capped at 64 KiB.
out["oversized"] = code_of(raw("Stats"), b"\xa2\x06\x80\x80\x40" + bytes(1 << 20),
                           metadata=auth)
out["unknown_method"] = code_of(raw("Nope"), b"", metadata=auth)
out["unknown_lease"] = code_of(
    method("Release", pb.ReleaseRequest, pb.ReleaseResponse),
    pb.ReleaseRequest(lease_ids=[12345]), metadata=auth)
out["stale_instance"] = code_of(stats, pb.StatsRequest(),
                                metadata=auth + [("kvdepot-instance", "00")])
ping = method("Admin", pb.AdminRequest, pb.AdminResponse)(
    pb.AdminRequest(ping=pb.Ping()), timeout=5, metadata=auth)
out["ping"] = [ping.ping.version, ping.ping.protocol_major,
               ping.ping.protocol_revision]
# Still serving after all of the above.
out["after"] = len(stats(pb.StatsRequest(), timeout=5, metadata=auth).tiers)
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    d = tmp_path_factory.mktemp("pb")
    subprocess.run(["protoc", f"-I{PROTO_DIR}", f"--python_out={d}",
                    "kvdepot/v1/metadata.proto", "kvdepot/v1/store.proto"],
                   check=True)
    (d / "client.py").write_text(CLIENT)
    return d


def proto_revision():
    """KVD_PROTO_REVISION of proto/kvd_proto.h: what the daemon announces."""
    text = (Path(__file__).resolve().parents[2] / "proto" /
            "kvd_proto.h").read_text()
    return int(re.search(r"#define KVD_PROTO_REVISION (\d+)", text).group(1))


def run_client(stubs, port, *extra):
    env = dict(os.environ, PYTHONPATH=str(stubs))
    p = subprocess.run([sys.executable, str(stubs / "client.py"), str(port),
                        TOKEN, *extra], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}",
                                    timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_grpc_client_over_tcp(tmp_path, stubs):
    pytest.importorskip("grpc")
    proc, port, mport = start_daemon(tmp_path)
    try:
        out = run_client(stubs, port)
        assert out["tiers"][0][0] == "TIER_HOST" and out["tiers"][0][1] > 0
        assert out["lookup_hits"] == 0 and out["lookup_lease"] == 0
        assert out["no_token"] == ["UNAUTHENTICATED", "-81"]
        assert out["wrong_token"] == ["UNAUTHENTICATED", "-81"]
        assert out["malformed"] == ["INVALID_ARGUMENT", "-5"]
        assert out["garbage"] == ["INVALID_ARGUMENT", "-5"]
        assert out["oversized"] == ["INVALID_ARGUMENT", "-5"]
        assert out["unknown_method"] == ["UNIMPLEMENTED", "-6"]
        assert out["unknown_lease"] == ["OK", None]  # nothing to release
        assert out["stale_instance"] == ["FAILED_PRECONDITION", "-7"]
        assert out["ping"][1:] == [1, proto_revision()]
        assert out["after"] == 1

        status, body = get(mport, "/metrics")
        assert status == 200
        assert 'kvdepot_errors_total{status="KVD_ERR_AUTH"} 2' in body
        assert 'kvdepot_errors_total{status="KVD_ERR_PROTO"} 3' in body
        assert 'kvdepot_rpc_latency_seconds_count{method="Stats"}' in body
        assert 'kvdepot_tier_capacity_bytes{tier="host"} 67108864' in body
        assert get(mport, "/healthz")[0] == 200
        assert get(mport, "/readyz") == (200, "ready\n")
        assert get(mport, "/nope")[0] == 404
    finally:
        stop_daemon(proc)


@pytest.mark.parametrize("sets,needle", [
    (["server.threads=0"], "server.threads"),
    (["store.arena_sise=1g"], "store.arena_sise"),
    (["server.unix_mode=9x"], "server.unix_mode"),
    (["server.tcp_address=127.0.0.1:0", "server.token="], "server.token"),
    (["server.unix_socket=", "server.tcp_address="], "nothing to listen on"),
    (["server.tls_cert=/nonexistent.pem"], "go together"),
    (["server.tenants=alice=team"], "server.tenants"),
    (["server.tenant_quotas=team-a"], "server.tenant_quotas"),
    (["server.tenant_quotas=team-a=lots"], "server.tenant_quotas"),
    (["server.tenant_quotas=team-a=0"], "server.tenant_quotas"),
    (["server.tls_tenants=client=team-a"], "server.tls_tenants"),
    (["server.token_tenants=/nonexistent"], "server.token_tenants"),
])
def test_bad_config_fails_at_start(tmp_path, sets, needle):
    args = [KVDEPOTD, "--set", f"server.unix_socket={tmp_path}/d.sock",
            "--set", "store.arena_size=16m", "--set", "store.arena_chunk=2m",
            "--set", "store.arena_prefault=false"]
    for s in sets:
        args += ["--set", s]
    p = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr


def test_print_config_shows_every_key(tmp_path):
    cfg = tmp_path / "k.yaml"
    cfg.write_text("server:\n  threads: 3\nstore:\n  arena_size: 1g\n")
    p = subprocess.run([KVDEPOTD, "--config", str(cfg), "--set",
                        "server.node_id=n1", "--print-config"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = {ln.split(" = ")[0]: ln for ln in p.stdout.splitlines()
             if " = " in ln}
    for key in ("server.unix_socket", "server.tcp_address", "server.token",
                "server.metrics_address", "server.lease_ttl", "log.level",
                "store.arena_size", "store.disk_path", "store.mode"):
        assert key in lines, key
    assert "from: file" in lines["server.threads"]
    assert "from: call" in lines["server.node_id"]
    # A bad value is reported by --print-config too, as a start would.
    cfg.write_text("server:\n  threads: 0\nstore:\n  arena_sise: 1g\n")
    p = subprocess.run([KVDEPOTD, "--config", str(cfg), "--print-config"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "server.threads" in p.stderr, p.stderr


def test_sighup_reload_keeps_serving(tmp_path, stubs):
    pytest.importorskip("grpc")
    proc, port, mport = start_daemon(tmp_path)
    try:
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.2)
        assert proc.poll() is None
        assert get(mport, "/readyz")[0] == 200
        assert run_client(stubs, port)["after"] == 1
    finally:
        stop_daemon(proc)


def test_drain_marks_not_ready(tmp_path, stubs):
    pytest.importorskip("grpc")
    proc, port, mport = start_daemon(tmp_path)
    try:
        assert get(mport, "/readyz")[0] == 200
        assert run_client(stubs, port, "on") == {"draining": True}
        assert get(mport, "/readyz") == (503, "not ready\n")
        assert get(mport, "/healthz")[0] == 200
        assert run_client(stubs, port, "off") == {"draining": False}
        assert get(mport, "/readyz")[0] == 200
    finally:
        stop_daemon(proc)


def make_pki(d):
    """A CA, a server certificate for 127.0.0.1 and a client certificate,
    with Debian's openssl command; another CA's client certificate too."""
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True,
                       cwd=d, timeout=60)
    for ca in ("ca", "other-ca"):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-subj", f"/CN={ca}")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, ca, ext in (("server", "ca", True), ("client", "ca", False),
                          ("rogue", "other-ca", False)):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem",
            "-CAkey", f"{ca}.key", "-CAcreateserial", "-days", "2",
            "-out", f"{name}.pem", *(["-extfile", "san.cnf"] if ext else []))


TLS_CLIENT = r'''
import json, sys
import grpc
from kvdepot.v1 import store_pb2 as pb
port, d, who = int(sys.argv[1]), sys.argv[2], sys.argv[3]
read = lambda n: open(f"{d}/{n}", "rb").read()
creds = grpc.ssl_channel_credentials(
    root_certificates=read("ca.pem"),
    private_key=read(f"{who}.key") if who != "none" else None,
    certificate_chain=read(f"{who}.pem") if who != "none" else None)
ch = grpc.secure_channel(f"127.0.0.1:{port}", creds)
stats = ch.unary_unary("/kvdepot.v1.KvStore/Stats",
                       request_serializer=pb.StatsRequest.SerializeToString,
                       response_deserializer=pb.StatsResponse.FromString)
admin = ch.unary_unary("/kvdepot.v1.KvStore/Admin",
                       request_serializer=pb.AdminRequest.SerializeToString,
                       response_deserializer=pb.AdminResponse.FromString)
try:
    if len(sys.argv) > 4:  # an operator-only call
        r = admin(pb.AdminRequest(drain=pb.Drain(enable=False)), timeout=5)
        print(json.dumps({"ok": r.drain.draining}))
    else:
        r = stats(pb.StatsRequest(), timeout=5)
        print(json.dumps({"ok": len(r.tiers)}))
except grpc.RpcError as e:
    print(json.dumps({"error": e.code().name}))
'''


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")
def test_tls_client_certificates(tmp_path, stubs):
    pytest.importorskip("grpc")
    pki = tmp_path / "pki"
    pki.mkdir()
    make_pki(pki)
    (stubs / "tls_client.py").write_text(TLS_CLIENT)
    proc, port, _ = start_daemon(
        tmp_path, "server.token=", f"server.tls_cert={pki}/server.pem",
        f"server.tls_key={pki}/server.key",
        f"server.tls_client_ca={pki}/ca.pem")
    env = dict(os.environ, PYTHONPATH=str(stubs))

    def call(who, *extra):
        p = subprocess.run([sys.executable, str(stubs / "tls_client.py"),
                            str(port), str(pki), who, *extra], env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)
    try:
        assert call("client") == {"ok": 1}     # a certificate the CA signed
        assert "error" in call("none")         # no certificate: no handshake
        assert "error" in call("rogue")        # another CA's certificate
        assert call("client", "drain") == {"ok": False}  # an operator
    finally:
        stop_daemon(proc)
    # server.tls_tenants binds the certificate's CN to a tenant: served,
    # but no longer an operator.
    proc, port, _ = start_daemon(
        tmp_path, "server.token=", f"server.tls_cert={pki}/server.pem",
        f"server.tls_key={pki}/server.key",
        f"server.tls_client_ca={pki}/ca.pem",
        "server.tls_tenants=client=team-c")
    try:
        assert call("client") == {"ok": 1}
        assert call("client", "drain") == {"error": "UNAUTHENTICATED"}
    finally:
        stop_daemon(proc)


UNIX_CLIENT = r'''
import sys
import grpc
ch = grpc.insecure_channel("unix:" + sys.argv[1])
stats = ch.unary_unary("/kvdepot.v1.KvStore/Stats",
                       request_serializer=lambda b: b,
                       response_deserializer=lambda b: b)
md = [("kvdepot-session", sys.argv[2])] if len(sys.argv) > 2 else []
try:
    stats(b"", timeout=5, metadata=md)
    print("OK")
except grpc.RpcError as e:
    print(e.code().name)
'''


def test_tenants_need_the_handoff_session(tmp_path):
    """With server.tenants set, a local caller must present the session its
    arena hand-off gave (bound to its uid); without it, or with a made-up
    one, it is refused. Without tenants, local calls need no session."""
    pytest.importorskip("grpc")
    script = tmp_path / "unix_client.py"
    script.write_text(UNIX_CLIENT)

    def call(*extra):
        p = subprocess.run([sys.executable, str(script),
                            f"{tmp_path}/d.sock", *extra],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return p.stdout.strip()
    proc, _, _ = start_daemon(tmp_path, "server.tenants=12345=team-a")
    try:
        assert call() == "UNAUTHENTICATED"
        assert call("00" * 16) == "UNAUTHENTICATED"
        assert call("ab" * 16) == "UNAUTHENTICATED"
    finally:
        stop_daemon(proc)
    proc, _, _ = start_daemon(tmp_path)
    try:
        assert call() == "OK"
    finally:
        stop_daemon(proc)


TENANT_CLIENT = r'''
import json, sys
import grpc
from kvdepot.v1 import store_pb2 as pb
port, op, token = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ch = grpc.insecure_channel(f"127.0.0.1:{port}")
md = [("authorization", "Bearer " + token)]
ns, h = bytes([7]) * 16, bytes([9]) * 32
if op in ("save", "lookup") and len(sys.argv) > 4:  # another block
    h = bytes([int(sys.argv[4])]) * 32

def method(name, req, rsp):
    return ch.unary_unary("/kvdepot.v1.KvStore/" + name,
                          request_serializer=req.SerializeToString,
                          response_deserializer=rsp.FromString)

admin = method("Admin", pb.AdminRequest, pb.AdminResponse)
try:
    if op == "save":  # the request names a tenant; the token's wins
        r = method("Reserve", pb.ReserveRequest, pb.ReserveResponse)(
            pb.ReserveRequest(namespace_id=ns, block_hashes=[h],
                              object_size_bytes=4096, tenant="someone-else"),
            timeout=5, metadata=md)
        c = method("Commit", pb.CommitRequest, pb.CommitResponse)(
            pb.CommitRequest(reservation_id=r.reservation_id,
                             entries=[pb.CommitEntry(block_hash=h,
                                                     layer_checksums=[0])]),
            timeout=5, metadata=md)
        out = c.num_committed
    elif op == "lookup":
        r = method("Lookup", pb.LookupRequest, pb.LookupResponse)(
            pb.LookupRequest(namespace_id=ns, block_hashes=[h],
                             lease_ttl_ms=10000), timeout=5, metadata=md)
        out = [len(r.locations), r.lease_id]
    elif op == "release":
        out = method("Release", pb.ReleaseRequest, pb.ReleaseResponse)(
            pb.ReleaseRequest(lease_ids=[int(sys.argv[4])]), timeout=5,
            metadata=md).num_released
    elif op == "list":
        r = admin(pb.AdminRequest(list_namespaces=pb.ListNamespaces()),
                  timeout=5, metadata=md)
        out = [[n.namespace_id.hex(), n.host_objects]
               for n in r.list_namespaces.namespaces]
    elif op == "drop":
        r = admin(pb.AdminRequest(drop_namespace=pb.DropNamespace(
            namespace_id=ns)), timeout=5, metadata=md)
        out = r.drop_namespace.num_objects_dropped
    elif op == "drop_tenant":
        r = admin(pb.AdminRequest(drop_tenant=pb.DropTenant(
            tenant=sys.argv[4])), timeout=5, metadata=md)
        out = r.drop_tenant.num_objects_dropped
    elif op == "drain":
        out = admin(pb.AdminRequest(drain=pb.Drain(enable=False)), timeout=5,
                    metadata=md).drain.draining
    elif op == "config":
        r = admin(pb.AdminRequest(config_dump=pb.ConfigDump()), timeout=5,
                  metadata=md)
        out = {e.key: [e.value, e.source] for e in r.config_dump.entries}
    elif op == "stats":
        r = method("Stats", pb.StatsRequest, pb.StatsResponse)(
            pb.StatsRequest(), timeout=5, metadata=md)
        host = r.tiers[0]  # the daemon answers the host tier first
        out = [r.tenant, host.num_objects, host.hits, host.misses,
               r.active_leases]
    elif op == "delete":
        out = method("Delete", pb.DeleteRequest, pb.DeleteResponse)(
            pb.DeleteRequest(namespace_id=ns, block_hashes=[h]), timeout=5,
            metadata=md).num_deleted
    print(json.dumps({"ok": out}))
except grpc.RpcError as e:
    print(json.dumps({"error": e.code().name}))
'''


def test_tenants_bound_to_tcp_tokens(tmp_path, stubs):
    """server.token_tenants binds each TCP token to a tenant: its saves are
    the tenant's whatever the request says, in the tenant's own copy of the
    namespace (another tenant knowing the namespace and the hashes finds
    nothing and saves its own object), its leases are its own, it lists and
    drops only its tenant's objects, its Stats are its tenant's figures
    only, and the daemon-wide admin calls (drain,
    config dump) and delete-by-key need the operator's token. The config
    dump shows every setting with server.token redacted."""
    pytest.importorskip("grpc")
    (stubs / "tenant_client.py").write_text(TENANT_CLIENT)
    tokens = tmp_path / "tenant-tokens"
    ta, tb = "a" * 24, "b" * 24
    tokens.write_text(f"# tenant token\nteam-a {ta}\n\nteam-b {tb}\n")
    tokens.chmod(0o644)
    env = dict(os.environ, PYTHONPATH=str(stubs))

    def call(op, token, *extra):
        p = subprocess.run([sys.executable, str(stubs / "tenant_client.py"),
                            str(port), op, token, *extra], env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    # Readable by others: refused at start, naming the key.
    p = subprocess.run([KVDEPOTD, "--set", f"server.token_tenants={tokens}",
                        "--set", f"server.unix_socket={tmp_path}/x.sock",
                        "--print-config"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2
    assert "server.token_tenants" in p.stderr and "chmod 600" in p.stderr
    tokens.chmod(0o600)
    # TCP carries no payload bytes, so nothing to checksum: commits unchecked.
    proc, port, _ = start_daemon(tmp_path, f"server.token_tenants={tokens}",
                                 "server.verify_commits=false")
    ns = "07" * 16
    try:
        assert call("save", ta) == {"ok": 1}
        listed = call("list", ta)["ok"]
        assert len(listed) == 1 and listed[0][1] == 1
        scoped = listed[0][0]                     # team-a's copy of ns
        assert scoped != ns
        assert call("list", tb) == {"ok": []}
        assert call("list", TOKEN) == {"ok": [[scoped, 1]]}
        # team-b knows the namespace and the hash: no hit, and its own save.
        assert call("lookup", tb)["ok"][0] == 0
        assert call("lookup", TOKEN)["ok"][0] == 0
        hits, lease = call("lookup", ta)["ok"]
        assert hits == 1 and lease != 0
        # Stats: each tenant its own figures, the operator everyone's.
        assert call("stats", tb) == {"ok": ["team-b", 0, 0, 1, 0]}
        assert call("stats", ta) == {"ok": ["team-a", 1, 1, 0, 1]}
        assert call("stats", TOKEN)["ok"][:2] == ["", 1]
        assert call("release", tb, str(lease)) == {"ok": 0}   # not its lease
        assert call("release", ta, str(lease)) == {"ok": 1}
        assert call("save", tb) == {"ok": 1}
        hits, lease = call("lookup", tb)["ok"]
        assert hits == 1
        assert call("release", tb, str(lease)) == {"ok": 1}
        assert call("drop_tenant", tb, "") == {"ok": 1}
        assert call("drop", tb) == {"ok": 0}      # not team-b's object
        assert call("list", ta) == {"ok": [[scoped, 1]]}
        for op in ("drain", "config", "delete"):
            assert call(op, ta) == {"error": "UNAUTHENTICATED"}, op
        assert call("list", "c" * 24) == {"error": "UNAUTHENTICATED"}
        cfg = call("config", TOKEN)["ok"]
        assert cfg["server.token"] == ["<redacted>", "call"]
        assert cfg["server.token_tenants"] == [str(tokens), "call"]
        assert cfg["store.arena_size"] == ["64m", "call"]
        assert TOKEN not in json.dumps(cfg) and ta not in json.dumps(cfg)
        assert call("drop", ta) == {"ok": 1}
        assert call("list", TOKEN) == {"ok": []}
        # Clearing a tenant: its own (by name or "") or, for the operator,
        # any tenant's; never another tenant's.
        assert call("save", ta) == {"ok": 1}
        assert call("drop_tenant", tb, "team-a") == {
            "error": "UNAUTHENTICATED"}
        assert call("drop_tenant", tb, "") == {"ok": 0}
        assert call("drop_tenant", TOKEN, "team-b") == {"ok": 0}
        assert call("drop_tenant", ta, "") == {"ok": 1}
        assert call("save", ta) == {"ok": 1}
        assert call("drop_tenant", TOKEN, "team-a") == {"ok": 1}
        assert call("list", TOKEN) == {"ok": []}
    finally:
        stop_daemon(proc)

    # server.tenant_quotas: team-a may hold two 4 KiB objects; its third
    # save evicts one of its own, never team-b's.
    proc, port, _ = start_daemon(tmp_path, f"server.token_tenants={tokens}",
                                 "server.verify_commits=false",
                                 "server.tenant_quotas=team-a=8k")
    try:
        assert call("save", tb, "50") == {"ok": 1}
        for b in ("51", "52", "53"):
            assert call("save", ta, b) == {"ok": 1}
        hits = [call("lookup", ta, b)["ok"][0] for b in ("51", "52", "53")]
        assert sum(hits) == 2 and hits[2] == 1
        assert call("lookup", tb, "50")["ok"][0] == 1
    finally:
        stop_daemon(proc)
