# Sourced by the stand-in root scripts (trixie_root.sh, bullseye_root.sh, forky_root.sh): the one way
# a cached Debian root is made. The caller sets NAME (for messages), ROOT, PKGS (array) and want (the
# ready marker's text), then calls, in order:
#   root_begin              exits printing ROOT when ROOT/.sftctl-ready holds $want; else takes
#                           ROOT.lock, finds the mirror apt uses here and clears ROOT.tmp ($tmp)
#   root_debootstrap SUITE [SCRIPT] [--gpg-fallback]
#   root_no_valid_until     (old or moving suites whose Release may be past its Valid-Until)
#   root_install            mounts proc in $tmp, apt-get installs "${PKGS[@]}"
#   root_finish             apt-get clean, unmounts proc (the caller's own checks of $tmp follow)
#   root_commit             moves $tmp to ROOT, writes the ready marker, prints ROOT
# root_fail MSG [--log] stops with MSG (and the log's tail). $SUDO is "sudo" when not root.
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

root_fail() {
  echo "$NAME: $1" >&2
  [ "${2:-}" = "--log" ] && tail -n 20 "$ROOT.log" >&2
  exit 1
}

root_is_ready() { [ -f "$ROOT/.sftctl-ready" ] && [ "$(cat "$ROOT/.sftctl-ready")" = "$want" ]; }

root_begin() {
  if root_is_ready; then echo "$ROOT"; exit 0; fi
  command -v debootstrap >/dev/null 2>&1 || {
    echo "$NAME: installing debootstrap" >&2
    $SUDO apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  }
  # The Debian mirror apt uses here (deb822 .sources or a one-line sources.list).
  mirror=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -n1)
  [ -n "$mirror" ] || mirror=$(grep -hsE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
    awk '{print $2}' | grep -v security | head -n1)
  [ -n "$mirror" ] || root_fail "no Debian mirror found in /etc/apt sources"
  $SUDO mkdir -p "$(dirname "$ROOT")"
  exec 9>"$ROOT.lock"
  flock 9
  # Another run may have finished it while this one waited for the lock.
  if root_is_ready; then echo "$ROOT"; exit 0; fi
  tmp="$ROOT.tmp"
  trap root_unmount EXIT
  root_unmount
  $SUDO rm -rf "$tmp"
}

root_unmount() { $SUDO umount "$tmp/proc" 2>/dev/null || true; }

# --gpg-fallback: when the Release signature does not verify with this machine's keyring (a newer
# archive key for a testing suite), once more without the check, over the same mirror apt trusts.
root_debootstrap() {
  local suite=$1 script=${2:-} fallback=${3:-}
  echo "$NAME: debootstrap $suite into $tmp (a few minutes)" >&2
  if $SUDO debootstrap --variant=minbase "$suite" "$tmp" "$mirror" $script >"$ROOT.log" 2>&1; then return 0; fi
  if [ "$fallback" = "--gpg-fallback" ] && grep -qiE 'signature|NO_PUBKEY|Release.gpg|InRelease|keyring' "$ROOT.log"; then
    echo "$NAME: the Release signature did not verify with this machine's keyring; retrying without" >&2
    $SUDO rm -rf "$tmp"
    $SUDO debootstrap --no-check-gpg --variant=minbase "$suite" "$tmp" "$mirror" $script >>"$ROOT.log" 2>&1 &&
      return 0
  fi
  root_fail "debootstrap failed; see $ROOT.log" --log
}

root_no_valid_until() {
  echo 'Acquire::Check-Valid-Until "false";' | $SUDO tee "$tmp/etc/apt/apt.conf.d/99sftctl-no-valid-until" >/dev/null
}

root_install() {
  $SUDO mount -t proc proc "$tmp/proc"
  $SUDO chroot "$tmp" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${PKGS[@]}" >>"$ROOT.log" 2>&1 || root_fail "apt-get install in the root failed; see $ROOT.log" --log
}

root_finish() {
  $SUDO chroot "$tmp" apt-get clean
  $SUDO umount "$tmp/proc"
}

root_commit() {
  $SUDO rm -rf "$ROOT"
  $SUDO mv "$tmp" "$ROOT"
  echo "$want" | $SUDO tee "$ROOT/.sftctl-ready" >/dev/null
  echo "$ROOT"
}
