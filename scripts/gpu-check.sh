#!/usr/bin/env bash
# Builds kvdepot with CUDA on a GPU machine and runs what needs the GPU:
# the CUDA kernel and worker tests, the worker and demo tests, the kernel
# and worker benchmarks and the demo (its KV cache in GPU memory). Meant
# for a machine with nvcc, cmake, ninja and python3 but no Debian
# packages: the packages scripts/gpu-deps.sh downloaded into
# .gpu-deps/debs/ are unpacked into a prefix and used from there.
#
# Each step's output goes to $OUT (default ./gpu-check-out; the device
# tool's own $OUT brings them back), one log per step (seven files), and a
# summary line per step to $OUT/summary.txt; after the set-up a failed step
# does not stop the next. The demo's store goes to a temporary directory.
#
# usage: scripts/gpu-check.sh [--build-only]
# env:   KVD_DEPS_PREFIX (default /opt/kvd-deps), CUDA_ARCH (default 90),
#        OUT, JOBS (default: the CPU count)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
prefix=${KVD_DEPS_PREFIX:-/opt/kvd-deps}
out=${OUT:-$root/gpu-check-out}
jobs=${JOBS:-$(nproc)}
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"

step() { # step NAME COMMAND...: runs it, logs it, records its status
    local name=$1
    shift
    local t0=$SECONDS
    "$@" >"$out/$name.log" 2>&1
    local rc=$?
    printf '%-16s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" \
        "$(tail -n 1 "$out/$name.log" | cut -c1-120)" | tee -a "$summary"
    return $rc
}

unpack() {
    ls .gpu-deps/debs/*.deb >/dev/null 2>&1 || {
        echo "no .gpu-deps/debs/*.deb: run scripts/gpu-deps.sh where apt works"
        return 1
    }
    mkdir -p "$prefix"
    for d in .gpu-deps/debs/*.deb; do
        if command -v dpkg-deb >/dev/null; then
            dpkg-deb -x "$d" "$prefix" || return 1
        else
            (cd "$(mktemp -d)" && ar x "$root/$d" &&
                tar -xf data.tar.* -C "$prefix") || return 1
        fi
    done
    echo "unpacked $(ls .gpu-deps/debs/*.deb | wc -l) packages into $prefix"
}

lib=$prefix/usr/lib/x86_64-linux-gnu
export PKG_CONFIG_SYSROOT_DIR=$prefix
export PKG_CONFIG_LIBDIR=$lib/pkgconfig:$prefix/usr/share/pkgconfig
export LD_LIBRARY_PATH=$lib:$prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$prefix/usr/bin:$PATH
# pkg-config leaves out -L for what it takes as the system's library
# directory, and gRPC's .pc names some libraries (re2, upb, c-ares) only
# as -l: the compiler driver and CMake must search the prefix too.
export LIBRARY_PATH=$lib${LIBRARY_PATH:+:$LIBRARY_PATH}
export CMAKE_LIBRARY_PATH=$lib
export UCX_MODULE_DIR=$lib/ucx
export UCX_NET_DEVICES=lo UCX_TLS=tcp

configure() {
    cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DKVD_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" \
        -DKVD_ETCD_PROTO_ROOT="$prefix/usr/share/gocode/src/go.etcd.io/etcd"
}

build() {
    # -k 0: a target that fails to build leaves the others to run.
    cmake --build build/gpu -j "$jobs" --target test_cuda_device \
        test_cuda_kernels test_cuda_worker test_cuda_worker_fake \
        test_worker_roundtrip test_worker_async test_worker_plans \
        test_worker_errors test_worker_steps test_demo_model \
        test_demo_roundtrip test_demo_cuda_fake bench_kernels bench_worker \
        kvdepot-demo kvdepot kvdepotd -- -k 0
}

setup() {
    unpack && configure && build
}

step setup setup || exit 1
[[ "${1:-}" == "--build-only" ]] && exit 0

step nvidia-smi nvidia-smi
step gpu-tests ctest --test-dir build/gpu --output-on-failure -R \
    'test_cuda_|test_worker_|test_demo_'
step bench-kernels build/gpu/bench/bench_kernels
step bench-worker build/gpu/bench/bench_worker
demo_dir=$(mktemp -d)
step demo build/gpu/demo/kvdepot-demo --dir "$demo_dir/store"
rm -rf "$demo_dir"
# Transformers' TTFT with kvdepot.hf at full size (the machine's own torch
# and transformers; bench/README.md).
step ttft-hf env PYTHONPATH="$root/python" \
    KVDEPOT_LIB="$root/build/gpu/libkvdepot.so" \
    KVDEPOTD="$root/build/gpu/server/kvdepotd" \
    python3 bench/ttft_hf.py --out "$out/ttft_hf.txt"
echo "gpu-check: logs in $out"
