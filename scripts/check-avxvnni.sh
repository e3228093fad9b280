#!/usr/bin/env bash
# The x86_64-v3-vnni kernels of a pack, self-tested on a CPU without AVX-VNNI but with
# AVX-512 VNNI (Zen 4, Sapphire Rapids): its module built again with the EVEX form of the
# same instruction (_mm256_dpbusd_epi32 for _mm256_dpbusd_avx_epi32, identical results),
# recorded as built for this CPU's target (x86_64-v4), then `strata-run selftest` against the
# reference. This machine has no AVX-VNNI CPU to run the real build on.
#
# Usage: scripts/check-avxvnni.sh PACK
set -euo pipefail
cd "$(dirname "$0")/.."
pack=${1:?usage: scripts/check-avxvnni.sh PACK}
bin="${CARGO_TARGET_DIR:-target}/release"
cargo build --release --locked --bins >/dev/null
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$bin/strata-compile" --pack "$pack" --target x86_64-v3-vnni --out "$dir" >/dev/null
sed -i 's/_mm256_dpbusd_avx_epi32/_mm256_dpbusd_epi32/g' "$dir/module.cc"
# The manifest's own clang command, with the EVEX instruction set in place of -mavxvnni
# (__AVXVNNI__ still selects the AVX-VNNI code paths).
mapfile -t cmd < <(awk -F'"' '/^command = \[/ { for (i = 2; i < NF; i += 2) print $i; exit }' "$dir/manifest.toml")
for i in "${!cmd[@]}"; do [ "${cmd[$i]}" = -mavxvnni ] && cmd[$i]=-D__AVXVNNI__; done
"${cmd[@]}" -mavx512vl -mavx512vnni -Wno-macro-redefined
grep -qw avx512_vnni /proc/cpuinfo || { echo "needs an x86_64-v4 CPU (AVX-512 VNNI)" >&2; exit 1; }
sed -i '/^\[target\]/,/^$/ s/^name = "x86_64-v3-vnni"/name = "x86_64-v4"/' "$dir/manifest.toml"
"$bin/strata-run" selftest --pack "$pack" --backend host --artifacts "$dir" --ctx 256
