// Journal: a job's append-only, seq-numbered event log (<job_dir>/journal.jsonl, one JSON object a line).
//
// Every stdout/stderr line, trainer metric record and state change gets the next seq (1, 2, ...).
// Readers replay from any seq: recent events come from a bounded in-memory ring, older ones from the
// file through a sparse seq -> offset index, so memory stays bounded however far behind a reader is.
// Followers register a one-shot callback that fires when a newer event (or the end) exists.
//
// Thread safety: all methods are safe to call concurrently. Callbacks run on the appending thread
// (or the registering thread when already satisfied) and must not block.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/event_line.h"
#include "common/mutex.h"
#include "common/os/file_system.h"
#include "common/status.h"
#include "sftctl/v1/agent.pb.h"

namespace sftctl::agent {

struct JournalEvent {
  uint64_t seq = 0;     // assigned by Append
  int64_t time_ms = 0;  // assigned by Append when 0
  ::sftctl::v1::Event::Kind kind = ::sftctl::v1::Event::KIND_UNSPECIFIED;
  int rank = -1;
  std::string text;
  ::sftctl::v1::JobState state = ::sftctl::v1::JOB_STATE_UNSPECIFIED;
  // Internal bookkeeping (not exposed): which rank output file the line came from (0 stdout,
  // 1 stderr, 2 events, -1 none) and the file offset just past it, so a restarted agent resumes tailing.
  int src = -1;
  uint64_t src_end = 0;
};

// The one rule for turning what was read from a rank's output file into journal lines, used by the
// supervisor (ranks it started) and the Slurm runner (rank files on the shared filesystem): `buf`
// holds the bytes of source `src` (0 stdout, 1 stderr, 2 events) of `rank` that start at file offset
// `off`. Appends one event per complete line ('\n' and a trailing '\r' dropped), over-long lines in
// pieces of kMaxRankLine bytes, and the unterminated rest only when `last_piece` (a dead rank's last
// words). Returns the bytes consumed; the caller reads on from off + that.
constexpr size_t kMaxRankLine = 64 * 1024;
// At most kMaxRankReadPerPass bytes of a rank output file are read per file and pass (bounds memory).
constexpr size_t kMaxRankReadPerPass = size_t{4} << 20;
// The bytes of rank output file `path` from offset `off`, at most kMaxRankReadPerPass of them ("" when
// the file is missing or has nothing new). *at_eof: they reach the file's end (true when ""); *more
// (optional): the file holds more beyond them.
std::string ReadRankOutput(const std::string& path, uint64_t off, bool* at_eof, bool* more = nullptr);
size_t SplitRankOutput(int rank, int src, uint64_t off, const std::string& buf, bool last_piece,
                       std::vector<JournalEvent>* events);

// A line the journal keeps whole is one the event-line reader takes (common/event_line.h).
static_assert(kMaxRankLine == kMaxEventLineBytes, "a whole journaled rank line is a readable event line");

// One line of a trainer's event stream (source 2), {"event":"<kind>",...}, as the agent reads it: the one
// reader for the supervisor (its ranks, and the journal of a job recovered after a restart) and the
// Slurm runner, through common/event_line.h's ParseEventLine. The line is the trainer's, so untrusted:
// INVALID_ARGUMENT (ParseEventLine's, every message starting "rank <rank> event": "rank 0 event: field
// 'event': expected a string, got number 7") is returned, never thrown; callers skip such a line (the
// journal keeps it as it was).
StatusOr<EventLine> ParseTrainerEvent(std::string_view line, int rank);

class Journal {
 public:
  // The in-memory ring keeps the newest events: at most kRingSize of them and, beyond its newest
  // event, at most kRingBytes of text (4096 lines of 1 MiB would otherwise hold 4 GiB per job).
  static constexpr size_t kRingSize = 4096;
  static constexpr size_t kRingBytes = size_t{8} << 20;
  static constexpr uint64_t kIndexEvery = 256;

  // Opens or creates the journal at `path`, rebuilding seq, index and source offsets from the file. A
  // torn last line (the agent died mid-write) is truncated away. All file access goes through `fs`
  // (not owned; must outlive the journal), so tests can inject a full disk.
  static StatusOr<std::shared_ptr<Journal>> Open(const std::string& path,
                                                 FileSystem* fs = FileSystem::Default());
  ~Journal();

  // Appends events in order, assigning seqs; returns the last seq. Data reaches the OS page cache
  // (survives an agent crash); Flush() makes it durable. All or nothing: on an error (disk full,
  // file too large) nothing of the batch is in the file or in memory, and followers see nothing. Should
  // cutting a failed write off fail too, the next Append cuts it off first (or fails again).
  StatusOr<uint64_t> Append(std::vector<JournalEvent> events) EXCLUDES(mu_);
  Status Flush() EXCLUDES(mu_);

  // Up to `max_events` events with seq > after_seq, in order.
  StatusOr<std::vector<JournalEvent>> Read(uint64_t after_seq, size_t max_events) EXCLUDES(mu_);

  uint64_t last_seq() const EXCLUDES(mu_);
  // Text bytes held in the in-memory ring (tests).
  size_t ring_bytes() const EXCLUDES(mu_);
  // A finished journal belongs to a job in a final state: followers stop at its end.
  void SetFinished(bool finished) EXCLUDES(mu_);
  bool finished() const EXCLUDES(mu_);

  // Runs `fn` once as soon as last_seq() > after_seq or the journal is finished.
  void NotifyWhenAfter(uint64_t after_seq, std::function<void()> fn) EXCLUDES(mu_);

  // End offsets of the last journaled line per (rank, src), recovered by Open.
  std::map<std::pair<int, int>, uint64_t> source_offsets() const EXCLUDES(mu_);

 private:
  Journal(std::string path, std::unique_ptr<AppendableFile> file)
      : path_(std::move(path)), file_(std::move(file)) {}
  Status Scan() REQUIRES(mu_);
  Status WriteLocked(const std::string& data) REQUIRES(mu_);
  void FireWaitersLocked(std::vector<std::function<void()>>* out) REQUIRES(mu_);
  void PushRingLocked(JournalEvent ev) REQUIRES(mu_);

  const std::string path_;
  const std::unique_ptr<AppendableFile> file_;  // Append/Truncate under mu_; ReadAt from any thread
  mutable Mutex mu_;
  uint64_t last_seq_ GUARDED_BY(mu_) = 0;
  uint64_t file_size_ GUARDED_BY(mu_) = 0;
  bool torn_ GUARDED_BY(mu_) = false;  // bytes past file_size_ from a failed write could not be cut off yet
  bool finished_ GUARDED_BY(mu_) = false;
  std::deque<JournalEvent> ring_ GUARDED_BY(mu_);
  size_t ring_bytes_ GUARDED_BY(mu_) = 0;        // text bytes in ring_
  std::vector<uint64_t> index_ GUARDED_BY(mu_);  // index_[i] = file offset of seq i*kIndexEvery+1
  std::vector<std::pair<uint64_t, std::function<void()>>> waiters_ GUARDED_BY(mu_);
  std::map<std::pair<int, int>, uint64_t> source_offsets_ GUARDED_BY(mu_);
};

// Serialises one event as a journal line (with trailing newline); exposed for tests.
std::string EncodeJournalLine(const JournalEvent& ev);
bool DecodeJournalLine(const std::string& line, JournalEvent* ev);

}  // namespace sftctl::agent
