#!/usr/bin/env bash
# ZeRO-1/2 on two NCCL ranks (bench/gpu/run.sh's zero rows): the Qwen2.5-0.5B architecture (random
# init, bf16 autocast, batch 2 x grad_accum 2 x seq 512 per rank) trained by 2 ranks on GPUs 0 and 1
# with distributed.shard none, optimizer and gradients; rank 0's GPU peak (the largest
# gpu_mem_peak_mb of its step records, torch's allocator statistics) and step time of each sharded
# stage against none's, and its last loss against none's.
#
#   zero_ranks.sh SFTCTL_TRAINER OUT_DIR GPUS STEPS [--device cpu]
#
# GPUS: the GPUs torch sees (0: no GPU). NCCL refuses two ranks on one GPU ("Duplicate GPU
# detected"), so with fewer than 2 the rows are SKIP (0: "skipped (no GPU)") and nothing runs.
# --device cpu: the same jobs on 2 Gloo CPU ranks with a tiny model, the peak read from rss_mb
# (a check of this script on a machine without GPUs; GPUS is then only the switch above; the tiny
# model's savings are lost in the RSS, so the peak is shown, not checked).
# Output: one row per line, "PHASE<TAB>RESULT<TAB>DETAIL"; a row is FAIL when a job failed, when a
# sharded stage's peak is not below none's, or when its last loss is more than 2% from none's
# (bf16 kernels and ZeRO-2's order of additions change the last digits, not more).
set -uo pipefail
trainer=${1:?trainer binary} out=${2:?output folder} gpus=${3:?GPU count} steps=${4:?steps}
device=cuda tiny=()
[[ ${5:-} == --device ]] && { device=${6:?}; [[ $device == cpu ]] && tiny=(--tiny); }
py=${PYTHON:-python3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
no_gpu="skipped (no GPU)"

if [[ $device == cuda && $gpus -lt 2 ]]; then
  why="distributed.shard optimizer / gradients need 2 ranks; NCCL refuses two ranks on one GPU (Duplicate GPU detected)"
  if [[ $gpus -lt 1 ]]; then
    printf 'zero\t%s\t%s\n' "$no_gpu" "$why"
  else
    printf 'zero\tSKIP\t%s\n' "$gpus GPU: $why"
  fi
  exit 0
fi

work=$out/zero
rm -rf "$work" && mkdir -p "$work"
port=$((31500 + RANDOM % 2000))
source "$here/two_ranks.sh"  # launch
# The data: enough records for 2 ranks x 2 micro-batches x 2 sequences per step.
"$py" "$here/hf_train.py" "${tiny[@]}" --device "$device" --write-spec "$work/data" --trainer-out "$work/none" \
  --batch 2 --seq 512 --steps $((4 * steps)) > "$work/base.json" || { printf 'zero\tFAIL\thf_train.py --write-spec failed\n'; exit 0; }
for stage in none optimizer gradients; do
  "$py" - "$work/base.json" "$work/$stage.json" "$work/$stage" "$stage" "$steps" <<'PY'
import json, sys
base, path, run, stage, steps = sys.argv[1:]
s = json.load(open(base))
s["output_dir"] = run
s["train"].update(max_steps=int(steps), grad_accum=2)
s["distributed"] = {"shard": stage, "timeout_s": 300}
json.dump(s, open(path, "w"), indent=2)
PY
  launch "$stage"
  rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  rm -rf "$work/$stage"/checkpoint-*  # the final checkpoint: ~6 GB at 0.5B, not needed
  if [[ $rc != 0 ]]; then
    printf 'zero\tFAIL\t2-rank job with distributed.shard: %s exited %s; see %s\n' "$stage" "$rc" "$work/$stage-rank*.log"
    exit 0
  fi
done

"$py" - "$work" "$device" <<'PY'
import json, statistics, sys
work, device = sys.argv[1:]
def summary(stage):
    steps = [r for r in map(json.loads, open(f"{work}/{stage}/metrics.jsonl")) if r.get("event") == "step"]
    key = "gpu_mem_peak_mb" if device == "cuda" else "rss_mb"
    peaks = [r[key] for r in steps if key in r]
    timed = steps[min(2, len(steps) - 1):]
    return (max(peaks) if peaks else None), statistics.median(r["step_s"] for r in timed), steps[-1]["loss"]
none = summary("none")
what = "GPU peak" if device == "cuda" else "RSS (CPU check)"
for phase, stage in (("zero1", "optimizer"), ("zero2", "gradients")):
    peak, sps, loss = summary(stage)
    bad = []
    if peak is None or none[0] is None:
        bad.append("no %s in rank 0's step records" % what)
    elif device == "cuda" and peak >= none[0]:  # (the CPU check's tiny model saves nothing visible)
        bad.append("peak not below none's")
    rel = abs(loss - none[2]) / max(abs(none[2]), 1e-12)
    if rel > 0.02:
        bad.append("last loss %.4f vs none's %.4f" % (loss, none[2]))
    peak_s = "n/a" if peak is None or none[0] is None else "%.0f MiB (%.2fx none's %.0f)" % (peak, peak / none[0], none[0])
    detail = "%s: rank 0 %s %s, %.3f s/step (%.2fx), loss %.4f (none %.4f)" % (
        stage, what, peak_s, sps, sps / none[1], loss, none[2])
    if bad:
        detail += "; " + "; ".join(bad)
    print("%s\t%s\t%s" % (phase, "FAIL" if bad else "ok", detail))
PY
