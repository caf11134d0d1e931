# shellcheck shell=bash
# Sourced by the stand-in root scripts (trixie_root.sh, bullseye_root.sh, forky_root.sh) and by the
# checks that run inside those roots (*_check.sh, gpu_checklist_check.sh): the one way a cached Debian
# root is made, entered, given the source tree and timed.
#
# Making a root. The caller sets NAME (for messages), ROOT, PKGS (array) and want (the ready
# marker's text), then calls, in order:
#   root_begin              exits printing ROOT when ROOT/.sftctl-ready holds $want; else takes
#                           ROOT.lock, finds the mirror apt uses here and clears ROOT.tmp ($tmp)
#   root_debootstrap SUITE [SCRIPT] [--gpg-fallback]
#   root_no_valid_until     (old or moving suites whose Release may be past its Valid-Until)
#   root_install            mounts proc in $tmp, apt-get installs "${PKGS[@]}"
#   root_finish             apt-get clean, unmounts proc (the caller's own checks of $tmp follow)
#   root_commit             moves $tmp to ROOT, writes the ready marker, prints ROOT
# root_fail MSG [--log] stops with MSG (and the log's tail). $SUDO is "sudo" when not root.
# dpkg unpacks without fsync in a root being made (force-unsafe-io: a killed run's root is thrown away).
#
# Checking inside a root (see "The checks" below): check_enter, in_root, copy_source, phase /
# done_phase / check_fail / check_summary.
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

root_fail() {
  echo "$NAME: $1" >&2
  [ "${2:-}" = "--log" ] && tail -n 20 "$ROOT.log" >&2
  exit 1
}

# shellcheck disable=SC2154  # (want: set by the root script)
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

# unmount_ccache DIR: the shared ccache's bind mount in a root (check_enter), before DIR is removed.
unmount_ccache() {
  if mountpoint -q "$1/var/cache/sftctl-ccache" 2>/dev/null; then
    $SUDO umount -l "$1/var/cache/sftctl-ccache" || root_fail "cannot unmount $1/var/cache/sftctl-ccache"
  fi
}

# --gpg-fallback: when the Release signature does not verify with this machine's keyring (a newer
# archive key for a testing suite), once more without the check, over the same mirror apt trusts.
root_debootstrap() {
  local suite=$1 script=${2:-} fallback=${3:-} t0=$SECONDS
  echo "$NAME: debootstrap $suite into $tmp (a few minutes)" >&2
  if $SUDO debootstrap --variant=minbase "$suite" "$tmp" "$mirror" $script >"$ROOT.log" 2>&1; then
    echo "$NAME: debootstrap took $((SECONDS - t0)) s" >&2
    root_unsafe_io
    return 0
  fi
  if [ "$fallback" = "--gpg-fallback" ] && grep -qiE 'signature|NO_PUBKEY|Release.gpg|InRelease|keyring' "$ROOT.log"; then
    echo "$NAME: the Release signature did not verify with this machine's keyring; retrying without" >&2
    $SUDO rm -rf "$tmp"
    $SUDO debootstrap --no-check-gpg --variant=minbase "$suite" "$tmp" "$mirror" $script >>"$ROOT.log" 2>&1 &&
      root_unsafe_io && return 0
  fi
  root_fail "debootstrap failed; see $ROOT.log" --log
}

root_unsafe_io() {
  echo force-unsafe-io | $SUDO tee "$tmp/etc/dpkg/dpkg.cfg.d/99sftctl-unsafe-io" >/dev/null
}

root_no_valid_until() {
  echo 'Acquire::Check-Valid-Until "false";' | $SUDO tee "$tmp/etc/apt/apt.conf.d/99sftctl-no-valid-until" >/dev/null
}

root_install() {
  local t0=$SECONDS
  $SUDO mount -t proc proc "$tmp/proc"
  $SUDO chroot "$tmp" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${PKGS[@]}" >>"$ROOT.log" 2>&1 || root_fail "apt-get install in the root failed; see $ROOT.log" --log
  echo "$NAME: apt-get install took $((SECONDS - t0)) s ($(du -sh "$tmp/var/cache/apt/archives" | cut -f1) of packages)" >&2
}

root_finish() {
  $SUDO chroot "$tmp" apt-get clean
  $SUDO umount "$tmp/proc"
}

root_commit() {
  unmount_ccache "$ROOT"
  $SUDO rm -f "$tmp/etc/dpkg/dpkg.cfg.d/99sftctl-unsafe-io"
  $SUDO rm -rf "$ROOT"
  $SUDO mv "$tmp" "$ROOT"
  echo "$want" | $SUDO tee "$ROOT/.sftctl-ready" >/dev/null
  echo "$ROOT"
}

# ---- The checks ----------------------------------------------------------------------------------
# A check sets NAME, sources this file and calls check_enter ROOT_SCRIPT: it cds to the source tree,
# has ROOT_SCRIPT make (or find) the root and sets ROOT to it, mounts proc in the root and binds the
# shared ccache (below) at ROOT/var/cache/sftctl-ccache; both are undone on exit, after the
# function named by CHECK_EXIT_HOOK, if any (e.g. to stop a daemon started in the root).
#
# The shared ccache: one folder on this machine, $SFTCTL_CCACHE_DIR or /var/cache/sftctl/ccache,
# serves every root (and CI's main build, .ci/run), so a root made again keeps its compiler's
# objects and one size limit (its ccache.conf: max_size, set once here) covers them all. Inside a
# root it is /var/cache/sftctl-ccache, base dir /work, -Werror left out of the hash: a
# bootstrapped host's ~/.local/share/sftctl/{src,build-*} (tests/remote/fresh_host.sh binds it too)
# sees the same relative paths, so the fresh-host test's builds hit the checks' objects. The
# sloppiness lets it cache the trainer tests, which include a precompiled header (tests/CMakeLists.txt
# sftctl_test_pch; the checks name ccache as the launcher themselves, so CMakeLists.txt's does not apply).
CCACHE_SHARED=${SFTCTL_CCACHE_DIR:-/var/cache/sftctl/ccache}
CCACHE_ENV=(CCACHE_DIR=/var/cache/sftctl-ccache CCACHE_BASEDIR=/work CCACHE_IGNOREOPTIONS=-Werror
  CCACHE_SLOPPINESS=pch_defines,time_macros)
# Where the checks keep the source and their build folders inside a root; how many compiles at once.
# shellcheck disable=SC2034  # (for the checks that source this file)
WORK=/work/src
# shellcheck disable=SC2034
jobs=${SFTCTL_CHECK_JOBS:-$(nproc 2>/dev/null || echo 2)}

# ccache_shared_init: makes the shared folder, with its size limit when it has none.
ccache_shared_init() {
  $SUDO mkdir -p "$CCACHE_SHARED"
  if ! grep -qs '^max_size' "$CCACHE_SHARED/ccache.conf"; then
    echo "max_size = 12G" | $SUDO tee -a "$CCACHE_SHARED/ccache.conf" >/dev/null
  fi
}

check_enter() {
  cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
  ROOT=$(bash "$1" | tail -n 1)
  LOGS=$ROOT/work
  trap check_exit EXIT
  check_unmount
  ccache_shared_init
  $SUDO mkdir -p "$ROOT/var/cache/sftctl-ccache" "$LOGS"
  # A root made before the cache was shared has its own: its objects move to the shared one (once).
  if [ -n "$($SUDO ls -A "$ROOT/var/cache/sftctl-ccache")" ]; then
    $SUDO cp -a --no-clobber "$ROOT/var/cache/sftctl-ccache/." "$CCACHE_SHARED/" &&
      $SUDO find "$ROOT/var/cache/sftctl-ccache" -mindepth 1 -delete
  fi
  $SUDO mount --bind "$CCACHE_SHARED" "$ROOT/var/cache/sftctl-ccache"
  $SUDO mount -t proc proc "$ROOT/proc"
}

# (Lazily when busy: a compiler a killed build left running still writes to the cache.)
check_unmount() {
  local m
  for m in "$ROOT/proc" "$ROOT/var/cache/sftctl-ccache"; do
    if mountpoint -q "$m" 2>/dev/null; then $SUDO umount "$m" 2>/dev/null || $SUDO umount -l "$m"; fi
  done
}

check_exit() {
  if [ -n "${CHECK_EXIT_HOOK:-}" ]; then "$CHECK_EXIT_HOOK" || true; fi
  check_unmount
}

# in_root CMD...: CMD inside the root, in a clean environment (C.UTF-8: ccache hashes the locale).
in_root() {
  $SUDO chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "${CCACHE_ENV[@]}" "$@"
}

# copy_source: the tree as a fresh checkout has it -- tracked and untracked, not ignored, files
# (bench/gpu/deps/ is a download of Debian packages for a GPU machine, not source) -- into ROOT$WORK.
# Files are compared by content (--checksum) and times are not copied (no -t): a file whose content
# is unchanged keeps its old time in the root even when this tree is a fresh clone (all times new),
# and a changed one gets the time of the copy, so ninja rebuilds exactly what changed.
copy_source() {
  $SUDO mkdir -p "$ROOT$WORK"
  { git ls-files -co --exclude-standard -z 2>/dev/null ||
    find . -path ./build -prune -o -path ./.git -prune -o -type f -printf '%P\0'; } |
    { grep -zv '^bench/gpu/deps/' || true; } |
    $SUDO rsync -rl --checksum --ignore-missing-args --from0 --files-from=- ./ "$ROOT$WORK/"
}

# select_openblas_openmp: Debian's LibTorch uses OpenBLAS; its pthread flavour under LibTorch's
# OpenMP is ~30x slower, so the root's alternatives point at the OpenMP one where it is installed.
select_openblas_openmp() {
  local alt target
  for alt in libblas.so.3 liblapack.so.3 libopenblas.so.0; do
    target=/usr/lib/x86_64-linux-gnu/openblas-openmp/$alt
    if [ -e "$ROOT$target" ]; then in_root update-alternatives --set "$alt-x86_64-linux-gnu" "$target" >/dev/null; fi
  done
}

# Phases: `phase TEXT` starts one (printed with the time), `done_phase LABEL [RESULT]` records its
# summary line with its duration, `check_fail LABEL MSG` records it as FAILED, prints the summary
# and exits 1, `check_summary TITLE` prints the summary and the total.
summary=()
t_phase=$SECONDS
phase() {
  t_phase=$SECONDS
  echo "$NAME: $* ($(date +%H:%M:%S))"
}
done_phase() { summary+=("$(printf '%-44s %5d s  %s' "$1" $((SECONDS - t_phase)) "${2:-ok}")"); }
check_fail() {
  done_phase "$1" FAILED
  printf '%s\n' "$NAME summary:" "${summary[@]}" >&2
  echo "$NAME: FAILED: $2" >&2
  exit 1
}
check_summary() {
  printf '%s\n' "$NAME summary ($1):" "${summary[@]}"
  echo "$NAME: passed in $SECONDS s"
}
