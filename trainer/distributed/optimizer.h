// AdamW over flat buffers, with the learning-rate schedule and gradient clipping.
//
// At construction every trainable parameter is moved into one of two contiguous fp32 buffers
// (with / without weight decay) and becomes a view of it; its .grad() becomes a view of a
// matching gradient buffer, into which autograd accumulates in place. A step is then a
// handful of kernels over two tensors instead of a loop over hundreds of small ones.
// Semantics equal torch.optim.AdamW (decoupled weight decay, bias correction).
//
// The update kernel depends on the device (AdamWKernel): on the CPU the one-pass loop of
// trainer/model/fused_ops.h; on CUDA LibTorch's own fused AdamW (at::_fused_adamw_, LibTorch 2.0+: one
// kernel reading each buffer once, no temporaries), or plain tensor ops where LibTorch lacks it.
// The gradient norm off the CPU is a reduction per buffer, without a squared copy.
//
// Sharding (ZeRO-1, distributed.shard: optimizer): with `Sharding{rank, world}` and world > 1,
// each flat buffer is split into `world` equal contiguous shards (ShardLayout) and this rank keeps
// AdamW moments for its own shard only; Step updates only its shard of the parameters, and the
// caller all-gathers the updated parameters (GatherParameters in trainer/distributed/distributed.h).
// The parameter and gradient buffers stay whole, padded with zeros to world * shard elements so
// every rank's slice has the same size (an equal-size all-gather); the padding stays zero.
//
// With `gradients` too (ZeRO-2, distributed.shard: gradients) there is no whole gradient buffer:
// the gradient buffer of each group is this rank's shard only (shard elements), parameters' .grad
// are autograd's own tensors, and GradBuckets (trainer/distributed/distributed.h) adds each
// parameter's gradient into a bucket, frees it, and reduces each bucket's pieces to the ranks
// that own them, which add them into their shard. GradNorm is then this rank's part only: the
// caller adds GradSquareSum over ranks.
//
// Thread safety: none; one training loop owns it.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "common/spec/spec.h"
#include "trainer/checkpoint/optimizer_shards.h"

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

// Fp32 elements a shard boundary is aligned to (64 bytes).
inline constexpr int64_t kShardAlign = 16;

// The ZeRO partition of one flat buffer of `numel` elements over `world` ranks: rank r owns the
// slice [r * shard, (r + 1) * shard) of the buffer padded to padded() elements, where shard is
// ceil(numel / world) rounded up to kShardAlign (world 1: shard = numel, no padding). The
// parameter elements a rank owns are that slice clamped to numel: Owned(r), possibly empty.
struct ShardLayout {
  int64_t numel = 0;
  int64_t shard = 0;
  int world = 1;
  int64_t padded() const { return shard * world; }
  std::pair<int64_t, int64_t> Owned(int rank) const;
};
// REQUIRES: numel >= 0, world >= 1.
ShardLayout MakeShardLayout(int64_t numel, int world);

// Which ranks share the optimizer state; world 1 (the default) keeps all of it on this rank.
struct Sharding {
  int rank = 0;
  int world = 1;
  bool gradients = false;  // ZeRO-2: also shard the gradients (world > 1)
};

class FlatAdamW {
 public:
  // `params`: (name, parameter) pairs; parameters that do not require grad are skipped.
  // `decay(name, p)` picks the weight-decay group. `kernel`: kAuto except in tests.
  FlatAdamW(const std::vector<std::pair<std::string, torch::Tensor>>& params, const TrainSpec& t,
            const std::function<bool(const std::string&, const torch::Tensor&)>& decay,
            AdamWKernel kernel = AdamWKernel::kAuto, Sharding sharding = {});
  AdamWKernel kernel() const { return kernel_; }
  bool sharded() const { return sharding_.world > 1; }
  bool shards_gradients() const { return sharded() && sharding_.gradients; }
  const Sharding& sharding() const { return sharding_; }

  void ZeroGrad();
  // Global L2 norm of all gradients (fp32 scalar tensor): fused::SumOfSquares with kCpuFused,
  // else one norm reduction per buffer. With shards_gradients(), of this rank's shard only.
  torch::Tensor GradNorm() const;
  // The sum of the squares of the gradients this rank holds, as a float64 scalar on the buffers'
  // device: with shards_gradients(), the sum over ranks of it is the squared global norm.
  torch::Tensor GradSquareSum() const;
  // Scales gradients so their norm is at most `max_norm` (torch.nn.utils.clip_grad_norm_).
  void ClipGradNorm(const torch::Tensor& norm, double max_norm);
  // Multiplies every gradient by `factor` (undoing a loss scale).
  void ScaleGrads(double factor);
  // One AdamW update at learning rate `lr` (sharded: of this rank's shard of the parameters
  // only); increments the step count.
  void Step(double lr);

  int64_t steps() const { return steps_; }
  // Per-parameter state for checkpoints: "exp_avg.<name>", "exp_avg_sq.<name>".
  // REQUIRES: !sharded().
  std::vector<std::pair<std::string, torch::Tensor>> StateTensors() const;
  // Restores state saved by StateTensors. Errors name the missing or mis-shaped tensor.
  Status LoadState(const std::function<torch::Tensor(const std::string&)>& lookup, int64_t steps);
  // Restores this rank's moments (all of them when not sharded) from any checkpoint layout.
  Status LoadMoments(const MomentReader& read, int64_t steps);
  // The moments rank `rank` of this optimizer's sharding holds, read from `read`: per group
  // exp_avg then exp_avg_sq, each ShardLayout::shard elements (zeros past the parameters), on
  // this optimizer's device. Rank 0 of a sharded run builds every rank's shard with it.
  StatusOr<std::vector<torch::Tensor>> ReadMomentShard(const MomentReader& read, int rank) const;
  // A sharded run's checkpoint: this rank's slices "exp_avg.<group>", "exp_avg_sq.<group>" (its
  // owned elements, padding excluded), and the manifest of all ranks' files.
  std::vector<std::pair<std::string, torch::Tensor>> ShardStateTensors() const;
  // The names and lengths ShardStateTensors has on rank `rank` (same order).
  std::vector<std::pair<std::string, int64_t>> ShardStateShapes(int rank) const;
  OptimizerShardManifest ShardManifest() const;

  // The flat layout, for data-parallel training (trainer/distributed/distributed.h).
  struct Slot {
    std::string name;
    torch::Tensor param;  // a view of buffer `group`
    int group = 0;
    int64_t offset = 0, numel = 0;
    int64_t index = 0;  // position in the constructor's `params` (registration order)
  };
  // Every trainable parameter, in registration order.
  std::vector<Slot> Slots() const;
  // The gradient buffers, one per group (what ZeroGrad clears and Step reads): padded whole
  // buffers, or with shards_gradients() this rank's shard (ShardLayout::shard elements).
  std::vector<torch::Tensor> GradBuffers() const;
  // The parameter buffers, one per group, padded to ShardLayout::padded() elements.
  std::vector<torch::Tensor> ParamBuffers() const;
  // Per group: exp_avg, exp_avg_sq (sharded: this rank's shard).
  std::vector<torch::Tensor> MomentBuffers() const;
  std::vector<ShardLayout> Layouts() const;
  // The buffers that, with steps(), are the whole optimizer state: per group the parameters,
  // exp_avg and exp_avg_sq. Broadcasting them from one rank makes every rank's state equal
  // (unsharded; a sharded optimizer's moments are its shard: ReadMomentShard).
  std::vector<torch::Tensor> StateBuffers() const;
  void set_steps(int64_t steps) { steps_ = steps; }

 private:
  struct Group {
    double weight_decay = 0;
    torch::Tensor data, grad, exp_avg, exp_avg_sq;  // data, grad: layout.padded() elements
    ShardLayout layout;
    std::vector<std::pair<std::string, torch::Tensor>> params;  // views into data
    std::vector<std::pair<int64_t, int64_t>> spans;             // (offset, numel)
    std::vector<int64_t> index;                                 // registration order
    torch::Tensor step;  // kTorchFused: the step count as a float32 scalar on the device
  };
  // The parameters and gradients Step updates: this rank's shard, or everything.
  torch::Tensor LocalData(const Group& g) const;
  torch::Tensor LocalGrad(const Group& g) const;
  void TorchFusedStep(Group& g, double lr);
  void OpsStep(Group& g, double lr, double bc1, double bc2);
  void Build(Group& g, const std::vector<std::pair<std::string, torch::Tensor>>& ps,
             const std::vector<int64_t>& index);

  TrainSpec t_;
  std::vector<Group> groups_;
  int64_t steps_ = 0;
  AdamWKernel kernel_ = AdamWKernel::kAuto;
  Sharding sharding_;
};

}  // namespace sftctl::trainer
