#!/usr/bin/env bash
# Makes once, then reuses, a Debian 11 ("bullseye") root that stands in for an Ubuntu 22.04 GPU host
# as `sftctl bootstrap` finds it: the agent's packages as deploy/host/sftctl-host.sh installs them,
# at the old versions those hosts have -- gRPC 1.30.2 with no CMake config (pkg-config files only),
# protobuf 3.12.4, fmt 7.1, spdlog 1.8, nlohmann-json 3.9, yaml-cpp 0.6, curl 7.74, OpenSSL 1.1,
# CMake 3.18 (older than the presets' 3.21) and g++ 10. Debian 11 has no libcli11-dev; the root gets
# the one this machine's apt offers (Debian 12: 2.1.2, the version Ubuntu 22.04 ships). The agent is
# built and started inside it by tests/portability/bullseye_agent_check.sh.
#
# Usage: tests/portability/bullseye_root.sh [ROOT]
#   ROOT defaults to $SFTCTL_BULLSEYE_ROOT, else /var/cache/sftctl/bullseye-root. The root is ready
#   when ROOT/.sftctl-ready holds this script's package list; a half-made root (killed run) is
#   thrown away and made again. Needs root (or sudo), debootstrap, and the Debian registry this
#   machine's apt already uses (its address is read from apt's sources, not written here).
#   Takes a few minutes and about 1 GB the first time; seconds afterwards.
set -euo pipefail
NAME=bullseye_root
# shellcheck source=tests/portability/debian_root_lib.sh
. "$(dirname "$0")/debian_root_lib.sh"

ROOT=${1:-${SFTCTL_BULLSEYE_ROOT:-/var/cache/sftctl/bullseye-root}}

# The host script's package list for Debian/Ubuntu (HOST_PKGS in deploy/host/sftctl-host.sh) less
# libcli11-dev, which bullseye lacks (added below from this machine's apt), GoogleTest 1.10 for
# the agent's end-to-end test (every RPC, streaming ones included, through gRPC 1.30), and sshd and
# python3 for `sftctl bootstrap` onto it (tests/remote/fresh_host.sh with SFTCTL_FRESH_HOST_ROOT=bullseye).
PKGS=(g++ make cmake ninja-build pkg-config ca-certificates ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libssl-dev libsqlite3-dev
  libboost-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libyaml-cpp-dev libpcre2-dev
  libutf8proc-dev libcurl4-openssl-dev libgtest-dev libgmock-dev openssh-server python3)
want="${PKGS[*]} +libcli11-dev"

root_begin
root_debootstrap bullseye
# An old suite's Release file may have passed its Valid-Until on a snapshot mirror.
root_no_valid_until
echo "bullseye_root: installing ${#PKGS[@]} packages (gRPC 1.30, protobuf 3.12, CMake 3.18, g++ 10)" >&2
root_install
# CLI11 is header-only (headers and a CMake config, no dependencies): this machine's package.
debs=$(mktemp -d)
(cd "$debs" && { apt-get download libcli11-dev || { $SUDO apt-get update -qq && apt-get download libcli11-dev; }; } \
  >>"$ROOT.log" 2>&1) || root_fail "apt-get download libcli11-dev failed on this machine; see $ROOT.log"
$SUDO cp "$debs"/libcli11-dev_*.deb "$tmp/tmp/"
rm -rf "$debs"
$SUDO chroot "$tmp" sh -c 'dpkg -i /tmp/libcli11-dev_*.deb && rm -f /tmp/libcli11-dev_*.deb' >>"$ROOT.log" 2>&1 ||
  root_fail "installing libcli11-dev in the root failed; see $ROOT.log"
root_finish

# The root must keep gRPC's old layout, or the check proves nothing about pkg-config discovery.
if ls "$tmp"/usr/lib/*/cmake/grpc/gRPCConfig.cmake >/dev/null 2>&1; then
  root_fail "the root's gRPC has a CMake config; it no longer stands in for gRPC 1.30"
fi

root_commit
