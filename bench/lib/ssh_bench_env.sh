# Sourced by the SSH transfer benches (bench/pull_vs_scp/run.sh, bench/wan/run.sh): a throwaway sshd on
# 127.0.0.1 (ed25519 host/user keys, UsePAM no, StrictModes no, its own config: the shell twin of
# tests/ssh/sshd_fixture.h) and a real sftd with the stub trainer.
#
# Needs: ROOT, BUILD (absolute), T (a fresh temporary folder). Sets: BIN, PORT, USER_NAME, SSHD_PID,
# KNOWN_HOSTS (for OpenSSH clients), and a HOME for sftctl at $T/home (known_hosts for port $PORT).
# bench_env_start starts both; bench_env_cleanup (call it from an EXIT trap) stops them and removes $T.
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
