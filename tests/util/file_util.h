// Whole files for tests, in one place: WriteWholeFile (parent folders created) and ReadWholeFile
// ("" when missing). Binary-safe. Thread-compatible.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace sftctl::testing {

inline void WriteWholeFile(const std::string& path, const std::string& data) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << data;
}

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace sftctl::testing
