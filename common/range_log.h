// RangeLog: the sidecar of a file filled as fixed-size blocks in any order (a ranged pull's
// "<dest>.part.ranges" on the client, a ranged upload's "partial/<sha256>.ranges" on the agent): a
// header naming the whole (size, sha256, block size), then the index of each completed block, one per
// line, appended as it completes (after its bytes are written). A later run re-uses the blocks it
// lists when the header still matches; a torn last line (a crash mid-append) is ignored.
//
// Thread safety: Append may be called from several threads (one write(2) per line on an O_APPEND
// descriptor); Load, Start, Reopen and Close before that, from one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace sftctl {

class RangeLog {
 public:
  RangeLog(std::string path, uint64_t size, std::string sha256, uint64_t block);
  ~RangeLog();
  RangeLog(const RangeLog&) = delete;
  RangeLog& operator=(const RangeLog&) = delete;

  // Per block (of `blocks`), whether an earlier run completed it; all zero and *matched false when
  // the file is missing or its header names another whole.
  std::vector<char> Load(size_t blocks, bool* matched) const;
  // A new log (replacing any): the header only.
  Status Start();
  // Appends to the existing log (after Load matched).
  Status Reopen();
  // Closes the log's descriptor; later Appends open the log for their one line and close it again (a
  // holder of many logs that are rarely appended to keeps no descriptor per log).
  void Close();
  // REQUIRES: Start or Reopen succeeded.
  Status Append(size_t block);
  const std::string& path() const { return path_; }

 private:
  std::string Header() const;
  std::string path_;
  uint64_t size_;
  std::string sha256_;
  uint64_t block_;
  int fd_ = -1;
};

}  // namespace sftctl
