#!/usr/bin/env bash
# The host backend beside llama.cpp's CPU build, in one run on this machine: SmolLM2-135M
# Q4_1 (real) and Llama-1B-shape Q4_0 and IQ2_XS packs (synthetic, random valid blocks),
# prompt (pp512) and decode (tg128), both on the same threads (default: physical cores),
# then this machine's read bandwidth and the decode's share of it.
#
# Usage: scripts/bench-host.sh LLAMA_BENCH [THREADS]
#   LLAMA_BENCH  llama-bench of a CPU build of the llama.cpp in the llama-cpp-python
#                0.3.36 sdist (see ../shared/PEERS.md: -DGGML_CUDA=OFF, the no-AMX flags)
set -euo pipefail
cd "$(dirname "$0")/.."
peer=${1:?usage: scripts/bench-host.sh LLAMA_BENCH [THREADS]}
threads=${2:-}
cargo build --release --locked --bins >/dev/null
bin="${CARGO_TARGET_DIR:-target}/release"
packs=$(mktemp -d)
trap 'rm -rf "$packs"' EXIT
model=$(scripts/fetch-model.sh)
"$bin/strata-compile" synth --preset llama-1b --type Q4_0 --embd-type Q4_0 --seed 8 --out "$packs/llama1b-Q4_0.gguf" >/dev/null
"$bin/strata-compile" synth --preset llama-1b --type IQ2_XS --embd-type Q4_0 --seed 8 --out "$packs/llama1b-IQ2_XS.gguf" >/dev/null
results=()
for pack in "$model" "$packs/llama1b-Q4_0.gguf" "$packs/llama1b-IQ2_XS.gguf"; do
    line=$("$bin/strata-run" bench -m "$pack" --backend host ${threads:+--threads "$threads"} \
        -p 512 -n 128 -r 3 --llama-bench "$peer" 2>/dev/null | tail -2 | tr '\n' ' ')
    bytes=$(stat -c %s "$pack")
    results+=("$(basename "$pack" .gguf) $bytes $line")
done
# Read bandwidth: THREADS threads each summing its part of a 1 GiB buffer (best of 5).
cat >"$packs/bw.c" <<'C'
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define N (1ul << 28)
static unsigned* a; static int parts; static unsigned sums[64];
static void* sum(void* p) { long i = (long)p; unsigned s = 0; for (size_t k = N / parts * i; k < N / parts * (i + 1); ++k) s += a[k]; sums[i] = s; return 0; }
int main(int c, char** v) {
    parts = atoi(v[1]); a = malloc(N * 4); for (size_t k = 0; k < N; ++k) a[k] = 1;
    double best = 0;
    for (int r = 0; r < 6; ++r) {
        struct timespec t0, t1; pthread_t t[64]; clock_gettime(CLOCK_MONOTONIC, &t0);
        for (long i = 0; i < parts; ++i) pthread_create(&t[i], 0, sum, (void*)i);
        for (int i = 0; i < parts; ++i) pthread_join(t[i], 0);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
        if (r > 0 && N * 4 / s > best) best = N * 4 / s;
    }
    printf("%.1f\n", best / 1e9 + (sums[0] == 12345u));
}
C
clang-19 -O3 -march=native -pthread -o "$packs/bw" "$packs/bw.c"
bw=$("$packs/bw" "${threads:-$(nproc)}")
echo
printf '%-18s %8s %8s %8s %8s %7s %7s %8s\n' pack pp512 llama tg128 llama pp tg "GB/s"
for r in "${results[@]}"; do
    python3 - "$bw" $r <<'PY'
import re, sys
bw, name, size, text = float(sys.argv[1]), sys.argv[2], int(sys.argv[3]), " ".join(sys.argv[4:])
pp, tg = map(float, re.search(r"pp512 ([\d.]+) t/s.*?tg128 ([\d.]+) t/s", text).groups())
lpp, ltg = map(float, re.search(r"llama.cpp pp512 ([\d.]+) t/s\s+tg128 ([\d.]+) t/s", text).groups())
print("%-18s %8.1f %8.1f %8.1f %8.1f %6.2fx %6.2fx %8.1f" % (name, pp, lpp, tg, ltg, pp / lpp, tg / ltg, tg * size / 1e9))
PY
done
echo "read bandwidth (all threads): $bw GB/s; GB/s = decode t/s x pack bytes"
