"""A reasoning model's thinking through the official `openai` client, on a pack whose
Qwen3-style template opens a `<think>` block (random weights never close it): the reply is
all `reasoning_content` (a field the SDK keeps as an extra), streamed as its own deltas
with the same text, no `content`; `chat_template_kwargs` {"enable_thinking": false} turns
it off, so the reply is `content`.

    python openai_reasoning.py http://127.0.0.1:PORT/v1
"""

import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the sources

from openai import OpenAI

from common import TIMEOUT_S, check, request, run

ASK = [{"role": "user", "content": "What is 2 + 2?"}]


def main(base):
    client = OpenAI(base_url=base, api_key="strata-test", timeout=TIMEOUT_S, max_retries=0)
    model = request("GET /models", client.models.list).data[0].id
    create = client.chat.completions.create
    kwargs = dict(model=model, messages=ASK, max_tokens=12, temperature=0)

    msg = request("not streamed", create, **kwargs).choices[0].message
    reasoning = getattr(msg, "reasoning_content", None)
    check(isinstance(reasoning, str) and reasoning, f"not streamed: no reasoning_content: {msg}")
    check(not msg.content, f"not streamed: content {msg.content!r} beside the thinking")

    streamed, content = "", ""
    for chunk in request("streamed", create, stream=True, **kwargs):
        for choice in chunk.choices:
            streamed += getattr(choice.delta, "reasoning_content", None) or ""
            content += choice.delta.content or ""
    check(streamed == reasoning, f"streamed: reasoning {streamed!r}, not streamed {reasoning!r}")
    check(not content, f"streamed: content {content!r} beside the thinking")

    off = request("thinking off", create, extra_body={"chat_template_kwargs": {"enable_thinking": False}}, **kwargs)
    msg = off.choices[0].message
    check(msg.content and not getattr(msg, "reasoning_content", None), f"thinking off: {msg}")
    return f"{len(reasoning)} characters of reasoning_content, streamed the same; thinking off gives content"


if __name__ == "__main__":
    run("openai_reasoning", main)
