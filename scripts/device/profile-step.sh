#!/usr/bin/env bash
# Where one decode step's time goes, kernel by kernel: Nsight Compute times every kernel
# of a short generation (each alone, clocks and caches left as they are) and the kernels
# of the last decode step are summed by name. Needs .device/bin and .device/bench/<pack>
# (scripts/prepare-bench.sh). Usage: profile-step.sh PACK_NAME (a line of bench-packs.txt).
# PROMPT="..." WIDEST=1 sums the pass with the most kernel time instead (a prompt's
# chunk or window); LAUNCHES=N profiles only the first N kernels.
set -euo pipefail
cd "$(dirname "$0")/../.."
name=${1:-llama8b-IQ2_XS}
bin=.device/bin
packs=${PACKS:-/tmp/strata-packs}
mkdir -p "$packs"
read -r _ preset types layers < <(grep "^$name " scripts/device/bench-packs.txt)
extra=()
[ "$layers" != "-" ] && extra=(--layers "$layers")
pack=$packs/$name.gguf
[ -f "$pack" ] || $bin/strata-compile synth --preset "$preset" --type "$types" --seed 8 "${extra[@]}" --out "$pack" >/dev/null
csv=${OUT:-/tmp}/profile-$name.csv
limit=()
[ -n "${LAUNCHES:-}" ] && limit=(--launch-count "$LAUNCHES")
ncu "${limit[@]}" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --print-units base \
    $bin/strata-run generate --pack "$pack" --artifacts ".device/bench/$name" --prompt "${PROMPT:-hi}" --max-tokens 3 \
    2>/dev/null | grep '^"' >"$csv"
WIDEST=${WIDEST:-0} python3 - "$csv" <<'PY'
import csv, os, sys, collections
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["Metric Name"] == "gpu__time_duration.sum"]
names = [r["Kernel Name"] for r in rows]
# A pass runs from an embedding kernel to the next. The last decode step, or (WIDEST=1)
# the pass with the most kernel time.
embeds = [i for i, n in enumerate(names) if n.startswith("embed_")]
passes = [rows[a:b] for a, b in zip(embeds, embeds[1:] + [len(rows)])]
us = lambda p: sum(float(r["Metric Value"].replace(",", "")) for r in p)
step = max(passes, key=us) if os.environ["WIDEST"] == "1" else passes[-1]
total = collections.OrderedDict()
for r in step:
    t, n = total.get(r["Kernel Name"], (0.0, 0))
    total[r["Kernel Name"]] = (t + float(r["Metric Value"].replace(",", "")) / 1e3, n + 1)
all_us = sum(t for t, _ in total.values())
print(f"one pass: {len(step)} kernels, {all_us:.1f} us of kernel time (each kernel alone)")
print(f"{'kernel':<40} {'launches':>8} {'total us':>10} {'us each':>9} {'share':>6}")
for n, (t, c) in sorted(total.items(), key=lambda kv: -kv[1][0]):
    print(f"{n:<40} {c:>8} {t:>10.1f} {t / c:>9.2f} {100 * t / all_us:>5.1f}%")
PY
