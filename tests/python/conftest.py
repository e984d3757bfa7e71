"""Shared set-up of the Python tests: the source tree's python/ package is
importable, tests that need libkvdepot.so call require_lib() to skip
cleanly when it is not built, and tests of daemon mode start a real
kvdepotd ($KVDEPOTD) with start_daemon()."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# KVDEPOT_TEST_INSTALLED=1: the tests run against an installed package
# (the wheel test), not the source tree's.
if not os.environ.get("KVDEPOT_TEST_INSTALLED"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))


def require_lib():
    from kvdepot import _lib
    try:
        _lib.lib()
    except OSError as e:  # pragma: no cover
        pytest.skip(f"libkvdepot.so not built: {e}", allow_module_level=True)


KVDEPOTD = os.environ.get("KVDEPOTD", "")
DAEMON_TOKEN = "t0ken-for-tests"


def start_daemon(tmp_path, *sets):
    """Starts kvdepotd with its sockets in tmp_path (gRPC at d.sock, TCP and
    metrics on ports it picks) and extra "key=value" settings; waits until
    it is ready. Returns (process, tcp_port, metrics_port)."""
    ready = Path(tmp_path) / "ready"
    if ready.exists():
        ready.unlink()
    args = [KVDEPOTD,
            "--set", f"server.unix_socket={tmp_path}/d.sock",
            "--set", "server.tcp_address=127.0.0.1:0",
            "--set", f"server.token={DAEMON_TOKEN}",
            "--set", "server.metrics_address=127.0.0.1:0",
            "--set", "store.arena_size=64m",
            "--set", "store.arena_chunk=4m",
            "--set", "store.arena_hugepages=off",
            "--set", "store.arena_prefault=false",
            "--set", "log.level=warn",
            "--ready-file", str(ready)]
    for s in sets:
        args += ["--set", s]
    log = open(Path(tmp_path) / "daemon.log", "a")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while not ready.exists():
        assert proc.poll() is None, (Path(tmp_path) / "daemon.log").read_text()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    info = dict(line.split("=", 1) for line in ready.read_text().split())
    return proc, int(info["tcp_port"]), int(info["metrics_port"])


def stop_daemon(proc):
    """SIGTERM; a graceful stop exits 0."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
