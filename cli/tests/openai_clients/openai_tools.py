"""The two-step tool loop through the official `openai` client, streamed and not, with
tool_choice "required" and naming the function: request 1 must come back as a get_weather
call (finish_reason "tool_calls", an id, arguments that validate against the tool's
schema); request 2 sends that call and the tool's result back and must be answered.

    python openai_tools.py http://127.0.0.1:PORT/v1
"""

import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the sources

from openai import OpenAI

from common import QUESTION, TIMEOUT_S, WEATHER_REPORT, WEATHER_TOOL, check, check_tool_call, request, run

NAMED = {"type": "function", "function": {"name": "get_weather"}}


def first_turn(client, model, stream, tool_choice, seed, what):
    """Request 1: (the assistant message to send back, its call's id, name, arguments)."""
    create = client.chat.completions.create
    kwargs = dict(
        model=model,
        messages=QUESTION,
        tools=[WEATHER_TOOL],
        tool_choice=tool_choice,
        max_tokens=200,
        temperature=1.0,
        seed=seed,
    )
    if not stream:
        resp = request(what, create, **kwargs)
        check(len(resp.choices) == 1, f"{what}: {len(resp.choices)} choices")
        choice = resp.choices[0]
        check(choice.finish_reason == "tool_calls", f"{what}: finish_reason {choice.finish_reason!r}: {resp}")
        msg = choice.message
        check(msg.role == "assistant", f"{what}: role {msg.role!r}")
        check(msg.tool_calls, f"{what}: no tool_calls: {msg}")
        call = msg.tool_calls[0]
        check(call.type == "function", f"{what}: tool call type {call.type!r}")
        # The message goes back as it came, as the openai docs' loop does.
        return msg, call.id, call.function.name, call.function.arguments

    # Streamed: accumulate delta.tool_calls by index, as clients do.
    calls, finish, content = {}, None, ""
    for chunk in request(what, create, stream=True, stream_options={"include_usage": True}, **kwargs):
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for tc in delta.tool_calls or []:
                check(isinstance(tc.index, int), f"{what}: a tool call delta without an index: {tc}")
                slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    check(slot["id"] in (None, tc.id), f"{what}: tool call {tc.index} changed id")
                    slot["id"] = tc.id
                if tc.function is not None:
                    slot["name"] += tc.function.name or ""
                    slot["arguments"] += tc.function.arguments or ""
            if choice.finish_reason is not None:
                check(finish is None, f"{what}: a second finish_reason {choice.finish_reason!r}")
                finish = choice.finish_reason
    check(finish == "tool_calls", f"{what}: finish_reason {finish!r} (content {content!r}, calls {calls})")
    check(calls and min(calls) == 0, f"{what}: no tool call at index 0: {calls}")
    call = calls[0]
    message = {
        "role": "assistant",
        "content": content or None,
        "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for _, c in sorted(calls.items())
        ],
    }
    return message, call["id"], call["name"], call["arguments"]


def second_turn(client, model, stream, messages, what):
    """Request 2: the tool's result sent back; the reply's finish_reason."""
    create = client.chat.completions.create
    kwargs = dict(
        model=model, messages=messages, tools=[WEATHER_TOOL], tool_choice="auto", max_tokens=16, temperature=0, seed=1
    )
    if not stream:
        resp = request(what, create, **kwargs)
        choice = resp.choices[0]
        msg = choice.message
        check(msg is not None and msg.role == "assistant", f"{what}: no assistant message: {resp}")
        check(isinstance(msg.content, str) or msg.tool_calls, f"{what}: neither content nor tool_calls: {msg}")
        finish = choice.finish_reason
    else:
        finish, role, content, calls = None, None, "", 0
        for chunk in request(what, create, stream=True, **kwargs):
            for choice in chunk.choices:
                role = role or choice.delta.role
                content += choice.delta.content or ""
                calls += len(choice.delta.tool_calls or [])
                finish = choice.finish_reason or finish
        check(role == "assistant", f"{what}: no assistant role in the stream (content {content!r}, {calls} calls)")
    check(finish in ("stop", "length", "tool_calls"), f"{what}: finish_reason {finish!r}")
    return finish


def main(base):
    client = OpenAI(base_url=base, api_key="strata-test", timeout=TIMEOUT_S, max_retries=0)
    model = request("GET /models", client.models.list).data[0].id
    seen = []
    for seed, (stream, tool_choice) in enumerate(
        [(False, "required"), (True, "required"), (False, NAMED), (True, NAMED)], start=1
    ):
        how = f"{'streamed' if stream else 'not streamed'}, tool_choice {'named' if tool_choice is NAMED else tool_choice}"
        message, call_id, name, arguments = first_turn(client, model, stream, tool_choice, seed, f"request 1 ({how})")
        args = check_tool_call(call_id, name, arguments, f"request 1 ({how})")
        messages = QUESTION + [message, {"role": "tool", "tool_call_id": call_id, "content": WEATHER_REPORT}]
        finish = second_turn(client, model, stream, messages, f"request 2 ({how})")
        seen.append(f"{how}: get_weather({args}) then {finish}")
    return f"{len(seen)} tool loops on {model}: " + "; ".join(seen)


if __name__ == "__main__":
    run("openai_tools", main)
