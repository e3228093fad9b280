#!/usr/bin/env python3
"""Compares two `strata-run score --json` outputs (a device's against the CPU reference's)
over the same prompt: the same token at every position, the same top-1 wherever the
reference's top-two margin exceeds MARGIN, and the largest difference of the reference's
top-1 logit. Prints one line; exits 1 on a disagreement.

    python3 score_compare.py GOT.json WANT.json [MARGIN]
"""
import json
import sys

got, want = (json.load(open(p))["positions"] for p in sys.argv[1:3])
margin = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05
assert len(got) == len(want), f"{len(got)} positions, reference {len(want)}"
clear = agree = 0
worst = 0.0
for i, (g, w) in enumerate(zip(got, want)):
    assert g["token"] == w["token"], f"position {i}: token {g['token']}, reference {w['token']}"
    top, second = w["top_k"][0], w["top_k"][1]
    ours = dict((t, l) for t, l in g["top_k"])
    if top[0] in ours:
        worst = max(worst, abs(ours[top[0]] - top[1]))
    if top[1] - second[1] > margin:
        clear += 1
        agree += g["top_k"][0][0] == top[0]
ok = agree == clear and worst < 0.5
print(f"{'PASS' if ok else 'FAIL'} ({len(want)} positions: top-1 equal at {agree} of {clear} with margin > {margin}; "
      f"largest top-1 logit difference {worst:.4f})")
sys.exit(0 if ok else 1)
