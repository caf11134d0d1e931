// Following a job's journal (StreamEvents) across dropped connections, and rendering its events.
//
// FollowEvents delivers every event with seq > after_seq exactly once and in order: after a dropped
// stream it reconnects (Reconnector: backoff, bounded attempts and time) and resumes with after_seq =
// the last seq delivered, so nothing is missed or repeated.
//
// Thread safety: one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "client/remote/agent_session.h"
#include "common/status.h"

namespace sftctl::client {

struct FollowResult {
  uint64_t last_seq = 0;
  // With follow: the job's final state (SUCCEEDED, FAILED or CANCELLED) and its reason.
  std::optional<v1::JobState> final_state;
  std::string reason;
};

// Streams the events of `job_id` after `after_seq`; with `follow` until the job's final state.
// Errors: NOT_FOUND (no such job on the agent), UNAVAILABLE (the connection could not be resumed).
StatusOr<FollowResult> FollowEvents(Reconnector* rc, const std::string& job_id, uint64_t after_seq,
                                    bool follow, const std::function<void(const v1::Event&)>& on_event,
                                    const std::function<void()>& after_batch = nullptr);

// FollowEvents printing every event on stdout: EventPrinter lines, or EventToJson lines with `json`.
// `printed` (may be null) is kept at the seq of the last event printed, also when it fails: where a
// later call continues.
StatusOr<FollowResult> PrintEvents(Reconnector* rc, const std::string& job_id, uint64_t after_seq,
                                   bool follow, bool json, uint64_t* printed = nullptr);

// `sftctl logs --tail N`: the last `tail` lines PrintEvents would print for the events journaled so far
// (with `json`: the last `tail` events), then with `follow` every later event until the job ends (a
// job that already ended reports its final state at once). Reads back from the end in growing
// windows, so a long journal is not streamed whole.
StatusOr<FollowResult> PrintEventsTail(Reconnector* rc, const std::string& job_id, uint64_t tail, bool follow,
                                       bool json);

// True for SUCCEEDED, FAILED and CANCELLED.
bool IsFinal(v1::JobState s);
// "SUCCEEDED", "RUNNING", ...
std::string StateName(v1::JobState s);
// 0 SUCCEEDED, 1 FAILED, 3 CANCELLED (see remote_options.h).
int ExitCodeForState(v1::JobState s);

// Renders events for people: rank output lines as they are ("[rank N] " before ranks other than 0),
// step/eval/checkpoint/start/done/error records as one readable line, state changes as "== STATE: reason".
// The text is the agent's, unescaped: print it through EscapeForTerminal (PrintEvents does).
class EventPrinter {
 public:
  // The line for `e` (no newline); empty when the event shows nothing. A metric record that
  // common/event_line.h's ParseEventLine refuses (fields of unexpected types) is shown raw
  // ("metric: ...") instead of throwing.
  std::string Format(const v1::Event& e);

 private:
  std::string FormatUnchecked(const v1::Event& e);
  int64_t total_steps_ = 0;
};

// One event as JSON: {"seq", "time_unix_ms", "kind": "stdout|stderr|metric|state", "rank", "text",
// "state" (state events), "record" (metric events: the parsed trainer record)}.
nlohmann::json EventToJson(const v1::Event& e);

}  // namespace sftctl::client
