#include "common/os/self_exe.h"

#include <unistd.h>

#if defined(__APPLE__)
#include <mach-o/dyld.h>
#endif

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace sftctl {

StatusOr<std::string> SelfExePath() {
#if defined(__linux__)
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ErrnoError("cannot read", "/proc/self/exe", errno);
  return std::string(buf, static_cast<size_t>(n));
#elif defined(__APPLE__)
  uint32_t size = PATH_MAX;
  std::vector<char> raw(size);
  if (::_NSGetExecutablePath(raw.data(), &size) != 0) {  // too small: size is now what it needs
    raw.resize(size);
    if (::_NSGetExecutablePath(raw.data(), &size) != 0) return NotFoundError("_NSGetExecutablePath failed");
  }
  char resolved[PATH_MAX];
  if (::realpath(raw.data(), resolved) == nullptr) return ErrnoError("cannot resolve", raw.data(), errno);
  return std::string(resolved);
#else
  return UnimplementedError("this system has no known way to find the running executable");
#endif
}

std::string DirWithSlash(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

}  // namespace sftctl
