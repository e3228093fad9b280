#!/usr/bin/env bash
# Builds what scripts/device/gemma3-check.sh needs into .device/gemma3/ (git-ignored):
# the release binaries xz'd (.device/binxz), the sm_90 artifacts and the gfx1100 (wave32)
# kernels rendered for sm_90 of two synthetic gemma3 packs with Gemma 3 270M Q4_K_M's
# type mix (Q5_0 q/k/gate/up, Q8_0 v, Q4_K output, Q6_K down, a Q8_0 embedding): the
# 270M shape (a window of 512 on five layers in six; a byte vocabulary, so every token
# prints) and tiny-gemma3 (a window of 16), and the CPU reference's greedy text for a
# prompt longer than both windows and its scores (the top logits at every position); and the sm_90 artifacts of the 270M shape with its
# whole vocabulary, for the benchmark. The packs
# themselves are written again there by the same deterministic synth command (the 270M
# one is larger than a device call carries).
#
# There: run carry=[".device/binxz", ".device/gemma3", ".peer"]
#   command="bash scripts/device/gemma3-check.sh"
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --bins
dev=.device
rm -rf "$dev/binxz" "$dev/gemma3" && mkdir -p "$dev/binxz" "$dev/gemma3"
for b in strata-compile strata-run; do strip -o "/tmp/$b" "target/release/$b" && xz -T2 -6 -c "/tmp/$b" >"$dev/binxz/$b.xz"; done
sc=target/release/strata-compile
run=target/release/strata-run
prompt=$(cat scripts/device/gemma3-prompt.txt)
while read -r name preset vocab; do
    pack=/tmp/$name.gguf
    $sc synth --preset "$preset" --type Q5_0,Q5_0,Q8_0,Q4_K,Q5_0,Q5_0,Q6_K --embd-type Q8_0 --seed 9 \
        ${vocab:+--vocab "$vocab"} --out "$pack" >/dev/null
    $sc --pack "$pack" --target sm_90 --spec 4 --out "$dev/gemma3/$name-sm_90" >/dev/null
    $sc --pack "$pack" --target gfx1100 --run-on sm_90 --spec 4 --out "$dev/gemma3/$name-gfx1100-on-sm_90" >/dev/null
    $run generate --pack "$pack" --backend cpu --ctx 2048 --prompt "$prompt" --max-tokens 32 --ignore-eos \
        >"$dev/gemma3/$name-cpu.txt" 2>/dev/null
    $run score --pack "$pack" --backend cpu --ctx 2048 --prompt "$prompt" --top-k 4 --json \
        >"$dev/gemma3/$name-cpu-score.json" 2>/dev/null
done <<'PACKS'
g270m gemma3-270m 257
tiny tiny-gemma3
PACKS
# The benchmark's pack: the 270M shape with its whole vocabulary of 262,144 (whose
# padding tokens print nothing, so the check above reads bytes instead).
$sc synth --preset gemma3-270m --type Q5_0,Q5_0,Q8_0,Q4_K,Q5_0,Q5_0,Q6_K --embd-type Q8_0 --seed 9 \
    --out /tmp/g270m-full.gguf >/dev/null
$sc --pack /tmp/g270m-full.gguf --target sm_90 --spec 4 --out "$dev/gemma3/g270m-full-sm_90" >/dev/null
md5sum "$dev"/gemma3/*-cpu.txt
du -sh "$dev/binxz" "$dev/gemma3"
