#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/: token ids from llama.cpp for the Rust tokenizer tests.

Reference: llama-cpp-python 0.3.36 (CPU build; it vendors llama.cpp), loading packs with
`vocab_only=True`, and jinja2 (a llama-cpp-python dependency) for chat templates.

- smollm2.json: the real default model (byte-level BPE, pre "smollm"). For ~45 texts the
  ids of `llm.tokenize(text, add_bos=True, special=True)` (add_bos=True is llama.cpp's
  add_special: a BOS goes in only where the pack asks for one, which SmolLM2 does not) and,
  for most, with special=False; every token's printed piece for a sample of ids
  (`llama_token_to_piece(..., special=False)`), the pieces of a few id lists joined, the EOG
  ids, and the pack's chat template rendered by jinja2 the way transformers does it.
- bpe_small.json / spm_small.json: small vocabularies cut from llama.cpp's own test
  vocabularies (`vendor/llama.cpp/models/ggml-vocab-qwen2.gguf`, Apache-2.0, and
  `ggml-vocab-phi-3.gguf`, MIT, in the llama-cpp-python sdist): the first 2000 tokens, the
  special tokens renumbered after them, and (BPE) the merges among the kept tokens. Each
  "variant" is one pack written with these tokens plus its own keys (a pre-tokenizer
  type, a model name, add_bos...), tokenized by llama.cpp; the Rust test writes the same
  pack and compares. One BPE vocabulary under every pre-tokenizer type covers the regexes;
  the SPM one covers score merging, byte fallback, space prefix and Phi-3's rstrip.

Usage: /tmp/venv/bin/python scripts/reference/tokenizer_fixtures.py [--model PACK]
       [--vocab-dir DIR]   (DIR holds ggml-vocab-qwen2.gguf and ggml-vocab-phi-3.gguf; get
       them from `pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`)
"""
import argparse
import ctypes
import json
import os
import tempfile

import gguf
import jinja2
import jinja2.sandbox
import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "..", "tests", "fixtures", "tokenizer")
DEFAULT_MODEL = os.path.expanduser(
    os.path.join(os.environ.get("STRATA_CACHE", "~/.cache/strata"), "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
)

TEXTS = [
    "",
    " ",
    "  ",
    "Hello world",
    " Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's fine, but we'd've known. DON'T YOU'RE I'M",
    "don't can't won't shouldn't",
    "12345",
    "3.14159",
    "1234567890 and 2024-01-15, $100.50 or 99%",
    "def f(x):\n    return x * 2\n\n\tif x:\n\t\tpass\n",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}",
    "a  b   c    d",
    "trailing spaces   ",
    "   leading spaces",
    "\n\n\nthree newlines",
    "line\r\nwindows\r\n",
    "tab\tseparated\tvalues",
    "héllo wörld café naïve",
    "e\u0301 combining accent",
    "日本語のテキスト",
    "中文测试，标点。",
    "한국어 텍스트",
    "Привет, мир!",
    "Γειά σου κόσμε",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "ภาษาไทย",
    "emoji 🦙🚀 and family 👨\u200d👩\u200d👧",
    "a\u00a0b\u3000c\u2028d",
    "!!!???...",
    "x^2+y^2=z^2 <= 10 && a|b ~c `d`",
    "https://example.com/path?query=value&x=1#frag",
    "“curly quotes” — em dash… ellipsis",
    "HelloWorld camelCase snake_case SCREAMING_CASE",
    "µ ÀÉÎÕÜ ß",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more",
    "<|im_start|><|im_end|>",
    " <|im_end|> spaced ",
    "<|im_start|",
    "a" * 200,
    "Supercalifragilisticexpialidocious antidisestablishmentarianism",
]

# Texts for the small vocabularies: the common ones plus each vocabulary's specials.
SMALL_TEXTS = [t for t in TEXTS if "<|" not in t and len(t) < 100]

PRE_TYPES = [
    "default", "gpt-2", "mpt", "olmo", "llama-bpe", "llama3", "dbrx", "qwen2", "qwen35", "smollm", "starcoder",
    "refact", "command-r", "deepseek-coder", "deepseek-llm", "deepseek-v3", "falcon", "tekken", "gpt-4o",
    "bloom", "viking", "chatglm-bpe",
]


def vocab_of(llm):
    return llm._model.vocab


def piece(vocab, token, special=False):
    buf = (ctypes.c_char * 1024)()
    n = llama_cpp.llama_token_to_piece(vocab, llama_cpp.llama_token(token), buf, 1024, 0, special)
    assert 0 <= n <= 1024, n
    return bytes(buf[:n])


def load(path):
    return llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)


def tokenize(llm, text, special):
    return llm.tokenize(text.encode("utf-8"), add_bos=True, special=special)


def render(template, messages, add_generation_prompt, bos_token, eos_token):
    """As transformers' apply_chat_template renders: sandboxed, trim_blocks, lstrip_blocks."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos_token, eos_token=eos_token
    )


def smollm2(model_path):
    llm = load(model_path)
    vocab = vocab_of(llm)
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    cases = []
    for i, text in enumerate(TEXTS):
        case = {"text": text, "ids": tokenize(llm, text, True)}
        if i % 5 != 4:
            case["ids_nospecial"] = tokenize(llm, text, False)
        cases.append(case)
    sample = sorted(set(range(0, n, 97)) | set(range(0, 20)) | {n - 1})
    pieces = {str(i): piece(vocab, i).hex() for i in sample}
    detok = []
    for ids in [cases[5]["ids"], cases[20]["ids"], cases[30]["ids"], [1, 2, 0, 905], cases[38]["ids"], [216, 216]]:
        # llama.cpp's pieces concatenated (llm.detokenize also drops a leading space after a
        # BOS, a quirk of the Python binding only).
        detok.append({"ids": ids, "bytes": b"".join(piece(vocab, i) for i in ids).hex()})
    meta = llm.metadata
    template = meta["tokenizer.chat_template"]
    bos = llama_cpp.llama_vocab_bos(vocab)
    eos = llama_cpp.llama_vocab_eos(vocab)
    bos_text, eos_text = piece(vocab, bos, True).decode(), piece(vocab, eos, True).decode()
    chats = []
    for messages, gen in [
        ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}], True),
        ([{"role": "user", "content": "Hi there"}], True),
        ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}], False),
    ]:
        chats.append(
            {"messages": messages, "add_generation_prompt": gen, "text": render(template, messages, gen, bos_text, eos_text)}
        )
    return {
        "source": "llama-cpp-python %s, vocab_only; jinja2 %s" % (llama_cpp.__version__, jinja2.__version__),
        "model": os.path.basename(model_path),
        "vocab_size": n,
        "bos": bos,
        "eos": eos,
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "eog": [i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)],
        "cases": cases,
        "pieces": pieces,
        "detokenize": detok,
        "chat": chats,
    }


def cut(path, keep):
    """The first `keep` tokens and the non-normal tokens after them, renumbered."""
    r = gguf.GGUFReader(path)
    f = r.fields
    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode() for i in f["tokenizer.ggml.tokens"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    scores = None
    if "tokenizer.ggml.scores" in f:
        scores = [float(f["tokenizer.ggml.scores"].parts[i][0]) for i in f["tokenizer.ggml.scores"].data]
    kept = [i for i in range(len(tokens)) if i < keep or types[i] not in (1, 6)]
    # Keep only a few of the numbered padding tokens.
    kept = [i for i in kept if i < keep or not tokens[i].startswith("[PAD") or tokens[i] in ("[PAD32011]", "[PAD151646]", "[PAD151647]")]
    renum = {old: new for new, old in enumerate(kept)}
    out = {"tokens": [tokens[i] for i in kept], "token_type": [types[i] for i in kept]}
    if scores is not None:
        out["scores"] = [scores[i] for i in kept]
    if "tokenizer.ggml.merges" in f:
        have = set(out["tokens"])
        merges = []
        for i in f["tokenizer.ggml.merges"].data:
            m = bytes(f["tokenizer.ggml.merges"].parts[i]).decode()
            a, b = m.split(" ", 1)
            if a in have and b in have and a + b in have:
                merges.append(m)
        out["merges"] = merges

    def ids(key):
        if key not in f:
            return None
        old = int(f[key].parts[f[key].data[0]][0])
        return renum.get(old)

    out["bos"] = ids("tokenizer.ggml.bos_token_id")
    out["eos"] = ids("tokenizer.ggml.eos_token_id")
    out["unk"] = ids("tokenizer.ggml.unknown_token_id")
    return out


def write_pack(path, vocab, model, keys):
    """A vocab-only llama pack: tiny hyperparameters (llama.cpp reads them), the vocabulary,
    then the variant's keys (str, bool or int values)."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(64)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model(model)
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["token_type"])
    if "scores" in vocab:
        w.add_token_scores(vocab["scores"])
    if "merges" in vocab:
        w.add_token_merges(vocab["merges"])
    for key in ("bos", "eos", "unk"):
        if vocab[key] is not None:
            name = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id"}[key]
            w.add_uint32("tokenizer.ggml." + name, vocab[key])
    for k, v in keys.items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        else:
            w.add_string(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run_variants(vocab, model, variants, texts):
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, keys in enumerate(variants):
            path = os.path.join(tmp, f"v{n}.gguf")
            write_pack(path, vocab, model, keys)
            llm = load(path)
            v = vocab_of(llm)
            ids = [tokenize(llm, text, True) for text in texts]
            # Without special parsing only where the text holds a special token's text.
            nospecial = [tokenize(llm, t, False) if ("<" in t or "[" in t) else None for t in texts]
            nt = llama_cpp.llama_vocab_n_tokens(v)
            out.append(
                {
                    "keys": keys,
                    "bos": llama_cpp.llama_vocab_bos(v),
                    "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(v)),
                    "eog": [i for i in range(nt) if llama_cpp.llama_vocab_is_eog(v, i)],
                    "ids": ids,
                    "ids_nospecial": nospecial,
                }
            )
            del llm
    return out


def small_bpe(vocab_dir):
    vocab = cut(os.path.join(vocab_dir, "ggml-vocab-qwen2.gguf"), 2000)
    texts = SMALL_TEXTS + [
        "<|im_start|>user\nhi<|im_end|>\n",
        "a<|endoftext|>b [PAD151646] c[PAD151647]",
    ]
    variants = [{"tokenizer.ggml.pre": p} for p in PRE_TYPES]
    variants.append({"tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True})
    vocab["texts"] = texts
    vocab["variants"] = run_variants(vocab, "gpt2", variants, texts)
    return vocab


def small_spm(vocab_dir):
    vocab = cut(os.path.join(vocab_dir, "ggml-vocab-phi-3.gguf"), 2000)
    texts = SMALL_TEXTS + [
        "<|user|>\nhi<|end|>\n<|assistant|>",
        "<s>hello</s> world",
        " <|end|>  x",
        "a[PAD32011]b<unk>c",
    ]
    variants = [
        {"general.name": "spm-test"},
        {"general.name": "Phi3"},
        {"general.name": "spm-test", "tokenizer.ggml.add_space_prefix": False},
        {"general.name": "spm-test", "tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_eos_token": True},
    ]
    vocab["texts"] = texts
    vocab["variants"] = run_variants(vocab, "llama", variants, texts)
    return vocab


def dump(name, data):
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(path, os.path.getsize(path), "bytes")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--vocab-dir", default=os.environ.get("LLAMA_VOCAB_DIR"))
    args = ap.parse_args()
    if not args.vocab_dir:
        ap.error("--vocab-dir (or LLAMA_VOCAB_DIR): the sdist's vendor/llama.cpp/models directory")
    dump("smollm2.json", smollm2(args.model))
    dump("bpe_small.json", small_bpe(args.vocab_dir))
    dump("spm_small.json", small_spm(args.vocab_dir))


if __name__ == "__main__":
    main()
