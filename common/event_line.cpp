#include "common/event_line.h"

#include <utility>

#include "common/json_parse.h"

namespace sftctl {
namespace {

// The typed fields of EventLine, by key: one table per type, so the reader has one loop each.
struct CountField {
  const char* key;
  std::optional<int64_t> EventLine::*member;
};
struct NumberField {
  const char* key;
  std::optional<double> EventLine::*member;
};
struct TextField {
  const char* key;
  std::string EventLine::*member;
};

constexpr CountField kCountFields[] = {
    {"step", &EventLine::step},
    {"tokens", &EventLine::tokens},
    {"eval_targets", &EventLine::eval_targets},
    {"exact_correct", &EventLine::exact_correct},
    {"exact_total", &EventLine::exact_total},
    {"total_steps", &EventLine::total_steps},
    {"parameters", &EventLine::parameters},
    {"trainable_parameters", &EventLine::trainable_parameters},
    {"rank", &EventLine::rank},
    {"world_size", &EventLine::world_size},
    {"bad_steps", &EventLine::bad_steps},
};

constexpr NumberField kNumberFields[] = {
    {"time", &EventLine::time},
    {"loss", &EventLine::loss},
    {"grad_norm", &EventLine::grad_norm},
    {"loss_scale", &EventLine::loss_scale},
    {"elapsed_s", &EventLine::elapsed_s},
    {"epoch", &EventLine::epoch},
    {"lr", &EventLine::lr},
    {"tokens_per_s", &EventLine::tokens_per_s},
    {"step_s", &EventLine::step_s},
    {"allreduce_s", &EventLine::allreduce_s},
    {"eval_loss", &EventLine::eval_loss},
    {"exact_match", &EventLine::exact_match},
    {"eval_s", &EventLine::eval_s},
};

constexpr TextField kTextFields[] = {
    {"device", &EventLine::device},
    {"precision", &EventLine::precision},
    {"resumed_from", &EventLine::resumed_from},
    {"path", &EventLine::path},
    {"checkpoint", &EventLine::checkpoint},
    {"reason", &EventLine::reason},
    {"code", &EventLine::code},
    {"message", &EventLine::message},
};

constexpr std::pair<EventKind, std::string_view> kKindNames[] = {
    {EventKind::kStart, "start"},           {EventKind::kStep, "step"},       {EventKind::kEval, "eval"},
    {EventKind::kCheckpoint, "checkpoint"}, {EventKind::kSkipped, "skipped"}, {EventKind::kDone, "done"},
    {EventKind::kStopped, "stopped"},       {EventKind::kError, "error"},
};

Status ReadTypedFields(const std::string& where, EventLine* ev) {
  for (const CountField& f : kCountFields) {
    SFT_ASSIGN_OR_RETURN(std::optional<int64_t> v, OptionalJsonField<int64_t>(ev->json, f.key, where));
    if (v && *v < 0)
      return FieldError(where, f.key, "expected an integer >= 0, got number " + std::to_string(*v));
    ev->*f.member = v;
  }
  for (const NumberField& f : kNumberFields) {
    SFT_ASSIGN_OR_RETURN(ev->*f.member, OptionalJsonField<double>(ev->json, f.key, where));
  }
  for (const TextField& f : kTextFields) {
    SFT_ASSIGN_OR_RETURN(ev->*f.member, JsonFieldOr<std::string>(ev->json, f.key, "", where));
  }
  return OkStatus();
}

}  // namespace

nlohmann::json EventLineToJson(const EventLine& ev) {
  nlohmann::json out = ev.json.is_object() ? ev.json : nlohmann::json::object();
  out["event"] = ev.kind;
  for (const CountField& f : kCountFields) {
    if (ev.*f.member) out[f.key] = *(ev.*f.member);
  }
  for (const NumberField& f : kNumberFields) {
    if (ev.*f.member) out[f.key] = *(ev.*f.member);
  }
  for (const TextField& f : kTextFields) {
    if (!(ev.*f.member).empty()) out[f.key] = ev.*f.member;
  }
  return out;
}

std::string_view EventKindName(EventKind kind) {
  for (const auto& [k, name] : kKindNames) {
    if (k == kind) return name;
  }
  return "";
}

EventKind EventKindOf(std::string_view name) {
  for (const auto& [k, n] : kKindNames) {
    if (n == name) return k;
  }
  return EventKind::kOther;
}

StatusOr<EventLine> ReadEventLine(nlohmann::json record, const std::string& where) {
  SFT_RETURN_IF_ERROR(CheckJsonObject(record, where));
  EventLine ev;
  SFT_ASSIGN_OR_RETURN(ev.kind, JsonField<std::string>(record, "event", where));
  if (ev.kind.empty()) return FieldError(where, "event", "empty");
  ev.type = EventKindOf(ev.kind);
  ev.json = std::move(record);
  SFT_RETURN_IF_ERROR(ReadTypedFields(where, &ev));
  return ev;
}

StatusOr<EventLine> ParseEventLine(std::string_view line, const std::string& where) {
  if (line.size() > kMaxEventLineBytes) {
    return InvalidArgumentError((where.empty() ? "" : where + ": ") + "line of " +
                                std::to_string(line.size()) + " bytes, over the limit of " +
                                std::to_string(kMaxEventLineBytes));
  }
  SFT_ASSIGN_OR_RETURN(nlohmann::json record, ParseJson(line, where, kMaxEventLineDepth));
  return ReadEventLine(std::move(record), where);
}

}  // namespace sftctl
