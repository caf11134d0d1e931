#include "trainer/distributed/optimizer.h"

#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "trainer/model/fused_ops.h"
#include "trainer/model/working_weights.h"

namespace sftctl::trainer {

double LearningRate(const TrainSpec& t, int64_t step, int64_t total_steps) {
  if (t.warmup_steps > 0 && step < t.warmup_steps) {
    return t.lr * static_cast<double>(step + 1) / static_cast<double>(t.warmup_steps);
  }
  if (t.schedule == "constant") return t.lr;
  const double min_lr = t.lr * t.min_lr_ratio;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - t.warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - t.warmup_steps) / decay_steps);
  if (t.schedule == "linear") return t.lr + (min_lr - t.lr) * progress;
  return min_lr + 0.5 * (t.lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

// LibTorch 2.0 added at::_fused_adamw_ with a CUDA kernel, 2.4 its CPU kernel.
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
#define SFTCTL_HAVE_FUSED_ADAMW 1
#else
#define SFTCTL_HAVE_FUSED_ADAMW 0
#endif

bool TorchFusedAdamWRuns(const torch::Device& device) {
#if SFTCTL_HAVE_FUSED_ADAMW
  if (device.is_cuda()) return true;
  if (device.is_cpu()) return TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 4;
#endif
  (void)device;
  return false;
}

AdamWKernel PickAdamWKernel(const torch::Device& device, bool torch_fused) {
  if (device.is_cpu()) return AdamWKernel::kCpuFused;
  return torch_fused ? AdamWKernel::kTorchFused : AdamWKernel::kOps;
}

const char* AdamWKernelName(AdamWKernel k) {
  switch (k) {
    case AdamWKernel::kAuto:
      return "auto";
    case AdamWKernel::kCpuFused:
      return "cpu-fused";
    case AdamWKernel::kTorchFused:
      return "torch-fused";
    case AdamWKernel::kOps:
      return "ops";
  }
  return "?";
}

std::pair<int64_t, int64_t> ShardLayout::Owned(int rank) const {
  const int64_t begin = std::min(numel, rank * shard);
  return {begin, std::min(numel, (rank + 1) * shard)};
}

ShardLayout MakeShardLayout(int64_t numel, int world) {
  ShardLayout l;
  l.numel = numel;
  l.world = world;
  if (world <= 1) {
    l.shard = numel;
    return l;
  }
  const int64_t per = (numel + world - 1) / world;
  l.shard = (per + kShardAlign - 1) / kShardAlign * kShardAlign;
  return l;
}

FlatAdamW::FlatAdamW(const std::vector<std::pair<std::string, torch::Tensor>>& params, const TrainSpec& t,
                     const std::function<bool(const std::string&, const torch::Tensor&)>& decay,
                     AdamWKernel kernel, Sharding sharding)
    : t_(t), kernel_(kernel), sharding_(sharding) {
  TORCH_CHECK(sharding_.world >= 1 && sharding_.rank >= 0 && sharding_.rank < sharding_.world,
              "FlatAdamW: bad sharding");
  std::vector<std::pair<std::string, torch::Tensor>> with, without;
  std::vector<int64_t> with_index, without_index;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    if (!p.requires_grad()) continue;
    const bool decays = decay(name, p) && t.weight_decay > 0;
    (decays ? with : without).emplace_back(name, p);
    (decays ? with_index : without_index).push_back(static_cast<int64_t>(i));
  }
  for (auto* ps : {&with, &without}) {
    if (ps->empty()) continue;
    groups_.emplace_back();
    groups_.back().weight_decay = ps == &with ? t.weight_decay : 0.0;
    Build(groups_.back(), *ps, ps == &with ? with_index : without_index);
  }
  if (groups_.empty()) return;
  const torch::Device device = groups_.front().data.device();
  if (kernel_ == AdamWKernel::kAuto) kernel_ = PickAdamWKernel(device, TorchFusedAdamWRuns(device));
  TORCH_CHECK(kernel_ != AdamWKernel::kCpuFused || device.is_cpu(), "FlatAdamW: cpu-fused needs CPU buffers");
  TORCH_CHECK(kernel_ != AdamWKernel::kTorchFused || TorchFusedAdamWRuns(device),
              "FlatAdamW: this LibTorch has no fused AdamW for ", device.str());
  for (auto& g : groups_) g.step = torch::zeros({}, g.data.options());
}

void FlatAdamW::Build(Group& g, const std::vector<std::pair<std::string, torch::Tensor>>& ps,
                      const std::vector<int64_t>& index) {
  g.index = index;
  int64_t total = 0;
  for (const auto& [name, p] : ps) {
    g.spans.emplace_back(total, p.numel());
    total += p.numel();
  }
  const auto opts = ps.front().second.options().dtype(torch::kFloat32);
  g.layout = MakeShardLayout(total, sharding_.world);
  g.data = torch::empty({g.layout.padded()}, opts);
  if (g.layout.padded() > total) g.data.narrow(0, total, g.layout.padded() - total).zero_();
  g.grad = torch::zeros({shards_gradients() ? g.layout.shard : g.layout.padded()}, opts);
  g.exp_avg = torch::zeros({g.layout.shard}, opts);
  g.exp_avg_sq = torch::zeros({g.layout.shard}, opts);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < ps.size(); ++i) {
    torch::Tensor p = ps[i].second;
    auto [off, n] = g.spans[i];
    torch::Tensor view = g.data.narrow(0, off, n).view(p.sizes());
    view.copy_(p);
    p.set_data(view);  // the module's parameter now lives in the flat buffer
    if (!shards_gradients()) p.mutable_grad() = g.grad.narrow(0, off, n).view(p.sizes());
    g.params.emplace_back(ps[i].first, p);
  }
}

void FlatAdamW::ZeroGrad() {
  for (auto& g : groups_) {
    g.grad.zero_();
    // ZeRO-2: autograd's own gradients (GradBuckets frees them once bucketed).
    if (shards_gradients())
      for (auto& [name, p] : g.params) p.mutable_grad() = torch::Tensor();
  }
}

torch::Tensor FlatAdamW::GradSquareSum() const {
  // As GradNorm: the fused CPU loop (summing in double), else a norm per buffer (no squared copy).
  if (kernel_ == AdamWKernel::kCpuFused) {
    double sq = 0;
    for (const auto& g : groups_) sq += fused::SumOfSquares(g.grad);
    return torch::tensor(sq, torch::kFloat64);
  }
  torch::Tensor sum;
  for (const auto& g : groups_) {
    torch::Tensor n = g.grad.norm().to(torch::kFloat64).square();
    sum = sum.defined() ? sum + n : n;
  }
  return sum.defined() ? sum : torch::zeros({}, torch::kFloat64);
}

torch::Tensor FlatAdamW::GradNorm() const {
  // The parameters' gradients, without the zero padding of a sharded layout (the same sums as
  // an unsharded run's).
  auto used = [&](const Group& g) {
    return shards_gradients() ? g.grad : g.grad.narrow(0, 0, g.layout.numel);
  };
  if (kernel_ == AdamWKernel::kCpuFused) {
    double sq = 0;
    for (const auto& g : groups_) sq += fused::SumOfSquares(used(g));
    return torch::tensor(static_cast<float>(std::sqrt(sq)));
  }
  // One reduction per buffer (no squared copy of it), then the norm of the norms.
  std::vector<torch::Tensor> norms;
  for (const auto& g : groups_) norms.push_back(used(g).norm());
  return torch::stack(norms).norm();
}

void FlatAdamW::ScaleGrads(double factor) {
  for (auto& g : groups_) g.grad.mul_(factor);
}

void FlatAdamW::ClipGradNorm(const torch::Tensor& norm, double max_norm) {
  const double n = norm.item<double>();
  const double coef = max_norm / (n + 1e-6);
  if (coef < 1.0) {
    for (auto& g : groups_) LocalGrad(g).mul_(coef);  // Step reads no other gradient
  }
}

torch::Tensor FlatAdamW::LocalData(const Group& g) const {
  return sharded() ? g.data.narrow(0, sharding_.rank * g.layout.shard, g.layout.shard) : g.data;
}

torch::Tensor FlatAdamW::LocalGrad(const Group& g) const {
  if (!sharded() || shards_gradients()) return g.grad;
  return g.grad.narrow(0, sharding_.rank * g.layout.shard, g.layout.shard);
}

void FlatAdamW::Step(double lr) {
  torch::NoGradGuard no_grad;
  ++steps_;
  const double bc1 = 1.0 - std::pow(t_.beta1, static_cast<double>(steps_));
  const double bc2 = 1.0 - std::pow(t_.beta2, static_cast<double>(steps_));
  for (auto& g : groups_) {
    switch (kernel_) {
      case AdamWKernel::kCpuFused: {
        torch::Tensor data = LocalData(g);
        fused::AdamWStep(data, LocalGrad(g), g.exp_avg, g.exp_avg_sq, lr, g.weight_decay, t_.beta1, t_.beta2,
                         t_.eps, bc1, bc2);
        break;
      }
      case AdamWKernel::kTorchFused:
        TorchFusedStep(g, lr);
        break;
      default:
        OpsStep(g, lr, bc1, bc2);
    }
    // The CPU kernel writes through raw pointers: copies made from the parameters (the working
    // weights, trainer/model/working_weights.h) learn from the version counter that they are stale.
    MarkChanged(g.data);
  }
}

void FlatAdamW::TorchFusedStep(Group& g, double lr) {
#if SFTCTL_HAVE_FUSED_ADAMW
  g.step.fill_(static_cast<double>(steps_));  // the kernel takes bias corrections from it
  at::_fused_adamw_({LocalData(g)}, {LocalGrad(g)}, {g.exp_avg}, {g.exp_avg_sq}, /*max_exp_avg_sqs=*/{},
                    {g.step}, lr, t_.beta1, t_.beta2, g.weight_decay, t_.eps, /*amsgrad=*/false,
                    /*maximize=*/false);
#else
  (void)g;
  (void)lr;
  TORCH_CHECK(false, "FlatAdamW: at::_fused_adamw_ needs LibTorch 2.0 or newer");
#endif
}

void FlatAdamW::OpsStep(Group& g, double lr, double bc1, double bc2) {
  torch::Tensor data = LocalData(g);
  const torch::Tensor grad = LocalGrad(g);
  if (g.weight_decay > 0) data.mul_(1.0 - lr * g.weight_decay);
  g.exp_avg.mul_(t_.beta1).add_(grad, 1.0 - t_.beta1);
  g.exp_avg_sq.mul_(t_.beta2).addcmul_(grad, grad, 1.0 - t_.beta2);
  torch::Tensor denom = (g.exp_avg_sq.sqrt() / std::sqrt(bc2)).add_(t_.eps);
  data.addcdiv_(g.exp_avg, denom, -lr / bc1);
}

std::vector<std::pair<std::string, torch::Tensor>> FlatAdamW::StateTensors() const {
  TORCH_CHECK(!sharded(), "FlatAdamW::StateTensors: a sharded optimizer holds only its shard");
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& g : groups_) {
    for (size_t i = 0; i < g.params.size(); ++i) {
      auto [off, n] = g.spans[i];
      const auto& [name, p] = g.params[i];
      out.emplace_back("exp_avg." + name, g.exp_avg.narrow(0, off, n).view(p.sizes()));
      out.emplace_back("exp_avg_sq." + name, g.exp_avg_sq.narrow(0, off, n).view(p.sizes()));
    }
  }
  return out;
}

Status FlatAdamW::LoadState(const std::function<torch::Tensor(const std::string&)>& lookup, int64_t steps) {
  // Shapes first (the per-parameter format keeps them), then the values through LoadMoments.
  std::map<std::string, torch::Tensor> saved;
  for (const auto& g : groups_) {
    for (const auto& [name, p] : g.params) {
      for (const char* kind : {"exp_avg.", "exp_avg_sq."}) {
        const std::string key = kind + name;
        torch::Tensor src = lookup(key);
        if (!src.defined()) return DataLossError("optimizer state has no tensor '" + key + "'");
        if (src.sizes() != p.sizes()) {
          return DataLossError("optimizer state tensor '" + key + "' has shape " + c10::str(src.sizes()) +
                               ", expected " + c10::str(p.sizes()));
        }
        saved[key] = src;
      }
    }
  }
  return LoadMoments(PerParameterMoments(&saved), steps);
}

Status FlatAdamW::LoadMoments(const MomentReader& read, int64_t steps) {
  SFT_ASSIGN_OR_RETURN(std::vector<torch::Tensor> shard, ReadMomentShard(read, sharding_.rank));
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < groups_.size(); ++i) {
    groups_[i].exp_avg.copy_(shard[2 * i]);
    groups_[i].exp_avg_sq.copy_(shard[2 * i + 1]);
  }
  steps_ = steps;
  return OkStatus();
}

StatusOr<std::vector<torch::Tensor>> FlatAdamW::ReadMomentShard(const MomentReader& read, int rank) const {
  std::vector<torch::Tensor> out;
  for (const auto& g : groups_) {
    const auto [lo, hi] = g.layout.Owned(rank);
    for (const char* kind : {"exp_avg", "exp_avg_sq"}) {
      torch::Tensor t = torch::zeros({g.layout.shard}, g.data.options());
      // Every parameter that overlaps [lo, hi) gives its overlapping elements.
      for (size_t i = 0; i < g.params.size(); ++i) {
        const auto [off, n] = g.spans[i];
        const int64_t b = std::max(lo, off), e = std::min(hi, off + n);
        if (b >= e) continue;
        SFT_RETURN_IF_ERROR(read(kind, g.params[i].first, n, b - off, e - b, t.narrow(0, b - lo, e - b)));
      }
      out.push_back(std::move(t));
    }
  }
  return out;
}

std::vector<std::pair<std::string, int64_t>> FlatAdamW::ShardStateShapes(int rank) const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (size_t i = 0; i < groups_.size(); ++i) {
    const auto [lo, hi] = groups_[i].layout.Owned(rank);
    out.emplace_back("exp_avg." + std::to_string(i), hi - lo);
    out.emplace_back("exp_avg_sq." + std::to_string(i), hi - lo);
  }
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> FlatAdamW::ShardStateTensors() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  const auto shapes = ShardStateShapes(sharding_.rank);
  for (size_t i = 0; i < groups_.size(); ++i) {
    out.emplace_back(shapes[2 * i].first, groups_[i].exp_avg.narrow(0, 0, shapes[2 * i].second));
    out.emplace_back(shapes[2 * i + 1].first, groups_[i].exp_avg_sq.narrow(0, 0, shapes[2 * i + 1].second));
  }
  return out;
}

OptimizerShardManifest FlatAdamW::ShardManifest() const {
  OptimizerShardManifest m;
  m.world_size = sharding_.world;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const Group& g = groups_[gi];
    m.groups.push_back({g.layout.numel, g.weight_decay});
    for (size_t i = 0; i < g.params.size(); ++i)
      m.params.push_back({g.params[i].first, static_cast<int>(gi), g.spans[i].first, g.spans[i].second});
  }
  for (int r = 0; r < sharding_.world; ++r) {
    OptimizerShardManifest::File f{OptimizerShardFileName(r, sharding_.world), r, {}};
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      const auto [lo, hi] = groups_[gi].layout.Owned(r);
      f.ranges.push_back({static_cast<int>(gi), lo, hi});
    }
    m.files.push_back(std::move(f));
  }
  return m;
}

std::vector<FlatAdamW::Slot> FlatAdamW::Slots() const {
  std::vector<Slot> out;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const Group& g = groups_[gi];
    for (size_t i = 0; i < g.params.size(); ++i) {
      out.push_back({g.params[i].first, g.params[i].second, static_cast<int>(gi), g.spans[i].first,
                     g.spans[i].second, g.index[i]});
    }
  }
  std::sort(out.begin(), out.end(), [](const Slot& a, const Slot& b) { return a.index < b.index; });
  return out;
}

std::vector<torch::Tensor> FlatAdamW::GradBuffers() const {
  std::vector<torch::Tensor> out;
  for (const auto& g : groups_) out.push_back(g.grad);
  return out;
}

std::vector<torch::Tensor> FlatAdamW::ParamBuffers() const {
  std::vector<torch::Tensor> out;
  for (const auto& g : groups_) out.push_back(g.data);
  return out;
}

std::vector<torch::Tensor> FlatAdamW::MomentBuffers() const {
  std::vector<torch::Tensor> out;
  for (const auto& g : groups_) {
    out.push_back(g.exp_avg);
    out.push_back(g.exp_avg_sq);
  }
  return out;
}

std::vector<ShardLayout> FlatAdamW::Layouts() const {
  std::vector<ShardLayout> out;
  for (const auto& g : groups_) out.push_back(g.layout);
  return out;
}

std::vector<torch::Tensor> FlatAdamW::StateBuffers() const {
  std::vector<torch::Tensor> out;
  for (const auto& g : groups_) {
    out.push_back(g.data);
    out.push_back(g.exp_avg);
    out.push_back(g.exp_avg_sq);
  }
  return out;
}

}  // namespace sftctl::trainer
