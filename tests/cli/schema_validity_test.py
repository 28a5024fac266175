"""Every reply to a JSON Schema validates: the JSON-Schema-Test-Suite's draft 2020-12 schemas.

Run by schema_validity_test.sh as: python3 schema_validity_test.py GRANULE_CLI MODEL SUITE_DIR
(the default model; the suite from `setup.sh schemasuite`). Each schema of the suite goes to
granule-cli serve as response_format json_schema, greedy, on 8 chats at once. A schema with a
keyword the server does not enforce must be refused with a 400; every reply that ends by itself
must validate under its schema (the jsonschema package, draft 2020-12). Replies cut by
max_tokens (a tiny model may write digits forever where a schema bounds nothing) are counted
and reported, never taken as valid. Prints the counts; exits 1 on an invalid reply, a 5xx, or
a schema the server accepted without enforcing.
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

CLI, MODEL, SUITE = sys.argv[1], sys.argv[2], sys.argv[3]
MAX_TOKENS = 96


def cases():
    for path in sorted(glob.glob(os.path.join(SUITE, "*.json"))):
        with open(path, encoding="utf-8") as f:
            for group in json.load(f):
                yield os.path.basename(path)[:-5] + ": " + group["description"], group["schema"]


def main():
    proc = subprocess.Popen([CLI, "serve", MODEL, "--port", "0", "--device", "cpu", "--ctx", "512",
                             "--chats", "8", "--timeout", "300"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    counts = {"valid": 0, "refused": 0, "length": 0, "invalid": 0, "error": 0}
    problems = []
    start = time.monotonic()
    try:
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        if not match:
            print(f"schema_validity_test: FAILED: serve did not report its port: {line!r}")
            return 1
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{match.group(1)}/v1", api_key="none",
                               max_retries=0, timeout=300)

        def one(case):
            name, schema = case
            try:
                reply = client.chat.completions.create(
                    model="any", temperature=0, max_tokens=MAX_TOKENS,
                    messages=[{"role": "user", "content": "Reply with a JSON value."}],
                    response_format={"type": "json_schema",
                                     "json_schema": {"name": "x", "schema": schema, "strict": True}})
            except openai.BadRequestError:
                return name, "refused", ""
            except openai.APIStatusError as e:
                return name, "error", f"{e.status_code}: {e.body}"
            choice = reply.choices[0]
            if choice.finish_reason == "length":
                return name, "length", choice.message.content
            try:
                jsonschema.Draft202012Validator(schema).validate(json.loads(choice.message.content))
            except (ValueError, jsonschema.ValidationError) as e:
                return name, "invalid", f"{choice.message.content!r}: {str(e).splitlines()[0]}"
            except Exception as e:  # the validator itself could not check it
                return name, "error", f"accepted a schema jsonschema cannot check: {e}"
            return name, "valid", ""

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for name, outcome, detail in pool.map(one, list(cases())):
                counts[outcome] += 1
                if outcome in ("invalid", "error"):
                    problems.append(f"{outcome}: {name}: {detail}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    total = sum(counts.values())
    accepted = counts["valid"] + counts["invalid"] + counts["length"]
    print(f"schema_validity_test: {total} schemas in {time.monotonic() - start:.0f} s: "
          f"{counts['refused']} refused (keywords not enforced), {accepted} accepted: "
          f"{counts['valid']} replies valid, {counts['invalid']} invalid, {counts['length']} cut at "
          f"{MAX_TOKENS} tokens; {counts['error']} errors")
    for p in problems:
        print("  " + p)
    return 1 if problems or counts["valid"] == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
