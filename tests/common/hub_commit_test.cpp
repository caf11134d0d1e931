// common/hub/hub_commit.h against the fake Hub (tests/util/fake_hub.py, commit/preupload/LFS
// endpoints): a folder with a small file and files over 10 MiB committed, then downloaded back equal by
// HubDownloader (LFS content in one PUT, or in parts); where the token goes; write vs read-only vs
// no token; a 5xx retried.
#include "common/hub/hub_commit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "common/hub/hf_hub.h"
#include "tests/util/fake_hub.h"
#include "tests/util/file_util.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"

namespace sftctl {
namespace {

using ::sftctl::testing::FakeHub;
using ::sftctl::testing::ReadWholeFile;
using ::sftctl::testing::StatusIs;
using ::sftctl::testing::TempDir;
using ::sftctl::testing::WriteWholeFile;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

// A Status or StatusOr that must be OK; its error is printed when it is not.
#define ASSERT_OK(expr)                                                                     \
  do {                                                                                      \
    const auto& ok_or_status = (expr);                                                      \
    ASSERT_TRUE(ok_or_status.ok()) << ::sftctl::testing::StatusOf(ok_or_status).ToString(); \
  } while (0)

constexpr const char* kReadToken = "hf_read_only_token";
constexpr const char* kWriteToken = "hf_write_secret_token";

std::string RandomBytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

class HubCommitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ckpt_ = tmp_.path() + "/checkpoint-000002";
    WriteWholeFile(ckpt_ + "/config.json", R"({"model_type": "qwen2"})");
    WriteWholeFile(ckpt_ + "/model.safetensors", RandomBytes(11 << 20, 1));  // LFS by name
    WriteWholeFile(ckpt_ + "/optimizer.bin", RandomBytes(10 << 20, 2));      // LFS by size
    WriteWholeFile(ckpt_ + "/DONE", "");
  }

  void StartHub(nlohmann::json extra = nlohmann::json::object()) {
    nlohmann::json config = {
        {"token", kReadToken}, {"write_token", kWriteToken}, {"repos", nlohmann::json::object()}};
    config.update(extra);
    ASSERT_TRUE(hub_.Start(tmp_.path(), config));
  }

  HubOptions Options(const std::string& token) {
    HubOptions o;
    o.endpoint = hub_.url();
    o.cache_dir = tmp_.path() + "/cache";
    o.token = token;
    return o;
  }

  std::vector<HubCommitFile> CheckpointFiles() {
    std::vector<HubCommitFile> files;
    for (const char* name : {"config.json", "model.safetensors", "optimizer.bin", "DONE"})
      files.push_back({std::string("checkpoint-000002/") + name, ckpt_ + "/" + name});
    return files;
  }

  TempDir tmp_;
  FakeHub hub_;
  std::string ckpt_;
};

TEST_F(HubCommitTest, CommitsAFolderThatDownloadsBackEqual) {
  StartHub();
  HubCommitter hub(Options(kWriteToken));
  ASSERT_OK(hub.EnsureRepo("org/ckpt"));
  ASSERT_OK(hub.EnsureRepo("org/ckpt"));  // exists already: fine
  auto done = hub.Commit("org/ckpt", "main", "sftctl: checkpoint-000002 (step 2)", CheckpointFiles());
  ASSERT_OK(done);
  EXPECT_EQ(done->commit.size(), 40u);
  EXPECT_EQ(done->lfs_files_skipped, 0);
  EXPECT_GE(done->bytes_sent, (21u << 20));

  // Two LFS PUTs went to the other origin without the token; the commit itself carried it.
  int puts = 0, commits = 0;
  for (const auto& e : hub_.Log()) {
    if (e["method"] == "PUT") {
      ++puts;
      EXPECT_EQ(e["port"], "cdn");
      EXPECT_TRUE(e["auth"].is_null()) << e.dump();
    }
    if (e["method"] == "POST" && e["path"].get<std::string>().find("/commit/main") != std::string::npos) {
      ++commits;
      EXPECT_EQ(e["auth"], std::string("Bearer ") + kWriteToken);
    }
  }
  EXPECT_EQ(puts, 2);
  EXPECT_EQ(commits, 1);

  auto listed = hub.ListFiles("org/ckpt", "main");
  ASSERT_OK(listed);
  EXPECT_THAT(*listed,
              UnorderedElementsAre("checkpoint-000002/config.json", "checkpoint-000002/model.safetensors",
                                   "checkpoint-000002/optimizer.bin", "checkpoint-000002/DONE"));

  // The private repository is read back by the downloader (LFS files verified by sha256).
  auto ref = ParseHubRef("hf://org/ckpt/checkpoint-000002");
  ASSERT_OK(ref);
  HubDownloader down(Options(kReadToken));
  auto snap = down.Download(*ref, {"checkpoint-000002/*"});
  ASSERT_OK(snap);
  for (const char* name : {"config.json", "model.safetensors", "optimizer.bin", "DONE"}) {
    EXPECT_EQ(ReadWholeFile(snap->folder + "/checkpoint-000002/" + name), ReadWholeFile(ckpt_ + "/" + name))
        << name;
  }
  // Without a token the private repository is not readable.
  HubDownloader anonymous(Options(""));
  EXPECT_THAT(anonymous.Download(*ref, {"checkpoint-000002/*"}).status(),
              StatusIs(StatusCode::kPermissionDenied, HasSubstr("org/ckpt")));
}

TEST_F(HubCommitTest, SameContentIsNotSentTwiceAndFoldersAreDeleted) {
  StartHub();
  HubCommitter hub(Options(kWriteToken));
  ASSERT_OK(hub.EnsureRepo("org/ckpt"));
  ASSERT_OK(hub.Commit("org/ckpt", "main", "first", CheckpointFiles()));
  std::vector<HubCommitFile> again;
  for (const HubCommitFile& f : CheckpointFiles())
    again.push_back(
        {"checkpoint-000004/" + f.path_in_repo.substr(f.path_in_repo.find('/') + 1), f.local_path});
  auto second = hub.Commit("org/ckpt", "main", "second", again, {"checkpoint-000002"});
  ASSERT_OK(second);
  EXPECT_EQ(second->lfs_files_skipped, 2);
  EXPECT_LT(second->bytes_sent, 1u << 20);
  auto listed = hub.ListFiles("org/ckpt", "main");
  ASSERT_OK(listed);
  EXPECT_THAT(*listed,
              UnorderedElementsAre("checkpoint-000004/config.json", "checkpoint-000004/model.safetensors",
                                   "checkpoint-000004/optimizer.bin", "checkpoint-000004/DONE"));
}

TEST_F(HubCommitTest, LargeObjectsGoUpInPartsWhenTheHubAsks) {
  StartHub({{"multipart_chunk", 4 << 20}});
  HubCommitter hub(Options(kWriteToken));
  ASSERT_OK(hub.EnsureRepo("org/ckpt"));
  ASSERT_OK(hub.Commit("org/ckpt", "main", "in parts", CheckpointFiles()));
  int parts = 0, completions = 0;
  for (const auto& e : hub_.Log()) {
    const std::string path = e["path"];
    if (e["method"] == "PUT") {
      EXPECT_EQ(path.rfind("/part/", 0), 0u) << path;
      EXPECT_TRUE(e["auth"].is_null()) << e.dump();
      ++parts;
    }
    if (path.rfind("/lfs-complete/", 0) == 0) {
      EXPECT_EQ(e["status"], 200) << e.dump();
      ++completions;
    }
  }
  EXPECT_EQ(parts, 6);  // 11 MiB and 10 MiB in 4 MiB parts
  EXPECT_EQ(completions, 2);
  auto ref = ParseHubRef("hf://org/ckpt/checkpoint-000002");
  ASSERT_OK(ref);
  auto snap = HubDownloader(Options(kReadToken)).Download(*ref, {"checkpoint-000002/*"});
  ASSERT_OK(snap);
  for (const char* name : {"model.safetensors", "optimizer.bin"})
    EXPECT_EQ(ReadWholeFile(snap->folder + "/checkpoint-000002/" + name), ReadWholeFile(ckpt_ + "/" + name))
        << name;
}

TEST_F(HubCommitTest, ReadOnlyOrNoTokenIsPermissionDeniedNamingTheRepository) {
  StartHub();
  HubCommitter read_only(Options(kReadToken));
  EXPECT_THAT(
      read_only.EnsureRepo("org/ckpt"),
      StatusIs(StatusCode::kPermissionDenied, AllOf(HasSubstr("org/ckpt"), HasSubstr("write access"))));
  ASSERT_OK(HubCommitter(Options(kWriteToken)).EnsureRepo("org/ckpt"));
  Status st = read_only.Commit("org/ckpt", "main", "m", CheckpointFiles()).status();
  EXPECT_THAT(st, StatusIs(StatusCode::kPermissionDenied,
                           AllOf(HasSubstr("hf://org/ckpt"), HasSubstr("write access"))));
  EXPECT_THAT(st.message(), Not(HasSubstr(kReadToken)));
  HubCommitter anonymous(Options(""));
  EXPECT_THAT(anonymous.Commit("org/ckpt", "main", "m", CheckpointFiles()).status(),
              StatusIs(StatusCode::kPermissionDenied, AllOf(HasSubstr("no token"), HasSubstr("HF_TOKEN"))));
  EXPECT_THAT(
      HubCommitter(Options(kWriteToken)).Commit("org/missing", "main", "m", CheckpointFiles()).status(),
      StatusIs(StatusCode::kNotFound, HasSubstr("hf://org/missing")));
}

// Issue 37 ("the class behind them"): value("uploadMode", "") and value("oid", "") threw on an answer
// whose field is not a string. Now the commit fails with the answer and the field named.
TEST_F(HubCommitTest, AnAnswerWithAFieldOfTheWrongTypeIsInvalidArgumentNamingIt) {
  for (const auto& [hostile, message] :
       {std::pair<std::string, std::string>{"preupload",
                                            "hf://org/ckpt: the preupload answer: field "
                                            "'uploadMode': expected a string, got number 7"},
        {"lfs_batch", "hf://org/ckpt: the LFS batch answer: field 'oid': expected a string, got number 7"}}) {
    TempDir dir("hostile-hub");
    FakeHub hub;
    ASSERT_TRUE(hub.Start(dir.path(), {{"token", kReadToken},
                                       {"write_token", kWriteToken},
                                       {"repos", nlohmann::json::object()},
                                       {"hostile", hostile}}));
    HubOptions o = Options(kWriteToken);
    o.endpoint = hub.url();
    HubCommitter committer(o);
    ASSERT_OK(committer.EnsureRepo("org/ckpt"));
    EXPECT_THAT(committer.Commit("org/ckpt", "main", "m", CheckpointFiles()).status(),
                StatusIs(StatusCode::kInvalidArgument, message));
  }
}

TEST_F(HubCommitTest, ServerErrorsAreRetried) {
  StartHub({{"fail_commit_once", 2}});
  HubOptions o = Options(kWriteToken);
  o.max_attempts = 3;
  HubCommitter hub(o);
  ASSERT_OK(hub.EnsureRepo("org/ckpt"));
  ASSERT_OK(hub.Commit("org/ckpt", "main", "m", {{"a.json", ckpt_ + "/config.json"}}));
  int commits = 0;
  for (const auto& e : hub_.Log())
    if (e["method"] == "POST" && e["path"].get<std::string>().find("/commit/") != std::string::npos)
      ++commits;
  EXPECT_EQ(commits, 3);
}

TEST_F(HubCommitTest, ServerErrorsPastTheAttemptsAreUnavailable) {
  StartHub({{"fail_commit_once", 5}});
  HubOptions o = Options(kWriteToken);
  o.max_attempts = 2;
  HubCommitter hub(o);
  ASSERT_OK(hub.EnsureRepo("org/ckpt"));
  EXPECT_THAT(hub.Commit("org/ckpt", "main", "m", {{"a.json", ckpt_ + "/config.json"}}).status(),
              StatusIs(StatusCode::kUnavailable, AllOf(HasSubstr("hf://org/ckpt"), HasSubstr("503"))));
}

}  // namespace
}  // namespace sftctl
