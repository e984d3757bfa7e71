#!/bin/sh
# The wheel: built from this tree's libkvdepot.so (scripts/build-wheel.sh),
# installed into a fresh virtualenv (Debian's site-packages visible for
# torch; nothing downloaded), and the connector tests run against the
# installed package with no KVDEPOT_LIB and no source tree on the path.
#
# usage: test_wheel.sh SRC_DIR PATH/TO/libkvdepot.so PATH/TO/kvdepotd
set -u
src=${1:?usage: $0 SRC_DIR LIBKVDEPOT_SO KVDEPOTD}
so=${2:?}
kvdepotd=${3:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/kvd_wheel_test.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 -c 'import wheel, setuptools' 2>/dev/null || {
    echo "test_wheel: python3-wheel and python3-setuptools are needed (skipped)" >&2
    exit 77
}
whl=$("$src/scripts/build-wheel.sh" "$so" "$work/dist") || exit 1
case "$whl" in
*-py3-none-linux_*.whl) ;;
*) echo "FAIL: wheel tag: $whl" >&2; exit 1 ;;
esac
/usr/bin/python3 -m venv --system-site-packages "$work/venv" || exit 1
"$work/venv/bin/python" -m pip install -q --no-deps --no-index "$whl" || exit 1
cd "$work" || exit 1
env -u KVDEPOT_LIB KVDEPOT_TEST_INSTALLED=1 KVDEPOTD="$kvdepotd" \
    "$work/venv/bin/python" -m pytest -q -p no:cacheprovider \
    "$src/tests/python/test_lib_handshake.py" \
    "$src/tests/python/test_trtllm_connector.py" \
    "$src/tests/python/test_vllm_connector.py"
