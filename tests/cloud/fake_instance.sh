#!/bin/sh
# One "rented instance" for tests/util/fake_cloud.py --instance-command: a real sshd on
# 127.0.0.1:$FAKE_SSH_PORT that lets in the SSH keys the provider was given ($FAKE_AUTHORIZED_KEYS),
# running as this user. Terminated (SIGTERM to its process group), it drops its SSH connections and
# runs $FAKE_AGENT_STOP (the test's `sftd stop --data-dir ...`): what ran on the instance goes with it.
# Paused (SIGUSR1: the fake's /_fake/pause) it is off the network for a while and what runs on it runs
# on. Its sessions get a configuration folder of their own (XDG_CONFIG_HOME under the instance's
# folder), as a fresh host has. Run it with `exec`, so that the signals reach this shell. What its
# sessions start (the detached sftd) carries the test's SFTCTL_TEST_OWNER (sshd's SetEnv), so that it
# dies with the test however the test ends (tests/util/owned_processes.h).
set -eu
dir=$(mktemp -d "${FAKE_INSTANCE_ROOT:-${TMPDIR:-/tmp}}/fake-instance.XXXXXX")
ssh-keygen -q -t ed25519 -N '' -C fake-instance -f "$dir/host_key"
if [ "$(id -u)" = 0 ]; then mkdir -p /run/sshd; fi
# A RunPod pod has its own id and API key in its environment and runpodctl on its PATH: here a
# runpodctl that asks the fake (FAKE_POD_API_KEY: the test's key) to remove the pod.
pod_env=""
if [ -n "${FAKE_POD_API_KEY:-}" ] && [ "${FAKE_API_URL#*/api/v1}" = "$FAKE_API_URL" ]; then
  mkdir -p "$dir/bin"
  cat >"$dir/bin/runpodctl" <<'SHIM'
#!/bin/sh
# runpodctl (fake): `remove pod ID` through the fake's REST API, with the pod's own key.
[ "$1 $2" = "remove pod" ] || { echo "runpodctl (fake): only 'remove pod ID'" >&2; exit 2; }
exec curl -fsS --max-time 60 -X POST -H "Authorization: Bearer $RUNPOD_API_KEY" \
  -H 'Content-Type: application/json' -d '{"action": "terminate"}' "$RUNPOD_API_URL/v2/pods/$3/action"
SHIM
  chmod +x "$dir/bin/runpodctl"
  pod_env="PATH=$dir/bin:/usr/local/bin:/usr/bin:/bin RUNPOD_POD_ID=$FAKE_INSTANCE_ID RUNPOD_API_KEY=$FAKE_POD_API_KEY RUNPOD_API_URL=$FAKE_API_URL"
fi
cat >"$dir/sshd_config" <<CONFIG
Port $FAKE_SSH_PORT
ListenAddress 127.0.0.1
HostKey $dir/host_key
PidFile $dir/sshd.pid
AuthorizedKeysFile $FAKE_AUTHORIZED_KEYS
UsePAM no
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowTcpForwarding yes
MaxStartups 64
MaxSessions 64
SetEnv XDG_CONFIG_HOME=$dir/config $pod_env${SFTCTL_TEST_OWNER:+ SFTCTL_TEST_OWNER=$SFTCTL_TEST_OWNER}
CONFIG
# sshd in a session of its own: a signal to the instance's group reaches this shell (whose trap then
# ends sshd's connections and sshd), not sshd before its connections could be found.
start_sshd() {
  setsid /usr/sbin/sshd -D -f "$dir/sshd_config" -E "$dir/sshd.log" &
  sshd=$!
}
# The machine's network goes: sshd's per-connection children (sessions of their own), then sshd.
drop_network() {
  pkill -KILL -P "$sshd" 2>/dev/null || true
  kill "$sshd" 2>/dev/null || true
}
stop() {
  drop_network
  if [ -n "${FAKE_AGENT_STOP:-}" ]; then sh -c "$FAKE_AGENT_STOP" >/dev/null 2>&1 || true; fi
  rm -rf "$dir"
  exit 0
}
# SIGUSR1 (the fake's /_fake/pause): off the network for the seconds in $FAKE_PAUSE_FILE, then back;
# what runs on the machine (the agent, its jobs) runs on.
pause() {
  drop_network
  wait "$sshd" 2>/dev/null || true
  echo "fake instance $FAKE_INSTANCE_ID: off the network for $(cat "$FAKE_PAUSE_FILE") s"
  sleep "$(cat "$FAKE_PAUSE_FILE")"
  start_sshd
  echo "fake instance $FAKE_INSTANCE_ID: back"
}
trap stop TERM INT
trap pause USR1
start_sshd
echo "fake instance $FAKE_INSTANCE_ID: sshd on 127.0.0.1:$FAKE_SSH_PORT"
while kill -0 "$sshd" 2>/dev/null; do wait "$sshd" || true; done
rm -rf "$dir"
