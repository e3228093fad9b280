#!/usr/bin/env bash
# The cost of constrained decoding a token: SmolLM2 (the default model) writes six JSON
# records under a schema (`generate --json-schema`, 125 decoded tokens) and, alternately
# in the same rounds, 125 tokens without one, greedy and sampled. Prints each mode's
# median decode tokens/s and the grammar's mean mask time.
#   scripts/bench-grammar.sh [BACKEND] [ROUNDS]   (defaults: host 5; needs a release build)
# On the device machine (no network, no clang): RUN=.device/bin/strata-run, MODEL=a pack
# (e.g. a SmolLM2-shaped synthetic pack with SmolLM2's tokenizer: the schema bounds what
# random weights write) and ARTIFACTS=its compiled kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
backend="${1:-host}"
rounds="${2:-5}"
run=${RUN:-target/release/strata-run}
[ -x "$run" ] || { echo "bench-grammar: build first: cargo build --release --locked" >&2; exit 1; }
model=${MODEL:-$(scripts/fetch-model.sh)}
artifacts=()
[ -n "${ARTIFACTS:-}" ] && artifacts=(--artifacts "$ARTIFACTS")
schema=$(mktemp)
trap 'rm -f "$schema"' EXIT
cat >"$schema" <<'JSON'
{"type": "array", "minItems": 6, "maxItems": 6, "items": {"type": "object",
 "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "city": {"type": "string", "maxLength": 24}},
 "required": ["name", "age", "city"], "additionalProperties": false}}
JSON
common=(generate --pack "$model" --backend "$backend" "${artifacts[@]}" --chat --prompt "List six people as JSON." --seed 5)
declare -A rates masks
modes=("greedy" "sampled" "greedy+schema" "sampled+schema")
for _ in $(seq "$rounds"); do
    for mode in "${modes[@]}"; do
        args=()
        case "$mode" in
        greedy*) args+=(--temperature 0) ;;
        sampled*) args+=(--temperature 1) ;;
        esac
        case "$mode" in
        *schema) args+=(--json-schema "$schema" --max-tokens 400) ;;
        *) args+=(--max-tokens 126 --ignore-eos) ;;
        esac
        log=$("$run" "${common[@]}" "${args[@]}" 2>&1 >/dev/null)
        rate=$(sed -n 's/.*decode [0-9]* tokens at \([0-9.]*\) t\/s.*/\1/p' <<<"$log")
        rates[$mode]+="$rate "
        mask=$(sed -n 's/.*grammar: [0-9]* masks, \([0-9.]*\) us each.*/\1/p' <<<"$log")
        [ -n "$mask" ] && masks[$mode]+="$mask "
    done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
echo "| mode ($backend, $rounds rounds) | decode t/s (median) | mask us/token (median) |"
echo "| --- | ---: | ---: |"
for mode in "${modes[@]}"; do
    m="-"
    [ -n "${masks[$mode]:-}" ] && m=$(median <<<"${masks[$mode]}")
    echo "| $mode | $(median <<<"${rates[$mode]}") | $m |"
done
