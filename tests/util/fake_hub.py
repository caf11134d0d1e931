#!/usr/bin/env python3
"""A stand-in for the Hugging Face Hub's HTTP API on 127.0.0.1, for tests (no internet).

Usage: fake_hub.py CONFIG.json LOG.jsonl

CONFIG: {"token": "hf_...",                  # the one token a gated repository accepts
         "repos": {"ORG/NAME" | "datasets/ORG/NAME":
                     {"dir": "/path/of/its/files", "gated": false}},
         "drop_once": {"FILE": N},           # the first content GET of FILE closes after N bytes
         "corrupt": ["FILE"],                # FILE's content is served with its first byte changed
         "oversize": {"FILE": N},            # the CDN serves FILE with N more bytes than it has
         "chunked_oversize": {"FILE": N},    # ... chunked, N more bytes than its Content-Length says
         "redirect": {"FILE": "URL"}}        # resolve/FILE answers 302 to URL (no X-Linked-Size)

It listens on two ports: the Hub (API and resolve URLs) and a "CDN" (another origin, as the real Hub
redirects LFS content to one), and prints "PORTS <hub> <cdn>" once both listen. Served like the Hub:
  GET  /api/{models|datasets}/ORG/NAME/revision/REV  -> {"id", "sha", "siblings": [{"rfilename"}]}
  HEAD|GET /[datasets/]ORG/NAME/resolve/REV/FILE     -> LFS files (*.safetensors, *.jsonl): 302 to
       the CDN with X-Repo-Commit, X-Linked-Etag (sha256), X-Linked-Size; other files: 200 with
       ETag (the git blob sha1), X-Repo-Commit and the content
  GET  /cdn/SHA256 (CDN port)                        -> the content; Range: bytes=N- gives 206
  GET  /bounce?to=URL (Hub port)                     -> 302 to URL, whatever its scheme
REV is "main" or the repository's commit (sha1 of its name). 401 + X-Error-Code: GatedRepo for a
gated repository without "Authorization: Bearer <token>"; 404 with RepoNotFound, RevisionNotFound or
EntryNotFound. Every request is logged to LOG as a JSON line: port ("hub"/"cdn"), method, path, auth,
range, status and body bytes sent.
"""
import hashlib
import json
import os
import socket
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONFIG = json.load(open(sys.argv[1]))
LOG_PATH = sys.argv[2]
LOG_LOCK = threading.Lock()
STATE = {"dropped": set()}
REPOS = {}  # "models/ORG/NAME" -> {"commit", "gated", "files": {name: bytes}}
BY_SHA = {}  # sha256 -> (repo key, file name)
PORTS = {}


def is_lfs(name):
    return name.endswith(".safetensors") or name.endswith(".jsonl")


def load_repos():
    for key, spec in CONFIG["repos"].items():
        kind_key = key if key.startswith("datasets/") else "models/" + key
        files = {}
        for root, _, names in os.walk(spec["dir"]):
            for n in names:
                full = os.path.join(root, n)
                files[os.path.relpath(full, spec["dir"])] = open(full, "rb").read()
        commit = hashlib.sha1(kind_key.encode()).hexdigest()
        REPOS[kind_key] = {"commit": commit, "gated": spec.get("gated", False), "files": files}
        for name, data in files.items():
            BY_SHA[hashlib.sha256(data).hexdigest()] = (kind_key, name)


def git_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def record(self, status, sent):
        entry = {"port": self.server.role, "method": self.command, "path": self.path,
                 "auth": self.headers.get("Authorization"), "range": self.headers.get("Range"),
                 "status": status, "bytes": sent}
        with LOG_LOCK, open(LOG_PATH, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def reply(self, status, headers=None, body=b""):
        # Logged before the reply, so the log is complete once the client has its answer.
        self.record(status, len(body) if self.command != "HEAD" else 0)
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, status, code):
        self.reply(status, {"X-Error-Code": code, "Content-Type": "application/json"},
                   json.dumps({"error": code}).encode())

    def authorized(self, repo):
        return not repo["gated"] or self.headers.get("Authorization") == "Bearer " + CONFIG.get("token", "")

    def find_repo(self, parts):
        """(repo key, repo, rest of parts) for [datasets/]ORG/NAME/...; None when unknown."""
        kind = "models"
        if parts and parts[0] == "datasets":
            kind, parts = "datasets", parts[1:]
        if len(parts) < 2:
            return None, None, parts
        key = kind + "/" + parts[0] + "/" + parts[1]
        return key, REPOS.get(key), parts[2:]

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        path = urllib.parse.unquote(urllib.parse.urlparse(self.path).path)
        parts = [p for p in path.split("/") if p]
        if self.server.role == "cdn":
            return self.serve_cdn(parts)
        if parts == ["bounce"]:
            to = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query).get("to", [""])[0]
            return self.reply(302, {"Location": to})
        if len(parts) >= 2 and parts[0] == "api":
            return self.serve_api(parts[1:])
        key, repo, rest = self.find_repo(parts)
        if repo is None:
            return self.error(404, "RepoNotFound")
        if not self.authorized(repo):
            return self.error(401, "GatedRepo")
        if len(rest) < 3 or rest[0] != "resolve":
            return self.error(404, "EntryNotFound")
        if rest[1] not in ("main", repo["commit"]):
            return self.error(404, "RevisionNotFound")
        name = "/".join(rest[2:])
        if name not in repo["files"]:
            return self.error(404, "EntryNotFound")
        data = repo["files"][name]
        if name in CONFIG.get("redirect", {}):
            return self.reply(302, {"Location": CONFIG["redirect"][name], "X-Repo-Commit": repo["commit"],
                                    "ETag": '"%s"' % git_sha1(data)})
        if is_lfs(name):
            sha = hashlib.sha256(data).hexdigest()
            cdn = "http://127.0.0.1:%d/cdn/%s" % (PORTS["cdn"], sha)
            return self.reply(302, {"Location": cdn, "X-Repo-Commit": repo["commit"],
                                    "X-Linked-Etag": '"%s"' % sha, "X-Linked-Size": str(len(data)),
                                    "ETag": '"%s"' % git_sha1(b"pointer " + sha.encode())})
        self.reply(200, {"ETag": '"%s"' % git_sha1(data), "X-Repo-Commit": repo["commit"]}, data)

    def serve_api(self, parts):
        # {models|datasets}/ORG/NAME/revision/REV
        if len(parts) != 5 or parts[0] not in ("models", "datasets") or parts[3] != "revision":
            return self.error(404, "RepoNotFound")
        repo = REPOS.get(parts[0] + "/" + parts[1] + "/" + parts[2])
        if repo is None:
            return self.error(404, "RepoNotFound")
        if not self.authorized(repo):
            return self.error(401, "GatedRepo")
        if parts[4] not in ("main", repo["commit"]):
            return self.error(404, "RevisionNotFound")
        body = {"id": parts[1] + "/" + parts[2], "sha": repo["commit"],
                "siblings": [{"rfilename": n} for n in sorted(repo["files"])]}
        self.reply(200, {"Content-Type": "application/json"}, json.dumps(body).encode())

    def serve_cdn(self, parts):
        if len(parts) != 2 or parts[0] != "cdn" or parts[1] not in BY_SHA:
            return self.reply(404)
        key, name = BY_SHA[parts[1]]
        data = REPOS[key]["files"][name]
        if name in CONFIG.get("corrupt", []):
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[6:-1])
        body = data[start:] + b"x" * CONFIG.get("oversize", {}).get(name, 0)
        extra = CONFIG.get("chunked_oversize", {}).get(name)
        if extra is not None:
            return self.serve_chunked(body, extra)
        drop = CONFIG.get("drop_once", {}).get(name)
        dropping = drop is not None and name not in STATE["dropped"]
        self.record(206 if start else 200, drop if dropping else len(body))
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if dropping:
            STATE["dropped"].add(name)
            self.wfile.write(body[:drop])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self.wfile.write(body)

    def serve_chunked(self, body, extra):
        """`body` and `extra` more bytes, chunked, under a Content-Length of len(body) (which a
        chunked body overrides for the client, so only a client that checks it stops there)."""
        self.record(200, len(body) + extra)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        whole = body + b"y" * extra
        try:
            for i in range(0, len(whole), 65536):
                piece = whole[i:i + 65536]
                self.wfile.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True


class Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that stopped reading: fine
            super().handle_error(request, client_address)


def serve(role):
    server = Server(("127.0.0.1", 0), Handler)
    server.role = role
    server.daemon_threads = True
    PORTS[role] = server.server_address[1]
    return server


def main():
    load_repos()
    hub, cdn = serve("hub"), serve("cdn")
    threading.Thread(target=cdn.serve_forever, daemon=True).start()
    print("PORTS %d %d" % (PORTS["hub"], PORTS["cdn"]), flush=True)
    hub.serve_forever()


if __name__ == "__main__":
    main()
