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
# The source is copied into ROOT/work/sftctl-src with timestamps kept and the build folder
# (ROOT/work/sftctl-build) stays in the root, so a second run rebuilds only what changed.
# Logs: ROOT/work/{configure,build,ctest,cuda-errors,ctest-sdpa,abi0}.log. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
ROOT=$(bash tests/portability/trixie_root.sh | tail -n 1)
# The same layout as a bootstrapped host's ~/.local/share/sftctl/{src,build-trainer}
# (deploy/host/sftctl-host.sh), so ccache (base dir /work there, ~/.local/share/sftctl on the host)
# sees the same relative paths and the fresh-host test's trainer build hits this one's cache.
WORK=/work/src
BUILD=/work/build-trainer
CCACHE_ENV=(CCACHE_DIR=/var/cache/sftctl-ccache CCACHE_BASEDIR=/work CCACHE_IGNOREOPTIONS=-Werror
  CCACHE_MAXSIZE=4G)
LOGS=$ROOT/work
jobs=$(nproc 2>/dev/null || echo 2)

summary=()
t_phase=$SECONDS
phase() {
  t_phase=$SECONDS
  echo "trixie_trainer_check: $* ($(date +%H:%M:%S))"
}
done_phase() { summary+=("$(printf '%-44s %5d s  %s' "$1" $((SECONDS - t_phase)) "${2:-ok}")"); }
fail() {
  done_phase "$1" FAILED
  printf '%s\n' "trixie_trainer_check summary:" "${summary[@]}" >&2
  echo "trixie_trainer_check: FAILED: $2" >&2
  exit 1
}
cleanup() { $SUDO umount "$ROOT/proc" 2>/dev/null || true; }
trap cleanup EXIT
cleanup
$SUDO mount -t proc proc "$ROOT/proc"
in_root() {
  $SUDO chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "${CCACHE_ENV[@]}" "$@"
}

phase "copying the source into $ROOT$WORK"
$SUDO mkdir -p "$ROOT$WORK"
# Tracked and untracked (not ignored) files, as a fresh checkout of this tree would have them
# (bench/gpu/deps/ is a download of Debian packages for a GPU machine, not source). Files are
# compared by content (--checksum) and times are not copied (no -t): a file whose content is
# unchanged keeps its old time in the root even when this tree is a fresh clone (all times new),
# and a changed one gets the time of the copy, so ninja rebuilds exactly what changed.
{ git ls-files -co --exclude-standard -z 2>/dev/null ||
  find . -path ./build -prune -o -path ./.git -prune -o -type f -printf '%P\0'; } |
  { grep -zv '^bench/gpu/deps/' || true; } |
  $SUDO rsync -rl --checksum --ignore-missing-args --from0 --files-from=- ./ "$ROOT$WORK/"
done_phase "copy source"

phase "the root is wheel-like"
for h in gloo/algorithm.h openssl/evp.h yaml-cpp/yaml.h grpcpp/grpcpp.h; do
  [ ! -e "$ROOT/usr/include/$h" ] || fail "root is wheel-like" "the root has /usr/include/$h: it no longer stands in for a pip wheel"
done
# Debian's LibTorch uses OpenBLAS; its pthread flavour under LibTorch's OpenMP is ~30x slower.
for alt in libblas.so.3 liblapack.so.3 libopenblas.so.0; do
  target=/usr/lib/x86_64-linux-gnu/openblas-openmp/$alt
  if [ -e "$ROOT$target" ]; then in_root update-alternatives --set "$alt-x86_64-linux-gnu" "$target" >/dev/null; fi
done
done_phase "root is wheel-like (no gloo/OpenSSL/yaml/gRPC)"

phase "configure: trainer-only preset, -Werror, tests on"
in_root bash -c "cd $WORK && cmake --preset trainer-only -B $BUILD -DSFTCTL_BUILD_TESTS=ON -DSFTCTL_WERROR=ON \
  -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache" \
  >"$LOGS/configure.log" 2>&1 || { tail -n 40 "$LOGS/configure.log"; fail "configure" "configure failed"; }
grep -E '^-- sftctl:|sftctl:' "$LOGS/configure.log" || true
grep -q 'sftctl: NCCL process groups on' "$LOGS/configure.log" ||
  fail "configure" "configure did not say 'NCCL process groups on' (CUDA LibTorch + libnccl-dev): the NCCL code is not compiled"
done_phase "configure (trainer-only preset, NCCL on)"

phase "build (-j$jobs, -Werror, CUDA LibTorch 2.6)"
in_root cmake --build "$BUILD" -j "$jobs" >"$LOGS/build.log" 2>&1 ||
  { grep -E 'error|warning' "$LOGS/build.log" | head -n 40; tail -n 20 "$LOGS/build.log"
    fail "build" "build failed (CUDA LibTorch 2.6, -Werror)"; }
done_phase "build ($(grep -c 'Building CXX' "$LOGS/build.log" || true) objects compiled; ccache: $(in_root ccache -s 2>/dev/null | grep -iE '^ *hits' | head -n 1 | tr -s ' ' || true))"

phase "no compiled C++ library but LibTorch in sftctl-trainer"
# The libraries sftctl-trainer itself asks for (NEEDED), not ldd's transitive list: Debian's own
# libtorch links libfmt and libprotobuf, a pip wheel bundles what it needs; what matters is that
# nothing of ours pulls in a C++ library built with another ABI than LibTorch's.
needed=$(in_root readelf -d "$BUILD/bin/sftctl-trainer" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
[ -n "$needed" ] || fail "NEEDED of sftctl-trainer" "readelf printed no NEEDED entries"
if echo "$needed" | grep -E 'libfmt|libspdlog|libyaml-cpp|libssl|libcrypto|libgrpc|libprotobuf|libabsl'; then
  fail "NEEDED of sftctl-trainer" "sftctl-trainer links a compiled C++ library it must not (ABI-sensitive)"
fi
echo "  NEEDED: $(echo "$needed" | tr '\n' ' ')"
done_phase "NEEDED: no libfmt/libspdlog/libssl/libyaml"

phase "trainer tests (ctest -L trainer)"
in_root bash -c "cd $BUILD && ctest -L trainer -j $jobs --output-on-failure --timeout 900" \
  >"$LOGS/ctest.log" 2>&1 || { tail -n 60 "$LOGS/ctest.log"; fail "ctest -L trainer" "trainer tests failed"; }
passed=$(grep -E "tests passed" "$LOGS/ctest.log" | tail -n 1 || true)
skipped=$(grep -c '\*\*\*Skipped' "$LOGS/ctest.log" || true)
grep -E '\*\*\*Skipped' "$LOGS/ctest.log" | sed 's/^/  /' | head -n 20
done_phase "ctest -L trainer" "$passed; $skipped skipped"

phase "CUDA without a GPU: clear errors"
# The real trainer with `device: cuda` (a tiny spec from bench/gpu/hf_train.py, which needs no torch
# to write one): a non-zero exit naming the field, not a crash inside LibTorch.
in_root bash -c "rm -rf /tmp/cuda-spec && mkdir -p /tmp/cuda-spec && python3 $WORK/bench/gpu/hf_train.py --tiny --device cuda --batch 2 \
  --seq 32 --steps 2 --write-spec /tmp/cuda-spec --trainer-out /tmp/cuda-spec/run >/tmp/cuda-spec/spec.json &&
  ! $BUILD/bin/sftctl-trainer train --spec /tmp/cuda-spec/spec.json" >"$LOGS/cuda-errors.log" 2>&1 ||
  { tail -n 20 "$LOGS/cuda-errors.log"; fail "device: cuda" "sftctl-trainer with device: cuda did not fail (no GPU here)"; }
grep -q "field 'device': 'cuda' requested but CUDA is not available" "$LOGS/cuda-errors.log" ||
  { tail -n 20 "$LOGS/cuda-errors.log"; fail "device: cuda" "device: cuda failed without the clear error"; }
# Joining an NCCL process group (built in, see configure) without a GPU: the tests' own check, which
# must run here (not skip).
nccl_bin=$(in_root bash -c "cd $BUILD/bin && grep -l NcclWithoutGpu -- *_test; true" | head -n 1)
[ -n "$nccl_bin" ] || fail "NCCL without a GPU" "no test binary has NcclWithoutGpu.* (tests/trainer)"
in_root "$BUILD/bin/$nccl_bin" --gtest_filter='NcclWithoutGpu.*' >>"$LOGS/cuda-errors.log" 2>&1 ||
  { tail -n 20 "$LOGS/cuda-errors.log"; fail "NCCL without a GPU" "$nccl_bin --gtest_filter=NcclWithoutGpu.* failed"; }
! grep -q '\[  SKIPPED \]' "$LOGS/cuda-errors.log" ||
  fail "NCCL without a GPU" "NcclWithoutGpu.* skipped in the CUDA build (the NCCL path was not checked)"
done_phase "device: cuda / NCCL group without a GPU" "clear errors"

phase "the SDPA path (SFTCTL_NO_FUSED=1): HF parity, LoRA and packed training"
in_root bash -c "cd $BUILD && SFTCTL_NO_FUSED=1 ctest -L trainer -R 'HfParity|Lora\.|Packing\.|GradAccumulation' \
  -j $jobs --output-on-failure --timeout 900" >"$LOGS/ctest-sdpa.log" 2>&1 ||
  { tail -n 60 "$LOGS/ctest-sdpa.log"; fail "SDPA path" "SDPA-path tests failed"; }
done_phase "SFTCTL_NO_FUSED=1 ctest" "$(grep -E 'tests passed' "$LOGS/ctest-sdpa.log" | tail -n 1)"

phase "trainer and common sources with -D_GLIBCXX_USE_CXX11_ABI=0 (-fsyntax-only)"
in_root python3 - "$BUILD/compile_commands.json" "$WORK" "$jobs" >"$LOGS/abi0.log" 2>&1 <<'PY' ||
import json, shlex, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
db, src, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3])
cmds = [c for c in json.load(open(db))
        if c["file"].startswith((src + "/trainer/", src + "/common/"))]
def run(c):
    args = [a for a in shlex.split(c["command"]) if not a.startswith("-D_GLIBCXX_USE_CXX11_ABI")]
    if args and args[0].endswith("ccache"): args = args[1:]
    out = args.index("-o")
    args = args[:out] + args[out + 2:]
    args = [a for a in args if a not in ("-c", "-MD")]
    mf = args.index("-MF") if "-MF" in args else -1
    if mf >= 0: args = args[:mf] + args[mf + 2:]
    mt = args.index("-MT") if "-MT" in args else -1
    if mt >= 0: args = args[:mt] + args[mt + 2:]
    args += ["-D_GLIBCXX_USE_CXX11_ABI=0", "-fsyntax-only"]
    r = subprocess.run(args, cwd=c["directory"], capture_output=True, text=True)
    return c["file"], r.returncode, r.stderr
bad = 0
with ThreadPoolExecutor(jobs) as ex:
    for f, rc, err in ex.map(run, cmds):
        if rc != 0:
            bad += 1
            print(f"ABI=0 compile failed: {f}\n{err[:2000]}")
print(f"ABI=0: {len(cmds) - bad} of {len(cmds)} trainer/common sources compile")
sys.exit(1 if bad or not cmds else 0)
PY
  { tail -n 40 "$LOGS/abi0.log"; fail "ABI=0 compile" "a source does not compile with the old C++ ABI"; }
done_phase "-D_GLIBCXX_USE_CXX11_ABI=0 -fsyntax-only" "$(tail -n 1 "$LOGS/abi0.log")"

printf '%s\n' "trixie_trainer_check summary (CUDA LibTorch 2.6 without a GPU, Debian 13, $jobs cores):" "${summary[@]}"
echo "trixie_trainer_check: passed in $SECONDS s"
