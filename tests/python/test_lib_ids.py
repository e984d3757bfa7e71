"""Token and block ids cross into the library as uint32 arrays built over
an array.array: any iterable of integers is taken, the values arrive
exactly, and a value outside 0..2^32-1 is refused with the argument named
instead of being wrapped around into another key."""

import pytest

from conftest import require_lib
from kvdepot import _lib

require_lib()


@pytest.fixture
def leader():
    store = _lib.Store({"store.arena_size": "16m", "store.arena_chunk": "1m",
                        "store.arena_hugepages": "off"})
    ld = _lib.Leader(store, 16, _lib.Namespace())
    yield ld
    ld.close()
    store.close()


def test_iterables_are_accepted(leader):
    toks = list(range(7, 7 + 40))
    assert leader.match("a", toks, 0) == (0, False)
    assert leader.match("b", tuple(toks), 0) == (0, False)
    assert leader.match("c", (t for t in toks), 0) == (0, False)
    assert leader.match("d", [], 0) == (0, False)


@pytest.mark.parametrize("bad", [-1, 2 ** 32, 1.5])
def test_out_of_range_ids_are_refused(leader, bad):
    with pytest.raises(ValueError, match="tokens"):
        leader.match("a", [1, bad, 3], 0)
    with pytest.raises(ValueError, match="tokens"):
        leader.request_scheduled("a", [], [bad], 0)


def test_conversion_is_exact():
    vals = [0, 1, 2 ** 31, 2 ** 32 - 1]
    arr, n = _lib._u32_array(vals, "x")
    assert list(arr) == vals and n == 4
    assert _lib._u32_array([], "x")[1] == 0
    # A byte string is its bytes, not its raw bytes read four at a time.
    arr, n = _lib._u32_array(b"\x01\x00\x00\x00", "x")
    assert list(arr) == [1, 0, 0, 0] and n == 4
    assert list(_lib._u32_array(bytearray(b"ab"), "x")[0]) == [97, 98]
    assert list(_lib._u32s(vals[:1], "x")) == [0]
    assert _lib._u32s([], "x") is None
    with pytest.raises(ValueError, match="x"):
        _lib._u32s([-5], "x")
