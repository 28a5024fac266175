"""granule-cli serve's forced tool calls on gpt-oss's harmony format, with the official client.

Run by harmony_tool_serve_test.sh as: python3 harmony_tool_serve_test.py GRANULE_CLI MODEL, where
MODEL is the synthetic model carrying gpt-oss's chat template (its random weights write nothing
meaningful, so every call below comes from the forced header and the arguments' constraint).
Checks: a named function, and tool_choice required with one tool or several, each give exactly
one call (of that function; for several, of one of them) whose arguments validate against its
schema, whole and streamed (the deltas as OpenAI sends them: index, id, type and name first with
no arguments, then the arguments in pieces, reassembled by the client into the same call); auto
and none are answered as before (none: never a call). Exits 1 on the first failure.
"""

import json
import sys

import openai

from serve_support import granule_serve

try:
    import jsonschema
except ImportError:  # checked by hand below
    jsonschema = None

CLI, MODEL = sys.argv[1], sys.argv[2]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "The time in a city",
                 "parameters": {"type": "object",
                                "properties": {"hour24": {"type": "boolean"}},
                                "required": ["hour24"], "additionalProperties": False}},
}


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def validate(arguments, tool):
    value = json.loads(arguments)
    schema = tool["function"]["parameters"]
    if jsonschema is not None:
        jsonschema.validate(value, schema)
    else:
        check(isinstance(value, dict) and set(value) == set(schema["required"]),
              f"arguments {arguments!r} do not fit {schema}")


def expect_one_call(client, expected, **request):
    """One call of `expected` (a tool, or a list of them); returns the function's name."""
    expected = expected if isinstance(expected, list) else [expected]
    by_name = {t["function"]["name"]: t for t in expected}
    whole = client.chat.completions.create(**request)
    choice = whole.choices[0]
    check(choice.finish_reason == "tool_calls", f"finish_reason: {whole}")
    calls = choice.message.tool_calls
    check(calls and len(calls) == 1, f"not one call: {whole}")
    check(calls[0].type == "function" and calls[0].id and calls[0].function.name in by_name,
          f"call: {calls[0]}")
    tool = by_name[calls[0].function.name]
    check(not choice.message.content, f"content beside the call: {choice.message.content!r}")
    validate(calls[0].function.arguments, tool)

    # Streamed: the raw deltas, then the client's reassembly.
    raw = list(client.chat.completions.create(**request, stream=True))
    deltas = [tc for c in raw for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    check(deltas and deltas[0].index == 0 and deltas[0].id and deltas[0].type == "function"
          and deltas[0].function.name == calls[0].function.name, f"tool-call deltas: {deltas}")
    check(all(d.index == 0 for d in deltas), f"deltas of more than one call: {deltas}")
    # Name first, then the arguments as they come, in later deltas that name nothing.
    check(not deltas[0].function.arguments and len(deltas) > 1 and
          all(d.id is None and d.function.name is None for d in deltas[1:]),
          f"not the name first, then argument pieces: {deltas}")
    arguments = "".join(d.function.arguments or "" for d in deltas)
    check(arguments == calls[0].function.arguments,
          f"streamed arguments {arguments!r} differ from the whole {calls[0].function.arguments!r}")
    content = "".join(ch.delta.content or "" for c in raw for ch in c.choices)
    check(content == "", f"streamed content beside the call: {content!r}")
    check(raw[-1].choices[0].finish_reason == "tool_calls", f"last chunk: {raw[-1]}")
    with client.chat.completions.stream(**request) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    reassembled = final.choices[0].message.tool_calls
    check([(c.function.name, c.function.arguments) for c in reassembled] ==
          [(c.function.name, c.function.arguments) for c in calls],
          f"the client's reassembled calls {reassembled} differ from {calls}")
    return calls[0].function.name


def main():
    with granule_serve(CLI, MODEL, "--ctx", "2048", "--chats", "2", "--timeout", "120") as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                               max_retries=0, timeout=120)
        common = dict(model="any", temperature=0, max_tokens=160, parallel_tool_calls=False,
                      messages=[{"role": "user", "content": "What is the weather in Rome?"}])

        for seed in (1, 2):
            expect_one_call(client, WEATHER, tools=[WEATHER, TIME], seed=seed,
                            tool_choice={"type": "function", "function": {"name": "get_weather"}},
                            **common)
        expect_one_call(client, TIME, tools=[WEATHER, TIME],
                        tool_choice={"type": "function", "function": {"name": "get_time"}},
                        **common)
        expect_one_call(client, TIME, tools=[TIME], tool_choice="required", **common)

        # auto: the model decides (random weights: free text, cut by max_tokens).
        auto = client.chat.completions.create(tools=[WEATHER, TIME], tool_choice="auto",
                                              **dict(common, max_tokens=24))
        check(auto.choices[0].finish_reason in ("stop", "length", "tool_calls"), f"auto: {auto}")
        # none: never a call.
        none = client.chat.completions.create(tools=[WEATHER, TIME], tool_choice="none",
                                              **dict(common, max_tokens=24))
        check(not none.choices[0].message.tool_calls and
              none.choices[0].finish_reason in ("stop", "length"), f"none: {none}")

        # required with several tools: the name constrained to theirs, then that tool's
        # arguments (its schema): one call of one of them, whichever order the tools come in.
        names = {expect_one_call(client, [WEATHER, TIME], tools=tools, tool_choice="required",
                                 seed=seed, **common)
                 for tools in ([WEATHER, TIME], [TIME, WEATHER]) for seed in (1, 2, 3)}
        print(f"harmony_tool_serve_test: required with two tools called {sorted(names)}")
        print("harmony_tool_serve_test: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"harmony_tool_serve_test: {e}")
        sys.exit(1)
