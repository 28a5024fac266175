#!/usr/bin/env python3
"""A loopback HTTP proxy for the remote-engine tests: forwards each request to the upstream
server, or injects the fault queued for it. Bounded: it serves on 127.0.0.1 only, ends on its
own after --idle seconds without a request, and never runs past --lifetime seconds.

Faults are queued with a control request, POST /__fault/<kind>, one per following request
(GET /metrics, which a window polls, always passes):
  pass            forward unchanged
  status:<code>   answer <code> with an OpenAI error body (429 adds Retry-After: 1)
  drop:<bytes>    forward the response, then close the connection after <bytes> of its body
  stall:<seconds>[:<bytes>]
                  forward the headers and <bytes> (default 200) of the body, then send nothing
                  for <seconds> and close (the client's stall timeout should end it first)
It prints "fault proxy on http://127.0.0.1:PORT" once listening.
"""
import argparse
import http.client
import http.server
import json
import sys
import threading
import time
import urllib.parse

faults = []
faults_lock = threading.Lock()
last_request = [time.monotonic()]


def next_fault():
    with faults_lock:
        return faults.pop(0) if faults else "pass"


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream = None

    def log_message(self, fmt, *args):
        pass

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def handle_any(self, method):
        last_request[0] = time.monotonic()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        if self.path.startswith("/__fault/"):
            with faults_lock:
                faults.append(urllib.parse.unquote(self.path[len("/__fault/"):]))
            self.reply(200, b"queued\n", "text/plain")
            return
        # A window polls /metrics once a second beside its chat: scrapes pass, so a queued
        # fault meets the request it was queued for.
        fault = "pass" if self.path.split("?")[0] == "/metrics" else next_fault()
        if fault.startswith("status:"):
            code = int(fault.split(":")[1])
            extra = {"Retry-After": "1"} if code == 429 else {}
            message = {401: "invalid API key", 429: "too many requests, slow down",
                       500: "internal error", 502: "bad gateway", 503: "engine overloaded"}.get(code, "error")
            payload = json.dumps({"error": {"message": message, "type": "fault_proxy", "code": code}}).encode()
            self.reply(code, payload, "application/json", extra)
            return
        up = http.client.HTTPConnection(self.upstream[0], self.upstream[1], timeout=300)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        up.request(method, self.path, body=body, headers=headers)
        res = up.getresponse()
        self.send_response(res.status)
        for k, v in res.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        sent = 0
        limit = None
        stall = None
        if fault.startswith("drop:"):
            limit = int(fault.split(":")[1])
        elif fault.startswith("stall:"):
            parts = fault.split(":")
            stall = float(parts[1])
            limit = int(parts[2]) if len(parts) > 2 else 200
        try:
            while True:
                chunk = res.read1(4096) if hasattr(res, "read1") else res.read(4096)
                if not chunk:
                    break
                if limit is not None and sent + len(chunk) > limit:
                    chunk = chunk[: limit - sent]
                self.wfile.write(chunk)
                self.wfile.flush()
                sent += len(chunk)
                if limit is not None and sent >= limit:
                    if stall is not None:
                        time.sleep(stall)
                    break  # drop: close mid-stream, without the rest or [DONE]
        except (BrokenPipeError, ConnectionResetError):
            pass
        up.close()

    def reply(self, code, payload, content_type, extra=None):
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(payload)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("upstream", help="host:port of the server behind the proxy")
    parser.add_argument("--idle", type=float, default=60)
    parser.add_argument("--lifetime", type=float, default=600)
    args = parser.parse_args()
    host, port = args.upstream.rsplit(":", 1)
    Proxy.upstream = (host, int(port))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    server.daemon_threads = True
    print(f"fault proxy on http://127.0.0.1:{server.server_address[1]}", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    start = time.monotonic()
    while time.monotonic() - last_request[0] < args.idle and time.monotonic() - start < args.lifetime:
        time.sleep(0.5)
    server.shutdown()


if __name__ == "__main__":
    sys.exit(main())
