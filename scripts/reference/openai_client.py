#!/usr/bin/env python3
"""The official `openai` Python client (registry package) against `strata-run serve`.

    strata-run serve --pack SmolLM2-135M-Instruct.Q4_1.gguf --port 8080 &
    python3 -m pip install openai
    python3 scripts/reference/openai_client.py http://127.0.0.1:8080/v1 [API_KEY]

Lists the models, chats without and with streaming (usage included), runs a plain
completion, and checks that a bad request comes back as the client's typed error.
"""
import sys

import openai

base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080/v1"
client = openai.OpenAI(base_url=base, api_key=sys.argv[2] if len(sys.argv) > 2 else "none")

model = client.models.list().data[0].id
print("model:", model)

reply = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    temperature=0,
    max_tokens=24,
)
print("chat:", repr(reply.choices[0].message.content), reply.choices[0].finish_reason, reply.usage)
assert "Paris" in reply.choices[0].message.content

pieces, usage = [], None
for chunk in client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    temperature=0,
    max_tokens=24,
    stream=True,
    stream_options={"include_usage": True},
):
    if chunk.choices and chunk.choices[0].delta.content:
        pieces.append(chunk.choices[0].delta.content)
    if chunk.usage:
        usage = chunk.usage
print("stream:", repr("".join(pieces)), usage)
assert "".join(pieces) == reply.choices[0].message.content
assert usage.completion_tokens == reply.usage.completion_tokens

done = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4, temperature=0)
print("completion:", repr(done.choices[0].text), done.usage)

try:
    client.chat.completions.create(model=model, messages=[], max_tokens=4)
    raise SystemExit("an empty message list was accepted")
except openai.BadRequestError as e:
    print("bad request refused:", e.status_code, e.body["message"] if isinstance(e.body, dict) else e.body)
print("openai client: OK")
