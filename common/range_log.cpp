#include "common/range_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>

#include "common/os/file_system.h"

namespace sftctl {

RangeLog::RangeLog(std::string path, uint64_t size, std::string sha256, uint64_t block)
    : path_(std::move(path)), size_(size), sha256_(std::move(sha256)), block_(block) {}

RangeLog::~RangeLog() {
  if (fd_ >= 0) ::close(fd_);
}

std::string RangeLog::Header() const {
  return "sftctl-ranges 1 " + std::to_string(size_) + " " + sha256_ + " " + std::to_string(block_);
}

std::vector<char> RangeLog::Load(size_t blocks, bool* matched) const {
  std::vector<char> done(blocks, 0);
  *matched = false;
  std::ifstream in(path_);
  std::string header;
  if (!in || !std::getline(in, header) || header != Header()) return done;
  *matched = true;
  std::string line;
  while (std::getline(in, line) && !in.eof()) {
    char* end = nullptr;
    unsigned long long i = std::strtoull(line.c_str(), &end, 10);
    if (end != line.c_str() && *end == '\0' && i < blocks) done[i] = 1;
  }
  return done;
}

Status RangeLog::Start() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0) return ErrnoError("cannot write", path_, errno);
  return WriteFully(fd_, Header() + "\n", path_);
}

Status RangeLog::Reopen() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
  if (fd_ < 0) return ErrnoError("cannot write", path_, errno);
  return OkStatus();
}

void RangeLog::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status RangeLog::Append(size_t block) {
  const std::string line = std::to_string(block) + "\n";
  if (fd_ >= 0) return WriteFully(fd_, line, path_);
  const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoError("cannot write", path_, errno);
  Status s = WriteFully(fd, line, path_);
  ::close(fd);
  return s;
}

}  // namespace sftctl
