// The memory estimate before training (trainer/training/memory_estimate.h): its parameter counts, the
// refusal and its message, the check running before any weight is read, the override, and the
// estimate against the measured peak of a real step.
#include "trainer/training/memory_estimate.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/os/host_memory.h"
#include "tests/trainer/test_util.h"
#include "tests/util/status_matchers.h"
#include "trainer/distributed/optimizer.h"
#include "trainer/model/lora.h"
#include "trainer/training/trainer.h"

namespace sftctl::trainer {
namespace {

using nlohmann::json;
using sftctl::testing::MakeTempDir;
using ::sftctl::testing::StatusIs;
using sftctl::testing::TinySpec;
using sftctl::testing::WriteWholeFile;
using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

// Qwen2.5-1.5B's shapes (config.json of the release).
ModelConfig Qwen15B() {
  return *ParseModelConfig(sftctl::testing::Qwen25OnePointFiveBConfig(), "qwen2.5-1.5b");
}

TEST(MemoryEstimate, ParameterCountsEqualTheBuiltModel) {
  for (const std::string type : {"llama", "qwen2", "qwen3", "gemma2", "gemma3_text"}) {
    json j = sftctl::testing::TinyDecoderConfig(type, 97, 32, 48, type != "llama");
    if (type != "llama" && type != "qwen2") j["head_dim"] = 12;
    const ModelConfig c = *ParseModelConfig(j, "test");
    for (bool lora : {false, true}) {
      CausalLM m(c);
      std::optional<LoraSpec> spec;
      if (lora) {
        spec = LoraSpec();
        spec->target_modules = {"q_proj", "o_proj", "up_proj"};
        ASSERT_TRUE(ApplyLora(m, *spec).ok());
      }
      int64_t total = 0, trainable = 0, frozen_matrices = 0;
      for (const auto& p : m->parameters()) {
        total += p.numel();
        if (p.requires_grad()) trainable += p.numel();
        if (!p.requires_grad() && p.dim() == 2) frozen_matrices += p.numel();
      }
      const ParameterCount n = CountParameters(c, spec);
      EXPECT_EQ(n.total, total) << type;
      EXPECT_EQ(n.trainable, trainable) << type;
      EXPECT_EQ(n.frozen_matrices, frozen_matrices) << type;
    }
  }
  // Qwen2.5-1.5B: 1,543,714,304 parameters (tied; q/k/v biases).
  EXPECT_EQ(CountParameters(Qwen15B(), std::nullopt).total, 1543714304);
}

MemoryPlan QwenLoraPlan() {
  MemoryPlan p;
  p.config = Qwen15B();
  p.seq_len = 2048;
  p.lora = LoraSpec();
  p.activation_bytes = 2;
  return p;
}

TEST(MemoryEstimate, EachKnobLowersItsPart) {
  MemoryPlan p = QwenLoraPlan();
  const MemoryEstimate base = EstimateMemory(p);
  EXPECT_EQ(base.weights, CountParameters(p.config, p.lora).total * 4);
  EXPECT_EQ(base.gradients, CountParameters(p.config, p.lora).trainable * 4);
  EXPECT_EQ(base.optimizer, CountParameters(p.config, p.lora).trainable * 8);
  // Unchunked: 2047 rows x 151,936 x (8 + 2) bytes, plus the bf16 cast of the fp32 head.
  EXPECT_EQ(base.logits, int64_t{2047} * 151936 * 10 + int64_t{151936} * 1536 * 2);

  MemoryPlan bf16 = p;
  bf16.base_bytes = 2;
  EXPECT_LT(EstimateMemory(bf16).weights, base.weights * 0.51);
  MemoryPlan ckpt = p;
  ckpt.gradient_checkpointing = true;
  EXPECT_LT(EstimateMemory(ckpt).activations, base.activations / 5);
  MemoryPlan chunked = p;
  chunked.loss_chunk_tokens = 110;
  EXPECT_LT(EstimateMemory(chunked).logits, base.logits / 5);
  MemoryPlan two = p;
  two.processes = 2;
  EXPECT_EQ(EstimateMemory(two).total(), 2 * base.total());
}

// A CUDA plan of the same shapes: the device's memory decides the loss chunk (trainer/model/chunked_loss.h).
MemoryPlan OnCuda(MemoryPlan p, int64_t device_memory = 80 * kGiB) {
  p.loss_device = {at::kCUDA, device_memory};
  p.cpu_kernels = false;
  p.loss_chunk_tokens = LossChunkTokens(0, p.config.vocab_size, p.loss_device);
  return p;
}

// The optimizer step's temporaries: FlatAdamW's 8 bytes per trainable parameter on the CPU, none
// with CUDA's fused AdamW. The step runs after backward, so it adds only where it is the peak.
TEST(MemoryEstimate, OptimizerStepTemporariesOffCudaOnly) {
  MemoryPlan p = QwenLoraPlan();
  p.lora.reset();
  const int64_t trainable = CountParameters(p.config, std::nullopt).trainable;
  const MemoryEstimate cpu = EstimateMemory(p);
  EXPECT_EQ(cpu.step, 8 * trainable);
  EXPECT_EQ(EstimateMemory(OnCuda(p)).step, 0);
  // A short batch: the step (12.3 GB) is larger than activations and logits, so it is the peak.
  p.seq_len = 16;
  const MemoryEstimate small = EstimateMemory(p);
  ASSERT_GT(small.step, small.activations + small.logits);
  EXPECT_EQ(small.total(), small.weights + small.gradients + small.optimizer + small.step + small.runtime);
  EXPECT_NE(small.Describe().find("step 11.5 GiB"), std::string::npos) << small.Describe();
}

// The evaluation between steps, capped to a training micro-batch's tokens (trainer/training/evaluate.h):
// counted, and never larger than training's activations and logits.
TEST(MemoryEstimate, EvaluationIsCountedAndCapped) {
  MemoryPlan p = QwenLoraPlan();
  p.batch_size = 4;
  p.loss_chunk_tokens = 110;  // the CPU's automatic chunk
  EXPECT_EQ(EstimateMemory(p).eval, 0) << "no eval data, no evaluation";
  p.eval = EvalSpec();  // 256 sequences per forward, unless the cap cuts them
  for (const MemoryPlan& q : {p, OnCuda(p)}) {
    const MemoryEstimate e = EstimateMemory(q);
    EXPECT_GT(e.eval, 0);
    EXPECT_LT(e.eval, e.activations + e.logits) << "4 x 2048 tokens, without autograd";
    EXPECT_EQ(e.total(), e.weights + e.gradients + e.optimizer + e.activations + e.logits + e.runtime);
  }
  // The loss batch: 8192 tokens (4 rows of 2048) of one layer's working set and the hidden states,
  // plus one chunk of logits.
  const int64_t C = 1536, I = 8960, per_token = 12 * C + 2 * ((12 + 4) * 128 + 3 * I) + 2 * 2 * 12 * 2048;
  EXPECT_EQ(EstimateMemory(p).eval, int64_t{8192} * per_token + int64_t{110} * 151936 * 10);
  // Exact match decodes with every layer's K and V: with full-width K/V heads and short rows the
  // decode batch's cache outgrows the loss batch.
  MemoryPlan gen = p;
  gen.config.num_key_value_heads = 12;
  gen.seq_len = 64;
  const int64_t loss_only = EstimateMemory(gen).eval;
  gen.eval->exact_match = true;
  EXPECT_GT(EstimateMemory(gen).eval, loss_only);
}

// LoRA's own activations under autocast: the cast input of each adapted projection, its rank-r
// output and, with dropout, the dropped input and its mask.
TEST(MemoryEstimate, LoraActivationsAreCounted) {
  MemoryPlan none = QwenLoraPlan();
  none.lora->target_modules = {};
  MemoryPlan qv = QwenLoraPlan();  // q_proj and v_proj
  const int64_t tokens = 2048, L = 28, C = 1536, r = 8;
  const int64_t qv_bytes = 2 * (2 * C + 2 * r);  // two projections of input C: cast input + output
  EXPECT_EQ(EstimateMemory(qv).activations - EstimateMemory(none).activations, L * tokens * qv_bytes);
  MemoryPlan dropout = qv;
  dropout.lora->dropout = 0.05;
  EXPECT_EQ(EstimateMemory(dropout).activations - EstimateMemory(qv).activations, L * tokens * 2 * 5 * C);
  MemoryPlan fp32 = qv;  // autocast off: the adapters read the activations their base matmul saved
  fp32.activation_bytes = 4;
  fp32.cpu_kernels = false;  // (the CPU path's concatenated weights depend on the targets)
  MemoryPlan fp32_none = none;
  fp32_none.activation_bytes = 4;
  fp32_none.cpu_kernels = false;
  EXPECT_EQ(EstimateMemory(fp32).activations - EstimateMemory(fp32_none).activations, L * tokens * 2 * 4 * r);
}

// A packed batch's block-causal mask: one boolean and one additive [B, T, T] mask for all layers.
TEST(MemoryEstimate, PackingCountsOneSharedMask) {
  MemoryPlan p = OnCuda(QwenLoraPlan());
  p.batch_size = 4;
  MemoryPlan packed = p;
  packed.packing = true;
  EXPECT_EQ(EstimateMemory(packed).activations - EstimateMemory(p).activations,
            int64_t{4} * 2048 * 2048 * (1 + 2));
}

// On CUDA the automatic loss chunk is the device's: an 80 GiB GPU holds far more rows of logits
// per chunk than the CPU's 64 MiB, and the refusal suggests that chunk.
TEST(MemoryEstimate, CudaLossChunkFollowsTheDevice) {
  MemoryPlan p = QwenLoraPlan();
  p.batch_size = 4;
  const MemoryPlan cuda = OnCuda(p);
  EXPECT_EQ(cuda.loss_chunk_tokens, 4416);
  const MemoryEstimate e = EstimateMemory(cuda);
  EXPECT_EQ(e.logits, int64_t{4416} * 151936 * 10 + 8 * 4 * 2047 + int64_t{151936} * 1536 * 2);
  MemoryPlan unchunked = cuda;
  unchunked.loss_chunk_tokens = 0;
  MemoryPlan suggested = unchunked;
  suggested.loss_chunk_tokens = 4416;
  EXPECT_THAT(
      CheckMemoryFits(unchunked, 1 * kGiB, "test"),
      StatusIs(StatusCode::kFailedPrecondition, HasSubstr("train.loss_chunk_tokens: 0 (about " +
                                                          FormatGiB(EstimateMemory(suggested).total()))));
}

// The done-when case of ZeRO (docs/memory.md, "Which stage: Qwen2.5-7B on 8 x 80 GB"): a full
// fine-tune of Qwen2.5-7B's shapes on 8 GPUs of 80 GiB, batch 1 x seq 2048 per rank, bf16
// autocast, gradient checkpointing. Unsharded it needs 16 bytes per parameter (about 113 GiB of
// weights, gradients and moments) and is refused; the refusal names both sharded stages as
// fitting, and each of them passes the check. ZeRO-1 is the one to pick: it fits with room to
// spare and keeps the single all-reduce of the gradients (ZeRO-2 adds reduces per micro-batch).
TEST(MemoryEstimate, Qwen7BFullFineTuneOnEight80GiBGpusFitsWithZero1) {
  MemoryPlan p;
  p.config = *ParseModelConfig({{"model_type", "qwen2"},
                                {"vocab_size", 152064},
                                {"hidden_size", 3584},
                                {"intermediate_size", 18944},
                                {"num_hidden_layers", 28},
                                {"num_attention_heads", 28},
                                {"num_key_value_heads", 4},
                                {"max_position_embeddings", 32768},
                                {"tie_word_embeddings", false}},
                               "qwen2.5-7b");
  p.batch_size = 1;
  p.seq_len = 2048;
  p.gradient_checkpointing = true;
  p.activation_bytes = 2;
  p.ranks = 8;
  p = OnCuda(p);
  const int64_t n = CountParameters(p.config, std::nullopt).trainable;
  EXPECT_EQ(n, int64_t{7615616512});  // Qwen2.5-7B's published count (untied lm_head, q/k/v biases)
  auto at = [&](ShardStage stage) {
    MemoryPlan q = p;
    q.shard = stage;
    return q;
  };
  const MemoryEstimate none = EstimateMemory(at(ShardStage::kNone));
  const MemoryEstimate zero1 = EstimateMemory(at(ShardStage::kOptimizer));
  const MemoryEstimate zero2 = EstimateMemory(at(ShardStage::kGradients));
  for (const auto& [name, e] : {std::pair<const char*, const MemoryEstimate*>{"none", &none},
                                {"optimizer", &zero1},
                                {"gradients", &zero2}}) {
    RecordProperty(name, std::to_string(e->total()) + " bytes per rank: " + e->Describe());
  }
  const int64_t gpu = 80 * kGiB;
  EXPECT_GT(none.weights + none.gradients + none.optimizer, gpu) << "the model states alone overflow";
  const Status refused = CheckMemoryFits(at(ShardStage::kNone), gpu, "the total memory of cuda:0");
  ASSERT_EQ(refused.code(), StatusCode::kFailedPrecondition) << none.Describe();
  EXPECT_THAT(
      refused.message(),
      HasSubstr("To fit: distributed.shard: optimizer (AdamW moments split over the 8 ranks) (about " +
                FormatGiB(zero1.total()) +
                ", fits); distributed.shard: gradients (AdamW moments and "
                "gradients split over the 8 ranks) (about " +
                FormatGiB(zero2.total()) + ", fits); "));
  EXPECT_TRUE(CheckMemoryFits(at(ShardStage::kOptimizer), gpu, "x").ok()) << zero1.Describe();
  EXPECT_TRUE(CheckMemoryFits(at(ShardStage::kGradients), gpu, "x").ok()) << zero2.Describe();
  // ZeRO-1 leaves more than 8 GiB free, so the lighter-traffic stage is the one to use.
  EXPECT_LT(zero1.total(), gpu - 8 * kGiB) << zero1.Describe();
  EXPECT_LT(zero2.total(), zero1.total());
}

TEST(MemoryEstimate, APlanThatFitsPasses) {
  const MemoryPlan p = QwenLoraPlan();
  const int64_t need = EstimateMemory(p).total();
  EXPECT_TRUE(CheckMemoryFits(p, need, "test").ok());
  EXPECT_TRUE(CheckMemoryFits(p, 64 * kGiB, "test").ok());
}

TEST(MemoryEstimate, APlanThatDoesNotFitIsRefusedWithTheBreakdownAndSuggestions) {
  MemoryPlan p = QwenLoraPlan();
  p.lora.reset();  // a full fine-tune
  p.batch_size = 4;
  const MemoryEstimate e = EstimateMemory(p);
  const Status s = CheckMemoryFits(p, 8 * kGiB, "MemAvailable in /proc/meminfo");
  ASSERT_EQ(s.code(), StatusCode::kFailedPrecondition);
  const std::string& m = s.message();
  EXPECT_EQ(m.find("memory: this plan needs about " + e.Describe() +
                   " but 8.0 GiB is available (MemAvailable in /proc/meminfo). To fit: "),
            0u)
      << m;
  MemoryPlan ckpt = p;
  ckpt.gradient_checkpointing = true;
  for (const std::string& hint :
       {std::string("lora: {} (train adapters, not the whole model) (about "),
        "train.gradient_checkpointing: true (about " + FormatGiB(EstimateMemory(ckpt).total()) + ")",
        std::string("train.loss_chunk_tokens: 0 (about "),
        std::string("train.batch_size: 2 (raise train.grad_accum to keep the batch) (about "),
        std::string("data.max_seq_len: 1024 (about "),
        std::string("; or set train.skip_memory_check: true to train anyway")}) {
    EXPECT_NE(m.find(hint), std::string::npos) << hint << "\n" << m;
  }
  EXPECT_EQ(m.find("lora.base_dtype"), std::string::npos) << "no LoRA, so no base dtype to suggest";
}

// Train() checks before reading weights: a model folder whose weights file is missing fails with
// the memory message, not with the missing file.
TEST(MemoryEstimate, TrainRefusesBeforeLoadingWeights) {
  const std::string dir = MakeTempDir();
  JobSpec spec = TinySpec(dir, 2);
  json config = spec.model.config;
  config["vocab_size"] = 300;  // the byte tokenizer's 259 and some
  WriteWholeFile(dir + "/model/config.json", config.dump());
  spec.model.config = nullptr;
  spec.model.path = dir + "/model";
  TrainOptions options;
  options.hooks.available_memory = 1 << 20;
  StatusOr<TrainResult> r = Train(spec, options);
  ASSERT_THAT(r, StatusIs(StatusCode::kFailedPrecondition,
                          HasSubstr("but 0.0 GiB is available (the test's available memory)")));
  EXPECT_FALSE(std::filesystem::exists(dir + "/run/checkpoint-2"));
  // With the override the same plan reaches the weights (and fails there: there are none).
  spec.train.skip_memory_check = true;
  r = Train(spec, options);
  EXPECT_THAT(r, StatusIs(StatusCode::kNotFound, ::testing::AllOf(HasSubstr("model.safetensors"),
                                                                  ::testing::Not(HasSubstr("memory:")))));
}

TEST(MemoryEstimate, AFittingPlanTrains) {
  const std::string dir = MakeTempDir();
  JobSpec spec = TinySpec(dir, 2);
  TrainOptions options;
  options.hooks.available_memory = 8 * kGiB;
  StatusOr<TrainResult> r = Train(spec, options);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->steps, 2);
}

// The estimate against the measured peak resident set of one fp32 training step (model built,
// forward, backward, AdamW) on a small model with a 16k vocabulary, a full fine-tune without
// checkpointing and LoRA with it. Stated factor: the estimate (without the fixed runtime part) is within
// [0.6, 1.6] of the measured growth of the resident set.
TEST(MemoryEstimate, WithinAStatedFactorOfTheMeasuredPeak) {
  if (!ResetPeakResident()) GTEST_SKIP() << "this system cannot reset the peak resident set";
  const ModelConfig c = *ParseModelConfig({{"model_type", "qwen2"},
                                           {"vocab_size", 16384},
                                           {"hidden_size", 256},
                                           {"intermediate_size", 704},
                                           {"num_hidden_layers", 4},
                                           {"num_attention_heads", 4},
                                           {"num_key_value_heads", 2},
                                           {"max_position_embeddings", 512},
                                           {"tie_word_embeddings", true}},
                                          "test");
  DevicePlan plan;  // CPU, fp32
  // Full without checkpointing and LoRA with it: the two ends (each case costs a few seconds).
  for (bool lora : {false, true}) {
    for (bool ckpt : {lora}) {
      JobSpec spec;
      spec.train.batch_size = 2;
      spec.data.max_seq_len = 512;
      spec.train.gradient_checkpointing = ckpt;
      if (lora) spec.lora = LoraSpec();
      const MemoryPlan mp = PlanMemory(spec, c, plan);
      const MemoryEstimate e = EstimateMemory(mp);
      ASSERT_TRUE(ResetPeakResident());
      const int64_t before = ResidentBytes();
      {
        torch::manual_seed(0);
        CausalLM m(c);
        if (lora) {
          ASSERT_TRUE(ApplyLora(m, *spec.lora).ok());
        }
        m->SetGradientCheckpointing(ckpt);
        m->SetLossChunkTokens(mp.loss_chunk_tokens);
        std::vector<std::pair<std::string, torch::Tensor>> params;
        for (const auto& p : m->named_parameters()) params.emplace_back(p.key(), p.value());
        FlatAdamW opt(params, spec.train, DecaysWeight);
        Batch b;
        b.input_ids = torch::randint(0, c.vocab_size, {2, 512}, torch::kInt64);
        b.labels = b.input_ids.clone();
        b.targets = 2 * 511;
        AccumulateWindow(m, {b}, plan);
        opt.Step(1e-4);
      }
      const double measured = static_cast<double>(PeakResidentBytes() - before);
      const double estimated = static_cast<double>(e.total() - e.runtime);
      const std::string what = std::string(lora ? "lora" : "full") + (ckpt ? " + checkpointing" : "");
      EXPECT_GE(estimated, 0.6 * measured)
          << what << ": estimate " << e.Describe() << ", measured " << measured;
      EXPECT_LE(estimated, 1.6 * measured)
          << what << ": estimate " << e.Describe() << ", measured " << measured;
    }
  }
}

}  // namespace
}  // namespace sftctl::trainer
