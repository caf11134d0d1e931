# Sourced by the SSH transfer benches (bench/pull_vs_scp/run.sh, bench/wan/run.sh): a throwaway sshd on
# 127.0.0.1 (ed25519 host/user keys, UsePAM no, StrictModes no, its own config: the shell twin of
# tests/ssh/sshd_fixture.h) and a real sftd with the stub trainer.
#
# Needs: ROOT, BUILD (absolute), T (a fresh temporary folder). Sets: BIN, PORT, USER_NAME, SSHD_PID,
# KNOWN_HOSTS (for OpenSSH clients), and a HOME for sftctl at $T/home (known_hosts for port $PORT).
# bench_env_start starts both; bench_env_cleanup (call it from an EXIT trap) stops them and removes $T.
# Also: bench_require (the binaries a bench needs), bench_setup_job (pull_bench's job with an MB MiB
# checkpoint file) and wan_relay_start (bench/wan/wan_relay with one of the network profiles).
BIN="$BUILD/bin"
SSHD_PID=""

bench_env_cleanup() {
  "$BIN/sftd" stop --data-dir "$T/agent" >/dev/null 2>&1 || true
  if [[ -n "$SSHD_PID" ]]; then
    pkill -KILL -P "$SSHD_PID" 2>/dev/null || true  # per-connection children of our listener only
    kill "$SSHD_PID" 2>/dev/null || true
    wait "$SSHD_PID" 2>/dev/null || true
  fi
  rm -rf "$T"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_port() {
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
  echo "nothing listens on 127.0.0.1:$1" >&2
  return 1
}

bench_env_start() {
  [[ "$(id -u)" == 0 && ! -d /run/sshd ]] && mkdir -m 0755 /run/sshd
  ssh-keygen -q -t ed25519 -N '' -f "$T/host_key"
  ssh-keygen -q -t ed25519 -N '' -f "$T/user_key"
  cp "$T/user_key.pub" "$T/authorized_keys"
  USER_NAME="$(id -un)"
  PORT="$(free_port)"
  local sftp=/usr/lib/openssh/sftp-server
  [[ -x $sftp ]] || sftp=internal-sftp
  cat > "$T/sshd_config" <<CFG
Port $PORT
ListenAddress 127.0.0.1
HostKey $T/host_key
PidFile $T/sshd.pid
AuthorizedKeysFile $T/authorized_keys
UsePAM no
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowTcpForwarding yes
Subsystem sftp $sftp
LogLevel ERROR
CFG
  /usr/sbin/sshd -D -f "$T/sshd_config" -E "$T/sshd.log" &
  SSHD_PID=$!
  wait_port "$PORT"
  KNOWN_HOSTS="$T/known_hosts"
  mkdir -p -m 0700 "$T/home/.ssh"
  trust_port "$PORT"
  "$BIN/sftd" start --detach --data-dir "$T/agent" --gpus none --trainer "$BIN/sftd-stub-trainer" >/dev/null
}

# Trusts sshd's host key at 127.0.0.1:$1 (sshd itself, or a relay in front of it), for OpenSSH clients
# ($KNOWN_HOSTS) and for sftctl ($T/home/.ssh/known_hosts).
trust_port() {
  local line="[127.0.0.1]:$1 $(cut -d' ' -f1,2 "$T/host_key.pub")"
  echo "$line" >> "$KNOWN_HOSTS"
  echo "$line" >> "$T/home/.ssh/known_hosts"
}

now() { date +%s.%N; }

# bench_require NAME...: exits 2 naming the first of $BIN/NAME that is not built.
bench_require() {
  local b
  for b in "$@"; do
    [[ -x "$BIN/$b" ]] || { echo "missing $BIN/$b (cmake --build $BUILD --target $b)" >&2; exit 2; }
  done
}

# bench_setup_job MB: a job on the agent whose checkpoint-000001 holds an MB MiB model.bin (pull_bench
# setup). Sets COMMON (pull_bench's connection flags), JOB, FILE (the model file on the agent's side)
# and REL (its path in the run folder).
bench_setup_job() {
  COMMON=(--host "$USER_NAME@127.0.0.1:$PORT" -i "$T/user_key" --known-hosts "$KNOWN_HOSTS"
          --sftd "$BIN/sftd" --data-dir "$T/agent")
  local setup
  setup="$("$BIN/pull_bench" "${COMMON[@]}" setup --mb "$1")"
  JOB="$(awk '/^JOB /{print $2}' <<<"$setup")"
  FILE="$(awk '/^FILE /{print $2}' <<<"$setup")"
  REL="$(awk '/^REL /{print $2}' <<<"$setup")"
}

# The network profiles (round-trip time, rate) as wan_relay's flags: lan (0.2 ms, 10 Gbit/s), metro
# (10 ms, 1 Gbit/s), wan (40 ms, 500 Mbit/s, 1 ms jitter), far (100 ms, 2 Gbit/s, 1 ms jitter).
wan_profile_args() {
  case "$1" in
    lan) echo "--rtt-ms 0.2 --mbit 10000" ;;
    metro) echo "--rtt-ms 10 --mbit 1000" ;;
    wan) echo "--rtt-ms 40 --mbit 500 --jitter-ms 1" ;;
    far) echo "--rtt-ms 100 --mbit 2000 --jitter-ms 1" ;;
    *) echo "unknown profile $1" >&2; return 1 ;;
  esac
}

# wan_relay_start PROFILE TARGET_PORT NAME: a relay with PROFILE in front of 127.0.0.1:TARGET_PORT,
# its output in $T/NAME.out; sets RELAY_PORT and RELAY_PID once it listens.
wan_relay_start() {
  local args
  args="$(wan_profile_args "$1")" || return 1
  RELAY_PORT="$(free_port)"
  # shellcheck disable=SC2086 # the flags, split on purpose
  "$BIN/wan_relay" --listen "$RELAY_PORT" --to "127.0.0.1:$2" $args > "$T/$3.out" &
  RELAY_PID=$!
  wait_port "$RELAY_PORT"
}
