#!/usr/bin/env python3
"""An independent float64 forward pass of a llama-family or gemma3 GGUF pack in numpy,
from the weights as the `gguf` package dequantizes them: a third opinion when strata's
CPU backend and llama.cpp (which quantizes activations to 8 bits) disagree on a logit.
Gemma 3 as llama.cpp computes it: embeddings times sqrt(width), per-head q/k norms,
NeoX rope (base 10000 on the sliding-window layers, every sixth layer global unless
`attention.sliding_window_pattern` says otherwise), norms after attention and the FFN,
tanh-GELU gating.

    python3 scripts/reference/numpy_forward.py PACK.gguf ID ID ID...   # prints top-5 per position
    python3 scripts/reference/numpy_forward.py PACK.gguf --fixture tests/fixtures/smollm2_llamacpp.json \
        > tests/fixtures/smollm2_float_reference.json   # top-5 over each fixture sequence
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def load(path):
    r = GGUFReader(path)
    kv = {f.name: f for f in r.fields.values()}

    def val(key):
        f = kv[key]
        return f.parts[f.data[0]][0]

    arch = bytes(kv["general.architecture"].parts[-1]).decode()
    n_head = int(val(f"{arch}.attention.head_count"))
    n_kv = int(val(f"{arch}.attention.head_count_kv"))
    eps = float(val(f"{arch}.attention.layer_norm_rms_epsilon"))
    base = float(val(f"{arch}.rope.freq_base"))
    n_layer = int(val(f"{arch}.block_count"))
    hd = int(val(f"{arch}.attention.key_length")) if f"{arch}.attention.key_length" in kv else None
    window = int(val(f"{arch}.attention.sliding_window")) if f"{arch}.attention.sliding_window" in kv else 0
    pattern_key = f"{arch}.attention.sliding_window_pattern"
    every = int(val(pattern_key)) if pattern_key in kv else 6
    local = [arch == "gemma3" and window > 0 and (every == 0 or l % every < every - 1) for l in range(n_layer)]
    W = {}
    for t in r.tensors:
        W[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64).reshape([int(x) for x in t.shape[::-1]])
    return dict(W=W, n_head=n_head, n_kv=n_kv, eps=eps, base=base, n_layer=n_layer, arch=arch, hd=hd,
                window=window, local=local)


def forward(m, ids):
    W, n_head, n_kv, eps, base, n_layer = (m[k] for k in ("W", "n_head", "n_kv", "eps", "base", "n_layer"))

    def norm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    gemma = m["arch"] == "gemma3"
    x = W["token_embd.weight"][ids]
    if gemma:
        x = x * np.float64(np.sqrt(np.float32(x.shape[1])))
    T = len(ids)
    hd = m["hd"] or x.shape[1] // n_head
    pos = np.arange(T)

    def table(b):
        ang = pos[:, None] * (b ** (-np.arange(0, hd, 2) / hd))[None, :]
        return np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    tables = {False: table(base), True: table(10000.0)}

    def rope(v, local):
        c, s = tables[local]
        out = np.empty_like(v)
        if gemma:  # NeoX: the halves of a head are the pairs
            a, b = v[..., : hd // 2], v[..., hd // 2 :]
            out[..., : hd // 2] = a * c - b * s
            out[..., hd // 2 :] = a * s + b * c
        else:  # adjacent pairs (llama in GGUF)
            a, b = v[..., 0::2], v[..., 1::2]
            out[..., 0::2] = a * c - b * s
            out[..., 1::2] = a * s + b * c
        return out

    causal = np.triu(np.full((T, T), -np.inf), 1)
    windowed = causal + np.tril(np.full((T, T), -np.inf), -m["window"]) if m["window"] else causal
    for l in range(n_layer):
        p = f"blk.{l}."
        local = m["local"][l]
        mask = windowed if local else causal
        h = norm(x, W[p + "attn_norm.weight"])
        q = (h @ W[p + "attn_q.weight"].T).reshape(T, n_head, hd)
        k = (h @ W[p + "attn_k.weight"].T).reshape(T, n_kv, hd)
        v = (h @ W[p + "attn_v.weight"].T).reshape(T, n_kv, hd)
        if gemma:
            q, k = norm(q, W[p + "attn_q_norm.weight"]), norm(k, W[p + "attn_k_norm.weight"])
        q, k = rope(q, local), rope(k, local)
        k = k.astype(np.float16).astype(np.float64)  # the f16 KV cache
        v = v.astype(np.float16).astype(np.float64)
        g = n_head // n_kv
        out = np.zeros((T, n_head, hd))
        for hh in range(n_head):
            s = q[:, hh] @ k[:, hh // g].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            out[:, hh] = s @ v[:, hh // g]
        a = out.reshape(T, -1) @ W[p + "attn_output.weight"].T
        x = x + (norm(a, W[p + "post_attention_norm.weight"]) if gemma else a)
        h = norm(x, W[p + "ffn_norm.weight"])
        gt = h @ W[p + "ffn_gate.weight"].T
        up = h @ W[p + "ffn_up.weight"].T
        if gemma:
            act = 0.5 * gt * (1 + np.tanh(np.sqrt(2 / np.pi) * (gt + 0.044715 * gt**3)))
        else:
            act = gt / (1 + np.exp(-gt))
        f = (act * up) @ W[p + "ffn_down.weight"].T
        x = x + (norm(f, W[p + "post_ffw_norm.weight"]) if gemma else f)
    h = norm(x, W["output_norm.weight"])
    out_w = W.get("output.weight", W["token_embd.weight"])
    return h @ out_w.T


def top5(row):
    return [[int(t), round(float(row[t]), 5)] for t in np.argsort(-row)[:5]]


def main():
    m = load(sys.argv[1])
    if sys.argv[2] == "--fixture":
        fixture = json.load(open(sys.argv[3]))
        out = {"about": "float64 numpy forward (scripts/reference/numpy_forward.py) over each prompt of "
               + sys.argv[3] + " followed by llama.cpp's greedy continuation; top-5 (id, logit) per position",
               "sequences": []}
        prompts = fixture["prompts"] if "prompts" in fixture else fixture["gemma3"]["prompts"]
        for p in prompts:
            seq = p["prompt_tokens"] + [s["token"] for s in p["steps"]]
            logits = forward(m, seq)
            out["sequences"].append({"name": p["name"], "tokens": seq, "top": [top5(r) for r in logits]})
        json.dump(out, sys.stdout, separators=(",", ":"))
        return
    logits = forward(m, [int(x) for x in sys.argv[2:]])
    for i, row in enumerate(logits):
        print(i, top5(row))


if __name__ == "__main__":
    main()
