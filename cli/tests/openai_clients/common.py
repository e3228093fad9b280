"""What the client scripts share: the get_weather tool, the checks of a tool call, and
how a script ends (one summary line on success; a clear message and exit 1 on failure).

The scripts run from cli/tests/openai_clients.rs, with the venv scripts/python-clients.sh
makes, against a running `strata-run serve`:

    python SCRIPT.py http://127.0.0.1:PORT/v1
"""

import json
import sys
import traceback

import jsonschema

# Every client call is bounded: no request waits longer than this, and none is retried.
TIMEOUT_S = 120

# The arguments of get_weather. `city` is bounded so that a model of random weights (the
# tests' synthetic pack), held to this schema, closes the string and finishes the call.
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris", "maxLength": 32},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": WEATHER_PARAMETERS,
    },
}

QUESTION = [
    {"role": "system", "content": "You are a helpful assistant. Use the tools you are given."},
    {"role": "user", "content": "What is the weather like in Paris today?"},
]

WEATHER_REPORT = json.dumps({"city": "Paris", "temperature": 18, "unit": "celsius", "conditions": "sunny"})


class Failure(Exception):
    """A check that did not hold: the script fails with this message."""


def check(cond, message):
    if not cond:
        raise Failure(message)


def validate(instance, schema, what):
    """`instance` against `schema`, or a Failure naming `what` and the first violation."""
    try:
        jsonschema.validate(instance, schema)
    except jsonschema.ValidationError as e:
        path = "/".join(str(p) for p in e.absolute_path) or "(top)"
        raise Failure(f"{what}: {json.dumps(instance)} does not match the schema at {path}: {e.message}") from None


def parse_json(text, what):
    try:
        return json.loads(text)
    except (TypeError, ValueError) as e:
        raise Failure(f"{what}: not JSON ({e}): {text!r}") from None


def check_tool_call(call_id, name, arguments, what):
    """A get_weather call: an id, the name, and `arguments` (a JSON string, or the object a
    framework parsed it into) that validates against WEATHER_PARAMETERS. Returns the arguments."""
    check(isinstance(call_id, str) and call_id, f"{what}: the tool call has no id: {call_id!r}")
    check(name == "get_weather", f"{what}: the tool call names {name!r}, not 'get_weather'")
    args = parse_json(arguments, f"{what}: function.arguments") if isinstance(arguments, str) else arguments
    validate(args, WEATHER_PARAMETERS, f"{what}: the arguments")
    return args


def request(what, call, *args, **kwargs):
    """call(*args, **kwargs), a request through a client; an HTTP error becomes a Failure
    naming `what`, the status and the server's body (its OpenAI-style error)."""
    import openai

    try:
        return call(*args, **kwargs)
    except openai.APIStatusError as e:
        raise Failure(f"{what}: HTTP {e.status_code}: {e.response.text}") from None
    except openai.APIConnectionError as e:
        raise Failure(f"{what}: {type(e).__name__}: {e}") from None


def run(script, main):
    """Runs main(base_url) with the base URL from argv; prints the line main returns, or
    fails with one message (HTTP errors with their status and body)."""
    if len(sys.argv) != 2:
        print(f"usage: {script}.py http://HOST:PORT/v1", file=sys.stderr)
        sys.exit(2)
    try:
        summary = main(sys.argv[1].rstrip("/"))
    except Failure as e:
        print(f"{script}: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
    except Exception as e:  # any other error fails the script too, said clearly
        import openai

        if isinstance(e, openai.APIStatusError):
            print(f"{script}: FAILED: HTTP {e.status_code} from the server: {e.response.text}", file=sys.stderr)
        else:
            traceback.print_exc()
            print(f"{script}: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"{script}: ok: {summary}")
