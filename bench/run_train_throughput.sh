#!/usr/bin/env bash
# Training throughput: the C++ trainer's step (bench/train_throughput.cpp) vs an eager
# PyTorch-Python step (bench/train_throughput.py), ~5M and ~28M parameters, batch 4 x seq 256,
# fp32 and bf16 autocast, all cores; prints a side-by-side table.
#
#   bench/run_train_throughput.sh BUILD_DIR [--quick] [--steps N] [--warmup N] [--threads N] [--foreach]
#                                 [--parallel aten,pool] [--no-python] [--baseline OLD_BUILD_DIR]
#
#   --quick     5 timed steps after 2 warm-up steps per config (< 1 minute in all)
#   default     30 timed steps after 5 warm-up steps per config (a few minutes)
#   --foreach   Python uses AdamW(foreach=True) rather than torch 1.13's default (foreach=False)
#   --parallel  C++ runs each config once per parallel backend of the fused kernels (trainer/runtime/parallel.h:
#               aten = LibTorch's OpenMP threads, pool = the portable pool), one row each, side by side
#   --no-python skip the Python side (its columns print as -)
#   --baseline  also run OLD_BUILD_DIR/bin/train_throughput (e.g. a build of the previous commit in a
#               git worktree) first; its rows are labelled "before" and are the "vs first" baseline,
#               so the table shows after/before ratios from one run
#
# Builds nothing: BUILD_DIR must contain bin/train_throughput
# (cmake --build BUILD_DIR --target train_throughput). Raw JSON lines are kept in
# BUILD_DIR/bench-results/. Run it on an otherwise idle machine.
set -euo pipefail

usage() {
  echo "usage: $0 BUILD_DIR [--quick] [--steps N] [--warmup N] [--threads N] [--foreach] [--parallel LIST] [--no-python] [--baseline OLD_BUILD_DIR]" >&2
  exit 2
}
[[ $# -ge 1 ]] || usage
build=$(cd "$1" && pwd); shift
steps=30 warmup=5 threads=0 foreach=() parallel=() python=1 baseline=
while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) steps=5 warmup=2 ;;
    --steps) steps=${2:?}; shift ;;
    --warmup) warmup=${2:?}; shift ;;
    --threads) threads=${2:?}; shift ;;
    --foreach) foreach=(--foreach) ;;
    --parallel) parallel=(--parallel "${2:?}"); shift ;;
    --no-python) python=0 ;;
    --baseline) baseline=$(cd "${2:?}" && pwd); shift ;;
    *) usage ;;
  esac
  shift
done
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bench=$build/bin/train_throughput
py=/usr/bin/python3  # Debian's python3 with torch 1.13 (a pyenv python3 on PATH may lack torch)
[[ -x $bench ]] || { echo "$bench not found: cmake --build $build --target train_throughput" >&2; exit 1; }
if [[ $python == 1 ]]; then
  $py -c 'import torch' 2>/dev/null || { echo "$py cannot import torch: apt-get install python3-torch" >&2; exit 1; }
fi

out=$build/bench-results
mkdir -p "$out"
cpp_out=$out/train_throughput-cpp.jsonl
py_out=$out/train_throughput-python.jsonl
echo "train_throughput: batch 4 x seq 256, $steps timed steps after $warmup warm-up steps, threads $([[ $threads == 0 ]] && echo all || echo "$threads"), load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')" >&2
: > "$cpp_out"
if [[ -n $baseline ]]; then
  [[ -x $baseline/bin/train_throughput ]] || { echo "$baseline/bin/train_throughput not found" >&2; exit 1; }
  echo "C++ baseline ($baseline) ..." >&2
  "$baseline/bin/train_throughput" --steps "$steps" --warmup "$warmup" --threads "$threads" |
    $py -c 'import json,sys
for l in sys.stdin:
    if l.strip():
        r = json.loads(l); r["parallel"] = "before"; print(json.dumps(r), flush=True)' | tee -a "$cpp_out" >&2
fi
echo "C++ ..." >&2
"$bench" --steps "$steps" --warmup "$warmup" --threads "$threads" "${parallel[@]}" | tee -a "$cpp_out" >&2
: > "$py_out"
if [[ $python == 1 ]]; then
  echo "Python ..." >&2
  $py "$src/bench/train_throughput.py" --steps "$steps" --warmup "$warmup" --threads "$threads" "${foreach[@]}" \
    | tee "$py_out" >&2
fi

$py - "$cpp_out" "$py_out" <<'PY'
import json, sys
cpp = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
py = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
peaks = {r["precision"]: r for r in cpp if r["bench"] == "matmul_peak" and r.get("parallel") != "before"}
runs = [r for r in cpp if r["bench"] == "train_throughput"]
pyruns = {(r["size"], r["precision"]): r for r in py}
targets = {"5M": 2.0, "28M": 1.2}
first = runs[0]
# The first backend of each config is the baseline of the "vs first" column (--parallel).
base = {}
for r in runs:
    base.setdefault((r["size"], r["precision"]), r)
print()
print("matmul peak (%d^3 torch::mm, best of %d, %d threads): %s" % (
    next(iter(peaks.values()))["n"], next(iter(peaks.values()))["reps"], first["threads"],
    ", ".join("%s %.0f GFLOP/s" % (p, r["flops"] / 1e9) for p, r in peaks.items())))
print("model FLOPs/step = %s (Linear weights; full T x T attention; fwd+bwd)" % first["flops_formula"])
print("%-5s %-9s %8s %-11s %13s %10s %9s %14s %11s %14s" % (
    "size", "precision", "params", "parallel", "C++ tok/s", "% of peak", "vs first", "Python tok/s", "C++/Python",
    "target"))
for r in runs:
    size, prec = r["size"], r["precision"]
    p = pyruns.get((size, prec))
    b = base[(size, prec)]
    ratio = r["tokens_per_s"] / p["tokens_per_s"] if p else None
    tgt = targets.get(size)
    verdict = "-" if ratio is None or tgt is None else (">=%.1fx %s" % (tgt, "met" if ratio >= tgt else "NOT met"))
    print("%-5s %-9s %7.1fM %-11s %13.0f %9.1f%% %8.2fx %14s %11s %14s" % (
        size, prec, r["params"] / 1e6, r.get("parallel", "-"), r["tokens_per_s"], 100 * r["peak_fraction"],
        r["tokens_per_s"] / b["tokens_per_s"], "%.0f" % p["tokens_per_s"] if p else "-",
        "%.2fx" % ratio if ratio else "-", verdict))
PY
