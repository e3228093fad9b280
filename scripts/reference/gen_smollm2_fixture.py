#!/usr/bin/env python3
"""Writes tests/fixtures/smollm2/: reference rows of the real default model.

For a few tensors of SmolLM2-135M-Instruct Q4_1 (one per type it holds), the first two
rows dequantized by the Python `gguf` package (0.19.0), as little-endian f32, plus the
model's description as that package reads it. The Rust tests compare bit for bit.

Usage: python3 scripts/reference/gen_smollm2_fixture.py PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import json
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

TENSORS = ["token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight", "output_norm.weight"]


def main():
    reader = GGUFReader(sys.argv[1])
    out = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "smollm2")
    os.makedirs(out, exist_ok=True)
    index = {}
    for t in reader.tensors:
        if t.name not in TENSORS:
            continue
        rows = min(2, int(np.prod(t.shape[1:])))
        values = dequantize(t.data, t.tensor_type).reshape(-1, int(t.shape[0]))[:rows]
        values.astype("<f4").tofile(os.path.join(out, f"{t.name}.f32"))
        index[t.name] = {"type": t.tensor_type.name, "shape": [int(d) for d in t.shape], "rows": rows}
    with open(os.path.join(out, "tensors.json"), "w") as f:
        json.dump(index, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
