#!/usr/bin/env bash
# The stand-in for a GPU host with the newest PyTorch (LibTorch 2.13 and later require C++20):
# inside the Debian testing ("forky") root of tests/portability/forky_root.sh (LibTorch 2.14, g++ 16,
# CMake 4.3), configure the trainer-only preset with -Werror and the trainer's tests, check that
# configure chose C++20 for the trainer, build, and run the trainer tests.
#
# Usage: tests/portability/forky_trainer_check.sh [--compile-only]   (root or sudo; the root is made
# when missing). --compile-only (or SFTCTL_FORKY_COMPILE_ONLY=1) stops after the build.
# The source is copied into ROOT/work/src by content (as trixie_trainer_check.sh does) and the build
# folder (ROOT/work/build-trainer) and ccache (ROOT/var/cache/sftctl-ccache) stay in the root, so a
# second run rebuilds only what changed. Logs: ROOT/work/{configure,build,ctest}.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
compile_only=${SFTCTL_FORKY_COMPILE_ONLY:-0}
[ "${1:-}" != "--compile-only" ] || compile_only=1
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
ROOT=$(bash tests/portability/forky_root.sh | tail -n 1)
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
  echo "forky_trainer_check: $* ($(date +%H:%M:%S))"
}
done_phase() { summary+=("$(printf '%-44s %5d s  %s' "$1" $((SECONDS - t_phase)) "${2:-ok}")"); }
fail() {
  done_phase "$1" FAILED
  printf '%s\n' "forky_trainer_check summary:" "${summary[@]}" >&2
  echo "forky_trainer_check: FAILED: $2" >&2
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
# Tracked and untracked (not ignored) files, by content, without times (see trixie_trainer_check.sh).
{ git ls-files -co --exclude-standard -z 2>/dev/null ||
  find . -path ./build -prune -o -path ./.git -prune -o -type f -printf '%P\0'; } |
  { grep -zv '^bench/gpu/deps/' || true; } |
  $SUDO rsync -rl --checksum --ignore-missing-args --from0 --files-from=- ./ "$ROOT$WORK/"
# Debian's LibTorch uses OpenBLAS; its pthread flavour under LibTorch's OpenMP is ~30x slower.
for alt in libblas.so.3 liblapack.so.3 libopenblas.so.0; do
  target=/usr/lib/x86_64-linux-gnu/openblas-openmp/$alt
  if [ -e "$ROOT$target" ]; then in_root update-alternatives --set "$alt-x86_64-linux-gnu" "$target" >/dev/null; fi
done
done_phase "copy source"

phase "configure: trainer-only preset, -Werror, tests on"
tests=ON
[ "$compile_only" = 1 ] && tests=OFF
in_root bash -c "cd $WORK && cmake --preset trainer-only -B $BUILD -DSFTCTL_BUILD_TESTS=$tests -DSFTCTL_WERROR=ON \
  -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache" \
  >"$LOGS/configure.log" 2>&1 || { tail -n 40 "$LOGS/configure.log"; fail "configure" "configure failed"; }
line=$(grep -E 'sftctl: LibTorch' "$LOGS/configure.log" | tail -n 1 || true)
echo "  ${line#-- }"
# The check proves the C++20 path only while the root's LibTorch needs it.
echo "$line" | grep -q 'C++20' ||
  fail "configure" "configure did not choose C++20 for the trainer (${line#-- }); LibTorch 2.13+ needs it"
done_phase "configure (${line#-- sftctl: })"

phase "build (-j$jobs, -Werror, C++20)"
in_root cmake --build "$BUILD" -j "$jobs" >"$LOGS/build.log" 2>&1 ||
  { grep -E 'error|warning' "$LOGS/build.log" | head -n 40; tail -n 20 "$LOGS/build.log"
    fail "build" "build failed (LibTorch 2.13+, C++20, -Werror)"; }
in_root "$BUILD/bin/sftctl-trainer" --help >/dev/null 2>&1 || fail "build" "sftctl-trainer --help failed"
done_phase "build ($(grep -c 'Building CXX' "$LOGS/build.log" || true) objects compiled; ccache: $(in_root ccache -s 2>/dev/null | grep -iE '^ *hits' | head -n 1 | tr -s ' ' || true))"

if [ "$compile_only" != 1 ]; then
  phase "trainer tests (ctest -L trainer)"
  in_root bash -c "cd $BUILD && ctest -L trainer -j $jobs --output-on-failure --timeout 900" \
    >"$LOGS/ctest.log" 2>&1 || { tail -n 60 "$LOGS/ctest.log"; fail "ctest -L trainer" "trainer tests failed"; }
  passed=$(grep -E "tests passed" "$LOGS/ctest.log" | tail -n 1 || true)
  skipped=$(grep -c '\*\*\*Skipped' "$LOGS/ctest.log" || true)
  done_phase "ctest -L trainer" "$passed; $skipped skipped"
fi

printf '%s\n' "forky_trainer_check summary ($(in_root g++ -dumpfullversion), $jobs cores):" "${summary[@]}"
echo "forky_trainer_check: passed in $SECONDS s"
