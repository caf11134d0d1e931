// Helpers shared by the libFuzzer targets in tests/fuzz (docs/fuzzing.md).
//
// A target calls the real parsing entry point and never catches: an exception escaping a parser
// terminates the process, which libFuzzer reports as a crash (that is a bug in the parser, not in
// the target). FUZZ_CHECK states properties the parsers promise (an accepted path stays beneath
// its folder, escaped text holds no control sequence, ...); a violation aborts the same way.
// Set SFTCTL_FUZZ_DEBUG=1 to print what each input produced (useful when a seed should parse).
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/unicode_normalize.h"

#define FUZZ_CHECK(cond, what)                                                              \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #cond, \
                   std::string(what).c_str());                                              \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

namespace sftctl::fuzz {

inline std::string_view AsView(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

inline bool Debug() {
  static const bool on = [] {
    const char* v = std::getenv("SFTCTL_FUZZ_DEBUG");
    return v != nullptr && *v != '\0' && std::string_view(v) != "0";
  }();
  return on;
}

inline void Log(const std::string& what, const Status& s) {
  if (Debug()) std::fprintf(stderr, "[fuzz] %s: %s\n", what.c_str(), s.ok() ? "OK" : s.ToString().c_str());
}

// A folder of this process, removed at exit: on /dev/shm when it is writable (the targets write
// their input to a file when the entry point reads files), else in $TMPDIR or /tmp.
inline const std::string& ScratchDir() {
  static const std::string dir = [] {
    std::string base = "/dev/shm";
    if (::access(base.c_str(), W_OK) != 0) {
      const char* t = std::getenv("TMPDIR");
      base = t != nullptr && *t != '\0' ? t : "/tmp";
    }
    std::string templ = base + "/sftctl-fuzz-XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    static std::string remove_me;
    remove_me = templ;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(remove_me, ec);
    });
    return templ;
  }();
  return dir;
}

inline void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::abort();
  }
}

// Splits `s` at every occurrence of `sep` (seeds use a separator line between the parts of an
// input; see each target).
inline std::vector<std::string_view> Split(std::string_view s, std::string_view sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (;;) {
    const size_t p = s.find(sep, start);
    if (p == std::string_view::npos) {
      parts.push_back(s.substr(start));
      return parts;
    }
    parts.push_back(s.substr(start, p - start));
    start = p + sep.size();
  }
}

// Well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
using ::sftctl::IsValidUtf8;

// What common/terminal_text.h promises of EscapeForTerminal's output: valid UTF-8 in which the
// only control characters are \n, \t and \r, and no C1 control or bidirectional override.
inline bool IsTerminalSafe(std::string_view s) {
  if (!IsValidUtf8(s)) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if ((c < 0x20 && c != '\n' && c != '\t' && c != '\r') || c == 0x7F) return false;
    if (c == 0xC2 && i + 1 < s.size()) {  // U+0080..U+009F
      const unsigned char d = static_cast<unsigned char>(s[i + 1]);
      if (d >= 0x80 && d <= 0x9F) return false;
    }
    if (c == 0xE2 && i + 2 < s.size()) {
      const unsigned char d = static_cast<unsigned char>(s[i + 1]);
      const unsigned char e = static_cast<unsigned char>(s[i + 2]);
      if (d == 0x80 && (e == 0x8E || e == 0x8F || (e >= 0xAA && e <= 0xAE)))
        return false;                                         // LRM RLM LRE..RLO
      if (d == 0x81 && e >= 0xA6 && e <= 0xA9) return false;  // LRI..PDI
    }
  }
  return true;
}

}  // namespace sftctl::fuzz
