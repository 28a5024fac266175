#!/usr/bin/env python3
"""Load a running `granule-cli serve` with N concurrent streaming completions (standard
library only, so it runs where no package registry is reachable) and print the aggregate
throughput the clients saw, measured like `granule-bench chats` measures the engine:

  decode tokens/s   tokens generated while every request was decoding, over that window's
                    length: the window runs from the last request's first token to the first
                    request's last token, as the server's `timings` place them (sent time +
                    prompt_ms, + predicted_ms), and the tokens are the server's
                    granule_server_completion_tokens_total counter, sampled from /metrics every
                    20 ms in a side thread and interpolated at the window's ends. (Chunks are
                    not counted: a token whose text is empty, e.g. a control token a synthetic
                    model emits, sends none.)
  end-to-end tok/s  all completion tokens over the wall time from the first request sent to
                    the last response ended (includes prefill and HTTP)

Each request is a /v1/completions call with a prompt of random token ids (--prompt-tokens),
greedy, `ignore_eos` (llama-server's extension, as the bench ignores EOS) and
`max_tokens` = --max-tokens, so every request produces exactly that many tokens.

Before the measured runs, one short untimed round per concurrency (16-token prompts, 8 tokens
each; --no-warmup skips it), as `granule-bench chats` warms its engine up before measuring: a
fresh server's first requests otherwise pay cuBLAS start-up and the first capture of each
batch size's decode graph inside the measured window.

usage: loadgen.py --port 8080 --vocab 128256 --concurrency 8,32 [--prompt-tokens 128]
                  [--max-tokens 128] [--no-warmup] [--json]
"""
import argparse
import http.client
import json
import random
import sys
import threading
import time


def one_request(host, port, body, out, index, barrier):
    barrier.wait()
    sent = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=600)
    conn.request("POST", "/v1/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    first = last = None
    chunks = []
    usage = None
    timings = None
    finish = None
    error = None
    if resp.status != 200:
        error = f"HTTP {resp.status}: {resp.read()[:200]!r}"
    else:
        buf = b""
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            now = time.perf_counter()
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk.get("timings"):
                timings = chunk["timings"]
            for choice in chunk.get("choices", []):
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
                if choice.get("text"):
                    if first is None:
                        first = now
                    last = now
                    chunks.append(now)
            if "error" in chunk:
                error = chunk["error"].get("message")
    conn.close()
    out[index] = {"sent": sent, "first": first, "last": last, "end": time.perf_counter(),
                  "chunks": chunks,
                  "usage": usage, "timings": timings, "finish": finish, "error": error}


def completion_tokens_total(host, port):
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    for line in text.splitlines():
        if line.startswith("granule_server_completion_tokens_total "):
            return float(line.split()[1])
    return None


def sample_counter(host, port, samples, stop):
    """(time, tokens generated so far) every 20 ms until `stop` is set."""
    while not stop.is_set():
        value = completion_tokens_total(host, port)
        if value is not None:
            samples.append((time.perf_counter(), value))
        time.sleep(0.02)


def counter_at(samples, t):
    """The counter at time t, interpolated between the samples around it."""
    for (t0, v0), (t1, v1) in zip(samples, samples[1:]):
        if t0 <= t <= t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
    return None


def run(host, port, n, prompt_tokens, max_tokens, vocab, seed):
    rng = random.Random(seed + n)
    samples, stop = [], threading.Event()
    sampler = threading.Thread(target=sample_counter, args=(host, port, samples, stop))
    sampler.start()
    results = [None] * n
    barrier = threading.Barrier(n)
    threads = []
    for i in range(n):
        body = {"prompt": [rng.randrange(1, vocab) for _ in range(prompt_tokens)],
                "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True}
        t = threading.Thread(target=one_request, args=(host, port, body, results, i, barrier))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    stop.set()
    sampler.join()
    errors = [r["error"] for r in results if r["error"]]
    completion = sum(r["usage"]["completion_tokens"] for r in results if r["usage"])
    decode_rate = 0.0
    ok = [r for r in results if r["timings"] and r["timings"]["predicted_n"] > 1]
    if len(ok) == n:
        first = [r["sent"] + r["timings"]["prompt_ms"] / 1e3 for r in ok]
        last = [f + r["timings"]["predicted_ms"] / 1e3 for f, r in zip(first, ok)]
        begin, end = max(first), min(last)
        a, b = counter_at(samples, begin), counter_at(samples, end)
        if end > begin and a is not None and b is not None:
            decode_rate = (b - a) / (end - begin)
    wall = max(r["end"] for r in results) - min(r["sent"] for r in results)
    # Time to first token by the server's clock (queue + prefill): a first chunk may come later
    # than the first token when the token has no text.
    ttft = sorted(r["timings"]["prompt_ms"] / 1e3 for r in results if r["timings"])
    t0 = min(r["sent"] for r in results)
    timeline = [{"sent_ms": (r["sent"] - t0) * 1e3,
                 "first_ms": (r["first"] - t0) * 1e3 if r["first"] else None,
                 "last_ms": (r["last"] - t0) * 1e3 if r["last"] else None,
                 "chunks": len(r["chunks"]), "timings": r["timings"]} for r in results]
    return {"concurrency": n, "requests_ok": n - len(errors), "errors": errors[:3],
            "timeline": sorted(timeline, key=lambda t: (t["timings"] or {}).get("prompt_ms", 0)),
            "completion_tokens": completion, "wall_s": wall,
            "end_to_end_tokens_per_s": completion / wall if wall > 0 else 0.0,
            "decode_tokens_per_s": decode_rate,
            "ttft_median_s": ttft[len(ttft) // 2] if ttft else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True, help="token ids are drawn below this")
    ap.add_argument("--concurrency", default="8,32")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-warmup", action="store_true", help="measure a cold server")
    ap.add_argument("--timeline", action="store_true",
                    help="print every request's first and last chunk and the server's timings")
    args = ap.parse_args()
    levels = [int(n) for n in args.concurrency.split(",")]
    if not args.no_warmup:
        for n in levels:
            run(args.host, args.port, n, 16, 8, args.vocab, args.seed + 1000)
    rows = [run(args.host, args.port, n, args.prompt_tokens, args.max_tokens, args.vocab,
                args.seed) for n in levels]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'requests':>8} {'ok':>4} {'decode tok/s':>13} {'end-to-end tok/s':>17} "
              f"{'TTFT median':>12}")
        for r in rows:
            ttft = f"{r['ttft_median_s'] * 1000:.0f} ms" if r["ttft_median_s"] is not None else "-"
            print(f"{r['concurrency']:>8} {r['requests_ok']:>4} {r['decode_tokens_per_s']:>13.1f} "
                  f"{r['end_to_end_tokens_per_s']:>17.1f} {ttft:>12}")
            for e in r["errors"]:
                print("  error:", e)
            if args.timeline:
                print("   sent ms  first ms   last ms  chunks  server: prompt ms  decode t/s")
                for t in r["timeline"]:
                    tm = t["timings"] or {}
                    print(f"  {t['sent_ms']:8.1f}  {t['first_ms'] or -1:8.1f}  {t['last_ms'] or -1:8.1f}  "
                          f"{t['chunks']:6d}  {tm.get('prompt_ms', -1):17.1f}  "
                          f"{tm.get('predicted_per_second', -1):10.1f}")
    return 0 if all(r["requests_ok"] == r["concurrency"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
