#!/usr/bin/env bash
# check.sh SOURCE_DIR BUILD_DIR: the stand-in for a GPU image whose compiler has only a static
# libstdc++ (CXX=/opt/gcc/bin/g++ there; ../shared/notes/gpu-image.md), where the trainer crashed at
# its first checkpoint rotation (issue 46).
#   1. make_toolchain.sh makes such a compiler from the system GCC (BUILD_DIR/static-libstdcxx/gcc);
#   2. the trainer-only preset with the trainer's tests is configured with it (configure must say
#      "libstdc++ static only") and the trainer with the test executables below built: each links
#      the wheel stand-in (tests/trainer/wheel_standin/) in LibTorch's place, and gtest's discovery
#      runs each at build time -- the step that aborted on the GPU image;
#   3. sftctl-trainer and a test executable name libstdc++ ahead of LibTorch
#      (needed_order_check.sh), the wheel stand-in's tests pass (a checkpoint save, rotation and
#      exact resume through the poisoned std::filesystem), and cxx_runtime_check_test.sh runs a real
#      save / rotate / resume job with the stand-in trainer, BUILD_DIR's sftctl writing its spec, and
#      sees the wrongly linked trainer refuse to start.
# Compiles through the project's ccache launcher: the copied compiler keeps the real one's size, time
# and name, and the launcher's CCACHE_BASEDIR (CMakeLists.txt) makes every path under the source
# relative to the build folder; the build goes beside BUILD_DIR (BUILD_DIR/../static-libstdcxx, as
# deep as BUILD_DIR), so its compile lines are the main build's word for word and the trainer's
# objects come from the cache (the few tests built here, which use the precompiled LibTorch header,
# still compile: ccache does not yet serve those across builds, docs/portability.md).
# Logs under BUILD_DIR/static-libstdcxx/. Exits non-zero on any failure.
set -uo pipefail
src=$(cd "$1" && pwd) main_build=$(cd "$2" && pwd)
work=$main_build/static-libstdcxx
build=$(dirname "$main_build")/static-libstdcxx
mkdir -p "$work"
step() { echo "=== static-libstdcxx: $*"; }
die() { echo "FAIL: $*"; exit 1; }

step "a compiler whose libstdc++ is static only"
cxx=$(bash "$src/tests/trainer/static_libstdcxx/make_toolchain.sh" "$work/gcc") || die "make_toolchain.sh failed"
echo "$cxx -print-file-name=libstdc++.so: $("$cxx" -print-file-name=libstdc++.so)"
echo "$cxx -print-file-name=libstdc++.so.6: $("$cxx" -print-file-name=libstdc++.so.6)"

step "configure (trainer-only preset, tests on, CXX=$cxx)"
(cd "$src" && cmake --preset trainer-only -B "$build" -DSFTCTL_BUILD_TESTS=ON \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$(dirname "$cxx")/cc") >"$work/configure.log" 2>&1 ||
  { tail -n 30 "$work/configure.log"; die "configure failed"; }
grep -E 'sftctl: executables that link LibTorch' "$work/configure.log"
grep -q 'libstdc++ static only' "$work/configure.log" ||
  die "configure did not see a static-only libstdc++: the stand-in does not stand in"

# The executables this check runs, and the two test executables whose gtest discovery aborted on the
# GPU image (fused_ops_test, data_test). Every other trainer test links by the same rule
# (trainer/libstdcxx_first.cmake) and runs with the wheel stand-in in the main suite already.
targets=(sftctl-trainer sftctl_trainer_wheel_standin sftctl_trainer_libstdcxx_last wheel_abi_test
  fused_ops_test data_test)
step "build (${targets[*]}; gtest discovery runs each test with the wheel stand-in)"
start=$(date +%s)
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >"$work/build.log" 2>&1 ||
  { grep -E 'error|poisoned|FAILED' "$work/build.log" | head -n 20; tail -n 15 "$work/build.log"; die "build failed"; }
echo "built in $(($(date +%s) - start)) s"

step "libstdc++ ahead of LibTorch"
bash "$src/tests/trainer/needed_order_check.sh" "$build/bin/sftctl-trainer" "$build/bin/wheel_abi_test" \
  "$build/bin/sftctl_trainer_wheel_standin" || die "a binary names LibTorch or the stand-in first"

step "the wheel stand-in's tests"
ctest --test-dir "$build" -R '^WheelStandIn\.' --output-on-failure >"$work/ctest.log" 2>&1 ||
  { tail -n 40 "$work/ctest.log"; die "the wheel stand-in's tests failed"; }
grep -E 'tests passed|tests failed' "$work/ctest.log"
grep -qE '100% tests passed, 0 tests failed out of [1-9]' "$work/ctest.log" || die "no WheelStandIn test ran"

step "start-up check and a save / rotate / resume job"
sftctl=$main_build/bin/sftctl
[ -x "$sftctl" ] || die "$sftctl is not built (it writes the job's spec)"
TMPDIR=$work bash "$src/tests/trainer/cxx_runtime_check_test.sh" "$build/bin/sftctl_trainer_libstdcxx_last" \
  "$build/bin/sftctl_trainer_wheel_standin" "$src/examples/job.yaml" "$sftctl" || die "cxx_runtime_check_test.sh failed"
echo "static-libstdcxx: ok"
