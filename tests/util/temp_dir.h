// Temporary folders for tests, in one place.
//   TempDir: a fresh empty folder, removed with everything in it when the object goes away.
//   MakeTempDir(tag): a fresh empty folder that stays (for tests that hand it to another process
//     or keep it for a post-mortem).
// Both live under std::filesystem::temp_directory_path() ($TMPDIR), named sftctl-<tag>-XXXXXX.
// Thread-safe (mkdtemp).
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace sftctl::testing {

// "" if the folder could not be made (the test then fails at its first use of it).
inline std::string MakeTempDir(const std::string& tag = "test") {
  std::string tmpl = (std::filesystem::temp_directory_path() / ("sftctl-" + tag + "-XXXXXX")).string();
  return ::mkdtemp(tmpl.data()) != nullptr ? tmpl : std::string();
}

class TempDir {
 public:
  explicit TempDir(const std::string& tag = "test") : path_(MakeTempDir(tag)) {}
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
