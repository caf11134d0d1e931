#!/usr/bin/env bash
# Sets up sftctl on a fresh Debian 12 / Ubuntu 24.04 machine: installs the Debian packages it
# needs (deploy/install-deps.sh), then configures and builds the release preset into
# build/release. Safe to run again: it only installs what is missing and rebuilds what changed.
#
# Usage: deploy/setup.sh [--install [PREFIX]]
#   --install  also installs sftctl, sftd and sftctl-trainer into PREFIX/bin (default ~/.local), with
#              what they read in PREFIX/share/sftctl, so that `sftctl` can be typed bare.
set -euo pipefail
cd "$(dirname "$0")/.."

install_prefix=""
case "${1:-}" in
  "") ;;
  --install) install_prefix="${2:-$HOME/.local}" ;;
  *) echo "usage: deploy/setup.sh [--install [PREFIX]]" >&2; exit 2 ;;
esac

# One line about a build's bin folder DIR: the three binaries you type or a host runs by name, and a
# count of the rest (tests, benchmarks, tools) rather than ~90 names. tests/client/setup_scripts_test.cpp
# runs it.
built_summary() {
  local dir=$1 built="" b others
  for b in sftctl sftd sftctl-trainer; do
    if [ -x "$dir/$b" ]; then built="$built${built:+, }$b"; fi
  done
  others=$(find "$dir" -maxdepth 1 -type f -perm -u+x ! -name sftctl ! -name sftd ! -name sftctl-trainer | wc -l)
  echo "setup: built ${built:-none of sftctl, sftd and sftctl-trainer} in $dir (and $others test and tool programs)"
}

deploy/install-deps.sh
cmake --preset release >/dev/null
jobs=$(nproc 2>/dev/null || echo 2)
cmake --build --preset release -j "$jobs"
built_summary build/release/bin

if [ -n "$install_prefix" ]; then
  cmake --install build/release --prefix "$install_prefix" >/dev/null
  echo "setup: installed sftctl, sftd and sftctl-trainer into $install_prefix/bin"
  case ":$PATH:" in
    *":$install_prefix/bin:"*) ;;
    *) echo "setup: $install_prefix/bin is not on your PATH; add it (e.g. in ~/.profile):" \
            "export PATH=\"$install_prefix/bin:\$PATH\"" ;;
  esac
fi
