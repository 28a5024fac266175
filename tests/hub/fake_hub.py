#!/usr/bin/env python3
"""A fake Hugging Face Hub for Granule's hub tests: loopback only, bounded in time, speaking
the endpoints and fields huggingface_hub reads (huggingface_hub 2.4: hf_api.list_models,
list_repo_tree, file_download.get_hf_file_metadata / http_get):

  GET  /api/models?search=&sort=downloads|lastModified&direction=-1&limit=&filter=gguf
  GET  /api/models/ORG/NAME/tree/REV?recursive=true   [{type, oid, size, path, lfs{oid,size,pointerSize}}]
  HEAD|GET /ORG/NAME/resolve/REV/PATH   LFS files: 302 to /_lfs/..., with X-Repo-Commit,
                                        X-Linked-Etag, X-Linked-Size; others: 200 with ETag
  HEAD|GET /_lfs/ORG/NAME/PATH          the bytes, with Range (206, Content-Range)

It serves the repositories under --root: ROOT/ORG/NAME/* with ROOT/ORG/NAME/.repo.json holding
the repository's search fields ({"downloads":, "likes":, "lastModified":, "architecture":,
"gated": false|"manual", "token": "..."}). Files over 64 MiB are taken as the tests' sparse
8B-shaped models: their LFS oid is the SHA-256 of the path (they are read by range, never
downloaded whole).

Fault modes, set with POST /_control (JSON), for every later request until changed:
  {"drop_after": N, "drop_times": K}   the next K file bodies end (connection closed) after N bytes
  {"stall_after": N, "stall_seconds": S, "stall_times": K}   stop sending for S s after N bytes
  {"wrong_checksum": true}             the tree lists a wrong LFS oid for every file
  {"rate_limit": K, "retry_after": S}  the next K requests get 429 with Retry-After: S
  {"claim_size": N}                    HEAD says every LFS file has N bytes
  {"throttle": B}                      file bodies at about B bytes/s (for screenshots)
  {"reset": true}                      no faults; counters to zero
GET /_stats gives the counters: requests, body_bytes (file bytes sent), range_requests, paths.

Prints "PORT <n>" on stdout once listening; exits after --idle seconds without a request
or --lifetime seconds in all.
"""
import argparse
import hashlib
import json
import os
import re
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SPARSE_BYTES = 64 << 20
STATE = {"faults": {}, "stats": {}, "last_request": time.time()}
LOCK = threading.Lock()
SHA_CACHE = {}


def reset_stats():
    STATE["stats"] = {"requests": 0, "body_bytes": 0, "range_requests": 0, "paths": []}


reset_stats()


def repo_dirs(root):
    for org in sorted(os.listdir(root)):
        org_dir = os.path.join(root, org)
        if not os.path.isdir(org_dir):
            continue
        for name in sorted(os.listdir(org_dir)):
            if os.path.isdir(os.path.join(org_dir, name)):
                yield org + "/" + name, os.path.join(org_dir, name)


def repo_meta(path):
    try:
        with open(os.path.join(path, ".repo.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def commit_of(repo):
    return hashlib.sha1(("commit:" + repo).encode()).hexdigest()


def sha256_of(path, rel):
    key = (path, os.path.getmtime(path))
    if key not in SHA_CACHE:
        if os.path.getsize(path) > SPARSE_BYTES:
            SHA_CACHE[key] = hashlib.sha256(("sparse:" + rel).encode()).hexdigest()
        else:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            SHA_CACHE[key] = h.hexdigest()
    return SHA_CACHE[key]


def git_oid(path):
    h = hashlib.sha1()
    h.update(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as f:
        h.update(f.read(1 << 16))
    return h.hexdigest()


def files_of(repo_path):
    out = []
    for base, _, names in os.walk(repo_path):
        for n in sorted(names):
            if n.startswith("."):
                continue
            full = os.path.join(base, n)
            out.append((os.path.relpath(full, repo_path).replace(os.sep, "/"), full))
    return sorted(out)


def is_lfs(rel):
    return rel.endswith(".gguf")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeHub/1.0"

    def log_message(self, fmt, *args):
        if os.environ.get("FAKE_HUB_VERBOSE"):
            sys.stderr.write("fake_hub: " + fmt % args + "\n")

    # --- helpers -------------------------------------------------------------------------
    def send_json(self, status, obj, headers=None):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, status, message, headers=None):
        h = {"X-Error-Message": message}
        h.update(headers or {})
        self.send_json(status, {"error": message}, h)

    def repo_path(self, repo):
        org, _, name = repo.partition("/")
        if not org or not name or ".." in repo:
            return None
        path = os.path.join(self.server.root, org, name)
        return path if os.path.isdir(path) else None

    def authorised(self, repo_path):
        """None when the request may go on, else it has been answered (401/403)."""
        token = repo_meta(repo_path).get("token")
        if not token:
            return True
        got = self.headers.get("Authorization", "")
        if not got.startswith("Bearer "):
            self.error(401, "Access to this model is restricted. You must have access to it and be authenticated to access it. Please log in.")
            return False
        if got[len("Bearer "):] != token:
            self.error(403, "Access to this gated model is not granted for your token; request access on its page.")
            return False
        return True

    def take_fault(self, name):
        with LOCK:
            f = STATE["faults"]
            left = f.get(name, 0)
            if left > 0:
                f[name] = left - 1
                return True
            return False

    # --- routes --------------------------------------------------------------------------
    def do_POST(self):
        if self.path == "/_control":
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            with LOCK:
                if body.get("reset"):
                    STATE["faults"] = {}
                    reset_stats()
                else:
                    STATE["faults"].update(body)
            self.send_json(200, {"ok": True})
            return
        self.error(404, "not found")

    def do_HEAD(self):
        self.route()

    def do_GET(self):
        self.route()

    def route(self):
        STATE["last_request"] = time.time()
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        query = urllib.parse.parse_qs(url.query)
        if path == "/_stats":
            with LOCK:
                self.send_json(200, STATE["stats"])
            return
        with LOCK:
            STATE["stats"]["requests"] += 1
            STATE["stats"]["paths"].append(self.command + " " + path + (" " + self.headers["Range"] if self.headers.get("Range") else ""))
        if self.take_fault("rate_limit"):
            self.error(429, "You have been rate-limited; you can retry this action later.",
                       {"Retry-After": str(STATE["faults"].get("retry_after", 1))})
            return
        if path == "/api/models":
            return self.search(query)
        m = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$", path)
        if m:
            return self.tree(m.group(1), m.group(2))
        m = re.match(r"^/api/models/([^/]+/[^/]+)$", path)
        if m:
            return self.info(m.group(1))
        m = re.match(r"^/([^/_][^/]*/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if m:
            return self.resolve(m.group(1), m.group(2), m.group(3))
        m = re.match(r"^/_lfs/([^/]+/[^/]+)/(.+)$", path)
        if m:
            return self.lfs(m.group(1), m.group(2))
        self.error(404, "Repository Not Found")

    def search(self, query):
        text = (query.get("search") or [""])[0].lower()
        sort = (query.get("sort") or ["downloads"])[0]
        limit = int((query.get("limit") or ["30"])[0])
        filt = query.get("filter") or []
        out = []
        for repo, path in repo_dirs(self.server.root):
            if text and text not in repo.lower():
                continue
            meta = repo_meta(path)
            has_gguf = any(is_lfs(rel) for rel, _ in files_of(path))
            if "gguf" in filt and not has_gguf:
                continue
            out.append({
                "_id": hashlib.sha1(repo.encode()).hexdigest()[:24], "id": repo, "modelId": repo,
                "downloads": meta.get("downloads", 0), "likes": meta.get("likes", 0),
                "lastModified": meta.get("lastModified", "2026-01-01T00:00:00.000Z"),
                "createdAt": meta.get("lastModified", "2026-01-01T00:00:00.000Z"),
                "private": False, "gated": meta.get("gated", False), "tags": ["gguf"] if has_gguf else [],
                "library_name": "gguf" if has_gguf else None,
                "gguf": {"architecture": meta.get("architecture", "llama"), "total": meta.get("parameters", 0),
                         "context_length": meta.get("context_length", 0)} if has_gguf else None,
            })
        key = "lastModified" if sort in ("lastModified", "last_modified") else "downloads"
        out.sort(key=lambda r: r[key], reverse=True)
        self.send_json(200, out[:limit])

    def info(self, repo):
        path = self.repo_path(repo)
        if path is None:
            return self.error(404, "Repository Not Found")
        meta = repo_meta(path)
        self.send_json(200, {"id": repo, "modelId": repo, "sha": commit_of(repo), "private": False,
                             "gated": meta.get("gated", False), "downloads": meta.get("downloads", 0),
                             "siblings": [{"rfilename": rel} for rel, _ in files_of(path)]})

    def tree(self, repo, revision):
        path = self.repo_path(repo)
        if path is None:
            return self.error(404, "Repository Not Found")
        if not self.authorised(path):
            return
        wrong = STATE["faults"].get("wrong_checksum")
        out = []
        for rel, full in files_of(path):
            entry = {"type": "file", "oid": git_oid(full), "size": os.path.getsize(full), "path": rel}
            if is_lfs(rel):
                sha = sha256_of(full, rel)
                if wrong:
                    sha = hashlib.sha256(b"wrong" + sha.encode()).hexdigest()
                entry["lfs"] = {"oid": sha, "size": os.path.getsize(full), "pointerSize": 134}
            out.append(entry)
        self.send_json(200, out)

    def resolve(self, repo, revision, rel):
        path = self.repo_path(repo)
        if path is None:
            return self.error(404, "Repository Not Found", {"X-Error-Code": "RepoNotFound"})
        if not self.authorised(path):
            return
        full = os.path.join(path, rel)
        if ".." in rel or not os.path.isfile(full):
            return self.error(404, "Entry not found", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit_of(repo)})
        size = os.path.getsize(full)
        if is_lfs(rel):
            sha = sha256_of(full, rel)
            claimed = STATE["faults"].get("claim_size")
            # Another host, as the Hub's CDN is: clients stop there for the metadata and
            # send no token to it. Both names reach this loopback server.
            location = "http://localhost:%d/_lfs/%s/%s" % (self.server.server_port, repo, urllib.parse.quote(rel))
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("X-Repo-Commit", commit_of(repo))
            self.send_header("X-Linked-Etag", '"%s"' % sha)
            self.send_header("X-Linked-Size", str(claimed or size))
            self.send_header("ETag", '"%s"' % git_oid(full))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_file(full, {"X-Repo-Commit": commit_of(repo), "ETag": '"%s"' % git_oid(full)})

    def lfs(self, repo, rel):
        path = self.repo_path(repo)
        full = os.path.join(path or "", rel)
        if path is None or ".." in rel or not os.path.isfile(full):
            return self.error(404, "not found")
        self.send_file(full, {"ETag": '"%s"' % sha256_of(full, rel)})

    def send_file(self, full, headers):
        size = os.path.getsize(full)
        begin, end = 0, size - 1
        status = 200
        rng = self.headers.get("Range")
        if rng:
            m = re.match(r"bytes=(\d+)-(\d*)$", rng.strip())
            if m:
                begin = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
                if begin >= size:
                    self.send_response(416)
                    self.send_header("Content-Range", "bytes */%d" % size)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status = 206
                with LOCK:
                    STATE["stats"]["range_requests"] += 1
        length = end - begin + 1
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(length))
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (begin, end, size))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return
        faults = STATE["faults"]
        drop_at = faults.get("drop_after") if self.take_fault("drop_times") else None
        stall_at = faults.get("stall_after") if self.take_fault("stall_times") else None
        sent = 0
        with open(full, "rb") as f:
            f.seek(begin)
            while sent < length:
                chunk = f.read(min(1 << 16, length - sent))
                if not chunk:
                    break
                if drop_at is not None and sent + len(chunk) >= drop_at:
                    chunk = chunk[: max(0, drop_at - sent)]
                    self.write_counted(chunk)
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if stall_at is not None and sent + len(chunk) >= stall_at:
                    head = chunk[: max(0, stall_at - sent)]
                    self.write_counted(head)
                    time.sleep(faults.get("stall_seconds", 5))
                    self.close_connection = True
                    try:
                        self.connection.shutdown(2)
                    except OSError:
                        pass
                    return
                self.write_counted(chunk)
                sent += len(chunk)
                if faults.get("throttle"):
                    time.sleep(len(chunk) / float(faults["throttle"]))

    def write_counted(self, chunk):
        try:
            self.wfile.write(chunk)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return
        with LOCK:
            STATE["stats"]["body_bytes"] += len(chunk)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--idle", type=float, default=120)
    ap.add_argument("--lifetime", type=float, default=900)
    args = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.root = os.path.abspath(args.root)
    started = time.time()
    print("PORT %d" % server.server_port, flush=True)

    def watchdog():
        while True:
            time.sleep(0.5)
            now = time.time()
            if now - STATE["last_request"] > args.idle or now - started > args.lifetime:
                os._exit(0)
            if os.getppid() == 1:  # the test that started it is gone
                os._exit(0)

    threading.Thread(target=watchdog, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
