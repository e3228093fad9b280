#!/usr/bin/env bash
# Builds what scripts/device/amd-check.sh (the cross-vendor suite) needs into .device/amd/
# (git-ignored): the test packs (two holding all 22 quant types, a qwen3 and a qwen3moe
# pack; the default model travels apart, see docs/DEVELOPING.md "GPU checks"), the wave32 AMD kernels
# of each (gfx1100 plain and --checked, gfx1030), rendered with the CUDA prelude for sm_90,
# with verify windows up to 16 and QSA; sm_90 artifacts for the HIP backend's runs (also
# --checked, and with a planted wrong kernel and a planted hang); and
# the CPU reference's text for every case of scripts/device/amd-cases.txt.
#
# Carry .device/bin and .device/amd.tar.xz.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --bins
dev=.device
mkdir -p "$dev/bin"
for b in strata-compile strata-run; do strip -o "$dev/bin/$b" "target/release/$b"; done
sc=$dev/bin/strata-compile
run=$dev/bin/strata-run
amd=$dev/amd
rm -rf "$amd" && mkdir -p "$amd/packs" "$amd/art" "$amd/cpu"
$sc synth --preset tiny-llama --type IQ1_M,IQ2_XS,IQ3_XXS,IQ3_S,Q4_0,Q4_1,Q8_0,Q4_K,Q6_K \
    --out "$amd/packs/mix-a.gguf" --seed 1 >/dev/null
$sc synth --preset tiny-qwen3moe --type Q5_0,Q5_1,Q2_K,Q3_K,Q5_K,IQ2_XXS,IQ2_S,IQ1_S,IQ4_NL,IQ4_XS,F16,BF16,F32 \
    --embd-type Q4_K --out "$amd/packs/mix-b.gguf" --seed 2 >/dev/null
$sc synth --preset tiny-qwen3 --type Q4_K,Q6_K,Q8_0 --out "$amd/packs/qwen3.gguf" --seed 3 >/dev/null
$sc synth --preset tiny-qwen3moe --type IQ2_XS,IQ1_M,Q4_K --out "$amd/packs/moe-a.gguf" --seed 11 >/dev/null
model=$(scripts/fetch-model.sh)
pack_of() { if [ "$1" = smollm2 ]; then echo "$model"; else echo "$amd/packs/$1.gguf"; fi; }

for p in mix-a mix-b qwen3 moe-a smollm2; do
    for t in "gfx1100" "gfx1100 --checked" "gfx1030" "sm_90"; do
        set -- $t
        name="$p-$1${2:+-checked}"
        cross=(); [ "$1" != sm_90 ] && cross=(--run-on sm_90)
        $sc --pack "$(pack_of $p)" --target "$@" "${cross[@]}" --spec 16 --out "$amd/art/$name" >/dev/null
        echo "$p" >"$amd/art/$name/PACK"
    done
done

# The HIP backend's own checks: --checked kernels (error read-back inside captured
# graphs) and planted faults (the self-test and the watchdog name the kernel).
for p in qwen3 moe-a; do
    $sc --pack "$amd/packs/$p.gguf" --target sm_90 --spec 4 --checked --out "$amd/art/$p-sm_90-checked" >/dev/null
done
for fault in wrong hang; do
    $sc --pack "$amd/packs/qwen3.gguf" --target sm_90 --fault "$fault:add_256" --out "$amd/art/qwen3-sm_90-$fault" >/dev/null
done
for i in $(seq 1 40); do printf 'Line %d: the quick brown fox jumps over the lazy dog. ' "$i"; done >"$amd/cpu/long-prompt"
grep -v '^#' scripts/device/amd-cases.txt | while read -r tag p flags; do
    prompt="The capital of France is"
    [ "${p%-long}" != "$p" ] && prompt=$(cat "$amd/cpu/long-prompt")
    # shellcheck disable=SC2086
    $run generate --pack "$(pack_of "${p%-long}")" --backend cpu --prompt "$prompt" --max-tokens 32 --ignore-eos \
        $flags >"$amd/cpu/$tag.txt" 2>/dev/null
done
tar -cJf "$dev/amd.tar.xz" --exclude=src --exclude='module.cu' --exclude='module.hip' \
    -C "$dev" amd/art amd/cpu $(cd "$dev" && ls amd/packs/*.gguf)
ls -la "$dev/amd.tar.xz"
md5sum "$amd"/cpu/*.txt
