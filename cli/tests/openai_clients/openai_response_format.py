"""Structured output through the official `openai` client: 20 json_schema requests
(strict, temperature 1, seeds 1..20) whose every content must parse and validate against
the schema and finish with "stop", one more streamed, and one json_object request whose
content must be a JSON object.

    python openai_response_format.py http://127.0.0.1:PORT/v1
"""

import json
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the sources

from openai import OpenAI

from common import TIMEOUT_S, check, parse_json, request, run, validate

# Every string is bounded, so that each reply finishes within max_tokens.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "occupation": {"type": "string", "enum": ["engineer", "doctor", "teacher", "artist", "farmer"]},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
    },
    "required": ["name", "age", "occupation", "hobbies"],
    "additionalProperties": False,
}

RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON}}

ASK_PERSON = [
    {"role": "system", "content": "You answer in JSON."},
    {"role": "user", "content": "Invent a person: their name, age, occupation and hobbies."},
]

ASK_OBJECT = [
    {"role": "system", "content": "You answer in JSON."},
    {"role": "user", "content": 'Give the capital of France as a JSON object like {"country": ..., "capital": ...}.'},
]

REQUESTS = 20


def main(base):
    client = OpenAI(base_url=base, api_key="strata-test", timeout=TIMEOUT_S, max_retries=0)
    model = request("GET /models", client.models.list).data[0].id
    create = client.chat.completions.create
    people = []
    for seed in range(1, REQUESTS + 1):
        what = f"json_schema request {seed}/{REQUESTS} (seed {seed})"
        resp = request(
            what,
            create,
            model=model,
            messages=ASK_PERSON,
            response_format=RESPONSE_FORMAT,
            max_tokens=200,
            temperature=1.0,
            seed=seed,
        )
        choice = resp.choices[0]
        content = choice.message.content
        check(choice.finish_reason == "stop", f"{what}: finish_reason {choice.finish_reason!r}: {content!r}")
        person = parse_json(content, f"{what}: message.content")
        validate(person, PERSON, what)
        people.append(person)

    # Streamed: the joined deltas are the document.
    what = "json_schema request, streamed"
    content, finish = "", None
    for chunk in request(
        what,
        create,
        model=model,
        messages=ASK_PERSON,
        response_format=RESPONSE_FORMAT,
        max_tokens=200,
        temperature=1.0,
        seed=REQUESTS + 1,
        stream=True,
    ):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    check(finish == "stop", f"{what}: finish_reason {finish!r}: {content!r}")
    validate(parse_json(content, f"{what}: the content"), PERSON, what)

    what = "json_object request"
    resp = request(
        what,
        create,
        model=model,
        messages=ASK_OBJECT,
        response_format={"type": "json_object"},
        max_tokens=200,
        temperature=0,
        seed=1,
    )
    content = resp.choices[0].message.content
    obj = parse_json(content, f"{what}: message.content")
    check(isinstance(obj, dict), f"{what}: {content!r} is JSON but not an object")

    distinct = len({json.dumps(p, sort_keys=True) for p in people})
    return (
        f"{REQUESTS} json_schema replies on {model} validate and stop ({distinct} distinct, e.g. {people[0]}), "
        f"one streamed too; json_object gave {obj} ({resp.choices[0].finish_reason})"
    )


if __name__ == "__main__":
    run("openai_response_format", main)
