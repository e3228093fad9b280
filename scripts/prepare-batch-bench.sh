#!/usr/bin/env bash
# Builds what scripts/device/bench-batch.sh carries, under .device/batch/ (git-ignored):
# this tree's binaries and those of BASE (default: the commit before HEAD's batch-GEMV
# work, 20b9840), xz-compressed, and each one's sm_90 artifacts (--spec 16) of the full
# Llama-8B Q4_0 pack, with this tree's of its two-layer pack, as arts.tar.xz. The packs
# are made in /tmp here and again on the device by the same command
# (scripts/device/bench-packs.sh). Carry .device/batch and .peer/llama.cpp.tar.gz.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/device/bench-packs.sh
base=${BASE:-20b9840}
out=.device/batch
cargo build --release --locked --bins
old=/tmp/strata-base-$base
if [ ! -x "$old/target/release/strata-run" ]; then
    git worktree add -f "$old" "$base" >/dev/null
    (cd "$old" && CARGO_TARGET_DIR="$old/target" cargo build --release --locked --bins)
fi
rm -rf "$out" /tmp/strata-batch-arts && mkdir -p "$out/bin" "$out/binprev" /tmp/strata-packs /tmp/strata-batch-arts
for b in strata-compile strata-run; do
    strip -o "$out/bin/$b" "target/release/$b"
    strip -o "$out/binprev/$b" "$old/target/release/$b"
done
sc=$out/bin/strata-compile
pack=/tmp/strata-packs/llama8b-Q4_0.gguf
[ -f "$pack" ] || synth_bench_pack "$sc" /tmp/strata-packs llama8b-Q4_0 llama-8b Q4_0 -
w2=$(synth_window_pack "$sc" /tmp/strata-packs llama8b-Q4_0 llama-8b Q4_0)
arts=/tmp/strata-batch-arts
$sc --pack "$pack" --target sm_90 --spec 16 --out "$arts/new/llama8b-Q4_0"
$out/binprev/strata-compile --pack "$pack" --target sm_90 --spec 16 --out "$arts/old/llama8b-Q4_0"
$sc --pack "$w2" --target sm_90 --spec 16 --out "$arts/w2/llama8b-Q4_0-w2"
tar -cJf "$out/arts.tar.xz" -C "$arts" .
xz -T2 -6 "$out"/bin/* "$out"/binprev/*
du -sh "$out"/arts.tar.xz "$out"/bin/* "$out"/binprev/*
