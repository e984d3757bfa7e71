#!/bin/sh
# `kvdepot codec-eval` end to end: the table a user sees on Gaussian
# vectors (every codec row present, numbers in the range each codec can
# produce, deterministic for a seed), a small float32 .npy written here,
# and the errors users get for broken files and bad command lines (message
# text and exit codes 1 and 2 as documented in cli/cli_int.h).
#
# usage: test_cli_codec_eval.sh PATH/TO/kvdepot
set -u

KVDEPOT=${1:?usage: $0 PATH/TO/kvdepot}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvd_cli_codec_eval.XXXXXX") || exit 1
trap 'rm -rf "$WORK"' EXIT INT TERM
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

# check_row CODEC PLANE AWK_CONDITION: the row exists and its numbers
# (mse: relMSE, cosine: mean cosine, bpv: bytes/vector, ratio: vs fp16)
# satisfy the condition.
check_row() {
    if ! awk -v c="$1" -v p="$2" '
        $1 == c && $2 == p {
            found = 1
            mse = $3 + 0; cosine = $4 + 0; bpv = $5 + 0
            ratio = $6; sub(/x$/, "", ratio); ratio += 0
            if (!('"$3"')) bad = 1
        }
        END { exit !(found && !bad) }' "$WORK/out"; then
        fail "row '$1 $2' missing or not ($3)"
        sed 's/^/  out: /' "$WORK/out" >&2
    fi
}

# check_na CODEC PLANE TEXT: the row gives a reason (TEXT) instead of numbers.
check_na() {
    if ! awk -v c="$1" -v p="$2" -v t="$3" '
        $1 == c && $2 == p && index($0, t) > 0 { found = 1 }
        END { exit !found }' "$WORK/out"; then
        fail "row '$1 $2' does not say '$3'"
        sed 's/^/  out: /' "$WORK/out" >&2
    fi
}

# rel_mse CODEC PLANE: prints the row's relMSE.
rel_mse() {
    awk -v c="$1" -v p="$2" '$1 == c && $2 == p { print $3 }' "$WORK/out"
}

# --- Gaussian vectors: the issue's command line ---------------------------
run 0 codec-eval --vectors 512 --dim 128 --codec all --seed 1
expect_text out "input: Gaussian N(0,1), seed 1, 512 vectors x 128 channels"
expect_text out "blocks: 32 of 16 tokens x 1 head, last block 16 tokens"
check_row raw k,v 'mse == 0 && cosine == 1 && bpv == 256 && ratio == 1'
check_row fp8_e4m3 k,v 'mse > 0 && mse < 1e-3 && cosine > 0.999 && bpv == 132'
# int8 and KIVI K keep their parameters per channel of each 16-token block,
# V per token (int8) or per 32 channels of each token (KIVI): K pays more
# metadata per vector, and int8 K loses less than int8 V.
check_row int8 k 'mse > 0 && mse < 6e-5 && cosine > 0.9999 && bpv == 144'
check_row int8 v 'mse > 0 && mse < 6e-5 && cosine > 0.9999 && bpv == 130'
if ! awk -v k="$(rel_mse int8 k)" -v v="$(rel_mse int8 v)" \
        'BEGIN { exit !(k < v) }'; then
    fail "int8 K (per channel) lost more than int8 V (per token)"
fi
check_row kivi4 k 'mse > 0 && mse < 0.05 && cosine > 0.97 && bpv == 96'
check_row kivi4 v 'mse > 0 && mse < 0.05 && cosine > 0.97 && bpv == 80'
check_row kivi2 k 'mse > 0 && mse < 0.5 && cosine > 0.7 && bpv == 64'
check_row kivi2 v 'mse > 0 && mse < 0.5 && cosine > 0.7 && bpv == 48'
check_row tq4 k,v 'mse > 0 && mse < 0.02 && cosine > 0.99 && bpv == 66'
check_row tq3 k,v 'mse > 0 && mse < 0.06 && cosine > 0.97 && bpv == 50'
check_row tq2 k,v 'mse > 0 && mse < 0.2 && cosine > 0.9 && bpv == 34'
# Fewer bits never lose less.
if ! awk -v a="$(rel_mse tq4 k,v)" -v b="$(rel_mse tq3 k,v)" \
        -v c="$(rel_mse tq2 k,v)" -v d="$(rel_mse kivi4 v)" \
        -v e="$(rel_mse kivi2 v)" 'BEGIN { exit !(a < b && b < c && d < e) }'; then
    fail "relMSE does not grow as bits shrink"
fi
cp "$WORK/out" "$WORK/first"
run 0 codec-eval --vectors 512 --dim 128 --codec all --seed 1
cmp -s "$WORK/first" "$WORK/out" || fail "same seed gave a different table"
run 0 codec-eval --vectors 512 --dim 128 --codec all --seed 2
tail -n +2 "$WORK/first" >"$WORK/first_rows"
tail -n +2 "$WORK/out" | cmp -s "$WORK/first_rows" - &&
    fail "another seed gave the same table"

# One codec, one plane, partial last block, several heads.
run 0 codec-eval --vectors 300 --heads 3 --block-size 16 --codec kivi4 --plane v
expect_text out "blocks: 7 of 16 tokens x 3 heads, last block 4 tokens (partial)"
check_row kivi4 v 'mse > 0 && mse < 0.05'
[ "$(grep -c '^kivi4' "$WORK/out")" -eq 1 ] || fail "--plane v printed K too"
[ "$(grep -c '^raw' "$WORK/out")" -eq 0 ] || fail "--codec kivi4 printed raw"

# Codecs that do not apply say why instead of printing numbers.
run 0 codec-eval --vectors 64 --dim 48
check_row raw k,v 'mse == 0'
check_na tq4 k,v "n/a: tq4 needs head_dim 64, 128 or 256, got 48"
check_na tq2 k,v "n/a: tq2 needs head_dim 64, 128 or 256, got 48"
check_na kivi4 v "n/a: "
check_row kivi4 k 'mse > 0'

# --- A float32 .npy written here: shape (32, 64) ---------------------------
# numpy's v1.0 layout: magic, version, u16 header length 118, the dict
# padded with spaces to a 64-byte boundary and a newline, then the data.
npy_header() {
    printf '\223NUMPY\001\000\166\000'
    printf '%-117s\n' "{'descr': '$1', 'fortran_order': False, 'shape': (32, 64), }"
}
# 2048 float32 values cycling through 16 distinct ones (little-endian).
npy_data() {
    set -- '\000\000\200\077' '\000\000\000\277' '\000\000\200\076' \
        '\000\000\000\100' '\315\314\114\276' '\000\000\300\077' \
        '\232\231\031\077' '\000\000\100\300' '\000\000\040\100' \
        '\000\000\200\275' '\315\314\314\075' '\000\000\340\277' \
        '\146\146\246\077' '\000\000\000\000' '\000\000\220\300' \
        '\000\000\100\076'
    i=0
    while [ $i -lt 2048 ]; do
        j=$(((i * 7 + i / 64) % 16 + 1))
        eval "printf \"\${$j}\""
        i=$((i + 1))
    done
}
{ npy_header '<f4'; npy_data; } >"$WORK/k.npy"
[ "$(wc -c <"$WORK/k.npy")" -eq 8320 ] || fail "test .npy is not 8320 bytes"
run 0 codec-eval --input "$WORK/k.npy" --codec all --seed 3
expect_text out "input: $WORK/k.npy, float32 converted to float16, 32 vectors x 64 channels"
check_row raw k,v 'mse == 0 && bpv == 128'
check_row fp8_e4m3 k,v 'mse > 0 && mse < 1e-3'
check_row tq4 k,v 'mse > 0 && mse < 0.05'
run 0 codec-eval --input "$WORK/k.npy" --vectors 16 --dim 64 --codec raw
expect_text out "16 vectors x 64 channels"
run 1 codec-eval --input "$WORK/k.npy" --dim 128
expect_text err "--dim 128 but the file has 64 channels per vector"
run 1 codec-eval --input "$WORK/k.npy" --vectors 33
expect_text err "--vectors 33 but the file has 32"

# Truncated data: the clear message and exit 1.
head -c 228 "$WORK/k.npy" >"$WORK/trunc.npy"
run 1 codec-eval --input "$WORK/trunc.npy"
expect_text err "kvdepot codec-eval: $WORK/trunc.npy: truncated data: shape (32, 64) float32 needs 8192 bytes, file has 100"
[ -s "$WORK/out" ] && fail "a failed run printed a table"

# Truncated header, wrong dtype, missing file.
head -c 50 "$WORK/k.npy" >"$WORK/hdr.npy"
run 1 codec-eval --input "$WORK/hdr.npy"
expect_text err "truncated .npy header: 118 bytes declared, 40 present"
{ npy_header '<f8'; npy_data; } >"$WORK/f8.npy"
run 1 codec-eval --input "$WORK/f8.npy"
expect_text err "unsupported dtype '<f8': need '<f2' (float16) or '<f4' (float32)"
run 1 codec-eval --input "$WORK/missing.npy"
expect_text err "$WORK/missing.npy: No such file or directory"

# --- Command line ---------------------------------------------------------
run 2
expect_text err "usage: kvdepot <command>"
run 2 frobnicate
expect_text err "kvdepot: unknown command 'frobnicate'"
expect_text err "codec-eval"
run 0 --help
expect_text out "codec-eval"
run 0 help codec-eval
expect_text out "--block-size"
run 0 codec-eval --help
expect_text out "--plane k|v"
run 2 help nothing
expect_text err "unknown command 'nothing'"
run 2 codec-eval --codec zstd
expect_text err "unknown codec 'zstd'"
run 2 codec-eval --vectors 0
expect_text err "--vectors '0': need an integer in 1.."
run 2 codec-eval --dim 12x
expect_text err "--dim '12x'"
run 2 codec-eval --plane q
run 2 codec-eval --bogus
expect_text err "unknown option '--bogus'"
run 2 codec-eval --seed
expect_text err "--seed needs a value"
run 2 codec-eval extra
expect_text err "unexpected argument 'extra'"
run 2 codec-eval --vectors 100 --heads 3
expect_text err "100 vectors are not a whole number of tokens of 3 heads"

if [ "$FAILS" -ne 0 ]; then
    echo "test_cli_codec_eval: $FAILS check(s) failed" >&2
    exit 1
fi
echo "test_cli_codec_eval: all checks passed"
