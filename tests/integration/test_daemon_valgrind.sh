#!/bin/sh
# kvdepotd's start and stop path under valgrind's memcheck, twice on the
# same NVMe directory: the daemon starts with every listener and tier a
# deployment uses (unix socket, TCP with a token, /metrics, the NVMe tier
# with write-through); the first run stores a 100 KiB object through one
# client session and stops on SIGTERM; the second starts from the index,
# reads the object back from disk byte for byte and stops. Each run must
# exit 0 with no memcheck error and no block definitely or indirectly lost.
# A third run maps a tenant arena (server.tenant_arenas) for its client.
# Still-reachable memory is what Debian's gRPC and OpenSSL keep for the
# process's lifetime, not a leak.
# The NVMe tier runs its thread-pool engine: valgrind 3.19 does not follow
# io_uring's shared rings (the daemon waits forever for completions it
# cannot see), and the pool is the same tier code path with pread/pwrite.
# Skipped (77) without valgrind.
#
# usage: test_daemon_valgrind.sh PATH/TO/kvdepot PATH/TO/kvdepotd
set -u

KVDEPOT=${1:?usage: $0 PATH/TO/kvdepot PATH/TO/kvdepotd}
KVDEPOTD=${2:?usage: $0 PATH/TO/kvdepot PATH/TO/kvdepotd}
command -v valgrind >/dev/null 2>&1 || {
    echo "valgrind not installed: skipped"
    exit 77
}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvd_valgrind.XXXXXX") || exit 1
DPID=
cleanup() {
    if [ -n "$DPID" ]; then
        kill -KILL "$DPID" 2>/dev/null
        wait "$DPID" 2>/dev/null
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 1' HUP INT PIPE TERM

die() {
    echo "FAIL: $*" >&2
    [ -f "$WORK/daemon.log" ] && sed 's/^/  daemon: /' "$WORK/daemon.log" >&2
    [ -f "$WORK/vg.log" ] && sed 's/^/  valgrind: /' "$WORK/vg.log" >&2
    exit 1
}

SOCK="$WORK/d.sock"
printf 'valgrind-test-token\n' >"$WORK/token"
mkdir "$WORK/disk"

# start_daemon RUN [--set KEY=VALUE ...]: kvdepotd under memcheck, ready
# within 60 s.
start_daemon() {
    run=$1
    shift
    rm -f "$WORK/ready"
    valgrind --tool=memcheck --leak-check=full \
        --show-leak-kinds=definite,indirect \
        --errors-for-leak-kinds=definite,indirect --error-exitcode=99 \
        --log-file="$WORK/vg.log" \
        "$KVDEPOTD" --set server.unix_socket="$SOCK" \
        --set server.tcp_address=127.0.0.1:0 \
        --set server.token_file="$WORK/token" \
        --set server.metrics_address=127.0.0.1:0 \
        --set store.arena_size=64m --set store.arena_prefault=false \
        --set store.disk_path="$WORK/disk" --set store.disk_size=64m \
        --set store.disk_write=through --set store.disk_engine=threads \
        --set log.level=warn "$@" \
        --ready-file "$WORK/ready" >"$WORK/daemon.log" 2>&1 &
    DPID=$!
    i=0
    while [ ! -s "$WORK/ready" ] && [ $i -lt 600 ]; do
        kill -0 "$DPID" 2>/dev/null || {
            DPID=
            die "run $run: kvdepotd exited at start"
        }
        sleep 0.1
        i=$((i + 1))
    done
    [ -s "$WORK/ready" ] || die "run $run: kvdepotd not ready after 60 s"
}

# stop_daemon RUN: SIGTERM, exit 0, memcheck clean.
stop_daemon() {
    kill -TERM "$DPID"
    wait "$DPID"
    rc=$?
    DPID=
    [ "$rc" -eq 0 ] ||
        die "run $1: kvdepotd under valgrind exited $rc (99: memcheck errors)"
    grep -q "ERROR SUMMARY: 0 errors" "$WORK/vg.log" ||
        die "run $1: memcheck reported errors"
    grep -E -q "definitely lost: 0 bytes|no leaks are possible" \
        "$WORK/vg.log" || die "run $1: memory definitely lost"
}

NS=00112233445566778899aabbccddeeff
HASH=0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0
head -c 102400 /dev/urandom >"$WORK/in.bin"

start_daemon 1
"$KVDEPOT" put --address "unix:$SOCK" --timeout 20s --namespace "$NS" \
    --hash "$HASH" "$WORK/in.bin" >"$WORK/out" 2>&1 ||
    die "put failed: $(cat "$WORK/out")"
stop_daemon 1

start_daemon 2
"$KVDEPOT" get --address "unix:$SOCK" --timeout 20s --namespace "$NS" \
    --hash "$HASH" "$WORK/back.bin" >"$WORK/out" 2>&1 ||
    die "get from disk failed: $(cat "$WORK/out")"
cmp -s "$WORK/in.bin" "$WORK/back.bin" || die "get returned other bytes"
stop_daemon 2

# Run 3: tenant arenas. This user is team-a, whose arena is a memfd of its
# own mapped after the main one; the CLI is handed that memfd only. A put
# and a get through it, then the stop unmaps both partitions.
start_daemon 3 --set server.tenants="$(id -u)=team-a" \
    --set server.tenant_arenas=team-a=8m --set store.arena_chunk=4m
"$KVDEPOT" put --address "unix:$SOCK" --timeout 20s --namespace "$NS" \
    --hash "$HASH" "$WORK/in.bin" >"$WORK/out" 2>&1 ||
    die "put into a tenant arena failed: $(cat "$WORK/out")"
"$KVDEPOT" get --address "unix:$SOCK" --timeout 20s --namespace "$NS" \
    --hash "$HASH" "$WORK/back3.bin" >"$WORK/out" 2>&1 ||
    die "get from a tenant arena failed: $(cat "$WORK/out")"
cmp -s "$WORK/in.bin" "$WORK/back3.bin" ||
    die "get from a tenant arena returned other bytes"
stop_daemon 3
echo "kvdepotd: three starts (the last with a tenant arena), two puts, two" \
    "gets (one from NVMe), three stops: memcheck clean"
