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
#   About 1.6 GB on disk; timings in docs/portability.md.
set -euo pipefail
NAME=forky_root
# shellcheck source=tests/portability/debian_root_lib.sh
. "$(dirname "$0")/debian_root_lib.sh"

ROOT=${1:-${SFTCTL_FORKY_ROOT:-/var/cache/sftctl/forky-root}}
SUITE=forky

# Only what compiling, linking and running the trainer and its tests needs: a compiler, CMake,
# LibTorch (libtorch-dev: headers, CMake config, libtorch2.14; it pulls python3-dev in), the
# trainer's header-only and C dependencies, GoogleTest, OpenBLAS's OpenMP flavour (the tests' speed)
# and ccache; and, unlike the trixie root (which stands in for a wheel's layout), gloo's headers, so
# the Gloo code path -- the gradient buckets' hooks on LibTorch's grad accumulators, one of the APIs
# 2.14 changed -- compiles and its multi-rank tests run against the new LibTorch. And the real
# software the trainer's outputs must work with (about 110 MB more to download: Python torch reuses
# libtorch2.14): transformers 5 (with torch, numpy, safetensors, tokenizers), whose models the
# parity test compares with sftctl's (tests/reference/transformers_reference.py), and llama.cpp's
# tools, which load sftctl's GGUF exports (tests/reference/llama_cpp_greedy.sh).
PKGS=(ca-certificates g++ cmake ninja-build pkg-config libtorch-dev libopenblas0-openmp
  nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libpcre2-dev libutf8proc-dev libgloo-dev
  libgtest-dev libgmock-dev ccache python3-torch python3-numpy python3-transformers llama.cpp-tools
  python3-gguf)
want="${PKGS[*]}"

root_begin
# Debian 12's debootstrap has no script named after forky; testing and unstable use sid's.
script=/usr/share/debootstrap/scripts/sid
[ -e "/usr/share/debootstrap/scripts/$SUITE" ] && script=/usr/share/debootstrap/scripts/$SUITE
# Debian 12's keyring may lack the key testing's Release is signed with.
root_debootstrap "$SUITE" "$script" --gpg-fallback
# A mirror's Release of testing may be past its Valid-Until (a stale mirror or snapshot).
root_no_valid_until
echo "forky_root: installing ${#PKGS[@]} packages (LibTorch 2.13+, C++20)" >&2
root_install
root_finish
root_commit
