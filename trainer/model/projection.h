// Projection: a linear layer y = x W^T + b with HF parameter names ("weight", "bias") and an
// optional LoRA adapter (submodules "lora_A", "lora_B", as PEFT names them), so that the
// adapter's parameters are "<module path>.lora_A.weight" [r, in] and ".lora_B.weight" [out, r].
//
//   y = x W^T + b + scale * lora_B(lora_A(dropout(x)))
//
// Without an adapter it is exactly torch::nn::Linear. See trainer/model/lora.h for how adapters are
// added, saved and merged.
//
// A frozen base weight may be stored in bf16 (lora.base_dtype, trainer/model/lora.h) while the
// activations are fp32: MixedLinear is the one rule for that case, used by every matmul of the
// model's weights.
//
// A trainable weight may instead be read from bf16 working weights (trainer/model/working_weights.h,
// BindWorkingWeight) on the CUDA path.
//
// Thread safety: like any torch::nn::Module.
#pragma once

#include <torch/torch.h>

#include <initializer_list>
#include <memory>
#include <vector>

#include "trainer/model/working_weights.h"

namespace sftctl::trainer {

// Whether autocast is on for x's device (CPU or CUDA).
bool LinearAutocast(const torch::Tensor& x);
// The dtype x W^T runs in: autocast's when autocast is on for x's device, else W's.
torch::ScalarType LinearComputeDtype(const torch::Tensor& x, const torch::Tensor& w);

// x W^T + b. Under autocast: plain linear, so the product and its result are in autocast's
// dtype whatever W is stored in (a bf16 frozen base on CUDA: no fp32 result, no fp32 copies
// saved for backward). When autocast is off and W's dtype differs from x's (a bf16 frozen
// weight, fp32 activations), x and b are cast to W's dtype, the product runs there and returns
// in x's dtype; autograd saves the cast x and W itself, never a widened copy of W. Otherwise
// plain linear.
torch::Tensor MixedLinear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b = {});

class ProjectionImpl : public torch::nn::Module {
 public:
  // weight [out, in] and bias [out] initialised like torch::nn::Linear (callers usually
  // overwrite them); with `initialise` false they are torch::empty, never written, and nothing
  // is drawn from the RNG (for a load that overwrites them).
  ProjectionImpl(int64_t in_features, int64_t out_features, bool bias, bool initialise = true);
  torch::Tensor forward(const torch::Tensor& x);

  // The adapter's input and output follow x's dtype (fp32 A and B, see MixedLinear).
  // Adds lora_A [r, in] (kaiming-uniform with a = sqrt(5), as PEFT) and lora_B [out, r]
  // (zeros), in fp32, drawn on the CPU (the same values whatever the device) and then moved to
  // the weight's device. REQUIRES: no adapter yet.
  void EnableLora(int64_t r, double scale, double dropout);
  bool has_lora() const { return !lora_A.is_empty(); }

  // Reads the weight from its working copy (trainer/model/working_weights.h) whenever the model
  // takes its CUDA path (cuda_ops::Supported) under autocast in the copy's dtype, its gradient then
  // added into weight.grad() inside the GEMM (cuda_ops::WorkingLinear); otherwise as before. An
  // unbound `working` unbinds. REQUIRES: weight is the view of the master buffer at the place
  // `working` names, and its .grad() the optimizer's fp32 view of the matching gradient buffer
  // (trainer/distributed/optimizer.h).
  void BindWorkingWeight(WorkingWeight working);
  bool has_working_weight() const { return static_cast<bool>(working_); }

  // The working weight Linear reads x's product from: bound, and autocast on x's device in its
  // dtype on the CUDA path. Unbound otherwise (the product is then MixedLinear's).
  const WorkingWeight& WorkingWeightFor(const torch::Tensor& x) const;

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

  torch::Tensor weight, bias;  // bias undefined without bias
  torch::nn::Linear lora_A{nullptr}, lora_B{nullptr};
  double lora_scale = 0;
  double lora_dropout = 0;

 private:
  // x W^T + b, through the working weight where it applies.
  torch::Tensor Linear(const torch::Tensor& x);

  int64_t in_, out_;
  WorkingWeight working_;
};
TORCH_MODULE(Projection);

// x times the weights of `projections` stacked along their outputs, plus their biases: [.., sum of
// their out_features], the outputs in the given order. One cuda_ops::WorkingLinear over the stacked
// slice of the working copy -- one GEMM forward, one for dx and one dW GEMM backward, where one
// by one would take one of each per projection and an add per extra dx -- when every projection
// reads its working weight (WorkingWeightFor), none carries an adapter, all or none has a bias, and
// the weights lie next to each other in this order in the master buffer, its gradient buffer and
// the working copy (as the optimizer lays out q/k/v or gate/up when they share a buffer: with
// weight decay, or without biases). Otherwise an undefined tensor: the caller runs them one by one.
torch::Tensor StackedWorkingLinear(const torch::Tensor& x,
                                   std::initializer_list<ProjectionImpl*> projections);

// Where a parameter lies in the buffers of a WorkingWeights: buffer `group`, from `offset`.
struct FlatPlace {
  torch::Tensor param;
  size_t group = 0;
  int64_t offset = 0;
};
// Binds every Projection of `model` whose weight requires grad and is one of `places`' params to
// `working` (ProjectionImpl::BindWorkingWeight). Returns how many it bound.
int BindWorkingWeights(torch::nn::Module& model, const std::shared_ptr<WorkingWeights>& working,
                       const std::vector<FlatPlace>& places);

}  // namespace sftctl::trainer
