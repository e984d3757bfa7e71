#!/usr/bin/env bash
# Installs the Debian 12 packages kvdepot needs, by profile, and nothing else.
# Idempotent and quiet: packages already present are skipped, so a machine
# that has everything costs one dpkg-query and no apt run at all.
#
# Usage: scripts/install-deps.sh [PROFILE] [--check | --list]
#   PROFILE  build    the toolchain and the -dev libraries: what compiling
#                     needs
#            runtime  the shared libraries kvdepotd, the kvdepot CLI and
#                     libkvdepot.so load: what a machine that only runs them
#                     needs (a .deb's dependencies)
#            test     (default) build + runtime + what the test suite, the
#                     demo and the benchmarks use: what `make demo` and
#                     `make test` need
#            bench    test + what `make bench-curves` and `make dashboard-png`
#                     use: matplotlib, and prometheus for the dashboard
#                     (Debian's package also installs a Prometheus service)
#            package  build + what `make deb`, `make image` and their tests
#                     use: mmdebstrap for a clean Debian root, podman (with
#                     runc) for the image
#   --check  only report what is missing (exit 1 if anything is)
#   --list   print the profile's packages, one per line, and exit
set -euo pipefail

profile=test
action=install
for arg in "$@"; do
    case "$arg" in
    build | runtime | test | bench | package) profile=$arg ;;
    --check) action=check ;;
    --list) action=list ;;
    *)
        echo "usage: $0 [build|runtime|test|bench|package] [--check|--list]" >&2
        exit 2
        ;;
    esac
done

# Shared libraries the binaries load at run time (what the -dev packages
# below pull in too); tests/integration/test_runtime_deps.sh checks that
# every library the built binaries need comes from one of these (or libc).
runtime_pkgs=(
    libgrpc29 libprotobuf-c1 liblmdb0 liburing2 libssl3 libxxhash0
    libyaml-0-2 libmicrohttpd12 libsystemd0 libucx0
)
# gRPC's own libraries, which a build without --as-needed (the sanitizer
# trees) names directly too.
runtime_pkgs+=(libabsl20220623 libre2-9 libc-ares2 zlib1g libatomic1)

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
# The cluster: etcd's protos (golang-etcd-server-dev, compiled at build time).
pkgs+=(golang-etcd-server-dev)
build_pkgs=("${pkgs[@]}")

pkgs=()
# Tests: block-hash vectors are checked against Python's cbor2 + hashlib;
# the vLLM connector shim is driven with real torch CPU tensors.
pkgs+=(python3 python3-cbor2 python3-pytest python3-torch python3-numpy)
# The wheel (make wheel, ctest python_wheel) and the engines' virtualenvs
# (make test-hf, test-vllm): pip, venv, setuptools and wheel.
pkgs+=(python3-pip python3-venv python3-setuptools python3-wheel)
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
# The etcd server the cluster tests start.
pkgs+=(etcd-server)
test_pkgs=("${pkgs[@]}")

# The .deb is built by CPack (cmake) and dpkg-deb; its test installs it into
# a Debian root made by mmdebstrap, and the image (the same root with the
# .deb in it) is imported and run by podman. runc: podman's default crun
# refuses hosts whose cgroups are in hybrid mode.
package_pkgs=(mmdebstrap podman runc)

case "$profile" in
build) pkgs=("${build_pkgs[@]}") ;;
runtime) pkgs=("${runtime_pkgs[@]}") ;;
test) pkgs=("${build_pkgs[@]}" "${runtime_pkgs[@]}" "${test_pkgs[@]}") ;;
bench) pkgs=("${build_pkgs[@]}" "${runtime_pkgs[@]}" "${test_pkgs[@]}"
    python3-matplotlib prometheus) ;;
package) pkgs=("${build_pkgs[@]}" "${package_pkgs[@]}") ;;
esac
if [[ $action == list ]]; then
    printf '%s\n' "${pkgs[@]}"
    exit 0
fi

missing=()
for p in "${pkgs[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi
if [[ $action == check ]]; then
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
