// Device and precision policy.
//
// auto device: CUDA if available, else MPS (Apple), else CPU.
// auto precision: CUDA -> bf16 autocast; MPS -> fp32; CPU -> bf16 autocast when the CPU has
// native bf16 arithmetic (x86 AVX512-BF16/AMX-BF16, Arm BF16), else fp32. The CPU choice is
// backed by a measurement on the demo task (docs/precision.md): bf16 learned as well as fp32
// and ran faster. Parameters, gradients and optimizer state stay fp32 (master weights);
// autocast runs matmuls in bf16.
#pragma once

#include <torch/torch.h>

#include <string>

#include "common/status.h"

namespace sftctl::trainer {

struct DevicePlan {
  torch::Device device = torch::kCPU;
  bool bf16 = false;   // autocast to bf16
  std::string reason;  // why this device/precision was chosen, for the log
  std::string precision() const { return bf16 ? "bf16" : "fp32"; }
};

// Resolves the spec's `device` and `precision` fields. Errors when a requested device is
// absent (e.g. "cuda" on a machine without CUDA) or bf16 is asked for on MPS.
StatusOr<DevicePlan> ChooseDevice(const std::string& device, const std::string& precision);

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
