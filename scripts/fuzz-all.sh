#!/usr/bin/env bash
# Runs every libFuzzer target of tests/fuzz for SECONDS each (two at a time)
# and prints one line per target: executions, corpus size, and whether it
# crashed (the crashing input is left in build/fuzz/crashes/<target>/).
# Needs the fuzz preset (clang); `make fuzz-all FUZZ_SECONDS=N` calls it.
#
# Usage: scripts/fuzz-all.sh SECONDS
set -euo pipefail
secs=${1:-60}
cmake --preset fuzz >/dev/null
targets=$(ls tests/fuzz/fuzz_*.c | sed 's|tests/fuzz/fuzz_\(.*\)\.c|\1|')
cmake --build --preset fuzz -j "$(nproc)" \
    $(for t in $targets; do echo "--target fuzz_${t}_libfuzzer"; done) >/dev/null
logs=build/fuzz/logs
mkdir -p "$logs"
run_one() {
    local t=$1
    mkdir -p "build/fuzz/corpus/$t" "build/fuzz/crashes/$t"
    if build/fuzz/tests/fuzz/fuzz_${t}_libfuzzer -max_total_time="$secs" \
        -artifact_prefix="build/fuzz/crashes/$t/" \
        "build/fuzz/corpus/$t" "tests/fuzz/corpus/$t" >"$logs/$t.log" 2>&1; then
        echo ok >"$logs/$t.status"
    else
        echo CRASH >"$logs/$t.status"
    fi
}
export -f run_one
export secs logs
printf '%s\n' $targets | xargs -P 2 -I{} bash -c 'run_one {}'
status=0
printf '%-22s %12s %8s %s\n' target executions corpus result
for t in $targets; do
    runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$logs/$t.log" | tail -1)
    corp=$(grep -o 'corp: [0-9]*' "$logs/$t.log" | tail -1 | awk '{print $2}')
    res=$(cat "$logs/$t.status")
    [[ "$res" == ok ]] || status=1
    printf '%-22s %12s %8s %s\n' "$t" "${runs:-?}" "${corp:-?}" "$res"
done
exit $status
