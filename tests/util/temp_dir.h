// Temporary folders for tests, in one place.
//   TempDir: a fresh empty folder, removed with everything in it when the object goes away.
//   MakeTempDir(tag): a fresh empty folder that outlives the test that made it (for tests that hand
//     it to another process) and is removed when the test program exits, pass or fail, by the
//     process that made it (a forked child's exit removes nothing). SFTCTL_KEEP_TEST_DIRS=1 keeps
//     them for a post-mortem. A crashed test program leaves its folders.
// Both live under std::filesystem::temp_directory_path() ($TMPDIR), named sftctl-<tag>-XXXXXX.
// Thread-safe (mkdtemp; the exit list under a mutex).
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

namespace sftctl::testing {

namespace internal {

// The folders MakeTempDir made in this process, removed at its exit.
class MadeTempDirs {
 public:
  static MadeTempDirs& Get() {
    static MadeTempDirs* dirs = [] {
      auto* d = new MadeTempDirs();
      std::atexit([] { Get().RemoveAll(); });
      return d;
    }();
    return *dirs;
  }
  void Add(const std::string& path) {
    std::lock_guard<std::mutex> l(mu_);
    paths_.push_back(path);
  }

 private:
  void RemoveAll() {
    const char* keep = std::getenv("SFTCTL_KEEP_TEST_DIRS");
    if (::getpid() != owner_ || (keep != nullptr && std::string(keep) == "1")) return;
    std::lock_guard<std::mutex> l(mu_);
    for (const std::string& p : paths_) {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    }
    paths_.clear();
  }
  const pid_t owner_ = ::getpid();
  std::mutex mu_;
  std::vector<std::string> paths_;  // GUARDED_BY(mu_)
};

inline std::string MakeDir(const std::string& tag) {
  std::string tmpl = (std::filesystem::temp_directory_path() / ("sftctl-" + tag + "-XXXXXX")).string();
  return ::mkdtemp(tmpl.data()) != nullptr ? tmpl : std::string();
}

}  // namespace internal

// "" if the folder could not be made (the test then fails at its first use of it).
inline std::string MakeTempDir(const std::string& tag = "test") {
  std::string path = internal::MakeDir(tag);
  if (!path.empty()) internal::MadeTempDirs::Get().Add(path);
  return path;
}

class TempDir {
 public:
  explicit TempDir(const std::string& tag = "test") : path_(internal::MakeDir(tag)) {}
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace sftctl::testing
