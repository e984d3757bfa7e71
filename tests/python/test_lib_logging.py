"""The library's log messages inside Python: they reach the "kvdepot.lib"
logger (so an engine's logging configuration applies), at logging's level
for the C level, with the C file and line; KVDEPOT_LOG_STDERR=1 keeps the
library's own stderr lines. Before, they went to stderr only, where
vLLM's log handlers never saw them."""

import logging
import os
import subprocess
import sys
from pathlib import Path

from conftest import require_lib
from kvdepot import _lib

require_lib()

SETTINGS = {"store.arena_size": "64m", "store.arena_chunk": "4m",
            "store.arena_hugepages": "off", "store.arena_prefault": "false"}


def test_c_messages_reach_python_logging(caplog):
    lib = _lib.lib()
    before = lib.kvd_log_get_level()
    lib.kvd_log_set_level(2)  # info
    try:
        with caplog.at_level(logging.INFO, logger="kvdepot.lib"):
            _lib.Store(SETTINGS).close()
    finally:
        lib.kvd_log_set_level(before)
    opens = [r for r in caplog.records if r.name == "kvdepot.lib" and
             r.getMessage().startswith("store: open, arena 64 MiB")]
    assert len(opens) == 1
    assert opens[0].levelno == logging.INFO
    assert opens[0].filename == "store.c" and opens[0].lineno > 0


def test_stderr_when_asked():
    code = ("import sys; sys.path.insert(0, %r); from kvdepot import _lib; "
            "h = _lib.lib(); h.kvd_log_set_level(2); "
            "_lib.Store(%r).close()" % (
                str(Path(__file__).resolve().parents[2] / "python"),
                SETTINGS))
    for env, want in (({"KVDEPOT_LOG_STDERR": "1"}, True), ({}, False)):
        out = subprocess.run([sys.executable, "-c", code], env={
            **os.environ, **env}, capture_output=True, text=True,
            timeout=60)
        assert out.returncode == 0, out.stderr
        assert ("info  store.c" in out.stderr) == want, out.stderr
