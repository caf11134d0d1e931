#!/usr/bin/env python3
"""Compiles translation units of a configured build at syntax level (-fsyntax-only), each with the
build's own command from compile_commands.json: the same compiler, -std, -D, -I and warning flags
(-Werror included), less the ccache launcher and what only matters for an object file (-c, -o,
-MD/-MF/-MT). Used inside the stand-in roots (tests/portability/*_check.sh), where python3 is there
anyway: the trixie check's old-ABI pass and the forky check's test sources.

Usage: syntax_check.py COMPILE_COMMANDS --only REGEX [--skip REGEX] [--drop=PREFIX]... [--add=FLAG]...
                       [--jobs N] [--label TEXT] [--stamps FILE]
  --only REGEX  the TUs whose absolute path matches (re.search); --skip REGEX leaves out matches
  --drop=PREFIX leaves out every argument starting with PREFIX; --add=FLAG appends FLAG (write
                them with "=": they start with a dash)
  --stamps FILE remembers each TU that compiled by a hash of its command, the compiler's version and
                its preprocessed text (-E: about a tenth of the syntax pass), and checks it again
                only when that hash changed (a rerun after a small change costs seconds)
Prints each failing TU with the start of its errors, then one line "LABEL: N of M TUs compile" (the
last line); exits 1 when one fails or none matches.
"""
import argparse
import hashlib
import os
import json
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

# Options that take the next argument and only matter for an object file.
WITH_VALUE = ("-o", "-MF", "-MT", "-MQ")
ALONE = ("-c", "-MD", "-MMD")


def base_args(entry, drop, add):
    args = entry.get("arguments") or shlex.split(entry["command"])
    if args and args[0].endswith("ccache"):
        args = args[1:]
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in WITH_VALUE:
            skip = True
        elif a in ALONE or any(a.startswith(p) for p in drop):
            continue
        else:
            out.append(a)
    return out + list(add)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("db")
    ap.add_argument("--only", required=True)
    ap.add_argument("--skip")
    ap.add_argument("--drop", action="append", default=[])
    ap.add_argument("--add", action="append", default=[])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--label", default="syntax")
    ap.add_argument("--stamps")
    opt = ap.parse_args()
    entries = [e for e in json.load(open(opt.db))
               if re.search(opt.only, e["file"]) and not (opt.skip and re.search(opt.skip, e["file"]))]

    stamps = {}
    if opt.stamps and os.path.exists(opt.stamps):
        with open(opt.stamps) as f:
            stamps = json.load(f)
    versions = {}

    def digest(e, args):
        if args[0] not in versions:
            versions[args[0]] = subprocess.run([args[0], "--version"], capture_output=True).stdout
        pre = subprocess.run(args + ["-E"], cwd=e["directory"], capture_output=True)
        if pre.returncode != 0:
            return None
        h = hashlib.sha256(versions[args[0]] + "\0".join(args).encode() + pre.stdout)
        return h.hexdigest()

    def run(e):
        args = base_args(e, opt.drop, opt.add)
        d = digest(e, args) if opt.stamps else None
        if d is not None and stamps.get(e["file"]) == d:
            return e["file"], 0, "", d, True
        r = subprocess.run(args + ["-fsyntax-only"], cwd=e["directory"], capture_output=True, text=True)
        return e["file"], r.returncode, r.stderr, d, False

    bad = unchanged = 0
    with ThreadPoolExecutor(max(1, opt.jobs)) as ex:
        for f, rc, err, d, same in ex.map(run, entries):
            unchanged += same
            if rc != 0:
                bad += 1
                stamps.pop(f, None)
                print(f"{opt.label}: compile failed: {f}\n{err[:2000]}")
            elif d is not None:
                stamps[f] = d
    if opt.stamps:
        with open(opt.stamps, "w") as f:
            json.dump(stamps, f, indent=0, sort_keys=True)
    note = f" ({unchanged} unchanged since they last compiled)" if opt.stamps else ""
    print(f"{opt.label}: {len(entries) - bad} of {len(entries)} TUs compile{note}")
    return 1 if bad or not entries else 0


if __name__ == "__main__":
    sys.exit(main())
