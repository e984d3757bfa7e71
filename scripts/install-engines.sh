#!/usr/bin/env bash
# Creates (or reuses) the virtualenv that holds the inference engines from
# PyPI, for the engine tests (`make test-vllm`). Not part of `make test`:
# the engines are large and come from PyPI, not Debian.
#
# Usage: scripts/install-engines.sh --vllm VERSION [VENV]
#            (default build/vllm-venv-VERSION; `make test-vllm` makes one
#            per release of its VLLM_VERSIONS)
#        scripts/install-engines.sh [VENV]   (vLLM $VLLM_VERSION, default
#            build/engines-venv)
#        scripts/install-engines.sh --hf [VENV]   (default build/hf-venv)
#        scripts/install-engines.sh --trtllm VERSION [VENV]
#            (default build/trtllm-venv-VERSION; `make test-trtllm`)
# The venv sees Debian's site-packages too, so /usr/lib/python3 stays the
# base, and the pinned versions below are installed into it. --hf makes
# the transformers venv of `make test-hf` instead: torch and transformers
# at the versions of the GPU machine docs/hf.md names, plus pytest.
set -euo pipefail

VLLM_VERSION=0.33.0   # the newest release kvdepot.vllm is tested with (docs/vllm.md)
TORCH_VERSION=2.11.0  # kvdepot.hf's pins (docs/hf.md)
TRANSFORMERS_VERSION=5.17.0

if [[ "${1:-}" == "--trtllm" ]]; then
    # PyPI's tensorrt-llm is a wheel-stub sdist: installing it downloads the
    # real wheel from pypi.nvidia.com. Where that index cannot be reached
    # the install fails; say so plainly (docs/trtllm.md).
    TRTLLM_VERSION=${2:?--trtllm needs a version}
    venv=${3:-build/trtllm-venv-$TRTLLM_VERSION}
    if [[ ! -x "$venv/bin/python" ]]; then
        /usr/bin/python3 -m venv --system-site-packages "$venv"
        "$venv/bin/pip" install -q --upgrade pip
    fi
    have=$("$venv/bin/python" -c 'import tensorrt_llm; print(tensorrt_llm.__version__)' 2>/dev/null || true)
    if [[ "$have" != "$TRTLLM_VERSION" ]]; then
        echo "install-engines: installing tensorrt-llm==$TRTLLM_VERSION into $venv (from pypi.nvidia.com through PyPI's wheel-stub)"
        if ! "$venv/bin/pip" install -q "tensorrt-llm==$TRTLLM_VERSION" pytest pyyaml; then
            echo "install-engines: tensorrt-llm==$TRTLLM_VERSION could not be installed: PyPI holds only a wheel-stub that fetches the wheel from pypi.nvidia.com (reachable? curl -sI https://pypi.nvidia.com/)" >&2
            exit 1
        fi
    fi
    "$venv/bin/python" -c 'import tensorrt_llm; print("install-engines: tensorrt_llm", tensorrt_llm.__version__)'
    exit 0
fi

if [[ "${1:-}" == "--hf" ]]; then
    venv=${2:-build/hf-venv}
    if [[ ! -x "$venv/bin/python" ]]; then
        /usr/bin/python3 -m venv "$venv"
        "$venv/bin/pip" install -q --upgrade pip
    fi
    have=$("$venv/bin/python" -c 'import torch, transformers, pytest
print(torch.__version__.split("+")[0], transformers.__version__)' 2>/dev/null || true)
    if [[ "$have" != "$TORCH_VERSION $TRANSFORMERS_VERSION" ]]; then
        echo "install-engines: installing torch==$TORCH_VERSION transformers==$TRANSFORMERS_VERSION into $venv (large: CUDA wheels)"
        "$venv/bin/pip" install -q "torch==$TORCH_VERSION" \
            "transformers==$TRANSFORMERS_VERSION" pytest
    fi
    "$venv/bin/python" -c 'import torch, transformers
print("install-engines: torch", torch.__version__, "transformers", transformers.__version__)'
    exit 0
fi

if [[ "${1:-}" == "--vllm" ]]; then
    VLLM_VERSION=${2:?--vllm needs a version}
    set -- "${3:-build/vllm-venv-$VLLM_VERSION}"
fi
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
