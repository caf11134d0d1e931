#include "common/safe_path.h"

#include <sys/stat.h>

#include <cerrno>

#include "common/os/file_system.h"
#include "common/terminal_text.h"

namespace sftctl {
namespace {

constexpr size_t kMaxPath = 4096;

Status Unsafe(std::string_view rel, const std::string& why) {
  return InvalidArgumentError("unsafe path '" + EscapeForTerminal(rel) + "': " + why);
}

}  // namespace

Status CheckRelativePath(std::string_view rel) {
  if (rel.empty()) return Unsafe(rel, "empty");
  if (rel.size() > kMaxPath) return Unsafe(rel.substr(0, 64), "longer than 4096 bytes");
  if (rel.front() == '/') return Unsafe(rel, "absolute");
  for (unsigned char c : rel) {
    if (c < 0x20 || c == 0x7F) return Unsafe(rel, "holds a control character");
    if (c == '\\') return Unsafe(rel, "holds a backslash");
  }
  // C1 and bidirectional controls: an 8-bit CSI acts on a terminal, and an override shows a name
  // other than it is ("x<U+202E>gpj.exe" reads "xexe.jpg").
  if (HoldsC1OrBidiControl(rel)) return Unsafe(rel, "holds a C1 or bidirectional control character");
  size_t start = 0;
  while (start <= rel.size()) {
    size_t end = rel.find('/', start);
    if (end == std::string_view::npos) end = rel.size();
    const std::string_view part = rel.substr(start, end - start);
    if (part.empty()) return Unsafe(rel, "has an empty component");
    if (part == "." || part == "..") return Unsafe(rel, "has a '" + std::string(part) + "' component");
    start = end + 1;
  }
  return OkStatus();
}

StatusOr<std::string> PathBeneath(const std::string& root, std::string_view rel) {
  SFT_RETURN_IF_ERROR(CheckRelativePath(rel));
  std::string path = root.empty() ? "." : root;  // walked with lstat
  size_t start = 0;
  while (start < rel.size()) {
    size_t end = rel.find('/', start);
    const bool last = end == std::string_view::npos;
    if (last) end = rel.size();
    path = JoinPath(path, rel.substr(start, end - start));
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) return JoinPath(root, rel);  // the rest is created
      return ErrnoError("cannot inspect", path, errno);
    }
    if (S_ISLNK(st.st_mode)) {
      return FailedPreconditionError("refusing to write through the symbolic link '" +
                                     EscapeForTerminal(path) +
                                     "' (the destination must hold real folders and files)");
    }
    if (!last && !S_ISDIR(st.st_mode)) {
      return FailedPreconditionError("'" + EscapeForTerminal(path) + "' is not a folder");
    }
    start = end + 1;
  }
  return JoinPath(root, rel);
}

}  // namespace sftctl
