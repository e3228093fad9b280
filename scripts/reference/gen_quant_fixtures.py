#!/usr/bin/env python3
"""Writes the dequantization fixtures in tests/fixtures/quant/ from an outside reference.

For every block type strata reads, this draws random valid blocks (random bytes, with
every fp16 scale field set to a finite value: realistic magnitudes, zeros, and fp16
subnormals) and dequantizes them with the Python `gguf` package (0.19.0, see
../shared/PEERS.md). It writes `<TYPE>.blocks` (the raw blocks) and `<TYPE>.f32` (the
reference output, little-endian f32). The Rust tests compare bit for bit.

Usage: python3 scripts/reference/gen_quant_fixtures.py tests/fixtures/quant
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T, GGML_QUANT_SIZES
from gguf.quants import dequantize

# Byte offsets of the fp16 scale fields inside one block, per type.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0], T.IQ3_XXS: [0], T.IQ3_S: [0],
    T.IQ1_S: [0], T.IQ4_NL: [0], T.IQ4_XS: [0],
}
TYPES = [T.F32, T.F16, T.BF16, *F16_FIELDS.keys(), T.IQ1_M]
BLOCKS = 24


def scale(rng, kind):
    """One finite fp16 value as its 16 bits."""
    if kind == "subnormal":
        bits = rng.integers(1, 0x400)
    elif kind == "zero":
        bits = 0
    elif kind == "large":
        bits = np.float16(rng.uniform(1.0, 60000.0)).view(np.uint16)
    else:
        bits = np.float16(10.0 ** rng.uniform(-4.5, -1.0)).view(np.uint16)
    sign = 0x8000 if rng.random() < 0.3 else 0
    return int(bits) | sign


def finite_floats(rng, n, dtype):
    if dtype == np.float32:
        return (rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 3, n)).astype(np.float32)
    if dtype == np.float16:
        vals = (rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 3, n)).astype(np.float16)
        vals[: n // 8] = rng.integers(1, 0x400, n // 8).astype(np.uint16).view(np.float16)
        return vals
    # bf16: the top half of a finite f32
    vals = (rng.standard_normal(n) * 10.0 ** rng.uniform(-30, 30, n)).astype(np.float32)
    return (vals.view(np.uint32) >> 16).astype(np.uint16)


def blocks_for(rng, qtype):
    block, size = GGML_QUANT_SIZES[qtype]
    if qtype in (T.F32, T.F16, T.BF16):
        dtype = {T.F32: np.float32, T.F16: np.float16, T.BF16: np.uint16}[qtype]
        return finite_floats(rng, BLOCKS * 32, dtype).view(np.uint8).copy()
    raw = rng.integers(0, 256, (BLOCKS, size), dtype=np.uint8)
    kinds = ["subnormal"] * 6 + ["zero"] * 2 + ["large"] * 2 + ["normal"] * (BLOCKS - 10)
    for b, kind in enumerate(kinds):
        if qtype == T.IQ1_M:
            # The fp16 super-scale is spread over the top nibbles of the four u16
            # scale words at bytes 48..56.
            d = scale(rng, kind)
            words = raw[b, 48:56].view(np.uint16).copy()
            for i in range(4):
                words[i] = (words[i] & 0x0FFF) | (((d >> (4 * i)) & 0xF) << 12)
            raw[b, 48:56] = words.view(np.uint8)
            continue
        for off in F16_FIELDS[qtype]:
            raw[b, off:off + 2] = np.array([scale(rng, kind)], dtype=np.uint16).view(np.uint8)
    return raw.reshape(-1)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(20261203)
    for qtype in TYPES:
        raw = blocks_for(rng, qtype)
        ref = dequantize(raw, qtype).astype(np.float32)
        assert np.all(np.isfinite(ref)), qtype.name
        raw.tofile(os.path.join(out, f"{qtype.name}.blocks"))
        ref.astype("<f4").tofile(os.path.join(out, f"{qtype.name}.f32"))
        print(f"{qtype.name:8} {raw.size:6} bytes -> {ref.size:5} values")


if __name__ == "__main__":
    main()
