#!/usr/bin/env bash
# Where CMake is older than 3.21 (Debian 11's 3.18) and reads no presets, deploy/host/sftctl-host.sh
# configures the host presets with arguments of its own (`sftctl-host.sh preset-args PRESET`). They
# must name the generator and cache variables CMakePresets.json gives each host preset (through
# "inherits"); this check fails on any drift. Needs bash and python3; no root, no build.
#
# Usage: tests/portability/host_preset_args.sh [SOURCE_DIR]
set -euo pipefail
cd "${1:-$(dirname "$0")/../..}"
status=0
for preset in host-agent trainer-only; do
  want=$(python3 - CMakePresets.json "$preset" <<'PY'
import json, sys
presets = {p["name"]: p for p in json.load(open(sys.argv[1]))["configurePresets"]}
def resolve(name):
    p = presets[name]
    out = {"generator": None, "cache": {}}
    parents = p.get("inherits", [])
    for parent in reversed([parents] if isinstance(parents, str) else parents):  # the first wins
        r = resolve(parent)
        out["generator"] = r["generator"] or out["generator"]
        out["cache"].update(r["cache"])
    out["generator"] = p.get("generator", out["generator"])
    out["cache"].update(p.get("cacheVariables", {}))
    return out
r = resolve(sys.argv[2])
print("-G", r["generator"], sep="\n")
for k, v in sorted(r["cache"].items()):
    print(f"-D{k}={v}")
PY
  )
  mapfile -t args < <(bash deploy/host/sftctl-host.sh preset-args "$preset")
  got=$(printf '%s\n' "${args[@]}" | sed -n '1,2p'; printf '%s\n' "${args[@]}" | sed -n '3,$p' | sort)
  if [ "$got" = "$want" ]; then
    echo "host_preset_args: $preset: $(echo "$got" | tr '\n' ' ')"
  else
    echo "host_preset_args: sftctl-host.sh preset-args $preset differs from CMakePresets.json (< preset, > script):" >&2
    diff <(echo "$want") <(echo "$got") >&2 || true
    status=1
  fi
done
exit $status
