# Sourced, here and on the device: the benchmark packs of bench-packs.txt and the one
# `synth` command that makes each, so that both sides make the same pack. Artifacts are
# checked against the pack's fingerprint, which covers its metadata, and `synth` names
# the pack after the file: the file name is part of the pack. Needs bash.

# Layers of the verify-window benchmark's packs (scripts/device/bench-windows.sh): two
# layers hold every GEMV shape of the full model and are quicker to make and upload.
WINDOW_LAYERS=2
# The packs it times by default (names in bench-packs.txt).
WINDOW_PACKS='^llama8b-(Q4_0|IQ2_XS|IQ1_M|IQ3_S|IQ3_XXS)$'
# The mixture-of-experts packs (Qwen3-30B-A3B shape, about 9 GiB each), timed by
# scripts/device/bench-moe.sh: prepare-bench.sh and bench-decode.sh make and time them
# only when ONLY names them.
MOE_PACKS='^qwen3moe-'

# The lines "name preset types layers" of bench-packs.txt.
bench_packs() {
    grep -v '^#' "$(dirname "${BASH_SOURCE[0]}")/bench-packs.txt"
}

# synth_bench_pack STRATA_COMPILE DIR NAME PRESET TYPES LAYERS: writes DIR/NAME.gguf
# (LAYERS "-": the preset's).
synth_bench_pack() {
    local sc=$1 dir=$2 name=$3 preset=$4 types=$5 layers=$6
    local extra=()
    [ "$layers" != "-" ] && extra=(--layers "$layers")
    "$sc" synth --preset "$preset" --type "$types" --seed 8 "${extra[@]}" --out "$dir/$name.gguf" >/dev/null
}

# llama_tg_rates JSONL: "depth t/s" for each decode-only test llama-bench -o jsonl finished.
llama_tg_rates() {
    python3 -c '
import json, sys
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0:
        print(r.get("n_depth", 0), "%.1f" % r["avg_ts"])
' "$1"
}

# synth_window_pack STRATA_COMPILE DIR NAME PRESET TYPES: the verify-window benchmark's
# pack of NAME (WINDOW_LAYERS layers); prints its path.
synth_window_pack() {
    local stem=$3-w$WINDOW_LAYERS
    synth_bench_pack "$1" "$2" "$stem" "$4" "$5" "$WINDOW_LAYERS" && echo "$2/$stem.gguf"
}
