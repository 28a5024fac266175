"""Idle connections must not starve other clients of granule-cli serve.

Run by idle_connections_test.sh as: python3 idle_connections_test.py GRANULE_CLI MODEL. Opens
300 TCP connections that send nothing (and 50 that send half a request), then times /health
and a short completion on fresh connections beside them: each must answer within a second or
so of what it takes alone (before the fix /health waited 5.9 s behind 200 idle sockets).
Exits 1 on a failure.
"""

import http.client
import json
import socket
import subprocess
import sys
import time

from serve_support import granule_serve

CLI, MODEL = sys.argv[1], sys.argv[2]


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def timed_get(port, path):
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return time.monotonic() - start, response.status, body


def timed_completion(port):
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "Hello", "max_tokens": 4}),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    conn.close()
    return time.monotonic() - start, response.status


def main():
    idle = []
    with granule_serve(CLI, MODEL, "--ctx", "256", "--chats", "2", stderr=subprocess.DEVNULL) as port:
        try:
            alone, status, _ = timed_get(port, "/health")
            check(status == 200, f"/health: {status}")
            completion_alone, status = timed_completion(port)
            check(status == 200, f"completion: {status}")

            for i in range(350):
                s = socket.create_connection(("127.0.0.1", port))
                if i >= 300:
                    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # half a request
                idle.append(s)
            time.sleep(0.2)
            crowded, status, body = timed_get(port, "/health")
            check(status == 200 and b"ok" in body, f"/health beside idle sockets: {status} {body!r}")
            check(crowded < alone + 1.0,
                  f"/health took {crowded:.2f} s beside 350 idle connections ({alone:.3f} s alone)")
            completion_crowded, status = timed_completion(port)
            check(status == 200, f"completion beside idle sockets: {status}")
            check(completion_crowded < completion_alone + 1.0,
                  f"a completion took {completion_crowded:.2f} s beside idle connections "
                  f"({completion_alone:.2f} s alone)")
            print(f"idle_connections_test: /health {alone * 1e3:.1f} ms alone, {crowded * 1e3:.1f} ms "
                  f"beside 350 idle connections; completion {completion_alone * 1e3:.0f} ms / "
                  f"{completion_crowded * 1e3:.0f} ms")
        finally:
            for s in idle:
                s.close()


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"idle_connections_test: FAILED: {e}")
        sys.exit(1)
