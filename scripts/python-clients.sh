#!/usr/bin/env bash
# Makes (or checks) the Python venv of the client tests (cli/tests/openai_clients.rs) and
# prints its python: the official `openai` client, LangChain's OpenAI adapter
# (`langchain-openai`, with the `langchain-core` it runs on) and `jsonschema`, at the
# versions pinned here, in ${STRATA_CACHE:-~/.cache/strata}/clients-venv. A venv of their
# own: the system's python may be "externally managed", and its packages are left alone.
# Needs python3 >= 3.11 (langchain-openai's floor) with venv and ensurepip (Debian/Ubuntu:
# python3-venv, which scripts/setup.sh installs) and PyPI. Idempotent: a venv that holds
# every pinned version is kept as it is, without asking PyPI.
set -euo pipefail
cache="${STRATA_CACHE:-$HOME/.cache/strata}"
venv="$cache/clients-venv"
pins=(openai==3.63.0 langchain-openai==1.8.1 langchain-core==1.8.3 jsonschema==4.26.0)

die() {
    echo "python-clients: $*" >&2
    exit 1
}

# Whether the venv holds every pinned version.
pinned() {
    [ -x "$venv/bin/python" ] && "$venv/bin/python" - "${pins[@]}" >/dev/null 2>&1 <<'PY'
import sys
from importlib.metadata import version
sys.exit(any(version(name) != want for name, want in (p.split("==") for p in sys.argv[1:])))
PY
}

if ! pinned; then
    command -v python3 >/dev/null || die "no python3: install python3 (3.11 or newer, with venv)"
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || die "python3 is $(python3 -c 'import platform; print(platform.python_version())'); langchain-openai needs 3.11 or newer"
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1 \
        || die "python3 has no venv with ensurepip: install python3-venv (Debian/Ubuntu), or run scripts/setup.sh"
    if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
        echo "python-clients: making a venv at $venv" >&2
        mkdir -p "$cache"
        python3 -m venv --clear "$venv"
    fi
    echo "python-clients: pip install ${pins[*]}" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}" >&2 \
        || die "pip could not install ${pins[*]} into $venv"
    pinned || die "$venv still lacks one of ${pins[*]}"
fi
echo "$venv/bin/python"
