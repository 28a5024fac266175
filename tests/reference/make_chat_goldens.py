#!/usr/bin/env python3
"""Golden chat-template renderings for tests/engine/chat_template_test.cpp.

Renders the models' real Jinja chat templates (copied from their tokenizer_config.json /
GGUF tokenizer.chat_template) with the `jinja2` package, configured the way Hugging Face
transformers does (sandboxed, trim_blocks, lstrip_blocks, loopcontrols, its tojson,
raise_exception, strftime_now), and writes:
  tests/data/chat/<template>.jinja            the template source
  tests/data/chat/<template>.<case>.txt       its output for one conversation (raw bytes)
The templates of FILE_TEMPLATES are read from tests/data/chat/<template>.jinja instead: they
were copied from llama.cpp's models/templates/ (llama-cpp-python 0.3.36's vendor/llama.cpp),
which holds each model's template as its tokenizer_config.json has it. Their extra cases set
the template variables a request may set (enable_thinking, reasoning_effort, tools).
The C++ renderers (hand-written families and the Jinja engine) are tested against these files.

Run:  pip install jinja2 && python3 tests/reference/make_chat_goldens.py
"""
import datetime
import json
import pathlib

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

OUT = pathlib.Path(__file__).resolve().parent.parent / "data" / "chat"

# --- Real template sources -------------------------------------------------------------

# HuggingFaceTB/SmolLM2-135M-Instruct (read from the default model's GGUF): ChatML that
# injects a default system prompt when the conversation has none.
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)

# teknium/OpenHermes-2.5-Mistral-7B: plain ChatML.
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)

# meta-llama/Meta-Llama-3-8B-Instruct.
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# meta-llama/Llama-3.2-3B-Instruct: a system turn with the knowledge cut-off and today's date
# (strftime_now; pinned to TODAY below) always comes first.
LLAMA32 = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""
# The date strftime_now gives while rendering (the C++ test pins the same one).
TODAY = datetime.date(2026, 12, 2)

# meta-llama/Llama-2-7b-chat-hf.
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)

# mistralai/Mistral-7B-Instruct-v0.1/v0.2 (the template shipped in most GGUF conversions).
# It rejects a system message; Granule prepends the system prompt to the first user message
# with a blank line between (as Mistral's later official templates do), so the system cases
# below are rendered from the conversation with that merge applied (see merge_system).
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}"
)

# google/gemma-3-4b-it (text parts): the system prompt is merged into the first user turn.
GEMMA = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

# microsoft/Phi-3-mini-4k-instruct (current revision).
PHI3 = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)

# The template inside llama.cpp's Phi-3 vocabulary GGUF (the first Phi-3-mini release): it
# writes BOS and drops system messages, so only the conversation without one is rendered.
PHI3_GGUF = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}"
    "{{'<|user|>' + '\n' + message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}"
    "{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\n'}}"
    "{% endif %}{% endfor %}"
)

# name -> (source, bos_token, eos_token, merge a system message into the first user one,
#          the cases to render: None = all)
TEMPLATES = {
    "smollm2": (SMOLLM2, "<|im_start|>", "<|im_end|>", False, None),
    "chatml": (CHATML, "<s>", "</s>", False, None),
    "llama3": (LLAMA3, "<|begin_of_text|>", "<|eot_id|>", False, None),
    "llama32": (LLAMA32, "<|begin_of_text|>", "<|eot_id|>", False, None),
    "llama2": (LLAMA2, "<s>", "</s>", False, None),
    "mistral": (MISTRAL, "<s>", "</s>", True, None),
    "gemma": (GEMMA, "<bos>", "<eos>", False, None),
    "phi3": (PHI3, "<s>", "<|endoftext|>", False, None),
    "phi3_gguf": (PHI3_GGUF, "<s>", "<|endoftext|>", False, ["no_system"]),
}

# Real templates read from tests/data/chat/<name>.jinja (copied from llama.cpp's
# models/templates/<file>): name -> (llama.cpp's file name, bos_token, eos_token, extra cases).
FILE_TEMPLATES = {
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", "", "<|im_end|>", ["no_thinking", "tools"]),
    "gpt_oss": ("openai-gpt-oss-120b.jinja", "<|startoftext|>", "<|return|>",
                ["effort_high", "effort_low"]),
    "llama31": ("meta-llama-Llama-3.1-8B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>",
                ["tools"]),
    "mistral_nemo": ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>", "</s>", []),
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name"}},
            "required": ["city"],
        },
    },
}

SYSTEM = {"role": "system", "content": "You are a helpful assistant"}
# Conversations: (messages, add_generation_prompt). Padded and non-ASCII content checks
# that each format trims exactly where its template does and passes UTF-8 through.
CASES = {
    "multiturn_system": ([
        SYSTEM,
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there"},
        {"role": "user", "content": "Who are you"},
        {"role": "assistant", "content": "   I am an assistant   "},
        {"role": "user", "content": "Another question \u00e9\u2603"},
    ], True),
    "system_user": ([SYSTEM, {"role": "user", "content": " Why is the sky blue?\n"}], True),
    "no_system": ([
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there"},
        {"role": "user", "content": "Who are you"},
    ], True),
    "no_generation_prompt": ([
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there"},
    ], False),
}


# Extra cases: (the CASES conversation they render, template variables).
EXTRA_CASES = {
    "no_thinking": ("system_user", {"enable_thinking": False}),
    "effort_high": ("system_user", {"reasoning_effort": "high"}),
    "effort_low": ("no_system", {"reasoning_effort": "low"}),
    "tools": ("system_user", {"tools": [WEATHER_TOOL]}),
}


def merge_system(messages):
    if not messages or messages[0]["role"] != "system":
        return messages
    first = dict(messages[1])
    first["content"] = messages[0]["content"] + "\n\n" + first["content"]
    return [first] + messages[2:]


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' own tojson: json.dumps without jinja2's HTML escaping.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = TODAY.strftime
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (source, bos, eos, merge, cases) in TEMPLATES.items():
        (OUT / f"{name}.jinja").write_bytes(source.encode())
        template = env.from_string(source)
        for case, (messages, add_generation_prompt) in CASES.items():
            if cases is not None and case not in cases:
                continue
            if merge:
                messages = merge_system(messages)
            text = template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                   bos_token=bos, eos_token=eos)
            (OUT / f"{name}.{case}.txt").write_bytes(text.encode())
    for name, (_, bos, eos, extras) in FILE_TEMPLATES.items():
        template = env.from_string((OUT / f"{name}.jinja").read_text())
        cases = {case: (messages, gen, {}) for case, (messages, gen) in CASES.items()}
        for extra in extras:
            base, variables = EXTRA_CASES[extra]
            cases[extra] = (*CASES[base], variables)
        for case, (messages, add_generation_prompt, variables) in cases.items():
            text = template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                   bos_token=bos, eos_token=eos, **variables)
            (OUT / f"{name}.{case}.txt").write_bytes(text.encode())
    print(f"wrote {len(TEMPLATES)} templates x {len(CASES)} cases and {len(FILE_TEMPLATES)} "
          f"file templates to {OUT}")


if __name__ == "__main__":
    main()
