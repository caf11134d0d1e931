#!/usr/bin/env bash
# Time to learn: the demo task (client/local/demo.cpp) trained by the C++ trainer (`sftctl run --local`
# with a spec equal to the demo's but eval.interval 100) and by the PyTorch-Python reference
# (bench/time_to_learn.py train) with identical hyperparameters, seed, data order and precision;
# prints the training time (evaluation excluded) to >= 95% and >= 99% held-out exact match for
# each and the ratio C++/Python.
#
#   bench/run_time_to_learn.sh BUILD_DIR [bf16|fp32] [--max-steps N] [--threads N] [--seed N] [--out DIR] [--foreach]
#
#   precision     default bf16 (CPU autocast) on both sides
#   --max-steps   default 2000 (the demo's); e.g. 200 for a smoke run (the lr schedule shrinks with it)
#   --seed        init and data-order seed on both sides (default 1234, the demo's)
#   --out         work folder (default BUILD_DIR/bench-results/time_to_learn); rewritten each run
#   --foreach     Python uses AdamW(foreach=True) rather than torch 1.13's default
#
# Builds nothing: BUILD_DIR must contain bin/sftctl (and the trainer it starts).
# The full run takes a few minutes per side on a quiet 2-core machine.
set -euo pipefail

usage() { echo "usage: $0 BUILD_DIR [bf16|fp32] [--max-steps N] [--threads N] [--seed N] [--out DIR] [--foreach]" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
build=$(cd "$1" && pwd); shift
precision=bf16
if [[ $# -gt 0 && $1 != --* ]]; then precision=$1; shift; fi
[[ $precision == bf16 || $precision == fp32 ]] || usage
max_steps=2000 threads=0 seed=1234 out=$build/bench-results/time_to_learn foreach=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --max-steps) max_steps=${2:?}; shift ;;
    --threads) threads=${2:?}; shift ;;
    --seed) seed=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    --foreach) foreach=(--foreach) ;;
    *) usage ;;
  esac
  shift
done
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
sftctl=$build/bin/sftctl
py=/usr/bin/python3  # Debian's python3 with torch 1.13 (a pyenv python3 on PATH may lack torch)
[[ -x $sftctl ]] || { echo "$sftctl not found: cmake --build $build" >&2; exit 1; }
$py -c 'import torch' 2>/dev/null || { echo "$py cannot import torch: apt-get install python3-torch" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)

# 1. The demo's data files, written by the demo itself (one step; kept between runs).
data=$out/demo/data
if [[ ! -s $data/train.jsonl || ! -s $data/eval.jsonl ]]; then
  echo "writing the demo data (sftctl run --local --max-steps 1) ..." >&2
  rm -rf "$out/demo"
  "$sftctl" run --local -o "$out/demo" --max-steps 1 > "$out/demo.log" 2>&1 \
    || { cat "$out/demo.log" >&2; exit 1; }
fi

# 2. C++: the demo's spec (client/local/demo.cpp), evaluated every 100 steps, in a fresh folder.
rm -rf "$out/cpp"
mkdir -p "$out/cpp"
cat > "$out/cpp/spec.yaml" <<YAML
name: time-to-learn
output_dir: $out/cpp/run
resume: never
seed: $seed
device: cpu
precision: $precision
threads: $threads
tokenizer: byte
model:
  config:
    model_type: llama
    hidden_size: 128
    intermediate_size: 384
    num_hidden_layers: 2
    num_attention_heads: 4
    num_key_value_heads: 4
    max_position_embeddings: 64
    rms_norm_eps: 1.0e-5
    rope_theta: 10000.0
    tie_word_embeddings: false
data:
  train: [$data/train.jsonl]
  eval: [$data/eval.jsonl]
  format: prompt_completion
  max_seq_len: 32
train:
  batch_size: 128
  lr: 2.0e-3
  min_lr_ratio: 0.1
  schedule: cosine
  warmup_steps: 100
  weight_decay: 0.1
  beta1: 0.9
  beta2: 0.95
  eps: 1.0e-8
  clip_grad_norm: 1.0
  max_steps: $max_steps
  log_interval: 100
eval:
  interval: 100
  batch_size: 500
  exact_match: true
  max_new_tokens: 8
checkpoint:
  interval: 0
  keep: 1
YAML
echo "C++: sftctl run --local (precision $precision, $max_steps steps) ..." >&2
"$sftctl" run --local "$out/cpp/spec.yaml" > "$out/cpp/log.txt" 2>&1 || { tail -20 "$out/cpp/log.txt" >&2; exit 1; }
$py "$src/bench/time_to_learn.py" summarize-cpp "$out/cpp/run/metrics.jsonl" > "$out/cpp-summary.json"

# 3. Python reference, same hyperparameters.
echo "Python: bench/time_to_learn.py train (precision $precision, $max_steps steps) ..." >&2
$py "$src/bench/time_to_learn.py" train --data "$data" --precision "$precision" --max-steps "$max_steps" \
  --threads "$threads" --seed "$seed" --log "$out/python-metrics.jsonl" "${foreach[@]}" > "$out/python.log"
tail -1 "$out/python.log" > "$out/python-summary.json"

echo
$py "$src/bench/time_to_learn.py" compare "$out/cpp-summary.json" "$out/python-summary.json"
echo "(raw: $out/cpp/run/metrics.jsonl, $out/python-metrics.jsonl)"
