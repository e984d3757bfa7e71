#!/usr/bin/env bash
# Builds kvdepot with CUDA on a GPU machine and runs what needs the GPU:
# the CUDA kernel and worker tests, the worker and demo tests, the kernel
# and worker benchmarks and the demo (its KV cache in GPU memory). Meant
# for a machine with nvcc, cmake, ninja and python3 but no Debian
# packages: the packages scripts/gpu-deps.sh downloaded into
# .gpu-deps/debs/ are unpacked into a prefix and used from there.
#
# Each step's log goes to $OUT/logs/ (default ./gpu-check-out; the device
# tool's own $OUT brings it back), packed at the end into $OUT/logs.tar.gz;
# a summary line per step goes to $OUT/summary.txt, and $OUT/results.txt
# holds the machine, the commit and every headline (BENCH) line: the file
# docs/performance.md quotes. After the set-up a failed step does not stop
# the next. The demo's store goes to a temporary directory.
#
# usage: scripts/gpu-check.sh [--build-only]
# env:   KVD_DEPS_PREFIX (default /opt/kvd-deps), CUDA_ARCH (default 90),
#        OUT, JOBS (default: the CPU count), GPU_CHECK_STEPS (the steps to
#        run after the set-up, by name; default all: nvidia-smi gpu-tests
#        sanitize-kernels sanitize-worker racecheck-kernels bench-kernels
#        ncu-kernels bench-worker bench-saves demo ttft-hf), TTFT_HF_ARGS (flags for
#        bench/ttft_hf.py, e.g. "--models 8b --sizes 16k"), TTFT_HF_TIMEOUT
#        (seconds, default 300), GPU_CHECK_TARGETS (the build's targets
#        instead of all the steps need, e.g. "kvdepot kvdepotd" for ttft-hf),
#        GPU_CHECK_DEADLINE (seconds from the start: after the set-up, each
#        step is stopped at it and none starts past it, leaving 10 s to
#        write the results; set it under the device run's own limit, which
#        would kill the script before it packs anything)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
prefix=${KVD_DEPS_PREFIX:-/opt/kvd-deps}
out=${OUT:-$root/gpu-check-out}
jobs=${JOBS:-$(nproc)}
logs=$out/logs
mkdir -p "$logs"
summary="$out/summary.txt"
: >"$summary"

step() { # step NAME COMMAND...: runs it, logs it, records its status
    local name=$1
    shift
    if [[ -n "${GPU_CHECK_STEPS:-}" && " $GPU_CHECK_STEPS " != *" $name "* &&
        $name != setup ]]; then
        return 0
    fi
    local t0=$SECONDS
    local left=0
    if [[ -n "${GPU_CHECK_DEADLINE:-}" && $name != setup ]]; then
        left=$((GPU_CHECK_DEADLINE - 10 - SECONDS))
        if ((left < 5)); then
            printf '%-16s skipped: GPU_CHECK_DEADLINE (%ss) reached\n' \
                "$name" "$GPU_CHECK_DEADLINE" | tee -a "$summary"
            return 0
        fi
    fi
    if ((left > 0)); then
        timeout "$left" "$@" >"$logs/$name.log" 2>&1
    else
        "$@" >"$logs/$name.log" 2>&1
    fi
    local rc=$?
    printf '%-16s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" \
        "$(tail -n 1 "$logs/$name.log" | cut -c1-120)" | tee -a "$summary"
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
    fix_links
}

# A -dev package's absolute link (libz.so -> /lib/.../libz.so.1.2.13)
# points into this machine's root, not the prefix, and the library it
# names may be left out of the packages (every system has zlib): point it
# at the prefix's copy, else at the system's library of the same soname,
# else remove it, so the linker never falls back to a static archive.
fix_links() {
    local l t so
    while IFS= read -r l; do
        t=$(readlink "$l")
        if [[ -e "$prefix$t" ]]; then
            ln -sfn "$prefix$t" "$l"
            continue
        fi
        so=$(basename "$t" | sed -E 's/(\.so\.[0-9]+).*/\1/')
        if [[ -e /usr/lib/x86_64-linux-gnu/$so ]]; then
            ln -sfn "/usr/lib/x86_64-linux-gnu/$so" "$l"
        elif [[ -e /lib/x86_64-linux-gnu/$so ]]; then
            ln -sfn "/lib/x86_64-linux-gnu/$so" "$l"
        else
            rm -f "$l"
        fi
        echo "link $l -> $(readlink "$l")"
    done < <(find "$prefix" -type l -lname '/*')
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

gpu_tests_re='test_cuda_|test_worker_|test_demo_'

build() {
    # The GPU step's tests are whatever ctest lists under its pattern (a
    # test's target has its name), so a test added later is built too.
    local tests
    tests=$(ctest --test-dir build/gpu -N -R "$gpu_tests_re" |
        sed -n 's/^ *Test *#[0-9]*: *//p')
    [[ -n "$tests" ]] || {
        echo "ctest lists no test matching $gpu_tests_re"
        return 1
    }
    # -k 0: a target that fails to build leaves the others to run.
    # shellcheck disable=SC2086
    cmake --build build/gpu -j "$jobs" --target \
        ${GPU_CHECK_TARGETS:-$tests bench_kernels bench_worker bench_saves \
        kvdepot-demo kvdepot kvdepotd} -- -k 0
}

setup() {
    unpack && configure && build
}

step setup setup || exit 1
[[ "${1:-}" == "--build-only" ]] && exit 0

step nvidia-smi nvidia-smi
step gpu-tests ctest --test-dir build/gpu --output-on-failure -R \
    "$gpu_tests_re"
# The kernel and worker GPU tests again under compute-sanitizer's memcheck
# (out-of-bounds and misaligned accesses, leaks) and racecheck (shared
# memory hazards; the RoPE suite too, whose fused scatter reuses the
# codec's shared memory for its table), bounded in time: a sanitizer run
# is many times slower.
if command -v compute-sanitizer >/dev/null; then
    step sanitize-kernels timeout 150 compute-sanitizer --tool memcheck \
        --leak-check full --error-exitcode 9 build/gpu/tests/test_cuda_kernels
    step sanitize-worker timeout 60 compute-sanitizer --tool memcheck \
        --error-exitcode 9 build/gpu/tests/test_cuda_worker
    step racecheck-kernels sh -c 'timeout 120 compute-sanitizer --tool racecheck \
        --error-exitcode 9 build/gpu/tests/test_cuda_kernels &&
        timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 \
        build/gpu/tests/test_cuda_rope'
fi
step bench-kernels build/gpu/bench/bench_kernels
# Nsight Compute on the encoding kernels that miss their targets: the
# first gather launch (layer 0) and the first scatter launch (launch 8:
# the bench has 8 layers) of fp8 and tq4, from the bench's untimed round.
if command -v ncu >/dev/null; then
    step ncu-kernels sh -c 'for c in fp8_e4m3 tq4; do
        KVDEPOT_BENCH_SKIP_CPU=1 KVDEPOT_BENCH_GPU_CODECS=$c timeout 120 \
            ncu --kernel-name regex:kvd_gs_kernel --launch-skip 0 \
            --launch-count 9 --section SpeedOfLight --section Occupancy \
            --section LaunchStats --section WarpStateStats \
            --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
            build/gpu/bench/bench_kernels || exit 1
    done'
fi
# The raw rows again at several staging sizes (cuda_staging_blocks).
KVDEPOT_BENCH_CUDA_STAGING=${KVDEPOT_BENCH_CUDA_STAGING:-16,32,64,128} \
    step bench-worker build/gpu/bench/bench_worker
# Decode steps with saves in flight (async_saves) against steps without,
# host then CUDA backend (failpoints are on in this RelWithDebInfo build).
step bench-saves timeout 150 build/gpu/bench/bench_saves
demo_dir=$(mktemp -d)
step demo build/gpu/demo/kvdepot-demo --dir "$demo_dir/store"
rm -rf "$demo_dir"
# A real model runner, where the machine has one (PyTorch + transformers).
if [[ -f bench/ttft_hf.py ]] &&
    python3 -c 'import torch, transformers' >/dev/null 2>&1; then
    KVDEPOT_LIB=$root/build/gpu/libkvdepot.so \
        KVDEPOTD=$root/build/gpu/server/kvdepotd PYTHONPATH=$root/python \
        step ttft-hf timeout "${TTFT_HF_TIMEOUT:-300}" python3 bench/ttft_hf.py \
        ${TTFT_HF_ARGS:-} --out "$out/ttft_hf.txt"
fi

{
    echo "# kvdepot gpu-check $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "commit: $(git describe --always --dirty 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    echo "nvcc: $(nvcc --version | tail -n 1)"
    echo
    cat "$summary"
    echo
    grep -h '^BENCH' "$logs"/*.log
} >"$out/results.txt" 2>&1
tar -czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$logs"
echo "gpu-check: $out/results.txt, logs in $out/logs.tar.gz"
