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
#include "trainer/cuda_capability.h"

namespace sftctl::trainer {

struct DevicePlan {
  torch::Device device = torch::kCPU;
  bool bf16 = false;  // autocast to bf16
  bool fp16 = false;  // autocast to fp16 (CUDA only)
  // Dynamic loss scaling (trainer/loss_scaler.h): on with fp16. Tests turn it on alone on the
  // CPU, where LibTorch has no fp16 autocast, to exercise the overflow handling.
  bool loss_scaling = false;
  std::string reason;  // why this device/precision was chosen, for the log
  std::string precision() const { return bf16 ? "bf16" : fp16 ? "fp16" : "fp32"; }
};

// Resolves the spec's `device` and `precision` fields. Errors when a requested device is
// absent (e.g. "cuda" on a machine without CUDA), bf16 is asked for on MPS, or fp16 off CUDA.
StatusOr<DevicePlan> ChooseDevice(const std::string& device, const std::string& precision);

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
