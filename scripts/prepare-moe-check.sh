#!/usr/bin/env bash
# Builds what scripts/device/moe-check.sh needs into .device/moe/ (git-ignored; carry it
# with .device/bin): two small synthetic qwen3moe packs (int8-path expert types, and
# types whose experts take the float path), their sm_90 artifacts and their gfx1100
# (wave32) kernels rendered for sm_90, and the CPU reference's greedy output for every
# placement the check runs. The default verify window (4): a prompt is read in 16-token
# passes and its last tokens in verify windows. Expects release binaries in .device/bin
# (prepare-device.sh or prepare-bench.sh make them).
set -euo pipefail
cd "$(dirname "$0")/.."
dev=.device
sc=$dev/bin/strata-compile
run=$dev/bin/strata-run
[ -x "$sc" ] && [ -x "$run" ] || { echo "no release binaries in $dev/bin"; exit 1; }
rm -rf "$dev/moe" && mkdir -p "$dev/moe"
# Longer than the prompt window (16 tokens) and not a multiple of it: whole windows, then
# verify windows.
MOE_PROMPT=$(cat scripts/device/moe-prompt.txt)
$sc synth --preset tiny-qwen3moe --type IQ2_XS,IQ1_M,Q4_K --out "$dev/moe/moe-a.gguf" --seed 11 >/dev/null
$sc synth --preset tiny-qwen3moe --type Q5_K,Q3_K,IQ4_XS --out "$dev/moe/moe-b.gguf" --seed 12 >/dev/null
for p in moe-a moe-b; do
    $sc --pack "$dev/moe/$p.gguf" --target sm_90 --out "$dev/moe/$p-sm_90" >/dev/null
    $sc --pack "$dev/moe/$p.gguf" --target gfx1100 --run-on sm_90 --out "$dev/moe/$p-gfx1100-on-sm_90" >/dev/null
    # The CPU reference's scores over the prompt (the top logits at every position), and
    # its greedy text for every placement moe-check.sh runs (see its PLACEMENTS).
    $run score --pack "$dev/moe/$p.gguf" --backend cpu --prompt "$MOE_PROMPT" --top-k 4 --json \
        >"$dev/moe/$p-cpu-score.json" 2>/dev/null
    while read -r tag flags; do
        # shellcheck disable=SC2086
        $run generate --pack "$dev/moe/$p.gguf" --backend cpu --prompt "$MOE_PROMPT" --max-tokens 32 \
            $flags >"$dev/moe/$p-cpu-$tag.txt" 2>/dev/null
    done < scripts/device/moe-placements.txt
done
md5sum "$dev"/moe/*-cpu-*.txt
du -sh "$dev/moe"
