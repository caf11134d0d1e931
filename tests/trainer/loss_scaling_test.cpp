// fp16 loss scaling: the scaler's policy, the precision choice per CUDA compute capability, and
// training with injected gradient overflows. LibTorch has no fp16 autocast on the CPU, so the
// training tests turn loss scaling on alone (TrainHooks::adjust_plan) and compute in fp32: what
// they check is the scaling path itself (scaled backward, unscale, skip, back off, resume).
#include <gtest/gtest.h>

#include <limits>

#include "tests/trainer/test_util.h"
#include "tests/util/status_matchers.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/distributed/loss_scaler.h"
#include "trainer/runtime/device.h"
#include "trainer/runtime/tensor_io.h"
#include "trainer/training/trainer.h"

namespace sftctl::trainer {
namespace {

using sftctl::testing::MakeTempDir;
using sftctl::testing::ReadMetrics;
using ::sftctl::testing::StatusIs;
using sftctl::testing::TinySpec;
using ::testing::HasSubstr;

TEST(DynamicLossScaler, HalvesOnOverflowAndGrowsAfterTheInterval) {
  DynamicLossScaler::Options o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  o.min_scale = 256;
  DynamicLossScaler s(o);
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.OnOverflow());
  EXPECT_EQ(s.scale(), 512);
  s.OnGoodStep();
  s.OnGoodStep();
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.good_steps(), 2);
  EXPECT_TRUE(s.OnOverflow());  // an overflow also restarts the count of good steps
  EXPECT_EQ(s.scale(), 256);
  EXPECT_EQ(s.good_steps(), 0);
  EXPECT_FALSE(s.OnOverflow());  // at the floor: not a scaling problem
  EXPECT_EQ(s.scale(), 256);
  for (int i = 0; i < 3; ++i) s.OnGoodStep();
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.good_steps(), 0);
  s.Restore(4096, 2);
  s.OnGoodStep();
  EXPECT_EQ(s.scale(), 8192);
}

DevicePlan On(torch::Device d) {
  DevicePlan p;
  p.device = d;
  return p;
}

TEST(PrecisionPolicy, AutoOnCudaPicksFp16BelowComputeCapability8) {
  const torch::Device cuda(torch::kCUDA, 0);
  DevicePlan t4 = On(cuda);
  ASSERT_TRUE(PickPrecision("auto", false, ComputeCapability{7, 5}, &t4).ok());
  EXPECT_EQ(t4.precision(), "fp16");
  EXPECT_TRUE(t4.loss_scaling);
  EXPECT_FALSE(t4.bf16);
  EXPECT_NE(t4.reason.find("compute capability 7.5 has no bf16"), std::string::npos) << t4.reason;

  DevicePlan a100 = On(cuda);
  ASSERT_TRUE(PickPrecision("auto", false, ComputeCapability{8, 0}, &a100).ok());
  EXPECT_EQ(a100.precision(), "bf16");
  EXPECT_FALSE(a100.loss_scaling);

  DevicePlan unknown = On(cuda);  // the driver could not be asked: bf16, as before
  ASSERT_TRUE(PickPrecision("auto", false, std::nullopt, &unknown).ok());
  EXPECT_EQ(unknown.precision(), "bf16");

  DevicePlan asked = On(cuda);
  ASSERT_TRUE(PickPrecision("fp16", false, ComputeCapability{9, 0}, &asked).ok());
  EXPECT_EQ(asked.precision(), "fp16");
  EXPECT_TRUE(asked.loss_scaling);
}

TEST(PrecisionPolicy, Fp16OffCudaIsRefusedNamingTheField) {
  DevicePlan cpu = On(torch::kCPU);
  Status s = PickPrecision("fp16", true, std::nullopt, &cpu);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "field 'precision': fp16 (with loss scaling) needs a CUDA device; on cpu use fp32 or bf16");
  DevicePlan mps = On(torch::Device(torch::kMPS));
  s = PickPrecision("fp16", false, std::nullopt, &mps);
  EXPECT_EQ(s.message(), "field 'precision': fp16 (with loss scaling) needs a CUDA device; on mps use fp32");

  DevicePlan native = On(torch::kCPU), plain = On(torch::kCPU);
  ASSERT_TRUE(PickPrecision("auto", true, std::nullopt, &native).ok());
  ASSERT_TRUE(PickPrecision("auto", false, std::nullopt, &plain).ok());
  EXPECT_EQ(native.precision(), "bf16");
  EXPECT_EQ(plain.precision(), "fp32");
  EXPECT_FALSE(native.loss_scaling || plain.loss_scaling);
}

TrainOptions WithLossScaling() {
  TrainOptions o;
  o.hooks.adjust_plan = [](DevicePlan& p) { p.loss_scaling = true; };
  return o;
}

std::vector<nlohmann::json> Events(const JobSpec& spec, const std::string& kind) {
  std::vector<nlohmann::json> out;
  for (const auto& r : ReadMetrics(spec.output_dir + "/metrics.jsonl"))
    if (r["event"] == kind) out.push_back(r);
  return out;
}

TEST(LossScaling, WithoutOverflowTrainingEqualsAnUnscaledRun) {
  const std::string dir_a = MakeTempDir("scale-off"), dir_b = MakeTempDir("scale-on");
  const JobSpec a = TinySpec(dir_a, 5), b = TinySpec(dir_b, 5);
  auto ra = Train(a, {});
  auto rb = Train(b, WithLossScaling());
  ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status().ToString() << rb.status().ToString();
  // Scales are powers of two: scaling and unscaling are exact, so the weights agree.
  auto wa = LoadTensors(ra->checkpoint_dir + "/model.safetensors");
  auto wb = LoadTensors(rb->checkpoint_dir + "/model.safetensors");
  ASSERT_TRUE(wa.ok() && wb.ok());
  ASSERT_EQ(wa->size(), wb->size());
  for (const auto& [name, t] : *wa) {
    const torch::Tensor& u = wb->at(name);
    EXPECT_LE((t - u).abs().max().item<double>(), 1e-6 * (t.abs().max().item<double>() + 1e-12)) << name;
  }
  for (const auto& step : Events(b, "step")) EXPECT_EQ(step["loss_scale"], 65536.0);
  EXPECT_FALSE(Events(a, "step").front().contains("loss_scale"));
  auto state = ReadTrainerState(rb->checkpoint_dir);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->loss_scale, 65536.0);
  EXPECT_EQ(state->loss_scale_good_steps, 5);
}

TEST(LossScaling, AnOverflowSkipsTheUpdateAndHalvesTheScale) {
  const std::string dir = MakeTempDir("scale-overflow");
  const JobSpec spec = TinySpec(dir, 6);
  TrainOptions opts = WithLossScaling();
  std::map<int64_t, torch::Tensor> weights;  // a parameter as each window's backward ends
  opts.hooks.after_backward = [&](int64_t step, CausalLM& model) {
    torch::Tensor w = model->named_parameters()[0].value();
    weights[step] = w.detach().clone();
    if (step == 2) w.grad().view(-1)[0] = std::numeric_limits<float>::infinity();
  };
  auto r = Train(spec, opts);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->steps, 6);
  EXPECT_TRUE(std::isfinite(r->last_loss));
  // The third step (0-based 2) overflowed: no update, so the weights it left equal those it found.
  EXPECT_TRUE(torch::equal(weights.at(2), weights.at(3)));
  EXPECT_FALSE(torch::equal(weights.at(1), weights.at(2)));
  EXPECT_FALSE(torch::equal(weights.at(3), weights.at(4)));
  const auto skipped = Events(spec, "skipped");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0]["reason"], "overflow");
  EXPECT_EQ(skipped[0]["step"], 3);
  EXPECT_EQ(skipped[0]["loss_scale"], 32768.0);
  for (const auto& step : Events(spec, "step"))
    EXPECT_EQ(step["loss_scale"], step["step"].get<int>() < 3 ? 65536.0 : 32768.0) << step.dump();
  auto state = ReadTrainerState(r->checkpoint_dir);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->loss_scale, 32768.0);
  EXPECT_EQ(state->loss_scale_good_steps, 3);
  EXPECT_EQ(state->bad_steps, 0);  // an overflow is not a bad step

  // A resumed run continues at the saved scale.
  JobSpec more = spec;
  more.train.max_steps = 8;
  auto resumed = Train(more, WithLossScaling());
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->resumed_from_step, 6);
  EXPECT_EQ(Events(more, "step").back()["loss_scale"], 32768.0);
}

TEST(LossScaling, OverflowsAtTheFloorCountAsBadSteps) {
  const std::string dir = MakeTempDir("scale-floor");
  JobSpec spec = TinySpec(dir, 30);
  spec.train.max_bad_steps = 2;
  TrainOptions opts = WithLossScaling();
  opts.hooks.after_backward = [](int64_t, CausalLM& model) {
    model->named_parameters()[0].value().grad().view(-1)[0] = std::numeric_limits<float>::infinity();
  };
  auto r = Train(spec, opts);
  // 16 halvings take 65536 to the floor of 1; the next two overflows are bad steps.
  EXPECT_THAT(
      r, StatusIs(StatusCode::kAborted,
                  HasSubstr("stopped at step 18: 2 consecutive steps had a non-finite loss or gradient")));
  EXPECT_EQ(Events(spec, "skipped").size(), 18u);
}

}  // namespace
}  // namespace sftctl::trainer
