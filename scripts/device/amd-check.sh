#!/usr/bin/env bash
# The cross-vendor suite (issue 10), on an NVIDIA machine with no AMD GPU:
#  1. every wave32 AMD kernel (gfx1100 plain and --checked, gfx1030) of the test packs,
#     verify windows up to 16 and QSA included, rendered with the CUDA prelude and
#     self-tested against the CPU reference (strata-run selftest);
#  2. greedy generation with those kernels equal to the CPU's text (plain, --spec 4 and
#     16, QSA past its budget, MoE resident, with a 25% expert cache, and --spec 4 on a
#     50% cache);
#  3. the HIP backend itself (streams, events, graphs, pinned memory, async uploads,
#     watchdog) through HIP's NVIDIA platform (HIP_PLATFORM=nvidia): self-tests, the same
#     generation cases, and decode speed beside the CUDA backend's;
#  4. refusals: --backend hip without ROCm, --device N past the devices present; through
#     the HIP backend, --checked kernels (greedy text equal to the CPU's) and planted faults
#     (a wrong kernel named by the self-test, a hang named by the watchdog).
# Prints a table last.
#
# Here: scripts/prepare-amd-check.sh, and the default model carried ahead in two calls
# (docs/DEVELOPING.md, "GPU checks"). There: carry .device/bin (or .device/bin.tar.xz, the folder
# compressed, beside a model piece) and .device/amd.tar.xz, run
#   bash scripts/device/amd-check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
dev=.device
run=$dev/bin/strata-run
out=${OUT:-/tmp}
export STRATA_CACHE=/tmp/strata-cache
[ -f "$dev/bin.tar.xz" ] && tar -xJf "$dev/bin.tar.xz" -C "$dev"
tar -xJf "$dev/amd.tar.xz" -C "$dev"
amd=$dev/amd
model=/tmp/strata-model/smollm2.gguf
if [ ! -f "$model" ] && [ -f /tmp/strata-model/a/part ] && [ -f /tmp/strata-model/b/part ]; then
    cat /tmp/strata-model/a/part /tmp/strata-model/b/part >"$model"
fi
pack_of() { if [ "$1" = smollm2 ]; then echo "$model"; else echo "$amd/packs/$1.gguf"; fi; }
rows=()
row() { rows+=("$(printf '%-48s %s' "$1" "$2")"); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true

# 1. Self-tests.
selftest() { # name, artifacts, pack, backend, environment (NAME=VALUE)...
    local name=$1 art=$2 pack=$3 backend=$4; shift 4
    if env "$@" "$run" selftest --pack "$pack" --artifacts "$art" --backend "$backend" >"$out/st-$name.txt" 2>&1; then
        row "self-test $name" "PASS ($(grep -c ' ok ' "$out/st-$name.txt") kernels)"
    else
        row "self-test $name" "FAIL: $(grep -v ' ok ' "$out/st-$name.txt" | tail -1)"
    fi
}
for p in mix-a mix-b qwen3 moe-a smollm2; do
    [ "$p" = smollm2 ] && [ ! -f "$model" ] && { row "self-test smollm2" "SKIP (model not carried)"; continue; }
    for t in gfx1100 gfx1100-checked gfx1030; do
        selftest "$p-$t" "$amd/art/$p-$t" "$(pack_of $p)" cuda
    done
    selftest "$p-sm_90-hip" "$amd/art/$p-sm_90" "$(pack_of $p)" hip HIP_PLATFORM=nvidia
done
cat "$out"/st-*.txt >"$out/selftests.txt" && rm -f "$out"/st-*.txt

# 2 and 3. Generation against the CPU's text.
grep -v '^#' scripts/device/amd-cases.txt | while read -r tag p flags; do
    base=${p%-long}
    [ "$base" = smollm2 ] && [ ! -f "$model" ] && continue
    prompt="The capital of France is"
    [ "$base" != "$p" ] && prompt=$(cat "$amd/cpu/long-prompt")
    hows="gfx1100 gfx1030 hip"
    [ "${tag#*checked}" != "$tag" ] && hows=hip-checked
    for how in $hows; do
        art=$amd/art/$base-$how; env=(); backend=cuda
        [ $how = hip ] && { art=$amd/art/$base-sm_90; env=(HIP_PLATFORM=nvidia); backend=hip; }
        [ $how = hip-checked ] && { art=$amd/art/$base-sm_90-checked; env=(HIP_PLATFORM=nvidia); backend=hip; }
        # shellcheck disable=SC2086
        if ! env "${env[@]}" "$run" generate --pack "$(pack_of "$base")" --artifacts "$art" --backend $backend \
            --prompt "$prompt" --max-tokens 32 --ignore-eos $flags >/tmp/amd-got.txt 2>/tmp/amd-err.txt; then
            echo "$how $tag = CPU|FAIL: $(tail -1 /tmp/amd-err.txt)"
        elif cmp -s /tmp/amd-got.txt "$amd/cpu/$tag.txt"; then
            echo "$how $tag = CPU|PASS"
        else
            echo "$how $tag = CPU|FAIL (got $(md5sum </tmp/amd-got.txt | cut -c1-8), cpu $(md5sum <"$amd/cpu/$tag.txt" | cut -c1-8))"
        fi
    done
done >"$out/generate.txt"
while IFS='|' read -r what result; do row "$what" "$result"; done <"$out/generate.txt"

# 3. Decode speed, HIP backend (on NVIDIA) beside CUDA, same sm_90 kernels.
if [ -f "$model" ]; then
    for backend in cuda hip; do
        HIP_PLATFORM=nvidia "$run" bench --pack "$model" --artifacts "$amd/art/smollm2-sm_90" --backend $backend \
            -p 64 -n 128 -r 3 >"$out/bench-$backend.txt" 2>&1
        row "tg128 smollm2, $backend backend" "$(grep -o 'tg128 *[0-9.]*' "$out/bench-$backend.txt" | tail -1) t/s"
    done
fi

# 4. Refusals: one line, non-zero exit; planted faults named through the HIP backend.
refusal() { # name, expected text, command...
    local name=$1 want=$2; shift 2
    "$@" >/dev/null 2>/tmp/amd-refusal.txt
    local rc=$? lines
    lines=$(wc -l </tmp/amd-refusal.txt)
    if [ $rc -ne 0 ] && [ "$lines" -eq 1 ] && grep -q "$want" /tmp/amd-refusal.txt; then
        row "$name" "PASS (exit $rc): $(cat /tmp/amd-refusal.txt)"
    else
        row "$name" "FAIL (exit $rc, $lines lines): $(head -c 300 /tmp/amd-refusal.txt)"
    fi
}
refusal "--backend hip without ROCm" "no HIP runtime (libamdhip64.so)" \
    "$run" generate --pack "$amd/packs/qwen3.gguf" --backend hip --prompt hi
refusal "--device 1 of one GPU" "device 1 asked for, 1 present" \
    "$run" generate --pack "$amd/packs/qwen3.gguf" --backend cuda --device 1 --prompt hi
named() { # name, expected text, command...: fails (non-zero exit) naming the kernel
    local name=$1 want=$2; shift 2
    "$@" >/dev/null 2>/tmp/amd-fault.txt
    local rc=$?
    if [ $rc -ne 0 ] && grep -q "$want" /tmp/amd-fault.txt; then
        row "$name" "PASS (exit $rc): $(grep "$want" /tmp/amd-fault.txt | head -c 200)"
    else
        row "$name" "FAIL (exit $rc): $(tail -1 /tmp/amd-fault.txt | head -c 300)"
    fi
}
named "HIP: planted wrong kernel" "kernel add_256 does not match the CPU reference" \
    env HIP_PLATFORM=nvidia "$run" selftest --pack "$amd/packs/qwen3.gguf" \
    --artifacts "$amd/art/qwen3-sm_90-wrong" --backend hip
start=$(date +%s)
named "HIP: planted hang" "kernel add_256 did not finish within 2 s" \
    timeout 60 env HIP_PLATFORM=nvidia "$run" generate --pack "$amd/packs/qwen3.gguf" \
    --artifacts "$amd/art/qwen3-sm_90-hang" --backend hip --prompt hi --deadline 2
row "HIP: planted hang reported after" "$(( $(date +%s) - start )) s"
echo
printf '%s\n' "${rows[@]}"
