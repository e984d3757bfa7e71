#!/usr/bin/env bash
# Creates (or reuses) the virtualenv that holds the peers kvdepot is measured
# against (`make bench-peers`, bench/peers/): LMCache, Mooncake's transfer
# engine and NIXL, pinned, from PyPI. Not part of `make test`: the peers are
# large (torch and CUDA wheels, about 7 GiB) and come from PyPI, not Debian.
#
# Usage: scripts/install-peers.sh [VENV]   (default build/peers-venv)
#
# Mooncake publishes two wheels of the same module: mooncake-transfer-engine
# links libcudart.so.12 and does not import on a machine without CUDA 12
# ("ImportError: libcudart.so.12: cannot open shared object file"), so a
# machine without an NVIDIA driver gets mooncake-transfer-engine-non-cuda.
set -euo pipefail

LMCACHE_VERSION=0.5.6
MOONCAKE_VERSION=0.3.13.post1
NIXL_VERSION=1.5.1

venv=${1:-build/peers-venv}
if [[ -e /proc/driver/nvidia/version ]]; then
    mooncake=mooncake-transfer-engine
    other=mooncake-transfer-engine-non-cuda
else
    mooncake=mooncake-transfer-engine-non-cuda
    other=mooncake-transfer-engine
fi
want=("lmcache==$LMCACHE_VERSION" "$mooncake==$MOONCAKE_VERSION"
      "nixl==$NIXL_VERSION")

if [[ ! -x "$venv/bin/python" ]]; then
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
fi
have() {
    "$venv/bin/python" - "$@" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
for spec in sys.argv[1:]:
    name, want = spec.split("==")
    try:
        if version(name) != want:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
EOF
}
if ! have "${want[@]}"; then
    echo "install-peers: installing ${want[*]} into $venv (large: torch and CUDA wheels)"
    if "$venv/bin/pip" show -q "$other" >/dev/null 2>&1; then
        "$venv/bin/pip" uninstall -q -y "$other"
    fi
    "$venv/bin/pip" install -q "${want[@]}"
fi
"$venv/bin/python" - "$mooncake" <<'EOF'
import sys
from importlib.metadata import version
import lmcache  # noqa: F401  (each import proves the wheel loads here)
import nixl._api  # noqa: F401
from mooncake.engine import TransferEngine  # noqa: F401
print("install-peers:", ", ".join(
    f"{d} {version(d)}" for d in ("lmcache", sys.argv[1], "nixl")))
EOF
