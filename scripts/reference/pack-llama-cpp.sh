#!/usr/bin/env bash
# Packs the llama.cpp source vendored in the llama-cpp-python 0.3.36 sdist into a small
# tarball (~7 MiB) that can be carried to the GPU device machine (no network there) to build
# llama-bench as a speed reference.
#
# Kept: CMakeLists.txt CMakePresets.json cmake ggml src include common vendor tools licenses
# LICENSE, minus tools/ui, tools/server and tools/cli (only added when LLAMA_BUILD_SERVER=ON).
# The archive holds one top folder, llama.cpp/.
#
# Usage: scripts/reference/pack-llama-cpp.sh [SDIST] [OUT]
#   SDIST  default /tmp/sdist/llama_cpp_python-0.3.36.tar.gz; fetch it with
#          python3 -m pip download --no-deps --no-binary llama-cpp-python \
#              llama-cpp-python==0.3.36 -d /tmp/sdist
#          (--no-binary :all: would also build cmake/ninja from source: very slow)
#   OUT    default .peer/llama.cpp.tar.gz in the repository root
#   VERIFY=1 also runs a CPU-only cmake configure of the packed tree (needs cmake >= 3.14).
#
# On the device machine (configure options verified with CUDA off; CUDA on is the same plus
# -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90):
#   tar -xzf llama.cpp.tar.gz && cmake -S llama.cpp -B llama.cpp/build -DCMAKE_BUILD_TYPE=Release \
#     -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
#     -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
#   cmake --build llama.cpp/build --target llama-bench -j
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
sdist=${1:-/tmp/sdist/llama_cpp_python-0.3.36.tar.gz}
out=${2:-$repo/.peer/llama.cpp.tar.gz}
[[ -f $sdist ]] || { echo "no sdist at $sdist (see the pip download line in this script)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

base=$(basename "$sdist" .tar.gz)  # sdists unpack into NAME-VERSION/
src=$base/vendor/llama.cpp
keep=(CMakeLists.txt CMakePresets.json cmake ggml src include common vendor tools licenses LICENSE)
tar -xzf "$sdist" -C "$work" \
    --exclude="$src/tools/ui" --exclude="$src/tools/server" --exclude="$src/tools/cli" \
    "${keep[@]/#/$src/}"
mv "$work/$src" "$work/llama.cpp"

mkdir -p "$(dirname "$out")"
tar -czf "$out" -C "$work" --owner=0 --group=0 --sort=name llama.cpp
echo "$out: $(du -h "$out" | cut -f1) ($(stat -c %s "$out") bytes)"

if [[ ${VERIFY:-0} == 1 ]]; then
    cmake -S "$work/llama.cpp" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >"$work/configure.log" 2>&1 \
        || { tail -30 "$work/configure.log" >&2; exit 1; }
    grep -q 'llama-bench' "$work/build/Makefile" "$work/build/build.ninja" 2>/dev/null \
        && echo "cmake configure OK; llama-bench target present"
fi
