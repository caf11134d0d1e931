#!/usr/bin/env bash
# The GPU checklist: run on a Linux machine with an NVIDIA GPU and a pip PyTorch (CUDA build), from
# a fresh copy of the tree, in one go. Prints one table at the end and writes it, with the failing
# tests' lines and the environment, to DIR/results/summary.txt (small: the file to fetch from a GPU
# machine; under 1 MB); raw logs go to DIR/results/ too (DIR: build/gpu).
#
#   bench/gpu/run.sh [--quick] [--python PY] [--jobs N] [--steps N] [--batch B] [--seq T] [--skip-build]
#                    [--skip-tests] [--tests REGEX] [--only-checks] [--profile] [--peak-tflops X]
#                    [--build DIR] [--lora-layers L] [--lora-steps N] [--lora-batch B]
#   --only-checks: build, runtime, tests, kernels and nccl; none of the benchmark rows (zero, train,
#            hf+compile, casts, lora, peft): a correctness pass in about three minutes on 16 cores.
#   --profile: the profile row: a short traced run of each job (full fine-tune and LoRA), where its
#            step's time goes (bench/gpu/trace_summary.py) under the tables (about a minute more).
#   --quick: build + tests + kernels + nccl + zero (6 steps) + the train rows at 10 steps (sftctl, HF eager,
#            HF + torch.compile) + the LoRA rows at 8 steps on 4 of the 7B shape's 28 layers (sftctl,
#            HF + PEFT eager, HF + PEFT + torch.compile): for a GPU machine rented
#            for a few minutes (438 s on an H200 with 16 cores, --lora-layers 2 --lora-steps 4).
#
# Nothing is preloaded: an LD_PRELOAD in the environment is dropped (and named in the summary), so
# the rows show what a user's job does.
#
# Phases (each one's result is a row of the table; a failed phase does not stop the later ones; a
# phase that needs a GPU is reported "skipped (no GPU)" when torch sees none):
#   1. build   the trainer-only preset against PY's torch (torch.utils.cmake_prefix_path): the
#              trainer and every trainer test binary (all the preset has). A CUDA wheel's CMake config
#              needs nvcc and the CUDA runtime headers of the wheel's CUDA version: from CUDA_HOME,
#              /usr/local/cuda or PATH, else NVIDIA's pip wheels (nvidia-cuda-nvcc, -runtime, -cccl)
#              already beside torch, else installed by pip into build/gpu/cuda-pip. Header-only and C
#              dependencies come from the system, or from bench/gpu/deps/ (bench/gpu/prepare.sh).
#              GoogleTest is built from source with torch's C++ ABI. The HF reference runs on PY.
#   1b. runtime `sftctl-trainer check-runtime`: where the trainer's std::filesystem calls bind (a pip
#              wheel's LibTorch exports a copy that crashes; trainer/libstdcxx_first.cmake) and the
#              compiler's libstdc++ kind (shared, or static only as /opt/gcc's); when it fails, the
#              tests row says SKIP instead of crashing in every test.
#   2. tests   ctest -L trainer: trainer runs with device "auto" train on the GPU (on the CPU when
#              there is none: the row says so).
#   2b. kernels the GPU kernels' tests (BUILD/bin/cuda_kernels_test, built when CMakeCache.txt has
#              SFTCTL_CUDA_KERNELS_BUILT:INTERNAL=ON) once more under compute-sanitizer's memcheck (from PATH, the
#              CUDA toolkit's bin/, or NVIDIA's pip wheel beside torch), with torch's caching allocator
#              off so that an out-of-bounds access hits a real allocation's edge: ok when every test
#              passes and memcheck reports 0 errors. FAIL when the option is ON but the binary is
#              missing; SKIP with a CPU wheel, when the option is not ON, or without compute-sanitizer.
#   3. nccl    a one-rank NCCL group (distributed_test's NcclOneRank test: every collective with
#              host and device tensors). NCCL refuses two ranks on one GPU ("Duplicate GPU
#              detected"), so a 2-rank NCCL job (and the dead-peer check) runs only with >= 2 GPUs.
#   3b. zero   ZeRO-1/2 (bench/gpu/zero_ranks.sh): the Qwen2.5-0.5B job on 2 NCCL ranks with
#              distributed.shard none / optimizer / gradients: rank 0's GPU peak and step time of each
#              sharded stage against none's, and its last loss. Needs >= 2 GPUs (else one SKIP row).
#   4. train   bf16 training throughput, MFU and peak memory (torch's allocator statistics: the
#              trainer's metrics, torch.cuda.max_memory_allocated for the reference) of the
#              Qwen2.5-0.5B architecture (random init, inline config) at seq T: sftctl-trainer vs
#              Hugging Face transformers with PyTorch SDPA (bench/gpu/hf_train.py; a plain-PyTorch
#              model with SDPA when transformers is missing or fails) on the same GPU and batch.
#              And what a user's job does with checkpoints, on the GPU: a tiny Qwen2 trained 2K steps
#              uninterrupted, and K steps then resumed to 2K in one folder (checkpoint every K,
#              keep: 1, so rotation removes a checkpoint; a leftover .tmp-checkpoint folder for the
#              resumed run to clear), deterministic: the resumed losses must equal the uninterrupted
#              run's (hf_train.py --write-resume-specs, --compare-resume). Without a GPU the resume
#              check runs on the CPU, and the row stays "skipped (no GPU)" unless it fails.
#   4a. hf+compile the same HF reference with torch.compile(loss_fn) (the model's forward and the
#              loss compiled together; the optimizer step eager), timed after >= 3 warm-up steps so
#              that compilation is not timed: tok/s, step ms, peak GiB, sftctl's ratio to it. SKIP
#              with the reason when torch.compile cannot run (no triton, no compiler).
#   4a'. casts  sftctl-trainer's same run with SFTCTL_NO_WORKING_WEIGHTS=1 (autocast casting the fp32
#              weights at every step, as before bf16 working weights: docs/precision.md): its tok/s,
#              step ms, peak GiB, the working weights' ratio to them, and the largest relative
#              difference between the two runs' step losses; the train row's log says how many
#              matrices read the working weights.
#   4b. lora   LoRA r 16, alpha 32, no dropout, on q/k/v/o/gate/up/down of the Qwen2.5-7B architecture
#              (inline config, random init; all 28 layers, 4 with --quick), frozen bf16 base, fp32
#              adapters, AdamW, bf16 autocast, batch B x seq T: sftctl-trainer (its spec's lora
#              section) in the lora row, HF + PEFT eager (peft row) and HF + PEFT + torch.compile
#              (peft+compile row), each with tok/s, step ms, peak GiB; the peft rows with sftctl's
#              ratio to them. The HF base is made in bf16 directly on the GPU. No peft: those rows
#              SKIP with the reason. On a GPU under 110 GiB the 28-layer rows use half the batch
#              (the plan needs about 96 GiB at batch 4) unless --lora-batch is given. An HF side
#              (here or in 4a) that runs out of GPU memory gets an OOM row, not a FAIL.
set -uo pipefail

usage() {
  sed -n '/^#   bench\/gpu\/run.sh/,/^#$/p' "$0" | sed '$d' >&2
  exit 2
}
py=${PYTHON:-python3} jobs=$(nproc) steps=20 batch=4 seq=2048 skip_build=0 skip_tests=0 peak_tflops='' build=''
tests_regex='' only_checks=0 profile=0
quick=0 lora_layers='' lora_steps='' lora_batch=''
while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) quick=1 steps=10 ;;
    --python) py=${2:?}; shift ;;
    --jobs) jobs=${2:?}; shift ;;
    --steps) steps=${2:?}; shift ;;
    --batch) batch=${2:?}; shift ;;
    --seq) seq=${2:?}; shift ;;
    --skip-build) skip_build=1 ;;
    --skip-tests) skip_tests=1 ;;
    --tests) tests_regex=${2:?}; shift ;;
    --only-checks) only_checks=1 ;;
    --profile) profile=1 ;;
    --peak-tflops) peak_tflops=${2:?}; shift ;;
    --build) build=${2:?}; shift ;;
    --lora-layers) lora_layers=${2:?}; shift ;;
    --lora-steps) lora_steps=${2:?}; shift ;;
    --lora-batch) lora_batch=${2:?}; shift ;;
    *) usage ;;
  esac
  shift
done
# The LoRA rows: the 7B shape's 28 layers and the train rows' steps; --quick: 4 layers, 8 steps.
lora_layers=${lora_layers:-$((quick == 1 ? 4 : 28))}
lora_steps=${lora_steps:-$((quick == 1 ? 8 : steps))}
lora_batch_note=''
if [[ -z $lora_batch ]]; then lora_batch=$batch; else lora_batch_note="--lora-batch $lora_batch"; fi

preload_note="none"
if [[ -n ${LD_PRELOAD:-} ]]; then
  preload_note="none (LD_PRELOAD=$LD_PRELOAD was set: dropped for this run)"
  echo "run.sh: dropping LD_PRELOAD=$LD_PRELOAD: the checklist runs what a user runs, without a preload" >&2
  unset LD_PRELOAD
fi
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here=$src/bench/gpu
build=$(realpath -m "${build:-$src/build/gpu}")
cd "$src" || exit 1  # (the presets are read from the current folder)
out=$build/results
mkdir -p "$out" "$build"
declare -a rows=()
row() { rows+=("$(printf '%-12s %-18s %s' "$1" "$2" "$3")"); }
say() { echo "== $* ($((SECONDS)) s)" >&2; }
NO_GPU="skipped (no GPU)"

# ---- The machine -------------------------------------------------------------------------------
py=$(command -v "$py" || echo "$py")
read -r torch_prefix torch_site torch_version torch_cuda abi cuda_ok gpu_name gpus gpu_mib < <("$py" - <<'PY' 2>/dev/null
import os, torch
ok = torch.cuda.is_available()
name = torch.cuda.get_device_name(0).replace(" ", "_") if ok else "none"
mib = torch.cuda.get_device_properties(0).total_memory // 2**20 if ok else 0
print(torch.utils.cmake_prefix_path, os.path.dirname(os.path.dirname(torch.__file__)), torch.__version__,
      torch.version.cuda, int(torch._C._GLIBCXX_USE_CXX11_ABI), int(ok), name,
      torch.cuda.device_count(), mib)
PY
) || true
if [[ -z ${torch_prefix:-} ]]; then
  echo "run.sh: $py cannot import torch (pass --python PY, the interpreter with the CUDA wheel)" >&2
  exit 1
fi
say "torch $torch_version (CUDA $torch_cuda, C++11 ABI $abi), GPU: $gpu_name x $gpus"
# The 28-layer LoRA plan needs about 96 GiB at batch 4 x 2048 (the trainer's estimate; HF's more): a
# smaller GPU (80 GiB) gets half the batch, said in the rows, unless --lora-batch chose one.
if [[ -z $lora_batch_note && $cuda_ok == 1 && $lora_layers -ge 20 && ${gpu_mib:-0} -lt 112640 && $lora_batch -gt 1 ]]; then
  lora_batch=$((lora_batch / 2))
  lora_batch_note="batch $lora_batch, half of $batch: the GPU has $((gpu_mib / 1024)) GiB"
fi
[[ $cuda_ok == 1 ]] || echo "run.sh: torch sees no GPU: the GPU phases are skipped, the tests run on the CPU" >&2

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

# GoogleTest with torch's C++ ABI (Debian's libgtest.a uses the new ABI; wheels <= 2.6 the old):
# the system's when torch uses the new ABI too, else built from its sources.
gtest_src=
for d in "$deps/usr/src/googletest" /usr/src/googletest; do [[ -f $d/CMakeLists.txt ]] && gtest_src=$d && break; done
build_gtest() {
  local dst=$build/gtest-abi$abi
  if [[ $abi == 1 ]] && compgen -G "/usr/lib/*/cmake/GTest/GTestConfig.cmake" >/dev/null; then return 0; fi
  [[ -f $dst/.done ]] && { prefix_path="$dst;$prefix_path"; return 0; }
  [[ -n $gtest_src ]] || { echo "no GoogleTest sources (run bench/gpu/prepare.sh)" >&2; return 1; }
  cmake -S "$gtest_src" -B "$build/gtest-build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$dst" \
    -DCMAKE_CXX_FLAGS="-D_GLIBCXX_USE_CXX11_ABI=$abi" -DBUILD_GMOCK=ON > "$out/gtest.log" 2>&1 &&
    cmake --build "$build/gtest-build" -j "$jobs" --target install >> "$out/gtest.log" 2>&1 && touch "$dst/.done" &&
    prefix_path="$dst;$prefix_path"
}

# ---- The CUDA toolkit a CUDA wheel's CMake config asks for --------------------------------------
# Sets cuda_args (CMake arguments) and cuda_note; returns 1 with cuda_note saying why when there is
# no toolkit. Order: CUDA_HOME, /usr/local/cuda, nvcc on PATH (a distribution's toolkit), NVIDIA's
# pip wheels beside torch (CUDA 13: nvidia/cu13/{bin,include,lib}; CUDA 12: nvidia/cuda_nvcc, ...),
# then the same wheels installed by pip into build/gpu/cuda-pip (needs the package index).
cuda_args=() cuda_note='' nvcc_used='' cuda_root=''
pip_toolkit_root() {  # pip_toolkit_root SITE -> the folder with bin/nvcc, include, lib; or nothing
  local site=$1 major=${torch_cuda%%.*}
  if [[ -x $site/nvidia/cu$major/bin/nvcc ]]; then echo "$site/nvidia/cu$major"; return; fi
  [[ -x $site/nvidia/cuda_nvcc/bin/nvcc ]] || return 0
  # CUDA 12's wheels are one folder each: one private root of links, as the toolkit lays them out.
  local merged=$build/cuda-toolkit d f
  rm -rf "$merged" && mkdir -p "$merged/include" "$merged/lib"
  ln -s "$site/nvidia/cuda_nvcc/bin" "$merged/bin"
  [[ -d $site/nvidia/cuda_nvcc/nvvm ]] && ln -s "$site/nvidia/cuda_nvcc/nvvm" "$merged/nvvm"
  for d in cuda_nvcc cuda_runtime cuda_cccl; do
    for f in "$site/nvidia/$d/include/"* "$site/nvidia/$d/lib/"*; do
      [[ -e $f ]] && ln -sfn "$f" "$merged/$(basename "$(dirname "$f")")/$(basename "$f")"
    done
  done
  echo "$merged"
}
find_cuda_toolkit() {
  [[ -n $torch_cuda && $torch_cuda != None ]] || { cuda_note="CPU wheel: no CUDA toolkit needed"; return 0; }
  local c nvcc='' root='' mm
  for c in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    [[ -n $c && -x $c/bin/nvcc ]] && { root=$c; nvcc=$c/bin/nvcc; break; }
  done
  [[ -n $nvcc ]] || nvcc=$(command -v nvcc || true)
  if [[ -z $nvcc ]]; then
    root=$(pip_toolkit_root "$torch_site")
    if [[ -z $root ]]; then
      mm=$(echo "$torch_cuda" | cut -d. -f1,2)
      local suffix="-cu${torch_cuda%%.*}"; [[ ${torch_cuda%%.*} -ge 13 ]] && suffix=
      say "no nvcc: pip install nvidia-cuda-{nvcc,runtime,cccl}$suffix==$mm.* into $build/cuda-pip"
      "$py" -m pip install -q --target "$build/cuda-pip" "nvidia-cuda-nvcc$suffix==$mm.*" \
        "nvidia-cuda-runtime$suffix==$mm.*" "nvidia-cuda-cccl$suffix==$mm.*" > "$out/cuda-pip.log" 2>&1 &&
        root=$(pip_toolkit_root "$build/cuda-pip")
    fi
    [[ -n $root ]] || { cuda_note="no nvcc for CUDA $torch_cuda (CUDA_HOME, /usr/local/cuda, PATH, pip: $out/cuda-pip.log)"; return 1; }
    nvcc=$root/bin/nvcc
  fi
  cuda_args=(-DCMAKE_CUDA_COMPILER="$nvcc")
  nvcc_used=$nvcc cuda_root=$root
  if [[ -n $root ]]; then
    cuda_args+=(-DCUDAToolkit_ROOT="$root" -DCUDA_TOOLKIT_ROOT_DIR="$root")
    # FindCUDAToolkit looks for an unversioned libcudart.so, which the pip wheels do not ship.
    local cudart
    cudart=$(ls "$root"/lib*/libcudart.so "$root"/lib*/libcudart.so.[0-9]* 2>/dev/null | head -n 1)
    if [[ -n $cudart && ! -e $root/lib/libcudart.so && ! -e $root/lib64/libcudart.so ]]; then
      mkdir -p "$build/cuda-lib" && ln -sf "$cudart" "$build/cuda-lib/libcudart.so"
      cuda_args+=(-DCUDA_cudart_LIBRARY="$build/cuda-lib/libcudart.so" -DCMAKE_CUDA_FLAGS="-L$build/cuda-lib")
    fi
  fi
  cuda_note="nvcc: $nvcc"
}

# "g++ at /opt/gcc/bin/g++: libstdc++ static only": the compiler the build used (CMakeCache.txt, else
# $CXX, else g++) and whether it finds a shared libstdc++ (trainer/libstdcxx_first.cmake).
cxx_runtime_kind() {
  local cxx
  cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null)
  cxx=${cxx:-${CXX:-g++}}
  if [[ $("$cxx" -print-file-name=libstdc++.so 2>/dev/null) == /* ]]; then
    echo "$cxx: libstdc++ shared"
  else
    echo "$cxx: libstdc++ static only"
  fi
}

# ---- 1. build -----------------------------------------------------------------------------------
# Every target of the trainer-only build: sftctl-trainer and every trainer test (a trainer-only
# build has nothing else), so no test the tests row runs lacks its binary. (GoogleTest's tests are
# discovered from the built binaries: ctest cannot list them before the build.)
if [[ $skip_build == 0 ]]; then
  say "build (trainer-only preset, tests on)"
  t0=$SECONDS
  if ! find_cuda_toolkit; then
    row build FAIL "$cuda_note"
  elif ! build_gtest; then
    row build FAIL "GoogleTest with torch's ABI: see $out/gtest.log"
  elif ! cmake --preset trainer-only -B "$build" -DSFTCTL_BUILD_TESTS=ON -DCMAKE_PREFIX_PATH="$prefix_path" \
      -DSFTCTL_TORCH_PYTHON="$py" "${cuda_args[@]}" > "$out/configure.log" 2>&1; then
    row build FAIL "configure: see $out/configure.log ($cuda_note)"
    tail -30 "$out/configure.log" >&2
  else
    if cmake --build "$build" -j "$jobs" > "$out/build.log" 2>&1; then
      nccl=$(grep -c "NCCL process groups on" "$out/configure.log")
      row build ok "$((SECONDS - t0)) s; NCCL compiled in: $([[ $nccl -gt 0 ]] && echo yes || echo NO); $cuda_note"
    else
      row build FAIL "see $out/build.log"
      grep -E 'error|FAILED' "$out/build.log" | head -20 >&2
    fi
  fi
fi
trainer=$build/bin/sftctl-trainer

# ---- 1b. runtime: where the trainer's std::filesystem calls bind ----------------------------------
# (trainer/runtime/cxx_runtime_check.h: a pip wheel's LibTorch exports a copy that crashes; the
# trainer refuses to start when its calls bind there.) One line with the reason instead of a failed
# tests row and a crash at the first checkpoint rotation.
runtime_ok=1
if [[ -x $trainer ]]; then
  if "$trainer" check-runtime > "$out/check-runtime.log" 2>&1; then
    row runtime ok "std::filesystem binds to $(grep -m1 -o -- '-> .*' "$out/check-runtime.log" | cut -c4-); $(cxx_runtime_kind)"
  else
    runtime_ok=0
    row runtime FAIL "$(grep -m1 -o 'will not run: [^(]*' "$out/check-runtime.log" | cut -c1-160); $(cxx_runtime_kind)"
  fi
fi

# ---- 2. tests -----------------------------------------------------------------------------------
rm -f "$out/ctest.log"
if [[ $skip_tests == 0 && -x $trainer && $runtime_ok == 0 ]]; then
  row tests SKIP "the runtime row failed: every test would crash the same way"
elif [[ $skip_tests == 0 && -x $trainer ]]; then
  where=$([[ $cuda_ok == 1 ]] && echo "GPU" || echo "CPU: no GPU")
  only=${tests_regex:+, only -R $tests_regex}
  say "trainer tests (ctest -L trainer$only, on the $where)"
  t0=$SECONDS
  if ctest --test-dir "$build" -L trainer ${tests_regex:+-R "$tests_regex"} -j $((jobs < 8 ? jobs : 8)) \
    --output-on-failure > "$out/ctest.log" 2>&1; then
    row tests ok "$(grep -E 'tests passed' "$out/ctest.log" | tail -1) ($((SECONDS - t0)) s, $where$only)"
  else
    row tests FAIL "$(grep -E 'tests passed|tests failed' "$out/ctest.log" | tail -1); see $out/ctest.log"
    grep -E '^\s+[0-9]+ - ' "$out/ctest.log" | head -10 >&2
  fi
  skipped=$(grep -c "Skipped\|SKIPPED" "$out/ctest.log")
  [[ $skipped -gt 0 ]] && row "" "" "$skipped skip lines in ctest.log (e.g. multi-rank CPU tests without Gloo)"
fi

# ---- 2b. kernels: the GPU kernels' tests under compute-sanitizer ----------------------------------
# cuda_kernels_test (a trainer test, built when the cache has SFTCTL_CUDA_KERNELS_BUILT:INTERNAL=ON) ran plainly
# in the tests row; here once more under memcheck, with torch's caching allocator off
# (PYTORCH_NO_CUDA_MEMORY_CACHING=1: each tensor its own cudaMalloc, so a kernel that reads past
# its tensor leaves the allocation memcheck knows). API errors are not reported: LibTorch's own
# probing calls return some by design; a failed launch fails the tests themselves.
find_compute_sanitizer() {
  local c d cache_nvcc
  c=$(command -v compute-sanitizer 2>/dev/null) && { echo "$c"; return 0; }
  cache_nvcc=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null)
  for d in "$cuda_root" "${nvcc_used:+$(dirname "$(dirname "$nvcc_used")")}" \
      "${cache_nvcc:+$(dirname "$(dirname "$cache_nvcc")")}" "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    [[ -n $d && -x $d/bin/compute-sanitizer ]] && { echo "$d/bin/compute-sanitizer"; return 0; }
  done
  # NVIDIA's pip wheel (nvidia-cuda-sanitizer-api) beside torch.
  c=$(find "$torch_site/nvidia" -maxdepth 4 -name compute-sanitizer -type f -perm -u+x 2>/dev/null | head -n 1)
  [[ -n $c ]] && echo "$c"
}
kernels_bin=$build/bin/cuda_kernels_test
if [[ $skip_tests == 0 ]]; then
  if [[ -z $torch_cuda || $torch_cuda == None ]]; then
    row kernels SKIP "CPU wheel: no CUDA kernels are built"
  elif [[ ! -x $kernels_bin ]]; then
    if grep -qs '^SFTCTL_CUDA_KERNELS_BUILT:INTERNAL=ON' "$build/CMakeCache.txt"; then
      row kernels FAIL "no bin/cuda_kernels_test although CMakeCache.txt has SFTCTL_CUDA_KERNELS_BUILT:INTERNAL=ON; see $out/build.log"
    else
      row kernels SKIP "not built: CMakeCache.txt has no SFTCTL_CUDA_KERNELS_BUILT:INTERNAL=ON"
    fi
  elif [[ $runtime_ok == 0 ]]; then
    row kernels SKIP "the runtime row failed"
  elif [[ $cuda_ok != 1 ]]; then
    row kernels "$NO_GPU" "cuda_kernels_test under compute-sanitizer memcheck"
  elif ! sanitizer=$(find_compute_sanitizer) || [[ -z $sanitizer ]]; then
    row kernels SKIP "no compute-sanitizer (PATH, the CUDA toolkit's bin/, NVIDIA's pip wheel beside torch)"
  else
    say "GPU kernels' tests under compute-sanitizer memcheck"
    t0=$SECONDS
    krc=0
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 600 "$sanitizer" --tool memcheck --report-api-errors no \
      --error-exitcode 3 "$kernels_bin" > "$out/kernels.log" 2>&1 || krc=$?
    errors=$(grep -o 'ERROR SUMMARY: [0-9]* error' "$out/kernels.log" | tail -n 1)
    passed=$(grep -o '\[  PASSED  \] [0-9]* test' "$out/kernels.log" | tail -n 1 | grep -o '[0-9]*')
    skips=$(grep -o '\[  SKIPPED \] [0-9]* test' "$out/kernels.log" | tail -n 1 | grep -o '[0-9]*')
    failed=$(grep -o '\[  FAILED  \] [0-9]* test' "$out/kernels.log" | tail -n 1 | grep -o '[0-9]*')
    errors=${errors#ERROR SUMMARY: }
    [[ -n $errors ]] && errors="${errors}s" || errors="no error summary"
    what="${passed:-0} tests passed${skips:+, $skips skipped}${failed:+, $failed FAILED}; memcheck: $errors"
    if [[ $krc == 0 ]]; then
      row kernels ok "$what ($((SECONDS - t0)) s, $sanitizer)"
    elif [[ -z $failed ]] && grep -q 'terminated before first instrumented API call' "$out/kernels.log"; then
      # (Every test skipped before touching the GPU: nothing for memcheck to watch.)
      row kernels SKIP "the tests made no CUDA call for memcheck to watch (${passed:-0} passed${skips:+, $skips skipped}); see $out/kernels.log"
    elif [[ $krc == 124 ]]; then
      row kernels FAIL "timed out after 600 s under memcheck; see $out/kernels.log"
    else
      row kernels FAIL "exit $krc: $what; see $out/kernels.log"
      grep -m 10 -E '^========= (Invalid|Program hit|  at )|\[  FAILED  \]' "$out/kernels.log" >&2
    fi
  fi
fi

# ---- 3. NCCL -----------------------------------------------------------------------------------
if [[ $cuda_ok != 1 ]]; then
  row nccl "$NO_GPU" "one-rank NCCL group"
elif [[ -x $build/bin/distributed_test ]]; then
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
    if PYTHON=$py bash "$here/two_rank_nccl.sh" "$trainer" "$out" > "$out/nccl2.log" 2>&1; then
      row nccl2 ok "$(tail -1 "$out/nccl2.log")"
    else
      row nccl2 FAIL "$(tail -1 "$out/nccl2.log"); see $out/nccl2.log"
    fi
  else
    row nccl2 SKIP "2-rank NCCL needs 2 GPUs (NCCL rejects two ranks on one GPU)"
  fi
else
  row nccl FAIL "no distributed_test binary (the build row failed)"
fi

# (an earlier run's figures never reach this run's tables)
rm -f "$out"/sftctl.json "$out"/hf.json "$out"/hf-compile.json "$out"/sftctl-casts.json "$out"/sftctl-metrics.jsonl "$out"/sftctl-lora.json \
  "$out"/sftctl-lora-metrics.jsonl "$out"/peft.json "$out"/peft-compile.json
lora_what="LoRA r 16, alpha 32, q/k/v/o/gate/up/down, bf16 base, fp32 adapters"
if [[ $only_checks == 0 ]]; then  # (the benchmark rows: zero, train, hf+compile, casts, lora, peft)
# ---- 3b. ZeRO-1/2 on two GPUs ------------------------------------------------------------------
# zero_ranks.sh: the Qwen2.5-0.5B job on 2 NCCL ranks with distributed.shard none, optimizer and
# gradients; rows zero1 and zero2 (rank 0's GPU peak and step time against none's, the last loss).
# NCCL refuses two ranks on one GPU, so with one GPU (or none) it prints a single SKIP row.
zero_steps=$((quick == 1 ? 6 : 12))
zero_gpus=$([[ $cuda_ok == 1 ]] && echo "${gpus:-0}" || echo 0)
if [[ $zero_gpus -ge 2 && ! -x $trainer ]]; then
  row zero FAIL "no sftctl-trainer (the build row failed)"
else
  [[ $zero_gpus -ge 2 ]] && say "ZeRO-1/2: distributed.shard none / optimizer / gradients on two GPUs, $zero_steps steps each"
  zero_rows=0
  while IFS=$'\t' read -r zero_phase zero_result zero_detail; do
    row "$zero_phase" "$zero_result" "$zero_detail"
    zero_rows=$((zero_rows + 1))
  done < <(PYTHON=$py bash "$here/zero_ranks.sh" "$trainer" "$out" "$zero_gpus" "$zero_steps" 2> "$out/zero.log")
  [[ $zero_rows -gt 0 ]] || row zero FAIL "zero_ranks.sh printed no row; see $out/zero.log"
fi

# ---- 4. bf16 throughput, MFU, peak memory; save, rotate, resume -------------------------------------
# resume_check DEVICE: the save / rotate / resume job (see the header) in $build/resume-check; sets
# resume_note to hf_train.py's one-line verdict (or what failed); returns 1 when it failed.
resume_steps=$(( steps < 2 ? 2 : (steps + 1) / 2 * 2 ))
resume_check() {
  local w=$build/resume-check r
  rm -rf "$w" && mkdir -p "$w"
  : > "$out/resume.log"
  if ! "$py" "$here/hf_train.py" --tiny --device "$1" --batch 4 --seq 128 --steps "$resume_steps" \
      --write-resume-specs "$w" >> "$out/resume.log" 2>&1; then
    resume_note="resume FAIL: hf_train.py --write-resume-specs failed; see $out/resume.log"
    return 1
  fi
  for r in full part resume; do
    # Left by an interrupted save: the resumed run's first checkpoint clears it (remove_all).
    [[ $r == resume ]] && mkdir -p "$w/part/.tmp-checkpoint-999999" && echo partial > "$w/part/.tmp-checkpoint-999999/x"
    if ! "$trainer" train --spec "$w/$r.json" >> "$out/resume.log" 2>&1; then
      resume_note="resume FAIL: the $r run failed; see $out/resume.log"
      tail -n 5 "$out/resume.log" >&2
      return 1
    fi
  done
  resume_note=$("$py" "$here/hf_train.py" --compare-resume "$w" --steps "$resume_steps" 2>&1 | tail -n 1)
  [[ $resume_note == "resume ok"* ]]
}

# throughput: the Qwen2.5-0.5B job, then the reference. Its run folder (a checkpoint of ~6 GB) is kept
# out of results/ and its checkpoint removed once read; its metrics.jsonl is copied to results/.
throughput() {
  local work=$build/qwen-run ok=1
  rm -rf "$work" && mkdir -p "$work"
  "$py" "$here/hf_train.py" --write-spec "$work" --batch "$batch" --seq "$seq" --steps "$steps" ${peak_tflops:+--peak-tflops "$peak_tflops"} \
    --trainer-out "$work/run" > "$work/spec.json"
  if "$trainer" train --spec "$work/spec.json" > "$out/sftctl-train.log" 2>&1; then
    cp "$work/run/metrics.jsonl" "$out/sftctl-metrics.jsonl"
    "$py" "$here/hf_train.py" --summarise "$out/sftctl-metrics.jsonl" --batch "$batch" --seq "$seq" \
      ${peak_tflops:+--peak-tflops "$peak_tflops"} > "$out/sftctl.json" || { train_fail+=("summarising metrics.jsonl"); ok=0; }
  else
    train_fail+=("sftctl-trainer failed; see $out/sftctl-train.log")
    ok=0
  fi
  rm -rf "$work/run"/checkpoint-*
  if ! "$py" "$here/hf_train.py" --batch "$batch" --seq "$seq" --steps "$steps" \
      ${peak_tflops:+--peak-tflops "$peak_tflops"} > "$out/hf.json" 2> "$out/hf-train.log"; then
    train_fail+=("hf_train.py failed; see $out/hf-train.log")
    ok=0
  fi
  [[ $ok == 1 ]]
}

# loss_diff A.jsonl B.jsonl: the largest |a - b| / |a| over the step losses two metrics.jsonl share.
loss_diff() {
  "$py" - "$1" "$2" <<'PY'
import json, sys
def losses(path):
    return [r["loss"] for r in map(json.loads, filter(str.strip, open(path))) if r.get("event") == "step"]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
n = min(len(a), len(b))
print("%.2g over %d steps" % (max((abs(x - y) / abs(x) for x, y in zip(a[:n], b[:n])), default=0.0), n))
PY
}

# casts_side: the throughput run again with SFTCTL_NO_WORKING_WEIGHTS=1 (phase 4a'), as the casts row.
casts_side() {
  local work=$build/casts-run used
  rm -rf "$work" && mkdir -p "$work"
  used=$(grep -m1 -o 'bf16 working weights: [0-9]* matrices' "$out/sftctl-train.log" || echo 'working weights NOT used')
  "$py" "$here/hf_train.py" --write-spec "$work" --batch "$batch" --seq "$seq" --steps "$steps" ${peak_tflops:+--peak-tflops "$peak_tflops"} \
    --trainer-out "$work/run" > "$work/spec.json"
  if SFTCTL_NO_WORKING_WEIGHTS=1 "$trainer" train --spec "$work/spec.json" > "$out/sftctl-casts.log" 2>&1 &&
    "$py" "$here/hf_train.py" --summarise "$work/run/metrics.jsonl" --batch "$batch" --seq "$seq" --impl "sftctl casts" \
      ${peak_tflops:+--peak-tflops "$peak_tflops"} > "$out/sftctl-casts.json"; then
    extra="$used; step losses differ by at most $(loss_diff "$out/sftctl-metrics.jsonl" "$work/run/metrics.jsonl")" \
      add_row casts "$out/sftctl-casts.json" "$out/sftctl.json"
  else
    row casts FAIL "the SFTCTL_NO_WORKING_WEIGHTS=1 run failed; see $out/sftctl-casts.log"
  fi
  rm -rf "$work"
}

# add_row PHASE SIDE.json [SFTCTL.json]: hf_train.py --row's line (ok / SKIP, the side's tok/s, step ms,
# peak GiB and sftctl's ratio to it) as a row of the table; EXTRA (when set) is added to its detail.
add_row() {
  local p r d
  if IFS=$'\t' read -r p r d < <("$py" "$here/hf_train.py" --row "$@" 2>/dev/null); then
    row "$p" "$r" "$d${extra:+; $extra}"
  else
    row "$1" FAIL "no row from $2"
  fi
}

# hf_side PHASE JSON LOG SFTCTL.json ARGS...: one reference side (hf_train.py ARGS) and its row: its figures
# and sftctl's ratio to them; SKIP with hf_train.py's reason (no peft, torch.compile unavailable);
# FAIL when it failed (a crash, out of memory).
hf_side() {
  local phase=$1 json=$2 log=$3 base=$4
  shift 4
  if "$py" "$here/hf_train.py" "$@" ${peak_tflops:+--peak-tflops "$peak_tflops"} > "$json" 2> "$log"; then
    extra='' add_row "$phase" "$json" "$base"
  else
    rm -f "$json"
    row "$phase" FAIL "hf_train.py $* failed: $(tail -n 1 "$log" | cut -c1-120); see $log"
  fi
}

# lora_sftctl: the LoRA job (hf_train.py --write-spec --lora: the spec's lora section, base_dtype bf16)
# in $build/lora-run, its metrics summarised into results/sftctl-lora.json; its checkpoint (with a
# model.config run, the base weights too: 15 GB or more for 28 layers) removed once the run ends.
lora_args=(--lora --layers "$lora_layers" --batch "$lora_batch" --seq "$seq" --steps "$lora_steps")
lora_sftctl() {
  local work=$build/lora-run rc=0
  rm -rf "$work" && mkdir -p "$work"
  "$py" "$here/hf_train.py" --write-spec "$work" "${lora_args[@]}" ${peak_tflops:+--peak-tflops "$peak_tflops"} \
    --trainer-out "$work/run" > "$work/spec.json" || { lora_note="hf_train.py --write-spec --lora failed"; return 1; }
  "$trainer" train --spec "$work/spec.json" > "$out/sftctl-lora.log" 2>&1 || rc=$?
  rm -rf "$work/run"/checkpoint-*
  if [[ $rc != 0 ]]; then
    lora_note="sftctl-trainer exited $rc: $( (grep -m1 '^error' "$out/sftctl-lora.log" || tail -n 1 "$out/sftctl-lora.log") | cut -c1-120); see $out/sftctl-lora.log"
    return 1
  fi
  cp "$work/run/metrics.jsonl" "$out/sftctl-lora-metrics.jsonl"
  "$py" "$here/hf_train.py" --summarise "$out/sftctl-lora-metrics.jsonl" "${lora_args[@]}" --impl "sftctl lora" \
    ${peak_tflops:+--peak-tflops "$peak_tflops"} > "$out/sftctl-lora.json" ||
    { lora_note="summarising the LoRA run's metrics.jsonl failed"; return 1; }
}

train_fail=() resume_note=
if [[ ! -x $trainer ]]; then
  row train FAIL "no sftctl-trainer (the build row failed)"
  row hf+compile SKIP "no sftctl-trainer to compare with (the build row failed)"
else
  dev=$([[ $cuda_ok == 1 ]] && echo cuda || echo cpu)
  say "save, rotate (keep 1) and resume: $resume_steps steps, on the $dev"
  resume_check "$dev" || train_fail+=("the resume check on the $dev")
  if [[ $cuda_ok == 1 ]]; then
    say "bf16 training, Qwen2.5-0.5B architecture, batch $batch x seq $seq, $steps steps"
    throughput
  fi
  if [[ ${#train_fail[@]} -gt 0 ]]; then
    fails=$(printf '%s; ' "${train_fail[@]}")
    row train FAIL "${fails%; }"
  elif [[ $cuda_ok == 1 ]]; then
    row train ok "$("$py" "$here/hf_train.py" --pair "$out/sftctl.json" "$out/hf.json") ($steps steps each, table below); save, rotate, resume on the GPU"
  else
    row train "$NO_GPU" "bf16 throughput, MFU, peak memory vs the HF reference; resume check ran on the CPU"
  fi
  row "" "" "$resume_note"
  if [[ $cuda_ok == 1 ]]; then
    say "the same with torch.compile on the HF side, $steps steps"
    hf_side hf+compile "$out/hf-compile.json" "$out/hf-compile.log" "$out/sftctl.json" \
      --compile --batch "$batch" --seq "$seq" --steps "$steps"
    if [[ -s $out/sftctl.json ]]; then
      say "sftctl without bf16 working weights (SFTCTL_NO_WORKING_WEIGHTS=1), $steps steps"
      casts_side
    else
      row casts SKIP "the train row's sftctl run failed"
    fi
  else
    row hf+compile "$NO_GPU" "the HF reference with torch.compile(loss_fn): forward + loss"
    row casts "$NO_GPU" "sftctl without bf16 working weights: tok/s and step losses side by side"
  fi
fi

# ---- 4b. LoRA on the Qwen2.5-7B shape: sftctl-trainer, HF + PEFT, HF + PEFT + torch.compile ------
if [[ $cuda_ok != 1 ]]; then
  row lora "$NO_GPU" "$lora_what: sftctl-trainer, HF + PEFT eager, HF + PEFT + torch.compile"
elif [[ ! -x $trainer ]]; then
  row lora FAIL "no sftctl-trainer (the build row failed)"
else
  say "LoRA, Qwen2.5-7B architecture ($lora_layers layers), batch $lora_batch x seq $seq, $lora_steps steps"
  lora_note=''
  if lora_sftctl; then
    extra="$lora_what${lora_batch_note:+; $lora_batch_note}" add_row lora "$out/sftctl-lora.json"
  else
    row lora FAIL "$lora_note"
  fi
  say "LoRA: HF + PEFT, eager and with torch.compile"
  hf_side peft "$out/peft.json" "$out/peft.log" "$out/sftctl-lora.json" "${lora_args[@]}"
  hf_side peft+compile "$out/peft-compile.json" "$out/peft-compile.log" "$out/sftctl-lora.json" "${lora_args[@]}" --compile
fi
fi  # only_checks

# ---- 5. profile: where a step's time goes (--profile) ---------------------------------------------
# A short run of each job (6 steps; LibTorch's profiler traces steps 2-4: trainer/training/step_profiler.h)
# apart from the rows' runs, whose timings tracing would slow; trace_summary.py's summary of each goes
# to results/profile-{full,lora}.txt and under the tables.
profile_run() {  # profile_run NAME SPEC-ARGS...: one traced run, its summary in results/profile-NAME.txt
  local name=$1 work=$build/profile-$1 rc=0
  shift
  rm -rf "$work" && mkdir -p "$work"
  { "$py" "$here/hf_train.py" --write-spec "$work" "$@" --seq "$seq" --steps 6 --trainer-out "$work/run" \
      > "$work/spec.json" &&
      "$trainer" train --spec "$work/spec.json" --profile "$work/trace" --profile-steps 3 > "$out/profile-$name.log" 2>&1 &&
      "$py" "$here/trace_summary.py" "$work/trace/trace-rank0.json" --steps 3 --top 20 > "$out/profile-$name.txt"; } ||
    rc=1
  rm -rf "$work"
  return $rc
}
rm -f "$out"/profile-full.txt "$out"/profile-lora.txt
if [[ $profile == 1 ]]; then
  if [[ $cuda_ok != 1 ]]; then
    row profile "$NO_GPU" "the traced runs' kernels need a GPU"
  elif [[ ! -x $trainer ]]; then
    row profile FAIL "no sftctl-trainer (the build row failed)"
  else
    say "profile: a traced run of the full fine-tune and of LoRA"
    prof_fail=()
    profile_run full --batch "$batch" || prof_fail+=(full)
    profile_run lora --lora --layers "$lora_layers" --batch "$lora_batch" || prof_fail+=(lora)
    if ((${#prof_fail[@]} == 0)); then
      row profile ok "steps 2-4 of a 6-step run of each job traced; where their time goes: below"
    else
      row profile FAIL "the ${prof_fail[*]} run failed; see $out/profile-${prof_fail[0]}.log"
    fi
  fi
fi

# ---- The summary: the table, the failing tests, the environment ----------------------------------
# The failing tests' lines of ctest.log: ctest's list, then each failure's assertion lines and crashes.
failing_tests() {
  if [[ $skip_tests == 1 || ! -s $out/ctest.log ]]; then echo "  (the tests row did not run)"; return; fi
  if ! grep -q "The following tests FAILED" "$out/ctest.log"; then echo "  none"; return; fi
  sed -n '/The following tests FAILED/,$p' "$out/ctest.log" | grep -E '^\s+[0-9]+ - ' | head -n 100
  echo "  -- their failures:"
  awk '/: Failure$/ {n = 8}
       /\[  FAILED  \]|\*\*\*(Failed|Exception|Timeout)|Segmentation fault|terminate called|Child aborted/ {print; n = 0; next}
       n > 0 {print; n--}' "$out/ctest.log" | cut -c1-300 | head -n 400
}

environment() {
  local smi os nvcc_v needed
  smi=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | paste -sd ';' -)
  # shellcheck disable=SC1091
  os=$(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")
  [[ -n $nvcc_used ]] && nvcc_v=$("$nvcc_used" --version 2>/dev/null | grep -o 'release [0-9.]*, V[0-9.]*')
  needed=$(readelf -d "$trainer" 2>/dev/null | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | paste -sd ' ' -)
  echo "  GPU           ${smi:-none (nvidia-smi: none, or no driver)}"
  echo "  torch         $torch_version (CUDA $torch_cuda, C++11 ABI $abi) in $torch_site"
  echo "  python        $py $("$py" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null)"
  echo "  transformers  $("$py" -c 'import transformers; print(transformers.__version__)' 2>/dev/null || echo none)"
  echo "  g++           $(g++ --version 2>/dev/null | head -n 1)"
  echo "  C++ compiler  $(cxx_runtime_kind)"
  echo "  nvcc          ${nvcc_used:-none used}${nvcc_v:+ ($nvcc_v)}"
  echo "  cmake         $(cmake --version 2>/dev/null | head -n 1); ninja $(ninja --version 2>/dev/null)"
  echo "  OS            ${os:-?}, kernel $(uname -r), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "  preload       $preload_note"
  echo "  trainer links ${needed:-?}"
}

summary() {
  echo "GPU checklist: $gpu_name x $gpus, torch $torch_version (CUDA $torch_cuda), $jobs jobs, $SECONDS s$([[ $quick == 1 ]] && echo ", --quick")$([[ $only_checks == 1 ]] && echo ", --only-checks")"
  printf '%-12s %-18s %s\n' phase result detail
  for r in "${rows[@]}"; do echo "$r"; done
  if [[ -s $out/sftctl.json || -s $out/hf.json || -s $out/hf-compile.json ]]; then
    echo
    "$py" "$here/hf_train.py" --table "$out/sftctl.json" "$out/hf.json" "$out/hf-compile.json"
  fi
  if [[ -s $out/sftctl-lora.json || -s $out/peft.json || -s $out/peft-compile.json ]]; then
    echo
    echo "LoRA (${lora_what#LoRA }) on $lora_layers of the Qwen2.5-7B shape's 28 layers, batch $lora_batch:"
    "$py" "$here/hf_train.py" --table "$out/sftctl-lora.json" "$out/peft.json" "$out/peft-compile.json"
  fi
  for p in full lora; do
    [[ -s $out/profile-$p.txt ]] || continue
    echo
    echo "where a step's time goes, $([[ $p == full ]] && echo "full fine-tune" || echo "LoRA, $lora_layers layers") (--profile; bench/gpu/trace_summary.py):"
    cat "$out/profile-$p.txt"
  done
  # The trainer's own resource figures (trainer/training/gpu_metrics.h: CUDA allocator, NVML through dlopen,
  # MFU) from its last step record: absent fields mean that source was not available on this machine.
  for m in "$out/sftctl-metrics.jsonl" "$out/sftctl-lora-metrics.jsonl"; do
    [[ -s $m ]] || continue
    "$py" - "$m" <<'PY'
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r.get("event") == "step"]
keys = ("gpu_mem_allocated_mb", "gpu_mem_reserved_mb", "gpu_mem_peak_mb", "gpu_util_pct", "gpu_power_w",
        "mfu", "rss_mb")
what = "the LoRA run's last step" if "lora" in sys.argv[1] else "last step"
if steps:
    s = steps[-1]
    print("trainer metrics, %s: " % what + (", ".join("%s %s" % (k, s[k]) for k in keys if k in s) or "none"))
PY
  done
  echo
  echo "failing tests (from $out/ctest.log):"
  failing_tests
  echo
  echo "environment:"
  environment
}

echo
summary | head -c 1000000 > "$out/summary.txt"
cat "$out/summary.txt"
echo "(this summary: $out/summary.txt, $(wc -c < "$out/summary.txt") bytes)"
! printf '%s\n' "${rows[@]}" | grep -qE '^\S*\s+FAIL'
