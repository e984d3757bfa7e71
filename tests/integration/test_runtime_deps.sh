#!/bin/sh
# scripts/install-deps.sh's runtime profile covers what the built binaries
# load: every shared library kvdepotd, the kvdepot CLI and libkvdepot.so
# name (DT_NEEDED) comes from a package of that profile, or from libc6,
# libgcc-s1 or libstdc++6 (present on every Debian system); a sanitizer
# tree's own runtimes are left out. A library added
# to the build without its runtime package fails here, not on a machine
# that installed only the runtime profile.
#
# usage: test_runtime_deps.sh SRC_DIR BINARY...
set -u
src=${1:?usage: $0 SRC_DIR BINARY...}
shift
command -v readelf >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1 || {
    echo "test_runtime_deps: readelf and dpkg are needed (skipped)" >&2
    exit 77
}
allowed=$("$src/scripts/install-deps.sh" runtime --list) || exit 1
allowed="$allowed libc6 libgcc-s1 libstdc++6"
fails=0
# ldd once per binary and dpkg -S once per library path: each call is slow
# (a sanitizer binary's ldd, dpkg's whole file database), and the same
# libraries come back for every binary.
seen=$(mktemp)
trap 'rm -f "$seen"' EXIT
for bin in "$@"; do
    deps=$(ldd "$bin")
    for lib in $(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        case "$lib" in ld-linux*) continue ;; esac # the loader: libc6
        path=$(printf '%s\n' "$deps" | awk -v l="$lib" '$1 == l {print $3}')
        [ -n "$path" ] || { echo "FAIL: $bin: $lib not found" >&2; fails=$((fails + 1)); continue; }
        pkg=$(awk -v p="$path" '$1 == p {print $2}' "$seen")
        if [ -z "$pkg" ]; then
            pkg=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null || dpkg -S "$path" 2>/dev/null)
            pkg=${pkg%%:*}
            echo "$path ${pkg:--}" >>"$seen"
        fi
        [ "$pkg" = "-" ] && pkg=""
        case "$pkg" in libasan* | libubsan* | libtsan*) continue ;; esac # sanitizer trees
        case " $(echo $allowed) " in
        *" $pkg "*) ;;
        *)
            echo "FAIL: $(basename "$bin") needs $lib from ${pkg:-no package}, not in install-deps.sh's runtime profile" >&2
            fails=$((fails + 1))
            ;;
        esac
    done
done
[ "$fails" -eq 0 ] || exit 1
echo "test_runtime_deps: every library the binaries need is in the runtime profile"
