#!/usr/bin/env python3
"""A stand-in for the Hugging Face Hub's HTTP API on 127.0.0.1, for tests (no internet).

Usage: fake_hub.py CONFIG.json LOG.jsonl

CONFIG: {"token": "hf_...",                  # the one token a gated repository accepts (read-only)
         "write_token": "hf_...",            # the token that may create repositories and commit
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
Uploads, as the Hub's commit API (only with "Authorization: Bearer <write_token>": 403 for another
token, 401 for none):
  POST /api/repos/create {"name", "organization", "private"}  -> 200, or 409 when it exists; a private
       repository answers reads only with the read or the write token
  POST /api/models/ORG/NAME/preupload/REV {"files": [{path, size, sample}]} -> uploadMode "lfs" for
       LFS names and files of 10 MiB or more, else "regular"
  POST /ORG/NAME.git/info/lfs/objects/batch  -> per object: no actions when the content is known, else
       "upload" (PUT to the CDN port, /upload/SHA256, which checks the sha256) and "verify" (Hub port)
  POST /api/models/ORG/NAME/commit/REV (NDJSON: header, file (base64), lfsFile, deletedFolder,
       deletedFile) -> {"commitOid", "commitUrl"}; the files are then served by the download API
       (lfsFile entries as LFS files). An lfsFile whose content was not uploaded: 422.
  "fail_commit_once": N   the first N commit requests answer 503 (a retried 5xx)
  "hostile": "preupload" | "lfs_batch"   that answer gives a field of the wrong type (uploadMode, oid: 7)
  "multipart_chunk": N    LFS objects over N bytes get the "multipart" transfer: chunk_size N and one
       URL per part (keys "00001", ...; PUT /part/SHA256/I on the CDN port answers an MD5 ETag), then
       POST /lfs-complete/SHA256 {"oid", "parts": [{partNumber, etag}]} on the Hub port assembles it
REV is "main" or the repository's commit (sha1 of its name, then of each commit). 401 + X-Error-Code: GatedRepo for a
gated repository without "Authorization: Bearer <token>"; 404 with RepoNotFound, RevisionNotFound or
EntryNotFound. Every request is logged to LOG as a JSON line: port ("hub"/"cdn"), method, path, auth,
range, status and body bytes sent.
"""
import base64
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
REPOS = {}  # "models/ORG/NAME" -> {"commit", "gated", "files": {name: bytes}, "lfs": set of names}
LFS_STORE = {}  # sha256 -> bytes: every LFS object the Hub holds (PUT to the CDN port or committed);
               # like the Hub's, it outlives the files that named it
PARTS = {}  # (sha256, part number) -> bytes of a multipart upload
REPO_LOCK = threading.Lock()
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
        REPOS[kind_key] = {"commit": commit, "gated": spec.get("gated", False), "files": files,
                           "lfs": {n for n in files if is_lfs(n)}}
        for name, data in files.items():
            BY_SHA[hashlib.sha256(data).hexdigest()] = (kind_key, name)
            if is_lfs(name):
                LFS_STORE[hashlib.sha256(data).hexdigest()] = data


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
        auth = self.headers.get("Authorization")
        return not repo["gated"] or auth in ("Bearer " + CONFIG.get("token", ""),
                                             "Bearer " + CONFIG.get("write_token", "\0"))

    def may_write(self):
        """True for the write token; else answers 401 (no token) or 403 (another token)."""
        auth = self.headers.get("Authorization")
        if auth is not None and auth == "Bearer " + CONFIG.get("write_token", "\0"):
            return True
        if auth is None:
            self.error(401, "Unauthorized")
        else:
            self.reply(403, {"Content-Type": "application/json"},
                       json.dumps({"error": "You don't have the rights to write to this repository"}).encode())
        return False

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
        if name in repo["lfs"]:
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

    def body(self):
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def reply_json(self, status, obj):
        self.reply(status, {"Content-Type": "application/json"}, json.dumps(obj).encode())

    def do_PUT(self):
        parts = [p for p in urllib.parse.urlparse(self.path).path.split("/") if p]
        data = self.body()
        if self.server.role == "cdn" and len(parts) == 3 and parts[0] == "part":
            with REPO_LOCK:
                PARTS[(parts[1], int(parts[2]))] = data
            return self.reply(200, {"ETag": '"%s"' % hashlib.md5(data).hexdigest()})
        if self.server.role != "cdn" or len(parts) != 2 or parts[0] != "upload":
            return self.reply(404)
        if hashlib.sha256(data).hexdigest() != parts[1]:
            return self.reply(400, {}, b"sha256 mismatch")
        with REPO_LOCK:
            LFS_STORE[parts[1]] = data
        self.reply(200)

    def do_POST(self):
        parts = [p for p in urllib.parse.unquote(urllib.parse.urlparse(self.path).path).split("/") if p]
        data = self.body()
        if self.server.role != "hub":
            return self.reply(404)
        if len(parts) == 2 and parts[0] == "lfs-complete":
            return self.complete_parts(parts[1], json.loads(data))
        if parts == ["api", "repos", "create"]:
            return self.create_repo(json.loads(data))
        if len(parts) == 6 and parts[:2] == ["api", "models"] and parts[4] in ("preupload", "commit"):
            repo = REPOS.get("models/" + parts[2] + "/" + parts[3])
            if not self.may_write():
                return None
            if repo is None:
                return self.error(404, "RepoNotFound")
            if parts[5] not in ("main", repo["commit"]):
                return self.error(404, "RevisionNotFound")
            if parts[4] == "preupload":
                return self.preupload(json.loads(data))
            return self.commit("models/" + parts[2] + "/" + parts[3], data)
        if len(parts) == 6 and parts[1].endswith(".git") and parts[2:5] == ["info", "lfs", "objects"]:
            if not self.may_write():
                return None
            if "models/" + parts[0] + "/" + parts[1][:-4] not in REPOS:
                return self.error(404, "RepoNotFound")
            if parts[5] == "batch":
                return self.lfs_batch(json.loads(data))
            if parts[5] == "verify":
                oid = json.loads(data).get("oid")
                return self.reply_json(200 if oid in LFS_STORE else 404, {})
        return self.error(404, "EntryNotFound")

    def create_repo(self, req):
        if not self.may_write():
            return None
        key = "models/%s/%s" % (req.get("organization"), req.get("name"))
        with REPO_LOCK:
            if key in REPOS:
                return self.reply_json(409, {"error": "You already created this model repo"})
            REPOS[key] = {"commit": hashlib.sha1(key.encode()).hexdigest(), "gated": bool(req.get("private")),
                          "files": {}, "lfs": set()}
        self.reply_json(200, {"url": "http://127.0.0.1:%d/%s" % (PORTS["hub"], key[len("models/"):])})

    def preupload(self, req):
        files = []
        for f in req.get("files", []):
            lfs = is_lfs(f["path"]) or f["size"] >= 10 * 1024 * 1024
            base64.b64decode(f["sample"], validate=True)
            mode = 7 if CONFIG.get("hostile") == "preupload" else ("lfs" if lfs else "regular")
            files.append({"path": f["path"], "uploadMode": mode, "shouldIgnore": False})
        self.reply_json(200, {"files": files})

    def lfs_batch(self, req):
        objects = []
        for o in req.get("objects", []):
            entry = {"oid": 7 if CONFIG.get("hostile") == "lfs_batch" else o["oid"], "size": o["size"]}
            chunk = CONFIG.get("multipart_chunk", 0)
            if o["oid"] not in LFS_STORE and chunk and o["size"] > chunk:
                header = {"chunk_size": str(chunk)}
                for i in range(1, (o["size"] + chunk - 1) // chunk + 1):
                    header["%05d" % i] = "http://127.0.0.1:%d/part/%s/%d" % (PORTS["cdn"], o["oid"], i)
                entry["actions"] = {"upload": {"href": "http://127.0.0.1:%d/lfs-complete/%s" % (
                    PORTS["hub"], o["oid"]), "header": header}}
            elif o["oid"] not in LFS_STORE:
                entry["actions"] = {
                    "upload": {"href": "http://127.0.0.1:%d/upload/%s" % (PORTS["cdn"], o["oid"])},
                    "verify": {"href": "http://127.0.0.1:%d%s" % (PORTS["hub"], self.path.replace("batch", "verify"))}}
            objects.append(entry)
        self.reply(200, {"Content-Type": "application/vnd.git-lfs+json"},
                   json.dumps({"transfer": "basic", "objects": objects}).encode())

    def complete_parts(self, oid, req):
        with REPO_LOCK:
            data = b""
            for n, p in enumerate(req.get("parts", []), start=1):
                chunk = PARTS.get((oid, p["partNumber"]))
                if p["partNumber"] != n or chunk is None or p["etag"] != '"%s"' % hashlib.md5(chunk).hexdigest():
                    return self.reply_json(400, {"error": "bad part %d" % n})
                data += chunk
            if hashlib.sha256(data).hexdigest() != oid or req.get("oid") != oid:
                return self.reply_json(400, {"error": "the parts do not make the object %s" % oid})
            LFS_STORE[oid] = data
        self.reply_json(200, {})

    def commit(self, key, data):
        fail = CONFIG.get("fail_commit_once", 0)
        if STATE.setdefault("commit_failures", 0) < fail:
            STATE["commit_failures"] += 1
            return self.reply_json(503, {"error": "try again"})
        with REPO_LOCK:
            repo = REPOS[key]
            files, lfs = dict(repo["files"]), set(repo["lfs"])
            lines = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
            if not lines or lines[0].get("key") != "header":
                return self.reply_json(400, {"error": "the first line must be the header"})
            for line in lines[1:]:
                k, v = line["key"], line["value"]
                if k == "file":
                    files[v["path"]] = base64.b64decode(v["content"], validate=True)
                    lfs.discard(v["path"])
                elif k == "lfsFile":
                    content = LFS_STORE.get(v["oid"])
                    if content is None or len(content) != v["size"]:
                        return self.reply_json(422, {"error": "LFS object %s was not uploaded" % v["oid"]})
                    files[v["path"]] = content
                    lfs.add(v["path"])
                elif k == "deletedFolder":
                    prefix = v["path"].rstrip("/") + "/"
                    files = {n: c for n, c in files.items() if not n.startswith(prefix)}
                elif k == "deletedFile":
                    files.pop(v["path"], None)
                else:
                    return self.reply_json(400, {"error": "unknown key " + k})
            repo["files"], repo["lfs"] = files, lfs & set(files)
            repo["commit"] = hashlib.sha1((repo["commit"] + "\n").encode() + data).hexdigest()
            for n in repo["lfs"]:
                BY_SHA[hashlib.sha256(files[n]).hexdigest()] = (key, n)
        self.reply_json(200, {"commitOid": repo["commit"],
                              "commitUrl": "http://127.0.0.1:%d/%s/commit/%s" % (
                                  PORTS["hub"], key[len("models/"):], repo["commit"])})

    def serve_cdn(self, parts):
        if len(parts) != 2 or parts[0] != "cdn" or parts[1] not in BY_SHA:
            return self.reply(404)
        key, name = BY_SHA[parts[1]]
        data = LFS_STORE.get(parts[1], REPOS[key]["files"].get(name))
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
