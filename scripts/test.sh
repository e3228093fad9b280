#!/usr/bin/env bash
# Runs every test on a fresh machine: installs what they need, fetches the default
# model (so the tests on the real pack run instead of skipping), then cargo test.
# Arguments replace --workspace (e.g. `scripts/test.sh -p strata-cli --test run_cli`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
command -v cargo >/dev/null || export PATH="$HOME/.cargo/bin:$PATH" # rustup just installed it
export STRATA_REQUIRE=1
if [ $# -eq 0 ]; then
    set -- --workspace
fi
cargo test --locked "$@"
