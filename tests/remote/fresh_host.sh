#!/usr/bin/env bash
# A fresh GPU host stand-in for `sftctl bootstrap`: a cached Debian root seen through an overlay so
# the cache is never changed, running its own sshd on a loopback port. $SFTCTL_FRESH_HOST_ROOT picks
# it: `trixie` (default; tests/portability/trixie_root.sh: Debian 13, LibTorch 2.6, python3-torch, a
# compiler, sshd) or `bullseye` (tests/portability/bullseye_root.sh: Debian 11 with Ubuntu 22.04's
# gRPC 1.30 generation, no LibTorch). Nothing of sftctl is in either.
#
#   fresh_host.sh up [KEY=VALUE...]   make it (tearing down a previous one first) and print one line:
#       FRESH_HOST port=P root=MERGED key=CLIENT_KEY home=CLIENT_HOME run=RUN_DIR
#     KEY=VALUE pairs become sshd `SetEnv` lines: the environment a configured host gives its
#     sessions (e.g. HF_ENDPOINT of the test Hub). CCACHE_DIR always points at the portability
#     checks' shared ccache (tests/portability/debian_root_lib.sh), bound at /var/cache/sftctl-ccache:
#     the host's builds find the objects the trainer and agent checks compiled.
#   fresh_host.sh down                stop everything running in it (sshd, sftd, jobs, the bootstrap
#                                     worker), unmount, remove the run folder. Safe to repeat.
#
# RUN_DIR is $SFTCTL_FRESH_HOST_DIR, else /var/tmp/sftctl-fresh-host. Needs root (overlayfs, chroot).
# The host has a /workspace folder, like RunPod's storage that survives the instance.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tests/portability/debian_root_lib.sh
. tests/portability/debian_root_lib.sh  # CCACHE_SHARED, ccache_shared_init
RUN=${SFTCTL_FRESH_HOST_DIR:-/var/tmp/sftctl-fresh-host}
MERGED=$RUN/merged

# Every process whose root is the merged folder (sshd, the worker, sftd, trainer ranks).
inside_pids() {
  local p root
  for p in /proc/[0-9]*; do
    root=$(readlink "$p/root" 2>/dev/null) || continue
    case $root in "$MERGED" | "$MERGED"/*) echo "${p#/proc/}" ;; esac
  done
}

down() {
  local pids i
  for i in 1 2 3 4 5; do
    pids=$(inside_pids)
    [ -n "$pids" ] || break
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.2
  done
  for m in "$MERGED/var/cache/sftctl-ccache" "$MERGED/dev" "$MERGED/proc" "$MERGED"; do
    if mountpoint -q "$m" 2>/dev/null; then umount -l "$m" 2>/dev/null || true; fi
  done
  # Never remove through a mount (the shared ccache, /dev).
  if awk '{print $2}' /proc/mounts | grep -q "^$RUN/"; then
    echo "fresh_host: something is still mounted under $RUN; not removing it" >&2
    return 1
  fi
  rm -rf "$RUN"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

up() {
  [ "$(id -u)" -eq 0 ] || { echo "fresh_host: needs root (overlayfs, chroot)" >&2; exit 1; }
  local root
  local kind=${SFTCTL_FRESH_HOST_ROOT:-trixie}
  case $kind in trixie | bullseye) ;; *) echo "fresh_host: SFTCTL_FRESH_HOST_ROOT=$kind: not trixie or bullseye" >&2; exit 2 ;; esac
  root=$(bash "tests/portability/${kind}_root.sh" | tail -n 1)
  [ -x "$root/usr/sbin/sshd" ] || { echo "fresh_host: $root has no sshd (${kind}_root.sh installs openssh-server)" >&2; exit 1; }
  down
  mkdir -p "$RUN/upper" "$RUN/work" "$MERGED" "$RUN/client/.ssh"
  mount -t overlay overlay -o "lowerdir=$root,upperdir=$RUN/upper,workdir=$RUN/work" "$MERGED"
  rm -rf "$MERGED/work"  # the portability checks' copy of sftctl: a fresh host has none
  rm -rf "$MERGED/root/.local" "$MERGED/root/.config/sftd"
  mount -t proc proc "$MERGED/proc"
  mount --bind /dev "$MERGED/dev"
  ccache_shared_init
  mkdir -p "$MERGED/var/cache/sftctl-ccache"
  mount --bind "$CCACHE_SHARED" "$MERGED/var/cache/sftctl-ccache"
  mkdir -p "$MERGED/run/sshd" "$MERGED/workspace" "$MERGED/root/.ssh"
  chmod 0755 "$MERGED/run/sshd"
  chmod 0700 "$MERGED/root/.ssh"

  ssh-keygen -q -t ed25519 -N "" -C fresh-host -f "$RUN/host_key"
  cp "$RUN/host_key" "$MERGED/etc/ssh/sftctl_test_host_key"
  chmod 0600 "$MERGED/etc/ssh/sftctl_test_host_key"
  ssh-keygen -q -t ed25519 -N "" -C client -f "$RUN/client/.ssh/id_ed25519"
  cp "$RUN/client/.ssh/id_ed25519.pub" "$MERGED/root/.ssh/authorized_keys"
  chmod 0600 "$MERGED/root/.ssh/authorized_keys"

  local port env_lines="SetEnv CCACHE_DIR=/var/cache/sftctl-ccache" kv
  for kv in "$@"; do env_lines="$env_lines $kv"; done
  port=$(free_port)
  cat >"$MERGED/etc/ssh/sftctl_test_sshd_config" <<EOF
Port $port
ListenAddress 127.0.0.1
HostKey /etc/ssh/sftctl_test_host_key
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
AuthorizedKeysFile .ssh/authorized_keys
UsePAM no
AllowTcpForwarding yes
PidFile /run/sftctl_test_sshd.pid
$env_lines
EOF
  chroot "$MERGED" /usr/sbin/sshd -t -f /etc/ssh/sftctl_test_sshd_config
  setsid chroot "$MERGED" /usr/sbin/sshd -D -e -f /etc/ssh/sftctl_test_sshd_config >"$RUN/sshd.log" 2>&1 </dev/null &
  local i
  for i in $(seq 1 100); do
    if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null; then break; fi
    sleep 0.1
  done
  # The client's known_hosts names the host key under [127.0.0.1]:PORT, as OpenSSH writes it.
  echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$RUN/host_key.pub")" >"$RUN/client/.ssh/known_hosts"
  echo "FRESH_HOST port=$port root=$MERGED key=$RUN/client/.ssh/id_ed25519 home=$RUN/client run=$RUN"
}

case ${1:-} in
  up) shift; up "$@" ;;
  down) down ;;
  *) echo "usage: fresh_host.sh up [KEY=VALUE...] | down" >&2; exit 2 ;;
esac
