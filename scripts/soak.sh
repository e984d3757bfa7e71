#!/usr/bin/env bash
# make soak: CLIENTS client processes (`kvdepot bench`, one client each:
# saves, lookups and loads of 64 KiB objects, every byte checked) against
# one kvdepotd (1 GiB arena, no disk tier: the arena fills within seconds and
# eviction runs all along) for SECONDS, bounded. Every 10 s it samples the daemon's RSS
# and the arena bytes and leases from /metrics. It passes when no operation
# failed, the daemon is still up and answers, and the RSS after warm-up
# (the first minute, or the first sixth of a shorter run) grew by less than
# 10%. It prints the samples and each operation's p50/p99 across clients.
#
# Usage: scripts/soak.sh [SECONDS (600)] [CLIENTS (32)] [BUILD_DIR (build/dev)]
set -euo pipefail

seconds=${1:-600}
clients=${2:-32}
build=${3:-build/dev}
kvdepot=$build/cli/kvdepot
daemon=$build/server/kvdepotd
for b in "$kvdepot" "$daemon"; do
    [[ -x $b ]] || { echo "soak: $b not built (make build)" >&2; exit 2; }
done

dir=$(mktemp -d "${TMPDIR:-/tmp}/kvd_soak_XXXXXX")
# Private copies: a rebuild during the run must not mix two versions.
cp "$kvdepot" "$daemon" "$dir/"
kvdepot=$dir/kvdepot
daemon=$dir/kvdepotd
dpid=
cleanup() {
    [[ -n $dpid ]] && kill -TERM "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null
    jobs -p | xargs -r kill 2>/dev/null || true
    [[ -n ${KEEP_SOAK:-} ]] || rm -rf "$dir"
}
trap cleanup EXIT

"$daemon" --set "server.unix_socket=$dir/d.sock" \
    --set server.metrics_address=127.0.0.1:0 --set server.threads=2 \
    --set store.arena_size=1g --set log.level=warn --ready-file "$dir/ready" >"$dir/daemon.log" 2>&1 &
dpid=$!
for _ in $(seq 600); do [[ -s $dir/ready ]] && break; sleep 0.1; done
[[ -s $dir/ready ]] || { echo "soak: kvdepotd did not start"; cat "$dir/daemon.log"; exit 1; }
mport=$(sed -n 's/^metrics_port=//p' "$dir/ready")

metric() { # name{labels} -> value from /metrics
    curl -s "http://127.0.0.1:$mport/metrics" | awk -v k="$1" '$1 == k { print $2 }'
}
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$dpid/status"; }

echo "soak: $clients client processes for ${seconds}s against kvdepotd (pid $dpid)"
for i in $(seq "$clients"); do
    "$kvdepot" bench --clients 1 --seconds "$seconds" --size 64k \
        --address "unix:$dir/d.sock" --timeout 5s \
        >"$dir/bench.$i.out" 2>/dev/null &
done

warm=$((seconds / 6 < 60 ? seconds / 6 : 60))
printf '%8s %12s %14s %8s\n' "t (s)" "RSS (MiB)" "arena (MiB)" "leases"
start=$(date +%s)
rss_warm=
rss_last=
while :; do
    now=$(( $(date +%s) - start ))
    kill -0 "$dpid" 2>/dev/null || { echo "soak: kvdepotd died"; exit 1; }
    rss=$(rss_kib)
    arena=$(metric 'kvdepot_tier_bytes{tier="host"}')
    leases=$(metric kvdepot_leases)
    awk -v t="$now" -v r="$rss" -v a="${arena:-0}" -v l="${leases:-?}" \
        'BEGIN { printf "%8d %12.1f %14.1f %8s\n", t, r / 1024, a / 1048576, l }'
    if [[ -z $rss_warm && $now -ge $warm ]]; then rss_warm=$rss; fi
    rss_last=$rss
    (( now >= seconds + 5 )) && break
    [[ -z $(jobs -p | grep -v "^$dpid$") ]] && break
    sleep 10
done
wait $(jobs -p | grep -v "^$dpid$") 2>/dev/null || true

# Per-operation figures across clients: p50 is the median of the clients'
# p50s, p99 the largest of their p99s (a client's histogram is not merged).
errors=0
for op in put get; do
    p50=$(awk -v op="$op" '$1 == op && $2 ~ /^[0-9]+$/ { print $5 }' "$dir"/bench.*.out | sort -g |
          awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print 0 }')
    awk -v op="$op" -v p50="$p50" '$1 == op && $2 ~ /^[0-9]+$/ { ops += $3; err += $8; if ($6 > p99) p99 = $6 }
        END { printf "%-4s %10.0f ops/s  p50 %8.1f us  p99 %8.1f us  errors %d\n",
              op, ops, p50, p99, err }' "$dir"/bench.*.out
    e=$(awk -v op="$op" '$1 == op && $2 ~ /^[0-9]+$/ { e += $8 } END { print e + 0 }' "$dir"/bench.*.out)
    errors=$((errors + e))
done
ran=$(grep -l '^total' "$dir"/bench.*.out | wc -l)
for f in "$dir"/bench.*.out; do
    grep -q '^total' "$f" || { echo "soak: $(basename "$f") has no summary:"; cat "$f"; }
done
growth=$(awk -v a="$rss_warm" -v b="$rss_last" 'BEGIN { printf "%.1f", (b - a) * 100 / a }')
awk -v ran="$ran" -v n="$clients" -v a="$rss_warm" -v b="$rss_last" -v g="$growth" \
    'BEGIN { printf "clients that finished: %d of %d; RSS after warm-up %.1f -> %.1f MiB (%+.1f%%)\n",
             ran, n, a / 1024, b / 1024, g }'
ok=1
(( errors == 0 )) || { echo "soak: $errors operations failed"; ok=0; }
(( ran == clients )) || { echo "soak: some clients did not finish"; ok=0; }
awk -v g="$growth" 'BEGIN { exit !(g < 10) }' || { echo "soak: RSS grew after warm-up"; ok=0; }
"$kvdepot" stats --address "unix:$dir/d.sock" >/dev/null ||
    { echo "soak: the daemon does not answer"; ok=0; }
(( ok )) && echo "soak: passed" || { echo "soak: FAILED"; exit 1; }
