// The CUDA path's memory and speed policies, tested on the CPU (issue 25): one additive attention
// mask per forward shared by all layers, the GQA path per compute capability, the evaluation's
// token cap and its batches, decode batches under a token cap, and the next-token choice made on
// the logits' device.
#include <gtest/gtest.h>

#include <limits>
#include <numeric>

#include "common/tokenizer/tokenizer.h"
#include "tests/trainer/test_util.h"
#include "trainer/model/generate.h"
#include "trainer/model/model.h"
#include "trainer/model/sampling.h"
#include "trainer/runtime/device.h"
#include "trainer/training/data.h"
#include "trainer/training/evaluate.h"

namespace sftctl::trainer {
namespace {

using nlohmann::json;
using sftctl::testing::MakeTempDir;
using sftctl::testing::TinySpec;

constexpr float kInf = std::numeric_limits<float>::infinity();

ModelConfig Config(const std::string& type) {
  json j = sftctl::testing::TinyDecoderConfig(type, 61, 32, 48, false, 2);
  if (type == "mistral") j["sliding_window"] = 4;
  return *ParseModelConfig(j, "test");
}

TEST(AttentionMask, AdditiveMaskOfABooleanOne) {
  // Two packed samples of 3 and 2 tokens.
  const torch::Tensor segments = torch::tensor({0, 0, 0, 1, 1}, torch::kInt64).view({1, 5});
  const torch::Tensor allowed = PackedAttentionMask(segments);
  ASSERT_EQ(allowed.scalar_type(), torch::kBool);
  const torch::Tensor m = AdditiveAttentionMask(allowed, 0, torch::kBFloat16);
  EXPECT_EQ(m.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(m.sizes(), allowed.sizes());
  EXPECT_TRUE(torch::equal(m.to(torch::kFloat32).eq(0), allowed));
  EXPECT_TRUE(torch::equal(m.to(torch::kFloat32).eq(-kInf), allowed.logical_not()));
  // Rows padded to 16 elements, so SDPA's memory-efficient kernel takes the mask as it is.
  EXPECT_EQ(m.stride(-2) % 16, 0);
  // A sliding window of 2 is ANDed in: key j is visible from query t when 0 <= t - j < 2.
  const torch::Tensor w = AdditiveAttentionMask(allowed, 2, torch::kFloat32).reshape({5, 5});
  EXPECT_EQ(w[2][0].item<float>(), -kInf);  // same sample, outside the window
  EXPECT_EQ(w[2][1].item<float>(), 0.0f);
  EXPECT_EQ(w[4][3].item<float>(), 0.0f);
  EXPECT_EQ(w[3][2].item<float>(), -kInf);  // the other sample
  // An additive mask passes through unchanged: the very tensor, so all layers share one.
  const torch::Tensor again = AdditiveAttentionMask(m, 2, torch::kFloat32);
  EXPECT_TRUE(again.is_same(m));
}

TEST(AttentionMask, DtypeFollowsAutocast) {
  const torch::Tensor x = torch::zeros({1, 2, 4});
  EXPECT_EQ(AttentionMaskDtype(x), torch::kFloat32);
  DevicePlan plan;
  plan.bf16 = true;
  AutocastScope autocast(plan);
  EXPECT_EQ(AttentionMaskDtype(x), torch::kBFloat16);
}

// A packed row of two samples gives each sample the hidden states it has alone: the one shared
// additive mask keeps attention inside each sample (and inside Mistral's window), in fp32 and
// under bf16 autocast, with and without gradient checkpointing.
TEST(AttentionMask, PackedRowEqualsTheSamplesAlone) {
  for (const std::string type : {"llama", "mistral"}) {
    for (bool bf16 : {false, true}) {
      torch::manual_seed(7);
      CausalLM m(Config(type));
      m->eval();
      const torch::Tensor a = torch::randint(0, 61, {1, 6}, torch::kInt64);
      const torch::Tensor b = torch::randint(0, 61, {1, 5}, torch::kInt64);
      const torch::Tensor ids = torch::cat({a, b}, 1);
      const torch::Tensor segments =
          torch::cat({torch::zeros({1, 6}), torch::ones({1, 5})}, 1).to(torch::kInt64);
      const torch::Tensor positions =
          torch::cat({torch::arange(6, torch::kInt64), torch::arange(5, torch::kInt64)}).view({1, 11});
      DevicePlan plan;
      plan.bf16 = bf16;
      torch::NoGradGuard no_grad;
      AutocastScope autocast(plan);
      const torch::Tensor packed = m->Hidden(ids, positions, PackedAttentionMask(segments));
      const torch::Tensor alone = torch::cat({m->Hidden(a), m->Hidden(b)}, 1);
      const double tol = bf16 ? 5e-2 : 1e-5;
      EXPECT_LE((packed - alone).abs().max().item<double>(), tol) << type << (bf16 ? " bf16" : " fp32");
      EXPECT_TRUE(packed.isfinite().all().item<bool>()) << type;
    }
  }
}

// The loss and gradients of a packed batch are the same with checkpointing (whose recompute gets
// the same shared mask) as without.
TEST(AttentionMask, CheckpointedPackedBatchMatches) {
  torch::manual_seed(8);
  CausalLM m(Config("llama"));
  const torch::Tensor ids = torch::randint(0, 61, {2, 10}, torch::kInt64);
  const torch::Tensor segments = torch::cat({torch::zeros({2, 4}), torch::ones({2, 6})}, 1).to(torch::kInt64);
  const torch::Tensor positions =
      torch::cat({torch::arange(4, torch::kInt64), torch::arange(6, torch::kInt64)}).repeat({2, 1});
  const torch::Tensor mask = PackedAttentionMask(segments);
  std::vector<std::vector<torch::Tensor>> runs;
  for (bool ckpt : {false, true}) {
    m->SetGradientCheckpointing(ckpt);
    m->zero_grad();
    torch::Tensor loss = m->LossSum(ids, ids, positions, mask);
    loss.backward();
    std::vector<torch::Tensor> r = {loss.detach().reshape({1})};
    for (const auto& p : m->parameters()) r.push_back(p.grad().clone());
    runs.push_back(r);
  }
  double worst = 0;
  for (size_t i = 0; i < runs[0].size(); ++i)
    worst = std::max(worst, (runs[0][i] - runs[1][i]).abs().max().item<double>());
  EXPECT_LE(worst, 1e-6);
  EXPECT_GT(runs[0][1].abs().sum().item<double>(), 0);
}

TEST(GqaPolicy, NativeGqaFromAmpereOn) {
  EXPECT_FALSE(SdpaNativeGqa(std::nullopt));
  EXPECT_FALSE(SdpaNativeGqa(ComputeCapability{7, 5}));  // T4
  EXPECT_FALSE(SdpaNativeGqa(ComputeCapability{7, 0}));  // V100
  EXPECT_TRUE(SdpaNativeGqa(ComputeCapability{8, 0}));   // A100
  EXPECT_TRUE(SdpaNativeGqa(ComputeCapability{9, 0}));   // H100
}

TEST(EvalPolicy, TokenCapFollowsTheTrainingMicroBatch) {
  EXPECT_EQ(EvalBatchTokens(8 * 2048), 8 * 2048);  // a training micro-batch
  EXPECT_EQ(EvalBatchTokens(512), kEvalMinBatchTokens);
  EXPECT_EQ(kEvalMinBatchTokens, 8192);
  EXPECT_EQ(EvalBatchTokens(0), kEvalDefaultBatchTokens);  // `eval`: no training batch
  EXPECT_EQ(kEvalDefaultBatchTokens, 16384);
}

TEST(EvalPolicy, LossBatchesKeepOrderAndBothLimits) {
  const std::string dir = MakeTempDir();
  JobSpec spec = TinySpec(dir, 1);
  ByteTokenizer tok;
  StatusOr<Dataset> d = LoadDataset(spec, tok);
  ASSERT_TRUE(d.ok()) << d.status().message();
  const SampleSet& s = d->eval;
  ASSERT_EQ(s.size(), 16u);
  int64_t longest = 0;
  for (size_t i = 0; i < s.size(); ++i) longest = std::max(longest, s[i].size());
  for (const int64_t cap : {int64_t{0}, 3 * longest, longest, int64_t{1}}) {
    const auto batches = EvalLossBatches(s, 5, cap);
    std::vector<int64_t> all;
    for (const auto& b : batches) {
      ASSERT_FALSE(b.empty());
      EXPECT_LE(b.size(), 5u) << cap;
      int64_t lo = 0;
      for (int64_t i : b) lo = std::max(lo, s[i].size());
      if (cap > 0 && b.size() > 1) {
        EXPECT_LE(static_cast<int64_t>(b.size()) * lo, cap);
      }
      all.insert(all.end(), b.begin(), b.end());
    }
    std::vector<int64_t> expected(s.size());
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(all, expected) << cap;
    if (cap == 0) {
      EXPECT_EQ(batches.size(), 4u);  // 5 + 5 + 5 + 1
    } else if (cap == 3 * longest) {
      EXPECT_GE(batches.size(), 6u);  // at most 3 rows each
    } else {
      EXPECT_EQ(batches.size(), 16u);  // one row each
    }
  }
}

// The evaluation's result does not depend on how its loss batches are cut.
TEST(EvalPolicy, LossIsTheSameForEveryBatchSize) {
  const std::string dir = MakeTempDir();
  JobSpec spec = TinySpec(dir, 1);
  ByteTokenizer tok;
  StatusOr<Dataset> d = LoadDataset(spec, tok);
  ASSERT_TRUE(d.ok()) << d.status().message();
  torch::manual_seed(1);
  json cfg = spec.model.config;
  cfg["vocab_size"] = tok.vocab_size();
  CausalLM m(*ParseModelConfig(cfg, "test"));
  m->eval();
  EvalSpec es;
  es.exact_match = false;
  DevicePlan plan;
  es.batch_size = 16;
  const EvalResult all = Evaluate(m, d->eval, es, plan, 0, 1);
  es.batch_size = 3;
  const EvalResult small = Evaluate(m, d->eval, es, plan, 0, 1);
  EXPECT_GT(all.targets, 0);
  EXPECT_EQ(all.targets, small.targets);
  EXPECT_NEAR(all.loss_sum, small.loss_sum, 1e-4 * all.loss_sum);
}

TEST(GeneratePolicy, BatchesUnderATokenCap) {
  std::vector<std::vector<int32_t>> prompts;
  for (int n : {5, 1, 9, 3, 3, 7, 2}) prompts.emplace_back(n, 1);
  GenerateOptions o;
  o.max_new_tokens = 4;
  o.batch_size = 3;
  auto batches = GenerateBatches(prompts, o);
  ASSERT_EQ(batches.size(), 3u);  // sorted by length: [1, 2, 3] [3, 5, 7] [9]
  EXPECT_EQ(batches[0], (std::vector<size_t>{1, 6, 3}));
  EXPECT_EQ(batches[2], (std::vector<size_t>{2}));
  o.max_batch_tokens = 20;  // rows x (longest prompt + 4) <= 20
  batches = GenerateBatches(prompts, o);
  std::vector<size_t> seen;
  for (const auto& b : batches) {
    size_t longest = 0;
    for (size_t r : b) longest = std::max(longest, prompts[r].size());
    if (b.size() > 1) {
      EXPECT_LE(static_cast<int64_t>(b.size() * (longest + 4)), 20);
    }
    EXPECT_LE(b.size(), 3u);
    seen.insert(seen.end(), b.begin(), b.end());
  }
  EXPECT_EQ(seen, (std::vector<size_t>{1, 6, 3, 4, 0, 5, 2}));
  EXPECT_GT(batches.size(), 3u);
}

// NextTokens picks, for every row of a [B, V] batch at once, exactly the token each row's own
// sampler picks from that row: greedy, top-k, top-p and plain temperature sampling.
TEST(GeneratePolicy, NextTokensEqualsTheRowSampler) {
  torch::manual_seed(11);
  const torch::Tensor logits = torch::randn({6, 300}) * 3;
  std::vector<SamplingOptions> cases(4);
  cases[1] = {0.8, 1.0, 20};
  cases[2] = {1.0, 0.9, 0};
  cases[3] = {1.3, 1.0, 0};
  for (const SamplingOptions& o : cases) {
    std::vector<TokenSampler> batch, alone;
    for (uint64_t i = 0; i < 6; ++i) {
      batch.emplace_back(o, 100 + i);
      alone.emplace_back(o, 100 + i);
    }
    const std::vector<char> skip = {0, 0, 1, 0, 0, 0};
    for (int step = 0; step < 5; ++step) {
      const std::vector<int32_t> got = NextTokens(logits, batch, skip);
      for (int64_t b = 0; b < 6; ++b) {
        if (skip[b]) {
          EXPECT_EQ(got[b], -1);
          continue;
        }
        EXPECT_EQ(got[b], alone[b].Next(logits[b])) << "temperature " << o.temperature << " row " << b;
      }
    }
  }
}

TEST(GeneratePolicy, InferenceRunsFp32OffCuda) {
  StatusOr<DevicePlan> plan = InferencePlan("cpu");
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_TRUE(plan->device.is_cpu());
  EXPECT_EQ(plan->precision(), "fp32");
}

}  // namespace
}  // namespace sftctl::trainer
