#!/usr/bin/env python3
"""Writes tests/fixtures/gemma3_llamacpp.json: llama.cpp's logits for Gemma 3, for
tests/tests/gemma3.rs.

(a) The real Gemma 3 270M Q4_K_M pack (scripts/fetch-gemma3.sh), on four prompts: plain
    text, code, a chat turn in Gemma's turn format (the pack carries no chat template;
    strata's built-in one must render exactly this text) and a long prompt of about 700
    tokens, past the 512-position sliding window of its local layers. For each: the
    token ids (special tokens parsed, BOS as the pack says), the top-5 [id, logit] at
    every prompt position (the long prompt: every 16th and the last 8), and 32 greedy
    tokens (16 for the long prompt) with the top-5 each came from, the smallest top-two
    margin of those steps, and the text.
(b) A synthetic tiny gemma3 pack (`strata-compile synth --preset tiny-gemma3 --type Q8_0
    --seed 7 --tokenizer-from SmolLM2`: two local layers with a window of 16, then a
    global one) on a 300-token prompt: top-5 at every 10th position and the last 8, and
    16 greedy steps. Its sha256 is recorded; the test refuses a fixture that no longer
    matches what synth writes.

Top-5 lists are highest first, ties by lower id; logits rounded to 4 decimals.
Needs llama-cpp-python 0.3.36 (CPU build, AMX off; see shared PEERS.md) and numpy:

    python3 scripts/reference/gemma3_reference.py STRATA_COMPILE GEMMA3_GGUF SMOLLM2_GGUF
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import llama_cpp
import numpy as np
from llama_cpp import Llama

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "gemma3_llamacpp.json")
TOP = 5
CHAT = "<start_of_turn>user\nWhat is the tallest mountain?<end_of_turn>\n<start_of_turn>model\n"
LONG = "The history of the city goes back a long way, and every street has a story to tell. " * 40
SYNTH_TEXT = "Once upon a time there was a small village by the sea, where the boats came home at dusk. " * 20


def top(row):
    ids = np.argsort(-row, kind="stable")[:TOP]
    return [[int(i), round(float(row[i]), 4)] for i in ids]


def continue_greedy(llm, vocab, row, n):
    steps, margins = [], []
    for _ in range(n):
        tok = int(np.argsort(-row, kind="stable")[0])
        srt = np.sort(row)
        margins.append(float(srt[-1] - srt[-2]))
        steps.append({"token": tok, "top": top(row)})
        if llama_cpp.llama_vocab_is_eog(vocab, tok):
            break
        llm.eval([tok])
        row = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32).copy()
    return steps, round(min(margins), 4)


def run(llm, vocab, text, positions, n_gen):
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
    llm.reset()
    llm.eval(tokens)
    scores = np.asarray(llm.scores[: len(tokens)], dtype=np.float32)
    positions = positions(len(tokens))
    steps, margin = continue_greedy(llm, vocab, scores[-1].copy(), n_gen)
    text_out = llm.detokenize([s["token"] for s in steps]).decode("utf-8", errors="replace")
    return {
        "prompt_tokens": tokens,
        "positions": [{"position": p, "top": top(scores[p])} for p in positions],
        "steps": steps,
        "min_margin": margin,
        "text": text_out,
    }


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def main(compile_bin, gemma, smollm2):
    out = {"generator": "scripts/reference/gemma3_reference.py", "llama_cpp_python": "0.3.36"}
    llm = Llama(model_path=gemma, n_ctx=1024, n_batch=1024, logits_all=True, n_threads=2, verbose=False, seed=0)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    every = lambda n: list(range(n))
    sparse = lambda step: lambda n: sorted(set(range(0, n, step)) | set(range(n - 8, n)))
    prompts = [
        ("plain", "The capital of France is", False, every, 32),
        ("code", "def fibonacci(n):\n", False, every, 32),
        ("chat", CHAT, True, every, 32),
        ("long", LONG, False, sparse(16), 16),
    ]
    out["gemma3"] = {"sha256": sha256(gemma), "prompts": []}
    for name, text, chat, positions, n_gen in prompts:
        p = {"name": name, "prompt": text, "chat": chat, **run(llm, vocab, text, positions, n_gen)}
        if chat:
            p["messages"] = [{"role": "user", "content": "What is the tallest mountain?"}]
        out["gemma3"]["prompts"].append(p)
        print(name, len(p["prompt_tokens"]), repr(p["text"][:60]), p["min_margin"], file=sys.stderr)
    del llm

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tiny-gemma3.gguf")
        subprocess.run([compile_bin, "synth", "--preset", "tiny-gemma3", "--type", "Q8_0", "--seed", "7",
                        "--tokenizer-from", smollm2, "--out", path], check=True, capture_output=True)
        llm = Llama(model_path=path, n_ctx=512, n_batch=512, logits_all=True, n_threads=2, verbose=False)
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        tokens = llm.tokenize(SYNTH_TEXT.encode(), add_bos=False, special=False)[:300]
        llm.eval(tokens)
        scores = np.asarray(llm.scores[: len(tokens)], dtype=np.float32)
        positions = sorted(set(range(0, len(tokens), 10)) | set(range(len(tokens) - 8, len(tokens))))
        steps, margin = continue_greedy(llm, vocab, scores[-1].copy(), 16)
        out["tiny"] = {
            "sha256": sha256(path),
            "prompt_tokens": tokens,
            "positions": [{"position": p, "top": top(scores[p])} for p in positions],
            "steps": steps,
            "min_margin": margin,
        }
        print("tiny", len(tokens), [s["token"] for s in steps[:6]], margin, file=sys.stderr)
    with open(OUT, "w") as f:
        json.dump(out, f, separators=(",", ":"), ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
