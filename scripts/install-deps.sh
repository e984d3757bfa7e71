#!/usr/bin/env bash
# Installs the Debian 12 packages that kvdepot's build, test suite and demo need,
# and nothing else. Idempotent and quiet: packages already present are skipped, so a
# machine that has everything costs one dpkg-query and no apt run at all.
#
# Usage: scripts/install-deps.sh [--check]
#   --check  only report what is missing (exit 1 if anything is)
set -euo pipefail

# Build toolchain and code generators.
pkgs=(
    build-essential cmake ninja-build pkg-config
    clang libclang-rt-14-dev clang-format clang-tidy
    protobuf-c-compiler
)
# Libraries the C code links (docs/building.md; every one found with pkg-config).
pkgs+=(
    libucx-dev liburing-dev liblmdb-dev libprotobuf-c-dev libgrpc-dev
    libssl-dev libxxhash-dev libyaml-dev libmicrohttpd-dev libcmocka-dev
)
# kvdepotd's systemd notifications (optional for the build: without it the
# daemon's unit file is Type=exec; the notify test then skips).
pkgs+=(libsystemd-dev)
# Tests: block-hash vectors are checked against Python's cbor2 + hashlib;
# the vLLM connector shim is driven with real torch CPU tensors.
pkgs+=(python3 python3-cbor2 python3-pytest python3-torch python3-numpy)
# kvdepotd's interop test: a Python gRPC client generated from the .proto.
pkgs+=(python3-grpcio python3-protobuf protobuf-compiler)
# kvdepotd's /metrics is parsed with Prometheus's own client library, and
# deploy/monitoring's dashboard and rules are read with PyYAML. (promtool is
# used too when present, but its package, prometheus, installs and starts a
# Prometheus server, so it is not installed here.)
pkgs+=(python3-prometheus-client python3-yaml)
# Benchmarks run their peers in the same run (bench/README.md): fio for NVMe,
# redis-server (driven through hiredis) for the daemon.
pkgs+=(fio redis-server libhiredis-dev)
# ucx_perftest (ucx-utils) for the cluster data plane (bench_cluster).
pkgs+=(ucx-utils)
# make soak reads the daemon's /metrics; test_daemon_valgrind runs kvdepotd
# under memcheck; test_partition drops packets between cluster nodes with
# iptables (this kernel has no tc netem).
pkgs+=(curl valgrind iptables)
# The cluster: etcd's protos (golang-etcd-server-dev, compiled at build time)
# and the etcd server the cluster tests start.
pkgs+=(golang-etcd-server-dev etcd-server)

missing=()
for p in "${pkgs[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi
if [[ "${1:-}" == "--check" ]]; then
    echo "missing Debian packages: ${missing[*]}"
    exit 1
fi

echo "install-deps: installing ${missing[*]}"
sudo=()
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || {
        echo "install-deps: need root or sudo to install: ${missing[*]}" >&2
        exit 1
    }
    sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
