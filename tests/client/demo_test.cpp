// The built-in demo (`sftctl run` without a spec) through the real binaries: it learns within a
// fixed step budget, and its run folder works with the commands a newcomer tries next.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/trainer/test_util.h"
#include "tests/util/command.h"
#include "tests/util/test_paths.h"

namespace sftctl {
namespace {

using sftctl::testing::Bin;
using sftctl::testing::MakeTempDir;
using sftctl::testing::ReadMetrics;
using sftctl::testing::RunShell;

constexpr auto npos = std::string::npos;

// The demo task, CI-sized: a fixed step budget (not a time limit) must reach >= 85% held-out exact
// match, and the checkpoint must answer a held-out-style prompt.
//
// The budget: 1,200 steps took 90 s alone and 712-791 s of the 900 s limit on a loaded 2-core machine
// (the suite and other builds sharing both cores). 800 steps do two thirds of that work, and the
// learning rate decays over the budget given (cosine to max_steps), so the run still ends at a low
// rate. Measured at 800 steps (2 cores, loaded): the demo's seed 1234 reached 97.8% in bf16 (69-84 s)
// and in fp32 (the same 97.8%), the recipe's other seeds learn later (seed 1: 90.0%); a CPU run is
// deterministic, so the margin that matters is 1234's, and 85% leaves room for another CPU's kernels.
// 85% of 1,000 held-out sums, never trained on, is far above chance and proves learning. The limit
// (CMakeLists.txt: TIMEOUT 1800) covers a 2x slower fp32 CPU loaded as that machine was (8-9x).
TEST(Demo, LearnsAdditionWithinAFixedStepBudget) {
  const std::string dir = MakeTempDir("demo");
  auto r = RunShell(Bin("sftctl") + " run --local -o " + dir + "/run --max-steps 800 --set eval.interval=0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  double exact = -1;
  for (const auto& rec : ReadMetrics(dir + "/run/metrics.jsonl")) {
    if (rec["event"] == "eval" && rec["step"] == 800) exact = rec["exact_match"].get<double>();
  }
  EXPECT_GE(exact, 0.85) << r.output;
  auto g = RunShell(Bin("sftctl") + " generate --model " + dir +
                    "/run/checkpoint-000800 --prompt $'What is 47+38?\\n'");
  ASSERT_EQ(g.exit_code, 0) << g.output;
  EXPECT_EQ(g.output, "85\n");
}

// A newcomer's first hour (issue 38, item 7) on a one-step demo run, from the folder it was started
// in, with the run folder named relative to it as the demo's default sftctl-runs/demo-<time> is.
TEST(Demo, ItsRunFolderWorksWithTheCommandsTriedNext) {
  const std::string dir = MakeTempDir("demo-next");
  const std::string sftctl = Bin("sftctl");
  const std::string in_dir = "cd " + dir + " && ";
  auto r = RunShell(in_dir + sftctl + " run -o sftctl-runs/demo-1 --max-steps 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The closing hint can be typed in the same shell: this build's bin/ is not on PATH (nor is
  // ~/.local/bin on root's), so it names the binary by its full path.
  const std::string self = std::filesystem::canonical(sftctl).string();
  EXPECT_NE(
      r.output.find("Try the model:  " + self + " generate --model sftctl-runs/demo-1/checkpoint-000001"),
      npos)
      << r.output;

  // The run's spec.json reads back from where it lies (its relative data paths were joined twice).
  auto inspect = RunShell(in_dir + sftctl + " inspect-data sftctl-runs/demo-1/spec.json -n 2");
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("sftctl-runs/demo-1/data/train.jsonl:2: "), npos) << inspect.output;
  EXPECT_EQ(inspect.output.find("sftctl-runs/demo-1/data/train.jsonl:3: "), npos) << inspect.output;

  // Run again: it resumes from the final checkpoint and trains nothing, and says so instead of
  // reporting a train loss of 0. With sftctl on PATH the hint names it bare.
  auto again = RunShell(in_dir + "PATH=" + std::string(SFTCTL_BIN_DIR) +
                        ":$PATH sftctl run -o sftctl-runs/demo-1 --max-steps 1");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("done: the run was already complete at step 1"), npos) << again.output;
  EXPECT_EQ(again.output.find("final train loss"), npos) << again.output;
  EXPECT_NE(again.output.find("Try the model:  sftctl generate --model sftctl-runs/demo-1/checkpoint-000001"),
            npos)
      << again.output;
  const auto records = ReadMetrics(dir + "/sftctl-runs/demo-1/metrics.jsonl");
  ASSERT_FALSE(records.empty());
  EXPECT_EQ(records.back()["event"], "done");
  EXPECT_EQ(records.back()["step"], 1);
  EXPECT_FALSE(records.back().contains("loss")) << records.back().dump() << ": no step, no loss of its own";

  // The checkpoint uses the byte tokenizer: tokenize says to pass it, generate --chat says there is
  // no chat template (not that a file cannot be read).
  const std::string ckpt = dir + "/sftctl-runs/demo-1/checkpoint-000001";
  auto tok = RunShell("echo hi | " + sftctl + " tokenize --tokenizer " + ckpt);
  EXPECT_NE(tok.exit_code, 0);
  EXPECT_NE(tok.output.find("this model uses sftctl's built-in byte tokenizer (" + ckpt +
                            "/sftctl_tokenizer.json); use the tokenizer \"byte\" (--tokenizer byte)"),
            npos)
      << tok.output;
  auto chat = RunShell(sftctl + " generate --model " + ckpt + " --chat --prompt hi");
  EXPECT_NE(chat.exit_code, 0);
  EXPECT_NE(chat.output.find("this model has no chat template: '" + ckpt +
                             "' has no tokenizer_config.json (it uses sftctl's built-in byte tokenizer); "
                             "leave out --chat"),
            npos)
      << chat.output;
}

}  // namespace
}  // namespace sftctl
