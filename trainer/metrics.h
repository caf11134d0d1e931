// MetricsSink: where the trainer reports progress.
//
// Every record is one JSON object per line ("event": start | step | eval | checkpoint |
// skipped | done | error, plus step, epoch, loss, lr, grad_norm, tokens_per_s, elapsed_s...)
// appended to <run>/metrics.jsonl, and, when a supervisor passes --events-fd, written to that
// descriptor too. On a terminal (and without --events-fd) a one-line progress bar with ETA,
// loss and tokens/s is drawn on stderr; otherwise a log line is printed every few steps.
//
// Thread safety: one thread.
#pragma once

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace sftctl::trainer {

class MetricsSink {
 public:
  // `jsonl_path` may be empty (no file). `events_fd` < 0: none. `progress_bar`: draw the
  // TTY bar instead of periodic log lines.
  static StatusOr<std::unique_ptr<MetricsSink>> Open(const std::string& jsonl_path, int events_fd,
                                                     bool progress_bar, int64_t log_interval);
  // A sink that drops everything (data-parallel ranks other than 0).
  static std::unique_ptr<MetricsSink> Silent();
  ~MetricsSink();

  // Writes one record (adds "time": unix seconds) to the file and the events descriptor.
  void Emit(nlohmann::json record);
  // Shows training progress for a step record (bar or periodic log line).
  void ShowStep(const nlohmann::json& step_record, int64_t total_steps);
  // Prints a line to the user, keeping the progress bar intact.
  void Say(const std::string& line);
  // Ends the progress bar line.
  void Finish();

 private:
  MetricsSink() = default;
  std::FILE* file_ = nullptr;
  int events_fd_ = -1;
  bool bar_ = false;
  bool bar_drawn_ = false;
  bool silent_ = false;
  int64_t log_interval_ = 10;
  std::chrono::steady_clock::time_point last_draw_{};
};

// Whether stderr is a terminal.
bool StderrIsTty();

}  // namespace sftctl::trainer
