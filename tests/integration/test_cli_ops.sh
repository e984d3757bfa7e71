#!/bin/sh
# `kvdepot ping`, `drain on --wait`, `ls --json` with tenant names and
# `lookup` end to end against real kvdepotds started here. `lookup`'s block
# keys are checked against an independent computation of vLLM's
# sha256_cbor chain (a few lines of Python below), so the tool and the
# leader cannot drift apart unnoticed. Error exits: bad options (2), no
# daemon (1).
#
# usage: test_cli_ops.sh PATH/TO/kvdepot PATH/TO/kvdepotd
set -u

KVDEPOT=${1:?usage: $0 PATH/TO/kvdepot PATH/TO/kvdepotd}
KVDEPOTD=${2:?usage: $0 PATH/TO/kvdepot PATH/TO/kvdepotd}
command -v python3 >/dev/null 2>&1 || {
    echo "test_cli_ops: python3 is needed (skipped)" >&2
    exit 77
}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvd_cli_ops.XXXXXX") || exit 1
DPIDS=
cleanup() {
    for p in $DPIDS; do
        kill -TERM "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
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

expect_text() {
    if ! grep -qF -- "$2" "$WORK/$1"; then
        fail "$1 lacks '$2'"
        sed "s/^/  $1: /" "$WORK/$1" >&2
    fi
}

# start_daemon NAME SETTINGS...: a kvdepotd on $WORK/NAME.sock.
start_daemon() {
    name=$1
    shift
    "$KVDEPOTD" --set server.unix_socket="$WORK/$name.sock" \
        --set store.arena_size=64m --set store.arena_prefault=false \
        --set log.level=warn --ready-file "$WORK/$name.ready" "$@" \
        >"$WORK/$name.log" 2>&1 &
    pid=$!
    DPIDS="$DPIDS $pid"
    i=0
    while [ ! -s "$WORK/$name.ready" ] && [ $i -lt 100 ]; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "FAIL: kvdepotd $name exited at start:" >&2
            cat "$WORK/$name.log" >&2
            exit 1
        fi
        sleep 0.1
        i=$((i + 1))
    done
    [ -s "$WORK/$name.ready" ] || {
        echo "FAIL: kvdepotd $name not ready after 10 s" >&2
        exit 1
    }
}

# chain SEED BLOCK_SIZE TOKENS: vLLM's sha256_cbor block hashes, one a line
# (root: SHA-256 of the CBOR text SEED; block: SHA-256 of the CBOR array
# [parent bstr, [token uints], null]), written here from the definition.
chain() {
    python3 - "$@" <<'PY'
import hashlib, sys
def head(major, n):
    if n < 24:
        return bytes([major << 5 | n])
    for ai, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if n < 1 << (8 * size):
            return bytes([major << 5 | ai]) + n.to_bytes(size, "big")
seed, bs = sys.argv[1].encode(), int(sys.argv[2])
toks = [int(t) for t in sys.argv[3].split(",")]
h = hashlib.sha256(head(3, len(seed)) + seed).digest()
for b in range(len(toks) // bs):
    blk = toks[b * bs:(b + 1) * bs]
    h = hashlib.sha256(head(4, 3) + head(2, 32) + h + head(4, len(blk)) +
                       b"".join(head(0, t) for t in blk) + b"\xf6").digest()
    print(h.hex())
PY
}

start_daemon a
KVDEPOT_STORE_ADDRESS="unix:$WORK/a.sock"
export KVDEPOT_STORE_ADDRESS
NS=00112233445566778899aabbccddeeff

# --- ping ---------------------------------------------------------------------
run 0 ping
expect_text out "ok "
expect_text out " ms  kvdepotd "
expect_text out "at unix:$WORK/a.sock"
run 2 ping extra
run 1 ping --address "unix:$WORK/nobody.sock" --timeout 300ms
expect_text err "cannot connect to kvdepotd"

# --- lookup -------------------------------------------------------------------
TOKENS=101,102,103,104,105,106,107,108,109,110,111,112,113,114
chain kvdepot 4 "$TOKENS" >"$WORK/chain"
[ "$(wc -l <"$WORK/chain")" -eq 3 ] || fail "chain: $(cat "$WORK/chain")"
H0=$(sed -n 1p "$WORK/chain")
H2=$(sed -n 3p "$WORK/chain")
head -c 4096 /dev/urandom >"$WORK/blk"
run 0 put --namespace "$NS" --hash "$H0" "$WORK/blk"
run 0 put --namespace "$NS" --hash "$H2" "$WORK/blk"
run 0 lookup --namespace "$NS" --tokens "$TOKENS" --block-size 4
expect_text out "14 tokens, block size 4: 3 full blocks (the last 2 tokens"
expect_text out "hit: 1 of 3 blocks, 4 of 14 tokens"
expect_text out "1 block(s) after the first miss are stored but unreachable"
expect_text out "$H0"
expect_text out "host     $H2  (behind a miss)"
# The same tokens from a file (a JSON list), as JSON.
echo "[$TOKENS]" | sed 's/,/, /g' >"$WORK/tokens.json"
run 0 lookup --namespace "$NS" --token-file "$WORK/tokens.json" \
    --block-size 4 --json
python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["matched_blocks"] == 1 and r["matched_tokens"] == 4, r
assert r["blocks"] == 3 and r["stored_behind_miss"] == 1, r
tiers = [(b["tier"], b["reachable"]) for b in r["block_list"]]
assert tiers == [("host", True), ("missing", False), ("host", False)], tiers
assert r["block_list"][2]["hash"] == sys.argv[2], r
' "$WORK/out" "$H2" || fail "lookup --json: $(cat "$WORK/out")"
# A salt or a LoRA changes every key: nothing matches.
run 0 lookup --namespace "$NS" --tokens "$TOKENS" --block-size 4 --salt s1
expect_text out "hit: 0 of 3 blocks"
run 0 lookup --namespace "$NS" --tokens "$TOKENS" --block-size 4 --lora l1
expect_text out "hit: 0 of 3 blocks"
# The lookups gave every lease back.
run 0 stats --json
expect_text out '"active_leases":0'
run 2 lookup --namespace "$NS" --block-size 4
expect_text err "give exactly one of --tokens, --token-file, --text and --text-file"
run 2 lookup --namespace "$NS" --tokens 1,2,x3
expect_text err "'x3' (token 3) is not a token id"
run 2 lookup --namespace "$NS" --tokens 1,2 --block-size 0
expect_text err "--block-size '0'"
run 2 lookup --tokens 1,2
expect_text err "--namespace is required"
run 1 lookup --namespace "$NS" --token-file "$WORK/none.txt"
expect_text err "$WORK/none.txt: No such file or directory"
run 1 lookup --namespace "$NS" --tokens 1,2,3
expect_text err "3 tokens fill no block of 16"
run 1 lookup --namespace "$NS" --tokens "$TOKENS" --block-size 4 \
    --address "unix:$WORK/nobody.sock" --timeout 300ms
expect_text err "cannot connect to kvdepotd"

# --- ls --json ------------------------------------------------------------------
run 0 ls --json
python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
ns = {n["namespace"]: n for n in r["namespaces"]}
assert ns[sys.argv[2]]["host_objects"] == 2, r
assert ns[sys.argv[2]]["bytes"] == 8192, r
assert r["tenants"] == [{"id": 0, "name": "", "objects": 2, "bytes": 8192}], r
assert r["truncated"] is False, r
' "$WORK/out" "$NS" || fail "ls --json: $(cat "$WORK/out")"
run 2 ls --jsonx

# --- lookup --evict ---------------------------------------------------------------
# Clear by prefix: --evict removes the prompt's stored blocks (both of
# them, the one behind the miss too); the next lookup finds none.
run 2 lookup --namespace "$NS" --tokens "$TOKENS" --block-size 4 --evict --json
expect_text err "print text; leave out --json"
run 2 lookup --namespace "$NS" --tokens "$TOKENS" --block-size 4 --pin --unpin
expect_text err "one of --evict, --pin and --unpin"
# Pin and unpin the prompt's blocks: both stored ones count.
run 0 lookup --namespace "$NS" --tokens "$TOKENS" --block-size 4 --pin
expect_text out "pinned 2 of the prompt's 2 stored block(s)"
run 0 lookup --namespace "$NS" --tokens "$TOKENS" --block-size 4 --unpin
expect_text out "unpinned 2 of the prompt's 2 stored block(s)"
run 0 lookup --namespace "$NS" --tokens "$TOKENS" --block-size 4 --evict
expect_text out "evicted 2 of the prompt's 2 stored block(s)"
run 0 lookup --namespace "$NS" --tokens "$TOKENS" --block-size 4
expect_text out "hit: 0 of 3 blocks"
if grep -q "host " "$WORK/out"; then
    fail "lookup after --evict still finds blocks: $(cat "$WORK/out")"
fi

# --- drain on --wait --------------------------------------------------------------
run 0 drain on --wait --wait-timeout 5s
expect_text out "draining (new saves refused"
expect_text out "drained: no lease or reservation held"
run 1 put --namespace "$NS" --hash "$(sed -n 2p "$WORK/chain")" "$WORK/blk"
run 0 drain off
run 2 drain off --wait
expect_text err "--wait goes with on"
run 2 drain on --wait --wait-timeout 0
expect_text err "--wait-timeout '0'"
run 1 drain on --wait --address "unix:$WORK/nobody.sock" --timeout 300ms
expect_text err "cannot connect to kvdepotd"

# --- tenant names: this user's saves belong to team-a -------------------------
# --- pin bound -------------------------------------------------------------------
# store.pin_max_bytes bounds what pins keep: one 4 KiB object fits, the
# second is refused with the reason.
start_daemon p --set store.pin_max_bytes=4k
PADDR="unix:$WORK/p.sock"
run 0 put --address "$PADDR" --namespace "$NS" --hash "$H0" "$WORK/blk"
run 0 put --address "$PADDR" --namespace "$NS" --hash "$H2" "$WORK/blk"
run 1 lookup --address "$PADDR" --namespace "$NS" --tokens "$TOKENS" \
    --block-size 4 --pin
expect_text out "pinned 1 of the prompt's 2 stored block(s)"
expect_text err "store.pin_max_bytes is reached"

start_daemon b --set server.tenants="$(id -u)=team-a" \
    --set server.tenant_arena_size=shared
KVDEPOT_STORE_ADDRESS="unix:$WORK/b.sock"
run 0 put --namespace "$NS" --hash "$H0" "$WORK/blk"
run 0 ls
expect_text out "team-a"
run 0 ls --json
python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert [(t["name"], t["objects"]) for t in r["tenants"]] == [("team-a", 1)], r
assert r["tenants"][0]["id"] != 0, r
' "$WORK/out" || fail "ls --json (tenant): $(cat "$WORK/out")"
run 0 evict --tenant team-a
expect_text out "evicted 1 objects of tenant team-a"

if [ "$FAILS" -ne 0 ]; then
    echo "test_cli_ops: $FAILS check(s) failed" >&2
    exit 1
fi
echo "test_cli_ops: all checks passed"
