#!/usr/bin/env python3
"""A stand-in for a GPU cloud's API on 127.0.0.1, for tests (no internet): Lambda Cloud API v1 or
RunPod REST API v2, as client/cloud/lambda_cloud.h and runpod.h describe them.

Usage: fake_cloud.py --dialect lambda|runpod --api-key KEY --config CONFIG.json [--log LOG.jsonl]
                     [--instance-command CMD] [--ssh-port N] [--state-dir DIR]
                     [--no-launch-limit] [--launch-interval SECONDS]

Prints "PORT <n>" once it listens. The API root is http://127.0.0.1:<n>/api/v1 (lambda) or
http://127.0.0.1:<n> (runpod: paths /v2/...). Every API request needs "Authorization: Bearer KEY"
(lambda also takes Basic base64("KEY:")); otherwise 401 in the dialect's error shape:
  lambda  {"error": {"code": "global/invalid-api-key", "message", "suggestion"}}
  runpod  application/problem+json {"title": "Unauthorized", "status": 401, "detail"}

CONFIG (JSON):
  {"offers": [{"id": "gpu_1x_h100_sxm5" | "NVIDIA H100 80GB HBM3",  # instance type / GPU type id
               "gpu": "H100 (80 GB SXM5)",         # gpu_description / the GPU type's name
               "gpu_count": 1,                      # lambda specs.gpus
               "max_count": 8,                      # runpod maxCount.secure (default 8)
               "gpu_memory_gib": 80,                # runpod memory
               "price_per_hour": 2.49,              # lambda: the instance; runpod: one GPU (USD)
               "vcpus": 26, "memory_gib": 225, "storage_gib": 2750,   # lambda specs
               "regions": {"us-east-1": true, "us-west-2": false}}],  # region / data center -> capacity
   "capacity_fail": ["<id>", ...],  # launching that id answers the insufficient-capacity error
   "rate_limit_once": true,         # the first authorized API request answers 429, Retry-After: 1
   "boot_polls": 2,                 # a new instance is booting / PROVISIONING for its first N GETs
   "malformed": ["catalog", "instance"],  # those answers come in a shape no client can read
   "deep": ["catalog", "instance", "list", "terminate"],  # those answers (status 200) hold an array
                                    # nested 150,000 deep (300 KB) where the client reads a field;
                                    # a terminate is carried out before its deep answer
   "ssh_keys": [{"name", "public_key"}]}  # lambda: keys registered at the start

Served (lambda, under /api/v1): GET /instance-types, GET|POST /ssh-keys, POST
/instance-operations/launch (one launch per --launch-interval seconds, default 12, else 429 with
Retry-After; --no-launch-limit turns that off), GET /instances, GET /instances/{id}, POST
/instance-operations/terminate. (runpod): GET /v2/catalog/gpus (include=AVAILABILITY, count=N: a type
whose max_count is below N has availability NONE), POST /v2/pods (unknown body fields: 422; a
capacity failure: 400 with a detail, as RunPod does), GET /v2/pods, GET /v2/pods/{id}, DELETE
/v2/pods/{id} and POST /v2/pods/{id}/action {"action": "terminate"} (204).

Instance life (only a GET of the one instance counts as a poll; listings show the state without
moving it): booting (lambda) / PROVISIONING (runpod) for the first boot_polls GETs, then active /
RUNNING (lambda reports ip 127.0.0.1 from then on; runpod reports ssh.direct and runtime.ports
{private 22, public <port>, ip 127.0.0.1}). After a terminate: lambda answers "terminating" for one
GET, "terminated" for the next, then 404 global/object-does-not-exist; runpod answers TERMINATED for
one GET, then 404; a terminated pod is never listed, a lambda instance is listed until it is gone.

Instances backed by a process (--instance-command CMD): at launch CMD runs through /bin/sh in a new
process group (session), with the fake's environment plus
  FAKE_INSTANCE_ID       the instance's id
  FAKE_AUTHORIZED_KEYS   a file (under --state-dir) holding the launch's SSH public key: lambda the
                         registered key named in ssh_key_names, runpod the pod's env PUBLIC_KEY
  FAKE_API_URL           the fake's API root (what a pod's runpodctl would call)
  FAKE_PAUSE_FILE        where /_fake/pause writes how long to stay off the network
  FAKE_SSH_PORT          lambda: --ssh-port (default 22; its API has no port); runpod: a free port
                         the fake picked and reports as the pod's mapping of 22/tcp
Its stdout/stderr go to <state-dir>/<id>.log. A terminate sends SIGTERM to the process group, then
SIGKILL 5 s later if anything of its group is still there. When the fake gets SIGTERM or SIGINT it does the same to every
instance's group and exits. Without --instance-command instances are bookkeeping only.

For tests (no auth): GET /_fake/state -> {"dialect", "launches", "ssh_keys": [{name, public_key}],
"instances": [{id, name, instance_type, region, status (what a GET would say now), phase, orphan,
pid, exit_code, ssh_port, authorized_keys}]}; POST /_fake/orphan {"name", "instance_type"?,
"region"?} -> {"id"}: an instance that is already running, with no process; POST /_fake/preempt
{"id"}: the provider takes the instance away (as a terminate, but nobody asked through the API);
POST /_fake/pause {"id", "seconds"}: the instance drops off the network for that long (SIGUSR1 to its
process group with the seconds in $FAKE_PAUSE_FILE; the instance command does the rest) and runs on.
Every request is appended to --log as a JSON line: method, path, status, auth (whether an
Authorization header came; never its value).
"""
import argparse
import base64
import json
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ARGS = None
CONFIG = {}
LOCK = threading.RLock()
STATE = {"instances": {}, "order": [], "ssh_keys": [], "last_launch": None, "launches": 0,
         "rate_limited": False}
STATE_DIR = None
API_URL = ""  # the API root, once listening (FAKE_API_URL of instance commands)
OWN_STATE_DIR = False
DEEP_NESTING = 150000  # config "deep": how deep those answers nest


def offers():
    return CONFIG.get("offers", [])


def find_offer(offer_id):
    for o in offers():
        if o.get("id") == offer_id:
            return o
    return None


# ---- instances ---------------------------------------------------------------------------------

def new_instance(name, offer_id, region, public_key, orphan=False):
    if ARGS.dialect == "lambda":
        iid = uuid.uuid4().hex
    else:
        iid = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(14))
    inst = {"id": iid, "name": name, "instance_type": offer_id, "region": region,
            "phase": "active" if orphan else "booting",
            "boot_left": 0 if orphan else int(CONFIG.get("boot_polls", 0)),
            "orphan": orphan, "proc": None, "ssh_port": None, "keys_file": None,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu_count": 1}
    if ARGS.dialect == "runpod":
        inst["ssh_port"] = free_port()
    elif ARGS.ssh_port:
        inst["ssh_port"] = ARGS.ssh_port
    STATE["instances"][iid] = inst
    STATE["order"].append(iid)
    if ARGS.instance_command and not orphan:
        start_process(inst, public_key)
    return inst


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_process(inst, public_key):
    keys = os.path.join(STATE_DIR, inst["id"] + ".authorized_keys")
    with open(keys, "w") as f:
        f.write(public_key.strip() + "\n")
    os.chmod(keys, 0o600)
    inst["keys_file"] = keys
    env = dict(os.environ)
    env["FAKE_INSTANCE_ID"] = inst["id"]
    env["FAKE_AUTHORIZED_KEYS"] = keys
    env["FAKE_SSH_PORT"] = str(inst["ssh_port"] or 22)
    env["FAKE_API_URL"] = API_URL
    env["FAKE_PAUSE_FILE"] = os.path.join(STATE_DIR, inst["id"] + ".pause")
    log = open(os.path.join(STATE_DIR, inst["id"] + ".log"), "wb")
    inst["proc"] = subprocess.Popen(["/bin/sh", "-c", ARGS.instance_command], env=env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()


def end_group(proc, deadline):
    """Waits until the process group of `proc` (its leader) is empty or `deadline` passes, then SIGKILLs
    what is left and reaps the leader. The whole group gets the grace, not only its leader: the
    instance's own shutdown (its trap) may run in a child after the leader died of the SIGTERM."""
    while time.monotonic() < deadline:
        proc.poll()  # reaps the leader once it ended (a zombie would keep the group)
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.05)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def stop_process(inst, grace=5.0):
    proc = inst.get("proc")
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return

    def kill_later():
        end_group(proc, time.monotonic() + grace)

    threading.Thread(target=kill_later, daemon=True).start()


def terminate(inst):
    if inst["phase"] in ("terminating", "terminated", "gone"):
        return
    inst["phase"] = "terminating"
    stop_process(inst)


def status_word(inst, phase=None):
    phase = phase or inst["phase"]
    if ARGS.dialect == "lambda":
        return {"booting": "booting", "active": "active", "terminating": "terminating",
                "terminated": "terminated"}.get(phase, phase)
    return {"booting": "PROVISIONING", "active": "RUNNING", "terminating": "TERMINATED",
            "terminated": "TERMINATED"}.get(phase, phase)


def poll(inst):
    """One GET of the instance: the phase it shows, moving its life on. None: it is gone."""
    phase = inst["phase"]
    if phase == "booting":
        if inst["boot_left"] > 0:
            inst["boot_left"] -= 1
            return "booting"
        inst["phase"] = "active"
        return "active"
    if phase == "terminating":
        inst["phase"] = "terminated" if ARGS.dialect == "lambda" else "gone"
        return "terminating"
    if phase == "terminated":
        inst["phase"] = "gone"
        return "terminated"
    if phase == "gone":
        return None
    return phase


def lambda_type_json(o):
    return {"name": o["id"], "description": "%dx %s" % (o.get("gpu_count", 1), o.get("gpu", o["id"])),
            "gpu_description": o.get("gpu", o["id"]),
            "price_cents_per_hour": int(round(o.get("price_per_hour", 1.0) * 100)),
            "specs": {"vcpus": o.get("vcpus", 8), "memory_gib": o.get("memory_gib", 64),
                      "storage_gib": o.get("storage_gib", 512), "gpus": o.get("gpu_count", 1)}}


def lambda_instance_json(inst, phase):
    o = find_offer(inst["instance_type"]) or {"id": inst["instance_type"]}
    j = {"id": inst["id"], "name": inst["name"], "status": status_word(inst, phase),
         "ssh_key_names": inst.get("ssh_key_names", []), "file_system_names": [],
         "region": {"name": inst["region"], "description": inst["region"]},
         "instance_type": lambda_type_json(o), "actions": {}}
    if phase in ("active", "terminating"):
        j["ip"] = "127.0.0.1"
        j["private_ip"] = "10.0.0.2"
        j["hostname"] = "127-0-0-1"
    return j


def runpod_pod_json(inst, phase):
    o = find_offer(inst["instance_type"]) or {"id": inst["instance_type"]}
    running = phase == "active"
    port = inst["ssh_port"]
    j = {"id": inst["id"], "name": inst["name"], "image": inst.get("image", ""), "args": "", "disk": 50,
         "ports": ["22/tcp"], "env": inst.get("env", {}), "registry": None, "status": status_word(inst, phase),
         "actions": ["stop", "restart", "terminate"] if running else ["terminate"], "mounts": {},
         "gpu": {"id": inst["instance_type"], "count": inst["gpu_count"]}, "cloud": "SECURE",
         "dataCenterId": inst["region"] or "US-TX-3", "cudaVersion": "12.8",
         "ssh": {"proxy": None, "direct": None}, "template": None,
         "cost": round(o.get("price_per_hour", 1.0) * inst["gpu_count"], 4) if running else 0.0,
         "locked": False, "globalNetworking": {"enabled": False}, "runtime": None,
         "createdAt": inst["created"], "startedAt": inst["created"] if running else None}
    if running:
        j["ssh"]["direct"] = {"host": "127.0.0.1", "port": port, "username": "root",
                              "command": "ssh root@127.0.0.1 -p %d" % port}
        j["runtime"] = {"uptime": 1, "ports": [{"private": 22, "public": port, "type": "tcp",
                                                "ip": "127.0.0.1"}]}
    return j


def listed_phase(inst):
    """What a listing (or /_fake/state) shows: the phase as it is, without a poll."""
    return inst["phase"]


# ---- the handler -------------------------------------------------------------------------------

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def record(self, status):
        entry = {"method": self.command, "path": self.path, "status": status,
                 "auth": self.headers.get("Authorization") is not None}
        if ARGS.log:
            with LOCK, open(ARGS.log, "a") as f:
                f.write(json.dumps(entry) + "\n")

    def reply(self, status, body=None, headers=None, content_type="application/json"):
        self.record(status)
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if data:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data:
            self.wfile.write(data)

    def reply_deep(self, field):
        """A 200 answer whose `field` holds an array nested DEEP_NESTING deep (written by hand: json.dumps
        would recurse)."""
        self.record(200)
        data = ('{"%s": ' % field + "[" * DEEP_NESTING + "]" * DEEP_NESTING + "}").encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def deep(self, answer):
        return answer in CONFIG.get("deep", [])

    def error(self, status, code, message, headers=None):
        """The dialect's error shape; `code` is Lambda's error code (RunPod has none)."""
        if ARGS.dialect == "lambda":
            return self.reply(status, {"error": {"code": code, "message": message,
                                                 "suggestion": "This is a fake."}}, headers)
        title = {400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 409: "Conflict",
                 422: "Unprocessable Entity", 429: "Too Many Requests"}.get(status, "Error")
        return self.reply(status, {"title": title, "status": status, "detail": message}, headers,
                          "application/problem+json")

    def read_json(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            return None

    def authorized(self):
        got = self.headers.get("Authorization") or ""
        if got == "Bearer " + ARGS.api_key:
            return True
        if ARGS.dialect == "lambda" and got.startswith("Basic "):
            try:
                return base64.b64decode(got[6:]).decode() == ARGS.api_key + ":"
            except ValueError:
                return False
        return False

    def do_GET(self):
        self.dispatch("GET")

    def do_POST(self):
        self.dispatch("POST")

    def do_DELETE(self):
        self.dispatch("DELETE")

    def dispatch(self, method):
        url = urllib.parse.urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        query = urllib.parse.parse_qs(url.query)
        body = self.read_json() if method == "POST" else {}
        if path.startswith("/_fake/"):
            return self.fake_endpoint(method, path, body)
        if not self.authorized():
            return self.error(401, "global/invalid-api-key", "API key was invalid, expired, or deleted.")
        with LOCK:
            if CONFIG.get("rate_limit_once") and not STATE["rate_limited"]:
                STATE["rate_limited"] = True
                return self.error(429, "global/too-many-requests", "Too many requests.", {"Retry-After": "1"})
        if not isinstance(body, dict):
            return self.error(400, "global/invalid-parameters", "The body is not JSON.")
        with LOCK:
            if ARGS.dialect == "lambda":
                return self.lambda_api(method, path, body)
            return self.runpod_api(method, path, query, body)

    # ---- /_fake ----
    def fake_endpoint(self, method, path, body):
        with LOCK:
            if method == "GET" and path == "/_fake/state":
                out = []
                for iid in STATE["order"]:
                    inst = STATE["instances"][iid]
                    proc = inst["proc"]
                    out.append({"id": iid, "name": inst["name"], "instance_type": inst["instance_type"],
                                "region": inst["region"], "phase": inst["phase"],
                                "status": status_word(inst, listed_phase(inst)), "orphan": inst["orphan"],
                                "pid": proc.pid if proc else None,
                                "exit_code": proc.poll() if proc else None,
                                "ssh_port": inst["ssh_port"], "authorized_keys": inst["keys_file"]})
                return self.reply(200, {"dialect": ARGS.dialect, "launches": STATE["launches"],
                                        "ssh_keys": STATE["ssh_keys"], "instances": out})
            if method == "POST" and path == "/_fake/orphan" and isinstance(body, dict):
                first = offers()[0]["id"] if offers() else "gpu_1x_fake"
                inst = new_instance(body.get("name", "orphan"), body.get("instance_type", first),
                                    body.get("region", "us-east-1"), "", orphan=True)
                return self.reply(200, {"id": inst["id"]})
            if method == "POST" and path == "/_fake/pause" and isinstance(body, dict):
                inst = STATE["instances"].get(body.get("id", ""))
                if inst is None or inst.get("proc") is None:
                    return self.reply(404, {"error": "no such instance with a process"})
                with open(os.path.join(STATE_DIR, inst["id"] + ".pause"), "w") as f:
                    f.write(str(float(body.get("seconds", 10))))
                os.killpg(inst["proc"].pid, signal.SIGUSR1)
                return self.reply(200, {"id": inst["id"]})
            if method == "POST" and path == "/_fake/preempt" and isinstance(body, dict):
                inst = STATE["instances"].get(body.get("id", ""))
                if inst is None:
                    return self.reply(404, {"error": "no such instance"})
                terminate(inst)  # the provider's doing: its process goes, as a terminate's would
                return self.reply(200, {"id": inst["id"]})
        return self.reply(404, {"error": "no such fake endpoint"})

    # ---- Lambda ----
    def lambda_api(self, method, path, body):
        if not path.startswith("/api/v1/"):
            return self.error(404, "global/not-found", "The requested resource was not found.")
        p = path[len("/api/v1"):]
        if method == "GET" and p == "/instance-types":
            if self.deep("catalog"):
                return self.reply_deep("data")
            if "catalog" in CONFIG.get("malformed", []):
                return self.reply(200, {"data": {"broken": {"instance_type": "oops"}}})
            data = {}
            for o in offers():
                data[o["id"]] = {"instance_type": lambda_type_json(o),
                                 "regions_with_capacity_available": [
                                     {"name": r, "description": r} for r, cap in o.get("regions", {}).items() if cap]}
            return self.reply(200, {"data": data})
        if p == "/ssh-keys":
            if method == "GET":
                return self.reply(200, {"data": [{"id": k["id"], "name": k["name"], "public_key": k["public_key"]}
                                                 for k in STATE["ssh_keys"]]})
            if method == "POST":
                name, key = body.get("name"), body.get("public_key")
                if not isinstance(name, str) or not name or not isinstance(key, str) or not key:
                    return self.error(400, "global/invalid-parameters", "name and public_key are required.")
                if any(k["name"] == name for k in STATE["ssh_keys"]):
                    return self.error(400, "global/invalid-parameters", "An SSH key with that name exists.")
                k = {"id": uuid.uuid4().hex, "name": name, "public_key": key}
                STATE["ssh_keys"].append(k)
                return self.reply(200, {"data": k})
        if method == "POST" and p == "/instance-operations/launch":
            return self.lambda_launch(body)
        if method == "GET" and p == "/instances":
            if self.deep("list"):
                return self.reply_deep("data")
            return self.reply(200, {"data": [lambda_instance_json(STATE["instances"][i], listed_phase(STATE["instances"][i]))
                                             for i in STATE["order"] if STATE["instances"][i]["phase"] != "gone"]})
        if method == "GET" and p.startswith("/instances/"):
            inst = STATE["instances"].get(p[len("/instances/"):])
            phase = poll(inst) if inst else None
            if phase is None:
                return self.error(404, "global/object-does-not-exist", "Specified instance does not exist.")
            if self.deep("instance"):
                return self.reply_deep("data")
            if "instance" in CONFIG.get("malformed", []):
                return self.reply(200, {"data": {"id": 7, "status": ["active"]}})
            return self.reply(200, {"data": lambda_instance_json(inst, phase)})
        if method == "POST" and p == "/instance-operations/terminate":
            ids = body.get("instance_ids")
            if not isinstance(ids, list) or not ids:
                return self.error(400, "global/invalid-parameters", "instance_ids is required.")
            found = [STATE["instances"].get(i) for i in ids]
            if any(inst is None or inst["phase"] == "gone" for inst in found):
                return self.error(404, "global/object-does-not-exist", "Specified instance does not exist.")
            for inst in found:
                terminate(inst)
            if self.deep("terminate"):
                return self.reply_deep("data")
            return self.reply(200, {"data": {"terminated_instances": [lambda_instance_json(i, "terminating")
                                                                      for i in found]}})
        return self.error(404, "global/not-found", "The requested resource was not found.")

    def lambda_launch(self, body):
        now = time.monotonic()
        last = STATE["last_launch"]
        if not ARGS.no_launch_limit and last is not None and now - last < ARGS.launch_interval:
            wait = max(1, math.ceil(ARGS.launch_interval - (now - last)))
            return self.error(429, "global/too-many-requests", "Launch rate limit exceeded.",
                              {"Retry-After": str(wait)})
        STATE["last_launch"] = now
        region, type_name = body.get("region_name"), body.get("instance_type_name")
        key_names = body.get("ssh_key_names")
        if not isinstance(region, str) or not isinstance(type_name, str) or not isinstance(key_names, list) \
                or len(key_names) != 1:
            return self.error(400, "global/invalid-parameters",
                              "region_name, instance_type_name and exactly one ssh_key_names are required.")
        keys = [k for k in STATE["ssh_keys"] if k["name"] == key_names[0]]
        o = find_offer(type_name)
        if not keys or o is None:
            return self.error(404, "global/object-does-not-exist", "The SSH key or instance type does not exist.")
        if type_name in CONFIG.get("capacity_fail", []) or not o.get("regions", {}).get(region):
            return self.error(400, "instance-operations/launch/insufficient-capacity",
                              "Not enough capacity to fulfill launch request.")
        inst = new_instance(body.get("name") or "", type_name, region, keys[0]["public_key"])
        inst["ssh_key_names"] = key_names
        STATE["launches"] += 1
        return self.reply(200, {"data": {"instance_ids": [inst["id"]]}})

    # ---- RunPod ----
    def runpod_api(self, method, path, query, body):
        if method == "GET" and path == "/v2/catalog/gpus":
            return self.runpod_catalog(query)
        if method == "POST" and path == "/v2/pods":
            return self.runpod_create(body)
        if method == "GET" and path == "/v2/pods":
            if self.deep("list"):
                return self.reply_deep("pods")
            return self.reply(200, {"pods": [runpod_pod_json(STATE["instances"][i], listed_phase(STATE["instances"][i]))
                                             for i in STATE["order"]
                                             if STATE["instances"][i]["phase"] in ("booting", "active")]})
        parts = path.split("/")
        if len(parts) >= 4 and parts[1] == "v2" and parts[2] == "pods":
            inst = STATE["instances"].get(parts[3])
            if method == "GET" and len(parts) == 4:
                phase = poll(inst) if inst else None
                if phase is None:
                    return self.error(404, "", "pod not found")
                if self.deep("instance"):
                    return self.reply_deep("gpu")
                if "instance" in CONFIG.get("malformed", []):
                    return self.reply(200, {"id": 7, "status": ["RUNNING"]})
                return self.reply(200, runpod_pod_json(inst, phase))
            terminating = (method == "DELETE" and len(parts) == 4) or (
                method == "POST" and len(parts) == 5 and parts[4] == "action")
            if terminating:
                if method == "POST" and body.get("action") != "terminate":
                    return self.error(422, "", "only the terminate action is faked")
                if inst is None or inst["phase"] in ("terminating", "gone"):
                    return self.error(404, "", "pod not found")
                terminate(inst)
                if self.deep("terminate"):
                    return self.reply_deep("detail")
                return self.reply(204)
        return self.error(404, "", "resource not found")

    def runpod_catalog(self, query):
        if self.deep("catalog"):
            return self.reply_deep("gpus")
        if "catalog" in CONFIG.get("malformed", []):
            return self.reply(200, {"gpus": "oops"})
        with_availability = "AVAILABILITY" in ",".join(query.get("include", []))
        count = int((query.get("count") or ["1"])[0])
        gpus = []
        for o in offers():
            g = {"id": o["id"], "name": o.get("gpu", o["id"]), "pool": None, "manufacturer": "NVIDIA",
                 "memory": o.get("gpu_memory_gib", 80), "secure": True, "community": False,
                 "price": {"secure": o.get("price_per_hour", 1.0), "community": 0},
                 "maxCount": {"secure": o.get("max_count", 8), "community": 0}}
            if with_availability:
                fits = count <= o.get("max_count", 8)
                centers = [{"id": r, "name": r, "availability": "HIGH" if cap and fits else "NONE"}
                           for r, cap in o.get("regions", {}).items()]
                g["availability"] = "HIGH" if any(c["availability"] != "NONE" for c in centers) else "NONE"
                if g["availability"] != "NONE":
                    g["dataCenters"] = centers
            gpus.append(g)
        return self.reply(200, {"gpus": gpus})

    def runpod_create(self, body):
        allowed = {"name", "image", "gpu", "cloud", "dataCenterIds", "ports", "env", "disk", "args", "mounts",
                   "registry", "globalNetworking", "startJupyter", "startSsh", "templateId", "cpu"}
        unknown = sorted(set(body) - allowed)
        if unknown:
            return self.error(422, "", "unknown fields: " + ", ".join(unknown))
        gpu = body.get("gpu")
        if not isinstance(body.get("name"), str) or not body["name"] or not isinstance(body.get("image"), str) \
                or not isinstance(gpu, dict) or not isinstance(gpu.get("id"), str):
            return self.error(422, "", "name, image and gpu.id are required")
        o = find_offer(gpu["id"])
        if o is None:
            return self.error(400, "", "unknown GPU type " + gpu["id"])
        count = int(gpu.get("count", 1))
        centers = body.get("dataCenterIds") or [r for r, cap in o.get("regions", {}).items() if cap]
        with_capacity = [r for r in centers if o.get("regions", {}).get(r)]
        if gpu["id"] in CONFIG.get("capacity_fail", []) or not with_capacity or count > o.get("max_count", 8):
            return self.error(400, "", "There are no longer any instances available with the requested "
                                       "specifications. Please refresh and try again.")
        env = body.get("env") or {}
        inst = new_instance(body["name"], gpu["id"], with_capacity[0], env.get("PUBLIC_KEY", ""))
        inst.update({"gpu_count": count, "env": env, "image": body["image"]})
        STATE["launches"] += 1
        return self.reply(201, runpod_pod_json(inst, "booting"))


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def shutdown(signum, frame):
    with LOCK:
        procs = [i for i in STATE["instances"].values() if i.get("proc") is not None]
    for inst in procs:
        if inst["proc"].poll() is None:
            try:
                os.killpg(inst["proc"].pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    for inst in procs:
        end_group(inst["proc"], deadline)
    if OWN_STATE_DIR:
        shutil.rmtree(STATE_DIR, ignore_errors=True)
    os._exit(0)


def main():
    global ARGS, CONFIG, STATE_DIR, OWN_STATE_DIR
    ap = argparse.ArgumentParser(description="A fake Lambda Cloud / RunPod API for tests.")
    ap.add_argument("--dialect", choices=["lambda", "runpod"], required=True)
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--config", help="JSON config (offers, capacity_fail, ...)")
    ap.add_argument("--log", help="append every request here as a JSON line")
    ap.add_argument("--instance-command", help="run per instance through /bin/sh in its own process group")
    ap.add_argument("--ssh-port", type=int, default=0, help="lambda: FAKE_SSH_PORT of instance commands")
    ap.add_argument("--state-dir", help="where authorized_keys files and instance logs go (default: a "
                                        "temporary folder removed at exit)")
    ap.add_argument("--no-launch-limit", action="store_true", help="lambda: no launch rate limit")
    ap.add_argument("--launch-interval", type=float, default=12.0, help="lambda: seconds between launches")
    ARGS = ap.parse_args()
    if ARGS.config:
        with open(ARGS.config) as f:
            CONFIG = json.load(f)
    for k in CONFIG.get("ssh_keys", []):
        STATE["ssh_keys"].append({"id": uuid.uuid4().hex, "name": k["name"], "public_key": k["public_key"]})
    if ARGS.state_dir:
        STATE_DIR = ARGS.state_dir
        os.makedirs(STATE_DIR, exist_ok=True)
    else:
        STATE_DIR = tempfile.mkdtemp(prefix="fake-cloud-")
        OWN_STATE_DIR = True
    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    server = Server(("127.0.0.1", 0), Handler)
    global API_URL
    API_URL = "http://127.0.0.1:%d%s" % (server.server_address[1], "/api/v1" if ARGS.dialect == "lambda" else "")
    print("PORT %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
