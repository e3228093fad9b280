#!/usr/bin/env bash
# Puts llama.cpp's llama-bench (CUDA, sm_90, static ggml) at /tmp/llb/bin/llama-bench on the
# device machine, the peer every benchmark here is measured beside; with an argument, that
# tool instead (`llama-batched-bench`, the serving peer of scripts/device/bench-serve.sh).
#
# Either from an earlier build carried as .peer/<tool>.xz.part-* (fast), or built from
# .peer/llama.cpp.tar.gz (scripts/reference/pack-llama-cpp.sh; about 4 minutes on 16
# cores). With EXPORT_DIR set, a fresh build is also written there as xz parts of at most
# 15 MiB, so the device call can hand it back and later calls carry it instead.
set -euo pipefail
tool=${1:-llama-bench}
bin=/tmp/llb/bin/$tool
[ -x "$bin" ] && exit 0
mkdir -p /tmp/llb/bin
if compgen -G ".peer/$tool.xz.part-*" >/dev/null; then
    cat .peer/"$tool".xz.part-* | xz -d >"$bin"
    chmod +x "$bin"
    exit 0
fi
src=/tmp/llama-src
mkdir -p "$src"
tar -xzf .peer/llama.cpp.tar.gz -C "$src" --strip-components=1
cmake -S "$src" -B /tmp/llb/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >/tmp/llb/cmake.log
cmake --build /tmp/llb/build -j16 --target "$tool" >/tmp/llb/build.log
strip -o "$bin" /tmp/llb/build/bin/"$tool"
if [ -n "${EXPORT_DIR:-}" ]; then
    mkdir -p "$EXPORT_DIR"
    xz -T16 -6 -c "$bin" | split -b 15M -d - "$EXPORT_DIR/$tool.xz.part-"
    ls -la "$EXPORT_DIR"
fi
