// The safe-path policy for names another machine chose (common/safe_path.h).
#include "common/safe_path.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"

namespace sftctl {
namespace {

namespace fs = std::filesystem;
using ::sftctl::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(SafePath, AcceptsPlainRelativePaths) {
  EXPECT_TRUE(CheckRelativePath("metrics.jsonl").ok());
  EXPECT_TRUE(CheckRelativePath("checkpoint-000004/model.safetensors").ok());
  EXPECT_TRUE(CheckRelativePath("a/..b/c..").ok());  // dots inside names are names
}

TEST(SafePath, RefusesEscapesNamingTheReason) {
  struct Case {
    std::string path, why;
  } cases[] = {
      {"", "empty"},
      {"/home/u/.bashrc", "absolute"},
      {"checkpoint-1/../../../../home/u/.bash_aliases", "a '..' component"},
      {"..", "a '..' component"},
      {"./x", "a '.' component"},
      {"a//b", "an empty component"},
      {"a/b/", "an empty component"},
      {"a\\..\\b", "a backslash"},
      {"ok\x1b[2J", "a control character"},
      {std::string("a\0b", 3), "a control character"},
      {std::string(5000, 'a'), "longer than 4096 bytes"},
  };
  for (const auto& c : cases) {
    Status s = CheckRelativePath(c.path);
    // The error names the reason and is itself printable (no raw ESC).
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, AllOf(HasSubstr(c.why), Not(HasSubstr("\x1b")))))
        << c.path;
  }
}

TEST(SafePath, RefusesC1AndBidiControlsInAnyComponent) {
  struct Case {
    std::string path, shown;
  } cases[] = {
      {"checkpoint-1/\xc2\x9b"
       "2Jmodel.safetensors",
       "checkpoint-1/\\u009b2Jmodel.safetensors"},              // 8-bit CSI
      {"invoice\xe2\x80\xaegpj.exe", "invoice\\u202egpj.exe"},  // RLO
      {"\xe2\x81\xa6x/y", "\\u2066x/y"},                        // LRI
      {"a/b\xe2\x80\x8f", "a/b\\u200f"},                        // RLM
      {"\xd8\xb9\xd8\x9c/c", "\xd8\xb9\\u061c/c"},              // ALM
      {"\xc2\x80", "\\u0080"},
  };
  for (const auto& c : cases) {
    EXPECT_THAT(CheckRelativePath(c.path),
                StatusIs(StatusCode::kInvalidArgument,
                         HasSubstr("unsafe path '" + c.shown + "': holds a C1 or bidirectional control")));
    EXPECT_THAT(PathBeneath("/tmp", c.path), StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.shown)));
  }
  // Other non-ASCII names are names.
  EXPECT_TRUE(
      CheckRelativePath("caf\xc3\xa9/\xd8\xb9\xd8\xb1\xd8\xa8\xd9\x8a/\xe4\xb8\xad\xe6\x96\x87.txt").ok());
  EXPECT_TRUE(CheckRelativePath("a\xc2\xa0"
                                "b")
                  .ok());  // NO-BREAK SPACE, just past the C1 range
}

class SafePathDisk : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(root_.empty());
    fs::create_directories(root_ + "/out/real");
    fs::create_directories(root_ + "/elsewhere");
  }
  const ::sftctl::testing::TempDir dir_{"safepath"};  // removed with the fixture
  const std::string root_ = dir_.path();
};

TEST_F(SafePathDisk, JoinsBeneathTheRootWhenNothingIsInTheWay) {
  auto p = PathBeneath(root_ + "/out", "real/new/file.bin");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(*p, root_ + "/out/real/new/file.bin");
  EXPECT_FALSE(fs::exists(root_ + "/out/real/new")) << "PathBeneath creates nothing";
}

TEST_F(SafePathDisk, RefusesASymlinkedFolderOrFileBeneathTheRoot) {
  fs::create_directory_symlink(root_ + "/elsewhere", root_ + "/out/checkpoint-000001");
  auto p = PathBeneath(root_ + "/out", "checkpoint-000001/model.safetensors");
  EXPECT_THAT(p, StatusIs(StatusCode::kFailedPrecondition,
                          HasSubstr("symbolic link '" + root_ + "/out/checkpoint-000001'")));

  fs::create_symlink(root_ + "/elsewhere/target", root_ + "/out/real/spec.json");
  p = PathBeneath(root_ + "/out", "real/spec.json");
  EXPECT_EQ(p.status().code(), StatusCode::kFailedPrecondition);

  std::ofstream(root_ + "/out/file") << "x";
  p = PathBeneath(root_ + "/out", "file/inner");
  EXPECT_THAT(p, StatusIs(StatusCode::kFailedPrecondition, HasSubstr("is not a folder")));
}

TEST_F(SafePathDisk, TheRootItselfMayBeALink) {
  fs::create_directory_symlink(root_ + "/elsewhere", root_ + "/link");
  auto p = PathBeneath(root_ + "/link", "a/b");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(*p, root_ + "/link/a/b");
}

}  // namespace
}  // namespace sftctl
