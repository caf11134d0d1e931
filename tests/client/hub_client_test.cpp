// The real sftctl binary against a fake Hugging Face Hub (tests/util/fake_hub.py on 127.0.0.1,
// HF_ENDPOINT): `sftctl download` (snapshot path on stdout, --include, the gated error and exit code)
// and, when the trainer is built, `sftctl run --local` training from hf:// model and data paths.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/util/command.h"
#include "tests/util/fake_hub.h"
#include "tests/util/file_util.h"
#include "tests/util/temp_dir.h"

namespace sftctl {
namespace {

using ::sftctl::testing::Bin;
using ::sftctl::testing::FakeHub;
using ::sftctl::testing::ReadWholeFile;
using ::sftctl::testing::RunCommand;
using ::sftctl::testing::RunForStdout;
using ::sftctl::testing::TempDir;
using ::sftctl::testing::WriteWholeFile;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

class HubClientTest : public ::testing::Test {
 protected:
  // Serves `model_dir` as org/tiny and org/gated (gated, token "hf_cli") and a data set org/data.
  void StartHub(const std::string& model_dir) {
    WriteWholeFile(tmp_.path() + "/repo-data/train.jsonl", data_);
    nlohmann::json config = {{"token", "hf_cli"},
                             {"repos",
                              {{"org/tiny", {{"dir", model_dir}}},
                               {"org/gated", {{"dir", model_dir}, {"gated", true}}},
                               {"datasets/org/data", {{"dir", tmp_.path() + "/repo-data"}}}}}};
    ASSERT_TRUE(hub_.Start(tmp_.path(), config));
    env_ = {"HF_ENDPOINT=" + hub_.url(), "HF_HOME=" + tmp_.path() + "/hf", "HF_TOKEN=", "HF_HUB_CACHE="};
  }

  TempDir tmp_{"hub-client"};
  FakeHub hub_;
  std::vector<std::string> env_;
  std::string data_;
};

TEST_F(HubClientTest, DownloadPrintsTheSnapshotAndHonoursInclude) {
  WriteWholeFile(tmp_.path() + "/model/config.json", "{}");
  WriteWholeFile(tmp_.path() + "/model/model.safetensors", "weights");
  StartHub(tmp_.path() + "/model");
  auto r = RunForStdout({Bin("sftctl"), "download", "org/tiny", "--include", "*.json"}, env_);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string snapshots = tmp_.path() + "/hf/hub/models--org--tiny/snapshots/";
  ASSERT_THAT(r.output, HasSubstr(snapshots));
  const std::string folder = r.output.substr(0, r.output.size() - 1);  // without the newline
  EXPECT_TRUE(fs::exists(folder + "/config.json"));
  EXPECT_FALSE(fs::exists(folder + "/model.safetensors"));  // not included

  auto gated = RunCommand({Bin("sftctl"), "download", "hf://org/gated"}, env_);
  EXPECT_EQ(gated.exit_code, 4);
  EXPECT_THAT(gated.output,
              HasSubstr("error: hf://org/gated: model org/gated is gated and no token was sent: "
                        "accept the licence at " +
                        hub_.url() + "/org/gated and set HF_TOKEN"));
  std::vector<std::string> with_token = env_;
  with_token.insert(with_token.begin(), "HF_TOKEN=hf_cli");  // the first of a name wins
  auto ok = RunForStdout({Bin("sftctl"), "download", "org/gated"}, with_token);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_THAT(ok.output, HasSubstr(tmp_.path() + "/hf/hub/models--org--gated/snapshots/"));
}

// inspect-data reads hf:// data sets, and of an hf:// model only what tokenizing needs (no weights).
TEST_F(HubClientTest, InspectDataReadsHubPathsWithoutTheWeights) {
  data_ = "{\"prompt\": \"What is 2+2?\\n\", \"completion\": \"4\"}\n";
  WriteWholeFile(tmp_.path() + "/model/config.json", "{}");
  WriteWholeFile(tmp_.path() + "/model/model.safetensors", "weights");
  StartHub(tmp_.path() + "/model");
  WriteWholeFile(tmp_.path() + "/job.yaml",
                 "model:\n  path: hf://org/tiny\ntokenizer: byte\n"
                 "data:\n  train: hf://datasets/org/data/train.jsonl\n");
  auto r = RunCommand({Bin("sftctl"), "inspect-data", tmp_.path() + "/job.yaml", "--color", "never"}, env_);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("What is 2+2?"));
  EXPECT_THAT(r.output, HasSubstr("tokenizer: byte"));
  const std::string snapshots = tmp_.path() + "/hf/hub/models--org--tiny/snapshots/";
  ASSERT_TRUE(fs::exists(snapshots));
  for (const auto& snap : fs::directory_iterator(snapshots)) {
    EXPECT_TRUE(fs::exists(snap.path() / "config.json"));
    EXPECT_FALSE(fs::exists(snap.path() / "model.safetensors"));
  }
}

#ifdef SFTCTL_HAVE_TRAINER
// A model the trainer saved is served as org/tiny; run --local trains from it and from a data set
// file, both given as hf:// paths.
TEST_F(HubClientTest, RunLocalTrainsFromHubPaths) {
  for (int i = 0; i < 16; ++i) {
    data_ += "{\"prompt\": \"What is " + std::to_string(i) + "+1?\\n\", \"completion\": \"" +
             std::to_string(i + 1) + "\"}\n";
  }
  const std::string model = R"(model:
  config: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4,
           max_position_embeddings: 64}
tokenizer: byte
device: cpu
train: {max_steps: 2, batch_size: 4}
)";
  WriteWholeFile(tmp_.path() + "/base/train.jsonl", data_);
  WriteWholeFile(tmp_.path() + "/base/job.yaml", model + "data:\n  train: train.jsonl\n");
  auto base = RunCommand({Bin("sftctl"), "run", "--local", tmp_.path() + "/base/job.yaml"});
  ASSERT_EQ(base.exit_code, 0) << base.output;
  StartHub(tmp_.path() + "/base/runs/job/checkpoint-000002");

  WriteWholeFile(
      tmp_.path() + "/ft/job.yaml",
      "model:\n  path: hf://org/tiny\ntokenizer: byte\ndevice: cpu\ntrain: {max_steps: 2, batch_size: 4}\n"
      "data:\n  train: hf://datasets/org/data/train.jsonl\n");
  auto ft = RunCommand({Bin("sftctl"), "run", "--local", tmp_.path() + "/ft/job.yaml"}, env_);
  ASSERT_EQ(ft.exit_code, 0) << ft.output;
  std::ifstream spec_in(tmp_.path() + "/ft/runs/job/spec.json");
  const nlohmann::json spec = nlohmann::json::parse(spec_in);
  const std::string path = spec["model"]["path"];
  EXPECT_EQ(path.rfind(tmp_.path() + "/hf/hub/models--org--tiny/snapshots/", 0), 0u) << path;
  EXPECT_EQ(
      spec["data"]["train"][0].get<std::string>().rfind(tmp_.path() + "/hf/hub/datasets--org--data/", 0), 0u);
  EXPECT_TRUE(fs::is_symlink(path + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(tmp_.path() + "/ft/runs/job/checkpoint-000002/DONE"));
}
#endif

}  // namespace
}  // namespace sftctl
