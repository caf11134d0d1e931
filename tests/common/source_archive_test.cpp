// cmake/source_archive.cmake and common/source_id.h: the archive `sftctl bootstrap` uploads holds
// exactly the listed source files plus SOURCES and SOURCE_ID; the id is the same whether computed
// from git's file list (this checkout), from the unpacked archive's SOURCE_ID, or from a plain copy
// of those files without git (the glob fallback); and the binaries of this build report it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/source_id.h"
#include "tests/util/command.h"
#include "tests/util/temp_dir.h"

namespace sftctl {
namespace {

using ::sftctl::testing::Bin;
using ::sftctl::testing::RunCommand;
using ::sftctl::testing::RunShell;
using ::sftctl::testing::TempDir;
namespace fs = std::filesystem;

const std::string kShare = std::string(SFTCTL_BUILD_DIR) + "/share/sftctl";
const std::string kScript = std::string(SFTCTL_SOURCE_DIR) + "/cmake/source_archive.cmake";

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string RunScript(const std::string& src, const std::string& out) {
  auto r = RunCommand({"cmake", "-DSRC=" + src, "-DOUT=" + out, "-P", kScript});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return Read(out + "/SOURCE_ID");
}

TEST(SourceArchive, TheIdIsTheSameFromGitTheArchiveAndAPlainCopy) {
  const std::string id = Read(kShare + "/SOURCE_ID");
  ASSERT_EQ(id.size(), 65u) << id;   // 64 hex digits and a newline
  EXPECT_EQ(SourceId() + "\n", id);  // what this test binary (in bin/ beside share/) reads

  TempDir tmp("source-archive");
  const std::string unpacked = tmp.path() + "/unpacked";
  fs::create_directories(unpacked);
  auto tar = RunCommand({"tar", "-xzf", kShare + "/sftctl-src.tar.gz", "-C", unpacked});
  ASSERT_EQ(tar.exit_code, 0) << tar.output;
  EXPECT_EQ(Read(unpacked + "/SOURCE_ID"), id);
  const std::string listed = Read(unpacked + "/SOURCES");
  EXPECT_NE(listed.find("CMakeLists.txt\n"), std::string::npos);
  EXPECT_NE(listed.find("deploy/host/sftctl-host.sh\n"), std::string::npos);
  EXPECT_EQ(listed.find("build/"), std::string::npos);

  // The unpacked archive (a GPU host's ~/.local/share/sftctl/src): its SOURCE_ID as it is.
  EXPECT_EQ(RunScript(unpacked, tmp.path() + "/from-archive"), id);
  // The same files without SOURCES/SOURCE_ID and without git: hashed again, the same id.
  fs::remove(unpacked + "/SOURCES");
  fs::remove(unpacked + "/SOURCE_ID");
  EXPECT_EQ(RunScript(unpacked, tmp.path() + "/from-copy"), id);
  // One byte more in one file: another id.
  std::ofstream(unpacked + "/README.md", std::ios::app) << " ";
  EXPECT_NE(RunScript(unpacked, tmp.path() + "/changed"), id);
}

TEST(SourceArchive, BinariesPrintTheShortId) {
  const std::string short_id = ShortSourceId(SourceId());
  ASSERT_EQ(short_id.size(), 12u);
  auto client = RunCommand({Bin("sftctl"), "--version"});
  EXPECT_EQ(client.output, "sftctl 0.1.0 (source " + short_id + ")\n");
  // Another share folder: the id written there.
  TempDir share("share");
  std::ofstream(share.path() + "/SOURCE_ID") << std::string(64, 'a') << "\n";
  auto moved = RunCommand({Bin("sftctl"), "--version"}, {"SFTCTL_SHARE_DIR=" + share.path()});
  EXPECT_EQ(moved.output, "sftctl 0.1.0 (source aaaaaaaaaaaa)\n");
  auto none = RunCommand({Bin("sftctl"), "--version"}, {"SFTCTL_SHARE_DIR=" + share.path() + "/none"});
  EXPECT_EQ(none.output, "sftctl 0.1.0 (source unknown)\n");
}

}  // namespace
}  // namespace sftctl
