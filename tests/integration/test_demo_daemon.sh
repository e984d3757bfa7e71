#!/bin/sh
# The persistence round trip with the store in a kvdepotd process: every
# scenario's process opens the store in daemon mode; B, C and the lossy
# codecs' warm runs must load what earlier processes saved into the daemon,
# and the raw round trip must give the same tokens.
# Usage: test_demo_daemon.sh <kvdepot-demo> <kvdepotd>
set -eu
demo=$1
daemon=$2
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvd_demo_daemon_XXXXXX")
pid=
cleanup() {
    if [ -n "$pid" ]; then kill -9 "$pid" 2>/dev/null || true; fi
    rm -rf "$dir"
}
trap cleanup EXIT
"$daemon" --set "server.unix_socket=$dir/d.sock" --set store.arena_size=64m \
    --set store.arena_chunk=1m --set store.arena_prefault=false \
    --set store.arena_hugepages=off --set log.level=warn \
    --ready-file "$dir/ready" >"$dir/daemon.log" 2>&1 &
pid=$!
i=0
while [ ! -f "$dir/ready" ]; do
    i=$((i + 1))
    if [ $i -gt 400 ] || ! kill -0 "$pid" 2>/dev/null; then
        echo "kvdepotd did not start:"; cat "$dir/daemon.log"; exit 1
    fi
    sleep 0.05
done
"$demo" --daemon "unix:$dir/d.sock" --dir "$dir/demo" --prompt-tokens 300 \
    --gen 8 --layers 2 >"$dir/out" 2>&1 || { cat "$dir/out"; exit 1; }
cat "$dir/out"
grep -q "B: warm, new process     | raw      |    300 |     288 " "$dir/out"
grep -q "the restarted process generated the same tokens" "$dir/out"
kill -TERM "$pid"
wait "$pid"
pid=
