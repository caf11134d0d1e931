// bf16 working weights: the forward reads the trainable weights from a low-precision copy of the
// optimizer's fp32 master buffers (trainer/distributed/optimizer.h keeps every trainable parameter
// as a view of one flat fp32 buffer per group), made with one cast kernel per buffer each time the
// buffer changed, instead of autocast casting each weight again at every step (the 395 casts of a
// Qwen2.5-0.5B step). A Projection bound to one (ProjectionImpl::BindWorkingWeight) multiplies
// with its slice, and its weight gradient is added in fp32 straight into the flat gradient buffer
// inside the GEMM (cuda_ops::WorkingLinear): no bf16 dW, no cast, no add per parameter. The master
// weights, the optimizer and `precision: bf16`'s meaning (fp32 master, bf16 compute) are unchanged.
//
// Freshness: a buffer's copy is made again when the buffer's version counter differs from the one
// the copy was made from. ATen's in-place writes bump it (the optimizer's ops, copy_ when a
// checkpoint is loaded into the parameters); a writer that bypasses ATen (raw pointers, a
// collective) calls MarkChanged on the buffer (FlatAdamW::Step does).
//
// Thread safety: View may be called from any thread (the forward's, the backward's recompute of a
// checkpointed layer); the copies are made under a mutex.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "common/mutex.h"

namespace sftctl::trainer {

// Bumps `buffer`'s version counter (shared with its views): what was derived from it is stale.
void MarkChanged(const torch::Tensor& buffer);

class WorkingWeights {
 public:
  // `masters`: the flat fp32 parameter buffers (not copied: the copy follows them). `dtype`: the
  // working precision (bf16).
  WorkingWeights(std::vector<torch::Tensor> masters, torch::ScalarType dtype);

  torch::ScalarType dtype() const { return dtype_; }
  size_t groups() const { return masters_.size(); }
  const torch::Tensor& master(size_t group) const { return masters_.at(group); }

  // Elements [offset, offset + numel(shape)) of buffer `group`'s current copy, shaped `shape`.
  // REQUIRES: the range lies inside the buffer.
  torch::Tensor View(size_t group, int64_t offset, at::IntArrayRef shape);

  // How many buffer copies have been made (tests: one per change, not one per use).
  int64_t copies() const;

 private:
  const std::vector<torch::Tensor> masters_;
  const torch::ScalarType dtype_;
  mutable Mutex mu_;
  std::vector<torch::Tensor> working_ GUARDED_BY(mu_);  // per group, undefined until first used
  std::vector<int64_t> versions_ GUARDED_BY(mu_);       // the master's version each copy is of
  int64_t copies_ GUARDED_BY(mu_) = 0;
};

// One weight's place in a WorkingWeights (buffer `group`, from `offset`); unbound when `copies` is
// null. Cheap to copy.
struct WorkingWeight {
  std::shared_ptr<WorkingWeights> copies;
  size_t group = 0;
  int64_t offset = 0;

  explicit operator bool() const { return copies != nullptr; }
  // The weight's current working copy, shaped `shape`. REQUIRES: bound.
  torch::Tensor View(at::IntArrayRef shape) const { return copies->View(group, offset, shape); }
  // Throws unless `param` starts at this place of the master buffers (what binding a weight
  // requires); `what` names the binder in the error. REQUIRES: bound.
  void CheckIsPlaceOf(const torch::Tensor& param, const char* what) const {
    TORCH_CHECK(param.data_ptr() == copies->master(group).data_ptr<float>() + offset, what,
                ": the weight is not the view of buffer ", group, " at ", offset);
  }
};

}  // namespace sftctl::trainer
