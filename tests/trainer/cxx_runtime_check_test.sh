#!/usr/bin/env bash
# cxx_runtime_check_test.sh WRONG RIGHT JOB_YAML [SFTCTL]
#
# WRONG and RIGHT are sftctl-trainers built from the shipped main.cpp with the wheel stand-in
# (tests/trainer/wheel_standin/) loaded where a pip wheel's LibTorch sits; RIGHT is linked as
# trainer/libstdcxx_first.cmake links, WRONG without its option. Checks:
#   - WRONG refuses to start, before it reads anything, with the one message of
#     trainer/runtime/cxx_runtime_check.h (the function, the stand-in it binds to, the compiler, the
#     fix), and a non-zero exit -- for `check-runtime` and for `train` alike;
#   - RIGHT's `check-runtime` says ok and binds every checked function to libstdc++;
#   - with SFTCTL (the client, to write the job's spec.json from JOB_YAML): RIGHT trains a real job
#     that saves every 2 steps and keeps 1 (each save removes the one before), stops at step 4,
#     resumes to step 8, and leaves only checkpoint-000008 -- through the stand-in's poisoned
#     std::filesystem, which aborts if anything reaches it.
set -uo pipefail
wrong=$1 right=$2 job_yaml=$3 sftctl=${4:-}
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cxx-runtime-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

for args in "check-runtime" "train --spec $tmp/none.json"; do
  # shellcheck disable=SC2086
  out=$("$wrong" $args 2>&1)
  rc=$?
  echo "--- $(basename "$wrong") $args (exit $rc): $out"
  [ $rc -ne 0 ] || fail "$(basename "$wrong") $args exited 0"
  echo "$out" | grep -q "sftctl-trainer will not run: std::filesystem::.* binds to .*libsftctl_wheel_stdfs_standin" ||
    fail "$(basename "$wrong") $args did not refuse naming the stand-in"
  echo "$out" | grep -q "It was built with .*Fix: " || fail "the refusal names no compiler or fix"
  echo "$out" | grep -q "cannot read spec" && fail "$(basename "$wrong") read the spec before the check"
done

out=$("$right" check-runtime 2>&1)
rc=$?
echo "--- $(basename "$right") check-runtime (exit $rc):"
echo "$out"
[ $rc -eq 0 ] || fail "$(basename "$right") check-runtime exited $rc"
echo "$out" | grep -q "^ok: built with " || fail "check-runtime did not say ok"
echo "$out" | grep -q "std::filesystem::remove_all.* -> .*libstdc++" ||
  fail "remove_all does not bind to libstdc++"
! echo "$out" | grep -q "wheel_stdfs_standin" || fail "a checked function binds to the stand-in"

if [ -n "$sftctl" ]; then
  run=$tmp/run
  spec_at() {  # spec_at STEPS: the job's resolved spec, max_steps STEPS, into $tmp/spec-STEPS.json
    "$sftctl" run "$job_yaml" -o "$run" --dry-run --set train.max_steps="$1" --set checkpoint.interval=2 \
      --set checkpoint.keep=1 --set eval.interval=0 >"$tmp/spec-$1.json" 2>"$tmp/dry-run.err" ||
      { cat "$tmp/dry-run.err"; fail "sftctl run --dry-run failed"; }
  }
  spec_at 4 && spec_at 8
  for steps in 4 8; do
    if ! "$right" train --spec "$tmp/spec-$steps.json" >"$tmp/train-$steps.log" 2>&1; then
      tail -n 20 "$tmp/train-$steps.log"
      fail "the job to step $steps failed"
    fi
  done
  grep -qi "resum.*step 4\|from step 4\|checkpoint-000004" "$tmp/train-8.log" ||
    { tail -n 20 "$tmp/train-8.log"; fail "the second run did not resume from checkpoint-000004"; }
  left=$(cd "$run" && ls -d checkpoint-* 2>/dev/null | tr '\n' ' ')
  echo "--- checkpoints left: $left"
  [ "$left" = "checkpoint-000008 " ] || fail "keep: 1 should leave only checkpoint-000008, left: $left"
fi

echo "cxx_runtime_check: $fails failed"
[ $fails -eq 0 ]
