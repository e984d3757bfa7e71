#!/usr/bin/env bash
# Creates (or reuses) the virtualenv that holds the inference engines from
# PyPI, for the engine tests (`make test-vllm`). Not part of `make test`:
# the engines are large and come from PyPI, not Debian.
#
# Usage: scripts/install-engines.sh [VENV]   (default build/engines-venv)
# The venv sees Debian's site-packages too, so /usr/lib/python3 stays the
# base, and the pinned versions below are installed into it.
set -euo pipefail

VLLM_VERSION=0.19.1   # the API kvdepot.vllm is written against (docs/vllm.md)

venv=${1:-build/engines-venv}
if [[ ! -x "$venv/bin/python" ]]; then
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
fi
have=$("$venv/bin/python" -c 'import vllm; print(vllm.__version__)' 2>/dev/null || true)
if [[ "$have" != "$VLLM_VERSION" ]]; then
    echo "install-engines: installing vllm==$VLLM_VERSION into $venv (large: torch and CUDA wheels)"
    "$venv/bin/pip" install -q "vllm==$VLLM_VERSION" pytest
fi
"$venv/bin/python" -c 'import vllm; print("install-engines: vllm", vllm.__version__)'
