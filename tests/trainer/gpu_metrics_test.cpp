// trainer/training/gpu_metrics.h: the peak table, FLOPs per token and MFU arithmetic, CUDA_VISIBLE_DEVICES to
// NVML devices, NVML loaded at run time (absent, not NVML, and a stand-in library), and what a step
// record gets on CPU (RSS only) and on a CUDA device with NVML.
#include "trainer/training/gpu_metrics.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace sftctl::trainer {
namespace {

TEST(GpuPeak, TableKnowsCommonGpusByTheirNames) {
  EXPECT_EQ(PeakTflopsForGpu("NVIDIA H100 80GB HBM3"), 989);
  EXPECT_EQ(PeakTflopsForGpu("NVIDIA H100 PCIe"), 756);
  EXPECT_EQ(PeakTflopsForGpu("NVIDIA H200"), 989);
  EXPECT_EQ(PeakTflopsForGpu("NVIDIA A100-SXM4-80GB"), 312);
  EXPECT_EQ(PeakTflopsForGpu("NVIDIA A10G"), 70);
  EXPECT_EQ(PeakTflopsForGpu("NVIDIA A10"), 125);
  EXPECT_EQ(PeakTflopsForGpu("NVIDIA L40S"), 362);
  EXPECT_EQ(PeakTflopsForGpu("NVIDIA L4"), 121);
  EXPECT_EQ(PeakTflopsForGpu("Tesla T4"), 65);
  EXPECT_FALSE(PeakTflopsForGpu("Some Future GPU").has_value());
}

TEST(Flops, FullFineTuneIsSixNPlusAttention) {
  FlopsModel m{/*matmul_params=*/1'000'000, /*trainable_params=*/1'000'000, /*layers=*/2,
               /*attention_width=*/64, /*seq_len=*/128};
  EXPECT_EQ(TrainFlopsPerToken(m), 6.0e6 + 12.0 * 2 * 64 * 128);
}

TEST(Flops, FrozenWeightsSkipTheirWeightGradients) {
  FlopsModel m{1'000'000, 10'000, 0, 0, 0};
  EXPECT_EQ(TrainFlopsPerToken(m), 4.0e6 + 2.0e4);
  m.trainable_params = 5'000'000;  // never more than N
  EXPECT_EQ(TrainFlopsPerToken(m), 6.0e6);
}

// The Qwen2.5-0.5B architecture at T = 2048 (bench/gpu's model), by hand:
//   per layer q, o 896 x 896 each, k, v 896 x 128 each (2 of 14 heads' 64 dims), MLP 3 x 896 x 4864
//     = 1,605,632 + 229,376 + 13,074,432 = 14,909,440;  x 24 layers = 357,826,560
//   LM head (the tied embedding) 151,936 x 896 = 136,134,656;  N = 493,961,216
//   6 N = 2,963,767,296;  attention 12 x 24 x 896 x 2048 = 528,482,304;  total 3,492,249,600
ModelConfig Qwen25Half() {
  ModelConfig c;
  c.vocab_size = 151936;
  c.hidden_size = 896;
  c.intermediate_size = 4864;
  c.num_hidden_layers = 24;
  c.num_attention_heads = 14;
  c.num_key_value_heads = 2;
  c.tie_word_embeddings = true;
  return c;
}

TEST(Flops, Qwen25HalfBillionFullFineTuneByHand) {
  const ModelConfig c = Qwen25Half();
  EXPECT_EQ(MatmulParams(c), 493'961'216);
  // params: every parameter, norms and q/k/v biases included (494,032,768); all train.
  const auto o = ResourceOptionsFor(c, 494'032'768, 494'032'768, 2048, true, 0, 0);
  EXPECT_EQ(o.flops_per_token, 3'492'249'600.0);
  // 53,552 tok/s on an H100 (989 TFLOP/s): 18.9%.
  EXPECT_NEAR(ModelFlopsUtilisation(53'552, o.flops_per_token, 989), 0.1891, 1e-4);
}

TEST(Flops, LoraAddsItsAdaptersAndOnlyTheyGetWeightGradients) {
  const ModelConfig c = Qwen25Half();
  const int64_t adapters = 8'798'208;
  const auto o = ResourceOptionsFor(c, 494'032'768 + adapters, adapters, 2048, true, 0, 0);
  const double n = 493'961'216.0 + adapters;
  EXPECT_EQ(o.flops_per_token, 4 * n + 2.0 * adapters + 528'482'304.0);
}

TEST(Flops, UntiedEmbeddingLookupIsNotAMatmul) {
  ModelConfig c = Qwen25Half();
  c.tie_word_embeddings = false;  // a separate lm_head: still one V x h matmul, the lookup is free
  EXPECT_EQ(MatmulParams(c), 493'961'216);
  c.head_dim = 128;  // Qwen3-style explicit head_dim: q/o are h x 14*128, k/v h x 2*128
  EXPECT_EQ(MatmulParams(c), 24 * (896 * (2 * 1792 + 2 * 256) + 3 * 896 * 4864) + 136'134'656LL);
}

// The step's MFU is its own rate (tokens / step_s), not the run's average since its start (which
// counts CUDA's start-up: the trainer said 11.0% where the checklist measured 17.5%).
TEST(ResourceMetrics, StepMfuUsesTheStepsOwnRate) {
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  ResourceMetrics::Options o;
  o.cuda = true;
  o.flops_per_token = 6e9;
  o.peak_tflops = 400;
  o.nvml_library = "/nonexistent/libnvidia-ml.so.1";
  ResourceMetrics m(o);
  nlohmann::json r = {{"event", "step"}, {"tokens", 8192}, {"step_s", 0.5}, {"tokens_per_s", 1000.0}};
  m.AddTo(&r);
  EXPECT_DOUBLE_EQ(r["mfu"].get<double>(), 16384 * 6e9 / 400e12);
  nlohmann::json start = {{"event", "start"}};
  m.AddMfuInputsTo(&start);
  EXPECT_EQ(start["flops_per_token"], 6e9);
  EXPECT_EQ(start["gpu_peak_tflops"], 400);
}

TEST(Mfu, TokensPerSecondTimesFlopsOverPeak) {
  // 2,000 tok/s x 6e9 FLOPs/token = 12 TFLOP/s of 989: 1.213%.
  EXPECT_DOUBLE_EQ(ModelFlopsUtilisation(2000, 6e9, 989), 12e12 / 989e12);
  EXPECT_EQ(ModelFlopsUtilisation(2000, 6e9, 0), 0);
}

TEST(NvmlDevice, FollowsCudaVisibleDevices) {
  EXPECT_EQ(NvmlDeviceFor(1, nullptr), "1");
  EXPECT_EQ(NvmlDeviceFor(0, "3,1"), "3");
  EXPECT_EQ(NvmlDeviceFor(1, "3, 1"), "1");
  EXPECT_EQ(NvmlDeviceFor(0, "GPU-8a1b"), "GPU-8a1b");
  EXPECT_EQ(NvmlDeviceFor(2, "3,1"), "");
  EXPECT_EQ(NvmlDeviceFor(0, ""), "");
  EXPECT_EQ(NvmlDeviceFor(0, "x"), "");
}

TEST(Nvml, AbsentOrForeignLibraryLoadsNothing) {
  EXPECT_EQ(Nvml::Load("/nonexistent/libnvidia-ml.so.1"), nullptr);
  EXPECT_EQ(Nvml::Load("libc.so.6"), nullptr);  // loads, but has no NVML functions
}

TEST(Nvml, StandInLibraryIsReadByIndexAndUuid) {
  auto nvml = Nvml::Load(SFTCTL_FAKE_NVML);
  ASSERT_NE(nvml, nullptr);
  const Nvml::Reading r = nvml->Read("0");
  EXPECT_EQ(r.name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(r.util_pct, 87);
  EXPECT_EQ(r.power_w, 312.5);
  EXPECT_EQ(nvml->Read("GPU-fake").util_pct, 87);
  const Nvml::Reading none = nvml->Read("1");
  EXPECT_FALSE(none.name || none.util_pct || none.power_w);
  EXPECT_FALSE(nvml->Read("").util_pct);
}

TEST(ResourceMetrics, CpuStepsGetRssAndNoGpuFields) {
  ResourceMetrics::Options o;
  o.flops_per_token = 6e6;
  o.peak_tflops = 100;  // ignored: no MFU without a GPU
  o.nvml_library = SFTCTL_FAKE_NVML;
  ResourceMetrics m(o);
  nlohmann::json r = {{"event", "step"}, {"tokens_per_s", 1000.0}};
  m.AddTo(&r);
  ASSERT_TRUE(r.contains("rss_mb"));
  EXPECT_GT(r["rss_mb"].get<double>(), 1.0);
  for (const char* k : {"gpu_mem_allocated_mb", "gpu_mem_reserved_mb", "gpu_mem_peak_mb", "gpu_util_pct",
                        "gpu_power_w", "mfu"}) {
    EXPECT_FALSE(r.contains(k)) << k;
  }
}

TEST(ResourceMetrics, CudaWithoutNvmlOmitsUtilisationAndUnknownPeak) {
  ResourceMetrics::Options o;
  o.cuda = true;
  o.flops_per_token = 6e9;
  o.nvml_library = "/nonexistent/libnvidia-ml.so.1";
  ResourceMetrics m(o);
  nlohmann::json r = {{"event", "step"}, {"tokens_per_s", 2000.0}};
  m.AddTo(&r);
  EXPECT_TRUE(r.contains("rss_mb"));
  EXPECT_FALSE(r.contains("gpu_util_pct"));
  EXPECT_FALSE(r.contains("gpu_power_w"));
  EXPECT_FALSE(r.contains("mfu"));  // no NVML name, no override: the peak is unknown
}

TEST(ResourceMetrics, CudaWithNvmlGetsUtilisationPowerAndMfuFromTheTable) {
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  ResourceMetrics::Options o;
  o.cuda = true;
  o.flops_per_token = 6e9;
  o.nvml_library = SFTCTL_FAKE_NVML;
  ResourceMetrics m(o);
  nlohmann::json r = {{"event", "step"}, {"tokens_per_s", 2000.0}};
  m.AddTo(&r);
  EXPECT_EQ(r["gpu_util_pct"], 87);
  EXPECT_EQ(r["gpu_power_w"], 312.5);
  EXPECT_DOUBLE_EQ(r["mfu"].get<double>(), 12e12 / 989e12);  // the fake is an H100 SXM
  o.peak_tflops = 400;                                       // metrics.gpu_peak_tflops wins
  ResourceMetrics overridden(o);
  r = {{"event", "step"}, {"tokens_per_s", 2000.0}};
  overridden.AddTo(&r);
  EXPECT_DOUBLE_EQ(r["mfu"].get<double>(), 12e12 / 400e12);
}

}  // namespace
}  // namespace sftctl::trainer
