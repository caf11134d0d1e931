#!/usr/bin/env bash
# A checkpoint pulled three ways, side by side in one run: from a bucket with `sftctl pull s3://`, from
# the host's agent with `sftctl pull` over SSH, and from the bucket with `aws s3 cp --recursive`.
#
#   bench/object_store/run.sh [BUILD_DIR]    (needs sftctl, sftd, sftd-stub-trainer, pull_bench and
#                                             wan_relay: `cmake --build B --target sftctl sftd
#                                             sftd-stub-trainer pull_bench wan_relay`; moto, awscli:
#                                             deploy/install-deps.sh)
#   MB=512 ROUNDS=1 PROFILES="loopback wan far" bench/object_store/run.sh build/release
#
# The SSH side is bench/wan's (bench/lib/ssh_bench_env.sh: a throwaway sshd and agent on 127.0.0.1;
# pull_bench setup makes a job whose checkpoint-000001 holds an MB MiB model.bin). The bucket is
# moto_server (tests/object_store/s3_server.sh, lenient: signatures are not checked, which only spares
# the server work), holding the same folder under s3://bench/run/checkpoint-000001 with its
# MANIFEST.json. For a profile other than loopback, bench/wan/wan_relay (same profiles as bench/wan)
# sits in front of sshd and, a second one, in front of the bucket. Each copy is the whole command
# (connecting, listing, sha256 checks, fsync where the tool does it) and is compared byte for byte.
# Prints MiB/s (median over rounds) and the ratios of `pull s3://` to the other two.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$(cd "${1:-$ROOT/build/release}" && pwd)"
MB="${MB:-512}"
ROUNDS="${ROUNDS:-1}"
PROFILES="${PROFILES:-loopback wan far}"
[[ -x /usr/bin/aws && -x /usr/bin/moto_server ]] || { echo "run deploy/install-deps.sh (moto, awscli)" >&2; exit 2; }

T="$(mktemp -d "${TMPDIR:-/tmp}/s3-bench-XXXXXX")"
# shellcheck source=../lib/ssh_bench_env.sh
source "$ROOT/bench/lib/ssh_bench_env.sh"
bench_require pull_bench wan_relay sftd sftd-stub-trainer sftctl
S3_SERVER="$ROOT/tests/object_store/s3_server.sh"
RELAYS=()
cleanup() {
  local pid
  for pid in "${RELAYS[@]}"; do kill "$pid" 2>/dev/null || true; done
  "$S3_SERVER" stop "$T/s3" || true
  bench_env_cleanup
}
trap cleanup EXIT
bench_env_start

bench_setup_job "$MB"
CKPT="$(dirname "$FILE")"
SIZE="$(du -sb "$CKPT" | cut -f1)"

# The bucket: the same checkpoint folder, then its manifest (as the uploader writes it: last).
S3_PORT="$(free_port)"
"$S3_SERVER" start "$T/s3" "$S3_PORT" lenient
set -a
# shellcheck disable=SC1091
source "$T/s3/env"
set +a
export AWS_DEFAULT_REGION=us-east-1 AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null
export AWS_EC2_METADATA_DISABLED=true
aws_s3() { /usr/bin/aws --endpoint-url "$1" s3 "${@:2}"; }
aws_s3 "$S3_ENDPOINT" mb s3://bench >/dev/null
aws_s3 "$S3_ENDPOINT" cp --recursive --quiet "$CKPT" s3://bench/run/checkpoint-000001
python3 - "$CKPT" > "$T/MANIFEST.json" <<'PY'
import hashlib, json, os, sys
d = sys.argv[1]
files = []
for name in sorted(os.listdir(d)):
    h = hashlib.sha256()
    with open(os.path.join(d, name), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    files.append({"path": name, "size": os.path.getsize(os.path.join(d, name)), "sha256": h.hexdigest()})
print(json.dumps({"format": 1, "step": 1, "name": "checkpoint-000001", "files": files}))
PY
aws_s3 "$S3_ENDPOINT" cp --quiet "$T/MANIFEST.json" s3://bench/run/checkpoint-000001/MANIFEST.json

# Relays for profile $1: RP (sshd) and RS (the bucket); the servers' own ports for loopback.
start_relays() {
  local pid
  for pid in "${RELAYS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  RELAYS=()
  if [[ "$1" == loopback ]]; then RP="$PORT" RS="$S3_PORT"; return; fi
  wan_relay_start "$1" "$PORT" relay-ssh
  RP="$RELAY_PORT"
  RELAYS+=("$RELAY_PID")
  wan_relay_start "$1" "$S3_PORT" relay-s3
  RS="$RELAY_PORT"
  RELAYS+=("$RELAY_PID")
  trust_port "$RP"
}

elapsed() {  # runs "$@", prints its wall time in seconds; a failure stops the bench
  local t0 t1
  t0="$(now)"
  "$@" >/dev/null 2>>"$T/errors" || { echo "failed: $*" >&2; cat "$T/errors" >&2; exit 1; }
  t1="$(now)"
  python3 -c "print($t1-$t0)"
}
s3_pull() {
  rm -rf "$T/s3pull"
  HOME="$T/home" "$BIN/sftctl" pull s3://bench/run "$T/s3pull" --endpoint-url "http://127.0.0.1:$RS"
}
ssh_pull() {
  rm -rf "$T/sshpull"
  HOME="$T/home" XDG_CONFIG_HOME="$T/home/.config" "$BIN/sftctl" pull --host "$USER_NAME@127.0.0.1:$RP" \
    -i "$T/user_key" --sftd "$BIN/sftd" --agent-data-dir "$T/agent" "$JOB" -o "$T/sshpull"
}
aws_cp() {
  rm -rf "$T/awscp"
  aws_s3 "http://127.0.0.1:$RS" cp --recursive --quiet s3://bench/run/checkpoint-000001 "$T/awscp"
}

echo "object_store bench: $((SIZE / 1048576)) MiB checkpoint, $ROUNDS round(s), $(nproc) cores," \
  "load $(cut -d' ' -f1-3 /proc/loadavg)"
RESULTS="$T/results.txt"
for p in $PROFILES; do
  start_relays "$p"
  for r in $(seq "$ROUNDS"); do
    for tool in s3_pull ssh_pull aws_cp; do
      t="$(elapsed "$tool")"
      echo "$p $tool $t" >> "$RESULTS"
      echo "  $p round $r: $tool $(python3 -c "print(f'{$SIZE/1048576/$t:.0f}')") MiB/s"
    done
    for copy in s3pull/checkpoint-000001 sshpull/checkpoint-000001 awscp; do
      cmp -s "$T/$copy/model.bin" "$FILE" || { echo "a copy differs ($p: $copy)" >&2; exit 1; }
    done
  done
done

python3 - "$SIZE" "$RESULTS" <<'PY'
import collections, statistics, sys
mib = int(sys.argv[1]) / 1048576
t = collections.defaultdict(list)
for line in open(sys.argv[2]):
    p, tool, s = line.split()
    t[(p, tool)].append(float(s))
rate = lambda p, tool: mib / statistics.median(t[(p, tool)])
print(f"\n{'profile':<9} {'pull s3://':>10} {'pull (SSH)':>10} {'aws s3 cp':>10} {'s3/SSH':>7} {'s3/aws':>7}"
      "   (MiB/s, median)")
for p in dict.fromkeys(p for p, _ in t):
    s3, ssh, aws = rate(p, "s3_pull"), rate(p, "ssh_pull"), rate(p, "aws_cp")
    print(f"{p:<9} {s3:10.0f} {ssh:10.0f} {aws:10.0f} {s3/ssh:6.2f}x {s3/aws:6.2f}x")
PY
