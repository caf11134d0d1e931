#!/usr/bin/env bash
# bench/gpu/run.sh, the GPU checklist, proves itself without a GPU: inside the CUDA stand-in root of
# tests/portability/trixie_root.sh (CUDA LibTorch 2.6, NCCL, Debian's CUDA toolkit, no GPU), from a
# copy of the tree, in one `--quick` run (what a rented GPU machine runs) with an LD_PRELOAD that
# run.sh must drop, it must reach its table with
#   build  ok (NCCL compiled in)      tests  ok (on the CPU; a few with --tests: trixie_trainer_check.sh
#                                     has run them all in the same root)
#   kernels skipped (no GPU), or SKIP when SFTCTL_CUDA_KERNELS is not ON in the cache (FAIL when it
#          is ON and bin/cuda_kernels_test is missing)
#   nccl   skipped (no GPU)           train  skipped (no GPU), its save / rotate (keep 1) / resume
#                                     check run on the CPU: "resume ok"
#   hf+compile, lora, profile (--profile)   skipped (no GPU)
# and exit 0: nothing fails for a reason that is not the missing GPU; and it must write its summary
# (results/summary.txt: the table, the failing tests, the environment; under 1 MB). What this cannot
# show: the GPU rows themselves, and the pip-wheel CUDA toolkit (the root's nvcc is on PATH).
#
# Usage: tests/portability/gpu_checklist_check.sh   (root or sudo; the root is made when missing)
# The source goes to ROOT/work/src as in trixie_trainer_check.sh; run.sh builds in
# ROOT/work/build-gpu through the shared ccache (tests/portability/debian_root_lib.sh).
# Log: ROOT/work/gpu-checklist.log.
set -euo pipefail
NAME=gpu_checklist_check
# shellcheck source=tests/portability/debian_root_lib.sh
. "$(dirname "$0")/debian_root_lib.sh"
check_enter tests/portability/trixie_root.sh
LOG=$LOGS/gpu-checklist.log
copy_source

t0=$SECONDS
rc=0
in_root CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache LD_PRELOAD=libstdc++.so.6 \
  bash "$WORK/bench/gpu/run.sh" --quick --python python3 --build /work/build-gpu --jobs "$jobs" \
  --tests 'CudaPathOnTheCpu|WorkingWeights\.' --profile >"$LOG" 2>&1 || rc=$?
sed -n '/^GPU checklist:/,$p' "$LOG"
echo "gpu_checklist_check: run.sh exited $rc after $((SECONDS - t0)) s"

bad=0
expect() {  # expect PHASE REGEX: the table's row for PHASE matches REGEX
  if ! grep -qE "^$1 +$2" "$LOG"; then
    echo "gpu_checklist_check: the '$1' row is not '$2'" >&2
    bad=1
  fi
}
grep -q '^GPU checklist:' "$LOG" || { tail -n 40 "$LOG" >&2; echo "gpu_checklist_check: run.sh printed no table" >&2; exit 1; }
expect build 'ok .*NCCL compiled in: yes'
expect tests 'ok .*tests passed.*CPU: no GPU, only -R '
expect kernels '(skipped \(no GPU\) +cuda_kernels_test under compute-sanitizer|SKIP +not built: CMakeCache.txt has no SFTCTL_CUDA_KERNELS)'
expect nccl 'skipped \(no GPU\)'
expect zero 'skipped \(no GPU\)'
expect train 'skipped \(no GPU\) .*resume check ran on the CPU'
expect 'hf\+compile' 'skipped \(no GPU\) +the HF reference with torch.compile'
expect lora 'skipped \(no GPU\) +LoRA r 16, alpha 32'
expect profile "skipped \(no GPU\) +the traced runs' kernels need a GPU"
grep -qE '^ +resume ok: steps 6-10 after resuming at step 5 equal' "$LOG" ||
  { echo "gpu_checklist_check: no 'resume ok' line under the train row" >&2; bad=1; }
grep -q '^GPU checklist: .*, --quick$' "$LOG" || { echo "gpu_checklist_check: not a --quick run" >&2; bad=1; }
sum_file=$ROOT/work/build-gpu/results/summary.txt
if [ ! -f "$sum_file" ]; then
  echo "gpu_checklist_check: no $sum_file" >&2
  bad=1
else
  size=$(wc -c <"$sum_file")
  [ "$size" -lt 1000000 ] || { echo "gpu_checklist_check: summary.txt has $size bytes (1 MB at most)" >&2; bad=1; }
  for want in '^GPU checklist: ' '^build +ok' '^failing tests \(from ' '^  none$' '^environment:' \
    '^  torch +2\.6' '^  g\+\+ +g\+\+' '^  nvcc +/usr/bin/nvcc \(release 12\.4' '^  cmake +cmake version' \
    '^  preload +none \(LD_PRELOAD=libstdc\+\+\.so\.6 was set: dropped'; do
    grep -qE "$want" "$sum_file" || { echo "gpu_checklist_check: summary.txt has no line matching '$want'" >&2; bad=1; }
  done
fi
[ "$rc" -eq 0 ] || { echo "gpu_checklist_check: run.sh exited $rc" >&2; bad=1; }
[ "$bad" -eq 0 ] || { echo "gpu_checklist_check: FAILED (log: $LOG)" >&2; exit 1; }
echo "gpu_checklist_check: passed"
