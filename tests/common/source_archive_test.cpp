// cmake/source_archive.cmake and common/source_id.h: the archive `sftctl bootstrap` uploads holds
// exactly the listed source files plus SOURCES and SOURCE_ID; the id is the same whether computed
// from git's file list (this checkout), from the unpacked archive's SOURCE_ID, or from a plain copy
// of those files without git (the glob fallback); and the binaries of this build report it. Only
// what a host's build reads is packed: the tracked files of CMakeLists.txt, CMakePresets.json and
// the source folders, never an untracked file (a planted .env) or one outside them (docs/, bench/).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "common/source_id.h"
#include "tests/util/command.h"
#include "tests/util/file_util.h"
#include "tests/util/temp_dir.h"
#include "tests/util/test_paths.h"

namespace sftctl {
namespace {

using ::sftctl::testing::Bin;
using ::sftctl::testing::ReadWholeFile;
using ::sftctl::testing::RunCommand;
using ::sftctl::testing::RunShell;
using ::sftctl::testing::TempDir;
using ::sftctl::testing::WriteWholeFile;
namespace fs = std::filesystem;

const std::string kShare = std::string(SFTCTL_BUILD_DIR) + "/share/sftctl";
const std::string kScript = std::string(SFTCTL_SOURCE_DIR) + "/cmake/source_archive.cmake";

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string RunScript(const std::string& src, const std::string& out) {
  auto r = RunCommand({"cmake", "-DSRC=" + src, "-DOUT=" + out, "-P", kScript});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return ReadWholeFile(out + "/SOURCE_ID");
}

TEST(SourceArchive, TheIdIsTheSameFromGitTheArchiveAndAPlainCopy) {
  const std::string id = ReadWholeFile(kShare + "/SOURCE_ID");
  ASSERT_EQ(id.size(), 65u) << id;   // 64 hex digits and a newline
  EXPECT_EQ(SourceId() + "\n", id);  // what this test binary (in bin/ beside share/) reads

  TempDir tmp("source-archive");
  const std::string unpacked = tmp.path() + "/unpacked";
  fs::create_directories(unpacked);
  auto tar = RunCommand({"tar", "-xzf", kShare + "/sftctl-src.tar.gz", "-C", unpacked});
  ASSERT_EQ(tar.exit_code, 0) << tar.output;
  EXPECT_EQ(ReadWholeFile(unpacked + "/SOURCE_ID"), id);
  const std::string listed = ReadWholeFile(unpacked + "/SOURCES");
  EXPECT_NE(listed.find("CMakeLists.txt\n"), std::string::npos);
  EXPECT_NE(listed.find("deploy/host/sftctl-host.sh\n"), std::string::npos);
  EXPECT_EQ(listed.find("build/"), std::string::npos);
  // Only what a host's build reads: not the docs, the benchmarks, the tests, the README or a dotfile.
  for (const std::string& line : Lines(listed)) {
    EXPECT_TRUE(line.rfind("docs/", 0) != 0 && line.rfind("bench/", 0) != 0 && line.rfind("tests/", 0) != 0 &&
                line != "README.md" && line[0] != '.' && line.find("/.") == std::string::npos)
        << line;
  }

  // The unpacked archive (a GPU host's ~/.local/share/sftctl/src): its SOURCE_ID as it is.
  EXPECT_EQ(RunScript(unpacked, tmp.path() + "/from-archive"), id);
  // The same files without SOURCES/SOURCE_ID and without git: hashed again, the same id.
  fs::remove(unpacked + "/SOURCES");
  fs::remove(unpacked + "/SOURCE_ID");
  EXPECT_EQ(RunScript(unpacked, tmp.path() + "/from-copy"), id);
  // One byte more in one file: another id.
  std::ofstream(unpacked + "/CMakeLists.txt", std::ios::app) << " ";
  EXPECT_NE(RunScript(unpacked, tmp.path() + "/changed"), id);
}

// The files of the archive `out`/sftctl-src.tar.gz, sorted (SOURCES and SOURCE_ID included).
std::vector<std::string> ArchiveEntries(const std::string& out) {
  auto tar = RunCommand({"tar", "-tzf", out + "/sftctl-src.tar.gz"});
  EXPECT_EQ(tar.exit_code, 0) << tar.output;
  std::vector<std::string> entries;
  for (const std::string& e : Lines(tar.output))
    if (!e.empty() && e.back() != '/') entries.push_back(e);
  std::sort(entries.begin(), entries.end());
  return entries;
}

// A checkout holding, besides its tracked sources, what must never reach a GPU host: an untracked
// .env (also in a source folder), an untracked file and tracked ones outside the source folders.
TEST(SourceArchive, PacksOnlyTheTrackedFilesOfTheSourceFolders) {
  TempDir tmp("source-archive-planted");
  const std::string src = tmp.path() + "/src";
  const std::set<std::string> tracked_sources = {"CMakeLists.txt",
                                                 "CMakePresets.json",
                                                 "agent/sftd.cpp",
                                                 "client/commands/main.cpp",
                                                 "cmake/x.cmake",
                                                 "common/a.cpp",
                                                 "deploy/host/sftctl-host.sh",
                                                 "proto/sftctl/v1/agent.proto",
                                                 "trainer/t.cpp"};
  for (const auto& f : tracked_sources) WriteWholeFile(src + "/" + f, f + "\n");
  for (const char* f :
       {"README.md", "docs/x.md", "bench/b.cpp", ".ci/run", "cmake/.hidden", "tests/CMakeLists.txt"})
    WriteWholeFile(src + "/" + f, "tracked, not built\n");
  auto git = RunShell("cd '" + src + "' && git init -q && git add -A");
  ASSERT_EQ(git.exit_code, 0) << git.output;
  const char* planted[] = {".env",           "common/.env",
                           "notes.txt",      "docs/draft.md",
                           "common/new.cpp", "tests/util/__pycache__/fake_hub.cpython-311.pyc"};
  for (const char* f : planted) WriteWholeFile(src + "/" + f, "SECRET_TOKEN=hf_abc\n");

  // From git: the tracked source files only; the untracked new source is named, not packed.
  auto r = RunCommand({"cmake", "-DSRC=" + src, "-DOUT=" + tmp.path() + "/git", "-P", kScript});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("not packed, as git does not track them (git add): common/new.cpp"),
            std::string::npos)
      << r.output;
  std::vector<std::string> want(tracked_sources.begin(), tracked_sources.end());
  want.push_back("SOURCES");
  want.push_back("SOURCE_ID");
  std::sort(want.begin(), want.end());
  EXPECT_EQ(ArchiveEntries(tmp.path() + "/git"), want);
  const std::string git_id = ReadWholeFile(tmp.path() + "/git/SOURCE_ID");

  // Without git: the files beneath the source folders (so common/new.cpp), still no dotfile, no
  // file outside them and no Python cache.
  fs::remove_all(src + "/.git");
  EXPECT_NE(RunScript(src, tmp.path() + "/copy"), git_id);
  want.push_back("common/new.cpp");
  std::sort(want.begin(), want.end());
  EXPECT_EQ(ArchiveEntries(tmp.path() + "/copy"), want);
  // The id follows the packed files only: a change outside them leaves it as it is.
  fs::remove(src + "/common/new.cpp");
  WriteWholeFile(src + "/docs/x.md", "changed\n");
  WriteWholeFile(src + "/.env", "SECRET_TOKEN=other\n");
  EXPECT_EQ(RunScript(src, tmp.path() + "/copy-again"), git_id);
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
