#!/usr/bin/env bash
# Runs every test on a fresh machine: installs what they need, fetches the default
# model and the Gemma 3 test pack (so the tests on real packs run instead of
# skipping), then cargo test.
# Arguments replace --workspace (e.g. `scripts/test.sh -p strata-cli --test run_cli`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/fetch-gemma3.sh >/dev/null # the Gemma 3 tests' real pack
command -v cargo >/dev/null || export PATH="$HOME/.cargo/bin:$PATH" # rustup just installed it
export STRATA_REQUIRE=1
if [ $# -eq 0 ]; then
    set -- --workspace
fi
cargo test --locked "$@"
