// The temporary-folder guard, linked into every test program that sftctl_add_test builds.
//
// Before the first test runs it makes a folder of the program's own under $TMPDIR
// (sftctl-proc-<pid>-XXXXXX) and points TMPDIR there, so that whatever the tests and the processes
// they start put in "the temporary folder" lands in one place. After each test it looks for litter:
// an entry there that no live TempDir or MakeTempDir (tests/util/temp_dir.h) owns. When the tests end
// it fails the program, naming each such entry and the test after which it appeared, removes the
// litter, and at exit removes the folder with everything left in it (SFTCTL_KEEP_TEST_DIRS=1 keeps
// it). $TMPDIR is <build>/test-tmp under ctest (sftctl_add_test) and when it is not set (TestTmpDir,
// tests/util/test_paths.h), so even a test program that is killed leaves nothing in /tmp; the next one
// removes what it left.
//
// Processes (tests/util/owned_processes.h): before the first test it marks the program's children
// (SFTCTL_TEST_OWNER) and starts its watchdog, which kills what they left running once the program is
// gone, however it ended (ctest's SIGKILL at a timeout too). When the tests end it waits up to 3 s for
// the processes they started to end, then names those still running on stderr and kills them. It
// first kills and names what an earlier, killed test program left (the next run's log says what
// leaked).
//
// Not thread-safe, nor needs to be: GoogleTest calls it between tests, on the main thread.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include "tests/util/owned_processes.h"
#include "tests/util/temp_dir.h"
#include "tests/util/test_paths.h"

namespace sftctl::testing {
namespace {

namespace fs = std::filesystem;

bool KeepDirs() {
  const char* keep = std::getenv("SFTCTL_KEEP_TEST_DIRS");
  return keep != nullptr && std::string(keep) == "1";
}

// The guard's state; never destroyed, so that the exit handler may still read it.
struct GuardState {
  std::string dir;    // "" when there is no folder to guard
  pid_t owner = 0;    // the process that made it (a forked child's exit removes nothing)
  std::string token;  // its owner token (tests/util/owned_processes.h); "" off Linux
  std::map<std::string, std::string> litter;  // path -> the test after which it was first seen
};

GuardState& State() {
  static GuardState* state = new GuardState();
  return *state;
}

// Records each entry of the folder that no live TempDir or MakeTempDir owns.
void Scan(const std::string& after) {
  GuardState& st = State();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(st.dir, ec)) {
    const std::string path = e.path().string();
    if (!internal::TempDirRegistry::Get().Owns(path)) st.litter.emplace(path, after);
  }
}

void RemoveAtExit() {
  const GuardState& st = State();
  if (st.dir.empty() || ::getpid() != st.owner || KeepDirs()) return;
  std::error_code ec;
  fs::remove_all(st.dir, ec);
}

// Up to five of the files under `dir`, to tell who left it (a folder still being written after its
// TempDir was removed holds what its writer made last).
std::string SomeContents(const fs::path& dir) {
  std::string out;
  int n = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end && n < 5; it.increment(ec)) {
    if (it->is_directory(ec)) continue;
    out += "\n      " + it->path().lexically_relative(dir).string();
    ++n;
  }
  return out;
}

// The processes the tests started that still run once they all ended (a daemon nobody stopped):
// given a few seconds to go, then named on stderr and killed.
void NameSurvivors(const std::string& token) {
  if (token.empty()) return;
  if (WaitOwnedGone(token, std::chrono::seconds(3)).empty()) return;
  const std::vector<OwnedProcess> killed = KillOwned(token);
  if (killed.empty()) return;
  std::cerr << "sftctl test guard: the tests left these processes running; killed them:\n"
            << DescribeProcesses(killed);
}

class TmpDirEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    GuardState& st = State();
    std::error_code ec;
    const fs::path base = fs::temp_directory_path(ec);
    if (ec) return;  // no usable $TMPDIR: the tests run as they would without the guard
    SweepLeftovers(base.string(), "sftctl test guard");
    RemoveOrphanFolders(base.string());
    st.dir = MakeProgramFolder(base.string());
    if (st.dir.empty()) return;
    st.owner = ::getpid();
    ::unsetenv("TMPDIR");  // every copy: an environment may name a variable twice (the last may win)
    ::setenv("TMPDIR", st.dir.c_str(), 1);
    std::atexit(&RemoveAtExit);
    st.token = MarkChildren();
    StartWatchdog(st.token, base.string());
  }

  void TearDown() override {
    GuardState& st = State();
    if (st.dir.empty()) return;
    NameSurvivors(st.token);
    Scan("the last test");
    std::string found;
    for (const auto& [path, after] : st.litter) {
      std::error_code ec;
      if (!fs::exists(fs::symlink_status(path, ec))) continue;  // removed later by its maker
      found += "\n  " + path + " (first seen after " + after + ")" + SomeContents(path);
      if (!KeepDirs()) fs::remove_all(path, ec);
    }
    if (!found.empty()) {
      ADD_FAILURE() << "the tests left litter in $TMPDIR (use TempDir or MakeTempDir, tests/util/temp_dir.h):"
                    << found;
    }
  }
};

class TmpDirListener : public ::testing::EmptyTestEventListener {
 public:
  // Runs after the test's fixture (and the TempDirs it held) is gone.
  void OnTestEnd(const ::testing::TestInfo& test) override {
    if (!State().dir.empty()) Scan(std::string(test.test_suite_name()) + "." + test.name());
  }
};

// GoogleTest takes ownership of both. Without $TMPDIR (a test program run by hand) the base is the
// build's test-tmp as well. A $TMPDIR that does not exist yet (a fresh build folder's test-tmp) is
// made first: std::filesystem::temp_directory_path() throws on a missing one.
[[maybe_unused]] const bool kRegistered = [] {
  const char* tmp = std::getenv("TMPDIR");
  if (tmp == nullptr || *tmp == '\0') ::setenv("TMPDIR", TestTmpDir(), 1);
  std::error_code ec;
  fs::create_directories(std::getenv("TMPDIR"), ec);
  ::testing::AddGlobalTestEnvironment(new TmpDirEnvironment());
  ::testing::UnitTest::GetInstance()->listeners().Append(new TmpDirListener());
  return true;
}();

}  // namespace
}  // namespace sftctl::testing
