"""The tool loop through an agent framework's OpenAI adapter, LangChain's `ChatOpenAI`:
`bind_tools` with tool_choice naming get_weather (invoked) and "required" (streamed,
chunks summed as agents do) must give a get_weather call whose args validate; the call and
a ToolMessage with its result go back, and that invoke must be answered.

    python langchain_tools.py http://127.0.0.1:PORT/v1
"""

import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the sources

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_openai import ChatOpenAI
from openai import OpenAI

from common import QUESTION, TIMEOUT_S, WEATHER_REPORT, WEATHER_TOOL, check, check_tool_call, request, run


def chat(base, model, **kwargs):
    return ChatOpenAI(base_url=base, api_key="strata-test", model=model, timeout=TIMEOUT_S, max_retries=0, **kwargs)


def check_call(ai, what):
    """The AIMessage's first tool call is get_weather with valid args; returns (id, args)."""
    check(isinstance(ai, AIMessage), f"{what}: {type(ai).__name__}, not an AIMessage")
    check(not ai.invalid_tool_calls, f"{what}: invalid tool calls: {ai.invalid_tool_calls}")
    check(ai.tool_calls, f"{what}: no tool_calls: {ai!r}")
    finish = ai.response_metadata.get("finish_reason")
    check(finish == "tool_calls", f"{what}: finish_reason {finish!r}")
    call = ai.tool_calls[0]
    args = check_tool_call(call["id"], call["name"], call["args"], what)
    return call["id"], args


def main(base):
    model = request(
        "GET /models", OpenAI(base_url=base, api_key="strata-test", timeout=TIMEOUT_S, max_retries=0).models.list
    )
    model = model.data[0].id
    question = [SystemMessage(QUESTION[0]["content"]), HumanMessage(QUESTION[1]["content"])]
    answer = chat(base, model, max_tokens=16, temperature=0, seed=1).bind_tools([WEATHER_TOOL], tool_choice="auto")
    seen = []
    for how, tool_choice, stream in [
        ("invoked, tool_choice named", "get_weather", False),
        ("streamed, tool_choice required", "required", True),
    ]:
        llm = chat(base, model, max_tokens=200, temperature=1.0, seed=len(seen) + 1)
        bound = llm.bind_tools([WEATHER_TOOL], tool_choice=tool_choice)
        what = f"turn 1 ({how})"
        if stream:
            chunks = list(request(what, bound.stream, question))
            check(chunks, f"{what}: nothing streamed")
            ai = chunks[0]
            for c in chunks[1:]:
                ai = ai + c
            ai = AIMessage(
                content=ai.content,
                tool_calls=ai.tool_calls,
                invalid_tool_calls=ai.invalid_tool_calls,
                response_metadata=ai.response_metadata,
                id=ai.id,
            )
        else:
            ai = request(what, bound.invoke, question)
        call_id, args = check_call(ai, what)

        what = f"turn 2 ({how})"
        reply = request(what, answer.invoke, question + [ai, ToolMessage(content=WEATHER_REPORT, tool_call_id=call_id)])
        check(isinstance(reply, AIMessage), f"{what}: {type(reply).__name__}, not an AIMessage")
        finish = reply.response_metadata.get("finish_reason")
        check(finish in ("stop", "length", "tool_calls"), f"{what}: finish_reason {finish!r}")
        check(isinstance(reply.content, str), f"{what}: content {reply.content!r}")
        seen.append(f"{how}: get_weather({args}) then {finish}")
    return f"LangChain ChatOpenAI on {model}: " + "; ".join(seen)


if __name__ == "__main__":
    run("langchain_tools", main)
