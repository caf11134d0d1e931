#!/usr/bin/env bash
# The stand-in for an Ubuntu 22.04 GPU host as `sftctl bootstrap` builds the agent there: inside the
# Debian 11 root of tests/portability/bullseye_root.sh (gRPC 1.30.2 with pkg-config files only,
# protobuf 3.12, fmt 7, spdlog 1.8, nlohmann-json 3.9, yaml-cpp 0.6, curl 7.74, OpenSSL 1.1, CMake
# 3.18, g++ 10), configure the agent the way deploy/host/sftctl-host.sh does where CMake reads no
# presets (its `preset-args host-agent`, which must match CMakePresets.json; plus the tests), with
# -Werror, build sftd, check what it links, and run it: `sftd --version`, then `sftd start --detach`
# and `sftd status`, whose Health RPC goes through the callback API of gRPC 1.30 (grpc::experimental,
# proto/grpc_compat.h). Then the agent's end-to-end test (every RPC against the real sftd, streams
# included) built there too.
#
# Usage: tests/portability/bullseye_agent_check.sh   (root or sudo; the root is made when missing)
#   SFTCTL_CHECK_JOBS=N   parallel compiles (default: nproc)
# The source is copied into ROOT/work/src (by content) and the build folder ROOT/work/build-agent
# stays in the root, compiled through the shared ccache, so a second run rebuilds only what changed
# (tests/portability/debian_root_lib.sh: check_enter, copy_source).
# Logs: ROOT/work/{configure,build,sftd,e2e}.log. Exits non-zero naming the failed phase.
set -euo pipefail
NAME=bullseye_agent_check
# shellcheck source=tests/portability/debian_root_lib.sh
. "$(dirname "$0")/debian_root_lib.sh"
# The layout of a bootstrapped host's ~/.local/share/sftctl/{src,build-agent}.
BUILD=/work/build-agent
DATA=/work/sftd-data
stop_sftd() {
  if [ -x "$ROOT$BUILD/bin/sftd" ]; then in_root "$BUILD/bin/sftd" stop --data-dir "$DATA" >/dev/null 2>&1 || true; fi
}
CHECK_EXIT_HOOK=stop_sftd
check_enter tests/portability/bullseye_root.sh

phase "copying the source into $ROOT$WORK"
copy_source
done_phase "copy source"

phase "the root has the old toolchain; the host script configures as CMakePresets.json says"
cmake_version=$(in_root cmake --version | head -n 1 | awk '{print $3}')
grpc_version=$(in_root pkg-config --modversion grpc++)
[ "$(printf '%s\n' 3.21 "$cmake_version" | sort -V | head -n 1)" != 3.21 ] ||
  check_fail "old toolchain" "the root's CMake $cmake_version reads presets: the no-preset path is not exercised"
if ls "$ROOT"/usr/lib/*/cmake/grpc/gRPCConfig.cmake >/dev/null 2>&1; then
  check_fail "old toolchain" "the root's gRPC has a CMake config: pkg-config discovery is not exercised"
fi
# The host script's arguments for CMake without presets name what CMakePresets.json says.
bash tests/portability/host_preset_args.sh . >"$LOGS/preset-args.log" 2>&1 ||
  { cat "$LOGS/preset-args.log"; check_fail "preset-args" "sftctl-host.sh preset-args differs from CMakePresets.json"; }
# (args: host-agent's, for the configure below)
mapfile -t args < <(bash deploy/host/sftctl-host.sh preset-args host-agent)
echo "  CMake $cmake_version, gRPC $grpc_version (pkg-config), $(in_root g++ --version | head -n 1)"
done_phase "CMake $cmake_version, gRPC $grpc_version, no presets"

phase "configure: host-agent's settings by hand, -Werror, the tests on"
in_root bash -c "cd $WORK && cmake -S . -B $BUILD ${args[*]} -DSFTCTL_WERROR=ON -DSFTCTL_BUILD_TESTS=ON \
  -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache" \
  >"$LOGS/configure.log" 2>&1 || { tail -n 40 "$LOGS/configure.log"; check_fail "configure" "configure failed"; }
grep -E 'sftctl:' "$LOGS/configure.log" || true
grep -q "gRPC $grpc_version by pkg-config" "$LOGS/configure.log" ||
  check_fail "configure" "configure did not find gRPC $grpc_version by pkg-config"
done_phase "configure (no presets, CMake $cmake_version)"

phase "build sftd and its end-to-end test (-j$jobs, -Werror, gRPC $grpc_version)"
in_root cmake --build "$BUILD" -j "$jobs" --target sftd sftd-stub-trainer agent_e2e_test >"$LOGS/build.log" 2>&1 ||
  { grep -E 'error|warning' "$LOGS/build.log" | head -n 40; tail -n 20 "$LOGS/build.log"
    check_fail "build" "building sftd failed (gRPC $grpc_version, g++ 10, -Werror)"; }
done_phase "build ($(grep -c 'Building CXX' "$LOGS/build.log" || true) objects compiled; ccache $(in_root ccache -s 2>/dev/null | grep -E '^cache hit rate' | tr -s ' ' || true))"

phase "sftd links the root's gRPC and protobuf"
needed=$(in_root readelf -d "$BUILD/bin/sftd" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "  NEEDED: $(echo "$needed" | tr '\n' ' ')"
echo "$needed" | grep -q '^libgrpc++\.so\.1$' || check_fail "NEEDED of sftd" "sftd does not link libgrpc++.so.1"
echo "$needed" | grep -q '^libprotobuf\.so\.23$' || check_fail "NEEDED of sftd" "sftd does not link protobuf 3.12 (libprotobuf.so.23)"
done_phase "NEEDED: libgrpc++.so.1, libprotobuf.so.23"

phase "sftd --version, start --detach, status (an RPC through gRPC $grpc_version), stop"
{
  in_root "$BUILD/bin/sftd" --version &&
    in_root rm -rf "$DATA" &&
    in_root "$BUILD/bin/sftd" start --detach --data-dir "$DATA" --gpus none &&
    in_root "$BUILD/bin/sftd" status --json --data-dir "$DATA" &&
    in_root "$BUILD/bin/sftd" stop --data-dir "$DATA"
} >"$LOGS/sftd.log" 2>&1 || { cat "$LOGS/sftd.log"; check_fail "run sftd" "sftd did not start, answer or stop"; }
grep -q '"running":true' "$LOGS/sftd.log" || { cat "$LOGS/sftd.log"; check_fail "run sftd" "sftd status did not report a running agent"; }
grep -q '"healthy":true' "$LOGS/sftd.log" ||
  { cat "$LOGS/sftd.log"; check_fail "run sftd" "the agent did not answer sftd status's Health RPC"; }
sed -n '1,6s/^/  /p' "$LOGS/sftd.log"
done_phase "sftd runs and answers"

phase "the agent's end-to-end test against sftd (gRPC $grpc_version)"
in_root bash -c "cd $BUILD && bin/agent_e2e_test" >"$LOGS/e2e.log" 2>&1 ||
  { grep -E '^\[  FAILED|Failure' "$LOGS/e2e.log" | head -n 40; tail -n 30 "$LOGS/e2e.log"
    check_fail "agent_e2e_test" "the agent's end-to-end test failed under gRPC $grpc_version"; }
done_phase "agent_e2e_test" "$(grep -E '^\[  PASSED' "$LOGS/e2e.log" | tail -n 1)"

check_summary "Debian 11, gRPC $grpc_version, $jobs jobs"
