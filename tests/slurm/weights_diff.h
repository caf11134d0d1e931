// MaxAbsDiff: how far apart the final weights of two runs are, for the Slurm tests that compare a
// Slurm job's weights with `run --local --ranks 2` of the same spec.
//
// Thread safety: a pure function of the two files.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/formats/safetensors.h"

namespace sftctl::testing {

// The largest absolute difference between the F32 tensors of two safetensors files (infinity when
// their tensors differ in name, type or shape, or a file cannot be read).
inline double MaxAbsDiff(const std::string& a_path, const std::string& b_path) {
  auto a = safetensors::Reader::Open(a_path);
  auto b = safetensors::Reader::Open(b_path);
  if (!a.ok() || !b.ok() || (*a)->tensors().size() != (*b)->tensors().size()) return INFINITY;
  double worst = 0;
  for (const auto& ta : (*a)->tensors()) {
    const auto* tb = (*b)->Find(ta.name);
    if (tb == nullptr || tb->dtype != safetensors::DType::kF32 || ta.dtype != tb->dtype ||
        ta.shape != tb->shape)
      return INFINITY;
    for (int64_t i = 0; i < ta.numel(); ++i) {
      float x, y;
      std::memcpy(&x, (*a)->data(ta) + 4 * i, 4);
      std::memcpy(&y, (*b)->data(*tb) + 4 * i, 4);
      worst = std::max(worst, static_cast<double>(std::fabs(x - y)));
    }
  }
  return worst;
}

}  // namespace sftctl::testing
