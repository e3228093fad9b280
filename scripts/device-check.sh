#!/usr/bin/env bash
# Every GPU-side check, run on the device machine from the repo root, with the release
# binaries and artifacts built here and carried in .device/ (scripts/prepare-device.sh
# makes that folder). Prints a summary table last.
set -uo pipefail
dev=.device
strata="$dev/bin/strata-compile"
results=()
record() { results+=("$(printf '%-46s %s' "$1" "$2")"); }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
for art in "$dev"/art/*/; do
    art=${art%/}
    name=$(basename "$art")
    pack="$dev/packs/$(cat "$art/PACK")"
    echo "== gemv kernels of $name =="
    if python3 scripts/device/gemv_check.py "$art" "$pack" "$strata"; then
        record "gemv vs CPU reference: $name" PASS
    else
        record "gemv vs CPU reference: $name" FAIL
    fi
    if command -v ptxas >/dev/null && [ -f "$art/module.ptx" ]; then
        arch=$(python3 -c "import tomllib,sys;print(tomllib.load(open(sys.argv[1],'rb'))['target']['built_for'])" "$art/manifest.toml")
        ptxas -arch="$arch" -v "$art/module.ptx" -o /dev/null 2>"$OUT/ptxas-$name.txt"
        regs=$(grep -o 'Used [0-9]* registers' "$OUT/ptxas-$name.txt" | awk '{print $2}' | sort -n | tail -1)
        spills=$(grep -o '[0-9]* bytes spill stores' "$OUT/ptxas-$name.txt" | awk '{s+=$1} END {print s+0}')
        record "ptxas $name: max registers, spill bytes" "$regs, $spills"
    fi
done
echo "== --checked kernels record out-of-bounds accesses =="
if python3 scripts/device/checked_check.py "$dev/checked/mix-a-sm_90" "$dev/art/mix-a-sm_90"; then
    record "checked: violations recorded, no faults" PASS
else
    record "checked: violations recorded, no faults" FAIL
fi
if python3 scripts/device/gemv_check.py "$dev/checked/mix-a-sm_90" "$dev/packs/mix-a.gguf" "$strata" >"$OUT/gemv-checked.txt"; then
    record "gemv vs CPU reference: checked build" PASS
else
    record "gemv vs CPU reference: checked build" FAIL
fi
echo
echo "== summary =="
printf '%s\n' "${results[@]}"
