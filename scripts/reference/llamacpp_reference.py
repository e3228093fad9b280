#!/usr/bin/env python3
"""Writes tests/fixtures/smollm2_llamacpp.json: llama.cpp's own logits for SmolLM2 on the CPU.

For three prompts (plain text, code, and a chat turn rendered with the GGUF's own chat
template, special tokens parsed) it records:

  prompt, chat, messages (chat only), prompt_tokens  -- llama.cpp token ids (special=True,
                                                        BOS as the GGUF's add_bos_token says)
  prompt_top   -- for every prompt position i, the top-5 [id, logit] (they predict token i+1)
  steps        -- a greedy continuation of up to 32 tokens: per step the chosen token (plain
                  argmax, lowest id on ties, no penalties) and the top-5 [id, logit] it came from;
                  stops after an end-of-generation token (kept as the last step)
  text         -- the continuation detokenized, for humans
  min_margin   -- smallest top1 - top2 logit gap over the steps (how robust greedy agreement is)

Top-5 lists are highest first, ties by lower id; logits rounded to 4 decimals. The Rust
tests compare strata's CPU/GPU logits and greedy tokens against this file.

Needs llama-cpp-python 0.3.36 (CPU build; AMX disabled so results do not depend on the host)
and jinja2.  Run:

    python3 scripts/reference/llamacpp_reference.py [PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf]

(default path: ~/.cache/strata/models/SmolLM2-135M-Instruct.Q4_1.gguf).
"""
import hashlib
import json
import os
import sys

import jinja2
import llama_cpp
import numpy as np
from llama_cpp import Llama

DEFAULT_MODEL = os.path.expanduser("~/.cache/strata/models/SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures",
                   "smollm2_llamacpp.json")
N_GEN = 32
TOP = 5
CHAT_MESSAGES = [{"role": "user", "content": "What is the tallest mountain?"}]


def top(row):
    """Top-5 [id, logit], highest first, ties by lower id (stable sort on -logit)."""
    ids = np.argsort(-row, kind="stable")[:TOP]
    return [[int(i), round(float(row[i]), 4)] for i in ids]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def render_chat(llm, messages):
    """The GGUF's own template, as strata renders it (minijinja) and llama.cpp's Jinja path does."""
    template = llm.metadata["tokenizer.chat_template"]
    env = jinja2.Environment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True)
    bos = llm._model.token_get_text(llm.token_bos())
    eos = llm._model.token_get_text(llm.token_eos())
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token=bos, eos_token=eos)


def run(llm, vocab, prompt):
    # add_bos=True means "add special tokens as the vocab says" (SmolLM2: add_bos_token=False).
    tokens = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
    llm.reset()
    llm.eval(tokens)
    n_vocab = llm.n_vocab()
    scores = np.asarray(llm.scores[: len(tokens)], dtype=np.float32).reshape(len(tokens), n_vocab)
    prompt_top = [top(scores[i]) for i in range(len(tokens))]
    row = scores[-1].copy()
    steps, generated, margins = [], [], []
    for _ in range(N_GEN):
        tok = int(np.argmax(row))  # first index of the maximum: lowest id wins ties
        t5 = top(row)
        assert t5[0][0] == tok
        srt = np.sort(row)
        margins.append(float(srt[-1] - srt[-2]))
        steps.append({"token": tok, "top": t5})
        generated.append(tok)
        if llama_cpp.llama_vocab_is_eog(vocab, tok):
            break
        llm.eval([tok])
        row = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32).copy()
    text = llm.detokenize(generated).decode("utf-8", errors="replace")
    return tokens, prompt_top, steps, text, min(margins)


def dump(doc):
    """Indented JSON, but each [id, logit] list of a position on one line to keep the file small."""
    def enc(v, ind):
        pad = " " * ind
        if isinstance(v, dict) and "token" not in v:
            items = [f'{pad} {json.dumps(k)}: {enc(x, ind + 1)}' for k, x in v.items()]
            return "{\n" + ",\n".join(items) + "\n" + pad + "}"
        if isinstance(v, list) and v and isinstance(v[0], (dict, list)) and not (
                isinstance(v[0], list) and v[0] and not isinstance(v[0][0], list)):
            return "[\n" + ",\n".join(pad + " " + enc(x, ind + 1) for x in v) + "\n" + pad + "]"
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    return enc(doc, 0) + "\n"


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_MODEL
    llm = Llama(model_path=model, n_ctx=512, logits_all=True, n_threads=2, verbose=False, seed=0)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    prompts = [
        {"name": "plain", "prompt": "The capital of France is", "chat": False},
        {"name": "code", "prompt": "def fibonacci(n):\n", "chat": False},
        {"name": "chat", "prompt": render_chat(llm, CHAT_MESSAGES), "chat": True, "messages": CHAT_MESSAGES},
    ]
    for p in prompts:
        tokens, prompt_top, steps, text, margin = run(llm, vocab, p["prompt"])
        p.update(prompt_tokens=tokens, prompt_top=prompt_top, steps=steps, text=text,
                 min_margin=round(margin, 4))
        print(f'{p["name"]}: {len(tokens)} prompt tokens, {len(steps)} steps, '
              f'min step margin {margin:.4f}, text {text!r}', file=sys.stderr)
    doc = {
        "about": "llama.cpp CPU reference logits for SmolLM2 (scripts/reference/llamacpp_reference.py)",
        "llama_cpp_python": llama_cpp.__version__,
        "model": os.path.basename(model),
        "model_sha256": sha256(model),
        "n_vocab": llm.n_vocab(),
        "n_ctx": 512,
        "top": TOP,
        "max_new_tokens": N_GEN,
        "prompts": prompts,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(dump(doc))


if __name__ == "__main__":
    main()
