#!/usr/bin/env bash
# Builds what scripts/device/bench-decode.sh needs into .device/ (git-ignored): release
# binaries and sm_90 artifacts of the Llama-8B-shape benchmark packs. The packs (2 to
# 5 GiB each) are made in /tmp here and again on the device by the same deterministic
# command; only the artifacts travel.
#
# SWEEP=REGEX also builds, for the packs whose names match, the variants that
# bench-decode.sh times beside the default in the same run: bench-r1 and bench-r4 (one
# and four rows per wave in the int8 GEMVs) and bench-serial (no programmatic dependent
# launch: a copy of sm_90 with grid_dependency off).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --bins
mkdir -p .device/bin .device/bench /tmp/strata-packs
for b in strata-compile strata-run; do strip -o ".device/bin/$b" "target/release/$b"; done
sc=.device/bin/strata-compile
while read -r name preset types layers; do
    extra=()
    [ "$layers" != "-" ] && extra=(--layers "$layers")
    pack=/tmp/strata-packs/$name.gguf
    $sc synth --preset "$preset" --type "$types" --seed 8 "${extra[@]}" --out "$pack" >/dev/null
    $sc --pack "$pack" --target sm_90 --spec "${SPEC:-4}" --out ".device/bench/$name"
    if [ -n "${SWEEP:-}" ] && [[ "$name" =~ $SWEEP ]]; then
        sed 's/^grid_dependency = true.*/grid_dependency = false/' targets/sm_90.toml >/tmp/strata-sm_90-serial.toml
        $sc --pack "$pack" --target sm_90 --spec "${SPEC:-4}" --q8-rows 1 --out ".device/bench-r1/$name"
        $sc --pack "$pack" --target sm_90 --spec "${SPEC:-4}" --q8-rows 4 --out ".device/bench-r4/$name"
        $sc --pack "$pack" --target /tmp/strata-sm_90-serial.toml --spec "${SPEC:-4}" --out ".device/bench-serial/$name"
    fi
    rm -f "$pack"
done < <(grep -v '^#' scripts/device/bench-packs.txt)
du -sh .device/bin .device/bench*
