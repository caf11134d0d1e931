#!/usr/bin/env bash
# Per-token time of greedy generation, recompute vs KV cache, at 256 new tokens on a small random
# Qwen2-architecture model; prints the table and the ratio (target: >= 5x).
#   bench/generate/run.sh [BUILD_DIR] [generate_bench flags...]
set -euo pipefail
build=${1:-build/release}
shift || true
cmake --build "$build" --target generate_bench >/dev/null
"$build/bin/generate_bench" --new-tokens 256 "$@"
