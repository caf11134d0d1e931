// Reading another process's /proc files in tests, in one place.
//   ReadProcFile(path): the bytes read before end of file or the first error; "" when it cannot be
//     opened. Never throws: a process that exits while its file is read makes read() fail with
//     ESRCH, which an ifstream's buffer turns into std::ios_base::failure when read through
//     istreambuf_iterator (libstdc++ throws from underflow whatever the stream's exception mask),
//     and that once aborted a test that was scanning /proc.
// Thread-safe.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace sftctl::testing {

inline std::string ReadProcFile(const std::string& path) {
  std::string out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;  // end of file, or the process is gone
    }
  }
  ::close(fd);
  return out;
}

}  // namespace sftctl::testing
