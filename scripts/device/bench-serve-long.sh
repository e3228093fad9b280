#!/usr/bin/env bash
# A long prompt arriving while streams decode (issue 22), on the device machine: for each
# --batch-tokens B of BATCH (default "128 512 2048"), `strata-run serve --parallel 10
# --ctx CTX` on the pack PACK of scripts/device/bench-packs.txt (default llama8b-Q4_0,
# synthetic; the artifacts of .device/serve/PACK, or ARTS/PACK), 8 streams decoding and a LONG-token
# prompt (default 16000; smollm2-Q4_1 holds 8192 positions) arriving
# (scripts/device/long_prompt_bench.py): its time to first token, that of short prompts
# sent one after another while it is read (p50, p99), and the streams' token gaps before
# and while it is read. Prints a table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/bench-packs.sh
packs=${PACKS:-/tmp/strata-packs}
out=${OUT:-/tmp}/serve-long
mkdir -p "$packs" "$out"
export STRATA_CACHE=/tmp/strata-cache
long=${LONG:-16000}
ctx=$((long + 1024))
name=${PACK:-llama8b-Q4_0}
read -r _ preset types layers < <(bench_packs | awk -v n="$name" '$1 == n')
[ -n "${preset:-}" ] || { echo "$name: not in scripts/device/bench-packs.txt"; exit 1; }
[ -f "$packs/$name.gguf" ] || synth_bench_pack .device/bin/strata-compile "$packs" "$name" "$preset" "$types" "$layers"
summary=()
for b in ${BATCH:-128 512 2048}; do
    log=$out/serve-$b.log
    .device/bin/strata-run serve --pack "$packs/$name.gguf" --artifacts "${ARTS:-.device/serve}/$name" --parallel 10 \
        --ctx $ctx --batch-tokens "$b" --port 18080 >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do grep -q ' ready: ' "$log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.5; done
    line=$(python3 scripts/device/long_prompt_bench.py http://127.0.0.1:18080 8 "$long" 512 2>&1 | tee "$out/bench-$b.txt" | tail -1)
    echo "--batch-tokens $b: $line"
    summary+=("$b|$line")
    kill $pid 2>/dev/null
    wait $pid 2>/dev/null
done
rm -f "$packs/$name.gguf"
echo
echo "== 8 streams decoding, a $long-token prompt arriving ($name)"
printf '%s\n' "${summary[@]}" | tr '|' '\t'
