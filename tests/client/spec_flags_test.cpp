// The flags that change a job spec are applied one way (client/commands/spec_flags.h): each becomes a
// --set override in the one list the spec is loaded with. Through the real sftctl, `run --dry-run` and
// `submit --dry-run` given the same flags print the same spec, byte for byte, so a flag applied
// differently in one command fails here; and a flag's value reaches the spec exactly as typed.
#include "client/commands/spec_flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/spec/spec_yaml.h"
#include "tests/util/command.h"
#include "tests/util/file_util.h"
#include "tests/util/temp_dir.h"

namespace sftctl::client {
namespace {

using sftctl::testing::Bin;
using sftctl::testing::RunForStdout;
using sftctl::testing::TempDir;
using sftctl::testing::WriteWholeFile;
using ::testing::HasSubstr;

constexpr char kSpec[] = R"(model:
  config: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4,
           max_position_embeddings: 64}
tokenizer: byte
data:
  train: train.jsonl
train: {max_steps: 100, lr: 0.001}
seed: 3
)";

// What `sftctl <command> SPEC <flags> --dry-run` prints on stdout (the spec it would run or send).
std::string DryRun(const std::string& command, const std::string& spec,
                   const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {Bin("sftctl"), command, spec};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back("--dry-run");
  auto r = RunForStdout(argv);
  EXPECT_EQ(r.exit_code, 0) << command << ": " << r.output;
  return r.output;
}

class SpecFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteWholeFile(dir_.path() + "/train.jsonl", "{\"text\": \"1+1=2\"}\n");
    WriteWholeFile(spec_, kSpec);
  }

  TempDir dir_{"spec-flags"};
  std::string spec_ = dir_.path() + "/job.yaml";
};

// Every flag `run` and `submit` share, each changing the spec, and a --set that a dedicated flag
// overrides: the two commands print the same spec, byte for byte.
TEST_F(SpecFlagsTest, RunAndSubmitMakeTheSameSpecFromTheSameFlags) {
  const std::vector<std::string> flags = {"--set",         "train.max_steps=3",
                                          "--set",         "eval.interval=5",
                                          "--max-steps",   "7",
                                          "--device",      "cpu",
                                          "--precision",   "fp32",
                                          "--seed",        "11",
                                          "--upload-to",   "s3://bucket/runs/a #1",
                                          "--resume-from", "s3://bucket/runs/b"};
  const std::string run = DryRun("run", spec_, flags);
  const std::string submit = DryRun("submit", spec_, flags);
  EXPECT_EQ(run, submit);

  const auto j = nlohmann::json::parse(run, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object()) << run;
  EXPECT_EQ(j["train"]["max_steps"], 7);  // the flag wins over the --set before it
  EXPECT_EQ(j["train"]["lr"], 0.001);     // the spec's own
  EXPECT_EQ(j["eval"]["interval"], 5);
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["precision"], "fp32");
  EXPECT_EQ(j["seed"], 11);
  EXPECT_EQ(j["checkpoint"]["upload_to"], "s3://bucket/runs/a #1");  // as typed: no YAML comment
  EXPECT_EQ(j["resume"], "s3://bucket/runs/b");

  // Without flags too; and the flags did change it.
  const std::string plain = DryRun("run", spec_, {});
  EXPECT_EQ(plain, DryRun("submit", spec_, {}));
  EXPECT_NE(plain, run);
}

// A flag's text is never read as YAML: a folder named like a comment, a mapping or null.
TEST_F(SpecFlagsTest, AFlagsValueIsTakenAsTyped) {
  const std::string odd = dir_.path() + "/runs: #1 [null] \"q\" \\ ü";
  const auto j = nlohmann::json::parse(DryRun("run", spec_, {"-o", odd}), nullptr, false);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["output_dir"], odd);

  for (const std::string name : {"null", "1e3", "[a, b]", "{x: 1}", "a: b # c", "-x", "tab\there", "~"}) {
    SpecFlags f;
    f.name = name;
    auto overrides = SpecOverrides(SpecCommand::kSubmit, f);
    ASSERT_TRUE(overrides.ok()) << overrides.status().ToString();
    auto spec = LoadSpecFile(spec_, *overrides);
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status().ToString();
    EXPECT_EQ(spec->name, name);
  }
}

// submit checks --upload-to and --resume-from before loading (the host's agent uses them); run's
// --upload-to is checked as the spec's field.
TEST_F(SpecFlagsTest, SubmitChecksTheBucketFlagsFirst) {
  SpecFlags f;
  f.resume_from = "gs://x/y";
  EXPECT_THAT(SpecOverrides(SpecCommand::kSubmit, f).status().message(), HasSubstr("--resume-from: "));
  EXPECT_TRUE(SpecOverrides(SpecCommand::kRun, f).ok());  // a local run also resumes from a folder
  f = SpecFlags();
  f.upload_to = "hf://datasets/org/x";
  EXPECT_THAT(SpecOverrides(SpecCommand::kSubmit, f).status().message(), HasSubstr("--upload-to: "));
  auto spec = LoadSpecFile(spec_, *SpecOverrides(SpecCommand::kRun, f));
  EXPECT_THAT(spec.status().message(), HasSubstr("command line: field 'checkpoint.upload_to': must be"));
}

}  // namespace
}  // namespace sftctl::client
