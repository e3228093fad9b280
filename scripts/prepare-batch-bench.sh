#!/usr/bin/env bash
# Builds what scripts/device/bench-batch.sh carries, under .device/batch/ (git-ignored):
# this tree's binaries and those of BASE (default: the commit before HEAD's batch-GEMV
# work, 20b9840), xz-compressed, and each one's sm_90 artifacts (--spec 16) of the full
# Llama-8B Q4_0 pack, with this tree's of its two-layer pack, as arts.tar.xz. The packs
# are made in /tmp here and again on the device by the same command
# (scripts/device/bench-packs.sh). Carry .device/batch and .peer/llama.cpp.tar.gz.
#
# FLAGS="..." compiles this tree's artifacts (new and w2) with those strata-compile
# options; with BASE=. the old build is this tree too, without them: one binary, the
# rule against a variant (e.g. FLAGS="--gemv-mma-one-round false" BASE=.).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/device/bench-packs.sh
base=${BASE:-20b9840}
out=.device/batch
cargo build --release --locked --bins
old=/tmp/strata-base-$base
[ "$base" = . ] && old=$PWD
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
# shellcheck disable=SC2086 # FLAGS: several options
$sc --pack "$pack" --target sm_90 --spec 16 ${FLAGS:-} --out "$arts/new/llama8b-Q4_0"
$out/binprev/strata-compile --pack "$pack" --target sm_90 --spec 16 --out "$arts/old/llama8b-Q4_0"
# shellcheck disable=SC2086
$sc --pack "$w2" --target sm_90 --spec 16 ${FLAGS:-} --out "$arts/w2/llama8b-Q4_0-w2"
# The two-layer pack without FLAGS too, so that the kernel tables compare the variant.
[ -n "${FLAGS:-}" ] && $sc --pack "$w2" --target sm_90 --spec 16 --out "$arts/w2old/llama8b-Q4_0-w2"
tar -cJf "$out/arts.tar.xz" -C "$arts" .
xz -T2 -6 "$out"/bin/* "$out"/binprev/*
du -sh "$out"/arts.tar.xz "$out"/bin/* "$out"/binprev/*
