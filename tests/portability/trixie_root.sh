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
NAME=trixie_root
# shellcheck source=tests/portability/debian_root_lib.sh
. "$(dirname "$0")/debian_root_lib.sh"

ROOT=${1:-${SFTCTL_TRIXIE_ROOT:-/var/cache/sftctl/trixie-root}}

# What a GPU host's build of the trainer has: a compiler, CMake, LibTorch 2.x, the trainer's
# header-only and C dependencies, GoogleTest, and Python torch for the HF parity reference; sshd
# (every rented host has one: the fresh-host test of `sftctl bootstrap` logs in through it) and
# ccache (the trainer check fills a cache the fresh host's build of the same source then hits).
# Deliberately absent: libgloo-dev (a pip wheel ships no gloo headers) and libssl-dev.
PKGS=(ca-certificates g++ cmake ninja-build pkg-config make libtorch-dev libopenblas0-openmp
  nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libpcre2-dev libutf8proc-dev
  libgtest-dev libgmock-dev python3 python3-torch python3-numpy openssh-server ccache)
want="${PKGS[*]}"

root_begin
root_debootstrap trixie
echo "trixie_root: installing ${#PKGS[@]} packages (LibTorch 2.x, no gloo, no OpenSSL headers)" >&2
root_install
root_finish

# The root must look like a pip wheel's LibTorch, or the check proves nothing.
if [ -e "$tmp/usr/include/gloo/algorithm.h" ]; then
  root_fail "gloo headers are present in the root; it no longer stands in for a pip wheel"
fi
grep -qs 'USE_C10D_GLOO' -r "$tmp"/usr/lib/*/cmake/Caffe2 "$tmp"/usr/lib/*/cmake/Torch ||
  echo "trixie_root: note: LibTorch's CMake config no longer exports USE_C10D_GLOO" >&2

root_commit
