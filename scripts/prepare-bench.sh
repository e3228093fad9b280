#!/usr/bin/env bash
# Builds what scripts/device/bench-decode.sh needs into .device/ (git-ignored): release
# binaries and sm_90 artifacts of the Llama-8B-shape benchmark packs. The packs (2 to
# 5 GiB each) are made in /tmp here and again on the device by the same deterministic
# command (scripts/device/bench-packs.sh); only the artifacts travel. ONLY=REGEX makes
# only the packs whose names match; the MoE packs of scripts/device/bench-moe.sh (9 GiB)
# only so (ONLY='^qwen3moe' scripts/prepare-bench.sh).
#
# SWEEP=REGEX also builds, for the packs whose names match, the variants that
# bench-decode.sh times beside the default in the same run: bench-r1 and bench-r4 (one
# and four rows per wave in the int8 GEMVs) and bench-serial (no programmatic dependent
# launch: a copy of sm_90 with grid_dependency off).
#
# WINDOWS=1 instead builds what scripts/device/bench-windows.sh needs: for the five
# single-type 8B packs (or ONLY=REGEX), artifacts with every verify window up to
# SPEC (default 16) of two-layer packs, as .device/bench-windows/<pack>.tar.xz (about
# 6 MiB of PTX a pack, 0.5 MiB compressed), and for scripts/device/bench-spec.sh the
# artifacts of the full Q4_0 pack with windows up to 16, as
# .device/bench-windows/e2e-llama8b-Q4_0.tar.xz.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/device/bench-packs.sh
cargo build --release --locked --bins
mkdir -p .device/bin /tmp/strata-packs
for b in strata-compile strata-run; do strip -o ".device/bin/$b" "target/release/$b"; done
sc=.device/bin/strata-compile

if [ "${WINDOWS:-0}" != 0 ]; then
    only=${ONLY:-$WINDOW_PACKS}
    mkdir -p .device/bench-windows
    work=$(mktemp -d /tmp/strata-windows.XXXXXX)
    while read -r name preset types _layers; do
        [[ "$name" =~ $only ]] || continue
        pack=$(synth_window_pack "$sc" /tmp/strata-packs "$name" "$preset" "$types")
        $sc --pack "$pack" --target sm_90 --spec "${SPEC:-16}" --out "$work/$name"
        tar -cJf ".device/bench-windows/$name.tar.xz" -C "$work" "$name"
        rm -f "$pack"
    done < <(bench_packs)
    synth_bench_pack "$sc" /tmp/strata-packs llama8b-Q4_0 llama-8b Q4_0 -
    $sc --pack /tmp/strata-packs/llama8b-Q4_0.gguf --target sm_90 --spec 16 --out "$work/e2e-llama8b-Q4_0"
    tar -cJf .device/bench-windows/e2e-llama8b-Q4_0.tar.xz -C "$work" e2e-llama8b-Q4_0
    rm -f /tmp/strata-packs/llama8b-Q4_0.gguf
    du -sh "$work"/*
    rm -rf "$work"
    ls -l .device/bench-windows
    du -sh .device/bin .device/bench-windows
    exit 0
fi

mkdir -p .device/bench
while read -r name preset types layers; do
    [ -n "${ONLY:-}" ] && ! [[ "$name" =~ $ONLY ]] && continue
    # The 9 GiB MoE packs (scripts/device/bench-moe.sh) only when ONLY names them.
    [ -z "${ONLY:-}" ] && [[ "$name" =~ $MOE_PACKS ]] && continue
    pack=/tmp/strata-packs/$name.gguf
    synth_bench_pack "$sc" /tmp/strata-packs "$name" "$preset" "$types" "$layers"
    $sc --pack "$pack" --target sm_90 --spec "${SPEC:-4}" --out ".device/bench/$name"
    if [ -n "${SWEEP:-}" ] && [[ "$name" =~ $SWEEP ]]; then
        sed 's/^grid_dependency = true.*/grid_dependency = false/' targets/sm_90.toml >/tmp/strata-sm_90-serial.toml
        $sc --pack "$pack" --target sm_90 --spec "${SPEC:-4}" --q8-rows 1 --out ".device/bench-r1/$name"
        $sc --pack "$pack" --target sm_90 --spec "${SPEC:-4}" --q8-rows 4 --out ".device/bench-r4/$name"
        $sc --pack "$pack" --target /tmp/strata-sm_90-serial.toml --spec "${SPEC:-4}" --out ".device/bench-serial/$name"
    fi
    rm -f "$pack"
done < <(bench_packs)
du -sh .device/bin .device/bench*
