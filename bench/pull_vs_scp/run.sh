#!/usr/bin/env bash
# sftctl pull vs scp of the same file through the same sshd on 127.0.0.1, in one run.
#
#   bench/pull_vs_scp/run.sh [BUILD_DIR]        (default build/release; needs pull_bench, sftd,
#                                                sftd-stub-trainer, sftctl: `cmake --build B`)
#   MB=1024 ROUNDS=3 SWEEP=1 bench/pull_vs_scp/run.sh build/h-ssh
#
# Starts a throwaway sshd and a real sftd with the stub trainer (bench/lib/ssh_bench_env.sh), submits a
# job whose checkpoint holds an MB MiB model.bin, then times, alternating, ROUNDS times each:
#   scp          root@127.0.0.1:<file> (OpenSSH client, default cipher, writes a file)
#   sftctl pull  the whole command: the job's checkpoint folder + metrics, sha256-verified, fsynced
#   pull_bench   ConnectOverSsh + ListArtifacts + PullArtifact + sha256 verify + write (timing detail)
# and prints MiB/s of each (best and median) and the ratios to scp (target >= 1.0x).
# SWEEP=1 also times pull with each cipher/MAC pair libssh2 1.10 offers (SFTCTL_SSH_CIPHERS/MACS).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$(cd "${1:-$ROOT/build/release}" && pwd)"
MB="${MB:-1024}"
ROUNDS="${ROUNDS:-3}"
T="$(mktemp -d "${TMPDIR:-/tmp}/pull-vs-scp-XXXXXX")"
# shellcheck source=../lib/ssh_bench_env.sh
source "$ROOT/bench/lib/ssh_bench_env.sh"
bench_require pull_bench sftd sftd-stub-trainer sftctl
trap bench_env_cleanup EXIT
bench_env_start
bench_setup_job "$MB"
SIZE="$(stat -c %s "$FILE")"
cat "$FILE" > /dev/null  # both sides read from the page cache

mibs() { python3 -c "import sys; print(f'{$SIZE/1048576/float(sys.argv[1]):.0f}')" "$1"; }

time_scp() {
  rm -f "$T/scp.out"
  local t0 t1
  t0="$(now)"
  scp -q -F /dev/null -o BatchMode=yes -o UserKnownHostsFile="$KNOWN_HOSTS" -o StrictHostKeyChecking=yes \
      -i "$T/user_key" -P "$PORT" "$USER_NAME@127.0.0.1:$FILE" "$T/scp.out"
  t1="$(now)"
  python3 -c "print($t1-$t0)"
}
time_sftctl() {  # the whole `sftctl pull` command: the checkpoint folder + metrics, sha256-verified
  rm -rf "$T/sftctl.out"
  local t0 t1
  t0="$(now)"
  HOME="$T/home" XDG_CONFIG_HOME="$T/home/.config" "$BIN/sftctl" pull --host "$USER_NAME@127.0.0.1:$PORT" \
      -i "$T/user_key" --sftd "$BIN/sftd" --agent-data-dir "$T/agent" "$JOB" -o "$T/sftctl.out" \
      >/dev/null 2>>"$T/pull.err"
  t1="$(now)"
  python3 -c "print($t1-$t0)"
}
time_pull() {
  rm -f "$T/pull.out"
  local t0 t1 line
  t0="$(now)"
  line="$("$BIN/pull_bench" "${COMMON[@]}" pull --job "$JOB" --path "$REL" --out "$T/pull.out" 2>>"$T/pull.err")"
  t1="$(now)"
  echo "$line" > "$T/pull.json"
  python3 -c "print($t1-$t0)"
}

echo "pull_vs_scp: $((SIZE / 1048576)) MiB, sshd 127.0.0.1:$PORT, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
SCP=(); PULL=(); SFT=()
for r in $(seq "$ROUNDS"); do
  SCP+=("$(time_scp)")
  SFT+=("$(time_sftctl)")
  PULL+=("$(time_pull)")
  echo "  round $r: scp $(mibs "${SCP[-1]}") MiB/s, sftctl pull $(mibs "${SFT[-1]}") MiB/s, pull_bench $(mibs "${PULL[-1]}") MiB/s"
done
cmp -s "$T/scp.out" "$FILE" || { echo "scp copy differs" >&2; exit 1; }
cmp -s "$T/sftctl.out/checkpoint-000001/model.bin" "$FILE" || { echo "sftctl pull copy differs" >&2; exit 1; }
cmp -s "$T/pull.out" "$FILE" || { echo "pull copy differs" >&2; exit 1; }
echo "  pull detail (last round): $(cat "$T/pull.json")"
[[ -s "$T/pull.err" ]] && sed "s/^/  /" "$T/pull.err"
python3 - "$SIZE" "${SCP[*]}" "${PULL[*]}" "${SFT[*]}" <<'PY'
import statistics, sys
size = int(sys.argv[1]) / 1048576
scp = [float(x) for x in sys.argv[2].split()]
pull = [float(x) for x in sys.argv[3].split()]
sft = [float(x) for x in sys.argv[4].split()]
def row(name, xs):
    best, med = size / min(xs), size / statistics.median(xs)
    print(f"{name:<44} best {best:7.0f} MiB/s   median {med:7.0f} MiB/s")
    return best, med
sb, sm = row("scp (OpenSSH, whole command)", scp)
tb, tm = row("sftctl pull (whole command)", sft)
pb, pm = row("pull_bench (connect+list+pull+sha256)", pull)
print(f"{'ratio sftctl pull/scp':<44} best {tb/sb:7.2f}x        median {tm/sm:7.2f}x   (target >= 1.0x)")
print(f"{'ratio pull_bench/scp':<44} best {pb/sb:7.2f}x        median {pm/sm:7.2f}x")
PY

if [[ "${SWEEP:-0}" == 1 ]]; then
  echo "cipher/MAC sweep (pull, one run each; the default order is in client/remote/ssh/ssh_session.cpp):"
  for c in aes128-ctr aes256-ctr; do
    for m in hmac-sha2-256 hmac-sha1 hmac-sha2-512; do
      t="$(SFTCTL_SSH_CIPHERS=$c SFTCTL_SSH_MACS=$m time_pull)"
      echo "  $c + $m: $(mibs "$t") MiB/s"
    done
  done
fi
