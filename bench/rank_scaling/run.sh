#!/usr/bin/env bash
# Rank scaling: the ~28M model (hidden 512, 8 layers, 8 heads, intermediate 1536; the 28M config of
# bench/train_throughput.cpp) trained by sftctl-trainer as 1 rank and as 2 CPU ranks (Gloo on
# 127.0.0.1) with the same global batch (4 x 256 tokens), plus 1 rank on half the cores as the
# per-rank baseline. Prints tokens/s of each, the speed-up, the scaling efficiency and the
# all-reduce wait per step (the step records' "allreduce_s").
#
#   bench/rank_scaling/run.sh BUILD_DIR [--steps N] [--warmup N] [--precision fp32|bf16] [--threads N]
#
#   --steps N      timed steps per run after the warm-up (default 10)
#   --warmup N     untimed first steps (default 2)
#   --threads N    cores to use in all (default: all); 2 ranks get N/2 threads each
#
# Builds nothing: BUILD_DIR must contain bin/sftctl-trainer. Runs are kept under
# BUILD_DIR/bench-results/rank_scaling/. Take numbers on an otherwise idle machine.
set -euo pipefail

usage() { echo "usage: $0 BUILD_DIR [--steps N] [--warmup N] [--precision fp32|bf16] [--threads N]" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
build=$(cd "$1" && pwd); shift
steps=10 warmup=2 precision=fp32 threads=$(nproc)
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) steps=${2:?}; shift ;;
    --warmup) warmup=${2:?}; shift ;;
    --precision) precision=${2:?}; shift ;;
    --threads) threads=${2:?}; shift ;;
    *) usage ;;
  esac
  shift
done
trainer=$build/bin/sftctl-trainer
py=/usr/bin/python3
[[ -x $trainer ]] || { echo "$trainer not found: cmake --build $build --target sftctl-trainer" >&2; exit 1; }
half=$(( threads / 2 > 0 ? threads / 2 : 1 ))
out=$build/bench-results/rank_scaling
rm -rf "$out"
mkdir -p "$out"

# Data: 512 text records of 255 random lowercase bytes (+ end token = 256 tokens, all trained).
$py - "$out" <<'PY'
import json, random, sys
random.seed(0)
with open(sys.argv[1] + "/train.jsonl", "w") as f:
    for _ in range(512):
        f.write(json.dumps({"text": "".join(random.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(255))}) + "\n")
PY

# spec NAME BATCH THREADS
spec() {
  $py - "$out" "$1" "$2" "$3" "$((steps + warmup))" "$precision" <<'PY'
import json, sys
out, name, batch, threads, steps, precision = sys.argv[1:]
json.dump({
    "name": name, "output_dir": f"{out}/{name}", "resume": "never", "tokenizer": "byte",
    "precision": precision, "threads": int(threads), "seed": 1,
    "model": {"config": {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 8,
                         "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 1536,
                         "max_position_embeddings": 256}},
    "data": {"train": [f"{out}/train.jsonl"], "max_seq_len": 256},
    "train": {"batch_size": int(batch), "grad_accum": 1, "max_steps": int(steps), "lr": 1e-4,
              "log_interval": 1000},
    "checkpoint": {"interval": 0, "keep": 1},
    "distributed": {"timeout_s": 600, "bucket_mb": 25},
}, open(f"{out}/{name}.json", "w"))
PY
}

port=$(( 20000 + RANDOM % 20000 ))
echo "rank_scaling: 28M model, global batch 4 x 256 tokens, $precision, $steps timed steps after $warmup, $threads cores" >&2
spec one-all 4 "$threads"
spec one-half 4 "$half"
spec two 2 "$half"
echo "1 rank, $threads threads ..." >&2
"$trainer" train --spec "$out/one-all.json" > "$out/one-all.log" 2>&1
echo "1 rank, $half threads ..." >&2
"$trainer" train --spec "$out/one-half.json" > "$out/one-half.log" 2>&1
echo "2 ranks, $half threads each ..." >&2
export WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
RANK=1 LOCAL_RANK=1 "$trainer" train --spec "$out/two.json" > "$out/two-rank1.log" 2>&1 &
rank1=$!
RANK=0 LOCAL_RANK=0 "$trainer" train --spec "$out/two.json" > "$out/two-rank0.log" 2>&1
wait $rank1
unset WORLD_SIZE LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT

$py - "$out" "$warmup" <<'PY'
import json, sys
out, warmup = sys.argv[1], int(sys.argv[2])
def summary(name):
    steps = [r for r in map(json.loads, open(f"{out}/{name}/metrics.jsonl")) if r["event"] == "step"]
    timed = steps[warmup:]
    seconds = timed[-1]["elapsed_s"] - steps[warmup - 1]["elapsed_s"] if warmup else timed[-1]["elapsed_s"]
    tokens = sum(r["tokens"] for r in timed)
    ar = [r["allreduce_s"] for r in timed if "allreduce_s" in r]
    return tokens / seconds, seconds / len(timed), (sum(ar) / len(ar) if ar else None), timed[-1]["loss"]
rows = {n: summary(n) for n in ("one-all", "one-half", "two")}
print()
print("%-28s %10s %10s %14s %10s" % ("run", "tok/s", "s/step", "allreduce s/step", "last loss"))
labels = {"one-all": "1 rank, all cores", "one-half": "1 rank, half the cores", "two": "2 ranks, half each"}
for n, (tps, sps, ar, loss) in rows.items():
    print("%-28s %10.0f %10.3f %14s %10.4f" % (labels[n], tps, sps, "-" if ar is None else "%.3f (%.0f%%)" % (ar, 100 * ar / sps), loss))
one_all, one_half, two = rows["one-all"][0], rows["one-half"][0], rows["two"][0]
print()
print("2 ranks vs 1 rank on the same cores: %.2fx" % (two / one_all))
print("scaling efficiency (2 ranks / (2 x 1 rank on half the cores)): %.0f%%" % (100 * two / (2 * one_half)))
PY
