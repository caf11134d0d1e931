#!/usr/bin/env bash
# Two NCCL ranks on GPUs 0 and 1 (called by bench/gpu/run.sh on machines with >= 2 GPUs):
#   1. a short job: both ranks exit 0 and agree on the final loss;
#   2. a long job whose rank 1 is killed (SIGKILL) after its first steps: rank 0 must exit 1
#      within distributed.timeout_s (+ margin) with the trainer's UNAVAILABLE message, not abort.
#   two_rank_nccl.sh SFTCTL_TRAINER OUT_DIR     (last line of output: a one-line verdict)
set -uo pipefail
trainer=${1:?trainer binary} out=${2:?output folder}
py=${PYTHON:-python3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$out/nccl2
rm -rf "$work" && mkdir -p "$work"
port=$((29500 + RANDOM % 2000))

spec() {  # spec(name, steps, timeout_s)
  "$py" "$here/hf_train.py" --tiny --write-spec "$work/$1-data" --trainer-out "$work/$1" --batch 4 --seq 64 \
    --steps "$2" | "$py" -c "import json,sys; s=json.load(sys.stdin); s['distributed']={'timeout_s':$3}; print(json.dumps(s))" \
    > "$work/$1.json"
}

# launch(name) -> pids in $pids
source "$here/two_ranks.sh"

spec short 10 60
launch short
rc0=0 rc1=0
wait "${pids[0]}" || rc0=$?
wait "${pids[1]}" || rc1=$?
if [[ $rc0 != 0 || $rc1 != 0 ]]; then
  tail -5 "$work"/short-rank*.log
  echo "2-rank NCCL job failed: exit codes $rc0, $rc1"
  exit 1
fi
grep -q '"backend"\|nccl' "$work/short-rank0.log" || echo "note: rank 0's log does not name nccl"

timeout_s=20
spec long 100000 $timeout_s
launch long
# Kill rank 1 once rank 0 has logged a few steps.
for _ in $(seq 1 600); do
  [[ $(grep -c '"event": *"step"' "$work/long/metrics.jsonl" 2>/dev/null || echo 0) -ge 3 ]] && break
  sleep 0.5
done
kill -9 "${pids[1]}"
t0=$SECONDS
rc0=0
wait "${pids[0]}" || rc0=$?
took=$((SECONDS - t0))
if [[ $rc0 == 1 && $took -le $((timeout_s + 30)) ]] && grep -q "collective .* failed after" "$work/long-rank0.log"; then
  echo "2 ranks ok; killed peer: rank 0 exited 1 after ${took} s: $(grep -m1 -o 'collective .*' "$work/long-rank0.log" | cut -c1-100)"
else
  tail -5 "$work/long-rank0.log"
  echo "killed peer: rank 0 exited $rc0 after ${took} s (expected 1 within $((timeout_s + 30)) s with the UNAVAILABLE message)"
  exit 1
fi
