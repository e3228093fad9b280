#!/usr/bin/env python3
"""Writes tests/fixtures/rope_llamacpp.json: llama.cpp's logits on synthetic llama packs
whose rope departs from the plain one, for tests/tests/rope_scaling.rs.

The packs come from `strata-compile synth --preset tiny-llama --type Q8_0 --seed 7
--tokenizer-from SmolLM2` (deterministic; their sha256 is recorded, and the test refuses a
fixture that no longer matches what synth writes), one plain and one per variant:

  freqs  -- Llama 3.1+ frequency factors (`rope_freqs.weight`, --rope-freqs)
  yarn   -- YaRN, factor 4 over an original context of 128 (--rope-scaling yarn:4:128)
  linear -- linear, factor 8 (--rope-scaling linear:8)

For each pack it records, for one prompt of 600 tokens (llama.cpp's ids), the top-5
[id, logit] at every 25th position and at the last 8, and 16 greedy tokens after it.
The test compares strata's CPU backend with it, and shows that the plain rope misses it.

Needs llama-cpp-python 0.3.36 (CPU build, AMX off; see shared PEERS.md) and numpy:

    python3 scripts/reference/rope_reference.py STRATA_COMPILE SMOLLM2_GGUF
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from llama_cpp import Llama

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "rope_llamacpp.json")
VARIANTS = {"plain": [], "freqs": ["--rope-freqs"], "yarn": ["--rope-scaling", "yarn:4:128"], "linear": ["--rope-scaling", "linear:8"]}
TEXT = "The history of the city goes back a long way, and every street has a story to tell. " * 40
N_PROMPT = 600
N_GEN = 16
TOP = 5


def top(row):
    ids = np.argsort(-row, kind="stable")[:TOP]
    return [[int(i), round(float(row[i]), 4)] for i in ids]


def main(compile_bin, smollm2):
    out = {"generator": "scripts/reference/rope_reference.py", "llama_cpp_python": "0.3.36", "packs": {}}
    with tempfile.TemporaryDirectory() as d:
        for name, flags in VARIANTS.items():
            path = os.path.join(d, f"{name}.gguf")
            subprocess.run([compile_bin, "synth", "--preset", "tiny-llama", "--type", "Q8_0", "--seed", "7",
                            "--tokenizer-from", smollm2, *flags, "--out", path], check=True, capture_output=True)
            digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
            llm = Llama(model_path=path, n_ctx=1024, n_batch=1024, logits_all=True, n_threads=2, verbose=False)
            tokens = llm.tokenize(TEXT.encode(), add_bos=False, special=False)[:N_PROMPT]
            assert len(tokens) == N_PROMPT, len(tokens)
            llm.eval(tokens)
            logits = np.array(llm.scores[: len(tokens)], dtype=np.float32)
            positions = sorted(set(range(0, N_PROMPT, 25)) | set(range(N_PROMPT - 8, N_PROMPT)))
            steps, seq = [], list(tokens)
            last = logits[-1]
            for _ in range(N_GEN):
                t = int(np.argsort(-last, kind="stable")[0])
                steps.append({"token": t, "top": top(last)})
                seq.append(t)
                llm.eval([t])
                last = np.array(llm.scores[len(seq) - 1], dtype=np.float32)
            out["packs"][name] = {
                "flags": flags,
                "sha256": digest,
                "prompt_tokens": tokens,
                "positions": [{"position": p, "top": top(logits[p])} for p in positions],
                "steps": steps,
            }
            print(name, digest[:12], [s["token"] for s in steps[:6]], file=sys.stderr)
    with open(OUT, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
