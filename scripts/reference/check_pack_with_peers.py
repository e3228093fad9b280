#!/usr/bin/env python3
"""Cross-checks a pack (e.g. one written by `strata-compile synth`) with outside readers.

1. The Python `gguf` package reads it: same tensor names, types and shapes as
   `strata-compile inspect --json`, and every tensor's dequantization is bit-identical to
   `strata-compile inspect --tensor NAME --dequant FILE`.
2. llama.cpp (llama-cpp-python, if installed) loads it and evaluates a few tokens to
   finite logits.

Usage: python3 scripts/reference/check_pack_with_peers.py STRATA_COMPILE PACK [PACK...]
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def check_gguf(strata, path):
    report = json.loads(subprocess.check_output([strata, "inspect", path, "--json"]))
    ours = {t["name"]: t for t in report["tensors"]}
    shard_paths = report["files"]
    theirs = {}
    for shard in shard_paths:
        for t in GGUFReader(shard).tensors:
            theirs[t.name] = t
    assert set(ours) == set(theirs), set(ours) ^ set(theirs)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "t.f32")
        for name, t in theirs.items():
            assert ours[name]["type"] == t.tensor_type.name, name
            assert ours[name]["shape"] == [int(d) for d in t.shape], name
            subprocess.check_call([strata, "inspect", path, "--tensor", name, "--dequant", out],
                                  stderr=subprocess.DEVNULL)
            got = np.fromfile(out, dtype="<f4")
            ref = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
            assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), name
    print(f"{path}: gguf package agrees on {len(theirs)} tensors, bit for bit")


def check_llama_cpp(path):
    try:
        import llama_cpp
    except ImportError:
        print("llama-cpp-python not installed: skipping the llama.cpp load")
        return
    llm = llama_cpp.Llama(model_path=path, n_ctx=256, verbose=False, n_threads=2, logits_all=True)
    tokens = llm.tokenize(b"def add(a, b): return a + b", add_bos=True, special=True)[:8]
    llm.eval(tokens)
    logits = np.array(llm.scores[len(tokens) - 1])
    assert np.isfinite(logits).all() and logits.std() > 0, "degenerate logits"
    print(f"{path}: llama.cpp loads it (n_vocab {llm.n_vocab()}), logits finite")


def main():
    strata = sys.argv[1]
    for path in sys.argv[2:]:
        check_gguf(strata, path)
        check_llama_cpp(path)


if __name__ == "__main__":
    main()
