// Temporary folders for tests, in one place.
//   TempDir: a fresh empty folder, removed with everything in it when the object goes away.
//   MakeTempDir(tag): a fresh empty folder that outlives the test that made it (for tests that hand
//     it to another process) and is removed when the test program exits, pass or fail, by the
//     process that made it (a forked child's exit removes nothing). SFTCTL_KEEP_TEST_DIRS=1 keeps
//     them for a post-mortem. A crashed test program leaves its folders.
// Both live under std::filesystem::temp_directory_path() ($TMPDIR), named sftctl-<tag>-XXXXXX. In a
// test program built by sftctl_add_test, $TMPDIR is a folder of that program's own, checked for
// litter and removed when its tests end (tests/util/tmpdir_guard.cpp).
// Thread-safe (mkdtemp; the registry under a mutex).
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "common/mutex.h"

namespace sftctl::testing {

namespace internal {

// The folders TempDir and MakeTempDir made in this process and that still exist; those of
// MakeTempDir are removed at its exit.
class TempDirRegistry {
 public:
  static TempDirRegistry& Get() {
    static TempDirRegistry* dirs = [] {
      auto* d = new TempDirRegistry();
      std::atexit([] { Get().RemoveAtExit(); });
      return d;
    }();
    return *dirs;
  }
  void Add(const std::string& path, bool remove_at_exit) {
    MutexLock l(&mu_);
    (remove_at_exit ? made_ : live_).push_back(path);
  }
  void Forget(const std::string& path) {
    MutexLock l(&mu_);
    live_.erase(std::remove(live_.begin(), live_.end(), path), live_.end());
  }
  // Whether `path` is a folder that TempDir or MakeTempDir made and that its owner will remove.
  bool Owns(const std::string& path) const {
    MutexLock l(&mu_);
    return std::find(live_.begin(), live_.end(), path) != live_.end() ||
           std::find(made_.begin(), made_.end(), path) != made_.end();
  }

 private:
  void RemoveAtExit() {
    const char* keep = std::getenv("SFTCTL_KEEP_TEST_DIRS");
    if (::getpid() != owner_ || (keep != nullptr && std::string(keep) == "1")) return;
    MutexLock l(&mu_);
    for (const std::string& p : made_) {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    }
    made_.clear();
  }
  const pid_t owner_ = ::getpid();
  mutable Mutex mu_;
  std::vector<std::string> live_ GUARDED_BY(mu_);  // TempDir objects alive now
  std::vector<std::string> made_ GUARDED_BY(mu_);  // MakeTempDir's, removed at exit
};

inline std::string MakeDir(const std::string& tag) {
  std::string tmpl = (std::filesystem::temp_directory_path() / ("sftctl-" + tag + "-XXXXXX")).string();
  return ::mkdtemp(tmpl.data()) != nullptr ? tmpl : std::string();
}

}  // namespace internal

// "" if the folder could not be made (the test then fails at its first use of it).
inline std::string MakeTempDir(const std::string& tag = "test") {
  std::string path = internal::MakeDir(tag);
  if (!path.empty()) internal::TempDirRegistry::Get().Add(path, /*remove_at_exit=*/true);
  return path;
}

class TempDir {
 public:
  explicit TempDir(const std::string& tag = "test") : path_(internal::MakeDir(tag)) {
    if (!path_.empty()) internal::TempDirRegistry::Get().Add(path_, /*remove_at_exit=*/false);
  }
  ~TempDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    internal::TempDirRegistry::Get().Forget(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace sftctl::testing
