// The model's CUDA path -- the autograd functions of trainer/model/cuda_ops.h around the fused
// kernels, as the model composes them on a GPU -- run on the CPU through the kernels' host
// reference (cuda_ops::SetHostReference): its loss and gradients against the composite path, and
// the number of kernels one training step launches (ATen dispatches that do work, and each fused
// kernel as one), side by side with the composite path's. tests/trainer/cuda_kernels_test.cpp
// checks the same on a GPU.
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "trainer/model/cuda_ops.h"
#include "trainer/model/fused_ops.h"
#include "trainer/model/model.h"
#include "trainer/runtime/device.h"

namespace sftctl::trainer {
namespace {

using torch::Tensor;

// While alive, the model runs on CPU tensors as on CUDA: through the CUDA path (`on`), or
// through the composite ATen path the CUDA path replaces (the CPU's own fused kernels off either
// way: they are not what a GPU runs).
class HostReferenceScope {
 public:
  explicit HostReferenceScope(bool on) {
    fused::SetEnabled(false);
    cuda_ops::SetHostReference(on);
  }
  ~HostReferenceScope() {
    cuda_ops::SetHostReference(false);
    fused::SetEnabled(true);
  }
};

ModelConfig TinyConfig(const std::string& type, int64_t layers) {
  ModelConfig c;
  c.model_type = type;
  c.attention_bias = type == "qwen2";
  c.qk_norm = type == "qwen3";
  c.sliding_window = type == "mistral" ? 5 : 0;
  c.vocab_size = 97;
  c.hidden_size = 48;
  c.intermediate_size = 40;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-6;
  return c;
}

// The loss and every parameter's gradient of one forward/backward.
std::vector<Tensor> LossAndGrads(CausalLM& model, const Tensor& ids, const Tensor& labels) {
  model->zero_grad();
  Tensor loss = model->LossSum(ids, labels);
  loss.backward();
  std::vector<Tensor> out = {loss.detach().clone()};
  for (const auto& p : model->parameters()) out.push_back(p.grad().clone());
  return out;
}

double Diff(const Tensor& a, const Tensor& b) {
  const Tensor af = a.to(torch::kFloat32), bf = b.to(torch::kFloat32);
  if (af.isnan().any().item<bool>()) return INFINITY;
  return (af - bf).abs().max().item<double>() / std::max(1.0, bf.abs().max().item<double>());
}

TEST(CudaPathOnTheCpu, LossAndGradientsMatchTheCompositePath) {
  for (const std::string type : {"llama", "qwen2", "qwen3", "mistral"}) {
    SCOPED_TRACE(type);
    torch::manual_seed(5);
    CausalLM model(TinyConfig(type, 2));
    model->SetLossChunkTokens(17);  // several chunks, the last one short
    const Tensor ids = torch::randint(0, 97, {3, 12}, torch::kInt64);
    Tensor labels = ids.clone();
    labels.slice(1, 0, 4).fill_(-100);
    std::vector<Tensor> ours, ref;
    {
      const HostReferenceScope scope(true);
      ASSERT_TRUE(cuda_ops::Supported(torch::zeros({1})));
      ours = LossAndGrads(model, ids, labels);
    }
    {
      const HostReferenceScope scope(false);
      ASSERT_FALSE(cuda_ops::Supported(torch::zeros({1})));
      ref = LossAndGrads(model, ids, labels);
    }
    ASSERT_EQ(ours.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_LE(Diff(ours[i], ref[i]), 2e-5) << "tensor " << i;
  }
}

TEST(CudaPathOnTheCpu, Bf16AutocastStaysCloseToTheCompositePath) {
  torch::manual_seed(6);
  CausalLM model(TinyConfig("qwen2", 2));
  model->SetLossChunkTokens(17);
  const Tensor ids = torch::randint(0, 97, {2, 16}, torch::kInt64);
  DevicePlan plan;
  plan.bf16 = true;
  std::vector<Tensor> ours, ref;
  {
    const HostReferenceScope scope(true);
    const AutocastScope autocast(plan);
    ours = LossAndGrads(model, ids, ids);
  }
  {
    const HostReferenceScope scope(false);
    const AutocastScope autocast(plan);
    ref = LossAndGrads(model, ids, ids);
  }
  // bf16 activations: each path rounds at its own places, so agreement is to bf16's precision.
  EXPECT_LE(Diff(ours[0], ref[0]), 1e-2);
  for (size_t i = 1; i < ref.size(); ++i) EXPECT_LE(Diff(ours[i], ref[i]), 6e-2) << "tensor " << i;
}

// ---- Counting a step's kernels ------------------------------------------------------------

// ATen ops that launch no kernel of their own (views, metadata, allocation, no-op conversions).
bool LaunchesNothing(const std::string& name) {
  static const std::set<std::string> kNone = {"aten::empty",
                                              "aten::empty_like",
                                              "aten::empty_strided",
                                              "aten::view",
                                              "aten::_unsafe_view",
                                              "aten::reshape",
                                              "aten::_reshape_alias",
                                              "aten::as_strided",
                                              "aten::t",
                                              "aten::transpose",
                                              "aten::permute",
                                              "aten::expand",
                                              "aten::expand_as",
                                              "aten::slice",
                                              "aten::select",
                                              "aten::narrow",
                                              "aten::unsqueeze",
                                              "aten::squeeze",
                                              "aten::detach",
                                              "aten::alias",
                                              "aten::split",
                                              "aten::split_with_sizes",
                                              "aten::unbind",
                                              "aten::chunk",
                                              "aten::contiguous",
                                              "aten::to",
                                              "aten::resize_",
                                              "aten::set_",
                                              "aten::lift_fresh",
                                              "aten::view_as",
                                              "aten::numel",
                                              "aten::size",
                                              "aten::stride",
                                              "aten::dim",
                                              "aten::result_type",
                                              "aten::item",
                                              "aten::_local_scalar_dense",
                                              "aten::is_nonzero",
                                              "aten::scalar_tensor",
                                              "aten::is_floating_point",
                                              "aten::unflatten",
                                              "aten::flatten",
                                              "aten::matrix_H",
                                              "aten::numpy_T",
                                              "aten::resolve_conj",
                                              "aten::resolve_neg",
                                              "aten::conj",
                                              "aten::_conj",
                                              "aten::_has_compatible_shallow_copy_type",
                                              "aten::requires_grad_",
                                              "aten::retain_grad"};
  return kNone.count(name) > 0;
}

struct Frame {
  std::string name;
  bool has_child = false;
  bool hidden = false;  // inside one of our kernels' scopes
  int64_t bytes = 0;    // of its tensor inputs
};
thread_local std::vector<Frame> t_frames;
std::mutex g_mu;
std::map<std::string, int64_t> g_counts;  // guarded by g_mu
int64_t g_bytes = 0;                      // guarded by g_mu

bool Ours(const std::string& name) { return name.rfind("sftctl::", 0) == 0; }

std::unique_ptr<at::ObserverContext> OnStart(const at::RecordFunction& fn) {
  Frame f;
  f.name = fn.name();
  if (!t_frames.empty()) {
    // An op that only calls ops launching nothing (mm calling resolve_conj) still launches its own.
    if (!LaunchesNothing(f.name)) t_frames.back().has_child = true;
    f.hidden = t_frames.back().hidden || Ours(t_frames.back().name);
  }
  for (const c10::IValue& v : fn.inputs())
    if (v.isTensor() && v.toTensor().defined()) f.bytes += static_cast<int64_t>(v.toTensor().nbytes());
  t_frames.push_back(std::move(f));
  return nullptr;
}

void OnEnd(const at::RecordFunction&, at::ObserverContext*) {
  if (t_frames.empty()) return;
  const Frame f = std::move(t_frames.back());
  t_frames.pop_back();
  if (f.hidden) return;
  const bool aten_leaf = !f.has_child && f.name.rfind("aten::", 0) == 0 && !LaunchesNothing(f.name);
  if (!Ours(f.name) && !aten_leaf) return;
  const std::lock_guard<std::mutex> lock(g_mu);
  ++g_counts[f.name];
  g_bytes += f.bytes;
}

struct KernelCount {
  int64_t kernels = 0;
  int64_t bytes_read = 0;
  std::map<std::string, int64_t> by_op;
};

// The kernels of one forward and backward of `model` (the optimizer's step is apart: a handful
// of fused kernels over the flat buffers, trainer/distributed/optimizer.h).
KernelCount CountStep(CausalLM& model, const Tensor& ids, const Tensor& labels) {
  {
    const std::lock_guard<std::mutex> lock(g_mu);
    g_counts.clear();
    g_bytes = 0;
  }
  const at::CallbackHandle handle =
      at::addGlobalCallback(at::RecordFunctionCallback(OnStart, OnEnd).needsInputs(true));
  model->zero_grad();
  model->LossSum(ids, labels).backward();
  at::removeCallback(handle);
  KernelCount out;
  const std::lock_guard<std::mutex> lock(g_mu);
  out.by_op = g_counts;
  out.bytes_read = g_bytes;
  for (const auto& [name, n] : g_counts) out.kernels += n;
  return out;
}

std::string Top(const KernelCount& c, size_t n) {
  std::vector<std::pair<int64_t, std::string>> v;
  for (const auto& [name, count] : c.by_op) v.emplace_back(count, name);
  std::sort(v.rbegin(), v.rend());
  std::string s;
  for (size_t i = 0; i < std::min(n, v.size()); ++i)
    s += "  " + std::to_string(v[i].first) + " " + v[i].second + "\n";
  return s;
}

// Measured: 2,191 with LibTorch 1.13 (whose attention is a composite of a dozen ops per layer;
// 2.x runs one SDPA op) against 5,173 for the composite path; 1,759 against 4,067 with 2.6. About
// 900 of the 2,191 are dtype copies (autocast's weight casts, gradients cast back to fp32): bf16
// working weights remove them.
constexpr int64_t kFusedKernelBudget = 2400;

// Qwen2.5-0.5B's layer count and head layout (24 layers, 14 heads, 2 KV heads, tied embeddings)
// at a toy width, one micro-batch whose loss takes two chunks (as 4 x 2048 tokens take on an
// 80+ GiB GPU): the kernel count depends on the composition, not on the widths.
TEST(CudaPathOnTheCpu, KernelsPerStepSideBySide) {
  ModelConfig c = TinyConfig("qwen2", 24);
  c.num_attention_heads = 14;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.tie_word_embeddings = true;
  torch::manual_seed(8);
  CausalLM model(c);
  const Tensor ids = torch::randint(0, c.vocab_size, {2, 32}, torch::kInt64);
  model->SetLossChunkTokens(32);  // 62 labelled positions: two chunks
  DevicePlan plan;
  plan.bf16 = true;
  KernelCount fused, composite;
  {
    const HostReferenceScope scope(true);
    const AutocastScope autocast(plan);
    fused = CountStep(model, ids, ids);
  }
  {
    const HostReferenceScope scope(false);
    const AutocastScope autocast(plan);
    composite = CountStep(model, ids, ids);
  }
  std::printf(
      "kernels per step (forward + backward, 24 layers, bf16 autocast, LibTorch %s):\n"
      "  CUDA path (fused kernels)  %6lld kernels, %8.1f MB read\n"
      "  composite path             %6lld kernels, %8.1f MB read\n"
      "most frequent, fused:\n%smost frequent, composite:\n%s",
      TORCH_VERSION, static_cast<long long>(fused.kernels), fused.bytes_read / 1e6,
      static_cast<long long>(composite.kernels), composite.bytes_read / 1e6, Top(fused, 25).c_str(),
      Top(composite, 25).c_str());
  EXPECT_GT(fused.by_op["sftctl::add_rms_norm_forward"], 0);
  EXPECT_GT(fused.by_op["sftctl::qkv_rope_forward"], 0);
  EXPECT_EQ(fused.by_op["sftctl::cross_entropy_forward"], 2);  // one per chunk
  EXPECT_LT(fused.kernels, composite.kernels);
  // The budget this composition holds (docs/performance.md, "Kernels per step"): raise it only
  // with a reason; the target for the full step is 1,200 (bf16 working weights next).
  EXPECT_LE(fused.kernels, kFusedKernelBudget);
}

}  // namespace
}  // namespace sftctl::trainer
