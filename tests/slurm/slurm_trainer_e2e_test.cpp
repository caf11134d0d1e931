// The real sftctl-trainer through Slurm: a 2-node x 1-rank CPU job (Gloo) on the test cluster
// (tests/slurm/slurm_cluster.h), started by the engine's sbatch script, trains the same spec as
// `sftctl run --local --ranks 2` and ends with the same weights.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "agent/process/command_runner.h"
#include "agent/slurm/sbatch_script.h"
#include "agent/slurm/slurm_cli.h"
#include "common/formats/safetensors.h"
#include "common/os/process_util.h"
#include "tests/client/tiny_job.h"
#include "tests/slurm/slurm_cluster.h"
#include "tests/slurm/weights_diff.h"
#include "tests/util/command.h"
#include "tests/util/file_util.h"
#include "tests/util/wait_for.h"

namespace sftctl::agent::slurm {
namespace {

using ::sftctl::testing::Bin;
using ::sftctl::testing::ReadWholeFile;
using ::sftctl::testing::WriteWholeFile;

using ::sftctl::testing::MaxAbsDiff;

TEST(SlurmTrainer, TwoNodeGlooJobEndsWithTheWeightsOfATwoRankLocalRun) {
  auto cluster = sftctl::testing::SlurmCluster::Start();
  ASSERT_NE(cluster, nullptr);
  const std::string dir = sftctl::testing::MakeTempDir("slurm-trainer");
  const std::string spec = sftctl::testing::WriteTinyJobSpec(
      dir,
      "precision: fp32\nthreads: 1\ntrain: {max_steps: 3, batch_size: 4}\ndistributed: {timeout_s: 60}\n",
      24);
  const auto local =
      sftctl::testing::RunShell(Bin("sftctl") + " run --local --ranks 2 " + spec + " -o " + dir + "/local");
  ASSERT_EQ(local.exit_code, 0) << local.output;

  // The Slurm job trains the same canonical spec, its run folder inside the job folder.
  const std::string job_dir = dir + "/job";
  nlohmann::json j = nlohmann::json::parse(ReadWholeFile(dir + "/local/spec.json"));
  j["output_dir"] = job_dir + "/run";
  WriteWholeFile(job_dir + "/spec.json", j.dump(2) + "\n");
  SlurmOptions options;
  options.nodes = 2;
  const SbatchJob job{"sftctl-tiny", job_dir, Bin("sftctl-trainer"), ChildEnvironment(ChildKind::kRank)};
  auto script = RenderSbatchScript(options, job);
  ASSERT_TRUE(script.ok()) << script.status().ToString();
  WriteWholeFile(ScriptPath(job_dir), *script);
  WriteWholeFile(RankEnvPath(job_dir), RenderRankEnv(job.rank_env));

  const std::unique_ptr<CommandRunner> runner = CommandRunner::NewPosix(ChildKind::kSlurmCommand);
  const SlurmCli cli(runner.get(), {cluster->env()});
  auto id = cli.Submit(ScriptPath(job_dir));
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  StatusOr<SlurmJobInfo> info = NotFoundError("not queried");
  ::sftctl::testing::WaitFor(
      [&] {
        info = cli.Query(*id, job_dir);
        return info.ok() && IsTerminal(info->state);
      },
      std::chrono::seconds(120), std::chrono::milliseconds(100));
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  ASSERT_EQ(info->Describe(), "COMPLETED") << ReadWholeFile(BatchOutputPath(job_dir)) << "\nrank 0:\n"
                                           << ReadWholeFile(job_dir + "/logs/rank-0.stderr") << "\nrank 1:\n"
                                           << ReadWholeFile(job_dir + "/logs/rank-1.stderr");

  const std::string ckpt = "/checkpoint-000003";
  ASSERT_TRUE(std::filesystem::exists(job_dir + "/run" + ckpt + "/DONE"));
  EXPECT_LE(MaxAbsDiff(dir + "/local" + ckpt + "/model.safetensors",
                       job_dir + "/run" + ckpt + "/model.safetensors"),
            1e-6);
  // Rank 1 ran on n2 and joined a world of two.
  EXPECT_THAT(ReadWholeFile(job_dir + "/logs/rank-1.events"), ::testing::HasSubstr("\"world_size\":2"));
}

}  // namespace
}  // namespace sftctl::agent::slurm
