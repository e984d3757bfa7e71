"""Tensor parallelism with the default settings (store_mode "auto"): the
engine's processes start their own kvdepotd (kvdepot/_spawn.py) and leave
none behind.

Each worker rank runs in a process of its own (spawn_rank.py), as vLLM
runs them, created before the scheduler; the scheduler runs here or, where
it must be killed, in a process too. Every test has a private
XDG_RUNTIME_DIR, so the run directory and its daemons are its own.

  - two ranks and the scheduler save, then load: the KV bytes are equal,
    exactly one kvdepotd was started (and joined by the others), and once
    all of them have shut down the daemon is gone within spawn_idle_exit
    plus its stop;
  - kill -9 of every engine process: the daemon still goes; a daemon
    killed itself leaves stale files that do not block the next start;
  - with store_dir: engine 1 saves, everything stops, engine 2 gets a new
    daemon on the same disk tier and loads the same bytes;
  - a run directory that is another user's, or that others may write, is
    refused with a clear error.
"""

import base64
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

torch = pytest.importorskip("torch")

from conftest import KVDEPOTD, require_lib  # noqa: E402
from kvdepot import _spawn, config, vllm as kv  # noqa: E402
import test_vllm_connector as t  # noqa: E402

require_lib()
pytestmark = pytest.mark.skipif(not KVDEPOTD, reason="KVDEPOTD not set")

HERE = Path(__file__).resolve().parent
GONE_WITHIN_S = 10  # spawn_idle_exit (1 s here) + the stop, with margin


class Rank:
    """One engine process (spawn_rank.py)."""

    def __init__(self, xdg, name):
        env = dict(os.environ, XDG_RUNTIME_DIR=str(xdg))
        self.err = open(Path(xdg).parent / f"{name}.err", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "spawn_rank.py")], cwd=HERE,
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.err, text=True)

    def send(self, cmd, **args):
        self.proc.stdin.write(json.dumps(dict(args, cmd=cmd)) + "\n")
        self.proc.stdin.flush()

    def reply(self):
        for line in self.proc.stdout:
            if line.startswith("@@ "):
                out = json.loads(line[3:])
                assert "error" not in out, out["error"]
                return out
        self.err.seek(0)
        raise AssertionError("engine process died:\n" + self.err.read())

    def call(self, cmd, **args):
        self.send(cmd, **args)
        return self.reply()

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def private_runtime_dir(tmp_path, monkeypatch):
    xdg = tmp_path / "x"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    return xdg


def open_rank(rank, role, instance_id, extra, fill=False, seed=0):
    rank.send("open", role=role, rank=rank.rank, tp=2,
              instance_id=instance_id, extra=dict(extra), fill=fill,
              seed=seed)


def scheduler(instance_id, extra):
    extra = dict(extra)
    cfg = t.vllm_config(extra.pop("store_dir", ""), **extra)
    cfg.parallel_config.tensor_parallel_size = 2
    cfg.parallel_config.rank = 0
    cfg.instance_id = instance_id
    return kv.KvdepotConnector(cfg, kv.KVConnectorRole.SCHEDULER)


def step(s, ranks, meta, seen=None):
    """Both ranks run the step; their outputs aggregated as vLLM does (a
    request is finished once every rank has said so, in any steps; `seen`
    keeps what each rank said in earlier ones)."""
    blob = base64.b64encode(pickle.dumps(meta)).decode()
    for r in ranks:
        r.send("step", meta=blob)
    outs = [pickle.loads(base64.b64decode(r.reply()["out"])) for r in ranks]
    metas = [o.kv_connector_worker_meta for o in outs
             if o.kv_connector_worker_meta is not None]
    agg = metas[0].aggregate(metas[1]) if len(metas) == 2 else \
        (metas[0] if metas else None)
    s.update_connector_output(NS(kv_connector_worker_meta=agg))
    seen = seen if seen is not None else [set() for _ in ranks]
    for got, o in zip(seen, outs):
        got |= set(o.finished_recving or ())
    done = seen[0] & seen[1]
    return done, set().union(*(o.invalid_block_ids for o in outs))


def daemon_gone(pid):
    """Exited (a zombie whose parent has not reaped it counts: it holds
    nothing any more)."""
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return st[st.rindex(")") + 2:].startswith("Z")


def wait_gone(pid, within=GONE_WITHIN_S):
    t0 = time.monotonic()
    while not daemon_gone(pid):
        assert time.monotonic() - t0 < within, f"kvdepotd {pid} still runs"
        time.sleep(0.05)
    return time.monotonic() - t0


def starts_logged(xdg):
    return sum(p.read_text().count("kvdepotd started by pid")
               for p in (xdg / "kvdepot").glob("*.log"))


TOKENS = [(i * 29 + 1) % 32000 for i in range(t.PROMPT)]
A_BLOCKS, B_BLOCKS = [3, 9, 1, 12, 5, 20, 7], [11, 13, 15, 17, 19, 21, 23]


def save(s, ranks):
    """Engine A computes the prompt; both ranks save their shard. Returns
    each rank's bytes of the six full blocks."""
    req = t.Request("sp-a", TOKENS)
    assert s.get_num_new_matched_tokens(req, 0) == (0, False)
    s.update_state_after_alloc(req, t.Blocks(A_BLOCKS), 0)
    step(s, ranks, s.build_connector_meta(
        t.sched_output(new=[(req, 0)], tokens={"sp-a": t.PROMPT})))
    assert s.request_finished(req, A_BLOCKS) == (False, None)
    for r in ranks:
        assert r.call("stats")["blocks_saved"] == 6
    saved = [r.call("blocks", ids=A_BLOCKS[:6])["data"] for r in ranks]
    assert saved[0] != saved[1]  # each rank its own shard
    return saved


def load(s, ranks, from_disk):
    """Engine B: the same prompt; both ranks load their shard."""
    req = t.Request("sp-b", TOKENS)
    assert s.get_num_new_matched_tokens(req, 0) == (96, from_disk)
    s.update_state_after_alloc(req, t.Blocks(B_BLOCKS), 96)
    if from_disk:  # asynchronous: reported finished by both ranks
        deadline = time.monotonic() + 20
        done, seen = set(), [set(), set()]
        while not done:
            assert time.monotonic() < deadline
            done, invalid = step(s, ranks, s.build_connector_meta(
                t.sched_output()), seen)
            assert invalid == set()
        assert done == {"sp-b"}
    else:
        done, invalid = step(s, ranks, s.build_connector_meta(
            t.sched_output(new=[(req, 96)],
                           tokens={"sp-b": t.PROMPT - 96})))
        assert invalid == set() and done == set()
    for r in ranks:
        assert r.call("stats")["blocks_loaded"] == 6
    return [r.call("blocks", ids=B_BLOCKS[:6])["data"] for r in ranks]


def workers(xdg, n=2):
    ranks = []
    for i in range(n):
        r = Rank(xdg, f"rank{i}")
        r.rank = i
        ranks.append(r)
    return ranks


def test_tp2_default_settings_one_daemon(tmp_path, monkeypatch):
    xdg = private_runtime_dir(tmp_path, monkeypatch)
    extra = {"spawn_idle_exit": "3s"}  # no store_mode: the default
    assert config.parse(extra).store_mode == "auto"
    ranks = workers(xdg)
    s = None
    try:
        # vLLM creates the workers first: both race to start the daemon.
        for r in ranks:
            open_rank(r, "worker", "tp-one", extra, fill=True,
                      seed=500 + r.rank)
        infos = [r.reply() for r in ranks]
        s = scheduler("tp-one", extra)
        pid = s.daemon.pid
        assert [i["pid"] for i in infos] == [pid, pid]
        assert [i["started"] for i in infos] + [s.daemon.started] in (
            [True, False, False], [False, True, False])
        pid_files = list((xdg / "kvdepot").glob("*.pid"))
        assert [int(p.read_text()) for p in pid_files] == [pid]
        assert starts_logged(xdg) == 1
        saved = save(s, ranks)

        # Engine B in the same processes: the daemon is still there.
        for c in [s]:
            c.shutdown()
        for r in ranks:
            r.call("shutdown")
            open_rank(r, "worker", "tp-one", extra, seed=0)
            assert r.reply()["pid"] == pid
        s = scheduler("tp-one", extra)
        assert s.daemon.pid == pid and not s.daemon.started
        assert load(s, ranks, from_disk=False) == saved
        assert starts_logged(xdg) == 1

        s.shutdown()
        s = None
        for r in ranks:
            r.call("shutdown")
            r.close()
        took = wait_gone(pid)
        print(f"kvdepotd gone {took:.2f} s after the engine")
        sock = Path(infos[0]["address"][len("unix:"):])
        assert not sock.exists() and not Path(f"{sock}.shm").exists()
    finally:
        if s is not None:
            s.shutdown()
        for r in ranks:
            r.proc.kill()


def test_kill9_leaves_no_daemon(tmp_path, monkeypatch):
    xdg = private_runtime_dir(tmp_path, monkeypatch)
    extra = {"spawn_idle_exit": "1s"}
    procs = workers(xdg, 3)
    try:
        for r in procs[:2]:
            open_rank(r, "worker", "k9", extra)
        pids = {r.reply()["pid"] for r in procs[:2]}
        procs[2].rank = 0
        open_rank(procs[2], "scheduler", "k9", extra)
        pids.add(procs[2].reply()["pid"])
        assert len(pids) == 1
        pid = pids.pop()
        assert not daemon_gone(pid)
        for r in procs:
            r.proc.send_signal(signal.SIGKILL)
            r.proc.wait()
        print(f"kvdepotd gone {wait_gone(pid):.2f} s after kill -9")

        # The next engine with the same key starts a daemon cleanly; then
        # that daemon is killed itself, leaving its sockets, ready and pid
        # files: the one after that starts cleanly too.
        s = scheduler("k9", extra)
        second = s.daemon.pid
        assert second != pid and s.daemon.started
        s.shutdown()
        os.kill(second, signal.SIGKILL)
        wait_gone(second)
        files = s.daemon.files
        assert files["ready"].exists() and Path(
            f"{files['sock']}.shm").exists()
        s = scheduler("k9", extra)
        assert s.daemon.started and s.daemon.pid not in (pid, second)
        third = s.daemon.pid
        s.shutdown()
        wait_gone(third)
    finally:
        for r in procs:
            r.proc.kill()


def test_store_dir_survives_engine_and_daemon(tmp_path, monkeypatch):
    xdg = private_runtime_dir(tmp_path, monkeypatch)
    nvme = tmp_path / "nvme"
    extra = {"spawn_idle_exit": "1s", "store_dir": str(nvme)}
    ranks = workers(xdg)
    s = None
    try:
        for r in ranks:
            open_rank(r, "worker", "engine-1", extra, fill=True,
                      seed=700 + r.rank)
        first = {r.reply()["pid"] for r in ranks}
        s = scheduler("engine-1", extra)
        saved = save(s, ranks)
        s.shutdown()
        s = None
        for r in ranks:
            r.call("shutdown")
        (pid,) = first
        wait_gone(pid)

        # Engine 2 (another instance id): a new daemon on the same tier.
        for r in ranks:
            open_rank(r, "worker", "engine-2", extra, seed=0)
        second = {r.reply()["pid"] for r in ranks}
        s = scheduler("engine-2", extra)
        assert second == {s.daemon.pid} and s.daemon.pid != pid
        assert load(s, ranks, from_disk=True) == saved
    finally:
        if s is not None:
            s.shutdown()
        for r in ranks:
            r.proc.kill()


def test_run_dir_must_be_private(tmp_path, monkeypatch):
    xdg = tmp_path / "x"
    xdg.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    run = xdg / "kvdepot"
    run.mkdir(mode=0o700)
    os.chmod(run, 0o777)
    settings = config.parse({})
    with pytest.raises(_spawn.SpawnError,
                       match="may be written by group or others"):
        _spawn.ensure_daemon(settings, "k")
    os.chmod(run, 0o700)
    if os.getuid() == 0:
        os.chown(run, 65534, 65534)
    else:  # pretend to be someone else than the directory's owner
        uid = os.getuid() + 1
        monkeypatch.setattr(_spawn.os, "getuid", lambda: uid)
    with pytest.raises(_spawn.SpawnError, match="belongs to uid"):
        _spawn.ensure_daemon(settings, "k")
    # Through the connector: the same error, at the connector's start.
    with pytest.raises(_spawn.SpawnError, match="belongs to uid"):
        scheduler("k", {})
    assert not list(run.iterdir())  # nothing was started or written
