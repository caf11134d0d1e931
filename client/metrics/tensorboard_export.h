// The client's TensorBoard exports (docs/observability.md), over common/formats/tensorboard.h's writer:
//   `sftctl run --tensorboard DIR`: MetricsFileExport reads <run>/metrics.jsonl as the trainer appends
//     to it, on a thread of its own, until Stop().
//   `sftctl logs JOB -f --tensorboard DIR`: FollowToTensorBoard takes the job's METRIC events of
//     rank 0 from the journal (from its first event, so the series is whole) while printing what
//     `logs` prints.
// Either way the event file is DIR/events.out.tfevents.sftctl, each (tag, step) once: following a job
// again, from another machine or after a resume, adds only the steps the file does not hold.
//
// Thread safety: MetricsFileExport's methods are called from one thread (its own thread only reads
// the file and writes the event file); FollowToTensorBoard is like FollowEvents.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "client/remote/log_follower.h"
#include "common/formats/tensorboard.h"
#include "common/status.h"

namespace sftctl::client {

// Feeds the complete lines of `jsonl` from `*offset` on to `writer` and moves `*offset` past them
// (a last line without its newline is left for the next call). Lines that are not JSON objects are
// skipped. A missing file is no error (the trainer has not created it yet).
Status ExportNewMetricLines(const std::string& jsonl, uint64_t* offset, tensorboard::EventFileWriter* writer);

class MetricsFileExport {
 public:
  // Opens the event file in `dir`, writes `spec_text` once, and starts following `jsonl`.
  static StatusOr<std::unique_ptr<MetricsFileExport>> Start(const std::string& jsonl, const std::string& dir,
                                                            const std::string& spec_text);
  // Stops the thread and exports what the file holds by now. Returns the first error, if any.
  Status Stop();
  ~MetricsFileExport();

 private:
  MetricsFileExport() = default;
  void Loop();

  std::string jsonl_;
  std::unique_ptr<tensorboard::EventFileWriter> writer_;
  uint64_t offset_ = 0;
  Status error_;  // written by the thread, read after join
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// `logs JOB [-f] --tensorboard DIR`: prints like PrintEvents (the events after `print_after_seq`, as
// text or with `json` as JSON lines) and writes every rank-0 metric record of the job, and the job's
// spec as text, into DIR. Errors: FollowEvents' errors, and the event file's (naming its path).
StatusOr<FollowResult> FollowToTensorBoard(Reconnector* rc, const std::string& job_id,
                                           uint64_t print_after_seq, bool follow, bool json,
                                           const std::string& dir);

}  // namespace sftctl::client
