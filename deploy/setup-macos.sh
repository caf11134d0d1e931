#!/usr/bin/env bash
# Sets up sftctl on macOS (Apple silicon or Intel) with Homebrew: installs deploy/Brewfile, then
# configures and builds the `macos` preset (client + trainer; the agent is Linux-only) into
# build/macos. Safe to run again: brew skips what is installed, CMake rebuilds what changed.
#
# LibTorch comes from Homebrew's `pytorch` formula, which links the wheel's C++ headers, libraries
# and CMake config (share/cmake/Torch) into its own prefix; CMAKE_PREFIX_PATH points there.
# OpenSSL is keg-only in Homebrew, so OPENSSL_ROOT_DIR is passed too.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(uname -s)" = Darwin ] || { echo "setup-macos: this script is for macOS (Linux: deploy/setup.sh)" >&2; exit 1; }
command -v brew >/dev/null || { echo "setup-macos: install Homebrew first (https://brew.sh)" >&2; exit 1; }

brew bundle --file=deploy/Brewfile

torch_prefix=$(brew --prefix pytorch)
torch_cmake=$torch_prefix/share/cmake
[ -f "$torch_cmake/Torch/TorchConfig.cmake" ] || {
  echo "setup-macos: no TorchConfig.cmake under $torch_cmake (is Homebrew's pytorch installed?)" >&2
  exit 1
}

cmake --preset macos \
  -DCMAKE_PREFIX_PATH="$torch_cmake;$(brew --prefix)" \
  -DOPENSSL_ROOT_DIR="$(brew --prefix openssl@3)" >/dev/null
jobs=$(sysctl -n hw.ncpu 2>/dev/null || echo 4)
cmake --build --preset macos -j "$jobs"
echo "setup-macos: built $(ls build/macos/bin | tr '\n' ' ')in build/macos/bin"
echo "setup-macos: try the demo: build/macos/bin/sftctl run --local   (MPS when this Mac has it)"
