"""Shared set-up of the Python tests: the source tree's python/ package is
importable, and tests that need libkvdepot.so call require_lib() to skip
cleanly when it is not built."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))


def require_lib():
    from kvdepot import _lib
    try:
        _lib.lib()
    except OSError as e:  # pragma: no cover
        pytest.skip(f"libkvdepot.so not built: {e}", allow_module_level=True)
