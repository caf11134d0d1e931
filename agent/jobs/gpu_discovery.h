// GPU discovery: which CUDA devices this host has, without linking CUDA or LibTorch.
//
// Order: an explicit override (--gpus "0,1" or "none"), else `nvidia-smi --query-gpu` when it is on
// PATH, else no GPUs (a CPU host runs CPU jobs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace sftctl::agent {

struct GpuInfo {
  int index = 0;
  std::string name;
  uint64_t memory_mib = 0;
};

// Parses an override list: "" or "none" -> no GPUs; "0,1,3" -> those indices. INVALID_ARGUMENT on
// anything else (naming the bad item), duplicates included.
StatusOr<std::vector<GpuInfo>> ParseGpuList(const std::string& list);
// Parses `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits` output.
StatusOr<std::vector<GpuInfo>> ParseNvidiaSmi(const std::string& csv);
// Runs nvidia-smi when present; an empty list when it is absent or fails.
std::vector<GpuInfo> DiscoverGpus();

}  // namespace sftctl::agent
