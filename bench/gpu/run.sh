#!/usr/bin/env bash
# The GPU checklist: run on a Linux machine with an NVIDIA GPU and a pip PyTorch (CUDA build), from
# the repository root. Prints one table at the end; raw logs go to bench/gpu/results/.
#
#   bench/gpu/run.sh [--python PY] [--jobs N] [--steps N] [--batch B] [--seq T] [--skip-build]
#                    [--skip-tests] [--peak-tflops X]
#
# Phases (each one's result is a row of the table; a failed phase does not stop the later ones):
#   1. build   the trainer-only preset against PY's torch (torch.utils.cmake_prefix_path), with the
#              trainer tests. Header-only and C dependencies come from the system, or from
#              bench/gpu/deps/ (bench/gpu/prepare.sh, run on a Debian machine beforehand) when the
#              GPU machine has no apt. GoogleTest is built from source with torch's C++ ABI.
#   2. tests   ctest -L trainer: trainer runs with device "auto" train on the GPU.
#   3. nccl    a one-rank NCCL group (distributed_test's NcclOneRank test: every collective with
#              host and device tensors). The trainer creates no process group for WORLD_SIZE=1, and
#              NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so a 2-rank NCCL job
#              (and the dead-peer check) runs only on a machine with >= 2 GPUs.
#   4. train   bf16 training throughput, MFU and peak memory of the Qwen2.5-0.5B architecture
#              (random init, inline config) at seq T: sftctl-trainer vs Hugging Face transformers
#              with PyTorch SDPA (bench/gpu/hf_train.py; a plain-PyTorch model with SDPA when
#              transformers is not installed) on the same GPU, the same batch and steps.
set -uo pipefail

usage() {
  sed -n '5,7p' "$0" >&2
  exit 2
}
py=${PYTHON:-python3} jobs=$(nproc) steps=20 batch=4 seq=2048 skip_build=0 skip_tests=0 peak_tflops=
while [[ $# -gt 0 ]]; do
  case $1 in
    --python) py=${2:?}; shift ;;
    --jobs) jobs=${2:?}; shift ;;
    --steps) steps=${2:?}; shift ;;
    --batch) batch=${2:?}; shift ;;
    --seq) seq=${2:?}; shift ;;
    --skip-build) skip_build=1 ;;
    --skip-tests) skip_tests=1 ;;
    --peak-tflops) peak_tflops=${2:?}; shift ;;
    *) usage ;;
  esac
  shift
done

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here=$src/bench/gpu
build=$src/build/gpu
out=$here/results
mkdir -p "$out"
declare -a rows=()
row() { rows+=("$(printf '%-8s %-6s %s' "$1" "$2" "$3")"); }
say() { echo "== $*" >&2; }

# ---- The machine -------------------------------------------------------------------------------
read -r torch_prefix torch_version torch_cuda abi cuda_ok gpu_name gpus < <("$py" - <<'PY' 2>/dev/null
import torch
name = torch.cuda.get_device_name(0).replace(" ", "_") if torch.cuda.is_available() else "none"
print(torch.utils.cmake_prefix_path, torch.__version__, torch.version.cuda, int(torch._C._GLIBCXX_USE_CXX11_ABI),
      int(torch.cuda.is_available()), name, torch.cuda.device_count())
PY
) || true
if [[ -z ${torch_prefix:-} ]]; then
  echo "run.sh: $py cannot import torch (pass --python PY, the interpreter with the CUDA wheel)" >&2
  exit 1
fi
say "torch $torch_version (CUDA $torch_cuda, C++11 ABI $abi), GPU: $gpu_name x $gpus"
[[ $cuda_ok == 1 ]] || echo "run.sh: torch sees no GPU; the CUDA phases will fail" >&2

# ---- Dependencies from bench/gpu/deps (prepare.sh) ---------------------------------------------
deps=$here/deps
prefix_path=$torch_prefix
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
if [[ -d $deps/usr ]]; then
  multiarch=$deps/usr/lib/x86_64-linux-gnu
  prefix_path="$prefix_path;$deps/usr"
  export PKG_CONFIG_LIBDIR=$multiarch/pkgconfig:$deps/usr/share/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=$deps
  export LD_LIBRARY_PATH=$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  if ! command -v pkg-config >/dev/null; then
    mkdir -p "$build/tools"
    printf '#!/bin/sh\nexec "%s" "$@"\n' "$deps/usr/bin/pkgconf" > "$build/tools/pkg-config"
    chmod +x "$build/tools/pkg-config"
    export PATH=$build/tools:$PATH
  fi
fi

# GoogleTest with torch's C++ ABI (Debian's libgtest.a uses the new ABI; wheels <= 2.6 the old).
gtest_src=
for d in "$deps/usr/src/googletest" /usr/src/googletest; do [[ -f $d/CMakeLists.txt ]] && gtest_src=$d && break; done
build_gtest() {
  local dst=$build/gtest-abi$abi
  [[ -f $dst/.done ]] && { prefix_path="$dst;$prefix_path"; return 0; }
  [[ -n $gtest_src ]] || { echo "no GoogleTest sources (run bench/gpu/prepare.sh)" >&2; return 1; }
  cmake -S "$gtest_src" -B "$build/gtest-build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$dst" \
    -DCMAKE_CXX_FLAGS="-D_GLIBCXX_USE_CXX11_ABI=$abi" -DBUILD_GMOCK=ON >&2 &&
    cmake --build "$build/gtest-build" -j "$jobs" --target install >&2 && touch "$dst/.done" &&
    prefix_path="$dst;$prefix_path"
}

# ---- 1. build -----------------------------------------------------------------------------------
targets=(sftctl-trainer trainer_test fused_ops_test hf_checkpoint_test data_test lora_test distributed_test)
if [[ $skip_build == 0 ]]; then
  say "build (trainer-only preset, tests on)"
  cuda_root=()
  for c in "${CUDA_HOME:-}" /usr/local/cuda; do
    [[ -n $c && -x $c/bin/nvcc ]] && cuda_root=(-DCUDAToolkit_ROOT="$c" -DCUDA_TOOLKIT_ROOT_DIR="$c") && break
  done
  [[ ${#cuda_root[@]} -gt 0 ]] || echo "run.sh: no nvcc found (CUDA_HOME, /usr/local/cuda): LibTorch's CMake" \
    "needs the CUDA toolkit to configure a CUDA build" >&2
  t0=$SECONDS
  if build_gtest && cmake --preset trainer-only -B "$build" -DSFTCTL_BUILD_TESTS=ON \
      -DCMAKE_PREFIX_PATH="$prefix_path" "${cuda_root[@]}" > "$out/configure.log" 2>&1 &&
     cmake --build "$build" -j "$jobs" --target "${targets[@]}" > "$out/build.log" 2>&1; then
    nccl=$(grep -c "NCCL process groups on" "$out/configure.log")
    row build ok "$((SECONDS - t0)) s; NCCL compiled in: $([[ $nccl -gt 0 ]] && echo yes || echo NO)"
  else
    row build FAIL "see $out/configure.log, $out/build.log"
    tail -30 "$out/build.log" "$out/configure.log" 2>/dev/null >&2
  fi
fi
trainer=$build/bin/sftctl-trainer

# ---- 2. tests on CUDA ---------------------------------------------------------------------------
if [[ $skip_tests == 0 && -x $trainer ]]; then
  say "trainer tests (ctest -L trainer)"
  t0=$SECONDS
  if ctest --test-dir "$build" -L trainer -j 2 --output-on-failure > "$out/ctest.log" 2>&1; then
    row tests ok "$(grep -E 'tests passed' "$out/ctest.log" | tail -1) ($((SECONDS - t0)) s)"
  else
    row tests FAIL "$(grep -E 'tests passed|tests failed' "$out/ctest.log" | tail -1); see $out/ctest.log"
  fi
  skipped=$(grep -c "Skipped\|SKIPPED" "$out/ctest.log")
  [[ $skipped -gt 0 ]] && row "" "" "$skipped skip lines in ctest.log (e.g. multi-rank CPU tests without Gloo)"
fi

# ---- 3. NCCL -----------------------------------------------------------------------------------
if [[ -x $build/bin/distributed_test ]]; then
  say "NCCL: one-rank group"
  if "$build/bin/distributed_test" --gtest_filter='Nccl*' > "$out/nccl.log" 2>&1; then
    if grep -q "SKIPPED" "$out/nccl.log"; then
      row nccl SKIP "$(grep -m1 -A1 SKIPPED "$out/nccl.log" | tail -1 | cut -c1-90)"
    else
      row nccl ok "one-rank group: all-reduce, broadcast, all-gather of host and GPU tensors"
    fi
  else
    row nccl FAIL "see $out/nccl.log"
  fi
  if [[ $gpus -ge 2 && -x $trainer ]]; then
    say "NCCL: two ranks on two GPUs, then a killed peer"
    if "$here/two_rank_nccl.sh" "$trainer" "$out" > "$out/nccl2.log" 2>&1; then
      row nccl2 ok "$(tail -1 "$out/nccl2.log")"
    else
      row nccl2 FAIL "$(tail -1 "$out/nccl2.log"); see $out/nccl2.log"
    fi
  else
    row nccl2 SKIP "2-rank NCCL needs 2 GPUs (NCCL rejects two ranks on one GPU)"
  fi
fi

# ---- 4. bf16 throughput, MFU, peak memory -------------------------------------------------------
# Samples the GPU memory used by process PID every 0.2 s; prints the maximum in MiB.
watch_memory() {
  local pid=$1 peak=0 m
  while kill -0 "$pid" 2>/dev/null; do
    m=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
        awk -F', *' -v p="$pid" '$1 == p { print $2 }')
    [[ -n $m && $m -gt $peak ]] && peak=$m
    sleep 0.2
  done
  echo "$peak"
}
if [[ -x $trainer && $cuda_ok == 1 ]]; then
  say "bf16 training, Qwen2.5-0.5B architecture, batch $batch x seq $seq, $steps steps"
  work=$out/qwen-run
  rm -rf "$work" && mkdir -p "$work"
  "$py" "$here/hf_train.py" --write-spec "$work" --batch "$batch" --seq "$seq" --steps "$steps" \
    --trainer-out "$work/run" > "$work/spec.json"
  "$trainer" train --spec "$work/spec.json" > "$out/sftctl-train.log" 2>&1 &
  pid=$!
  peak=$(watch_memory $pid)
  wait $pid
  rc=$?
  if [[ $rc == 0 ]]; then
    "$py" "$here/hf_train.py" --summarise "$work/run/metrics.jsonl" --batch "$batch" --seq "$seq" \
      --peak-mib "$peak" ${peak_tflops:+--peak-tflops "$peak_tflops"} > "$out/sftctl.json"
  else
    row train FAIL "sftctl-trainer exited $rc; see $out/sftctl-train.log"
  fi
  "$py" "$here/hf_train.py" --batch "$batch" --seq "$seq" --steps "$steps" \
    ${peak_tflops:+--peak-tflops "$peak_tflops"} > "$out/hf.json" 2> "$out/hf-train.log" &
  pid=$!
  peak=$(watch_memory $pid)
  wait $pid || row train FAIL "hf_train.py failed; see $out/hf-train.log"
  [[ -s $out/hf.json ]] && "$py" - "$out/hf.json" "$peak" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); r["peak_mib"] = int(sys.argv[2]); json.dump(r, open(sys.argv[1], "w"))
PY
fi

# ---- The table ---------------------------------------------------------------------------------
echo
echo "GPU checklist: $gpu_name x $gpus, torch $torch_version (CUDA $torch_cuda)"
printf '%-8s %-6s %s\n' phase result detail
for r in "${rows[@]}"; do echo "$r"; done
if [[ -s $out/sftctl.json || -s $out/hf.json ]]; then
  echo
  "$py" "$here/hf_train.py" --table "$out/sftctl.json" "$out/hf.json"
fi
