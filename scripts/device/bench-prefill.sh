#!/usr/bin/env bash
# Prompt processing on the matrix units beside llama.cpp, on the device machine, in one
# run: for each Llama-8B-shape pack prepared by `ONLY=... scripts/prepare-bench.sh`
# (artifacts in .device/bench/<pack>), the self-test of its kernels (GEMMs and the
# prefill attention included), then ppN for each N of PP (default "512 4096") with the
# time to first token, beside llama-bench's ppN in the same run (three repetitions up to
# 512 tokens, one beyond), and each GEMM alone (bench --kernels: TFLOP/s against the f16
# peak measured in the same run). TTFT=N also times an N-token prompt (to the first
# token) on the Q4_0 pack; tile variants in .device/bench-g<tile>/<pack> are timed too.
# Prints a table last.
#
# Needs .device/bin, .device/bench/<pack>/ and llama-bench (scripts/device/llama-bench.sh:
# .peer/llama.cpp.tar.gz or .peer/llama-bench.xz.part-*), or, where only
# .peer/llama-batched-bench.xz.part-* is carried (no 4-minute build), llama-batched-bench's
# prompt rate after a 512-token warm-up prompt (its first runs cold). PEER=0 skips llama.cpp;
# ONLY=REGEX runs only the packs whose names match; ALSO="FLAGS" times pp512 once more
# with those strata-run flags.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/bench-packs.sh
bin=.device/bin
packs=${PACKS:-/tmp/strata-packs}
out=${OUT:-/tmp}/prefill
mkdir -p "$packs" "$out"
export STRATA_CACHE=/tmp/strata-cache
pps=${PP:-512 4096}
peer=()
batched=0
if [ "${PEER:-1}" != 0 ]; then
    if [ ! -f .peer/llama.cpp.tar.gz ] && ! compgen -G ".peer/llama-bench.xz.part-*" >/dev/null \
        && compgen -G ".peer/llama-batched-bench.xz.part-*" >/dev/null; then
        bash scripts/device/llama-bench.sh llama-batched-bench || { echo "no llama-batched-bench"; exit 1; }
        batched=1
    else
        EXPORT_DIR=${OUT:-/tmp}/peer bash scripts/device/llama-bench.sh || { echo "no llama-bench"; exit 1; }
        peer=(--llama-bench /tmp/llb/bin/llama-bench)
    fi
fi
# llama-batched-bench's prompt rate for $2 tokens of pack $1: the mean of its timed prompts
# (three up to 512 tokens, one beyond) after a 512-token warm-up.
batched_pp() {
    local reps=3 npp=512
    [ "$2" -gt 512 ] && reps=1
    for _ in $(seq $reps); do npp+=",$2"; done
    /tmp/llb/bin/llama-batched-bench -m "$1" -ngl 99 -fa on -c $(($2 + 256)) -b 2048 -ub 512 -npp "$npp" \
        -ntg 1 -npl 1 --output-format jsonl 2>/dev/null | python3 -c '
import json, sys
r = [json.loads(l)["speed_pp"] for l in sys.stdin if l.startswith("{")][1:]
print("%.1f" % (sum(r) / len(r)) if r else "")'
}
# The device's f16 matrix peak, measured here: cuBLAS through PyTorch on 8192^3 random
# operands (f32 accumulate), the median of 20 timed runs after warm-up.
python3 - <<'PY' 2>&1 | tee "$out/peak.txt"
import torch
n = 8192
a, b = (torch.randn(n, n, device="cuda", dtype=torch.float16) for _ in range(2))
for _ in range(5):
    a @ b
times = []
for _ in range(20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); a @ b; e.record(); torch.cuda.synchronize()
    times.append(s.elapsed_time(e) / 1e3)
t = sorted(times)[len(times) // 2]
print(f"peak f16 (torch.matmul {n}^3): {2 * n**3 / t / 1e12:.1f} TFLOP/s")
PY
summary=()
while read -r name preset types layers; do
    art=.device/bench/$name
    [ -d "$art" ] || continue
    [ -n "${ONLY:-}" ] && ! [[ "$name" =~ $ONLY ]] && continue
    pack=$packs/$name.gguf
    synth_bench_pack "$bin/strata-compile" "$packs" "$name" "$preset" "$types" "$layers"
    echo "== $name"
    if $bin/strata-run selftest --pack "$pack" --artifacts "$art" --ctx 256 >"$out/$name-selftest.txt" 2>&1; then
        summary+=("$name|self-test PASS ($(grep -c ' ok ' "$out/$name-selftest.txt") kernels)")
    else
        summary+=("$name|self-test FAIL")
        tail -5 "$out/$name-selftest.txt"
        continue
    fi
    first=1
    for pp in $pps; do
        kernels=()
        [ $first = 1 ] && kernels=(--kernels)
        reps=3
        [ "$pp" -gt 512 ] && reps=1
        $bin/strata-run bench --pack "$pack" --artifacts "$art" --ctx $((pp + 256)) -p "$pp" -n 16 -r $reps \
            "${kernels[@]}" "${peer[@]}" 2>&1 | tee "$out/$name-pp$pp.txt"
        first=0
        line=$(grep -o "pp$pp [0-9.]* t/s (ttft [0-9.]* ms)" "$out/$name-pp$pp.txt" | head -1)
        peer_line=$(grep -o "llama.cpp pp$pp [0-9.]* t/s" "$out/$name-pp$pp.txt" | head -1)
        ratio=$(grep -o "ratio strata/llama.cpp: pp [0-9.]*x" "$out/$name-pp$pp.txt" | grep -o "[0-9.]*x")
        if [ $batched = 1 ]; then
            rate=$(batched_pp "$pack" "$pp")
            ours=$(grep -o "pp$pp [0-9.]* t/s" "$out/$name-pp$pp.txt" | head -1 | cut -d' ' -f2)
            peer_line="llama.cpp pp$pp $rate t/s (llama-batched-bench)"
            ratio=$(python3 -c "import sys; a, b = sys.argv[1:]; print('%.2fx' % (float(a) / float(b)) if a and b else '')" "$ours" "$rate")
        fi
        summary+=("$name|$line|$peer_line|$ratio")
        echo "SUMMARY $name|$line|$peer_line|$ratio"
    done
    if [ -n "${TTFT:-}" ] && [[ "$name" =~ Q4_0 ]]; then
        $bin/strata-run bench --pack "$pack" --artifacts "$art" --ctx $((TTFT + 256)) -p "$TTFT" -n 1 -r 1 \
            2>&1 | tee "$out/$name-ttft.txt"
        summary+=("$name|$(grep -o "pp$TTFT [0-9.]* t/s (ttft [0-9.]* ms)" "$out/$name-ttft.txt" | head -1)")
        echo "SUMMARY ${summary[-1]}"
    fi
    # ALSO="FLAGS": pp512 once more with strata-run's FLAGS (e.g. --prefill 4, the
    # narrower passes of before), same pack, same run, no peer.
    if [ -n "${ALSO:-}" ]; then
        # shellcheck disable=SC2086
        $bin/strata-run bench --pack "$pack" --artifacts "$art" --ctx 768 -p 512 -n 16 -r 3 $ALSO \
            >"$out/$name-also.txt" 2>&1
        summary+=("$name ($ALSO)|$(grep -o 'pp512 [0-9.]* t/s (ttft [0-9.]* ms)' "$out/$name-also.txt")")
        echo "SUMMARY ${summary[-1]}"
    fi
    # GEMM tile variants (strata-compile --gemm-tile, built by hand into
    # .device/bench-g<tile>/<pack>): the same pack, same run, no peer.
    for dir in .device/bench-g*/"$name"; do
        [ -d "$dir" ] || continue
        variant=$(basename "$(dirname "$dir")")
        $bin/strata-run bench --pack "$pack" --artifacts "$dir" --ctx 768 -p 512 -n 16 -r 3 --kernels \
            >"$out/$name-$variant.txt" 2>&1
        summary+=("$name ($variant)|$(grep -o 'pp512 [0-9.]* t/s (ttft [0-9.]* ms)' "$out/$name-$variant.txt")")
        echo "SUMMARY ${summary[-1]}"
        grep -E "^gemm_" "$out/$name-$variant.txt" | sed "s/^/$variant: /"
    done
    rm -f "$pack"
done < <(bench_packs)
echo
echo "== GEMM kernels (tokens 512)"
cat "$out/peak.txt"
grep -h -E "^gemm_" "$out"/*-pp*.txt | sort -u
echo
echo "== prompt processing beside llama.cpp"
printf '%s\n' "${summary[@]}" | tr '|' '\t'
