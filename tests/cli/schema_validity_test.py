"""Every reply to a JSON Schema validates: the JSON-Schema-Test-Suite's draft 2020-12 schemas.

Run by schema_validity_test.sh as: python3 schema_validity_test.py GRANULE_CLI MODEL SUITE_DIR
(the default model; the suite from `setup.sh schemasuite`). Each schema of the suite goes to
granule-cli serve as response_format json_schema, greedy, on 8 chats at once. A schema with a
keyword the server does not enforce must be refused with a 400; every reply that ends by itself
must validate under its schema (the jsonschema package, draft 2020-12). A reply cut by
max_tokens (a tiny model may repeat digits, words or properties forever where a schema bounds
nothing) is not JSON, as OpenAI's are not: it is counted apart, and must be the beginning of a
JSON text (nothing invalid before the cut). A cut reply is asked again once with the frequency
and presence penalties a user would set against the loop (1.0 and 0.5): what then ends by itself
must validate too, counted apart. Prints the counts, and the refusals by keyword;
exits 1 on an invalid reply, a cut reply that is not a JSON prefix, a 5xx, or a refusal that
names nothing.
"""

import concurrent.futures
import glob
import json
import os
import re
import subprocess
import sys
import time

import jsonschema
import openai

from serve_support import granule_serve

CLI, MODEL, SUITE = sys.argv[1], sys.argv[2], sys.argv[3]
MAX_TOKENS = 512


NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def json_prefix(text):
    """Whether `text` is the beginning of a JSON text (or a whole one): nothing invalid so far."""
    stack, state, i, n = [], "value", 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\n\r":
            i += 1
        elif state in ("value", "value_or_end"):
            if state == "value_or_end" and c == "]":
                stack.pop()
                state, i = "after", i + 1
            elif c in "{[":
                stack.append(c)
                state, i = ("key_or_end" if c == "{" else "value_or_end"), i + 1
            elif c == '"':
                i = string_end(text, i)
                if i is None:
                    return False
                state = "after"
            elif c in "-0123456789":
                j = i
                while j < n and text[j] in "+-.eE0123456789":
                    j += 1
                run = text[i:j]
                if j == n:  # cut inside the number: some digit must complete it
                    return bool(NUMBER.fullmatch(run) or NUMBER.fullmatch(run + "0"))
                if not NUMBER.fullmatch(run):
                    return False
                state, i = "after", j
            else:
                word = next((w for w in ("true", "false", "null") if w[0] == c), None)
                if word is None or not word.startswith(text[i:i + len(word)]):
                    return False
                if i + len(word) > n:
                    return True
                state, i = "after", i + len(word)
        elif state in ("key", "key_or_end"):
            if state == "key_or_end" and c == "}":
                stack.pop()
                state, i = "after", i + 1
            elif c == '"':
                i = string_end(text, i)
                if i is None:
                    return False
                state = "colon"
            else:
                return False
        elif state == "colon":
            if c != ":":
                return False
            state, i = "value", i + 1
        else:  # after a value
            if not stack:
                return False  # text after a whole value
            if c == ",":
                state = "key" if stack[-1] == "{" else "value"
            elif (c, stack[-1]) in (("}", "{"), ("]", "[")):
                stack.pop()
            else:
                return False
            i += 1
    return True


def string_end(text, i):
    """The index after the string opening at text[i], len(text) if it is cut, None if invalid."""
    j, n = i + 1, len(text)
    while j < n:
        c = text[j]
        if c == '"':
            return j + 1
        if c == "\\":
            e = text[j + 1:j + 2]
            if e == "u":
                digits = text[j + 2:j + 6]
                if not all(d in "0123456789abcdefABCDEF" for d in digits):
                    return None
                j += 6
            elif e == "" or e in '"\\/bfnrt':
                j += 2
            else:
                return None
        elif ord(c) < 0x20:
            return None
        else:
            j += 1
    return n


def refused_for(message):
    """What a 400 names: the keyword it refuses, else the gist of its message."""
    match = re.search(r"keyword '([^']+)'", message)
    if match:
        return match.group(1)
    for gist in ("must point into the schema itself", "the schema false", "points at nothing",
                 "without escapes", "which 'properties' does not describe", "must be a"):
        if gist in message:
            return gist
    return message[:60]


def cases():
    for path in sorted(glob.glob(os.path.join(SUITE, "*.json"))):
        with open(path, encoding="utf-8") as f:
            for group in json.load(f):
                yield os.path.basename(path)[:-5] + ": " + group["description"], group["schema"]


def main():
    counts = {"valid": 0, "valid after penalties": 0, "refused": 0, "length": 0, "invalid": 0, "error": 0}
    problems = []
    refusals = {}
    start = time.monotonic()
    try:
        with granule_serve(CLI, MODEL, "--ctx", "1024", "--chats", "8", "--timeout", "300",
                           stderr=subprocess.DEVNULL) as port:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                                   max_retries=0, timeout=300)

            def ask(schema, **penalties):
                return client.chat.completions.create(
                    model="any", temperature=0, max_tokens=MAX_TOKENS,
                    messages=[{"role": "user", "content": "Reply with a JSON value."}],
                    response_format={"type": "json_schema",
                                     "json_schema": {"name": "x", "schema": schema, "strict": True}},
                    **penalties)

            def one(case):
                name, schema = case
                penalised = False
                try:
                    reply = ask(schema)
                    if reply.choices[0].finish_reason == "length" and json_prefix(
                            reply.choices[0].message.content):
                        reply = ask(schema, frequency_penalty=1.0, presence_penalty=0.5)
                        penalised = True
                except openai.BadRequestError as e:
                    message = e.body.get("message", "") if isinstance(e.body, dict) else str(e.body)
                    if not message:
                        return name, "error", "a 400 without a message"
                    return name, "refused", refused_for(message)
                except openai.APIStatusError as e:
                    return name, "error", f"{e.status_code}: {e.body}"
                choice = reply.choices[0]
                if choice.finish_reason == "length":
                    if not json_prefix(choice.message.content):
                        return name, "invalid", f"cut, and not JSON before the cut: {choice.message.content!r}"
                    return name, "length", ""
                try:
                    jsonschema.Draft202012Validator(schema).validate(json.loads(choice.message.content))
                except (ValueError, jsonschema.ValidationError) as e:
                    return name, "invalid", f"{choice.message.content!r}: {str(e).splitlines()[0]}"
                except Exception as e:  # the validator itself could not check it
                    return name, "error", f"accepted a schema jsonschema cannot check: {e}"
                return name, "valid after penalties" if penalised else "valid", ""

            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                for name, outcome, detail in pool.map(one, list(cases())):
                    counts[outcome] += 1
                    if outcome == "refused":
                        refusals[detail] = refusals.get(detail, 0) + 1
                    if outcome in ("invalid", "error"):
                        problems.append(f"{outcome}: {name}: {detail}")
    except AssertionError as e:  # serve did not start
        print(f"schema_validity_test: FAILED: {e}")
        return 1
    total = sum(counts.values())
    accepted = counts["valid"] + counts["valid after penalties"] + counts["invalid"] + counts["length"]
    print(f"schema_validity_test: {total} schemas in {time.monotonic() - start:.0f} s: "
          f"{counts['refused']} refused (keywords not enforced), {accepted} accepted: "
          f"{counts['valid']} replies valid, {counts['valid after penalties']} more valid when asked "
          f"again with penalties, {counts['invalid']} invalid, {counts['length']} cut at "
          f"{MAX_TOKENS} tokens even then; {counts['error']} errors")
    print("  refused for: " + ", ".join(f"{k} {v}" for k, v in
                                       sorted(refusals.items(), key=lambda kv: (-kv[1], kv[0]))))
    for p in problems:
        print("  " + p)
    return 1 if problems or counts["valid"] == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
