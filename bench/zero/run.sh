#!/usr/bin/env bash
# ZeRO-1/2 on CPU ranks: distributed.shard none / optimizer / gradients, each trained by W
# sftctl-trainer ranks (Gloo on 127.0.0.1) on the same random-init ~50M-parameter llama (hidden 768,
# 7 layers, intermediate 2048; optimizer state and gradients dominate its memory), few steps on tiny
# random-text data. Prints one table: per-rank peak RSS (during training, and with the final
# checkpoint), the RSS each rank keeps after a step, rank 0's step time, and each figure's ratio to
# `none` at the same number of ranks. bench/zero/zero_bench.py does the work (see its docstring).
#
#   bench/zero/run.sh BUILD_DIR [--quick] [--ranks 2,4] [--steps N] [--warmup N] [--glibc-default]
#                               [any other zero_bench.py option: --batch, --seq, --hidden, ...]
#
#   --quick   2 ranks only, 4 steps (2 warm-up): a couple of minutes on a 2-core machine
#   default   2 and 4 ranks, 6 steps (2 warm-up); 4 ranks on 2 cores is slow (oversubscribed)
#
# MALLOC_MMAP_THRESHOLD_=131072 is set for every rank (--glibc-default leaves glibc's defaults):
# glibc's dynamic mmap threshold grows to the size of the largest block freed, so after the first
# step the gradients that ZeRO-2 frees as soon as they are reduced to their owner go back to the
# heap and stay resident, and the measured RSS would not show the saving that the allocator can in
# fact reuse. A fixed 128 KiB threshold serves every tensor larger than that with its own mmap and
# returns it on free. (On a GPU, LibTorch's caching allocator reuses freed blocks anyway.)
#
# Builds nothing: BUILD_DIR must contain bin/sftctl-trainer (built with Gloo). Runs are kept under
# BUILD_DIR/bench-results/zero/ (checkpoints removed once measured). The machine should be idle for
# the times; the memory figures do not depend on it.
set -euo pipefail
usage() { sed -n '/^#   bench\/zero\/run.sh/,/^#   default/p' "$0" >&2; exit 2; }
[[ $# -ge 1 && $1 != -* ]] || usage
build=$(cd "$1" && pwd); shift
args=() quick=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) quick=1 ;;
    -h|--help) usage ;;
    *) args+=("$1") ;;
  esac
  shift
done
trainer=$build/bin/sftctl-trainer
[[ -x $trainer ]] || { echo "$trainer not found: cmake --build $build --target sftctl-trainer" >&2; exit 1; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$build/bench-results/zero
rm -rf "$out" && mkdir -p "$out"
py=$(command -v python3 || echo /usr/bin/python3)
if [[ $quick == 1 ]]; then
  set -- --ranks 2 --steps 4 --warmup 2
else
  set -- --ranks 2,4 --steps 6 --warmup 2
fi
# Later options win (argparse), so the caller's override the mode's.
"$py" "$here/zero_bench.py" --trainer "$trainer" --out "$out" "$@" "${args[@]}" | tee "$out/table.txt"
