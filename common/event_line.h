// One line of a trainer's event stream, and the one checked reader of it.
//
// sftctl-trainer reports progress as one JSON object per line, {"event": KIND, ...}: MetricsSink
// (trainer/training/metrics.h) writes every record to <run>/metrics.jsonl and to `--events-fd`, adding
// "time"; a trainer that fails writes {"event":"error","code","message"} to `--events-fd` alone
// (trainer/tools/trainer_cli.cpp). The kinds and their fields are listed in docs/observability.md ("The event
// line"). Everything that reads these lines reads them here: the agent (agent/state/journal.h
// ParseTrainerEvent: the supervisor's live path, its journal replay after a restart, the Slurm follow
// thread), the client (`run --local --ranks N`'s rank failures, `logs`, `status`, `plot`) and the
// TensorBoard writer (common/formats/tensorboard.h, the trainer's and the client's).
//
// The lines come from the user's job's process, through the journal, an agent and a network: they are
// untrusted. ParseEventLine never throws and bounds what it reads (kMaxEventLineBytes, nesting
// kMaxEventLineDepth). Every typed field below is checked when present: a field of another type, or a
// count below 0, is INVALID_ARGUMENT naming it ("<where>: field 'step': expected an integer, got
// string"); a field that is absent or null (nlohmann writes a NaN as null) is std::nullopt, or "" for a
// string. No field is required but "event": which ones a reader needs is the reader's to check (a
// "step" record with no "step" still counts as the trainer's heartbeat). Keys beyond these (the
// resource figures of trainer/training/gpu_metrics.h, per-phase times, whatever a newer trainer adds)
// are not checked and are kept in EventLine::json for the readers that want them. A kind this reader
// does not know is kept (EventKind::kOther, its name in `kind`): a newer trainer's records still show.
//
// Thread safety: pure functions; an EventLine is a plain value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace sftctl {

// The longest line ParseEventLine reads, in bytes (a trailing newline counts). The agent's journal
// keeps a rank's line whole up to the same length (agent/state/journal.h kMaxRankLine) and splits a longer
// one into pieces, which are then no event lines.
inline constexpr size_t kMaxEventLineBytes = 64 * 1024;
// The deepest nesting of objects and arrays in a line (the trainer's records are flat: depth 1).
inline constexpr int kMaxEventLineDepth = 8;

// The kinds the trainer writes; kOther for any other name.
enum class EventKind { kOther, kStart, kStep, kEval, kCheckpoint, kSkipped, kDone, kStopped, kError };

// "start", "step", "eval", "checkpoint", "skipped", "done", "stopped", "error"; "" for kOther.
std::string_view EventKindName(EventKind kind);
// The kind named `name`; kOther for a name the trainer does not write.
EventKind EventKindOf(std::string_view name);

// One event line, read. Numbers read from text are finite (JSON has no NaN or infinity); a record
// built in C++ (the trainer's own, handed to the TensorBoard writer) may hold a NaN loss.
struct EventLine {
  std::string kind;                    // "event" as written: never empty
  EventKind type = EventKind::kOther;  // EventKindOf(kind)

  // Fields of several kinds.
  std::optional<int64_t> step;       // >= 0: optimizer steps completed (every kind but "error")
  std::optional<double> time;        // unix seconds (MetricsSink adds it; "error" has none)
  std::optional<double> loss;        // "step", "skipped" (a non-finite loss: null), "done"
  std::optional<double> grad_norm;   // "step", "skipped"
  std::optional<double> loss_scale;  // "step" and "skipped" of an fp16 run
  std::optional<double> elapsed_s;   // "step", "done", "stopped": training seconds, resumes included

  // "step".
  std::optional<double> epoch;         // fractional: epochs completed
  std::optional<double> lr;            // the learning rate of the step
  std::optional<int64_t> tokens;       // >= 0: tokens of the step's window
  std::optional<double> tokens_per_s;  // since this session started
  std::optional<double> step_s;        // wall time of the step
  std::optional<double> allreduce_s;   // several ranks: time waiting on all-reduces in the step

  // "eval" (eval_loss and exact_match also in "done").
  std::optional<double> eval_loss;
  std::optional<int64_t> eval_targets;   // >= 0
  std::optional<double> exact_match;     // a fraction
  std::optional<int64_t> exact_correct;  // >= 0
  std::optional<int64_t> exact_total;    // >= 0
  std::optional<double> eval_s;          // wall time of the evaluation

  // "start".
  std::optional<int64_t> total_steps;           // >= 0
  std::optional<int64_t> parameters;            // >= 0
  std::optional<int64_t> trainable_parameters;  // >= 0
  std::optional<int64_t> rank;                  // >= 0; with world_size, a run of several ranks
  std::optional<int64_t> world_size;            // >= 0
  std::string device, precision;                // "cuda:0", "bf16", ...
  std::string resumed_from;                     // the checkpoint folder resumed from; "" for none

  std::string path;                  // "checkpoint": the folder written
  std::string checkpoint;            // "done", "stopped": the last checkpoint folder
  std::string reason;                // "skipped": "overflow" (fp16) or none (a non-finite loss)
  std::optional<int64_t> bad_steps;  // "skipped" (non-finite loss): consecutive skipped steps, >= 0
  std::string code;                  // "error": the status code's name ("INVALID_ARGUMENT", ...)
  std::string message;               // "error": what went wrong

  nlohmann::json json;  // the whole line: the fields above and every other key
};

// Reads one event line. `where` starts every error message ("rank 0 event", "metrics.jsonl:12").
// Errors (INVALID_ARGUMENT, "<where>: ..."): a line over kMaxEventLineBytes ("line of N bytes, over the
// limit of 65536"), text that is not JSON (ParseJson's, common/json_parse.h: "invalid JSON: ...", or
// nested deeper than kMaxEventLineDepth), a value that is not an object ("expected a JSON object, got
// array"), an "event" that is missing, not a string or empty, or a typed field of the wrong type or
// below 0 (above).
StatusOr<EventLine> ParseEventLine(std::string_view line, const std::string& where = "event line");

// The record of `ev`, as a writer would emit it: ev.json (an empty object when it is not an object) with
// "event" set to ev.kind and every typed field that is set (an optional with a value, a non-empty
// string) written over it; unset fields leave ev.json's key as it is. For a line ParseEventLine read,
// that is ev.json again. Never throws.
nlohmann::json EventLineToJson(const EventLine& ev);

// The same for a line already parsed (a plot's records, the record the trainer hands the TensorBoard
// writer): the checks above but the size and JSON syntax. `record` becomes EventLine::json.
StatusOr<EventLine> ReadEventLine(nlohmann::json record, const std::string& where = "event line");

}  // namespace sftctl
