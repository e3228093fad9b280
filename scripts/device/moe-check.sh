#!/usr/bin/env bash
# Mixture-of-experts on the device: for two small qwen3moe packs (experts on the int8
# path, and on the float path), the self-test of every kernel on sm_90 and of the gfx1100
# kernels rendered for sm_90; then greedy generation on CUDA with every expert resident,
# with a cache holding 25% and 50% of them (LFU and LRU), and with --spec 4, each
# compared with the CPU reference's text made here (identical tokens give identical
# text); and the scores over the prompt (the top logits at every position) against the
# CPU reference's (scripts/device/score_compare.py). With every expert resident, sm_90
# reads the prompt in one chunk on the GEMMs (the experts' grouped and int8, exact to
# the reference; the pack's small dense products on the f16 GEMM, within 0.08 of its
# logits), so its greedy text may part from the CPU's at a near tie: the scores row is
# that pass's check. Prints a table last.
#
# Here: scripts/prepare-moe-check.sh (after prepare-bench.sh or prepare-device.sh made
# .device/bin). There: run carry=[".device/bin", ".device/moe"]
#   command="bash scripts/device/moe-check.sh"
set -uo pipefail
cd "$(dirname "$0")/../.."
dev=.device
run=$dev/bin/strata-run
export STRATA_CACHE=/tmp/strata-cache
MOE_PROMPT=$(cat scripts/device/moe-prompt.txt)
rows=()
row() { rows+=("$(printf '%-44s %s' "$1" "$2")"); }
for p in moe-a moe-b; do
    for art in "$dev/moe/$p-sm_90" "$dev/moe/$p-gfx1100-on-sm_90"; do
        name=$(basename "$art")
        if $run selftest --pack "$dev/moe/$p.gguf" --artifacts "$art" >"${OUT:-/tmp}/selftest-$name.txt" 2>&1; then
            row "self-test $name" "PASS ($(grep -c ' ok ' "${OUT:-/tmp}/selftest-$name.txt") kernels)"
        else
            row "self-test $name" "FAIL: $(grep -v ' ok ' "${OUT:-/tmp}/selftest-$name.txt" | tail -1)"
        fi
        $run score --pack "$dev/moe/$p.gguf" --artifacts "$art" --prompt "$MOE_PROMPT" --top-k 4 --json \
            >/tmp/moe-score.json 2>/tmp/moe-err.txt
        row "$name scores = CPU" "$(python3 scripts/device/score_compare.py /tmp/moe-score.json "$dev/moe/$p-cpu-score.json" 2>&1 | tail -1)"
        while read -r tag flags; do
            want=$dev/moe/$p-cpu-$tag.txt
            # shellcheck disable=SC2086
            if ! $run generate --pack "$dev/moe/$p.gguf" --artifacts "$art" --prompt "$MOE_PROMPT" \
                --max-tokens 32 $flags >/tmp/moe-got.txt 2>/tmp/moe-err.txt; then
                row "$name $tag" "FAIL: $(tail -1 /tmp/moe-err.txt)"
            elif cmp -s /tmp/moe-got.txt "$want"; then
                row "$name $tag = CPU" PASS
            else
                row "$name $tag = CPU" "FAIL (cuda $(md5sum </tmp/moe-got.txt | cut -c1-8), cpu $(md5sum <"$want" | cut -c1-8))"
            fi
        done < scripts/device/moe-placements.txt
    done
done
echo
printf '%s\n' "${rows[@]}"
