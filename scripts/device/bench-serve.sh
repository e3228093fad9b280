#!/usr/bin/env bash
# Serving many streams (issue 22), on the device machine, in one run: for the SmolLM2 and
# Llama-8B Q4_0 shapes (synthetic packs, scripts/device/bench-packs.sh), `strata-run serve
# --parallel 32` with the artifacts of .device/serve/<pack> (compiled with --spec 16: up
# to 16 sequences a pass on the window GEMVs, more on the GEMMs), then: the aggregate
# rate of N streaming clients, end to end and decoding alone (scripts/device/serve_bench.py,
# N in STREAMS, default "1 4 8 16 32", MAX tokens each, default 128); the same with the binaries of
# .device/binprev where carried (an earlier build), for PREV_STREAMS (default "1 8"); and
# batched text against each request alone (scripts/device/batch_check.py, 8 requests);
# and, unless PEER=0, the peer on the same pack: llama.cpp's llama-batched-bench
# (scripts/device/llama-bench.sh, built while the packs are made; EXPORT_DIR=$OUT/peer
# hands a fresh build back), N sequences of a 128-token prompt each decoding MAX tokens,
# its S_TG counting decode time alone, as serve_bench.py's second figure does. Prints a
# table last.
#
# Needs .device/bin (new binaries), .device/serve/<pack>/ (ARTS=DIR: DIR/<pack>/ instead, another
# build of the same packs); optional .device/binprev (PREV_ARTS=DIR: its artifacts from
# DIR/<pack>/, where their format differs). A pack already in PACKS is used as it is;
# KEEP_PACKS=1 leaves the packs there after.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/bench-packs.sh
packs=${PACKS:-/tmp/strata-packs}
out=${OUT:-/tmp}/serve
mkdir -p "$packs" "$out"
export STRATA_CACHE=/tmp/strata-cache
streams=${STREAMS:-1 4 8 16 32}
max=${MAX:-128}
summary=()
peer=${PEER:-1}
if [ "$peer" = 1 ]; then
    EXPORT_DIR=${OUT:-/tmp}/peer bash scripts/device/llama-bench.sh llama-batched-bench >"$out/peer-build.log" 2>&1 &
    build=$!
fi
while read -r name preset types layers; do
    [ -d "${ARTS:-.device/serve}/$name" ] || continue
    [ -n "${ONLY:-}" ] && ! [[ "$name" =~ $ONLY ]] && continue
    [ -f "$packs/$name.gguf" ] || synth_bench_pack .device/bin/strata-compile "$packs" "$name" "$preset" "$types" "$layers"
done < <(bench_packs)
if [ "$peer" = 1 ] && ! wait $build; then
    tail -5 "$out/peer-build.log"
    summary+=("llama.cpp|build failed")
    peer=0
fi
serve() { # BIN PACK ART LOG: starts serve, waits for ready; prints the pid
    "$1/strata-run" serve --pack "$2" --artifacts "$3" --parallel 32 --port 18080 --ctx 1024 >"$4" 2>&1 &
    local pid=$!
    for _ in $(seq 600); do grep -q ' ready: ' "$4" && break; kill -0 $pid 2>/dev/null || break; sleep 0.5; done
    echo $pid
}
while read -r name preset types layers; do
    art=${ARTS:-.device/serve}/$name
    [ -d "$art" ] || continue
    [ -n "${ONLY:-}" ] && ! [[ "$name" =~ $ONLY ]] && continue
    pack=$packs/$name.gguf
    for bin in .device/binprev .device/bin; do
        [ -x "$bin/strata-run" ] || continue
        label=$(basename "$bin")
        binart=$art
        [ "$label" = binprev ] && binart=${PREV_ARTS:-${ARTS:-.device/serve}}/$name
        pid=$(serve "$bin" "$pack" "$binart" "$out/$name-$label.log")
        if ! grep -q ' ready: ' "$out/$name-$label.log"; then
            tail -5 "$out/$name-$label.log"
            summary+=("$name|$label|not ready")
            kill "$pid" 2>/dev/null
            continue
        fi
        ns=$streams
        [ "$label" = binprev ] && ns=${PREV_STREAMS:-1 8}
        for n in $ns; do
            line=$(python3 scripts/device/serve_bench.py http://127.0.0.1:18080 "$n" "$max")
            echo "$name $label: $line"
            summary+=("$name|$label|$n|$(grep -o '= [0-9.]* t/s' <<<"$line" | tr -d '= ')|decoding $(grep -o 'decoding [0-9.]* t/s' <<<"$line" | cut -d' ' -f2)|$(grep -o 'first token .*' <<<"$line")")
        done
        if [ "$label" = bin ]; then
            check=$(python3 scripts/device/batch_check.py http://127.0.0.1:18080 8)
            echo "$check"
            summary+=("$name|check|$(head -1 <<<"$check")")
        fi
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    if [ "$peer" = 1 ]; then
        pl=$(tr ' ' , <<<"$streams")
        /tmp/llb/bin/llama-batched-bench -m "$pack" -ngl 99 -fa on -c $((32 * (128 + max))) -b 2048 -ub 512 \
            -npp 128 -ntg "$max" -npl "$pl" --output-format jsonl >"$out/$name-peer.jsonl" 2>"$out/$name-peer.log"
        while read -r n rate; do
            echo "$name llama.cpp: $n streams: $rate t/s"
            summary+=("$name|llama.cpp|$n|$rate")
        done < <(python3 -c '
import json, sys
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if "speed_tg" in r:
        print(r["pl"], "%.1f" % r["speed_tg"])
' "$out/$name-peer.jsonl")
    fi
    [ -n "${KEEP_PACKS:-}" ] || rm -f "$pack"
done < <(bench_packs)
echo
echo "== aggregate decode t/s by concurrent streams (binprev: the earlier build; llama.cpp: llama-batched-bench S_TG)"
printf '%s\n' "${summary[@]}" | tr '|' '\t'
