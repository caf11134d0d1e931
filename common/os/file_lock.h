// FileLock: an exclusive advisory lock (flock) on a lock file, the way Hugging Face's own clients
// lock the HF cache (`<cache>/.locks/<repo folder>/<etag>.lock`), so two downloads of one file by
// sftctl processes, or by sftctl and `huggingface_hub`, never append to the same `.incomplete` file.
//
// The lock is held while the FileLock lives (moved, not copied) and released by its destructor or
// when the process dies. Works on Linux and macOS (flock is POSIX-ish on both). Thread safety: a
// FileLock is owned by one thread; flock locks belong to the open file description, so two threads
// of one process exclude each other too.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "common/status.h"

namespace sftctl {

class FileLock {
 public:
  // Creates `path` (and not its folder) when missing and waits until the lock is ours. While
  // waiting, `on_wait` (may be empty) is called once, and `cancelled` (may be empty) is polled
  // every `poll`: CANCELLED when it turns true. Errors name the path (open/flock failures).
  static StatusOr<FileLock> Acquire(const std::string& path, const std::function<bool()>& cancelled = nullptr,
                                    const std::function<void()>& on_wait = nullptr,
                                    std::chrono::milliseconds poll = std::chrono::milliseconds(100));
  FileLock(FileLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace sftctl
