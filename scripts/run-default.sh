#!/usr/bin/env bash
# Sets up and runs the main job on the default model (SmolLM2-135M-Instruct Q4_1):
# installs what is needed, fetches the model (sha256-checked), builds, describes the pack
# and asks it a chat question on the detected device (compiling its kernels into the cache
# first; the CPU when there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
command -v cargo >/dev/null || export PATH="$HOME/.cargo/bin:$PATH" # rustup just installed it
model=$(scripts/fetch-model.sh)
cargo build --release --locked --bins
bin="${CARGO_TARGET_DIR:-target}/release"
report=$(mktemp)
trap 'rm -f "$report"' EXIT
"$bin/strata-compile" inspect "$model" >"$report"
sed -n '1,7p' "$report"
"$bin/strata-run" generate --pack "$model" --chat --prompt "What is the capital of France?" --max-tokens 128
