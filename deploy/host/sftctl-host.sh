#!/usr/bin/env bash
# sftctl-host.sh: the host side of `sftctl bootstrap` (docs/remote.md, "A fresh host").
#
# `sftctl bootstrap` uploads this script to ~/.local/share/sftctl/bootstrap/ on the GPU host and runs
# its subcommands over SSH. Everything it prints is read by a client that does not trust the host:
# key=value lines and a log it shows escaped.
#
#   probe [--install-torch] [--agent-only]
#                              what the host has, as key=value lines (one SSH round trip), with the
#                              trainer's LibTorch decision for those worker flags (torch_plan=...;
#                              torch_problem=... lines: the message when there is no usable one)
#   torch-plan [--install-torch] [--agent-only]
#                              (tests, a dry run) that decision alone; installs nothing
#   start-worker ARGS...       start the worker detached (a dropped SSH connection does not stop it);
#                              prints "WORKER started <pid>" or "WORKER running <pid>"
#   poll OFFSET                "STATUS <status>", "SIZE <log bytes>", then the log from OFFSET (<= 64 KiB)
#   worker ARGS...             (internal) unpack -> torch (decide) -> deps -> [torch-install] -> build
#                              agent -> build trainer -> install -> start
#   exec-start ARGS...         (internal, tests) the systemd unit's ExecStart= value for worker ARGS
#   preset-args PRESET         (internal, tests) how PRESET is configured where CMake reads no presets
#
# Worker ARGS: --sha256 HEX (of bootstrap/sftctl-src.tar.gz) --source-id HEX [--jobs N]
#   [--no-install-deps] [--data-dir DIR] [--no-systemd] [--agent-arg ARG]... (added to `sftd start`)
#   [--agent-only] (build and install sftd only: a host whose trainer comes from elsewhere)
#   [--install-torch] (no usable LibTorch: install PyTorch into sftctl's own venv, torch_decide)
#   DIR "~", "~/x" or relative is taken under $HOME, as the client's ssh commands take it.
# State, under SFTCTL_HOME (default ~/.local/share/sftctl):
#   bootstrap/status   one line: "running <phase>", "done <source id>" or "failed <phase>: <why>"
#   bootstrap/log      the worker's output (kept; its path is printed on failure)
#   src/ build-agent/ build-trainer/   the source (updated file by file) and the two builds
#   torch-venv/        PyTorch installed by --install-torch (found again by later bootstraps)
# Environment: SFTCTL_PYTHON, a Python whose torch to try first; SFTCTL_HOST_ROOT (tests), see ROOT.
#   installed          the source id of ~/.local/bin/{sftd,sftctl-trainer}; "<id> agent-only" when
#                      only sftd was installed (--agent-only)
set -u

SFTCTL_HOME=${SFTCTL_HOME:-$HOME/.local/share/sftctl}
BOOT=$SFTCTL_HOME/bootstrap
PREFIX=${SFTCTL_PREFIX:-$HOME/.local}
STATUS=$BOOT/status
LOG=$BOOT/log

# What the agent and the trainer need to build on Debian and Ubuntu (the trainer's LibTorch comes
# from the host's Python torch, a C++ LibTorch, or what torch_decide installs).
HOST_PKGS="g++ make cmake ninja-build pkg-config ca-certificates ccache
libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libssl-dev libsqlite3-dev
libboost-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev libyaml-cpp-dev libpcre2-dev
libutf8proc-dev libcurl4-openssl-dev"

kv() { printf '%s=%s\n' "$1" "$(printf '%s' "$2" | tr '\n\r=' '  :')"; }

# CLI11 is header-only (headers and a CMake config). Debian 11 has no libcli11-dev: where apt cannot
# install it, the worker unpacks Debian 12's package (2.1.2, the version Ubuntu 22.04 ships; pinned
# by its sha256) under SFTCTL_HOME/deps, installing nothing, and the builds find it there.
CLI11_DEB=libcli11-dev_2.1.2+ds-1_all.deb
CLI11_DEB_SHA256=f1f6ee9ec053e0e0bcec47345e241b6a8ee006321248b4329e9ce88d2b4b64a8
CLI11_URLS="http://deb.debian.org/debian/pool/main/c/cli11/libcli11-dev_2.1.2%2Bds-1_all.deb
http://archive.debian.org/debian/pool/main/c/cli11/libcli11-dev_2.1.2%2Bds-1_all.deb"
CLI11_DIR=$SFTCTL_HOME/deps/cli11/usr/share/cmake/CLI11

# A package of HOST_PKGS is there: installed, or (libcli11-dev) the private copy of CLI11.
have_pkg() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed" && return 0
  [ "$1" = libcli11-dev ] && [ -f "$CLI11_DIR/CLI11Config.cmake" ]
}

# CLI11 comes privately (fetch_cli11, no root needed) where apt offers no libcli11-dev (Debian 11), so
# it is never a package to ask an administrator for.
private_cli11() {
  ! have_pkg libcli11-dev && ! LC_ALL=C apt-cache policy libcli11-dev 2>/dev/null | grep -q 'Candidate: [0-9]'
}

# --- probe -----------------------------------------------------------------------------------------

probe_os() {
  if [ -r /etc/os-release ]; then
    # shellcheck disable=SC1091
    . /etc/os-release
    kv os_id "${ID:-unknown}"
    kv os_version "${VERSION_ID:-}"
    kv os_name "${PRETTY_NAME:-${ID:-unknown}}"
  else
    kv os_id "$(uname -s)"
  fi
  kv arch "$(uname -m)"
  kv user "$(id -un 2>/dev/null || echo "?")"
  if [ "$(id -u)" -eq 0 ]; then
    kv sudo root
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    kv sudo yes
  else
    kv sudo no
  fi
  kv pid1 "$(cat /proc/1/comm 2>/dev/null || echo unknown)"
  kv home "$HOME"
}

probe_gpus() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    local lines
    lines=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null)
    kv gpu_count "$(printf '%s\n' "$lines" | grep -c .)"
    printf '%s\n' "$lines" | head -n 16 | while IFS= read -r l; do kv gpu "$l"; done
  else
    kv gpu_count 0
  fi
}

# --- the trainer's LibTorch: decided before anything is installed or built ---------------------------
# Supported: LibTorch TORCH_MIN or newer (Debian 12's 1.13, the oldest the trainer builds and is tested
# against; CPU); on a GPU host (nvidia-smi reports a driver) a CUDA build of PyTorch TORCH_MIN_CUDA or
# newer: a distribution's LibTorch is CPU-only, useless there. The order (torch_decide):
#   1. a Python's torch with a CMake config (SFTCTL_PYTHON, sftctl's own venv TORCH_VENV, $VIRTUAL_ENV,
#      $CONDA_PREFIX, python/python3/python3.X on PATH, ~/.venv, ~/venv, ~/miniconda3, ~/anaconda3,
#      ~/miniforge3, ~/mambaforge, /opt/conda, /opt/venv, /workspace/venv, /workspace/.venv,
#      /usr/bin/python3);
#   2. a C++ LibTorch (Debian's libtorch-dev, /usr/local/libtorch);
#   3. with --install-torch: PyTorch from download.pytorch.org into TORCH_VENV (a CUDA wheel matching
#      the driver on a GPU host, the CPU wheel elsewhere);
#   4. a CPU host with apt: the distribution's libtorch-dev, when its candidate is new enough;
#   5. else nothing is installed or built: one message says what was found, what is needed and how
#      to fix it. A LibTorch older than the minimum is never used.
TORCH_MIN=1.13
TORCH_MIN_CUDA=2.4
TORCH_VENV=$SFTCTL_HOME/torch-venv
TORCH_WHEELS=https://download.pytorch.org/whl
# (tests) A folder that stands for / where the script looks at fixed places (LibTorch, Pythons).
ROOT=${SFTCTL_HOST_ROOT:-}

# version_at_least VERSION MIN: VERSION's major.minor ("2.11.0+cu130": 2.11) is MIN or newer.
version_at_least() {
  local v
  v=$(printf '%s' "${1%%+*}" | cut -d. -f1,2)
  case $v in '' | *[!0-9.]*) return 1 ;; esac
  [ "$(printf '%s\n' "$2" "$v" | sort -V | head -n 1)" = "$2" ]
}

# The GPU driver's version when nvidia-smi reports one (a GPU host), else nothing.
gpu_driver() {
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 | grep -E '^[0-9]+(\.[0-9]+)*$'
}

# The wheel index (cuXYZ) of the newest CUDA the driver runs (NVIDIA's minimum driver per CUDA
# release, by the driver's major version); nothing below 520 (CUDA 11.8, the oldest wheel of torch 2.4).
cuda_wheel_for_driver() {
  local major=${1%%.*}
  case $major in '' | *[!0-9]*) return 0 ;; esac
  if [ "$major" -ge 580 ]; then echo cu130
  elif [ "$major" -ge 570 ]; then echo cu128
  elif [ "$major" -ge 560 ]; then echo cu126
  elif [ "$major" -ge 550 ]; then echo cu124
  elif [ "$major" -ge 530 ]; then echo cu121
  elif [ "$major" -ge 520 ]; then echo cu118
  fi
}

# Every Python worth asking for torch, one a line (not all exist).
torch_python_candidates() {
  local c
  [ -n "${SFTCTL_PYTHON:-}" ] && echo "$SFTCTL_PYTHON"
  echo "$TORCH_VENV/bin/python"
  [ -n "${VIRTUAL_ENV:-}" ] && echo "$VIRTUAL_ENV/bin/python"
  [ -n "${CONDA_PREFIX:-}" ] && echo "$CONDA_PREFIX/bin/python"
  for c in python python3 python3.14 python3.13 python3.12 python3.11 python3.10 python3.9; do
    command -v "$c" 2>/dev/null
  done
  for c in "$HOME/.venv" "$HOME/venv" "$HOME/miniconda3" "$HOME/anaconda3" "$HOME/miniforge3" \
    "$HOME/mambaforge" "$ROOT/opt/conda" "$ROOT/opt/venv" "$ROOT/workspace/venv" "$ROOT/workspace/.venv"; do
    echo "$c/bin/python"
  done
  echo "$ROOT/usr/bin/python3"
}

# What PY's torch is: key=value lines (python_version, torch_version, torch_cuda, torch_cmake,
# torch_abi, torch_dir); fails when PY cannot import torch.
python_torch() {
  "$1" - 2>/dev/null <<'PY'
import sys, os
import torch, torch.utils
print("python_version=%d.%d.%d" % sys.version_info[:3])
print("torch_version=" + torch.__version__)
print("torch_cuda=" + (torch.version.cuda or ""))
p = torch.utils.cmake_prefix_path
print("torch_cmake=" + (p if os.path.exists(os.path.join(p, "Torch", "TorchConfig.cmake")) else ""))
print("torch_abi=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI))
print("torch_dir=" + os.path.dirname(os.path.realpath(torch.__file__)))
PY
}

# Each C++ LibTorch at the usual places, a line each: PREFIX VERSION CUDA (1: a CUDA build).
system_torches() {
  local c prefix ver cuda d
  for c in "$ROOT"/usr/lib/*/cmake/Torch/TorchConfig.cmake "$ROOT/usr/share/cmake/Torch/TorchConfig.cmake" \
    "$ROOT/usr/local/libtorch/share/cmake/Torch/TorchConfig.cmake"; do
    [ -f "$c" ] || continue
    prefix=$(dirname "$(dirname "$c")")
    ver=$(sed -n 's/^ *set *( *PACKAGE_VERSION *"\([^"]*\)".*/\1/p' "$(dirname "$c")/TorchConfigVersion.cmake" \
      2>/dev/null | head -n 1)
    [ -n "$ver" ] || ver=$(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null | sed 's/^[0-9]*://; s/[+~-].*//')
    cuda=0
    for d in "$(dirname "$prefix")" "$(dirname "$(dirname "$prefix")")/lib"; do
      ls "$d"/libtorch_cuda.so* >/dev/null 2>&1 && cuda=1
    done
    echo "$prefix ${ver:-unknown} $cuda"
  done
}

# The distribution's libtorch-dev candidate version (apt), or nothing.
apt_torch_candidate() {
  command -v apt-cache >/dev/null 2>&1 || return 0
  LC_ALL=C apt-cache policy libtorch-dev 2>/dev/null | sed -n 's/^ *Candidate: \([0-9].*\)/\1/p' | head -n 1 |
    sed 's/^[0-9]*://; s/[+~-].*//'
}

# Judges one Python's torch (python_torch's lines in $2) for this host; sets T_* of the first usable
# one and appends what was seen to T_FOUND. Returns 0 when it is usable.
judge_python_torch() {
  local py=$1 out=$2 ver cuda cmake what
  ver=$(printf '%s\n' "$out" | sed -n 's/^torch_version=//p')
  cuda=$(printf '%s\n' "$out" | sed -n 's/^torch_cuda=//p')
  cmake=$(printf '%s\n' "$out" | sed -n 's/^torch_cmake=//p')
  what="$py: torch $ver ($([ -n "$cuda" ] && echo "CUDA $cuda" || echo CPU))"
  [ -n "$T_PY_INFO" ] || T_PY_INFO="python=$py"$'\n'"$out"
  if [ -n "$T_DRIVER" ] && [ -z "$cuda" ]; then
    T_FOUND+=("$what: a CPU build, and this is a GPU host")
  elif [ -n "$T_DRIVER" ] && ! version_at_least "$ver" "$TORCH_MIN_CUDA"; then
    T_FOUND+=("$what: older than $TORCH_MIN_CUDA")
  elif ! version_at_least "$ver" "$TORCH_MIN"; then
    T_FOUND+=("$what: older than $TORCH_MIN")
  elif [ -z "$cmake" ]; then
    T_FOUND+=("$what: no LibTorch CMake config (torch.utils.cmake_prefix_path has no Torch/TorchConfig.cmake)")
  else
    T_PY_INFO="python=$py"$'\n'"$out"
    TORCH_PLAN=python TORCH_CMAKE=$cmake TORCH_DESC="$what"
    return 0
  fi
  return 1
}

# Step 1 of torch_decide: the Pythons, each torch once. Returns 0 when one is usable.
decide_python() {
  local py out dir seen=" " candidates
  candidates=$(torch_python_candidates)  # (a here-string below: no /dev/fd needed, as in a bare chroot)
  while IFS= read -r py; do
    if [ -z "$py" ] || [ ! -x "$py" ] || [ -d "$py" ]; then continue; fi
    out=$(python_torch "$py") || continue
    dir=$(printf '%s\n' "$out" | sed -n 's/^torch_dir=//p')
    case $seen in *" $dir "*) continue ;; esac
    seen="$seen$dir "
    judge_python_torch "$py" "$out" && return 0
  done <<<"$candidates"
  return 1
}

# Step 2: a C++ LibTorch. Returns 0 when one is usable.
decide_system() {
  local prefix ver cuda what found
  found=$(system_torches)
  while read -r prefix ver cuda; do
    [ -n "$prefix" ] || continue
    what="LibTorch $ver ($([ "$cuda" = 1 ] && echo CUDA || echo CPU)) at $prefix"
    if [ -n "$T_DRIVER" ] && [ "$cuda" != 1 ]; then
      T_FOUND+=("$what: a CPU build, and this is a GPU host")
    elif [ -n "$T_DRIVER" ] && ! version_at_least "$ver" "$TORCH_MIN_CUDA"; then
      T_FOUND+=("$what: older than $TORCH_MIN_CUDA")
    elif ! version_at_least "$ver" "$TORCH_MIN"; then
      T_FOUND+=("$what: older than $TORCH_MIN")
    else
      TORCH_PLAN=system TORCH_CMAKE=$prefix TORCH_DESC=$what
      return 0
    fi
  done <<<"$found"
  return 1
}

# torch_decide INSTALL_TORCH AGENT_ONLY: decides, installing nothing. Sets TORCH_PLAN (python,
# system, install, apt, none or not-needed), TORCH_CMAKE (python, system), TORCH_WHEEL (install:
# cu130, ..., cpu), TORCH_DESC, and TORCH_PROBLEM (the lines of the message, plan none).
torch_decide() {
  TORCH_PLAN=none TORCH_CMAKE="" TORCH_WHEEL="" TORCH_DESC="" T_PY_INFO=""
  T_FOUND=() TORCH_PROBLEM=()
  T_DRIVER=$(gpu_driver)
  if [ "$2" = 1 ]; then TORCH_PLAN=not-needed; return 0; fi
  decide_python && return 0
  decide_system && return 0
  local apt_ver
  if [ -n "$T_DRIVER" ]; then
    TORCH_WHEEL=$(cuda_wheel_for_driver "$T_DRIVER")
  else
    TORCH_WHEEL=cpu
  fi
  if [ "$1" = 1 ] && [ -n "$TORCH_WHEEL" ]; then
    TORCH_PLAN=install TORCH_DESC="PyTorch from $TORCH_WHEELS/$TORCH_WHEEL into $TORCH_VENV"
    return 0
  fi
  if [ -z "$T_DRIVER" ]; then
    apt_ver=$(apt_torch_candidate)
    if [ -n "$apt_ver" ] && version_at_least "$apt_ver" "$TORCH_MIN"; then
      TORCH_PLAN=apt TORCH_DESC="the distribution's libtorch-dev $apt_ver (apt, CPU)"
      return 0
    fi
    [ -n "$apt_ver" ] && T_FOUND+=("the distribution's libtorch-dev $apt_ver (apt): older than $TORCH_MIN")
  fi
  torch_problem
}

# The message of plan none (TORCH_PROBLEM, a line each): found, needed, the fix.
torch_problem() {
  local f venv_py="$TORCH_VENV/bin/python" idx
  TORCH_PROBLEM=("no usable LibTorch for the trainer on this host; nothing was installed or built.")
  [ ${#T_FOUND[@]} -gt 0 ] || T_FOUND=("no Python with torch (python, python3, venvs, conda) and no C++ LibTorch")
  for f in "${T_FOUND[@]}"; do TORCH_PROBLEM+=("found: $f"); done
  if [ -n "$T_DRIVER" ]; then
    TORCH_PROBLEM+=("found: an NVIDIA GPU, driver $T_DRIVER")
    TORCH_PROBLEM+=("needed: a CUDA build of PyTorch $TORCH_MIN_CUDA or newer (pip wheel: any Python, a venv, conda)")
  else
    TORCH_PROBLEM+=("needed: PyTorch or LibTorch $TORCH_MIN or newer (no GPU here: a CPU build will do)")
  fi
  if [ -z "$TORCH_WHEEL" ]; then
    TORCH_PROBLEM+=("fix: driver $T_DRIVER is older than 520, the oldest that runs a PyTorch $TORCH_MIN_CUDA CUDA wheel (CUDA 11.8): update the NVIDIA driver, then run sftctl bootstrap again")
  else
    idx=$TORCH_WHEELS/$TORCH_WHEEL
    TORCH_PROBLEM+=("fix: run sftctl bootstrap again with --install-torch (installs torch from $idx into $TORCH_VENV)")
    TORCH_PROBLEM+=("  or on the host: python3 -m venv $TORCH_VENV && $venv_py -m pip install torch --index-url $idx; then sftctl bootstrap again")
  fi
  if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    TORCH_PROBLEM+=("  (this host's python3 cannot make a venv: sudo apt-get install -y python3-venv first)")
  fi
  TORCH_PROBLEM+=("  or sftctl bootstrap --agent-only: sftd alone, no trainer on this host")
}

# The decision as key=value lines (probe, torch-plan): the Python torch shown in the probe table
# (the one used, else the first seen), the plan, and the message's lines.
torch_plan_kv() {
  local l
  if [ -n "$T_PY_INFO" ]; then
    printf '%s\n' "$T_PY_INFO" | grep -E '^(python|python_version|torch_version|torch_cuda|torch_abi)='
  else
    kv python "$(command -v python3 2>/dev/null || true)"
  fi
  [ "$TORCH_PLAN" = python ] && kv torch_cmake "$TORCH_CMAKE"
  [ "$TORCH_PLAN" = system ] && kv system_torch_cmake "$TORCH_CMAKE"
  kv torch_plan "$TORCH_PLAN"
  kv torch_plan_detail "$TORCH_DESC"
  [ -n "$TORCH_WHEEL" ] && [ "$TORCH_PLAN" = install ] && kv torch_wheel "$TORCH_WHEEL"
  for l in "${TORCH_PROBLEM[@]}"; do printf 'torch_problem=%s\n' "$(printf '%s' "$l" | tr '\n\r' '  ')"; done
}

# torch_flags STRICT ARGS...: TORCH_FLAG_INSTALL and TORCH_FLAG_AGENT_ONLY (0 or 1) from the flags
# that change the LibTorch decision (--install-torch, --agent-only); with STRICT=1 any other argument
# is an error (exit 2), else it is left for the caller.
torch_flags() {
  local strict=$1 a
  shift
  TORCH_FLAG_INSTALL=0 TORCH_FLAG_AGENT_ONLY=0
  for a in "$@"; do
    case $a in
      --install-torch) TORCH_FLAG_INSTALL=1 ;;
      --agent-only) TORCH_FLAG_AGENT_ONLY=1 ;;
      *) if [ "$strict" = 1 ]; then echo "sftctl-host.sh: unknown option $a" >&2; return 2; fi ;;
    esac
  done
}

# torch-plan [--install-torch] [--agent-only]: the decision alone (tests, a dry run): key=value lines.
cmd_torch_plan() {
  torch_flags 1 "$@" || return 2
  torch_decide "$TORCH_FLAG_INSTALL" "$TORCH_FLAG_AGENT_ONLY"
  torch_plan_kv
}

probe_tools() {
  kv cxx "$( (c++ --version 2>/dev/null || g++ --version 2>/dev/null) | head -n 1)"
  kv cmake "$(cmake --version 2>/dev/null | head -n 1 | awk '{print $3}')"
  kv ninja "$(ninja --version 2>/dev/null)"
  kv ccache "$(command -v ccache 2>/dev/null)"
  kv nvcc "$( (PATH=$PATH:/usr/local/cuda/bin nvcc --version 2>/dev/null || true) | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  kv nproc "$(nproc 2>/dev/null || echo 1)"
  mkdir -p "$SFTCTL_HOME" 2>/dev/null
  kv home_free_mib "$(df -Pm "$SFTCTL_HOME" 2>/dev/null | awk 'NR==2 {print $4}')"
  if command -v dpkg-query >/dev/null 2>&1; then
    local p missing=""
    for p in $HOST_PKGS; do
      have_pkg "$p" || { [ "$p" = libcli11-dev ] && private_cli11; } || missing="$missing $p"
    done
    kv missing_packages "${missing# }"
    kv package_manager apt
  else
    kv package_manager none
  fi
}

# Storage that survives the instance: RunPod's /workspace, Lambda's /lambda/nfs/<name>.
probe_storage() {
  local d
  for d in /workspace /lambda/nfs/*; do
    if [ -d "$d" ] && [ -w "$d" ]; then
      kv storage "$d"
      kv storage_free_mib "$(df -Pm "$d" 2>/dev/null | awk 'NR==2 {print $4}')"
      return
    fi
  done
}

probe_sftctl() {
  kv installed "$(cat "$SFTCTL_HOME/installed" 2>/dev/null)"
  kv archive_sha256 "$( (sha256sum "$BOOT/sftctl-src.tar.gz" 2>/dev/null || true) | awk '{print $1}')"
  kv status "$(cat "$STATUS" 2>/dev/null)"
  kv worker "$(worker_pid)"
  kv data_dir_config "$(head -n 1 "${XDG_CONFIG_HOME:-$HOME/.config}/sftd/data_dir" 2>/dev/null)"
  if [ -x "$PREFIX/bin/sftd" ]; then
    kv agent "$("$PREFIX/bin/sftd" status --json 2>/dev/null | head -n 1)"
  fi
}

# probe [--install-torch] [--agent-only]: the flags the worker will get that change the LibTorch
# decision, so that the client stops before uploading anything when there is no usable one.
cmd_probe() {
  torch_flags 0 "$@"
  kv probe 1
  probe_os
  probe_gpus
  torch_decide "$TORCH_FLAG_INSTALL" "$TORCH_FLAG_AGENT_ONLY"
  torch_plan_kv
  probe_tools
  probe_storage
  probe_sftctl
}

# --- worker control --------------------------------------------------------------------------------

# The pid of a live worker, or nothing.
worker_pid() {
  local pid
  pid=$(cat "$BOOT/worker.pid" 2>/dev/null) || return 0
  case $pid in '' | *[!0-9]*) return 0 ;; esac
  if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'sftctl-host.sh worker'; then
    echo "$pid"
  fi
}

cmd_start_worker() {
  mkdir -p "$BOOT"
  local pid
  pid=$(worker_pid)
  if [ -n "$pid" ]; then
    echo "WORKER running $pid"
    return 0
  fi
  set_status "running start"
  : >"$LOG"
  setsid nohup bash "$BOOT/sftctl-host.sh" worker "$@" >>"$LOG" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$BOOT/worker.pid"
  echo "WORKER started $pid"
}

cmd_poll() {
  local offset=${1:-0} size alive=0
  case $offset in '' | *[!0-9]*) offset=0 ;; esac
  # Liveness first: a worker found dead has written its last status, which is read after.
  [ -n "$(worker_pid)" ] && alive=1
  echo "STATUS $(cat "$STATUS" 2>/dev/null)"
  echo "ALIVE $alive"
  size=$(stat -c %s "$LOG" 2>/dev/null || echo 0)
  echo "SIZE $size"
  if [ "$offset" -lt "$size" ]; then tail -c +"$((offset + 1))" "$LOG" | head -c 65536; fi
}

set_status() {
  printf '%s\n' "$1" >"$STATUS.tmp" && mv -f "$STATUS.tmp" "$STATUS"
}

# --- the worker ------------------------------------------------------------------------------------

phase() {
  PHASE=$1
  set_status "running $1"
  echo "== $1: $2 ($(date '+%H:%M:%S'))"
}

fail() {
  echo "!! $PHASE failed: $1"
  set_status "failed $PHASE: $1"
  exit 1
}

# Unpacks the archive and copies into src/ only the files whose content changed, so a build of a new
# version recompiles what changed and nothing else.
unpack() {
  phase unpack "checking and unpacking the source"
  local got
  got=$(sha256sum "$BOOT/sftctl-src.tar.gz" | awk '{print $1}')
  [ "$got" = "$W_SHA" ] || fail "the uploaded archive's sha256 is $got, not $W_SHA (upload again)"
  rm -rf "$BOOT/unpack" && mkdir -p "$BOOT/unpack" || fail "cannot write $BOOT/unpack"
  tar -xzf "$BOOT/sftctl-src.tar.gz" -C "$BOOT/unpack" || fail "cannot unpack the archive"
  local new=$BOOT/unpack
  [ "$(cat "$new/SOURCE_ID" 2>/dev/null)" = "$W_ID" ] || fail "the archive holds another source id than $W_ID"
  mkdir -p "$SFTCTL_HOME/src"
  local f changed=0
  while IFS= read -r f; do
    case $f in '' | /* | *..*) continue ;; esac
    if ! cmp -s "$new/$f" "$SFTCTL_HOME/src/$f"; then
      mkdir -p "$(dirname "$SFTCTL_HOME/src/$f")" && cp -p "$new/$f" "$SFTCTL_HOME/src/$f" || fail "cannot copy $f"
      changed=$((changed + 1))
    fi
  done <"$new/SOURCES"
  # Files of the previous version that this one no longer has.
  if [ -f "$SFTCTL_HOME/src/SOURCES" ]; then
    grep -vxF -f "$new/SOURCES" "$SFTCTL_HOME/src/SOURCES" | while IFS= read -r f; do
      case $f in '' | /* | *..*) continue ;; esac
      rm -f "$SFTCTL_HOME/src/$f"
    done
  fi
  for f in SOURCES SOURCE_ID; do cmp -s "$new/$f" "$SFTCTL_HOME/src/$f" || cp "$new/$f" "$SFTCTL_HOME/src/$f"; done
  rm -rf "$BOOT/unpack"
  echo "source $W_ID: $changed file(s) changed"
}

install_deps() {
  phase deps "checking packages"
  command -v dpkg-query >/dev/null 2>&1 || { echo "no dpkg: not installing packages"; return 0; }
  local p missing=""
  if private_cli11; then fetch_cli11; fi
  for p in $HOST_PKGS; do
    have_pkg "$p" || missing="$missing $p"
  done
  if [ "$TORCH_PLAN" = apt ]; then
    # choose_torch took the distribution's LibTorch (CPU only, new enough).
    for p in libtorch-dev libopenblas0-openmp; do
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
    done
  fi
  if [ "$TORCH_PLAN" = install ] && ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    missing="$missing python3-venv"  # (pulls python3 in)
  fi
  missing=${missing# }
  [ -n "$missing" ] || { echo "all packages present"; return 0; }
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; else
      fail "missing packages and no root or password-less sudo: ask an administrator to run: sudo apt-get install -y $missing"
    fi
  fi
  [ "$W_INSTALL" = 1 ] || fail "missing packages (--no-install-deps): sudo apt-get install -y $missing"
  echo "installing: $missing"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq || fail "apt-get update failed"
  # Stale package lists hid libcli11-dev before the update; without it now, the private copy.
  case " $missing " in
    *" libcli11-dev "*)
      if private_cli11; then
        fetch_cli11
        local rest=""
        for p in $missing; do [ "$p" = libcli11-dev ] || rest="$rest $p"; done
        missing=${rest# }
      fi
      ;;
  esac
  [ -n "$missing" ] || return 0
  # shellcheck disable=SC2086
  $sudo apt-get install -y -q --no-install-recommends $missing || fail "apt-get install failed: $missing"
}

# Unpacks CLI11 (CLI11_DEB, checked against its sha256) under SFTCTL_HOME/deps/cli11: the builds
# find its CMake config there (CLI11_DIR). Fails naming what to do when it cannot be downloaded.
fetch_cli11() {
  [ -f "$CLI11_DIR/CLI11Config.cmake" ] && return 0
  local deps=$SFTCTL_HOME/deps url got=""
  echo "this distribution has no libcli11-dev: unpacking Debian 12's $CLI11_DEB (header-only) into $deps/cli11"
  mkdir -p "$deps" || fail "cannot create $deps"
  for url in $CLI11_URLS; do
    rm -f "$deps/$CLI11_DEB.part"
    if command -v curl >/dev/null 2>&1; then
      curl -fsSL --retry 2 -o "$deps/$CLI11_DEB.part" "$url" || continue
    elif command -v wget >/dev/null 2>&1; then
      wget -q -O "$deps/$CLI11_DEB.part" "$url" || continue
    elif command -v python3 >/dev/null 2>&1; then
      python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
        "$url" "$deps/$CLI11_DEB.part" 2>/dev/null || continue
    else
      break
    fi
    got=$(sha256sum "$deps/$CLI11_DEB.part" | awk '{print $1}')
    [ "$got" = "$CLI11_DEB_SHA256" ] && break
    echo "note: $url has sha256 $got, not $CLI11_DEB_SHA256"
    got=""
  done
  [ -n "$got" ] || fail "libcli11-dev is not in this distribution's apt sources, and $CLI11_DEB could not be downloaded (curl, wget or python3): fetch ${CLI11_URLS%%$'\n'*} (sha256 $CLI11_DEB_SHA256), run dpkg-deb -x $CLI11_DEB $deps/cli11, and bootstrap again"
  rm -rf "$deps/cli11" && mkdir -p "$deps/cli11" && dpkg-deb -x "$deps/$CLI11_DEB.part" "$deps/cli11" &&
    [ -f "$CLI11_DIR/CLI11Config.cmake" ] || fail "cannot unpack $CLI11_DEB into $deps/cli11"
  rm -f "$deps/$CLI11_DEB.part"
}

# The worker's LibTorch decision (torch_decide with its flags), before anything is installed: stops
# with the decision's message when there is no usable LibTorch and no way to one.
choose_torch() {
  phase torch "choosing the trainer's LibTorch"
  torch_decide "$W_INSTALL_TORCH" "$W_AGENT_ONLY"
  if [ "$TORCH_PLAN" = none ]; then
    local IFS='|'
    fail "$(printf '%s' "${TORCH_PROBLEM[*]}" | sed 's/|/ | /g')"
  fi
  echo "LibTorch: $TORCH_PLAN${TORCH_DESC:+: $TORCH_DESC}"
}

# Installs PyTorch (TORCH_WHEEL's index) into sftctl's own venv TORCH_VENV, then decides again: the
# venv's torch must be the one chosen.
install_torch() {
  phase torch-install "installing PyTorch from $TORCH_WHEELS/$TORCH_WHEEL into $TORCH_VENV"
  command -v python3 >/dev/null 2>&1 || fail "no python3 to make $TORCH_VENV with (apt-get install python3-venv)"
  if [ ! -x "$TORCH_VENV/bin/python" ]; then
    python3 -m venv "$TORCH_VENV" || fail "python3 -m venv $TORCH_VENV failed (Debian, Ubuntu: sudo apt-get install -y python3-venv)"
  fi
  "$TORCH_VENV/bin/python" -m pip install --index-url "$TORCH_WHEELS/$TORCH_WHEEL" torch ||
    fail "pip install torch from $TORCH_WHEELS/$TORCH_WHEEL into $TORCH_VENV failed (see the log above)"
  torch_decide 0 0
  [ "$TORCH_PLAN" = python ] || fail "the torch installed into $TORCH_VENV is not usable: ${TORCH_PROBLEM[*]}"
  echo "LibTorch: $TORCH_DESC"
}

# How CMake older than 3.21, which reads no presets (Debian 11 has 3.18, Ubuntu 22.04 3.22), configures
# a host preset of CMakePresets.json: its generator and cache variables, one argument a line. Keep in
# step with CMakePresets.json (tests/portability/bullseye_agent_check.sh compares them).
preset_args() {
  case $1 in
    host-agent) printf '%s\n' -G Ninja -DCMAKE_BUILD_TYPE=Release -DSFTCTL_BUILD_TRAINER=OFF \
      -DSFTCTL_BUILD_CLIENT=OFF -DSFTCTL_BUILD_TESTS=OFF ;;
    trainer-only) printf '%s\n' -G Ninja -DCMAKE_BUILD_TYPE=Release -DSFTCTL_TRAINER_ONLY=ON -DSFTCTL_BUILD_TESTS=OFF ;;
    *) return 1 ;;
  esac
}

# CMake reads CMakePresets.json (version 3: CMake 3.21 or newer).
cmake_reads_presets() {
  local v
  v=$(cmake --version 2>/dev/null | head -n 1 | awk '{print $3}')
  [ -n "$v" ] && [ "$(printf '%s\n' 3.21 "$v" | sort -V | head -n 1)" = 3.21 ]
}

# configure + build one preset into SFTCTL_HOME/<dir>.
build() {
  local preset=$1 dir=$2 target=$3
  shift 3
  local launcher=()
  # One locale for every build: ccache hashes it, and SSH clients send different ones (libssh2 none).
  export LANG=C.UTF-8
  unset LC_ALL LC_CTYPE LC_MESSAGES
  if command -v ccache >/dev/null 2>&1; then
    export CCACHE_BASEDIR=$SFTCTL_HOME
    launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  local configure=(--preset "$preset")
  if ! cmake_reads_presets; then
    echo "$(cmake --version | head -n 1) reads no presets (3.21+): configuring $preset's settings by hand"
    mapfile -t configure < <(preset_args "$preset")
    configure=(-S . "${configure[@]}")
  fi
  # CLI11 unpacked by fetch_cli11, where the distribution has none.
  if ! dpkg-query -W -f='${Status}' libcli11-dev 2>/dev/null | grep -q "install ok installed" &&
    [ -f "$CLI11_DIR/CLI11Config.cmake" ]; then
    configure+=("-DCLI11_DIR=$CLI11_DIR")
  fi
  (cd "$SFTCTL_HOME/src" && cmake "${configure[@]}" -B "$SFTCTL_HOME/$dir" "${launcher[@]}" "$@") ||
    fail "cmake --preset $preset failed (see the log above)"
  cmake --build "$SFTCTL_HOME/$dir" -j "$W_JOBS" --target "$target" || fail "building $target failed (see the log above)"
}

install_binaries() {
  phase install "installing into $PREFIX/bin"
  mkdir -p "$PREFIX/bin" || fail "cannot create $PREFIX/bin"
  local b src
  local bins=(sftd sftctl-trainer)
  [ "$W_AGENT_ONLY" = 1 ] && bins=(sftd)
  for b in "${bins[@]}"; do
    src=$SFTCTL_HOME/build-agent/bin/$b
    [ "$b" = sftctl-trainer ] && src=$SFTCTL_HOME/build-trainer/bin/$b
    [ -x "$src" ] || fail "$src was not built"
    cp "$src" "$PREFIX/bin/.$b.new" && mv -f "$PREFIX/bin/.$b.new" "$PREFIX/bin/$b" || fail "cannot install $b"
  done
  # The binaries read their source id here (common/source_id.h).
  mkdir -p "$PREFIX/share/sftctl" && cp "$SFTCTL_HOME/src/SOURCE_ID" "$PREFIX/share/sftctl/.SOURCE_ID.new" &&
    mv -f "$PREFIX/share/sftctl/.SOURCE_ID.new" "$PREFIX/share/sftctl/SOURCE_ID" || fail "cannot install SOURCE_ID"
}

# The data dir: --data-dir, else the surviving storage (recorded for sftd's default), else sftd's own.
choose_data_dir() {
  local conf=${XDG_CONFIG_HOME:-$HOME/.config}/sftd/data_dir storage
  if [ -n "$W_DATA_DIR" ]; then
    DATA_DIR=$W_DATA_DIR
    return
  fi
  if [ -f "$conf" ]; then
    DATA_DIR=$(head -n 1 "$conf")
    return
  fi
  storage=$(probe_storage | sed -n 's/^storage=//p')
  DATA_DIR=""
  if [ -n "$storage" ]; then
    DATA_DIR=$storage/sftd
    mkdir -p "$(dirname "$conf")" && printf '%s\n' "$DATA_DIR" >"$conf" || fail "cannot write $conf"
    echo "agent data (jobs, checkpoints) on surviving storage: $DATA_DIR (recorded in $conf)"
  fi
}

# A folder named by the client, as an absolute path: "~" and "~/x" under $HOME (a client quotes the
# tilde), and a relative one too (its ssh commands start in $HOME; systemd's units do not).
host_path() {
  case $1 in
    '~') printf '%s' "$HOME" ;;
    '~/'*) printf '%s/%s' "$HOME" "${1#\~/}" ;;
    /*) printf '%s' "$1" ;;
    *) printf '%s/%s' "$HOME" "$1" ;;
  esac
}

# One argument of a systemd command line (systemd.syntax(7), "Quoting"): double-quoted with \ and "
# escaped, and % and $ doubled so that systemd expands neither specifiers nor variables in it.
# Fails on control characters, which a unit file cannot carry.
systemd_quote() {
  local a=$1
  case $a in *[[:cntrl:]]*) return 1 ;; esac
  a=${a//\\/\\\\}
  a=${a//\"/\\\"}
  a=${a//%/%%}
  a=${a//\$/\$\$}
  printf '"%s"' "$a"
}

# The arguments as one ExecStart= value.
systemd_exec_line() {
  local out="" a q
  for a in "$@"; do
    q=$(systemd_quote "$a") || return 1
    out="$out${out:+ }$q"
  done
  printf '%s' "$out"
}

# `sftd start`'s arguments: the data dir, then the client's --agent-arg flags.
set_start_args() {
  local dd=()
  [ -n "$DATA_DIR" ] && dd=(--data-dir "$DATA_DIR")
  START_ARGS=("${dd[@]}" "${W_AGENT_ARGS[@]}")
}

# A unit when PID 1 is systemd and we may use it; else sftd detaches itself.
start_agent() {
  phase start "starting sftd"
  choose_data_dir
  local dd=() st
  [ -n "$DATA_DIR" ] && dd=(--data-dir "$DATA_DIR")
  set_start_args
  # Secrets the stop action needs (LAMBDA_API_KEY, LAMBDA_INSTANCE_ID), kept on the host only.
  local env_file=${XDG_CONFIG_HOME:-$HOME/.config}/sftd/env
  if [ -r "$env_file" ]; then
    set -a
    # shellcheck disable=SC1090
    . "$env_file"
    set +a
    echo "environment for sftd read from $env_file"
  fi
  st=$("$PREFIX/bin/sftd" status --json "${dd[@]}" 2>/dev/null | head -n 1)
  if printf '%s' "$st" | grep -q '"running":true' && ! printf '%s' "$st" | grep -q "\"source_id\":\"$W_ID\""; then
    echo "stopping the running agent of another version (its jobs keep running and are re-attached)"
    "$PREFIX/bin/sftd" stop "${dd[@]}" || true
  fi
  if [ "$W_SYSTEMD" = 1 ] && [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ] && start_systemd; then
    return
  fi
  "$PREFIX/bin/sftd" start --detach "${START_ARGS[@]}" || fail "sftd start --detach failed"
}

start_systemd() {
  local unit_dir ctl exec_start
  exec_start=$(systemd_exec_line "$PREFIX/bin/sftd" start "${START_ARGS[@]}") || {
    echo "note: an argument of sftd has a control character: not starting it under systemd"
    return 1
  }
  if [ "$(id -u)" -eq 0 ]; then
    unit_dir=/etc/systemd/system ctl="systemctl"
  else
    systemctl --user show-environment >/dev/null 2>&1 || return 1
    unit_dir=${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user ctl="systemctl --user"
    loginctl enable-linger "$(id -un)" 2>/dev/null || echo "note: loginctl enable-linger failed: sftd stops when you log out"
  fi
  mkdir -p "$unit_dir" || return 1
  local env_file=${XDG_CONFIG_HOME:-$HOME/.config}/sftd/env
  cat >"$unit_dir/sftd.service" <<EOF
[Unit]
Description=sftctl agent (sftd)
After=network.target

[Service]
EnvironmentFile=-${env_file//%/%%}
ExecStart=$exec_start
Restart=on-failure
KillMode=process

[Install]
WantedBy=$([ "$(id -u)" -eq 0 ] && echo multi-user.target || echo default.target)
EOF
  $ctl daemon-reload && $ctl enable sftd.service && $ctl restart sftd.service || return 1
  local i
  for i in $(seq 1 50); do
    "$PREFIX/bin/sftd" status --json ${DATA_DIR:+--data-dir "$DATA_DIR"} 2>/dev/null | grep -q '"running":true' && {
      echo "sftd runs under systemd ($unit_dir/sftd.service)"
      return 0
    }
    sleep 0.2
  done
  return 1
}

parse_worker_args() {
  W_SHA="" W_ID="" W_JOBS=$(nproc 2>/dev/null || echo 2) W_INSTALL=1 W_DATA_DIR="" W_SYSTEMD=1
  W_AGENT_ONLY=0 W_INSTALL_TORCH=0
  W_AGENT_ARGS=()
  while [ $# -gt 0 ]; do
    case $1 in
      --sha256) W_SHA=$2; shift 2 ;;
      --source-id) W_ID=$2; shift 2 ;;
      --jobs) W_JOBS=$2; shift 2 ;;
      --no-install-deps) W_INSTALL=0; shift ;;
      --data-dir) W_DATA_DIR=$(host_path "$2"); shift 2 ;;
      --no-systemd) W_SYSTEMD=0; shift ;;
      --agent-only) W_AGENT_ONLY=1; shift ;;
      --install-torch) W_INSTALL_TORCH=1; shift ;;
      --agent-arg) W_AGENT_ARGS+=("$2"); shift 2 ;;
      *) PHASE=args; fail "unknown worker option $1" ;;
    esac
  done
}

# (internal, tests) The ExecStart= value of the unit for worker ARGS, their --data-dir taken as is.
cmd_exec_start() {
  parse_worker_args "$@"
  DATA_DIR=$W_DATA_DIR
  set_start_args
  systemd_exec_line "$PREFIX/bin/sftd" start "${START_ARGS[@]}" && echo
}

cmd_worker() {
  parse_worker_args "$@"
  PHASE=start
  exec 9>"$BOOT/worker.lock"
  flock -n 9 || fail "another bootstrap worker holds $BOOT/worker.lock"
  echo "$$" >"$BOOT/worker.pid"
  echo "sftctl-host worker $$ on $(hostname 2>/dev/null), source $W_ID"
  unpack
  choose_torch
  install_deps
  case $TORCH_PLAN in
    install) install_torch ;;
    apt)
      torch_decide 0 0
      [ "$TORCH_PLAN" = system ] || fail "libtorch-dev was installed, but no usable LibTorch is found: ${TORCH_PROBLEM[*]}"
      ;;
  esac
  phase build-agent "building sftd"
  build host-agent build-agent sftd
  [ "$W_AGENT_ONLY" = 1 ] || build_trainer
  install_binaries
  start_agent
  local installed=$W_ID what="sftd and sftctl-trainer"
  [ "$W_AGENT_ONLY" = 1 ] && installed="$W_ID agent-only" what="sftd (agent only)"
  printf '%s\n' "$installed" >"$SFTCTL_HOME/installed.tmp" && mv -f "$SFTCTL_HOME/installed.tmp" "$SFTCTL_HOME/installed"
  set_status "done $W_ID"
  echo "== done: $what of source $W_ID installed and running ($(date '+%H:%M:%S'))"
}

build_trainer() {
  phase build-trainer "building sftctl-trainer against $TORCH_CMAKE"
  # A CUDA LibTorch's CMake config looks for the CUDA toolkit; NVIDIA's images keep it here.
  local cuda=()
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=$PATH:/usr/local/cuda/bin
    cuda=(-DCUDAToolkit_ROOT=/usr/local/cuda)
  fi
  build trainer-only build-trainer sftctl-trainer "-DCMAKE_PREFIX_PATH=$TORCH_CMAKE" "${cuda[@]}"
}

case ${1:-} in
  probe) shift; cmd_probe "$@" ;;
  torch-plan) shift; cmd_torch_plan "$@" ;;
  start-worker) shift; cmd_start_worker "$@" ;;
  poll) shift; cmd_poll "$@" ;;
  worker) shift; cmd_worker "$@" ;;
  exec-start) shift; cmd_exec_start "$@" ;;
  preset-args) preset_args "${2:-}" || { echo "sftctl-host.sh: no host preset ${2:-}" >&2; exit 2; } ;;
  *) echo "usage: sftctl-host.sh probe|start-worker ARGS|poll OFFSET" >&2; exit 2 ;;
esac
