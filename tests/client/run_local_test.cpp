// End to end through the real binaries: `sftctl run --local` with good and bad input, a run folder's
// spec.json used again, the example spec, and `sftctl tokenize` (the demo: demo_test.cpp).
#include <gtest/gtest.h>

#include <fstream>

#include "tests/client/tiny_job.h"
#include "tests/trainer/test_util.h"
#include "tests/util/command.h"
#include "tests/util/test_paths.h"

namespace sftctl {
namespace {

using sftctl::testing::Bin;
using sftctl::testing::MakeTempDir;
using sftctl::testing::ReadMetrics;
using sftctl::testing::RunShell;
using sftctl::testing::WriteWholeFile;

std::string WriteSpec(const std::string& dir, const std::string& extra) {
  return sftctl::testing::WriteTinyJobSpec(dir, extra);
}

TEST(RunLocal, TrainsFromASpecAndWritesTheRunFolder) {
  const std::string dir = MakeTempDir("run-ok");
  const std::string spec = WriteSpec(dir, "train: {max_steps: 3, batch_size: 4}\n");
  auto r = RunShell(Bin("sftctl") + " run --local " + spec);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("checkpoint: " + dir + "/runs/job/checkpoint-000003"), std::string::npos)
      << r.output;
  auto records = ReadMetrics(dir + "/runs/job/metrics.jsonl");
  int steps = 0;
  for (const auto& rec : records) steps += rec["event"] == "step";
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(records.back()["event"], "done");
  for (const char* f : {"spec.json", "checkpoint-000003/DONE", "checkpoint-000003/config.json"}) {
    EXPECT_TRUE(std::filesystem::exists(dir + "/runs/job/" + f)) << f;
  }
}

TEST(RunLocal, UnknownFieldIsRejectedWithItsLine) {
  const std::string dir = MakeTempDir("run-unknown");
  const std::string spec = WriteSpec(dir, "train:\n  max_step: 3\n");
  auto r = RunShell(Bin("sftctl") + " run --local " + spec);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(
      r.output.find("job.yaml:8: field 'train.max_step': unknown field (did you mean 'train.max_steps'?)"),
      std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/runs")) << "nothing may be written for a bad spec";
}

TEST(RunLocal, WrongTypeIsRejected) {
  const std::string dir = MakeTempDir("run-type");
  auto r = RunShell(Bin("sftctl") + " run --local " + WriteSpec(dir, "train: {lr: fast}\n"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("field 'train.lr': must be a number, got a string"), std::string::npos) << r.output;
}

TEST(RunLocal, MissingDataFileIsNamed) {
  const std::string dir = MakeTempDir("run-missing");
  WriteWholeFile(dir + "/job.yaml",
                 std::string(sftctl::testing::kTinyJobModel) + "data: {train: nowhere.jsonl}\n");
  auto r = RunShell(Bin("sftctl") + " run --local " + dir + "/job.yaml");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("field 'data.train': file '" + dir + "/nowhere.jsonl' does not exist"),
            std::string::npos)
      << r.output;
}

TEST(RunLocal, EmptyDataFileIsNamed) {
  const std::string dir = MakeTempDir("run-empty");
  WriteWholeFile(dir + "/empty.jsonl", "");
  WriteWholeFile(dir + "/job.yaml",
                 std::string(sftctl::testing::kTinyJobModel) + "data: {train: empty.jsonl}\n");
  auto r = RunShell(Bin("sftctl") + " run --local " + dir + "/job.yaml");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("data file '" + dir + "/empty.jsonl' is empty"), std::string::npos) << r.output;
}

TEST(RunLocal, MalformedJsonlLineIsNamed) {
  const std::string dir = MakeTempDir("run-badline");
  WriteWholeFile(dir + "/bad.jsonl",
                 "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": 3, \"completion\": \"b\"}\n");
  WriteWholeFile(dir + "/job.yaml",
                 std::string(sftctl::testing::kTinyJobModel) + "data: {train: bad.jsonl}\n");
  auto r = RunShell(Bin("sftctl") + " run --local " + dir + "/job.yaml");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find(dir + "/bad.jsonl:2: field 'prompt' must be a string"), std::string::npos)
      << r.output;
}

TEST(RunLocal, MixedFormatsInOneFileAreRejected) {
  const std::string dir = MakeTempDir("run-mixed");
  WriteWholeFile(dir + "/mixed.jsonl", "{\"text\": \"hello\"}\n{\"prompt\": \"a\", \"completion\": \"b\"}\n");
  WriteWholeFile(dir + "/job.yaml",
                 std::string(sftctl::testing::kTinyJobModel) + "data: {train: mixed.jsonl}\n");
  auto r = RunShell(Bin("sftctl") + " run --local " + dir + "/job.yaml");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("mixed.jsonl:2: record is 'prompt_completion' but the file is 'text'"),
            std::string::npos)
      << r.output;
}

TEST(RunLocal, SetOverridesAnyFieldThroughTheSameValidation) {
  const std::string dir = MakeTempDir("run-set");
  const std::string spec = WriteSpec(dir, "train: {max_steps: 50, batch_size: 4}\n");
  auto ok =
      RunShell(Bin("sftctl") + " run --local " + spec + " --set train.max_steps=2 --set checkpoint.keep=1");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  auto j = nlohmann::json::parse(std::ifstream(dir + "/runs/job/spec.json"));
  EXPECT_EQ(j["train"]["max_steps"], 2);
  EXPECT_EQ(j["checkpoint"]["keep"], 1);

  auto unknown = RunShell(Bin("sftctl") + " run --local " + spec + " --set train.nope=1");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.output.find("--set: unknown field 'train.nope'"), std::string::npos) << unknown.output;
  auto bad = RunShell(Bin("sftctl") + " run --local " + spec + " --set train.lr=fast");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("command line: field 'train.lr': must be a number, got a string"),
            std::string::npos)
      << bad.output;
}

TEST(RunLocal, EventsFdCarriesTheMetricRecords) {
  const std::string dir = MakeTempDir("run-events");
  const std::string spec = WriteSpec(dir, "train: {max_steps: 3, batch_size: 4}\n");
  auto r = RunShell(Bin("sftctl") + " run --local " + spec + " --events-fd 3 3>" + dir + "/events.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto events = ReadMetrics(dir + "/events.jsonl");
  auto metrics = ReadMetrics(dir + "/runs/job/metrics.jsonl");
  ASSERT_EQ(events.size(), metrics.size());
  std::vector<std::string> kinds;
  for (const auto& e : events) kinds.push_back(e["event"]);
  EXPECT_EQ(kinds, (std::vector<std::string>{"start", "step", "step", "step", "checkpoint", "done"}));
  EXPECT_EQ(events[3]["step"], 3);
  EXPECT_TRUE(events[3].contains("loss") && events[3].contains("lr") && events[3].contains("grad_norm") &&
              events[3].contains("tokens_per_s") && events[3].contains("elapsed_s") &&
              events[3].contains("epoch"));
}

// `run` trains here with or without --local (a newcomer types `sftctl run job.yaml`).
TEST(RunLocal, RunWithoutLocalTrainsHere) {
  const std::string dir = MakeTempDir("run-plain");
  const std::string spec = WriteSpec(dir, "train: {max_steps: 1, batch_size: 2}\n");
  auto r = RunShell(Bin("sftctl") + " run " + spec);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/runs/job/checkpoint-000001/DONE")) << r.output;
  std::filesystem::remove_all(dir);
}

// A spec given relative to the working directory (`--set data.train=...`, `-o runs/try1`) leaves a
// spec.json in the run folder that works again from there: `inspect-data` and `run` on it find the
// same data (it used to join the run folder to the relative paths a second time).
TEST(RunLocal, TheRunFoldersSpecJsonWorksAgain) {
  const std::string dir = MakeTempDir("run-again");
  WriteSpec(dir, "train: {max_steps: 1, batch_size: 2}\n");
  const std::string in_dir = "cd " + dir + " && " + Bin("sftctl");
  auto r = RunShell(in_dir + " run job.yaml --set data.train=train.jsonl -o runs/try1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string real = std::filesystem::canonical(dir).string();
  auto j = nlohmann::json::parse(std::ifstream(dir + "/runs/try1/spec.json"));
  EXPECT_EQ(j["data"]["train"], nlohmann::json::array({real + "/train.jsonl"}));
  EXPECT_EQ(j["output_dir"], real + "/runs/try1");
  auto inspect = RunShell(in_dir + " inspect-data runs/try1/spec.json -n 1");
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find(real + "/train.jsonl:1: "), std::string::npos) << inspect.output;
  auto rerun = RunShell(in_dir + " run runs/try1/spec.json --max-steps 2");
  ASSERT_EQ(rerun.exit_code, 0) << rerun.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/runs/try1/checkpoint-000002/DONE")) << rerun.output;
}

// examples/job.yaml, the spec the README's Usage section runs, trains as it is (two steps here;
// tests/common/spec_test.cpp checks its fields).
TEST(RunLocal, TheExampleSpecTrains) {
  const std::string dir = MakeTempDir("run-example");
  auto r = RunShell(Bin("sftctl") + " run " + SFTCTL_SOURCE_DIR + "/examples/job.yaml -o " + dir +
                    "/run --max-steps 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/run/checkpoint-000002/DONE")) << r.output;
  EXPECT_NE(r.output.find("held-out exact match"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace sftctl

namespace sftctl {
namespace {

TEST(Tokenize, EncodesAndDecodesWithTheByteTokenizer) {
  auto enc = sftctl::testing::RunShell("printf 'hi\\n<|end|>\\n' | " + sftctl::testing::Bin("sftctl") +
                                       " tokenize --tokenizer byte");
  ASSERT_EQ(enc.exit_code, 0) << enc.output;
  EXPECT_EQ(enc.output, "104 105\n256\n");
  auto dec = sftctl::testing::RunShell("printf '104 105 256\\n' | " + sftctl::testing::Bin("sftctl") +
                                       " tokenize --tokenizer byte --decode");
  ASSERT_EQ(dec.exit_code, 0) << dec.output;
  EXPECT_EQ(dec.output, "hi<|end|>\n");
}

TEST(Tokenize, BadTokenizerFolderIsNamed) {
  const std::string dir = sftctl::testing::MakeTempDir("tok-bad");
  auto r = sftctl::testing::RunShell("echo hi | " + sftctl::testing::Bin("sftctl") +
                                     " tokenize --tokenizer " + dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(dir + "/tokenizer.json"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace sftctl
