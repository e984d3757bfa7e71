#!/usr/bin/env bash
# Installs the build tree into a temporary prefix and builds a program
# against it the way a user would: through pkg-config, once against
# libkvdepot.so and once against libkvdepot.a. Checks that the installed
# headers compile on their own, the .pc file is relocatable, and only kvd_*
# symbols are exported. Then the daemon's packaging: kvdepotd, its systemd
# unit and the example configuration are installed, the example sets every
# key (--print-config), and the installed daemon starts with it.
# Usage: test_install.sh BUILD_DIR
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
daemon_pid=
cleanup()
{
    if [ -n "$daemon_pid" ]; then
        kill -KILL "$daemon_pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
pkg-config --exists kvdepot
test "$(pkg-config --modversion kvdepot)" = "$(sed -n 's/^Version: //p' \
    "$PKG_CONFIG_PATH/kvdepot.pc")"

cat >"$tmp/use.c" <<'C'
#include <kvdepot/common.h>
#include <kvdepot/kernels.h>
#include <stdio.h>
#include <string.h>
int main(void)
{
    kvd_block_hash_t root;
    if (kvd_block_hash_seed(KVD_BLOCK_HASH_DEFAULT_SEED, &root) != KVD_OK) {
        return 1;
    }
    kvd_codec_t codec;
    if (kvd_codec_parse("tq4", &codec) != KVD_OK || codec != KVD_CODEC_TQ4) {
        return 1;
    }
    printf("%s\n", kvd_version());
    return 0;
}
C
cc_flags=(-std=c11 -Wall -Wextra -Werror)
gcc "${cc_flags[@]}" "$tmp/use.c" $(pkg-config --cflags --libs kvdepot) \
    -Wl,-rpath,"$tmp/prefix/lib" -o "$tmp/use_shared"
test "$("$tmp/use_shared")" = "$(pkg-config --modversion kvdepot)"

static_libs=$(pkg-config --static --libs kvdepot | sed 's/-lkvdepot/-l:libkvdepot.a/')
gcc "${cc_flags[@]}" "$tmp/use.c" $(pkg-config --cflags kvdepot) $static_libs \
    -o "$tmp/use_static"
test "$("$tmp/use_static")" = "$(pkg-config --modversion kvdepot)"

leaked=$(nm -D --defined-only "$tmp/prefix/lib/libkvdepot.so" \
    | awk '{print $3}' | grep -v '^kvd_' || true)
if [ -n "$leaked" ]; then
    echo "symbols exported without the kvd_ prefix:"; echo "$leaked"; exit 1
fi

# --- kvdepotd packaging ----------------------------------------------------
prefix=$tmp/prefix
kvdepotd=$prefix/sbin/kvdepotd
unit=$prefix/lib/systemd/system/kvdepotd.service
example=$prefix/share/kvdepot/kvdepotd.yaml
test -x "$kvdepotd"
cmp "$unit" "$src/deploy/systemd/kvdepotd.service"
cmp "$example" "$src/deploy/config/kvdepotd.yaml"
grep -qx 'ExecStart=/usr/local/sbin/kvdepotd --config /etc/kvdepot/kvdepotd.yaml' \
    "$unit"

# KVDEPOT_* variables outrank the file; none may leak in from the caller.
for v in $(compgen -e | grep '^KVDEPOT_' || true); do
    unset "$v"
done
"$kvdepotd" --config "$example" --print-config >"$tmp/print-config"
# The example sets every key the daemon has; server.token_file,
# cluster.token_file and store.token_file alone stay commented out (paths of
# secrets the administrator provides).
unset_keys=$(grep -v 'from: file)$' "$tmp/print-config" | cut -d' ' -f1 |
    sort | tr '\n' ' ')
if [ "$unset_keys" != "cluster.token_file server.token_file store.token_file " ]; then
    echo "keys the example config does not set:"; echo "$unset_keys"; exit 1
fi

# --print-config only shows the text: the values are parsed and checked at
# start. Start the installed daemon on the example, with the paths and sizes
# that belong to a real node moved into the temporary directory.
"$kvdepotd" --config "$example" \
    --set server.unix_socket="$tmp/kvdepotd.sock" \
    --set server.metrics_address=127.0.0.1:0 \
    --set store.disk_path="$tmp/nvme" \
    --set store.arena_size=64m --set store.disk_size=64m \
    --ready-file "$tmp/ready" 2>"$tmp/kvdepotd.log" &
daemon_pid=$!
for _ in $(seq 300); do
    if [ -f "$tmp/ready" ] || ! kill -0 "$daemon_pid" 2>/dev/null; then
        break
    fi
    sleep 0.1
done
if [ ! -f "$tmp/ready" ]; then
    echo "kvdepotd did not start with the example configuration:"
    cat "$tmp/kvdepotd.log"; exit 1
fi
test -S "$tmp/kvdepotd.sock"
test -S "$tmp/kvdepotd.sock.shm"
kill -TERM "$daemon_pid"
rc=0
wait "$daemon_pid" || rc=$?
daemon_pid=
if [ "$rc" -ne 0 ]; then
    echo "kvdepotd exited $rc after SIGTERM:"; cat "$tmp/kvdepotd.log"; exit 1
fi
echo "install: shared and static links work, exports are kvd_* only;" \
    "kvdepotd, its unit and example config install, and it starts on them"
