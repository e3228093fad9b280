#!/usr/bin/env bash
# Decode at the bandwidth limit: per-kernel GEMV bandwidth and tg/pp beside llama.cpp on
# Llama-8B-shape packs, on the device machine, in one run. Prints a summary table last.
#
# Needs .device/bin (release binaries), .device/bench/<pack>/ (artifacts made here by
# scripts/prepare-bench.sh) and llama-bench (scripts/device/llama-bench.sh); runs SmolLM2
# too where it was carried ahead as for scripts/device-check.sh (with .device/art-run).
# The packs are regenerated here with the same deterministic `synth` command as there, so
# the artifacts' pack fingerprints match.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/bench-packs.sh
bin=.device/bin
packs=${PACKS:-/tmp/strata-packs}
out=${OUT:-/tmp}/bench
mkdir -p "$packs" "$out"
# PEER=0 skips llama.cpp (a quicker run while tuning); NCU=REGEX profiles the 4096x14336
# GEMV of the packs whose names match with Nsight Compute; ONLY=REGEX runs only the packs
# whose names match.
peer=()
if [ "${PEER:-1}" != 0 ]; then
    bash scripts/device/llama-bench.sh || { echo "no llama-bench"; exit 1; }
    peer=(--llama-bench /tmp/llb/bin/llama-bench)
fi
summary=()
while read -r name preset types layers; do
    art=.device/bench/$name
    [ -d "$art" ] || continue
    [ -n "${ONLY:-}" ] && ! [[ "$name" =~ $ONLY ]] && continue
    # The MoE packs only when ONLY names them: scripts/device/bench-moe.sh times those.
    [ -z "${ONLY:-}" ] && [[ "$name" =~ $MOE_PACKS ]] && continue
    pack=$packs/$name.gguf
    extra=()
    [ "$layers" != "-" ] && extra=(--layers "$layers")
    $bin/strata-compile synth --preset "$preset" --type "$types" --seed 8 "${extra[@]}" --out "$pack" >/dev/null
    echo "== $name"
    if [ "$layers" = "-" ]; then
        $bin/strata-run bench --pack "$pack" --artifacts "$art" --ctx 4096 --kernels -p 512 -n 128 -r 3 \
            "${peer[@]}" 2>&1 | tee "$out/$name.txt"
        if [ -n "${NCU:-}" ] && [[ "$name" =~ $NCU ]] && command -v ncu >/dev/null; then
            # Where the time of the down projection goes (its self-test launch, same shape).
            ncu --kernel-name "regex:gemv_.*_4096x14336$" --launch-count 1 --section SpeedOfLight \
                --section Occupancy --section WarpStateStats --section LaunchStats \
                $bin/strata-run selftest --pack "$pack" --artifacts "$art" --ctx 256 >"$out/$name-ncu.txt" 2>&1
            grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles" \
                "$out/$name-ncu.txt" | head -20
        fi
        summary+=("$name|$(grep -o 'tg128 [0-9.]* t/s' "$out/$name.txt" | head -1)|$(grep -o 'llama.cpp pp512 [0-9.]* t/s  tg128 [0-9.]* t/s' "$out/$name.txt")|$(grep -o 'tg [0-9.]*x' "$out/$name.txt")")
    else
        $bin/strata-run bench --pack "$pack" --artifacts "$art" --ctx 256 --kernels -p 16 -n 16 -r 1 2>&1 | tee "$out/$name.txt"
    fi
    # Variants built by prepare-bench.sh SWEEP=...: the same pack, same run, no peer.
    for dir in .device/bench-*/"$name"; do
        [ -d "$dir" ] || continue
        variant=$(basename "$(dirname "$dir")")
        echo "== $name ($variant)"
        $bin/strata-run bench --pack "$pack" --artifacts "$dir" --ctx 4096 --kernels -p 16 -n 128 -r 3 2>&1 |
            tee "$out/$name-$variant.txt"
        summary+=("$name ($variant)|$(grep -o 'tg128 [0-9.]* t/s' "$out/$name-$variant.txt" | head -1)")
    done
    rm -f "$pack"
done < <(bench_packs)
# The default model, where it was carried ahead (docs/DEVELOPING.md, "GPU checks") with its artifacts.
model=/tmp/strata-model/smollm2.gguf
if [ ! -f "$model" ] && [ -f /tmp/strata-model/a/part ] && [ -f /tmp/strata-model/b/part ]; then
    cat /tmp/strata-model/a/part /tmp/strata-model/b/part >"$model"
fi
if [ -f "$model" ] && [ -d .device/art-run/smollm2-sm_90 ] && [[ -z "${ONLY:-}" || smollm2 =~ $ONLY ]]; then
    echo "== smollm2"
    $bin/strata-run bench --pack "$model" --artifacts .device/art-run/smollm2-sm_90 --kernels -p 512 -n 128 -r 3 \
        "${peer[@]}" 2>&1 | tee "$out/smollm2.txt"
    summary+=("smollm2|$(grep -o 'tg128 [0-9.]* t/s' "$out/smollm2.txt" | head -1)|$(grep -o 'llama.cpp pp512 [0-9.]* t/s  tg128 [0-9.]* t/s' "$out/smollm2.txt")|$(grep -o 'tg [0-9.]*x' "$out/smollm2.txt")")
fi
echo
echo "== GEMV kernels at 4096x14336 and 14336x4096 (all packs)"
for f in "$out"/*.txt; do
    grep -E "^(copy bandwidth|gemv_[a-z0-9_]+_(4096x14336|14336x4096) )" "$f" | sed "s|^|$(basename "$f" .txt): |"
done
echo
echo "== decode beside llama.cpp"
printf '%s\n' "${summary[@]}"
