#!/usr/bin/env bash
# Makes once, then reuses, a Debian 13 ("trixie") root that stands in for a Linux GPU host whose
# PyTorch is a pip wheel: LibTorch 2.6 (libtorch-dev) with its CMake config, but no gloo headers
# and no OpenSSL headers. The trainer-only build and the trainer tests run inside it
# (tests/portability/trixie_trainer_check.sh).
#
# Usage: tests/portability/trixie_root.sh [ROOT]
#   ROOT defaults to $SFTCTL_TRIXIE_ROOT, else /var/cache/sftctl/trixie-root. The root is ready
#   when ROOT/.sftctl-ready holds this script's package list; a half-made root (killed run) is
#   thrown away and made again. Needs root (or sudo), debootstrap, and the Debian registry this
#   machine's apt already uses (its address is read from apt's sources, not written here).
#   Takes 5-10 minutes and about 2.5 GB the first time; seconds afterwards.
set -euo pipefail

ROOT=${1:-${SFTCTL_TRIXIE_ROOT:-/var/cache/sftctl/trixie-root}}
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# What a GPU host's build of the trainer has: a compiler, CMake, LibTorch 2.x, the trainer's
# header-only and C dependencies, GoogleTest, and Python torch for the HF parity reference; sshd
# (every rented host has one: the fresh-host test of `sftctl bootstrap` logs in through it) and
# ccache (the trainer check fills a cache the fresh host's build of the same source then hits).
# Deliberately absent: libgloo-dev (a pip wheel ships no gloo headers) and libssl-dev.
PKGS=(ca-certificates g++ cmake ninja-build pkg-config make libtorch-dev libopenblas0-openmp
  nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libpcre2-dev libutf8proc-dev
  libgtest-dev libgmock-dev python3 python3-torch python3-numpy openssh-server ccache)
want="${PKGS[*]}"

if [ -f "$ROOT/.sftctl-ready" ] && [ "$(cat "$ROOT/.sftctl-ready")" = "$want" ]; then
  echo "$ROOT"
  exit 0
fi

command -v debootstrap >/dev/null 2>&1 || {
  echo "trixie_root: installing debootstrap" >&2
  $SUDO apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
}

# The Debian mirror apt uses here (deb822 .sources or a one-line sources.list).
mirror=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -n1)
[ -n "$mirror" ] || mirror=$(grep -hsE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
  awk '{print $2}' | grep -v security | head -n1)
[ -n "$mirror" ] || { echo "trixie_root: no Debian mirror found in /etc/apt sources" >&2; exit 1; }

$SUDO mkdir -p "$(dirname "$ROOT")"
exec 9>"$ROOT.lock"
flock 9
# Another run may have finished it while this one waited for the lock.
if [ -f "$ROOT/.sftctl-ready" ] && [ "$(cat "$ROOT/.sftctl-ready")" = "$want" ]; then
  echo "$ROOT"
  exit 0
fi

tmp="$ROOT.tmp"
cleanup() {
  $SUDO umount "$tmp/proc" 2>/dev/null || true
}
trap cleanup EXIT
cleanup
$SUDO rm -rf "$tmp"
echo "trixie_root: debootstrap trixie into $tmp (a few minutes)" >&2
$SUDO debootstrap --variant=minbase trixie "$tmp" "$mirror" >"$ROOT.log" 2>&1 || {
  echo "trixie_root: debootstrap failed; see $ROOT.log" >&2
  tail -n 20 "$ROOT.log" >&2
  exit 1
}
$SUDO mount -t proc proc "$tmp/proc"
echo "trixie_root: installing ${#PKGS[@]} packages (LibTorch 2.x, no gloo, no OpenSSL headers)" >&2
$SUDO chroot "$tmp" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "${PKGS[@]}" >>"$ROOT.log" 2>&1 || {
  echo "trixie_root: apt-get install in the root failed; see $ROOT.log" >&2
  tail -n 20 "$ROOT.log" >&2
  exit 1
}
$SUDO chroot "$tmp" apt-get clean
$SUDO umount "$tmp/proc"

# The root must look like a pip wheel's LibTorch, or the check proves nothing.
if [ -e "$tmp/usr/include/gloo/algorithm.h" ]; then
  echo "trixie_root: gloo headers are present in the root; it no longer stands in for a pip wheel" >&2
  exit 1
fi
grep -qs 'USE_C10D_GLOO' -r "$tmp"/usr/lib/*/cmake/Caffe2 "$tmp"/usr/lib/*/cmake/Torch ||
  echo "trixie_root: note: LibTorch's CMake config no longer exports USE_C10D_GLOO" >&2

$SUDO rm -rf "$ROOT"
$SUDO mv "$tmp" "$ROOT"
echo "$want" | $SUDO tee "$ROOT/.sftctl-ready" >/dev/null
echo "$ROOT"
