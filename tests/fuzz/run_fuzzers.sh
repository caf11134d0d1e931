#!/usr/bin/env bash
# Builds the libFuzzer targets and sftd + sftctl (the `fuzz` preset, in build/fuzz: clang, ASan/UBSan,
# -Werror=thread-safety) and runs each for a short fixed
# time on a copy of its seed corpus (tests/fuzz/corpus/<name>/). Prints one line per target
# (executions, coverage, where a crash input was saved) and exits non-zero if any target found a
# crash, a leak, an input slower than SFTCTL_FUZZ_TIMEOUT, or did not run. See docs/fuzzing.md.
#
# Usage: tests/fuzz/run_fuzzers.sh [TARGET...]      (default: every tests/fuzz/*_fuzz.cpp)
# Environment:
#   SFTCTL_FUZZ_SECONDS   run time per target (default $SFTCTL_FUZZ_DEFAULT_SECONDS, else 20; ctest's
#                         fuzz.run_all sets that default to 5)
#   SFTCTL_FUZZ_TIMEOUT   seconds one input may take before it counts as a hang (default 10)
#   SFTCTL_FUZZ_JOBS      build parallelism (default: the number of cores)
#   SFTCTL_FUZZ_NO_BUILD  set to 1 to use the binaries already in build/fuzz
#   SFTCTL_FUZZ_OUT       where the working corpora, logs and crash inputs go
#                         (default build/fuzz/fuzz-runs)
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$(cd "$here/../.." && pwd)"
build="$src/build/fuzz"
seconds="${SFTCTL_FUZZ_SECONDS:-${SFTCTL_FUZZ_DEFAULT_SECONDS:-20}}"
timeout_s="${SFTCTL_FUZZ_TIMEOUT:-10}"
jobs="${SFTCTL_FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}"
out="${SFTCTL_FUZZ_OUT:-$build/fuzz-runs}"

if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  targets=()
  for f in "$here"/*_fuzz.cpp; do
    n="$(basename "$f" .cpp)"
    targets+=("${n%_fuzz}")
  done
fi

start=$SECONDS
if [ "${SFTCTL_FUZZ_NO_BUILD:-0}" != "1" ]; then
  echo "== configuring and building the fuzz preset in $build (-j$jobs)"
  mkdir -p "$build"
  (cd "$src" && cmake --preset fuzz >"$build/configure.log" 2>&1) || {
    cat "$build/configure.log"
    echo "FAILED: cmake --preset fuzz" >&2
    exit 1
  }
  # sftd and sftctl too: the preset's -Werror=thread-safety makes this build also the check that
  # every lock is taken as its header says (common/thread_annotations.h), over all of agent/ and client/.
  build_targets=(sftd sftctl)
  for t in "${targets[@]}"; do build_targets+=("${t}_fuzz"); done
  if ! cmake --build "$build" -j "$jobs" --target "${build_targets[@]}"; then
    echo "FAILED: building the fuzz targets" >&2
    exit 1
  fi
  echo "== built in $((SECONDS - start)) s"
fi

# Sanitizers: stop at the first report (UBSan otherwise prints and carries on), with stacks.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1}"

mkdir -p "$out"
failed=()
summary=()
for t in "${targets[@]}"; do
  bin="$build/bin/${t}_fuzz"
  seeds="$here/corpus/$t"
  work="$out/$t"
  rm -rf "$work"  # the previous run's corpus, log and crash inputs of this target
  mkdir -p "$work/corpus" "$work/artifacts"
  [ -d "$seeds" ] && cp -r "$seeds/." "$work/corpus/"
  log="$work/fuzz.log"
  if [ ! -x "$bin" ]; then
    summary+=("$(printf '%-16s FAILED: %s is missing' "$t" "$bin")")
    failed+=("$t")
    continue
  fi
  # -max_total_time bounds the run; -timeout flags one slow input; -rss_limit_mb a memory blow-up.
  # A target's dictionary (tests/fuzz/<name>.dict), where it has one.
  dict=()
  [ -f "$here/$t.dict" ] && dict=(-dict="$here/$t.dict")
  "$bin" "${dict[@]}" -max_total_time="$seconds" -timeout="$timeout_s" -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/" "$work/corpus" >"$log" 2>&1
  rc=$?
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  cov="$(grep -Eo 'cov: [0-9]+' "$log" | tail -1 | awk '{print $2}')"
  ft="$(grep -Eo 'ft: [0-9]+' "$log" | tail -1 | awk '{print $2}')"
  corpus_n="$(find "$work/corpus" -type f | wc -l)"
  artifact="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)"
  if [ "$rc" -eq 0 ] && [ -n "$execs" ]; then
    line="$(printf '%-16s ok      execs=%-9s cov=%-6s ft=%-6s corpus=%s' "$t" "$execs" "${cov:-?}" "${ft:-?}" "$corpus_n")"
  else
    kind="$(grep -Eo 'ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer)[^(]*' "$log" | head -1)"
    [ -z "$kind" ] && kind="$(grep -Eo 'FUZZ_CHECK\(.*|runtime error: .*|terminate called.*' "$log" | head -1)"
    line="$(printf '%-16s FAILED  execs=%-9s cov=%-6s ft=%-6s rc=%s %s; crash input: %s (log: %s)' "$t" \
      "${execs:-?}" "${cov:-?}" "${ft:-?}" "$rc" "${kind:-see log}" "${artifact:-none saved}" "$log")"
    failed+=("$t")
  fi
  echo "$line"
  summary+=("$line")
done

echo
echo "== fuzz summary (${seconds} s per target, total $((SECONDS - start)) s; logs and corpora in $out)"
printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "FAILED: ${failed[*]} (reproduce: build/fuzz/bin/<target>_fuzz <crash input>)" >&2
  exit 1
fi
echo "all ${#targets[@]} targets ran clean"
