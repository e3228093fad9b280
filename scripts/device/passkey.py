#!/usr/bin/env python3
"""Prints a passkey-retrieval prompt of about N tokens (the long-context test of
scripts/device/qsa-check.sh): filler sentences with one needle, the pass key, at a
fraction of the way in, ending with the question. Stdlib only.

    python3 scripts/device/passkey.py --tokens 7600 --depth 0.5 [--key 68341]

Lengths are estimated at --chars-per-token characters a token (default 4). SmolLM2's
tokenizer averages about 3.8 on this text (--tokens 1000 gives 1061 tokens, 7600 about
8050), so leave a margin below the context.
"""

import argparse
import sys

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
QUESTION = "What is the pass key? The pass key is"


def prompt(tokens: int, depth: float, key: str, chars_per_token: float) -> str:
    needle = f"The pass key is {key}. Remember it. {key} is the pass key. "
    head = "There is important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    budget = int(tokens * chars_per_token) - len(head) - len(needle) - len(QUESTION)
    reps = max(budget // len(FILLER), 1)
    before = round(reps * depth)
    return head + FILLER * before + needle + FILLER * (reps - before) + QUESTION


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, required=True, help="about how many tokens")
    ap.add_argument("--depth", type=float, default=0.5, help="where the key goes (0 = start, 1 = end)")
    ap.add_argument("--key", default="68341")
    ap.add_argument("--chars-per-token", type=float, default=4.0)
    a = ap.parse_args()
    if not 0.0 <= a.depth <= 1.0:
        ap.error("--depth is a fraction from 0 to 1")
    sys.stdout.write(prompt(a.tokens, a.depth, a.key, a.chars_per_token))
    return 0


if __name__ == "__main__":
    sys.exit(main())
