#!/bin/sh
# `kvdepot stats/put/get/ls/evict/drain/config/bench` end to end against a real kvdepotd started
# here: a random 100 KiB file put and got back byte for byte, `stats
# --json` counting it, the errors users get (absent key: exit 1; the same
# key put twice: "exists", exit 1; bad keys and options: exit 2; no daemon:
# exit 1) and a short bench that must finish without errors.
#
# usage: test_cli_daemon.sh PATH/TO/kvdepot PATH/TO/kvdepotd
set -u

KVDEPOT=${1:?usage: $0 PATH/TO/kvdepot PATH/TO/kvdepotd}
KVDEPOTD=${2:?usage: $0 PATH/TO/kvdepot PATH/TO/kvdepotd}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvd_cli_daemon.XXXXXX") || exit 1
DPID=
cleanup() {
    if [ -n "$DPID" ]; then
        kill -TERM "$DPID" 2>/dev/null
        wait "$DPID" 2>/dev/null
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 1' HUP INT PIPE TERM
FAILS=0

fail() {
    echo "FAIL: $*" >&2
    FAILS=$((FAILS + 1))
}

# run EXPECTED_RC ARGS...: runs kvdepot, keeps stdout/stderr in $WORK.
run() {
    want=$1
    shift
    "$KVDEPOT" "$@" >"$WORK/out" 2>"$WORK/err"
    rc=$?
    if [ "$rc" -ne "$want" ]; then
        fail "kvdepot $* exited $rc, expected $want"
        sed 's/^/  stdout: /' "$WORK/out" >&2
        sed 's/^/  stderr: /' "$WORK/err" >&2
    fi
}

# expect_text FILE TEXT: FILE (out or err) contains TEXT literally.
expect_text() {
    if ! grep -qF -- "$2" "$WORK/$1"; then
        fail "$1 lacks '$2'"
        sed "s/^/  $1: /" "$WORK/$1" >&2
    fi
}

# --- the daemon -----------------------------------------------------------
SOCK="$WORK/d.sock"
"$KVDEPOTD" --set server.unix_socket="$SOCK" --set store.arena_size=256m \
    --set store.arena_prefault=false --set log.level=warn \
    --ready-file "$WORK/ready" >"$WORK/daemon.log" 2>&1 &
DPID=$!
i=0
while [ ! -s "$WORK/ready" ] && [ $i -lt 100 ]; do
    if ! kill -0 "$DPID" 2>/dev/null; then
        echo "FAIL: kvdepotd exited at start:" >&2
        cat "$WORK/daemon.log" >&2
        DPID=
        exit 1
    fi
    sleep 0.1
    i=$((i + 1))
done
if [ ! -s "$WORK/ready" ]; then
    echo "FAIL: kvdepotd not ready after 10 s" >&2
    cat "$WORK/daemon.log" >&2
    exit 1
fi
# The environment variable is how a deployment points the tool at its
# daemon; --address is tested below.
KVDEPOT_STORE_ADDRESS="unix:$SOCK"
export KVDEPOT_STORE_ADDRESS

NS=00112233445566778899aabbccddeeff
HASH=0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0
ABSENT=ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff

# --- stats on an empty store ----------------------------------------------
run 0 stats
expect_text out "kvdepotd at unix:$SOCK"
expect_text out "capacity"
expect_text out "256.0 MiB"
expect_text out "active leases: 0"

# --- put, get back, compare -----------------------------------------------
head -c 102400 /dev/urandom >"$WORK/in.bin"
run 0 put --namespace "$NS" --hash "$HASH" "$WORK/in.bin"
expect_text out "102400 bytes"
run 0 get --namespace "$NS" --hash "$HASH" "$WORK/out.bin"
cmp -s "$WORK/in.bin" "$WORK/out.bin" || fail "get returned other bytes"
[ -e "$WORK/out.bin.tmp" ] && fail "get left out.bin.tmp behind"
# Upper-case hex names the same key; --address beats the environment.
UPPER=$(echo "$HASH" | tr 'a-f' 'A-F')
run 0 get --address "unix:$SOCK" --namespace "$NS" --hash "$UPPER" \
    "$WORK/out2.bin"
cmp -s "$WORK/in.bin" "$WORK/out2.bin" || fail "upper-case hash differs"

# --- stats --json counts the object -----------------------------------------
run 0 stats --json
if command -v python3 >/dev/null 2>&1; then
    python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
h = s["host"]
assert h["objects"] >= 1, h
assert h["used_bytes"] >= 102400, h
assert h["capacity_bytes"] == 256 << 20, h
assert h["hits"] >= 2, h
assert s["active_leases"] == 0, s
assert s["dropped_writes"] == 0 and s["writes_pending"] == 0, s
assert s["disk"]["capacity_bytes"] == 0, s
' "$WORK/out" || fail "stats --json: unexpected figures: $(cat "$WORK/out")"
else
    grep -q '"host":{[^}]*"objects":[1-9]' "$WORK/out" ||
        fail "stats --json: host objects < 1: $(cat "$WORK/out")"
fi

# --- the errors users see ---------------------------------------------------
run 1 get --namespace "$NS" --hash "$ABSENT" "$WORK/absent.bin"
expect_text err "not found"
[ -e "$WORK/absent.bin" ] && fail "a failed get created the file"
run 1 put --namespace "$NS" --hash "$HASH" "$WORK/in.bin"
expect_text err "exists already"
: >"$WORK/empty.bin"
run 1 put --namespace "$NS" --hash "$ABSENT" "$WORK/empty.bin"
expect_text err "empty"
run 1 put --namespace "$NS" --hash "$ABSENT" "$WORK/missing.bin"
expect_text err "$WORK/missing.bin: No such file or directory"
run 2 put --namespace 0011 --hash "$HASH" "$WORK/in.bin"
expect_text err "--namespace '0011': need 32 hex digits (16 bytes), got 4"
run 2 get --namespace "$NS" --hash "${HASH%?}x" "$WORK/x.bin"
expect_text err "'x' at position 64 is not a hex digit"
run 2 get --namespace "$NS" "$WORK/x.bin"
expect_text err "--hash is required"
run 2 get --namespace "$NS" --hash "$HASH"
expect_text err "FILE is required"
run 2 stats --namespace "$NS"
expect_text err "unknown option '--namespace'"
run 2 stats --address /tmp/no-scheme.sock
expect_text err "need unix:PATH"
run 2 stats --timeout 0
expect_text err "--timeout '0'"
run 1 stats --address "unix:$WORK/nobody.sock" --timeout 500ms
expect_text err "cannot connect to kvdepotd"
run 0 help put
expect_text out "--namespace HEX32"
run 0 --help
expect_text out "bench"

# --- bench ------------------------------------------------------------------
run 0 bench --clients 2 --seconds 1 --size 16k
expect_text out "2 clients"
expect_text err "ops/s"
if ! awk '$1 == "put" && $2 > 0 && $8 == 0 { p = 1 }
          $1 == "get" && $2 > 0 && $8 == 0 { g = 1 }
          END { exit !(p && g) }' "$WORK/out"; then
    fail "bench: no put/get rows with operations and no errors"
    sed 's/^/  out: /' "$WORK/out" >&2
fi
run 2 bench --clients 0
expect_text err "--clients '0': need an integer in 1..64"
run 2 bench --size 1g
expect_text err "--size '1g'"

# --- ls / evict / drain -------------------------------------------------------
run 0 ls
expect_text out "$NS"
run 0 evict --namespace "$NS" --hash "$HASH" --hash "$ABSENT"
expect_text out "evicted 1 of 2 objects"
run 1 get --namespace "$NS" --hash "$HASH" "$WORK/gone.bin"
run 0 put --namespace "$NS" --hash "$HASH" "$WORK/in.bin"
run 0 evict --namespace "$NS"
expect_text out "evicted 1 objects of namespace $NS"
run 0 ls
if grep -qF -- "$NS" "$WORK/out"; then
    fail "ls still lists the evicted namespace"
fi
run 2 evict --hash "$HASH"
expect_text err "--namespace is required"
# A tenant's objects: the tool saves without a tenant ("").
run 0 put --namespace "$NS" --hash "$HASH" "$WORK/in.bin"
run 0 evict --tenant nobody
expect_text out "evicted 0 objects of tenant nobody"
run 0 get --namespace "$NS" --hash "$HASH" "$WORK/still.bin"
run 0 evict --tenant ""   # with what `bench` above saved
expect_text out "objects of tenant  (leased ones"
run 1 get --namespace "$NS" --hash "$HASH" "$WORK/gone2.bin"
run 2 evict --tenant nobody --namespace "$NS"
expect_text err "--tenant goes alone"
run 0 drain on
expect_text out "draining"
run 1 put --namespace "$NS" --hash "$HASH" "$WORK/in.bin"
run 0 drain off
run 0 put --namespace "$NS" --hash "$HASH" "$WORK/in.bin"
run 2 drain maybe

# --- config -------------------------------------------------------------------
run 0 config
expect_text out "store.arena_size = 256m  # from: call"
expect_text out "server.token =   # from: default"
expect_text out "server.verify_commits = true  # from: default"
run 2 config extra

# The daemon is still up and holds no lease the tool forgot.
run 0 stats --json
expect_text out '"active_leases":0'

if [ "$FAILS" -ne 0 ]; then
    echo "test_cli_daemon: $FAILS check(s) failed" >&2
    exit 1
fi
echo "test_cli_daemon: all checks passed"
