#!/usr/bin/env bash
# Downloads, on this Debian 12 machine, the Debian packages a GPU machine
# needs to build kvdepot's C library, its GPU tests, benchmarks and demo
# (scripts/gpu-check.sh unpacks them there into a prefix): the C build
# dependencies with their library closure, protoc-c, and the etcd sources
# that hold the protos the cluster client is generated from. The GPU
# machines this project is lent run another distribution with CUDA and no
# package registry, so the packages travel with the working tree.
#
# Packages every Linux system has (the C library, libstdc++, zlib, ...) are
# left out. Writes .gpu-deps/debs/ (ignored by git); prints the total size.
#
# usage: scripts/gpu-deps.sh
set -euo pipefail
cd "$(dirname "$0")/.."

roots=(
    libucx-dev liburing-dev liblmdb-dev libprotobuf-c-dev libgrpc-dev
    libssl-dev libxxhash-dev libyaml-dev libmicrohttpd-dev libcmocka-dev
    protobuf-c-compiler
)
# Present on any glibc system, or never needed to build and run the tests.
base=" libc6 libc6-dev libgcc-s1 libstdc++6 gcc-12-base zlib1g perl-base
 debconf dpkg tar libcrypt1 libcrypt-dev libnsl-dev libtirpc-dev
 linux-libc-dev libzstd1 liblzma5 libbz2-1.0 libselinux1 libpcre2-8-0
 libtinfo6 libacl1 libattr1 libaudit1 libaudit-common libcap-ng0 libmd0
 libdebconfclient0 libpam0g libpam-modules libpam-runtime libsemanage2
 libsepol2 libsemanage-common coreutils lsb-base sysvinit-utils
 libsystemd0 libgcrypt20 libgpg-error0 liblz4-1 libcap2 adduser passwd
 login libuuid1 util-linux mount libmount1 libblkid1 libsmartcols1
 libudev1 libncursesw6 libext2fs2 e2fsprogs libcom-err2 libss2 logsave "

closure=$(apt-cache depends --recurse --no-recommends --no-suggests \
    --no-conflicts --no-breaks --no-replaces --no-enhances "${roots[@]}" |
    grep '^[a-z0-9]' | sort -u)
pkgs=()
for p in $closure; do
    [[ "$base" == *" $p "* ]] && continue
    # Virtual packages have no candidate to download.
    apt-cache show --no-all-versions "$p" >/dev/null 2>&1 || continue
    pkgs+=("$p")
done
pkgs+=(golang-etcd-server-dev) # its .proto files only, not its Go deps

# Download into a new folder and replace the old one only when every
# package came: a failed download leaves the last complete set in place.
# Stale package lists (a version the mirror no longer has) are refreshed
# once, then the download is tried again.
rm -rf .gpu-deps/new
mkdir -p .gpu-deps/new
download() {
    # As root apt cannot drop to its sandbox user here; that is harmless.
    (cd .gpu-deps/new && apt-get download -qq "${pkgs[@]}") \
        2> >(grep -v 'unsandboxed' >&2)
}
if ! download; then
    echo "gpu-deps: download failed; refreshing the package lists" >&2
    apt-get update -qq
    rm -f .gpu-deps/new/*.deb
    download
fi
rm -rf .gpu-deps/debs
mv .gpu-deps/new .gpu-deps/debs
echo "gpu-deps: ${#pkgs[@]} packages, $(du -sh .gpu-deps/debs | cut -f1) in .gpu-deps/debs"
