"""kvdepotd as a systemd service and as a command line: the sd_notify(3)
protocol a Type=notify unit relies on (STATUS= during the start, READY=1
when serving, STOPPING=1 on SIGTERM, WATCHDOG=1 with WATCHDOG_USEC), the
syslog priority prefixes journald reads when stderr is the journal, and
the options --version, --check-config and --set's "did you mean".

The notify socket is a unix datagram socket this test binds in its temp
dir, exactly what systemd hands a service in $NOTIFY_SOCKET.
"""
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import KVDEPOTD, start_daemon, stop_daemon

pytestmark = pytest.mark.skipif(not KVDEPOTD or not os.path.exists(KVDEPOTD),
                                reason="KVDEPOTD not set")

# tests/CMakeLists.txt says whether kvdepotd was built with libsystemd.
HAVE_SYSTEMD = os.environ.get("KVDEPOTD_SYSTEMD", "1") == "1"


def small_daemon_args(tmp_path):
    return [KVDEPOTD,
            "--set", f"server.unix_socket={tmp_path}/d.sock",
            "--set", "store.arena_size=16m",
            "--set", "store.arena_chunk=2m",
            "--set", "store.arena_hugepages=off",
            "--set", "store.arena_prefault=false"]


def recv_until(sock, want, deadline, seen):
    """Appends every notification line to `seen` until one equals `want`."""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(4096).decode()
        except socket.timeout:
            break
        for line in data.split("\n"):
            if line:
                seen.append(line)
            if line == want:
                return True
    return False


@pytest.mark.skipif(not HAVE_SYSTEMD, reason="kvdepotd built without "
                    "libsystemd (no notifications)")
def test_notify_status_ready_watchdog_stopping(tmp_path):
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    env = dict(os.environ, NOTIFY_SOCKET=str(path), WATCHDOG_USEC="400000")
    env.pop("WATCHDOG_PID", None)
    log = open(tmp_path / "daemon.log", "w")
    proc = subprocess.Popen(small_daemon_args(tmp_path), env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    seen = []
    try:
        assert recv_until(sock, "READY=1", time.monotonic() + 20, seen), \
            (seen, (tmp_path / "daemon.log").read_text())
        ready_at = seen.index("READY=1")
        statuses = [s for s in seen[:ready_at] if s.startswith("STATUS=")]
        assert any("store" in s for s in statuses), seen
        # WatchdogSec 0.4 s: fed every 0.2 s or so while serving.
        later = []
        deadline = time.monotonic() + 3
        while later.count("WATCHDOG=1") < 3 and time.monotonic() < deadline:
            recv_until(sock, "WATCHDOG=1", deadline, later)
        assert later.count("WATCHDOG=1") >= 3, later
        assert "STOPPING=1" not in later
        proc.send_signal(signal.SIGTERM)
        rest = []
        assert recv_until(sock, "STOPPING=1", time.monotonic() + 20, rest), \
            rest
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()


def stderr_to_file(tmp_path, name):
    f = open(tmp_path / name, "w+")
    st = os.fstat(f.fileno())
    return f, f"{st.st_dev}:{st.st_ino}"


def test_journal_stream_gets_syslog_priorities(tmp_path):
    # Info lines of a daemon whose stderr is "the journal": <6>.
    err, stream = stderr_to_file(tmp_path, "journal.log")
    env = dict(os.environ, JOURNAL_STREAM=stream)
    ready = tmp_path / "ready"
    proc = subprocess.Popen(small_daemon_args(tmp_path) +
                            ["--set", "log.level=info",
                             "--ready-file", str(ready)],
                            env=env, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 20
    while not ready.exists():
        assert proc.poll() is None, (tmp_path / "journal.log").read_text()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    lines = (tmp_path / "journal.log").read_text().splitlines()
    ready_lines = [ln for ln in lines if "kvdepotd: ready" in ln]
    assert ready_lines and all(ln.startswith("<6>") for ln in ready_lines), \
        lines
    assert all(ln[:1] == "<" for ln in lines), lines

    # An error (a start refused): <3>, printed once.
    err2, stream2 = stderr_to_file(tmp_path, "journal2.log")
    env = dict(os.environ, JOURNAL_STREAM=stream2)
    p = subprocess.run(small_daemon_args(tmp_path) +
                       ["--set", "server.threads=0"], env=env,
                       stdout=subprocess.DEVNULL, stderr=err2, timeout=60)
    assert p.returncode == 2
    text = (tmp_path / "journal2.log").read_text()
    errors = [ln for ln in text.splitlines() if "server.threads" in ln]
    assert len(errors) == 1 and errors[0].startswith("<3>kvdepotd: "), text

    # JOURNAL_STREAM naming another file (inherited, stderr redirected):
    # no prefix; log.syslog_prefix=on forces it.
    p = subprocess.run(small_daemon_args(tmp_path) +
                       ["--set", "server.threads=0"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.stderr.startswith("kvdepotd: server.threads"), p.stderr
    env.pop("JOURNAL_STREAM")
    p = subprocess.run(small_daemon_args(tmp_path) +
                       ["--set", "log.syslog_prefix=on",
                        "--set", "server.threads=0"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.stderr.startswith("<3>kvdepotd: server.threads"), p.stderr


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=60,
                          **kw)


def test_version_and_unknown_set_key(tmp_path):
    p = run([KVDEPOTD, "--version"])
    assert p.returncode == 0 and p.stdout.startswith("kvdepotd "), p
    assert p.stdout.split()[1][0].isdigit(), p.stdout
    p = run(small_daemon_args(tmp_path) + ["--set", "server.thread=3"])
    assert p.returncode == 2
    assert "did you mean server.threads?" in p.stderr, p.stderr
    assert p.stderr.count("server.thread") == 2, p.stderr  # one line
    p = run(small_daemon_args(tmp_path) + ["--set", "store.arena_sise=1g",
                                           "--check-config"])
    assert p.returncode == 1
    assert "did you mean store.arena_size?" in p.stderr, p.stderr
    p = run([KVDEPOTD, "--no-such-option"])
    assert p.returncode == 2 and "unknown argument --no-such-option" \
        in p.stderr, p.stderr


def test_check_config_binds_nothing_and_reports_each_error(tmp_path):
    # Good: exit 0, and no socket appears (nothing started or bound).
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    p = run(small_daemon_args(tmp_path) +
            ["--set", f"server.tcp_address=127.0.0.1:{port}",
             "--set", "server.token=t0ken-for-tests",
             "--set", f"server.metrics_address=127.0.0.1:{port}",
             "--check-config"])
    busy.close()
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "d.sock").exists()
    assert not (tmp_path / "d.sock.shm").exists()

    # Several independent errors: one line each, each once, exit 1.
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("server:\n  threads: 0\n")
    p = run(small_daemon_args(tmp_path) +
            ["--config", str(cfg), "--set", "store.arena_chunk=3g",
             "--set", "store.disk_path=/nonexistent/a/b", "--check-config"])
    assert p.returncode == 1, p
    lines = p.stderr.splitlines()
    assert len(lines) == 2, lines
    assert sum("server.threads" in ln for ln in lines) == 1, lines
    assert sum("store.arena_chunk" in ln for ln in lines) == 1, lines

    # With the values right, the missing disk directory is reported.
    p = run(small_daemon_args(tmp_path) +
            ["--set", "store.disk_path=/nonexistent/a/b", "--check-config"])
    assert p.returncode == 1 and "store.disk_path" in p.stderr, p.stderr
    assert len(p.stderr.splitlines()) == 1, p.stderr
    p = run(small_daemon_args(tmp_path) +
            ["--set", f"store.disk_path={tmp_path}/disk", "--check-config"])
    assert p.returncode == 0, p.stderr

    # TLS files must be readable; TCP needs a token or certificates.
    p = run(small_daemon_args(tmp_path) +
            ["--set", "server.tcp_address=127.0.0.1:0", "--check-config"])
    assert p.returncode == 1 and "must authenticate" in p.stderr, p.stderr
    p = run(small_daemon_args(tmp_path) +
            ["--set", "server.tls_cert=/nonexistent.pem",
             "--set", "server.tls_key=/nonexistent.key",
             "--set", "server.tls_client_ca=/nonexistent.ca",
             "--check-config"])
    assert p.returncode == 1 and "server.tls_cert" in p.stderr, p.stderr


def test_check_config_reads_etcd_tls_files(tmp_path):
    # TLS to etcd: each PEM file must be readable and PEM; the certificate
    # and key go together and need the CA; all need cluster.etcd. Nothing
    # connects to etcd.
    etcd = ["--set", "cluster.etcd=127.0.0.1:1"]
    pem = tmp_path / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n"
                   "-----END CERTIFICATE-----\n")
    plain = tmp_path / "plain.txt"
    plain.write_text("not a certificate\n")
    p = run(small_daemon_args(tmp_path) + etcd +
            ["--set", f"cluster.etcd_tls_ca={pem}", "--check-config"])
    assert p.returncode == 0, p.stderr
    cases = [
        (["--set", "cluster.etcd_tls_ca=/nonexistent/ca.pem"],
         "cluster.etcd_tls_ca /nonexistent/ca.pem"),
        (["--set", f"cluster.etcd_tls_ca={plain}"], "not PEM"),
        (["--set", f"cluster.etcd_tls_ca={pem}",
          "--set", f"cluster.etcd_tls_cert={pem}"], "go together"),
        (["--set", f"cluster.etcd_tls_cert={pem}",
          "--set", f"cluster.etcd_tls_key={pem}"], "need cluster.etcd_tls_ca"),
        (["--set", f"cluster.etcd_tls_ca={pem}",
          "--set", f"cluster.etcd_tls_cert={pem}",
          "--set", "cluster.etcd_tls_key=/nonexistent/k.pem"],
         "cluster.etcd_tls_key /nonexistent/k.pem"),
    ]
    for args, want in cases:
        p = run(small_daemon_args(tmp_path) + etcd + args + ["--check-config"])
        assert p.returncode == 1 and want in p.stderr, (args, p.stderr)
        assert len(p.stderr.splitlines()) == 1, p.stderr
    p = run(small_daemon_args(tmp_path) +
            ["--set", f"cluster.etcd_tls_ca={pem}", "--check-config"])
    assert p.returncode == 1 and "cluster.etcd is not" in p.stderr, p.stderr


def test_bad_metrics_address_refused_alike(tmp_path):
    """What the start refuses --print-config and --check-config refuse,
    with the same single message."""
    base = small_daemon_args(tmp_path) + [
        "--set", "server.metrics_address=localhost:9464"]
    start = run(base)
    printed = run(base + ["--print-config"])
    checked = run(base + ["--check-config"])
    assert start.returncode == 2 and printed.returncode == 2
    assert checked.returncode == 1
    msg = start.stderr.strip()
    assert "server.metrics_address" in msg and len(msg.splitlines()) == 1, \
        start.stderr
    assert printed.stderr.strip() == msg
    assert checked.stderr.strip() == msg
    assert not (tmp_path / "d.sock").exists()


def have_ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not have_ipv6_loopback(), reason="no IPv6 loopback")
def test_ipv6_listeners(tmp_path):
    proc, port, mport = start_daemon(tmp_path,
                                     "server.tcp_address=[::1]:0",
                                     "server.metrics_address=[::1]:0")
    try:
        assert port > 0 and mport > 0
        with urllib.request.urlopen(f"http://[::1]:{mport}/healthz",
                                    timeout=5) as r:
            assert r.status == 200
        with socket.create_connection(("::1", port), timeout=5):
            pass
    finally:
        stop_daemon(proc)
