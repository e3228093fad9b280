#!/usr/bin/env bash
# GEMM variants side by side on the device machine, in one run: for each artifact
# directory .device/bench-<variant>/<pack> (built by hand with a changed template or
# tuning: strata-compile --pack <pack> --target sm_90 --out .device/bench-<variant>/<pack>),
# ptxas's registers and spills of its GEMMs, the self-test of its kernels, pp512 and each
# GEMM alone (bench --kernels). NCU=REGEX also profiles the first launch of the kernel
# the regex names in every variant, or in those of NCU_VARIANTS="v0 v1" (ncu: speed of
# light, occupancy, warp stalls).
# VARIANTS="v0 v1" picks variants (default: every .device/bench-v*). Prints a table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/bench-packs.sh
bin=.device/bin
packs=${PACKS:-/tmp/strata-packs}
out=${OUT:-/tmp}/gemm-variants
mkdir -p "$packs" "$out"
export STRATA_CACHE=/tmp/strata-cache
stalls=$(printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' barrier long_scoreboard \
    short_scoreboard mio_throttle math_pipe_throttle wait not_selected lg_throttle dispatch_stall \
    no_instruction selected membar | sed 's/,$//')
variants=${VARIANTS:-$(cd .device && ls -d bench-v* | sed 's/^bench-//')}
summary=()
while read -r name preset types layers; do
    ls -d .device/bench-*/"$name" >/dev/null 2>&1 || continue
    [ -n "${ONLY:-}" ] && ! [[ "$name" =~ $ONLY ]] && continue
    pack=$packs/$name.gguf
    synth_bench_pack "$bin/strata-compile" "$packs" "$name" "$preset" "$types" "$layers"
    for v in $variants; do
        art=.device/bench-$v/$name
        [ -d "$art" ] || continue
        echo "== $name $v"
        ptxas -arch=sm_90 -v "$art/module.ptx" -o /dev/null 2>&1 | grep -A4 "Compiling entry function '_*gemm" \
            | grep -o "gemm_[a-z0-9_]*\|Used [0-9]* registers\|[0-9]* bytes spill stores" | paste -sd' ' | sed 's/ gemm_/\ngemm_/g' \
            | sort -u | tee "$out/$name-$v-ptxas.txt"
        if $bin/strata-run selftest --pack "$pack" --artifacts "$art" --ctx 256 >"$out/$name-$v-selftest.txt" 2>&1; then
            st="PASS"
        else
            st="FAIL"; grep -v ' ok ' "$out/$name-$v-selftest.txt" | tail -5
        fi
        $bin/strata-run bench --pack "$pack" --artifacts "$art" --ctx 768 -p 512 -n 16 -r 3 --kernels \
            >"$out/$name-$v.txt" 2>&1
        grep -E "^gemm_" "$out/$name-$v.txt" | sed "s/^/$v: /"
        summary+=("$name|$v|self-test $st|$(grep -o 'pp512 [0-9.]* t/s (ttft [0-9.]* ms)' "$out/$name-$v.txt")")
        if [ -n "${NCU:-}" ] && grep -qE "$NCU" "$art/manifest.toml" && [[ " ${NCU_VARIANTS:-$v} " == *" $v "* ]]; then
            ncu --clock-control none -k "regex:${NCU}" -c 1 --section SpeedOfLight --section Occupancy \
                --section WarpStateStats --section LaunchStats --metrics "$stalls" \
                $bin/strata-run bench --pack "$pack" --artifacts "$art" --ctx 768 -p 512 -n 1 -r 1 \
                >"$out/$name-$v-ncu.txt" 2>&1
            grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Stall|cycles being stalled|Warp Cycles Per Issued|issue_stalled" \
                "$out/$name-$v-ncu.txt" | head -40
        fi
    done
    rm -f "$pack"
done < <(bench_packs)
echo
echo "== GEMM variants"
printf '%s\n' "${summary[@]}" | tr '|' '\t'
