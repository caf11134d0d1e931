#!/usr/bin/env bash
# Sets up sftctl on a fresh Debian 12 / Ubuntu 24.04 machine: installs the Debian packages it
# needs (deploy/install-deps.sh), then configures and builds the release preset into
# build/release. Safe to run again: it only installs what is missing and rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

deploy/install-deps.sh
cmake --preset release >/dev/null
jobs=$(nproc 2>/dev/null || echo 2)
cmake --build --preset release -j "$jobs"
echo "setup: built $(ls build/release/bin | tr '\n' ' ')in build/release/bin"
