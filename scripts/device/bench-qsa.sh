#!/usr/bin/env bash
# QSA (query-aware block-sparse decode attention) speed on the Llama-8B-shape Q4_0 pack
# (random weights, made here by the same synth command as in scripts/prepare-bench.sh),
# on the device machine, in one run:
#   (a) one layer's attention of a decode token alone, dense and at each QSA budget, at
#       contexts of 8k, 32k and 128k (`strata-run bench --attention`);
#   (b) tg32 decoding from a KV cache filled to 32k and 128k positions (synthetic keys
#       and values), with --qsa off and --qsa on at budgets of 2048 and 4096 tokens;
#   (c) llama.cpp's llama-bench on the same pack at the same depths (its depth prefill
#       of 128k tokens is the slow part, 1 to 3 minutes); SKIP_LLAMA=1 leaves it out.
# Prints a summary table last.
#
# Here: ONLY=llama8b-Q4_0 scripts/prepare-bench.sh (binaries and .device/bench/llama8b-Q4_0;
# the e2e archive of WINDOWS=1 scripts/prepare-bench.sh serves too). There:
#   run carry=[".device/bin", ".device/bench", ".peer/llama-bench.xz.part-00",
#              ".peer/llama-bench.xz.part-01", ".peer/llama-bench.xz.part-02"]
#       command="bash scripts/device/bench-qsa.sh"
# (or .device/bench-windows instead of .device/bench). Without the llama-bench parts
# (and no /tmp/llb/bin/llama-bench from an earlier call) llama.cpp is skipped with a
# note: building it here takes longer than this run. DEPTHS, BUDGETS (comma lists) and
# CTX change what is timed; full output goes to $OUT/bench-qsa.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/bench-packs.sh
bin=.device/bin
run=$bin/strata-run
packs=${PACKS:-/tmp/strata-packs}
out=${OUT:-/tmp}/bench-qsa
depths=${DEPTHS:-32768,131072}
budgets=${BUDGETS:-2048,4096}
ctx=${CTX:-131200}
n=32
mkdir -p "$packs" "$out"
export STRATA_CACHE=/tmp/strata-cache
start=$SECONDS
if [ -d .device/bench/llama8b-Q4_0 ]; then
    art=.device/bench/llama8b-Q4_0
elif [ -f .device/bench-windows/e2e-llama8b-Q4_0.tar.xz ]; then
    mkdir -p /tmp/strata-windows && tar -xJf .device/bench-windows/e2e-llama8b-Q4_0.tar.xz -C /tmp/strata-windows
    art=/tmp/strata-windows/e2e-llama8b-Q4_0
else
    echo "no artifacts: carry .device/bench (ONLY=llama8b-Q4_0 scripts/prepare-bench.sh)"; exit 1
fi
pack=$packs/llama8b-Q4_0.gguf
[ -f "$pack" ] || synth_bench_pack $bin/strata-compile "$packs" llama8b-Q4_0 llama-8b Q4_0 -
echo "== pack and artifacts ready: $art ($((SECONDS - start)) s)"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true

echo "== (a) one layer's attention of a decode token, dense and QSA"
t0=$SECONDS
if "$run" bench --pack "$pack" --artifacts "$art" --ctx "$ctx" --attention --contexts 8192,32768,131072 \
    --qsa-budgets "$budgets" >"$out/attention.txt" 2>"$out/attention.log"; then
    cat "$out/attention.txt"
else
    echo "attention bench failed:"; tail -5 "$out/attention.log"
fi
echo "   ($((SECONDS - t0)) s)"

echo "== (b) tg$n at depth, strata-run bench --depth"
t0=$SECONDS
declare -A rate
for d in ${depths//,/ }; do
    for mode in off ${budgets//,/ }; do
        q=(--qsa off); [ "$mode" != off ] && q=(--qsa on --qsa-budget "$mode")
        f=$out/tg-d$d-$mode
        if "$run" bench --pack "$pack" --artifacts "$art" --ctx "$ctx" -p 0 -n $n -r 1 --depth "$d" "${q[@]}" \
            >"$f.txt" 2>"$f.log"; then
            cat "$f.txt"
            rate[$d,$mode]=$(grep -oE "tg$n @ d$d [0-9.]+ t/s" "$f.txt" | awk '{print $4}' | head -1 || true)
        else
            echo "qsa $mode, depth $d failed:"; tail -3 "$f.log"
            rate[$d,$mode]=fail
        fi
    done
done
echo "   ($((SECONDS - t0)) s)"

echo "== (c) llama.cpp llama-bench -d $depths -n $n"
t0=$SECONDS
declare -A llama
note=""
if [ "${SKIP_LLAMA:-0}" != 0 ]; then
    note="llama.cpp skipped (SKIP_LLAMA=1)"
elif ! [ -x /tmp/llb/bin/llama-bench ] && ! compgen -G ".peer/llama-bench.xz.part-*" >/dev/null; then
    note="llama.cpp skipped: no llama-bench (carry .peer/llama-bench.xz.part-*, see docs/DEVELOPING.md)"
elif ! bash scripts/device/llama-bench.sh; then
    note="llama.cpp skipped: unpacking llama-bench failed"
else
    # Cut it short so that the summary still prints within a 10-minute device call.
    left=$((540 - (SECONDS - start)))
    limit=${LLAMA_TIMEOUT:-$((left > 60 ? left : 60))}
    rc=0
    timeout "$limit" /tmp/llb/bin/llama-bench -m "$pack" -ngl 99 -fa 1 -p 0 -n $n -r 1 \
        -d "$depths" -o jsonl >"$out/llama.jsonl" 2>"$out/llama.log" || rc=$?
    [ $rc != 0 ] && { note="llama-bench exit $rc (124: cut at $limit s)"; tail -3 "$out/llama.log"; }
    # One JSON line per finished test: "depth t/s".
    while read -r d r; do llama[$d]=$r; done < <(llama_tg_rates "$out/llama.jsonl")
    for d in "${!llama[@]}"; do echo "llama.cpp tg$n @ d$d ${llama[$d]} t/s"; done
fi
echo "   ($((SECONDS - t0)) s)"

echo
echo "== one layer's attention (us), dense and QSA; speedup = dense / QSA"
awk '$2 == "dense" { d[$1] = $3; order[++n] = $1 }
     $2 == "qsa" { q[$1, $3] = $4; if (!($3 in seen)) { seen[$3] = 1; b[++m] = $3 } }
     END {
         if (!n) { print "(no attention table)"; exit }
         printf "%9s %10s", "context", "dense"
         for (j = 1; j <= m; j++) printf " %10s %8s", "qsa " b[j], "speedup"
         print ""
         for (i = 1; i <= n; i++) {
             c = order[i]; printf "%9s %10s", c, d[c]
             for (j = 1; j <= m; j++) printf " %10s %7.2fx", q[c, b[j]], (q[c, b[j]] > 0 ? d[c] / q[c, b[j]] : 0)
             print ""
         }
     }' "$out/attention.txt" 2>/dev/null || echo "(no attention table)"
echo
echo "== tg$n t/s decoding at depth (8B Q4_0, H200); total $((SECONDS - start)) s${note:+; $note}"
first=${budgets%%,*}
{
    printf 'depth|strata dense'
    for b in ${budgets//,/ }; do printf '|QSA-%s' "$b"; done
    printf '|llama.cpp|QSA-%s/llama.cpp\n' "$first"
    for d in ${depths//,/ }; do
        printf '%s|%s' "$d" "${rate[$d,off]:--}"
        for b in ${budgets//,/ }; do printf '|%s' "${rate[$d,$b]:--}"; done
        l=${llama[$d]:--}
        printf '|%s|%s\n' "$l" "$(awk -v a="${rate[$d,$first]:-0}" -v b="$l" \
            'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2fx", a / b; else print "-" }')"
    done
} | awk -F'|' '{ for (i = 1; i <= NF; i++) printf (i == 1 ? "%-8s" : " %14s"), $i; print "" }'
