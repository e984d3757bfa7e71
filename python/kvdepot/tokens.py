"""The token ids of a prompt as an engine computes them, for
`kvdepot lookup --text` (the C CLI runs this module and reads its output).

    python -m kvdepot.tokens --tokenizer NAME [--chat] [--no-special-tokens]

Reads the text on stdin and prints its token ids as one JSON list. NAME is
a Hugging Face tokenizer name or directory (transformers' AutoTokenizer;
HF_HUB_OFFLINE=1 keeps it to the local cache). As vLLM's OpenAI server
tokenizes: a completion prompt with the tokenizer's special tokens (BOS)
unless --no-special-tokens; with --chat the text is one user message put
through the tokenizer's chat template with the generation prompt, as
/v1/chat/completions does. Exit 0 with the ids, 3 when the tokenizer cannot
be loaded (the reason on stderr), 2 on a bad command line.
"""
import argparse
import json
import sys
from typing import List, Optional, Sequence


def encode(tokenizer: str, text: str, special: bool = True,
           chat: bool = False) -> List[int]:
    """The token ids of `text` by the tokenizer `tokenizer`."""
    from transformers import AutoTokenizer  # imported here: optional
    tok = AutoTokenizer.from_pretrained(tokenizer)
    if chat:
        ids = tok.apply_chat_template([{"role": "user", "content": text}],
                                      add_generation_prompt=True,
                                      tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
    else:
        ids = tok(text, add_special_tokens=special)["input_ids"]
    return [int(i) for i in ids]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvdepot.tokens",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--no-special-tokens", action="store_true")
    a = ap.parse_args(argv)
    text = sys.stdin.read()
    try:
        import transformers  # noqa: F401
    except ImportError:
        print(f"kvdepot.tokens: transformers is not installed in the Python "
              f"at {sys.executable} (pip install transformers there, or set "
              f"KVDEPOT_PYTHON to a Python that has it); token ids work "
              f"without it: kvdepot lookup --tokens / --token-file",
              file=sys.stderr)
        return 3
    try:
        ids = encode(a.tokenizer, text, special=not a.no_special_tokens,
                     chat=a.chat)
    except Exception as e:  # noqa: BLE001 - any loader error is reported
        print(f"kvdepot.tokens: tokenizer '{a.tokenizer}': "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        return 3
    json.dump(ids, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
