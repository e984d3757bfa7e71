"""The Python package refuses a libkvdepot it was not written for: another
MAJOR.MINOR version, a library without kvd_struct_size, or one whose
structures have another size than the ctypes mirrors (built from other
headers: it would be handed structs of the wrong shape)."""

import ctypes

from conftest import require_lib
from kvdepot import _lib

require_lib()


class FakeLib:
    """A library's two handshake functions, with what they answer."""

    def __init__(self, version=b"0.1.0", sizes=None, has_sizes=True):
        real = _lib.lib()
        self._sizes = sizes or {}

        def kvd_version():
            return version
        self.kvd_version = kvd_version
        if has_sizes:
            def kvd_struct_size(name):
                n = name.decode()
                return self._sizes.get(n, real.kvd_struct_size(name))
            self.kvd_struct_size = kvd_struct_size


def test_an_installed_package_uses_its_own_library():
    """Under the wheel test: the package comes from site-packages and its
    library from next to it, with no KVDEPOT_LIB."""
    import os
    from pathlib import Path
    import kvdepot
    if not os.environ.get("KVDEPOT_TEST_INSTALLED"):
        return
    here = Path(kvdepot.__file__).resolve().parent
    assert "site-packages" in str(here), here
    assert "KVDEPOT_LIB" not in os.environ
    assert Path(_lib.lib()._name).resolve() == here / "libkvdepot.so"
    assert (here / "py.typed").is_file()
    assert (here / "DEBIAN_DEPENDS").read_text().split()


def test_the_built_library_matches():
    assert _lib._mismatch(_lib.lib()) is None
    for cls, name in _lib._MIRRORS:
        assert _lib.lib().kvd_struct_size(name.encode()) == \
            ctypes.sizeof(cls), name


def test_another_version_is_refused():
    why = _lib._mismatch(FakeLib(version=b"0.2.0"))
    assert why and "libkvdepot 0.2.0" in why and "0.1.0" in why


def test_a_library_without_the_check_is_refused():
    why = _lib._mismatch(FakeLib(has_sizes=False))
    assert why and "kvd_struct_size" in why


def test_a_struct_of_another_size_is_refused():
    real = ctypes.sizeof(_lib.LeaderConfig)
    why = _lib._mismatch(FakeLib(sizes={"kvd_leader_config_t": real + 8}))
    assert why and "kvd_leader_config_t" in why
    assert f"{real + 8} bytes in the library and {real}" in why


def test_an_unknown_struct_is_size_zero():
    assert _lib.lib().kvd_struct_size(b"kvd_no_such_t") == 0
    assert _lib.lib().kvd_struct_size(None) == 0
