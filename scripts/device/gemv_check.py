#!/usr/bin/env python3
"""Runs every GEMV kernel of an artifact directory on the GPU against the CPU reference.

For each `gemv` kernel in DIR/manifest.toml: the weights are a tensor of PACK with the
kernel's type and shape; the reference is `strata-compile inspect --tensor --dequant`
(strata's CPU dequantizer, bit-exact with ggml) times random inputs, in float64. The
kernel is loaded from the module (PTX) through the CUDA driver (CuPy), launched with the
manifest's launch rule on a NaN-poisoned output, and must match within 1e-5 relative
error. Window kernels (T > 1) are also compared column by column with the T = 1 kernel
of the same path and template, which the plan promises bit for bit. Prints one line per kernel and a
summary.

Float-path kernels take (w, x, y [, strata_err]). Int8-dot kernels, those whose manifest
buffers include `xq`, take (w, xq, xd, y [, strata_err]): the random inputs are quantized
here exactly as the runtime does it (`quantize_q8` below), and the reference multiplies
by the dequantized inputs q * d instead.

Usage: python3 gemv_check.py ARTIFACT_DIR PACK STRATA_COMPILE
"""
import json
import os
import subprocess
import sys
import tempfile
import tomllib

import numpy as np

TOLERANCE = 1e-5


def quantize_q8(x):
    """Int8 quants [T][cols] and per 32-element chunk (scale d, sum of quants) [T][cols/32][2]
    of float32 rows x [T][cols], bit for bit as runtime/src/backend/cpu.rs `quantize_q8`:
    d = max|x| / 127, q = round(x * (1 / d)) half away from zero, all in float32, with 1 / d
    taken as 0 where d = 0 (so q = 0). |x * (1 / d)| stays below 127.5: no clamp needed."""
    chunks = np.asarray(x, dtype=np.float32).reshape(*np.shape(x)[:-1], -1, 32)
    d = np.abs(chunks).max(axis=-1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (chunks * inv).astype(np.float64)  # the float32 product, widened exactly
    q = np.trunc(v + np.copysign(0.5, v)).astype(np.int8)  # exact in float64
    sums = q.sum(axis=-1, keepdims=True, dtype=np.int32).astype(np.float32)
    return q.reshape(np.shape(x)), np.concatenate([d, sums], axis=-1)


def dequantize_q8(xq, xd):
    """q * d per element, in float64 (exact), shaped like xq."""
    chunks = xq.reshape(*xq.shape[:-1], -1, 32).astype(np.float64)
    return (chunks * xd[..., :1].astype(np.float64)).reshape(xq.shape)


def main():
    import cupy as cp  # here, so that the numpy functions above import without a GPU

    art, pack, strata = sys.argv[1:4]
    manifest = tomllib.load(open(os.path.join(art, "manifest.toml"), "rb"))
    module = cp.RawModule(path=os.path.join(art, manifest["module"]["binary"]))
    checked_build = manifest["options"]["checked"]
    info = json.loads(subprocess.check_output([strata, "inspect", pack, "--json"]))
    by_shape = {}
    for t in info["tensors"]:
        # 2-D weights, and expert 0 of 3-D expert stacks [cols, rows, experts].
        if len(t["shape"]) in (2, 3):
            by_shape.setdefault((t["type"], t["shape"][1], t["shape"][0]), t)
    rng = np.random.default_rng(7)
    dequantized, single = {}, {}
    failures, bitwise_ok, bitwise_total, checked = 0, 0, 0, 0
    gemvs = sorted((k for k in manifest["kernels"] if k["op"] == "gemv"), key=lambda k: k["window"])
    tmp = tempfile.mkdtemp()
    for k in gemvs:
        key = (k["quant"], k["rows"], k["cols"])
        t = by_shape.get(key)
        if t is None:
            print(f"{k['name']:40} SKIP (no tensor of that type and shape)")
            continue
        if key not in dequantized:
            out = os.path.join(tmp, "w.f32")
            subprocess.check_call([strata, "inspect", pack, "--tensor", t["name"], "--dequant", out],
                                  stderr=subprocess.DEVNULL)
            w = np.fromfile(out, dtype="<f4")[: k["rows"] * k["cols"]]
            w = w.reshape(k["rows"], k["cols"]).astype(np.float64)
            slice_bytes = t["bytes"] // (t["shape"][2] if len(t["shape"]) == 3 else 1)
            with open(info["files"][t["shard"]], "rb") as f:
                f.seek(t["offset"])
                raw = np.frombuffer(f.read(slice_bytes), dtype=np.uint8)
            dequantized[key] = (w, cp.asarray(raw))
        w, w_dev = dequantized[key]
        window, rows, cols = k["window"], k["rows"], k["cols"]
        int8 = any(b["name"] == "xq" for b in k["buffers"])
        x = rng.standard_normal((window, cols)).astype(np.float32)
        if int8:
            xq, xd = quantize_q8(x)
            ref = (w @ dequantize_q8(xq, xd).T).T
            inputs = lambda j: [cp.asarray(xq[j]), cp.asarray(xd[j])]
        else:
            ref = (w @ x.T.astype(np.float64)).T
            inputs = lambda j: [cp.asarray(x[j])]

        def call(fn, launch, j, y):
            """Launches fn on input rows j into y; returns strata_err's first word (0: fine)."""
            err = cp.zeros(8, dtype=cp.int32)
            args = [w_dev, *inputs(j), y] + ([err] if checked_build else [])
            fn(tuple(int(d) for d in launch["grid"]), (launch["threads"], 1, 1), tuple(args))
            cp.cuda.runtime.deviceSynchronize()
            return int(err[0])

        fn = module.get_function(k["name"])
        y = cp.full((window, rows), np.nan, dtype=cp.float32)
        status = call(fn, k["launch"], slice(None), y)
        got = cp.asnumpy(y)
        rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref)) if np.isfinite(got).all() else float("inf")
        ok = rel < TOLERANCE and status == 0
        note = ""
        # Windows compare bit for bit with the single token of the same template (the
        # matrix-unit GEMV, whose tuning alone has `stages`, takes only wider windows by
        # default; its sums differ from the int8-dot GEMV's by rounding).
        path = key + (int8, "stages" in k.get("tuning", {}))
        if window == 1:
            single[path] = (fn, k["launch"])
        elif path in single:
            fn1, launch1 = single[path]
            same = True
            for j in range(window):
                y1 = cp.full((1, rows), np.nan, dtype=cp.float32)
                call(fn1, launch1, slice(j, j + 1), y1)
                same &= bool((cp.asnumpy(y1)[0].view(np.uint32) == got[j].view(np.uint32)).all())
            bitwise_total += 1
            bitwise_ok += int(same)
            note = " columns == T=1 bit for bit" if same else " COLUMNS DIFFER FROM T=1"
            ok &= same
        checked += 1
        failures += int(not ok)
        kind = "int8" if int8 else "float"
        print(f"{k['name']:40} {kind:5} {'ok  ' if ok else 'FAIL'} rel err {rel:.2e}{note}")
    print(f"gemv: {checked - failures}/{checked} kernels match the CPU reference; "
          f"{bitwise_ok}/{bitwise_total} windows equal T=1 bit for bit ({manifest['target']['name']} "
          f"built for {manifest['target']['built_for']})")
    sys.exit(1 if failures or checked == 0 else 0)


if __name__ == "__main__":
    main()
