#!/usr/bin/env python3
"""Runs every GEMV kernel of an artifact directory on the GPU against the CPU reference.

For each `gemv` kernel in DIR/manifest.toml: the weights are a tensor of PACK with the
kernel's type and shape; the reference is `strata-compile inspect --tensor --dequant`
(strata's CPU dequantizer, bit-exact with ggml) times random inputs, in float64. The
kernel is loaded from the module (PTX) through the CUDA driver (CuPy), launched with the
manifest's launch rule on a NaN-poisoned output, and must match within 1e-5 relative
error. Window kernels (T > 1) are also compared column by column with the T = 1 kernel,
which the plan promises bit for bit. Prints one line per kernel and a summary.

Usage: python3 gemv_check.py ARTIFACT_DIR PACK STRATA_COMPILE
"""
import json
import os
import subprocess
import sys
import tempfile
import tomllib

import cupy as cp
import numpy as np

TOLERANCE = 1e-5


def main():
    art, pack, strata = sys.argv[1:4]
    manifest = tomllib.load(open(os.path.join(art, "manifest.toml"), "rb"))
    module = cp.RawModule(path=os.path.join(art, manifest["module"]["binary"]))
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
        x = rng.standard_normal((window, cols)).astype(np.float32)
        ref = (w @ x.T.astype(np.float64)).T
        y = cp.full((window, rows), np.nan, dtype=cp.float32)
        launch = k["launch"]
        grid = tuple(int(d) for d in launch["grid"])
        fn = module.get_function(k["name"])
        args = [w_dev, cp.asarray(x), y]
        if manifest["options"]["checked"]:
            err = cp.zeros(8, dtype=cp.int32)
            args.append(err)
        fn(grid, (launch["threads"], 1, 1), tuple(args))
        cp.cuda.runtime.deviceSynchronize()
        got = cp.asnumpy(y)
        rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref)) if np.isfinite(got).all() else float("inf")
        ok = rel < TOLERANCE
        if manifest["options"]["checked"] and int(err[0]) != 0:
            ok = False
        note = ""
        if window == 1:
            single[key] = (fn, launch)
        elif key in single:
            fn1, launch1 = single[key]
            same = True
            for j in range(window):
                y1 = cp.full((1, rows), np.nan, dtype=cp.float32)
                one = [w_dev, cp.asarray(x[j:j + 1]), y1]
                if manifest["options"]["checked"]:
                    one.append(cp.zeros(8, dtype=cp.int32))
                fn1(tuple(int(d) for d in launch1["grid"]), (launch1["threads"], 1, 1), tuple(one))
                same &= bool((cp.asnumpy(y1)[0].view(np.uint32) == got[j].view(np.uint32)).all())
            bitwise_total += 1
            bitwise_ok += int(same)
            note = " columns == T=1 bit for bit" if same else " COLUMNS DIFFER FROM T=1"
            ok &= same
        checked += 1
        failures += int(not ok)
        print(f"{k['name']:40} {'ok  ' if ok else 'FAIL'} rel err {rel:.2e}{note}")
    print(f"gemv: {checked - failures}/{checked} kernels match the CPU reference; "
          f"{bitwise_ok}/{bitwise_total} windows equal T=1 bit for bit ({manifest['target']['name']} "
          f"built for {manifest['target']['built_for']})")
    sys.exit(1 if failures or checked == 0 else 0)


if __name__ == "__main__":
    main()
