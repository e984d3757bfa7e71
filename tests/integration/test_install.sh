#!/usr/bin/env bash
# Installs the build tree into a temporary prefix and builds a program
# against it the way a user would: through pkg-config, once against
# libkvdepot.so and once against libkvdepot.a. Checks that the installed
# headers compile on their own, the .pc file is relocatable, and only kvd_*
# symbols are exported.
# Usage: test_install.sh BUILD_DIR
set -euo pipefail
build=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

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
echo "install: shared and static links work, exports are kvd_* only"
