// Projection: a linear layer y = x W^T + b with HF parameter names ("weight", "bias") and an
// optional LoRA adapter (submodules "lora_A", "lora_B", as PEFT names them), so that the
// adapter's parameters are "<module path>.lora_A.weight" [r, in] and ".lora_B.weight" [out, r].
//
//   y = x W^T + b + scale * lora_B(lora_A(dropout(x)))
//
// Without an adapter it is exactly torch::nn::Linear. See trainer/lora.h for how adapters are
// added, saved and merged.
//
// Thread safety: like any torch::nn::Module.
#pragma once

#include <torch/torch.h>

namespace sftctl::trainer {

class ProjectionImpl : public torch::nn::Module {
 public:
  // weight [out, in] and bias [out] initialised like torch::nn::Linear (callers usually
  // overwrite them).
  ProjectionImpl(int64_t in_features, int64_t out_features, bool bias);
  torch::Tensor forward(const torch::Tensor& x);

  // Adds lora_A [r, in] (kaiming-uniform with a = sqrt(5), as PEFT) and lora_B [out, r]
  // (zeros), on the weight's device, in fp32. REQUIRES: no adapter yet.
  void EnableLora(int64_t r, double scale, double dropout);
  bool has_lora() const { return !lora_A.is_empty(); }

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

  torch::Tensor weight, bias;  // bias undefined without bias
  torch::nn::Linear lora_A{nullptr}, lora_B{nullptr};
  double lora_scale = 0;
  double lora_dropout = 0;

 private:
  int64_t in_, out_;
};
TORCH_MODULE(Projection);

}  // namespace sftctl::trainer
