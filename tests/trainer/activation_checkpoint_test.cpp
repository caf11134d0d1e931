// Activation checkpointing (trainer/model/activation_checkpoint.h, train.gradient_checkpointing): the
// same loss and gradients as without it, under autocast and dropout too, and the recompute.
#include "trainer/model/activation_checkpoint.h"

#include <gtest/gtest.h>

#include <set>

#include "tests/trainer/test_util.h"
#include "trainer/model/fused_ops.h"
#include "trainer/model/lora.h"
#include "trainer/model/model.h"
#include "trainer/runtime/device.h"
#include "trainer/training/data.h"
#include "trainer/training/trainer.h"

namespace sftctl::trainer {
namespace {

using nlohmann::json;
using sftctl::testing::MakeTempDir;
using sftctl::testing::ReadMetrics;
using sftctl::testing::TinySpec;

ModelConfig Config(const std::string& type) {
  json j = {{"model_type", type},       {"vocab_size", 61},
            {"hidden_size", 32},        {"intermediate_size", 48},
            {"num_hidden_layers", 3},   {"num_attention_heads", 4},
            {"num_key_value_heads", 2}, {"max_position_embeddings", 32}};
  if (type == "qwen3") j["head_dim"] = 12;
  if (type == "mistral") j["sliding_window"] = 5;
  return *ParseModelConfig(j, "test");
}

// The loss followed by the gradient of every trainable parameter.
std::vector<torch::Tensor> LossAndGrads(CausalLM& m, bool checkpointing, const torch::Tensor& ids,
                                        const torch::Tensor& labels, const torch::Tensor& positions = {},
                                        const torch::Tensor& mask = {}) {
  m->SetGradientCheckpointing(checkpointing);
  m->zero_grad();
  torch::manual_seed(42);  // the same dropout masks for both settings
  torch::Tensor loss = m->LossSum(ids, labels, positions, mask);
  loss.backward();
  std::vector<torch::Tensor> out = {loss.detach().to(torch::kFloat32)};
  for (const auto& p : m->parameters()) {
    if (p.requires_grad()) out.push_back(p.grad().clone());
  }
  return out;
}

void ExpectSame(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  int64_t nonzero = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
    nonzero += b[i].abs().sum().item<double>() > 0;
  }
  EXPECT_LE(worst, 1e-6) << what;
  EXPECT_GT(nonzero, static_cast<int64_t>(a.size()) / 2) << what << ": most gradients are zero";
}

// How many nodes of the autograd graph behind `t` are checkpointed calls.
int CheckpointNodes(const torch::Tensor& t) {
  std::vector<torch::autograd::Node*> todo = {t.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  int n = 0;
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    n += node->name() == "sftctl::CheckpointBackward";
    for (const auto& e : node->next_edges()) todo.push_back(e.function.get());
  }
  return n;
}

struct Inputs {
  torch::Tensor ids, labels;
};
Inputs MakeInputs() {
  torch::manual_seed(5);
  Inputs in;
  in.ids = torch::randint(0, 61, {3, 14}, torch::kInt64);
  in.labels = in.ids.clone();
  in.labels.slice(1, 0, 4).fill_(-100);
  return in;
}

TEST(GradientCheckpointing, SameLossAndGradientsForEveryArchitecture) {
  const Inputs in = MakeInputs();
  for (const std::string type : {"llama", "qwen2", "qwen3", "mistral"}) {
    for (bool fused_on : {true, false}) {
      fused::SetEnabled(fused_on);
      torch::manual_seed(1);
      CausalLM m(Config(type));
      m->train();
      auto plain = LossAndGrads(m, false, in.ids, in.labels);
      auto ckpt = LossAndGrads(m, true, in.ids, in.labels);
      ExpectSame(ckpt, plain, type + (fused_on ? " fused" : " composite"));
      // One checkpoint per decoder layer when on, none when off.
      m->SetGradientCheckpointing(true);
      EXPECT_EQ(CheckpointNodes(m->LossSum(in.ids, in.labels)), 3) << type;
      m->SetGradientCheckpointing(false);
      EXPECT_EQ(CheckpointNodes(m->LossSum(in.ids, in.labels)), 0) << type;
      fused::SetEnabled(true);
    }
  }
}

TEST(GradientCheckpointing, SameWithPackedRowsAndPositions) {
  const Inputs in = MakeInputs();
  torch::manual_seed(1);
  CausalLM m(Config("mistral"));
  // Two samples per row: segments 0 and 1, positions restarting at the boundary.
  torch::Tensor segments =
      torch::cat({torch::zeros({3, 6}, torch::kInt64), torch::ones({3, 8}, torch::kInt64)}, 1);
  torch::Tensor positions = torch::cat({torch::arange(6).expand({3, 6}), torch::arange(8).expand({3, 8})}, 1);
  torch::Tensor mask = PackedAttentionMask(segments);
  auto plain = LossAndGrads(m, false, in.ids, in.labels, positions, mask);
  auto ckpt = LossAndGrads(m, true, in.ids, in.labels, positions, mask);
  ExpectSame(ckpt, plain, "packed");
}

// The recompute runs in backward, outside autocast: it must re-enter the forward's bf16 autocast,
// or its activations (and the gradients) would be fp32 ones.
TEST(GradientCheckpointing, SameUnderBf16Autocast) {
  const Inputs in = MakeInputs();
  torch::manual_seed(1);
  CausalLM m(Config("qwen3"));
  DevicePlan plan;
  plan.bf16 = true;
  auto run = [&](bool checkpointing) {
    m->SetGradientCheckpointing(checkpointing);
    m->zero_grad();
    torch::Tensor loss;
    {
      AutocastScope autocast(plan);
      loss = m->LossSum(in.ids, in.labels);
    }
    loss.backward();
    ClearAutocastCache();
    std::vector<torch::Tensor> out = {loss.detach().to(torch::kFloat32)};
    for (const auto& p : m->parameters()) out.push_back(p.grad().clone());
    return out;
  };
  auto plain = run(false);
  auto ckpt = run(true);
  ExpectSame(ckpt, plain, "bf16 autocast");
  EXPECT_FALSE(AutocastEnabled(at::kCPU)) << "the recompute left autocast on";
}

// Autocast's cast cache is global: a recompute with it on would leave a bf16 copy of every
// layer's fp32 weights in it until ClearAutocastCache (the end of the step). A cached cast holds
// its weight (through the cast's autograd node), so a weight's use count shows whether one is
// cached. The plain run is the control: its forward caches, and the count shows it. (LibTorch
// 1.x caches only CUDA's fp16 casts: there the control sees nothing and the test is skipped.)
TEST(GradientCheckpointing, RecomputeLeavesNoCastsInTheAutocastCache) {
  const Inputs in = MakeInputs();
  torch::manual_seed(1);
  CausalLM m(Config("llama"));
  DevicePlan plan;
  plan.bf16 = true;
  // o_proj runs its own matmul (no concatenated weights) on every path.
  std::vector<torch::Tensor> weights;
  for (const auto& layer : *m->model->layers)
    weights.push_back(layer->as<DecoderLayer>()->self_attn->o_proj->weight);
  auto counts = [&] {
    std::vector<int64_t> n;
    for (const auto& w : weights) n.push_back(static_cast<int64_t>(w.use_count()));
    return n;
  };
  // Counts after a step's forward and backward, before the cache is cleared.
  auto after_step = [&](bool checkpointing) {
    m->SetGradientCheckpointing(checkpointing);
    m->zero_grad();
    torch::Tensor loss;
    {
      AutocastScope autocast(plan);
      loss = m->LossSum(in.ids, in.labels);
    }
    loss.backward();
    loss = torch::Tensor();
    const std::vector<int64_t> after = counts();
    ClearAutocastCache();
    return after;
  };
  const std::vector<int64_t> idle = counts();
  const std::vector<int64_t> plain = after_step(false);
  EXPECT_EQ(counts(), idle) << "ClearAutocastCache released every cast";
  if (plain == idle) GTEST_SKIP() << "this LibTorch's CPU autocast caches no casts";
  for (size_t i = 0; i < weights.size(); ++i) EXPECT_GT(plain[i], idle[i]) << "control, layer " << i;
  EXPECT_EQ(after_step(true), idle) << "a recompute left casts of the layers' weights in the cache";
}

// LoRA dropout draws random numbers: the recompute must see the forward's RNG state.
TEST(GradientCheckpointing, SameWithLoraDropout) {
  const Inputs in = MakeInputs();
  torch::manual_seed(1);
  CausalLM m(Config("llama"));
  LoraSpec spec;
  spec.r = 4;
  spec.alpha = 8;
  spec.dropout = 0.3;
  spec.target_modules = {"q_proj", "v_proj", "down_proj"};
  ASSERT_TRUE(ApplyLora(m, spec).ok());
  {  // non-zero B, so the dropout of A's input shows in every gradient
    torch::NoGradGuard g;
    for (auto& p : m->named_parameters()) {
      if (p.key().find("lora_B") != std::string::npos) p.value().normal_(0, 0.1);
    }
  }
  m->train();
  auto plain = LossAndGrads(m, false, in.ids, in.labels);
  auto ckpt = LossAndGrads(m, true, in.ids, in.labels);
  ExpectSame(ckpt, plain, "lora dropout");
  // And the dropout is really random: another seed gives other gradients.
  m->SetGradientCheckpointing(false);
  m->zero_grad();
  torch::manual_seed(43);
  m->LossSum(in.ids, in.labels).backward();
  double diff = 0;
  size_t i = 1;
  for (const auto& p : m->parameters()) {
    if (p.requires_grad()) diff = std::max(diff, (p.grad() - plain[i++]).abs().max().item<double>());
  }
  EXPECT_GT(diff, 1e-4);
}

TEST(GradientCheckpointing, RecomputesInBackwardOnlyWhenRecording) {
  int calls = 0;
  torch::Tensor w = torch::randn({4, 4}).requires_grad_();
  torch::Tensor x = torch::randn({2, 4}).requires_grad_();
  auto fn = [&](const torch::Tensor& in) {
    ++calls;
    return torch::tanh(torch::matmul(in, w));
  };
  torch::Tensor y = CheckpointedCall(fn, x, {w});
  EXPECT_EQ(calls, 1);
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "sftctl::CheckpointBackward");
  y.sum().backward();
  EXPECT_EQ(calls, 2);
  torch::Tensor gx = x.grad().clone(), gw = w.grad().clone();
  x.mutable_grad() = torch::Tensor();
  w.mutable_grad() = torch::Tensor();
  fn(x).sum().backward();
  EXPECT_TRUE(torch::allclose(gx, x.grad(), 0, 1e-7));
  EXPECT_TRUE(torch::allclose(gw, w.grad(), 0, 1e-7));
  // Evaluation: a plain call, nothing recorded.
  calls = 0;
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(CheckpointedCall(fn, x, {w}).requires_grad());
  EXPECT_EQ(calls, 1);
}

// The whole training loop: the same losses step by step, and train.gradient_checkpointing is
// what turns it on.
TEST(GradientCheckpointing, TrainingLossesMatch) {
  auto losses = [](bool on) {
    const std::string dir = MakeTempDir(on ? "ckpt-on" : "ckpt-off");
    JobSpec spec = TinySpec(dir, 3);
    spec.train.gradient_checkpointing = on;
    ByteTokenizer tok;  // the spec field reaches the model the trainer builds
    auto built = BuildModel(spec, tok);
    EXPECT_TRUE(built.ok() && (*built)->gradient_checkpointing() == on);
    auto r = Train(spec, {});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    std::vector<double> out;
    for (const auto& rec : ReadMetrics(dir + "/run/metrics.jsonl")) {
      if (rec["event"] == "step") out.push_back(rec["loss"].get<double>());
    }
    return out;
  };
  const auto off = losses(false), on = losses(true);
  ASSERT_EQ(off.size(), 3u);
  ASSERT_EQ(on.size(), 3u);
  for (size_t i = 0; i < off.size(); ++i) EXPECT_NEAR(on[i], off[i], 1e-6 * std::abs(off[i])) << "step " << i;
}

}  // namespace
}  // namespace sftctl::trainer
