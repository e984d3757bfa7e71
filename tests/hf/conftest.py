"""Set-up of the transformers tests (make test-hf): python/ and this folder
importable; without libkvdepot.so, torch or transformers they skip."""

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "python"))
sys.path.insert(0, str(HERE))

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="session", autouse=True)
def _lib_built():
    from kvdepot import _lib
    try:
        _lib.lib()
    except OSError as e:
        pytest.skip(f"libkvdepot.so not built: {e}")
