#!/usr/bin/env python3
"""Prints, for the NVIDIA kernels of an artifacts directory, the registers and spills ptxas
gives them, the blocks an SM holds at once (by registers and shared memory) and the rounds
of blocks the grid takes, and the instruction mix of each one's busiest loop (the backward
branch's body holding the most matrix-unit instructions, the innermost of those): what a
kernel spends per product, read from the SASS without a GPU.

    scripts/sass-loops.py ARTIFACTS_DIR [KERNEL_REGEX]

Needs ptxas ($STRATA_PTXAS or on the PATH) and cuobjdump with nvdisasm beside it (on the
PATH): the CUDA toolkit, or without one the PyPI wheels nvidia-cuda-nvcc-cu12 (ptxas),
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm (docs/DEVELOPING.md).
"""
import collections
import os
import re
import subprocess
import sys
import tempfile
import tomllib

artifacts = sys.argv[1]
wanted = re.compile(sys.argv[2] if len(sys.argv) > 2 else ".")
manifest = tomllib.load(open(f"{artifacts}/manifest.toml", "rb"))
arch = manifest["target"]["name"]
if not arch.startswith("sm_"):
    sys.exit(f"{arch}: not an NVIDIA build (scripts/amd-occupancy.py reads AMD ones)")
ptxas = os.environ.get("STRATA_PTXAS", "ptxas")
device = tomllib.load(open(f"{os.path.dirname(__file__)}/../targets/{arch}.toml", "rb"))["device"]
launches = {k["name"]: k["launch"] for k in manifest["kernels"]}


def occupancy(kernel, registers):
    """(blocks an SM holds at once, rounds of blocks the grid takes): registers by the
    block's threads, shared memory with the 1 KiB a block NVIDIA reserves."""
    launch = launches.get(kernel)
    grid = launch and launch["grid"][0]
    if not isinstance(grid, int) or not isinstance(registers, int):
        return "?", "?"
    threads, shared = launch["threads"], launch.get("shared_bytes", 0)
    by_registers = device["registers_per_cu"] // max(registers * threads, 1)
    by_shared = (device["shared_bytes_opt_in"] + 1024) // (shared + 1024)
    blocks = max(min(by_registers, by_shared, 32), 1)
    return blocks, f"{grid / (blocks * device['compute_units']):.2f}"


with tempfile.TemporaryDirectory() as tmp:
    cubin = f"{tmp}/module.cubin"
    report = subprocess.run([ptxas, f"-arch={arch}", "-v", f"{artifacts}/module.ptx", "-o", cubin],
                            capture_output=True, text=True, check=True).stderr
    sass = subprocess.run(["cuobjdump", "-sass", cubin], capture_output=True, text=True, check=True).stdout

# ptxas -v: each entry's registers and spilled bytes.
resources, name = {}, None
for line in report.splitlines():
    if m := re.search(r"entry function '(\w+)'", line):
        name = m.group(1)
    elif name and (m := re.search(r"(\d+) bytes spill stores", line)):
        resources.setdefault(name, {})["spills"] = int(m.group(1))
    elif name and (m := re.search(r"Used (\d+) registers", line)):
        resources.setdefault(name, {})["registers"] = int(m.group(1))

MATRIX = ("HMMA", "IMMA", "HGMMA", "IGMMA")
# The 4-way int8 dot (dp4a): a one-column GEMV's loop has one per four weights a lane.
DOTS = ("IDP",)


def busiest_loop(body):
    """(mma count, int8 dot count, opcodes) of the innermost loop body with the most
    matrix-unit instructions, else the most int8 dots (the shortest of those that hold as
    many), else of the shortest loop."""
    code = []
    for line in body.splitlines():
        if m := re.search(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)([.\w]*)(.*)", line):
            code.append((int(m.group(1), 16), m.group(2), m.group(4)))
    best = None
    for at, op, rest in code:
        target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if target and int(target.group(1), 16) < at:
            ops = [o for a, o, _ in code if int(target.group(1), 16) <= a <= at]
            mma = sum(o in MATRIX for o in ops)
            dots = sum(o in DOTS for o in ops)
            if best is None or (mma, dots, -len(ops)) > (best[0], best[1], -len(best[2])):
                best = (mma, dots, ops)
    return best


print(f"{arch}, {len(manifest['kernels'])} kernels, pack {manifest['pack']['file']}\n")
print("| kernel | registers | spilled bytes | blocks an SM | rounds | loop instructions | matrix-unit | a product | int8 dots | a weight | most frequent |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
for m in re.finditer(r"Function : (\w+)\n(.*?)(?=\n\s*Function : |\Z)", sass, re.S):
    kernel, body = m.group(1), m.group(2)
    if not wanted.search(kernel):
        continue
    r = resources.get(kernel, {})
    blocks, rounds = occupancy(kernel, r.get("registers"))
    head = f"| {kernel} | {r.get('registers', '?')} | {r.get('spills', '?')} | {blocks} | {rounds}"
    loop = busiest_loop(body)
    if loop is None:
        print(f"{head} | no loop | | | | | |")
        continue
    mma, dots, ops = loop
    mix = collections.Counter(ops).most_common(8)
    each = f"{len(ops) / mma:.1f}" if mma else ""
    # Issue slots a weight of a one-column dot loop: each lane's dp4a takes four weights.
    weight = f"{len(ops) / (4 * dots):.2f}" if dots and not mma else ""
    print(f"{head} | {len(ops)} | {mma} | {each} | {dots} | {weight} | "
          + " ".join(f"{o} {n}" for o, n in mix) + " |")
