#include "client/remote/log_follower.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <vector>

#include "common/event_line.h"
#include "common/terminal_text.h"

namespace sftctl::client {

bool IsFinal(v1::JobState s) { return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED; }

std::string StateName(v1::JobState s) {
  switch (s) {
    case v1::QUEUED:
      return "QUEUED";
    case v1::RUNNING:
      return "RUNNING";
    case v1::CANCELLING:
      return "CANCELLING";
    case v1::SUCCEEDED:
      return "SUCCEEDED";
    case v1::FAILED:
      return "FAILED";
    case v1::CANCELLED:
      return "CANCELLED";
    default:
      return "UNKNOWN";
  }
}

int ExitCodeForState(v1::JobState s) {
  switch (s) {
    case v1::SUCCEEDED:
      return 0;
    case v1::CANCELLED:
      return 3;
    default:
      return 1;
  }
}

namespace {

// One StreamEvents call from r->last_seq on. OK with r->final_state set when the job ended (or, not
// following, when the stream ended); UNAVAILABLE when a followed stream ended before the job did.
Attempt StreamEventsOnce(AgentSession& a, const std::string& job_id, bool follow,
                         const std::function<void(const v1::Event&)>& on_event,
                         const std::function<void()>& after_batch, FollowResult* r) {
  Attempt attempt;
  v1::StreamEventsRequest req;
  req.set_job_id(job_id);
  req.set_after_seq(r->last_seq);
  req.set_follow(follow);
  grpc::ClientContext ctx;
  a.Prepare(&ctx, std::chrono::milliseconds(0));
  auto reader = a.stub()->StreamEvents(&ctx, req);
  v1::StreamEventsResponse msg;
  while (reader->Read(&msg)) {
    for (const auto& e : msg.events()) {
      if (e.seq() <= r->last_seq) continue;  // never deliver twice
      r->last_seq = e.seq();
      attempt.progressed = true;
      if (e.kind() == v1::Event::STATE) {
        if (IsFinal(e.state())) {
          r->final_state = e.state();
          r->reason = e.text();
        } else {
          r->final_state.reset();  // a restart: FAILED -> QUEUED
        }
      }
      on_event(e);
    }
    if (after_batch) after_batch();
  }
  attempt.status = FromGrpc(reader->Finish(), a.host() + ": events of " + job_id);
  if (!attempt.status.ok() || !follow || r->final_state) return attempt;
  // The stream ended without a final state (agent stopping): ask, then resume.
  v1::GetJobRequest greq;
  greq.set_job_id(job_id);
  v1::Job job;
  grpc::ClientContext gctx;
  a.Prepare(&gctx);
  attempt.status = FromGrpc(a.stub()->GetJob(&gctx, greq, &job), a.host() + ": " + job_id);
  if (!attempt.status.ok()) return attempt;
  if (IsFinal(job.state()) && job.last_seq() <= r->last_seq) {
    r->final_state = job.state();
    r->reason = job.reason();
    return attempt;
  }
  attempt.status = UnavailableError(a.host() + ": the event stream of " + job_id + " ended early");
  return attempt;
}

}  // namespace

StatusOr<FollowResult> FollowEvents(Reconnector* rc, const std::string& job_id, uint64_t after_seq,
                                    bool follow, const std::function<void(const v1::Event&)>& on_event,
                                    const std::function<void()>& after_batch) {
  FollowResult r;
  r.last_seq = after_seq;
  SFT_RETURN_IF_ERROR(rc->Run(
      [&](AgentSession& a) { return StreamEventsOnce(a, job_id, follow, on_event, after_batch, &r); }));
  return r;
}

StatusOr<FollowResult> PrintEvents(Reconnector* rc, const std::string& job_id, uint64_t after_seq,
                                   bool follow, bool json, uint64_t* printed) {
  EventPrinter printer;
  return FollowEvents(
      rc, job_id, after_seq, follow,
      [&](const v1::Event& e) {
        if (printed != nullptr) *printed = e.seq();
        if (json) {
          std::cout << EventToJson(e).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
        } else {
          const std::string line = printer.Format(e);  // agent text: escaped before printing
          if (!line.empty()) std::cout << EscapeForTerminal(line) << "\n";
        }
      },
      [] { std::cout.flush(); });
}

namespace {

// What PrintEvents prints for `events` (in order), one string a line.
std::vector<std::string> RenderLines(const std::vector<v1::Event>& events, bool json) {
  EventPrinter printer;
  std::vector<std::string> lines;
  for (const v1::Event& e : events) {
    if (json) {
      lines.push_back(EventToJson(e).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    } else if (std::string line = printer.Format(e); !line.empty()) {
      lines.push_back(EscapeForTerminal(line));
    }
  }
  return lines;
}

}  // namespace

StatusOr<FollowResult> PrintEventsTail(Reconnector* rc, const std::string& job_id, uint64_t tail, bool follow,
                                       bool json) {
  v1::Job job;
  SFT_RETURN_IF_ERROR(GetJob(rc, job_id, &job));
  const uint64_t last = job.last_seq();
  std::vector<std::string> lines;
  for (uint64_t window = std::max<uint64_t>(tail, 1);; window *= 4) {
    const uint64_t from = last > window ? last - window : 0;
    std::vector<v1::Event> events;
    auto keep = [&](const v1::Event& e) {
      if (e.seq() <= last) events.push_back(e);
    };
    SFT_RETURN_IF_ERROR(FollowEvents(rc, job_id, from, /*follow=*/false, keep).status());
    lines = RenderLines(events, json);
    if (lines.size() >= tail || from == 0) break;
  }
  for (size_t i = lines.size() > tail ? lines.size() - tail : 0; i < lines.size(); ++i)
    std::cout << lines[i] << "\n";
  std::cout.flush();
  FollowResult result;
  result.last_seq = last;
  if (IsFinal(job.state())) {
    result.final_state = job.state();
    result.reason = job.reason();
  }
  if (!follow || result.final_state) return result;
  return PrintEvents(rc, job_id, last, /*follow=*/true, json);
}

namespace {

// `v` as `fmt` formats it; "?" when the record has no such number.
std::string Num(const std::optional<double>& v, const char* fmt) {
  if (!v) return "?";
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, *v);
  return buf;
}

std::string Count(const std::optional<int64_t>& v) { return v ? std::to_string(*v) : "?"; }

std::string TextOr(const std::string& s, const char* absent) { return s.empty() ? absent : s; }

// The readable line of a trainer record read by ParseEventLine (`text`: the line as the agent sent it);
// *total_steps is the run's step count, from its "start" record.
std::string FormatRecord(const EventLine& ev, const std::string& prefix, const std::string& text,
                         int64_t* total_steps) {
  const std::string step = Count(ev.step);
  switch (ev.type) {
    case EventKind::kStart: {
      *total_steps = ev.total_steps.value_or(0);
      std::string s = prefix + "start: " + Count(ev.parameters) + " parameters, " +
                      std::to_string(*total_steps) + " steps on " + TextOr(ev.device, "?") + " (" +
                      TextOr(ev.precision, "?") + ")";
      if (!ev.resumed_from.empty()) s += ", resuming at step " + step + " from " + ev.resumed_from;
      return s;
    }
    case EventKind::kStep:
      return prefix + "step " + step + (*total_steps > 0 ? "/" + std::to_string(*total_steps) : "") +
             ": loss " + Num(ev.loss, "%.4f") + ", lr " + Num(ev.lr, "%.2e") + ", grad norm " +
             Num(ev.grad_norm, "%.3f") + ", " + Num(ev.tokens_per_s, "%.0f") + " tok/s";
    case EventKind::kEval: {
      std::string s = prefix + "eval at step " + step + ": loss " + Num(ev.eval_loss, "%.4f");
      if (ev.exact_match) {
        s += ", exact match " + Num(ev.exact_match, "%.3f") + " (" +
             std::to_string(ev.exact_correct.value_or(0)) + "/" + std::to_string(ev.exact_total.value_or(0)) +
             ")";
      }
      return s;
    }
    case EventKind::kCheckpoint:
      return prefix + "checkpoint at step " + step + ": " + ev.path;
    case EventKind::kDone: {
      std::string s = prefix + "done at step " + step + ": loss " + Num(ev.loss, "%.4f");
      if (ev.eval_loss) s += ", eval loss " + Num(ev.eval_loss, "%.4f");
      if (ev.exact_match) s += ", exact match " + Num(ev.exact_match, "%.3f");
      return s;
    }
    case EventKind::kError:
      return prefix + "error: " + ev.code + " " + ev.message;
    default:  // "skipped", "stopped", and kinds a newer trainer writes: the record as it is
      return prefix + ev.kind + ": " + text;
  }
}

}  // namespace

// Nothing below throws: a metric is read by ParseEventLine, and one it refuses is shown raw.
std::string EventPrinter::Format(const v1::Event& e) { return FormatUnchecked(e); }

std::string EventPrinter::FormatUnchecked(const v1::Event& e) {
  switch (e.kind()) {
    case v1::Event::STDOUT:
    case v1::Event::STDERR:
      return e.rank() > 0 ? "[rank " + std::to_string(e.rank()) + "] " + e.text() : e.text();
    case v1::Event::STATE:
      return "== " + StateName(e.state()) + (e.text().empty() ? "" : ": " + e.text());
    case v1::Event::METRIC:
      break;
    default:
      return "";
  }
  StatusOr<EventLine> ev = ParseEventLine(e.text(), "metric");  // the trainer's, through the agent: untrusted
  if (!ev.ok()) return "metric: " + e.text();
  const std::string prefix = e.rank() > 0 ? "[rank " + std::to_string(e.rank()) + "] " : "";
  return FormatRecord(*ev, prefix, e.text(), &total_steps_);
}

nlohmann::json EventToJson(const v1::Event& e) {
  static const char* kKinds[] = {"unknown", "stdout", "stderr", "metric", "state"};
  const int k = static_cast<int>(e.kind());
  nlohmann::json j = {{"seq", e.seq()},
                      {"time_unix_ms", e.time_unix_ms()},
                      {"kind", k >= 0 && k <= 4 ? kKinds[k] : "unknown"},
                      {"rank", e.rank()},
                      {"text", e.text()}};
  if (e.kind() == v1::Event::STATE) j["state"] = StateName(e.state());
  if (e.kind() == v1::Event::METRIC) {
    if (auto ev = ParseEventLine(e.text(), "metric"); ev.ok()) j["record"] = std::move(ev->json);
  }
  return j;
}

}  // namespace sftctl::client
