#!/usr/bin/env bash
# One host GEMV kernel alone, on one core: its time per call and per 32-weight chunk on
# random weights (each block's f16 scale set to 1.0) and random int8 activations, best of
# 5 repetitions. Weights that fit the L2 (PARTS=16 on a 2048-row matrix: one part of 16)
# time the kernel's arithmetic; a matrix larger than the caches, its streaming.
#
# Usage: scripts/bench-host-kernel.sh ARTIFACTS KERNEL [PARTS] [CALLS]
#   ARTIFACTS  a host artifact directory (module.so, manifest.toml), e.g. the one
#              `strata-run bench --backend host` prints
#   KERNEL     a T=1 GEMV of it, e.g. gemv_iq2_xs_2048x8192 (rows x cols)
set -euo pipefail
art=${1:?usage: scripts/bench-host-kernel.sh ARTIFACTS KERNEL [PARTS] [CALLS]}
kernel=${2:?usage: scripts/bench-host-kernel.sh ARTIFACTS KERNEL [PARTS] [CALLS]}
parts=${3:-1}
calls=${4:-200}
[[ "$kernel" =~ ^gemv_([a-z0-9_]+)_([0-9]+)x([0-9]+)$ ]] || { echo "not a T=1 GEMV name: $kernel" >&2; exit 1; }
quant=${BASH_REMATCH[1]} rows=${BASH_REMATCH[2]} cols=${BASH_REMATCH[3]}
# Row bytes from the manifest's record of the weight buffer `w` (its bytes over the rows).
weights=$(awk -v k="name = \"$kernel\"" '$0 == k { on = 1 } on && /^name = "w"/ { w = 1 } on && w && /^extent = / { print $3; exit }' \
    "$art/manifest.toml")
[ -n "$weights" ] && row_bytes=$((weights / rows)) || row_bytes=""
[ -n "$row_bytes" ] || { echo "no weight row size for $kernel in $art/manifest.toml" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/kbench.c" <<'C'
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef struct { void* const* bufs; const uint32_t* scalars; uint32_t part, parts, phase; uint8_t* scratch; } call_t;
int main(int argc, char** argv) {
    void* lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    void (*kernel)(const call_t*) = (void (*)(const call_t*))dlsym(lib, argv[2]);
    if (!kernel) { fprintf(stderr, "no kernel %s\n", argv[2]); return 1; }
    long rows = atol(argv[3]), cols = atol(argv[4]), row_bytes = atol(argv[5]), block = atol(argv[6]);
    uint32_t parts = atoi(argv[7]); int calls = atoi(argv[8]);
    uint8_t* w = malloc(rows * row_bytes);
    srand(1);
    for (long i = 0; i < rows * row_bytes; ++i) w[i] = rand();
    long block_bytes = row_bytes / (cols / block);
    for (long i = 0; i + 1 < rows * row_bytes; i += block_bytes) w[i] = 0x00, w[i + 1] = 0x3C; // d = 1.0
    int8_t* xq = malloc(cols); float* xd = malloc(cols / 32 * 2 * sizeof(float)); float* y = malloc(rows * sizeof(float));
    for (long i = 0; i < cols; ++i) xq[i] = rand() % 255 - 127;
    for (long i = 0; i < cols / 32 * 2; ++i) xd[i] = 0.01f;
    void* bufs[4] = { w, xq, xd, y };
    uint32_t scalars[4] = { 0 };
    call_t call = { bufs, scalars, 0, parts, 0, 0 };
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int i = 0; i < calls; ++i) kernel(&call);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / calls;
        if (ns < best) best = ns;
    }
    double chunks = (double)rows / parts * cols / 32;
    printf("%s (part 1 of %u): %.1f us a call, %.2f ns a chunk (y[0] = %g)\n", argv[2], parts, best / 1e3, best / chunks, y[0]);
    return 0;
}
C
cc -O2 -o "$dir/kbench" "$dir/kbench.c" -ldl -Wl,--no-as-needed -lm
block=32
case $quant in q2_k|q3_k|q4_k|q5_k|q6_k|iq2_xxs|iq2_xs|iq2_s|iq3_xxs|iq3_s|iq1_s|iq1_m|iq4_xs) block=256 ;; esac
"$dir/kbench" "$(realpath "$art")/module.so" "$kernel" "$rows" "$cols" "$row_bytes" "$block" "$parts" "$calls"
