#!/usr/bin/env bash
# Gemma 3 on the device: for two synthetic gemma3 packs (Gemma 3 270M's shape and type
# mix, and tiny-gemma3), the self-test of every kernel on sm_90 and of the gfx1100 kernels
# rendered for sm_90; the logits at every position of a prompt longer than the sliding
# windows (scripts/device/score_compare.py), and greedy generation after it (with SPEC=1
# also with --spec 4), each compared with the CPU reference's made there; then decode and prompt speed of the 270M shape with its whole vocabulary
# (self-tested by the benchmark's start) beside llama.cpp's llama-bench on the same GGUF.
# Prints a table last.
#
# Here: scripts/prepare-gemma3-check.sh. There: run carry=[".device/binxz",
# ".device/gemma3", ".peer"] command="bash scripts/device/gemma3-check.sh"
# (EXPORT_DIR=$OUT hands a fresh llama-bench build back, see llama-bench.sh; PEER=0
# skips the benchmark and only self-tests its pack).
set -uo pipefail
cd "$(dirname "$0")/../.."
dev=.device
mkdir -p /tmp/gbin
for b in strata-compile strata-run; do xz -dc "$dev/binxz/$b.xz" >"/tmp/gbin/$b" && chmod +x "/tmp/gbin/$b"; done
sc=/tmp/gbin/strata-compile
run=/tmp/gbin/strata-run
export STRATA_CACHE=/tmp/strata-cache
log=${OUT:-/tmp}/gemma3-check.txt
: >"$log"
prompt=$(cat scripts/device/gemma3-prompt.txt)
rows=()
row() { rows+=("$(printf '%-40s %s' "$1" "$2")"); echo "ROW ${rows[-1]}" >>"$log"; }
while read -r name preset vocab; do
    pack=/tmp/$name.gguf
    $sc synth --preset "$preset" --type Q5_0,Q5_0,Q8_0,Q4_K,Q5_0,Q5_0,Q6_K --embd-type Q8_0 --seed 9 \
        ${vocab:+--vocab "$vocab"} --out "$pack" >/dev/null
    for art in "$dev/gemma3/$name-sm_90" "$dev/gemma3/$name-gfx1100-on-sm_90"; do
        tag=$(basename "$art")
        if $run selftest --pack "$pack" --artifacts "$art" --ctx 2048 >/tmp/selftest.txt 2>&1; then
            row "self-test $tag" "PASS ($(grep -c ' ok ' /tmp/selftest.txt) kernels)"
        else
            row "self-test $tag" "FAIL: $(grep -v ' ok ' /tmp/selftest.txt | tail -1)"
        fi
        { echo "== self-test $tag"; cat /tmp/selftest.txt; } >>"$log"
        $run score --pack "$pack" --artifacts "$art" --ctx 2048 --prompt "$prompt" --top-k 4 --json \
            >/tmp/score.json 2>/tmp/err.txt
        row "$tag scores = CPU" "$(python3 scripts/device/score_compare.py /tmp/score.json "$dev/gemma3/$name-cpu-score.json" 2>&1 | tail -1)"
        for flags in "" ${SPEC:+"--spec 4"}; do
            # shellcheck disable=SC2086
            if ! $run generate --pack "$pack" --artifacts "$art" --ctx 2048 --prompt "$prompt" --max-tokens 32 --ignore-eos \
                $flags >/tmp/got.txt 2>/tmp/err.txt; then
                row "$tag ${flags:-greedy}" "FAIL: $(tail -1 /tmp/err.txt)"
            elif cmp -s /tmp/got.txt "$dev/gemma3/$name-cpu.txt"; then
                row "$tag ${flags:-greedy} = CPU" "PASS ($(tail -1 /tmp/err.txt | grep -o 'decode [0-9]* tokens at [0-9.]* t/s'))"
            else
                row "$tag ${flags:-greedy} = CPU" "FAIL (cuda $(md5sum </tmp/got.txt | cut -c1-8), cpu $(md5sum <"$dev/gemma3/$name-cpu.txt" | cut -c1-8))"
            fi
            { echo "== generate $tag $flags"; cat /tmp/got.txt /tmp/err.txt; } >>"$log"
        done
    done
done <<'PACKS'
g270m gemma3-270m 257
tiny tiny-gemma3
PACKS
$sc synth --preset gemma3-270m --type Q5_0,Q5_0,Q8_0,Q4_K,Q5_0,Q5_0,Q6_K --embd-type Q8_0 --seed 9 \
    --out /tmp/g270m-full.gguf >/dev/null
if [ "${PEER:-1}" = 0 ]; then
    $run selftest --pack /tmp/g270m-full.gguf --artifacts "$dev/gemma3/g270m-full-sm_90" --ctx 2048 >/tmp/selftest.txt 2>&1 &&
        row "self-test g270m-full-sm_90" "PASS ($(grep -c ' ok ' /tmp/selftest.txt) kernels)" ||
        row "self-test g270m-full-sm_90" "FAIL: $(grep -v ' ok ' /tmp/selftest.txt | tail -1)"
elif bash scripts/device/llama-bench.sh >>"$log" 2>&1; then
    $run bench --pack /tmp/g270m-full.gguf --artifacts "$dev/gemma3/g270m-full-sm_90" --ctx 4096 -p 512 -n 128 -r 3 \
        --llama-bench /tmp/llb/bin/llama-bench >/tmp/bench.txt 2>&1
    { echo "== bench g270m"; cat /tmp/bench.txt; } >>"$log"
    row "bench g270m strata" "$(grep -o 'pp512 [0-9.]* t/s' /tmp/bench.txt | head -1) $(grep -o 'tg128 [0-9.]* t/s' /tmp/bench.txt | head -1)"
    row "bench g270m llama.cpp" "$(grep -o 'llama.cpp pp512 [0-9.]* t/s  tg128 [0-9.]* t/s' /tmp/bench.txt)"
    row "bench g270m ratio" "$(grep -oE '(pp|tg) [0-9.]*x' /tmp/bench.txt | tr '\n' ' ')"
else
    row "llama-bench" "FAIL (see log)"
fi
echo
printf '%s\n' "${rows[@]}" | tee -a "$log"
