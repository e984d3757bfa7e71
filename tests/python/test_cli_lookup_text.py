"""`kvdepot lookup --text`: the CLI hands the text to
`$KVDEPOT_PYTHON -m kvdepot.tokens` and looks up the ids it prints. Here
the tokenizer is a stand-in program (the real one, with transformers, runs
in tests/hf/test_lookup_text.py): the text reaches it unchanged on stdin
(UTF-8, newlines, 1 MiB), its options are passed on, its ids are the ones
looked up, and every failure (no transformers in Debian's python3, a
program that cannot start, that fails, that prints garbage, that stops
reading) ends the lookup with exit 1 and a reason."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import KVDEPOTD, start_daemon, stop_daemon
from test_cli_remote import cli

pytestmark = pytest.mark.skipif(not KVDEPOTD, reason="KVDEPOTD not set")

NS = "00112233445566778899aabbccddeeff"
PYTHON_DIR = str(Path(__file__).resolve().parents[2] / "python")

# Stand-in tokenizer: one id per character (its code point), the arguments
# it got written next to it, ids as a JSON list. MODE changes what it does.
STANDIN = r'''#!{python}
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
open(os.path.join(here, "args"), "w").write(json.dumps(sys.argv[1:]))
mode = os.environ.get("STANDIN_MODE", "ok")
if mode == "no-read":
    sys.exit(0)
text = sys.stdin.buffer.read().decode()
open(os.path.join(here, "text"), "w", encoding="utf-8").write(text)
if mode == "fail":
    print("standin: no such tokenizer", file=sys.stderr)
    sys.exit(3)
if mode == "garbage":
    print("[1, 2, three]")
    sys.exit(0)
print(json.dumps([ord(c) for c in text]))
'''


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = tmp_path_factory.mktemp("lookup-text")
    proc, _, _ = start_daemon(d)
    yield d
    stop_daemon(proc)


def standin(tmp_path):
    p = tmp_path / "tok"
    p.write_text(STANDIN.replace("{python}", sys.executable))
    p.chmod(0o755)
    return p


def lookup(daemon, *args, python=None, mode="ok", stdin=None):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KVDEPOT_STORE_")}
    env.update(STANDIN_MODE=mode, PYTHONPATH=PYTHON_DIR)
    if python is not None:
        env["KVDEPOT_PYTHON"] = str(python)
    p = subprocess.run([cli(), "lookup", "-n", NS, "--address",
                        f"unix:{daemon}/d.sock", *args], capture_output=True,
                       text=True, timeout=60, env=env, input=stdin)
    return p.returncode, p.stdout, p.stderr


def test_text_reaches_the_tokenizer_and_its_ids_are_looked_up(daemon,
                                                              tmp_path):
    tok = standin(tmp_path)
    text = "Grüße, 世界!\nline two\ttab " * 4  # 31 characters, 4 times
    rc, out, err = lookup(daemon, "--text", text, "--tokenizer", "org/m",
                          "--json", python=tok)
    assert rc == 0, err
    assert (tmp_path / "text").read_text(encoding="utf-8") == text
    assert json.loads((tmp_path / "args").read_text()) == [
        "-m", "kvdepot.tokens", "--tokenizer", "org/m"]
    got = json.loads(out)
    assert got["tokens"] == len(text) and got["blocks"] == len(text) // 16
    # The same ids given directly hash to the same blocks.
    ids = ",".join(str(ord(c)) for c in text)
    rc, out2, err = lookup(daemon, "--tokens", ids, "--json")
    assert rc == 0, err
    assert json.loads(out2)["block_list"] == got["block_list"]


def test_text_file_chat_and_no_special_tokens(daemon, tmp_path):
    tok = standin(tmp_path)
    big = ("x" * 1023 + "\n") * 1024  # 1 MiB
    f = tmp_path / "prompt.txt"
    f.write_text(big)
    rc, out, err = lookup(daemon, "--text-file", str(f), "--tokenizer", "t",
                          "--chat", "--no-special-tokens", "--block-size",
                          "256", "--json", python=tok)
    assert rc == 0, err
    assert (tmp_path / "text").read_text() == big
    assert json.loads((tmp_path / "args").read_text())[4:] == [
        "--no-special-tokens", "--chat"]
    assert json.loads(out)["tokens"] == len(big)


@pytest.mark.parametrize("mode, why", [
    ("fail", "standin: no such tokenizer"),
    ("garbage", "is not a token id"),
])
def test_tokenizer_failures_are_exit_1_with_a_reason(daemon, tmp_path, mode,
                                                     why):
    rc, out, err = lookup(daemon, "--text", "a" * 64, "--tokenizer", "t",
                          python=standin(tmp_path), mode=mode)
    assert rc == 1 and why in err and out == "", err


def test_tokenizer_that_stops_reading(daemon, tmp_path):
    f = tmp_path / "big.txt"
    f.write_text("a" * (2 << 20))  # more than a pipe holds
    rc, out, err = lookup(daemon, "--text-file", str(f), "--tokenizer",
                          "t", python=standin(tmp_path), mode="no-read")
    assert rc == 1 and "tokenizing with 't' failed" in err, err


def test_without_transformers_or_python(daemon, tmp_path):
    try:
        import transformers  # noqa: F401
        pytest.skip("this Python has transformers")
    except ImportError:
        pass
    rc, out, err = lookup(daemon, "--text", "hello", "--tokenizer", "t",
                          python=sys.executable)
    assert rc == 1 and "transformers is not installed" in err, err
    rc, out, err = lookup(daemon, "--text", "hello", "--tokenizer", "t",
                          python=tmp_path / "no-such-python")
    assert rc == 1 and "cannot run" in err and "KVDEPOT_PYTHON" in err, err


@pytest.mark.parametrize("args, why", [
    (["--text", "a"], "need --tokenizer"),
    (["--text", "a", "--tokens", "1", "--tokenizer", "t"], "exactly one of"),
    (["--tokens", "1", "--chat"], "go with --text"),
    (["--tokens", "1", "--tokenizer", "t"], "go with --text"),
])
def test_bad_combinations_are_usage_errors(daemon, args, why):
    rc, out, err = lookup(daemon, *args)
    assert rc == 2 and why in err, err
