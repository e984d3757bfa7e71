#!/usr/bin/env bash
# The manylinux wheel (scripts/repair-wheel.sh) where none of kvdepot's
# Debian libraries is installed: a minbase Debian 12 root with python3
# alone (no libgrpc29, liblmdb0, libucx0, ...: checked; apt brings
# libxxhash0, which the library still takes from its own copies), the wheel unpacked
# into a directory on PYTHONPATH (what pip install does for it), then the
# package loads its library, which finds every library it needs among its
# own copies or the system's base (libc, libm, libstdc++, libgcc_s, zlib),
# passes the version and layout handshake (every ctypes struct against the
# library's sizes), and opens an embedded store and calls it (a delete,
# key events on). `make test-wheel-manylinux`; needs root.
# Usage: tests/packaging/test_wheel_manylinux.sh WHEEL
set -euo pipefail

if [[ ${1:-} == --inside ]]; then
    root=$2 whl=$3
    mount -t proc proc "$root/proc"
    fail()
    {
        echo "test_wheel_manylinux: $*" >&2
        exit 1
    }
    for lib in libgrpc.so.29 liblmdb.so.0 libucp.so.0 libprotobuf-c.so.1 \
        liburing.so.2 libyaml-0.so.2 libmicrohttpd.so.12; do
        [[ ! -e $root/usr/lib/x86_64-linux-gnu/$lib ]] ||
            fail "the root has $lib: not a clean test"
    done
    mkdir -p "$root/opt/site"
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
        "$whl" "$root/opt/site"
    so=/opt/site/kvdepot/libkvdepot.so
    missing=$(chroot "$root" ldd "$so" | grep 'not found' || true)
    [[ -z $missing ]] || fail "unresolved: $missing"
    outside=$(chroot "$root" ldd "$so" | awk '/=> \//{print $3}' |
        grep -v '^/opt/site/kvdepot/../kvdepot.libs/\|^/opt/site/kvdepot.libs/' |
        grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libz|libpthread|libdl|librt)\.so' ||
        true)
    [[ -z $outside ]] || fail "libraries from outside the wheel: $outside"
    chroot "$root" env -u KVDEPOT_LIB PYTHONPATH=/opt/site python3 - <<'PY' ||
import os
from kvdepot import _lib
path = _lib.lib()._name
assert path.startswith("/opt/site/kvdepot/"), path
st = _lib.Store({"store.arena_size": "16m", "store.arena_chunk": "4m"})
try:
    ns = _lib.namespace("m", 1, 0, 0, 1, 1, 64, 16)
    assert st.delete(ns, [b"\x01" * 32]) == 0
    assert st.events_enable(8)
finally:
    st.close()
print("kvdepot loaded from", path)
PY
        fail "the package did not load or use its library"
    exit 0
fi

whl=$(realpath "${1:?usage: $0 WHEEL}")
if [[ $(id -u) -ne 0 ]]; then
    echo "test_wheel_manylinux: needs root (mmdebstrap, chroot)" >&2
    exit 1
fi
case "$whl" in
*-manylinux_*.whl) ;;
*) echo "test_wheel_manylinux: not a manylinux wheel: $whl" >&2; exit 1 ;;
esac
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvdepot-whl.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
"$src/scripts/debian-root.sh" "$tmp/root" --include=python3
unshare --mount --pid --fork --kill-child "$0" --inside "$tmp/root" "$whl"
echo "test_wheel_manylinux: $(basename "$whl") loads and opens a store in a Debian" \
    "root without kvdepot's libraries ($((SECONDS - start)) s)"
