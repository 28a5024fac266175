"""granule-cli serve against the official OpenAI Python client, curl and raw sockets.

Run by serve_test.sh as: python3 serve_test.py GRANULE_CLI MODEL. Starts the server on a
free loopback port with the CPU backend and checks: chat completions streamed and not, stop
strings, max_tokens, seed reproducibility, error JSON; /health and /metrics with curl; bad
input (malformed JSON, wrong types, a body over the limit, a prompt over the context, 500
rapid connects and disconnects) answered with the right 4xx while the server keeps serving;
a client that goes away is cancelled; 64 concurrent streams all complete and leave no KV
committed; the API key and --max-requests. Exits 1 on the first failed check.
"""

import concurrent.futures
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time

import openai

from serve_support import start_serve, stop_serve

CLI, MODEL = sys.argv[1], sys.argv[2]
CHECKS = 0


def check(condition, what):
    global CHECKS
    CHECKS += 1
    if not condition:
        raise AssertionError(what)


class Server:
    """granule-cli serve on 127.0.0.1, any free port (--port 0 prints the one it took)."""

    def __init__(self, *extra):
        self.proc, self.port = start_serve(CLI, MODEL, "--ctx", "512", "--chats", "8", "--max-body", "64KiB",
                                           "--timeout", "120", *extra)
        self.url = f"http://127.0.0.1:{self.port}"

    def client(self, api_key="none"):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=120)

    def raw(self, method, path, body=None, headers=None):
        """(status, parsed JSON or text) over a fresh connection."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        data = body if isinstance(body, (bytes, type(None))) else body.encode()
        conn.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
        response = conn.getresponse()
        text = response.read().decode()
        conn.close()
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text

    def metrics(self):
        text = subprocess.run(["curl", "-sf", self.url + "/metrics"], capture_output=True, text=True,
                              timeout=30).stdout
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.split()
                values[name] = float(value)
        return values

    def wait_idle(self, seconds=20):
        """Waits until no request runs and no running request holds KV (what stays committed is
        kept for prompt reuse, and reported as kept); returns the last metrics."""
        deadline = time.time() + seconds
        while True:
            m = self.metrics()
            idle = (m["granule_chats_running"] == 0 and m["granule_chats_waiting"] == 0 and
                    m["granule_kv_active_bytes"] == 0 and m["granule_server_requests_active"] == 0 and
                    m["granule_kv_committed_bytes"] == m["granule_kv_kept_bytes"])
            if idle or time.time() > deadline:
                return m
            time.sleep(0.1)

    def works(self, what):
        """The server still answers a chat completion after `what`."""
        reply = self.client().chat.completions.create(
            model="any", messages=[{"role": "user", "content": "Say hi"}], max_tokens=3, temperature=0)
        check(reply.usage.completion_tokens >= 1 and reply.choices[0].finish_reason in ("stop", "length"),
              f"no working reply after {what}: {reply}")

    def stop(self):
        check(stop_serve(self.proc, on_hang=print_backtrace), "serve did not stop on SIGTERM within 20 s")
        check(self.proc.returncode == 0, f"serve exited with {self.proc.returncode}: {self.proc.stderr.read()[-500:]}")


def print_backtrace(proc):
    """Says where a server that does not stop hangs, when a debugger is at hand."""
    if subprocess.run(["which", "gdb"], capture_output=True).returncode == 0:
        bt = subprocess.run(["gdb", "-batch", "-p", str(proc.pid), "-ex", "thread apply all bt"],
                            capture_output=True, text=True, timeout=120).stdout
        frames = [l for l in bt.splitlines() if re.match(r"#\d+ ", l) and ("granule" in l or "httplib" in l)]
        print("\n".join(frames[:80]))


def expect_api_error(status, body, want_status, what):
    check(status == want_status, f"{what}: status {status}, wanted {want_status}: {body}")
    check(isinstance(body, dict) and isinstance(body.get("error"), dict), f"{what}: no error JSON: {body}")
    error = body["error"]
    check(isinstance(error.get("message"), str) and error["message"] and "type" in error and
          "param" in error and "code" in error, f"{what}: incomplete error JSON: {body}")
    return error


def first_chunk_arrives(sock, seconds=30):
    """Reads from a raw streaming response until its first SSE event (True) or the end."""
    received = b""
    deadline = time.time() + seconds
    while b"data: " not in received and time.time() < deadline:
        piece = sock.recv(4096)
        if not piece:
            break
        received += piece
    return b"data: " in received


def chat(client, content, **kw):
    return client.chat.completions.create(model="any", messages=[{"role": "user", "content": content}], **kw)


def stream_chat(client, content, **kw):
    """(text, finish reasons, usage, number of chunks with content) of a streamed chat."""
    text, finishes, usage, content_chunks = "", [], None, 0
    for chunk in chat(client, content, stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None and not chunk.choices:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                text += choice.delta.content
                content_chunks += 1
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    return text, finishes, usage, content_chunks


def main():
    started = time.time()
    server = Server("--max-requests", "80")
    client = server.client()
    question = "What is the capital of France?"

    # /health and /v1/models.
    health = subprocess.run(["curl", "-sf", server.url + "/health"], capture_output=True, text=True, timeout=30)
    check(health.returncode == 0 and json.loads(health.stdout).get("status") == "ok", f"/health: {health}")
    models = client.models.list()
    check(len(models.data) == 1 and models.data[0].id == os.path.basename(MODEL)[:-len(".gguf")],
          f"/v1/models: {models}")

    # A chat completion, not streamed: text, finish reason, usage that adds up.
    reply = chat(client, question, max_tokens=24, temperature=0)
    text = reply.choices[0].message.content
    check(reply.object == "chat.completion" and reply.choices[0].message.role == "assistant", f"{reply}")
    check(len(text.strip()) > 0, f"empty reply: {reply}")
    check(reply.choices[0].finish_reason in ("stop", "length"), f"finish_reason: {reply}")
    usage = reply.usage
    check(usage.prompt_tokens > 5 and 1 <= usage.completion_tokens <= 24 and
          usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, f"usage: {usage}")
    check((reply.choices[0].finish_reason == "length") == (usage.completion_tokens == 24),
          f"finish_reason and completion_tokens disagree: {reply}")

    # The same, streamed: same greedy text, one finish reason, the usage chunk.
    s_text, finishes, s_usage, content_chunks = stream_chat(client, question, max_tokens=24, temperature=0)
    check(s_text == text, f"streamed text {s_text!r} differs from the whole reply {text!r}")
    check(finishes == [reply.choices[0].finish_reason], f"stream finish reasons: {finishes}")
    check(s_usage is not None and s_usage.prompt_tokens == usage.prompt_tokens and
          s_usage.completion_tokens == usage.completion_tokens and
          s_usage.total_tokens == s_usage.prompt_tokens + s_usage.completion_tokens,
          f"stream usage {s_usage} vs {usage}")
    check(1 <= content_chunks <= s_usage.completion_tokens, f"{content_chunks} content chunks")

    # max_tokens (and max_completion_tokens) honoured exactly, chat and completions.
    story = "Write a long story about a dragon who learns to cook."
    for field in ("max_tokens", "max_completion_tokens"):
        r = chat(client, story, temperature=0, **{field: 7})
        check(r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length",
              f"{field}=7 gave {r.usage.completion_tokens} tokens, {r.choices[0].finish_reason}")
    c = client.completions.create(model="any", prompt="Once upon a time", max_tokens=9, temperature=0)
    check(c.object == "text_completion" and c.usage.completion_tokens == 9 and
          c.choices[0].finish_reason == "length" and c.choices[0].text, f"completions: {c}")
    check(c.usage.total_tokens == c.usage.prompt_tokens + 9 and c.usage.prompt_tokens >= 4, f"{c.usage}")

    # Stop strings: the greedy text up to a later piece of it, then "stop".
    long = chat(client, story, max_tokens=40, temperature=0).choices[0].message.content
    words = long.split()
    check(len(words) >= 8, f"too short a story to cut: {long!r}")
    stop = " " + words[5]
    cut = long.index(stop)
    for stops in (stop, [stop, "never-in-the-text-0"]):
        r = chat(client, story, max_tokens=40, temperature=0, stop=stops)
        check(r.choices[0].message.content == long[:cut] and r.choices[0].finish_reason == "stop",
              f"stop {stops!r}: {r.choices[0].message.content!r} ({r.choices[0].finish_reason}), "
              f"wanted {long[:cut]!r}")
    s_text, finishes, _, _ = stream_chat(client, story, max_tokens=40, temperature=0, stop=stop)
    check(s_text == long[:cut] and finishes == ["stop"], f"streamed stop: {s_text!r} {finishes}")

    # Seeds: same seed and temperature > 0, same text; other seeds give other texts.
    sampled = [chat(client, story, max_tokens=24, temperature=1.0, seed=seed).choices[0].message.content
               for seed in (1234, 1234, 7, 99)]
    check(sampled[0] == sampled[1], f"seed 1234 gave {sampled[0]!r} then {sampled[1]!r}")
    check(sampled[2] != sampled[0] or sampled[3] != sampled[0], f"three seeds, one text: {sampled}")
    p = dict(max_tokens=16, temperature=0.8, seed=5, presence_penalty=0.5, frequency_penalty=0.5, top_p=0.9)
    check(chat(client, story, **p).choices[0].message.content == chat(client, story, **p).choices[0].message.content,
          "penalties and top_p with a seed are not reproducible")

    # Log-probabilities: one entry per generated token, the greedy token first among the
    # alternatives, alternatives most likely first, text equal to the tokens' bytes; the same
    # greedy text as without them.
    r = chat(client, story, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    check(len(content) == r.usage.completion_tokens,
          f"{len(content)} log-probs for {r.usage.completion_tokens} tokens")
    for t in content:
        check(t.logprob <= 0 and len(t.top_logprobs) == 3, f"log-prob entry {t}")
        check(t.top_logprobs[0].token == t.token and abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6,
              f"greedy token {t.token!r} is not the most likely {t.top_logprobs[0]}")
        check(all(a.logprob >= b.logprob for a, b in zip(t.top_logprobs, t.top_logprobs[1:])),
              f"alternatives out of order: {t.top_logprobs}")
    check(bytes(b for t in content for b in t.bytes).decode("utf-8", "replace") == r.choices[0].message.content,
          "the log-probs' tokens do not spell the answer")
    check(r.choices[0].message.content == chat(client, story, max_tokens=12, temperature=0).choices[0].message.content,
          "asking for log-probs changed the greedy text")
    s_lp = []
    for chunk in client.chat.completions.create(model="granule", messages=[{"role": "user", "content": story}],
                                                max_tokens=12, temperature=0, stream=True, logprobs=True):
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            s_lp += [t.token for t in chunk.choices[0].logprobs.content]
    check(s_lp == [t.token for t in content], f"streamed log-prob tokens {s_lp} != {[t.token for t in content]}")
    legacy = client.completions.create(model="granule", prompt="Once upon a time", max_tokens=6,
                                       temperature=0, logprobs=2)
    lp = legacy.choices[0].logprobs
    check(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == legacy.usage.completion_tokens > 0 and
          lp.text_offset[0] == 0 and all(len(a) == 2 for a in lp.top_logprobs),
          f"legacy completions log-probs: {lp}")

    # An error through the client: a temperature that is not a number.
    try:
        chat(client, question, temperature="hot")
        check(False, "temperature 'hot' was accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body.get("param") == "temperature" and
              e.body.get("type") == "invalid_request_error", f"bad temperature: {e.status_code} {e.body}")

    # Bad input, each with its 4xx, and the server keeps serving.
    status, body = server.raw("POST", "/v1/chat/completions", '{"messages": [')
    expect_api_error(status, body, 400, "malformed JSON")
    for bad, param in ((b'{"messages": "hi"}', "messages"),
                       (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "5"}', "max_tokens"),
                       (b'{"messages": [{"role": "user", "content": "hi"}], "stop": 5}', "stop"),
                       (b'{"messages": [{"role": "wizard", "content": "hi"}]}', "messages[0].role"),
                       (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}', "max_tokens"),
                       (b'{"messages": [{"role": "user", "content": "hi"}], "top_p": 3}', "top_p"),
                       (b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', "stream"),
                       (b'{"prompt": 12}', None),
                       (b'[1, 2]', None)):
        path = "/v1/completions" if b'"prompt"' in bad else "/v1/chat/completions"
        status, body = server.raw("POST", path, bad)
        error = expect_api_error(status, body, 400, f"wrong type {bad!r}")
        check(param is None or error["param"] == param, f"{bad!r}: param {error['param']!r}, wanted {param!r}")
    status, body = server.raw("POST", "/v1/chat/completions", b"x" * (100 * 1024))
    expect_api_error(status, body, 413, "a 100 KiB body over the 64 KiB limit")
    status, body = server.raw("GET", "/v1/nothing-here")
    expect_api_error(status, body, 404, "an unknown path")
    long_prompt = "the cat sat on the mat " * 200  # ~1200 tokens, past the 512-token context
    status, body = server.raw("POST", "/v1/chat/completions",
                              json.dumps({"messages": [{"role": "user", "content": long_prompt}]}))
    error = expect_api_error(status, body, 400, "a prompt over the context")
    check(error["code"] == "context_length_exceeded" and "context" in error["message"], f"{error}")
    server.works("bad input")

    # 500 rapid connects and disconnects: bare, half a request line, half a body.
    for i in range(500):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        if i % 3 == 1:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        elif i % 3 == 2:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"mess")
        sock.close()
    server.works("500 rapid connects and disconnects")

    # A client that goes away is cancelled and its KV freed, streamed or not.
    for stream in (True, False):
        body = json.dumps({"messages": [{"role": "user", "content": story}], "max_tokens": 450,
                           "temperature": 0, "stream": stream}).encode()
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        if stream:
            check(first_chunk_arrives(sock), "no first stream chunk")
        else:
            time.sleep(0.3)
        steps_at_close = server.metrics()["granule_steps_total"]
        sock.close()
        # Cancelled within a few steps, not after the ~450 its max_tokens allows (counted in
        # engine steps, so a busy machine does not make it flaky).
        t0 = time.time()
        m = server.wait_idle(seconds=30)
        steps = m["granule_steps_total"] - steps_at_close
        check(m["granule_chats_running"] == 0 and m["granule_kv_active_bytes"] == 0 and steps < 100,
              f"a {'streamed' if stream else 'whole'} request whose client left ran {steps:.0f} more steps "
              f"({time.time() - t0:.1f} s): {m}")
    server.works("clients that went away")

    # Prompt caching: a conversation's next turn resends the whole history; the KV of the
    # previous request is kept, so only the new turn is computed, and the answer is the same as
    # a fresh computation (greedy) on a server that keeps nothing.
    system = "You are a terse assistant who answers in one short sentence. " * 6
    turn1 = [{"role": "system", "content": system}, {"role": "user", "content": "Name a colour."}]
    r1 = client.chat.completions.create(model="any", messages=turn1, max_tokens=8, temperature=0)
    turn2 = turn1 + [{"role": "assistant", "content": r1.choices[0].message.content},
                     {"role": "user", "content": "And a fruit?"}]
    before = server.metrics()["granule_prompt_tokens_reused_total"]
    r2 = client.chat.completions.create(model="any", messages=turn2, max_tokens=8, temperature=0)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    reused = server.metrics()["granule_prompt_tokens_reused_total"] - before
    check(r1.usage.prompt_tokens_details.cached_tokens < r1.usage.prompt_tokens, f"first turn: {r1.usage}")
    check(cached >= r1.usage.prompt_tokens - 2 and cached < r2.usage.prompt_tokens and reused == cached,
          f"second turn reused {cached} of {r2.usage.prompt_tokens} prompt tokens (first turn "
          f"{r1.usage.prompt_tokens}; /metrics counted {reused})")
    m = server.wait_idle()
    check(m["granule_kv_kept_sequences"] >= 1 and m["granule_kv_kept_bytes"] > 0, f"nothing kept: {m}")
    fresh = Server("--kv-reuse", "off")
    f2 = fresh.client().chat.completions.create(model="any", messages=turn2, max_tokens=8, temperature=0)
    check(f2.choices[0].message.content == r2.choices[0].message.content and
          f2.usage.prompt_tokens_details.cached_tokens == 0,
          f"with the reused KV: {r2.choices[0].message.content!r}; computed afresh: "
          f"{f2.choices[0].message.content!r} ({f2.usage})")
    m = fresh.wait_idle()
    check(m["granule_kv_committed_bytes"] == 0 and m["granule_kv_kept_bytes"] == 0,
          f"--kv-reuse off keeps KV: {m}")

    # Load: 64 concurrent streams all complete; afterwards nothing runs and the only KV
    # committed is what is kept for prompt reuse.
    def one(i):
        text, finishes, usage, _ = stream_chat(server.client(), f"Tell me fact number {i} about the sea.",
                                               max_tokens=6, temperature=0.7, seed=i)
        return text, finishes, usage
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=64) as pool:
        results = list(pool.map(one, range(64)))
    load_seconds = time.time() - t0
    for text, finishes, usage in results:
        check(len(finishes) == 1 and finishes[0] in ("stop", "length") and usage is not None and
              1 <= usage.completion_tokens <= 6, f"a load-test stream ended badly: {finishes} {usage}")
    m = server.wait_idle(seconds=10)
    check(m["granule_chats_running"] == 0 and m["granule_chats_waiting"] == 0 and
          m["granule_kv_active_bytes"] == 0 and m["granule_server_requests_active"] == 0 and
          m["granule_kv_committed_bytes"] == m["granule_kv_kept_bytes"],
          f"after the load test: {m}")
    check(m["granule_decode_tokens_per_second"] > 0 and m["granule_server_requests_total"] >= 64, f"{m}")
    # 64 prompts through 8 slots evict kept entries; without --kv-host-cache they are dropped,
    # not copied to host memory.
    check(m["granule_kv_kept_dropped_total"] > 0 and m["granule_kv_swapped_bytes"] == 0 and
          m["granule_kv_swap_outs_total"] == 0, f"evictions under load: {m}")
    tokens = sum(u.completion_tokens for _, _, u in results)
    print(f"load: 64 streams, {tokens} tokens in {load_seconds:.1f} s")
    server.stop()
    # The same load on the server that keeps no KV: every byte of KV is given back.
    fresh_client = fresh.client()
    with concurrent.futures.ThreadPoolExecutor(max_workers=64) as pool:
        results = list(pool.map(lambda i: stream_chat(fresh_client, f"Fact {i} about rivers.", max_tokens=4,
                                                      temperature=0.7, seed=i), range(64)))
    for _, finishes, usage, _ in results:
        check(len(finishes) == 1 and usage is not None, f"a load-test stream on --kv-reuse off: {finishes}")
    m = fresh.wait_idle(seconds=10)
    check(m["granule_kv_committed_bytes"] == 0 and m["granule_kv_active_bytes"] == 0 and
          m["granule_chats_running"] == 0 and m["granule_server_requests_active"] == 0,
          f"after 64 streams with --kv-reuse off, KV is still committed: {m}")
    fresh.stop()

    # The API key, and --max-requests: the third concurrent request gets 503.
    keyed = Server("--api-key", "sekrit", "--max-requests", "2")
    status, body = keyed.raw("POST", "/v1/chat/completions", '{"messages":[{"role":"user","content":"hi"}]}')
    expect_api_error(status, body, 401, "no API key")
    try:
        chat(keyed.client(api_key="wrong"), "hi", max_tokens=2)
        check(False, "a wrong API key was accepted")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, f"{e}")
    check(chat(keyed.client(api_key="sekrit"), "hi", max_tokens=2).usage.completion_tokens >= 1, "the key")
    check(keyed.raw("GET", "/health")[0] == 200, "/health needs no key")
    streams = []
    body = json.dumps({"messages": [{"role": "user", "content": story}], "max_tokens": 400,
                       "stream": True}).encode()
    for _ in range(2):
        sock = socket.create_connection(("127.0.0.1", keyed.port), timeout=10)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        check(first_chunk_arrives(sock), "no first stream chunk")
        streams.append(sock)
    status, body = keyed.raw("POST", "/v1/chat/completions", '{"messages":[{"role":"user","content":"hi"}]}',
                             headers={"Authorization": "Bearer sekrit"})
    expect_api_error(status, body, 503, "a third request with --max-requests 2")
    for sock in streams:
        sock.close()
    deadline = time.time() + 15
    while True:
        status, _ = keyed.raw("POST", "/v1/chat/completions",
                              '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}',
                              headers={"Authorization": "Bearer sekrit"})
        if status == 200 or time.time() > deadline:
            break
        time.sleep(0.1)
    check(status == 200, f"the places of cancelled requests were not given back: {status}")
    keyed.stop()
    print(f"{CHECKS} checks passed in {time.time() - started:.1f} s")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAIL: {e}")
        print(f"{CHECKS} checks before the failure")
        sys.exit(1)
