#!/usr/bin/env bash
# Installs what strata's build and tests need on a fresh machine, then fetches the
# default model. Idempotent; uses sudo for apt only when not root.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages the tests need beyond a Rust toolchain and python3: Debian's clang-19
# builds every kernel (CUDA -> PTX, HIP -> code objects, no vendor SDK), lld-19 links the
# AMD code objects, llvm-19's llvm-readelf reads their resource notes.
packages=(clang-19 lld-19 llvm-19)
missing=()
for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

scripts/fetch-model.sh >/dev/null
