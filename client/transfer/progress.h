// Progress: a live transfer line on stderr ("label [=====>    ] 45% 12.3/27.4 MB 56.7 MB/s ETA 0:03"),
// redrawn at most 10 times a second, only when enabled (a terminal). Rates count only the bytes
// transferred by this process (not the bytes skipped or resumed). PrintUploadLine: the lines of a local
// run's checkpoint uploader.
//
// Thread safety: a Progress is used by one thread at a time; PrintUploadLine from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace sftctl::client {

class Progress {
 public:
  // `total`: bytes expected to move in all (0: unknown, no bar or ETA).
  Progress(bool enabled, uint64_t total);
  ~Progress();

  // `label` may come from another machine (a Hub file name, an agent's artifact path): it is shown
  // through EscapeForTerminal (common/terminal_text.h), with newlines and tabs escaped too.
  void SetLabel(const std::string& label);
  // `n` more bytes moved.
  void Add(uint64_t n);
  // Erases the line (when drawn).
  void Finish();

  uint64_t done() const { return done_; }
  // Bytes per second since construction.
  double Rate() const;
  double Seconds() const;

 private:
  void Draw(bool force);

  bool enabled_;
  uint64_t total_, done_ = 0;
  std::string label_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool drawn_ = false;
};

// One line of a local run's checkpoint uploader (to a bucket: bucket_transfer.h; to the Hub:
// hub_upload.h) on stderr, "sftctl: upload: <line>", whole when several uploader threads print at once.
void PrintUploadLine(const std::string& line);

// "512 B", "2.8 KB", "12.3 MB", "1.25 GB" (decimal units).
std::string FormatBytes(uint64_t bytes);

}  // namespace sftctl::client
