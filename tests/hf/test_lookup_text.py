"""`kvdepot lookup --text` with a real transformers tokenizer (made here
from a word-level vocabulary, saved to a directory: no download): the ids
`python -m kvdepot.tokens` prints are the tokenizer's own, with its BOS for
a completion prompt, without it under --no-special-tokens, and through its
chat template under --chat; the CLI finds the blocks stored for those ids
in a running kvdepotd, and reports a miss for another text."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NS = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
WORDS = [f"w{i}" for i in range(200)]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    vocab = {"<unk>": 0, "<s>": 1, "user:": 2, "assistant:": 3}
    vocab.update({w: i + 4 for i, w in enumerate(WORDS)})
    t = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>",
                                  unk_token="<unk>")
    tok.chat_template = ("{% for m in messages %}user: {{ m['content'] }} "
                         "{% endfor %}{% if add_generation_prompt %}"
                         "assistant:{% endif %}")
    d = tmp_path_factory.mktemp("tok")
    tok.save_pretrained(d)
    return d


def cli():
    path = Path(os.environ.get("KVDEPOTD", "")).resolve().parents[1] / \
        "cli" / "kvdepot"
    if not os.environ.get("KVDEPOTD") or not path.exists():
        pytest.skip("KVDEPOTD unset or no kvdepot CLI next to it")
    return str(path)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = tmp_path_factory.mktemp("d")
    kvdepotd = cli() and os.environ["KVDEPOTD"]
    proc = subprocess.Popen(
        [kvdepotd, "--set", f"server.unix_socket={d}/d.sock",
         "--set", "server.metrics_address=127.0.0.1:0",
         "--set", "store.arena_size=64m", "--set", "store.arena_chunk=4m",
         "--set", "store.arena_hugepages=off", "--set", "log.level=warn",
         "--ready-file", str(d / "ready")],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while not (d / "ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    yield f"unix:{d}/d.sock"
    proc.terminate()
    proc.wait(timeout=30)


def kv(*args):
    env = dict(os.environ, KVDEPOT_PYTHON=sys.executable,
               PYTHONPATH=str(ROOT / "python"))
    p = subprocess.run([cli(), *args], capture_output=True, text=True,
                       env=env, timeout=120)
    return p.returncode, p.stdout, p.stderr


def test_ids_are_the_tokenizers(tokenizer_dir):
    from kvdepot import tokens
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    text = " ".join(WORDS[:10])
    assert tokens.encode(str(tokenizer_dir), text) == \
        [1] + [i + 4 for i in range(10)]
    assert tokens.encode(str(tokenizer_dir), text, special=False) == \
        [i + 4 for i in range(10)]
    chat = tok.apply_chat_template([{"role": "user", "content": text}],
                                   add_generation_prompt=True, tokenize=True)
    if hasattr(chat, "keys"):  # transformers 5: a BatchEncoding
        chat = chat["input_ids"]
    assert tokens.encode(str(tokenizer_dir), text, chat=True) == list(chat)
    assert len(chat) > 10  # the template's words are in it


def test_lookup_by_text_finds_the_stored_prompt(tokenizer_dir, daemon,
                                                tmp_path):
    text = " ".join(WORDS[:63])  # with BOS: 64 tokens, 4 blocks
    base = ["-n", NS, "--address", daemon]
    ids = [1] + [i + 4 for i in range(63)]
    rc, out, err = kv("lookup", *base, "--tokens",
                      ",".join(map(str, ids)), "--json")
    assert rc == 0, err
    blocks = json.loads(out)["block_list"]
    assert len(blocks) == 4
    f = tmp_path / "kv"
    f.write_bytes(os.urandom(4096))
    for b in blocks:  # what an engine would have saved for this prompt
        rc, _, err = kv("put", *base[:2], "-k", b["hash"], "--address",
                        daemon, str(f))
        assert rc == 0, err

    rc, out, err = kv("lookup", *base, "--text", text, "--tokenizer",
                      str(tokenizer_dir), "--json")
    assert rc == 0, err
    got = json.loads(out)
    assert got["matched_tokens"] == 64 and got["block_list"] == [
        dict(b, tier="host", reachable=True) for b in blocks]
    # Without the BOS the chain differs from its first block on: a miss.
    rc, out, err = kv("lookup", *base, "--text", text, "--tokenizer",
                      str(tokenizer_dir), "--no-special-tokens")
    assert rc == 0 and "hit: 0 of 3 blocks" in out, out + err
    rc, out, err = kv("lookup", *base, "--text", text, "--tokenizer",
                      str(tmp_path / "no-such-tokenizer"))
    assert rc == 1 and "no-such-tokenizer" in err, err
