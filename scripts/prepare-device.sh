#!/usr/bin/env bash
# Builds what scripts/device-check.sh needs into .device/ (git-ignored; carry it with the
# device call): the release binaries, small synthetic test packs that together hold every
# supported quant type, and their artifacts for sm_90 plus the gfx1100 (wave32) kernels
# rendered in CUDA for sm_90 (cross-vendor execution).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --bins
dev=.device
rm -rf "$dev" && mkdir -p "$dev/bin" "$dev/packs" "$dev/art"
for b in strata-compile strata-run; do strip -o "$dev/bin/$b" "target/release/$b"; done
sc="$dev/bin/strata-compile"
$sc synth --preset tiny-llama --type IQ1_M,IQ2_XS,IQ3_XXS,IQ3_S,Q4_0,Q4_1,Q8_0,Q4_K,Q6_K \
    --out "$dev/packs/mix-a.gguf" --seed 1 >/dev/null
$sc synth --preset tiny-qwen3moe --type Q5_0,Q5_1,Q2_K,Q3_K,Q5_K,IQ2_XXS,IQ2_S,IQ1_S,IQ4_NL,IQ4_XS,F16,BF16,F32 \
    --embd-type Q4_K --out "$dev/packs/mix-b.gguf" --seed 2 >/dev/null
for p in mix-a mix-b; do
    for spec in "sm_90" "gfx1100 --run-on sm_90"; do
        set -- $spec
        name="$p-$1"
        $sc --pack "$dev/packs/$p.gguf" --target $spec --spec 8 --out "$dev/art/$name"
        echo "$p.gguf" >"$dev/art/$name/PACK"
    done
done
$sc --pack "$dev/packs/mix-a.gguf" --target sm_90 --spec 2 --checked --out "$dev/checked/mix-a-sm_90"
echo mix-a.gguf >"$dev/checked/mix-a-sm_90/PACK"
du -sh "$dev"
