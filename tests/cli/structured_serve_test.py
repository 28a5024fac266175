"""granule-cli serve's structured output and tool calling against the official OpenAI client.

Run by structured_serve_test.sh as: python3 structured_serve_test.py GRANULE_CLI MODEL (the
default model, SmolLM2-135M). Checks: chat.completions.parse with a pydantic model gives a
parsed object; response_format json_schema replies validate (with the jsonschema package when
it is installed); json_object gives a JSON object; a tool round trip (tools -> tool_calls ->
tool message -> answer); streamed tool calls reassembled by the client equal the whole ones;
unsupported combinations and bad schemas get a 400 naming the field. Exits 1 on a failure.
"""

import json
import sys

import openai
import pydantic

from serve_support import granule_serve

try:
    import jsonschema
except ImportError:  # validated by hand below
    jsonschema = None

CLI, MODEL = sys.argv[1], sys.argv[2]


def check(condition, what):
    if not condition:
        raise AssertionError(what)


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    country: str = pydantic.Field(max_length=24)
    population: int = pydantic.Field(ge=0, le=100_000_000)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "The time in a city",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string",
                                                                          "maxLength": 20}},
                                "required": ["city"], "additionalProperties": False}},
}


def validate(instance, schema):
    if jsonschema is not None:
        jsonschema.validate(instance, schema)


def main():
    with granule_serve(CLI, MODEL, "--ctx", "1024", "--chats", "2", "--timeout", "120") as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                               max_retries=0, timeout=120)
        common = dict(model="any", temperature=0, max_tokens=96)

        # chat.completions.parse: the client sends the pydantic model as a strict json_schema.
        parsed = client.chat.completions.parse(
            messages=[{"role": "user", "content": "Describe Paris as JSON."}],
            response_format=City, **common)
        city = parsed.choices[0].message.parsed
        check(isinstance(city, City), f"parse gave no City: {parsed}")
        validate(json.loads(parsed.choices[0].message.content), City.model_json_schema())

        schema = {"type": "object",
                  "properties": {"answer": {"type": "string", "maxLength": 40},
                                 "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                                 "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                          "maxItems": 3}},
                  "required": ["answer", "confidence", "tags"], "additionalProperties": False}
        reply = client.chat.completions.create(
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "answer", "schema": schema, "strict": True}},
            **common)
        check(reply.choices[0].finish_reason == "stop", f"json_schema reply: {reply}")
        value = json.loads(reply.choices[0].message.content)
        validate(value, schema)
        check(set(value) == {"answer", "confidence", "tags"}, f"json_schema reply: {value}")

        obj = client.chat.completions.create(
            messages=[{"role": "user", "content": "Give a JSON object with your name."}],
            response_format={"type": "json_object"}, **common)
        text = obj.choices[0].message.content
        check(text.startswith("{"), f"json_object reply: {text!r}")
        if obj.choices[0].finish_reason == "stop":
            check(isinstance(json.loads(text), dict), f"json_object reply: {text!r}")

        # A tool round trip: the call, the tool's result, the answer.
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        first = client.chat.completions.create(messages=messages, tools=[WEATHER, TIME],
                                               tool_choice="required", parallel_tool_calls=False,
                                               **common)
        choice = first.choices[0]
        check(choice.finish_reason == "tool_calls", f"required tool call: {first}")
        calls = choice.message.tool_calls
        check(calls and calls[0].type == "function", f"no tool call: {first}")
        for call in calls:
            check(call.function.name in ("get_weather", "get_time"), f"call: {call}")
            tool = WEATHER if call.function.name == "get_weather" else TIME
            validate(json.loads(call.function.arguments), tool["function"]["parameters"])
            check(call.id, f"a call without id: {call}")
        messages.append(choice.message.model_dump(exclude_none=True))
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": json.dumps({"temperature": 18, "sky": "clear"})})
        answer = client.chat.completions.create(messages=messages, tools=[WEATHER, TIME], **common)
        check(answer.choices[0].finish_reason in ("stop", "length", "tool_calls"), f"answer: {answer}")
        check(answer.choices[0].message.content or answer.choices[0].message.tool_calls,
              f"an empty answer after the tool result: {answer}")

        # A named function, whole and streamed: the client reassembles the same call.
        named = dict(messages=[{"role": "user", "content": "Weather in Rome please"}],
                     tools=[WEATHER, TIME],
                     tool_choice={"type": "function", "function": {"name": "get_weather"}},
                     parallel_tool_calls=False, **common)
        whole = client.chat.completions.create(**named)
        whole_calls = whole.choices[0].message.tool_calls
        check(whole_calls and all(c.function.name == "get_weather" for c in whole_calls),
              f"named call: {whole}")
        check(whole.choices[0].message.content is None, f"content beside the call: {whole}")
        streamed, finish = {}, None
        with client.chat.completions.stream(**named) as stream:
            for event in stream:
                pass
            final = stream.get_final_completion()
        finish = final.choices[0].finish_reason
        streamed_calls = final.choices[0].message.tool_calls
        check(finish == "tool_calls", f"streamed finish_reason {finish}")
        check([(c.function.name, c.function.arguments) for c in streamed_calls] ==
              [(c.function.name, c.function.arguments) for c in whole_calls],
              f"streamed calls {streamed_calls} differ from {whole_calls}")
        # The raw deltas, as OpenAI sends them: index, id, type and name first.
        raw = [c for c in client.chat.completions.create(**named, stream=True)]
        deltas = [tc for c in raw for ch in c.choices for tc in (ch.delta.tool_calls or [])]
        check(deltas and deltas[0].index == 0 and deltas[0].id and deltas[0].type == "function"
              and deltas[0].function.name == "get_weather", f"tool-call deltas: {deltas}")
        check(raw[-1].choices[0].finish_reason == "tool_calls", f"last chunk: {raw[-1]}")

        bad = [(dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
                "tool_choice"),
               (dict(tool_choice="required"), "tool_choice"),
               (dict(response_format={"type": "yaml"}), "response_format.type"),
               (dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
                "response_format.json_schema.schema"),
               (dict(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}),
                "tool_choice"),
               (dict(tools=[{"type": "function"}]), "tools[0]")]
        for extra, param in bad:
            try:
                client.chat.completions.create(
                    messages=[{"role": "user", "content": "hi"}], **common, **extra)
                check(False, f"{extra} was accepted")
            except openai.BadRequestError as e:
                check(e.status_code == 400 and e.body and e.body.get("param") == param,
                      f"{extra}: {e.status_code} {e.body}")
        # A schema the compiler refuses: a 400 from the engine, not a hang or a 500.
        try:
            client.chat.completions.create(
                messages=[{"role": "user", "content": "hi"}], **common,
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "x", "schema": {"type": "object",
                                                                         "properties": {"a": {"$ref": "#/nowhere"}},
                                                                         "required": ["a"]}}})
            check(False, "a schema with a dangling $ref was accepted")
        except openai.BadRequestError as e:
            check(e.status_code == 400, f"dangling $ref: {e.status_code} {e.body}")
        print("structured_serve_test: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"structured_serve_test: FAILED: {e}")
        sys.exit(1)
