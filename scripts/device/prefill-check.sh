#!/usr/bin/env bash
# The prompt-chunk kernels on the device, from what scripts/prepare-device.sh carries (packs,
# artifacts.tar.xz, prefill):
# the self-test of every GEMM (all 22 types, in mix-a and mix-c) and of the prefill
# attention, for sm_90 and for gfx1100 run through CUDA (its WMMA emulated); the int8
# GEMMs of the nine types with an int8 decoder (a 2048-wide pack made here); then greedy
# text on a SmolLM2-shaped pack (random Q4_1 weights, made here by the same `synth` as
# there) through CUDA with prompts read as GEMM chunks, against the CPU reference, for
# both targets' kernels. Prints a table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
dev=.device
run=$dev/bin/strata-run
out=${OUT:-/tmp}
mkdir -p "$out"
export STRATA_CACHE=/tmp/strata-cache
results=()
record() { results+=("$(printf '%-52s %s' "$1" "$2")"); }
[ -d "$dev/art" ] || [ ! -f "$dev/artifacts.tar.xz" ] || tar -xJf "$dev/artifacts.tar.xz" -C "$dev"
for case in mix-a-sm_90 mix-a-gfx1100 mix-c-sm_90 mix-c-gfx1100; do
    pack=$dev/packs/${case%-*}.gguf
    # A call may carry only some of the artifacts (64 MiB a call).
    if [ ! -d "$dev/art/$case" ]; then record "self-test $case" "not carried"; continue; fi
    if timeout 300 "$run" selftest --pack "$pack" --artifacts "$dev/art/$case" >"$out/st-$case.txt" 2>&1; then
        record "self-test $case ($(grep -c '^gemm_.* ok ' "$out/st-$case.txt") GEMMs)" PASS
    else
        record "self-test $case" FAIL
        grep -E " FAIL |refusing" "$out/st-$case.txt" | head -5
    fi
done
. scripts/device/prefill-packs.sh
if [ ! -d "$dev/prefill/mix-q8-sm_90" ]; then
    record "self-test mix-q8-sm_90" "not carried"
elif $dev/bin/strata-compile $MIX_Q8 --out /tmp/mix-q8.gguf >/dev/null && timeout 300 "$run" selftest --pack /tmp/mix-q8.gguf --artifacts "$dev/prefill/mix-q8-sm_90" >"$out/st-mix-q8.txt" 2>&1; then
    record "self-test mix-q8-sm_90 ($(grep -c '^gemm_.* ok ' "$out/st-mix-q8.txt") GEMMs)" PASS
else
    record "self-test mix-q8-sm_90" FAIL
    grep -E " FAIL |refusing" "$out/st-mix-q8.txt" | head -5
fi
smol=/tmp/smol.gguf
$dev/bin/strata-compile synth --preset smollm2-135m --type Q4_1 --seed 5 --out "$smol" >/dev/null
for arch in sm_90 gfx1100; do
    same=0
    for prompt in "The capital of France is" "def fibonacci(n):" "Write a haiku about the sea, then explain it line by line."; do
        "$run" generate --pack "$smol" --artifacts "$dev/prefill/smol-$arch" --backend cuda --prompt "$prompt" \
            --max-tokens 32 --ignore-eos >"$out/gen-cuda.txt" 2>>"$out/gen.log"
        "$run" generate --pack "$smol" --backend cpu --prompt "$prompt" --max-tokens 32 --ignore-eos \
            >"$out/gen-cpu.txt" 2>>"$out/gen.log"
        if cmp -s "$out/gen-cuda.txt" "$out/gen-cpu.txt"; then same=$((same + 1)); else
            echo "differs ($arch): $prompt"; cmp "$out/gen-cuda.txt" "$out/gen-cpu.txt" | head -2; fi
    done
    record "greedy CUDA (GEMM prefill) = CPU, smollm2 shape, $arch ($same/3)" "$([ $same = 3 ] && echo PASS || echo FAIL)"
done
grep -h "prefill" "$out/gen.log" | tail -4
echo
printf '%s\n' "${results[@]}"
