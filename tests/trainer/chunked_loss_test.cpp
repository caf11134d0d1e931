// Chunked cross-entropy (trainer/model/chunked_loss.h, train.loss_chunk_tokens): the loss and every
// gradient equal the plain path's, on the function and on whole llama/qwen2 models (tied
// embeddings, LoRA), and a chunked step's peak memory does not hold the [tokens x vocab] logits.
#include "trainer/model/chunked_loss.h"

#include <gtest/gtest.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "common/os/host_memory.h"
#include "tests/trainer/test_util.h"
#include "trainer/model/lora.h"
#include "trainer/model/model.h"
#include "trainer/runtime/device.h"

namespace sftctl::trainer {
namespace {

using nlohmann::json;

// max |a - b| / max |b| over the tensors: the relative error of a against the reference b.
double RelativeError(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double scale = b[i].abs().max().item<double>();
    EXPECT_GT(scale, 0) << "tensor " << i << " is all zeros: the comparison would prove nothing";
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

struct Problem {
  torch::Tensor h, w, t;
};
Problem MakeProblem(int64_t n, int64_t c, int64_t v) {
  torch::manual_seed(3);
  return {torch::randn({n, c}).requires_grad_(), (torch::randn({v, c}) * 0.3).requires_grad_(),
          torch::randint(0, v, {n}, torch::kInt64)};
}

// Loss, dL/dh, dL/dW.
std::vector<torch::Tensor> LossAndGrads(const Problem& p, int64_t chunk) {
  p.h.mutable_grad() = torch::Tensor();
  p.w.mutable_grad() = torch::Tensor();
  torch::Tensor loss = LinearCrossEntropySum(p.h, p.w, p.t, chunk);
  loss.backward();
  return {loss.detach().reshape({1}), p.h.grad().clone(), p.w.grad().clone()};
}

TEST(ChunkedLoss, EqualsThePlainPathForEveryChunking) {
  const Problem p = MakeProblem(37, 16, 101);
  const auto plain = LossAndGrads(p, 0);
  // The plain path is PyTorch's cross_entropy of the whole logits matrix.
  const double reference = torch::nn::functional::cross_entropy(
                               torch::matmul(p.h, p.w.t()), p.t,
                               torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                               .item<double>();
  EXPECT_NEAR(plain[0].item<double>(), reference, 1e-5 * std::abs(reference));
  for (int64_t chunk : {1, 5, 8, 36}) {
    EXPECT_LE(RelativeError(LossAndGrads(p, chunk), plain), 1e-6) << "chunk " << chunk;
  }
  // A chunk as large as the batch is the plain path itself.
  EXPECT_EQ(LinearCrossEntropySum(p.h, p.w, p.t, 37).grad_fn()->name(),
            LinearCrossEntropySum(p.h, p.w, p.t, 0).grad_fn()->name());
  EXPECT_NE(LinearCrossEntropySum(p.h, p.w, p.t, 8).grad_fn()->name(),
            LinearCrossEntropySum(p.h, p.w, p.t, 0).grad_fn()->name());
}

TEST(ChunkedLoss, NoWeightGradientForAFrozenHead) {
  Problem p = MakeProblem(20, 8, 50);
  p.w.set_requires_grad(false);
  torch::Tensor loss = LinearCrossEntropySum(p.h, p.w, p.t, 6);
  loss.backward();
  EXPECT_FALSE(p.w.grad().defined());
  torch::Tensor gh = p.h.grad().clone();
  p.h.mutable_grad() = torch::Tensor();
  LinearCrossEntropySum(p.h, p.w, p.t, 0).backward();
  EXPECT_LE((gh - p.h.grad()).abs().max().item<double>(), 1e-6 * p.h.grad().abs().max().item<double>());
}

// Under bf16 autocast both paths multiply in bf16; the chunked one sums W's gradient over chunks
// in fp32 where the plain one rounds one bf16 product, so they agree to bf16 precision.
TEST(ChunkedLoss, Bf16AutocastAgreesToBf16Precision) {
  const Problem p = MakeProblem(64, 32, 300);
  DevicePlan plan;
  plan.bf16 = true;
  auto run = [&](int64_t chunk) {
    p.h.mutable_grad() = torch::Tensor();
    p.w.mutable_grad() = torch::Tensor();
    torch::Tensor loss;
    {
      AutocastScope autocast(plan);
      loss = LinearCrossEntropySum(p.h.to(torch::kBFloat16), p.w, p.t, chunk);
    }
    EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
    loss.backward();
    ClearAutocastCache();
    return std::vector<torch::Tensor>{loss.detach().reshape({1}), p.h.grad().clone(), p.w.grad().clone()};
  };
  const auto plain = run(0);
  const auto chunked = run(16);
  EXPECT_LE(RelativeError({chunked[0]}, {plain[0]}), 1e-6);  // the same bf16 logits, fp32 loss
  EXPECT_LE(RelativeError(chunked, plain), 1e-2);            // bf16 has 8 significant bits
}

TEST(ChunkedLoss, AutomaticChunkSizeFollowsTheVocabulary) {
  const LossChunkDevice cpu;
  EXPECT_EQ(LossChunkTokens(0, 151936, cpu), (64 << 20) / (4 * 151936));  // Qwen: 110 rows
  EXPECT_EQ(LossChunkTokens(0, 151936, cpu), 110);
  EXPECT_EQ(LossChunkTokens(0, 32000, cpu), 524);
  EXPECT_EQ(LossChunkTokens(0, 31999, cpu), 0);  // small vocabularies keep the plain path
  EXPECT_EQ(LossChunkTokens(0, 259, cpu), 0);
  EXPECT_EQ(LossChunkTokens(0, 2'000'000, cpu), 64);  // never fewer than 64 rows
  EXPECT_EQ(LossChunkTokens(512, 259, cpu), 512);     // an explicit size always applies
  // MPS keeps the CPU's budget, whatever memory it is said to have.
  EXPECT_EQ(LossChunkTokens(0, 151936, {at::kMPS, int64_t{64} << 30}), 110);
}

// On CUDA a chunk takes 1/32 of the device's memory, between 512 MiB and 4 GiB of fp32 logits:
// a Qwen2.5-0.5B micro-batch of 4 x 2048 is two chunks on an 80 GiB GPU, not 75.
TEST(ChunkedLoss, AutomaticChunkOnCudaFollowsTheDeviceMemory) {
  const int64_t GiB = int64_t{1} << 30, qwen = 151936;
  EXPECT_EQ(LossChunkTokens(0, qwen, {at::kCUDA, 80 * GiB}), (80 * GiB / 32) / (4 * qwen));
  EXPECT_EQ(LossChunkTokens(0, qwen, {at::kCUDA, 80 * GiB}), 4416);
  EXPECT_EQ(LossChunkTokens(0, qwen, {at::kCUDA, 24 * GiB}), (24 * GiB / 32) / (4 * qwen));
  // The bounds: memory unknown (0) or small takes 512 MiB; a large GPU at most 4 GiB.
  EXPECT_EQ(LossChunkTokens(0, qwen, {at::kCUDA, 0}), (512 << 20) / (4 * qwen));
  EXPECT_EQ(LossChunkTokens(0, qwen, {at::kCUDA, 8 * GiB}), (512 << 20) / (4 * qwen));
  EXPECT_EQ(LossChunkTokens(0, qwen, {at::kCUDA, 192 * GiB}), 4 * GiB / (4 * qwen));
  // Always far larger than the CPU's chunk, and the same rules for small vocabularies and explicit sizes.
  EXPECT_GT(LossChunkTokens(0, 32000, {at::kCUDA, 0}), 8 * LossChunkTokens(0, 32000, LossChunkDevice{}));
  EXPECT_EQ(LossChunkTokens(0, 31999, {at::kCUDA, 80 * GiB}), 0);
  EXPECT_EQ(LossChunkTokens(96, qwen, {at::kCUDA, 80 * GiB}), 96);
  // The device of a CPU tensor: no memory asked.
  const LossChunkDevice d = LossChunkDeviceFor(torch::kCPU);
  EXPECT_EQ(d.type, at::kCPU);
  EXPECT_EQ(d.memory_bytes, 0);
}

// The model resolves train.loss_chunk_tokens for the device LossSum runs on.
TEST(ChunkedLoss, TheModelResolvesTheRequestForItsDevice) {
  json cfg = sftctl::testing::TinyDecoderConfig("llama", 40000, 16, 32, true, 1);
  CausalLM m(*ParseModelConfig(cfg, "test"));
  m->SetLossChunkTokens(0);
  EXPECT_EQ(m->LossChunkRows(torch::kCPU), LossChunkTokens(0, 40000, LossChunkDevice{}));
  EXPECT_EQ(m->LossChunkRows(torch::kCPU), (64 << 20) / (4 * 40000));
  m->SetLossChunkTokens(7);
  EXPECT_EQ(m->LossChunkRows(torch::kCPU), 7);
}

ModelConfig TinyConfig(const std::string& type, bool tied) {
  return *ParseModelConfig(sftctl::testing::TinyDecoderConfig(type, 97, 32, 48, tied), "test");
}

// Loss and the gradient of every trainable parameter, through LossSum with `chunk` rows.
std::vector<torch::Tensor> ModelLossAndGrads(CausalLM& m, int64_t chunk, const torch::Tensor& ids,
                                             const torch::Tensor& labels, const torch::Tensor& target_index) {
  m->SetLossChunkTokens(chunk);
  m->zero_grad();
  torch::Tensor loss = m->LossSum(ids, labels, {}, {}, target_index);
  loss.backward();
  std::vector<torch::Tensor> out = {loss.detach().reshape({1})};
  for (const auto& p : m->parameters()) {
    if (p.requires_grad()) out.push_back(p.grad().clone());
  }
  return out;
}

TEST(ChunkedLoss, WholeModelsTiedUntiedAndLora) {
  torch::manual_seed(5);
  const torch::Tensor ids = torch::randint(0, 97, {3, 16}, torch::kInt64);
  torch::Tensor labels = ids.clone();
  labels.slice(1, 0, 5).fill_(-100);  // a prompt: only 3 x 10 positions have labels
  const torch::Tensor target_index = labels.reshape({-1}).slice(0, 1).ne(-100).nonzero().reshape({-1});
  for (const std::string type : {"llama", "qwen2"}) {
    for (bool tied : {false, true}) {
      for (bool lora : {false, true}) {
        torch::manual_seed(1);
        CausalLM m(TinyConfig(type, tied));
        if (lora) {
          LoraSpec spec;
          spec.r = 4;
          spec.target_modules = {"q_proj", "v_proj", "down_proj"};
          ASSERT_TRUE(ApplyLora(m, spec).ok());
          torch::NoGradGuard g;  // non-zero B, so every adapter gets a gradient
          for (auto& p : m->named_parameters())
            if (p.key().find("lora_B") != std::string::npos) p.value().normal_(0, 0.1);
        }
        const std::string what = type + (tied ? " tied" : " untied") + (lora ? " lora" : " full");
        for (const torch::Tensor& index : {target_index, torch::Tensor()}) {
          const auto plain = ModelLossAndGrads(m, 0, ids, labels, index);
          EXPECT_LE(RelativeError(ModelLossAndGrads(m, 7, ids, labels, index), plain), 1e-6) << what;
        }
      }
    }
  }
}

// The point of chunking: a step with 1024 labelled rows over a 32,000 vocabulary keeps one
// chunk's logits, not 1024 x 32000 fp32 (125 MiB, several times over in the plain path).
TEST(ChunkedLoss, PeakMemoryHoldsOneChunkOfLogits) {
  if (!ResetPeakResident()) GTEST_SKIP() << "this system cannot reset the peak resident set";
#ifdef __GLIBC__
  // Every buffer of 1 MiB or more its own mapping, returned when freed: the resident set then
  // follows what is live, whatever glibc's adaptive threshold kept from the warm-up (with it, the
  // chunked pass measured 0 bytes on an idle machine and 40 MB under load).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
  const Problem p = MakeProblem(1024, 16, 32000);
  LossAndGrads(p, 64);  // warm the allocator
  auto peak_of = [&](int64_t chunk) {
    p.h.mutable_grad() = torch::Tensor();
    p.w.mutable_grad() = torch::Tensor();
    EXPECT_TRUE(ResetPeakResident());
    const int64_t before = ResidentBytes();
    LinearCrossEntropySum(p.h, p.w, p.t, chunk).backward();
    return PeakResidentBytes() - before;
  };
  const int64_t logits_bytes = int64_t{1024} * 32000 * 4;
  const int64_t chunked = peak_of(64), plain = peak_of(0);
  EXPECT_GE(plain, logits_bytes) << "the plain path forms the fp32 logits at least once";
  EXPECT_LE(chunked, logits_bytes / 4) << "plain " << plain << " bytes, chunked " << chunked;
}

}  // namespace
}  // namespace sftctl::trainer
