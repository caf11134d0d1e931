#!/usr/bin/env bash
# ctest common.thread_safety_probe: tests/common/thread_safety_probe.cpp compiles cleanly under clang's
# thread-safety analysis as errors, and each of its deliberate misuses (-DSFT_PROBE_VIOLATION) is
# reported as an error naming the field or function. Usage: thread_safety_probe.sh CLANGXX SOURCE_DIR
set -uo pipefail
clangxx=$1
src=$2
flags=(-std=c++17 -I"$src" -fsyntax-only -Wthread-safety -Werror=thread-safety)
probe="$src/tests/common/thread_safety_probe.cpp"

if ! out=$("$clangxx" "${flags[@]}" "$probe" 2>&1); then
  echo "FAILED: the probe does not compile cleanly:"
  echo "$out"
  exit 1
fi
echo "ok: the probe compiles without a finding"

if out=$("$clangxx" "${flags[@]}" -DSFT_PROBE_VIOLATION "$probe" 2>&1); then
  echo "FAILED: the deliberate misuses compiled (the analysis is not seeing the annotations)"
  exit 1
fi
failed=0
for want in "error: reading variable 'balance_' requires holding mutex 'mu_'" \
            "error: calling function 'WithdrawLocked' requires holding mutex 'mu_'" \
            "error: acquiring mutex 'mu_' that is already held"; do
  if grep -qF "$want" <<<"$out"; then
    echo "ok: $want"
  else
    echo "FAILED: expected: $want"
    failed=1
  fi
done
# The unannotated predicate reads balance_ at its own line.
line=$(grep -n "changed_.Wait(&mu_, \[&\] {" "$probe" | cut -d: -f1)
if grep -q "thread_safety_probe.cpp:$line:.*error: reading variable 'balance_'" <<<"$out"; then
  echo "ok: an unannotated CondVar predicate is reported (line $line)"
else
  echo "FAILED: the unannotated predicate at line $line was not reported"
  failed=1
fi
[ $failed -eq 0 ] || echo "$out"
exit $failed
