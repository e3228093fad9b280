#!/usr/bin/env bash
# Proves a refactor left the generated kernels alone: renders every test pack for all nine
# targets (plain and --checked, verify windows up to 16, QSA) with strata-compile built at
# BASE and at the working tree (`--emit-only`: no toolchain needed), then compares the
# kernel records (plan.toml) and the module sources byte for byte. Kernel signatures
# may differ (they are generated from the records since issue 20): those kernels are
# counted, and any other difference fails.
#
#   scripts/compare-generated.sh BASE_REV      # e.g. a0d2a16, the commit before issue 20's
#                                              # redesign (BASE must know --emit-only)
set -euo pipefail
cd "$(dirname "$0")/.."
base_rev=${1:?usage: scripts/compare-generated.sh BASE_REV}
work=${COMPARE_DIR:-target/compare}
rm -rf "$work/base" "$work/new" "$work/packs" && mkdir -p "$work/packs"

if [ ! -d "$work/tree" ]; then git worktree add --detach -f "$work/tree" "$base_rev" >/dev/null; fi
git -C "$work/tree" checkout -q --detach "$base_rev"
(cd "$work/tree" && CARGO_TARGET_DIR="$PWD/../target-base" cargo build -q --release --locked -p strata-cli --bin strata-compile)
cargo build -q --release --locked -p strata-cli --bin strata-compile
old="$work/target-base/release/strata-compile"
new=target/release/strata-compile

$new synth --preset tiny-llama --type IQ1_M,IQ2_XS,IQ3_XXS,IQ3_S,Q4_0,Q4_1,Q8_0,Q4_K,Q6_K \
    --out "$work/packs/mix-a.gguf" --seed 1 >/dev/null
$new synth --preset tiny-qwen3moe --type Q5_0,Q5_1,Q2_K,Q3_K,Q5_K,IQ2_XXS,IQ2_S,IQ1_S,IQ4_NL,IQ4_XS,F16,BF16,F32 \
    --embd-type Q4_K --out "$work/packs/mix-b.gguf" --seed 2 >/dev/null
$new synth --preset tiny-qwen3 --type Q4_K,Q6_K,Q8_0 --out "$work/packs/qwen3.gguf" --seed 3 >/dev/null
$new synth --preset tiny-qwen3moe --type IQ2_XS,IQ1_M,Q4_K --out "$work/packs/moe-a.gguf" --seed 11 >/dev/null
$new synth --preset llama-8b --layers 1 --vocab 512 --type IQ1_M,Q4_0,IQ3_S --out "$work/packs/llama8b.gguf" >/dev/null
model=$(scripts/fetch-model.sh 2>/dev/null || true)
[ -n "$model" ] && ln -sf "$(realpath "$model")" "$work/packs/smollm2.gguf"

cases=0
for pack in "$work"/packs/*.gguf; do
    p=$(basename "$pack" .gguf)
    for target in targets/*.toml; do
        t=$(basename "$target" .toml)
        for mode in plain checked; do
            flags=(--spec 16)
            [ "$mode" = checked ] && flags+=(--checked)
            case_name="$p-$t-$mode"
            $old --pack "$pack" --target "$t" "${flags[@]}" --emit-only --out "$work/base/$case_name" 2>/dev/null
            $new --pack "$pack" --target "$t" "${flags[@]}" --emit-only --out "$work/new/$case_name" 2>/dev/null
            cases=$((cases + 1))
        done
    done
done

python3 - "$work" "$cases" <<'EOF'
import pathlib, re, sys

work, cases = pathlib.Path(sys.argv[1]), int(sys.argv[2])
signature = re.compile(r"(STRATA_KERNEL\(\d+\)\nvoid (\w+))\((.*?)\) \{", re.S)

def normalized(text):
    """The module with each kernel's parameter list replaced by its name alone."""
    return signature.sub(lambda m: f"{m.group(1)}(...) {{", text)

def params(text):
    return {m.group(2): m.group(3) for m in signature.finditer(text)}

def kernel_records(path):
    """plan.toml from its first kernel record on (the options before it were renamed)."""
    text = path.read_text()
    return text[text.index("[[kernels]]"):]

def words(text):
    return " ".join(text.split())

failed, kernels, signatures, wrapped, identical = [], 0, 0, 0, 0
for base in sorted((work / "base").iterdir()):
    new = work / "new" / base.name
    if kernel_records(base / "plan.toml") != kernel_records(new / "plan.toml"):
        failed.append(f"{base.name}: kernel records differ")
    [old_src] = base.glob("module.*")
    new_src = new / old_src.name
    a, b = old_src.read_text(), new_src.read_text()
    if normalized(a) != normalized(b):
        failed.append(f"{base.name}: module source differs outside kernel signatures")
    identical += a == b
    pa, pb = params(a), params(b)
    kernels += len(pa)
    signatures += sum(1 for k in pa if words(pb.get(k, "")) != words(pa[k]))
    wrapped += sum(1 for k in pa if pb.get(k) != pa[k] and words(pb.get(k, "")) == words(pa[k]))

print(f"{cases} cases, {kernels} kernels: kernel records identical in {cases - sum('records' in f for f in failed)}, "
      f"modules byte-identical in {identical}; {wrapped} kernel signatures differ only in line breaks, "
      f"{signatures} in their parameters; {sum('outside' in f for f in failed)} modules differ elsewhere")
for f in failed:
    print("DIFFERS:", f)
sys.exit(1 if failed else 0)
EOF
