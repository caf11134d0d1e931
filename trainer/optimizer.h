// AdamW over flat buffers, with the learning-rate schedule and gradient clipping.
//
// At construction every trainable parameter is moved into one of two contiguous fp32 buffers
// (with / without weight decay) and becomes a view of it; its .grad() becomes a view of a
// matching gradient buffer, into which autograd accumulates in place. A step is then a
// handful of kernels over two tensors instead of a loop over hundreds of small ones.
// Semantics equal torch.optim.AdamW (decoupled weight decay, bias correction).
//
// The update kernel depends on the device (AdamWKernel): on the CPU the one-pass loop of
// trainer/fused_ops.h; on CUDA LibTorch's own fused AdamW (at::_fused_adamw_, LibTorch 2.0+: one
// kernel reading each buffer once, no temporaries), or plain tensor ops where LibTorch lacks it.
// The gradient norm off the CPU is a reduction per buffer, without a squared copy.
//
// Thread safety: none; one training loop owns it.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "common/spec.h"

namespace sftctl::trainer {

// lr at optimizer step `step` (0-based): linear warm-up to `lr`, then cosine/linear decay to
// lr * min_lr_ratio at `total_steps`, or constant.
double LearningRate(const TrainSpec& t, int64_t step, int64_t total_steps);

enum class AdamWKernel {
  kAuto,        // PickAdamWKernel for the parameters' device
  kCpuFused,    // fused::AdamWStep (CPU only)
  kTorchFused,  // at::_fused_adamw_ (REQUIRES TorchFusedAdamWRuns(device))
  kOps,         // mul_/add_/addcmul_/addcdiv_ on the whole buffers (any device)
};
// Whether this LibTorch has a fused AdamW kernel for `device`: CUDA from 2.0, CPU from 2.4.
bool TorchFusedAdamWRuns(const torch::Device& device);
// The kernel kAuto means on `device`: the CPU keeps kCpuFused; CUDA (and MPS) take kTorchFused
// when `torch_fused` (TorchFusedAdamWRuns), else kOps.
AdamWKernel PickAdamWKernel(const torch::Device& device, bool torch_fused);
const char* AdamWKernelName(AdamWKernel k);

class FlatAdamW {
 public:
  // `params`: (name, parameter) pairs; parameters that do not require grad are skipped.
  // `decay(name, p)` picks the weight-decay group. `kernel`: kAuto except in tests.
  FlatAdamW(const std::vector<std::pair<std::string, torch::Tensor>>& params, const TrainSpec& t,
            const std::function<bool(const std::string&, const torch::Tensor&)>& decay,
            AdamWKernel kernel = AdamWKernel::kAuto);
  AdamWKernel kernel() const { return kernel_; }

  void ZeroGrad();
  // Global L2 norm of all gradients (fp32 scalar tensor): fused::SumOfSquares with kCpuFused,
  // else one norm reduction per buffer.
  torch::Tensor GradNorm() const;
  // Scales gradients so their norm is at most `max_norm` (torch.nn.utils.clip_grad_norm_).
  void ClipGradNorm(const torch::Tensor& norm, double max_norm);
  // Multiplies every gradient by `factor` (undoing a loss scale).
  void ScaleGrads(double factor);
  // One AdamW update at learning rate `lr`; increments the step count.
  void Step(double lr);

  int64_t steps() const { return steps_; }
  // Per-parameter state for checkpoints: "exp_avg.<name>", "exp_avg_sq.<name>".
  std::vector<std::pair<std::string, torch::Tensor>> StateTensors() const;
  // Restores state saved by StateTensors. Errors name the missing or mis-shaped tensor.
  Status LoadState(const std::function<torch::Tensor(const std::string&)>& lookup, int64_t steps);

  // The flat layout, for data-parallel training (trainer/distributed.h).
  struct Slot {
    std::string name;
    torch::Tensor param;  // a view of buffer `group`
    int group = 0;
    int64_t offset = 0, numel = 0;
    int64_t index = 0;  // position in the constructor's `params` (registration order)
  };
  // Every trainable parameter, in registration order.
  std::vector<Slot> Slots() const;
  // The gradient buffers, one per group (what ZeroGrad clears and Step reads).
  std::vector<torch::Tensor> GradBuffers() const;
  // The buffers that, with steps(), are the whole optimizer state: per group the parameters,
  // exp_avg and exp_avg_sq. Broadcasting them from one rank makes every rank's state equal.
  std::vector<torch::Tensor> StateBuffers() const;
  void set_steps(int64_t steps) { steps_ = steps; }

 private:
  struct Group {
    double weight_decay = 0;
    torch::Tensor data, grad, exp_avg, exp_avg_sq;
    std::vector<std::pair<std::string, torch::Tensor>> params;  // views into data
    std::vector<std::pair<int64_t, int64_t>> spans;             // (offset, numel)
    std::vector<int64_t> index;                                 // registration order
    torch::Tensor step;  // kTorchFused: the step count as a float32 scalar on the device
  };
  void TorchFusedStep(Group& g, double lr);
  void OpsStep(Group& g, double lr, double bc1, double bc2);
  void Build(Group& g, const std::vector<std::pair<std::string, torch::Tensor>>& ps,
             const std::vector<int64_t>& index);

  TrainSpec t_;
  std::vector<Group> groups_;
  int64_t steps_ = 0;
  AdamWKernel kernel_ = AdamWKernel::kAuto;
};

}  // namespace sftctl::trainer
