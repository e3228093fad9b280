#!/usr/bin/env bash
# End-to-end speculative decoding with the n-gram drafter, on the device machine: decode
# tokens/s of a code-editing prompt with --spec 0 (off) and verify windows of 4, 8 and 16,
# with each run's acceptance, on SmolLM2 (where the model was carried ahead, see docs/DEVELOPING.md)
# and on the Llama-8B-shape Q4_0 pack (random weights: made here by the same synth
# command as in scripts/prepare-bench.sh, whose WINDOWS=1 mode builds its artifacts).
# Needs .device/bin, .device/artifacts.tar.xz (scripts/prepare-device.sh; for SmolLM2's)
# and .device/bench-windows/e2e-llama8b-Q4_0.tar.xz. Prints a summary table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/bench-packs.sh
run=.device/bin/strata-run
[ -d .device/art-run ] || tar -xJf .device/artifacts.tar.xz -C .device
out=${OUT:-/tmp}/bench-spec
mkdir -p "$out" /tmp/strata-packs /tmp/strata-windows
code=$'Rename the variable `total` to `sum` in this function and return the whole function:\n```python\ndef add_all(values):\n    total = 0\n    for v in values:\n        total = total + v\n    return total\n```'
rows=()
# bench LABEL PACK ARTIFACTS EXTRA...: one line per window setting.
bench() {
    local label=$1 pack=$2 art=$3; shift 3
    local base=""
    for t in 0 4 8 16; do
        "$run" generate --pack "$pack" --artifacts "$art" --backend cuda --prompt "$code" "$@" \
            --max-tokens 256 --ignore-eos --spec $t >"$out/$label-$t.txt" 2>"$out/$label-$t.log"
        rate=$(grep -o 'decode [0-9]* tokens at [0-9.]* t/s' "$out/$label-$t.log" | awk '{print $5}')
        acc=$(grep -o '([0-9.]*%), [0-9.]* accepted a pass' "$out/$label-$t.log" | tr -d '(),' | awk '{print $1 " / " $2}')
        [ -z "$base" ] && base=$rate
        same=$(cmp -s "$out/$label-0.txt" "$out/$label-$t.txt" && echo yes || echo NO)
        rows+=("$label|$t|${rate:-fail}|$(awk -v a="${rate:-0}" -v b="${base:-1}" 'BEGIN { printf "%.2fx", a / b }')|${acc:--}|$same")
        tail -2 "$out/$label-$t.log"
    done
}
model=/tmp/strata-model/smollm2.gguf
if [ ! -f "$model" ] && [ -f /tmp/strata-model/a/part ] && [ -f /tmp/strata-model/b/part ]; then
    cat /tmp/strata-model/a/part /tmp/strata-model/b/part >"$model"
fi
[ -f "$model" ] && bench smollm2 "$model" .device/art-run/smollm2-sm_90 --chat
synth_bench_pack .device/bin/strata-compile /tmp/strata-packs llama8b-Q4_0 llama-8b Q4_0 -
tar -xJf .device/bench-windows/e2e-llama8b-Q4_0.tar.xz -C /tmp/strata-windows
bench llama8b-Q4_0 /tmp/strata-packs/llama8b-Q4_0.gguf /tmp/strata-windows/e2e-llama8b-Q4_0
echo
echo "== decode t/s of a 256-token answer to a code-editing prompt, n-gram drafter (window T; 0 = off)"
{
    echo "pack|T|t/s|vs off|accepted % / per pass|same text"
    printf '%s\n' "${rows[@]}"
} | awk -F'|' '{ printf "%-14s %3s %9s %7s %22s %9s\n", $1, $2, $3, $4, $5, $6 }'
