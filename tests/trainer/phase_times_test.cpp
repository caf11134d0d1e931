// Where a step's time goes: metrics.phase_times (trainer/training/phase_timer.h) in the step records of
// a tiny CPU run, LossSumInPhases against CausalLMImpl::LossSum, and --profile's Chrome trace
// (trainer/training/step_profiler.h) with a good and a bad folder.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "tests/trainer/test_util.h"
#include "trainer/training/trainer.h"

namespace sftctl::trainer {
namespace {

using sftctl::testing::MakeTempDir;
using sftctl::testing::ReadMetrics;
using sftctl::testing::WriteWholeFile;

constexpr const char* kPhaseKeys[] = {"forward_ms", "loss_ms", "backward_ms", "optimizer_ms"};

std::vector<nlohmann::json> StepRecords(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  for (auto& r : ReadMetrics(run_dir + "/metrics.jsonl"))
    if (r["event"] == "step") out.push_back(r);
  return out;
}

TEST(PhaseTimes, EveryStepRecordHasThePhasesWithinItsWallTime) {
  const std::string dir = MakeTempDir("phases");
  JobSpec spec = sftctl::testing::TinySpec(dir, 3);  // grad_accum 2: each phase sums two micro-batches
  spec.metrics.phase_times = true;
  auto r = Train(spec, {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const auto steps = StepRecords(spec.output_dir);
  ASSERT_EQ(steps.size(), 3u);
  for (const auto& s : steps) {
    double sum_ms = 0;
    for (const char* key : kPhaseKeys) {
      ASSERT_TRUE(s.contains(key) && s[key].is_number()) << key << " in " << s.dump();
      EXPECT_GT(s[key].get<double>(), 0.0) << key << " in " << s.dump();
      sum_ms += s[key].get<double>();
    }
    EXPECT_LE(sum_ms, s["step_s"].get<double>() * 1000.0) << s.dump();
  }
}

TEST(PhaseTimes, OffByDefault) {
  const std::string dir = MakeTempDir("phases-off");
  const JobSpec spec = sftctl::testing::TinySpec(dir, 2);
  ASSERT_FALSE(spec.metrics.phase_times);
  auto r = Train(spec, {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const auto steps = StepRecords(spec.output_dir);
  ASSERT_EQ(steps.size(), 2u);
  for (const auto& s : steps)
    for (const char* key : kPhaseKeys) EXPECT_FALSE(s.contains(key)) << key << " in " << s.dump();
}

TEST(PhaseTimes, AMisplacedBracketIsRefused) {
  PhaseTimer timer(torch::kCPU);
  EXPECT_FALSE(timer.uses_cuda_events());
  timer.Begin(Phase::kForward);
  EXPECT_THROW(timer.Begin(Phase::kLoss), c10::Error);
  EXPECT_THROW(timer.End(Phase::kLoss), c10::Error);
  timer.End(Phase::kForward);
  const PhaseTimes t = timer.Collect();
  EXPECT_GE(t[Phase::kForward], 0.0);
  EXPECT_EQ(timer.Collect()[Phase::kForward], 0.0) << "Collect starts the next step from zero";
}

// The split of LossSum that the phases time must compute exactly what LossSum does: the same loss and
// the same gradients, by the mask and by target_index.
void ExpectSameLossAndGradients(bool by_index) {
  torch::manual_seed(7);
  const nlohmann::json cfg = sftctl::testing::TinyDecoderConfig("llama", 64, 32, 64, /*tied=*/false);
  auto config = ParseModelConfig(cfg, "test");
  ASSERT_TRUE(config.ok()) << config.status().message();
  CausalLM model(*config);
  model->SetLossChunkTokens(5);  // several chunks
  const torch::Tensor ids = torch::randint(0, 64, {3, 12}, torch::kInt64);
  torch::Tensor labels = ids.clone();
  labels.index_put_({torch::indexing::Slice(), torch::indexing::Slice(0, 4)}, -100);
  torch::Tensor index;
  if (by_index) {
    const torch::Tensor targets = labels.slice(1, 1).ne(-100);  // [3, 11]: position t predicts t+1
    const torch::Tensor rows = torch::arange(3, torch::kInt64).unsqueeze(1) * 12;
    index = (rows + torch::arange(11, torch::kInt64).unsqueeze(0)).masked_select(targets);
  }
  auto grads = [&](const torch::Tensor& loss) {
    model->zero_grad();
    loss.backward();
    std::vector<torch::Tensor> out;
    for (const auto& p : model->parameters()) out.push_back(p.grad().clone());
    return out;
  };
  const torch::Tensor plain = model->LossSum(ids, labels, {}, {}, index);
  const auto plain_grads = grads(plain);
  PhaseTimer timer(torch::kCPU);
  const torch::Tensor phased = LossSumInPhases(model, ids, labels, {}, {}, index, timer);
  const auto phased_grads = grads(phased);
  EXPECT_TRUE(torch::equal(plain, phased)) << plain.item<double>() << " vs " << phased.item<double>();
  ASSERT_EQ(plain_grads.size(), phased_grads.size());
  for (size_t i = 0; i < plain_grads.size(); ++i)
    EXPECT_TRUE(torch::equal(plain_grads[i], phased_grads[i])) << i;
  const PhaseTimes t = timer.Collect();
  EXPECT_GT(t[Phase::kForward], 0.0);
  EXPECT_GT(t[Phase::kLoss], 0.0);
}

TEST(PhaseTimes, LossSumInPhasesEqualsLossSumByMask) { ExpectSameLossAndGradients(false); }
TEST(PhaseTimes, LossSumInPhasesEqualsLossSumByTargetIndex) { ExpectSameLossAndGradients(true); }

// The names of a Chrome trace's events.
std::set<std::string> TraceEventNames(const std::string& path) {
  std::set<std::string> names;
  const nlohmann::json trace = nlohmann::json::parse(sftctl::testing::ReadWholeFile(path));
  const nlohmann::json& events = trace.is_array() ? trace : trace.at("traceEvents");
  for (const auto& e : events)
    if (e.contains("name") && e["name"].is_string()) names.insert(e["name"].get<std::string>());
  return names;
}

TEST(Profile, WritesAChromeTraceOfTheStepsAfterTheWarmUp) {
  const std::string dir = MakeTempDir("profile");
  const JobSpec spec = sftctl::testing::TinySpec(dir, 4);
  TrainOptions options;
  options.profile = {dir + "/trace", 2};  // made by the trainer
  auto r = Train(spec, options);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const std::string path = dir + "/trace/trace-rank0.json";
  ASSERT_TRUE(std::filesystem::exists(path));
  const std::set<std::string> names = TraceEventNames(path);
  EXPECT_TRUE(names.count("aten::mm") || names.count("aten::addmm") || names.count("aten::matmul"))
      << "no matrix product among " << names.size() << " event names";
  EXPECT_TRUE(names.count("sftctl step 2")) << "the first profiled step";
  EXPECT_TRUE(names.count("sftctl step 3")) << "the last profiled step";
  EXPECT_FALSE(names.count("sftctl step 1")) << "the warm-up step is not profiled";
  EXPECT_FALSE(names.count("sftctl step 4")) << "only --profile-steps steps are profiled";
  EXPECT_EQ(StepRecords(spec.output_dir).size(), 4u) << "the run goes on after the trace";
}

TEST(Profile, ARunShorterThanAskedWritesWhatItProfiled) {
  const std::string dir = MakeTempDir("profile-short");
  const JobSpec spec = sftctl::testing::TinySpec(dir, 2);
  TrainOptions options;
  options.profile = {dir + "/trace", 5};
  auto r = Train(spec, options);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const std::set<std::string> names = TraceEventNames(dir + "/trace/trace-rank0.json");
  EXPECT_TRUE(names.count("sftctl step 2"));
}

TEST(Profile, AFileForTheFolderFailsBeforeTrainingAndNamesIt) {
  const std::string dir = MakeTempDir("profile-bad");
  const JobSpec spec = sftctl::testing::TinySpec(dir, 2);
  WriteWholeFile(dir + "/not-a-folder", "x");
  TrainOptions options;
  options.profile = {dir + "/not-a-folder", 3};
  auto r = Train(spec, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("'" + dir + "/not-a-folder' is not a folder"), std::string::npos)
      << r.status().message();
  EXPECT_FALSE(std::filesystem::exists(spec.output_dir + "/metrics.jsonl")) << "nothing may train";
}

TEST(Profile, NoStepsIsRefused) {
  const std::string dir = MakeTempDir("profile-zero");
  const JobSpec spec = sftctl::testing::TinySpec(dir, 2);
  TrainOptions options;
  options.profile = {dir + "/trace", 0};
  auto r = Train(spec, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--profile-steps"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace sftctl::trainer
