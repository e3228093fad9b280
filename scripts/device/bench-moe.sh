#!/usr/bin/env bash
# Mixture-of-experts decode with a GPU expert cache: tg32 of the Qwen3-30B-A3B-shape packs
# (random weights, IQ2_XS and IQ1_M: 8.6 and 6.7 GiB; made there by the same synth command
# as in scripts/prepare-bench.sh, single-threaded, 38 and 22 s on the build machine) on the
# device machine, per pack:
#   (a) every expert resident on the GPU (`strata-run bench`, no --expert-cache);
#   (b) --expert-cache 50%, 25% and 10%: that share of the experts' bytes cached on the
#       GPU, the rest streamed from host memory over PCIe on a miss; strata-run's line
#       "experts: R of E resident (P% of M MiB), hit H%, S MiB/token streamed, stall T
#       ms/token, pcie G GB/s" gives the cache's hit rate, the bytes streamed a token and
#       the time a token waited for them;
#   (c) llama.cpp's llama-bench on the same pack: all on the GPU (-ngl 99), the peer of
#       (a), and with the experts in host memory, computed by the CPU (-ot exps=CPU), the
#       peer of (b). SKIP_LLAMA=1 leaves it out.
# Prints a summary table last: t/s, ratio to llama.cpp (resident to resident, cache rows
# to -ot exps=CPU), hit %, MiB/token streamed, stall ms/token.
#
# Here: ONLY='^qwen3moe' scripts/prepare-bench.sh (release binaries, .device/bench/qwen3moe-*).
# There, one pack a call (each run loads the whole pack: a pack's synth, its four strata
# runs and two llama-bench runs may fill much of one 10-minute call; the packs stay in
# /tmp/strata-packs while the machine is warm):
#   run carry=[".device/bin", ".device/bench", ".peer/llama.cpp.tar.gz"]
#       command="PACKS=qwen3moe-IQ2_XS bash scripts/device/bench-moe.sh"
#   then the same with PACKS=qwen3moe-IQ1_M.
# Without /tmp/llb/bin/llama-bench (a warm machine keeps it) and without carried
# .peer/llama-bench.xz.part-* (carry those instead of the .tar.gz where you have them),
# llama-bench is built from .peer/llama.cpp.tar.gz in the background while the pack is
# made (about 4 minutes; the strata runs wait for it, so that nothing else loads the CPU
# while they are timed) and handed back as $OUT/peer/llama-bench.xz.part-*: copy those
# into .peer/ here for later calls.
#
# PACKS (names of bench-packs.txt, comma- or space-separated; default both), BUDGETS
# (cache percentages, default 50,25,10), CTX (default 4096), PACK_DIR (default
# /tmp/strata-packs), DEADLINE (seconds from the start after which no run starts and
# running ones are cut; default 560, for the 600-second call). Full output goes to
# $OUT/bench-moe/<pack>.txt (one file a pack, all runs), the table to summary.txt.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. scripts/device/bench-packs.sh
bin=.device/bin
run=$bin/strata-run
dir=${PACK_DIR:-/tmp/strata-packs}
out=${OUT:-/tmp}/bench-moe
work=/tmp/bench-moe-work
names=${PACKS:-qwen3moe-IQ2_XS,qwen3moe-IQ1_M}
names=${names//,/ }
budgets=${BUDGETS:-50,25,10}
budgets=${budgets//,/ }
ctx=${CTX:-4096}
deadline=${DEADLINE:-560}
n=32
llama=/tmp/llb/bin/llama-bench
mkdir -p "$dir" "$out" "$work"
export STRATA_CACHE=/tmp/strata-cache
start=$SECONDS
notes=()
declare -A tg hit mib stall

# Seconds left before the deadline.
left() { echo $((deadline - (SECONDS - start))); }

nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null || true
df -h "$dir" | tail -1

# llama-bench: unpacked at once, or built in the background while the packs are made.
build_pid=
if [ "${SKIP_LLAMA:-0}" != 0 ]; then
    notes+=("llama.cpp skipped (SKIP_LLAMA=1)")
elif [ -x "$llama" ] || compgen -G ".peer/llama-bench.xz.part-*" >/dev/null; then
    bash scripts/device/llama-bench.sh || notes+=("llama.cpp skipped: unpacking llama-bench failed")
elif [ -f .peer/llama.cpp.tar.gz ]; then
    echo "== building llama-bench from .peer/llama.cpp.tar.gz in the background (about 4 min)"
    EXPORT_DIR=${OUT:-/tmp}/peer bash scripts/device/llama-bench.sh >"$work/llama-build.log" 2>&1 &
    build_pid=$!
else
    notes+=("llama.cpp skipped: no llama-bench (carry .peer/llama.cpp.tar.gz or .peer/llama-bench.xz.part-*)")
fi

# make_pack NAME PRESET TYPES LAYERS: DIR/NAME.gguf unless there; made in DIR/.part and
# moved, so that a cut synth leaves no pack behind (synth names the pack after the file's
# stem, not its folder).
make_pack() {
    local name=$1 lim t0=$SECONDS
    [ -f "$dir/$name.gguf" ] && return 0
    lim=$(left)
    if [ "$lim" -lt 60 ]; then
        echo "   synth $name: out of time"
        return 1
    fi
    rm -rf "$dir/.part"
    mkdir -p "$dir/.part"
    if timeout "$lim" bash -c '. scripts/device/bench-packs.sh && synth_bench_pack "$@"' _ \
        "$bin/strata-compile" "$dir/.part" "$@" && mv "$dir/.part/$name.gguf" "$dir/$name.gguf"; then
        echo "   synth $name: $((SECONDS - t0)) s, $(du -h "$dir/$name.gguf" | cut -f1)"
    else
        echo "   synth $name failed or was cut after $((SECONDS - t0)) s"
        rm -rf "$dir/.part"
        return 1
    fi
}

# strata NAME LABEL ARGS...: tg$n of one configuration into tg/hit/mib/stall[NAME,LABEL].
strata() {
    local name=$1 label=$2
    shift 2
    local f=$work/$name-$label lim rc=0 t0=$SECONDS line
    lim=$(left)
    if [ "$lim" -lt 30 ]; then
        tg[$name,$label]="time"
        echo "   $label: out of time"
        return
    fi
    timeout "$lim" "$run" bench --pack "$dir/$name.gguf" --artifacts ".device/bench/$name" --ctx "$ctx" \
        -p 0 -n $n -r 1 "$@" >"$f.txt" 2>"$f.log" || rc=$?
    {
        echo "### $label: strata-run bench -p 0 -n $n -r 1 --ctx $ctx $* (exit $rc, $((SECONDS - t0)) s)"
        cat "$f.txt"
        echo "--- stderr"
        cat "$f.log"
        echo
    } >>"$out/$name.txt"
    if [ $rc != 0 ]; then
        tg[$name,$label]=$([ $rc = 124 ] && echo cut || echo fail)
        echo "   $label: exit $rc$([ $rc = 124 ] && echo ", cut at $lim s")"
        tail -3 "$f.log"
        return
    fi
    tg[$name,$label]=$(grep -oE "tg$n [0-9.]+ t/s" "$f.txt" | awk '{ print $2 }' | head -1)
    # The stats line (stdout), not the placement line of the load (stderr, no "hit").
    line=$(cat "$f.txt" "$f.log" | grep -m1 -E 'experts: [0-9]+ of [0-9]+ resident .*, hit ' || true)
    hit[$name,$label]=$(sed -nE 's/.*, hit ([^%]+)%.*/\1/p' <<<"$line")
    mib[$name,$label]=$(sed -nE 's/.* ([^ ]+) MiB\/token streamed.*/\1/p' <<<"$line")
    stall[$name,$label]=$(sed -nE 's/.*stall ([^ ]+) ms\/token.*/\1/p' <<<"$line")
    echo "   $label: tg$n ${tg[$name,$label]:-?} t/s ($((SECONDS - t0)) s)${line:+; ${line#*experts: }}"
}

# llama_run NAME LABEL ARGS...: llama-bench tg$n into tg[NAME,LABEL].
llama_run() {
    local name=$1 label=$2
    shift 2
    local f=$work/$name-$label lim rc=0 t0=$SECONDS
    lim=$(($(left) - 5))
    if [ "$lim" -lt 30 ]; then
        tg[$name,$label]="time"
        echo "   $label: out of time"
        return
    fi
    timeout "$lim" "$llama" -m "$dir/$name.gguf" -ngl 99 -fa 1 -p 0 -n $n -r 1 "$@" -o jsonl \
        >"$f.jsonl" 2>"$f.log" || rc=$?
    {
        echo "### $label: llama-bench -ngl 99 -fa 1 -p 0 -n $n -r 1 $* -o jsonl (exit $rc, $((SECONDS - t0)) s)"
        cat "$f.jsonl"
        echo "--- stderr"
        cat "$f.log"
        echo
    } >>"$out/$name.txt"
    tg[$name,$label]=$(llama_tg_rates "$f.jsonl" 2>/dev/null | awk 'NR == 1 { print $2 }')
    if [ -z "${tg[$name,$label]}" ]; then
        tg[$name,$label]=$([ $rc = 124 ] && echo cut || echo fail)
        echo "   $label: exit $rc$([ $rc = 124 ] && echo ", cut at $lim s")"
        tail -3 "$f.log"
        return
    fi
    echo "   $label: tg$n ${tg[$name,$label]} t/s ($((SECONDS - t0)) s)"
}

echo "== packs: $names (in $dir)"
declare -A ready
for name in $names; do
    read -r _ preset types layers < <(bench_packs | awk -v n="$name" '$1 == n') || true
    if [ -z "${preset:-}" ]; then
        echo "   $name: not in scripts/device/bench-packs.txt"
        notes+=("$name: not in bench-packs.txt")
        continue
    fi
    rm -f "$out/$name.txt"
    if make_pack "$name" "$preset" "$types" "$layers"; then
        ready[$name]=1
    else
        notes+=("$name: no pack (synth cut, failed or out of time)")
    fi
    preset=
done
echo "   ($((SECONDS - start)) s)"

if [ -n "$build_pid" ]; then
    echo "== waiting for the llama-bench build"
    while kill -0 "$build_pid" 2>/dev/null && [ "$(left)" -gt 15 ]; do sleep 2; done
    if kill -0 "$build_pid" 2>/dev/null; then
        notes+=("llama-bench still building at the deadline (/tmp/llb; a warm call goes on from there)")
    elif wait "$build_pid"; then
        echo "   built; parts in ${OUT:-/tmp}/peer ($((SECONDS - start)) s)"
    else
        notes+=("llama-bench build failed: ${OUT:-/tmp}/bench-moe/llama-build.log")
        cp "$work/llama-build.log" "$out/llama-build.log"
        tail -5 "$work/llama-build.log"
    fi
fi

for name in $names; do
    [ -n "${ready[$name]:-}" ] || continue
    echo "== $name"
    if [ -d ".device/bench/$name" ]; then
        strata "$name" resident
        for b in $budgets; do strata "$name" "cache-$b" --expert-cache "$b%"; done
    else
        echo "   no artifacts .device/bench/$name (ONLY='^qwen3moe' scripts/prepare-bench.sh here)"
        notes+=("$name: no artifacts")
    fi
    if [ -x "$llama" ] && [ "${SKIP_LLAMA:-0}" = 0 ]; then
        llama_run "$name" llama
        llama_run "$name" llama-cpu -ot exps=CPU
    fi
done

echo
echo "== tg$n t/s, Qwen3-30B-A3B shape (H200); total $((SECONDS - start)) s"
for note in "${notes[@]}"; do echo "   $note"; done
{
    echo "pack|config|t/s|vs llama.cpp|hit %|MiB/token|stall ms/tok"
    for name in $names; do
        [ -n "${ready[$name]:-}" ] || continue
        for label in resident $(for b in $budgets; do echo "cache-$b"; done) llama llama-cpu; do
            case $label in
            resident) config=resident peer=llama ;;
            cache-*) config="cache ${label#cache-}%" peer=llama-cpu ;;
            llama) config=llama.cpp peer= ;;
            llama-cpu) config="llama.cpp -ot exps=CPU" peer= ;;
            esac
            rate=${tg[$name,$label]:--}
            ratio=-
            if [ -n "$peer" ]; then
                ratio=$(awk -v a="$rate" -v b="${tg[$name,$peer]:-}" \
                    'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2fx", a / b; else print "-" }')
            fi
            echo "$name|$config|$rate|$ratio|${hit[$name,$label]:--}|${mib[$name,$label]:--}|${stall[$name,$label]:--}"
        done
    done
} | awk -F'|' '{ printf "%-16s %-23s %8s %13s %6s %10s %13s\n", $1, $2, $3, $4, $5, $6, $7 }' | tee "$out/summary.txt"
