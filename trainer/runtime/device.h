// Device and precision policy.
//
// auto device: CUDA if available, else MPS (Apple), else CPU.
// auto precision: CUDA -> bf16 autocast on compute capability 8.0+ (Ampere and later), fp16
// autocast with dynamic loss scaling below it (T4, V100: no bf16 arithmetic); MPS -> fp32;
// CPU -> bf16 autocast when the CPU has native bf16 arithmetic (x86 AVX512-BF16/AMX-BF16, Arm
// BF16), else fp32. The CPU choice is backed by a measurement on the demo task
// (docs/precision.md): bf16 learned as well as fp32 and ran faster. Parameters, gradients and
// optimizer state stay fp32 (master weights); autocast runs matmuls in bf16 or fp16.
#pragma once

#include <torch/torch.h>

#include <string>

#include "common/status.h"
#include "trainer/runtime/cuda_capability.h"

namespace sftctl::trainer {

struct DevicePlan {
  torch::Device device = torch::kCPU;
  bool bf16 = false;  // autocast to bf16
  bool fp16 = false;  // autocast to fp16 (CUDA only)
  // Dynamic loss scaling (trainer/distributed/loss_scaler.h): on with fp16. Tests turn it on alone on the
  // CPU, where LibTorch has no fp16 autocast, to exercise the overflow handling.
  bool loss_scaling = false;
  std::string reason;  // why this device/precision was chosen, for the log
  // Non-empty when `auto` chose the CPU although the CUDA driver reports GPUs that LibTorch
  // cannot use (CudaFallbackWarning): callers show it prominently.
  std::string warning;
  std::string precision() const { return bf16 ? "bf16" : fp16 ? "fp16" : "fp32"; }
};

// Resolves the spec's `device` and `precision` fields. Errors when a requested device is
// absent (e.g. "cuda" on a machine without CUDA), bf16 is asked for on MPS, or fp16 off CUDA.
StatusOr<DevicePlan> ChooseDevice(const std::string& device, const std::string& precision);

// The device one rank of a job asks ChooseDevice for, from the spec's `device` (no probing: the
// caller passes `cuda_visible`, the CUDA devices this process sees, 0 without CUDA).
//  - A single process (`world_size` 1): `device` as it is.
//  - "cuda", or "auto" with CUDA visible: "cuda:LOCAL_RANK" when this process sees at least one
//    GPU per local rank (every rank sees all of the host's GPUs); else "cuda:0" (the launcher shows
//    each rank its own GPU, e.g. Slurm --gpus-per-task=1 or CUDA_VISIBLE_DEVICES per rank).
//  - "cuda:N" with several ranks on this host (`local_world_size` > 1): INVALID_ARGUMENT naming
//    field 'device' (it would put every rank on one GPU); with one rank per host, "cuda:N".
//  - anything else ("cpu", "mps", "auto" without CUDA): as it is.
StatusOr<std::string> RankDevice(const std::string& device, int world_size, int local_rank,
                                 int local_world_size, int cuda_visible);

// What `device: auto` should say when it falls back to the CPU although the CUDA driver reports
// GPUs: both CUDA versions and what to do. "" when there is nothing to say (`driver_gpus` 0, or
// `torch_cuda_usable`). `driver_cuda`: the newest CUDA the driver supports (e.g. 12040 for 12.4;
// 0 unknown); `libtorch_cuda`: the CUDA runtime LibTorch was built with (e.g. 13000), nullopt
// for a LibTorch without CUDA.
std::string CudaFallbackWarning(int driver_gpus, int driver_cuda, std::optional<long> libtorch_cuda,
                                bool torch_cuda_usable);
// "12.4" from 12040.
std::string CudaVersionText(long version);
// The CUDA runtime version this LibTorch was built with, or nullopt when it has no CUDA.
std::optional<long> LibTorchCudaVersion();

// Makes plan.device the current CUDA device of this process (nothing off CUDA), so that streams,
// the caching allocator and library handles live on it rather than on GPU 0.
void MakeDeviceCurrent(const DevicePlan& plan);

// `deterministic: true`: LibTorch's deterministic algorithms (in warn-only mode: an op without a
// deterministic CUDA kernel warns instead of failing the run), cuDNN autotuning off, and
// CUBLAS_WORKSPACE_CONFIG=:4096:8 (unless set) for cuBLAS. Call before any CUDA work.
void ConfigureDeterminism(bool deterministic);

// The precision half of ChooseDevice, without probing the machine: fills plan->bf16/fp16/
// loss_scaling/reason for plan->device. `cuda_cc`: the CUDA device's compute capability
// (nullopt: unknown, taken as bf16-capable).
Status PickPrecision(const std::string& precision, bool cpu_native_bf16,
                     const std::optional<ComputeCapability>& cuda_cc, DevicePlan* plan);

// Whether this CPU executes bf16 natively (reads /proc/cpuinfo flags).
bool CpuHasNativeBf16();

// Enables autocast for the plan's device while alive. Not reentrant.
class AutocastScope {
 public:
  explicit AutocastScope(const DevicePlan& plan);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool cpu_ = false, cuda_ = false;
};

// Whether autocast is on for `type`, and its dtype (on any LibTorch version).
bool AutocastEnabled(at::DeviceType type);
at::ScalarType AutocastDtype(at::DeviceType type);

// Autocast's settings for CPU and CUDA, captured to be re-entered later: activation
// checkpointing recomputes a forward (run under autocast) during backward (run outside it).
struct AutocastState {
  bool cpu = false, cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kBFloat16;
  bool cache = true;  // whether autocast caches casted weights
};
AutocastState CurrentAutocast();
// Sets autocast to `state` while alive, then restores the settings it found. Not reentrant.
class AutocastRestore {
 public:
  explicit AutocastRestore(const AutocastState& state);
  ~AutocastRestore();
  AutocastRestore(const AutocastRestore&) = delete;
  AutocastRestore& operator=(const AutocastRestore&) = delete;

 private:
  AutocastState saved_;
};
// Sets autocast's cast cache on or off.
void SetAutocastCache(bool enabled);

// Drops autocast's cache of casted weights; call after each optimizer step.
void ClearAutocastCache();

// Sets LibTorch's intra-op threads and returns the number in use. 0: the cores shared by the
// `local_ranks` processes of this host, max(1, cores / local_ranks).
int ConfigureThreads(int64_t requested, int local_ranks = 1);

}  // namespace sftctl::trainer
