// End to end through the real binaries: `sftctl run --profile DIR --profile-steps N` writes the trainer's
// Chrome trace (trainer/training/step_profiler.h), a bad DIR fails before anything trains, and
// metrics.phase_times set through --set reaches the step records.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "tests/client/tiny_job.h"
#include "tests/trainer/test_util.h"
#include "tests/util/command.h"
#include "tests/util/test_paths.h"

namespace sftctl {
namespace {

using sftctl::testing::Bin;
using sftctl::testing::MakeTempDir;
using sftctl::testing::ReadMetrics;
using sftctl::testing::ReadWholeFile;
using sftctl::testing::RunShell;
using sftctl::testing::WriteTinyJobSpec;
using sftctl::testing::WriteWholeFile;

TEST(RunProfile, WritesTheTraceOfTheStepsAfterTheWarmUp) {
  const std::string dir = MakeTempDir("run-profile");
  const std::string spec = WriteTinyJobSpec(dir, "train: {max_steps: 4, batch_size: 4}\n");
  auto r =
      RunShell("cd " + dir + " && " + Bin("sftctl") + " run " + spec + " --profile prof --profile-steps 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string path = dir + "/prof/trace-rank0.json";
  EXPECT_NE(r.output.find("steps 2-3 traced to " + path), std::string::npos) << r.output;
  const nlohmann::json trace = nlohmann::json::parse(ReadWholeFile(path));
  const nlohmann::json& events = trace.is_array() ? trace : trace.at("traceEvents");
  std::set<std::string> names;
  for (const auto& e : events) names.insert(e.value("name", ""));
  EXPECT_TRUE(names.count("aten::mm") || names.count("aten::addmm")) << names.size() << " names";
  EXPECT_TRUE(names.count("sftctl step 2") && names.count("sftctl step 3"));
  EXPECT_FALSE(names.count("sftctl step 1") || names.count("sftctl step 4"));
}

TEST(RunProfile, AFileForTheFolderFailsBeforeTrainingAndNamesIt) {
  const std::string dir = MakeTempDir("run-profile-bad");
  const std::string spec = WriteTinyJobSpec(dir, "train: {max_steps: 2}\n");
  WriteWholeFile(dir + "/taken", "x");
  auto r = RunShell(Bin("sftctl") + " run " + spec + " --profile " + dir + "/taken");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--profile: '" + dir + "/taken' is not a folder"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/runs")) << "nothing may train";
}

TEST(RunProfile, StepsWithoutAFolderAreRefused) {
  const std::string dir = MakeTempDir("run-profile-steps");
  const std::string spec = WriteTinyJobSpec(dir, "train: {max_steps: 2}\n");
  auto r = RunShell(Bin("sftctl") + " run " + spec + " --profile-steps 2");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--profile"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/runs"));
}

TEST(RunProfile, HelpNamesTheTraceFile) {
  auto r = RunShell(Bin("sftctl") + " run --help");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--profile-steps"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("trace-rank<R>.json"), std::string::npos) << r.output;
}

TEST(RunProfile, PhaseTimesFromTheSpec) {
  const std::string dir = MakeTempDir("run-phases");
  const std::string spec = WriteTinyJobSpec(dir, "train: {max_steps: 2, batch_size: 4}\n");
  auto r = RunShell(Bin("sftctl") + " run " + spec + " --set metrics.phase_times=true");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  int steps = 0;
  for (const auto& rec : ReadMetrics(dir + "/runs/job/metrics.jsonl")) {
    if (rec["event"] != "step") continue;
    ++steps;
    for (const char* key : {"forward_ms", "loss_ms", "backward_ms", "optimizer_ms"})
      EXPECT_GT(rec.value(key, 0.0), 0.0) << key << " in " << rec.dump();
  }
  EXPECT_EQ(steps, 2);
}

}  // namespace
}  // namespace sftctl
