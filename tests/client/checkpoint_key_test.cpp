// This machine's checkpoint key (client/transfer/checkpoint_key.h): made once, private, one run key per
// prefix.
#include "client/transfer/checkpoint_key.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

#include "tests/util/file_util.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"

namespace sftctl::client {
namespace {

using ::sftctl::testing::StatusIs;
using ::testing::HasSubstr;

class CheckpointKeyTest : public ::testing::Test {
 protected:
  void SetUp() override { ::setenv("XDG_CONFIG_HOME", dir_.path().c_str(), 1); }
  void TearDown() override { ::unsetenv("XDG_CONFIG_HOME"); }
  testing::TempDir dir_{"ckptkey"};
};

TEST_F(CheckpointKeyTest, MadeOncePrivateAndOneKeyPerPrefix) {
  EXPECT_EQ(CheckpointKeyPath(), dir_.path() + "/sftctl/checkpoint.key");
  auto a = CheckpointRunKey("s3://bucket/runs/a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  struct stat st {};
  ASSERT_EQ(::stat(CheckpointKeyPath().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((dir_.path() + "/sftctl").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  const std::string master = testing::ReadWholeFile(CheckpointKeyPath());
  EXPECT_EQ(master.size(), 65u);                           // 32 bytes as hex, a newline
  EXPECT_EQ(*CheckpointRunKey("s3://bucket/runs/a"), *a);  // the same file, the same key
  EXPECT_EQ(testing::ReadWholeFile(CheckpointKeyPath()), master);
  EXPECT_NE(*CheckpointRunKey("s3://bucket/runs/b"), *a);
  EXPECT_EQ(a->size(), 32u);
  EXPECT_EQ(a->find(master.substr(0, 16)), std::string::npos);  // derived, not the master itself
}

// Several first uses at once (parallel submits): one key file, whole, the same key for all of them.
TEST_F(CheckpointKeyTest, FirstUsesAtOnceAgreeOnOneKey) {
  std::vector<std::string> keys(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < keys.size(); ++i) {
    threads.emplace_back([&keys, i] {
      auto k = CheckpointRunKey("s3://bucket/runs/a");
      keys[i] = k.ok() ? *k : "error: " + k.status().ToString();
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& k : keys) EXPECT_EQ(k, keys[0]);
  EXPECT_EQ(keys[0].size(), 32u) << keys[0];
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_.path() + "/sftctl")) {
    ++files;
    EXPECT_EQ(e.path().filename(), "checkpoint.key");  // no temporary file left
  }
  EXPECT_EQ(files, 1u);
}

TEST_F(CheckpointKeyTest, AKeyOthersCanReadIsRefused) {
  ASSERT_TRUE(CheckpointRunKey("s3://bucket/runs/a").ok());
  ASSERT_EQ(::chmod(CheckpointKeyPath().c_str(), 0644), 0);
  EXPECT_THAT(CheckpointRunKey("s3://bucket/runs/a"),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("must be yours and private (chmod 600")));
}

}  // namespace
}  // namespace sftctl::client
