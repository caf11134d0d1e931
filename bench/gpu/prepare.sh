#!/usr/bin/env bash
# Run HERE (a Debian 12 machine with apt), before bench/gpu/run.sh goes to a GPU machine that has a
# pip PyTorch but perhaps no apt and no network: downloads the Debian packages the trainer-only
# build needs besides LibTorch and unpacks them into bench/gpu/deps/ (git-ignored), to be carried
# along with the working tree. Nothing is installed on this machine.
#
#   bench/gpu/prepare.sh            # -> bench/gpu/deps/{usr,...}, bench/gpu/deps/MANIFEST
#
# What is carried, and why (trainer/CMakeLists.txt, common/CMakeLists.txt, tests/CMakeLists.txt):
#   nlohmann-json3-dev, libcli11-dev       header-only (CONFIG packages)
#   libfmt-dev + libfmt9, libspdlog-dev + libspdlog1.1
#                                          used header-only by the trainer; the .so files are carried
#                                          only because their CMake target files insist they exist
#   libpcre2-dev + libpcre2-8-0, libutf8proc-dev + libutf8proc2
#                                          C libraries (either C++ ABI links them)
#   googletest                             GoogleTest's sources: run.sh builds it with the C++ ABI of
#                                          the machine's torch (wheels up to 2.6 use the old ABI)
#   pkgconf + libpkgconf3 + pkgconf-bin    pkg-config, in case the GPU image has none
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
deps=$here/deps
pkgs=(nlohmann-json3-dev libcli11-dev libfmt-dev libfmt9 libspdlog-dev libspdlog1.1 libpcre2-dev libpcre2-8-0
      libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2 googletest
      pkgconf pkgconf-bin libpkgconf3)
if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
  echo "prepare.sh: needs apt-get and dpkg-deb (run it on the Debian build machine)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download "${pkgs[@]}") >&2
rm -rf "$deps"
mkdir -p "$deps"
for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$deps"; done
(cd "$tmp" && find . -name '*.deb' -printf '%f\n' | sort) > "$deps/MANIFEST"
du -sh "$deps" >&2
echo "bench/gpu/deps ready: $(wc -l < "$deps/MANIFEST") packages" >&2
