#!/usr/bin/env bash
# A minimal Debian 12 root (mmdebstrap, variant minbase, bookworm with its
# updates and security suites) for the .deb test and the container image.
# Usage: scripts/debian-root.sh TARGET [MMDEBSTRAP_OPTION...]
#   TARGET  a directory, or a file NAME.tar for a tarball
# The options go to mmdebstrap before the suite, e.g. --include=./x.deb or
# --customize-hook=...; needs root (mmdebstrap's root mode).
set -euo pipefail
if [[ $# -lt 1 ]]; then
    echo "usage: $0 TARGET [MMDEBSTRAP_OPTION...]" >&2
    exit 2
fi
target=$1
shift
mirror=${KVDEPOT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${KVDEPOT_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
# Check-Valid-Until off: a mirror that serves a snapshot of the archive
# has Release files past their Valid-Until date.
# KVDEPOT_MMDEBSTRAP_VERBOSE=1 shows every step (and apt's output).
log=--quiet
if [[ -n ${KVDEPOT_MMDEBSTRAP_VERBOSE:-} ]]; then
    log=--verbose
fi
exec mmdebstrap "$log" --mode=root --variant=minbase \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$@" bookworm "$target" \
    "deb $mirror bookworm main" \
    "deb $mirror bookworm-updates main" \
    "deb $security bookworm-security main"
