#!/usr/bin/env bash
# Peak memory of one LoRA step (r 16, all seven projections) at seq 2048 for Qwen2.5-0.5B- and
# 1.5B-shaped models, three settings each, beside the trainer's estimate; one process per setting,
# run one after another (each refuses, printing its estimate, when that exceeds 90% of MemAvailable).
# Usage: bench/memory/run.sh BUILD_DIR [models, default "0.5b 1.5b"] [memory_bench options]
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR [models] [options]}
models=${2:-0.5b 1.5b}
shift $(( $# >= 2 ? 2 : 1 ))
bin="$build/bin/memory_bench"
lines=()
for model in $models; do
  lines+=("$("$bin" --model "$model" --checkpointing 0 --loss-chunk -1 --base fp32 "$@")")
  lines+=("$("$bin" --model "$model" --checkpointing 1 --loss-chunk 0 --base fp32 "$@")")
  lines+=("$("$bin" --model "$model" --checkpointing 1 --loss-chunk 0 --base bf16 "$@")")
done
python3 - "${lines[@]}" <<'PY'
import json, sys
rows = [json.loads(a) for a in sys.argv[1:]]
r0 = rows[0]
print(f"one LoRA step (r 16, all projections), CPU {r0['precision']}, batch {r0['batch']} x seq {r0['seq']}, "
      "random-init Qwen2.5 shapes; peak RSS of the step (VmHWM after clear_refs) vs the estimate")
head = f"{'model':6}{'setting':34}{'estimate GiB':>14}{'peak GiB':>10}{'peak/est':>10}{'build peak':>12}{'s/step':>9}"
print(head)
for r in rows:
    setting = ("checkpointing" if r["checkpointing"] else "no checkpointing") + \
              (f" + CE chunks of {r['loss_chunk_tokens']}" if r["loss_chunk_tokens"] < r["seq"] else " + unchunked CE") + \
              (" + bf16 base" if r["base"] == "bf16" else "")
    if "skipped" in r:
        print(f"{r['model']:6}{setting:34}{r['estimate_gib']:>14.2f}{'skipped: ' + r['skipped']:>40}")
        continue
    peak = r.get("step_peak_gib", r.get("process_peak_gib"))
    print(f"{r['model']:6}{setting:34}{r['estimate_gib']:>14.2f}{peak:>10.2f}{peak / r['estimate_gib']:>10.2f}"
          f"{r['build_peak_gib']:>12.2f}{r['s_per_step']:>9.1f}")
PY
