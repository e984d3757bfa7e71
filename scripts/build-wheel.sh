#!/usr/bin/env bash
# Builds the kvdepot wheel with libkvdepot.so inside: a platform wheel
# (py3-none-linux_<arch>) whose package finds its library next to itself,
# no KVDEPOT_LIB needed. The library links Debian's shared libraries
# (gRPC, protobuf-c, LMDB, liburing, UCX, OpenSSL, xxHash, libyaml); they
# are not vendored: the Debian packages that hold them are written into
# kvdepot/DEBIAN_DEPENDS (one per line) and named by the package when the
# library cannot be loaded. The wheel says so in its tag (linux_*, not
# manylinux): it runs where those packages are installed (Debian 12 and
# what shares its libraries).
#
# usage: scripts/build-wheel.sh LIBKVDEPOT_SO OUT_DIR
set -euo pipefail

so=${1:?usage: $0 LIBKVDEPOT_SO OUT_DIR}
out=${2:?usage: $0 LIBKVDEPOT_SO OUT_DIR}
src=$(cd "$(dirname "$0")/.." && pwd)
[[ -f "$so" ]] || { echo "build-wheel: no library at $so" >&2; exit 1; }
mkdir -p "$out"
stage=$(mktemp -d "${TMPDIR:-/tmp}/kvd_wheel.XXXXXX")
trap 'rm -rf "$stage"' EXIT

cp "$src/python/pyproject.toml" "$src/python/setup.py" "$src/python/README.md" "$stage/"
cp -r "$src/python/kvdepot" "$stage/kvdepot"
find "$stage/kvdepot" -name '__pycache__' -prune -exec rm -rf {} +
install -m 0755 "$so" "$stage/kvdepot/libkvdepot.so"
strip --strip-unneeded "$stage/kvdepot/libkvdepot.so" 2>/dev/null || true

# The Debian packages of the shared libraries the library needs (those not
# in libc6 itself).
deps=$(ldd "$stage/kvdepot/libkvdepot.so" | awk '/=> \//{print $3}' |
    while read -r lib; do
        dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true
    done | cut -d: -f1 | sort -u | grep -v -x -e libc6 -e libgcc-s1 || true)
printf '%s\n' $deps >"$stage/kvdepot/DEBIAN_DEPENDS"

/usr/bin/python3 -m pip wheel -q --no-deps --no-build-isolation -w "$out" "$stage" >&2
ls "$out"/kvdepot-*.whl
