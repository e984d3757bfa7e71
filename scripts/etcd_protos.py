#!/usr/bin/env python3
"""Prepares etcd's v3 API protos for protoc-c (build step of cluster/).

The protos come from Debian's golang-etcd-server-dev at build time; they are
not kept in this repository. They import gogoproto and google.api, whose
options protoc-c has no use for: this drops those imports, the gogoproto
options (file-level lines and [(gogoproto....)] field options) and the
`option (google.api.http) = {...};` blocks (nested braces), and points the
imports of kv.proto and auth.proto at the copies written next to rpc.proto.

usage: etcd_protos.py SRC_ROOT OUT_DIR
  SRC_ROOT  .../go.etcd.io/etcd (holds etcdserver/, mvcc/, auth/)
  OUT_DIR   where rpc.proto, kv.proto and auth.proto are written
"""
import os
import re
import sys

FILES = {
    "rpc.proto": "etcdserver/etcdserverpb/rpc.proto",
    "kv.proto": "mvcc/mvccpb/kv.proto",
    "auth.proto": "auth/authpb/auth.proto",
}


def drop_http_options(text):
    """Removes every `option (google.api.http) = { ... };`, counting braces
    (the bodies nest)."""
    out = []
    i = 0
    needle = "option (google.api.http)"
    while True:
        j = text.find(needle, i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        k = text.index("{", j)
        depth = 0
        while True:
            c = text[k]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        end = text.index(";", k)
        i = end + 1


def clean(text):
    text = drop_http_options(text)
    lines = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("import \"gogoproto/") or \
                s.startswith("import \"google/api/"):
            continue
        if s.startswith("option (gogoproto."):
            continue
        lines.append(line)
    text = "\n".join(lines) + "\n"
    # Field options: [(gogoproto.x) = y] or several, comma-separated.
    text = re.sub(r"\s*\[\s*\(gogoproto\.[^\]]*\]", "", text)
    text = text.replace('import "etcd/mvcc/mvccpb/kv.proto";',
                        'import "kv.proto";')
    text = text.replace('import "etcd/auth/authpb/auth.proto";',
                        'import "auth.proto";')
    if "gogoproto" in text or "google.api" in text:
        raise SystemExit("etcd_protos.py: gogoproto or google.api left over")
    return text


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    for name, rel in FILES.items():
        path = os.path.join(src, rel)
        with open(path, encoding="utf-8") as f:
            text = clean(f.read())
        dst = os.path.join(out, name)
        tmp = dst + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, dst)


if __name__ == "__main__":
    main()
