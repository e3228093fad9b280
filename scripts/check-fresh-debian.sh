#!/usr/bin/env bash
# Checks that the README's two commands work on a fresh Debian 12: makes a minimal
# Debian 12 root with debootstrap, clones this repository (its committed HEAD) into it
# and runs scripts/run-default.sh, then scripts/test.sh, inside it with chroot, timing
# each step. Needs root, network access to a Debian mirror and to PyPI.
#
#   sudo scripts/check-fresh-debian.sh [ROOT]        # default ROOT /tmp/deb12
#
# Rust: where rustup's downloads are reachable, leave the host's toolchain out
# (CHECK_HOST_RUST=0) and setup.sh installs the pinned version inside. Otherwise (the
# default) the host's ~/.rustup and ~/.cargo/bin are bind-mounted read-only and its
# cargo registry through a writable overlay (the crates' sources, so the build needs no
# crates.io).
# Environment:
#   CHECK_TEST_ARGS   arguments for scripts/test.sh (default: the whole workspace), e.g.
#                     "-p strata-cli --test run_cli"
#   CHECK_TARGET_DIR  a host directory used as CARGO_TARGET_DIR inside (reuses compiled
#                     dependencies: faster, less fresh); default a new one in the root
#   CHECK_SKIP_TESTS  set to skip scripts/test.sh
#   CHECK_SKIP_DEFAULT set to skip scripts/run-default.sh (test.sh still runs setup.sh)
#   MIRROR            the Debian mirror (default http://deb.debian.org/debian)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
root=${1:-/tmp/deb12}
mirror=${MIRROR:-http://deb.debian.org/debian}
[ "$(id -u)" -eq 0 ] || {
    echo "check-fresh-debian: needs root (debootstrap, mount, chroot)" >&2
    exit 1
}
stamp() { date -u +%H:%M:%S; }
timed() {
    local name=$1 t0 rc=0
    shift
    t0=$(date +%s)
    echo "== $(stamp) $name" >&2
    "$@" || rc=$?
    echo "== $(stamp) $name: exit $rc after $(($(date +%s) - t0)) s" >&2
    return $rc
}

command -v debootstrap >/dev/null || timed "apt-get install debootstrap" apt-get install -y -qq debootstrap
if [ ! -e "$root/etc/debian_version" ]; then
    timed "debootstrap bookworm" debootstrap --variant=minbase bookworm "$root" "$mirror" >/dev/null
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
# Local CAs the host trusts (a TLS-intercepting proxy's, say): without them pip cannot
# reach PyPI from inside. ca-certificates' install (by setup.sh) adds them to the bundle.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    [ ! -x "$root/usr/sbin/update-ca-certificates" ] || chroot "$root" update-ca-certificates >/dev/null 2>&1 || true
fi

mounted=()
bind() { # bind SRC DEST [ro]
    mkdir -p "$root$2"
    mount --bind "$1" "$root$2"
    mounted=("$root$2" "${mounted[@]}")
    [ "${3:-}" != ro ] || mount -o remount,bind,ro "$root$2"
}
overlay=""
cleanup() {
    for m in "${mounted[@]}"; do umount -l "$m" 2>/dev/null || true; done
    [ -z "$overlay" ] || rm -rf "$overlay"
}
trap cleanup EXIT
bind /proc /proc
bind /dev /dev
bind /dev/pts /dev/pts
bind /sys /sys ro

path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
if [ "${CHECK_HOST_RUST:-1}" = 1 ] && [ -d "$HOME/.rustup" ]; then
    bind "$HOME/.rustup" /root/.rustup ro
    bind "$HOME/.cargo/bin" /root/.cargo/bin ro
    # The registry, writable without touching the host's: an overlay.
    overlay=$(mktemp -d /tmp/check-fresh-debian.XXXXXX)
    mkdir -p "$overlay/upper" "$overlay/work" "$root/root/.cargo/registry"
    mount -t overlay overlay -o "lowerdir=$HOME/.cargo/registry,upperdir=$overlay/upper,workdir=$overlay/work" \
        "$root/root/.cargo/registry"
    mounted=("$root/root/.cargo/registry" "${mounted[@]}")
    path=/root/.cargo/bin:$path
fi
target=/root/strata/target
if [ -n "${CHECK_TARGET_DIR:-}" ]; then
    bind "$CHECK_TARGET_DIR" /root/target
    target=/root/target
fi

rm -rf "$root/root/strata"
git clone -q "$repo" "$root/root/strata"

inside() {
    chroot "$root" /usr/bin/env -i HOME=/root PATH="$path" TERM=dumb LANG=C.UTF-8 \
        CARGO_HOME=/root/.cargo RUSTUP_HOME=/root/.rustup CARGO_TARGET_DIR="$target" \
        /bin/bash -c "cd /root/strata && $*"
}
echo "== installed before: $(chroot "$root" dpkg-query -W -f '${binary:Package}\n' | wc -l) packages" >&2
chroot "$root" dpkg-query -W -f '${binary:Package}\n' | sort >"$root/root/packages-before.txt"
rc=0
if [ -z "${CHECK_SKIP_DEFAULT:-}" ]; then
    timed "scripts/run-default.sh" inside scripts/run-default.sh || rc=$?
fi
chroot "$root" dpkg-query -W -f '${binary:Package}\n' | sort >"$root/root/packages-after.txt"
echo "== setup installed: $(comm -13 "$root/root/packages-before.txt" "$root/root/packages-after.txt" | wc -l) packages:" \
    "$(comm -13 "$root/root/packages-before.txt" "$root/root/packages-after.txt" | grep -E '^(clang|lld|llvm|gcc|libc6-dev|python3|curl|ca-certificates)' | tr '\n' ' ')" >&2
if [ -z "${CHECK_SKIP_TESTS:-}" ]; then
    timed "scripts/test.sh ${CHECK_TEST_ARGS:-}" inside scripts/test.sh "${CHECK_TEST_ARGS:-}" || rc=$?
fi
exit $rc
