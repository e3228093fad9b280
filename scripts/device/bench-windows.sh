#!/usr/bin/env bash
# Verify-window GEMV times (speculative decoding): every compiled window T = 1..16 of each
# GEMV of the single-type Llama-8B-shape packs, timed alone (`strata-run bench --kernels
# --windows`), on the device machine. The goal: T=8 within 1.25x of T=1 at 4096x14336
# (ffn_down) and 14336x4096 (ffn_gate, ffn_up). Prints a summary table last.
#
# Needs .device/bin (release binaries) and .device/bench-windows/<pack>.tar.xz (made here
# by WINDOWS=1 scripts/prepare-bench.sh); no cargo. The two-layer packs are made again
# here by the same command as there (scripts/device/bench-packs.sh), so the artifacts'
# pack fingerprints match. ONLY=REGEX runs only the packs whose names match. Full output
# per pack goes to $OUT/bench-windows/<pack>.txt. ARCHIVES=DIR reads the artifacts from DIR
# instead of .device/bench-windows (another build of the same packs, for comparisons).
#
# GEMM=T also times each GEMM of the pack at T tokens (`--gemm-tokens`: its weights rotated
# as the GEMVs' are), the path a verify window of T could take instead, and so the GEMMs of
# the tile variants in .device/bench-windows-<variant>/<pack>.tar.xz (made here with
# `strata-compile --gemm-tile ... --gemm-wave-tokens ...`): their times go in the summary
# beside the GEMV's T=1 and T=GEMM.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/bench-packs.sh
bin=${BIN:-.device/bin}
packs=${PACKS:-/tmp/strata-packs}
arts=/tmp/strata-windows
out=${OUT:-/tmp}/bench-windows
mkdir -p "$packs" "$arts" "$out"
shapes='4096x14336|14336x4096'
summary=()
gemm_rows=()
start=$SECONDS
while read -r name preset types _layers; do
    archive=${ARCHIVES:-.device/bench-windows}/$name.tar.xz
    [ -f "$archive" ] || continue
    [ -n "${ONLY:-}" ] && ! [[ "$name" =~ $ONLY ]] && continue
    t0=$SECONDS
    rm -rf "${arts:?}/$name"
    tar -xJf "$archive" -C "$arts"
    pack=$(synth_window_pack "$bin/strata-compile" "$packs" "$name" "$preset" "$types")
    t1=$SECONDS
    gemm=()
    [ -n "${GEMM:-}" ] && gemm=(--gemm-tokens "$GEMM")
    $bin/strata-run bench --pack "$pack" --artifacts "$arts/$name" --ctx 256 --kernels --windows \
        "${gemm[@]}" -p 16 -n 16 -r 1 >"$out/$name.txt" 2>&1
    rc=$?
    if [ -n "${GEMM:-}" ]; then
        for variant in default .device/bench-windows-*/"$name.tar.xz"; do
            txt=$out/$name.txt v=default
            if [ "$variant" != default ]; then
                [ -f "$variant" ] || continue
                v=$(basename "$(dirname "$variant")"); v=${v#bench-windows-}
                rm -rf "${arts:?}/$v" && mkdir -p "$arts/$v" && tar -xJf "$variant" -C "$arts/$v"
                txt=$out/$name-$v.txt
                $bin/strata-run bench --pack "$pack" --artifacts "$arts/$v/$name" --ctx 256 --kernels \
                    "${gemm[@]}" -p 16 -n 16 -r 1 >"$txt" 2>&1 || { tail -3 "$txt"; continue; }
            fi
            # GEMM rows: "gemm_<type>_<shape>  tokens  us  TFLOP/s".
            for shape in ${shapes//|/ }; do
                us=$(awk -v s="_$shape\$" '/^gemm_/ && $1 ~ s { print $3 }' "$txt")
                [ -n "$us" ] && gemm_rows+=("$name|$shape|$v|$us")
            done
        done
    fi
    rm -f "$pack"
    echo "== $name: synth $((t1 - t0)) s, bench $((SECONDS - t1)) s (exit $rc)"
    if [ $rc != 0 ]; then
        tail -5 "$out/$name.txt"
        continue
    fi
    grep -E "^copy bandwidth" "$out/$name.txt"
    # Window rows (indented): "  gemv_<type>_<shape>  T  us  us/token  ratio  GB/s".
    for shape in ${shapes//|/ }; do
        rows=$(awk -v s="_$shape\$" '/^  gemv_/ && $1 ~ s && $2 ~ /^[0-9]+$/' "$out/$name.txt")
        [ -n "$rows" ] || continue
        echo "$rows" | awk '{ printf "%s%s", (NR > 1 ? " " : "  " $1 " T=1.. us: "), $3 } END { print "" }'
        summary+=("$name|$shape|$(echo "$rows" | awk '{ us[$2] = $3; x[$2] = $5 }
            END {
                printf "%s", (1 in us) ? us[1] : "-"
                for (t = 2; t <= 16; t *= 2) printf "|%s", (t in us) ? us[t] : "-"
                printf "|%s", (8 in x) ? x[8] : "-"
            }')")
    done
done < <(bench_packs)
echo
echo "== verify-window GEMV time in us; 4096x14336 = ffn_down, 14336x4096 = ffn_gate/up; goal T=8/T=1 <= 1.25x"
echo "   (total $((SECONDS - start)) s)"
{
    echo "pack|shape|T=1|T=2|T=4|T=8|T=16|T=8/T=1"
    printf '%s\n' "${summary[@]}"
} | awk -F'|' '{ printf "%-18s %-11s %9s %9s %9s %9s %9s %8s\n", $1, $2, $3, $4, $5, $6, $7, $8 }'
if [ -n "${GEMM:-}" ]; then
    echo
    echo "== the same shapes' GEMMs at $GEMM tokens, us (weights rotated); variant: artifacts"
    printf '%s\n' "${gemm_rows[@]}" | awk -F'|' '{ printf "%-18s %-11s %-28s %9s\n", $1, $2, $3, $4 }'
fi
