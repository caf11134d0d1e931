#!/usr/bin/env bash
# The stand-in for a Linux GPU host whose PyTorch is a CUDA wheel: inside the Debian 13 root of
# tests/portability/trixie_root.sh (CUDA LibTorch 2.6, NCCL, the CUDA toolkit, no GPU, no gloo
# headers, no OpenSSL headers), configure the trainer-only preset with -Werror and the trainer's
# tests (configure must compile the NCCL process group in), build -- the CUDA and NCCL code paths
# included --, run the tests on the CPU (the LibTorch 2.x code paths: c10d Backend, SDPA with
# SFTCTL_NO_FUSED=1, the device-generic autocast API), and check
#   - the root is wheel-like (no gloo, OpenSSL, yaml-cpp or gRPC headers);
#   - without a GPU, `device: cuda` and an NCCL process group fail at once with a clear error;
#   - sftctl-trainer links no compiled C++ library but LibTorch (no libfmt/libspdlog);
#   - every trainer and common source compiles with -D_GLIBCXX_USE_CXX11_ABI=0 (pip wheels before
#     torch 2.7), with the build's own flags (-fsyntax-only: the objects could not be linked
#     against the root's LibTorch, which uses the new ABI).
# Multi-rank CPU tests skip there (no Gloo); the clear error that replaces them is tested.
#
# Usage: tests/portability/trixie_trainer_check.sh   (root or sudo; the root is made when missing)
# The source is copied into ROOT/work/src by content and the build folder (ROOT/work/build-trainer)
# stays in the root, compiled through the shared ccache, so a second run rebuilds only what changed
# (tests/portability/debian_root_lib.sh: check_enter, copy_source).
# Logs: ROOT/work/{configure,build,ctest,cuda-errors,ctest-sdpa,abi0}.log. Exits non-zero on any failure.
set -euo pipefail
NAME=trixie_trainer_check
# shellcheck source=tests/portability/debian_root_lib.sh
. "$(dirname "$0")/debian_root_lib.sh"
# The same layout as a bootstrapped host's ~/.local/share/sftctl/{src,build-trainer}
# (deploy/host/sftctl-host.sh), so ccache (base dir /work there, ~/.local/share/sftctl on the host)
# sees the same relative paths and the fresh-host test's trainer build hits this one's cache.
BUILD=/work/build-trainer
check_enter tests/portability/trixie_root.sh

phase "copying the source into $ROOT$WORK"
copy_source
done_phase "copy source"

phase "the root is wheel-like"
for h in gloo/algorithm.h openssl/evp.h yaml-cpp/yaml.h grpcpp/grpcpp.h; do
  [ ! -e "$ROOT/usr/include/$h" ] || check_fail "root is wheel-like" "the root has /usr/include/$h: it no longer stands in for a pip wheel"
done
select_openblas_openmp
done_phase "root is wheel-like (no gloo/OpenSSL/yaml/gRPC)"

phase "configure: trainer-only preset, -Werror, tests on"
in_root bash -c "cd $WORK && cmake --preset trainer-only -B $BUILD -DSFTCTL_BUILD_TESTS=ON -DSFTCTL_WERROR=ON \
  -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache" \
  >"$LOGS/configure.log" 2>&1 || { tail -n 40 "$LOGS/configure.log"; check_fail "configure" "configure failed"; }
grep -E '^-- sftctl:|sftctl:' "$LOGS/configure.log" || true
grep -q 'sftctl: NCCL process groups on' "$LOGS/configure.log" ||
  check_fail "configure" "configure did not say 'NCCL process groups on' (CUDA LibTorch + libnccl-dev): the NCCL code is not compiled"
# The fused CUDA kernels (trainer/model/kernels/) compile here with nvcc, -Werror, for sm_80 and sm_90.
grep -q 'sftctl: fused CUDA kernels on' "$LOGS/configure.log" ||
  check_fail "configure" "configure did not say 'fused CUDA kernels on' (CUDA LibTorch + nvcc): the kernels are not compiled"
done_phase "configure (trainer-only preset, NCCL and CUDA kernels on)"

phase "build (-j$jobs, -Werror, CUDA LibTorch 2.6)"
in_root cmake --build "$BUILD" -j "$jobs" >"$LOGS/build.log" 2>&1 ||
  { grep -E 'error|warning' "$LOGS/build.log" | head -n 40; tail -n 20 "$LOGS/build.log"
    check_fail "build" "build failed (CUDA LibTorch 2.6, -Werror)"; }
done_phase "build ($(grep -c 'Building CXX' "$LOGS/build.log" || true) objects compiled; ccache: $(in_root ccache -s 2>/dev/null | grep -iE '^ *hits' | head -n 1 | tr -s ' ' || true))"

phase "no compiled C++ library but LibTorch in sftctl-trainer"
# The libraries sftctl-trainer itself asks for (NEEDED), not ldd's transitive list: Debian's own
# libtorch links libfmt and libprotobuf, a pip wheel bundles what it needs; what matters is that
# nothing of ours pulls in a C++ library built with another ABI than LibTorch's.
needed=$(in_root readelf -d "$BUILD/bin/sftctl-trainer" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
[ -n "$needed" ] || check_fail "NEEDED of sftctl-trainer" "readelf printed no NEEDED entries"
if echo "$needed" | grep -E 'libfmt|libspdlog|libyaml-cpp|libssl|libcrypto|libgrpc|libprotobuf|libabsl'; then
  check_fail "NEEDED of sftctl-trainer" "sftctl-trainer links a compiled C++ library it must not (ABI-sensitive)"
fi
echo "  NEEDED: $(echo "$needed" | tr '\n' ' ')"
done_phase "NEEDED: no libfmt/libspdlog/libssl/libyaml"

phase "trainer tests (ctest -L trainer)"
in_root bash -c "cd $BUILD && ctest -L trainer -j $jobs --output-on-failure --timeout 900" \
  >"$LOGS/ctest.log" 2>&1 || { tail -n 60 "$LOGS/ctest.log"; check_fail "ctest -L trainer" "trainer tests failed"; }
passed=$(grep -E "tests passed" "$LOGS/ctest.log" | tail -n 1 || true)
skipped=$(grep -c '\*\*\*Skipped' "$LOGS/ctest.log" || true)
grep -E '\*\*\*Skipped' "$LOGS/ctest.log" | sed -n '1,20s/^/  /p'  # (sed reads to the end: a reader that stops early fails the pipe under pipefail)
done_phase "ctest -L trainer" "$passed; $skipped skipped"

phase "CUDA without a GPU: clear errors"
# The real trainer with `device: cuda` (a tiny spec from bench/gpu/hf_train.py, which needs no torch
# to write one): a non-zero exit naming the field, not a crash inside LibTorch.
in_root bash -c "rm -rf /tmp/cuda-spec && mkdir -p /tmp/cuda-spec && python3 $WORK/bench/gpu/hf_train.py --tiny --device cuda --batch 2 \
  --seq 32 --steps 2 --write-spec /tmp/cuda-spec --trainer-out /tmp/cuda-spec/run >/tmp/cuda-spec/spec.json &&
  ! $BUILD/bin/sftctl-trainer train --spec /tmp/cuda-spec/spec.json" >"$LOGS/cuda-errors.log" 2>&1 ||
  { tail -n 20 "$LOGS/cuda-errors.log"; check_fail "device: cuda" "sftctl-trainer with device: cuda did not fail (no GPU here)"; }
grep -q "field 'device': 'cuda' requested but CUDA is not available" "$LOGS/cuda-errors.log" ||
  { tail -n 20 "$LOGS/cuda-errors.log"; check_fail "device: cuda" "device: cuda failed without the clear error"; }
# Joining an NCCL process group (built in, see configure) without a GPU: the tests' own check, which
# must run here (not skip).
nccl_bin=$(in_root bash -c "cd $BUILD/bin && grep -l NcclWithoutGpu -- *_test; true" | head -n 1)
[ -n "$nccl_bin" ] || check_fail "NCCL without a GPU" "no test binary has NcclWithoutGpu.* (tests/trainer)"
in_root "$BUILD/bin/$nccl_bin" --gtest_filter='NcclWithoutGpu.*' >>"$LOGS/cuda-errors.log" 2>&1 ||
  { tail -n 20 "$LOGS/cuda-errors.log"; check_fail "NCCL without a GPU" "$nccl_bin --gtest_filter=NcclWithoutGpu.* failed"; }
! grep -q '\[  SKIPPED \]' "$LOGS/cuda-errors.log" ||
  check_fail "NCCL without a GPU" "NcclWithoutGpu.* skipped in the CUDA build (the NCCL path was not checked)"
done_phase "device: cuda / NCCL group without a GPU" "clear errors"

phase "the SDPA path (SFTCTL_NO_FUSED=1): HF parity, LoRA and packed training"
in_root bash -c "cd $BUILD && SFTCTL_NO_FUSED=1 ctest -L trainer -R 'HfParity|Lora\.|Packing\.|GradAccumulation' \
  -j $jobs --output-on-failure --timeout 900" >"$LOGS/ctest-sdpa.log" 2>&1 ||
  { tail -n 60 "$LOGS/ctest-sdpa.log"; check_fail "SDPA path" "SDPA-path tests failed"; }
done_phase "SFTCTL_NO_FUSED=1 ctest" "$(grep -E 'tests passed' "$LOGS/ctest-sdpa.log" | tail -n 1)"

phase "trainer and common sources with -D_GLIBCXX_USE_CXX11_ABI=0 (-fsyntax-only)"
# The trainer's unity batches (trainer/unity/TARGET/unity_N.cpp) hold most trainer sources. The CUDA
# kernels (.cu, nvcc) are left out: they take no C++ library type across their interface
# (trainer/model/kernels/cuda_kernels.h), and nvcc has no -fsyntax-only.
in_root python3 "$WORK/tests/portability/syntax_check.py" "$BUILD/compile_commands.json" --jobs "$jobs" \
  --only "^$WORK/(trainer|common)/|/trainer/unity/sftctl_trainer[a-z_]*/" --skip '\.cu$' \
  --drop=-D_GLIBCXX_USE_CXX11_ABI --add=-D_GLIBCXX_USE_CXX11_ABI=0 --label "ABI=0 trainer/common" \
  --stamps "$BUILD/abi0-stamps.json" \
  >"$LOGS/abi0.log" 2>&1 ||
  { tail -n 40 "$LOGS/abi0.log"; check_fail "ABI=0 compile" "a source does not compile with the old C++ ABI"; }
done_phase "-D_GLIBCXX_USE_CXX11_ABI=0 -fsyntax-only" "$(tail -n 1 "$LOGS/abi0.log")"

check_summary "CUDA LibTorch 2.6 without a GPU, Debian 13, $jobs cores"
