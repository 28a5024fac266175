#!/usr/bin/env python3
"""granule-cli chat --endpoint end to end: against a server on loopback with the default model,
`granule-cli serve` (CPU) or llama.cpp's llama-server, directly and through fault_proxy.py,
which injects 401, 429, 5xx, a stream cut mid-answer and a stall. Each case checks the
one-line message, that the part of the answer that arrived is kept, and that /retry then gets
a whole answer; /metrics reads the server's Prometheus series.

usage: remote_chat_test.py GRANULE_CLI MODEL [LLAMA_SERVER]  (with LLAMA_SERVER: against it)"""
import re
import socket
import subprocess
import sys
import time
import urllib.request

CLI, MODEL = sys.argv[1], sys.argv[2]
LLAMA_SERVER = sys.argv[3] if len(sys.argv) > 3 else None
HERE = __file__.rsplit("/", 1)[0]
failures = []


def check(name, ok, detail=""):
    print(f"{'ok' if ok else 'FAIL'}: {name}" + ("" if ok else f"\n  {detail}"), flush=True)
    if not ok:
        failures.append(name)


def start(args, pattern):
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    match = re.search(pattern, line)
    if not match:
        proc.kill()
        raise SystemExit(f"FAIL: {args[0]} did not start: {line!r} {proc.stderr.read()[:400]}")
    return proc, int(match.group(1))


def chat(url, lines, *extra, env=None, timeout=240):
    args = [CLI, "chat", "--endpoint", url, "--temp", "0", "--top-k", "1", "-n", "48", *extra]
    r = subprocess.run(args, input="".join(l + "\n" for l in lines), capture_output=True, text=True,
                       timeout=timeout, env=env)
    return r.returncode, r.stdout, r.stderr


def fault(proxy_url, *kinds):
    for kind in kinds:
        urllib.request.urlopen(urllib.request.Request(f"{proxy_url}/__fault/{kind}", method="POST"), timeout=10).read()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_llama_server(*extra):
    """llama-server on a free loopback port; returns once /health answers 200."""
    port = free_port()
    proc = subprocess.Popen([LLAMA_SERVER, "-m", MODEL, "--host", "127.0.0.1", "--port", str(port),
                             "-c", "2048", "-np", "1", "-t", "2", "--metrics", "--no-webui", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"FAIL: llama-server ended: {proc.stderr.read()[-800:]}")
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                return proc, port
        except Exception:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("FAIL: llama-server did not become healthy in 120 s")


def start_server(*extra_key):
    if LLAMA_SERVER:
        return start_llama_server(*(["--api-key", extra_key[0]] if extra_key else []))
    return start([CLI, "serve", MODEL, "--port", "0", "--device", "cpu", "--ctx", "1024", "--chats", "4",
                  "--timeout", "120", *(["--api-key", extra_key[0]] if extra_key else [])],
                 r"http://127\.0\.0\.1:(\d+)/v1")


NAME = "llama-server" if LLAMA_SERVER else "Granule"
print(f"against {NAME}", flush=True)
server, port = start_server()
direct = f"http://127.0.0.1:{port}"
proxy, proxy_port = start([sys.executable, f"{HERE}/fault_proxy.py", f"127.0.0.1:{port}", "--idle", "120"],
                          r"127\.0\.0\.1:(\d+)")
via = f"http://127.0.0.1:{proxy_port}/v1"
try:
    # Two turns: the second's prompt starts with the first turn unchanged, so the server's
    # kept KV (its prefix cache) serves it.
    rc, out, err = chat(direct, ["Say hello.", "What is 2+2?"])
    cached = [int(c) for c in re.findall(r"\((\d+) cached\)", err)]
    check("chat: two turns answered", rc == 0 and len(re.findall(r"stop: stop|stop: length", err)) == 2, err)
    check("chat: the second turn's prefix is served from the server's cache",
          len(cached) == 2 and cached[1] > 0, err)
    reference = out.split("\n")[0]
    check("chat: an answer streamed to stdout", len(reference) > 10, out)

    rc, out, err = chat(direct, ["Say hello.", "/metrics"])
    check(f"/metrics: the {NAME} series read, unavailable ones said so",
          rc == 0 and f"metrics ({NAME}): running " in err and "generated tokens unavailable" not in err
          and (NAME != "llama-server" or "KV usage unavailable" in err), err)

    # Stop: Ctrl-C (SIGINT) ends the reply being streamed, not the chat; what arrived stays.
    import signal
    proc = subprocess.Popen([CLI, "chat", "--endpoint", direct, "--temp", "0", "-n", "400"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdin.write("Write a long story about a lighthouse keeper.\n")
    proc.stdin.flush()
    first = proc.stdout.read(8)  # some of the answer has streamed
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.stdin.write("/exit\n")
    proc.stdin.flush()
    out, err = proc.communicate(timeout=120)
    check("stop: Ctrl-C ends the reply, the chat goes on and exits cleanly",
          proc.returncode == 0 and len(first) == 8 and "stop: cancelled" in err, f"{proc.returncode} {err}")

    # The same turn through the proxy: the same answer (greedy), so the proxy changes nothing.
    rc, out, err = chat(via, ["Say hello."])
    check("proxy: passes the answer unchanged", rc == 0 and out.split("\n")[0] == reference, f"{out!r} vs {reference!r}")

    for code, words in [(429, "429 Too Many Requests: rate limited (retry after 1 s)"),
                        (500, "500 Internal Server Error"), (503, "503 Service Unavailable")]:
        fault(via.rsplit("/v1", 1)[0], "pass", f"status:{code}")
        rc, out, err = chat(via, ["Say hello."])
        check(f"{code}: one line naming it, and the run fails", rc == 1 and words in err
              and "(/retry sends the turn again)" in err, err)
        fault(via.rsplit("/v1", 1)[0], "pass", f"status:{code}")
        rc, out, err = chat(via, ["Say hello.", "/retry"])
        check(f"{code}: /retry answers the same turn", rc == 0 and reference in out, f"{rc} {out!r} {err}")

    # A stream cut mid-answer: the part that arrived is printed and kept, marked as cut.
    fault(via.rsplit("/v1", 1)[0], "pass", "drop:700")
    rc, out, err = chat(via, ["Say hello."])
    check("cut: one line saying the answer is cut", rc == 1 and "the answer above is cut" in err, err)
    check("cut: the part that arrived is kept", 0 < len(out.strip()) < len(reference) and reference.startswith(out.strip()),
          f"{out!r} vs {reference!r}")
    fault(via.rsplit("/v1", 1)[0], "pass", "drop:700")
    rc, out, err = chat(via, ["Say hello.", "/retry"])
    check("cut: /retry replaces the cut answer with a whole one", rc == 0 and reference in out, f"{rc} {out!r} {err}")

    # A stall: headers and a little of the body, then nothing; --stall-timeout ends it.
    fault(via.rsplit("/v1", 1)[0], "pass", "stall:20")
    t0 = time.monotonic()
    rc, out, err = chat(via, ["Say hello."], "--stall-timeout", "2")
    took = time.monotonic() - t0
    check("stall: ended by the stall timeout, said in one line", rc == 1 and "stalled" in err and took < 15,
          f"{took:.1f} s: {err}")

    # 401 from the server's own key check (serve --api-key), and the key given by variable.
    keyed, keyed_port = start_server("sesame")
    try:
        import os
        env = dict(os.environ, GRANULE_TEST_KEY="wrong")
        rc, out, err = chat(f"http://127.0.0.1:{keyed_port}", ["Say hello."], "--api-key-env", "GRANULE_TEST_KEY", env=env)
        check("401: the refused key in one line", rc == 1 and "401 Unauthorized: the endpoint refused the API key" in err
              and len(err.strip().splitlines()) == 1, err)
        env["GRANULE_TEST_KEY"] = "sesame"
        rc, out, err = chat(f"http://127.0.0.1:{keyed_port}", ["Say hello."], "--api-key-env", "GRANULE_TEST_KEY", env=env)
        check("401: the right key from --api-key-env chats", rc == 0 and reference in out, err)
        rc, out, err = chat(f"http://127.0.0.1:{keyed_port}", ["Say hello."], "--api-key-env", "GRANULE_NO_SUCH_VAR")
        check("key: an unset variable is named", rc == 1 and "GRANULE_NO_SUCH_VAR is not set" in err, err)
    finally:
        keyed.terminate()
        keyed.wait(30)

    # 401 injected mid-conversation (a revoked key): the turn fails, the chat goes on.
    fault(via.rsplit("/v1", 1)[0], "pass", "status:401")
    rc, out, err = chat(via, ["Say hello."])
    check("401 on a turn: named, not offered for retry", rc == 1 and "401 Unauthorized" in err and "/retry" not in err, err)

    # Unreachable: nothing listens there.
    rc, out, err = chat(f"http://127.0.0.1:{free_port()}", ["Say hello."])
    check("unreachable: one line naming the address", rc == 1 and "cannot reach http://127.0.0.1:" in err
          and len(err.strip().splitlines()) == 1, err)

    # Usage errors.
    rc, out, err = chat(direct, ["Say hello."], "--model", "no-such-model")
    check("an unknown --model lists the server's models", rc == 1 and re.search(r"no model no-such-model; it serves: \S*SmolLM2", err) is not None, err)
    r = subprocess.run([CLI, "chat", MODEL, "--endpoint", direct], capture_output=True, text=True)
    check("a model file with --endpoint is refused", r.returncode != 0 and "--model" in r.stderr, r.stderr)
finally:
    server.terminate()
    proxy.terminate()
    server.wait(30)
    proxy.wait(30)

print(f"{len(failures)} failed" if failures else "all passed")
sys.exit(1 if failures else 0)
