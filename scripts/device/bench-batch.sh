#!/usr/bin/env bash
# Batches of decode steps (issue 22), on the device machine, in one run: `strata-run
# bench --batch` (BATCH sequences, default 1,8,16,20,24,32,48,64) of the full Llama-8B
# Q4_0 pack with this build and an earlier one, each with its own artifacts (the
# self-test of every kernel first; OLD=0: this build alone, .device/batch/binprev not
# needed); then `bench --kernels --windows` of the two-layer
# pack: every verify window of each shape and its batch GEMV at 32 columns (WINDOWS=0:
# not); with PEER=1, llama.cpp's llama-batched-bench on the same pack
# (scripts/device/llama-bench.sh, built niced while strata runs; EXPORT_DIR=$OUT/peer
# hands the build back) at 1, 8, 16 and 32 sequences, S_TG being the figure beside
# strata's.
#
# Needs .device/batch from scripts/prepare-batch-bench.sh; for PEER=1, .peer: the
# llama-batched-bench.xz.part-* an earlier call handed back (carried by path: with
# llama.cpp.tar.gz and .device/batch they pass the 64 MiB a call carries), else the source.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/bench-packs.sh
export STRATA_CACHE=/tmp/strata-cache
out=${OUT:-/tmp}
exec > >(tee "$out/bench-batch.txt") 2>&1
work=/tmp/strata-batch && packs=/tmp/strata-packs
mkdir -p "$work/arts" "$packs" && tar -xJf .device/batch/arts.tar.xz -C "$work/arts"
for v in bin binprev; do
    [ -d ".device/batch/$v" ] || continue
    mkdir -p "$work/$v"
    for b in strata-run strata-compile; do xz -dc ".device/batch/$v/$b.xz" >"$work/$v/$b" && chmod +x "$work/$v/$b"; done
done
if [ "${PEER:-0}" = 1 ]; then
    (EXPORT_DIR=$out/peer nice -n 19 bash scripts/device/llama-bench.sh llama-batched-bench >/tmp/peer-build.log 2>&1
     echo "peer build rc=$?" >>/tmp/peer-build.log) &
    peer=$!
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }
synth_bench_pack "$work/bin/strata-compile" "$packs" llama8b-Q4_0 llama-8b Q4_0 - &
full=$!
[ "${WINDOWS:-1}" = 1 ] && w2=$(synth_window_pack "$work/bin/strata-compile" "$packs" llama8b-Q4_0 llama-8b Q4_0)
wait $full
echo "packs made in $(elapsed)"
for v in new old; do
    [ $v = old ] && [ "${OLD:-1}" = 0 ] && continue
    bin=$work/bin && [ $v = old ] && bin=$work/binprev
    echo "== bench --batch ($v build, $(elapsed))"
    timeout 120 "$bin/strata-run" bench --pack "$packs/llama8b-Q4_0.gguf" --artifacts "$work/arts/$v/llama8b-Q4_0" \
        --batch "${BATCH:-1,8,16,20,24,32,48,64}" -p 16 -n 64 -r 1 --ctx 1024 >"$work/batch-$v.txt" 2>&1
    grep -i -E 'self-test|error' "$work/batch-$v.txt" | head -5
    grep -v '^\s*$' "$work/batch-$v.txt" | tail -12
done
if [ "${WINDOWS:-1}" = 1 ]; then
    # w2old: the same build's artifacts without prepare-batch-bench.sh's FLAGS, where made.
    for a in w2 w2old; do
        [ -d "$work/arts/$a" ] || continue
        echo "== window and batch GEMVs, two layers ($a, new build, $(elapsed))"
        timeout 75 "$work/bin/strata-run" bench --pack "$w2" --artifacts "$work/arts/$a/llama8b-Q4_0-w2" \
            --kernels --windows -p 16 -n 16 -r 1 --ctx 256 2>&1 | grep -E 'T=|^  gemv_q4_0_|^copy' | tail -60
    done
fi
if [ "${PEER:-0}" = 1 ]; then
    echo "== waiting for the peer build ($(elapsed))"
    wait $peer
    tail -2 /tmp/peer-build.log
    echo "== llama-batched-bench ($(elapsed))"
    timeout 150 /tmp/llb/bin/llama-batched-bench -m "$packs/llama8b-Q4_0.gguf" -ngl 99 -fa on -c $((32 * 256)) \
        -b 2048 -ub 512 -npp 128 -ntg 128 -npl 1,8,16,32 2>/tmp/peer.log | grep -E '^\|' | tail -6
fi
echo "== done ($(elapsed))"
