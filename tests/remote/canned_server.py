#!/usr/bin/env python3
"""A loopback stand-in for an OpenAI-compatible server whose answer is a canned SSE file: the
remote-engine tests use it for what the tiny default model behind `granule-cli serve` cannot
show (a reasoning model's reasoning_content, parallel tool calls streamed in fragments, as vLLM
and llama-server send them). Bounded: 127.0.0.1 only, ends after --idle seconds without a
request and never runs past --lifetime seconds.

  GET  /v1/models             one model, --model, owned by --owned-by
  POST /v1/chat/completions   the bytes of --sse, as text/event-stream, in small pieces
  GET  /__last_request        the body of the last chat completion request (for the tests)
  GET  /metrics               404 (no metrics)
It prints "canned server on http://127.0.0.1:PORT" once listening.
"""
import argparse
import http.server
import json
import sys
import threading
import time

state = {"last": b"{}", "at": time.monotonic()}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    sse = b""
    model = "m"
    owned_by = "vllm"

    def log_message(self, fmt, *args):
        pass

    def reply(self, code, payload, content_type):
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):
        state["at"] = time.monotonic()
        if self.path == "/v1/models":
            body = {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": self.owned_by}]}
            self.reply(200, json.dumps(body).encode(), "application/json")
        elif self.path == "/__last_request":
            self.reply(200, state["last"], "application/json")
        else:
            self.reply(404, b'{"error": {"message": "not found"}}', "application/json")

    def do_POST(self):
        state["at"] = time.monotonic()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path != "/v1/chat/completions":
            self.reply(404, b'{"error": {"message": "not found"}}', "application/json")
            return
        state["last"] = body
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        # Small pieces, so events arrive split across reads as over a real network.
        for i in range(0, len(self.sse), 97):
            self.wfile.write(self.sse[i:i + 97])
            self.wfile.flush()
            time.sleep(0.002)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sse", required=True, help="the SSE file every completion answers with")
    parser.add_argument("--model", default="m")
    parser.add_argument("--owned-by", default="vllm")
    parser.add_argument("--idle", type=float, default=60)
    parser.add_argument("--lifetime", type=float, default=300)
    args = parser.parse_args()
    with open(args.sse, "rb") as f:
        Handler.sse = f.read()
    Handler.model = args.model
    Handler.owned_by = args.owned_by
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"canned server on http://127.0.0.1:{server.server_address[1]}", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    start = time.monotonic()
    while time.monotonic() - state["at"] < args.idle and time.monotonic() - start < args.lifetime:
        time.sleep(0.5)
    server.shutdown()


if __name__ == "__main__":
    sys.exit(main())
