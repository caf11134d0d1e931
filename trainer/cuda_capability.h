// The compute capability of a CUDA device, read through the CUDA driver (libcuda), which is
// present wherever LibTorch can use a GPU. LibTorch's C++ API has no call for it without the
// CUDA toolkit's headers, which pip LibTorch builds do not need.
//
// Linux-only seam: elsewhere (macOS) the answer is always "unknown".
// Thread safety: safe to call from any thread.
#pragma once

#include <optional>

namespace sftctl::trainer {

struct ComputeCapability {
  int major = 0, minor = 0;
};

// The capability of CUDA device `index` (as numbered after CUDA_VISIBLE_DEVICES), or nullopt
// when the driver cannot be loaded or queried.
std::optional<ComputeCapability> CudaComputeCapability(int index);

}  // namespace sftctl::trainer
