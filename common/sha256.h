// SHA-256 of byte strings and files (OpenSSL EVP), as lowercase hex.
//
// Used by the agent (blob store, artifacts) and the client (uploads, verified pulls).
// Thread safety: Sha256 objects are used by one thread at a time; the free functions are reentrant.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace sftctl {

// Incremental SHA-256.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(std::string_view data);
  void Update(const void* data, size_t size);
  // Returns the 64-digit lowercase hex digest; the object must not be updated afterwards.
  std::string HexDigest();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::string Sha256Hex(std::string_view data);
// Hashes the whole file. Errors: NOT_FOUND / PERMISSION_DENIED style ErrnoError on open/read failure.
StatusOr<std::string> Sha256File(const std::string& path);
// Hashes the first `size` bytes of the open file `fd` (pread: its offset is not moved), e.g. the part
// of a growing file that a stream will send. `path` names it in errors. Errors: the read's errno
// error, DATA_LOSS when the file is shorter than `size`.
StatusOr<std::string> Sha256FilePrefix(int fd, uint64_t size, const std::string& path);
// The same into `h`, which the caller may go on updating (a resumed download hashes what it already
// has, then what arrives). Errors as Sha256FilePrefix; `h` holds part of the prefix then.
Status Sha256UpdateFromFile(int fd, uint64_t size, const std::string& path, Sha256* h);
// True if `s` is 64 lowercase hex digits.
bool IsSha256Hex(std::string_view s);

}  // namespace sftctl
