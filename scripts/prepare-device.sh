#!/usr/bin/env bash
# Builds what scripts/device-check.sh needs into .device/ (git-ignored; carry it with the
# device call): the release binaries, small synthetic test packs that together hold every
# supported quant type, and their artifacts for sm_90 plus the gfx1100 (wave32) kernels
# rendered in CUDA for sm_90 (cross-vendor execution); the same for the default model
# (SmolLM2) and a qwen3 synthetic pack, with deliberately faulty builds for the refusal
# checks.
#
# Carry .device/bin, .device/packs, .device/prefill and .device/artifacts.tar.xz (the art, art-run and
# checked folders, compressed).
#
# The default model (94 MiB) is larger than one device call carries (64 MiB), so it
# travels in pieces: .device-model/part-a and part-b, each carried by its own call ahead
# of the check (see docs/DEVELOPING.md, "GPU checks"); device-check.sh joins them.
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
# mix-b's types in a dense pack: its prompt-chunk GEMMs (a mixture of experts has none).
$sc synth --preset tiny-llama --type Q5_0,Q5_1,Q2_K,Q3_K,Q5_K,IQ2_XXS,IQ2_S,IQ1_S,IQ4_NL,IQ4_XS,F16,BF16,F32 \
    --embd-type Q4_K --out "$dev/packs/mix-c.gguf" --seed 4 >/dev/null
for p in mix-a mix-b mix-c; do
    for spec in "sm_90" "gfx1100 --run-on sm_90"; do
        set -- $spec
        name="$p-$1"
        $sc --pack "$dev/packs/$p.gguf" --target $spec --spec 16 --out "$dev/art/$name"
        echo "$p.gguf" >"$dev/art/$name/PACK"
    done
done
$sc --pack "$dev/packs/mix-a.gguf" --target sm_90 --spec 2 --checked --out "$dev/checked/mix-a-sm_90"
echo mix-a.gguf >"$dev/checked/mix-a-sm_90/PACK"

# The default model and a qwen3 synthetic pack: artifacts for sm_90, for gfx1100 run on
# sm_90, natively for gfx1100 (to be refused on this device), and with planted faults.
model=$(scripts/fetch-model.sh)
$sc synth --preset tiny-qwen3 --type Q4_K,Q6_K,Q8_0 --out "$dev/packs/qwen3.gguf" --seed 3 >/dev/null
for p in smollm2 qwen3; do
    pack="$dev/packs/$p.gguf"
    [ $p = smollm2 ] && pack=$model
    $sc --pack "$pack" --target sm_90 --spec 16 --out "$dev/art-run/$p-sm_90" >/dev/null
    $sc --pack "$pack" --target gfx1100 --run-on sm_90 --spec 16 --out "$dev/art-run/$p-gfx1100-on-sm_90" >/dev/null
done
# The int8-dot GEMVs of all nine types with an int8 decoder, windows up to 16 (forced:
# the test pack's matrices are below the size where they are chosen by default).
for spec in "sm_90" "gfx1100 --run-on sm_90"; do
    set -- $spec
    $sc --pack "$dev/packs/mix-a.gguf" --target $spec --spec 16 --int8 always \
        --out "$dev/art-run/mix-a-int8-$1$([ $# -gt 1 ] && echo -on-sm_90)" >/dev/null
done
$sc --pack "$model" --target gfx1100 --out "$dev/art-run/smollm2-gfx1100" >/dev/null
$sc --pack "$model" --target sm_90 --fault wrong:rmsnorm_576 --out "$dev/art-run/smollm2-fault-wrong" >/dev/null
$sc --pack "$model" --target sm_90 --fault hang:silu_mul_1536 --out "$dev/art-run/smollm2-fault-hang" >/dev/null
# A SmolLM2-shaped pack of random Q4_1 weights (made again there by the same command):
# the prompt-chunk check's greedy text (scripts/device/prefill-check.sh).
$sc synth --preset smollm2-135m --type Q4_1 --seed 5 --out /tmp/smol.gguf >/dev/null
for spec in "sm_90" "gfx1100 --run-on sm_90"; do
    set -- $spec
    $sc --pack /tmp/smol.gguf --target $spec --out "$dev/prefill/smol-$1" >/dev/null
done
rm -f /tmp/smol.gguf
# The int8 GEMMs of the nine types with an int8 decoder need rows of whole 16-byte
# pieces: a 2048-wide pack (67 MiB, made again there by the same command, MIX_Q8 in
# prefill-packs.sh) holds each at 2048 or 8192 columns (forced: some of its matrices are
# below the size where the int8 GEMM is chosen by default).
. scripts/device/prefill-packs.sh
$sc $MIX_Q8 --out /tmp/mix-q8.gguf >/dev/null
$sc --pack /tmp/mix-q8.gguf --target sm_90 --int8 always --out "$dev/prefill/mix-q8-sm_90" >/dev/null
rm -f /tmp/mix-q8.gguf
# PTX compresses twenty-fold: the artifacts travel as one archive beside the binaries and
# packs (device-check.sh unpacks it), under the 64 MiB a device call carries.
tar -cJf "$dev/artifacts.tar.xz" -C "$dev" art art-run checked
rm -rf .device-model && mkdir -p .device-model/a .device-model/b
head -c 40M "$model" >.device-model/a/part
tail -c +$((40 * 1024 * 1024 + 1)) "$model" >.device-model/b/part
du -sh "$dev" .device-model/* .peer 2>/dev/null
