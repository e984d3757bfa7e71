"""A kvdepotd started by the engine's own processes (store_mode "auto" with
tensor parallelism, or "spawn").

An embedded store lives in one process, and a tensor-parallel vLLM engine
is several: the scheduler and one worker per rank, created in an order the
connector does not choose (the workers first). Each of them calls
ensure_daemon() with the same key; the first one, under a file lock,
starts a kvdepotd for the engine and the others join it. The daemon is
started with server.exit_when_idle, so it stops by itself once no engine
process has had its store open on it for that long, however the processes
ended (a kill -9 closes their hand-off connections too); nothing here has
to outlive the engine to stop it. docs/daemon.md, "Started by the engine",
has the whole story.

Files, in the run directory ($XDG_RUNTIME_DIR/kvdepot, else
/tmp/kvdepot-<uid>; mode 0700, this user's only), per daemon <name>:
<name>.lock (flock), <name>.sock and .sock.shm (the daemon's sockets),
<name>.ready (its --ready-file), <name>.pid, <name>.log (its output),
<name>.json (the store settings it was started with). <name> is a hash of
the engine's key, or of store_dir when one is set: one disk tier has one
daemon, shared by the engines that name it.

Standard library only. Thread-safe (the lock is a file lock; two threads
of one process take turns through it)."""

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import threading
import time
from pathlib import Path

from kvdepot import config

READY_TIMEOUT_S = 60   # a daemon's start, up to its ready file
STOP_WAIT_S = 90       # a stopping daemon (grace, flush to NVMe) to go
LOCK_TIMEOUT_S = READY_TIMEOUT_S + STOP_WAIT_S + 30
_SUN_PATH_MAX = 107    # sockaddr_un.sun_path, less its NUL
_lock_threads = threading.Lock()


class SpawnError(RuntimeError):
    """The engine's kvdepotd could not be started or joined."""


@dataclasses.dataclass
class DaemonHandle:
    """The daemon an engine process uses. Nothing to release: the daemon
    stops once no process has its store open (server.exit_when_idle)."""
    address: str   # "unix:<run dir>/<name>.sock", for store_address
    pid: int       # the daemon's process id
    started: bool  # this process started it (else joined it)
    files: dict    # "sock", "ready", "pid", "log", "json", "lock" -> Path

    def serving(self):
        """Whether the daemon is still serving (not stopping or gone)."""
        return _ready_pid(self.files) == self.pid and _is_daemon(
            self.pid, self.files)


def run_dir():
    """The run directory, created 0700 if missing. SpawnError when it is
    not a directory of this user that only this user may write."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    d = Path(base) / "kvdepot" if base else Path(f"/tmp/kvdepot-{os.getuid()}")
    try:
        d.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise SpawnError(f"kvdepot: cannot create the run directory {d}: "
                         f"{e}") from e
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode):
        raise SpawnError(f"kvdepot: run directory {d} is not a directory "
                         f"(a symbolic link or a file); remove it")
    if st.st_uid != os.getuid():
        raise SpawnError(f"kvdepot: run directory {d} belongs to uid "
                         f"{st.st_uid}, not to this user (uid "
                         f"{os.getuid()}); set XDG_RUNTIME_DIR to a "
                         f"directory of your own")
    if st.st_mode & 0o022:
        raise SpawnError(f"kvdepot: run directory {d} may be written by "
                         f"group or others (mode {st.st_mode & 0o777:o}); "
                         f"chmod 700 it or remove it")
    return d


def daemon_binary():
    """kvdepotd, found like libkvdepot.so (_lib.py): KVDEPOTD, next to the
    package, beside KVDEPOT_LIB's build tree, the source checkout's build
    trees, then PATH. SpawnError naming where it looked."""
    here = Path(__file__).resolve().parent
    root = here.parent.parent
    tried = []
    env = os.environ.get("KVDEPOTD")
    cands = [Path(env)] if env else []
    cands.append(here / "kvdepotd")
    lib = os.environ.get("KVDEPOT_LIB")
    if lib:
        cands.append(Path(lib).resolve().parent / "server" / "kvdepotd")
    for tree in ("dev", "ci", "release", "asan", "gpu"):
        cands.append(root / "build" / tree / "server" / "kvdepotd")
    found = shutil.which("kvdepotd")
    if found:
        cands.append(Path(found))
    for c in cands:
        tried.append(str(c))
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise SpawnError("kvdepot: kvdepotd not found; set KVDEPOTD (tried: " +
                     "; ".join(tried) + ")")


def engine_key(instance_id, settings):
    """The key of one engine: vLLM's instance_id (the same in all of its
    processes), else a digest of the store settings."""
    if instance_id:
        return str(instance_id)
    return "settings:" + json.dumps(
        _daemon_store_settings(settings), sort_keys=True)


def _name(settings, key):
    basis = ("dir:" + os.path.realpath(settings.store_dir)
             if settings.store_dir else "key:" + key)
    return hashlib.sha256(basis.encode()).hexdigest()[:16]


def _daemon_store_settings(settings):
    """The store.* settings the daemon is started with: those an embedded
    store would get, store_dir as an absolute path."""
    out = config.store_settings(
        dataclasses.replace(settings, store_mode="embedded"))
    if settings.store_dir:
        out["store.disk_path"] = os.path.realpath(settings.store_dir)
    return {k: _text(v) for k, v in out.items()}


def _text(v):
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _files(d, name):
    files = {ext: d / f"{name}.{ext}"
             for ext in ("lock", "sock", "ready", "pid", "log", "json")}
    if len(str(files["sock"]) + ".shm") > _SUN_PATH_MAX:
        raise SpawnError(f"kvdepot: socket path {files['sock']}.shm is "
                         f"longer than {_SUN_PATH_MAX} bytes; set "
                         f"XDG_RUNTIME_DIR to a shorter directory")
    return files


def _ready_pid(files):
    """The pid= of the ready file, or None."""
    try:
        for line in files["ready"].read_text().split():
            if line.startswith("pid="):
                return int(line[4:])
    except (OSError, ValueError):
        pass
    return None


def _is_daemon(pid, files):
    """Whether `pid` is running (not a zombie) and is the kvdepotd of these
    files (its command line names their ready file; pids are reused)."""
    if not pid:
        return False
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
        if st[st.rindex(")") + 2:].startswith("Z"):
            return False
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return False
    return os.fsencode(str(files["ready"])) in argv


def _recorded_pid(files):
    try:
        return int(files["pid"].read_text())
    except (OSError, ValueError):
        return _ready_pid(files)


def _log_tail(files, n=20):
    try:
        lines = files["log"].read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:]) or "(empty log)"


class _Locked:
    """flock(LOCK_EX) on `path` for a with block, polled up to a deadline
    (another process may hold it while its daemon starts or stops)."""

    def __init__(self, path, files):
        self.path, self.files, self.fd = path, files, None

    def __enter__(self):
        _lock_threads.acquire()
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                              0o600)
            deadline = time.monotonic() + LOCK_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return self
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise SpawnError(
                            f"kvdepot: {self.path} stayed locked for "
                            f"{LOCK_TIMEOUT_S} s by another process of an "
                            f"engine; its daemon's log ends with:\n" +
                            _log_tail(self.files)) from None
                    time.sleep(0.05)
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)  # releases the flock
            self.fd = None
        _lock_threads.release()


def _wait_settled(files):
    """With the lock held: the pid of a serving daemon of these files, or
    None once there is none (a starting one is waited for, and so is a
    stopping one, which must be gone before another uses its disk tier)."""
    deadline = time.monotonic() + READY_TIMEOUT_S + STOP_WAIT_S
    while True:
        pid = _recorded_pid(files)
        if not _is_daemon(pid, files):
            return None
        if _ready_pid(files) == pid:
            return pid
        if time.monotonic() > deadline:
            raise SpawnError(
                f"kvdepot: kvdepotd pid {pid} ({files['sock']}) has been "
                f"neither serving nor gone for {READY_TIMEOUT_S + STOP_WAIT_S}"
                f" s; its log ends with:\n" + _log_tail(files))
        time.sleep(0.05)


def _start(settings, files, wanted):
    """With the lock held and no daemon alive: clears what a dead one left,
    starts kvdepotd and waits for its ready file. Returns its pid."""
    for ext in ("sock", "ready", "pid", "json"):
        files[ext].unlink(missing_ok=True)
    Path(str(files["sock"]) + ".shm").unlink(missing_ok=True)
    sets = {"server.unix_socket": str(files["sock"]),
            "server.unix_mode": "0600", "server.tcp_address": "",
            "server.metrics_address": "", "cluster.etcd": "",
            "server.exit_when_idle": settings.spawn_idle_exit}
    if settings.node_id:
        sets["server.node_id"] = settings.node_id
    sets.update(wanted)
    args = [str(daemon_binary()), "--ready-file", str(files["ready"])]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    with open(files["log"], "a") as log:
        os.fchmod(log.fileno(), 0o600)
        log.write(f"---- kvdepot: kvdepotd started by pid {os.getpid()} at "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {args}\n")
        log.flush()
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, cwd="/",
                                start_new_session=True)
    # Reap it when it exits while this process lives (no zombie that
    # looks alive to the others).
    threading.Thread(target=proc.wait, daemon=True).start()
    files["pid"].write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + READY_TIMEOUT_S
    while _ready_pid(files) != proc.pid:
        if proc.poll() is not None:
            raise SpawnError(f"kvdepot: kvdepotd exited with code "
                             f"{proc.returncode} at start; its log "
                             f"({files['log']}) ends with:\n" +
                             _log_tail(files))
        if time.monotonic() > deadline:
            proc.terminate()
            raise SpawnError(f"kvdepot: kvdepotd was not ready within "
                             f"{READY_TIMEOUT_S} s; its log ends with:\n" +
                             _log_tail(files))
        time.sleep(0.02)
    files["json"].write_text(json.dumps(wanted, sort_keys=True))
    return proc.pid


def ensure_daemon(settings, key):
    """The engine's kvdepotd: joined when one serves these files, else
    started. `settings`: config.Settings; `key`: the same string in every
    process of one engine (engine_key). Returns (address, DaemonHandle).
    SpawnError when it cannot be started or joined (with its log's tail),
    ValueError when a running daemon of the same store_dir has other store
    settings."""
    d = run_dir()
    files = _files(d, _name(settings, key))
    wanted = _daemon_store_settings(settings)
    with _Locked(files["lock"], files):
        pid = _wait_settled(files)
        if pid is not None:
            try:
                have = json.loads(files["json"].read_text())
            except (OSError, ValueError):
                have = wanted
            if have != wanted:
                what = (f"store_dir {settings.store_dir}"
                        if settings.store_dir else "this engine")
                raise ValueError(
                    f"kvdepot: the kvdepotd serving {what} (pid {pid}, "
                    f"started by another engine) has the store settings "
                    f"{have}; this one asks for {wanted}. Give the same, "
                    f"another store_dir, or wait until it stops "
                    f"(spawn_idle_exit after its last engine process)")
            started = False
        else:
            pid, started = _start(settings, files, wanted), True
    return f"unix:{files['sock']}", DaemonHandle(
        f"unix:{files['sock']}", pid, started, files)


def attach(settings, key, acquire, attempts=3):
    """ensure_daemon, then acquire(store settings) -> its result (the
    store): returns (DaemonHandle, result). A daemon can decide to stop for
    idleness just as a process joins it; the store then fails to open on a
    daemon that is no longer serving, and the next one is started (or
    joined) and tried, `attempts` times in all."""
    for attempt in range(attempts):
        address, handle = ensure_daemon(settings, key)
        client = config.store_settings(dataclasses.replace(
            settings, store_mode="daemon", store_address=address))
        try:
            return handle, acquire(client)
        except Exception:
            if attempt + 1 == attempts or handle.serving():
                raise
    raise AssertionError("unreachable")
