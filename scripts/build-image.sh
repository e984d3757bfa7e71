#!/usr/bin/env bash
# The kvdepotd container image, from Debian's packages only (no registry is
# needed): a minbase Debian 12 root made by mmdebstrap with the kvdepot .deb
# installed in it, so the image holds the runtime profile's libraries and
# nothing of the build; imported into podman with the entrypoint, user and
# stop signal of deploy/container/Dockerfile, and saved as an OCI archive
# that `podman load` or `docker load` reads.
#   user kvdepot, uid/gid 990 (KVDEPOT_UID / KVDEPOT_GID), created before
#   the .deb so that host directories can be given to a fixed id
# Usage: scripts/build-image.sh DEB OUT.tar [TAG]   (TAG: kvdepotd:VERSION)
# Needs root (mmdebstrap) and podman.
set -euo pipefail
if [[ $# -lt 2 ]]; then
    echo "usage: $0 DEB OUT.tar [TAG]" >&2
    exit 2
fi
deb=$(realpath "$1")
out=$2
version=$(dpkg-deb -f "$deb" Version)
tag=${3:-kvdepotd:$version}
uid=${KVDEPOT_UID:-990}
gid=${KVDEPOT_GID:-990}
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvdepot-image.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# base-passwd (essential) has written /etc/passwd and /etc/group when the
# essential hook runs; the .deb's postinst then finds the user and only
# creates its directories. The last customize hooks drop what a running daemon
# never reads: apt's lists and caches, documentation.
"$src/scripts/debian-root.sh" "$tmp/rootfs.tar" \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/kvdepot/*' \
    --essential-hook="echo 'kvdepot:x:$gid:' >> \"\$1/etc/group\"" \
    --essential-hook="echo 'kvdepot:x:$uid:$gid:kvdepot store daemon:/var/lib/kvdepot:/usr/sbin/nologin' >> \"\$1/etc/passwd\"" \
    --customize-hook="copy-in $deb /tmp" \
    --customize-hook="chroot \"\$1\" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends /tmp/$(basename "$deb")" \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/tmp/*' \
    --customize-hook="test \"\$(chroot \"\$1\" id -u kvdepot)\" = $uid"

podman import --quiet \
    --change 'USER kvdepot' \
    --change 'WORKDIR /var/lib/kvdepot' \
    --change 'STOPSIGNAL SIGTERM' \
    --change 'ENTRYPOINT ["/usr/sbin/kvdepotd", "--config", "/etc/kvdepot/kvdepotd.yaml"]' \
    --change 'CMD []' \
    --change "LABEL org.opencontainers.image.title=kvdepotd org.opencontainers.image.version=$version" \
    "$tmp/rootfs.tar" "$tag" >/dev/null
mkdir -p "$(dirname "$out")"
rm -f "$out"
podman save --quiet --format oci-archive -o "$out" "$tag"
echo "image $tag: $out ($(du -h "$out" | cut -f1)), user kvdepot ($uid:$gid)"
