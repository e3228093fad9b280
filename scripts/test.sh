#!/usr/bin/env bash
# Runs every test on a fresh machine: installs what they need, fetches the default
# model (so the tests on the real pack run instead of skipping), then cargo test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export STRATA_REQUIRE=1
cargo test --workspace --locked
