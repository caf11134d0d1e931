#!/usr/bin/env bash
# The stand-in for a GPU host with the newest PyTorch (LibTorch 2.13 and later require C++20):
# inside the Debian testing ("forky") root of tests/portability/forky_root.sh (LibTorch 2.14, g++ 16,
# CMake 4.3), configure the trainer-only preset with -Werror and the trainer's tests, check that
# configure chose C++20 for the trainer, and then (the default, CI's) prove that every trainer
# translation unit compiles and the trainer links, at the cost of a few compiles:
#   - build sftctl-trainer (every trainer source, the preset's -O3, -Werror, C++20) and link it;
#   - build and run two trainer tests whose code paths LibTorch 2.14 changed: distributed_test (the
#     gradient buckets' hooks on grad accumulators, the TCPStore without libuv, Gloo across two
#     ranks of the real trainer) and activation_checkpoint_test (autograd nodes owned by
#     intrusive_ptr);
#   - compile every other trainer test source at syntax level (-fsyntax-only with the build's own
#     flags, -Werror included: tests/portability/syntax_check.py);
#   - parity with the real transformers package (the root's python3-transformers 5): every model
#     family built, saved and run by transformers (tests/reference/transformers_reference.py),
#     loaded and compared by transformers_parity_test, which saves each model and a LoRA adapter
#     of it for transformers to load (the same logits, bit for bit; the adapter by PEFT's names);
#   - llama.cpp (the root's llama.cpp-tools) loads sftctl's GGUF export of every family it knows and
#     answers 20 prompts greedily as `sftctl-trainer generate` does (tests/reference/llama_cpp_greedy.sh).
# --full (or SFTCTL_FORKY_FULL=1) builds everything instead and runs every trainer test (ctest -L
# trainer), the HF parity ones and transformers_parity_test included.
#
# Usage: tests/portability/forky_trainer_check.sh [--full]   (root or sudo; the root is made when
# missing). The source is copied into ROOT/work/src by content and the build folder
# (ROOT/work/build-trainer) stays in the root, compiled through the shared ccache, so a second run
# rebuilds only what changed (tests/portability/debian_root_lib.sh). Logs:
# ROOT/work/{configure,build,syntax,tests,ctest}.log.
set -euo pipefail
NAME=forky_trainer_check
# shellcheck source=tests/portability/debian_root_lib.sh
. "$(dirname "$0")/debian_root_lib.sh"
full=${SFTCTL_FORKY_FULL:-0}
case "${1:-}" in
  "") ;;
  --full) full=1 ;;
  *) echo "usage: forky_trainer_check.sh [--full]" >&2; exit 2 ;;
esac
BUILD=/work/build-trainer
# The tests built and run in the default mode (tests/trainer/<name>.cpp each).
RUN_TESTS=(distributed_test activation_checkpoint_test)
# Built in full and run after their reference is made (the phases below).
REFERENCE_TESTS=(transformers_parity_test)
check_enter tests/portability/forky_root.sh

phase "copying the source into $ROOT$WORK"
copy_source
select_openblas_openmp
done_phase "copy source"

phase "configure: trainer-only preset, -Werror, tests on"
# -O1, not the preset's -O3 (but for fused_ops.cpp, which sets its own): what this check proves is that
# the code compiles as C++20 against LibTorch 2.14 and runs, and -O1 compiles the trainer's unity
# batches in about half the time (--full keeps -O3).
# (Both set, so that the build folder's cache never keeps the other's.)
opt=("-DCMAKE_CXX_FLAGS_RELEASE='-O1 -DNDEBUG'")
[ "$full" = 0 ] || opt=("-DCMAKE_CXX_FLAGS_RELEASE='-O3 -DNDEBUG'")
in_root bash -c "cd $WORK && cmake --preset trainer-only -B $BUILD -DSFTCTL_BUILD_TESTS=ON -DSFTCTL_WERROR=ON \
  -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache ${opt[*]}" \
  >"$LOGS/configure.log" 2>&1 || { tail -n 40 "$LOGS/configure.log"; check_fail "configure" "configure failed"; }
line=$(grep -E 'sftctl: LibTorch' "$LOGS/configure.log" | tail -n 1 || true)
echo "  ${line#-- }"
# The check proves the C++20 path only while the root's LibTorch needs it.
echo "$line" | grep -q 'C++20' ||
  check_fail "configure" "configure did not choose C++20 for the trainer (${line#-- }); LibTorch 2.13+ needs it"
done_phase "configure (${line#-- sftctl: })"

# build_targets WHAT TARGET...: builds TARGETs (all when none), -Werror, into build.log.
build_targets() {
  local what=$1 targets=()
  shift
  [ $# -eq 0 ] || targets=(--target "$@")
  phase "build $what (-j$jobs, -Werror, C++20)"
  in_root cmake --build "$BUILD" -j "$jobs" "${targets[@]}" >"$LOGS/build.log" 2>&1 ||
    { grep -E 'error|warning' "$LOGS/build.log" | head -n 40; tail -n 20 "$LOGS/build.log"
      check_fail "build" "build failed (LibTorch 2.13+, C++20, -Werror)"; }
  in_root "$BUILD/bin/sftctl-trainer" --help >/dev/null 2>&1 || check_fail "build" "sftctl-trainer --help failed"
  done_phase "build $what ($(grep -c 'Building CXX' "$LOGS/build.log" || true) compiles)"
}

if [ "$full" = 1 ]; then
  build_targets "everything"
  phase "trainer tests (ctest -L trainer)"
  in_root bash -c "cd $BUILD && ctest -L trainer -j $jobs --output-on-failure --timeout 900" \
    >"$LOGS/ctest.log" 2>&1 || { tail -n 60 "$LOGS/ctest.log"; check_fail "ctest -L trainer" "trainer tests failed"; }
  passed=$(grep -E "tests passed" "$LOGS/ctest.log" | tail -n 1 || true)
  skipped=$(grep -c '\*\*\*Skipped' "$LOGS/ctest.log" || true)
  done_phase "ctest -L trainer" "$passed; $skipped skipped"
else
  build_targets "sftctl-trainer, ${RUN_TESTS[*]} ${REFERENCE_TESTS[*]}" sftctl-trainer "${RUN_TESTS[@]}" \
    "${REFERENCE_TESTS[@]}"

  phase "the other trainer test sources (-fsyntax-only, -Werror)"
  skip=$(IFS='|'; echo "/tests/trainer/(${RUN_TESTS[*]}|${REFERENCE_TESTS[*]})\.cpp$")
  in_root python3 "$WORK/tests/portability/syntax_check.py" "$BUILD/compile_commands.json" --jobs "$jobs" \
    --only "^$WORK/tests/" --skip "$skip" --label "test sources" --stamps "$BUILD/syntax-stamps.json" \
    >"$LOGS/syntax.log" 2>&1 ||
    { tail -n 40 "$LOGS/syntax.log"; check_fail "-fsyntax-only" "a test source does not compile (LibTorch 2.13+, C++20)"; }
  done_phase "-fsyntax-only" "$(tail -n 1 "$LOGS/syntax.log")"

  phase "run ${RUN_TESTS[*]}"
  : >"$LOGS/tests.log"
  for t in "${RUN_TESTS[@]}"; do
    in_root timeout 600 "$BUILD/bin/$t" >>"$LOGS/tests.log" 2>&1 ||
      { grep -E '^\[  FAILED|Failure' "$LOGS/tests.log" | head -n 40; tail -n 30 "$LOGS/tests.log"
        check_fail "run tests" "$t failed against LibTorch 2.13+"; }
  done
  ran=$(grep -E '^\[  PASSED  \]' "$LOGS/tests.log" | sed 's/.*PASSED  \] //; s/\.$//' | paste -sd, - | sed 's/,/, /g')
  # The root has gloo's headers: the multi-rank CPU tests must run, not skip.
  ! grep -q 'built without Gloo' "$LOGS/tests.log" ||
    check_fail "run tests" "the trainer was built without Gloo (libgloo-dev is in the root): the Gloo path is unchecked"
  done_phase "run ${RUN_TESTS[*]}" "passed: $ran"
fi

phase "parity with transformers (the root's python3-transformers)"
# (Never passes by skipping: the root's packages include transformers.)
tref=$BUILD/transformers-reference
in_root python3 "$WORK/tests/reference/transformers_reference.py" --out "$tref" >"$LOGS/transformers.log" 2>&1 ||
  { tail -n 30 "$LOGS/transformers.log"; check_fail "transformers reference" "transformers_reference.py failed"; }
in_root env SFTCTL_TRANSFORMERS_REFERENCE="$tref" timeout 600 "$BUILD/bin/transformers_parity_test" \
  >>"$LOGS/transformers.log" 2>&1 ||
  { grep -E '^\[  FAILED|Failure|\[transformers\]' "$LOGS/transformers.log" | head -n 40
    check_fail "transformers parity" "sftctl's logits or loss differ from transformers'"; }
# And back: transformers loads what the test saved of each family, with the same logits, and each
# family's LoRA adapter applies to transformers' modules by its PEFT key names.
in_root python3 "$WORK/tests/reference/transformers_reference.py" --out "$tref" --check-saved \
  >>"$LOGS/transformers.log" 2>&1 ||
  { grep -E 'sftctl.s save|check-saved' "$LOGS/transformers.log" | tail -n 15
    check_fail "transformers loads sftctl's save" "transformers cannot load what sftctl saved"; }
done_phase "parity with $(grep -m 1 -E "^transformers [0-9]" "$LOGS/transformers.log" | cut -d, -f1)" \
  "$(grep -E '^\[  PASSED  \]' "$LOGS/transformers.log" | sed 's/.*PASSED  \] //; s/\.$//');\
 $(grep -c "loads sftctl's save as" "$LOGS/transformers.log") saves load back,\
 $(grep -c "LoRA adapter on transformers' modules" "$LOGS/transformers.log") LoRA adapters apply"

phase "llama.cpp answers as sftctl does on its GGUF exports (the root's llama.cpp-tools)"
in_root bash "$WORK/tests/reference/llama_cpp_greedy.sh" "$BUILD/bin/sftctl-trainer" "$BUILD/llama-cpp-greedy" \
  >"$LOGS/llama-cpp.log" 2>&1 ||
  { tail -n 30 "$LOGS/llama-cpp.log"; check_fail "llama.cpp greedy" "llama.cpp's greedy answers differ from sftctl's"; }
done_phase "llama.cpp greedy" "$(tail -n 1 "$LOGS/llama-cpp.log")"

check_summary "$(in_root g++ -dumpfullversion), ${line#-- sftctl: }, $jobs cores"
