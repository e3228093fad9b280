#!/usr/bin/env bash
# Every GPU-side check, run on the device machine from the repo root, with the release
# binaries and artifacts built here and carried in .device/ (scripts/prepare-device.sh
# makes that folder). Prints a summary table last.
set -uo pipefail
dev=.device
strata="$dev/bin/strata-compile"
results=()
record() { results+=("$(printf '%-46s %s' "$1" "$2")"); }

[ -f "$dev/artifacts.tar.xz" ] && tar -xJf "$dev/artifacts.tar.xz" -C "$dev"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
for art in "$dev"/art/*/; do
    art=${art%/}
    name=$(basename "$art")
    pack="$dev/packs/$(cat "$art/PACK")"
    echo "== gemv kernels of $name =="
    if python3 scripts/device/gemv_check.py "$art" "$pack" "$strata"; then
        record "gemv vs CPU reference: $name" PASS
    else
        record "gemv vs CPU reference: $name" FAIL
    fi
    if command -v ptxas >/dev/null && [ -f "$art/module.ptx" ]; then
        arch=$(python3 -c "import tomllib,sys;print(tomllib.load(open(sys.argv[1],'rb'))['target']['built_for'])" "$art/manifest.toml")
        ptxas -arch="$arch" -v "$art/module.ptx" -o /dev/null 2>"$OUT/ptxas-$name.txt"
        regs=$(grep -o 'Used [0-9]* registers' "$OUT/ptxas-$name.txt" | awk '{print $2}' | sort -n | tail -1)
        spills=$(grep -o '[0-9]* bytes spill stores' "$OUT/ptxas-$name.txt" | awk '{s+=$1} END {print s+0}')
        record "ptxas $name: max registers, spill bytes" "$regs, $spills"
    fi
done
for art in "$dev"/art-run/mix-a-int8-*/; do
    art=${art%/}
    name=$(basename "$art")
    echo "== gemv kernels of $name =="
    if python3 scripts/device/gemv_check.py "$art" "$dev/packs/mix-a.gguf" "$strata"; then
        record "gemv vs CPU reference: $name" PASS
    else
        record "gemv vs CPU reference: $name" FAIL
    fi
done
echo "== --checked kernels record out-of-bounds accesses =="
if python3 scripts/device/checked_check.py "$dev/checked/mix-a-sm_90" "$dev/art/mix-a-sm_90"; then
    record "checked: violations recorded, no faults" PASS
else
    record "checked: violations recorded, no faults" FAIL
fi
if python3 scripts/device/gemv_check.py "$dev/checked/mix-a-sm_90" "$dev/packs/mix-a.gguf" "$strata" >"$OUT/gemv-checked.txt"; then
    record "gemv vs CPU reference: checked build" PASS
else
    record "gemv vs CPU reference: checked build" FAIL
fi

# ---- strata-run (issue 4): self-test, CUDA = CPU, refusals, speed beside llama.cpp ----
run="$dev/bin/strata-run"
model=/tmp/strata-model/smollm2.gguf
if [ ! -f "$model" ] && [ -f /tmp/strata-model/a/part ] && [ -f /tmp/strata-model/b/part ]; then
    cat /tmp/strata-model/a/part /tmp/strata-model/b/part >"$model"
fi
export STRATA_CACHE=/tmp/strata-cache
if [ -f "$model" ]; then
    qwen3="$dev/packs/qwen3.gguf"
    for case in "smollm2 sm_90" "qwen3 sm_90" "smollm2 gfx1100-on-sm_90" "qwen3 gfx1100-on-sm_90" \
        "mix-a-int8 sm_90" "mix-a-int8 gfx1100-on-sm_90" "mix-a sm_90" "mix-a gfx1100-on-sm_90" \
        "mix-c sm_90" "mix-c gfx1100-on-sm_90"; do
        set -- $case
        pack=$model; [ "$1" = qwen3 ] && pack=$qwen3; [ "$1" = mix-a-int8 ] && pack=$dev/packs/mix-a.gguf
        [[ "$1" = mix-[ac] ]] && pack=$dev/packs/$1.gguf
        dir=$dev/art-run/$1-$2; [[ "$1" = mix-[ac] ]] && dir=$dev/art/$1-${2%-on-sm_90}
        if "$run" selftest --pack "$pack" --artifacts "$dir" >"$OUT/selftest-$1-$2.txt" 2>&1; then
            record "self-test $1 $2 ($(grep -c ' ok ' "$OUT/selftest-$1-$2.txt") kernels)" PASS
        else
            record "self-test $1 $2" FAIL; tail -3 "$OUT/selftest-$1-$2.txt"
        fi
    done
    same=0
    for prompt in "The capital of France is" "def fibonacci(n):" "Write a haiku about the sea."; do
        chat=(); [ "$prompt" = "Write a haiku about the sea." ] && chat=(--chat)
        "$run" generate --pack "$model" --artifacts "$dev/art-run/smollm2-sm_90" --backend cuda \
            --prompt "$prompt" "${chat[@]}" --max-tokens 64 --ignore-eos >"$OUT/gen-cuda.txt" 2>>"$OUT/gen.log"
        "$run" generate --pack "$model" --backend cpu --prompt "$prompt" "${chat[@]}" --max-tokens 64 --ignore-eos \
            >"$OUT/gen-cpu.txt" 2>>"$OUT/gen.log"
        if cmp -s "$OUT/gen-cuda.txt" "$OUT/gen-cpu.txt"; then same=$((same + 1)); else
            echo "differs for: $prompt"; diff "$OUT/gen-cuda.txt" "$OUT/gen-cpu.txt" | head -5; fi
    done
    record "CUDA greedy = CPU greedy, 64 tokens ($same/3 prompts)" "$([ $same = 3 ] && echo PASS || echo FAIL)"
    # Speculative decoding: greedy output with verify windows equals decoding without,
    # for sm_90's kernels and gfx1100's run through CUDA.
    code=$'Rename the variable `total` to `sum` in this function and return the whole function:\n```python\ndef add_all(values):\n    total = 0\n    for v in values:\n        total = total + v\n    return total\n```'
    for arch in sm_90 gfx1100-on-sm_90; do
        same=0 runs=0
        for prompt in "$code" "The capital of France is" $'for i in range(3):\n    print(i)\nfor i in range(3):\n    print(i)\n'; do
            chat=(); [ "$prompt" = "$code" ] && chat=(--chat)
            gen() { "$run" generate --pack "$model" --artifacts "$dev/art-run/smollm2-$arch" --backend cuda \
                --prompt "$prompt" "${chat[@]}" --max-tokens 96 --ignore-eos "$@" 2>>"$OUT/spec.log"; }
            gen --spec 0 >"$OUT/spec-off.txt"
            for t in 2 4 6 8 16; do
                runs=$((runs + 1))
                gen --spec $t >"$OUT/spec-on.txt"
                if cmp -s "$OUT/spec-off.txt" "$OUT/spec-on.txt"; then same=$((same + 1)); else
                    echo "spec $t differs ($arch): $prompt"; diff "$OUT/spec-off.txt" "$OUT/spec-on.txt" | head -5; fi
            done
            runs=$((runs + 1))
            gen --spec 8 --spec-draft-max 2 --spec-ngram 2 >"$OUT/spec-on.txt"
            cmp -s "$OUT/spec-off.txt" "$OUT/spec-on.txt" && same=$((same + 1))
        done
        record "greedy --spec T = --spec 0, $arch ($same/$runs)" "$([ $same = $runs ] && echo PASS || echo FAIL)"
    done
    grep 'speculative' "$OUT/spec.log" | tail -3
    refuse() { # label, expected text, expected status, command...
        local label=$1 want=$2 status=$3; shift 3
        out=$("$@" 2>&1); rc=$?
        if [ "$rc" = "$status" ] && grep -q -- "$want" <<<"$out"; then record "$label" PASS; else
            record "$label" "FAIL (rc $rc)"; echo "$out" | tail -3; fi
    }
    refuse "refuses artifacts of another pack" "artifacts are for another pack" 1 \
        "$run" selftest --pack "$qwen3" --artifacts "$dev/art-run/smollm2-sm_90"
    refuse "refuses artifacts of another target" "artifacts are for gfx1100; this device is sm_90" 1 \
        "$run" selftest --pack "$model" --artifacts "$dev/art-run/smollm2-gfx1100"
    refuse "self-test names a planted wrong kernel" "kernel rmsnorm_576 does not match" 1 \
        "$run" generate --pack "$model" --artifacts "$dev/art-run/smollm2-fault-wrong" --prompt hi --max-tokens 1
    start=$(date +%s)
    refuse "watchdog names a planted endless loop" "kernel silu_mul_1536 did not finish within 2 s" 3 \
        timeout 60 "$run" generate --pack "$model" --artifacts "$dev/art-run/smollm2-fault-hang" --prompt hi --deadline 2
    echo "hang reported after $(( $(date +%s) - start )) s"
    echo "== speed: strata-run bench beside llama-bench, same GGUF =="
    "$run" bench --pack "$model" --artifacts "$dev/art-run/smollm2-sm_90" -p 512 -n 128 -r 3 2>/dev/null | tee "$OUT/bench-strata.txt"
    record "strata SmolLM2 Q4_1 sm_90" "$(cat "$OUT/bench-strata.txt" | cut -d'(' -f1)"
    echo "== strata-run serve: concurrent streams =="
    "$run" serve --pack "$model" --artifacts "$dev/art-run/smollm2-sm_90" --parallel 8 --port 18080 --ctx 1024 \
        >"$OUT/serve.log" 2>&1 &
    serve_pid=$!
    for _ in $(seq 120); do grep -q ' ready: ' "$OUT/serve.log" && break; sleep 0.5; done
    for clients in 1 8; do
        line=$(python3 scripts/device/serve_bench.py http://127.0.0.1:18080 $clients 256)
        echo "$line"
        record "serve SmolLM2 sm_90, $clients stream(s)" "$(cut -d= -f2 <<<"$line")"
    done
    kill $serve_pid 2>/dev/null
    llb=/tmp/llb/bin/llama-bench
    if [ -x "$llb" ]; then
        "$llb" -m "$model" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o md 2>/dev/null | tee "$OUT/bench-llama.txt"
        pp=$(awk -F'|' '/pp512/ {print $(NF-1)}' "$OUT/bench-llama.txt" | xargs)
        tg=$(awk -F'|' '/tg128/ {print $(NF-1)}' "$OUT/bench-llama.txt" | xargs)
        record "llama.cpp SmolLM2 Q4_1 (llama-bench)" "pp512 $pp t/s  tg128 $tg t/s"
    else
        record "llama.cpp llama-bench" "not built (carry .peer, see docs/DEVELOPING.md)"
    fi
else
    record "strata-run checks" "SKIPPED: the default model was not carried"
fi

echo
echo "== summary =="
printf '%s\n' "${results[@]}"
