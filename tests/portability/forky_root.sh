#!/usr/bin/env bash
# Makes once, then reuses, a Debian testing ("forky") root that stands in for a GPU host with the
# newest PyTorch: LibTorch 2.14 (libtorch-dev), whose headers require C++20, g++ 16, CMake 4.3. The
# trainer-only build and the trainer tests run inside it (tests/portability/forky_trainer_check.sh).
#
# Usage: tests/portability/forky_root.sh [ROOT]
#   ROOT defaults to $SFTCTL_FORKY_ROOT, else /var/cache/sftctl/forky-root. The root is ready when
#   ROOT/.sftctl-ready holds this script's package list; a half-made root (killed run) is thrown
#   away and made again. Needs root (or sudo), debootstrap, and the Debian registry this machine's
#   apt already uses (its address is read from apt's sources, not written here). Debian testing
#   moves: a root made later gets newer packages (the check prints the LibTorch version it found).
set -euo pipefail

ROOT=${1:-${SFTCTL_FORKY_ROOT:-/var/cache/sftctl/forky-root}}
SUITE=forky
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# A compiler, CMake, LibTorch, the trainer's header-only and C dependencies, GoogleTest (the trainer
# tests), Python torch (the HF parity tests' reference logits) and ccache; and, unlike the trixie
# root (which stands in for a wheel's layout), gloo's headers, so the multi-rank CPU tests -- the
# gradient buckets' hooks on LibTorch's grad accumulators among them -- run against the new LibTorch.
PKGS=(ca-certificates g++ cmake ninja-build pkg-config make libtorch-dev libopenblas0-openmp
  nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libpcre2-dev libutf8proc-dev libgloo-dev
  libgtest-dev libgmock-dev python3 python3-torch python3-numpy ccache)
want="${PKGS[*]}"

if [ -f "$ROOT/.sftctl-ready" ] && [ "$(cat "$ROOT/.sftctl-ready")" = "$want" ]; then
  echo "$ROOT"
  exit 0
fi

command -v debootstrap >/dev/null 2>&1 || {
  echo "forky_root: installing debootstrap" >&2
  $SUDO apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
}
# Debian 12's debootstrap has no script named after forky; testing and unstable use sid's.
script=/usr/share/debootstrap/scripts/sid
[ -e "/usr/share/debootstrap/scripts/$SUITE" ] && script=/usr/share/debootstrap/scripts/$SUITE

# The Debian mirror apt uses here (deb822 .sources or a one-line sources.list).
mirror=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -n1)
[ -n "$mirror" ] || mirror=$(grep -hsE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
  awk '{print $2}' | grep -v security | head -n1)
[ -n "$mirror" ] || { echo "forky_root: no Debian mirror found in /etc/apt sources" >&2; exit 1; }

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
echo "forky_root: debootstrap $SUITE into $tmp (a few minutes)" >&2
# Debian 12's keyring may lack the key testing's Release is signed with: verify with it when it
# can, else (a newer archive key) without the signature check, over the same mirror apt trusts.
if ! $SUDO debootstrap --variant=minbase "$SUITE" "$tmp" "$mirror" "$script" >"$ROOT.log" 2>&1; then
  if grep -qiE 'signature|NO_PUBKEY|Release.gpg|InRelease|keyring' "$ROOT.log"; then
    echo "forky_root: the Release signature did not verify with this machine's keyring; retrying without" >&2
    $SUDO rm -rf "$tmp"
    $SUDO debootstrap --no-check-gpg --variant=minbase "$SUITE" "$tmp" "$mirror" "$script" >>"$ROOT.log" 2>&1 || {
      echo "forky_root: debootstrap failed; see $ROOT.log" >&2
      tail -n 20 "$ROOT.log" >&2
      exit 1
    }
  else
    echo "forky_root: debootstrap failed; see $ROOT.log" >&2
    tail -n 20 "$ROOT.log" >&2
    exit 1
  fi
fi
# A mirror's Release of testing may be past its Valid-Until (a stale mirror or snapshot).
echo 'Acquire::Check-Valid-Until "false";' | $SUDO tee "$tmp/etc/apt/apt.conf.d/99sftctl-valid-until" >/dev/null
$SUDO mount -t proc proc "$tmp/proc"
echo "forky_root: installing ${#PKGS[@]} packages (LibTorch 2.13+, C++20)" >&2
$SUDO chroot "$tmp" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "${PKGS[@]}" >>"$ROOT.log" 2>&1 || {
  echo "forky_root: apt-get install in the root failed; see $ROOT.log" >&2
  tail -n 20 "$ROOT.log" >&2
  exit 1
}
$SUDO chroot "$tmp" apt-get clean
$SUDO umount "$tmp/proc"

$SUDO rm -rf "$ROOT"
$SUDO mv "$tmp" "$ROOT"
echo "$want" | $SUDO tee "$ROOT/.sftctl-ready" >/dev/null
echo "$ROOT"
