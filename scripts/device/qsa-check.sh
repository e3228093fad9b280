#!/usr/bin/env bash
# QSA (query-aware block-sparse decode attention) on the device machine, with SmolLM2:
# `strata-run selftest` of sm_90's kernels and gfx1100's run through CUDA must pass the
# kernels QSA touches (rope_store, attention, attention_sparse, attention_merge,
# qsa_score, qsa_select); and passkey retrieval from a prompt of about 8k tokens (the
# key at 25, 50 and 75% of it, scripts/device/passkey.py) decoded greedily with
# --qsa off and --qsa on at budgets of 1024 and 2048 tokens, each answer compared with
# the dense one. Prints a summary table last; exits 1 when a check fails.
#
# Here: scripts/prepare-device.sh. There, from the repo root, SmolLM2's two pieces
# (docs/DEVELOPING.md, "GPU checks") in two calls, the second within the machine's 30 warm seconds:
#   run carry=[".device-model/b"]
#       command="mkdir -p /tmp/strata-model/b && cp .device-model/b/part /tmp/strata-model/b/"
#   run carry=[".device-model/a", ".device/bin", ".device/artifacts.tar.xz"]
#       command="bash scripts/device/qsa-check.sh"
# (the script copies any piece it is carried with to /tmp/strata-model; a later call on
# the warm machine needs neither piece and can add ".device/packs" for the qwen3 pack's
# self-test). ARCHS="sm_90" limits the passkey runs to one architecture; TOKENS=N
# changes the prompt length (default 7600, about 8050 of SmolLM2's tokens: prompt and
# answer fit --ctx 8192). Full output goes to $OUT/qsa-check.
set -euo pipefail
cd "$(dirname "$0")/../.."
dev=.device
run=$dev/bin/strata-run
out=${OUT:-/tmp}/qsa-check
key=68341
mkdir -p "$out"
export STRATA_CACHE=/tmp/strata-cache
# Always from the carried archive: a warm machine may hold an older art-run.
rm -rf "$dev/art-run" && tar -xJf "$dev/artifacts.tar.xz" -C "$dev" art-run
for piece in a b; do
    if [ -f .device-model/$piece/part ]; then
        mkdir -p /tmp/strata-model/$piece && cp .device-model/$piece/part /tmp/strata-model/$piece/part
        rm -f /tmp/strata-model/smollm2.gguf
    fi
done
model=/tmp/strata-model/smollm2.gguf
if [ ! -f "$model" ] && [ -f /tmp/strata-model/a/part ] && [ -f /tmp/strata-model/b/part ]; then
    cat /tmp/strata-model/a/part /tmp/strata-model/b/part >"$model"
fi
[ -f "$model" ] || { echo "SmolLM2 was not carried ahead to /tmp/strata-model (docs/DEVELOPING.md, GPU checks)"; exit 1; }
checks=() rows=() fails=0
record() { checks+=("$(printf '%-52s %s' "$1" "$2")"); [[ "$2" == PASS* ]] || fails=$((fails + 1)); }

echo "== self-test: the kernels QSA touches"
for case in "smollm2 sm_90" "smollm2 gfx1100-on-sm_90" "qwen3 sm_90" "qwen3 gfx1100-on-sm_90"; do
    set -- $case
    pack=$model; [ "$1" = qwen3 ] && pack=$dev/packs/qwen3.gguf
    [ -f "$pack" ] || continue
    log=$out/selftest-$1-$2.txt
    rc=0; "$run" selftest --pack "$pack" --artifacts "$dev/art-run/$1-$2" >"$log" 2>&1 || rc=$?
    echo "-- $1 $2 (exit $rc)"
    grep -E '^(rope_store|attention|qsa_score|qsa_select)_' "$log" || tail -3 "$log"
    missing=()
    for k in rope_store attention attention_sparse attention_merge qsa_score qsa_select; do
        # The dense attention's name is attention_<heads>x..., the others' attention_<word>_.
        pat="^${k}_[^ ]* +ok "; [ $k = attention ] && pat='^attention_[0-9][^ ]* +ok '
        grep -qE "$pat" "$log" || missing+=("$k")
    done
    if [ $rc = 0 ] && [ ${#missing[@]} = 0 ]; then record "self-test $1 $2, QSA kernels ok" PASS; else
        record "self-test $1 $2, QSA kernels ok" "FAIL (exit $rc; not ok: ${missing[*]:-none})"; fi
done

echo "== passkey, about ${TOKENS:-7600} tokens, greedy, dense vs QSA"
answer() { tr '\n' ' ' <"$1" | sed 's/^ *//; s/ *$//' | cut -c1-24; }
for arch in ${ARCHS:-sm_90 gfx1100-on-sm_90}; do
    for depth in 0.25 0.5 0.75; do
        prompt=$(python3 scripts/device/passkey.py --tokens "${TOKENS:-7600}" --depth "$depth" --key $key)
        row="$arch|$depth"
        for mode in off 1024 2048; do
            q=(--qsa off); [ $mode != off ] && q=(--qsa on --qsa-budget $mode)
            f=$out/passkey-$arch-$depth-$mode
            rc=0
            "$run" generate --pack "$model" --artifacts "$dev/art-run/smollm2-$arch" --backend cuda \
                --prompt "$prompt" --ctx 8192 --prefill 512 --max-tokens 8 "${q[@]}" >"$f.txt" 2>"$f.log" || rc=$?
            if [ $rc != 0 ]; then
                echo "-- $arch depth $depth qsa $mode: exit $rc"; tail -3 "$f.log"
                [ $mode = off ] && row+="|?"
                row+="|exit $rc|FAIL"; fails=$((fails + 1)); continue
            fi
            if [ $mode = off ]; then
                n=$(grep -oE 'prefill [0-9]+ tokens' "$f.log" | awk '{print $2}' || true)
                grep -q $key "$f.txt" && found=yes || found=no
                row+="|${n:-?}|\"$(answer "$f.txt")\"|$found"
            elif [ -f "$out/passkey-$arch-$depth-off.txt" ] && cmp -s "$out/passkey-$arch-$depth-off.txt" "$f.txt"; then
                row+="|\"$(answer "$f.txt")\"|PASS"
            else
                row+="|\"$(answer "$f.txt")\"|FAIL"; fails=$((fails + 1))
            fi
        done
        rows+=("$row")
        echo "$row"
    done
done

echo
echo "== summary: passkey ($key) answers, 8 greedy tokens; PASS = the same text as dense (--qsa off)"
{
    echo "arch|key at|prompt|dense answer|key?|QSA-1024 answer|=dense|QSA-2048 answer|=dense"
    printf '%s\n' "${rows[@]}"
} | awk -F'|' '{ printf "%-17s %6s %6s %-26s %4s  %-26s %6s  %-26s %6s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }'
printf '%s\n' "${checks[@]}"
echo "$fails failed"
[ $fails = 0 ]
