// MetricsSink: where the trainer reports progress.
//
// Every record is one JSON object per line ("event": start | step | eval | checkpoint |
// skipped | stopped | done, plus step, epoch, loss, lr, grad_norm, tokens_per_s, elapsed_s...: the
// event line of common/event_line.h, which every reader uses; "error" goes to --events-fd only)
// appended to <run>/metrics.jsonl, and, when a supervisor passes --events-fd, written to that
// descriptor too. On a terminal (and without --events-fd) a one-line progress bar with ETA,
// loss and tokens/s is drawn on stderr; otherwise a log line is printed every few steps.
// With EnableTensorBoard the scalars of every record also go to TensorBoard event files
// (common/formats/tensorboard.h; spec `metrics.tensorboard`, docs/observability.md).
//
// Thread safety: one thread.
#pragma once

#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/formats/tensorboard.h"
#include "common/status.h"
#include "trainer/training/gpu_metrics.h"

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

  // Also writes every later record's scalars into event files in `dir`, and `spec_text` once as the
  // "spec" text. Errors: the folder or file cannot be made or read (tensorboard::EventFileWriter::Open).
  Status EnableTensorBoard(const std::string& dir, const std::string& spec_text);
  // Adds `resources`' fields (trainer/training/gpu_metrics.h: memory, GPU utilisation, MFU) to every later
  // "step" record; they show on the progress bar and log lines too.
  void SetResourceMetrics(std::unique_ptr<ResourceMetrics> resources);
  // Writes one record (adds "time": unix seconds) to the file, the events descriptor and the event
  // files. A failed event-file write is reported once and ends the event files, not the run.
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
  std::unique_ptr<tensorboard::EventFileWriter> tensorboard_;
  std::unique_ptr<ResourceMetrics> resources_;
  nlohmann::json last_step_ =
      nlohmann::json::object();  // the last "step" record as emitted (with resource fields)
  bool bar_ = false;
  bool bar_drawn_ = false;
  bool silent_ = false;
  int64_t log_interval_ = 10;
  std::chrono::steady_clock::time_point last_draw_{};
};

// Whether stderr is a terminal.
bool StderrIsTty();

}  // namespace sftctl::trainer
