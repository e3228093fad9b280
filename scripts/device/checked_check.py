#!/usr/bin/env python3
"""Shows --checked kernels recording out-of-bounds accesses instead of faulting.

Launches, from a `--checked` artifact directory, kernels whose runtime arguments point
outside their buffers: an embedding gather with a token id past the table, a K/V store
at a position past the cache (rope_store), attention over more positions than the cache holds. Each
must leave the error record [count, kernel, buffer, index lo, index hi, block x,
block y, thread] naming that kernel and buffer, and write nothing out of bounds. The
same launches on the unchecked build must not fault either (their guards skip).

Usage: python3 checked_check.py CHECKED_DIR UNCHECKED_DIR
"""
import os
import sys
import tomllib

import cupy as cp
import numpy as np


def load(art):
    m = tomllib.load(open(os.path.join(art, "manifest.toml"), "rb"))
    return m, cp.RawModule(path=os.path.join(art, m["module"]["binary"]))


def kernel(m, op):
    for i, k in enumerate(m["kernels"]):
        if k["op"] == op:
            return i, k
    raise SystemExit(f"no {op} kernel")


def grid(k, **runtime):
    dims = []
    for d in k["launch"]["grid"]:
        dims.append(int(d) if isinstance(d, int) else -(-runtime[d["arg"]] // d["per_block"]))
    return tuple(dims)


def run(art, checked):
    m, mod = load(art)
    results = []
    err_args = lambda: [cp.zeros(8, dtype=cp.int32)] if checked else []

    # Embedding gather: token 1 is past the table.
    i, k = kernel(m, "embed")
    vocab, cols, row_bytes = k["vocab"], k["cols"], None
    table_len = next(b["extent"] for b in k["buffers"] if b["name"] == "table")
    row_bytes = table_len // vocab
    table = cp.asarray(np.random.default_rng(1).integers(0, 256, table_len, dtype=np.uint8))
    table[:] = 0  # zero blocks: finite values
    ids = cp.asarray(np.array([3, vocab + 7], dtype=np.int32))
    y = cp.full((2, cols), np.nan, dtype=cp.float32)
    extra = err_args()
    mod.get_function(k["name"])(grid(k, tokens=2), (k["launch"]["threads"], 1, 1), (table, ids, y, np.uint32(2), *extra))
    cp.cuda.runtime.deviceSynchronize()
    y = cp.asnumpy(y)
    ok = np.isfinite(y[0]).all() and np.isnan(y[1]).all()
    if checked:
        e = cp.asnumpy(extra[0])
        index = int(e[3]) & 0xFFFFFFFF | (int(e[4]) << 32)
        ok &= e[0] >= 1 and e[1] == i and e[2] == 0 and index == (vocab + 7) * row_bytes and e[6] == 1
        results.append((k["name"], "token id past the table", ok, e.tolist()))
    else:
        results.append((k["name"], "token id past the table", ok, "guarded, no fault"))

    # Rotate and store K/V at a position past the cache.
    i, k = kernel(m, "rope_store")
    heads, kv_heads, hd, n_ctx = k["heads"], k["kv_heads"], k["head_dim"], 4
    width = kv_heads * hd
    q = cp.ones((1, heads * hd), dtype=cp.float32)
    kv = cp.ones((1, width), dtype=cp.float32)
    kc = cp.zeros((n_ctx, width), dtype=cp.uint16)
    vc = cp.zeros((n_ctx, width), dtype=cp.uint16)
    table = cp.zeros((n_ctx, k["rope_dims"]), dtype=cp.float32)
    pos = cp.array([n_ctx], dtype=cp.int32)
    extra = err_args()
    args = (q, kv, kv, kc, vc, table, pos, np.uint32(1), np.uint32(n_ctx), *extra)
    mod.get_function(k["name"])(grid(k, tokens=1), (k["launch"]["threads"], 1, 1), args)
    cp.cuda.runtime.deviceSynchronize()
    ok = int(cp.count_nonzero(kc)) == 0 and bool((cp.asnumpy(q) == 1).all())
    if checked:
        e = cp.asnumpy(extra[0])
        ok &= e[0] >= 1 and e[1] == i and e[2] == 3
        results.append((k["name"], "position past the cache", ok, e.tolist()))
    else:
        results.append((k["name"], "position past the cache", ok, "guarded, no fault"))

    # Attention over more positions than the cache holds.
    i, k = kernel(m, "attention")
    heads, kv_heads, hd = k["heads"], k["kv_heads"], k["head_dim"]
    q = cp.ones(heads * hd, dtype=cp.float32)
    cache = cp.zeros((2, kv_heads * hd), dtype=cp.uint16)
    out = cp.full(heads * hd, np.nan, dtype=cp.float32)
    extra = err_args()
    pos = cp.array([8], dtype=cp.int32)  # one token: 9 positions
    args = (q, cache, cache, out, pos, np.uint32(1), np.uint32(2), *extra)
    mod.get_function(k["name"])(grid(k, tokens=1), (k["launch"]["threads"], 1, 1), args)
    cp.cuda.runtime.deviceSynchronize()
    ok = bool(np.isfinite(cp.asnumpy(out)).all())
    if checked:
        e = cp.asnumpy(extra[0])
        ok &= e[0] >= 1 and e[1] == i and e[2] == 1
        results.append((k["name"], "more positions than the cache", ok, e.tolist()))
    else:
        results.append((k["name"], "more positions than the cache", ok, "guarded, no fault"))
    return results


def main():
    failures = 0
    for art, checked in [(sys.argv[1], True), (sys.argv[2], False)]:
        for name, case, ok, record in run(art, checked):
            failures += int(not ok)
            mode = "checked" if checked else "unchecked"
            print(f"{mode:9} {name:28} {case:32} {'ok  ' if ok else 'FAIL'} {record}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
