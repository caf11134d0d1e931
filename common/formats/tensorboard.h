// TensorBoard event files without TensorFlow or a protobuf library: the few messages sftctl writes,
// encoded by hand, in TFRecord framing (docs/observability.md).
//
// A record is: uint64 length, uint32 masked CRC-32C of the length bytes, the data, uint32 masked
// CRC-32C of the data (all little-endian). The data is a serialized tensorboard.Event (wall_time = 1,
// step = 2, file_version = 3, summary = 5) whose Summary holds Values {tag = 1, simple_value = 2} for
// scalars, or {tag = 1, metadata = 9 (plugin "text"), tensor = 8 (a DT_STRING scalar)} for text.
//
// EventFileWriter keeps one series per run folder: the file name is fixed (kEventFileName), and a tag's
// steps only grow — a record whose step is not above the last one written for its tag is skipped, so
// following a job twice, or a resumed run re-reporting steps, writes each (tag, step) once. Before
// every append it takes an flock on the file and reads what other writers appended since, so two
// processes writing the same folder stay consistent too.
//
// Lives in sftctl_common (no library beyond the C++ standard library and nlohmann/json), so the
// trainer (spec `metrics.tensorboard`) and the client (`logs -f --tensorboard`, `run --tensorboard`)
// write the same bytes from the same metrics.jsonl records.
//
// Thread safety: the free functions are pure; one EventFileWriter is used by one thread at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/event_line.h"
#include "common/status.h"

namespace sftctl::tensorboard {

inline constexpr char kEventFileName[] = "events.out.tfevents.sftctl";
inline constexpr char kSpecTag[] = "spec";

// CRC-32C (Castagnoli), and TFRecord's mask of it: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t Crc32c(std::string_view data);
uint32_t MaskedCrc32c(std::string_view data);

// `data` framed as one TFRecord.
std::string FrameRecord(std::string_view data);

// Serialized Event messages.
std::string FileVersionEvent(double wall_time);  // file_version "brain.Event:2"
std::string ScalarEvent(double wall_time, int64_t step, std::string_view tag, float value);
std::string TextEvent(double wall_time, int64_t step, std::string_view tag, std::string_view text);

// The scalars TensorBoard gets from one metrics.jsonl record: every finite number (not a bool) of a
// "step" record as "train/<field>", of an "eval" record as "eval/<field without its eval_ prefix>";
// "step", "time" and other records give none, and so does a record that common/event_line.h's
// ReadEventLine refuses (not an object, "event" not a string, a field of the wrong type, a negative
// step: the records come from the trainer through the agent, untrusted). Sorted by tag.
std::vector<std::pair<std::string, double>> ScalarsOf(const nlohmann::json& record);

// The "spec" text: the spec's JSON as a Markdown code block (TensorBoard's text plugin renders Markdown).
std::string SpecText(const nlohmann::json& spec);

// What a valid event file holds, for readers and tests.
struct ParsedEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::string> tags;  // the summary values' tags, in order
};

// Parses the records of an event file's bytes from `offset` on. Stops at the first incomplete record
// (a write in progress or a crash) and reports where the complete ones end in `*end`. Errors:
// DATA_LOSS naming `name` and the byte offset for a CRC mismatch or an Event that does not parse.
StatusOr<std::vector<ParsedEvent>> ParseRecords(std::string_view bytes, size_t offset, size_t* end,
                                                const std::string& name);

class EventFileWriter {
 public:
  // Creates `dir` (and its parents) when missing and opens dir/kEventFileName for appending; reads
  // what the file holds (a torn last record is cut off). Errors: errno errors naming the path;
  // DATA_LOSS for a record whose CRC does not match (the file is left as it is).
  static StatusOr<std::unique_ptr<EventFileWriter>> Open(const std::string& dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // Appends ScalarsOf(record) at record["step"] with wall time record["time"] (else now), each tag only
  // when the step is above its last one. Records without a step, or that ReadEventLine refuses (a
  // negative step, a "time" that is not a number, ...), write nothing.
  Status WriteMetrics(const nlohmann::json& record);
  // The same for a line already read (ParseEventLine: the client's export of a metrics.jsonl).
  Status WriteMetrics(const EventLine& ev);
  // Appends `text` under `tag` at step 0 unless the tag is already in the file.
  Status WriteTextOnce(std::string_view tag, std::string_view text, double wall_time);

  const std::string& path() const { return path_; }

 private:
  EventFileWriter() = default;
  // Under the flock: reads records other writers appended, then appends `events` (serialized Events
  // with their tags and step) that are still new.
  struct Pending {
    std::string tag;
    int64_t step;
    std::string event;
  };
  Status Append(const std::vector<Pending>& events);
  Status CatchUp();  // REQUIRES: the flock is held

  int fd_ = -1;
  std::string path_;
  uint64_t offset_ = 0;                  // bytes of complete records read or written
  std::map<std::string, int64_t> last_;  // tag -> last step in the file
};

}  // namespace sftctl::tensorboard
