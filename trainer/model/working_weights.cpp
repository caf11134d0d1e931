#include "trainer/model/working_weights.h"

#include <torch/csrc/autograd/variable.h>

#include <utility>

namespace sftctl::trainer {

void MarkChanged(const torch::Tensor& buffer) { torch::autograd::impl::bump_version(buffer); }

WorkingWeights::WorkingWeights(std::vector<torch::Tensor> masters, torch::ScalarType dtype)
    : masters_(std::move(masters)), dtype_(dtype) {
  for (const torch::Tensor& m : masters_) {
    TORCH_CHECK(m.dim() == 1 && m.is_contiguous() && m.scalar_type() == torch::kFloat32,
                "working weights: a master buffer must be flat, contiguous fp32");
  }
  MutexLock lock(&mu_);
  working_.resize(masters_.size());
  versions_.assign(masters_.size(), -1);
}

torch::Tensor WorkingWeights::View(size_t group, int64_t offset, at::IntArrayRef shape) {
  const torch::Tensor& master = masters_.at(group);
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  TORCH_CHECK(offset >= 0 && offset + numel <= master.numel(), "working weights: elements [", offset, ", ",
              offset + numel, ") lie outside buffer ", group, " of ", master.numel());
  MutexLock lock(&mu_);
  torch::Tensor& copy = working_[group];
  const int64_t version = static_cast<int64_t>(master._version());
  if (!copy.defined() || versions_[group] != version) {
    const torch::NoGradGuard no_grad;
    if (!copy.defined()) copy = torch::empty(master.sizes(), master.options().dtype(dtype_));
    copy.copy_(master);  // one cast kernel for the whole buffer
    versions_[group] = version;
    ++copies_;
  }
  return copy.narrow(0, offset, numel).view(shape);
}

int64_t WorkingWeights::copies() const {
  MutexLock lock(&mu_);
  return copies_;
}

}  // namespace sftctl::trainer
