"""granule-cli serve's reasoning fields against the official OpenAI Python client.

Run by reasoning_serve_test.sh as: python3 reasoning_serve_test.py GRANULE_CLI MODEL, where
MODEL is a synthetic model whose template opens <think> at the end of the prompt unless
chat_template_kwargs.enable_thinking is false. Its random weights never write </think>, so a
reply that starts inside the reasoning is all reasoning_content. Checks: reasoning_content in
a whole response and in streamed deltas (the same text), content empty then; enable_thinking
false gives content and no reasoning; reasoning_effort accepted; unsupported template
variables and bad values answered with 400 naming the field. Exits 1 on the first failure.
"""

import json
import sys

import openai

from serve_support import granule_serve

CLI, MODEL = sys.argv[1], sys.argv[2]


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def main():
    with granule_serve(CLI, MODEL, "--ctx", "256", "--chats", "2", "--timeout", "60") as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                               max_retries=0, timeout=60)
        messages = [{"role": "user", "content": "What is 2+2?"}]
        common = dict(model="any", messages=messages, max_tokens=12, temperature=0)

        whole = client.chat.completions.create(**common)
        message = whole.choices[0].message
        reasoning = getattr(message, "reasoning_content", None)
        check(reasoning, f"no reasoning_content in a reply that starts inside <think>: {whole}")
        check(not message.content, f"content beside reasoning that never closed: {message.content!r}")

        streamed_reasoning, streamed_content, chunks, events = "", "", 0, 0
        for chunk in client.chat.completions.create(**common, stream=True):
            events += 1
            for choice in chunk.choices:
                part = getattr(choice.delta, "reasoning_content", None)
                if part:
                    streamed_reasoning += part
                    chunks += 1
                streamed_content += choice.delta.content or ""
        check(streamed_reasoning == reasoning,
              f"streamed reasoning {streamed_reasoning!r} differs from the whole {reasoning!r}")
        # The server joins the deltas a slow reader has not taken yet into one event (a loaded
        # CI machine), so the reasoning may come in one delta; the stream still has its own
        # events before the final one.
        check(chunks >= 1 and events >= 2,
              f"reasoning in {chunks} delta(s) over {events} event(s): not streamed")
        check(streamed_content == "", f"streamed content {streamed_content!r}")

        plain = client.chat.completions.create(
            **common, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        check(plain.choices[0].message.content, f"no content with enable_thinking false: {plain}")
        check(getattr(plain.choices[0].message, "reasoning_content", None) is None,
              f"reasoning_content with enable_thinking false: {plain}")

        effort = client.chat.completions.create(**common, reasoning_effort="high")
        check(effort.choices[0].finish_reason in ("stop", "length"), f"reasoning_effort: {effort}")

        bad = [({"chat_template_kwargs": {"tools_in_user_message": True}},
                "chat_template_kwargs.tools_in_user_message"),
               ({"chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs.enable_thinking"),
               ({"chat_template_kwargs": "thinking"}, "chat_template_kwargs"),
               ({"reasoning_effort": "extreme"}, "reasoning_effort")]
        for extra, param in bad:
            try:
                client.chat.completions.create(**common, extra_body=extra)
                check(False, f"{extra} was accepted")
            except openai.BadRequestError as e:
                check(e.status_code == 400 and e.body and e.body.get("param") == param,
                      f"{extra}: {e.status_code} {e.body}")
        print("reasoning_serve_test: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAIL: {e}")
        sys.exit(1)
