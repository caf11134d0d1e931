#!/usr/bin/env bash
# Installs every Debian/Ubuntu package sftctl needs to build, run and test.
# Idempotent: packages already present are skipped by apt; safe to run repeatedly.
# Usage: deploy/install-deps.sh [--runtime-only]
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

BUILD_PKGS=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libtorch-dev libgloo-dev libopenblas0-openmp
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libssh2-1-dev libssl-dev libspdlog-dev libfmt-dev libboost-dev
  nlohmann-json3-dev libcli11-dev libyaml-cpp-dev libsqlite3-dev
  libpcre2-dev libutf8proc-dev libcairo2-dev
  ccache  # every build compiles through it when present (CMakeLists.txt SFTCTL_CCACHE)
  libcurl4-openssl-dev  # the Hugging Face Hub (common/net/http_client.cpp): hf:// paths, `sftctl download`
)
TEST_PKGS=(
  libgtest-dev libgmock-dev openssh-server openssh-client clang libclang-rt-dev
  python3 python3-torch python3-numpy python3-jinja2
  python3-protobuf  # tests/client/tensorboard_test.py parses the TensorBoard event files (protoc: BUILD_PKGS)
  # The portability checks (tests/portability): a cached Debian 13 root stands in for a GPU host.
  debootstrap rsync
  # tests/slurm: a 2-node Slurm cluster on 127.0.0.1 (tests/slurm/slurm_cluster.sh; nothing starts by itself).
  munge slurmctld slurmd slurm-client
)

want=("${BUILD_PKGS[@]}")
if [ "${1:-}" != "--runtime-only" ]; then
  want+=("${TEST_PKGS[@]}")
  # Tokenizer parity tests run a JavaScript reference. Keep an existing Node.js (e.g. NodeSource's,
  # which bundles npm and conflicts with Debian's npm package); otherwise use Debian's.
  command -v node >/dev/null 2>&1 || want+=(nodejs)
  command -v npm >/dev/null 2>&1 || want+=(npm)
fi

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${#missing[@]} package(s): ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "install-deps: all packages present"
fi

# The object-storage tests' S3 server: Debian 13's python3-moto (+ awscli, s3cmd to cross-check).
if [ "${1:-}" != "--runtime-only" ]; then
  $SUDO "$(dirname "$0")/../tests/object_store/s3_server.sh" install
fi

# LibTorch links libblas.so.3; make sure the OpenMP OpenBLAS wins over the reference BLAS
# (the reference BLAS makes training ~30x slower).
for alt in libblas.so.3-x86_64-linux-gnu liblapack.so.3-x86_64-linux-gnu; do
  cand=$(update-alternatives --list "$alt" 2>/dev/null | grep openblas-openmp | head -n1 || true)
  if [ -n "$cand" ]; then $SUDO update-alternatives --set "$alt" "$cand" >/dev/null; fi
done
