// Facts about a CUDA device read through the CUDA driver (libcuda), which is present wherever
// LibTorch can use a GPU: its compute capability and its total memory. LibTorch's C++ API has no
// call for them without the CUDA toolkit's headers, which pip LibTorch builds do not need.
//
// Linux-only seam: elsewhere (macOS) the answer is always "unknown".
// Thread safety: safe to call from any thread.
#pragma once

#include <cstdint>
#include <optional>

namespace sftctl::trainer {

struct ComputeCapability {
  int major = 0, minor = 0;
};

// The capability of CUDA device `index` (as numbered after CUDA_VISIBLE_DEVICES), or nullopt
// when the driver cannot be loaded or queried.
std::optional<ComputeCapability> CudaComputeCapability(int index);

// The total memory of CUDA device `index` in bytes (no context needed), or nullopt.
std::optional<int64_t> CudaTotalMemory(int index);

// What the driver itself reports, whatever LibTorch can use: its GPUs (after
// CUDA_VISIBLE_DEVICES) and the newest CUDA version it supports (e.g. 12040 for 12.4).
struct CudaDriverInfo {
  int devices = 0;
  int cuda_version = 0;
};
// nullopt when the driver cannot be loaded or initialised (no NVIDIA driver, or no GPU).
std::optional<CudaDriverInfo> CudaDriver();

}  // namespace sftctl::trainer
