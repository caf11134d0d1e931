#include "trainer/model/projection.h"

#include <cmath>
#include <map>
#include <utility>

#include "trainer/model/cuda_ops.h"
#include "trainer/runtime/device.h"

namespace sftctl::trainer {

bool LinearAutocast(const torch::Tensor& x) {
  const at::DeviceType type = x.device().type();
  return (type == at::kCPU || type == at::kCUDA) && AutocastEnabled(type);
}

torch::ScalarType LinearComputeDtype(const torch::Tensor& x, const torch::Tensor& w) {
  return LinearAutocast(x) ? AutocastDtype(x.device().type()) : w.scalar_type();
}

torch::Tensor MixedLinear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  // Under autocast, autocast casts x (and an fp32 W) itself and the result stays in its dtype.
  if (LinearAutocast(x) || x.scalar_type() == w.scalar_type()) return torch::nn::functional::linear(x, w, b);
  const torch::ScalarType dtype = w.scalar_type();
  const torch::Tensor bias = b.defined() ? b.to(dtype) : b;
  return torch::nn::functional::linear(x.to(dtype), w, bias).to(x.scalar_type());
}

ProjectionImpl::ProjectionImpl(int64_t in_features, int64_t out_features, bool with_bias, bool initialise)
    : in_(in_features), out_(out_features) {
  weight = register_parameter("weight", torch::empty({out_features, in_features}));
  torch::NoGradGuard no_grad;
  if (initialise) torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (with_bias) {
    const double bound = in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0.0;
    torch::Tensor b = torch::empty({out_features});
    if (initialise) b.uniform_(-bound, bound);
    bias = register_parameter("bias", b);
  }
}

void ProjectionImpl::BindWorkingWeight(WorkingWeight working) {
  if (working) working.CheckIsPlaceOf(weight, "BindWorkingWeight");
  working_ = std::move(working);
}

const WorkingWeight& ProjectionImpl::WorkingWeightFor(const torch::Tensor& x) const {
  static const WorkingWeight kUnbound;
  if (working_ && LinearAutocast(x) && AutocastDtype(x.device().type()) == working_.copies->dtype() &&
      cuda_ops::Supported(x)) {
    return working_;
  }
  return kUnbound;
}

torch::Tensor ProjectionImpl::Linear(const torch::Tensor& x) {
  if (const WorkingWeight& w = WorkingWeightFor(x))
    return cuda_ops::WorkingLinear(x, w.View(weight.sizes()), bias, weight);
  return MixedLinear(x, weight, bias);
}

namespace {

// Whether b starts where a ends in a's storage (a and b contiguous).
bool Follows(const torch::Tensor& a, const torch::Tensor& b) {
  return a.defined() && b.defined() && a.is_contiguous() && b.is_contiguous() &&
         a.scalar_type() == b.scalar_type() &&
         b.data_ptr() == static_cast<const char*>(a.data_ptr()) + a.numel() * a.element_size();
}

}  // namespace

torch::Tensor StackedWorkingLinear(const torch::Tensor& x,
                                   std::initializer_list<ProjectionImpl*> projections) {
  const ProjectionImpl* first = *projections.begin();
  const WorkingWeight& w0 = first->WorkingWeightFor(x);
  if (!w0 || !first->weight.grad().defined()) return {};
  const bool biased = first->bias.defined();
  int64_t out = 0;
  const ProjectionImpl* prev = nullptr;
  for (const ProjectionImpl* p : projections) {
    const WorkingWeight& w = p->WorkingWeightFor(x);
    if (!w || p->has_lora() || p->bias.defined() != biased || p->in_features() != first->in_features() ||
        w.copies != w0.copies || w.group != w0.group || w.offset != w0.offset + out * first->in_features())
      return {};
    // (The weights follow each other in the master buffer as their working places do: binding
    // checked each one's place. Their gradient views were never checked.)
    if (prev && !Follows(prev->weight.grad(), p->weight.grad())) return {};
    out += p->out_features();
    prev = p;
  }
  const int64_t in = first->in_features();
  // The stacked master: a view of the master buffer whose .grad() is the stacked view of the
  // gradient buffer, where WorkingLinear's backward adds dW.
  torch::Tensor master = first->weight.detach().as_strided({out, in}, {in, 1});
  master.mutable_grad() = first->weight.grad().as_strided({out, in}, {in, 1});
  torch::Tensor bias;
  if (biased) {
    std::vector<torch::Tensor> biases;
    for (const ProjectionImpl* p : projections) biases.push_back(p->bias);
    bias = torch::cat(biases);
  }
  return cuda_ops::WorkingLinear(x, w0.View({out, in}), bias, master);
}

torch::Tensor ProjectionImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = Linear(x);
  if (!has_lora()) return y;
  torch::Tensor h = x;
  // Without autocast an fp32 adapter on bf16 activations (a bf16 down_proj input) reads them in fp32.
  if (LinearComputeDtype(x, lora_A->weight) != x.scalar_type()) h = h.to(lora_A->weight.scalar_type());
  if (lora_dropout > 0 && is_training()) {
    h = torch::nn::functional::dropout(
        h, torch::nn::functional::DropoutFuncOptions().p(lora_dropout).training(true));
  }
  return y + (lora_B->forward(lora_A->forward(h)) * lora_scale).to(y.scalar_type());
}

void ProjectionImpl::EnableLora(int64_t r, double scale, double dropout) {
  TORCH_CHECK(!has_lora(), "LoRA adapter already enabled");
  lora_A = register_module("lora_A", torch::nn::Linear(torch::nn::LinearOptions(in_, r).bias(false)));
  lora_B = register_module("lora_B", torch::nn::Linear(torch::nn::LinearOptions(r, out_).bias(false)));
  {
    torch::NoGradGuard no_grad;
    // PEFT: nn.init.kaiming_uniform_(lora_A.weight, a=math.sqrt(5)); nn.init.zeros_(lora_B.weight).
    torch::nn::init::kaiming_uniform_(lora_A->weight, std::sqrt(5.0));
    lora_B->weight.zero_();
  }
  lora_A->to(weight.device());
  lora_B->to(weight.device());
  lora_scale = scale;
  lora_dropout = dropout;
}

int BindWorkingWeights(torch::nn::Module& model, const std::shared_ptr<WorkingWeights>& working,
                       const std::vector<FlatPlace>& places) {
  std::map<const void*, const FlatPlace*> by_data;
  for (const FlatPlace& p : places) by_data[p.param.data_ptr()] = &p;
  int bound = 0;
  for (const auto& module : model.modules()) {
    auto* projection = dynamic_cast<ProjectionImpl*>(module.get());
    if (!projection || !projection->weight.requires_grad()) continue;
    const auto it = by_data.find(projection->weight.data_ptr());
    if (it == by_data.end()) continue;
    projection->BindWorkingWeight({working, it->second->group, it->second->offset});
    ++bound;
  }
  return bound;
}

}  // namespace sftctl::trainer
