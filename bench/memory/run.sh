#!/usr/bin/env bash
# Peak memory of one LoRA step (r 16, all seven projections) at seq 2048 for Qwen2.5-0.5B- and
# 1.5B-shaped models, three settings each, beside the trainer's estimate; one process per setting,
# run one after another (each refuses, printing its estimate, when that exceeds 90% of MemAvailable).
# Usage: bench/memory/run.sh BUILD_DIR [models, default "0.5b 1.5b"] [memory_bench options]
#        bench/memory/run.sh BUILD_DIR load   (the model load, before vs after issue 25's change:
#        random-init checkpoints of a 164M-parameter model written into a temporary folder; the
#        peak growth of the resident set while a full fine-tune (fp32) and a LoRA run (bf16 base)
#        load them, one process per row)
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR [models] [options]}
if [[ "${2:-}" == load ]]; then
  bin="$build/bin/memory_bench"
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/sftctl-memory-load-XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  "$bin" write "$tmp/fp32" fp32
  "$bin" write "$tmp/bf16" bf16
  lines=()
  for path in old new; do
    lines+=("$("$bin" load "$tmp/fp32" full "$path")")
    lines+=("$("$bin" load "$tmp/bf16" lora "$path")")
  done
  python3 - "${lines[@]}" <<'PY'
import json, sys
rows = [json.loads(a) for a in sys.argv[1:]]
by = {(r["load"], r["path"]): r for r in rows}
print(f"model load on the CPU, 164M-parameter Qwen2-shaped checkpoint (fp32 model {rows[0]['fp32_model_gib']:.2f} GiB); "
      "peak growth of the resident set during the load (VmHWM after clear_refs), GiB")
print(f"{'load':34}{'parameters':>12}{'before':>10}{'after':>10}{'after/before':>14}")
names = {"full": "full fine-tune (fp32 file)", "lora": "LoRA, bf16 base (bf16 file)"}
for kind in ("full", "lora"):
    old, new = by[(kind, "old")], by[(kind, "new")]
    key = "load_peak_growth_gib" if "load_peak_growth_gib" in new else "process_peak_gib"
    print(f"{names[kind]:34}{new['params_gib']:>12.2f}{old[key]:>10.2f}{new[key]:>10.2f}{new[key] / old[key]:>14.2f}")
PY
  exit 0
fi
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
