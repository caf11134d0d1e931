#include "trainer/optimizer.h"

#include <torch/version.h>

#include <algorithm>
#include <cmath>

#include "trainer/fused_ops.h"

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

FlatAdamW::FlatAdamW(const std::vector<std::pair<std::string, torch::Tensor>>& params, const TrainSpec& t,
                     const std::function<bool(const std::string&, const torch::Tensor&)>& decay,
                     AdamWKernel kernel)
    : t_(t), kernel_(kernel) {
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
  g.data = torch::empty({total}, opts);
  g.grad = torch::zeros({total}, opts);
  g.exp_avg = torch::zeros({total}, opts);
  g.exp_avg_sq = torch::zeros({total}, opts);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < ps.size(); ++i) {
    torch::Tensor p = ps[i].second;
    auto [off, n] = g.spans[i];
    torch::Tensor view = g.data.narrow(0, off, n).view(p.sizes());
    view.copy_(p);
    p.set_data(view);  // the module's parameter now lives in the flat buffer
    p.mutable_grad() = g.grad.narrow(0, off, n).view(p.sizes());
    g.params.emplace_back(ps[i].first, p);
  }
}

void FlatAdamW::ZeroGrad() {
  for (auto& g : groups_) g.grad.zero_();
}

torch::Tensor FlatAdamW::GradNorm() const {
  if (kernel_ == AdamWKernel::kCpuFused) {
    double sq = 0;
    for (const auto& g : groups_) sq += fused::SumOfSquares(g.grad);
    return torch::tensor(static_cast<float>(std::sqrt(sq)));
  }
  // One reduction per buffer (no squared copy of it), then the norm of the norms.
  std::vector<torch::Tensor> norms;
  for (const auto& g : groups_) norms.push_back(g.grad.norm());
  return torch::stack(norms).norm();
}

void FlatAdamW::ScaleGrads(double factor) {
  for (auto& g : groups_) g.grad.mul_(factor);
}

void FlatAdamW::ClipGradNorm(const torch::Tensor& norm, double max_norm) {
  const double n = norm.item<double>();
  const double coef = max_norm / (n + 1e-6);
  if (coef < 1.0) {
    for (auto& g : groups_) g.grad.mul_(coef);
  }
}

void FlatAdamW::Step(double lr) {
  torch::NoGradGuard no_grad;
  ++steps_;
  const double bc1 = 1.0 - std::pow(t_.beta1, static_cast<double>(steps_));
  const double bc2 = 1.0 - std::pow(t_.beta2, static_cast<double>(steps_));
  for (auto& g : groups_) {
    switch (kernel_) {
      case AdamWKernel::kCpuFused:
        fused::AdamWStep(g.data, g.grad, g.exp_avg, g.exp_avg_sq, lr, g.weight_decay, t_.beta1, t_.beta2,
                         t_.eps, bc1, bc2);
        break;
      case AdamWKernel::kTorchFused:
        TorchFusedStep(g, lr);
        break;
      default:
        OpsStep(g, lr, bc1, bc2);
    }
  }
}

void FlatAdamW::TorchFusedStep(Group& g, double lr) {
#if SFTCTL_HAVE_FUSED_ADAMW
  g.step.fill_(static_cast<double>(steps_));  // the kernel takes bias corrections from it
  at::_fused_adamw_({g.data}, {g.grad}, {g.exp_avg}, {g.exp_avg_sq}, /*max_exp_avg_sqs=*/{}, {g.step}, lr,
                    t_.beta1, t_.beta2, g.weight_decay, t_.eps, /*amsgrad=*/false, /*maximize=*/false);
#else
  (void)g;
  (void)lr;
  TORCH_CHECK(false, "FlatAdamW: at::_fused_adamw_ needs LibTorch 2.0 or newer");
#endif
}

void FlatAdamW::OpsStep(Group& g, double lr, double bc1, double bc2) {
  if (g.weight_decay > 0) g.data.mul_(1.0 - lr * g.weight_decay);
  g.exp_avg.mul_(t_.beta1).add_(g.grad, 1.0 - t_.beta1);
  g.exp_avg_sq.mul_(t_.beta2).addcmul_(g.grad, g.grad, 1.0 - t_.beta2);
  torch::Tensor denom = (g.exp_avg_sq.sqrt() / std::sqrt(bc2)).add_(t_.eps);
  g.data.addcdiv_(g.exp_avg, denom, -lr / bc1);
}

std::vector<std::pair<std::string, torch::Tensor>> FlatAdamW::StateTensors() const {
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
  torch::NoGradGuard no_grad;
  for (auto& [key, dst] : StateTensors()) {
    torch::Tensor src = lookup(key);
    if (!src.defined()) return DataLossError("optimizer state has no tensor '" + key + "'");
    if (src.sizes() != dst.sizes()) {
      return DataLossError("optimizer state tensor '" + key + "' has shape " + c10::str(src.sizes()) +
                           ", expected " + c10::str(dst.sizes()));
    }
    dst.copy_(src);
  }
  steps_ = steps;
  return OkStatus();
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
