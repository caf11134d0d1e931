// Whole files for tests, in one place (no private copies in test files). Binary-safe.
//   ReadWholeFile(path): the file's bytes; "" when it is missing or unreadable (a test then fails on
//     the content it expected).
//   WriteWholeFile(path, data): replaces the file, creating its parent folders; true when written.
//   AppendToFile(path, data): adds to its end (created when missing); true when written.
// Thread-compatible: concurrent writers of one file interleave as the OS does.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>

namespace sftctl::testing {

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

namespace internal {
inline bool WriteFileMode(const std::string& path, const std::string& data, std::ios::openmode mode) {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::ofstream out(path, std::ios::binary | mode);
  out << data;
  out.close();
  return !out.fail();
}
}  // namespace internal

inline bool WriteWholeFile(const std::string& path, const std::string& data) {
  return internal::WriteFileMode(path, data, std::ios::trunc);
}

inline bool AppendToFile(const std::string& path, const std::string& data) {
  return internal::WriteFileMode(path, data, std::ios::app);
}

}  // namespace sftctl::testing
