#!/usr/bin/env bash
# Transfers over an emulated network, side by side in one run: scp, rsync -e ssh and sftctl (pull of a
# checkpoint, upload of a data file) through the same sshd, reached through bench/wan/wan_relay with a
# profile's round-trip time and rate.
#
#   bench/wan/run.sh [BUILD_DIR]                 (needs pull_bench, wan_relay, sftd, sftd-stub-trainer,
#                                                 sftctl: `cmake --build B --target pull_bench wan_relay`)
#   MB=1024 ROUNDS=1 PROFILES="lan metro wan" STREAMS="" bench/wan/run.sh build/release
#
# Profiles (RTT, rate): loopback (no relay), lan (0.2 ms, 10 Gbit/s), metro (10 ms, 1 Gbit/s),
# wan (40 ms, 500 Mbit/s, 1 ms jitter), far (100 ms, 2 Gbit/s, 1 ms jitter: across an ocean on a fast
# link, where one SSH channel is bound by its window, not the link). For each profile and round it
# times, one after the other:
#   scp down       scp -P RELAY user@127.0.0.1:FILE OUT (OpenSSH, its default cipher)
#   rsync down     rsync -e 'ssh -p RELAY' (Debian's rsync; the destination is absent: whole file)
#   sftctl pull    the whole `sftctl pull JOB -o DIR` command (checkpoint folder + metrics, sha256, fsync),
#                  as it chooses its connections (parallel byte ranges), and with --streams 1 (one connection)
#   scp up         scp -P RELAY FILE user@127.0.0.1:DEST
#   sftctl upload  pull_bench upload: what `sftctl submit` does for a data file (sha256 of it, StatBlob,
#                  UploadBlob through the client's UploadFile); a fresh blob each round
# and prints MiB/s (median over rounds) and each one's ratio to scp in its direction.
# STREAMS, when set, is passed to the first `sftctl pull` as --streams. TOOLS picks a subset of
# "scp_down rsync_down sftctl_pull sftctl_pull_1 scp_up sftctl_upload" (the table needs all six).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$(cd "${1:-$ROOT/build/release}" && pwd)"
MB="${MB:-1024}"
ROUNDS="${ROUNDS:-1}"
PROFILES="${PROFILES:-loopback lan metro wan}"
TOOLS="${TOOLS:-scp_down rsync_down sftctl_pull sftctl_pull_1 scp_up sftctl_upload}"
command -v rsync >/dev/null || { echo "rsync is not installed (apt install rsync)" >&2; exit 2; }

T="$(mktemp -d "${TMPDIR:-/tmp}/wan-bench-XXXXXX")"
# shellcheck source=../lib/ssh_bench_env.sh
source "$ROOT/bench/lib/ssh_bench_env.sh"
bench_require pull_bench wan_relay sftd sftd-stub-trainer sftctl
RELAY_PID=""
cleanup() {
  [[ -n "$RELAY_PID" ]] && kill "$RELAY_PID" 2>/dev/null || true
  bench_env_cleanup
}
trap cleanup EXIT
bench_env_start

bench_setup_job "$MB"
SIZE="$(stat -c %s "$FILE")"
UP="$T/upload.bin"
head -c "$SIZE" /dev/urandom > "$UP"

# Starts the relay for profile $1 and sets RP to the port to use (sshd's own for loopback).
start_relay() {
  [[ -n "$RELAY_PID" ]] && { kill "$RELAY_PID" 2>/dev/null || true; wait "$RELAY_PID" 2>/dev/null || true; }
  RELAY_PID=""
  if [[ "$1" == loopback ]]; then RP="$PORT"; return; fi
  wan_relay_start "$1" "$PORT" relay
  RP="$RELAY_PORT"
  trust_port "$RP"
}

SSH_OPTS=(-F /dev/null -o BatchMode=yes -o UserKnownHostsFile="$KNOWN_HOSTS" -o StrictHostKeyChecking=yes
          -i "$T/user_key")
elapsed() {  # runs "$@", prints its wall time in seconds; a failure stops the bench
  local t0 t1
  t0="$(now)"
  "$@" >/dev/null 2>>"${ERRLOG:-$T/errors}" || { echo "failed: $*" >&2; cat "$T/errors" >&2; exit 1; }
  t1="$(now)"
  python3 -c "print($t1-$t0)"
}
scp_down() { rm -f "$T/scp.out"; scp -q "${SSH_OPTS[@]}" -P "$RP" "$USER_NAME@127.0.0.1:$FILE" "$T/scp.out"; }
rsync_down() {
  rm -f "$T/rsync.out"
  rsync -q -e "ssh ${SSH_OPTS[*]} -p $RP" "$USER_NAME@127.0.0.1:$FILE" "$T/rsync.out"
}
sftctl_pull() {
  rm -rf "$T/pull.out"
  HOME="$T/home" XDG_CONFIG_HOME="$T/home/.config" "$BIN/sftctl" pull --host "$USER_NAME@127.0.0.1:$RP" \
    -i "$T/user_key" --sftd "$BIN/sftd" --agent-data-dir "$T/agent" "$JOB" -o "$T/pull.out" \
    ${STREAMS:+--streams "$STREAMS"}
}
sftctl_pull_1() {
  rm -rf "$T/pull1.out"
  HOME="$T/home" XDG_CONFIG_HOME="$T/home/.config" "$BIN/sftctl" pull --host "$USER_NAME@127.0.0.1:$RP" \
    -i "$T/user_key" --sftd "$BIN/sftd" --agent-data-dir "$T/agent" "$JOB" -o "$T/pull1.out" --streams 1
}
scp_up() { scp -q "${SSH_OPTS[@]}" -P "$RP" "$UP" "$USER_NAME@127.0.0.1:$T/scp-up.bin"; }
sftctl_upload() {
  date +%s%N | dd of="$UP" conv=notrunc status=none  # a new blob each time: the agent skips one it holds
  "$BIN/pull_bench" "${COMMON[@]}" --host "$USER_NAME@127.0.0.1:$RP" \
    upload --file "$UP"
}

cat "$FILE" "$UP" > /dev/null  # every tool reads from the page cache
echo "wan bench: $((SIZE / 1048576)) MiB, $ROUNDS round(s), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
RESULTS="$T/results.txt"
for p in $PROFILES; do
  start_relay "$p"
  for r in $(seq "$ROUNDS"); do
    for tool in $TOOLS; do
      t="$(elapsed "$tool")"
      echo "$p $tool $t" >> "$RESULTS"
      echo "  $p round $r: $tool $(python3 -c "print(f'{$SIZE/1048576/$t:.0f}')") MiB/s"
    done
  done
  for copy in scp.out rsync.out pull.out/checkpoint-000001/model.bin pull1.out/checkpoint-000001/model.bin; do
    [[ ! -e "$T/$copy" ]] || cmp -s "$T/$copy" "$FILE" || { echo "a copy differs ($p: $copy)" >&2; exit 1; }
  done
done
[[ "$TOOLS" == "scp_down rsync_down sftctl_pull sftctl_pull_1 scp_up sftctl_upload" ]] || exit 0

python3 - "$SIZE" "$RESULTS" <<'PY'
import collections, statistics, sys
mib = int(sys.argv[1]) / 1048576
t = collections.defaultdict(list)
for line in open(sys.argv[2]):
    p, tool, s = line.split()
    t[(p, tool)].append(float(s))
profiles = list(dict.fromkeys(p for p, _ in t))
rate = lambda p, tool: mib / statistics.median(t[(p, tool)])
print(f"\n{'profile':<9} {'scp down':>9} {'rsync':>7} {'pull':>6} {'pull/scp':>9} {'pull 1 conn':>14}"
      f" {'1/scp':>6} {'scp up':>7} {'upload':>7} {'up/scp':>7}   (MiB/s, median)")
for p in profiles:
    sd, rs, sp, s1 = (rate(p, t) for t in ("scp_down", "rsync_down", "sftctl_pull", "sftctl_pull_1"))
    su, up = rate(p, "scp_up"), rate(p, "sftctl_upload")
    print(f"{p:<9} {sd:9.0f} {rs:7.0f} {sp:6.0f} {sp/sd:8.2f}x {s1:14.0f} {s1/sd:5.2f}x {su:7.0f} {up:7.0f}"
          f" {up/su:6.2f}x")
PY
